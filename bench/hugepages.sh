#!/usr/bin/env bash
# Huge pages and ramd's page arenas: the same fio jobs over NBD against ramd
# started with no --huge-pages (the system's setting), --huge-pages never,
# madvise and always, one after the other in one run. See BENCHMARKS.md.
#
# usage: bench/hugepages.sh [--size SIZE] [--runtime SECS] [--runs N] [--modes "default madvise"]
#
#   --size SIZE      disk size (default 1G); the fill writes all of it
#   --runtime SECS   measured seconds of each 4 KiB job, after 2 s of ramp (default 10)
#   --runs N         runs of everything; the table shows medians (default 2)
#   --modes LIST     which settings, in order (default "default madvise always never")
#
# Per mode and run: start ramd, fill the disk once with 1 MiB sequential
# writes (every page first-touch: where huge pages change the most), then
# 4 KiB random reads and 4 KiB random writes at QD32 over the written pages
# (where the TLB matters), read AnonHugePages from smaps_rollup, stop. The
# order of modes rotates between runs.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

size=1G runtime=10 runs=2 modes="default madvise always never"
bench_args --size= --runtime= --runs= --modes= -- "$@"
want_size --size "$size"
want_count --runtime "$runtime"
want_count --runs "$runs"

bench_lock
want_fio_nbd
need nbdinfo libnbd-bin
[[ -r /sys/kernel/mm/transparent_hugepage/enabled ]] ||
    die "this kernel has no transparent huge pages"

build_ramd
ramd=$built

work=$(mktemp -d)
bench_trap "$work" ""

# one MODE RUN: one ramd, the three jobs; appends to results.tsv.
one() {
    local mode=$1 r=$2 flags=() uri t0 t1 fill_mibs rd wr huge
    [[ $mode == default ]] || flags=(--huge-pages "$mode")
    serve_nbd "$ramd" "$work" "$size" "${flags[@]}"
    wait_quiet
    t0=$(date +%s%N)
    fio --name=fill --ioengine=nbd --uri="$uri" --size="$size" --rw=write --bs=1M \
        --iodepth=8 --output-format=json --output="$work/fill.json" >/dev/null ||
        die "fio fill ($mode) failed"
    t1=$(date +%s%N)
    fill_mibs=$(python3 -c "import json; j=json.load(open('$work/fill.json'))['jobs'][0]['write']; print(round(j['io_bytes']/2**20/(j['runtime']/1000)))")
    for job in randread randwrite; do
        wait_quiet
        fio --name="$job" --ioengine=nbd --uri="$uri" --size="$size" --rw="$job" --bs=4k \
            --iodepth=32 --norandommap --time_based --ramp_time=2 --runtime="$runtime" \
            --output-format=json --output="$work/$job.json" >/dev/null ||
            die "fio $job ($mode) failed"
    done
    rd=$(python3 -c "import json; print(round(json.load(open('$work/randread.json'))['jobs'][0]['read']['iops']))")
    wr=$(python3 -c "import json; print(round(json.load(open('$work/randwrite.json'))['jobs'][0]['write']['iops']))")
    huge=$(awk '$1 == "AnonHugePages:" { print int($2 / 1024) }' "/proc/$ramd_pid/smaps_rollup")
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$mode" "$r" "$fill_mibs" "$rd" "$wr" "$huge" >>"$work/results.tsv"
    note "$mode run $r: fill ${fill_mibs} MiB/s ($(((t1 - t0) / 1000000)) ms), randread $rd IOPS, randwrite $wr IOPS, AnonHugePages ${huge} MiB"
    stop_server "$ramd_pid" || die "ramd ($mode) did not stop cleanly"
    rm -rf "$work/run"
}

read -r -a order <<<"$modes"
for ((r = 1; r <= runs; r++)); do
    # Rotate, so no mode always runs first (or right after another).
    for ((i = 0; i < ${#order[@]}; i++)); do
        one "${order[(i + r - 1) % ${#order[@]}]}" "$r"
    done
done

echo "# $(fio --version), ramd $("$ramd" --version | awk '{ print $2 }') ($(git -C "$repo" rev-parse --short HEAD)), $(uname -r)"
echo "# THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled), defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag); size $size, ${runtime}s per job, $runs run(s), medians"
python3 - "$work/results.tsv" "$modes" <<'EOF'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines()]
modes = sys.argv[2].split()
def med(mode, col):
    return statistics.median(float(r[col]) for r in rows if r[0] == mode)
base = modes[0]
print(f"| --huge-pages | fill 1 MiB seq write, first touch (MiB/s) | 4 KiB randread QD32 (IOPS) | 4 KiB randwrite QD32 (IOPS) | AnonHugePages after (MiB) | vs {base}: fill, randread, randwrite |")
print("|---|---|---|---|---|---|")
for m in modes:
    f, r, w, h = (med(m, c) for c in (2, 3, 4, 5))
    vs = f"{f / med(base, 2):.2f}, {r / med(base, 3):.2f}, {w / med(base, 4):.2f}"
    print(f"| {m} | {f:.0f} | {r:.0f} | {w:.0f} | {h:.0f} | {vs} |")
EOF
