//! Several client processes at once, each on its own connections.

mod common;

use common::*;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

fn qemu_io_cmd(uri: &str, cmds: &[String]) -> Command {
    require_tool("qemu-io");
    let mut c = cmd("qemu-io", ["-f", "raw"]);
    for x in cmds {
        c.args(["-c", x]);
    }
    c.arg(uri);
    c
}

/// qemu-io exits 0 even when some aio commands failed; look at its words too.
fn assert_no_failure(outs: &[String]) {
    for o in outs {
        assert!(!o.contains("failed") && !o.contains("error"), "{o}");
    }
}

#[test]
fn mixed_clients_write_distinct_regions_then_verify_concurrently() {
    let d = Ramd::start(&["--size", "192M"]);
    let u = d.uri();
    // Regions of 32 MiB: 0, 1 and 4 random data (libnbd, 4 MiB writes),
    // 2 and 3 same-filled 1 MiB pieces (qemu-io aio); 5 stays untouched.
    let pattern_cmds = |region: u64, pat: u64, verb: &str| -> Vec<String> {
        let mut v: Vec<String> = (0..32u64)
            .map(|k| format!("{verb} -P {} {} 1M", pat + k, region * 32 * MIB + k * MIB))
            .collect();
        v.push("aio_flush".into());
        v
    };
    let writers = vec![
        nbd_script_cmd("io.py", &[u, "write-random", "0", "32M", "a"]),
        nbd_script_cmd("io.py", &[u, "write-random", "32M", "32M", "b"]),
        qemu_io_cmd(u, &pattern_cmds(2, 0x20, "aio_write")),
        qemu_io_cmd(u, &pattern_cmds(3, 0x60, "aio_write")),
        nbd_script_cmd("io.py", &[u, "write-random", "128M", "32M", "c"]),
    ];
    let outs = run_parallel_ok(writers, LONG_TIMEOUT);
    assert_no_failure(&outs);

    let verifiers = vec![
        nbd_script_cmd("io.py", &[u, "verify-random", "0", "32M", "a"]),
        nbd_script_cmd("io.py", &[u, "verify-random", "32M", "32M", "b"]),
        qemu_io_cmd(u, &pattern_cmds(2, 0x20, "aio_read")),
        qemu_io_cmd(u, &pattern_cmds(3, 0x60, "aio_read")),
        nbd_script_cmd("io.py", &[u, "verify-random", "128M", "32M", "c"]),
        nbd_script_cmd("io.py", &[u, "verify-byte", "160M", "32M", "0"]),
    ];
    let outs = run_parallel_ok(verifiers, LONG_TIMEOUT);
    assert_no_failure(&outs);

    let s = d.stats();
    assert_eq!(field(&s, "data_pages"), 96 * MIB / PAGE, "{s}");
    assert_eq!(field(&s, "fill_pages"), 64 * MIB / PAGE, "{s}");
    assert_accounting(&s);
}

#[test]
fn four_fio_jobs_verify_their_own_regions() {
    require_tool("fio");
    let tmp = scratch();
    let d = Ramd::start(&["--size", "256M"]);
    let out_file = tmp.path().join("fio.json");
    let mut c = cmd(
        "fio",
        [
            "--name=four".to_string(),
            "--ioengine=nbd".into(),
            format!("--uri={}", d.uri()),
            "--numjobs=4".into(),
            "--size=48M".into(),
            "--offset_increment=64M".into(),
            "--rw=randwrite".into(),
            "--bs=16k".into(),
            "--iodepth=16".into(),
            "--verify=crc32c".into(),
            "--verify_fatal=1".into(),
            "--output-format=json".into(),
            format!("--output={}", out_file.display()),
        ],
    );
    c.current_dir(tmp.path()); // fio drops *-verify.state files here
    let out = run(&mut c, LONG_TIMEOUT);
    let json = std::fs::read_to_string(&out_file).unwrap_or_default();
    assert!(out.success(), "fio failed: {out:?}\n{json}");
    let v: Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("fio JSON ({e}):\n{json}"));
    let jobs = v["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 4, "{v}");
    for j in jobs {
        assert_eq!(j["error"], 0, "{j}");
        assert_eq!(field(&j["write"], "io_bytes"), 48 * MIB, "{j}");
        assert_eq!(field(&j["read"], "io_bytes"), 48 * MIB, "{j}");
    }
}

#[test]
fn status_counts_concurrent_connections() {
    let d = Ramd::start(&["--size", "64M"]);
    // Six connections held open by one libnbd process until its stdin closes.
    let script = "import nbd, sys\n\
                  hs = [nbd.NBD() for _ in range(6)]\n\
                  [h.connect_uri(sys.argv[1]) for h in hs]\n\
                  sys.stdin.read()\n";
    let mut holder = Background::spawn(Command::new(python_nbd()).args(["-c", script, d.uri()]));
    wait_until(
        Duration::from_secs(20),
        "status to show 6 connections",
        || {
            holder.assert_running();
            field(&d.stats(), "connections") == 6
        },
    );
    holder.finish_ok();
    wait_until(
        Duration::from_secs(10),
        "status to show 0 connections",
        || field(&d.stats(), "connections") == 0,
    );
}
