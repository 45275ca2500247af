//! Images of `--data-path kernel` disks (`crates/ramd-fs/src/fs/saves.rs`):
//! file data lives in a private kernel tmpfs that ramd never sees written,
//! and saves find what changed by themselves. Checked against the real
//! daemon with ordinary tools (sh, dd, truncate, fallocate, setfattr,
//! stat, sha256sum, python's mmap): round trips through clean stops and
//! SIGKILLs after `ramd snapshot`, incremental saves that write only the
//! changed pages, no stale data after deletes, shrinks and punched holes,
//! no save when nothing changed, writes through mappings, concurrent
//! writers, crashes during a save, images moving between data paths, and
//! `--flush persist`.

mod common;
mod fs_common;

use common::*;
use fs_common::*;
use serde_json::Value;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread;

// ---------------------------------------------------------------------------
// Helpers

/// A kernel-path disk on image `img`: `--size 1G --image IMG --data-path
/// kernel EXTRA…`.
fn kernel_disk(img: &Path, extra: &[&str]) -> FsDisk {
    let mut args = vec!["--size", "1G", "--image", s(img), "--data-path", "kernel"];
    args.extend_from_slice(extra);
    FsDisk::mount(&args)
}

/// `ramd snapshot NAME --json`; panics unless it succeeds.
fn snapshot(d: &FsDisk) -> Value {
    let out = ramd_cmd(d.run_dir(), &["snapshot", d.name(), "--json"]).ok();
    let v: Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("`ramd snapshot --json` printed invalid JSON ({e}):\n{out}"));
    for k in ["seq", "pages", "bytes"] {
        field(&v, k);
    }
    v
}

/// One `seg` line of a MANIFEST.
#[derive(Debug, Clone, PartialEq)]
struct Seg {
    seq: u64,
    full: bool,
    pages: u64,
    bytes: u64,
}

/// The chain a MANIFEST names (FORMAT.md, "MANIFEST").
fn chain(img: &Path) -> Vec<Seg> {
    let text = fs::read_to_string(img.join("MANIFEST"))
        .unwrap_or_else(|e| panic!("reading {img:?}/MANIFEST: {e}"));
    text.lines()
        .filter_map(|l| l.strip_prefix("seg "))
        .map(|l| {
            let mut w = l.split_whitespace();
            let seq = w.next().unwrap().parse().unwrap();
            let full = match w.next() {
                Some("full") => true,
                Some("incr") => false,
                k => panic!("MANIFEST seg line with kind {k:?}:\n{text}"),
            };
            let mut get = |key: &str| -> u64 {
                let kv = w
                    .next()
                    .unwrap_or_else(|| panic!("MANIFEST seg line lacks {key}:\n{text}"));
                kv.strip_prefix(key)
                    .and_then(|v| v.strip_prefix('='))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("MANIFEST: {kv:?} is not {key}=N:\n{text}"))
            };
            let pages = get("pages");
            let _records = get("records");
            let bytes = get("bytes");
            Seg {
                seq,
                full,
                pages,
                bytes,
            }
        })
        .collect()
}

/// `sh -c SCRIPT` in `dir`; panics unless it succeeds.
fn sh(dir: &Path, script: &str) -> String {
    require_tool("sh");
    let mut c = cmd("sh", ["-c", script]);
    c.current_dir(dir);
    run(&mut c, LONG_TIMEOUT).ok()
}

/// Everything a round trip keeps of a tree, as sorted text: one `stat -c`
/// line per entry (type, mode, owner, size, links, target, mtime and
/// ctime to the nanosecond), the sha256 of every regular file, every
/// entry's xattrs, and which paths share an inode.
#[derive(Debug, PartialEq)]
struct Tree {
    stat: Vec<String>,
    sums: Vec<String>,
    xattrs: String,
    hardlinks: Vec<String>,
}

fn tree(root: &Path) -> Tree {
    for t in ["find", "sort", "xargs", "stat", "sha256sum", "getfattr"] {
        require_tool(t);
    }
    let lines = |script: &str| -> Vec<String> {
        let mut v: Vec<String> = sh(root, script).lines().map(str::to_string).collect();
        v.sort();
        v
    };
    let stat =
        lines("find . -print0 | sort -z | xargs -0 stat -c '%n|%F|%a|%u|%g|%s|%h|%N|%.9Y|%.9Z'");
    let sums = lines("find . -type f -print0 | sort -z | xargs -0 -r sha256sum");
    let xattrs = sh(
        root,
        "find . ! -type l -print0 | sort -z | xargs -0 -r getfattr -h -d -m - -e hex",
    );
    // Inode numbers may change across a load; the groups may not.
    let mut groups = std::collections::BTreeMap::<String, Vec<String>>::new();
    for l in lines("find . -type f -links +1 -printf '%i %P\\n'") {
        let (ino, path) = l.split_once(' ').unwrap();
        groups.entry(ino.into()).or_default().push(path.into());
    }
    let mut hardlinks: Vec<String> = groups
        .into_values()
        .map(|mut g| {
            g.sort();
            g.join(" = ")
        })
        .collect();
    hardlinks.sort();
    Tree {
        stat,
        sums,
        xattrs,
        hardlinks,
    }
}

/// Asserts two trees are equal, naming the lines that differ.
fn assert_same_tree(what: &str, before: &Tree, after: &Tree) {
    let diff = |name: &str, b: &[String], a: &[String]| {
        if b != a {
            let gone: Vec<&String> = b.iter().filter(|l| !a.contains(l)).take(10).collect();
            let new: Vec<&String> = a.iter().filter(|l| !b.contains(l)).take(10).collect();
            panic!("{what}: {name} differ\nonly before: {gone:#?}\nonly after: {new:#?}");
        }
    };
    diff("stat lines", &before.stat, &after.stat);
    diff("sha256 sums", &before.sums, &after.sums);
    let lines = |t: &str| t.lines().map(str::to_string).collect::<Vec<_>>();
    diff("xattrs", &lines(&before.xattrs), &lines(&after.xattrs));
    diff("hard-link groups", &before.hardlinks, &after.hardlinks);
}

/// The tree of the round-trip tests: random files of odd and page sizes,
/// a sparse 1 GiB file with a few bytes far in, an empty file, a file of
/// zeros, nested directories, symlinks, hard links, xattrs, modes,
/// owners and times.
fn build_tree(root: &Path) {
    for t in [
        "sh", "head", "dd", "truncate", "ln", "setfattr", "chmod", "chown", "touch", "mkdir",
    ] {
        require_tool(t);
    }
    sh(
        root,
        r#"
set -eu
mkdir -p a/b/c/d "with space" empty-dir
head -c 1 /dev/urandom > one-byte
head -c 4096 /dev/urandom > one-page
head -c 12345 /dev/urandom > odd
head -c 3000001 /dev/urandom > a/b/three-megs-odd
head -c 8M /dev/urandom > a/b/c/d/eight-megs
head -c 70001 /dev/urandom > "with space/file name"
: > empty
head -c 1000000 /dev/zero > zeros
truncate -s 1G sparse
printf 'far in' | dd of=sparse bs=1 seek=777777777 conv=notrunc status=none
printf 'at 0' | dd of=sparse bs=1 conv=notrunc status=none
ln odd hard1
ln odd a/b/hard2
ln -s odd link-file
ln -s a/b link-dir
ln -s /nonexistent/target dangling
setfattr -n user.color -v blue odd
setfattr -n user.bin -v 0x00ff10 one-page
setfattr -n user.empty a/b
setfattr -n trusted.secret -v s3cr3t a/b/c/d/eight-megs
chmod 0640 odd
chmod 0000 empty
chmod 4755 one-byte
chmod 1777 a/b
chmod 2750 "with space"
chown 1234:5678 odd
chown 42:43 a/b/c/d/eight-megs
chown -h 4321:8765 dangling
touch -d '1999-12-31 23:59:59.5' one-page
touch -d '2001-02-03 04:05:06.123456789' a/b/three-megs-odd
touch -h -d '2002-03-04 05:06:07.25' link-file
touch -d '2003-04-05 06:07:08' a/b/c
"#,
    );
}

/// Checks what `build_tree` made is as it should be on `root`: the tree
/// equals `want`, and the sparse file still takes little room.
fn check_tree(what: &str, root: &Path, want: &Tree) {
    assert_same_tree(what, want, &tree(root));
    // `tree` read every file: reads change no ctime (nor anything else
    // it compares).
    assert_same_tree(
        &format!("{what}, once every file was read"),
        want,
        &tree(root),
    );
    let used = du(&root.join("sparse"), false);
    assert!(
        used <= 64 * KIB,
        "{what}: the sparse 1 GiB file takes {used} bytes (du)"
    );
    assert_eq!(du(&root.join("sparse"), true), GIB, "{what}: apparent size");
}

/// Waits for a dead daemon's mount to go (`FsDisk::kill_leaving_mount`
/// leaves it) and unmounts it.
fn clear_dead_mount(d: &FsDisk) {
    if is_mounted(d.path()) {
        umount_or_detach(d.path());
    }
    assert!(!is_mounted(d.path()), "{:?} still mounted", d.path());
}

/// A python helper beside the test: it reads commands on stdin and answers
/// lines on stdout; killed on drop.
struct Helper {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Helper {
    fn start(script: &str, args: &[&str]) -> Helper {
        let mut child = Command::new(python())
            .arg("-c")
            .arg(script)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start python3");
        let stdin = child.stdin.take();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Helper {
            child,
            stdin,
            lines,
        }
    }

    /// The next line it prints, within the command deadline.
    fn line(&mut self) -> String {
        match self.lines.recv_timeout(CMD_TIMEOUT) {
            Ok(l) => l,
            Err(e) => {
                let st = self.child.try_wait().ok().flatten();
                panic!("python helper printed no line ({e}); exited: {st:?}")
            }
        }
    }

    /// Sends one command line.
    fn send(&mut self, what: &str) {
        let w = self.stdin.as_mut().expect("stdin open");
        writeln!(w, "{what}").expect("write to python helper");
        w.flush().unwrap();
    }

    /// Closes its stdin, takes the line it prints then, and waits for it
    /// to exit 0.
    fn finish(mut self) -> String {
        drop(self.stdin.take());
        let last = self.line();
        let st = wait_child(&mut self.child, CMD_TIMEOUT)
            .unwrap_or_else(|| panic!("python helper did not exit after its stdin closed"));
        assert!(st.success(), "python helper failed: {st}");
        last
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Writes `len` bytes of seeded random data to `path`; returns them.
fn seeded_file(path: &Path, len: usize, seed: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    Rng::new(seed).fill(&mut buf);
    write_file(path, &buf);
    buf
}

/// sha256 of bytes, through sha256sum (a file in `dir`).
fn sha256_of(dir: &Path, data: &[u8]) -> String {
    let f = dir.join("sha-input");
    write_file(&f, data);
    let sum = sha256(&f);
    fs::remove_file(&f).unwrap();
    sum
}

// ---------------------------------------------------------------------------
// 1. Round trips

/// A clean stop saves the tree and a start loads it, exactly.
#[test]
fn round_trip_through_a_clean_stop() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = kernel_disk(&img, &[]);
    build_tree(d.path());
    let want = tree(d.path());
    assert!(
        want.stat.len() >= 20 && want.hardlinks.len() == 1,
        "the tree is not as built: {want:#?}"
    );
    assert!(
        du(&d.join("sparse"), false) <= 64 * KIB,
        "sparse to begin with"
    );
    d.stop();

    let d = kernel_disk(&img, &[]);
    check_tree("after a clean stop and a start", d.path(), &want);
    d.stop();
    // A second round, through the image the first load wrote back.
    let d = kernel_disk(&img, &[]);
    check_tree("after a second stop and start", d.path(), &want);
    d.stop();
}

/// `ramd snapshot`, then SIGKILL: the image holds the snapshot.
#[test]
fn round_trip_through_snapshot_and_sigkill() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let mut d = kernel_disk(&img, &[]);
    build_tree(d.path());
    let want = tree(d.path());
    let snap = snapshot(&d);
    assert_eq!(snap["full"], true, "the first save: {snap}");
    d.kill();

    let mut d = kernel_disk(&img, &[]);
    check_tree("after snapshot and SIGKILL", d.path(), &want);

    // Change some of it, an incremental snapshot, SIGKILL again.
    sh(
        d.path(),
        r#"
set -eu
head -c 5000 /dev/urandom >> odd
rm a/b/hard2
mv "with space/file name" moved
truncate -s 100 a/b/three-megs-odd
printf 'new bytes' | dd of=sparse bs=1 seek=500000000 conv=notrunc status=none
setfattr -x user.color odd
setfattr -n user.new -v 1 a/b/c
head -c 2M /dev/urandom > a/new-file
chmod 0600 one-page
chown 7:8 zeros
touch -d '2010-01-01 00:00:00.000000001' a/new-file
"#,
    );
    let want = tree(d.path());
    let snap = snapshot(&d);
    assert_eq!(snap["full"], false, "the second save: {snap}");
    d.kill();
    let d = kernel_disk(&img, &[]);
    check_tree("after an incremental snapshot and SIGKILL", d.path(), &want);
    d.stop();
}

// ---------------------------------------------------------------------------
// 2. An incremental save writes what changed

/// 1% of a 64 MiB file's pages changed: the incremental save holds those
/// pages, and about 1% of the full save's bytes.
#[test]
fn one_percent_changed_saves_one_percent() {
    require_tool("dd");
    let tmp = scratch();
    let img = tmp.path().join("img");
    let reference = tmp.path().join("ref");
    let total_pages = 64 * MIB / PAGE;
    let mut want = seeded_file(&reference, (64 * MIB) as usize, 2);

    let mut d = kernel_disk(&img, &[]);
    let f = d.join("big");
    fs::copy(&reference, &f).unwrap();
    let full = snapshot(&d);
    assert_eq!(full["full"], true, "{full}");
    assert_eq!(field(&full, "pages"), total_pages, "full save: {full}");

    // 164 distinct pages (1%), each overwritten by dd with new random data.
    let mut rng = Rng::new(164);
    let mut chosen = std::collections::BTreeSet::new();
    while chosen.len() < 164 {
        chosen.insert(rng.below(total_pages));
    }
    let patch = tmp.path().join("patch");
    let data = seeded_file(&patch, chosen.len() * PAGE as usize, 3);
    let mut script = String::from("set -eu\n");
    for (i, pg) in chosen.iter().enumerate() {
        script.push_str(&format!(
            "dd if={} of={} bs=4096 skip={i} seek={pg} count=1 conv=notrunc status=none\n",
            s(&patch),
            s(&f)
        ));
        let at = (pg * PAGE) as usize;
        want[at..at + PAGE as usize]
            .copy_from_slice(&data[i * PAGE as usize..(i + 1) * PAGE as usize]);
    }
    sh(tmp.path(), &script);
    write_file(&reference, &want);
    drop(want);
    assert_eq!(sha256(&f), sha256(&reference), "the file as changed");

    let inc = snapshot(&d);
    assert_eq!(inc["full"], false, "{inc}");
    assert_eq!(
        field(&inc, "pages"),
        164,
        "an incremental save after changing 164 pages: {inc}"
    );
    let segs = chain(&img);
    assert_eq!(segs.len(), 2, "chain: {segs:?}");
    let (s0, s1) = (&segs[0], &segs[1]);
    assert!(s0.full && !s1.full, "chain: {segs:?}");
    assert_eq!(s0.pages, total_pages, "the full save's pages: {segs:?}");
    assert_eq!(s1.pages, 164, "the incremental save's pages: {segs:?}");
    let seg_len = |seq: u64| {
        fs::metadata(img.join(format!("seg-{seq:08}")))
            .unwrap()
            .len()
    };
    assert_eq!(seg_len(s0.seq), s0.bytes, "MANIFEST bytes= vs segment file");
    assert_eq!(seg_len(s1.seq), s1.bytes, "MANIFEST bytes= vs segment file");
    assert!(
        s1.bytes * 100 <= s0.bytes * 3,
        "the incremental save of 1% of the pages is {} bytes, the full one {}",
        s1.bytes,
        s0.bytes
    );

    d.kill();
    let d = kernel_disk(&img, &[]);
    assert_eq!(
        sha256(&d.join("big")),
        sha256(&reference),
        "the file after SIGKILL and a load"
    );
    d.stop();
}

// ---------------------------------------------------------------------------
// 3. No stale data

/// After a delete (and a new file that may take the freed slot), a shrink
/// and re-extend, and a punched hole, a load shows no old page anywhere.
#[test]
fn no_stale_data_after_delete_shrink_punch_and_slot_reuse() {
    for t in ["truncate", "fallocate", "dd", "rm"] {
        require_tool(t);
    }
    let tmp = scratch();
    let img = tmp.path().join("img");
    let mut d = kernel_disk(&img, &[]);
    let refs = tmp.path();
    let a = seeded_file(&refs.join("a"), (64 * MIB) as usize, 10);
    let mut c = seeded_file(&refs.join("c"), (8 * MIB) as usize, 11);
    let mut dd = seeded_file(&refs.join("d"), (8 * MIB) as usize, 12);
    for n in ["a", "c", "d"] {
        fs::copy(refs.join(n), d.join(n)).unwrap();
    }
    drop(a);
    let first = snapshot(&d);
    assert_eq!(first["full"], true, "{first}");

    sh(
        d.path(),
        r#"
set -eu
rm a
truncate -s 64M b
printf 'b at 0' | dd of=b conv=notrunc status=none
truncate -s 100 c
truncate -s 8M c
fallocate -p -o 1M -l 2M d
fallocate -p -o 8187000 -l 4096 d
"#,
    );
    // What they must read as, made here.
    let mut b = vec![0u8; (64 * MIB) as usize];
    b[..6].copy_from_slice(b"b at 0");
    c[100..].fill(0);
    dd[MIB as usize..3 * MIB as usize].fill(0);
    // A punch clears whole pages and zeros the parts of partial ones.
    dd[8187000..8187000 + 4096].fill(0);
    let want = [
        ("b", sha256_of(tmp.path(), &b)),
        ("c", sha256_of(tmp.path(), &c)),
        ("d", sha256_of(tmp.path(), &dd)),
    ];
    drop((b, c, dd));
    for (n, sum) in &want {
        assert_eq!(&sha256(&d.join(n)), sum, "{n} before the save");
    }
    assert!(!d.join("a").exists());
    let second = snapshot(&d);
    assert_eq!(second["full"], false, "{second}");
    // a's chunks are cleared in the image (FORMAT.md: GONE, type 6).
    let segs = common::layout::segments(&img);
    assert_eq!(segs.len(), 2, "{segs:?}");
    let gone = common::layout::records(&segs[1])
        .iter()
        .filter(|r| r.kind == 6)
        .count();
    assert!(
        gone >= (64 * MIB / PAGE / 64) as usize,
        "the save after rm a wrote {gone} GONE records, fewer than a's chunks"
    );

    d.kill();
    let d = kernel_disk(&img, &[]);
    assert!(!d.join("a").exists(), "a came back");
    for (n, sum) in &want {
        assert_eq!(&sha256(&d.join(n)), sum, "{n} after SIGKILL and a load");
    }
    let b_used = du(&d.join("b"), false);
    assert!(b_used <= 64 * KIB, "b takes {b_used} bytes: holes filled?");
    d.stop();
    // Once more through a clean stop's save and a load.
    let d = kernel_disk(&img, &[]);
    for (n, sum) in &want {
        assert_eq!(&sha256(&d.join(n)), sum, "{n} after a stop and a load");
    }
    d.stop();
}

// ---------------------------------------------------------------------------
// 4. Nothing changed, nothing written

/// `ramd snapshot` that found nothing to write: pages and bytes 0, the seq
/// of the last save.
fn assert_nothing_saved(what: &str, snap: &Value, img: &Path, before: &[Seg]) {
    assert_eq!(
        (field(snap, "pages"), field(snap, "bytes"), &snap["full"]),
        (0, 0, &Value::Bool(false)),
        "{what}: the snapshot wrote something: {snap}"
    );
    assert_eq!(
        field(snap, "seq"),
        before.last().unwrap().seq,
        "{what}: {snap}"
    );
    assert_eq!(chain(img), before, "{what}: the chain grew");
}

#[test]
fn an_unchanged_disk_saves_nothing() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = kernel_disk(&img, &[]);
    seeded_file(&d.join("a"), (3 * MIB + 5) as usize, 20);
    seeded_file(&d.join("b"), 8191, 21);
    fs::write(d.join("c"), b"").unwrap();
    fs::create_dir(d.join("dir")).unwrap();
    seeded_file(&d.join("dir/e"), 100_000, 22);
    d.stop();
    let after_stop = chain(&img);

    let d = kernel_disk(&img, &[]);
    // Metadata only: no file's contents is read.
    for n in ["a", "b", "c", "dir/e"] {
        fs::metadata(d.join(n)).unwrap();
    }
    let snap = snapshot(&d);
    assert_nothing_saved("after a load", &snap, &img, &after_stop);
    let snap = snapshot(&d);
    assert_nothing_saved("a second snapshot", &snap, &img, &after_stop);

    // A file held open for writing and never written.
    require_tool("sh");
    let mut holder = Background::spawn(&mut cmd(
        "sh",
        [
            "-c",
            &format!(
                "exec 3>>'{}'; exec 4<>'{}'; read x || :",
                s(&d.join("a")),
                s(&d.join("dir/e"))
            ),
        ],
    ));
    let fd = format!("/proc/{}/fd/4", holder.pid());
    wait_until(START_DEADLINE, "the shell to hold a and dir/e open", || {
        fs::read_link(&fd).is_ok()
    });
    // A save reads these files to find their changed pages; that read is
    // no client's and must not move their atime (nor so make the next
    // save write a new tree).
    let times = || sh(d.path(), "stat -c '%n %.9X %.9Y %.9Z' a dir/e");
    let before = times();
    for i in 0..3 {
        let snap = snapshot(&d);
        assert_eq!(
            times(),
            before,
            "snapshot {i} changed the times of files it only read"
        );
        assert_nothing_saved(
            &format!("snapshot {i} with a and dir/e open for writing"),
            &snap,
            &img,
            &after_stop,
        );
    }
    holder.assert_running();
    holder.finish_ok();
    let snap = snapshot(&d);
    assert_nothing_saved("after the holder closed them", &snap, &img, &after_stop);
    d.stop();
    assert_eq!(chain(&img), after_stop, "the stop saved again");
}

/// A long chain makes the next save a full one (a compaction), but only
/// when something changed: a snapshot of an unchanged disk rewrites
/// nothing, however long the chain.
#[test]
fn a_long_chain_of_an_unchanged_disk_is_not_rewritten() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = kernel_disk(&img, &[]);
    seeded_file(&d.join("big"), (16 * MIB) as usize, 23);
    snapshot(&d);
    // 15 small incremental saves: the chain is 16 long (the compaction
    // threshold, policy.rs MAX_CHAIN).
    for i in 0..15 {
        fs::write(d.join("small"), format!("{i}")).unwrap();
        let snap = snapshot(&d);
        assert_eq!(snap["full"], false, "save {i}: {snap}");
    }
    let long = chain(&img);
    assert_eq!(long.len(), 16, "{long:?}");
    let snap = snapshot(&d);
    assert_nothing_saved("an unchanged disk with a long chain", &snap, &img, &long);
    d.stop();
    assert_eq!(chain(&img), long, "the stop rewrote an unchanged disk");
    // With a change, the compaction happens, and holds every file.
    let mut d = kernel_disk(&img, &[]);
    let big = fs::read(d.join("big")).unwrap();
    fs::write(d.join("small"), b"changed").unwrap();
    let snap = snapshot(&d);
    assert_eq!(snap["full"], true, "a change with a long chain: {snap}");
    assert_eq!(chain(&img).len(), 1, "{:?}", chain(&img));
    d.kill();
    let d = kernel_disk(&img, &[]);
    assert!(
        fs::read(d.join("big")).unwrap() == big,
        "big after the compaction"
    );
    assert_eq!(fs::read(d.join("small")).unwrap(), b"changed");
    d.stop();
}

// ---------------------------------------------------------------------------
// 5. Writes through a shared mapping

/// Maps ARGV[1] (4 MiB, made here) shared, closes the fd, and for each
/// line TAG on stdin writes TAG (9 bytes) at four offsets through the
/// mapping, with no msync, and says `written TAG`.
const MMAP_WRITER: &str = r#"
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 4 << 20)
m = mmap.mmap(fd, 4 << 20, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
os.close(fd)
print('mapped', flush=True)
for line in sys.stdin:
    tag = ('%-9s' % line.strip())[:9].encode()
    for off in (0, 12345, (1 << 20) + 7, (4 << 20) - 9):
        m[off:off + 9] = tag
    print('written', line.strip(), flush=True)
"#;

fn mmap_expected(tags: &[(&str, usize)]) -> Vec<u8> {
    let mut v = vec![0u8; (4 * MIB) as usize];
    for (tag, off) in tags {
        let t = format!("{tag:<9}");
        v[*off..*off + 9].copy_from_slice(&t.as_bytes()[..9]);
    }
    v
}

#[test]
fn writes_through_a_mapping_are_saved() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let mut d = kernel_disk(&img, &[]);
    fs::write(d.join("other"), b"something first").unwrap();
    let first = snapshot(&d);
    assert_eq!(first["full"], true, "{first}");

    let mut py = Helper::start(MMAP_WRITER, &[s(&d.join("m"))]);
    assert_eq!(py.line(), "mapped");
    py.send("one");
    assert_eq!(py.line(), "written one");
    snapshot(&d);
    // The mapping is still there and still written: the next save must
    // look at the file again.
    py.send("two");
    assert_eq!(py.line(), "written two");
    snapshot(&d);
    let status = d.kill_leaving_mount();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    py.kill();
    clear_dead_mount(&d);
    drop(d);

    let want: Vec<(&str, usize)> = [0, 12345, (MIB + 7) as usize, (4 * MIB - 9) as usize]
        .into_iter()
        .map(|o| ("two", o))
        .collect();
    let d = kernel_disk(&img, &[]);
    let got = fs::read(d.join("m")).unwrap();
    assert_eq!(got.len(), (4 * MIB) as usize, "size of the mapped file");
    for (tag, off) in &want {
        assert_eq!(
            String::from_utf8_lossy(&got[*off..*off + 9]),
            format!("{tag:<9}"),
            "bytes written through the mapping at {off}"
        );
    }
    assert!(
        got == mmap_expected(&want),
        "the mapped file has other bytes too"
    );
    assert_eq!(fs::read(d.join("other")).unwrap(), b"something first");
    d.stop();
}

// ---------------------------------------------------------------------------
// 6. Concurrent writers

/// Rewrites ARGV[1] from offset 0 in rounds, each 4 MiB of the round
/// number (8 bytes, little-endian, repeated), through one fd kept open;
/// says `started` after round 1; when stdin closes, prints the last round.
const REWRITER: &str = r#"
import os, sys, threading
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
r = 0
while True:
    r += 1
    os.pwrite(fd, r.to_bytes(8, 'little') * (512 << 10), 0)
    if r == 1:
        print('started', flush=True)
    if stop.is_set():
        break
os.close(fd)
print(r, flush=True)
"#;

/// Appends `line N\n` to ARGV[1], N from 0, one write(2) each; says
/// `started` after the first; when stdin closes, prints how many.
const APPENDER: &str = r#"
import os, sys, threading
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
n = 0
while True:
    os.write(fd, b'line %d\n' % n)
    n += 1
    if n == 1:
        print('started', flush=True)
    if stop.is_set():
        break
os.close(fd)
print(n, flush=True)
"#;

fn rounds_of(r: u64) -> Vec<u8> {
    r.to_le_bytes().repeat((4 * MIB / 8) as usize)
}

fn lines_up_to(n: u64) -> Vec<u8> {
    (0..n)
        .flat_map(|i| format!("line {i}\n").into_bytes())
        .collect()
}

/// Asserts `got` is a prefix of the appender's stream.
fn assert_line_prefix(what: &str, got: &[u8]) {
    let n = got.iter().filter(|&&b| b == b'\n').count() as u64 + 1;
    let want = lines_up_to(n);
    assert!(
        got.len() <= want.len() && got == &want[..got.len()],
        "{what}: L ({} bytes) is not a prefix of the appended lines",
        got.len()
    );
}

#[test]
fn snapshots_under_concurrent_writers() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = kernel_disk(&img, &[]);
    let x = seeded_file(&d.join("x"), (5 * MIB + 3) as usize, 60);
    let mut w = Helper::start(REWRITER, &[s(&d.join("w"))]);
    let mut l = Helper::start(APPENDER, &[s(&d.join("l"))]);
    assert_eq!(w.line(), "started");
    assert_eq!(l.line(), "started");
    let mut seqs = Vec::new();
    for _ in 0..5 {
        let snap = snapshot(&d);
        seqs.push(field(&snap, "seq"));
    }
    assert!(
        seqs.windows(2).all(|s| s[0] < s[1]),
        "every snapshot under writes made a save: {seqs:?}"
    );
    let r: u64 = w.finish().parse().unwrap();
    let n: u64 = l.finish().parse().unwrap();
    snapshot(&d);
    let (want_w, want_l) = (rounds_of(r), lines_up_to(n));
    assert!(
        fs::read(d.join("w")).unwrap() == want_w,
        "w before the stop"
    );
    assert!(
        fs::read(d.join("l")).unwrap() == want_l,
        "l before the stop"
    );
    d.stop();

    let d = kernel_disk(&img, &[]);
    assert!(
        fs::read(d.join("w")).unwrap() == want_w,
        "w after a load is not all round {r}"
    );
    let got_l = fs::read(d.join("l")).unwrap();
    assert_line_prefix("after a load", &got_l);
    assert_eq!(got_l.len(), want_l.len(), "l after a load: {n} lines");
    assert!(fs::read(d.join("x")).unwrap() == x, "x after a load");
    d.stop();
}

/// A file nobody writes during a save is saved exactly, whatever else is
/// written meanwhile; an appended file is saved as a prefix of what was
/// appended.
#[test]
fn sigkill_after_a_snapshot_under_writers_keeps_quiet_files_exact() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let mut d = kernel_disk(&img, &[]);
    let x = seeded_file(&d.join("x"), (5 * MIB + 3) as usize, 61);
    let mut w = Helper::start(REWRITER, &[s(&d.join("w"))]);
    let mut l = Helper::start(APPENDER, &[s(&d.join("l"))]);
    assert_eq!(w.line(), "started");
    assert_eq!(l.line(), "started");
    for _ in 0..3 {
        snapshot(&d);
    }
    let status = d.kill_leaving_mount();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status}");
    w.kill();
    l.kill();
    clear_dead_mount(&d);
    drop(d);

    let d = kernel_disk(&img, &[]);
    assert!(fs::read(d.join("x")).unwrap() == x, "x after SIGKILL");
    assert_eq!(
        fs::metadata(d.join("w")).unwrap().len(),
        4 * MIB,
        "w's size after SIGKILL"
    );
    let got_l = fs::read(d.join("l")).unwrap();
    assert!(!got_l.is_empty(), "l is empty");
    assert_line_prefix("after SIGKILL", &got_l);
    d.stop();
}

// ---------------------------------------------------------------------------
// 7. A crash during a save

/// The daemon dies (RAMD_TEST_CRASH=pages:100) in the middle of a save of
/// files written through the kernel; the image loads the save before.
/// `restart`: the first save is made by another daemon than the one that
/// crashes (so the crashing one loaded it).
fn crash_during_a_save_of_hot_files(restart: bool) {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let crash = [("RAMD_TEST_CRASH", "pages:100")];
    let args = ["--size", "1G", "--image", s(&img), "--data-path", "kernel"];
    // The first save holds fewer than 100 pages: it is made whole.
    let mut d = FsDisk::mount_with_env(&args, if restart { &[] } else { &crash });
    seeded_file(&d.join("a"), 40_000, 70);
    seeded_file(&d.join("b"), 100_001, 71);
    fs::write(d.join("c"), b"hello").unwrap();
    fs::create_dir(d.join("dir")).unwrap();
    let want = tree(d.path());
    let first = snapshot(&d);
    assert_eq!(first["full"], true, "{first}");
    assert!(field(&first, "pages") < 100, "{first}");
    if restart {
        d.stop();
        d = FsDisk::mount_with_env(&args, &crash);
        assert_same_tree("loaded by the crashing daemon", &want, &tree(d.path()));
    }

    seeded_file(&d.join("b"), (8 * MIB) as usize, 72);
    seeded_file(&d.join("dir/e"), (4 * MIB) as usize, 73);
    fs::remove_file(d.join("a")).unwrap();
    fs::write(d.join("c"), b"changed").unwrap();
    let snap = ramd_cmd(d.run_dir(), &["snapshot", d.name()]);
    assert!(
        !snap.success(),
        "the snapshot succeeded though the daemon was to die: {}",
        snap.stdout
    );
    let status = d.wait_exit();
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "RAMD_TEST_CRASH=pages:100: {status}; stderr:\n{}",
        d.stderr()
    );
    clear_dead_mount(&d);
    drop(d);

    let d = kernel_disk(&img, &[]);
    assert_same_tree("after the crash", &want, &tree(d.path()));
    d.stop();
}

#[test]
fn crash_during_a_save_of_hot_files_keeps_the_previous_image() {
    crash_during_a_save_of_hot_files(false);
}

#[test]
fn crash_during_the_first_save_after_a_load_keeps_the_image() {
    crash_during_a_save_of_hot_files(true);
}

// ---------------------------------------------------------------------------
// 8. Images move between data paths

#[test]
fn an_image_moves_from_kernel_to_store_and_back() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = kernel_disk(&img, &[]);
    build_tree(d.path());
    let want = tree(d.path());
    d.stop();

    let d = FsDisk::mount(&["--size", "1G", "--image", s(&img)]);
    check_tree("kernel image loaded by the store", d.path(), &want);
    sh(
        d.path(),
        r#"
set -eu
head -c 5000 /dev/urandom >> odd
truncate -s 100 a/b/three-megs-odd
rm a/b/c/d/eight-megs
head -c 3M /dev/urandom > a/new-file
printf 'more' | dd of=sparse bs=1 seek=900000000 conv=notrunc status=none
"#,
    );
    let want = tree(d.path());
    d.stop();

    let d = kernel_disk(&img, &[]);
    check_tree("store's save loaded by the kernel path", d.path(), &want);
    d.stop();
}

#[test]
fn an_image_of_the_store_loads_with_the_kernel_path() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let d = FsDisk::mount(&["--size", "1G", "--image", s(&img)]);
    build_tree(d.path());
    let want = tree(d.path());
    d.stop();
    let d = kernel_disk(&img, &[]);
    check_tree("store image loaded by the kernel path", d.path(), &want);
    d.stop();
    let d = FsDisk::mount(&["--size", "1G", "--image", s(&img)]);
    check_tree("and back to the store", d.path(), &want);
    d.stop();
}

// ---------------------------------------------------------------------------
// 9. --flush persist

/// Writes ARGV[2] bytes of ARGV[3] at offset ARGV[4] of ARGV[1], fsyncs,
/// says `synced`.
const FSYNC_WRITER: &str = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
os.pwrite(fd, sys.argv[3].encode() * int(sys.argv[2]), int(sys.argv[4]))
os.fsync(fd)
os.close(fd)
print('synced', flush=True)
"#;

#[test]
fn flush_persist_makes_fsynced_data_durable() {
    require_tool("dd");
    let tmp = scratch();
    let img = tmp.path().join("img");
    let src = tmp.path().join("src");
    random_file(&src, 3 * MIB + 123);
    let want = sha256(&src);
    let mut d = kernel_disk(&img, &["--flush", "persist"]);
    assert_eq!(d.status()["flush"], "persist", "{}", d.status());
    fs::create_dir(d.join("dir")).unwrap();
    run(
        &mut cmd(
            "dd",
            [
                format!("if={}", s(&src)),
                format!("of={}", s(&d.join("dir/file"))),
                "bs=1M".into(),
                "conv=fsync".into(),
                "status=none".into(),
            ],
        ),
        LONG_TIMEOUT,
    )
    .ok();
    d.kill();

    let mut d = kernel_disk(&img, &["--flush", "persist"]);
    let f = d.join("dir/file");
    assert!(f.exists(), "the fsynced file is gone after SIGKILL");
    assert_eq!(sha256(&f), want, "the fsynced file's data after SIGKILL");

    // An overwrite in place of a file that is in the image already.
    let out = py_ok(FSYNC_WRITER, &[s(&f), "5000", "z", "1000000"]);
    assert_eq!(out.trim(), "synced");
    d.kill();
    let d = kernel_disk(&img, &["--flush", "persist"]);
    let got = fs::read(d.join("dir/file")).unwrap();
    let mut expect = fs::read(&src).unwrap();
    expect[1_000_000..1_005_000].fill(b'z');
    assert!(got == expect, "the fsynced overwrite after SIGKILL");
    d.stop();
}
