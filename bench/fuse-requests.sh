#!/usr/bin/env bash
# FUSE requests per application operation on a ramd filesystem disk,
# counted with the kernel's fuse:fuse_request_send tracepoint (perf), for
# the operations of BENCHMARKS.md's "Where the time goes". Counts, not
# timings: they do not depend on how busy the host is.
#
#   bench/fuse-requests.sh [--ramd BIN] [-- RAMD-SERVE-FLAGS...]
#
# Needs root (perf on tracepoints), perf (apt-get install linux-perf),
# python3 and tar.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

ramd=${RAMD:-$here/../target/release/ramd}
# Everything after -- goes to `ramd serve`.
args=() flags=()
while (($#)); do
    if [[ $1 == -- ]]; then
        shift
        flags=("$@")
        break
    fi
    args+=("$1")
    shift
done
bench_args --ramd= -- "${args[@]}"
need perf linux-perf
need python3 python3
need tar tar
[[ -x $ramd ]] || die "$ramd: no ramd binary (cargo build --release -p ramd, or --ramd BIN)"
bench_lock

work=$(mktemp -d)
bench_trap "$work" ""
mnt=$work/mnt
mkdir "$mnt"
at_exit unmount "$mnt"
serve_mount ramd "$mnt" 20 "$ramd" serve --size 1G --mount "$mnt" --run-dir "$work" "${flags[@]}" \
    >"$work/ramd.log" 2>&1
wait_until 20 "ramd serving $mnt" stat "$mnt/."
dev=$(stat -c %d "$mnt")

# A source-like tree to untar: 200 directories of 10 small files.
python3 - "$work/tree" <<'EOF'
import os, sys
root = sys.argv[1]
for d in range(200):
    p = os.path.join(root, f"d{d}")
    os.makedirs(p)
    for f in range(10):
        with open(os.path.join(p, f"f{f}.c"), "wb") as fh:
            fh.write(b"x" * (100 + 37 * f))
EOF
tar -C "$work" -cf "$work/tree.tar" tree

# count NAME OPS CMD...: runs CMD under the tracepoint and prints this
# mount's requests per operation by opcode.
count() {
    local name=$1 ops=$2
    shift 2
    # A large buffer: a lost event would lower the counts.
    perf record -q -m 16M -e fuse:fuse_request_send -a -o "$work/perf.data" -- "$@" \
        >/dev/null 2>"$work/perf.err" || die "$name: perf record or the workload failed"
    ! grep -qi "lost" "$work/perf.err" || die "$name: perf lost events: $(cat "$work/perf.err")"
    perf script -i "$work/perf.data" 2>/dev/null | { grep "connection $dev " || true; } |
        { grep -o '(FUSE_[A-Z_]*)' || true; } | sort | uniq -c |
        awk -v n="$ops" -v name="$name" '
            { total += $1; line = line sprintf(" %s %.2f", substr($2, 7, length($2) - 7), $1 / n) }
            END { printf "%-28s %6.2f /op:%s\n", name, total / n, line }'
}

n=2000
count "create+100B write+close" $n python3 -c "
import os,sys
d=sys.argv[1]+'/c'; os.mkdir(d)
for i in range($n):
    fd=os.open(f'{d}/f{i}',os.O_CREAT|os.O_WRONLY,0o644); os.write(fd,b'x'*100); os.close(fd)" "$mnt"
# Past the old 1 s entry/attribute timeout.
sleep 1.5
count "stat" $n python3 -c "
import os,sys
d=sys.argv[1]+'/c'
for i in range($n): os.stat(f'{d}/f{i}')" "$mnt"
count "stat again" $n python3 -c "
import os,sys
d=sys.argv[1]+'/c'
for i in range($n): os.stat(f'{d}/f{i}')" "$mnt"
count "stat of a missing name x2" $n python3 -c "
import os,sys
d=sys.argv[1]+'/c'
for r in range(2):
    for i in range($((n / 2))):
        try: os.stat(f'{d}/missing{i}')
        except FileNotFoundError: pass" "$mnt"
count "unlink" $n python3 -c "
import os,sys
d=sys.argv[1]+'/c'
for i in range($n): os.unlink(f'{d}/f{i}')" "$mnt"
count "untar (per file)" 2000 tar -C "$mnt" -xf "$work/tree.tar"
count "stat after untar (per file)" 2000 python3 -c "
import os,sys
for d, _, fs in os.walk(sys.argv[1] + '/tree'):
    for f in fs: os.stat(os.path.join(d, f))" "$mnt"
count "rm -r (per file)" 2000 rm -r "$mnt/tree"
count "16 KiB sequential write" 16384 dd if=/dev/zero of="$mnt/seq" bs=16k count=16384 status=none
count "8 kB write+fdatasync" $n python3 -c "
import os,sys
fd=os.open(sys.argv[1]+'/sync',os.O_CREAT|os.O_WRONLY,0o644)
b=b'y'*8192
for i in range($n):
    os.pwrite(fd,b,(i%128)*8192); os.fdatasync(fd)
os.close(fd)" "$mnt"
