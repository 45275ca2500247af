#!/usr/bin/env bash
# The cold tier of `--data-path kernel --compress`: the memory the host
# sees once files written to the disk have gone idle, and the time of the
# first read of them, against ext4 on the kernel's zram and against a
# plain kernel tmpfs (no compression). See BENCHMARKS.md, "Filesystem: the
# cold tier of `--data-path kernel`".
#
# usage: bench/fs-cold.sh [--files N] [--file-size SIZE] [--out DIR]
#
#   --files N          files written (default 64)
#   --file-size SIZE   each file's size, e.g. 4M (powers of 1024; default 4M)
#   --out DIR          also keep the figures (results.tsv) and logs in DIR
#
# Run as root (mounts, zram, drop_caches). zram0 must be free (disksize 0).
#
# Data: log-like text (a timestamp, a host, a method, a path, a status and
# a duration per line, from a fixed seed), made once in a scratch tmpfs and
# copied with cp. For each target, one after the other, after `sync; echo
# 3 > /proc/sys/vm/drop_caches`:
#   ramd-zstd, ramd-lz4   `ramd serve --size 2xDATA --data-path kernel
#                         --compress CODEC --compress-after 2s`; the copy,
#                         then a wait until `ramd status` counts every file
#                         cold; memory: ramd's VmRSS growth since start plus
#                         what its private tmpfs still holds (`hot_bytes`:
#                         its statfs, shmem the host sees)
#   zram-lz4              /dev/zram0 (lz4: this kernel's zram has no zstd),
#                         disksize 2xDATA, mkfs.ext4, mounted; the copy,
#                         sync, drop_caches (the page cache would otherwise
#                         hold a second, uncompressed copy); memory: mm_stat
#                         mem_used_total
#   tmpfs                 a kernel tmpfs; memory: the growth of Shmem in
#                         /proc/meminfo
# Then the first read: `cat` of every file to /dev/null, timed (ramd: each
# open moves the file back into the tmpfs; zram: ext4 reads and
# decompresses into the page cache; tmpfs: a copy), and the sha256 list
# compared with the source's.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

files=64 file_size=4M out=""
bench_args --files= --file-size= --out= -- "$@"
want_count --files "$files"
[[ $file_size =~ ^[1-9][0-9]*[KMG]?$ ]] || die "--file-size '$file_size': a number with an optional K, M or G suffix"
want_root "mounts, zram and drop_caches"
for t in python3 mkfs.ext4 sha256sum numfmt bc column; do need "$t" "$t"; done
bench_lock
zram_check lz4

bytes_each=$(numfmt --from=iec "$file_size")
data=$((bytes_each * files))
disk=$((data * 2))

build_ramd
ramd=$built

work=$(mktemp -d /tmp/ramd-cold.XXXXXX)
bench_trap "$work" "$out"
mkdir -p "$work/mnt" "$work/run" "$work/raw/logs"
at_exit unmount "$work/mnt"

# The corpus, in a tmpfs of its own (not counted: made before any baseline).
mount_tmpfs $((data + (64 << 20))) "$work/src"
note "making $files files of $file_size of log-like text"
python3 - "$work/src" "$files" "$bytes_each" <<'EOF'
import os, random, sys
d, n, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rnd = random.Random(20261126)
methods = ["GET", "PUT", "POST", "DELETE"]
for f in range(n):
    out, total, i = [], 0, 0
    while total < size:
        line = "2026-11-26T%02d:%02d:%02d.%03dZ host-%d %s /api/v1/items/%d status=%d took=%dms\n" % (
            (i // 3600) % 24, (i // 60) % 60, i % 60, rnd.randrange(1000), rnd.randrange(16),
            rnd.choice(methods), rnd.randrange(1000000), rnd.choice([200, 201, 204, 404, 500]),
            rnd.randrange(2000))
        out.append(line)
        total += len(line)
        i += 1
    with open(os.path.join(d, "log%03d.txt" % f), "w") as fh:
        fh.write("".join(out)[:size])
EOF
(cd "$work/src" && sha256sum ./*) >"$work/sums"
printf 'target\tmemory_bytes\tdata_bytes\tfirst_read_s\n' >"$work/raw/results.tsv"

shmem() { awk '$1 == "Shmem:" { print $2 * 1024 }' /proc/meminfo; }
status_field() {
    "$ramd" --run-dir "$work/run" status bench --json |
        python3 -c "import json,sys; d=json.load(sys.stdin)['disks'][0]; print(eval(sys.argv[1]))" "$1"
}
all_cold() { [[ $(status_field "d['cold']['files']") == "$files" ]]; }
timed_read() {
    local t0 t1
    drop_caches
    t0=$(date +%s.%N)
    cat "$1"/log*.txt >/dev/null
    t1=$(date +%s.%N)
    (cd "$1" && sha256sum ./log*.txt) | cmp -s - "$work/sums" || die "$2: the files read back differ"
    echo "$t1 - $t0" | bc -l
}
record() { printf '%s\t%s\t%s\t%.3f\n' "$1" "$2" "$data" "$3" | tee -a "$work/raw/results.tsv" >&2; }

for codec in zstd lz4; do
    drop_caches
    serve_mount ramd "$work/mnt" 30 "$ramd" --run-dir "$work/run" serve --name bench --size "$disk" \
        --mount "$work/mnt" --data-path kernel --compress "$codec" --compress-after 2s \
        >"$work/raw/logs/ramd-$codec.out" 2>"$work/raw/logs/ramd-$codec.log"
    srv_pid=$spawned
    rss0=$(($(proc_kib "$srv_pid" VmRSS) * 1024))
    cp "$work/src"/* "$work/mnt"/
    wait_until 600 "every file cold" all_cold
    alive "$srv_pid" ramd
    rss=$(($(proc_kib "$srv_pid" VmRSS) * 1024))
    hot=$(status_field "d['hot_bytes']")
    note "ramd-$codec: RSS $rss0 -> $rss, tmpfs $hot, cold tier $(status_field "d['cold']")"
    secs=$(timed_read "$work/mnt" "ramd-$codec")
    record "ramd-$codec" $((rss - rss0 + hot)) "$secs"
    umount "$work/mnt"
    reap_server "$srv_pid" || die "ramd exited with an error"
done

drop_caches
zram_setup lz4 "$disk"
mkfs.ext4 -q -F /dev/zram0
mount /dev/zram0 "$work/mnt"
cp "$work/src"/* "$work/mnt"/
drop_caches
used=$(awk '{ print $3 }' "$zram/mm_stat")
secs=$(timed_read "$work/mnt" zram-lz4)
record zram-lz4 "$used" "$secs"
umount "$work/mnt"
zram_reset

drop_caches
before=$(shmem)
mount -t tmpfs -o size="$disk" tmpfs "$work/mnt"
cp "$work/src"/* "$work/mnt"/
used=$(($(shmem) - before))
secs=$(timed_read "$work/mnt" tmpfs)
record tmpfs "$used" "$secs"
umount "$work/mnt"

column -t "$work/raw/results.tsv"
