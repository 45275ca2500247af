#!/usr/bin/env bash
# A standby (`ramd serve --image s3://... --standby`) against its writer:
# how far behind it runs under steady writes, and how long a failover
# takes from the writer's death to the first write the promoted standby
# takes. See BENCHMARKS.md, "A standby: lag and failover".
#
# usage: bench/standby.sh [--autosave D] [--poll D] [--lease SECS]
#                         [--duration SECS] [--runs N] [--rate IOPS]
#                         [--size SIZE] [--dir DIR] [--out DIR]
#
#   --autosave D    the writer's --autosave (default 5s)
#   --poll D        the standby's --standby-poll (default 500ms, ramd's own)
#   --lease SECS    the lease's term, RAMD_LEASE_SECS (default 10; ramd's
#                   own is 60 s, which only makes each failover run wait
#                   longer: the goal is measured from the lease's expiry)
#   --duration SECS how long the lag is sampled (default 60)
#   --runs N        failovers of each kind (default 3)
#   --rate IOPS     fio's steady rate of 4 KiB random writes (default 1000)
#   --size SIZE     disk size (powers of 1024; default 256M)
#   --dir DIR       where SeaweedFS keeps its data: a mktemp directory is
#                   made in DIR and removed at the end (default /var/tmp)
#   --out DIR       also keep the raw figures in DIR (results.tsv, samples,
#                   logs, summary.md)
#
# Environment: BENCH_QUIET_WAIT (see bench/lib.sh) bounds the wait for a
# quiet host.
#
# Server: SeaweedFS (`weed mini`) on loopback, started by bench/lib.sh's
# start_weed; built by scripts/install-test-tools.
#
# Steps:
#   1. lag: writer W (`ramd serve --size SIZE --image s3://BUCKET/lag
#      --autosave D`, one save made first) and standby S (`--image
#      s3://BUCKET/lag --standby --standby-poll D`), each on its own unix
#      socket and run dir; fio (nbd engine) writes 4 KiB pages at random at
#      RATE IOPS to W throughout. Every 0.5 s for SECS seconds, `ramd status
#      --json` of both: W's last committed save, S's applied_seq, lag_secs
#      and saves_behind. Reported: S's lag_secs (seconds since the switch of
#      the save it holds: how old its data is), p50 and max; and per save,
#      the seconds from the first sample in which W reports it committed to
#      the first in which S reports it applied (p50 and max; the samples'
#      spacing bounds the error to ±0.5 s)
#   2. failover, RUNS times each way, each on a fresh prefix: W and S as
#      above under the same fio writes; after a random wait of two to four
#      autosave intervals W is killed (SIGKILL) and at once `ramd promote
#      bench` (`--wait 120s`: once the lease expires; `--force`: at once)
#      runs, while a client (python3's libnbd) connects to S again and
#      again until a 4 KiB write succeeds. Reported: seconds from the kill
#      to that write, and (--wait) from the lease's expiry (as the
#      promotion logged it) to that write. Checked: the last save S applied
#      before its own is the last W committed (its MANIFEST's, read back
#      after), and none of W's logged commits is later.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

autosave=5s poll=500ms lease=10 duration=60 runs=3 rate=1000 size=256M dir=/var/tmp out=""
bench_args --autosave= --poll= --lease= --duration= --runs= --rate= --size= --dir= --out= -- "$@"
secs_of() {
    [[ $1 =~ ^([0-9]+(\.[0-9]+)?)(ms|s|m)$ ]] || die "'$1': use a duration like 500ms, 5s or 1m"
    awk -v n="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" \
        'BEGIN { printf "%g\n", u == "ms" ? n / 1000 : u == "m" ? n * 60 : n }'
}
autosave_s=$(secs_of "$autosave")
secs_of "$poll" >/dev/null # checked here, passed to ramd as given
for v in lease duration runs rate; do
    want_count "--$v" "${!v}"
done
want_size --size "$size"
want_dir --dir "$dir"

# --- tools and host -----------------------------------------------------------
need nbdinfo libnbd-bin
need jq jq
need python3 python3
need numfmt coreutils
need_pynbd
want_fio_nbd
need_weed

bench_lock
size_bytes=$(numfmt --from=iec "$size")

# --- build --------------------------------------------------------------------
build_ramd

# --- work directory -------------------------------------------------------------
work=$(mktemp -d "$dir/ramd-standby.XXXXXX")
bench_trap "$work" "$out"
fio_pid=""
mkdir -p "$work/raw"
copy_ramd
export RAMD_LEASE_SECS=$lease
results=$work/raw/results.tsv
: >"$results"
record() { printf '%s\t%s\n' "$1" "$2" >>"$results"; }
record loadavg_start "$(cut -d' ' -f1-3 /proc/loadavg)"

bucket=ramdbench
start_weed "$weed" "$work/weed" "$work/raw/weed.log" "$bucket" ramdbench ramdbenchsecret0123456789
lenient "$weed_pid"
# Ready once it answers a listing: "no image here" comes from the server.
# shellcheck disable=SC2317 # called by wait_until
weed_up() {
    local said
    alive "$weed_pid" "weed mini"
    said=$("$ramd" image ls "s3://$bucket/probe" 2>&1) || true
    [[ $said == *"no image here"* ]]
}
note "starting SeaweedFS (weed mini) on $endpoint"
wait_until 120 "weed mini's S3 at $endpoint" weed_up

# --- helpers ------------------------------------------------------------------
# ctl NAME ARGS...: the ramd CLI on the server in $work/NAME.
ctl() {
    local n=$1
    shift
    RAMD_RUN_DIR=$work/$n/run "$ramd" "$@"
}
# pair PREFIX W S: writer in $work/W, one save, standby in $work/S, which
# has applied it; fio writing to the writer. Sets w_pid, s_pid, s_uri.
pair() {
    local img=s3://$bucket/$1
    serve_nbd "$ramd" "$work/$2" "$size" --name bench --image "$img" --autosave "$autosave"
    w_pid=$ramd_pid
    local w_uri=$uri
    ctl "$2" snapshot bench >/dev/null || die "the first save to $img failed"
    serve_nbd "$ramd" "$work/$3" - --name bench --image "$img" --standby --standby-poll "$poll"
    s_pid=$ramd_pid s_uri=$uri
    pair_s=$3
    # shellcheck disable=SC2317 # called by wait_until
    _applied() { [[ $(ctl "$pair_s" status --json | jq '.disks[0].standby.applied_seq') -ge 1 ]]; }
    wait_until 60 "the standby of $img (save 1 applied)" _applied
    # --thread: a job process (fio's default) starts its own session, so
    # it outlives a signal to fio. Its output is capped (SIGXFSZ ends it):
    # once its server is gone, fio 3.33's nbd engine logs "nothing to poll
    # for in state DEAD" in a tight loop, gigabytes a minute.
    # Started last, so that at exit it stops before the servers.
    spawn fio steady_fio "$w_uri" "$work/raw/fio-$1.out" >/dev/null 2>&1
    fio_pid=$spawned
}
# shellcheck disable=SC2317 # called by spawn
steady_fio() {
    ulimit -f 1024
    exec fio --name=steady --ioengine=nbd --uri="$1" --thread --rw=randwrite --bs=4k \
        --iodepth=4 --rate_iops="$rate" --time_based --runtime=3600 --size="$size_bytes" \
        --output="$2"
}
stop_fio() {
    kill -KILL "$fio_pid" 2>/dev/null || true
    reap_server "$fio_pid" 2>/dev/null || true
    fio_pid=""
}
# down NAME PID: a clean stop through the CLI.
down() {
    ctl "$1" down bench >/dev/null || die "ramd down bench ($1) failed"
    wait_until 120 "ramd ($1) to stop" bash -c "! kill -0 $2 2>/dev/null"
    reap_server "$2" 2>/dev/null || die "ramd ($1) exited with status $?"
}

# --- 1. lag under steady writes -----------------------------------------------------
wait_quiet
note "lag: writer --autosave $autosave, standby --standby-poll $poll, fio at $rate IOPS, sampled for ${duration}s"
record lag_loadavg "$(cut -d' ' -f1 /proc/loadavg)"
pair lag lag-w lag-s
h0=$(host_busy_ticks)
python3 - "$ramd" "$work/lag-w/run" "$work/lag-s/run" "$duration" >"$work/raw/lag-samples.tsv" <<'EOF'
import json, os, subprocess, sys, time
ramd, wrun, srun, duration = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
def status(run):
    out = subprocess.run([ramd, "status", "--json"], env=dict(os.environ, RAMD_RUN_DIR=run),
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)["disks"][0]
print("t\twriter_seq\tapplied_seq\tlag_secs\tsaves_behind\terror")
start = time.time()
k = 0
while True:
    tick = start + 0.5 * k
    k += 1
    if tick > start + duration:
        break
    time.sleep(max(0.0, tick - time.time()))
    t = time.time()
    w, s = status(wrun), status(srun)
    sb = s["standby"]
    print(f"{t:.3f}\t{(w['last_save'] or {}).get('seq', 0)}\t{sb['applied_seq']}\t{sb['lag_secs']:.3f}"
          f"\t{sb['saves_behind']}\t{sb['error'] or ''}", flush=True)
EOF
h1=$(host_busy_ticks)
alive "$fio_pid" "fio (writing to the writer throughout)"
record lag_host_cores "$(awk -v t=$((h1 - h0)) -v tck="$(getconf CLK_TCK)" -v d="$duration" 'BEGIN { printf "%.2f", t / tck / d }')"
stop_fio
cp "$work/lag-s/ramd.log" "$work/raw/lag-standby.log"
cp "$work/lag-w/ramd.log" "$work/raw/lag-writer.log"
down lag-w "$w_pid"
down lag-s "$s_pid"

# --- 2. failover ----------------------------------------------------------------------
# first_write URI: connects to URI again and again until a 4 KiB write is
# taken and flushed; prints when (seconds since the epoch).
first_write() {
    "$pynbd" - "$1" <<'EOF'
import nbd, sys, time
deadline = time.time() + 300
while time.time() < deadline:
    h = nbd.NBD()
    try:
        h.connect_uri(sys.argv[1])
        if not h.is_read_only():
            h.pwrite(b"\x5a" * 4096, 0)
            h.flush()
            print(f"{time.time():.3f}")
            sys.exit(0)
    except nbd.Error:
        pass
    del h  # disconnects
    time.sleep(0.02)
sys.exit("no write was taken within 300 s")
EOF
}
for mode in wait force; do
    for r in $(seq 1 "$runs"); do
        key=fo_${mode}_$r
        wait_quiet
        note "failover $r/$runs (promote --$mode)"
        record "${key}_loadavg" "$(cut -d' ' -f1 /proc/loadavg)"
        pair "$key" "$key-w" "$key-s"
        # A random moment in the autosave and lease renewal cycles, a few
        # saves in (one may be uploading).
        sleep "$(awk -v a="$autosave_s" -v s=$RANDOM 'BEGIN { printf "%.2f", a * (2 + 2 * s / 32768) }')"
        alive "$w_pid" "the writer"
        t_kill=$(date +%s.%N)
        kill -KILL "$w_pid"
        case $mode in
        wait) flags=(--wait 120s) ;;
        force) flags=(--force) ;;
        esac
        ctl "$key-s" promote bench --json "${flags[@]}" >"$work/raw/$key-promote.json" &
        promote_pid=$!
        t_write=$(first_write "$s_uri") || die "$key: the promoted standby took no write"
        wait "$promote_pid" || die "$key: ramd promote ${flags[*]} failed"
        reap_server "$w_pid" 2>/dev/null || true
        stop_fio
        p_seq=$(jq -e .seq "$work/raw/$key-promote.json")
        cp "$work/$key-s/ramd.log" "$work/raw/$key-standby.log"
        cp "$work/$key-w/ramd.log" "$work/raw/$key-writer.log"
        # The last save the standby applied, and the writer's last logged commit.
        applied=$(sed -n 's/.*standby: applied .* save \([0-9]*\) of image.*/\1/p' "$work/raw/$key-standby.log" | tail -n 1)
        logged=$(sed -n 's/.*saved [a-z]* save \([0-9]*\) .*/\1/p' "$work/raw/$key-writer.log" | tail -n 1)
        chain=$("$ramd" image info "s3://$bucket/$key" --json | jq -c '[.chain[].seq]') ||
            die "$key: ramd image info s3://$bucket/$key failed"
        expires=$(sed -n 's/.*promoting: waiting for the lease held by .* to run out at \(.* UTC\) (in .*/\1/p' \
            "$work/raw/$key-standby.log" | tail -n 1)
        record "${key}_kill" "$t_kill"
        record "${key}_write" "$t_write"
        record "${key}_expires" "${expires:+$(date -u -d "$expires" +%s)}"
        record "${key}_promoted_seq" "$p_seq"
        record "${key}_applied_seq" "${applied:-0}"
        record "${key}_writer_logged_seq" "${logged:-0}"
        record "${key}_chain" "$chain"
        down "$key-s" "$s_pid"
    done
done
record loadavg_end "$(cut -d' ' -f1-3 /proc/loadavg)"

# --- report ---------------------------------------------------------------------
{
    echo "# ramd standby: lag and failover, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "# host: $(nproc) CPUs, kernel $(uname -r); load average at start $(awk -F'\t' '$1 == "loadavg_start" { print $2 }' "$results"), at end $(awk -F'\t' '$1 == "loadavg_end" { print $2 }' "$results")"
    echo "# ramd $("$ramd" --version | awk '{ print $2 }') at $commit; SeaweedFS $("$weed" version 2>&1 | awk '/version/ { print $3; exit }') (weed mini on loopback)"
    echo "# --autosave $autosave, --standby-poll $poll, RAMD_LEASE_SECS=$lease, fio 4 KiB random writes at $rate IOPS, $size disk"
    echo
    python3 - "$work/raw" "$autosave_s" "$runs" <<'EOF'
import json, statistics, sys
raw, autosave, runs = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
r = {}
with open(f"{raw}/results.tsv") as f:
    for line in f:
        k, _, v = line.rstrip("\n").partition("\t")
        r[k] = v
rows = []
with open(f"{raw}/lag-samples.tsv") as f:
    next(f)
    for line in f:
        t, ws, sa, lag, behind, err = line.rstrip("\n").split("\t")
        rows.append((float(t), int(ws), int(sa), float(lag), int(behind), err))
def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]
def verdict(ok):
    return "met" if ok else "MISSED"
lags = [x[3] for x in rows]
errors = sorted({x[5] for x in rows if x[5]})
# Per save: first sample the writer reports it committed, first the
# standby reports it applied.
first_w, first_s = {}, {}
for t, ws, sa, *_ in rows:
    for s in range(1, ws + 1):
        first_w.setdefault(s, t)
    for s in range(1, sa + 1):
        first_s.setdefault(s, t)
seen_from = rows[0][1] + 1  # saves committed before sampling began are not timed
delays = [first_s[s] - first_w[s] for s in sorted(first_w) if s >= seen_from and s in first_s]
goal = autosave + 2
print(f"| lag under steady writes ({len(rows)} samples, 0.5 s apart) | p50 | max | goal |")
print("|---|---:|---:|---|")
print(f"| standby's lag_secs: age of the save it holds (s) | {pct(lags, 50):.2f} | {max(lags):.2f} "
      f"| ≤ autosave + 2 = {goal:g}: {verdict(max(lags) <= goal)} |")
if delays:
    print(f"| writer's commit → standby applied, per save, ±0.5 s ({len(delays)} saves) (s) | {pct(delays, 50):.2f} "
          f"| {max(delays):.2f} | ≤ {goal:g}: {verdict(max(delays) <= goal)} |")
print(f"| saves_behind | {pct([x[4] for x in rows], 50)} | {max(x[4] for x in rows)} | |")
print()
print(f"Host busy during the sampling: {r['lag_host_cores']} cores on average (everything: both ramd, "
      f"SeaweedFS, fio, the sampler); 1-min load average at its start {r['lag_loadavg']}."
      + (f" Standby errors seen: {'; '.join(errors)}." if errors else " No standby error."))
print()
print("| failover (kill -9 of the writer under writes) | kill → first write (s), each run | lease expiry → first write (s), each run | goal | every committed save |")
print("|---|---|---|---|---|")
for mode in ("wait", "force"):
    kw, ew, ok_all, oks = [], [], True, []
    for i in range(1, runs + 1):
        k = f"fo_{mode}_{i}"
        kill, write = float(r[f"{k}_kill"]), float(r[f"{k}_write"])
        kw.append(write - kill)
        if r.get(f"{k}_expires"):
            ew.append(write - float(r[f"{k}_expires"]))
        p, a, lg = int(r[f"{k}_promoted_seq"]), int(r[f"{k}_applied_seq"]), int(r[f"{k}_writer_logged_seq"])
        chain = json.loads(r[f"{k}_chain"])
        # The MANIFEST after: the writer's last commit, then the promotion's.
        ok = a == p - 1 and lg <= a and chain[-2:] == [p - 1, p]
        ok_all &= ok
        oks.append(f"promoted save {p}, applied {a}, writer logged {lg}")
    fmt = lambda xs: ", ".join(f"{x:.2f}" for x in xs)
    if mode == "wait":
        g = f"≤ 1 after expiry: {verdict(len(ew) == runs and max(ew) <= 1)}"
        label = "`promote --wait 120s` (waits for the lease)"
    else:
        g = "(no goal: at once)"
        label = "`promote --force`"
    print(f"| {label} | {fmt(kw)} | {fmt(ew) if ew else '-'} | {g} | {'yes' if ok_all else 'NO'}: {'; '.join(oks)} |")
print()
print("Load average at each failover's start: " + ", ".join(
    f"{m} {i}: {r[f'fo_{m}_{i}_loadavg']}" for m in ("wait", "force") for i in range(1, runs + 1)) + ".")
EOF
} | tee "$work/raw/summary.md"
grep -q "| NO:" "$work/raw/summary.md" && die "a promotion lacked a committed save (see above)"
exit 0
