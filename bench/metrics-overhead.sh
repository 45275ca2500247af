#!/usr/bin/env bash
# What the request metrics cost on the NBD hot path: two ramd binaries, one
# built before per-request recording and one after, measured alternately in
# one run with the same fio jobs (nbd engine, 4 KiB, over warm pages).
# See BENCHMARKS.md, "Request metrics overhead".
#
# usage: OLD=PATH NEW=PATH bench/metrics-overhead.sh [ROUNDS] [SECONDS]
#   OLD, NEW  the two `ramd` binaries (e.g. a release build of the commit
#             before, and target/release/ramd)
#   ROUNDS    rounds; each runs every job on both, alternating which goes
#             first (default 3)
#   SECONDS   measured seconds of each job, after 2 s of ramp (default 10)
#
# Prints one line per round and server, then the medians. Needs fio (with
# its nbd engine) and python3.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

# shellcheck disable=SC2034 # read as ${!b}
old=${OLD:?set OLD to the ramd binary without recording}
# shellcheck disable=SC2034 # read as ${!b}
new=${NEW:?set NEW to the ramd binary with recording}
rounds=${1:-3} runtime=${2:-10}
want_count rounds "$rounds"
want_count runtime "$runtime"
need fio fio
need python3 python3
need nbdinfo libnbd-bin
bench_lock

dir=$(mktemp -d)
bench_trap "$dir" ""

# fio prints a line before its JSON with the nbd engine.
figure() { # FILE EXPR -> the value of EXPR over the job `j`
    python3 -c 'import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round(eval(sys.argv[2]),1))' "$1" "$2"
}

declare -A uri_of
for b in old new; do
    bin=${!b}
    serve_nbd "$bin" "$dir/$b" 1G --name "$b"
    uri_of[$b]=$uri
    # Every page written once: the timed jobs run over warm pages.
    fio --name=fill --ioengine=nbd --uri="${uri_of[$b]}" --rw=write --bs=1M --size=1G \
        --iodepth=8 --output-format=terse >/dev/null
done

job() { # SERVER FIO-ARGS... -> $dir/out.json
    local b=$1
    shift
    fio --name=j --ioengine=nbd --uri="${uri_of[$b]}" --size=1G --bs=4k --time_based \
        --runtime="$runtime" --ramp_time=2 --output-format=json "$@" >"$dir/out.json"
}

: >"$dir/results"
for r in $(seq "$rounds"); do
    order="old new"
    ((r % 2 == 0)) && order="new old"
    for b in $order; do
        job "$b" --rw=randrw --rwmixread=80 --iodepth=32
        mix=$(figure "$dir/out.json" 'j["read"]["iops"] + j["write"]["iops"]')
        job "$b" --rw=randread --iodepth=1
        rd=$(figure "$dir/out.json" 'j["read"]["clat_ns"]["percentile"]["50.000000"] / 1000')
        job "$b" --rw=randwrite --iodepth=1
        wr=$(figure "$dir/out.json" 'j["write"]["clat_ns"]["percentile"]["50.000000"] / 1000')
        echo "round $r $b: randrw 80/20 QD32 $mix IOPS, randread QD1 p50 $rd us," \
            "randwrite QD1 p50 $wr us (load average $(cut -d' ' -f1 /proc/loadavg))"
        echo "$b $mix $rd $wr" >>"$dir/results"
    done
done
python3 - "$dir/results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {b: [statistics.median(float(r[i]) for r in rows if r[0] == b) for i in (1, 2, 3)]
       for b in ("old", "new")}
names = ["randrw 80/20 QD32 IOPS", "randread QD1 p50 us", "randwrite QD1 p50 us"]
for i, n in enumerate(names):
    o, w = med["old"][i], med["new"][i]
    print(f"median {n}: old {o:.1f}, new {w:.1f}, new/old {w / o:.3f}")
PY
