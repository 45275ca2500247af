//! fio's `nbd` engine with data verification.

mod common;

use common::*;

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
