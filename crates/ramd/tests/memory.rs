//! Memory semantics seen from outside: what `ramd status --json` and the
//! process's RSS say after writes, trims, zeroes, and at --max-memory.

mod common;

use common::*;

/// The pool may keep up to 64 MiB of freed pages resident for reuse.
const WARM_POOL: u64 = 64 * MIB;
/// Room for allocator noise (request buffers, thread stacks) in RSS checks.
const RSS_SLACK: u64 = 48 * MIB;

fn io(d: &Ramd, ops: &[&str]) -> String {
    let mut args = vec![d.uri()];
    args.extend_from_slice(ops);
    nbd_script("io.py", &args)
}

#[test]
fn fresh_disk_uses_no_memory() {
    let d = Ramd::start(&["--size", "1G"]);
    let s = d.stats();
    for key in [
        "used_bytes",
        "memory_used",
        "data_pages",
        "zero_pages",
        "fill_pages",
        "chunks",
    ] {
        assert_eq!(field(&s, key), 0, "{key} on a fresh disk: {s}");
    }
    assert_eq!(field(&s, "size"), GIB, "{s}");
    assert_accounting(&s);
}

#[test]
fn trim_and_zero_free_memory_and_rss() {
    let d = Ramd::start(&["--size", "512M"]);
    let rss_start = d.rss();
    io(&d, &["write-random", "0", "256M", "1"]);
    let s = d.stats();
    assert_eq!(field(&s, "data_pages"), 256 * MIB / PAGE, "{s}");
    assert_eq!(field(&s, "used_bytes"), 256 * MIB, "{s}");
    assert_accounting(&s);
    let rss_full = d.rss();
    assert!(
        rss_full >= rss_start + 200 * MIB,
        "256 MiB of data but RSS went only from {rss_start} to {rss_full}"
    );

    io(&d, &["trim", "0", "128M"]);
    let s = d.stats();
    assert_eq!(field(&s, "data_pages"), 128 * MIB / PAGE, "after trim: {s}");
    assert_eq!(field(&s, "used_bytes"), 128 * MIB, "after trim: {s}");
    assert_accounting(&s);

    io(&d, &["zero", "128M", "128M", "nohole"]);
    let s = d.stats();
    assert_eq!(field(&s, "data_pages"), 0, "after zero NO_HOLE: {s}");
    assert_eq!(
        field(&s, "zero_pages"),
        128 * MIB / PAGE,
        "after zero NO_HOLE: {s}"
    );
    assert_eq!(
        field(&s, "memory_used"),
        field(&s, "metadata_bytes"),
        "zeroed pages cost page memory: {s}"
    );
    assert_accounting(&s);
    let pool = &s["pool"];
    assert!(field(pool, "warm_bytes") <= WARM_POOL, "{s}");
    assert!(
        field(pool, "released_bytes") >= 256 * MIB - WARM_POOL,
        "freed pages not released to the kernel: {s}"
    );

    // RSS drops: everything freed beyond the warm pool went back to the OS.
    let limit = rss_start + WARM_POOL + RSS_SLACK;
    wait_until(std::time::Duration::from_secs(10), "RSS to drop", || {
        d.rss() <= limit
    });

    // Data still readable where it was not touched; the rest reads zero.
    io(
        &d,
        &["verify-byte", "0", "256M", "0", ",", "trim", "0", "512M"],
    );
    let s = d.stats();
    for key in [
        "memory_used",
        "data_pages",
        "zero_pages",
        "used_bytes",
        "chunks",
    ] {
        assert_eq!(field(&s, key), 0, "{key} after trimming everything: {s}");
    }
}

#[test]
fn zero_and_same_filled_pages_cost_no_page_memory() {
    let d = Ramd::start(&["--size", "256M"]);
    io(
        &d,
        &[
            "write-byte",
            "0",
            "64M",
            "0xab",
            ",",
            "write-byte",
            "64M",
            "64M",
            "0",
            ",",
            "write-random",
            "128M",
            "4M",
            "3",
        ],
    );
    let s = d.stats();
    assert_eq!(field(&s, "data_pages"), 4 * MIB / PAGE, "{s}");
    assert_eq!(field(&s, "fill_pages"), 64 * MIB / PAGE, "{s}");
    assert_eq!(field(&s, "zero_pages"), 64 * MIB / PAGE, "{s}");
    assert_eq!(field(&s, "used_bytes"), 132 * MIB, "{s}");
    assert_accounting(&s);
    assert!(
        field(&s, "metadata_bytes") < 2 * MIB,
        "page-table metadata for 132 MiB is {}: {s}",
        field(&s, "metadata_bytes")
    );
    io(
        &d,
        &[
            "verify-byte",
            "0",
            "64M",
            "0xab",
            ",",
            "verify-byte",
            "64M",
            "64M",
            "0",
            ",",
            "verify-random",
            "128M",
            "4M",
            "3",
        ],
    );
    // Overwriting data with a pattern frees its page.
    io(&d, &["write-byte", "128M", "4M", "0x01"]);
    let s = d.stats();
    assert_eq!(field(&s, "data_pages"), 0, "{s}");
    assert_accounting(&s);
}

#[test]
fn max_memory_gives_enospc_and_the_disk_recovers() {
    let mut d = Ramd::start(&["--size", "256M", "--max-memory", "32M"]);
    let s = d.stats();
    assert_eq!(field(&s, "max_memory"), 32 * MIB, "{s}");

    let rss_start = d.rss();
    let out = io(&d, &["fill-until-enospc", "0", "256M", "7"]);
    let written = written(&out);
    assert!(
        (24 * MIB..=32 * MIB).contains(&written),
        "ENOSPC after {written} bytes with --max-memory 32M"
    );
    let s = d.stats();
    assert!(field(&s, "memory_used") <= 32 * MIB, "{s}");
    assert_accounting(&s);
    d.assert_alive();
    assert!(
        d.rss() <= rss_start + 32 * MIB + RSS_SLACK,
        "RSS {} after filling a 32 MiB budget (started at {rss_start})",
        d.rss()
    );

    // What was written before ENOSPC is intact; the disk answers reads,
    // flushes, and writes that need no new memory.
    let w = written.to_string();
    io(
        &d,
        &[
            "verify-random",
            "0",
            &w,
            "7",
            ",",
            "flush",
            ",",
            "write-byte",
            "0",
            "1M",
            "0x42",
            ",",
            "verify-byte",
            "0",
            "1M",
            "0x42",
        ],
    );

    // Trim frees memory; new data fits again.
    io(
        &d,
        &[
            "trim",
            "0",
            "8M",
            ",",
            "write-random",
            "0",
            "4M",
            "8",
            ",",
            "verify-random",
            "0",
            "4M",
            "8",
        ],
    );
    io(
        &d,
        &["verify-random", "8M", &(written - 8 * MIB).to_string(), "7"],
    );
    let s = d.stats();
    assert!(field(&s, "memory_used") <= 32 * MIB, "{s}");
    assert_accounting(&s);
}

#[test]
fn without_a_warm_pool_trim_returns_all_page_memory() {
    let d = Ramd::start(&["--size", "256M", "--warm-pool", "0"]);
    let rss_start = d.rss();
    io(&d, &["write-random", "0", "128M", "2"]);
    assert!(
        d.rss() >= rss_start + 100 * MIB,
        "RSS did not grow with the data"
    );
    io(&d, &["trim", "0", "256M"]);
    let s = d.stats();
    assert_eq!(field(&s, "memory_used"), 0, "{s}");
    assert_eq!(field(&s["pool"], "warm_bytes"), 0, "{s}");
    wait_until(std::time::Duration::from_secs(10), "RSS to drop", || {
        d.rss() <= rss_start + RSS_SLACK
    });
}

#[test]
fn concurrent_writers_share_one_budget() {
    let d = Ramd::start(&["--size", "256M", "--max-memory", "48M"]);
    let regions = ["0", "64M", "128M", "192M"];
    let cmds = regions
        .iter()
        .enumerate()
        .map(|(i, off)| {
            nbd_script_cmd(
                "io.py",
                &[d.uri(), "fill-until-enospc", off, "64M", &format!("w{i}")],
            )
        })
        .collect();
    let outs = run_parallel_ok(cmds, LONG_TIMEOUT);
    let s = d.stats();
    assert!(field(&s, "memory_used") <= 48 * MIB, "{s}");
    assert_accounting(&s);
    let mut total = 0;
    for (i, (out, off)) in outs.iter().zip(regions).enumerate() {
        let written = written(out);
        total += written;
        if written > 0 {
            io(
                &d,
                &["verify-random", off, &written.to_string(), &format!("w{i}")],
            );
        }
    }
    assert!(
        (32 * MIB..=48 * MIB).contains(&total),
        "4 writers stored {total} bytes under a 48 MiB budget"
    );
}

/// How far RSS may stay above `memory_used` once the warm pool has decayed:
/// growth of the C heap and thread stacks since the start.
const DECAYED_SLACK: u64 = 8 * MIB;
/// How long an idle disk may take to give its warm pages back: the decay
/// halves them every second; a loaded machine is slow.
const DECAY_DEADLINE: std::time::Duration = std::time::Duration::from_secs(60);

/// The status's process breakdown adds up to the resident size, give or
/// take what it cannot see (stacks): a few MiB or a few percent.
fn assert_process_adds_up(s: &serde_json::Value) {
    let p = &s["process"];
    let resident = field(p, "resident_bytes");
    let other = p["other_bytes"]
        .as_i64()
        .unwrap_or_else(|| panic!("no other_bytes: {s}"));
    assert!(
        other.unsigned_abs() <= (4 * MIB).max(resident / 20),
        "resident {resident} is not pages + warm + heap + heap free + program: {p}"
    );
    // The same figure as the host's, read a moment apart.
    let host = vm_rss(field(s, "pid") as u32);
    assert!(
        resident.abs_diff(host) <= 4 * MIB,
        "status says resident {resident}, /proc says {host}: {p}"
    );
}

/// RSS (from /proc/PID/status) falls to `memory_used` plus what the
/// process held before any data: the warm pool has decayed.
fn wait_for_rss_to_follow(d: &Ramd, rss_start: u64, what: &str) -> serde_json::Value {
    let mut last = (0, 0);
    let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until(DECAY_DEADLINE, what, || {
            let s = d.stats();
            let used = field(&s, "memory_used");
            last = (d.rss(), used);
            last.0 <= rss_start + used + DECAYED_SLACK && field(&s["pool"], "warm_bytes") == 0
        })
    }));
    if waited.is_err() {
        panic!(
            "{what}: RSS {} with memory_used {} (RSS at start {rss_start}): {}",
            last.0,
            last.1,
            d.stats()
        );
    }
    d.stats()
}

#[test]
fn idle_disk_gives_its_warm_pages_back_after_a_trim() {
    let d = Ramd::start(&["--size", "512M"]);
    let rss_start = d.rss();
    io(
        &d,
        &["write-random", "0", "128M", "5", ",", "trim", "0", "96M"],
    );
    let s = d.stats();
    assert_eq!(field(&s, "data_pages"), 32 * MIB / PAGE, "{s}");
    let s = wait_for_rss_to_follow(&d, rss_start, "RSS to follow memory_used after a trim");
    assert_eq!(field(&s["pool"], "warm_bytes"), 0, "{s}");
    assert!(field(&s["pool"], "decayed_bytes") > 0, "{s}");
    assert_eq!(field(&s["process"], "warm_bytes"), 0, "{s}");
    assert_process_adds_up(&s);
    // What stayed is intact, and new writes reuse the returned addresses.
    io(
        &d,
        &[
            "verify-random",
            "96M",
            "32M",
            "5",
            ",",
            "write-random",
            "0",
            "32M",
            "6",
            ",",
            "verify-random",
            "0",
            "32M",
            "6",
        ],
    );
    let s = d.stats();
    assert_eq!(field(&s, "data_pages"), 64 * MIB / PAGE, "{s}");
    assert_accounting(&s);
}

#[test]
fn repacked_disk_resident_memory_follows_memory_used() {
    require_tool("nbdcopy");
    require_tool("tar");
    let tmp = scratch();
    let data = tmp.path().join("usr.tar");
    // 96 MiB of the machine's own programs and libraries, as a tar stream.
    let script = format!(
        "tar -cf - --sort=name /usr/bin /usr/lib 2>/dev/null | head -c {} > {}",
        96 * MIB,
        data.display()
    );
    run_ok(&mut cmd("sh", ["-c", &script]));
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 96 * MIB);
    let d = Ramd::start(&[
        "--size",
        "128M",
        "--compress",
        "lz4",
        "--recompress",
        "zstd:12",
        "--idle-after",
        "1s",
    ]);
    let rss_start = d.rss();
    run_ok(&mut cmd("nbdcopy", [data.to_str().unwrap(), d.uri()]));
    // Every page idle: the scanner has had its turn at all of them.
    wait_until(
        std::time::Duration::from_secs(120),
        "the data to go idle and be re-packed",
        || {
            let s = d.stats();
            field(&s, "idle_pages") == field(&s, "data_pages") && field(&s, "frames") > 0
        },
    );
    let s = wait_for_rss_to_follow(&d, rss_start, "RSS to follow memory_used after re-packing");
    assert!(
        field(&s, "memory_used") < 80 * MIB,
        "96 MiB of /usr re-packed with zstd:12 still takes: {s}"
    );
    assert_process_adds_up(&s);
    let back = tmp.path().join("back");
    run_ok(&mut cmd("nbdcopy", [d.uri(), back.to_str().unwrap()]));
    let back_bytes = std::fs::read(&back).unwrap();
    assert_eq!(
        back_bytes[..(96 * MIB) as usize],
        std::fs::read(&data).unwrap()[..]
    );
}

/// A `Key: N kB` line of /proc/PID/status, in bytes.
fn proc_status_bytes(pid: u32, key: &str) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} in /proc/{pid}/status"));
    let kib: u64 = line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("bad {key} line {line:?}"));
    kib * 1024
}

#[test]
fn mlock_locks_the_disks_page_memory() {
    let d = Ramd::start(&["--size", "256M", "--mlock"]);
    let (pid, rss_start) = (d.pid(), d.rss());
    let locked_start = proc_status_bytes(pid, "VmLck:");
    io(&d, &["write-random", "0", "64M", "11"]);
    let locked = proc_status_bytes(pid, "VmLck:");
    assert!(
        locked >= locked_start + 64 * MIB,
        "64 MiB written with --mlock, VmLck went from {locked_start} to {locked}"
    );
    let s = d.stats();
    assert!(field(&s["process"], "locked_bytes") >= 64 * MIB, "{s}");
    // Locked pages still go back to the kernel once freed and idle.
    io(&d, &["trim", "0", "48M"]);
    wait_for_rss_to_follow(&d, rss_start, "RSS to follow memory_used with --mlock");
    io(&d, &["verify-random", "48M", "16M", "11"]);
}

#[test]
fn mlock_beyond_the_locked_memory_limit_is_refused_at_start() {
    require_tool("setpriv");
    require_tool("prlimit");
    let run_dir = scratch();
    // `ramd --run-dir DIR ARGS` without CAP_IPC_LOCK (root has it, and it
    // lifts the limit) and with an 8 MiB RLIMIT_MEMLOCK.
    let limited = |args: &[&str]| {
        let mut c = cmd(
            "setpriv",
            [
                "--bounding-set",
                "-ipc_lock",
                "--inh-caps",
                "-ipc_lock",
                "prlimit",
                "--memlock=8388608",
                ramd_bin(),
                "--run-dir",
                run_dir.path().to_str().unwrap(),
            ],
        );
        c.args(args);
        c
    };
    // A 256 MiB disk cannot be locked there.
    let out = run(
        &mut limited(&["serve", "--size", "256M", "--mlock"]),
        CMD_TIMEOUT,
    )
    .failed();
    for want in [
        "RLIMIT_MEMLOCK",
        "is 8M",
        "ulimit -l",
        "LimitMEMLOCK=infinity",
    ] {
        assert!(
            out.stderr.contains(want),
            "{want:?} not in:\n{}",
            out.stderr
        );
    }
    assert!(
        out.stdout.is_empty(),
        "a refused disk printed {:?}",
        out.stdout
    );
    // The same disk under the same limit starts without --mlock, and a
    // small one fits the limit with it.
    for args in [&["--size", "256M"][..], &["--size", "4M", "--mlock"][..]] {
        let mut child =
            Background::spawn(limited(&["serve", "--name", "fits", "--read-only"]).args(args));
        let sock = run_dir.path().join("fits.sock");
        wait_until(START_DEADLINE, "the disk to listen", || sock.exists());
        child.assert_running();
        ramd_cmd(run_dir.path(), &["down", "fits"]).ok();
        child.finish_ok();
    }
}
