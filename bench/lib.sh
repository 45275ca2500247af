# Helpers shared by the bench/ scripts. Source it; it defines functions only.
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
# WORK (run dir WORK/run, log WORK/ramd.log) and waits until its URI answers;
# sets ramd_pid and uri. SIZE "-": no --size (the image says it). Callers
# stop it with stop_pid "$ramd_pid" ramd.
serve_nbd() {
    local bin=$1 dir=$2 size_flag=()
    [[ $3 == - ]] || size_flag=(--size "$3")
    shift 3
    mkdir -p "$dir/run"
    # A URI line left by the last ramd must not pass for this one's.
    rm -f "$dir/uri"
    RAMD_RUN_DIR=$dir/run "$bin" serve "${size_flag[@]}" "$@" \
        --listen "unix:$dir/ramd.sock" >"$dir/uri" 2>"$dir/ramd.log" {bench_lock_fd}>&- &
    ramd_pid=$!
    _serve_nbd_has_uri() { alive "$ramd_pid" ramd && [[ -s $dir/uri ]]; }
    wait_until 30 "ramd (URI line)" _serve_nbd_has_uri
    uri=$(head -n 1 "$dir/uri")
    wait_until 30 "ramd at $uri" nbdinfo --size "$uri"
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

# start_weed WEED DIR LOG BUCKET KEY_ID SECRET: starts SeaweedFS (`weed
# mini`: master, volume, filer and S3 in one process) on loopback on ten
# free ports, its data and config in DIR, its output in LOG, with BUCKET
# and one identity; sets weed_pid and endpoint, and exports the AWS_*
# variables ramd takes its endpoint and credentials from. The caller waits
# until it answers (with its own client) and stops it with stop_pid.
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
    "$bin" mini -dir="$wdir/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
        -master.port="${ports[0]}" -master.port.grpc="${ports[1]}" \
        -volume.port="${ports[2]}" -volume.port.grpc="${ports[3]}" \
        -filer.port="${ports[4]}" -filer.port.grpc="${ports[5]}" \
        -s3.port="${ports[6]}" -s3.port.grpc="${ports[7]}" \
        -admin.port="${ports[8]}" -admin.port.grpc="${ports[9]}" \
        -admin.port.legacy=0 -admin.ui=false -webdav=false -s3.port.iceberg=0 -s3.port.lance=0 \
        -s3.config="$wdir/s3.json" -bucket="$bucket" \
        </dev/null >"$log" 2>&1 {bench_lock_fd}>&- &
    # shellcheck disable=SC2034 # read by the caller
    weed_pid=$!
    endpoint=http://127.0.0.1:${ports[6]}
    export AWS_ACCESS_KEY_ID=$key_id AWS_SECRET_ACCESS_KEY=$secret AWS_REGION=us-east-1
    export AWS_ENDPOINT_URL=$endpoint AWS_ALLOW_HTTP=true
}

# finish_run RC OK WORK OUT: the end of a script's EXIT trap. WORK is the
# script's scratch directory (holding raw/), OUT where raw/ is kept ("":
# nowhere). On failure (RC non-zero) the last lines of each log in raw/ go
# to stderr; WORK goes (--one-file-system: never into a mount that refused
# to go). Exits RC, or 1 if the run succeeded but the clean-up did not
# (OK non-zero).
finish_run() {
    local rc=$1 ok=$2 work=$3 out=$4 log
    if ((rc != 0)); then
        for log in "$work"/raw/*.log; do
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
