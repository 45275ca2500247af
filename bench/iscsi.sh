#!/usr/bin/env bash
# iSCSI benchmark: ramd's target against tgt (tgtd, LUN backed by a file on
# tmpfs), side by side in one run, alternating. See BENCHMARKS.md ("iSCSI:
# ramd vs tgt").
#
# usage: bench/iscsi.sh [--size SIZE_MB] [--time S] [--runs N] [--quick]
#
#   --size MB   each LUN's size in MiB (default 1024); both are filled with
#               random data first, so that reads hit real pages on both
#   --time S    seconds per measurement (default 20; --quick 5)
#   --runs N    rounds; each round measures ramd then tgt, the next one tgt
#               then ramd (default 3; --quick 1). The table shows medians.
#
# Measurements (libiscsi's iscsi-perf: random 4 KiB reads, -b 8 blocks of
# 512 bytes, one session):
#   qd32   iscsi-perf -m 32 -r      IOPS (goal: ramd >= 2 x tgt)
#   qd1    iscsi-perf -m 1 -r       IOPS and the latency they imply (goal:
#                                   ramd's no worse than tgt's)
#   mix    the IOMeter mix RAM-disk comparisons quote: 4 KiB, 80% random, 80% read, at
#          queue depth 32, with fio's nbd engine through `qemu-nbd` serving
#          the iscsi:// URL (fio has no iSCSI engine here): both targets pay
#          the same qemu-nbd hop, so the ratio is what compares.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
# shellcheck source=bench/lib.sh
source "$here/lib.sh"

size_mb=1024 secs="" runs="" quick=0
bench_args --size=size_mb --time=secs --runs= --quick -- "$@"
if ((quick)); then
    secs=${secs:-5} runs=${runs:-1}
fi
secs=${secs:-20} runs=${runs:-3}
want_count --size "$size_mb"
want_count --time "$secs"
want_count --runs "$runs"
for t in iscsi-perf:libiscsi-bin iscsi-ls:libiscsi-bin tgtd:tgt tgtadm:tgt \
    qemu-img:qemu-utils qemu-nbd:qemu-utils fio:fio; do
    need "${t%%:*}" "${t#*:}"
done
[[ -e /usr/lib/x86_64-linux-gnu/qemu/block-iscsi.so ]] ||
    die "qemu's iscsi driver is missing: apt-get install qemu-block-extra"

bench_lock
build_ramd
ramd=$built

work=$(mktemp -d /tmp/ramd-bench-iscsi.XXXXXX)
bench_trap "$work" ""

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

iqn_ramd=iqn.2026-11.org.ramd:bench
iqn_tgt=iqn.2026-11.org.example:tgt
port_ramd=$(free_port)
port_tgt=$(free_port)
# tgtd's management socket number (not a TCP port; below 32768).
control=$((RANDOM % 20000 + 10000))

spawn ramd "$ramd" --run-dir "$work/run" serve --size "${size_mb}M" --name bench \
    --iscsi "$port_ramd" --iscsi-target "$iqn_ramd" >"$work/ramd.out" 2>"$work/ramd.log"
ramd_pid=$spawned
start_tgt "$port_tgt" "$control" "$size_mb" "$iqn_tgt" "$work/tgt.out"
wait_until 20 "ramd" iscsi-ls "iscsi://127.0.0.1:$port_ramd"

declare -A url=(
    [ramd]="iscsi://127.0.0.1:$port_ramd/$iqn_ramd/0"
    [tgt]="iscsi://127.0.0.1:$port_tgt/$iqn_tgt/1"
)

note "filling both LUNs with ${size_mb} MiB of random data"
head -c "$((size_mb << 20))" /dev/urandom >"$work/fill.img"
for s in ramd tgt; do
    qemu-img convert -n -f raw -O raw "$work/fill.img" "${url[$s]}" ||
        die "filling $s failed"
done
rm -f "$work/fill.img"

# perf SERVER QD: iscsi-perf's final average IOPS.
perf() {
    local out
    out=$(iscsi-perf -m "$2" -b 8 -r -t "$secs" "${url[$1]}" 2>&1 | tr '\r' '\n') ||
        die "iscsi-perf against $1 failed: $out"
    grep -o 'iops average [0-9]*' <<<"$out" | tail -1 | awk '{ print $3 }'
}

# mix SERVER: fio's read+write IOPS through qemu-nbd.
mix() {
    local sock=$work/$1.nbd pid
    spawn qemu-nbd qemu-nbd -f raw -t --socket="$sock" --cache=none "${url[$1]}" 2>"$work/qemu-nbd-$1.log"
    pid=$spawned
    wait_until 20 "qemu-nbd for $1" test -S "$sock"
    fio --name=iometer --ioengine=nbd --uri="nbd+unix:///?socket=$sock" \
        --rw=randrw --rwmixread=80 --percentage_random=80 --bs=4k --iodepth=32 \
        --size="${size_mb}M" --time_based --runtime="$secs" \
        --output-format=json --output="$work/fio-$1.json" >/dev/null 2>&1 ||
        die "fio against $1 failed (see $work/fio-$1.json)"
    stop_server "$pid" || true
    python3 -c 'import json, sys
t = json.load(open(sys.argv[1]))["jobs"][0]
print(int(t["read"]["iops"] + t["write"]["iops"]))' "$work/fio-$1.json"
}

declare -A res
for ((r = 1; r <= runs; r++)); do
    order=(ramd tgt)
    ((r % 2 == 0)) && order=(tgt ramd)
    for s in "${order[@]}"; do
        alive "$ramd_pid" ramd
        note "round $r/$runs: $s"
        res[$s,qd32]+="$(perf "$s" 32) "
        res[$s,qd1]+="$(perf "$s" 1) "
        res[$s,mix]+="$(mix "$s") "
    done
done

median() { tr ' ' '\n' | grep . | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

echo
echo "iSCSI, ramd ($revision) vs tgt $(tgtd -V 2>/dev/null | head -1), ${size_mb} MiB LUNs" \
    "(tgt's on tmpfs), ${secs}s x $runs rounds, medians; $(nproc) cores"
printf '%-36s %12s %12s %8s\n' measurement ramd tgt ratio
for m in qd32 qd1 mix; do
    a=$(median <<<"${res[ramd,$m]}")
    b=$(median <<<"${res[tgt,$m]}")
    label=$m
    case $m in
    qd32) label="4 KiB random read QD32 (IOPS)" ;;
    qd1) label="4 KiB random read QD1 (IOPS)" ;;
    mix) label="IOMeter mix QD32 via qemu-nbd (IOPS)" ;;
    esac
    printf '%-36s %12s %12s %8s\n' "$label" "$a" "$b" "$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", a / b }')"
done
a=$(median <<<"${res[ramd,qd1]}")
b=$(median <<<"${res[tgt,qd1]}")
printf '%-36s %12s %12s\n' "QD1 latency (us, 1e6/IOPS)" \
    "$(awk -v a="$a" 'BEGIN { printf "%.1f", 1e6 / a }')" "$(awk -v b="$b" 'BEGIN { printf "%.1f", 1e6 / b }')"
