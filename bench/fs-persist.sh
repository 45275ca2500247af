#!/usr/bin/env bash
# Image saves and loads of a filesystem disk: the store data path (the
# default) against the kernel data path (`--data-path kernel`), in one run,
# with `cp -a` of the same tree to and from the same disk as the baseline.
# See BENCHMARKS.md, "Persistence of a filesystem disk: store and kernel
# data paths".
#
# usage: bench/fs-persist.sh [--size SIZE] [--files N] [--quick] [--dir DIR] [--out DIR]
#
#   --size SIZE   data in the tree, e.g. 1G (powers of 1024; default 2G,
#                 with --quick 256M)
#   --files N     files the data is split into (default 64)
#   --quick       smoke run: 256M
#   --dir DIR     where the images and the cp copy go: a mktemp directory is
#                 made in DIR and removed at the end (default /var/tmp, a
#                 real disk; tmpfs or ramfs is refused)
#   --out DIR     also keep the raw figures (results.tsv, logs) in DIR
#
# Run as root (mounts, drop_caches).
#
# Data: N files of /dev/urandom (incompressible), made once in a tmpfs.
# For each data path, one after the other, every timed step after
# `wait_quiet` and `sync; echo 3 > /proc/sys/vm/drop_caches`:
#   1. a disk is mounted (`ramd serve --mount M --size 2xSIZE --image
#      DIR/img-PATH`) and the tree copied in with `cp -a` (not timed);
#   2. full save: `ramd snapshot bench --full --json`: wall time and bytes;
#   3. 1% of the data's 4 KiB pages are rewritten with random bytes at
#      random places (python, pwrite, files kept closed between), then
#      `ramd snapshot bench --json`: bytes and wall time;
#   4. load: `ramd down bench` (it saves nothing new), then the same serve
#      again: time from exec until the mount point is mounted (ramd mounts
#      once the image is loaded), and the tree's sha256 list is compared
#      with the one taken before the stop (not timed).
# Baseline: `cp -a` of the tree from the tmpfs to DIR plus `sync -f`, and
# back into a fresh tmpfs directory.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

size="" files=64 quick=0 dir=/var/tmp out=""
bench_args --size= --files= --quick --dir= --out= -- "$@"
((quick)) && size=${size:-256M}
size=${size:-2G}
want_size --size "$size"
want_count --files "$files"
want_dir --dir "$dir"
want_root "it mounts and writes /proc/sys/vm/drop_caches"
need python3 python3
need jq jq
need numfmt coreutils
need sha256sum coreutils
need findmnt util-linux
need mountpoint util-linux
bench_lock

size_bytes=$(numfmt --from=iec "$size")
per_file=$((size_bytes / files))
((per_file >= 4096 && per_file % 4096 == 0)) || die "--size $size / --files $files: each file must be a whole number of 4 KiB pages"
want_disk "$dir" images

build_ramd
ramd=$built

work=$(mktemp -d /tmp/ramd-fs-persist.XXXXXX)
bench_trap "$work" "$out"
disk_dir=$(mktemp -d "$dir/ramd-fs-persist.XXXXXX")
at_exit rm -rf "$disk_dir"
mkdir -p "$work/mnt" "$work/run" "$work/raw"
at_exit unmount "$work/mnt"
mount_tmpfs "$((size_bytes + (64 << 20)))" "$work/src"
note "making $files files of $((per_file >> 20)) MiB of random data"
for i in $(seq 1 "$files"); do
    head -c "$per_file" /dev/urandom >"$work/src/f$i"
done
(cd "$work/src" && sha256sum f*) >"$work/sums"

results=$work/raw/results.tsv
printf 'path\tmeasure\tvalue\tunit\n' >"$results"
record() { printf '%s\t%s\t%s\t%s\n' "$@" >>"$results"; }
now() { date +%s.%N; }
elapsed() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.3f}')" "$1" "$2"; }

serve() { # serve PATH
    serve_mount "ramd --data-path $1" "$work/mnt" 600 "$ramd" serve --name bench --mount "$work/mnt" \
        --size "$((2 * size_bytes))" --image "$disk_dir/img-$1" --data-path "$1" --run-dir "$work/run" \
        >>"$work/raw/ramd-$1.log" 2>&1
    pid=$spawned
}

for path in store kernel; do
    note "data path $path"
    serve "$path"
    cp -a "$work/src/." "$work/mnt/"
    sync -f "$work/mnt"
    wait_quiet
    drop_caches
    t0=$(now)
    "$ramd" snapshot bench --full --json --run-dir "$work/run" >"$work/raw/full-$path.json"
    t1=$(now)
    record "$path" full_save_s "$(elapsed "$t0" "$t1")" s
    record "$path" full_save_bytes "$(jq .bytes "$work/raw/full-$path.json")" B
    # 1% of the pages, rewritten in place.
    python3 - "$work/mnt" "$files" "$per_file" <<'EOF'
import os, random, sys
d, n, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pages = n * per // 4096
rng = random.Random(1)
for p in rng.sample(range(pages), pages // 100):
    f, off = divmod(p * 4096, per)
    fd = os.open(os.path.join(d, f"f{f + 1}"), os.O_WRONLY)
    os.pwrite(fd, os.urandom(4096), off)
    os.close(fd)
EOF
    (cd "$work/mnt" && sha256sum f*) >"$work/sums-$path"
    wait_quiet
    drop_caches
    t0=$(now)
    "$ramd" snapshot bench --json --run-dir "$work/run" >"$work/raw/incr-$path.json"
    t1=$(now)
    record "$path" incr_save_s "$(elapsed "$t0" "$t1")" s
    record "$path" incr_save_bytes "$(jq .bytes "$work/raw/incr-$path.json")" B
    "$ramd" down bench --run-dir "$work/run" >/dev/null
    reap_server "$pid" || die "ramd --data-path $path exited with an error: $(tail -n 3 "$work/raw/ramd-$path.log")"
    wait_quiet
    drop_caches
    t0=$(now)
    serve "$path"
    t1=$(now)
    record "$path" load_s "$(elapsed "$t0" "$t1")" s
    (cd "$work/mnt" && sha256sum -c --quiet "$work/sums-$path") ||
        die "the tree loaded with --data-path $path differs from the one saved"
    record "$path" rss_after_load "$(($(proc_kib "$pid" VmRSS) * 1024))" B
    # The kernel path's file data is shmem in its private tmpfs, not in
    # ramd's RSS: what df shows the disk using (the tmpfs's own statfs).
    record "$path" df_used_after_load "$(df -B1 --output=used "$work/mnt" | tail -n 1 | tr -d ' ')" B
    "$ramd" down bench --run-dir "$work/run" >/dev/null
    reap_server "$pid" || true
done

note "baseline: cp -a"
wait_quiet
drop_caches
t0=$(now)
cp -a "$work/src" "$disk_dir/copy"
sync -f "$disk_dir/copy"
t1=$(now)
record cp save_s "$(elapsed "$t0" "$t1")" s
mount_tmpfs "$((size_bytes + (64 << 20)))" "$work/back"
wait_quiet
drop_caches
t0=$(now)
cp -a "$disk_dir/copy/." "$work/back/"
t1=$(now)
record cp load_s "$(elapsed "$t0" "$t1")" s

python3 - "$results" "$size_bytes" "$commit" <<'EOF'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
v = {(r["path"], r["measure"]): float(r["value"]) for r in rows}
size = int(sys.argv[2])
mib = lambda b: b / 1048576
print(f"ramd {sys.argv[3]}: {mib(size):.0f} MiB of random data in files; MiB/s of the data")
print("| measure | store path | kernel path | cp -a (+ sync) | kernel/store |")
print("|---|---:|---:|---:|---:|")
def row(name, s, k, c, unit_rate=True):
    if unit_rate:
        f = lambda t: f"{mib(size) / t:.0f}"
        ratio = v[("store", s)] / v[("kernel", k)]
    else:
        f = lambda x: x
        ratio = None
    print(f"| {name} | {f(v[('store', s)])} | {f(v[('kernel', k)])} | {f(v[('cp', c)]) if c else '-'} | {ratio:.2f} |")
row("full save (durable), MiB/s", "full_save_s", "full_save_s", "save_s")
row("load, MiB/s (exec to mounted)", "load_s", "load_s", "load_s")
for p in ("store", "kernel"):
    b, fb, s = v[(p, "incr_save_bytes")], v[(p, "full_save_bytes")], v[(p, "incr_save_s")]
    print(f"| {p}: 1% of pages rewritten, then a save | {mib(b):.1f} MiB ({100 * b / fb:.2f}% of the full save's) in {s:.3f} s | | | |")
rss = {p: mib(v[(p, "rss_after_load")]) for p in ("store", "kernel")}
used = {p: mib(v[(p, "df_used_after_load")]) for p in ("store", "kernel")}
print(f"| memory after the load: ramd's RSS (+ the tmpfs's pages, kernel path) | {rss['store']:.0f} MiB | {rss['kernel'] + used['kernel']:.0f} MiB ({rss['kernel']:.0f} + {used['kernel']:.0f}) | | |")
EOF
