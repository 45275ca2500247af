//! Persistence seen from outside: `serve --image DIR`, `--autosave`,
//! `--flush persist`, `ramd snapshot`, `ramd image info|verify|export|import`,
//! and what an image survives: clean stops, crashes at every step of a save
//! (the `RAMD_TEST_CRASH` hook and real SIGKILLs), damaged files, a full
//! filesystem under the image.
//!
//! Data goes in and comes out through real clients (fio's nbd engine,
//! nbdcopy, qemu-io, libnbd scripts; cp, find, sha256sum, getfattr on
//! filesystem disks) and is compared with references kept by the test.

mod common;
mod fs_common;
mod restore_common;

use common::layout::*;
use common::*;
use fs_common::{is_mounted, FsDisk};
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// How long the background scanner may take to compress or re-pack pages.
const SCANNER_DEADLINE: Duration = Duration::from_secs(90);

// ---------------------------------------------------------------------------
// Small helpers

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

fn nbdcopy(args: &[&str]) {
    require_tool("nbdcopy");
    run(&mut cmd("nbdcopy", args), LONG_TIMEOUT).ok();
}

fn io(uri: &str, ops: &[&str]) -> String {
    let mut args = vec![uri];
    args.extend_from_slice(ops);
    nbd_script("io.py", &args)
}

/// `ramd ARGS…` (no run dir needed: the `image` subcommands).
fn ramd(args: &[&str]) -> Output {
    run(&mut cmd(ramd_bin(), args), LONG_TIMEOUT)
}

/// stdout and stderr together, for "the message names X" checks.
fn all_output(o: &Output) -> String {
    format!("{}\n{}", o.stdout, o.stderr)
}

/// The exit code out of the status text `Ramd::try_start_in` returns
/// ("exited: exit status: 1").
fn exit_code_of(status: &str) -> Option<i32> {
    status
        .rsplit_once("exit status: ")
        .and_then(|(_, c)| c.trim().parse().ok())
}

/// Whether `text` mentions a size of `bytes` in one of the usual ways
/// (268435456, 256M, 256 MiB, 256MiB, 256.0 MiB, 256.0M).
fn mentions_size(text: &str, bytes: u64) -> bool {
    let mut forms = vec![bytes.to_string()];
    for (unit, long, div) in [("K", "KiB", KIB), ("M", "MiB", MIB), ("G", "GiB", GIB)] {
        if bytes.is_multiple_of(div) {
            let n = bytes / div;
            forms.extend([
                format!("{n}{unit}"),
                format!("{n} {long}"),
                format!("{n}{long}"),
                format!("{n}.0 {long}"),
                format!("{n}.0{unit}"),
                format!("{n}.0{long}"),
            ]);
        }
    }
    forms.iter().any(|f| {
        text.match_indices(f.as_str()).any(|(i, _)| {
            // Not the tail of a longer number (16M inside 116M).
            i == 0 || !text.as_bytes()[i - 1].is_ascii_digit()
        })
    })
}

/// Files (not directories) under `dir`, recursively, sorted.
fn files_in(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap_or_else(|e| panic!("read_dir {d:?}: {e}")) {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else {
                out.push(e.path());
            }
        }
    }
    out.sort();
    out
}

/// `ls -la` of the image directory, for failure messages.
fn listing(dir: &Path) -> String {
    run(cmd("ls", ["-laR"]).arg(dir), CMD_TIMEOUT).stdout
}

/// The segment files of an image, sorted by name (= by sequence number).
/// Leftovers of interrupted saves in the image directory.
fn tmp_files(img: &Path) -> Vec<PathBuf> {
    files_in(img)
        .into_iter()
        .filter(|f| f.to_string_lossy().ends_with(".tmp"))
        .collect()
}

fn file_name(f: &Path) -> String {
    f.file_name().unwrap().to_string_lossy().into_owned()
}

// ---------------------------------------------------------------------------
// ramd snapshot, status, image

/// `ramd snapshot NAME [--full] --json` against a running daemon; checks
/// the keys the contract promises and returns the object.
fn snapshot(run_dir: &Path, name: &str, full: bool) -> Value {
    let mut args = vec!["snapshot", name];
    if full {
        args.push("--full");
    }
    args.push("--json");
    let out = ramd_cmd(run_dir, &args).ok();
    let v: Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("`ramd snapshot --json` printed invalid JSON ({e}):\n{out}"));
    // (Every key of the contract is checked by snapshot_json_has_every_key.)
    for k in ["seq", "pages", "bytes"] {
        field(&v, k);
    }
    let is_full = v["full"]
        .as_bool()
        .unwrap_or_else(|| panic!("snapshot JSON lacks full (bool): {v}"));
    // Without --full, the first save of an image is a full one anyway.
    assert!(!full || is_full, "asked for --full, snapshot says: {v}");
    v
}

/// `ramd image verify DIR` must succeed and say `DIR: ok`.
fn verify_ok(img: &Path) -> String {
    let out = ramd(&["image", "verify", p(img)]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "ramd image verify {img:?} failed ({}):\n{}\nimage:\n{}",
        out.status,
        all_output(&out),
        listing(img)
    );
    assert!(
        out.stdout.contains(": ok"),
        "ramd image verify {img:?} did not say ok:\n{}",
        all_output(&out)
    );
    out.stdout
}

/// `ramd image info DIR --json`, parsed.
fn info_json(img: &Path) -> Value {
    let out = ramd(&["image", "info", p(img), "--json"]).ok();
    serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("`ramd image info --json` printed invalid JSON ({e}):\n{out}"))
}

/// The chain of saves in `image info --json`, whatever the array is called.
fn info_saves(info: &Value) -> Vec<Value> {
    for k in ["saves", "chain", "segments"] {
        if let Some(a) = info[k].as_array() {
            return a.clone();
        }
    }
    panic!("`ramd image info --json` has no array of saves (saves/chain/segments): {info}")
}

/// The sequence number of the newest save in the image.
fn latest_seq(img: &Path) -> u64 {
    let info = info_json(img);
    info_saves(&info)
        .iter()
        .map(|s| field(s, "seq"))
        .max()
        .unwrap_or_else(|| panic!("image {img:?} has no saves: {info}"))
}

/// Starts `ramd serve ARGS` in a fresh run dir expecting a refusal; returns
/// the exit code and stderr.
fn serve_refused(args: &[&str]) -> (Option<i32>, String) {
    let run_dir = scratch();
    match Ramd::try_start_in(run_dir.path(), args) {
        Ok(mut d) => {
            d.stop();
            panic!("ramd serve {args:?} started; it should have been refused");
        }
        Err((status, stderr)) => {
            assert!(
                status.starts_with("exited"),
                "ramd serve {args:?} neither started nor exited: {status}\n{stderr}"
            );
            (exit_code_of(&status), stderr)
        }
    }
}

/// A process that was killed by SIGKILL.
fn assert_sigkilled(status: std::process::ExitStatus, what: &str, stderr: &str) {
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "{what}: expected death by SIGKILL, got {status}; stderr:\n{stderr}"
    );
}

// ---------------------------------------------------------------------------
// 1. Block disk round trip: fio verify across a stop and a start

/// fio with the nbd engine over `region` bytes from offset 0: random
/// writes of 4 KiB..64 KiB blocks with crc32c headers, every block written
/// once. `verify_only` replays the same job (same seed) reading only.
fn fio_random(uri: &str, dir: &Path, region: u64, compressible: bool, verify_only: bool) -> Value {
    require_tool("fio");
    let out_file = dir.join(if verify_only {
        "verify.json"
    } else {
        "write.json"
    });
    let mut c = cmd(
        "fio",
        [
            "--name=persist".to_string(),
            "--ioengine=nbd".into(),
            format!("--uri={uri}"),
            "--rw=randwrite".into(),
            "--bsrange=4k-64k".into(),
            format!("--size={region}"),
            "--iodepth=16".into(),
            "--verify=crc32c".into(),
            "--verify_fatal=1".into(),
            "--randrepeat=1".into(),
            "--output-format=json".into(),
            format!("--output={}", out_file.display()),
        ],
    );
    if compressible {
        c.args([
            "--buffer_compress_percentage=60",
            "--buffer_compress_chunk=4k",
        ]);
    }
    if verify_only {
        c.arg("--verify_only");
    } else {
        c.arg("--do_verify=1");
    }
    // fio drops *-verify.state files in its working directory.
    c.current_dir(dir);
    let out = run(&mut c, LONG_TIMEOUT);
    let json = fs::read_to_string(&out_file).unwrap_or_default();
    assert!(
        out.success(),
        "fio (verify_only={verify_only}) failed: {out:?}\n{json}"
    );
    let v: Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("fio JSON ({e}):\n{json}"));
    let job = v["jobs"][0].clone();
    assert_eq!(job["error"], 0, "fio reported an error: {job}");
    assert_eq!(
        job["read"]["io_bytes"].as_u64(),
        Some(region),
        "fio did not verify the whole region: {job}"
    );
    job
}

/// Writes through other request types into [192M, 256M): plain writes,
/// zeros written as data, WRITE_ZEROES with and without NO_HOLE, TRIM,
/// same-filled pages.
fn write_tail_mix(uri: &str) {
    io(
        uri,
        &[
            "write-random",
            "192M",
            "16M",
            "r1",
            ",", //
            "write-byte",
            "208M",
            "4M",
            "0x00",
            ",", //
            "write-random",
            "212M",
            "8M",
            "r2",
            ",", //
            "zero",
            "214M",
            "2M",
            "-",
            ",", //
            "trim",
            "218M",
            "1M",
            ",", //
            "write-byte",
            "220M",
            "4M",
            "0xab",
            ",", //
            "write-random",
            "224M",
            "32M",
            "r3",
            ",", //
            "zero",
            "240M",
            "4M",
            "nohole",
            ",", //
            "flush",
        ],
    );
}

fn verify_tail_mix(uri: &str) {
    io(
        uri,
        &[
            "verify-random",
            "192M",
            "16M",
            "r1",
            ",", //
            "verify-byte",
            "208M",
            "4M",
            "0x00",
            ",", //
            "verify-random",
            "212M",
            "2M",
            "r2",
            ",", //
            "verify-byte",
            "214M",
            "2M",
            "0x00",
            ",", //
            "verify-random",
            "216M",
            "2M",
            "r2",
            ",", //
            "verify-byte",
            "218M",
            "1M",
            "0x00",
            ",", //
            "verify-random",
            "219M",
            "1M",
            "r2",
            ",", //
            "verify-byte",
            "220M",
            "4M",
            "0xab",
            ",", //
            "verify-random",
            "224M",
            "16M",
            "r3",
            ",", //
            "verify-byte",
            "240M",
            "4M",
            "0x00",
            ",", //
            "verify-random",
            "244M",
            "12M",
            "r3",
        ],
    );
}

/// serve --size 256M --image DIR EXTRA; fio + mixed writes; stop; the image
/// verifies and names its size; serve --image DIR EXTRA (no --size); fio
/// verify-only and the mixed part read back.
fn block_round_trip(extra: &[&str], compressible: bool, wait_frames: bool) {
    let tmp = scratch();
    let img = tmp.path().join("img");
    const REGION: u64 = 192 * MIB;

    let mut args = vec!["--size", "256M", "--image", p(&img)];
    args.extend_from_slice(extra);
    let mut d = Ramd::start(&args);
    assert!(img.is_dir(), "--image did not create {img:?}");
    fio_random(d.uri(), tmp.path(), REGION, compressible, false);
    write_tail_mix(d.uri());
    verify_tail_mix(d.uri());
    if compressible {
        let s = d.stats();
        assert!(
            field(&s, "compressed_pages") > 0 || field(&s, "hot_pages") > 0,
            "{s}"
        );
    }
    let before = if wait_frames {
        wait_for(&d, "idle pages re-packed into frames", |s| {
            field(s, "frame_pages") > 0
        })
    } else if compressible {
        wait_for(&d, "pages compressed", |s| field(s, "compressed_pages") > 0)
    } else {
        d.stats()
    };
    d.stop();

    verify_ok(&img);
    let info = ramd(&["image", "info", p(&img)]).ok();
    assert!(
        mentions_size(&info, 256 * MIB),
        "`ramd image info` does not name the size 256M:\n{info}"
    );
    assert!(
        info.contains("block"),
        "`ramd image info` does not name the kind:\n{info}"
    );
    let ij = info_json(&img);
    assert_eq!(ij["kind"], "block", "{ij}");
    assert_eq!(field(&ij, "size"), 256 * MIB, "{ij}");

    let mut args = vec!["--image", p(&img)];
    args.extend_from_slice(extra);
    let d = Ramd::start(&args);
    let err = d.stderr();
    assert!(
        err.contains("loading image") && err.contains("loaded image"),
        "no loading/loaded log lines on stderr:\n{err}"
    );
    let s = d.stats();
    assert_eq!(
        field(&s, "size"),
        256 * MIB,
        "size not taken from the image: {s}"
    );
    assert_eq!(s["image"].as_str(), Some(p(&img)), "{s}");
    assert_eq!(
        field(&s, "data_pages"),
        field(&before, "data_pages"),
        "data pages before the stop and after the load differ\nbefore: {before}\nafter: {s}"
    );
    fio_random(d.uri(), tmp.path(), REGION, compressible, true);
    verify_tail_mix(d.uri());
    if compressible {
        // The disk is compressed again: the loaded pages do not stay raw.
        wait_for(&d, "loaded pages compressed", |s| {
            field(s, "compressed_pages") + field(s, "frame_pages") > 0
        });
    }
    assert_accounting(&d.stats());
    if extra.is_empty() {
        return;
    }
    // And with nothing but --image: compressed pages and frames load into
    // a disk started without the codec flags, as they were (so the
    // "uncompressed disk: stored = data pages x 4096" rule of
    // assert_accounting does not apply; the identities do).
    let mut d = d;
    d.stop();
    let d = Ramd::start(&["--image", p(&img)]);
    fio_random(d.uri(), tmp.path(), REGION, compressible, true);
    verify_tail_mix(d.uri());
    assert_accounting_identities(&d.stats());
}

/// Status once `cond` holds, read so that it can serve as a reference: the
/// per-kind page counters are read one by one, so a reading taken while the
/// scanner moves a page (count −1 for the old slot, +1 for the new) can be a
/// page short; two readings in a row that agree on the page counts are not.
fn wait_for(d: &Ramd, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    let mut last = Value::Null;
    wait_until(SCANNER_DEADLINE, what, || {
        let first = d.stats();
        last = d.stats();
        let settled = ["data_pages", "used_bytes", "zero_pages", "fill_pages"]
            .iter()
            .all(|k| first[k] == last[k]);
        settled && cond(&last)
    });
    last
}

#[test]
fn block_round_trip_fio_verify() {
    block_round_trip(&[], false, false);
}

#[test]
fn block_round_trip_lz4() {
    block_round_trip(&["--compress", "lz4"], true, false);
}

#[test]
fn block_round_trip_lz4_recompressed_zstd_frames() {
    block_round_trip(
        &[
            "--compress",
            "lz4",
            "--recompress",
            "zstd",
            "--idle-after",
            "1s",
        ],
        true,
        true,
    );
}

// ---------------------------------------------------------------------------
// 2. Filesystem disk round trip

/// Builds, under `root`, a copy of /usr/share/doc and a generated tree with
/// sparse files, symlinks (dangling, long), hardlinks, xattrs (user,
/// trusted, binary, empty, large), odd modes and owners, a fifo, a device
/// node, names with spaces and non-ASCII, set timestamps.
fn build_tree(root: &Path) {
    for t in [
        "cp", "ln", "setfattr", "getfattr", "mkfifo", "mknod", "truncate", "dd", "chown", "chmod",
        "touch", "head", "sh",
    ] {
        require_tool(t);
    }
    let mut c = cmd("cp", ["-a", "/usr/share/doc"]);
    c.arg(root.join("doc"));
    run(&mut c, LONG_TIMEOUT).ok();
    let script = r#"
set -eu
mkdir -p gen/sub/deeper/deepest "gen/with space" "gen/ünïcödé"
cd gen
head -c 12345 /dev/urandom > odd
: > empty
head -c 3M /dev/urandom > data1
ln data1 hard1
ln data1 sub/hard2
truncate -s 64M sparse1
dd if=/dev/urandom of=sparse1 bs=4k seek=1000 count=3 conv=notrunc status=none
dd if=/dev/urandom of=sparse1 bs=4k seek=16000 count=1 conv=notrunc status=none
head -c 1M /dev/urandom > sparse2
truncate -s 10M sparse2
dd if=/dev/urandom of=tail bs=1 count=100 seek=5000000 status=none
head -c 300000 /dev/zero > zeros
ln -s data1 link-file
ln -s ../gen/sub link-dir
ln -s /nonexistent/target dangling
ln -s "$(head -c 250 /dev/zero | tr '\0' x)" longlink
mkfifo fifo
mknod chr c 1 3
echo hello > "with space/file name"
echo x > "ünïcödé/ƒile"
head -c 70000 /dev/urandom > sub/deeper/deepest/leaf
chmod 0640 odd
chmod 0000 empty
chmod 4755 tail
chmod 1777 sub
chmod 2750 "with space"
chown 1234:5678 odd
chown -h 4321:8765 dangling
setfattr -n user.color -v blue data1
setfattr -n user.bin -v 0x00ff10 odd
setfattr -n user.empty sub
setfattr -n trusted.secret -v s3cr3t sparse2
setfattr -n user.big -v "$(head -c 2000 /dev/zero | tr '\0' a)" sub/deeper/deepest/leaf
touch -d '1999-12-31 23:59:59.5' odd
touch -h -d '2001-02-03 04:05:06.123456789' link-file
"#;
    let mut c = cmd("sh", ["-c", script]);
    c.current_dir(root);
    run(&mut c, LONG_TIMEOUT).ok();
}

/// Everything a round trip must keep, as sorted text.
#[derive(Debug, PartialEq)]
struct TreeState {
    /// path, type, mode, uid, gid, size, links, symlink target, mtime
    entries: Vec<String>,
    /// sha256 of every regular file
    sums: Vec<String>,
    /// getfattr dump of every non-symlink, in path order
    xattrs: String,
    /// groups of paths sharing an inode
    hardlinks: Vec<Vec<String>>,
    /// allocated 512-byte blocks per regular file
    blocks: BTreeMap<String, u64>,
}

fn tree_state(root: &Path) -> TreeState {
    let find = |fmt: &str, filter: &[&str]| -> Vec<String> {
        let mut c = cmd("find", ["."]);
        c.args(filter).args(["-printf", fmt]).current_dir(root);
        let out = run(&mut c, LONG_TIMEOUT).ok();
        let mut v: Vec<String> = out
            .split('\0')
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        v.sort();
        v
    };
    let entries = find("%P\\t%y\\t%m\\t%U\\t%G\\t%s\\t%n\\t%l\\t%T@\\0", &[]);

    let mut c = cmd(
        "sh",
        [
            "-c",
            "find . -type f -print0 | sort -z | xargs -0 -r sha256sum",
        ],
    );
    c.current_dir(root);
    let sums: Vec<String> = run(&mut c, LONG_TIMEOUT)
        .ok()
        .lines()
        .map(str::to_string)
        .collect();

    let mut c = cmd(
        "sh",
        [
            "-c",
            "find . ! -type l -print0 | sort -z | xargs -0 -r getfattr -h -d -m - -e hex",
        ],
    );
    c.current_dir(root);
    let xattrs = run(&mut c, LONG_TIMEOUT).ok();

    let mut by_inode: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for l in find("%i\\t%P\\0", &["!", "-type", "d"]) {
        let (ino, path) = l.split_once('\t').unwrap();
        by_inode
            .entry(ino.to_string())
            .or_default()
            .push(path.to_string());
    }
    let mut hardlinks: Vec<Vec<String>> = by_inode
        .into_values()
        .filter(|g| g.len() > 1)
        .map(|mut g| {
            g.sort();
            g
        })
        .collect();
    hardlinks.sort();

    let blocks = find("%P\\t%b\\0", &["-type", "f"])
        .into_iter()
        .map(|l| {
            let (path, b) = l.split_once('\t').unwrap();
            (path.to_string(), b.parse().unwrap())
        })
        .collect();
    TreeState {
        entries,
        sums,
        xattrs,
        hardlinks,
        blocks,
    }
}

/// Asserts two sorted line lists are equal, showing the first differences.
fn assert_lines_equal(what: &str, before: &[String], after: &[String]) {
    if before == after {
        return;
    }
    let only_before: Vec<&String> = before
        .iter()
        .filter(|l| !after.contains(l))
        .take(10)
        .collect();
    let only_after: Vec<&String> = after
        .iter()
        .filter(|l| !before.contains(l))
        .take(10)
        .collect();
    panic!(
        "{what} changed across the restart ({} lines before, {} after)\n\
         only before (first 10): {only_before:#?}\nonly after (first 10): {only_after:#?}",
        before.len(),
        after.len()
    );
}

fn assert_same_tree(before: &TreeState, after: &TreeState) {
    assert_lines_equal(
        "path/type/mode/uid/gid/size/links/target/mtime",
        &before.entries,
        &after.entries,
    );
    assert_lines_equal("sha256 of files", &before.sums, &after.sums);
    if before.xattrs != after.xattrs {
        let b: Vec<String> = before.xattrs.lines().map(str::to_string).collect();
        let a: Vec<String> = after.xattrs.lines().map(str::to_string).collect();
        assert_lines_equal("xattrs (getfattr -d -m -)", &b, &a);
    }
    assert_eq!(
        before.hardlinks, after.hardlinks,
        "hardlink groups changed across the restart"
    );
    // Sparse files stay sparse: no file takes more blocks than it did.
    for (path, b) in &before.blocks {
        let a = after.blocks[path];
        assert!(
            a <= *b,
            "{path} took {b} blocks before the restart and {a} after (holes filled in?)"
        );
    }
}

#[test]
fn fs_round_trip_keeps_tree_metadata_and_data() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = FsDisk::mount(&["--size", "256M", "--image", p(&img)]);
    build_tree(d.path());
    let before = tree_state(d.path());
    assert!(
        before.entries.len() > 1000 && !before.hardlinks.is_empty(),
        "the tree is smaller than expected: {} entries",
        before.entries.len()
    );
    for want in [
        "user.color",
        "user.bin=0x00ff10",
        "user.empty",
        "trusted.secret",
        "user.big",
    ] {
        assert!(
            before.xattrs.contains(want),
            "xattr {want} missing from the tree before the restart:\n{}",
            before.xattrs
        );
    }
    for kind in ["\tp\t", "\tc\t", "\tl\t", "\td\t", "\tf\t"] {
        assert!(
            before.entries.iter().any(|e| e.contains(kind)),
            "no entry of type {kind:?} in the tree"
        );
    }
    assert!(
        before.blocks["gen/sparse1"] * 512 < MIB,
        "sparse1 is not sparse on the ramd disk to begin with: {:?}",
        before.blocks["gen/sparse1"]
    );
    d.stop();
    verify_ok(&img);
    let info = info_json(&img);
    assert_eq!(info["kind"], "fs", "{info}");

    // Restart with the image alone; everything is back.
    let d = FsDisk::mount(&["--image", p(&img)]);
    assert!(
        d.stderr().contains("loaded image"),
        "no `loaded image` line:\n{}",
        d.stderr()
    );
    assert_eq!(field(&d.status(), "size"), 256 * MIB, "{}", d.status());
    let after = tree_state(d.path());
    assert_same_tree(&before, &after);

    // Change things (an incremental save on top), restart again.
    let script = r#"
set -eu
first=$(ls doc | head -n 1)
rm -r "doc/$first"
mv gen/odd gen/odd-renamed
head -c 5000 /dev/urandom >> gen/data1
setfattr -x user.color gen/data1
setfattr -n user.new -v 1 gen/sub
truncate -s 10M gen/sparse1
rm gen/hard1
head -c 5M /dev/urandom > gen/new
mkdir gen/newdir
ln -s new gen/newdir/link
"#;
    let mut c = cmd("sh", ["-c", script]);
    c.current_dir(d.path());
    run(&mut c, LONG_TIMEOUT).ok();
    let changed = tree_state(d.path());
    let snap = snapshot(d.run_dir(), d.name(), false);
    assert!(field(&snap, "pages") > 0, "{snap}");
    d.stop();
    verify_ok(&img);
    let d = FsDisk::mount(&["--image", p(&img)]);
    let after = tree_state(d.path());
    assert_same_tree(&changed, &after);
    d.stop();
}

/// The META record of segment `seg` (FORMAT.md, *Records*): its variant
/// (0 whole tree, 1 tree delta) and payload length.
fn meta_record(seg: &Path) -> Option<(u8, usize)> {
    let data = fs::read(seg).unwrap();
    let mut at = 64;
    while at + 32 <= data.len() {
        let (ty, sub) = (data[at + 4], data[at + 5]);
        let plen = u32::from_le_bytes(data[at + 8..at + 12].try_into().unwrap()) as usize;
        match ty {
            7 => return Some((sub, plen)),
            0xff => return None,
            _ => at += 32 + plen.next_multiple_of(8),
        }
    }
    panic!("{seg:?}: no END record");
}

/// `sh -c SCRIPT` in `dir`.
fn sh_in(dir: &Path, script: &str) {
    let mut c = cmd("sh", ["-c", &format!("set -eu\n{script}")]);
    c.current_dir(dir);
    run(&mut c, LONG_TIMEOUT).ok();
}

/// A filesystem's tree as [`tree_state`] sees it, and the chattr flags of
/// the files that the changes below set them on.
fn tree_and_flags(root: &Path) -> (TreeState, String) {
    let mut c = cmd(
        "sh",
        [
            "-c",
            "for f in d1/renamed many/f11; do if [ -e $f ]; then lsattr $f; fi; done",
        ],
    );
    c.current_dir(root);
    (tree_state(root), run(&mut c, LONG_TIMEOUT).ok())
}

/// An fs disk's incremental save holds only what changed of its tree (a
/// tree delta, FORMAT.md): in a tree of 10 000 files, rewriting one writes
/// a small part of what the full save's whole tree takes. A chain of such
/// saves (a file created, grown, truncated, renamed across directories,
/// hard-linked, chmod, xattrs set and removed, chattr, unlinked, a
/// directory made and removed) loads as the tree was, and `ramd image
/// restore --at` rebuilds a save in the middle of the chain.
fn fs_saves_hold_tree_deltas(extra: &[&str]) {
    for t in ["lsattr", "chattr", "setfattr", "truncate", "head"] {
        require_tool(t);
    }
    let tmp = scratch();
    let img = tmp.path().join("img");
    let mut args = vec!["--size", "256M", "--image", p(&img)];
    args.extend(extra);
    let d = FsDisk::mount(&args);
    sh_in(
        d.path(),
        "mkdir many\nfor i in $(seq 1 10000); do echo \"file $i\" > many/f$i; done",
    );
    let full = snapshot(d.run_dir(), d.name(), true);
    let seg = |v: &Value| img.join(format!("seg-{:08}", field(v, "seq")));
    let (variant, whole) = meta_record(&seg(&full)).expect("a full save holds the tree");
    assert_eq!(variant, 0, "a full save holds the whole tree");
    assert!(
        whole > 10_000 * 20,
        "a tree of 10 000 files in {whole} bytes?"
    );

    sh_in(d.path(), "echo changed > many/f5000");
    let one = snapshot(d.run_dir(), d.name(), false);
    assert_eq!(one["full"], false, "{one}");
    let (variant, delta) = meta_record(&seg(&one)).expect("every fs save holds its tree");
    assert_eq!(variant, 1, "an incremental save holds a tree delta");
    let bytes = field(&one, "bytes") as usize;
    assert!(
        delta * 100 < whole && bytes * 20 < whole,
        "one file rewritten: a save of {bytes} bytes with a tree delta of {delta}, against a \
         whole tree of {whole}"
    );

    // A chain of changes, a save after each; the state after each kept.
    let steps = [
        "mkdir d1\necho a > d1/a\nln d1/a d1/hard\nln -s a d1/sym",
        "mv d1/a d1/renamed\nmv many/f10 d1/",
        "chmod 0600 d1/renamed\nsetfattr -n user.k -v v d1/renamed\nchattr +d d1/renamed",
        "head -c 300000 /dev/urandom >> many/f11\ntruncate -s 3 many/f12\nrm d1/hard\n\
         mkdir d2\nrmdir d2\nsetfattr -x user.k d1/renamed\nchattr +A many/f11",
        "truncate -s 5 many/f11\nrm many/f13\nchattr -d d1/renamed",
    ];
    let mut states = Vec::new();
    for step in steps {
        sh_in(d.path(), step);
        let r = snapshot(d.run_dir(), d.name(), false);
        assert_eq!(r["full"], false, "{r}");
        assert_eq!(meta_record(&seg(&r)).unwrap().0, 1, "{step}: a delta");
        states.push((field(&r, "seq"), tree_and_flags(d.path())));
    }
    d.stop();
    verify_ok(&img);

    // Loaded: the whole tree and every delta after it.
    let d = FsDisk::mount(&["--image", p(&img)]);
    let (last_seq, (tree, flags)) = states.last().unwrap();
    let (now_tree, now_flags) = tree_and_flags(d.path());
    assert_same_tree(tree, &now_tree);
    assert_eq!(&now_flags, flags, "chattr flags after the load");
    // The load knows the image's tree: a save after it is a delta again.
    sh_in(d.path(), "echo again > many/f1");
    let r = snapshot(d.run_dir(), d.name(), false);
    assert_eq!(r["full"], false, "{r}");
    assert_eq!(
        meta_record(&seg(&r)).unwrap().0,
        1,
        "the first save after a load"
    );
    assert!(field(&r, "seq") > *last_seq);
    d.stop();

    // A save in the middle of the chain: its whole tree and the deltas up
    // to it, not the ones after.
    let (mid_seq, (mid_tree, mid_flags)) = &states[2];
    let to = tmp.path().join("restored");
    ramd(&[
        "image",
        "restore",
        p(&img),
        "--at",
        &mid_seq.to_string(),
        "--to",
        p(&to),
    ])
    .ok();
    verify_ok(&to);
    let d = FsDisk::mount(&["--image", p(&to)]);
    let (got_tree, got_flags) = tree_and_flags(d.path());
    assert_same_tree(mid_tree, &got_tree);
    assert_eq!(&got_flags, mid_flags, "chattr flags of save {mid_seq}");
    d.stop();
}

/// A tree delta with no whole tree before it in the chain is damage: a
/// load and `ramd image verify` refuse the image, naming the segment and
/// the record's offset.
#[test]
fn fs_tree_delta_without_a_whole_tree_is_refused() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = FsDisk::mount(&["--size", "64M", "--image", p(&img)]);
    fs::write(d.join("f"), b"x").unwrap();
    d.stop();
    verify_ok(&img);
    // The full save's whole tree made a delta, its checksum made to match:
    // a record that verifies, in a chain with no tree before it.
    let seg = img.join("seg-00000001");
    let mut data = fs::read(&seg).unwrap();
    let mut at = 64;
    while data[at + 4] != 7 {
        let plen = u32::from_le_bytes(data[at + 8..at + 12].try_into().unwrap()) as usize;
        at += 32 + plen.next_multiple_of(8);
    }
    let plen = u32::from_le_bytes(data[at + 8..at + 12].try_into().unwrap()) as usize;
    data[at + 5] = 1;
    let crc = crc32c(&data[at + 4..at + 32 + plen.next_multiple_of(8)]);
    data[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    fs::write(&seg, &data).unwrap();
    let want = format!("{}: offset {at}: ", seg.display());

    let out = ramd(&["image", "verify", p(&img)]);
    assert_ne!(
        out.status.code(),
        Some(0),
        "verified:\n{}",
        all_output(&out)
    );
    let text = all_output(&out);
    assert!(
        text.contains(&want) && text.contains("no whole tree before it"),
        "{text}"
    );
    let dir = tmp.path().join("mnt");
    fs::create_dir(&dir).unwrap();
    let f = FsDisk::mount_at(&dir, &["--image", p(&img)])
        .err()
        .expect("an image whose chain starts with a tree delta loaded");
    assert!(
        f.stderr.contains(&want) && f.stderr.contains("no whole tree before it"),
        "{}",
        f.stderr
    );
}

#[test]
fn fs_saves_hold_tree_deltas_store_path() {
    fs_saves_hold_tree_deltas(&[]);
}

#[test]
fn fs_saves_hold_tree_deltas_kernel_path() {
    fs_saves_hold_tree_deltas(&["--data-path", "kernel"]);
}

// ---------------------------------------------------------------------------
// 3. Incremental saves hold what changed, and only that

/// A python-libnbd snippet: writes the pages listed in PAGES_FILE (one
/// number a line) with consecutive 4 KiB pieces of DATA_FILE, then flushes.
const WRITE_PAGES: &str = r#"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
pages = [int(x) for x in open(sys.argv[2]).read().split()]
data = open(sys.argv[3], 'rb').read()
assert len(data) == 4096 * len(pages)
for i, p in enumerate(pages):
    h.pwrite(data[i * 4096:(i + 1) * 4096], p * 4096)
h.flush()
h.shutdown()
"#;

#[test]
fn incremental_save_holds_exactly_the_changed_pages() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let reference = tmp.path().join("ref.img");
    let back = tmp.path().join("back.img");
    let total_pages = 64 * MIB / PAGE;

    let mut d = Ramd::start(&["--size", "64M", "--image", p(&img), "--name", "inc"]);
    random_file(&reference, 64 * MIB);
    nbdcopy(&[p(&reference), d.uri()]);
    let full = snapshot(d.run_dir(), "inc", true);
    assert_eq!(field(&full, "pages"), total_pages, "full save: {full}");
    assert!(
        field(&full, "bytes") >= 64 * MIB,
        "a full save of 64 MiB of random data wrote fewer bytes: {full}"
    );
    assert_eq!(
        Path::new(full["path"].as_str().unwrap()),
        img.as_path(),
        "{full}"
    );

    // Change 1% of the pages: 164 distinct pages, random data.
    let mut rng = Rng::new(164);
    let mut chosen = std::collections::BTreeSet::new();
    while chosen.len() < 164 {
        chosen.insert(rng.below(total_pages));
    }
    let mut data = vec![0u8; chosen.len() * PAGE as usize];
    rng.fill(&mut data);
    let list: String = chosen.iter().map(|p| format!("{p}\n")).collect();
    let pages_file = tmp.path().join("pages");
    let data_file = tmp.path().join("data");
    write_file(&pages_file, list.as_bytes());
    write_file(&data_file, &data);
    let mut c = Command::new(python_nbd());
    c.args(["-c", WRITE_PAGES, d.uri(), p(&pages_file), p(&data_file)]);
    run(&mut c, LONG_TIMEOUT).ok();
    let f = fs::OpenOptions::new().write(true).open(&reference).unwrap();
    for (i, pg) in chosen.iter().enumerate() {
        f.write_all_at(&data[i * PAGE as usize..(i + 1) * PAGE as usize], pg * PAGE)
            .unwrap();
    }
    drop(f);

    let inc = snapshot(d.run_dir(), "inc", false);
    assert_eq!(
        field(&inc, "pages"),
        164,
        "incremental save after changing 164 pages: {inc}"
    );
    assert!(
        field(&inc, "bytes") * 100 < field(&full, "bytes") * 3,
        "incremental save of 1% of the pages wrote {} bytes, full save {}: {inc}",
        field(&inc, "bytes"),
        field(&full, "bytes")
    );
    assert!(field(&inc, "seq") > field(&full, "seq"), "{full}\n{inc}");
    assert_eq!(inc["full"], false, "{inc}");

    let s = d.stats();
    assert_eq!(s["image"].as_str(), Some(p(&img)), "{s}");
    assert_eq!(s["flush"], "ignore", "{s}");
    assert!(s["autosave_secs"].is_null(), "{s}");
    assert!(field(&s, "saves") >= 2, "{s}");
    assert!(s["last_save_error"].is_null(), "{s}");
    let last = &s["last_save"];
    assert_eq!(field(last, "seq"), field(&inc, "seq"), "{s}");
    assert_eq!(last["full"], false, "{s}");
    assert_eq!(field(last, "pages"), 164, "{s}");
    assert_eq!(field(last, "bytes"), field(&inc, "bytes"), "{s}");
    field(last, "unix_time");

    // Nothing changed since: an empty incremental save; the plain output is
    // one line naming the disk.
    let none = snapshot(d.run_dir(), "inc", false);
    assert_eq!(field(&none, "pages"), 0, "{none}");
    let line = ramd_cmd(d.run_dir(), &["snapshot", "inc"]).ok();
    assert_eq!(line.lines().count(), 1, "{line}");
    assert!(line.starts_with("inc: saved"), "{line}");
    let table = ramd_cmd(d.run_dir(), &["status"]).ok();
    assert!(table.contains("SAVED"), "no SAVED column:\n{table}");

    d.stop();
    verify_ok(&img);
    let saves = info_saves(&info_json(&img));
    let seqs: Vec<u64> = saves.iter().map(|s| field(s, "seq")).collect();
    assert!(
        seqs.contains(&field(&full, "seq")) && seqs.contains(&field(&inc, "seq")),
        "image chain {seqs:?} lacks the full save {} or the incremental {}",
        field(&full, "seq"),
        field(&inc, "seq")
    );

    let d = Ramd::start(&["--image", p(&img), "--name", "inc"]);
    nbdcopy(&[d.uri(), p(&back)]);
    assert_same_file(&reference, &back);
}

#[test]
fn snapshot_json_has_every_key() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = Ramd::start(&["--size", "16M", "--image", p(&img), "--name", "keys"]);
    io(d.uri(), &["write-random", "0", "1M", "k"]);
    for full in [true, false] {
        let mut args = vec!["snapshot", "keys", "--json"];
        if full {
            args.push("--full");
        }
        let out = ramd_cmd(d.run_dir(), &args).ok();
        assert_eq!(out.trim().lines().count(), 1, "not one line: {out}");
        let v: Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(
            v["name"], "keys",
            "snapshot JSON lacks the disk's name: {v}"
        );
        for k in ["seq", "pages", "bytes"] {
            field(&v, k);
        }
        assert_eq!(v["full"].as_bool(), Some(full), "{v}");
        assert!(v["seconds"].is_number(), "snapshot JSON lacks seconds: {v}");
        assert_eq!(v["path"].as_str(), Some(p(&img)), "{v}");
    }
}

// ---------------------------------------------------------------------------
// 4. Crashes during a save

/// A `size` MiB image of content A (random, seeded) saved by a clean stop;
/// returns A as a file.
fn image_with_content(img: &Path, dir: &Path, size_mib: u64, seed: u64) -> PathBuf {
    let a = dir.join(format!("state-{seed}.img"));
    let mut buf = vec![0u8; (size_mib * MIB) as usize];
    Rng::new(seed).fill(&mut buf);
    write_file(&a, &buf);
    let mut d = Ramd::start(&["--size", &format!("{size_mib}M"), "--image", p(img)]);
    nbdcopy(&[p(&a), d.uri()]);
    d.stop();
    verify_ok(img);
    a
}

/// Reads the whole disk out and returns which of `states` it equals
/// exactly (panics if none).
fn which_state(uri: &str, dir: &Path, states: &[(&str, &Path)]) -> String {
    let back = dir.join("back.img");
    let _ = fs::remove_file(&back);
    nbdcopy(&[uri, p(&back)]);
    let got = fs::read(&back).unwrap();
    for (name, f) in states {
        if fs::read(f).unwrap() == got {
            return name.to_string();
        }
    }
    // Say how it is mixed.
    let page = PAGE as usize;
    let mut report = String::new();
    for (name, f) in states {
        let want = fs::read(f).unwrap();
        let same = got
            .chunks(page)
            .zip(want.chunks(page))
            .filter(|(a, b)| a == b)
            .count();
        report.push_str(&format!(
            "{same} of {} pages equal {name}; ",
            got.len() / page
        ));
    }
    panic!("the loaded disk is none of the known states: {report}");
}

fn crash_during_save(point: &str, expect: &str) {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let a = image_with_content(&img, tmp.path(), 32, 1);
    // B: other random data everywhere, zeros in [8M, 12M).
    let b = tmp.path().join("b.img");
    let mut buf = vec![0u8; (32 * MIB) as usize];
    Rng::new(2).fill(&mut buf);
    buf[(8 * MIB) as usize..(12 * MIB) as usize].fill(0);
    write_file(&b, &buf);
    drop(buf);

    let next = latest_seq(&img) + 1;
    let run_dir = scratch();
    let mut d = Ramd::try_start_in_with(
        run_dir.path(),
        &["--image", p(&img)],
        &[("RAMD_TEST_CRASH", point)],
        None,
    )
    .unwrap_or_else(|(s, e)| panic!("ramd with RAMD_TEST_CRASH={point} did not start ({s}):\n{e}"));
    assert_eq!(
        which_state(d.uri(), tmp.path(), &[("A", &a), ("B", &b)]),
        "A",
        "the image did not load A"
    );
    nbdcopy(&[p(&b), d.uri()]);
    let snap = ramd_cmd(run_dir.path(), &["snapshot", "ram0"]);
    let status = d.wait_exit(STOP_DEADLINE);
    assert_sigkilled(status, &format!("RAMD_TEST_CRASH={point}"), &d.stderr());
    assert!(
        !snap.success(),
        "ramd snapshot succeeded though the daemon died at {point}: {snap:?}"
    );
    assert!(
        snap.stderr.contains("ramd: error"),
        "ramd snapshot failed without a `ramd: error:` message: {snap:?}"
    );
    let files_after_crash = listing(&img);
    // The hook fired where it says (FORMAT.md, "How a save becomes visible").
    let seg = img.join(format!("seg-{next:08}"));
    let seg_tmp = img.join(format!("seg-{next:08}.tmp"));
    let manifest_tmp = img.join("MANIFEST.tmp");
    let committed = fs::read_to_string(img.join("MANIFEST"))
        .unwrap()
        .lines()
        .any(|l| l.starts_with(&format!("seg {next} ")));
    let (want_seg_tmp, want_seg, want_manifest_tmp, want_committed) = match point {
        "segment-renamed" => (false, true, false, false),
        "manifest-written" => (false, true, true, false),
        "manifest-renamed" => (false, true, false, true),
        _ => (true, false, false, false),
    };
    assert_eq!(
        (
            seg_tmp.exists(),
            seg.exists(),
            manifest_tmp.exists(),
            committed
        ),
        (want_seg_tmp, want_seg, want_manifest_tmp, want_committed),
        "after a crash at {point}: (seg-{next:08}.tmp, seg-{next:08}, MANIFEST.tmp, \
         MANIFEST names seg {next}) are not as expected; image:\n{files_after_crash}"
    );

    verify_ok(&img);
    let d = Ramd::start(&["--image", p(&img)]);
    let got = which_state(d.uri(), tmp.path(), &[("A", &a), ("B", &b)]);
    assert_eq!(
        got, expect,
        "after a crash at {point} the image loaded {got}, expected {expect}; \
         image after the crash:\n{files_after_crash}"
    );
    assert!(
        tmp_files(&img).is_empty(),
        "leftover *.tmp files not removed at start: {:?}",
        tmp_files(&img)
    );
    // The image goes on working: saved again at stop, loads the same.
    let mut d = d;
    d.stop();
    verify_ok(&img);
    let d = Ramd::start(&["--image", p(&img)]);
    assert_eq!(
        which_state(d.uri(), tmp.path(), &[("A", &a), ("B", &b)]),
        expect
    );
}

#[test]
fn crash_after_1_page_record_keeps_the_old_image() {
    crash_during_save("pages:1", "A");
}

#[test]
fn crash_after_100_page_records_keeps_the_old_image() {
    crash_during_save("pages:100", "A");
}

#[test]
fn crash_after_segment_synced_keeps_the_old_image() {
    crash_during_save("segment-synced", "A");
}

#[test]
fn crash_after_segment_renamed_keeps_the_old_image() {
    crash_during_save("segment-renamed", "A");
}

#[test]
fn crash_after_manifest_written_keeps_the_old_image() {
    crash_during_save("manifest-written", "A");
}

#[test]
fn crash_after_manifest_renamed_has_the_new_image() {
    crash_during_save("manifest-renamed", "B");
}

/// Writer of self-describing pages: page P of generation G is
/// `RAMDPG01, P, G, check` then a 32-byte block from (P, G) 127 times.
/// Writes 16 pages per request, in order from START, wrapping; with MARKER
/// `-` it writes every page once and stops, else it creates MARKER after
/// 256 requests (4 MiB) and goes on until killed.
const PAGE_WRITER: &str = r#"
import nbd, struct, sys
uri, gen, start, marker = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
h = nbd.NBD()
h.connect_uri(uri)
n = h.get_size() // 4096
M = (1 << 64) - 1
def page(p, g):
    blk = struct.pack('<4Q', (p * 0x9E3779B97F4A7C15) & M, (g * 0xC2B2AE3D27D4EB4F) & M,
                      ((p << 20) ^ g) & M, 0xA5A5A5A5A5A5A5A5 ^ p)
    return b'RAMDPG01' + struct.pack('<3Q', p, g, ((p * 7 + g * 13) ^ 0xDEAD) & M) + blk * 127
i = 0
while True:
    p0 = (start + 16 * i) % n
    h.pwrite(b''.join(page(p0 + k, gen) for k in range(16)), p0 * 4096)
    i += 1
    if marker == '-':
        if 16 * i >= n:
            break
    elif i == 256:
        open(marker, 'w').close()
h.flush()
h.shutdown()
"#;

fn race_page(pg: u64, g: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(PAGE as usize);
    v.extend_from_slice(b"RAMDPG01");
    for x in [
        pg,
        g,
        (pg.wrapping_mul(7).wrapping_add(g.wrapping_mul(13))) ^ 0xDEAD,
    ] {
        v.extend_from_slice(&x.to_le_bytes());
    }
    let mut blk = Vec::with_capacity(32);
    for x in [
        pg.wrapping_mul(0x9E37_79B9_7F4A_7C15),
        g.wrapping_mul(0xC2B2_AE3D_27D4_EB4F),
        (pg << 20) ^ g,
        0xA5A5_A5A5_A5A5_A5A5 ^ pg,
    ] {
        blk.extend_from_slice(&x.to_le_bytes());
    }
    for _ in 0..127 {
        v.extend_from_slice(&blk);
    }
    v
}

/// The generation of every page of a disk image written by PAGE_WRITER;
/// panics on a page that is not exactly one page of one generation.
fn page_generations(data: &[u8]) -> Vec<u64> {
    data.chunks(PAGE as usize)
        .enumerate()
        .map(|(i, pg)| {
            let i = i as u64;
            let g = u64::from_le_bytes(pg[16..24].try_into().unwrap());
            assert!(
                &pg[..8] == b"RAMDPG01"
                    && u64::from_le_bytes(pg[8..16].try_into().unwrap()) == i
                    && pg == race_page(i, g).as_slice(),
                "page {i} is not a whole page of any generation (torn or misplaced); \
                 it starts with {:02x?}",
                &pg[..32]
            );
            g
        })
        .collect()
}

#[test]
fn sigkill_at_random_moments_of_a_save_under_writes() {
    let seed = std::env::var("RAMD_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("race seed: {seed} (rerun with RAMD_TEST_SEED={seed})");
    eprintln!("race seed: {seed} (rerun with RAMD_TEST_SEED={seed})");
    let mut rng = Rng::new(seed);
    let tmp = scratch();
    let img = tmp.path().join("img");
    let back = tmp.path().join("back.img");
    let n = 128 * MIB / PAGE;
    let writer = |uri: &str, g: u64, start: u64, marker: &str| {
        let mut c = Command::new(python_nbd());
        c.args([
            "-c",
            PAGE_WRITER,
            uri,
            &g.to_string(),
            &start.to_string(),
            marker,
        ]);
        c
    };

    // Generation 0 everywhere, saved by a clean stop.
    let mut d = Ramd::start(&["--size", "128M", "--image", p(&img)]);
    run(&mut writer(d.uri(), 0, 0, "-"), LONG_TIMEOUT).ok();
    d.stop();
    verify_ok(&img);
    let mut base = vec![0u64; n as usize];
    let mut prev_seq = latest_seq(&img);

    let mut d = Ramd::start(&["--image", p(&img)]);
    for round in 1..=10u64 {
        let start = rng.below(n / 16) * 16;
        let delay = Duration::from_millis(2 + rng.below(299));
        let marker = tmp.path().join(format!("marker-{round}"));
        let mut w = Background::spawn(&mut writer(d.uri(), round, start, p(&marker)));
        wait_until(CMD_TIMEOUT, "the writer's first 4 MiB", || {
            w.assert_running();
            marker.exists()
        });
        let mut snap_cmd = cmd(ramd_bin(), ["--run-dir"]);
        snap_cmd
            .arg(d.run_dir())
            .args(["snapshot", d.name(), "--json"]);
        let snap = std::thread::spawn(move || run(&mut snap_cmd, CMD_TIMEOUT));
        // The injected moment of the crash: a random delay after the
        // snapshot began (this is the point of the test, not a wait).
        std::thread::sleep(delay);
        let status = d.stop_with(libc::SIGKILL);
        assert_sigkilled(status, "ramd", &d.stderr());
        let snap = snap.join().unwrap();
        drop(w);

        verify_ok(&img);
        let seq = latest_seq(&img);
        let committed = seq > prev_seq;
        let snap_seq = if snap.success() {
            let v: Value = serde_json::from_str(snap.stdout.trim())
                .unwrap_or_else(|e| panic!("snapshot JSON ({e}): {}", snap.stdout));
            Some(field(&v, "seq"))
        } else {
            None
        };
        println!(
            "round {round}: kill after {delay:?}, snapshot {}, image seq {prev_seq} -> {seq}",
            if snap_seq.is_some() {
                "answered"
            } else {
                "failed"
            }
        );
        if let Some(s) = snap_seq {
            assert_eq!(
                seq, s,
                "round {round} (seed {seed}): the snapshot answered seq {s} but the image's newest save is {seq}"
            );
        }

        d = Ramd::start(&["--image", p(&img)]);
        let _ = fs::remove_file(&back);
        nbdcopy(&[d.uri(), p(&back)]);
        let state = page_generations(&fs::read(&back).unwrap());
        for (i, (&g, &b)) in state.iter().zip(&base).enumerate() {
            assert!(
                g == b || g == round,
                "round {round} (seed {seed}): page {i} has generation {g}, \
                 neither the saved {b} nor the current {round}"
            );
        }
        let new = state.iter().filter(|&&g| g == round).count() as u64;
        if committed {
            // One state the disk was in: the writer's pages from START on,
            // in order, up to some point; including the 4 MiB written
            // before the snapshot began.
            assert!(
                new >= 4096,
                "round {round} (seed {seed}): the committed save misses writes done before it began \
                 ({new} pages of generation {round})"
            );
            for k in 0..new {
                let i = ((start + k) % n) as usize;
                assert_eq!(
                    state[i], round,
                    "round {round} (seed {seed}): the saved generation-{round} pages are not one \
                     run from page {start}: page {i} is missing ({new} pages new)"
                );
            }
        } else {
            assert_eq!(
                new, 0,
                "round {round} (seed {seed}): no save committed, yet {new} pages of generation {round} were loaded"
            );
        }
        base = state;
        prev_seq = seq;
    }
    d.stop();
    verify_ok(&img);
}

// ---------------------------------------------------------------------------
// 5. Damaged images are refused, naming the file and the offset

/// A 16 MiB block image with two saves: a full one, and an incremental one
/// (written at stop). `tag` names the data's seeds (`TAG1`, `TAG2`).
fn damage_base(tmp: &Path, tag: &str) -> PathBuf {
    let img = tmp.join("img");
    let (s1, s2) = (format!("{tag}1"), format!("{tag}2"));
    let mut d = Ramd::start(&["--size", "16M", "--image", p(&img), "--name", "dmg"]);
    io(
        d.uri(),
        &[
            "write-random",
            "0",
            "8M",
            &s1,
            ",", //
            "write-byte",
            "8M",
            "1M",
            "0x77",
        ],
    );
    snapshot(d.run_dir(), "dmg", true);
    io(d.uri(), &["write-random", "12M", "2M", &s2]);
    d.stop();
    verify_ok(&img);
    assert_eq!(segments(&img).len(), 2, "{}", listing(&img));
    img
}

/// A fresh copy of `img` to damage.
fn copy_image(img: &Path, to: &Path) -> PathBuf {
    let dst = to.join("damaged");
    run(cmd("cp", ["-a"]).arg(img).arg(&dst), CMD_TIMEOUT).ok();
    dst
}

/// What a damage case did, and what the refusal must say.
struct Damage {
    /// The file changed (its contents are checked to be left alone).
    file: String,
    /// Names any of which the messages may use for it (`file` if empty).
    names: Vec<String>,
    /// Whether the messages must give a byte offset.
    offset: bool,
    /// More text both messages must hold (e.g. "page 12").
    also: Vec<String>,
}

impl Damage {
    fn of(file: String, offset: bool) -> Damage {
        Damage {
            file,
            names: Vec::new(),
            offset,
            also: Vec::new(),
        }
    }
}

/// Serving the damaged image fails with exit 1 and `ramd: error:` naming
/// the file (and an offset when asked); verify exits 1 naming it; neither
/// changes the damaged file.
fn assert_refused(img: &Path, dmg: &Damage) {
    let file = &dmg.file;
    let names = if dmg.names.is_empty() {
        vec![file.clone()]
    } else {
        dmg.names.clone()
    };
    let names_one = |text: &str| names.iter().any(|n| text.contains(n.as_str()));
    let damaged = img.join(file);
    let before = fs::read(&damaged).ok();
    let (code, stderr) = serve_refused(&["--image", p(img)]);
    assert_eq!(
        code,
        Some(1),
        "serving an image with a damaged {file}: exit {code:?}, expected 1; stderr:\n{stderr}"
    );
    // Both `serve` and `image verify` must name the damage.
    let names_damage = |who: &str, text: &str| {
        assert!(names_one(text), "{who} does not name {names:?}:\n{text}");
        if dmg.offset {
            assert!(
                text.contains("offset"),
                "{who} does not give the offset in {file}:\n{text}"
            );
        }
        for t in &dmg.also {
            assert!(
                text.contains(t.as_str()),
                "{who} does not say {t:?}:\n{text}"
            );
        }
    };
    assert!(stderr.contains("ramd: error"), "no error line:\n{stderr}");
    names_damage("the refusal", &stderr);
    let out = ramd(&["image", "verify", p(img)]);
    let text = all_output(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "ramd image verify of an image with a damaged {file}: {}\n{text}",
        out.status
    );
    names_damage("ramd image verify", &text);
    assert_eq!(
        fs::read(&damaged).ok(),
        before,
        "refusing the image changed the damaged {file}"
    );
}

fn truncate_by(f: &Path, n: u64) {
    let file = fs::OpenOptions::new().write(true).open(f).unwrap();
    let len = file.metadata().unwrap().len();
    file.set_len(len - n).unwrap();
}

fn append_byte(f: &Path) {
    let mut file = fs::OpenOptions::new().append(true).open(f).unwrap();
    std::io::Write::write_all(&mut file, &[0]).unwrap();
}

/// Runs one damage case on a fresh copy of a fresh base image.
fn damage_case(damage: impl FnOnce(&Path) -> Damage) {
    let tmp = scratch();
    let img = damage_base(tmp.path(), "c");
    let copy = copy_image(&img, tmp.path());
    let dmg = damage(&copy);
    assert_refused(&copy, &dmg);
    // The original, untouched, still serves.
    verify_ok(&img);
    let d = Ramd::start(&["--image", p(&img)]);
    io(
        d.uri(),
        &[
            "verify-random",
            "0",
            "8M",
            "c1",
            ",", //
            "verify-byte",
            "8M",
            "1M",
            "0x77",
            ",", //
            "verify-random",
            "12M",
            "2M",
            "c2",
        ],
    );
}

#[test]
fn damaged_empty_manifest() {
    damage_case(|img| {
        fs::write(img.join("MANIFEST"), b"").unwrap();
        Damage::of("MANIFEST".into(), true)
    });
}

#[test]
fn damaged_manifest_flipped_byte() {
    damage_case(|img| {
        let f = img.join("MANIFEST");
        flip_byte(&f, fs::metadata(&f).unwrap().len() / 2);
        Damage::of("MANIFEST".into(), true)
    });
}

#[test]
fn damaged_manifest_truncated() {
    damage_case(|img| {
        truncate_by(&img.join("MANIFEST"), 1);
        Damage::of("MANIFEST".into(), true)
    });
}

#[test]
fn damaged_segment_truncated_by_one_byte() {
    damage_case(|img| {
        let seg = segments(img).pop().unwrap();
        truncate_by(&seg, 1);
        Damage::of(file_name(&seg), true)
    });
}

#[test]
fn damaged_full_segment_truncated_by_one_byte() {
    damage_case(|img| {
        let seg = segments(img).remove(0);
        truncate_by(&seg, 1);
        Damage::of(file_name(&seg), true)
    });
}

#[test]
fn damaged_segment_appended_byte() {
    damage_case(|img| {
        let seg = segments(img).pop().unwrap();
        append_byte(&seg);
        Damage::of(file_name(&seg), true)
    });
}

#[test]
fn damaged_segment_flipped_middle_byte() {
    damage_case(|img| {
        let seg = segments(img).remove(0);
        flip_byte(&seg, fs::metadata(&seg).unwrap().len() / 2);
        Damage::of(file_name(&seg), true)
    });
}

#[test]
fn damaged_incremental_segment_flipped_middle_byte() {
    damage_case(|img| {
        let seg = segments(img).pop().unwrap();
        flip_byte(&seg, fs::metadata(&seg).unwrap().len() / 2);
        Damage::of(file_name(&seg), true)
    });
}

#[test]
fn damaged_segment_replaced_by_a_foreign_file() {
    damage_case(|img| {
        let seg = segments(img).remove(0);
        let len = fs::metadata(&seg).unwrap().len();
        let mut junk = vec![0u8; len as usize];
        Rng::new(99).fill(&mut junk);
        fs::write(&seg, &junk).unwrap();
        Damage::of(file_name(&seg), true)
    });
}

#[test]
fn damaged_segment_replaced_by_one_of_another_image() {
    // A well-formed segment of the same name from another image: only the
    // MANIFEST's record of its segments can tell.
    let other = scratch();
    let other_img = damage_base(other.path(), "other");
    let other_segs = segments(&other_img);
    damage_case(move |img| {
        let segs = segments(img);
        let (mine, theirs) = (&segs[1], &other_segs[1]);
        assert_eq!(file_name(mine), file_name(theirs), "seq numbers differ");
        // Same size too (same pages changed, other data): only what the
        // MANIFEST records of the segment can tell them apart.
        fs::copy(theirs, mine).unwrap();
        Damage::of(file_name(mine), false)
    });
}

#[test]
fn damaged_missing_segment() {
    damage_case(|img| {
        let seg = segments(img).remove(0);
        fs::remove_file(&seg).unwrap();
        Damage::of(file_name(&seg), false)
    });
}

// ---------------------------------------------------------------------------
// 6. The filesystem under the image fills up

#[test]
fn save_on_a_full_filesystem_fails_and_the_last_image_stays_good() {
    for t in ["mkfs.ext4", "losetup", "mount", "umount", "truncate"] {
        require_tool(t);
    }
    let tmp = scratch();
    let backing = tmp.path().join("tiny.ext4");
    run_ok(cmd("truncate", ["-s", "16M"]).arg(&backing));
    let lo = Loop::attach(&backing);
    run(&mut cmd("mkfs.ext4", ["-F", "-q", lo.dev()]), LONG_TIMEOUT).ok();
    let m = Mount::on(lo.dev(), &tmp.path().join("tiny"));
    let img = m.path().join("img");

    let mut d = Ramd::start(&["--size", "64M", "--image", p(&img), "--name", "tiny"]);
    io(d.uri(), &["write-random", "0", "8M", "a"]);
    let good = snapshot(d.run_dir(), "tiny", false);
    let good_seq = field(&good, "seq");

    // 60 MiB of changes cannot fit in what is left of 16 MiB.
    io(d.uri(), &["write-random", "4M", "60M", "fill"]);
    let out = ramd_cmd(d.run_dir(), &["snapshot", "tiny"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "snapshot onto a full filesystem: {out:?}"
    );
    assert!(
        out.stderr.contains("ramd: error") && out.stderr.contains("No space left"),
        "the failed snapshot does not say why: {out:?}"
    );
    // Said once, not once more for every error in the chain.
    assert_eq!(
        out.stderr.matches("No space left").count(),
        1,
        "{}",
        out.stderr
    );
    let s = d.stats();
    assert_eq!(
        field(&s["last_save"], "seq"),
        good_seq,
        "last_save is not the last good save: {s}"
    );
    let err = s["last_save_error"]
        .as_str()
        .unwrap_or_else(|| panic!("last_save_error not set after a failed save: {s}"));
    assert_eq!(err.matches("No space left").count(), 1, "{s}");
    assert!(
        ramd_cmd(d.run_dir(), &["status"]).ok().contains("SAVED"),
        "no SAVED column"
    );

    // The disk goes on serving, the data written is all there.
    let back = tmp.path().join("back.img");
    nbdcopy(&[d.uri(), p(&back)]);
    assert_eq!(fs::metadata(&back).unwrap().len(), 64 * MIB);
    io(
        d.uri(),
        &[
            "verify-random",
            "0",
            "4M",
            "a",
            ",", //
            "verify-random",
            "4M",
            "60M",
            "fill",
            ",", //
            "write-random",
            "0",
            "1M",
            "w",
            ",", //
            "verify-random",
            "0",
            "1M",
            "w",
        ],
    );

    // The stop's own save fails too: the disk is not stopped (nothing is
    // lost), and says why; only `ramd down --force` gives its data up, and
    // says what that loses.
    let pid = d.pid();
    // SAFETY: kill(2) to our own child.
    unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    wait_until(STOP_DEADLINE, "the refused stop in status", || {
        d.stats()["blocked"]
            .as_str()
            .is_some_and(|b| b.contains("NOT STOPPED") && b.contains("No space left"))
    });
    io(d.uri(), &["verify-random", "0", "1M", "w"]);
    let out = ramd_cmd(d.run_dir(), &["down", "--force", "tiny"]).failed();
    assert!(
        out.stderr.contains("WITHOUT saving") && out.stderr.contains(&format!("save {good_seq}")),
        "{out:?}"
    );
    for line in d.stderr().lines() {
        assert!(line.matches("No space left").count() <= 1, "{line}");
    }
    let status = d.wait_exit(STOP_DEADLINE);
    assert_eq!(status.code(), Some(1), "stderr:\n{}", d.stderr());

    // The last good image loads: the 8 MiB of the first save, zeros after.
    verify_ok(&img);
    let d = Ramd::start(&["--image", p(&img), "--name", "tiny"]);
    io(
        d.uri(),
        &[
            "verify-random",
            "0",
            "8M",
            "a",
            ",", //
            "verify-byte",
            "8M",
            "56M",
            "0x00",
        ],
    );
    assert!(
        tmp_files(&img).is_empty(),
        "leftover *.tmp files not removed at start: {:?}",
        tmp_files(&img)
    );
}

// ---------------------------------------------------------------------------
// 7. --flush persist: what a client flushed survives SIGKILL

/// python-libnbd: a 64 KiB FUA write (bytes 0..=255 repeated) at OFFSET, or
/// with `check`, reads it back and compares.
const FUA_WRITE: &str = r#"
import nbd, sys
h = nbd.NBD()
h.connect_uri(sys.argv[1])
off = int(sys.argv[2])
data = bytes(range(256)) * 256
if sys.argv[3] == 'write':
    h.pwrite(data, off, nbd.CMD_FLAG_FUA)
else:
    assert h.pread(len(data), off) == data, 'FUA-written data lost'
h.shutdown()
"#;

fn fua(uri: &str, off: u64, what: &str) {
    let mut c = Command::new(python_nbd());
    c.args(["-c", FUA_WRITE, uri, &off.to_string(), what]);
    run(&mut c, CMD_TIMEOUT).ok();
}

#[test]
fn flush_persist_block_data_survives_sigkill() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let mut d = Ramd::start(&["--size", "16M", "--image", p(&img), "--flush", "persist"]);
    assert_eq!(d.stats()["flush"], "persist", "{}", d.stats());
    qemu_io(
        d.uri(),
        &["write -P 0x5a 0 1M".to_string(), "flush".to_string()],
    );
    io(d.uri(), &["write-random", "1M", "2M", "fl", ",", "flush"]);
    fua(d.uri(), 4 * MIB, "write");
    let status = d.stop_with(libc::SIGKILL);
    assert_sigkilled(status, "ramd", &d.stderr());

    verify_ok(&img);
    let d = Ramd::start(&["--image", p(&img), "--flush", "persist"]);
    qemu_io(d.uri(), &["read -P 0x5a 0 1M".to_string()]);
    io(d.uri(), &["verify-random", "1M", "2M", "fl"]);
    fua(d.uri(), 4 * MIB, "check");
}

#[test]
fn flush_persist_fs_fsynced_file_survives_sigkill() {
    require_tool("dd");
    let tmp = scratch();
    let img = tmp.path().join("img");
    let src = tmp.path().join("src");
    random_file(&src, 3 * MIB + 123);
    let want = sha256(&src);

    let mut d = FsDisk::mount(&["--size", "64M", "--image", p(&img), "--flush", "persist"]);
    assert_eq!(d.status()["flush"], "persist", "{}", d.status());
    fs::create_dir(d.join("dir")).unwrap();
    let dst = d.join("dir/file");
    run(
        &mut cmd(
            "dd",
            [
                format!("if={}", src.display()),
                format!("of={}", dst.display()),
                "bs=1M".into(),
                "conv=fsync".into(),
                "status=none".into(),
            ],
        ),
        LONG_TIMEOUT,
    )
    .ok();
    d.kill();

    verify_ok(&img);
    let d = FsDisk::mount(&["--image", p(&img), "--flush", "persist"]);
    let f = d.join("dir/file");
    assert!(f.exists(), "the fsynced file is gone after SIGKILL");
    assert_eq!(sha256(&f), want, "the fsynced file's data changed");
    d.stop();
}

// ---------------------------------------------------------------------------
// 8. Image files are private

fn assert_private(img: &Path, dir_mode: Option<u32>) {
    if let Some(want) = dir_mode {
        let mode = fs::metadata(img).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, want, "image directory {img:?} has mode {mode:o}");
    }
    let files = files_in(img);
    assert!(!files.is_empty(), "no files in {img:?}");
    for f in files {
        let meta = fs::symlink_metadata(&f).unwrap();
        let mode = meta.mode() & 0o7777;
        assert_eq!(mode, 0o600, "{f:?} has mode {mode:o}");
    }
}

#[test]
fn image_files_are_0600_and_a_created_directory_0700() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let run_dir = scratch();
    // umask 0, so only ramd's own choice of modes counts.
    let mut d = Ramd::try_start_in_with(
        run_dir.path(),
        &["--size", "32M", "--image", p(&img), "--autosave", "1s"],
        &[],
        Some(0),
    )
    .unwrap_or_else(|(s, e)| panic!("ramd did not start ({s}):\n{e}"));
    assert_eq!(
        d.stats()["autosave_secs"].as_f64(),
        Some(1.0),
        "{}",
        d.stats()
    );
    io(d.uri(), &["write-random", "0", "4M", "m1"]);
    let mut first = 0;
    wait_until(Duration::from_secs(60), "an autosave", || {
        let s = d.stats();
        first = s["last_save"]["seq"].as_u64().unwrap_or(0);
        first > 0
    });
    io(d.uri(), &["write-random", "4M", "4M", "m2"]);
    wait_until(Duration::from_secs(60), "a second autosave", || {
        d.stats()["last_save"]["seq"].as_u64().unwrap_or(0) > first
    });
    assert_private(&img, Some(0o700));
    snapshot(d.run_dir(), "ram0", true);
    io(d.uri(), &["write-random", "8M", "4M", "m3"]);
    d.stop();
    assert_private(&img, Some(0o700));
    let d = Ramd::start(&["--image", p(&img)]);
    io(
        d.uri(),
        &[
            "verify-random",
            "0",
            "4M",
            "m1",
            ",", //
            "verify-random",
            "4M",
            "4M",
            "m2",
            ",", //
            "verify-random",
            "8M",
            "4M",
            "m3",
        ],
    );

    // A directory that exists already keeps its mode; the files are 0600.
    let img2 = tmp.path().join("img2");
    fs::create_dir(&img2).unwrap();
    fs::set_permissions(&img2, fs::Permissions::from_mode(0o755)).unwrap();
    let d2 = FsDisk::mount(&["--size", "16M", "--image", p(&img2)]);
    fs::write(d2.join("f"), b"private").unwrap();
    d2.stop();
    assert_private(&img2, None);
}

// ---------------------------------------------------------------------------
// 9. Bad input

#[test]
fn autosave_without_image_is_refused() {
    let (code, err) = serve_refused(&["--size", "16M", "--autosave", "30s"]);
    assert!(matches!(code, Some(1 | 2)), "exit {code:?}: {err}");
    assert!(
        err.contains("--autosave") && err.contains("--image"),
        "the refusal does not name --autosave and --image:\n{err}"
    );
}

#[test]
fn flush_persist_without_image_is_refused() {
    let (code, err) = serve_refused(&["--size", "16M", "--flush", "persist"]);
    assert!(matches!(code, Some(1 | 2)), "exit {code:?}: {err}");
    assert!(
        err.contains("--flush") && err.contains("--image"),
        "the refusal does not name --flush and --image:\n{err}"
    );
}

/// `--image DIR` on a directory of someone's files is refused before
/// anything is written there, naming the directory and what is in it; the
/// directories an image may be made in (missing, empty, one whose first
/// save was killed half-way, with a fresh filesystem's lost+found) serve.
#[test]
fn a_non_empty_directory_that_is_not_an_image_is_refused() {
    let tmp = scratch();
    let data = tmp.path().join("data");
    fs::create_dir_all(data.join("photos")).unwrap();
    for f in ["notes.txt", "b.txt", "z.tmp", "seg-notes"] {
        fs::write(data.join(f), f).unwrap();
    }
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let before = listing(&data);
    for extra in [&[][..], &["--mount", p(&mnt)][..]] {
        let mut args = vec!["--size", "16M", "--image", p(&data)];
        args.extend(extra);
        let (code, err) = serve_refused(&args);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains(&format!("image directory {} is not empty", p(&data))),
            "{err}"
        );
        // The first few entries, in order, and how many more.
        assert!(
            err.contains("it has b.txt, notes.txt, photos/ and 2 more"),
            "{err}"
        );
        assert!(err.contains("new or empty directory"), "{err}");
        assert_eq!(listing(&data), before, "ramd changed the directory");
    }

    // A first save killed after its segment was renamed, before any
    // MANIFEST: its debris is no one else's, and a new disk starts there.
    let img = tmp.path().join("img");
    fs::create_dir_all(img.join("lost+found")).unwrap();
    let run_dir = scratch();
    let mut d = Ramd::try_start_in_with(
        run_dir.path(),
        &["--size", "16M", "--image", p(&img)],
        &[("RAMD_TEST_CRASH", "segment-renamed")],
        None,
    )
    .unwrap_or_else(|(s, e)| panic!("ramd did not start ({s}):\n{e}"));
    io(d.uri(), &["write-random", "0", "1M", "lost"]);
    let _ = ramd_cmd(run_dir.path(), &["snapshot", "ram0"]);
    let status = d.wait_exit(STOP_DEADLINE);
    assert_sigkilled(status, "RAMD_TEST_CRASH=segment-renamed", &d.stderr());
    assert!(
        img.join("seg-00000001").exists() && !img.join("MANIFEST").exists(),
        "no debris of the first save: {}",
        listing(&img)
    );
    let mut d = Ramd::start(&["--size", "16M", "--image", p(&img)]);
    io(d.uri(), &["write-random", "0", "1M", "kept"]);
    d.stop();
    let d = Ramd::start(&["--image", p(&img)]);
    io(d.uri(), &["verify-random", "0", "1M", "kept"]);
    assert!(img.join("lost+found").is_dir(), "{}", listing(&img));
}

#[test]
fn a_size_other_than_the_images_is_refused() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let mut d = Ramd::start(&["--size", "16M", "--image", p(&img)]);
    io(d.uri(), &["write-random", "0", "1M", "s"]);
    d.stop();
    let (code, err) = serve_refused(&["--size", "32M", "--image", p(&img)]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("ramd: error"), "{err}");
    assert!(
        err.contains(p(&img)),
        "the refusal does not name the image:\n{err}"
    );
    assert!(
        mentions_size(&err, 16 * MIB) && mentions_size(&err, 32 * MIB),
        "the refusal does not give both sizes:\n{err}"
    );
    // The same size is fine, and the data is there.
    let d = Ramd::start(&["--size", "16M", "--image", p(&img)]);
    io(d.uri(), &["verify-random", "0", "1M", "s"]);
}

#[test]
fn an_image_of_the_other_kind_is_refused() {
    let tmp = scratch();
    let fs_img = tmp.path().join("fs-img");
    let d = FsDisk::mount(&["--size", "16M", "--image", p(&fs_img)]);
    fs::write(d.join("f"), b"fs data").unwrap();
    d.stop();
    let (code, err) = serve_refused(&["--image", p(&fs_img)]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("ramd: error") && err.contains(p(&fs_img)),
        "the refusal does not name the image:\n{err}"
    );
    assert!(
        err.contains("fs") || err.contains("filesystem"),
        "the refusal does not say the image is a filesystem one:\n{err}"
    );

    let block_img = tmp.path().join("block-img");
    let mut b = Ramd::start(&["--size", "16M", "--image", p(&block_img)]);
    io(b.uri(), &["write-random", "0", "1M", "b"]);
    b.stop();
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    match FsDisk::mount_at(&mnt, &["--image", p(&block_img)]) {
        Ok(d) => {
            d.stop();
            panic!("a block image was mounted as a filesystem disk");
        }
        Err(f) => {
            assert_eq!(f.code, Some(1), "{f:?}");
            assert!(
                f.stderr.contains("ramd: error") && f.stderr.contains(p(&block_img)),
                "the refusal does not name the image:\n{}",
                f.stderr
            );
        }
    }
    assert!(!is_mounted(&mnt), "{mnt:?} left mounted");
}

#[test]
fn snapshot_without_image_and_verify_of_no_image_fail() {
    let d = Ramd::start(&["--size", "16M", "--name", "noimg"]);
    let out = ramd_cmd(d.run_dir(), &["snapshot", "noimg"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        out.stderr.contains("ramd: error") && out.stderr.contains("image"),
        "{out:?}"
    );
    let s = d.stats();
    assert!(s["image"].is_null(), "{s}");
    assert!(s["last_save"].is_null(), "{s}");

    let tmp = scratch();
    let out = ramd(&["image", "verify", p(tmp.path())]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(all_output(&out).contains(p(tmp.path())), "{out:?}");
}

#[test]
fn config_file_keys_image_flush_autosave() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let conf = tmp.path().join("ramd.toml");
    fs::write(
        &conf,
        format!(
            "[disk.cfg]\nsize = \"16M\"\nimage = \"{}\"\nflush = \"persist\"\nautosave = \"5m\"\n",
            img.display()
        ),
    )
    .unwrap();
    let mut d = Ramd::start(&["--config", p(&conf), "--disk", "cfg", "--name", "cfg"]);
    let s = d.stats();
    assert_eq!(s["image"].as_str(), Some(p(&img)), "{s}");
    assert_eq!(s["flush"], "persist", "{s}");
    assert_eq!(s["autosave_secs"].as_f64(), Some(300.0), "{s}");
    io(d.uri(), &["write-random", "0", "2M", "cfg"]);
    d.stop();
    verify_ok(&img);
    let d = Ramd::start(&["--image", p(&img), "--name", "cfg"]);
    io(d.uri(), &["verify-random", "0", "2M", "cfg"]);
}

// ---------------------------------------------------------------------------
// image export / import

#[test]
fn export_writes_the_disk_as_a_sparse_raw_file() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let reference = tmp.path().join("ref.raw");
    let mut d = Ramd::start(&["--size", "16M", "--image", p(&img)]);
    io(
        d.uri(),
        &[
            "write-random",
            "0",
            "4M",
            "e1",
            ",", //
            "write-byte",
            "8M",
            "1M",
            "0x33",
        ],
    );
    nbdcopy(&[d.uri(), p(&reference)]);
    d.stop();

    let raw = tmp.path().join("export.raw");
    ramd(&["image", "export", p(&img), p(&raw)]).ok();
    assert_same_file(&reference, &raw);
    let blocks = fs::metadata(&raw).unwrap().blocks() * 512;
    assert!(
        blocks < 8 * MIB,
        "the export of 5 MiB of data in 16 MiB is not sparse ({blocks} bytes allocated)"
    );

    // The same with --to; a tar of a block image is refused, saying so
    // (filesystem images: tests/salvage.rs).
    let raw2 = tmp.path().join("export2.raw");
    ramd(&["image", "export", p(&img), "--to", p(&raw2)]).ok();
    assert_same_file(&reference, &raw2);
    let out = ramd(&["image", "export", p(&img), "--to", p(&raw2)]);
    assert_eq!(out.status.code(), Some(1), "export over a file: {out:?}");
    assert!(out.stderr.contains("--force"), "{out:?}");
    let b_tar = tmp.path().join("b.tar");
    let out = ramd(&["image", "export", p(&img), "--to", p(&b_tar), "--tar"]);
    assert_eq!(out.status.code(), Some(1), "tar of a block image: {out:?}");
    assert!(out.stderr.contains("ramd: error"), "{out:?}");
}

/// `ramd image import RAW DIR [--compress C]` of a raw file of 5 MiB + 100
/// bytes of random data, then `ramd serve --image DIR` (nothing else): the
/// disk is 5 MiB + 4096 bytes, the data RAW's, the tail zeros.
fn import_then_serve(compress: &[&str]) {
    let tmp = scratch();
    let odd = tmp.path().join("odd.raw");
    random_file(&odd, 5 * MIB + 100);
    let img = tmp.path().join("img");
    let mut args = vec!["image", "import", p(&odd), p(&img)];
    args.extend_from_slice(compress);
    ramd(&args).ok();
    verify_ok(&img);
    let d = Ramd::start(&["--image", p(&img)]);
    let size = 5 * MIB + PAGE;
    assert_eq!(field(&d.stats(), "size"), size, "{}", d.stats());
    let back = tmp.path().join("back.raw");
    nbdcopy(&[d.uri(), p(&back)]);
    let (a, b) = (fs::read(&odd).unwrap(), fs::read(&back).unwrap());
    assert_eq!(b.len() as u64, size);
    assert!(a[..] == b[..a.len()], "imported data differs");
    assert!(
        b[a.len()..].iter().all(|&x| x == 0),
        "the rounded-up tail is not zeros"
    );
    drop(d);

    // Import into a directory that holds something: refused.
    let out = ramd(&["image", "import", p(&odd), p(&img)]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "import into an existing image: {out:?}"
    );
}

#[test]
fn import_of_an_odd_sized_raw_file_serves() {
    import_then_serve(&[]);
}

#[test]
fn import_with_lz4_of_an_odd_sized_raw_file_serves() {
    import_then_serve(&["--compress", "lz4"]);
}

// Cases that know the layout (FORMAT.md; what the tests know of it is in
// common/layout.rs).

#[test]
fn damaged_segment_header() {
    damage_case(|img| {
        let seg = segments(img).remove(0);
        records(&seg);
        flip_byte(&seg, 20); // the sequence number
        Damage::of(file_name(&seg), true)
    });
}

#[test]
fn segment_of_an_unknown_format_version_is_refused() {
    damage_case(|img| {
        let seg = segments(img).pop().unwrap();
        records(&seg);
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&seg)
            .unwrap();
        let mut h = [0u8; 64];
        f.read_exact_at(&mut h, 0).unwrap();
        h[8..10].copy_from_slice(&2u16.to_le_bytes());
        let crc = crc32c(&h[..60]);
        h[60..64].copy_from_slice(&crc.to_le_bytes());
        f.write_all_at(&h, 0).unwrap();
        Damage::of(file_name(&seg), false)
    });
}

#[test]
fn damaged_page_record_header() {
    damage_case(|img| {
        let seg = segments(img).remove(0);
        let rec = records(&seg)
            .into_iter()
            .find(|r| matches!(r.kind, RAW | PACKED | FILL))
            .expect("a page record in the full save");
        flip_byte(&seg, rec.off + 16); // its page number
        Damage::of(file_name(&seg), true)
    });
}

#[test]
fn damaged_page_payload_names_the_page() {
    damage_case(|img| {
        let seg = segments(img).pop().unwrap();
        let recs = records(&seg);
        let rec = recs
            .iter()
            .filter(|r| r.kind == RAW && r.len == PAGE)
            .nth(100)
            .expect("101 raw pages in the incremental save");
        flip_byte(&seg, rec.off + 32 + 1234);
        let mut d = Damage::of(file_name(&seg), true);
        d.also.push(format!("page {}", rec.a));
        d
    });
}

#[test]
fn damaged_end_record() {
    damage_case(|img| {
        let seg = segments(img).pop().unwrap();
        let end = records(&seg).pop().unwrap();
        assert_eq!(end.kind, END);
        flip_byte(&seg, end.off + 16); // the record count
        Damage::of(file_name(&seg), true)
    });
}

#[test]
fn manifest_with_a_valid_checksum_but_a_wrong_segment_length_is_refused() {
    damage_case(|img| {
        let f = img.join("MANIFEST");
        let text = fs::read_to_string(&f).unwrap();
        let body_end = text.trim_end().rfind('\n').unwrap() + 1;
        let (body, crc_line) = text.split_at(body_end);
        assert_eq!(
            crc_line.trim(),
            format!("crc32c {:08x}", crc32c(body.as_bytes())),
            "MANIFEST's checksum line is not what FORMAT.md says"
        );
        let seg = segments(img).pop().unwrap();
        let len = fs::metadata(&seg).unwrap().len();
        let old = format!("bytes={len} ");
        assert!(body.contains(&old), "no {old:?} in MANIFEST:\n{text}");
        let body = body.replacen(&old, &format!("bytes={} ", len + 8), 1);
        let new = format!("{body}crc32c {:08x}\n", crc32c(body.as_bytes()));
        fs::write(&f, new).unwrap();
        let mut d = Damage::of("MANIFEST".into(), false);
        d.names = vec!["MANIFEST".into(), file_name(&seg)];
        d
    });
}

/// `ramd image ls` lists the chain; `ramd image prune` removes save files
/// the MANIFEST does not name and says so, leaves other files, and is
/// refused (naming the process) while a ramd serves the image, as is a
/// second `ramd serve` of it.
#[test]
fn image_ls_and_prune_of_a_directory() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let mut d = Ramd::start(&["--size", "16M", "--image", p(&img)]);
    qemu_io(d.uri(), &["write -P 0x41 0 64k".into()]);
    snapshot(d.run_dir(), d.name(), false);
    qemu_io(d.uri(), &["write -P 0x42 1M 4k".into()]);
    snapshot(d.run_dir(), d.name(), false);

    let out = ramd(&["image", "prune", p(&img)]).failed();
    let pid = format!("pid {}", d.pid());
    for want in [p(&img), "in use", pid.as_str()] {
        assert!(
            out.stderr.contains(want),
            "prune refusal lacks {want:?}: {}",
            out.stderr
        );
    }
    let (_, err) = serve_refused(&["--image", p(&img)]);
    assert!(err.contains("in use") && err.contains(&pid), "{err}");
    d.stop();

    let ls = ramd(&["image", "ls", p(&img)]).ok();
    let rows: Vec<&str> = ls.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{ls}");
    assert!(
        rows[0].contains("full") && rows[1].contains("incremental"),
        "{ls}"
    );
    let chain: Value =
        serde_json::from_str(&ramd(&["image", "ls", p(&img), "--json"]).ok()).unwrap();
    let chain = chain.as_array().expect("ls --json is an array");
    assert_eq!(chain.len(), 2, "{chain:?}");
    assert_eq!(chain[1]["pages"], 1, "{chain:?}");
    assert!(field(&chain[0], "bytes") > 0 && field(&chain[1], "time_ns") > 0);

    // Debris as interrupted saves leave it, and a file that is not ramd's.
    fs::write(img.join("seg-00000007.tmp"), vec![1u8; 5000]).unwrap();
    fs::write(img.join("seg-00000009"), vec![2u8; 3000]).unwrap();
    fs::write(img.join("MANIFEST.tmp"), b"half a manifest").unwrap();
    fs::write(img.join("notes.txt"), b"mine").unwrap();
    let manifest = fs::read(img.join("MANIFEST")).unwrap();
    let out: Value =
        serde_json::from_str(&ramd(&["image", "prune", p(&img), "--json"]).ok()).unwrap();
    let mut removed: Vec<String> = out["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    removed.sort();
    assert_eq!(
        removed,
        ["MANIFEST.tmp", "seg-00000007.tmp", "seg-00000009"],
        "{out}"
    );
    assert_eq!(field(&out, "bytes"), 5000 + 3000 + 15, "{out}");
    assert!(
        img.join("notes.txt").exists(),
        "prune removed a foreign file"
    );
    assert_eq!(fs::read(img.join("MANIFEST")).unwrap(), manifest);
    let again = ramd(&["image", "prune", p(&img)]).ok();
    assert!(again.contains("no debris"), "{again}");
    verify_ok(&img);
}

/// An image an older ramd wrote (MANIFEST version 1, no id): `image info`
/// says it has none and changes nothing; the first `ramd serve` gives the
/// disk one and writes it at once, even with nothing to save, and every
/// start after presents the same one.
#[test]
fn a_version_1_image_gets_an_identity_that_stays() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let mut d = Ramd::start(&["--size", "16M", "--image", p(&img)]);
    qemu_io(d.uri(), &["write -P 0x51 0 64k".into()]);
    d.stop();
    let path = img.join("MANIFEST");
    let text = fs::read_to_string(&path).unwrap();
    let body = &text[..text.rfind("crc32c ").unwrap()];
    assert!(body.starts_with("ramd image 2\n"), "{text}");
    let old: String = body
        .replacen("ramd image 2\n", "ramd image 1\n", 1)
        .lines()
        .filter(|l| !l.starts_with("id "))
        .map(|l| format!("{l}\n"))
        .collect();
    let old = format!("{old}crc32c {:08x}\n", crc32c(old.as_bytes()));
    fs::write(&path, &old).unwrap();

    let info = ramd(&["image", "info", p(&img)]).ok();
    assert!(info.contains("id:     none yet"), "{info}");
    assert_eq!(fs::read_to_string(&path).unwrap(), old, "info changed it");

    let id_of = |d: &Ramd| {
        let status = status_json(d.run_dir());
        disk_entry(&status, d.name()).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let mut d = Ramd::start(&["--image", p(&img)]);
    let id = id_of(&d);
    let now = fs::read_to_string(&path).unwrap();
    assert!(
        now.starts_with("ramd image 2\n") && now.contains(&format!("\nid {id}\n")),
        "the MANIFEST did not get the disk's id {id} at the start:\n{now}"
    );
    d.stop_with(libc::SIGKILL);
    let d = Ramd::start(&["--image", p(&img)]);
    assert_eq!(id_of(&d), id, "the identity changed across starts");
    qemu_io(d.uri(), &["read -P 0x51 0 64k".into()]);
}

/// `ramd image restore` of a directory image: every save of three chains
/// (two kept by --keep-saves across full saves), a time between two, a
/// prune by retention, bad input (restore_common.rs); and a destination
/// directory of other files is refused, naming it.
#[test]
fn restore_any_kept_save_of_a_directory_image() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let dests: Vec<String> = (0..10)
        .map(|i| p(&tmp.path().join(format!("restored-{i}"))).to_string())
        .collect();
    // An empty directory is as good as a new one.
    fs::create_dir(&dests[1]).unwrap();
    restore_common::restore_scenario(p(&img), &dests, &[], tmp.path());
    // The dropped chain's files are gone, the kept one's are there.
    for seq in 1..=6 {
        let seg = img.join(format!("seg-{seq:08}"));
        assert_eq!(seg.exists(), seq > 2, "{seg:?}");
    }
    assert!(!img.join("MANIFEST-00000001").exists());
    assert!(img.join("MANIFEST-00000003").exists());

    let busy = tmp.path().join("busy");
    fs::create_dir(&busy).unwrap();
    fs::write(busy.join("notes.txt"), "mine").unwrap();
    let out = ramd_cmd(
        &tmp.path().join("run"),
        &["image", "restore", p(&img), "--at", "4", "--to", p(&busy)],
    )
    .failed();
    assert!(
        out.stderr.contains(p(&busy)) && out.stderr.contains("is not empty"),
        "{}",
        out.stderr
    );
    assert_eq!(
        fs::read_dir(&busy).unwrap().count(),
        1,
        "restore wrote into {busy:?}"
    );
}

/// A writer with --keep-saves drops, at a commit, the kept chains whose
/// newest save is older than its retention (MANIFEST-N, then its
/// segments); a writer without one neither keeps nor drops chains.
#[test]
fn keep_saves_expire_at_the_writers_commits() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let run = tmp.path().join("run");
    let now_ns = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64
    };
    let serve = |keep: Option<&str>| {
        let mut args = vec!["--size", "4M", "--image", p(&img)];
        if let Some(k) = keep {
            args.extend(["--keep-saves", k]);
        }
        Ramd::start_in(&run, &args)
    };
    let save = |d: &Ramd, byte: u8, full: bool| {
        qemu_io(d.uri(), &[format!("write -P {byte} 0 64k")]);
        snapshot(&run, d.name(), full);
    };
    let mut d = serve(Some("1h"));
    save(&d, 0x11, false);
    save(&d, 0x22, true);
    d.stop();
    assert!(img.join("MANIFEST-00000001").exists(), "chain [1] not kept");
    let t2 = now_ns();

    // Without a retention: nothing kept, nothing dropped.
    let mut d = serve(None);
    save(&d, 0x33, true);
    d.stop();
    assert!(
        !img.join("MANIFEST-00000002").exists(),
        "kept without a retention"
    );
    assert!(
        img.join("MANIFEST-00000001").exists(),
        "dropped without a retention"
    );
    assert!(img.join("seg-00000001").exists(), "save 1's segment went");

    // Saves 1 and 2 are past a retention of 1 s once the clock passed
    // them by that: the next commit drops chain [1] and its segment.
    let mut d = serve(Some("1s"));
    wait_until(
        Duration::from_secs(30),
        "the clock to pass save 2 by the retention",
        || now_ns() > t2 + 1_000_000_000,
    );
    save(&d, 0x44, false);
    d.stop();
    assert!(
        !img.join("MANIFEST-00000001").exists(),
        "chain [1] not dropped"
    );
    assert!(
        !img.join("seg-00000001").exists(),
        "save 1's segment stayed"
    );
    let out = ramd_cmd(&run, &["image", "ls", p(&img)]).ok();
    assert!(!out.contains("MANIFEST-"), "{out}");
}
