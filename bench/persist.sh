#!/usr/bin/env bash
# Persistence benchmark: ramd's image save and load against what a user
# would do by hand with cp, the cost of an incremental save, and the I/O a
# disk keeps serving while --autosave runs. See BENCHMARKS.md for what the
# figures mean.
#
# usage: bench/persist.sh [--size SIZE] [--quick] [--dir DIR] [--out DIR]
#
#   --size SIZE   disk size and amount of data, e.g. 1G (powers of 1024;
#                 default 4G, with --quick 512M)
#   --quick       smoke run: 512M disk, 8 s fio runs (1 s ramp)
#   --dir DIR     where the images and the cp files go: a mktemp directory
#                 is made in DIR and removed at the end (default /var/tmp, a
#                 real disk; tmpfs or ramfs is refused)
#   --out DIR     also keep the raw figures in DIR (results.tsv, snapshot and
#                 status JSON, fio JSON, ramd logs, summary.md)
#
# Run as root: it writes /proc/sys/vm/drop_caches and mounts a tmpfs.
#
# Data: SIZE bytes of /dev/urandom, made once in a tmpfs (SIZE + 64 MiB,
# mounted under the work directory, unmounted at the end): incompressible,
# so neither side gains from compression or holes.
#
# Steps, each timed one after the other on the same filesystem; before every
# timed step the script waits until the rest of the host is idle and runs
# `sync; echo 3 > /proc/sys/vm/drop_caches`:
#   1. full save: disk A (`ramd serve --size SIZE --image DIR/image`) is
#      filled with the data (nbdcopy), then `ramd snapshot bench --full
#      --json` (its own seconds and bytes, and the command's wall time),
#      against `cp` of the data file from the tmpfs to DIR followed by
#      `sync FILE DIR` (fsync of the file and its directory: a save is
#      durable, so the copy must be too)
#   2. incremental save: fio (nbd engine) writes 1% of the disk's 4 KiB
#      pages once each (random order, --number_ios, fio's random map), then
#      `ramd snapshot bench --json`: its bytes and seconds as % of the full
#      save's
#   3. load: A is stopped; memory is pre-touched (2 x SIZE + 256 MiB, so the
#      VM has backed it before); disk B (`ramd serve --image DIR/image`, no
#      --size) is started: time from exec to the URI line on stdout (ramd
#      prints it once the image is loaded), against `cp` of the copy from
#      step 1 out of DIR into the tmpfs. Both fill fresh memory: the load
#      measures first-touch (cold) memory, not a warm copy
#   4. I/O during autosave: fio, nbd engine, one connection, 4 KiB random
#      reads and writes 50/50 at QD16, time based, against B (an image but
#      no autosave), then against disk C (`--image DIR/image --autosave 2s`);
#      both loaded from the same image, so every page holds data and every
#      autosave has work; IOPS of each, and how many saves C made meanwhile
#      (status `saves`)
# Untimed checks: the disk read back after the load hashes (sha256) as it
# did before the stop, and `ramd image verify` passes at the end.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

size="" quick=0 dir=/var/tmp out=""
bench_args --size= --quick --dir= --out= -- "$@"
if ((quick)); then
    size=${size:-512M} runtime=8 ramp=1
else
    size=${size:-4G} runtime=20 ramp=2
fi
autosave=2s
want_size --size "$size"
want_quiet_wait
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
want_fio_nbd

bench_lock
size_bytes=$(numfmt --from=iec "$size")
((size_bytes % 1048576 == 0)) || die "--size $size: use a whole number of MiB"
((size_bytes >= 64 << 20)) || die "--size $size: use at least 64M"
pages=$((size_bytes / 4096))
changed=$((pages / 100)) # step 2: 1% of the pages
tck=$(getconf CLK_TCK)

# At most one disk and one SIZE file in the tmpfs at a time, plus the
# page cache's share and room for everyone else.
want_memory $((2 * size_bytes + (1 << 30))) "--size $size"
# The image (a full save, incremental saves: autosave can rewrite much of
# the disk) and the cp file.
want_disk "$dir" "images and copies" $((4 * size_bytes))

# --- build --------------------------------------------------------------------
build_ramd
"$built" serve --help | grep -q -- '--image' ||
    die "this ramd has no 'serve --image': persistence is not built in yet"

# --- work directory -----------------------------------------------------------
work=$(mktemp -d "$dir/ramd-persist.XXXXXX")
# On a failure ramd may be killed during its stop save; the image goes anyway.
bench_trap "$work" "$out"
tmpfs=$work/tmpfs
image=$work/image
ramd_pid="" ramd_what="" ramd_tag=""
mkdir -p "$work/raw" "$work/run"
copy_ramd
export RAMD_RUN_DIR=$work/run
results=$work/raw/results.tsv
: >"$results"
# record KEY VALUE: one figure.
record() { printf '%s\t%s\n' "$1" "$2" >>"$results"; }
record size_bytes "$size_bytes"
record changed_pages "$changed"

mount_tmpfs "$((size_bytes + (64 << 20)))" "$tmpfs"
note "writing $size of /dev/urandom to $tmpfs/data"
head -c "$size_bytes" /dev/urandom >"$tmpfs/data"

# --- helpers ------------------------------------------------------------------
# step_begin PID: before a timed step, waits for a quiet host, drops the
# page cache, then notes the clocks. PID is the ramd whose CPU counts as the
# server's ("" if none runs yet or none is involved).
step_begin() {
    wait_quiet
    drop_caches
    step_c0=0
    [[ -z $1 ]] || step_c0=$(cpu_ticks "$1")
    children_cpu_ms "$work/times"
    step_f0=$children_ms
    step_h0=$(host_busy_ticks)
    step_t0=$(date +%s%N)
}

# step_end KEY PID: records KEY_ns (wall time since step_begin) and, in
# cores over that time, KEY_server_cores (PID's CPU), KEY_client_cores (this
# script's reaped children: cp, sync, fio, the ramd CLI) and
# KEY_other_cores (the rest of the host, kernel writeback threads included).
step_end() {
    local key=$1 pid=$2 t1 h1 c1=0 ns other
    t1=$(date +%s%N)
    h1=$(host_busy_ticks)
    [[ -z $pid ]] || c1=$(cpu_ticks "$pid")
    children_cpu_ms "$work/times"
    ns=$((t1 - step_t0))
    other=$(((h1 - step_h0) - (c1 - step_c0) - (children_ms - step_f0) * tck / 1000))
    ((other > 0)) || other=0
    record "${key}_ns" "$ns"
    record "${key}_server_cores" "$(awk -v c=$((c1 - step_c0)) -v t="$tck" -v ns="$ns" 'BEGIN { printf "%.3f", c / t / (ns / 1e9) }')"
    record "${key}_client_cores" "$(awk -v ms=$((children_ms - step_f0)) -v ns="$ns" 'BEGIN { printf "%.3f", ms / 1e3 / (ns / 1e9) }')"
    record "${key}_other_cores" "$(awk -v o="$other" -v t="$tck" -v ns="$ns" 'BEGIN { printf "%.3f", o / t / (ns / 1e9) }')"
}

# stop_ramd: saves what changed first (untimed; the stop save then has
# nothing to do, so stop_pid's 10 s are plenty), then SIGTERM.
stop_ramd() {
    "$ramd" snapshot bench --json >"$work/raw/$ramd_tag.stop-snapshot.json" ||
        die "$ramd_what: ramd snapshot before the stop failed"
    stop_server "$ramd_pid" || die "$ramd_what did not stop cleanly"
    ramd_pid=""
    exec {ramd_out}>&-
}
# status FILE: this disk's `ramd status --json` object.
status() {
    "$ramd" status --json bench | jq -e -c '.disks[0]' >"$1" || die "ramd status of $ramd_what failed"
}
# snapshot KEY FILE [--full]: a timed `ramd snapshot`; its JSON to FILE and
# its seconds, bytes and pages to the results.
snapshot() {
    local key=$1 file=$2
    shift 2
    step_begin "$ramd_pid"
    "$ramd" snapshot bench --json "$@" >"$file" || die "ramd snapshot bench --json $* failed"
    step_end "$key" "$ramd_pid"
    alive "$ramd_pid" "$ramd_what"
    jq -e . "$file" >/dev/null || die "ramd snapshot --json printed no JSON: $(cat "$file")"
    record "${key}_seconds" "$(jq -e .seconds "$file")"
    record "${key}_bytes" "$(jq -e .bytes "$file")"
    record "${key}_pages" "$(jq -e .pages "$file")"
    record "${key}_full" "$(jq .full "$file")"
}
# --- 1. full save ---------------------------------------------------------------
serve_loaded A --size "$size" --image "$image"
check_size
note "filling disk A with the data (nbdcopy)"
nbdcopy "$tmpfs/data" "$uri" || die "nbdcopy to disk A failed"
record fill_rss_kib "$(proc_kib "$ramd_pid" VmRSS)"

note "full save: ramd snapshot --full"
pretouch $((size_bytes + (256 << 20))) >/dev/null
snapshot full_save "$work/raw/full-save.json" --full
[[ $(jq .full "$work/raw/full-save.json") == true ]] || die "ramd snapshot --full did not make a full save"

note "full save: cp of the data from the tmpfs to $work, then sync of the copy"
pretouch $((size_bytes + (256 << 20))) >/dev/null
step_begin ""
cp "$tmpfs/data" "$work/copy"
sync "$work/copy" "$work" # fsync the file and its directory entry
step_end cp_save ""
rm "$tmpfs/data"

# --- 2. incremental save --------------------------------------------------------
note "writing 1% of the pages ($changed random 4 KiB pages, each once)"
fio --name=change --ioengine=nbd --uri="$uri" --size="$size_bytes" --rw=randwrite --bs=4k \
    --iodepth=16 --number_ios="$changed" --refill_buffers \
    --output-format=json --output="$work/raw/fio-change.json" >/dev/null || die "fio randwrite (1%) failed"
record changed_ios "$(jq '.jobs[0].write.total_ios' "$work/raw/fio-change.json")"
note "incremental save: ramd snapshot"
snapshot incr_save "$work/raw/incr-save.json"
[[ $(jq .full "$work/raw/incr-save.json") == false ]] || die "ramd snapshot made a full save, not an incremental one"
sha_before=$(disk_sha)
status "$work/raw/A.status.json"
stop_ramd
record image_bytes "$(du -sb "$image" | cut -f1)"

# --- 3. load ------------------------------------------------------------------
# Memory the VM has never backed faults in much slower than memory it has
# handed out before: touch and free what both loads need, and report the speed.
note "pre-touching $(((2 * size_bytes + (256 << 20)) >> 20)) MiB so both loads get the same kind of fresh memory"
record pretouch_gibs "$(pretouch $((2 * size_bytes + (256 << 20))))"

note "load: ramd serve --image (time to the URI line)"
step_begin ""
serve_loaded B --image "$image"
step_end load "$ramd_pid"
check_size
record load_rss_kib "$(proc_kib "$ramd_pid" VmRSS)"
status "$work/raw/B.loaded.status.json"
record load_memory_used "$(jq .memory_used "$work/raw/B.loaded.status.json")"
# ramd's own figure: "loaded image DIR: N pages ... in T s".
log_s=$(sed -n 's/^.*loaded image .* in \([0-9.]*\) *s.*$/\1/p' "$work/raw/B.log" | tail -n 1)
if [[ -n $log_s ]]; then record load_log_s "$log_s"; fi

note "load: cp of the copy from $work into the tmpfs"
step_begin ""
cp "$work/copy" "$tmpfs/copy"
step_end cp_load ""
rm "$tmpfs/copy"
umount "$tmpfs"

note "checking the loaded disk against the saved one (sha256, untimed)"
sha_after=$(disk_sha)
record data_ok "$([[ $sha_after == "$sha_before" ]] && echo 1 || echo 0)"

# --- 4. I/O during autosave -------------------------------------------------------
# fio_mix KEY: the timed mix against the running disk; IOPS to the results.
fio_mix() {
    local key=$1 json=$work/raw/fio-$1.json
    wait_quiet
    fio --name="$key" --ioengine=nbd --uri="$uri" --size="$size_bytes" --rw=randrw --rwmixread=50 \
        --bs=4k --iodepth=16 --norandommap --time_based --runtime="$runtime" --ramp_time="$ramp" \
        --output-format=json --output="$json" >/dev/null || die "fio mix ($key) failed"
    alive "$ramd_pid" "$ramd_what"
    [[ $(jq '.jobs[0].error' "$json") == 0 ]] || die "fio mix ($key) reported error $(jq '.jobs[0].error' "$json")"
    record "${key}_iops" "$(jq '.jobs[0].read.iops + .jobs[0].write.iops' "$json")"
}
note "I/O: ${runtime}s of 4 KiB randrw 50/50 QD16 on disk B (no autosave)"
fio_mix mix_plain
stop_ramd

serve_loaded C --image "$image" --autosave "$autosave"
check_size
status "$work/raw/C.before.status.json"
note "I/O: the same on disk C (--autosave $autosave)"
log0=$(wc -l <"$work/raw/C.log")
fio_mix mix_autosave
status "$work/raw/C.after.status.json"
# How many of them were full saves (ramd starts a new chain when the old one
# grows large): from ramd's log lines, "saved full save N (...)".
record autosave_full_saves "$(tail -n +$((log0 + 1)) "$work/raw/C.log" | grep -c 'saved full save' || true)"
record autosave_saves "$(($(jq -e .saves "$work/raw/C.after.status.json") - $(jq -e .saves "$work/raw/C.before.status.json")))"
record autosave_error "$(jq -j '.last_save_error // ""' "$work/raw/C.after.status.json" | tr '\t\n' '  ')"
stop_ramd

note "ramd image verify (untimed)"
drop_caches
if "$ramd" image verify "$image" >"$work/raw/verify.out" 2>&1; then
    record verify_ok 1
else
    record verify_ok 0
fi

# --- report ---------------------------------------------------------------------
{
    echo "# ramd persistence: image save and load vs cp, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "# host: $(nproc) CPUs, $(awk '$1 == "MemTotal:" { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r)"
    echo "# ramd $("$ramd" --version | awk '{ print $2 }') at $commit (binary sha256 $ramd_sha), $(fio --version), $(nbdcopy --version | head -n 1)"
    echo "# images and copies in $work: $fstype on $(findmnt -n -o SOURCE --target "$dir")"
    echo
    RUNTIME=$runtime RAMP=$ramp AUTOSAVE=$autosave python3 - "$work/raw" <<'EOF'
import os, sys

raw = sys.argv[1]
r = {}
with open(f"{raw}/results.tsv") as f:
    for line in f:
        k, _, v = line.rstrip("\n").partition("\t")
        r[k] = v
num = lambda k: float(r[k])
MiB = 1 << 20
size = num("size_bytes")
runtime, ramp, autosave = os.environ["RUNTIME"], os.environ["RAMP"], os.environ["AUTOSAVE"]

def secs(k):
    return num(f"{k}_ns") / 1e9

def verdict(ok):
    return "MET" if ok else "MISSED"

def fmt(v):
    if v >= 10000:
        return f"{v / 1000:.1f}k"
    return f"{v:.0f}" if v >= 100 else f"{v:.2f}" if v < 10 else f"{v:.1f}"

save_r, save_c = size / MiB / secs("full_save"), size / MiB / secs("cp_save")
load_r, load_c = size / MiB / secs("load"), size / MiB / secs("cp_load")
ib, isec = num("incr_save_bytes") / num("full_save_bytes") * 100, num("incr_save_seconds") / num("full_save_seconds") * 100
iops_p, iops_a = num("mix_plain_iops"), num("mix_autosave_iops")
goals = [
    ("full save ≥ 0.8 × cp + sync", save_r / save_c >= 0.8),
    ("load ≥ 0.8 × cp", load_r / load_c >= 0.8),
    ("incremental save of 1% of the pages: bytes ≤ 3% of the full save's", ib <= 3),
    ("incremental save of 1% of the pages: seconds ≤ 3% of the full save's", isec <= 3),
    (f"I/O during --autosave {autosave} ≥ 0.8 × without", iops_a / iops_p >= 0.8),
]
size_s = f"{size / MiB:.0f} MiB" if size < 1 << 30 else f"{size / (1 << 30):g} GiB"
print(f"| measure ({size_s} disk of random data) | unit | ramd | baseline | baseline is | ramd/baseline | goal |")
print("|---|---|---:|---:|---|---:|---|")
print(f"| full save (durable) | MiB/s | {fmt(save_r)} | {fmt(save_c)} | cp tmpfs → disk + sync "
      f"| {save_r / save_c:.2f} | ≥ 0.8: {verdict(goals[0][1])} |")
print(f"| load (into fresh memory) | MiB/s | {fmt(load_r)} | {fmt(load_c)} | cp disk → tmpfs "
      f"| {load_r / load_c:.2f} | ≥ 0.8: {verdict(goals[1][1])} |")
print(f"| incremental save, 1% of pages changed: bytes written | MiB | {num('incr_save_bytes') / MiB:.2f} "
      f"| {num('full_save_bytes') / MiB:.1f} | the full save | {ib:.2f}% | ≤ 3%: {verdict(goals[2][1])} |")
print(f"| incremental save, 1% of pages changed: seconds | s | {num('incr_save_seconds'):.3f} "
      f"| {num('full_save_seconds'):.3f} | the full save | {isec:.2f}% | ≤ 3%: {verdict(goals[3][1])} |")
print(f"| 4 KiB randrw 50/50 QD16 during --autosave {autosave} | IOPS | {fmt(iops_a)} | {fmt(iops_p)} "
      f"| the same disk without autosave | {iops_a / iops_p:.2f} | ≥ 0.8: {verdict(goals[4][1])} |")
print()
print("How each figure was taken (every timed step after `sync; echo 3 > /proc/sys/vm/drop_caches`):")
print()
print(f"- full save: `ramd snapshot bench --full --json` on a disk filled with nbdcopy, "
      f"wall time of the command {secs('full_save'):.3f} s (ramd's own `seconds` {num('full_save_seconds'):.3f}), "
      f"{num('full_save_pages'):.0f} pages, {num('full_save_bytes') / MiB:.1f} MiB written "
      f"({num('full_save_bytes') / size * 100:.1f}% of the data); ramd used {num('full_save_server_cores'):.2f} cores meanwhile. "
      f"Baseline: `cp` of the same data from a tmpfs file to the image's filesystem, then `sync FILE DIR` "
      f"(fsync of both), as a save is durable: {secs('cp_save'):.3f} s.")
print(f"- load: from exec of `ramd serve --image DIR` (no --size) to its URI line, {secs('load'):.3f} s"
      + (f" (ramd's log: loaded in {num('load_log_s'):.3f} s)" if "load_log_s" in r else "")
      + f"; the image was {num('image_bytes') / MiB:.1f} MiB on disk (full save + incremental saves). "
      f"Baseline: `cp` of a {size_s} file from the image's filesystem into a tmpfs: {secs('cp_load'):.3f} s.")
print(f"  Both fill fresh memory, so this is cold memory: ramd's RSS after the load was "
      f"{num('load_rss_kib') / 1024:.1f} MiB (status memory_used {num('load_memory_used') / MiB:.1f} MiB; "
      f"{num('fill_rss_kib') / 1024:.1f} MiB after the nbdcopy fill). Before it the script touched and freed "
      f"{(2 * size + (256 << 20)) / MiB:.0f} MiB at {num('pretouch_gibs'):.2f} GiB/s, so the VM had backed that memory "
      f"before (memory it never backed faults in several times slower).")
print(f"- incremental save: fio wrote {num('changed_ios'):.0f} random 4 KiB pages once each "
      f"(1% of {size / 4096:.0f}), then `ramd snapshot bench --json` saved {num('incr_save_pages'):.0f} pages, "
      f"{num('incr_save_bytes') / MiB:.2f} MiB in {num('incr_save_seconds'):.3f} s (wall {secs('incr_save'):.3f} s).")
err = r.get("autosave_error", "").strip()
print(f"- I/O: fio, nbd engine, one connection, 4 KiB random reads and writes 50/50, QD16, {runtime} s after "
      f"{ramp} s ramp, over the whole disk, first on a disk loaded from the image without autosave, then on "
      f"one loaded from it with `--autosave {autosave}`: {num('autosave_saves'):.0f} saves during the run"
      + f" ({num('autosave_full_saves'):.0f} of them full saves, per ramd's log)"
      + (f"; last save error: {err}" if err else ", none failed") + ".")
print()
print("Goals:")
for label, ok in goals:
    print(f"- {'MET   ' if ok else 'MISSED'} {label}")
print()
print("Data after the load: " + ("as saved (sha256)." if r["data_ok"] == "1" else "DIFFERENT FROM WHAT WAS SAVED."))
print("ramd image verify: " + ("ok." if r["verify_ok"] == "1" else "FAILED (see verify.out)."))
noisy = sorted({k[:-len("_other_cores")] + f" ({num(k):.2f})" for k in r
                if k.endswith("_other_cores") and num(k) > 0.25})
if noisy:
    print()
    print("WARNING: other processes kept more than a quarter of a core busy during these steps")
    print("(cores; kernel writeback threads count here too): " + ", ".join(noisy))
EOF
} | tee "$work/raw/summary.md"
[[ $(awk -F'\t' '$1 == "data_ok" { print $2 }' "$results") == 1 ]] || die "the loaded disk differs from the saved one"
[[ $(awk -F'\t' '$1 == "verify_ok" { print $2 }' "$results") == 1 ]] || die "ramd image verify failed: $(cat "$work/raw/verify.out")"
