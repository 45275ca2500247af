//! What `nbdinfo` sees: size, flags, block sizes, export list, map, --can/--is.

mod common;

use common::*;
use serde_json::Value;

fn nbdinfo(args: &[&str]) -> Output {
    require_tool("nbdinfo");
    run(&mut cmd("nbdinfo", args), CMD_TIMEOUT)
}

fn nbdinfo_json(args: &[&str]) -> Value {
    let out = nbdinfo(args).ok();
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("nbdinfo JSON ({e}):\n{out}"))
}

/// The URI of export `name` on the daemon's Unix socket.
fn export_uri(d: &Ramd, name: &str) -> String {
    format!("nbd+unix:///{name}?socket={}", d.socket_path().display())
}

/// Exit code of `nbdinfo --can X` / `--is X`: 0 true, 2 false.
fn nbdinfo_code(args: &[&str]) -> i32 {
    let out = nbdinfo(args);
    out.status
        .code()
        .unwrap_or_else(|| panic!("nbdinfo killed: {out:?}"))
}

#[test]
fn reports_size_flags_contexts_and_block_sizes() {
    let d = Ramd::start(&["--size", "256M"]);
    let v = nbdinfo_json(&["--json", d.uri()]);
    assert_eq!(v["protocol"], "newstyle-fixed", "{v}");
    assert_eq!(v["structured"], true, "{v}");
    let e = &v["exports"][0];
    assert_eq!(e["export-name"], "ram0", "{v}");
    assert_eq!(e["export-size"], 256 * MIB, "{v}");
    assert_eq!(e["is_read_only"], false, "{v}");
    for flag in [
        "can_cache",
        "can_df",
        "can_fast_zero",
        "can_flush",
        "can_fua",
        "can_multi_conn",
        "can_trim",
        "can_zero",
    ] {
        assert_eq!(e[flag], true, "{flag} in {v}");
    }
    let contexts = e["contexts"].as_array().expect("contexts");
    assert!(contexts.iter().any(|c| c == "base:allocation"), "{v}");
    assert_eq!(e["block_size_minimum"], 1, "{v}");
    assert_eq!(e["block_size_preferred"], 4096, "{v}");
    assert_eq!(e["block_size_maximum"], 32 * MIB, "{v}");
}

#[test]
fn sizes_with_suffixes_and_plain_bytes() {
    for (arg, bytes) in [("1G", GIB), ("64M", 64 * MIB), ("10000000", 10_000_000)] {
        let d = Ramd::start(&["--size", arg]);
        let v = nbdinfo_json(&["--json", d.uri()]);
        assert_eq!(v["exports"][0]["export-size"], bytes, "--size {arg}: {v}");
    }
    // The last bytes of an odd-sized disk are reachable.
    let d = Ramd::start(&["--size", "10000000"]);
    nbd_script(
        "io.py",
        &[
            d.uri(),
            "write-random",
            "9999000",
            "1000",
            "1",
            ",",
            "verify-random",
            "9999000",
            "1000",
            "1",
        ],
    );
}

#[test]
fn list_shows_the_export() {
    let d = Ramd::start(&["--size", "64M", "--name", "scratch"]);
    assert!(
        d.uri().contains("scratch"),
        "URI {} lacks the name",
        d.uri()
    );
    let v = nbdinfo_json(&["--list", "--json", d.uri()]);
    let exports = v["exports"].as_array().expect("exports");
    let e = exports
        .iter()
        .find(|e| e["export-name"] == "scratch")
        .unwrap_or_else(|| panic!("export scratch not listed: {v}"));
    assert_eq!(e["export-size"], 64 * MIB, "{v}");
    let text = nbdinfo(&["--list", d.uri()]).ok();
    assert!(text.contains("scratch"), "{text}");
}

#[test]
fn empty_export_name_maps_to_the_disk_and_unknown_names_are_refused() {
    let mut d = Ramd::start(&["--size", "64M", "--name", "disk7"]);
    let v = nbdinfo_json(&["--json", &export_uri(&d, "")]);
    assert_eq!(v["exports"][0]["export-size"], 64 * MIB, "{v}");
    let out = nbdinfo(&["--json", &export_uri(&d, "no-such-disk")]).failed();
    assert!(out.stderr.contains("no-such-disk"), "{out:?}");
    d.assert_alive();
    let v = nbdinfo_json(&["--json", &export_uri(&d, "disk7")]);
    assert_eq!(v["exports"][0]["export-size"], 64 * MIB, "{v}");
}

/// `nbdinfo --map --json`, adjacent extents of one type merged (the server
/// may split extents wherever it likes).
fn map(uri: &str) -> Vec<(u64, u64, u64)> {
    let v = nbdinfo_json(&["--map", "--json", uri]);
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    for e in v.as_array().expect("map array") {
        let (off, len, ty) = (field(e, "offset"), field(e, "length"), field(e, "type"));
        let desc = e["description"].as_str().unwrap_or_default();
        let want_desc = ["data", "hole", "zero", "hole,zero"][ty as usize];
        assert_eq!(desc, want_desc, "type {ty} described as {desc:?}: {v}");
        match out.last_mut() {
            Some(last) if last.2 == ty && last.0 + last.1 == off => last.1 += len,
            _ => {
                let end = out.last().map(|l| l.0 + l.1).unwrap_or(0);
                assert_eq!(off, end, "map has a gap or overlap before {off}: {v}");
                out.push((off, len, ty));
            }
        }
    }
    out
}

#[test]
fn map_shows_holes_zeroes_and_data() {
    let d = Ramd::start(&["--size", "64M"]);
    assert_eq!(map(d.uri()), vec![(0, 64 * MIB, 3)]);
    qemu_io(
        d.uri(),
        &[
            "write -P 0x5a 1M 1M".into(), // same-filled: data
            "write -z 4M 1M".into(),      // WRITE_ZEROES + NO_HOLE: zero
        ],
    );
    assert_eq!(
        map(d.uri()),
        vec![
            (0, MIB, 3),
            (MIB, MIB, 0),
            (2 * MIB, 2 * MIB, 3),
            (4 * MIB, MIB, 2),
            (5 * MIB, 59 * MIB, 3),
        ]
    );
    let totals = nbdinfo(&["--map", "--totals", d.uri()]).ok();
    assert!(
        totals.contains("hole,zero") && totals.contains("data"),
        "{totals}"
    );
}

#[test]
fn can_and_is_answers() {
    let d = Ramd::start(&["--size", "64M"]);
    for what in [
        "connect",
        "read",
        "write",
        "flush",
        "fua",
        "trim",
        "zero",
        "fast-zero",
        "df",
        "multi-conn",
        "cache",
        "structured-reply",
    ] {
        assert_eq!(nbdinfo_code(&["--can", what, d.uri()]), 0, "--can {what}");
    }
    assert_eq!(nbdinfo_code(&["--is", "read-only", d.uri()]), 2);
    assert_eq!(nbdinfo_code(&["--is", "rotational", d.uri()]), 2);
}

#[test]
fn read_only_export_is_advertised_and_refuses_writes() {
    let mut d = Ramd::start(&["--size", "64M", "--read-only"]);
    let v = nbdinfo_json(&["--json", d.uri()]);
    assert_eq!(v["exports"][0]["is_read_only"], true, "{v}");
    assert_eq!(nbdinfo_code(&["--is", "read-only", d.uri()]), 0);
    assert_eq!(nbdinfo_code(&["--can", "write", d.uri()]), 2);
    assert_eq!(nbdinfo_code(&["--can", "read", d.uri()]), 0);

    require_tool("qemu-io");
    let out = run(
        &mut cmd(
            "qemu-io",
            ["-f", "raw", "-c", "write -P 0xab 0 64k", d.uri()],
        ),
        CMD_TIMEOUT,
    );
    assert!(
        !out.success() || out.stdout.contains("failed") || out.stderr.contains("failed"),
        "qemu-io wrote to a read-only disk: {out:?}"
    );
    d.assert_alive();
    // Nothing was written.
    nbd_script("io.py", &[d.uri(), "verify-byte", "0", "64K", "0"]);
}
