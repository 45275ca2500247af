//! `ramd bench`: kernel tmpfs, a directory on disk and a ramd export in
//! one run (table, JSON, an SVG that rsvg-convert renders), its NBD client
//! against nbdkit, and the inputs it must refuse before writing anything.
//! Small sizes: these check behaviour, never speed.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use serde_json::Value;

const WORKLOADS: [&str; 8] = [
    "dd", "seqwr", "seqrd", "rndrw", "pg-fsync", "iometer", "redhawk", "metadata",
];

fn bench(args: &[&str]) -> Output {
    run(
        Command::new(ramd_bin()).arg("bench").args(args),
        LONG_TIMEOUT,
    )
}

/// The `ramd-bench.*` directories left in `dir`.
fn leftovers(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("ramd-bench.")
        })
        .collect()
}

/// Width and height from a PNG's IHDR chunk.
fn png_size(path: &Path) -> (u32, u32) {
    let b = fs::read(path).unwrap();
    assert!(
        b.len() > 24 && &b[..8] == b"\x89PNG\r\n\x1a\n",
        "{path:?} is not a PNG"
    );
    assert_eq!(&b[12..16], b"IHDR");
    let be = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
    (be(16), be(20))
}

/// The `width="…" height="…"` an SVG declares.
fn svg_size(svg: &str) -> (u32, u32) {
    let attr = |name: &str| -> u32 {
        let i = svg.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
        let v = &svg[i..i + svg[i..].find('"').unwrap()];
        v.parse::<f64>().unwrap().round() as u32
    };
    (attr("width"), attr("height"))
}

fn metric(results: &Value, workload: &str, key: &str) -> f64 {
    results[workload]["metrics"][key]["value"]
        .as_f64()
        .unwrap_or_else(|| panic!("no {workload}.{key} in {results}"))
}

#[test]
fn tmpfs_disk_dir_and_ramd_export_side_by_side() {
    require_tool("rsvg-convert");
    let dir = scratch();
    let tmpfs = Mount::tmpfs(&dir.path().join("tmpfs"), "64M", &[]);
    // Under the target directory: on disk, whatever /tmp is on this host.
    let disk_dir = tempfile::Builder::new()
        .prefix("ramd-bench-test.")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let on_disk = disk_dir.path().to_path_buf();
    let fstype = run_ok(&mut cmd(
        "stat",
        ["-f", "-c", "%T", on_disk.to_str().unwrap()],
    ));
    assert!(
        !["tmpfs", "ramfs", "fuseblk", "fuse"].contains(&fstype.trim()),
        "{on_disk:?} is on {fstype}, not a disk"
    );
    let ramd = Ramd::start(&["--size", "64M"]);
    let uri = ramd.uri().to_string();
    let svg = dir.path().join("bench.svg");
    let targets = [
        tmpfs.path().to_str().unwrap(),
        on_disk.to_str().unwrap(),
        uri.as_str(),
    ];

    let mut args = targets.to_vec();
    args.extend([
        "--size", "16M", "--runs", "2", "--qd", "4", "--json", "--svg",
    ]);
    args.push(svg.to_str().unwrap());
    let out = bench(&args).ok();
    let j: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(j["size_bytes"], 16 << 20);
    assert_eq!(j["runs"], 2);
    assert_eq!(j["qd"], 4);
    let ts = j["targets"].as_array().unwrap();
    assert_eq!(ts.len(), 3);
    for (t, (spec, kind)) in ts
        .iter()
        .zip(targets.iter().zip(["directory", "directory", "nbd"]))
    {
        assert_eq!(t["target"], *spec);
        assert_eq!(t["kind"], kind);
        let results = &t["results"];
        for w in WORKLOADS {
            let r = &results[w];
            assert!(r.is_object(), "{spec}: no {w} in {t}");
            if w == "metadata" && kind == "nbd" {
                assert_eq!(r["skipped"], "not a directory", "{r}");
                continue;
            }
            let metrics = r["metrics"].as_object().unwrap();
            assert!(!metrics.is_empty(), "{spec}: {w} has no figures");
            for (key, m) in metrics {
                let v = m["value"].as_f64().unwrap();
                assert!(v.is_finite() && v > 0.0, "{spec}: {w}.{key} = {v}");
                assert_eq!(m["runs"].as_array().unwrap().len(), 2, "{w}.{key}");
                let ratio = m["ratio"].as_f64().unwrap();
                if spec == &targets[0] {
                    assert_eq!(ratio, 1.0);
                }
            }
        }
        // The figures the issue names.
        for (w, k) in [
            ("dd", "write_mib_s"),
            ("dd", "read_mib_s"),
            ("seqwr", "mib_s"),
            ("seqrd", "ops_s"),
            ("rndrw", "ops_s"),
            ("pg-fsync", "ops_s"),
            ("iometer", "iops"),
            ("iometer", "p99_lat_us"),
            ("redhawk", "write_ms"),
            ("redhawk", "read_ms"),
        ] {
            metric(results, w, k);
        }
    }
    metric(&ts[0]["results"], "metadata", "create_files_s");
    assert!(ts[2]["results"]["redhawk"]["note"]
        .as_str()
        .unwrap()
        .contains("O_DIRECT"));

    // Left as found: no bench directory, the export's used range zeroed.
    assert!(leftovers(tmpfs.path()).is_empty());
    assert!(leftovers(&on_disk).is_empty());
    assert_zeros(dir.path(), &uri);

    // The chart renders, at the size it declares.
    let svg_text = fs::read_to_string(&svg).unwrap();
    let (w, h) = svg_size(&svg_text);
    assert_eq!(w, 960);
    assert!(
        h > 1000,
        "one group per figure should make a tall chart: {h}"
    );
    for t in targets {
        assert!(svg_text.contains(t), "the legend lacks {t}");
    }
    let png = dir.path().join("bench.png");
    run_ok(&mut cmd(
        "rsvg-convert",
        [svg.to_str().unwrap(), "-o", png.to_str().unwrap()],
    ));
    assert_eq!(png_size(&png), (w, h));

    // The table: one line per figure, ratios to the first target.
    let table = bench(&[
        targets[0],
        targets[2],
        "--size",
        "16M",
        "--runs",
        "1",
        "--only",
        "dd,metadata",
    ])
    .ok();
    assert!(
        table.contains(&format!("A = {} (directory)", targets[0])),
        "{table}"
    );
    assert!(table.contains(&format!("B = {uri} (nbd)")), "{table}");
    let dd_write = table
        .lines()
        .find(|l| l.starts_with("dd") && l.contains("write"))
        .unwrap_or_else(|| panic!("no dd write line: {table}"));
    assert!(
        dd_write.contains("MiB/s") && dd_write.ends_with("x)"),
        "{dd_write}"
    );
    assert!(table.contains("metadata on B: not a directory"), "{table}");
    assert!(!table.contains("seqwr"), "--only ran more: {table}");
}

#[test]
fn nbd_client_against_nbdkit() {
    require_tool("nbdkit");
    let dir = scratch();
    let sock = dir.path().join("nbdkit.sock");
    let port = free_tcp_port().to_string();
    // One server on a Unix socket, one on TCP: both of the client's
    // transports against a server someone else wrote.
    let _unix = Background::spawn(&mut cmd(
        "nbdkit",
        ["-f", "-U", sock.to_str().unwrap(), "memory", "64M"],
    ));
    let _tcp = Background::spawn(&mut cmd(
        "nbdkit",
        ["-f", "-i", "127.0.0.1", "-p", &port, "memory", "64M"],
    ));
    let unix_uri = format!("nbd+unix:///?socket={}", sock.display());
    let tcp_uri = format!("nbd://127.0.0.1:{port}/");
    for uri in [&unix_uri, &tcp_uri] {
        wait_until(START_DEADLINE, "nbdkit", || {
            run(&mut cmd("nbdinfo", ["--size", uri.as_str()]), CMD_TIMEOUT).success()
        });
    }
    let out = bench(&[
        &unix_uri, &tcp_uri, "--size", "16M", "--runs", "1", "--qd", "16", "--json",
    ])
    .ok();
    let j: Value = serde_json::from_str(&out).unwrap();
    for t in j["targets"].as_array().unwrap() {
        assert_eq!(t["kind"], "nbd");
        // dd and seqrd compare what they read with what they wrote.
        for w in ["dd", "seqrd", "rndrw", "pg-fsync", "iometer", "redhawk"] {
            assert!(
                !t["results"][w]["metrics"].as_object().unwrap().is_empty(),
                "{w}: {t}"
            );
        }
    }
    // Zeroed at the end, as found: a second run needs no --destructive.
    assert_zeros(dir.path(), &unix_uri);
    bench(&[
        &tcp_uri, "--size", "16M", "--runs", "1", "--only", "pg-fsync",
    ])
    .ok();
}

/// Copies the whole export out with nbdcopy and checks it reads as zeros.
fn assert_zeros(dir: &Path, uri: &str) {
    let dump = dir.join("dump");
    run_ok(&mut cmd("nbdcopy", [uri, dump.to_str().unwrap()]));
    assert!(
        fs::read(&dump).unwrap().iter().all(|&b| b == 0),
        "{uri} was not zeroed"
    );
    fs::remove_file(&dump).unwrap();
}

#[test]
fn refuses_a_raw_file_or_export_holding_data_unless_destructive() {
    let dir = scratch();
    let img = dir.path().join("disk.img");
    fs::write(&img, vec![0u8; 32 << 20]).unwrap();
    // One byte inside the first MiB.
    let mut data = fs::read(&img).unwrap();
    data[4000] = 0x55;
    fs::write(&img, &data).unwrap();
    let before = sha256(&img);
    let out = bench(&[img.to_str().unwrap(), "--size", "16M", "--runs", "1"]).failed();
    assert!(
        out.stderr.contains("first MiB is not all zeros") && out.stderr.contains("--destructive"),
        "{}",
        out.stderr
    );
    assert!(out.stderr.contains(img.to_str().unwrap()), "{}", out.stderr);
    assert_eq!(sha256(&img), before, "written although refused");

    let out = bench(&[
        img.to_str().unwrap(),
        "--size",
        "16M",
        "--runs",
        "1",
        "--only",
        "dd,iometer",
        "--destructive",
        "--json",
    ])
    .ok();
    let j: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["targets"][0]["kind"], "file");
    metric(&j["targets"][0]["results"], "iometer", "iops");
    // The range used is zeroed; the file keeps its size.
    let after = fs::read(&img).unwrap();
    assert_eq!(after.len(), 32 << 20);
    assert!(after.iter().all(|&b| b == 0));

    // The same for an export: data written by another client.
    let ramd = Ramd::start(&["--size", "32M"]);
    qemu_io(ramd.uri(), &["write -P 0x55 65536 4096".into()]);
    let out = bench(&[ramd.uri(), "--size", "16M", "--only", "dd"]).failed();
    assert!(
        out.stderr.contains("first MiB is not all zeros"),
        "{}",
        out.stderr
    );
    qemu_io(ramd.uri(), &["read -P 0x55 65536 4096".into()]);
    bench(&[
        ramd.uri(),
        "--size",
        "16M",
        "--runs",
        "1",
        "--only",
        "dd",
        "--destructive",
    ])
    .ok();
    qemu_io(ramd.uri(), &["read -P 0 0 16M".into()]);
}

#[test]
fn a_block_device_is_a_raw_disk() {
    let dir = scratch();
    let img = dir.path().join("loop.img");
    fs::write(&img, vec![0u8; 24 << 20]).unwrap();
    let dev = Loop::attach(&img);
    let out = bench(&[
        dev.dev(),
        "--size",
        "16M",
        "--runs",
        "1",
        "--only",
        "dd,seqrd,redhawk,metadata",
        "--json",
    ])
    .ok();
    let j: Value = serde_json::from_str(&out).unwrap();
    let t = &j["targets"][0];
    assert_eq!(t["kind"], "block-device");
    metric(&t["results"], "dd", "read_mib_s");
    metric(&t["results"], "seqrd", "mib_s");
    // The loop device takes O_DIRECT: no fallback note.
    metric(&t["results"], "redhawk", "write_ms");
    assert!(t["results"]["redhawk"]["note"].is_null(), "{t}");
    assert_eq!(t["results"]["metadata"]["skipped"], "not a directory");
    dev.detach();
    assert!(
        fs::read(&img).unwrap().iter().all(|&b| b == 0),
        "not zeroed"
    );
}

#[test]
fn bad_targets_and_options_are_refused_before_anything_is_written() {
    let dir = scratch();
    let ok = dir.path().join("ok");
    fs::create_dir(&ok).unwrap();
    let ok_s = ok.to_str().unwrap();

    // Missing: named, and the good target before it untouched.
    let missing = dir.path().join("missing");
    let out = bench(&[ok_s, missing.to_str().unwrap(), "--size", "16M"]).failed();
    assert!(
        out.stderr
            .contains(&format!("{}: does not exist", missing.display())),
        "{}",
        out.stderr
    );
    assert!(leftovers(&ok).is_empty());

    // Too small: a directory, a file and an export, each with the sizes.
    let small = Mount::tmpfs(&dir.path().join("small"), "8M", &[]);
    let out = bench(&[ok_s, small.path().to_str().unwrap(), "--size", "16M"]).failed();
    assert!(
        out.stderr.contains("too small") && out.stderr.contains("--size 16M"),
        "{}",
        out.stderr
    );
    assert!(leftovers(&ok).is_empty());
    assert!(leftovers(small.path()).is_empty());
    let img = dir.path().join("small.img");
    fs::write(&img, vec![0u8; 4 << 20]).unwrap();
    let out = bench(&[img.to_str().unwrap(), "--size", "16M"]).failed();
    assert!(out.stderr.contains("too small"), "{}", out.stderr);
    let ramd = Ramd::start(&["--size", "16M"]);
    let out = bench(&[ramd.uri(), "--size", "32M"]).failed();
    assert!(
        out.stderr.contains("too small") && out.stderr.contains("need 32M"),
        "{}",
        out.stderr
    );

    // Not writable: a read-only tmpfs (root may write anywhere else) and a
    // read-only export.
    let ro = Mount::tmpfs(&dir.path().join("ro"), "64M", &["ro"]);
    let out = bench(&[ro.path().to_str().unwrap(), "--size", "16M"]).failed();
    assert!(out.stderr.contains("not writable"), "{}", out.stderr);
    let ro_disk = Ramd::start(&["--size", "32M", "--read-only"]);
    let out = bench(&[ro_disk.uri(), "--size", "16M"]).failed();
    assert!(out.stderr.contains("read-only"), "{}", out.stderr);

    // Unknown workload, and a size below the minimum: named by clap.
    let out = bench(&[ok_s, "--only", "dd,untar"]).failed();
    assert!(out.stderr.contains("'untar'"), "{}", out.stderr);
    assert!(out.stderr.contains("pg-fsync"), "{}", out.stderr);
    let out = bench(&[ok_s, "--size", "1M"]).failed();
    assert!(out.stderr.contains("16M"), "{}", out.stderr);
    // Not a URI we know; an unreachable export.
    let out = bench(&["nbds://h/x"]).failed();
    assert!(out.stderr.contains("nbds://h/x"), "{}", out.stderr);
    let out = bench(&[&format!(
        "nbd+unix:///x?socket={}",
        dir.path().join("none.sock").display()
    )])
    .failed();
    assert!(out.stderr.contains("none.sock"), "{}", out.stderr);
    assert!(leftovers(&ok).is_empty());
}
