#!/usr/bin/env bash
# Images in object storage: ramd's save to and load from an s3:// image
# against rclone copying the same image (a local directory of the same
# segments) to and from the same server, the bytes an incremental save
# uploads, and the same for a filesystem disk. See BENCHMARKS.md, "Images
# in object storage (S3)".
#
# usage: bench/s3.sh [--size SIZE] [--reps N] [--quick] [--dir DIR] [--out DIR]
#
#   --size SIZE   disk size, e.g. 1G (powers of 1024; default 1G, with
#                 --quick 256M)
#   --reps N      repetitions of each timed step, ramd and rclone
#                 alternating (who goes first swaps each time); the table
#                 shows medians (default 3)
#   --quick       smoke run: 256M disk
#   --dir DIR     where SeaweedFS keeps its data and the local image goes: a
#                 mktemp directory is made in DIR and removed at the end
#                 (default /var/tmp, a real disk; tmpfs or ramfs is refused)
#   --out DIR     also keep the raw figures in DIR (results.tsv, JSON, logs,
#                 summary.md)
#
# Environment: RCLONE=PATH picks the rclone binary; BENCH_QUIET_WAIT (see
# bench/lib.sh) bounds the wait for a quiet host.
#
# Run as root (drop_caches, a tmpfs mount, a FUSE mount).
#
# Server: SeaweedFS (`weed mini`: master, volume, filer and S3 in one
# process) on loopback, fresh ports, one bucket; built by
# scripts/install-test-tools. Peer: rclone (from $(go env GOPATH)/bin,
# where `go install github.com/rclone/rclone@latest` puts it, else from
# PATH; if neither has one, `apt-get install rclone`), an s3 remote of provider
# SeaweedFS, its default transfers and multipart settings.
#
# Data: SIZE bytes made once in a tmpfs, in 4 MiB runs: 3 MiB of
# /dev/urandom then 1 MiB of zeros (75% incompressible data, 25% zero
# pages that an image does not store).
#
# Steps (every timed step after `wait_quiet` and `sync; echo 3 >
# /proc/sys/vm/drop_caches`, so SeaweedFS reads its volumes from disk):
#   0. the peer's local copy: a disk served with `--image DIR/local`, filled
#      with the data (nbdcopy), saved with `ramd snapshot --full`, stopped:
#      DIR/local holds the same segment (and MANIFEST) as ramd uploads
#   1. full save: disk A (`ramd serve --size SIZE --image s3://BUCKET/ramd`)
#      filled the same way; then REPS times, alternating: `ramd snapshot
#      bench --full --json` (wall time) and `rclone copy DIR/local
#      peer:BUCKET/peer` (wall time; the copy is purged after, untimed)
#   2. incremental save, REPS times: fio (nbd engine) writes 1% of the
#      disk's 4 KiB pages once each in random order, then `ramd snapshot
#      bench --json`: its bytes (cross-checked with the segment object's
#      size as rclone lists it) as % of the full save's
#   3. load: A is stopped (`ramd down`); REPS times, alternating: `ramd
#      serve --image s3://BUCKET/ramd` (no --size) from exec to its URI
#      line (printed once the image is loaded), and `rclone copy
#      peer:BUCKET/ramd` (the same objects: MANIFEST, full segment,
#      incremental segments) into a tmpfs, with rclone's defaults and (no
#      goal) with `--multi-thread-streams 0`: one stream per object, as
#      ramd reads. Before each, SIZE + 256 MiB of memory is touched and
#      freed, so both fill memory the VM has backed
#   4. filesystem disk (`--mount`, the default data path, `--image
#      s3://BUCKET/fs`): files of the same data copied in, `ramd snapshot
#      --full`, then REPS times: 1% of the files' 4 KiB pages rewritten
#      (pwrite, random places) and `ramd snapshot`: bytes as % of the full
#      save's
#   5. a filesystem disk of many small files (`--image s3://BUCKET/many`):
#      10,000 files of 4 KiB of random data in one directory, `ramd snapshot
#      --full`, then REPS times: 1% of the files (100, chosen at random)
#      rewritten whole and `ramd snapshot`; then one file rewritten and
#      `ramd snapshot`: bytes as % of the full save's (here the tree, saved
#      as a delta of the inodes that changed, is a large part of a save)
# Untimed checks: the disk loaded from the prefix hashes (sha256) as disk A
# did before its stop, and `ramd image verify s3://BUCKET/ramd` passes.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

size="" reps=3 quick=0 dir=/var/tmp out=""
bench_args --size= --reps= --quick --dir= --out= -- "$@"
((quick)) && size=${size:-256M}
size=${size:-1G}
want_size --size "$size"
want_count --reps "$reps"
want_dir --dir "$dir"

# --- tools and host -----------------------------------------------------------
want_root "it writes /proc/sys/vm/drop_caches and mounts a tmpfs"
need nbdcopy libnbd-bin
need nbdinfo libnbd-bin
need jq jq
need python3 python3
need numfmt coreutils
need sha256sum coreutils
need findmnt util-linux
need mountpoint util-linux
want_fio_nbd

need_weed
# RCLONE=PATH picks one rclone among several (Debian's and a go install).
if [[ -n ${RCLONE:-} ]]; then
    [[ -x $RCLONE ]] || die "RCLONE=$RCLONE: not an executable"
    rclone=$RCLONE
elif ! rclone=$(find_go_tool rclone); then
    note "rclone not found: installing Debian's rclone (apt-get install rclone)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q rclone >/dev/null ||
        die "rclone not found and 'apt-get install rclone' failed: install rclone (Debian package rclone, or go install github.com/rclone/rclone@latest)"
    rclone=$(command -v rclone) || die "apt-get install rclone left no rclone on PATH"
fi

bench_lock
size_bytes=$(numfmt --from=iec "$size")
((size_bytes % (4 << 20) == 0)) || die "--size $size: use a multiple of 4 MiB"
((size_bytes >= 64 << 20)) || die "--size $size: use at least 64M"
pages=$((size_bytes / 4096))
changed=$((pages / 100)) # 1% of the pages
tck=$(getconf CLK_TCK)

# The data file, one disk, the peer's copy in the tmpfs, the page cache's share.
want_memory $((3 * size_bytes + (1 << 30))) "--size $size"
# SeaweedFS keeps deleted objects' bytes in its volumes until a vacuum:
# every full save and every peer copy stays on disk for the run.
want_disk "$dir" "SeaweedFS's volumes and the local image" $(((3 * reps + 4) * size_bytes))

# --- build --------------------------------------------------------------------
build_ramd

# --- work directory -------------------------------------------------------------
work=$(mktemp -d "$dir/ramd-s3.XXXXXX")
bench_trap "$work" "$out"
tmpfs=$work/tmpfs
mnt=$work/mnt
ramd_pid="" ramd_what="" ramd_out=""
mkdir -p "$work/raw" "$work/run" "$work/weed" "$mnt"
at_exit unmount "$mnt"
copy_ramd
export RAMD_RUN_DIR=$work/run
results=$work/raw/results.tsv
: >"$results"
# record KEY VALUE: one figure.
record() { printf '%s\t%s\n' "$1" "$2" >>"$results"; }
record size_bytes "$size_bytes"
record changed_pages "$changed"
record reps "$reps"
record loadavg_start "$(cut -d' ' -f1-3 /proc/loadavg)"

mount_tmpfs "$((2 * size_bytes + (64 << 20)))" "$tmpfs"
note "writing $size of data (3 MiB random, 1 MiB zeros, repeated) to $tmpfs/data"
python3 - "$tmpfs/data" "$size_bytes" <<'EOF'
import os, sys
MiB = 1 << 20
with open(sys.argv[1], "wb") as f:
    for i in range(int(sys.argv[2]) // MiB):
        f.write(bytes(MiB) if i % 4 == 3 else os.urandom(MiB))
EOF

# --- SeaweedFS ------------------------------------------------------------------
bucket=ramdbench
key_id=ramdbench secret=ramdbenchsecret0123456789
start_weed "$weed" "$work/weed" "$work/raw/weed.log" "$bucket" "$key_id" "$secret"
lenient "$weed_pid"

# rclone's remote "peer", from the environment only (no config file).
export RCLONE_CONFIG=$work/rclone.conf
: >"$RCLONE_CONFIG"
export RCLONE_CONFIG_PEER_TYPE=s3 RCLONE_CONFIG_PEER_PROVIDER=SeaweedFS
export RCLONE_CONFIG_PEER_ACCESS_KEY_ID=$key_id RCLONE_CONFIG_PEER_SECRET_ACCESS_KEY=$secret
export RCLONE_CONFIG_PEER_ENDPOINT=$endpoint RCLONE_CONFIG_PEER_REGION=us-east-1
# Without AWS_CA_BUNDLE: Debian's rclone (1.60) refuses to start when it is
# set ("unable to load custom CA bundle"); plain http on loopback needs no CA.
peer() { env -u AWS_CA_BUNDLE "$rclone" --config "$RCLONE_CONFIG" "$@"; }
weed_up() { alive "$weed_pid" "weed mini" && peer lsf "peer:$bucket" 2>"$work/raw/rclone-ready.log"; }
note "starting SeaweedFS (weed mini) on $endpoint"
wait_until 120 "weed mini's S3 at $endpoint (rclone lsf peer:$bucket)" weed_up

# --- helpers ------------------------------------------------------------------
now_ns() { date +%s%N; }

# step_begin: before a timed step, waits for a quiet host, drops the page
# cache, then notes the clocks.
step_begin() {
    wait_quiet
    drop_caches
    step_w0=$(cpu_ticks "$weed_pid")
    step_r0=0
    [[ -z $ramd_pid ]] || step_r0=$(cpu_ticks "$ramd_pid")
    children_cpu_ms "$work/times"
    step_f0=$children_ms
    step_h0=$(host_busy_ticks)
    step_load=$(cut -d' ' -f1 /proc/loadavg)
    step_t0=$(now_ns)
}
# step_end KEY: records KEY_ns (wall time since step_begin) and, in cores
# over that time, KEY_weed_cores, KEY_ramd_cores (the running ramd serve, 0
# if none ran at step_begin), KEY_client_cores (this script's reaped
# children: rclone, the ramd CLI) and KEY_other_cores (the rest of the
# host: the test suite and other work sharing it), and KEY_loadavg (the
# 1-minute load average at the start).
step_end() {
    local key=$1 t1 h1 w1 r1=0 ns other
    t1=$(now_ns)
    h1=$(host_busy_ticks)
    w1=$(cpu_ticks "$weed_pid")
    [[ -z $ramd_pid ]] || r1=$(cpu_ticks "$ramd_pid")
    ((step_r0 <= r1)) || r1=$step_r0 # a ramd started during the step
    children_cpu_ms "$work/times"
    ns=$((t1 - step_t0))
    other=$(((h1 - step_h0) - (w1 - step_w0) - (r1 - step_r0) - (children_ms - step_f0) * tck / 1000))
    ((other > 0)) || other=0
    cores() { awk -v t="$1" -v tck="$tck" -v ns="$ns" 'BEGIN { printf "%.3f", t / tck / (ns / 1e9) }'; }
    record "${key}_ns" "$ns"
    record "${key}_weed_cores" "$(cores $((w1 - step_w0)))"
    record "${key}_ramd_cores" "$(cores $((r1 - step_r0)))"
    record "${key}_client_cores" "$(cores $(((children_ms - step_f0) * tck / 1000)))"
    record "${key}_other_cores" "$(cores "$other")"
    record "${key}_loadavg" "$step_load"
}

# stop_ramd: `ramd down` (saves what changed, releases the lease), then
# waits for the process.
stop_ramd() {
    "$ramd" down bench >/dev/null || die "ramd down bench ($ramd_what) failed"
    local deadline=$((SECONDS + 120))
    while kill -0 "$ramd_pid" 2>/dev/null; do
        ((SECONDS < deadline)) || die "$ramd_what still running 120 s after ramd down"
        sleep 0.05
    done
    reap_server "$ramd_pid" || die "$ramd_what exited with status $?"
    ramd_pid=""
    [[ -z $ramd_out ]] || exec {ramd_out}>&-
    ramd_out=""
}
# snapshot KEY [--full]: a timed `ramd snapshot bench --json`; its bytes,
# pages and ramd's own seconds to the results.
snapshot() {
    local key=$1 file=$work/raw/$1.json
    shift
    step_begin
    "$ramd" snapshot bench --json "$@" >"$file" || die "ramd snapshot bench --json $* failed"
    step_end "$key"
    alive "$ramd_pid" "$ramd_what"
    record "${key}_bytes" "$(jq -e .bytes "$file")"
    record "${key}_pages" "$(jq -e .pages "$file")"
    record "${key}_seconds" "$(jq -e .seconds "$file")"
    record "${key}_full" "$(jq -e .full "$file")"
}
# newest_segment_bytes PREFIX: the size of the newest seg-* object under
# PREFIX, as rclone lists it (names sort by sequence number).
newest_segment_bytes() {
    peer lsjson "peer:$bucket/$1" | jq -e '[.[] | select(.Name | test("^seg-[0-9]+-[0-9a-f]+$"))] | sort_by(.Name) | last | .Size'
}
# --- 0. the peer's local copy of the image ---------------------------------------
note "making the local image the peer copies (disk L, --image $work/local)"
serve_loaded L --size "$size" --image "$work/local"
check_size
nbdcopy "$tmpfs/data" "$uri" || die "nbdcopy to disk L failed"
"$ramd" snapshot bench --full --json >"$work/raw/local-save.json" || die "ramd snapshot --full of disk L failed"
stop_ramd
record local_bytes "$(du -sb "$work/local" | cut -f1)"
record local_files "$(find "$work/local" -type f | wc -l)"

# --- 1. full save -----------------------------------------------------------------
serve_loaded A --size "$size" --image "s3://$bucket/ramd"
check_size
note "filling disk A with the data (nbdcopy)"
nbdcopy "$tmpfs/data" "$uri" || die "nbdcopy to disk A failed"
# peer_save KEY: rclone copy of the local image to a fresh prefix, purged after.
peer_save() {
    step_begin
    peer copy "$work/local" "peer:$bucket/peer" 2>>"$work/raw/rclone.log" || die "rclone copy $work/local peer:$bucket/peer failed"
    step_end "$1"
    record "$1_bytes" "$(peer size --json "peer:$bucket/peer" | jq -e .bytes)"
    peer purge "peer:$bucket/peer" 2>>"$work/raw/rclone.log" || die "rclone purge peer:$bucket/peer failed"
}
for r in $(seq 1 "$reps"); do
    if ((r % 2)); then
        note "full save $r/$reps: ramd snapshot --full, then rclone copy"
        snapshot "full_ramd_$r" --full
        peer_save "full_peer_$r"
    else
        note "full save $r/$reps: rclone copy, then ramd snapshot --full"
        peer_save "full_peer_$r"
        snapshot "full_ramd_$r" --full
    fi
    [[ $(jq .full "$work/raw/full_ramd_$r.json") == true ]] || die "ramd snapshot --full did not make a full save"
done
record full_segment_bytes "$(newest_segment_bytes ramd)"

# --- 2. incremental save ------------------------------------------------------------
for r in $(seq 1 "$reps"); do
    note "incremental save $r/$reps: fio writes $changed random 4 KiB pages, then ramd snapshot"
    fio --name=change --ioengine=nbd --uri="$uri" --size="$size_bytes" --rw=randwrite --bs=4k \
        --iodepth=16 --number_ios="$changed" --refill_buffers --randseed="$r" \
        --output-format=json --output="$work/raw/fio-change-$r.json" >/dev/null || die "fio randwrite (1%) failed"
    record "incr_ios_$r" "$(jq '.jobs[0].write.total_ios' "$work/raw/fio-change-$r.json")"
    snapshot "incr_ramd_$r"
    [[ $(jq .full "$work/raw/incr_ramd_$r.json") == false ]] || die "ramd snapshot made a full save, not an incremental one"
    record "incr_segment_bytes_$r" "$(newest_segment_bytes ramd)"
done
sha_before=$(disk_sha)
stop_ramd
record prefix_bytes "$(peer size --json "peer:$bucket/ramd" | jq -e .bytes)"
record prefix_objects "$(peer size --json "peer:$bucket/ramd" | jq -e .count)"

# --- 3. load --------------------------------------------------------------------
ramd_load() {
    pretouch $((size_bytes + (256 << 20))) >/dev/null # a load fills memory the VM has backed before
    step_begin
    serve_loaded "B$1" --image "s3://$bucket/ramd"
    step_end "load_ramd_$1"
    check_size
    log_s=$(sed -n 's/^.*loaded image .* in \([0-9.]*\) *s.*$/\1/p' "$work/raw/B$1.log" | tail -n 1)
    [[ -z $log_s ]] || record "load_ramd_$1_log_s" "$log_s"
    if (($1 == 1)); then
        note "checking the loaded disk against disk A (sha256, untimed)"
        record data_ok "$([[ $(disk_sha) == "$sha_before" ]] && echo 1 || echo 0)"
    fi
    stop_ramd
}
# peer_load KEY [RCLONE-FLAG...]: rclone copy of the prefix into the tmpfs.
peer_load() {
    local key=$1
    shift
    pretouch $((size_bytes + (256 << 20))) >/dev/null # a load fills memory the VM has backed before
    step_begin
    peer copy "$@" "peer:$bucket/ramd" "$tmpfs/copy" 2>>"$work/raw/rclone.log" || die "rclone copy $* peer:$bucket/ramd $tmpfs/copy failed"
    step_end "$key"
    record "${key}_bytes" "$(du -sb "$tmpfs/copy" | cut -f1)"
    rm -rf "$tmpfs/copy"
}
# Besides rclone's defaults (large objects are fetched as 4 ranges at
# once), one stream per object as ramd reads it: not a goal, it shows
# what the parallel ranges are worth.
for r in $(seq 1 "$reps"); do
    if ((r % 2)); then
        note "load $r/$reps: ramd serve --image s3://, then rclone copy (default, then one stream per object)"
        ramd_load "$r"
        peer_load "load_peer_$r"
        peer_load "load_peer1_$r" --multi-thread-streams 0
    else
        note "load $r/$reps: rclone copy (one stream per object, then default), then ramd serve --image s3://"
        peer_load "load_peer1_$r" --multi-thread-streams 0
        peer_load "load_peer_$r"
        ramd_load "$r"
    fi
done

note "ramd image verify s3://$bucket/ramd (untimed)"
if "$ramd" image verify "s3://$bucket/ramd" >"$work/raw/verify.out" 2>&1; then
    record verify_ok 1
else
    record verify_ok 0
fi

# --- 4. filesystem disk -------------------------------------------------------------
note "filesystem disk: ramd serve --mount (default data path) --image s3://$bucket/fs"
ramd_what="ramd (filesystem disk)"
serve_mount "$ramd_what" "$mnt" 120 "$ramd" serve --name bench --mount "$mnt" --size "$((2 * size_bytes))" \
    --image "s3://$bucket/fs" >"$work/raw/F.out" 2>"$work/raw/F.log"
ramd_pid=$spawned
record fs_data_path "$("$ramd" status --json bench | jq -r '.disks[0].data_path // "?"')"
fs_files=8
per_file=$((size_bytes / fs_files))
for i in $(seq 1 "$fs_files"); do
    dd if="$tmpfs/data" of="$mnt/f$i" bs=1M skip=$(((i - 1) * per_file >> 20)) count=$((per_file >> 20)) status=none ||
        die "copying data into $mnt/f$i failed"
done
sync -f "$mnt"
snapshot fs_full --full
for r in $(seq 1 "$reps"); do
    note "filesystem disk, incremental save $r/$reps: 1% of the files' pages rewritten, then ramd snapshot"
    python3 - "$mnt" "$fs_files" "$per_file" "$r" <<'EOF'
import os, random, sys
d, n, per, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
pages = n * per // 4096
rng = random.Random(seed)
for p in rng.sample(range(pages), pages // 100):
    f, off = divmod(p * 4096, per)
    fd = os.open(os.path.join(d, f"f{f + 1}"), os.O_WRONLY)
    os.pwrite(fd, os.urandom(4096), off)
    os.close(fd)
EOF
    sync -f "$mnt"
    snapshot "fs_incr_$r"
    [[ $(jq .full "$work/raw/fs_incr_$r.json") == false ]] || die "ramd snapshot (filesystem disk) made a full save"
done
"$ramd" down bench >/dev/null || die "ramd down bench ($ramd_what) failed"
wait_until 120 "$ramd_what to stop" bash -c "! kill -0 $ramd_pid"
reap_server "$ramd_pid" || die "$ramd_what exited with status $?"
ramd_pid=""

# --- 5. many small files --------------------------------------------------------
note "filesystem disk of 10,000 small files: ramd serve --mount --image s3://$bucket/many"
ramd_what="ramd (filesystem disk, many files)"
serve_mount "$ramd_what" "$mnt" 120 "$ramd" serve --name bench --mount "$mnt" --size 256M \
    --image "s3://$bucket/many" >"$work/raw/M.out" 2>"$work/raw/M.log"
ramd_pid=$spawned
many_files=10000
# rewrite SEED COUNT: COUNT of the files (chosen with SEED) written whole
# with new random data.
rewrite() {
    python3 - "$mnt/many" "$many_files" "$1" "$2" <<'EOF'
import os, random, sys
d, n, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.makedirs(d, exist_ok=True)
for i in random.Random(seed).sample(range(n), count):
    with open(os.path.join(d, f"f{i:05}"), "wb") as f:
        f.write(os.urandom(4096))
EOF
    sync -f "$mnt"
}
rewrite 0 "$many_files"
snapshot many_full --full
for r in $(seq 1 "$reps"); do
    note "many files, incremental save $r/$reps: 1% of the files rewritten, then ramd snapshot"
    rewrite "$r" $((many_files / 100))
    snapshot "many_incr_$r"
    [[ $(jq .full "$work/raw/many_incr_$r.json") == false ]] || die "ramd snapshot (many files) made a full save"
done
rewrite 999 1
snapshot many_one
"$ramd" down bench >/dev/null || die "ramd down bench ($ramd_what) failed"
wait_until 120 "$ramd_what to stop" bash -c "! kill -0 $ramd_pid"
reap_server "$ramd_pid" || die "$ramd_what exited with status $?"
ramd_pid=""
record loadavg_end "$(cut -d' ' -f1-3 /proc/loadavg)"

# --- report ---------------------------------------------------------------------
{
    echo "# ramd images in object storage vs rclone, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "# host: $(nproc) CPUs, $(awk '$1 == "MemTotal:" { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r); load average at start $(awk -F'\t' '$1 == "loadavg_start" { print $2 }' "$results"), at end $(awk -F'\t' '$1 == "loadavg_end" { print $2 }' "$results")"
    echo "# ramd $("$ramd" --version | awk '{ print $2 }') at $commit (binary sha256 $ramd_sha); $("$rclone" version | head -n 1) ($rclone); SeaweedFS $("$weed" version 2>&1 | awk '/version/ { print $3; exit }') ($weed mini on loopback); SeaweedFS data in $work: $fstype"
    echo
    python3 - "$work/raw" <<'EOF'
import statistics, sys

raw = sys.argv[1]
r = {}
with open(f"{raw}/results.tsv") as f:
    for line in f:
        k, _, v = line.rstrip("\n").partition("\t")
        r[k] = v
num = lambda k: float(r[k])
MiB = 1 << 20
size = num("size_bytes")
reps = int(r["reps"])
runs = range(1, reps + 1)

def secs(k):
    return num(f"{k}_ns") / 1e9

def med(f):
    return statistics.median(f(i) for i in runs)

def each(f, fmt="{:.2f}"):
    return ", ".join(fmt.format(f(i)) for i in runs)

def verdict(ok):
    return "met" if ok else "MISSED"

size_s = f"{size / MiB:.0f} MiB" if size < 1 << 30 else f"{size / (1 << 30):g} GiB"
full_b = med(lambda i: num(f"full_ramd_{i}_bytes"))
save_r, save_p = med(lambda i: secs(f"full_ramd_{i}")), med(lambda i: secs(f"full_peer_{i}"))
load_r, load_p = med(lambda i: secs(f"load_ramd_{i}")), med(lambda i: secs(f"load_peer_{i}"))
incr_b = med(lambda i: num(f"incr_ramd_{i}_bytes"))
incr_s = med(lambda i: secs(f"incr_ramd_{i}"))
fs_full = num("fs_full_bytes")
fs_incr = med(lambda i: num(f"fs_incr_{i}_bytes"))
g_save, g_load = save_p / save_r, load_p / load_r
g_incr, g_fs = incr_b / full_b * 100, fs_incr / fs_full * 100

print(f"| measure ({size_s} disk, 75% random, 25% zero), medians of {reps} | ramd | rclone | ramd speed / rclone's | goal |")
print("|---|---:|---:|---:|---|")
print(f"| full save to s3:// (s) | {save_r:.2f} | {save_p:.2f} | {g_save:.2f} | ≥ 1: {verdict(g_save >= 1)} |")
print(f"| load from s3:// into memory (s) | {load_r:.2f} | {load_p:.2f} | {g_load:.2f} | ≥ 1: {verdict(g_load >= 1)} |")
l1 = med(lambda i: secs(f"load_peer1_{i}"))
print(f"| load, rclone with one stream per object (`--multi-thread-streams 0`), no goal (s) | {load_r:.2f} | {l1:.2f} "
      f"| {l1 / load_r:.2f} | |")
print()
print(f"| incremental save, 1% of pages changed | bytes uploaded | % of the full save's | seconds | goal |")
print("|---|---:|---:|---:|---|")
print(f"| block disk (NBD) | {incr_b / MiB:.2f} MiB of {full_b / MiB:.1f} MiB | {g_incr:.2f}% | {incr_s:.2f} (full: {save_r:.2f}) "
      f"| ≤ 3%: {verdict(g_incr <= 3)} |")
print(f"| filesystem disk (--mount, data path {r['fs_data_path']}) | {fs_incr / MiB:.2f} MiB of {fs_full / MiB:.1f} MiB "
      f"| {g_fs:.2f}% | {med(lambda i: secs(f'fs_incr_{i}')):.2f} (full: {secs('fs_full'):.2f}) | ≤ 3%: {verdict(g_fs <= 3)} |")
many_full = num("many_full_bytes")
many_incr = med(lambda i: num(f"many_incr_{i}_bytes"))
g_many = many_incr / many_full * 100
print(f"| filesystem disk of 10,000 files of 4 KiB, 1% of them rewritten | {many_incr / MiB:.2f} MiB of {many_full / MiB:.1f} MiB "
      f"| {g_many:.2f}% | {med(lambda i: secs(f'many_incr_{i}')):.2f} (full: {secs('many_full'):.2f}) | ≤ 3%: {verdict(g_many <= 3)} |")
print(f"| the same disk, one file rewritten (no goal) | {num('many_one_bytes') / 1024:.1f} KiB of {many_full / MiB:.1f} MiB "
      f"| {num('many_one_bytes') / many_full * 100:.3f}% | {secs('many_one'):.2f} | |")
print()
print("Each run (seconds; r = ramd, p = rclone):")
print()
print("- full save: r " + each(lambda i: secs(f"full_ramd_{i}")) + "; p " + each(lambda i: secs(f"full_peer_{i}"))
      + " (odd runs ramd first)")
print("- load: r " + each(lambda i: secs(f"load_ramd_{i}")) + "; p " + each(lambda i: secs(f"load_peer_{i}"))
      + " (odd runs ramd first); p, one stream per object: " + each(lambda i: secs(f"load_peer1_{i}")))
print("- incremental save bytes (MiB): " + each(lambda i: num(f"incr_ramd_{i}_bytes") / MiB)
      + "; its segment object as rclone lists it: " + each(lambda i: num(f"incr_segment_bytes_{i}") / MiB)
      + "; filesystem disk: " + each(lambda i: num(f"fs_incr_{i}_bytes") / MiB)
      + "; many files: " + each(lambda i: num(f"many_incr_{i}_bytes") / MiB))
print()
print("Host load during each timed step (cores busy: SeaweedFS / ramd serve / client / everything else; 1-min load average):")
print()
keys = [f"full_ramd_{i}" for i in runs] + [f"full_peer_{i}" for i in runs] \
     + [f"load_ramd_{i}" for i in runs] + [f"load_peer_{i}" for i in runs] + [f"load_peer1_{i}" for i in runs] \
     + [f"incr_ramd_{i}" for i in runs] + ["fs_full"]
for k in keys:
    print(f"- {k}: {num(k + '_weed_cores'):.2f} / {num(k + '_ramd_cores'):.2f} / {num(k + '_client_cores'):.2f} "
          f"/ {num(k + '_other_cores'):.2f}; {r[k + '_loadavg']}")
print()
print(f"Sizes: ramd's full save {full_b / MiB:.1f} MiB (segment object {num('full_segment_bytes') / MiB:.1f} MiB); "
      f"the local image rclone uploads {num('local_bytes') / MiB:.1f} MiB in {r['local_files']} files "
      f"(rclone's copies: {each(lambda i: num(f'full_peer_{i}_bytes') / MiB, '{:.1f}')} MiB); "
      f"the prefix rclone downloads {num('prefix_bytes') / MiB:.1f} MiB in {r['prefix_objects']} objects "
      f"(ramd loads the same chain).")
print()
print("Data after the load: " + ("as saved (sha256)." if r["data_ok"] == "1" else "DIFFERENT FROM WHAT WAS SAVED."))
print("ramd image verify: " + ("ok." if r["verify_ok"] == "1" else "FAILED (see verify.out)."))
EOF
} | tee "$work/raw/summary.md"
[[ $(awk -F'\t' '$1 == "data_ok" { print $2 }' "$results") == 1 ]] || die "the loaded disk differs from the saved one"
[[ $(awk -F'\t' '$1 == "verify_ok" { print $2 }' "$results") == 1 ]] || die "ramd image verify failed: $(cat "$work/raw/verify.out")"
