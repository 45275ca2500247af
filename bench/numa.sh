#!/usr/bin/env bash
# RedHawk's NUMA test against ramd: a loop of "seek to 0,
# write 8 MiB" and of "seek to 0, read 8 MiB", each call timed with
# CLOCK_MONOTONIC, alone and beside a memory-bandwidth hog pinned to
# another node's CPUs, for ramd with and without --numa-nodes. See
# BENCHMARKS.md.
#
# usage: bench/numa.sh [--calls N] [--runs N]
#
#   --calls N   timed calls per loop, after 20 untimed ones (default 400)
#   --runs N    runs of everything; the table shows medians (default 3)
#
# The loop runs in python3 with libnbd (the same client the tests use): an
# NBD pwrite/pread of 8 MiB at offset 0 is the seek + write/read (NBD has
# no page cache on the client side, so it is direct I/O by nature). The
# loop is pinned to the first CPU of the disk's node; the hog (dd from
# /dev/zero to /dev/null in 64 MiB blocks: one core's worth of memory
# writes) to a CPU of another node. On a machine with one node there is no
# other node: the hog runs on another CPU of the same node, so the figures
# show contention for one memory controller, not remote placement; the
# script says which it measured.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

calls=400 runs=3
bench_args --calls= --runs= -- "$@"
want_count --calls "$calls"
want_count --runs "$runs"

bench_lock
need taskset util-linux
need nbdinfo libnbd-bin
need_pynbd

build_ramd
ramd=$built

mapfile -t node_list < <(cd /sys/devices/system/node && printf '%s\n' node[0-9]* | sed 's/node//' | sort -n)
local_node=${node_list[0]}
cpus_of() { cat "/sys/devices/system/node/node$1/cpulist"; }
first_cpu() { cpus_of "$1" | cut -d, -f1 | cut -d- -f1; }
loop_cpu=$(first_cpu "$local_node")
if ((${#node_list[@]} > 1)); then
    remote_node=${node_list[1]}
    hog_cpu=$(first_cpu "$remote_node")
    setting="hog on node $remote_node (CPU $hog_cpu), loop on node $local_node (CPU $loop_cpu)"
else
    remote_node=""
    hog_cpu=$(taskset -pc $$ | awk -F': ' '{ print $2 }' | tr ',' '\n' |
        awk -F- -v l="$loop_cpu" '{ for (c = $1; c <= ($2 == "" ? $1 : $2); c++) if (c != l) { print c; exit } }')
    [[ -n $hog_cpu ]] || die "one CPU only: nowhere to run the hog beside the loop"
    setting="ONE NODE ONLY: hog on CPU $hog_cpu of node $local_node, loop on CPU $loop_cpu (no remote memory to measure)"
fi

work=$(mktemp -d)
bench_trap "$work" ""
hog_pid=""

cat >"$work/loop.py" <<'EOF'
import sys, time, nbd
uri, op, calls = sys.argv[1], sys.argv[2], int(sys.argv[3])
h = nbd.NBD()
h.connect_uri(uri)
buf = bytearray(b"\xa5" * (8 << 20))
def call():
    if op == "write":
        h.pwrite(buf, 0)
    else:
        h.pread(8 << 20, 0)
for _ in range(20):
    call()
times = []
for _ in range(calls):
    t0 = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
    call()
    times.append(time.clock_gettime_ns(time.CLOCK_MONOTONIC) - t0)
times.sort()
print(times[len(times) // 2] / 1000)
EOF

# one PLACEMENT HOG RUN: a ramd, the two loops; appends to results.tsv.
one() {
    local placement=$1 hog=$2 r=$3 flags=() uri op us
    case $placement in
    default) ;;
    local) flags=(--numa-nodes "$local_node") ;;
    remote) flags=(--numa-nodes "$remote_node") ;;
    esac
    serve_nbd "$ramd" "$work" 64M "${flags[@]}"
    wait_quiet
    if [[ $hog == hog ]]; then
        spawn hog taskset -c "$hog_cpu" dd if=/dev/zero of=/dev/null bs=64M 2>/dev/null
        hog_pid=$spawned
    fi
    for op in write read; do
        us=$(taskset -c "$loop_cpu" "$pynbd" "$work/loop.py" "$uri" "$op" "$calls")
        printf '%s\t%s\t%s\t%s\t%s\n' "$placement" "$hog" "$op" "$r" "$us" >>"$work/results.tsv"
        note "$placement, $hog, $op run $r: median $us µs per 8 MiB call"
    done
    if [[ -n $hog_pid ]]; then
        stop_server "$hog_pid" || true
        hog_pid=""
    fi
    stop_server "$ramd_pid" || die "ramd did not stop cleanly"
    rm -rf "$work/run"
}

placements="default local"
[[ -n $remote_node ]] && placements+=" remote"
for ((r = 1; r <= runs; r++)); do
    for p in $placements; do
        for hog in alone hog; do
            one "$p" "$hog" "$r"
        done
    done
done

echo "# ramd $("$ramd" --version | awk '{ print $2 }') ($(git -C "$repo" rev-parse --short HEAD)), $(uname -r), $(nproc) CPUs, ${#node_list[@]} node(s)"
echo "# $setting; $calls calls per loop, $runs run(s), medians of per-run medians"
python3 - "$work/results.tsv" <<'EOF'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines()]
def med(p, hog, op):
    v = [float(r[4]) for r in rows if r[:3] == [p, hog, op]]
    return statistics.median(v) if v else None
print("| placement | op | alone (µs per 8 MiB call) | with hog (µs) | slowdown |")
print("|---|---|---|---|---|")
for p in dict.fromkeys(r[0] for r in rows):
    for op in ("write", "read"):
        a, h = med(p, "alone", op), med(p, "hog", op)
        print(f"| {p} | {op} | {a:.0f} | {h:.0f} | {(h / a - 1) * 100:+.0f}% |")
EOF
