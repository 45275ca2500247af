//! qemu's NBD client: `qemu-img convert/compare/map` and `qemu-io`.

mod common;

use common::*;
use serde_json::Value;

fn qemu_img(args: &[&str]) -> String {
    require_tool("qemu-img");
    run(&mut cmd("qemu-img", args), LONG_TIMEOUT).ok()
}

/// `qemu-img map --output=json` as (start, length, data, zero), adjacent
/// entries with the same flags merged.
fn qemu_map(uri: &str) -> Vec<(u64, u64, bool, bool)> {
    let out = qemu_img(&["map", "--output=json", "-f", "raw", uri]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("map JSON ({e}):\n{out}"));
    let mut merged: Vec<(u64, u64, bool, bool)> = Vec::new();
    for e in v.as_array().expect("map array") {
        let (start, len) = (field(e, "start"), field(e, "length"));
        let (data, zero) = (e["data"] == true, e["zero"] == true);
        match merged.last_mut() {
            Some(l) if l.2 == data && l.3 == zero && l.0 + l.1 == start => l.1 += len,
            _ => merged.push((start, len, data, zero)),
        }
    }
    merged
}

#[test]
fn convert_compare_and_map() {
    let tmp = scratch();
    let src = tmp.path().join("src.raw");
    // 32 MiB: random data in the first 8 MiB and at 20-24 MiB, zeros elsewhere.
    let mut buf = vec![0u8; (32 * MIB) as usize];
    Rng::new(5).fill(&mut buf[..(8 * MIB) as usize]);
    Rng::new(6).fill(&mut buf[(20 * MIB) as usize..(24 * MIB) as usize]);
    write_file(&src, &buf);
    let src = src.to_str().unwrap();

    let d = Ramd::start(&["--size", "32M"]);
    qemu_img(&["convert", "-n", "-f", "raw", "-O", "raw", src, d.uri()]);
    qemu_img(&["compare", "-f", "raw", "-F", "raw", src, d.uri()]);
    // The same through --image-opts.
    let sock = d.socket_path();
    let opts = format!(
        "driver=nbd,server.type=unix,server.path={},export=ram0",
        sock.display()
    );
    let src_opts = format!("driver=file,filename={src}");
    qemu_img(&["compare", "--image-opts", &src_opts, &opts]);

    // Zero ranges of the source are not data on the disk.
    for (start, len, data, zero) in qemu_map(d.uri()) {
        let end = start + len;
        let overlaps_data = start < 8 * MIB || (start < 24 * MIB && end > 20 * MIB);
        if !overlaps_data {
            assert!(
                zero,
                "zero range {start}+{len} of the source not zero: data={data}"
            );
        }
    }

    // Trim the first 4 MiB and zero (NO_HOLE) 20-22 MiB.
    qemu_io(d.uri(), &["discard 0 4M".into(), "write -z 20M 2M".into()]);
    let m = qemu_map(d.uri());
    assert_eq!(m[0], (0, 4 * MIB, false, true), "trimmed range: {m:?}");
    let z = m
        .iter()
        .find(|e| e.0 <= 20 * MIB && e.0 + e.1 > 20 * MIB)
        .unwrap();
    assert!(z.3 && z.0 + z.1 >= 22 * MIB, "zeroed range: {m:?}");
    let tail = m.last().unwrap();
    assert_eq!(
        (tail.0 + tail.1, tail.2, tail.3),
        (32 * MIB, false, true),
        "unwritten tail: {m:?}"
    );
    // And the disk now differs from the source exactly there.
    let out = run(
        &mut cmd(
            "qemu-img",
            ["compare", "-f", "raw", "-F", "raw", src, d.uri()],
        ),
        CMD_TIMEOUT,
    );
    assert_eq!(out.status.code(), Some(1), "compare should differ: {out:?}");
    assert!(out.stdout.contains("offset 0"), "{out:?}");
}

#[test]
fn qemu_io_patterns_discard_and_zero() {
    let d = Ramd::start(&["--size", "64M"]);
    let c = |s: &str| s.to_string();
    qemu_io(
        d.uri(),
        &[
            c("write -P 0xab 0 1M"),
            c("read -P 0xab 0 1M"),
            c("write -P 0xcd 1M 1M"),
            c("write -f -P 0xef 2M 64k"), // FUA
            c("flush"),
            c("read -P 0xcd 1M 1M"),
            c("read -P 0xef 2M 64k"),
            c("discard 512k 1M"),
            c("read -P 0xab 0 512k"),
            c("read -P 0 512k 1M"),
            c("read -P 0xcd 1536k 512k"),
            c("write -z 2M 64k"),
            c("read -P 0 2M 64k"),
            c("write -P 0x11 3M 128k"),
            c("write -z -u 3M 64k"),      // may unmap
            c("write -z -n 3211264 64k"), // FAST_ZERO at 3M+64k
            c("read -P 0 3M 128k"),
            // Unaligned and tiny, across a page and a 2 MiB boundary.
            c("write -P 0x77 8388607 3"),
            c("read -P 0x77 8388607 3"),
            c("read -P 0 8388606 1"),
            c("read -P 0 8388610 4096"),
        ],
    );
    // A fresh process sees the same disk.
    qemu_io(
        d.uri(),
        &[
            c("read -P 0xab 0 512k"),
            c("read -P 0xcd 1536k 512k"),
            c("read -P 0 2M 64k"),
            c("read -P 0x77 8388607 3"),
        ],
    );
}

#[test]
fn qemu_io_many_aio_requests() {
    let d = Ramd::start(&["--size", "64M"]);
    let mut cmds = Vec::new();
    for i in 0..64u64 {
        cmds.push(format!("aio_write -P {} {}k 256k", 0x10 + i, i * 256));
    }
    cmds.push("aio_flush".to_string());
    for i in (0..64u64).rev() {
        cmds.push(format!("aio_read -P {} {}k 256k", 0x10 + i, i * 256));
    }
    cmds.push("aio_flush".to_string());
    qemu_io(d.uri(), &cmds);
    // Check again from a second process, synchronously.
    let verify: Vec<String> = (0..64u64)
        .map(|i| format!("read -P {} {}k 256k", 0x10 + i, i * 256))
        .collect();
    qemu_io(d.uri(), &verify);
}
