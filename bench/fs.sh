#!/usr/bin/env bash
# Filesystem benchmark: ramd's `fs` disks (FUSE) against kernel tmpfs and
# libfuse's passthrough_hp over a tmpfs, the same jobs on every mount in one
# run. See BENCHMARKS.md ("Filesystem: ramd vs kernel tmpfs") for what the
# figures mean.
#
# usage: bench/fs.sh [--quick] [--runs N] [--threads N] [--ramd-opts "OPTS"] [--out DIR]
#
#   --quick        smoke run: 1 run (unless --runs), small sizes, 3 s timed
#                  jobs: about 3 min; a full run takes about 10 min
#   --runs N       runs of every job; the table shows medians (default 3)
#   --threads N    ramd FUSE worker threads (default: ramd's own, 8)
#   --ramd-opts "OPTS"
#                  more `ramd serve` options for both ramd mounts, e.g.
#                  "--no-writeback-cache" or "--data-path kernel"
#   --out DIR      also keep the raw results (TSV, fio JSON, tool output) in DIR
#
# Targets, all 2 GiB, mounted under one mktemp directory:
#   ramd      ramd serve --mount (default options: FUSE over io_uring where
#             the kernel has it; the kernel data path where passthrough can
#             be had, else the store path with its write-back cache)
#   ramd-dev  the same with --fuse-transport dev (read/write on /dev/fuse)
#   tmpfs     mount -t tmpfs -o size=2G
#   pthp      libfuse 3.17.2's example/passthrough_hp (C++, multi-threaded
#             low-level API) mirroring a directory of its own
#             `mount -t tmpfs -o size=2G`, with FUSE passthrough (its
#             default: reads and writes of an open file go to the tmpfs file
#             in the kernel), attribute and entry caching (its default, 1
#             day), --clone-fd (a /dev/fuse descriptor per worker thread).
#             The source comes from Debian's archive (the fuse3 .orig
#             tarball, sha256 pinned below), built once with meson and ninja
#             under ${XDG_CACHE_HOME:-~/.cache}/ramd-bench/ and reused
#
# Jobs (each run visits the targets in a rotated order):
#   dd        1 MiB sequential write of 1 GiB (conv=fsync) from /dev/zero and
#             from a random file on a separate tmpfs; then read it back after
#             drop_caches ("cold") and again ("warm"); after another
#             drop_caches the copy is compared with its source (cmp), untimed
#   fio       4 KiB randread then randwrite, buffered, QD1 (psync), 512 MiB
#             file, 15 s each: IOPS and p99 completion latency; then 5 s of
#             randread with the page cache kept (--invalidate=0) after a
#             sequential read of the file
#   bench     `ramd bench TMPFS RAMD RAMD-DEV PTHP --runs N --size 1G --json
#             --only seqwr,seqrd,rndrw,pg-fsync,metadata` (it alternates the
#             mounts itself): sysbench-fileio-style seqwr, seqrd, rndrw (16
#             KiB blocks, 16 files), pg_test_fsync-style 8 kB write +
#             fdatasync, untar/stat/remove of a tree of small files
#             (without pthp when its descriptor limit cannot hold the tree's
#             files: see job_bench)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

runs="" threads="" out="" quick=0 ramd_opts=""
bench_args --quick --runs= --threads= --ramd-opts= --out= -- "$@"
read -ra ramd_opts <<<"$ramd_opts"
# One benchmark at a time: two on 2 cores would measure each other.
bench_lock
[[ -n $runs ]] || { if ((quick)); then runs=1; else runs=3; fi; }
want_count --runs "$runs"
[[ -z $threads ]] || want_count --threads "$threads"

if ((quick)); then
    dd_mib=256 bench_size=256M fio_size=128M fio_time=3 fio_warm_time=2
else
    dd_mib=1024 bench_size=1G fio_size=512M fio_time=15 fio_warm_time=5
fi

# --- tools -------------------------------------------------------------------
want_root "it mounts tmpfs and writes /proc/sys/vm/drop_caches"
need fio fio
need python3 python3
need findmnt util-linux
avail_kib=$(awk '$1 == "MemAvailable:" { print $2 }' /proc/meminfo)
# Four 2 GiB mounts (each job removes its files before the next; pthp's data
# lives on its source tmpfs only) and the random source file; 6 GiB leaves
# room for everyone else.
((avail_kib > 6 * 1024 * 1024)) || die "needs 6 GiB of available memory; MemAvailable is $((avail_kib / 1024)) MiB"

# --- build --------------------------------------------------------------------
build_ramd

# passthrough_hp: libfuse's own example of a fast passthrough filesystem, as
# the FUSE peer. Debian's archive keeps libfuse's release tarball (as the
# fuse3 source package's .orig), so a fresh machine can fetch it.
libfuse_version=3.17.2
libfuse_sha256=3d932431ad94e86179e5265cddde1d67aa3bb2fb09a5bd35c641f86f2b5ed06f
libfuse_url=https://deb.debian.org/debian/pool/main/f/fuse3/fuse3_$libfuse_version.orig.tar.gz
bench_cache=${XDG_CACHE_HOME:-$HOME/.cache}/ramd-bench
libfuse_dir=$bench_cache/fuse-$libfuse_version
pthp_built=$libfuse_dir/build/example/passthrough_hp
# The built tree moves into place only once complete: a half build is never
# reused.
build_pthp() {
    local tgz=$bench_cache/fuse3_$libfuse_version.orig.tar.gz tmp
    need curl curl
    need meson meson
    need ninja ninja-build
    need pkg-config pkg-config
    need c++ g++
    mkdir -p "$bench_cache"
    if [[ ! -s $tgz ]]; then
        note "downloading $libfuse_url"
        curl -fsSL --retry 3 -o "$tgz.part" "$libfuse_url" || die "could not download $libfuse_url"
        mv "$tgz.part" "$tgz"
    fi
    [[ $(sha256sum "$tgz" | cut -d' ' -f1) == "$libfuse_sha256" ]] ||
        die "$tgz: sha256 is not $libfuse_sha256 (remove it to download it again)"
    tmp=$(mktemp -d "$bench_cache/build.XXXXXX")
    note "building libfuse $libfuse_version's passthrough_hp in $tmp (meson + ninja, about 15 s)"
    tar -xzf "$tgz" -C "$tmp" || die "could not unpack $tgz"
    (cd "$tmp/fuse-$libfuse_version" &&
        meson setup build --buildtype=release -Dutils=false -Dtests=false -Dexamples=true &&
        ninja -C build example/passthrough_hp) >"$tmp/build.log" 2>&1 ||
        die "building passthrough_hp failed: see $tmp/build.log"
    rm -rf "$libfuse_dir"
    mv "$tmp/fuse-$libfuse_version" "$libfuse_dir"
    rm -rf "$tmp"
}
[[ -x $pthp_built ]] || build_pthp
[[ -x $pthp_built ]] || die "$pthp_built was not built"
# The binary finds its libfuse3.so through an $ORIGIN-relative rpath, inside
# the build tree: run it from there.
pthp_sha=$(sha256sum "$pthp_built" | cut -c1-12)

# --- mounts -------------------------------------------------------------------
work=$(mktemp -d -t ramd-fsbench.XXXXXX)
targets=(ramd ramd-dev tmpfs pthp)
# pid_of: the server process of each FUSE target; what_of: its name in messages.
declare -A pid_of=() mnt_of=() what_of=([ramd]="ramd (ramd)" [ramd-dev]="ramd (ramd-dev)" [pthp]=passthrough_hp)
for t in "${targets[@]}"; do mnt_of[$t]=$work/mnt-$t; done
# pthp's source directory: a tmpfs of its own.
pthp_src=$work/pthp-src

bench_trap "$work" "$out"
mkdir -p "$work/raw" "${mnt_of[@]}" "$work/src" "$pthp_src"
# FUSE mounts a server left behind go after the servers stop.
for t in "${targets[@]}"; do at_exit unmount "${mnt_of[$t]}"; done
copy_ramd

# start_ramd TARGET [ramd options...]: serve a 2 GiB fs disk at TARGET's mount
# point; ready once it has printed the mount point and the mount is there.
start_ramd() {
    local t=$1 m=${mnt_of[$1]}
    shift
    mkdir -p "$work/run-$t"
    RAMD_RUN_DIR=$work/run-$t spawn "ramd ($t)" "$ramd" serve --mount "$m" --size 2G ${threads:+--threads "$threads"} \
        "${ramd_opts[@]}" "$@" \
        >"$work/ramd-$t.out" 2>"$work/raw/ramd-$t.log"
    pid_of[$t]=$spawned
}
ramd_ready() {
    local t=$1
    alive "${pid_of[$t]}" "ramd ($t)"
    [[ -s $work/ramd-$t.out && $(head -n 1 "$work/ramd-$t.out") == "${mnt_of[$t]}" ]] &&
        [[ $(findmnt -n -o FSTYPE --mountpoint "${mnt_of[$t]}") == fuse.ramd ]]
}
# fuse_transport TARGET: the transport serving TARGET's mount, as `ramd
# status --json` reports it.
fuse_transport() {
    RAMD_RUN_DIR=$work/run-$1 "$ramd" status --json |
        python3 -c 'import json, sys; print(json.load(sys.stdin)["disks"][0]["frontends"][0].get("transport"))'
}
# passthrough_hp's options (see the header): --foreground keeps it this
# script's child, so it is stopped like ramd; passthrough and caching are its
# defaults (no --nopassthrough, --nocache, --direct-io).
pthp_opts=(--foreground --clone-fd)
start_pthp() {
    mount_tmpfs 2G "$pthp_src"
    # Not its stdin: a leftover must not hold it.
    spawn passthrough_hp "$pthp_built" "${pthp_opts[@]}" "$pthp_src" "${mnt_of[pthp]}" \
        </dev/null >"$work/pthp.out" 2>"$work/raw/pthp.log"
    pid_of[pthp]=$spawned
    # It exits 1 when a signal ends its loop.
    clean_status "$spawned" 1
}
pthp_ready() {
    alive "${pid_of[pthp]}" passthrough_hp
    # A low-level libfuse mount without a subtype: "fuse", named after its source.
    [[ $(findmnt -n -o FSTYPE --mountpoint "${mnt_of[pthp]}") == fuse &&
        $(findmnt -n -o SOURCE --mountpoint "${mnt_of[pthp]}") == "$(realpath "$pthp_src")" ]]
}
start_ramd ramd
start_ramd ramd-dev --fuse-transport dev
start_pthp
mount_tmpfs 2G "${mnt_of[tmpfs]}"
mount_tmpfs $((dd_mib + 64))M "$work/src"
wait_until 30 "ramd mount at ${mnt_of[ramd]}" ramd_ready ramd
wait_until 30 "ramd --fuse-transport dev mount at ${mnt_of[ramd-dev]}" ramd_ready ramd-dev
wait_until 30 "passthrough_hp mount at ${mnt_of[pthp]}" pthp_ready
# passthrough_hp falls back to passing reads and writes through itself, with
# only a line on stderr, when the kernel refuses a backing file: open, write
# and read a file once and refuse to measure that fallback.
pthp_probe=${mnt_of[pthp]}/probe
if ! { dd if=/dev/zero of="$pthp_probe" bs=1M count=4 conv=fsync 2>/dev/null && cat "$pthp_probe" >/dev/null; }; then
    die "passthrough_hp: probe write/read failed: $(cat "$work/raw/pthp.log")"
fi
rm -f "$pthp_probe"
! grep -qi passthrough "$work/raw/pthp.log" || die "passthrough_hp runs without FUSE passthrough: $(cat "$work/raw/pthp.log")"
for t in "${targets[@]}"; do
    got=$(df -B1 --output=size "${mnt_of[$t]}" | tail -n 1 | tr -d ' ')
    [[ $got == $((2 << 30)) ]] || die "$t: ${mnt_of[$t]} is $got bytes, expected 2 GiB"
done
note "preparing the ${dd_mib} MiB random source file (on its own tmpfs)"
head -c "$((dd_mib << 20))" /dev/urandom >"$work/src/random.bin"

# --- measuring ----------------------------------------------------------------
results=$work/raw/results.tsv
: >"$results"
# record KEY LABEL UNIT GOAL TARGET RUN VALUE: one measured figure.
record() { printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$results"; }


# dd_mibs FILE: MiB/s from dd's last stderr line ("N bytes (...) copied, S s, ...").
dd_mibs() {
    tail -n 1 "$1" | awk '$0 ~ / copied, / { printf "%.1f", $1 / 1048576 / $(NF - 3); ok = 1 } END { exit !ok }' ||
        die "no dd summary in $1: $(cat "$1")"
}

job_dd() {
    local t=$1 r=$2 d=${mnt_of[$1]} raw=$work/raw/dd.$1.$2 v
    rm -f "$d/dd.zero" "$d/dd.rand"
    timeout 300 dd if=/dev/zero of="$d/dd.zero" bs=1M count="$dd_mib" conv=fsync 2>"$raw.wzero" ||
        die "dd write zeros on $t failed: $(cat "$raw.wzero")"
    v=$(dd_mibs "$raw.wzero")
    record dd-wz "dd 1 MiB write, zeros, conv=fsync" MiB/s - "$t" "$r" "$v"
    rm -f "$d/dd.zero"
    timeout 300 dd if="$work/src/random.bin" of="$d/dd.rand" bs=1M count="$dd_mib" conv=fsync 2>"$raw.wrand" ||
        die "dd write random on $t failed: $(cat "$raw.wrand")"
    v=$(dd_mibs "$raw.wrand")
    record dd-wr "dd 1 MiB write, random data, conv=fsync" MiB/s - "$t" "$r" "$v"
    drop_caches
    timeout 300 dd if="$d/dd.rand" of=/dev/null bs=1M 2>"$raw.rcold" || die "dd cold read on $t failed: $(cat "$raw.rcold")"
    v=$(dd_mibs "$raw.rcold")
    record dd-rc "dd 1 MiB read, cold (after drop_caches)" MiB/s - "$t" "$r" "$v"
    timeout 300 dd if="$d/dd.rand" of=/dev/null bs=1M 2>"$raw.rwarm" || die "dd warm read on $t failed: $(cat "$raw.rwarm")"
    v=$(dd_mibs "$raw.rwarm")
    record dd-rw "dd 1 MiB read, warm (page cache)" MiB/s - "$t" "$r" "$v"
    # Correctness, untimed: read back from the filesystem itself, not the page cache.
    drop_caches
    cmp "$work/src/random.bin" "$d/dd.rand" || die "$t: dd.rand differs from its source (after drop_caches)"
    rm -f "$d/dd.rand"
}

# fio_val JSON EXPR: a figure from fio's JSON (j = jobs[0]); fails on a job error.
fio_val() {
    python3 - "$1" "$2" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
if j["error"]:
    sys.exit(f"fio reported error {j['error']} in {sys.argv[1]}")
print(eval(sys.argv[2], {"j": j}))
EOF
}

job_fio() {
    local t=$1 r=$2 f=${mnt_of[$1]}/fio.dat raw=$work/raw/fio.$1.$2 rw dir key v goal
    for rw in randread randwrite; do
        timeout 300 fio --name="$rw" --filename="$f" --size="$fio_size" --ioengine=psync --direct=0 \
            --bs=4k --rw="$rw" --runtime="$fio_time" --time_based \
            --output-format=json --output="$raw.$rw.json" >"$raw.$rw.log" 2>&1 ||
            die "fio $rw on $t failed: $(cat "$raw.$rw.log")"
        dir=${rw#rand}
        key=fio-${rw#rand}
        v=$(fio_val "$raw.$rw.json" "round(j['$dir']['iops'])")
        # Goal only for cold reads: fio drops the cache every pass (below).
        goal=-
        [[ $rw == randread ]] && goal=cold
        record "$key" "fio 4 KiB $rw, buffered, QD1: IOPS" IOPS "$goal" "$t" "$r" "$v"
        v=$(fio_val "$raw.$rw.json" "j['$dir']['clat_ns']['percentile']['99.000000'] / 1000")
        record "$key-p99" "fio 4 KiB $rw: p99 completion latency" "µs (lower is better)" - "$t" "$r" "$v"
    done
    # fio drops the file's page cache (POSIX_FADV_DONTNEED, invalidate=1) at
    # the start of every pass over the file, so on ramd the randread above
    # measures the FUSE READ path. The same with the cache kept, after one
    # sequential read has filled it:
    cat "$f" >/dev/null
    timeout 300 fio --name=randread-warm --filename="$f" --size="$fio_size" --ioengine=psync --direct=0 \
        --bs=4k --rw=randread --invalidate=0 --runtime="$fio_warm_time" --time_based \
        --output-format=json --output="$raw.warm.json" >"$raw.warm.log" 2>&1 ||
        die "fio randread-warm on $t failed: $(cat "$raw.warm.log")"
    v=$(fio_val "$raw.warm.json" "round(j['read']['iops'])")
    record fio-read-warm "fio 4 KiB randread, page cache kept (--invalidate=0): IOPS" IOPS - "$t" "$r" "$v"
    # Untimed: written-back data must not spill into the next job.
    sync "$f"
    rm -f "$f"
}

# passthrough_hp holds a descriptor for every inode the kernel knows of (the
# untar's files stay cached: a day's entry timeout) and can raise only its
# soft limit to the hard one; raising the hard one needs CAP_SYS_RESOURCE.
# The metadata job makes 32 files per MiB of --size (32 768 at 1G): when the
# hard limit cannot hold twice that, pthp sits that job out (its rows say
# "–") rather than fail it with EMFILE.
bench_mib=$(($(numfmt --from=iec "$bench_size") >> 20))
pthp_nofile=$(ulimit -Hn)
pthp_meta=1
[[ $pthp_nofile == unlimited ]] || ((pthp_nofile >= 64 * bench_mib)) || pthp_meta=0

# job_bench: sysbench-, pg_test_fsync- and untar-style jobs by `ramd bench`,
# on all four mounts in one call (it alternates them per measurement
# itself), the metadata job on three when pthp sits it out (above); each
# run's figure becomes one record.
job_bench() {
    local raw=$work/raw/ramd-bench.json only=seqwr,seqrd,rndrw,pg-fsync,metadata f
    local -a dirs=("${mnt_of[tmpfs]}" "${mnt_of[ramd]}" "${mnt_of[ramd-dev]}" "${mnt_of[pthp]}")
    ((pthp_meta)) || only=seqwr,seqrd,rndrw,pg-fsync
    timeout 2400 "$ramd" bench "${dirs[@]}" --only "$only" --size "$bench_size" --runs "$runs" --json \
        >"$raw" 2>"$work/raw/ramd-bench.log" || die "ramd bench failed: $(cat "$work/raw/ramd-bench.log")"
    if ((!pthp_meta)); then
        note "ramd bench: metadata without pthp (its hard descriptor limit is $pthp_nofile)"
        timeout 2400 "$ramd" bench "${dirs[@]:0:3}" --only metadata --size "$bench_size" --runs "$runs" --json \
            >"$raw.metadata" 2>>"$work/raw/ramd-bench.log" || die "ramd bench failed: $(cat "$work/raw/ramd-bench.log")"
    fi
    for f in "$raw" "$raw.metadata"; do
        [[ -e $f ]] || continue
        python3 - "$f" "${dirs[@]}" >>"$results" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
name = dict(zip(sys.argv[2:], ["tmpfs", "ramd", "ramd-dev", "pthp"]))
# (workload, figure) -> (key, label, goal): issue 13's goals.
rows = {
    ("seqwr", "mib_s"): ("sb-seqwr", "ramd bench seqwr: 16 KiB, 16 files (sysbench-style)", "half"),
    ("seqrd", "mib_s"): ("sb-seqrd", "ramd bench seqrd: 16 KiB, 16 files (sysbench-style)", "-"),
    ("rndrw", "ops_s"): ("sb-rndrw", "ramd bench rndrw: 16 KiB reads+writes (sysbench-style)", "half"),
    ("pg-fsync", "ops_s"): ("pg-fdatasync", "ramd bench pg-fsync: 8 kB write + fdatasync", "fsync"),
    ("metadata", "total_s"): ("meta-total", "ramd bench metadata: untar + stat + remove", "meta"),
    ("metadata", "create_files_s"): ("meta-create", "ramd bench metadata: untar", "-"),
    ("metadata", "stat_files_s"): ("meta-stat", "ramd bench metadata: stat", "-"),
    ("metadata", "remove_files_s"): ("meta-remove", "ramd bench metadata: remove", "-"),
}
for (w, k), (key, label, goal) in rows.items():
    for t in j["targets"]:
        if w not in t["results"]:
            continue
        m = t["results"][w]["metrics"][k]
        for r, v in enumerate(m["runs"], 1):
            print(f"{key}\t{label}\t{m['unit']}\t{goal}\t{name[t['target']]}\t{r}\t{v}")
EOF
    done
}

cpu_log=$work/raw/cpu.tsv
: >"$cpu_log"
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
t_start=$SECONDS
jobs=(dd fio)
for job in "${jobs[@]}"; do
    for ((r = 1; r <= runs; r++)); do
        # Rotate the order of targets from run to run.
        order=()
        for ((i = 0; i < ${#targets[@]}; i++)); do order+=("${targets[$(((i + r - 1) % ${#targets[@]}))]}"); done
        for t in "${order[@]}"; do
            note "run $r/$runs: $job on $t ($((SECONDS - t_start)) s so far)"
            c0=0
            [[ -n ${pid_of[$t]:-} ]] && { alive "${pid_of[$t]}" "${what_of[$t]}"; c0=$(cpu_ticks "${pid_of[$t]}"); }
            w0=$(date +%s%N)
            "job_$job" "$t" "$r"
            w1=$(date +%s%N)
            if [[ -n ${pid_of[$t]:-} ]]; then
                alive "${pid_of[$t]}" "${what_of[$t]}"
                printf '%s\t%s\t%s\t%s\t%s\n' "$t" "$job" "$r" "$(($(cpu_ticks "${pid_of[$t]}") - c0))" "$((w1 - w0))" >>"$cpu_log"
            fi
        done
    done
done
note "ramd bench: seqwr, seqrd, rndrw, pg-fsync, metadata ($((SECONDS - t_start)) s so far)"
job_bench
alive "${pid_of[pthp]}" passthrough_hp
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

# --- report -------------------------------------------------------------------
warnings=$(cat "$work"/raw/ramd-*.log | grep -c ' \(WARN\|ERROR\) ' || true)
# passthrough_hp writes to stderr only when something went wrong (a fallback
# from passthrough, a failed request).
pthp_lines=$(grep -c . "$work/raw/pthp.log" || true)
{
    echo "# ramd fs (FUSE) vs kernel tmpfs and passthrough_hp, $(date -u +%Y-%m-%dT%H:%MZ), $((SECONDS - t_start)) s"
    echo "# host: $(nproc) CPUs ($(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)), $(awk '$1 == "MemTotal:" { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r)"
    echo "# $("$ramd" --version) (commit $commit; binary sha256 $ramd_sha), $(fio --version)"
    echo "# ramd: --size 2G${threads:+ --threads $threads}, FUSE transport of ramd: $(fuse_transport ramd), of ramd-dev: $(fuse_transport ramd-dev)${ramd_opts[*]:+; both with ${ramd_opts[*]}}; load average at start $load_start, at end $load_end"
    echo "# pthp: libfuse $libfuse_version example/passthrough_hp ${pthp_opts[*]} (binary sha256 $pthp_sha) over a 2 GiB tmpfs"
    echo "# median of $runs run(s); dd ${dd_mib} MiB, fio ${fio_size} ${fio_time} s (warm ${fio_warm_time} s), ramd bench --size $bench_size"
    echo
    CLK_TCK=$(getconf CLK_TCK) python3 - "$results" "$cpu_log" <<'EOF'
import os, statistics, sys
from collections import defaultdict

results, cpu_log = sys.argv[1], sys.argv[2]
targets = ["ramd", "ramd-dev", "tmpfs", "pthp"]
ours = ("ramd", "ramd-dev")
rows, vals = {}, defaultdict(list)
for line in open(results):
    key, label, unit, goal, t, r, v = line.rstrip("\n").split("\t")
    rows.setdefault(key, (label, unit, goal))
    vals[(key, t)].append(float(v))

def fmt(v):
    if v != v:
        return "–"
    if v >= 100000:
        return f"{v / 1000:.0f}k"
    if v >= 10000:
        return f"{v / 1000:.1f}k"
    if v < 10:
        return f"{v:.2f}"
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"

# Issue 13's goals. Ratios are "how fast against tmpfs": for a time (lower
# is better) tmpfs's over ramd's.
goals = {
    "half": (0.5, "≥ 0.5× tmpfs"),
    "cold": (0.3, "≥ 0.3× tmpfs"),
    "meta": (0.35, "≥ 0.35× tmpfs"),
    "fsync": (150000, "≥ 150k ops/s"),
}
print("| job | unit | ramd | ramd-dev | tmpfs | pthp | ramd/tmpfs | ramd-dev/tmpfs | ramd/pthp | goal: ramd, ramd-dev |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---|")
verdicts = []
for key, (label, unit, goal) in rows.items():
    # pthp may have sat a job out (job_bench): no figures, "–".
    med = {t: statistics.median(vals[(key, t)]) if vals[(key, t)] else float("nan") for t in targets}
    ratio = {}
    for t in ours:
        # A time in seconds: tmpfs's over ramd's (the latency rows stay
        # ramd's over tmpfs's, as their unit says).
        a, b = (med["tmpfs"], med[t]) if unit == "s" else (med[t], med["tmpfs"])
        ratio[t] = a / b if b else float("nan")
    # ramd against passthrough_hp, the same way round.
    a, b = (med["pthp"], med["ramd"]) if unit == "s" else (med["ramd"], med["pthp"])
    ratio["pthp"] = a / b if b else float("nan")
    g = ""
    if goal in goals:
        lim, text = goals[goal]
        oks = []
        for t in ours:
            ok = (med[t] if goal == "fsync" else ratio[t]) >= lim
            oks.append("met" if ok else "MISSED")
            verdicts.append((f"{label} [{t}]", ok))
        g = f"{text}: {oks[0]}, {oks[1]}"
    r = {t: "–" if v != v else f"{v:.2f}" for t, v in ratio.items()}
    print(f"| {label} | {unit} | {fmt(med['ramd'])} | {fmt(med['ramd-dev'])} | {fmt(med['tmpfs'])} | {fmt(med['pthp'])} "
          f"| {r['ramd']} | {r['ramd-dev']} | {r['pthp']} | {g} |")

print()
print("Spread of the runs, (max - min) / median:")
print()
print("| job | ramd | ramd-dev | tmpfs | pthp |")
print("|---|---:|---:|---:|---:|")
for key, (label, unit, goal) in rows.items():
    cells = []
    for t in targets:
        v = vals[(key, t)]
        m = statistics.median(v) if v else 0
        cells.append("–" if len(v) < 2 or not m else f"{(max(v) - min(v)) / m * 100:.0f}%")
    print(f"| {label} | {' | '.join(cells)} |")

tck = int(os.environ["CLK_TCK"])
cpu = defaultdict(list)
for line in open(cpu_log):
    t, job, r, ticks, ns = line.split()
    cpu[(t, job)].append(int(ticks) / tck / (int(ns) / 1e9))
print()
print("Server CPU while each job ran on it (ramd, or passthrough_hp for pthp; CPU-seconds per wall-second, all threads; 2 cores), median:")
print()
print("| job | ramd | ramd-dev | pthp |")
print("|---|---:|---:|---:|")
for job in ["dd", "fio"]:
    if cpu[("ramd", job)]:
        cells = " | ".join(f"{statistics.median(cpu[(t, job)]):.2f}" for t in ("ramd", "ramd-dev", "pthp"))
        print(f"| {job} | {cells} |")
print()
met = [l for l, ok in verdicts if ok]
missed = [l for l, ok in verdicts if not ok]
print(f"Goals met ({len(met)}/{len(verdicts)}): {'; '.join(met) or 'none'}")
print(f"Goals missed: {'; '.join(missed) or 'none'}")
EOF
    echo
    echo "ramd WARN/ERROR log lines while serving: $warnings"
    echo "passthrough_hp stderr lines: $pthp_lines"
} | tee "$work/raw/summary.md"
if ((warnings)); then
    grep -h ' \(WARN\|ERROR\) ' "$work"/raw/ramd-*.log | sort | uniq -c | head -n 20 >&2
fi
if ((pthp_lines)); then
    note "passthrough_hp wrote to stderr (pthp.log); first lines:"
    head -n 20 "$work/raw/pthp.log" >&2
fi
