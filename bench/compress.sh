#!/usr/bin/env bash
# Compression benchmark: the same data sets written to ramd (with each of its
# codecs), to the kernel's zram and to `nbdkit memory allocator=zstd`, in one
# run; memory used, ratio, write and read throughput, side by side.
#
# usage: bench/compress.sh [--size SIZE] [--quick] [--out DIR]
#
#   --size SIZE   bytes of each data set (and size of every disk), e.g. 256M,
#                 1G (powers of 1024; default 512M, with --quick 128M)
#   --quick       smoke run: 128M data sets, 256M hot-set disk, one short
#                 IOPS run per server; every target is still measured
#   --out DIR     also keep the raw figures in DIR (results.tsv, ramd status
#                 JSON, zram mm_stat, fio JSON, server logs, summary.md)
#
# Run as root: zram needs /sys/block/zram0 (the zram module loaded with at
# least one device, unused: disksize 0; it is reset on exit).
#
# Data sets, files in a mktemp directory under /var/tmp (a real disk): the
# writes read them from the page cache (each is read once before its writes):
#   usr     the first SIZE bytes of
#           `tar -cf - /usr/bin /usr/share/doc /usr/lib/x86_64-linux-gnu`
#           (binaries, libraries, text: a realistic mix of this machine)
#   zero    SIZE zero bytes
#   random  SIZE bytes of /dev/urandom (incompressible)
#
# Targets, each started fresh (empty) for every data set, one at a time:
#   zram-lz4, zram-lzo-rle   /sys/block/zram0 (reset; comp_algorithm; disksize
#                            SIZE); written with `dd bs=1M oflag=direct`, read
#                            with `dd bs=1M iflag=direct`: one client thread
#   nbdkit-zstd              nbdkit memory SIZE allocator=zstd
#   ramd-none, ramd-lz4, ramd-zstd
#                            ramd serve --compress none|lz4|zstd (zstd:3),
#                            compressing as pages are written (zram's way)
#   ramd-zstd+re, ramd-lz4+re
#                            the same with zstd or lz4, plus
#                            --recompress zstd:12 --idle-after 2s: idle pages
#                            re-packed into frames of up to 16 pages
#   ramd-zstd-tiered         --compress zstd --compress-after 2s
#                            --recompress zstd:12 --idle-after 2s: written
#                            pages stay raw (memory-speed writes) until
#                            untouched; pages read whole twice between two
#                            scanner passes turn raw again
#   Every ramd runs with its default warm pool: freed page memory kept for
#   reuse decays back to the kernel within seconds of idleness, and the
#   measurement waits for that (so its RSS is what a user sees). The NBD servers are written with
#   `nbdcopy -S 0 FILE URI` (4 connections; -S 0: zero blocks are sent as
#   data, as zram gets them) and read with `nbdcopy --no-extents URI null:`.
#
# Measures, per data set and target:
#   memory used   zram: mm_stat mem_used_total plus its table (16 bytes per
#                 4 KiB page of disksize); servers: VmRSS growth since
#                 the server was ready (empty). ramd also shows its status's
#                 memory_used. Taken after the write, once ramd's background
#                 work has settled: no change in its page counts (hot,
#                 compressed, frame, idle, incompressible) nor memory_used,
#                 and under 5% of a core of ramd CPU, for 4 s; with a
#                 deadline (then reported as not settled)
#   ratio         SIZE / memory used
#   peak          zram: mem_used_max; servers: VmHWM growth
#   write, read   SIZE / wall time of one dd or nbdcopy, MiB/s
#   data ok       what was read back (`nbdcopy URI -`, or dd) hashes as the
#                 source file (sha256); untimed
#
# Hot set: a ramd disk (1G; --quick 256M) filled with the usr mix, 4 KiB
# random reads (fio, nbd engine, one connection) over its first 64 MiB, at
# QD32 and QD1, for `--compress none` against `--compress zstd
# --compress-after 2s` (hot/cold tiering), once the latter has compressed
# every page (status hot_pages 0). Before each timed run two sequential
# passes over the hot set warm it up (the tiered disk turns a page read
# whole twice between scanner passes back to raw). Runs alternate which server goes first (3 runs, 10 s after 2 s
# ramp; --quick: 1 run, 3 s after 1 s).
#
# Before every timed step the script waits for the rest of the host to be
# idle and reports the CPU anything else used meanwhile ("other", in cores);
# a target (or hot-set run) during which that passed a quarter of a core is
# measured again (fresh server), up to twice. Waits and repeats together
# take at most BENCH_QUIET_WAIT seconds (default 150).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")
# shellcheck source=bench/lib.sh
. "$here/lib.sh"

size="" quick=0 out=""
bench_args --size= --quick --out= -- "$@"
if ((quick)); then
    size=${size:-128M} hot_disk=256M runs=1 runtime=3 ramp=1
else
    size=${size:-512M} hot_disk=1G runs=3 runtime=10 ramp=2
fi
hot_set=64M
recompress=zstd:12 idle_after=2s compress_after=2s
want_size --size "$size"
want_quiet_wait

# --- tools and host -----------------------------------------------------------
((EUID == 0)) || die "run as root: zram is set up through /sys/block/zram0"
need cargo "cargo (or rustup)"
need nbdkit nbdkit
need nbdcopy libnbd-bin
need nbdinfo libnbd-bin
need fio fio
need jq jq
need python3 python3
need numfmt coreutils
need sha256sum coreutils
need tar tar
need blockdev util-linux
want_fio_nbd
nbdkit memory --dump-plugin >/dev/null 2>&1 ||
    die "nbdkit has no memory plugin: apt-get install nbdkit"

bench_lock
# Checked under the lock: a benchmark that was running may have held it.
zram_check lz4 lzo-rle

size_bytes=$(numfmt --from=iec "$size")
hot_bytes=$(numfmt --from=iec "$hot_disk")
hot_set_bytes=$(numfmt --from=iec "$hot_set")
((size_bytes % 1048576 == 0)) || die "--size $size: use a whole number of MiB"
((size_bytes >= 16 << 20)) || die "--size $size: use at least 16M"
big=$((size_bytes > hot_bytes ? size_bytes : hot_bytes))
tck=$(getconf CLK_TCK)
# Two hot-set disks at once (or one data set), the source files in the page
# cache, and room for everyone else.
want_memory $((2 * big + 3 * size_bytes + (1 << 30))) "--size $size"

# --- build ----------------------------------------------------------------------
build_ramd

# --- work directory -------------------------------------------------------------
work=$(mktemp -d /var/tmp/ramd-compress.XXXXXX)
bench_trap "$work" "$out"
mkdir -p "$work/data" "$work/raw/status" "$work/raw/fio" "$work/raw/logs"
copy_ramd
declare -A hot_pid=()
results=$work/raw/results.tsv
: >"$results"

# --- data sets ----------------------------------------------------------------
note "preparing the data sets ($size each) in $work/data"
# tar stops on SIGPIPE once head has enough.
{ tar -cf - /usr/bin /usr/share/doc /usr/lib/x86_64-linux-gnu 2>/dev/null || true; } |
    head -c "$big" >"$work/data/usr.all"
got=$(stat -c %s "$work/data/usr.all")
((got == big)) || die "the /usr mix is only $got bytes, less than $big: use a smaller --size"
head -c "$size_bytes" "$work/data/usr.all" >"$work/data/usr"
head -c "$hot_bytes" "$work/data/usr.all" >"$work/data/usr-hot"
rm "$work/data/usr.all"
head -c "$size_bytes" /dev/zero >"$work/data/zero"
head -c "$size_bytes" /dev/urandom >"$work/data/random"
sets=(usr zero random)
declare -A sha=()
for s in "${sets[@]}"; do
    sha[$s]=$(sha256sum <"$work/data/$s" | cut -d' ' -f1)
done

# Memory the VM has never backed is much slower to fault in than memory it
# has handed out before; touching and freeing what the run will need gives
# every target the same kind of (recycled) pages. Its speed is reported.
note "pre-touching $(((2 * big + (256 << 20)) >> 20)) MiB so every target gets the same kind of fresh memory"
pretouch=$(pretouch $((2 * big + (256 << 20))))

# --- measuring helpers --------------------------------------------------------
# Figures of one attempt go to $pending first; an attempt during which the
# rest of the host was busy is thrown away and measured again (keep) .
pending=$work/pending.tsv
: >"$pending"
# record SET TARGET KEY VALUE: one figure.
record() { printf '%s\t%s\t%s\t%s\n' "$@" >>"$pending"; }
keep() {
    cat "$pending" >>"$results"
    : >"$pending"
}

# timed PID KEY CMD...: waits for a quiet host, runs CMD and records, under
# KEY for the current set and target: wall time (ns), and in cores over the
# run the server's CPU (PID; "" for zram, whose work is done in the
# client's context), the client's (CMD and its children) and everyone
# else's. Sets noisy=1 if everyone else kept more than a quarter of a core
# busy (and at least 2 clock ticks: short runs are measured in ticks).
# Fails if CMD fails.
timed() {
    local pid=$1 key=$2 c0=0 c1=0 h0 h1 t0 t1 f0 rc=0 other
    shift 2
    wait_quiet
    children_cpu_ms "$work/times"
    f0=$children_ms
    [[ -z $pid ]] || c0=$(cpu_ticks "$pid")
    h0=$(host_busy_ticks)
    t0=$(date +%s%N)
    "$@" || rc=$?
    t1=$(date +%s%N)
    h1=$(host_busy_ticks)
    [[ -z $pid ]] || c1=$(cpu_ticks "$pid")
    children_cpu_ms "$work/times"
    ((rc == 0)) || return "$rc"
    record "$cur_set" "$cur_target" "${key}_ns" "$((t1 - t0))"
    # Ticks and ms as cores over the wall time.
    record "$cur_set" "$cur_target" "${key}_server_cores" \
        "$(awk -v c=$((c1 - c0)) -v t="$tck" -v ns=$((t1 - t0)) 'BEGIN { printf "%.3f", c / t / (ns / 1e9) }')"
    record "$cur_set" "$cur_target" "${key}_client_cores" \
        "$(awk -v ms=$((children_ms - f0)) -v ns=$((t1 - t0)) 'BEGIN { printf "%.3f", ms / 1e3 / (ns / 1e9) }')"
    # In ticks: host busy - server - client (ms -> ticks).
    other=$(((h1 - h0) - (c1 - c0) - (children_ms - f0) * tck / 1000))
    ((other > 0)) || other=0
    record "$cur_set" "$cur_target" "${key}_other_cores" \
        "$(awk -v o="$other" -v t="$tck" -v ns=$((t1 - t0)) 'BEGIN { printf "%.3f", o / t / (ns / 1e9) }')"
    if ((other > 2 && other * 4 * 1000000000 > (t1 - t0) * tck)); then
        noisy=1
        noisy_what+=" $key:$(awk -v o="$other" -v t="$tck" -v ns=$((t1 - t0)) 'BEGIN { printf "%.2f", o / t / (ns / 1e9) }')"
    fi
    return 0
}

# attempts WHAT CMD...: runs CMD (which measures through timed) until the
# host was quiet during it, at most 3 times while the BENCH_QUIET_WAIT
# budget lasts (repeats spend it too); keeps the figures of the last.
attempts() {
    local what=$1 try start
    shift
    for try in 1 2 3; do
        noisy=0 noisy_what="" start=$SECONDS
        "$@"
        if ((noisy && try < 3 && quiet_budget > 0)); then
            note "$what: other processes were busy meanwhile (cores:$noisy_what): measuring again"
            : >"$pending"
            quiet_budget=$((quiet_budget - (SECONDS - start)))
            ((quiet_budget > 0)) || quiet_budget=0
            continue
        fi
        break
    done
    keep
}

# ramd_status RUN_DIR NAME FILE: ramd's status of disk NAME, as JSON, to FILE.
ramd_status() {
    RAMD_RUN_DIR=$1 "$ramd" status --json "$2" | jq -c '.disks[0]' >"$3" ||
        die "ramd status of $2 in $1 failed"
}

# start_ramd LOG-NAME SIZE DIR OPTS...: `ramd serve --name bench` in DIR (run
# dir DIR/run); sets started_pid and started_uri.
start_ramd() {
    local name=$1 size=$2 dir=$3
    shift 3
    serve_log=$work/raw/logs/$name.log serve_nbd "$ramd" "$dir" "$size" --name bench "$@"
    started_pid=$ramd_pid started_uri=$uri
}

# ramd_opts TARGET: sets opts, the ramd serve options of a ramd-* target.
ramd_opts() {
    case $1 in
    ramd-none) opts=(--compress none) ;;
    ramd-lz4) opts=(--compress lz4) ;;
    ramd-zstd) opts=(--compress zstd) ;;
    ramd-zstd+re) opts=(--compress zstd --recompress "$recompress" --idle-after "$idle_after") ;;
    ramd-lz4+re) opts=(--compress lz4 --recompress "$recompress" --idle-after "$idle_after") ;;
    ramd-zstd-tiered) opts=(--compress zstd --compress-after "$compress_after"
        --recompress "$recompress" --idle-after "$idle_after") ;;
    *) die "no target $1" ;;
    esac
}

# settle PID RUN_DIR LIMIT: waits until ramd's background work is done: its
# page counts, memory_used and warm pool unchanged (the pool's decay is
# over), and it under 5% of a core, for 4 s.
# Sets settled (1 or 0: LIMIT seconds passed first) and settle_s.
settle() {
    local pid=$1 run=$2 limit=$3 start=$SECONDS since=$SECONDS snap last="" c c_since
    c_since=$(cpu_ticks "$pid")
    settled=0
    while ((SECONDS - start < limit)); do
        alive "$pid" "ramd ($cur_target)"
        ramd_status "$run" bench "$work/settle.json"
        snap=$(jq -r '[.hot_pages, .compressed_pages, .frame_pages, .idle_pages,
            .incompressible_pages, .memory_used, .pool.warm_bytes] | @tsv' "$work/settle.json")
        c=$(cpu_ticks "$pid")
        if [[ $snap != "$last" ]]; then
            last=$snap since=$SECONDS c_since=$c
        elif ((SECONDS - since >= 4)); then
            if (((c - c_since) * 100 < 5 * tck * (SECONDS - since))); then
                settled=1
                break
            fi
            since=$SECONDS c_since=$c # still busy: start the 4 s again
        fi
        sleep 0.5
    done
    settle_s=$((SECONDS - start))
}

zram_stat() { awk -v f="$1" '{ print $f }' "$zram/mm_stat"; }

# --- one target, one data set ---------------------------------------------------
nbd_write() { nbdcopy -S 0 "$1" "$2"; }
nbd_read() { nbdcopy --no-extents "$1" null:; }
zram_write() { dd if="$1" of=/dev/zram0 bs=1M oflag=direct status=none; }
zram_read() { dd if=/dev/zram0 of=/dev/null bs=1M iflag=direct status=none; }

measure() {
    local set=$1 t=$2 file=$work/data/$1 base=0 pid="" uri="" run="" got
    cur_set=$set cur_target=$t
    note "$set data on $t"
    case $t in
    zram-*)
        zram_setup "${t#zram-}" "$size_bytes"
        base=$(zram_stat 3)
        ;;
    nbdkit-zstd)
        # A socket per data set: nbdkit leaves the file behind when it stops.
        start_nbdkit "$work/nbdkit.$set.sock" "$size_bytes" "$work/raw/logs/$set.$t.log" allocator=zstd
        srv_pid=$nbdkit_pid pid=$nbdkit_pid uri=$nbdkit_uri
        base=$(($(proc_kib "$pid" VmRSS) * 1024))
        ;;
    ramd-*)
        ramd_opts "$t"
        start_ramd "$set.$t" "$size_bytes" "$work/run.$set.$t" "${opts[@]}"
        run=$work/run.$set.$t/run srv_pid=$started_pid pid=$started_pid uri=$started_uri
        base=$(($(proc_kib "$pid" VmRSS) * 1024))
        ;;
    esac
    record "$set" "$t" base "$base"

    cat "$file" >/dev/null # the source comes from the page cache
    if [[ $t == zram-* ]]; then
        timed "" write zram_write "$file" || die "dd to zram0 ($t) failed"
    else
        timed "$pid" write nbd_write "$file" "$uri" || die "nbdcopy to $t failed"
        alive "$pid" "$t"
    fi

    # Memory, once any background work is done.
    case $t in
    zram-*)
        # zram's table: one 16-byte entry per page of disksize, outside
        # mem_used_total (zram_drv.h's struct zram_table_entry).
        # shellcheck disable=SC2017 # size_bytes is whole MiB: exact
        record "$set" "$t" mem "$(($(zram_stat 3) - base + size_bytes / 4096 * 16))"
        record "$set" "$t" peak "$(($(zram_stat 5) - base))"
        cp "$zram/mm_stat" "$work/raw/status/$set.$t.mm_stat"
        ;;
    *)
        if [[ $t == ramd-* ]]; then
            settle "$pid" "$run" $((60 + size_bytes / 2097152))
            record "$set" "$t" settled "$settled"
            record "$set" "$t" settle_s "$settle_s"
            ((settled)) || note "WARNING: $t on $set data still busy after ${settle_s}s: measuring anyway"
            ramd_status "$run" bench "$work/raw/status/$set.$t.json"
            record "$set" "$t" status_mem "$(jq .memory_used "$work/raw/status/$set.$t.json")"
        fi
        record "$set" "$t" mem "$(($(proc_kib "$pid" VmRSS) * 1024 - base))"
        record "$set" "$t" peak "$(($(proc_kib "$pid" VmHWM) * 1024 - base))"
        ;;
    esac

    if [[ $t == zram-* ]]; then
        timed "" read zram_read || die "dd from zram0 ($t) failed"
        got=$(dd if=/dev/zram0 bs=1M iflag=direct status=none | sha256sum | cut -d' ' -f1)
        record "$set" "$t" mem_after_read "$(($(zram_stat 3) - base))"
        zram_reset || die "could not reset zram0"
    else
        timed "$pid" read nbd_read "$uri" || die "nbdcopy from $t failed"
        alive "$pid" "$t"
        got=$(nbdcopy "$uri" - | sha256sum | cut -d' ' -f1)
        alive "$pid" "$t"
        record "$set" "$t" mem_after_read "$(($(proc_kib "$pid" VmRSS) * 1024 - base))"
        if [[ $t == ramd-* ]]; then
            ramd_status "$run" bench "$work/raw/status/$set.$t.after-read.json"
            record "$set" "$t" status_mem_after_read "$(jq .memory_used "$work/raw/status/$set.$t.after-read.json")"
        fi
        stop_server "$srv_pid" || die "$t did not stop cleanly"
        rm -rf "$work/run.$set.$t"
    fi
    if [[ $got == "${sha[$set]}" ]]; then
        record "$set" "$t" data_ok 1
    else
        record "$set" "$t" data_ok 0
        note "WRONG DATA: $t returned $set data with sha256 $got, expected ${sha[$set]}"
        noisy=0 # never measured again: this attempt's figures are kept
    fi
}

targets=(zram-lz4 zram-lzo-rle nbdkit-zstd ramd-none ramd-lz4 ramd-zstd ramd-zstd+re ramd-lz4+re ramd-zstd-tiered)
for ds in "${sets[@]}"; do
    for t in "${targets[@]}"; do
        attempts "$ds data on $t" measure "$ds" "$t"
    done
done

# --- hot set: 4 KiB random reads, tiered against uncompressed -------------------
cur_set=hot
hot_servers=(none tiered)
declare -A hot_uri=() hot_run=()
for h in "${hot_servers[@]}"; do
    if [[ $h == none ]]; then opts=(--compress none); else opts=(--compress zstd --compress-after "$compress_after"); fi
    start_ramd "hot.$h" "$hot_bytes" "$work/run.hot.$h" "${opts[@]}"
    hot_run[$h]=$work/run.hot.$h/run
    hot_pid[$h]=$started_pid hot_uri[$h]=$started_uri
done
for h in "${hot_servers[@]}"; do
    cur_target=$h
    note "hot set: filling the $hot_disk $h disk with the usr mix"
    cat "$work/data/usr-hot" >/dev/null
    timed "${hot_pid[$h]}" fill nbd_write "$work/data/usr-hot" "${hot_uri[$h]}" || die "nbdcopy to hot $h failed"
    keep # a first fill cannot be repeated
done
note "hot set: waiting until the tiered disk has compressed every page (hot_pages 0)"
hot_compressed() {
    alive "${hot_pid[tiered]}" "ramd (hot, tiered)"
    ramd_status "${hot_run[tiered]}" bench "$work/hot.json"
    [[ $(jq .hot_pages "$work/hot.json") == 0 ]]
}
start=$SECONDS
wait_until $((60 + hot_bytes / 2097152)) "the tiered disk compressing every page" hot_compressed
record hot tiered compress_wait_s $((SECONDS - start))
keep
for h in "${hot_servers[@]}"; do
    ramd_status "${hot_run[$h]}" bench "$work/raw/status/hot.$h.compressed.json"
done

# hot_pages SERVER: the disk's hot_pages now.
hot_pages() {
    ramd_status "${hot_run[$1]}" bench "$work/hot.json"
    jq .hot_pages "$work/hot.json"
}
fio_hot() {
    fio --name="$1" --ioengine=nbd --uri="$2" --offset=0 --size="$hot_set" "${@:4}" \
        --output-format=json --output="$3" >/dev/null
}
# hot_run_once SERVER RUN QD: warm-up (two passes: the tiered disk turns a
# page raw when it is read whole twice between scanner passes), then the
# timed random reads.
hot_run_once() {
    local h=$1 r=$2 qd=$3
    cur_target=$h
    alive "${hot_pid[$h]}" "ramd (hot, $h)"
    fio_hot warmup "${hot_uri[$h]}" "$work/raw/fio/hot.$h.warmup.$r.$qd.json" \
        --rw=read --bs=1M --iodepth=8 --loops=2 || die "fio warm-up on $h failed"
    record hot "$h" "hot_pages_warm.$r.$qd" "$(hot_pages "$h")"
    timed "${hot_pid[$h]}" "randread.$r.$qd" fio_hot randread "${hot_uri[$h]}" \
        "$work/raw/fio/hot.$h.randread.$r.$qd.json" --rw=randread --bs=4k --iodepth="$qd" \
        --norandommap --time_based --runtime="$runtime" --ramp_time="$ramp" ||
        die "fio randread on $h failed"
    record hot "$h" "hot_pages_after.$r.$qd" "$(hot_pages "$h")"
}
for ((r = 1; r <= runs; r++)); do
    if ((r % 2)); then order=(none tiered); else order=(tiered none); fi
    for qd in 32 1; do
        for h in "${order[@]}"; do
            note "hot set: run $r/$runs, 4 KiB randread QD$qd on $h"
            attempts "hot set QD$qd on $h" hot_run_once "$h" "$r" "$qd"
        done
    done
done
for h in "${hot_servers[@]}"; do
    ramd_status "${hot_run[$h]}" bench "$work/raw/status/hot.$h.end.json"
    stop_server "${hot_pid[$h]}" || die "ramd (hot, $h) did not stop cleanly"
    unset "hot_pid[$h]"
done

# --- report -------------------------------------------------------------------
{
    echo "# ramd compression vs zram and nbdkit memory allocator=zstd, $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "# host: $(nproc) CPUs, $(awk '$1 == "MemTotal:" { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo), kernel $(uname -r)"
    echo "# ramd $("$ramd" --version | awk '{ print $2 }') at $commit (binary sha256 $ramd_sha), $(nbdkit --version), $(nbdcopy --version | head -n 1), $(fio --version)"
    echo "# data sets of $size each; pre-touch of $(((2 * big + (256 << 20)) >> 20)) MiB of host memory before the run: $pretouch GiB/s"
    echo
    SIZE_BYTES=$size_bytes HOT_DISK=$hot_disk HOT_SET=$hot_set HOT_SET_BYTES=$hot_set_bytes RUNS=$runs RUNTIME=$runtime RAMP=$ramp \
        RECOMPRESS=$recompress IDLE_AFTER=$idle_after COMPRESS_AFTER=$compress_after \
        python3 - "$work" <<'EOF'
import json, os, statistics, sys
from collections import defaultdict

work = sys.argv[1]
size = int(os.environ["SIZE_BYTES"])
MiB = 1 << 20
res = defaultdict(dict)
with open(f"{work}/raw/results.tsv") as f:
    for line in f:
        s, t, k, v = line.rstrip("\n").split("\t")
        res[(s, t)][k] = float(v)

targets = ["zram-lz4", "zram-lzo-rle", "nbdkit-zstd", "ramd-none", "ramd-lz4", "ramd-zstd",
           "ramd-zstd+re", "ramd-lz4+re", "ramd-zstd-tiered"]
rc, ia, ca = os.environ["RECOMPRESS"], os.environ["IDLE_AFTER"], os.environ["COMPRESS_AFTER"]
how = {
    "zram-lz4": "zram0, comp_algorithm lz4; dd bs=1M oflag=direct / iflag=direct",
    "zram-lzo-rle": "zram0, comp_algorithm lzo-rle; dd as above",
    "nbdkit-zstd": "nbdkit memory allocator=zstd; nbdcopy",
    "ramd-none": "ramd --compress none (no compression); nbdcopy",
    "ramd-lz4": "ramd --compress lz4 (each page as written); nbdcopy",
    "ramd-zstd": "ramd --compress zstd (zstd:3, each page as written); nbdcopy",
    "ramd-zstd+re": f"ramd --compress zstd --recompress {rc} --idle-after {ia}; nbdcopy",
    "ramd-lz4+re": f"ramd --compress lz4 --recompress {rc} --idle-after {ia}; nbdcopy",
    "ramd-zstd-tiered": f"ramd --compress zstd --compress-after {ca} --recompress {rc} --idle-after {ia}; "
                        "nbdcopy. Written pages stay raw until idle; pages read whole twice between "
                        "scanner passes turn raw again (one read, as here, leaves them compressed)",
}

def mibs(s, t, k):
    return size / MiB / (res[(s, t)][f"{k}_ns"] / 1e9)

def ratio(mem):
    if mem <= 0:
        return "∞"
    r = size / mem
    return f"{r:.0f}" if r >= 100 else f"{r:.2f}"

def rel(a, b):
    if b <= 0:
        return "–"
    return f"{a / b:.2f}"

print("Targets (every one started empty for each data set, so every write faults in")
print("fresh memory: first-touch page faults are part of the write figures; that")
print("memory was touched once by the pre-touch, so it is recycled guest memory, not")
print("memory the VM has never backed):")
print()
for t in targets:
    print(f"- {t}: {how[t]}")
print()
print("memory used: zram's mm_stat mem_used_total (zsmalloc pages) plus its table of")
print("16 bytes per 4 KiB of disksize; for nbdkit and ramd the growth of the server's")
print("VmRSS from ready (empty) to after the write, once ramd's background work and its")
print("warm pool's decay settled (default settings: what the host sees). ramd's own status memory_used (pages, allocator")
print("slack, metadata) is shown beside it. ratio = data written / memory used.")
print("peak: zram mem_used_max, servers' VmHWM growth. write/read: MiB/s of one dd")
print(f"(1 thread, O_DIRECT, 1 MiB) for zram, one nbdcopy for the servers (its defaults:")
print(f"multi-conn with min(4, CPUs) = {min(4, os.cpu_count())} connections, 256 KiB requests, 64 in flight")
print("per connection). other: cores busy with anything else during the write / the read.")
print("×zram-lz4 = memory used / zram-lz4's (lower is better); ×nbdkit = write")
print("throughput / nbdkit-zstd's (higher is better).")
print()
verdicts = []
for s in ("usr", "zero", "random"):
    print(f"### data set: {s} ({size / MiB:.0f} MiB)")
    print()
    print("| target | memory used, MiB | ratio | ×zram-lz4 | peak, MiB | ramd status memory_used, MiB (ratio) "
          "| write MiB/s | ×nbdkit | read MiB/s | write CPU, cores srv+client | other, cores w/r | data ok |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    zmem = res[(s, "zram-lz4")]["mem"]
    nw = mibs(s, "nbdkit-zstd", "write")
    for t in targets:
        r = res[(s, t)]
        st = "–"
        if "status_mem" in r:
            st = f"{r['status_mem'] / MiB:.1f} ({ratio(r['status_mem'])})"
            if not r.get("settled", 1):
                st += f" NOT SETTLED after {r['settle_s']:.0f}s"
        w = mibs(s, t, "write")
        cpu = r["write_server_cores"] + r["write_client_cores"]
        print(f"| {t} | {r['mem'] / MiB:.1f} | {ratio(r['mem'])} | {rel(r['mem'], zmem)} "
              f"| {r['peak'] / MiB:.1f} | {st} | {w:.0f} | {rel(w, nw)} | {mibs(s, t, 'read'):.0f} "
              f"| {r['write_server_cores']:.2f}+{r['write_client_cores']:.2f} "
              f"| {r['write_other_cores']:.2f} / {r['read_other_cores']:.2f} "
              f"| {'yes' if r['data_ok'] else 'NO: WRONG DATA'} |")
    print()
    notes = []
    for t in targets:
        r = res[(s, t)]
        if "settle_s" in r and (t.endswith("+re") or t.endswith("-tiered")):
            notes.append(f"{t} settled {r['settle_s']:.0f} s after the write")
        if "status_mem_after_read" in r and abs(r["status_mem_after_read"] - r["status_mem"]) > MiB:
            notes.append(f"{t}: status memory_used went from {r['status_mem'] / MiB:.1f} to "
                         f"{r['status_mem_after_read'] / MiB:.1f} MiB across the read")
        if abs(r["mem_after_read"] - r["mem"]) > 4 * MiB:
            notes.append(f"{t}: memory used went from {r['mem'] / MiB:.1f} to "
                         f"{r['mem_after_read'] / MiB:.1f} MiB across the read")
    if notes:
        print("Notes: " + "; ".join(notes) + ".")
        print()
    # Where the memory goes, from ramd's status and zram's mm_stat.
    print("| target | stored data, MiB | allocator slack, MiB | metadata, MiB | pages: compressed / in frames (frames) / incompressible / same-filled |")
    print("|---|---:|---:|---:|---|")
    for t in targets:
        if t.startswith("zram-"):
            with open(f"{work}/raw/status/{s}.{t}.mm_stat") as f:
                mm = [int(x) for x in f.read().split()]
            # orig compr mem_used limit max same compacted huge ...
            print(f"| {t} | {mm[1] / MiB:.1f} | {(mm[2] - mm[1]) / MiB:.1f} | (not counted) "
                  f"| – / – / {mm[7] if len(mm) > 7 else '?'} / {mm[5]} |")
        elif t.startswith("ramd-"):
            with open(f"{work}/raw/status/{s}.{t}.json") as f:
                d = json.load(f)
            print(f"| {t} | {d['stored_bytes'] / MiB:.1f} | {d['slack_bytes'] / MiB:.1f} | {d['metadata_bytes'] / MiB:.2f} "
                  f"| {d['compressed_pages']} / {d['frame_pages']} ({d['frames']}) / {d['incompressible_pages']} "
                  f"/ {d['zero_pages'] + d['fill_pages']} |")
    print()

# Goals, on the realistic (usr) mix.
u = lambda t: res[("usr", t)]
zl = u("zram-lz4")["mem"]
for t in ("ramd-lz4", "ramd-lz4+re"):
    m = u(t)["mem"]
    verdicts.append((f"{t}: memory used ≤ zram-lz4's ({m / MiB:.1f} vs {zl / MiB:.1f} MiB, "
                     f"×{m / zl:.3f}; by status memory_used ×{u(t)['status_mem'] / zl:.3f})", m <= zl))
m = u("ramd-lz4+re")["mem"]
verdicts.append((f"ramd-lz4+re: memory used ≤ 0.77 × zram-lz4's ({m / MiB:.1f} vs {zl / MiB:.1f} MiB, "
                 f"×{m / zl:.3f})", m <= 0.77 * zl))
for t in ("ramd-zstd", "ramd-zstd+re", "ramd-zstd-tiered"):
    m = u(t)["mem"]
    k = zl / m
    verdicts.append((f"{t}: ratio ≥ 1.3 × zram-lz4's ({size / m:.2f} vs {size / zl:.2f}: ×{k:.3f}; "
                     f"by status memory_used ×{zl / u(t)['status_mem']:.3f})", k >= 1.3))
nw = mibs("usr", "nbdkit-zstd", "write")
for t in ("ramd-zstd", "ramd-zstd+re", "ramd-zstd-tiered"):
    w = mibs("usr", t, "write")
    verdicts.append((f"{t}: write ≥ 5 × nbdkit-zstd's ({w:.0f} vs {nw:.0f} MiB/s: ×{w / nw:.2f})", w >= 5 * nw))
bad = [f"{t} on {s}" for (s, t), r in res.items() if "data_ok" in r and not r["data_ok"]]

# Hot set.
runs, rt, rp = int(os.environ["RUNS"]), os.environ["RUNTIME"], os.environ["RAMP"]
hr = res[("hot", "tiered")]
def fio_iops(h, r, qd):
    with open(f"{work}/raw/fio/hot.{h}.randread.{r}.{qd}.json") as f:
        j = json.load(f)["jobs"][0]
    if j["error"]:
        sys.exit(f"fio on {h} reported error {j['error']}")
    return j["read"]["iops"], j["read"]["clat_ns"]["percentile"]["99.000000"] / 1e3
with open(f"{work}/raw/status/hot.tiered.compressed.json") as f:
    tc = json.load(f)
print(f"### hot set: 4 KiB random reads over the first {os.environ['HOT_SET']} of a {os.environ['HOT_DISK']} disk of the usr mix")
print()
print(f"none: ramd --compress none; tiered: ramd --compress zstd --compress-after {ca}")
print(f"(both with the default warm pool). The tiered disk had compressed every page")
print(f"{hr['compress_wait_s']:.0f} s after its fill (memory_used {tc['memory_used'] / MiB:.1f} MiB, "
      f"ratio {tc['ratio']:.2f}, {tc['compressed_pages']} compressed")
print(f"and {tc['incompressible_pages']} incompressible pages). Before each run two 1 MiB sequential reads of")
print(f"the hot set warmed it up. fio --ioengine=nbd, one connection, {rt} s after {rp} s")
print(f"ramp, {runs} run(s) alternating which disk goes first. IOPS and p99: medians of")
print("each disk's runs; tiered/none: the median of the per-run ratios (run r of one")
print("disk against run r of the other, taken one after the other), with their range.")
print()
print("| QD | none IOPS | tiered IOPS | tiered/none (range) | none p99 µs | tiered p99 µs | tiered hot_pages: after warm-up / after run | other, cores none/tiered | goal |")
print("|---|---:|---:|---:|---:|---:|---|---|---|")
for qd in (32, 1):
    n = [fio_iops("none", r, qd) for r in range(1, runs + 1)]
    t = [fio_iops("tiered", r, qd) for r in range(1, runs + 1)]
    ratios = [b[0] / a[0] for a, b in zip(n, t)]
    rq = statistics.median(ratios)
    rng = f" ({min(ratios):.2f}–{max(ratios):.2f})" if runs > 1 else ""
    warm = "/".join(f"{hr[f'hot_pages_warm.{r}.{qd}']:.0f}" for r in range(1, runs + 1))
    after = "/".join(f"{hr[f'hot_pages_after.{r}.{qd}']:.0f}" for r in range(1, runs + 1))
    other = lambda h: statistics.median(res[("hot", h)][f"randread.{r}.{qd}_other_cores"] for r in range(1, runs + 1))
    ok = rq >= 0.9
    verdicts.append((f"hot set QD{qd}: tiered IOPS ≥ 0.9 × uncompressed ({rq:.3f})", ok))
    print(f"| {qd} | {statistics.median(x[0] for x in n):.0f} | {statistics.median(x[0] for x in t):.0f} "
          f"| {rq:.2f}{rng} | {statistics.median(x[1] for x in n):.1f} | {statistics.median(x[1] for x in t):.1f} "
          f"| {warm} / {after} | {other('none'):.2f} / {other('tiered'):.2f} | ≥ 0.9: {'MET' if ok else 'MISSED'} |")
print(f"(the hot set is {int(os.environ['HOT_SET_BYTES']) // 4096} pages)")
print()
print("Goals (usr mix; memory used = RSS growth, status memory_used in brackets):")
for label, ok in verdicts:
    print(f"- {'MET   ' if ok else 'MISSED'} {label}")
print()
print("Data read back: " + ("all as written." if not bad else "WRONG DATA from " + ", ".join(bad)))
noisy = sorted({f"{t} on {s}" for (s, t), r in res.items()
                for k, v in r.items() if k.endswith("_other_cores") and v > 0.25})
if noisy:
    print()
    print("WARNING: other processes kept more than a quarter of a core busy while measuring")
    print("these (throughput figures suspect): " + ", ".join(noisy))
EOF
} | tee "$work/raw/summary.md"
