//! fio's `nbd` engine with data verification.

mod common;

use common::*;
use serde_json::Value;
use std::path::Path;

/// Runs fio with the nbd engine against `uri`; returns the parsed JSON of
/// its (only) job after checking that it reports no error.
fn fio(uri: &str, out_dir: &Path, name: &str, opts: &[&str]) -> Value {
    require_tool("fio");
    let out_file = out_dir.join(format!("{name}.json"));
    let mut c = cmd(
        "fio",
        [
            format!("--name={name}"),
            "--ioengine=nbd".into(),
            format!("--uri={uri}"),
            "--output-format=json".into(),
            format!("--output={}", out_file.display()),
            "--verify_fatal=1".into(),
        ],
    );
    // fio drops *-verify.state files in its working directory.
    c.args(opts).current_dir(out_dir);
    let out = run(&mut c, LONG_TIMEOUT);
    let json = std::fs::read_to_string(&out_file).unwrap_or_default();
    assert!(out.success(), "fio {name} failed: {out:?}\n{json}");
    let v: Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("fio JSON ({e}):\n{json}"));
    let job = v["jobs"][0].clone();
    assert_eq!(job["error"], 0, "fio {name} reported an error: {job}");
    job
}

fn io_bytes(job: &Value, dir: &str) -> u64 {
    job[dir]["io_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no {dir}.io_bytes in {job}"))
}

#[test]
fn random_4k_read_write_with_crc32c_verify() {
    let tmp = scratch();
    let d = Ramd::start(&["--size", "512M"]);
    let job = fio(
        d.uri(),
        tmp.path(),
        "randrw",
        &[
            "--rw=randrw",
            "--bs=4k",
            "--iodepth=32",
            "--size=256M",
            "--verify=crc32c",
            "--randrepeat=0",
        ],
    );
    // The verify phase read back everything written.
    let written = io_bytes(&job, "write");
    assert!(written > 64 * MIB, "fio wrote only {written} bytes: {job}");
    assert!(
        io_bytes(&job, "read") >= written,
        "fio did not read back what it wrote: {job}"
    );
    let s = d.stats();
    assert_accounting(&s);
}

#[test]
fn sequential_1m_write_then_verify_in_a_new_process() {
    let tmp = scratch();
    let d = Ramd::start(&["--size", "256M"]);
    let common = [
        "--rw=write",
        "--bs=1M",
        "--iodepth=8",
        "--size=256M",
        "--verify=crc32c",
    ];
    let mut opts = common.to_vec();
    opts.push("--do_verify=1");
    let job = fio(d.uri(), tmp.path(), "seq", &opts);
    assert_eq!(io_bytes(&job, "write"), 256 * MIB, "{job}");
    assert_eq!(io_bytes(&job, "read"), 256 * MIB, "{job}");

    // A second fio process verifies the same data over a new connection.
    let mut opts = common.to_vec();
    opts.push("--verify_only");
    let job = fio(d.uri(), tmp.path(), "seq", &opts);
    assert_eq!(io_bytes(&job, "read"), 256 * MIB, "{job}");
}

#[test]
fn verify_only_detects_a_trimmed_range() {
    // Proves the verification above is real: after trimming part of the
    // written area, a verify-only pass must fail.
    let tmp = scratch();
    let d = Ramd::start(&["--size", "64M"]);
    let common = ["--rw=write", "--bs=64k", "--size=32M", "--verify=crc32c"];
    let mut opts = common.to_vec();
    opts.push("--do_verify=0");
    fio(d.uri(), tmp.path(), "w", &opts);
    qemu_io(d.uri(), &["discard 1M 1M".into()]);
    let out_file = tmp.path().join("v.json");
    let mut c = cmd(
        "fio",
        [
            "--name=w".to_string(),
            "--ioengine=nbd".into(),
            format!("--uri={}", d.uri()),
            format!("--output={}", out_file.display()),
            "--verify_only".into(),
        ],
    );
    c.args(common).current_dir(tmp.path());
    run(&mut c, LONG_TIMEOUT).failed();
}
