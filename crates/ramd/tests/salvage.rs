//! Getting data out of images, as a user would: `ramd image export DIR
//! --to PATH` of a filesystem image (a directory, a tar), and `ramd image
//! salvage` of images damaged on disk (a flipped byte in a page record, a
//! truncated last segment, a damaged tree), checked against what was
//! written through real clients (a FUSE mount, nbdcopy and libnbd), and the
//! new image it writes served again.

mod common;
mod fs_common;

use common::layout::*;
use common::*;
use fs_common::FsDisk;
use serde_json::Value;
use std::fs;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// `ramd ARGS…`
fn ramd(args: &[&str]) -> Output {
    run(&mut cmd(ramd_bin(), args), LONG_TIMEOUT)
}

/// Exit status of salvage when something was lost (`--help` says so).
const EXIT_LOST: i32 = 3;

/// `ramd image salvage ARGS… --json`: its exit code and report.
fn salvage(args: &[&str]) -> (Option<i32>, Value) {
    let mut all = vec!["image", "salvage"];
    all.extend_from_slice(args);
    all.push("--json");
    let out = ramd(&all);
    let report = serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "ramd image salvage {args:?} printed no JSON report ({e}): {}\nstdout:\n{}\nstderr:\n{}",
            out.status, out.stdout, out.stderr
        )
    });
    (out.status.code(), report)
}

/// The RAW page record of `seg` whose payload is `page` (4096 bytes).
fn record_holding(seg: &Path, page: &[u8]) -> Rec {
    let data = fs::read(seg).unwrap();
    records_unchecked(seg)
        .into_iter()
        .find(|r| {
            r.kind == RAW && &data[(r.off + 32) as usize..(r.off + 32 + 4096) as usize] == page
        })
        .unwrap_or_else(|| panic!("no RAW record in {seg:?} holds the page asked for"))
}

/// sha256 of every file of an image directory, to show it was not changed.
fn image_sums(img: &Path) -> Vec<(PathBuf, String)> {
    let mut v: Vec<(PathBuf, String)> = fs::read_dir(img)
        .unwrap()
        .map(|e| e.unwrap().path())
        .map(|f| (f.clone(), sha256(&f)))
        .collect();
    v.sort();
    v
}

/// Deterministic data of `len` bytes for seed `seed`.
fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    Rng::new(seed).fill(&mut v);
    v
}

/// Writes a file through the mount and makes sure ramd has it.
fn put(root: &Path, rel: &str, bytes: &[u8]) {
    let path = root.join(rel);
    let f = fs::File::create(&path).unwrap_or_else(|e| panic!("create {path:?}: {e}"));
    f.write_all_at(bytes, 0).unwrap();
    f.sync_all().unwrap();
}

/// The lost ranges of a report as (paths, offset, length, state).
fn lost(report: &Value) -> Vec<(Vec<String>, u64, u64, String)> {
    report["lost"]
        .as_array()
        .unwrap_or_else(|| panic!("report without `lost`: {report}"))
        .iter()
        .map(|l| {
            let paths = l["paths"]
                .as_array()
                .map(|a| a.iter().map(|p| p.as_str().unwrap().to_string()).collect())
                .unwrap_or_default();
            (
                paths,
                l["offset"].as_u64().unwrap(),
                l["length"].as_u64().unwrap(),
                l["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn snapshot_full(run_dir: &Path, name: &str) {
    ramd_cmd(run_dir, &["snapshot", name, "--full"]).ok();
}

// ---------------------------------------------------------------------------
// salvage of filesystem images

/// A flipped byte inside one page of one file: the report names exactly
/// that file and that 4 KiB, every other file comes out byte-identical,
/// the image is untouched, and the new image serves the same files.
#[test]
fn salvage_fs_flipped_page_names_the_file_and_range() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = FsDisk::mount(&["--size", "64M", "--image", p(&img)]);
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("a.bin", data(1, 64 * 1024)),
        ("b.bin", data(2, 200 * 1024)),
        ("c.txt", b"a small file\n".to_vec()),
        ("dir/d.bin", data(4, 300 * 1024 + 17)),
    ];
    fs::create_dir(d.join("dir")).unwrap();
    for (name, bytes) in &files {
        put(d.path(), name, bytes);
    }
    d.stop();
    let seg = segments(&img).remove(0);
    let b = &files[1].1;
    let rec = record_holding(&seg, &b[8192..12288]);
    flip_byte(&seg, rec.off + 32 + 100);
    let before = image_sums(&img);

    let new = tmp.path().join("new");
    let out = tmp.path().join("out");
    let (code, report) = salvage(&[p(&img), "--to", p(&new), "--export", p(&out)]);
    assert_eq!(code, Some(EXIT_LOST), "{report:#}");
    assert_eq!(
        lost(&report),
        vec![(vec!["/b.bin".to_string()], 8192, 4096, "zeros".to_string())],
        "{report:#}"
    );
    assert_eq!(report["damaged"][0]["offset"], rec.off, "{report:#}");
    assert_eq!(report["complete"], false, "{report:#}");
    assert_eq!(
        image_sums(&img),
        before,
        "salvage changed the damaged image"
    );

    let mut want_b = b.clone();
    want_b[8192..12288].fill(0);
    let check = |root: &Path| {
        for (name, bytes) in &files {
            let want = if *name == "b.bin" { &want_b } else { bytes };
            let got = fs::read(root.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(
                &got == want,
                "{name} under {root:?} differs from what was written"
            );
        }
    };
    check(&out);
    let d = FsDisk::mount(&["--image", p(&new)]);
    check(d.path());
    d.stop();
    ramd(&["image", "verify", p(&new)]).ok();
}

/// The last segment cut short in the middle of the one file that save
/// wrote: the report names that file from the first missing page on, and
/// nothing else; the files of the first save are whole.
#[test]
fn salvage_fs_truncated_last_segment_names_the_file_it_cut() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = FsDisk::mount(&["--size", "64M", "--image", p(&img)]);
    let early = data(10, 128 * 1024);
    put(d.path(), "early.bin", &early);
    snapshot_full(d.run_dir(), d.name());
    let late = data(11, 40 * 4096);
    put(d.path(), "late.bin", &late);
    d.stop();
    let segs = segments(&img);
    assert_eq!(segs.len(), 2, "expected a full and an incremental save");
    // Cut inside the record holding late.bin's page 30.
    let rec = record_holding(&segs[1], &late[30 * 4096..31 * 4096]);
    let cut = rec.off + 32 + 1000;
    fs::OpenOptions::new()
        .write(true)
        .open(&segs[1])
        .unwrap()
        .set_len(cut)
        .unwrap();

    let new = tmp.path().join("new");
    let (code, report) = salvage(&[p(&img), "--to", p(&new)]);
    assert_eq!(code, Some(EXIT_LOST), "{report:#}");
    let lost = lost(&report);
    assert!(!lost.is_empty(), "nothing reported lost: {report:#}");
    for (paths, off, len, _) in &lost {
        assert_eq!(paths, &vec!["/late.bin".to_string()], "{report:#}");
        assert!(
            *off >= 30 * 4096 && off + len <= late.len() as u64,
            "{report:#}"
        );
    }
    assert_eq!(lost[0].1, 30 * 4096, "first lost byte: {report:#}");
    let d = FsDisk::mount(&["--image", p(&new)]);
    assert!(
        fs::read(d.join("early.bin")).unwrap() == early,
        "early.bin differs"
    );
    let got = fs::read(d.join("late.bin")).unwrap();
    assert!(
        got[..30 * 4096] == late[..30 * 4096],
        "late.bin's pages before the cut differ"
    );
    d.stop();
}

/// The last save's tree damaged: the tree of the save before is used, and
/// the report says so; a file made after it comes back in lost+found.
#[test]
fn salvage_fs_damaged_tree_falls_back_to_the_previous_save() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = FsDisk::mount(&["--size", "64M", "--image", p(&img)]);
    let old = data(20, 50 * 1024);
    put(d.path(), "old.bin", &old);
    snapshot_full(d.run_dir(), d.name());
    let young = data(21, 30 * 1024);
    put(d.path(), "young.bin", &young);
    d.stop();
    let segs = segments(&img);
    damage_tree(&segs[1]);

    let out = tmp.path().join("out");
    let (code, report) = salvage(&[p(&img), "--export", p(&out)]);
    assert_eq!(code, Some(EXIT_LOST), "{report:#}");
    assert_eq!(report["tree"]["save"], 1, "{report:#}");
    assert_eq!(report["tree"]["newest"], false, "{report:#}");
    assert!(
        fs::read(out.join("old.bin")).unwrap() == old,
        "old.bin differs"
    );
    assert!(
        !out.join("young.bin").exists(),
        "young.bin is not in save 1's tree"
    );
    let found: Vec<PathBuf> = fs::read_dir(out.join("lost+found"))
        .expect("a lost+found directory")
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    // Whole pages: the size was in the lost tree.
    let got = fs::read(&found[0]).unwrap();
    assert_eq!(
        got.len() as u64,
        (young.len() as u64).next_multiple_of(PAGE)
    );
    assert!(
        got[..young.len()] == young[..] && got[young.len()..].iter().all(|&b| b == 0),
        "lost+found holds other data than young.bin's"
    );
}

/// Flips a byte in the middle of the tree record (META) of `seg`, an
/// incremental save's segment.
fn damage_tree(seg: &Path) {
    let meta = records_unchecked(seg)
        .into_iter()
        .find(|r| r.kind == META)
        .expect("the incremental save has a tree");
    flip_byte(seg, meta.off + 32 + meta.len / 2);
}

/// The tree delta of a save in the middle of the chain damaged: the
/// deltas after it assume it, so the trees of those saves are not built
/// without it; the whole tree of the full save is used.
#[test]
fn salvage_fs_damaged_tree_delta_is_not_skipped() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = FsDisk::mount(&["--size", "64M", "--image", p(&img)]);
    put(d.path(), "x", b"x");
    put(d.path(), "y", b"y");
    let mode = |f: &Path| fs::metadata(f).unwrap().permissions().mode() & 0o7777;
    let before = mode(&d.join("x"));
    snapshot_full(d.run_dir(), d.name());
    // Save 2 changes only x, save 3 only y.
    for f in ["x", "y"] {
        fs::set_permissions(d.join(f), fs::Permissions::from_mode(0o600)).unwrap();
        ramd_cmd(d.run_dir(), &["snapshot", d.name()]).ok();
    }
    d.stop();
    let segs = segments(&img);
    assert_eq!(segs.len(), 3, "a full save and two incremental ones");
    damage_tree(&segs[1]);

    let out = tmp.path().join("out");
    let (code, report) = salvage(&[p(&img), "--export", p(&out)]);
    assert_eq!(code, Some(EXIT_LOST), "{report:#}");
    assert_eq!(report["tree"]["save"], 1, "{report:#}");
    assert_eq!(report["tree"]["newest"], false, "{report:#}");
    assert_eq!(mode(&out.join("x")), before, "x as save 1 holds it");
    assert_eq!(mode(&out.join("y")), before, "y as save 1 holds it");
}

// ---------------------------------------------------------------------------
// salvage of block images

fn nbdcopy(args: &[&str]) {
    require_tool("nbdcopy");
    run(&mut cmd("nbdcopy", args), LONG_TIMEOUT).ok();
}

/// A damaged page of the incremental save falls back to the full save's
/// copy (`older`), a damaged page of the full save that the incremental
/// one rewrote is healed, one it did not is zeros; the raw export and the
/// served new image are the disk with exactly those changes.
#[test]
fn salvage_block_reports_byte_ranges_and_falls_back_to_older_copies() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let v1 = tmp.path().join("v1.raw");
    let v2 = tmp.path().join("v2.raw");
    random_file(&v1, 16 * MIB);
    let mut d = Ramd::start(&["--size", "16M", "--image", p(&img), "--name", "slv"]);
    nbdcopy(&[p(&v1), d.uri()]);
    snapshot_full(d.run_dir(), "slv");
    // Rewrite pages 256..264 (1 MiB on) with other data, through libnbd.
    nbd_script("io.py", &[d.uri(), "write-random", "1M", "32K", "patch"]);
    nbdcopy(&[d.uri(), p(&v2)]);
    d.stop();
    let segs = segments(&img);
    assert_eq!(segs.len(), 2, "expected a full and an incremental save");
    let (v1, v2) = (fs::read(&v1).unwrap(), fs::read(&v2).unwrap());
    let page = |v: &[u8], n: u64| v[(n * PAGE) as usize..((n + 1) * PAGE) as usize].to_vec();
    assert_eq!(
        records_unchecked(&segs[1])
            .iter()
            .filter(|r| r.kind == RAW)
            .count(),
        8,
        "the incremental save should hold the 8 rewritten pages"
    );
    // Incremental save: page 257 damaged, the full save has an older copy.
    let r = record_holding(&segs[1], &page(&v2, 257));
    flip_byte(&segs[1], r.off + 32 + 5);
    // Full save: page 258 (rewritten later: healed), page 1000 (lost).
    for n in [258, 1000] {
        let r = record_holding(&segs[0], &page(&v1, n));
        flip_byte(&segs[0], r.off + 32 + 7);
    }

    let new = tmp.path().join("new");
    let raw = tmp.path().join("out.raw");
    let (code, report) = salvage(&[p(&img), "--to", p(&new), "--export", p(&raw)]);
    assert_eq!(code, Some(EXIT_LOST), "{report:#}");
    assert_eq!(
        lost(&report),
        vec![
            (vec![], 257 * PAGE, PAGE, "older".to_string()),
            (vec![], 1000 * PAGE, PAGE, "zeros".to_string()),
        ],
        "{report:#}"
    );
    let mut want = v2.clone();
    want[(257 * PAGE) as usize..(258 * PAGE) as usize].copy_from_slice(&page(&v1, 257));
    want[(1000 * PAGE) as usize..(1001 * PAGE) as usize].fill(0);
    let got = fs::read(&raw).unwrap();
    assert_eq!(got.len(), want.len());
    if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
        panic!("the export differs from the expected disk first at byte {i}");
    }
    let d = Ramd::start(&["--image", p(&new), "--name", "slv2"]);
    let back = tmp.path().join("back.raw");
    nbdcopy(&[d.uri(), p(&back)]);
    assert_same_file(&raw, &back);
    // What was recovered is the same disk: the damaged MANIFEST's id.
    let id = |img: &Path| {
        let info: Value =
            serde_json::from_str(&ramd(&["image", "info", p(img), "--json"]).ok()).unwrap();
        info["id"]
            .as_str()
            .expect("an id in image info")
            .to_string()
    };
    assert_eq!(
        id(&new),
        id(&img),
        "the salvaged image has another identity"
    );
}

/// An image with nothing wrong: exit 0, nothing lost.
#[test]
fn salvage_of_a_whole_image_reports_nothing_lost() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = FsDisk::mount(&["--size", "32M", "--image", p(&img)]);
    put(d.path(), "x", &data(30, 10_000));
    d.stop();
    let (code, report) = salvage(&[p(&img)]);
    assert_eq!(code, Some(0), "{report:#}");
    assert_eq!(report["complete"], true, "{report:#}");
    assert!(lost(&report).is_empty(), "{report:#}");
}

// ---------------------------------------------------------------------------
// export of a healthy filesystem image

/// A tree with a hard link, a symlink, a sparse file, an xattr, a fifo,
/// modes and times, written through the mount.
fn build(root: &Path) {
    require_tool("setfattr");
    let script = r#"
set -eu
mkdir -p sub/deeper
head -c 300000 /dev/urandom > sub/data
ln sub/data hard
ln -s sub/data sym
truncate -s 20M sparse
printf 'in the middle' | dd of=sparse bs=1 seek=10000000 conv=notrunc status=none
setfattr -n user.color -v blue sub/data
setfattr -n user.bin -v 0x00ff10 sub
mkfifo fifo
echo text > sub/deeper/t
chmod 640 sub/deeper/t
chmod 2750 sub/deeper
touch -d '2001-02-03 04:05:06.123456789' sub/deeper/t
sync
"#;
    let mut c = cmd("sh", ["-c", script]);
    c.current_dir(root);
    run(&mut c, LONG_TIMEOUT).ok();
}

/// `find -printf` of what `diff -r` does not compare: type, mode, owner,
/// size, mtime to the nanosecond, link target, link count.
fn listing(root: &Path) -> String {
    let out = run(
        cmd("find", [".", "-printf", "%P %y %m %U:%G %s %T@ %l %n\n"]).current_dir(root),
        CMD_TIMEOUT,
    )
    .ok();
    let mut lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    lines.sort();
    lines
        .iter()
        .map(|l| {
            // Directory sizes are each filesystem's own.
            let f: Vec<&str> = l.split(' ').collect();
            if f[1] == "d" {
                format!("{} d {} {} - {} {}", f[0], f[2], f[3], f[5], f[7])
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `getfattr -R -d -m -` of a tree, one block per file, sorted.
fn xattrs(root: &Path) -> Vec<String> {
    require_tool("getfattr");
    let out = run(
        cmd(
            "getfattr",
            ["-R", "-h", "-d", "-m", "-", "--absolute-names", "."],
        )
        .current_dir(root),
        CMD_TIMEOUT,
    )
    .ok();
    let mut blocks: Vec<String> = out
        .split("\n\n")
        .map(|b| b.trim().to_string())
        .filter(|b| !b.is_empty())
        .collect();
    blocks.sort();
    blocks
}

#[test]
fn export_fs_image_to_a_directory_and_to_a_tar() {
    require_tool("tar");
    require_tool("diff");
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = FsDisk::mount(&["--size", "64M", "--image", p(&img)]);
    build(d.path());
    // The reference: the tree as the mount shows it, copied out with cp -a.
    let reference = tmp.path().join("ref");
    run(
        cmd("cp", ["-a"]).arg(d.path()).arg(&reference),
        LONG_TIMEOUT,
    )
    .ok();
    let want_list = listing(d.path());
    let want_xattrs = xattrs(d.path());
    d.stop();

    // Into a directory.
    let out = tmp.path().join("out");
    ramd(&["image", "export", p(&img), "--to", p(&out)]).ok();
    let diff = run(
        cmd("diff", ["-r", "--no-dereference"])
            .arg(&reference)
            .arg(&out),
        CMD_TIMEOUT,
    );
    // diff names fifos it cannot compare; anything else is a difference.
    let real: Vec<&str> = diff
        .stdout
        .lines()
        .filter(|l| !l.contains("is a fifo while file"))
        .collect();
    assert!(real.is_empty(), "diff -r of the export:\n{}", diff.stdout);
    assert_eq!(
        listing(&out),
        want_list,
        "types, modes, owners, times, links"
    );
    assert_eq!(xattrs(&out), want_xattrs, "xattrs");
    let m = |f: &str| fs::symlink_metadata(out.join(f)).unwrap();
    assert_eq!(m("hard").ino(), m("sub/data").ino(), "hard link not kept");
    assert!(
        m("sparse").blocks() * 512 < MIB,
        "the sparse file is not sparse: {} blocks",
        m("sparse").blocks()
    );

    // Not into a non-empty directory.
    let again = ramd(&["image", "export", p(&img), "--to", p(&out)]);
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(again.stderr.contains("not empty"), "{again:?}");

    // Into a tar; tar -tvf names the link, the symlink; extracted, the same.
    let tar = tmp.path().join("out.tar");
    ramd(&["image", "export", p(&img), "--to", p(&tar)]).ok();
    let toc = run(&mut cmd("tar", ["-tvf", p(&tar)]), CMD_TIMEOUT).ok();
    // The first name met (in name order) holds the data, the other links.
    assert!(
        toc.contains("sub/data link to hard"),
        "tar -tvf lacks the hard link:\n{toc}"
    );
    for want in ["sym -> sub/data", " sparse\n", " fifo\n", "sub/deeper/t\n"] {
        assert!(toc.contains(want), "tar -tvf lacks {want:?}:\n{toc}");
    }
    let x = tmp.path().join("x");
    fs::create_dir(&x).unwrap();
    run(
        &mut cmd(
            "tar",
            [
                "--xattrs",
                "--xattrs-include=*",
                "-xpf",
                p(&tar),
                "-C",
                p(&x),
            ],
        ),
        CMD_TIMEOUT,
    )
    .ok();
    let diff = run(
        cmd("diff", ["-r", "--no-dereference"])
            .arg(&reference)
            .arg(&x),
        CMD_TIMEOUT,
    );
    let real: Vec<&str> = diff
        .stdout
        .lines()
        .filter(|l| !l.contains("is a fifo while file"))
        .collect();
    assert!(
        real.is_empty(),
        "diff -r of the extracted tar:\n{}",
        diff.stdout
    );
    assert_eq!(xattrs(&x), want_xattrs, "xattrs through the tar");
    assert_eq!(
        listing(&x),
        want_list,
        "types, modes, owners, times through the tar"
    );

    // An existing file is replaced only with --force.
    let again = ramd(&["image", "export", p(&img), "--to", p(&tar)]);
    assert_eq!(again.status.code(), Some(1), "{again:?}");
    assert!(again.stderr.contains("--force"), "{again:?}");
    ramd(&["image", "export", p(&img), "--to", p(&tar), "--force"]).ok();
}

/// The only tree damaged too: every file's data comes back as raw store
/// data in lost+found, and a damaged page is named in the file it went to.
#[test]
fn salvage_fs_without_any_tree_puts_the_data_in_lost_found() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = FsDisk::mount(&["--size", "64M", "--image", p(&img)]);
    let a = data(40, 12 * 4096);
    let b = data(41, 5 * 4096);
    put(d.path(), "a.bin", &a);
    put(d.path(), "b.bin", &b);
    d.stop();
    let seg = segments(&img).remove(0);
    let meta = records_unchecked(&seg)
        .into_iter()
        .find(|r| r.kind == META)
        .expect("a tree");
    flip_byte(&seg, meta.off + 32 + meta.len / 2);
    let rec = record_holding(&seg, &a[2 * 4096..3 * 4096]);
    flip_byte(&seg, rec.off + 32 + 1);

    let new = tmp.path().join("new");
    let out = tmp.path().join("out");
    let (code, report) = salvage(&[p(&img), "--to", p(&new), "--export", p(&out)]);
    assert_eq!(code, Some(EXIT_LOST), "{report:#}");
    assert!(report["tree"]["save"].is_null(), "{report:#}");
    let found = report["tree"]["lost_found"].as_array().unwrap();
    assert_eq!(found.len(), 2, "{report:#}");
    let lost = lost(&report);
    assert_eq!(lost.len(), 1, "{report:#}");
    let (paths, off, len, state) = &lost[0];
    assert_eq!(
        (*off, *len, state.as_str()),
        (8192, 4096, "zeros"),
        "{report:#}"
    );
    // The file named is a.bin's data, with that page zeroed.
    let named = out.join(paths[0].trim_start_matches('/'));
    let mut want = a.clone();
    want[8192..12288].fill(0);
    assert!(
        fs::read(&named).unwrap() == want,
        "{named:?} is not a.bin's data"
    );
    let d = FsDisk::mount(&["--image", p(&new)]);
    assert!(fs::read(d.join(&paths[0][1..])).unwrap() == want);
    d.stop();
}

/// No MANIFEST: the chain is rebuilt from the segment files' headers, the
/// data is all there, and the report says the MANIFEST was unusable.
#[test]
fn salvage_without_a_manifest_rebuilds_the_chain() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = FsDisk::mount(&["--size", "64M", "--image", p(&img)]);
    let one = data(50, 20_000);
    put(d.path(), "one", &one);
    snapshot_full(d.run_dir(), d.name());
    let two = data(51, 30_000);
    put(d.path(), "two", &two);
    d.stop();
    fs::remove_file(img.join("MANIFEST")).unwrap();
    let out = tmp.path().join("out");
    let (code, report) = salvage(&[p(&img), "--export", p(&out)]);
    assert_eq!(code, Some(EXIT_LOST), "{report:#}");
    assert!(report["manifest_error"].is_string(), "{report:#}");
    assert_eq!(report["saves"], serde_json::json!([1, 2]), "{report:#}");
    assert!(lost(&report).is_empty(), "{report:#}");
    assert!(fs::read(out.join("one")).unwrap() == one);
    assert!(fs::read(out.join("two")).unwrap() == two);
}
