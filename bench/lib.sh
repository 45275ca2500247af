# Helpers shared by the bench/ scripts. Source it; it defines functions only.
# What every script has in common lives here: the command line (bench_args),
# building ramd (build_ramd), starting each kind of server and waiting for it
# with a deadline (serve_nbd, serve_mount, start_nbdkit, start_tgt, start_weed,
# zram_setup, mount_tmpfs) and the one EXIT trap that stops and removes all of
# it (bench_trap). A script keeps only its own measurements and report.
# shellcheck shell=bash

die() {
    echo "bench: error: $*" >&2
    exit 1
}

note() {
    echo "bench: $*" >&2
}

# need TOOL DEBIAN-PACKAGE: fail at once, with the install command, when a
# tool is missing; a benchmark that silently skips a server proves nothing.
need() {
    command -v "$1" >/dev/null 2>&1 ||
        die "$1 not found: install it with 'apt-get install $2'"
}

# usage: prints the script's header comment (its help), from line 2 to the
# first line that is not a comment.
usage() {
    sed -n '2,/^[^#]/{/^[^#]/d;s/^# \{0,1\}//;s/^#$//;p}' "$0"
}

# bench_args SPEC... -- ARGS...: parses a script's command line. Each SPEC is
# one flag the script takes: "--quick" is a switch (sets quick=1); "--size="
# takes a value, kept in the variable of the flag's name (dashes become
# underscores: --file-size sets file_size); "--time=secs" keeps it in the
# named variable. -h/--help prints the header comment and exits; anything
# else is an error that names it. The caller sets the defaults first.
bench_args() {
    local -A takes=()
    local spec flag var
    while (($#)) && [[ $1 != -- ]]; do
        spec=$1
        shift
        flag=${spec%%=*}
        if [[ $spec == *=* ]]; then
            var=${spec#*=}
            var=${var:-${flag#--}}
            takes[$flag]=${var//-/_}
        else
            takes[$flag]=!${flag#--}
        fi
    done
    (($#)) || die "bench_args: no -- before the arguments"
    shift
    while (($#)); do
        case $1 in
        -h | --help)
            usage
            exit 0
            ;;
        esac
        var=${takes[$1]:-}
        [[ -n $var ]] || die "unknown argument '$1' (try --help)"
        if [[ $var == !* ]]; then
            printf -v "${var#!}" 1
            shift
        else
            (($# >= 2)) || die "$1 needs a value"
            printf -v "$var" '%s' "$2"
            shift 2
        fi
    done
}

# want_count FLAG VALUE, want_size FLAG VALUE, want_dir FLAG VALUE: the
# checks the scripts' flags share (a positive whole number; a size with an
# optional K, M, G or T suffix, powers of 1024; an existing directory).
want_count() {
    [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 '$2': use a positive whole number"
}
want_size() {
    [[ $2 =~ ^[1-9][0-9]*[KMGT]?$ ]] ||
        die "$1 '$2': use a number with an optional K, M, G or T suffix (powers of 1024)"
}
want_dir() {
    [[ -d $2 ]] || die "$1 $2: no such directory"
}
want_quiet_wait() {
    [[ ${BENCH_QUIET_WAIT:-0} =~ ^[0-9]+$ ]] || die "BENCH_QUIET_WAIT must be a number of seconds"
}

# want_memory BYTES WHY: MemAvailable holds more than BYTES, or fails
# saying how much WHY needs and how much there is.
want_memory() {
    local kib
    kib=$(awk '$1 == "MemAvailable:" { print $2 }' /proc/meminfo)
    ((kib * 1024 > $1)) ||
        die "$2: needs $(($1 >> 20)) MiB of available memory; MemAvailable is $((kib / 1024)) MiB"
}

# want_disk DIR WHAT [BYTES]: DIR is on a real disk (WHAT must go there:
# not tmpfs or ramfs) with more than BYTES free; sets fstype.
want_disk() {
    local free
    fstype=$(findmnt -n -o FSTYPE --target "$1")
    case $fstype in
    tmpfs | ramfs) die "--dir $1 is on $fstype: $2 must go to a real disk" ;;
    esac
    free=$(df -B1 --output=avail "$1" | tail -n 1 | tr -d ' ')
    ((free > ${3:-0})) ||
        die "--dir $1: needs $((${3:-0} >> 20)) MiB of free space for $2; it has $((free >> 20)) MiB"
}

# want_root WHY: fails unless run as root.
want_root() {
    ((EUID == 0)) || die "run as root: $1"
}

# want_fio_nbd: fio with its nbd engine (Debian's is built with libnbd).
want_fio_nbd() {
    need fio fio
    fio --enghelp=nbd >/dev/null 2>&1 ||
        die "this fio has no nbd engine: install Debian's fio (apt-get install fio), built with libnbd"
}

# build_ramd: builds ramd (release) in CARGO_TARGET_DIR (default the repo's
# target/, exported for the scripts that run cargo again) and sets built (the
# binary), commit (the short commit, "+ uncommitted changes" when the
# sources differ from it) and revision (git describe). Needs repo.
build_ramd() {
    need cargo "cargo (or rustup)"
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$repo/target}
    note "building ramd (release) in $CARGO_TARGET_DIR"
    (cd "$repo" && cargo build --release --quiet -p ramd) || die "cargo build failed"
    built=$CARGO_TARGET_DIR/release/ramd
    [[ -x $built ]] || die "$built was not built"
    commit=$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)
    git -C "$repo" diff --quiet HEAD -- crates Cargo.toml Cargo.lock 2>/dev/null || commit+=" + uncommitted changes"
    # shellcheck disable=SC2034 # read by the caller
    revision=$(git -C "$repo" describe --always --dirty 2>/dev/null || echo "unknown revision")
}

# copy_ramd: a copy of the built ramd in WORK (so that a rebuild during the
# run cannot swap the binary); sets ramd and ramd_sha (its hash, 12 digits).
copy_ramd() {
    ramd=$work/ramd
    cp "$built" "$ramd"
    # shellcheck disable=SC2034 # read by the caller
    ramd_sha=$(sha256sum "$ramd" | cut -c1-12)
}

# --- servers and the end of a run ---------------------------------------------
# Every server a script starts goes through spawn, every mount and device
# through at_exit; bench_trap's EXIT trap then stops the servers still
# running, undoes the rest newest first, and ends with finish_run.
declare -A bench_pids=() bench_clean=() bench_lenient=()
bench_order=() bench_undo=()

# spawn WHAT CMD...: starts CMD in the background, without the benchmark
# lock (a leftover must not hold it), as a server the EXIT trap stops if the
# script has not (stop_server); sets spawned to its pid. Redirect the call.
spawn() {
    local what=$1
    shift
    if [[ -n ${bench_lock_fd:-} ]]; then
        "$@" {bench_lock_fd}>&- &
    else
        "$@" &
    fi
    spawned=$!
    bench_pids[$spawned]=$what
    bench_order+=("$spawned")
}

# stop_server PID [STATUS]: stop_pid on a server started by spawn, named as
# spawn was told; it is no longer stopped at exit.
stop_server() {
    local pid=$1 what=${bench_pids[$1]:-server}
    unset "bench_pids[$pid]"
    stop_pid "$pid" "$what" "${2:-${bench_clean[$pid]:-0}}"
}

# reap_server PID: waits for a server started by spawn that was told to go
# (an unmount, `ramd down`) and returns its exit status; it is no longer
# stopped at exit.
reap_server() {
    unset "bench_pids[$1]"
    wait "$1"
}

# clean_status PID STATUS: one more exit status that means a clean stop for
# this server (libfuse's examples exit 1 when a signal ends their loop).
clean_status() {
    bench_clean[$1]=$2
}

# lenient PID: a server whose slow or failed stop at exit does not fail the
# run (stop_pid says so and kills it): SeaweedFS, now and then over 10 s on
# a busy host, after the figures are taken.
lenient() {
    bench_lenient[$1]=1
}

# at_exit CMD...: one more thing the EXIT trap undoes (unmount, reset a
# device), after the servers stop, newest first; a failure fails the run.
at_exit() {
    bench_undo+=("$(printf '%q ' "$@")")
}

# unmount DIR: unmounts DIR if it is a mount point (lazily if busy).
unmount() {
    findmnt -n --mountpoint "$1" >/dev/null 2>&1 || return 0
    umount "$1" 2>/dev/null || umount -l "$1" || { note "could not unmount $1"; return 1; }
}

# mount_tmpfs BYTES DIR: a tmpfs of BYTES (or a size with a suffix) on DIR,
# unmounted at exit.
mount_tmpfs() {
    mkdir -p "$2"
    mount -t tmpfs -o "size=$1" tmpfs "$2" || die "could not mount a tmpfs of $1 on $2"
    at_exit unmount "$2"
}

# bench_trap WORK OUT: installs the script's one EXIT trap (INT and TERM
# exit 130 and 143 through it). At exit: the servers still running stop,
# newest first (a ramd before the object store it saves to), the at_exit
# actions run newest first, then finish_run WORK OUT. Call it right after
# making WORK.
bench_trap() {
    bench_work=$1 bench_out=$2
    trap bench_exit EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
}
bench_exit() {
    local rc=$? ok=0 pid i
    trap - EXIT INT TERM
    cd /
    for ((i = ${#bench_order[@]} - 1; i >= 0; i--)); do
        pid=${bench_order[i]}
        [[ -n ${bench_pids[$pid]:-} ]] || continue
        stop_server "$pid" || ((${bench_lenient[$pid]:-0})) || ok=1
    done
    for ((i = ${#bench_undo[@]} - 1; i >= 0; i--)); do
        eval "${bench_undo[i]}" || ok=1
    done
    finish_run "$rc" "$ok" "$bench_work" "$bench_out"
}

# serve_loaded WHAT OPTS...: starts `$ramd serve --name bench OPTS` (log
# WORK/raw/WHAT.log, appended) and returns once it has printed its URI line;
# sets ramd_pid, ramd_what, ramd_tag (WHAT) and uri. Its stdout is a FIFO
# that this shell reads, so the moment the line comes (after a load) is seen
# without polling; the shell keeps the FIFO open (ramd_out) until the caller
# closes it once ramd has stopped. Needs ramd and work.
serve_loaded() {
    local what=$1 deadline=$((SECONDS + 600))
    shift
    rm -f "$work/ramd.out"
    mkfifo "$work/ramd.out"
    exec {ramd_out}<>"$work/ramd.out"
    spawn "ramd ($what)" "$ramd" serve --name bench "$@" >"$work/ramd.out" 2>>"$work/raw/$what.log" \
        {ramd_out}>&-
    # shellcheck disable=SC2034 # read by the caller
    ramd_pid=$spawned ramd_tag=$what ramd_what="ramd ($what)"
    uri=""
    until read -r -t 1 -u "$ramd_out" uri; do
        alive "$ramd_pid" "$ramd_what"
        ((SECONDS < deadline)) || die "$ramd_what: no URI line after 600 s"
    done
}

# check_size: the disk serve_loaded started answers at uri with size_bytes
# (set by the caller).
# shellcheck disable=SC2154
check_size() {
    local got
    wait_until 30 "$ramd_what at $uri" nbdinfo --size "$uri"
    got=$(nbdinfo --size "$uri")
    [[ $got == "$size_bytes" ]] || die "$ramd_what exports $got bytes, expected $size_bytes"
}

# disk_sha: the sha256 of everything the disk at uri holds.
disk_sha() {
    nbdcopy "$uri" - | sha256sum | cut -d' ' -f1
}

# serve_mount WHAT MNT LIMIT CMD...: starts CMD (a `ramd serve --mount MNT`)
# as a server and waits up to LIMIT seconds until MNT is mounted; sets
# spawned. Redirect the call.
serve_mount() {
    local what=$1 mnt=$2 limit=$3
    shift 3
    spawn "$what" "$@"
    # shellcheck disable=SC2317 # called by wait_until
    _serve_mount_up() { alive "$spawned" "$what" && mountpoint -q "$mnt"; }
    wait_until "$limit" "$what (mounted at $mnt)" _serve_mount_up
}

# start_nbdkit SOCKET SIZE LOG [PLUGIN-ARG...]: `nbdkit memory SIZE` on a
# Unix socket, waits until it answers with SIZE bytes; sets nbdkit_pid and
# nbdkit_uri. nbdkit leaves the socket file behind when it stops: an old one
# goes first. Options before "memory" come from the array nbdkit_opts.
start_nbdkit() {
    local sock=$1 size=$2 log=$3 got
    shift 3
    rm -f "$sock"
    spawn nbdkit nbdkit --foreground --exit-with-parent "${nbdkit_opts[@]}" \
        --unix "$sock" memory "$size" "$@" 2>"$log"
    # shellcheck disable=SC2034 # read by the caller
    nbdkit_pid=$spawned
    nbdkit_uri="nbd+unix:///?socket=$sock"
    wait_until 30 "nbdkit at $nbdkit_uri" nbdinfo --size "$nbdkit_uri"
    got=$(nbdinfo --size "$nbdkit_uri")
    [[ $got == "$(numfmt --from=iec "$size")" ]] || die "nbdkit exports $got bytes, expected $size"
}
nbdkit_opts=()

# start_tgt PORT CONTROL MIB IQN LOG: tgtd with one LUN of MIB MiB, through
# scripts/iscsi-tgt-target, waits until it says ready; sets tgt_pid.
start_tgt() {
    local log=$5
    spawn tgt "$repo/scripts/iscsi-tgt-target" "$1" "$2" "$3" "$4" >"$log" 2>&1
    tgt_pid=$spawned
    # shellcheck disable=SC2317 # called by wait_until
    _start_tgt_ready() { alive "$tgt_pid" tgt && grep -q ready "$log"; }
    wait_until 20 "tgt" _start_tgt_ready
}

# zram_check ALG...: zram0 is there, offers every ALG and is free.
zram=/sys/block/zram0
zram_check() {
    local alg
    [[ -d $zram ]] ||
        die "no $zram: load the zram module with at least one device (modprobe zram num_devices=1)"
    for alg in "$@"; do
        grep -qw -- "$alg" "$zram/comp_algorithm" ||
            die "zram0 offers no $alg (comp_algorithm: $(cat "$zram/comp_algorithm"))"
    done
    [[ $(cat "$zram/disksize") == 0 ]] ||
        die "zram0 is in use (disksize $(cat "$zram/disksize")); free it first (swapoff/umount, then echo 1 > $zram/reset)"
}
# zram_reset: frees zram0 (udev may still have it open for a moment, blkid
# after disksize: tries for 10 s).
zram_reset() {
    local i
    for ((i = 0; i < 100; i++)); do
        echo 1 >"$zram/reset" 2>/dev/null && return 0
        sleep 0.1
    done
    note "could not reset zram0"
    return 1
}
# zram_setup ALG BYTES: zram0 reset, then BYTES compressed with ALG; reset
# again at exit.
zram_setup() {
    ((${zram_armed:-0})) || { at_exit zram_reset; zram_armed=1; }
    zram_reset || die "could not reset zram0"
    echo "$1" >"$zram/comp_algorithm" || die "zram0 refused comp_algorithm $1"
    echo "$2" >"$zram/disksize" || die "zram0 refused disksize $2"
    [[ $(blockdev --getsize64 /dev/zram0) == "$2" ]] || die "/dev/zram0 is not $2 bytes"
    grep -q "\[$1\]" "$zram/comp_algorithm" || die "zram0 is not using $1"
}

# wait_until SECONDS WHAT CMD...: runs CMD until it succeeds, or fails after
# SECONDS. Readiness means "it answers", never a fixed sleep.
wait_until() {
    local limit=$1 what=$2
    shift 2
    local deadline=$((SECONDS + limit))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "$what: not ready after ${limit}s"
        sleep 0.05
    done
}

# alive PID WHAT: fails loudly if the process has exited.
alive() {
    kill -0 "$1" 2>/dev/null || die "$2 (pid $1) is no longer running"
}

# proc_kib PID FIELD: a /proc/PID/status field (VmHWM, VmRSS...) in KiB.
proc_kib() {
    awk -v f="$2:" '$1 == f { print $2; found = 1 } END { exit !found }' "/proc/$1/status" ||
        die "no $2 in /proc/$1/status"
}

# cpu_ticks PID: user + system CPU time of every thread of PID, in clock ticks.
cpu_ticks() {
    # Field 2 (comm) may hold spaces; count fields after its closing ')'.
    sed 's/^.*) //' "/proc/$1/stat" | awk '{ print $12 + $13 }'
}

# stop_pid PID WHAT [STATUS]: SIGTERM, wait up to 10 s for a clean exit, then
# SIGKILL. Returns non-zero if the process had to be killed or exited with an
# error; STATUS is one more exit status that means a clean stop (libfuse's
# examples exit 1 when a signal ends their loop).
stop_pid() {
    local pid=$1 what=$2 clean=${3:-0} deadline=$((SECONDS + 10)) rc=0
    kill -0 "$pid" 2>/dev/null || {
        wait "$pid" 2>/dev/null || rc=$?
        return "$rc"
    }
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do
        if ((SECONDS >= deadline)); then
            note "$what (pid $pid) ignored SIGTERM for 10 s: killing it"
            kill -KILL "$pid" 2>/dev/null || true
            wait "$pid" 2>/dev/null || true
            return 1
        fi
        sleep 0.05
    done
    wait "$pid" 2>/dev/null || rc=$?
    # 143 = killed by our SIGTERM without a handler: also a clean stop.
    if ((rc != 0 && rc != 143 && rc != clean)); then
        note "$what (pid $pid) exited with status $rc"
        return 1
    fi
    return 0
}

# host_busy_ticks: CPU time the whole host has spent busy (every CPU, every
# process), in clock ticks; set against the servers' and the client's own
# time it shows whether something else was running during a measurement.
host_busy_ticks() {
    # cpu user nice system idle iowait irq softirq steal ...
    awk '$1 == "cpu" { print $2 + $3 + $4 + $7 + $8 + $9; exit }' /proc/stat
}

# children_cpu_ms SCRATCH: sets children_ms to the user + system CPU of this
# shell's reaped children, in ms (bash's `times`); read it before and after
# running a client to get the client's cost. Call it directly, not in $(...):
# `times` must run in this shell, so its output goes through the file SCRATCH.
children_cpu_ms() {
    times >"$1"
    # shellcheck disable=SC2034 # read by the caller
    children_ms=$(awk 'NR == 2 {
        t = 0
        for (i = 1; i <= 2; i++) {
            split($i, p, /[ms]/)
            t += p[1] * 60000 + p[2] * 1000
        }
        printf "%d\n", t
    }' "$1")
}

# wait_quiet: before a measurement, waits until the rest of the host keeps
# less than a tenth of a core busy over half a second (on a shared machine a
# neighbour's burst would otherwise be measured as well). All calls together
# wait at most BENCH_QUIET_WAIT seconds (default 150); then they only warn.
# Callers may spend the same budget on other retries (quiet_budget).
quiet_budget=${BENCH_QUIET_WAIT:-150}
wait_quiet() {
    local tck h0 h1 start=$SECONDS warned=0
    tck=$(getconf CLK_TCK)
    while :; do
        h0=$(host_busy_ticks)
        sleep 0.5
        h1=$(host_busy_ticks)
        (((h1 - h0) * 100 <= 5 * tck)) && break
        if ((quiet_budget <= SECONDS - start)); then
            note "WARNING: host still busy ($(((h1 - h0) * 200 / tck))% of a core); measuring anyway"
            break
        fi
        if ((!warned)); then
            note "host busy ($(((h1 - h0) * 200 / tck))% of a core): waiting for it to quieten"
            warned=1
        fi
    done
    quiet_budget=$((quiet_budget - (SECONDS - start)))
    ((quiet_budget > 0)) || quiet_budget=0
}

# serve_nbd RAMD WORK SIZE [FLAG...]: starts `RAMD serve` on a unix socket in
# WORK (run dir WORK/run, log WORK/ramd.log or $serve_log) and waits until
# its URI answers with SIZE bytes; sets ramd_pid and uri. SIZE "-": no
# --size (the image says it). Callers
# stop it with stop_server "$ramd_pid" (or leave it to the EXIT trap).
serve_nbd() {
    local bin=$1 dir=$2 size=$3 size_flag=() log=${serve_log:-$2/ramd.log} got
    [[ $3 == - ]] || size_flag=(--size "$3")
    shift 3
    mkdir -p "$dir/run"
    # A URI line left by the last ramd must not pass for this one's.
    rm -f "$dir/uri"
    RAMD_RUN_DIR=$dir/run spawn ramd "$bin" serve "${size_flag[@]}" "$@" \
        --listen "unix:$dir/ramd.sock" >"$dir/uri" 2>"$log"
    ramd_pid=$spawned
    # shellcheck disable=SC2317 # called by wait_until
    _serve_nbd_has_uri() { alive "$ramd_pid" ramd && [[ -s $dir/uri ]]; }
    wait_until 30 "ramd (URI line)" _serve_nbd_has_uri
    uri=$(head -n 1 "$dir/uri")
    wait_until 30 "ramd at $uri" nbdinfo --size "$uri"
    [[ $size == - ]] || {
        got=$(nbdinfo --size "$uri")
        [[ $got == "$(numfmt --from=iec "$size")" ]] || die "ramd exports $got bytes, expected $size"
    }
}

# drop_caches: writes back dirty pages, then empties the page cache (needs
# root): a read after it comes from the disk under test, not from memory.
drop_caches() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}

# pretouch BYTES: allocates, touches and frees BYTES of memory, and prints
# how fast (GiB/s). On a VM the first touch of guest memory since boot is
# much slower than a touch of memory the guest has used before (the
# hypervisor backs it then); touching what a run will need first gives
# every server the same kind of (recycled) pages, and the speed shows what
# the VM did.
pretouch() {
    python3 -c '
import sys, time
n = int(sys.argv[1])
t = time.perf_counter()
b = b"\1" * n
dt = time.perf_counter() - t
del b
print(f"{n / dt / 2**30:.2f}")' "$1"
}

# bench_lock: one benchmark at a time on this host. Two benchmarks on a
# 2-core machine measure each other; every bench/ script calls this first
# and holds the lock until it exits. Waits up to BENCH_LOCK_WAIT seconds
# (default 1800) for a running one to finish.
bench_lock() {
    local file=${TMPDIR:-/tmp}/ramd-bench.lock
    need flock util-linux
    exec {bench_lock_fd}>>"$file"
    if ! flock -n "$bench_lock_fd"; then
        note "another benchmark holds $file: waiting for it to finish"
        flock -w "${BENCH_LOCK_WAIT:-1800}" "$bench_lock_fd" ||
            die "still locked after ${BENCH_LOCK_WAIT:-1800}s: $file"
    fi
}

# find_go_tool NAME: NAME where `go install` puts it (the newest release,
# built here), else on PATH.
find_go_tool() {
    local gobin=""
    command -v go >/dev/null 2>&1 && gobin=$(go env GOPATH 2>/dev/null)/bin
    for d in "$gobin" "${HOME:-/root}/go/bin"; do
        [[ -n $d && -x $d/$1 ]] && { echo "$d/$1"; return 0; }
    done
    command -v "$1" 2>/dev/null
}

# need_pynbd: sets pynbd, a python3 that can import libnbd's binding.
# Debian's python3-libnbd is for the system python, which may not be the
# first python3 on PATH (pyenv).
need_pynbd() {
    local p
    # shellcheck disable=SC2034 # read by the caller
    pynbd=""
    for p in /usr/bin/python3 python3; do
        # shellcheck disable=SC2034 # read by the caller
        "$p" -c 'import nbd' 2>/dev/null && { pynbd=$p; return 0; }
    done
    die "no python3 (/usr/bin/python3 nor on PATH) can import nbd: apt-get install python3-libnbd"
}

# need_weed: sets weed, SeaweedFS's binary, or fails saying how to get it.
need_weed() {
    # shellcheck disable=SC2034 # read by the caller
    weed=$(find_go_tool weed) ||
        die "SeaweedFS's weed not found (not on PATH nor in \$(go env GOPATH)/bin): run scripts/install-test-tools (it builds github.com/seaweedfs/seaweedfs/weed with go install)"
}

# start_weed WEED DIR LOG BUCKET KEY_ID SECRET: starts SeaweedFS (`weed
# mini`: master, volume, filer and S3 in one process) on loopback on ten
# free ports, its data and config in DIR, its output in LOG, with BUCKET
# and one identity; sets weed_pid and endpoint, and exports the AWS_*
# variables ramd takes its endpoint and credentials from. The caller waits
# until it answers (with its own client); the EXIT trap stops it.
start_weed() {
    local bin=$1 wdir=$2 log=$3 bucket=$4 key_id=$5 secret=$6 ports
    mkdir -p "$wdir/data"
    cat >"$wdir/s3.json" <<EOF
{"identities":[{"name":"bench","credentials":[{"accessKey":"$key_id","secretKey":"$secret"}],"actions":["Admin","Read","Write","List","Tagging"]}]}
EOF
    # Ten free loopback ports (taken by the kernel, then released for weed).
    mapfile -t ports < <(python3 -c '
import socket
s = [socket.socket() for _ in range(10)]
for x in s:
    x.bind(("127.0.0.1", 0))
print("\n".join(str(x.getsockname()[1]) for x in s))')
    spawn "weed mini" "$bin" mini -dir="$wdir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -master.port="${ports[0]}" -master.port.grpc="${ports[1]}" \
        -volume.port="${ports[2]}" -volume.port.grpc="${ports[3]}" \
        -filer.port="${ports[4]}" -filer.port.grpc="${ports[5]}" \
        -s3.port="${ports[6]}" -s3.port.grpc="${ports[7]}" \
        -admin.port="${ports[8]}" -admin.port.grpc="${ports[9]}" \
        -admin.port.legacy=0 -admin.ui=false -webdav=false -s3.port.iceberg=0 -s3.port.lance=0 \
        -s3.config="$wdir/s3.json" -bucket="$bucket" \
        </dev/null >"$log" 2>&1
    # shellcheck disable=SC2034 # read by the caller
    weed_pid=$spawned
    endpoint=http://127.0.0.1:${ports[6]}
    export AWS_ACCESS_KEY_ID=$key_id AWS_SECRET_ACCESS_KEY=$secret AWS_REGION=us-east-1
    export AWS_ENDPOINT_URL=$endpoint AWS_ALLOW_HTTP=true
}

# finish_run RC OK WORK OUT: the end of the EXIT trap (bench_exit). WORK is
# the script's scratch directory (holding raw/), OUT where raw/ is kept ("":
# nowhere). On failure (RC non-zero) the last lines of each log in WORK and
# its subdirectories go to stderr; WORK goes (--one-file-system: never into a mount that refused
# to go). Exits RC, or 1 if the run succeeded but the clean-up did not
# (OK non-zero).
finish_run() {
    local rc=$1 ok=$2 work=$3 out=$4 log
    if ((rc != 0)); then
        for log in "$work"/*.log "$work"/*/*.log; do
            [[ -s $log ]] && { echo "--- last lines of $(basename "$log")" >&2; tail -n 20 "$log" >&2; }
        done
    fi
    if [[ -n $out && -d $work/raw ]]; then
        mkdir -p "$out" && cp -r "$work"/raw/. "$out"/ && note "raw figures kept in $out"
    fi
    rm -rf --one-file-system "$work" || ok=1
    ((rc == 0 && ok != 0)) && rc=1
    exit "$rc"
}
