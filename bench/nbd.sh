#!/usr/bin/env bash
# NBD benchmark: ramd against `nbdkit memory`, side by side in one run, with
# the same fio jobs over Unix sockets. See BENCHMARKS.md for what the figures
# mean and how to read them.
#
# usage: bench/nbd.sh [--size SIZE] [--quick] [--runs N] [--runtime SECS]
#                     [--ramd-threads N] [--nbdkit-threads N] [--out DIR] [--profile JOB]
#
#   --size SIZE         disk size for both servers, e.g. 512M, 1G (default 1G)
#   --quick             smoke run: 1 run of each job, 3 s each
#   --runs N            runs of every timed job; the table shows medians (default 3)
#   --runtime SECS      measured seconds of every timed job, after 2 s of ramp (default 10)
#   --ramd-threads N    ramd serve --threads N (default: ramd's own default)
#   --nbdkit-threads N  nbdkit --threads N (default: nbdkit's own, 16)
#   --out DIR           also keep the raw fio JSON, CPU and memory figures in DIR
#   --profile JOB       instead of the timed runs, run JOB (mix4k, mix4k-2conn,
#                       qd1-randread, qd1-randwrite, seq-write or seq-read) once
#                       per server under `perf record -g` and `perf stat`, and
#                       print where each server spends its CPU (needs perf:
#                       apt-get install linux-perf)
#
# Before every measurement the script waits until the rest of the host is
# idle, and repeats a timed run during which other processes took more than
# a quarter of a core; waits and repeats together take at most
# BENCH_QUIET_WAIT seconds (default 150). The report shows the CPU that
# anything else used during each run: on a shared machine a neighbour's
# burst would otherwise be measured as well.
#
# Phases:
#   1. build ramd (release); touch and free 2 x SIZE + 256 MiB of memory so
#      that both servers get the same kind of fresh pages (see BENCHMARKS.md,
#      "Memory"); start ramd and nbdkit, each on its own socket in a mktemp
#      directory, and wait until each answers nbdinfo;
#   2. fill pass 1: write the whole disk once, 1 MiB sequential, random data:
#      every page is first-touch ("cold") memory; then read VmRSS/VmHWM;
#   3. fill pass 2: the same again over already-written ("warm") pages;
#   4. timed jobs, all over written (warm) pages so reads hit real data:
#      4 KiB 80/20 random mix at QD32 (one fio job, one connection), the
#      same from two fio jobs of QD16 each, 4 KiB QD1 randread and randwrite
#      latency, 1 MiB sequential write then read; each run alternates which
#      server goes first;
#   5. print the results table (median of runs, ratio ramd/nbdkit, goals),
#      server CPU use and memory figures; tear everything down on exit.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

size=1G runs="" runtime="" out="" ramd_threads="" nbdkit_threads="" profile="" quick=0
bench_args --size= --quick --runs= --runtime= --ramd-threads= --nbdkit-threads= --profile= --out= -- "$@"
ramp=2
if ((quick)); then
    runs=${runs:-1} runtime=${runtime:-3} ramp=1
fi
runs=${runs:-3} runtime=${runtime:-10}
want_size --size "$size"
want_count --runs "$runs"
want_count --runtime "$runtime"
case $profile in
"" | mix4k | mix4k-2conn | qd1-randread | qd1-randwrite | seq-write | seq-read) ;;
*) die "--profile '$profile': use mix4k, mix4k-2conn, qd1-randread, qd1-randwrite, seq-write or seq-read" ;;
esac
[[ -z $ramd_threads ]] || want_count --ramd-threads "$ramd_threads"
[[ -z $nbdkit_threads ]] || want_count --nbdkit-threads "$nbdkit_threads"
want_quiet_wait

# --- tools -------------------------------------------------------------------
want_fio_nbd
need nbdkit "nbdkit"
need nbdinfo libnbd-bin
need python3 python3
need numfmt coreutils
if [[ -n $profile ]]; then
    need perf linux-perf
    perf stat -e task-clock true >/dev/null 2>&1 ||
        die "perf cannot count events here (kernel.perf_event_paranoid is $(cat /proc/sys/kernel/perf_event_paranoid)): run as root"
fi
nbdkit memory --dump-plugin >/dev/null 2>&1 ||
    die "nbdkit has no memory plugin: apt-get install nbdkit"

bench_lock
size_bytes=$(numfmt --from=iec "$size")
tck=$(getconf CLK_TCK)
# Both disks end up full, at the same time, plus room for everything else.
want_memory $((2 * size_bytes + (1 << 30))) "--size $size (both servers' disks)"

# --- build --------------------------------------------------------------------
build_ramd
ramd=$built
# Unless told otherwise each server runs with its own default thread count
# (per connection): ramd's from its --help, nbdkit's documented 16 for
# parallel plugins such as memory.
ramd_threads_opt=()
if [[ -n $ramd_threads ]]; then
    ramd_threads_opt=(--threads "$ramd_threads")
else
    ramd_threads=$("$ramd" serve --help | awk '/--threads/ { on = 1 } on && match($0, /\[default: [0-9]+\]/) {
        print substr($0, RSTART + 10, RLENGTH - 11); exit }')
    ramd_threads="${ramd_threads:-?} (default)"
fi
nbdkit_threads_opt=()
if [[ -n $nbdkit_threads ]]; then
    nbdkit_threads_opt=(--threads "$nbdkit_threads")
else
    nbdkit_threads="16 (default)"
fi

# --- memory -------------------------------------------------------------------
# On a VM the first touch of guest memory since boot is much slower than a
# process's first touch of memory the guest has used before (the hypervisor
# backs it then). Left alone, whichever server fills first would get the
# recycled pages and the other the never-touched ones. Touching and freeing
# 2 x SIZE + 256 MiB first gives both servers the same kind of memory, so
# the "cold" pass below measures each server's own first touch (page fault
# and zeroing). The speed of this pass is printed to show what the VM did.
note "pre-touching $((2 * size_bytes / 1048576 + 256)) MiB so both servers get the same kind of fresh memory"
pretouch=$(pretouch $((2 * size_bytes + (256 << 20))))

# --- servers ------------------------------------------------------------------
work=$(mktemp -d -t ramd-bench.XXXXXX)
# Raw results are kept below (fio/, cpu.tsv...), not through the trap's raw/.
bench_trap "$work" ""
mkdir -p "$work/fio"
# ramd's and nbdkit's threads are per connection, and both default to what
# each project ships; nbdkit's memory plugin with its default allocator
# (sparse).
serve_nbd "$ramd" "$work/ramd" "$size" "${ramd_threads_opt[@]}"
ramd_uri=$uri
nbdkit_opts=("${nbdkit_threads_opt[@]}")
start_nbdkit "$work/nbdkit.sock" "$size" "$work/nbdkit.log"
for s in ramd nbdkit; do
    uri_var=${s}_uri
    got=$(nbdinfo --size "${!uri_var}")
    [[ $got == "$size_bytes" ]] || die "$s exports $got bytes, expected $size_bytes"
done

# --- measuring ----------------------------------------------------------------
pid_of() { if [[ $1 == ramd ]]; then echo "$ramd_pid"; else echo "$nbdkit_pid"; fi; }
uri_of() { if [[ $1 == ramd ]]; then echo "$ramd_uri"; else echo "$nbdkit_uri"; fi; }

# mem SERVER PHASE: records VmRSS and VmHWM (KiB), and for ramd the page
# store's own count (`ramd status`, bytes).
mem() {
    local pid used=-
    pid=$(pid_of "$1")
    alive "$pid" "$1"
    if [[ $1 == ramd ]]; then
        used=$(RAMD_RUN_DIR=$work/ramd/run "$ramd" status --json |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["disks"][0]["memory_used"])')
    fi
    printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$(proc_kib "$pid" VmRSS)" "$(proc_kib "$pid" VmHWM)" \
        "$used" >>"$work/mem.tsv"
}

# job_args JOB: the fio parameters of one job, the same for both servers.
job_args() {
    case $1 in
    fill) args=(--rw=write --bs=1M --iodepth=8) ;;
    mix4k) args=(--rw=randrw --rwmixread=80 --bs=4k --iodepth=32) ;;
    # The same mix and total queue depth from two fio processes, each with
    # its own connection: one fio job tops out at one core of client CPU.
    mix4k-2conn) args=(--rw=randrw --rwmixread=80 --bs=4k --iodepth=16 --numjobs=2 --group_reporting) ;;
    qd1-randread) args=(--rw=randread --bs=4k --iodepth=1) ;;
    qd1-randwrite) args=(--rw=randwrite --bs=4k --iodepth=1) ;;
    seq-write) args=(--rw=write --bs=1M --iodepth=8) ;;
    seq-read) args=(--rw=read --bs=1M --iodepth=8) ;;
    *) die "no job $1" ;;
    esac
    if [[ $1 != fill ]]; then
        args+=(--time_based "--runtime=$runtime" "--ramp_time=$ramp")
    fi
}

# run SERVER JOB TAG: one fio run; JSON to fio/SERVER.JOB.TAG.json. Over the
# run, cpu.tsv gets the server's CPU time, fio's (the client's) and the whole
# host's, so that CPU taken by anything else shows up in the report. A timed
# run during which other processes kept more than a quarter of a core busy
# is repeated, up to twice while the BENCH_QUIET_WAIT budget lasts; the fill passes cannot be (the second would not
# be cold), so they are only reported.
run() {
    local server=$1 job=$2 tag=$3 pid t0 t1 c0 c1 h0 h1 f0 other wall try
    local args
    pid=$(pid_of "$server")
    job_args "$job"
    for try in 1 2 3; do
        alive "$pid" "$server"
        wait_quiet
        children_cpu_ms "$work/times"
        f0=$children_ms
        c0=$(cpu_ticks "$pid")
        h0=$(host_busy_ticks)
        t0=$(date +%s%N)
        # One job = one NBD connection. The nbd engine prints a line on
        # stdout, so the JSON goes to its own file.
        fio --name="$job" --ioengine=nbd --uri="$(uri_of "$server")" --size="$size" \
            --norandommap --lat_percentiles=1 "${args[@]}" \
            --output-format=json --output="$work/fio/$server.$job.$tag.json" >/dev/null ||
            die "fio $job against $server failed"
        t1=$(date +%s%N)
        h1=$(host_busy_ticks)
        c1=$(cpu_ticks "$pid")
        children_cpu_ms "$work/times"
        alive "$pid" "$server"
        # In clock ticks: host busy - server - client (ms -> ticks).
        other=$(((h1 - h0) - (c1 - c0) - (children_ms - f0) * tck / 1000))
        wall=$(((t1 - t0) * tck / 1000000000))
        # Repeats share wait_quiet's budget, so a busy host cannot stretch
        # the benchmark without bound.
        if [[ $job == fill ]] || ((other * 4 <= wall || try == 3 || quiet_budget == 0)); then
            break
        fi
        note "$job on $server: other processes took $((other * 100 / wall))% of a core meanwhile; repeating the run"
        quiet_budget=$((quiet_budget - (t1 - t0) / 1000000000))
        ((quiet_budget > 0)) || quiet_budget=0
    done
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$server" "$job" "$tag" "$((t1 - t0))" \
        "$((c1 - c0))" "$((children_ms - f0))" "$((h1 - h0))" >>"$work/cpu.tsv"
}

# profile_run JOB: JOB once per server under perf record (call graphs) and
# perf stat (context switches), then where each server's CPU went. perf
# slows the servers down, so these runs give no figures for the results.
profile_run() {
    local job=$1 s pid rec st
    mkdir -p "$work/perf"
    for s in ramd nbdkit; do
        pid=$(pid_of "$s")
        note "profiling $job on $s"
        perf record -q -F 999 -g -p "$pid" -o "$work/perf/$s.data" 2>"$work/perf/$s.record.log" &
        rec=$!
        perf stat -x, -e context-switches,cpu-migrations,task-clock -p "$pid" \
            -o "$work/perf/$s.stat" &
        st=$!
        # perf writes its file header once it has attached.
        wait_until 10 "perf record on $s" test -s "$work/perf/$s.data"
        run "$s" "$job" prof
        kill -INT "$rec" "$st"
        wait "$rec" "$st" || true
        perf report -i "$work/perf/$s.data" --stdio --children --sort sym -g none \
            >"$work/perf/$s.children.txt" 2>/dev/null || die "perf report on $s failed"
    done
    {
        echo "# where ramd and nbdkit spend their CPU during $job, $(date -u +%Y-%m-%dT%H:%MZ)"
        echo "# perf record -F 999 -g and perf stat on each server; ${runtime}s after ${ramp}s ramp"
        echo "# ramd $revision; threads per connection: ramd $ramd_threads, nbdkit $nbdkit_threads"
        echo
        python3 - "$work" "$job" <<'EOF'
import json, re, sys

work, job = sys.argv[1], sys.argv[2]
servers = ("ramd", "nbdkit")

def symbols(server):
    """symbol -> (children %, self %) from perf report --children."""
    out = {}
    with open(f"{work}/perf/{server}.children.txt") as f:
        for line in f:
            m = re.match(r"\s*([\d.]+)%\s+([\d.]+)%\s+\[[.k]\]\s+(.*?)\s*$", line)
            if m:
                out.setdefault(m[3], (float(m[1]), float(m[2])))
    return out

def share(tab, pattern, col):
    # col 0: children (an entry point and all it calls), col 1: self.
    hits = [v[col] for k, v in tab.items() if re.search(pattern, k)]
    if not hits:
        return 0.0
    return max(hits) if col == 0 else sum(hits)

cats = [
    ("kernel: all syscalls", r"^do_syscall_64$", 0),
    ("  socket receive (copy in, or sleep until a request comes)", r"^unix_stream_read_generic$", 0),
    ("  socket send (copy out, wake the client)", r"^unix_stream_sendmsg$", 0),
    ("  futex (wait for, or wake, a lock holder)", r"^__x64_sys_futex$", 0),
    ("  sched_yield (spinning for a lock)", r"^__x64_sys_sched_yield$", 0),
    ("context switch in, self (finish_task_switch)", r"^finish_task_switch", 1),
    ("wake-up IPIs, self (_raw_spin_unlock_irqrestore)", r"^_raw_spin_unlock_irqrestore$", 1),
    ("memcpy in user space, self", r"^__mem(move|cpy)_", 1),
    ("ramd_store::*, self", r"^ramd_store::", 1),
]
tabs = {s: symbols(s) for s in servers}
print("Share of each server's sampled CPU time, % (perf report --children;")
print("rows marked self count only time in the function itself):")
print()
print("| where | ramd | nbdkit |")
print("|---|---:|---:|")
for label, pattern, col in cats:
    print(f"| {label} | " + " | ".join(f"{share(tabs[s], pattern, col):.1f}" for s in servers) + " |")
print()
stats = {}
for s in servers:
    st = {}
    with open(f"{work}/perf/{s}.stat") as f:
        for line in f:
            fields = line.strip().split(",")
            if len(fields) > 3 and fields[0][:1].isdigit():
                st[fields[2]] = float(fields[0])
    with open(f"{work}/fio/{s}.{job}.prof.json") as f:
        j = json.load(f)["jobs"][0]
    stats[s] = (st, j["read"]["total_ios"] + j["write"]["total_ios"])
print("| per I/O (perf stat over the whole run, ramp included, / I/Os fio counted after the ramp) | ramd | nbdkit |")
print("|---|---:|---:|")
for label, key in (("context switches", "context-switches"), ("CPU migrations", "cpu-migrations"),
                   ("server CPU, µs", "task-clock")):
    scale = 1e3 if key == "task-clock" else 1  # task-clock is in ms
    print(f"| {label} | " + " | ".join(
        f"{stats[s][0][key] * scale / stats[s][1]:.2f}" for s in servers) + " |")
print()
for s in servers:
    top = sorted(tabs[s].items(), key=lambda kv: -kv[1][1])[:10]
    print(f"{s}, top symbols by self time: " + "; ".join(f"{k} {v[1]:.1f}%" for k, v in top))
    print()
EOF
    } | tee "$work/profile.md"
    if [[ -n $out ]]; then
        mkdir -p "$out"
        cp -r "$work/perf" "$work/fio" "$work/profile.md" "$out/"
        note "perf data and profile kept in $out"
    fi
}

mem ramd start
mem nbdkit start
note "fill pass 1 (cold: first touch of every page)"
for s in ramd nbdkit; do run "$s" fill cold; mem "$s" cold; done
note "fill pass 2 (warm: the same pages rewritten)"
for s in ramd nbdkit; do run "$s" fill warm; mem "$s" warm; done

if [[ -n $profile ]]; then
    profile_run "$profile"
    exit 0
fi

jobs=(mix4k mix4k-2conn qd1-randread qd1-randwrite seq-write seq-read)
total=$((runs * ${#jobs[@]} * 2 * (runtime + ramp)))
note "timed jobs: $runs run(s) x ${#jobs[@]} jobs x 2 servers x $((runtime + ramp)) s = about $((total / 60)) min $((total % 60)) s"
for ((r = 1; r <= runs; r++)); do
    if ((r % 2)); then order=(ramd nbdkit); else order=(nbdkit ramd); fi
    for job in "${jobs[@]}"; do
        for s in "${order[@]}"; do
            note "run $r/$runs: $job on $s"
            run "$s" "$job" "$r"
        done
    done
done
mem ramd end
mem nbdkit end

# --- report -------------------------------------------------------------------
{
    echo "# ramd vs nbdkit memory over NBD (Unix sockets), $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "# host: $(nproc) CPUs, $(awk '$1 == "MemTotal:" { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r)"
    echo "# $(fio --version), $(nbdkit --version), ramd $("$ramd" --version | awk '{ print $2 }') ($revision)"
    echo "# pre-touch of $((2 * size_bytes / 1048576 + 256)) MiB of host memory before starting the servers: $pretouch GiB/s"
    echo "# disk $size; timed jobs: ${runtime}s after ${ramp}s ramp, median of $runs run(s); threads per connection: ramd $ramd_threads, nbdkit $nbdkit_threads"
    echo
    SIZE_BYTES=$size_bytes CLK_TCK=$tck python3 - "$work" <<'EOF'
import json, os, statistics, sys
from collections import defaultdict

work = sys.argv[1]
size = int(os.environ["SIZE_BYTES"])
tck = int(os.environ["CLK_TCK"])
servers = ("ramd", "nbdkit")

def fio(server, job, tag):
    with open(f"{work}/fio/{server}.{job}.{tag}.json") as f:
        j = json.load(f)["jobs"][0]
    if j["error"]:
        sys.exit(f"fio {job} on {server} reported error {j['error']}")
    return j

def tags(job):
    names = os.listdir(f"{work}/fio")
    return sorted({n.split(".")[2] for n in names if n.startswith(f"ramd.{job}.")})

MiB = 1 << 20
# (job, label, unit, extract, better, goal)
rows = [
    ("fill", "1 MiB seq write, whole disk, pass 1 (cold)", "MiB/s",
     lambda j: j["write"]["bw_bytes"] / MiB, "higher", None, "cold"),
    ("fill", "1 MiB seq write, whole disk, pass 2 (warm)", "MiB/s",
     lambda j: j["write"]["bw_bytes"] / MiB, "higher", None, "warm"),
    ("mix4k", "4 KiB randrw 80/20 QD32: IOPS", "IOPS",
     lambda j: j["read"]["iops"] + j["write"]["iops"], "higher", 1.5, None),
    ("mix4k-2conn", "the same mix, 2 connections x QD16: IOPS", "IOPS",
     lambda j: j["read"]["iops"] + j["write"]["iops"], "higher", None, None),
    ("qd1-randread", "4 KiB randread QD1: p50", "µs",
     lambda j: j["read"]["lat_ns"]["percentile"]["50.000000"] / 1e3, "lower", None, None),
    ("qd1-randread", "4 KiB randread QD1: p99", "µs",
     lambda j: j["read"]["lat_ns"]["percentile"]["99.000000"] / 1e3, "lower", 1.0, None),
    ("qd1-randwrite", "4 KiB randwrite QD1: p50", "µs",
     lambda j: j["write"]["lat_ns"]["percentile"]["50.000000"] / 1e3, "lower", None, None),
    ("qd1-randwrite", "4 KiB randwrite QD1: p99", "µs",
     lambda j: j["write"]["lat_ns"]["percentile"]["99.000000"] / 1e3, "lower", 1.0, None),
    ("seq-write", "1 MiB seq write QD8 (warm)", "MiB/s",
     lambda j: j["write"]["bw_bytes"] / MiB, "higher", 1.0, None),
    ("seq-read", "1 MiB seq read QD8", "MiB/s",
     lambda j: j["read"]["bw_bytes"] / MiB, "higher", 1.0, None),
]

def fmt(v):
    if v >= 10000:
        return f"{v / 1000:.1f}k"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"

def spread(vals):
    m = statistics.median(vals)
    return "–" if len(vals) < 2 or m == 0 else f"{(max(vals) - min(vals)) / m * 100:.0f}%"

print("ramd and nbdkit: medians of the runs. ramd/nbdkit: the median of the per-run")
print("ratios (run r of ramd against run r of nbdkit, taken one after the other), with")
print("their range; a goal verdict says in how many runs the goal held.")
print()
print("| job | unit | ramd | nbdkit | ramd/nbdkit (range) | goal | spread ramd / nbdkit |")
print("|---|---|---:|---:|---:|---|---|")
verdicts = []
for job, label, unit, get, better, goal, only in rows:
    ts = [only] if only else tags(job)
    vals = {s: [get(fio(s, job, t)) for t in ts] for s in servers}
    med = {s: statistics.median(v) for s, v in vals.items()}
    ratios = [a / b for a, b in zip(vals["ramd"], vals["nbdkit"])]
    ratio = statistics.median(ratios)
    rng = f" ({min(ratios):.2f}–{max(ratios):.2f})" if len(ratios) > 1 else ""
    if goal is None:
        g = f"({better} is better)"
    else:
        holds = (lambda r: r >= goal) if better == "higher" else (lambda r: r <= goal)
        ok = holds(ratio)
        n = sum(map(holds, ratios))
        g = (f"{'≥' if better == 'higher' else '≤'} {goal:.1f}: {'MET' if ok else 'MISSED'}"
             f" ({n} of {len(ratios)} runs)")
        verdicts.append((label, ok, n, len(ratios)))
    sp = f"{spread(vals['ramd'])} / {spread(vals['nbdkit'])}" if not only else "1 run"
    print(f"| {label} | {unit} | {fmt(med['ramd'])} | {fmt(med['nbdkit'])} | {ratio:.2f}{rng} | {g} | {sp} |")

print()
print("CPU while each job ran, in cores busy (CPU-seconds per wall-second; the host")
print("has 2): the server, fio (the client), and everything else on the host")
print("(an estimate from tick-sampled /proc/stat; runs where it passed 0.25 were repeated).")
print("Median of runs; CPU per I/O counts the server's time over the whole run.")
print()
cpu = defaultdict(list)
with open(f"{work}/cpu.tsv") as f:
    for line in f:
        s, job, tag, ns, server_t, client_ms, host_t = line.split()
        wall = int(ns) / 1e9
        cpu[(s, job)].append(dict(
            tag=tag, server=int(server_t) / tck / wall, client=int(client_ms) / 1e3 / wall,
            other=(int(host_t) / tck - int(server_t) / tck - int(client_ms) / 1e3) / wall))
print("| job | ramd | fio→ramd | other | nbdkit | fio→nbdkit | other | ramd µs/I/O | nbdkit µs/I/O |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
noisy = []
for job in ["fill", "mix4k", "mix4k-2conn", "qd1-randread", "qd1-randwrite", "seq-write", "seq-read"]:
    cells, per_io = [], []
    for s in servers:
        runs = cpu[(s, job)]
        med = {k: statistics.median(r[k] for r in runs) for k in ("server", "client", "other")}
        # Tick-sampled host time undercounts short sleeps (QD1): clamp at 0.
        cells += [f"{med['server']:.2f}", f"{med['client']:.2f}", f"{max(med['other'], 0):.2f}"]
        noisy += [f"{job} on {s} run {r['tag']}: {r['other']:.2f}" for r in runs if r["other"] > 0.25]
        def io_rate(t):
            j = fio(s, job, t)
            return j["read"]["iops"] + j["write"]["iops"]
        per_io.append(statistics.median(r["server"] / io_rate(r["tag"]) * 1e6 for r in runs))
    print(f"| {job} | {' | '.join(cells)} | {per_io[0]:.1f} | {per_io[1]:.1f} |")
if noisy:
    print()
    print("WARNING: other processes used CPU during these runs (cores); their figures")
    print("are suspect, rerun on a quiet host:", "; ".join(noisy))
print()
mem = {}
with open(f"{work}/mem.tsv") as f:
    for line in f:
        s, phase, rss, hwm, used = line.split()
        mem[(s, phase)] = (int(rss) * 1024, int(hwm) * 1024, used)
phases = [
    ("start", "started, empty disk"),
    ("cold", f"after fill pass 1: {size / MiB:.0f} MiB written to fresh (cold) pages"),
    ("warm", "after fill pass 2: the same pages rewritten (warm)"),
    ("end", "after all timed jobs"),
]
print(f"Memory: VmRSS (resident now) and VmHWM (peak resident) from /proc/PID/status,")
print(f"in MiB; the same {size / MiB:.0f} MiB of random data written to both disks.")
print()
print("| phase | ramd RSS | ramd HWM | nbdkit RSS | nbdkit HWM | HWM ramd/nbdkit | ramd store memory_used |")
print("|---|---:|---:|---:|---:|---:|---:|")
for key, label in phases:
    r, n = mem[("ramd", key)], mem[("nbdkit", key)]
    used = f"{int(r[2]) / MiB:.1f}" if r[2] != "-" else "–"
    print(f"| {label} | {r[0] / MiB:.1f} | {r[1] / MiB:.1f} | {n[0] / MiB:.1f} | {n[1] / MiB:.1f} "
          f"| {r[1] / n[1]:.3f} | {used} |")
print()
for s in servers:
    over = mem[(s, "end")][1] - mem[(s, "start")][0] - size
    print(f"{s}: peak RSS above its empty start, beyond the {size / MiB:.0f} MiB of data: "
          f"{over / MiB:+.1f} MiB ({over / size * 100:+.2f}%)")
print()
met = [f"{label} ({n}/{k} runs)" for label, ok, n, k in verdicts if ok]
missed = [f"{label} ({n}/{k} runs)" for label, ok, n, k in verdicts if not ok]
print(f"Goals met ({len(met)}/{len(verdicts)}): {'; '.join(met) or 'none'}")
print(f"Goals missed: {'; '.join(missed) or 'none'}")
EOF
} | tee "$work/summary.md"

if [[ -n $out ]]; then
    mkdir -p "$out"
    cp -r "$work/fio" "$work/cpu.tsv" "$work/mem.tsv" "$work/summary.md" "$out/"
    note "raw results kept in $out"
fi
