//! The cold tier of `--data-path kernel --compress` (`crates/ramd-fs/src/
//! fs/cold.rs`): closed files idle for `--compress-after` move from the
//! private tmpfs into ramd's store, compressed, and back when something
//! needs them. Checked against the real daemon with ordinary tools (sh,
//! sha256sum, stat, truncate, python's os and mmap, fsx): the tmpfs frees
//! what moved and RSS grows by the compressed size only; stat, reads,
//! in-place writes, truncates and mappings of cold files; saves, restarts
//! and SIGKILLs during moves; opens racing moves.

mod common;
mod fs_common;

use common::*;
use fs_common::*;
use serde_json::Value;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// How long a wait for files to go cold may take (a move of a few MiB
/// takes milliseconds; a loaded debug build, seconds).
const COLD_DEADLINE: Duration = Duration::from_secs(60);

/// A kernel-path disk with a cold tier: `--size 256M --data-path kernel
/// --compress zstd --compress-after AFTER EXTRA…`.
fn cold_disk_after(after: &str, extra: &[&str]) -> FsDisk {
    let mut args = vec![
        "--size",
        "256M",
        "--data-path",
        "kernel",
        "--compress",
        "zstd",
        "--compress-after",
        after,
    ];
    args.extend_from_slice(extra);
    FsDisk::mount(&args)
}

/// [`cold_disk_after`] 1s.
fn cold_disk(extra: &[&str]) -> FsDisk {
    cold_disk_after("1s", extra)
}

/// The disk's cold tier in `status --json` (`files`, `data_bytes`,
/// `memory_bytes`, `moved_out`, `moved_in`, `failed`).
fn cold(d: &FsDisk) -> Value {
    let st = d.status();
    let c = st["cold"].clone();
    assert!(c.is_object(), "status has no cold tier: {st}");
    c
}

/// Bytes the private tmpfs holds (its statfs), from `status --json`.
fn hot_bytes(d: &FsDisk) -> u64 {
    field(&d.status(), "hot_bytes")
}

/// Waits until `n` files are cold and the tmpfs holds at most `hot` bytes.
fn wait_cold(d: &FsDisk, n: u64, hot: u64) {
    wait_until(
        COLD_DEADLINE,
        &format!("{n} cold file(s), the tmpfs down to {hot} bytes"),
        || field(&cold(d), "files") == n && hot_bytes(d) <= hot,
    );
}

/// Removes every file of the disk, then waits until the cold tier holds
/// nothing: no copy of a moved, moved-back or cancelled file is left.
fn assert_nothing_left(d: &FsDisk) {
    sh(d.path(), "find . -mindepth 1 -delete");
    wait_until(COLD_DEADLINE, "an empty cold tier", || {
        let c = cold(d);
        field(&c, "files") == 0 && field(&c, "data_bytes") == 0
    });
}

/// A python process holding every regular file under a directory open.
struct Holder(std::process::Child);

/// Opens every regular file under `dir` (read-only) in a helper process
/// and returns once all are open.
fn hold_open(dir: &Path) -> Holder {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(python())
        .arg("-c")
        .arg(
            "import os,sys\n\
             fds=[os.open(os.path.join(r,f),os.O_RDONLY) for r,_,fs in os.walk(sys.argv[1]) \
             for f in fs]\nprint(len(fds),flush=True)\nsys.stdin.read()",
        )
        .arg(dir)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start python3");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("read from python");
    assert!(
        line.trim().parse::<u64>().is_ok(),
        "python printed {line:?}"
    );
    Holder(child)
}

impl Holder {
    /// Closes them all (the helper exits).
    fn release(mut self) {
        drop(self.0.stdin.take());
        let st = wait_child(&mut self.0, CMD_TIMEOUT).expect("python exits");
        assert!(st.success(), "python holding files: {st}");
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `sh -c SCRIPT` in `dir`; panics unless it succeeds.
fn sh(dir: &Path, script: &str) -> String {
    require_tool("sh");
    let mut c = cmd("sh", ["-c", script]);
    c.current_dir(dir);
    run(&mut c, LONG_TIMEOUT).ok()
}

/// What a stat shows of every regular file under `dir` (size, blocks,
/// atime, mtime, ctime to the nanosecond) and its sha256, sorted.
fn files_of(dir: &Path) -> (String, String) {
    for t in ["find", "sort", "xargs", "stat", "sha256sum"] {
        require_tool(t);
    }
    // Stat first: sha256sum's reads may move atime.
    let stat = sh(
        dir,
        "find . -type f -print0 | sort -z | xargs -0 -r stat -c '%n %s %b %.9X %.9Y %.9Z'",
    );
    let sums = sh(
        dir,
        "find . -type f -print0 | sort -z | xargs -0 -r sha256sum",
    );
    (stat, sums)
}

/// Log-like text: compresses several times over, as logs do.
fn log_text(lines: u64, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::new();
    let words = ["GET", "PUT", "POST", "DELETE"];
    for i in 0..lines {
        let w = words[rng.below(4) as usize];
        out.extend_from_slice(
            format!(
                "2026-11-26T12:{:02}:{:02}Z host-{} {w} /api/v1/items/{} status={} took={}ms\n",
                (i / 60) % 60,
                i % 60,
                rng.below(8),
                rng.below(100_000),
                [200, 201, 404, 500][rng.below(4) as usize],
                rng.below(1000)
            )
            .as_bytes(),
        );
    }
    out
}

/// Writes the files of the tests: `n` log-like text files of about 8 MiB
/// and two of random bytes (4 MiB, and an odd size), and a sparse one;
/// returns (text bytes, random bytes).
fn write_files(dir: &Path, n: u64) -> (u64, u64) {
    let mut text = 0;
    for i in 0..n {
        let t = log_text(110_000, i + 1);
        text += t.len() as u64;
        write_file(&dir.join(format!("log{i}.txt")), &t);
    }
    random_file(&dir.join("random"), 4 * MIB);
    random_file(&dir.join("odd"), 123_457);
    sh(
        dir,
        "truncate -s 100M sparse && printf 'far in' | dd of=sparse bs=1 seek=77777777 \
         conv=notrunc status=none",
    );
    (text, 4 * MIB + 123_457)
}

// ---------------------------------------------------------------------------

/// Closed idle files go cold: the tmpfs frees their pages, the daemon's
/// RSS grows by their compressed size rather than their raw size, a stat
/// shows exactly what it did, and a new open reads every byte back.
#[test]
fn idle_files_move_out_compressed_and_back_exact() {
    let d = cold_disk(&[]);
    let rss0 = vm_rss(d.pid());
    let (text, random) = write_files(d.path(), 4);
    let files = 4 + 3;
    // Held open, every file is in the tmpfs (moved back if it went cold
    // meanwhile, on a loaded host), whatever the time. First, so that the
    // times taken below are those the files keep: a file moved back has a
    // new backing file, whose ctime is the move's, and relatime then moves
    // atime at its next read (README: the cold tier).
    let holder = hold_open(d.path());
    // Read once, so that relatime moved every atime already.
    files_of(d.path());
    let before = files_of(d.path());
    let hot_before = hot_bytes(&d);
    assert!(
        hot_before >= text + random,
        "the tmpfs holds {hot_before} bytes with every file open"
    );
    holder.release();
    wait_cold(&d, files, 0);
    let c = cold(&d);
    let stored = field(&c, "memory_bytes");
    // The text compresses (zstd: ~5x on such logs), the random bytes not.
    assert!(
        stored < text / 3 + random + 2 * MIB,
        "the cold tier takes {stored} bytes for {text} bytes of text and {random} random: {c}"
    );
    // What the host sees: the tmpfs holds nothing now, and ramd holds
    // about the compressed size (plus its own buffers), not the raw size.
    let grown = vm_rss(d.pid()).saturating_sub(rss0);
    assert!(
        grown < stored + 24 * MIB && grown < (text + random) / 2,
        "ramd's RSS grew by {grown} bytes for {stored} compressed bytes of {} raw",
        text + random
    );
    // df counts cold files as used: the disk is as full as before.
    let df_used = df(d.path()).used;
    assert!(
        df_used >= text + random,
        "df says {df_used} bytes used with {} bytes cold",
        text + random
    );
    assert_eq!(files_of(d.path()).0, before.0, "stat of cold files");
    // Every file read through a new open: all moved back, byte-exact.
    let after = files_of(d.path());
    assert_eq!(after.1, before.1, "sha256 of files moved back");
    assert!(
        field(&cold(&d), "moved_in") >= files,
        "reads moved them back: {}",
        cold(&d)
    );
    // Idle again, cold again; the store's copies were freed in between.
    wait_cold(&d, files, 0);
    assert_eq!(field(&cold(&d), "failed"), 0, "{}", cold(&d));
    assert_nothing_left(&d);
    d.stop();
}

/// A cold file written in place (pwrite in the middle of an O_RDWR open),
/// truncated by path (`truncate -s`, no open), and mapped read-write.
#[test]
fn cold_files_change_in_place_truncate_and_map() {
    let d = cold_disk(&[]);
    let text = log_text(50_000, 7);
    let f = d.join("f");
    write_file(&f, &text);
    write_file(&d.join("g"), &text);
    write_file(&d.join("m"), &text);
    wait_cold(&d, 3, 0);

    // pwrite in the middle.
    let mut want = text.clone();
    let mid = text.len() / 2 + 3;
    want[mid..mid + 13].copy_from_slice(b"IN THE MIDDLE");
    py_ok(
        "import os,sys\nfd=os.open(sys.argv[1],os.O_RDWR)\n\
         assert os.pwrite(fd,b'IN THE MIDDLE',int(sys.argv[2]))==13\nos.close(fd)",
        &[s(&f), &mid.to_string()],
    );
    assert_eq!(fs::read(&f).unwrap(), want, "after pwrite into a cold file");

    // Truncate by path: SETATTR of size on a closed cold file.
    wait_cold(&d, 3, 0);
    sh(d.path(), "truncate -s 100000 g");
    assert_eq!(
        fs::metadata(d.join("g")).unwrap().len(),
        100_000,
        "size after truncate"
    );
    wait_cold(&d, 3, 0);
    sh(d.path(), "truncate -s 5000000 g");
    let mut g_want = text[..100_000].to_vec();
    g_want.resize(5_000_000, 0);
    assert_eq!(fs::read(d.join("g")).unwrap(), g_want, "shrunk then grown");

    // A mapping of a reopened cold file: read, write through it.
    wait_cold(&d, 3, 0);
    let mut m_want = text.clone();
    m_want[4096..4096 + 6].copy_from_slice(b"mapped");
    let got = py_ok(
        "import mmap,os,sys,hashlib\nfd=os.open(sys.argv[1],os.O_RDWR)\n\
         m=mmap.mmap(fd,0)\nh=hashlib.sha256(m[:]).hexdigest()\n\
         m[4096:4102]=b'mapped'\nm.flush()\nm.close()\nos.close(fd)\nprint(h)",
        &[s(&d.join("m"))],
    );
    assert_eq!(got.trim(), sha256_of(&text), "read through a mapping");
    wait_cold(&d, 3, 0);
    assert_eq!(
        fs::read(d.join("m")).unwrap(),
        m_want,
        "written through a mapping, then cold"
    );
    d.stop();
}

fn sha256_of(data: &[u8]) -> String {
    let dir = scratch();
    let p = dir.path().join("x");
    write_file(&p, data);
    sha256(&p)
}

/// `ramd snapshot` of cold files, an unchanged cold file saves nothing,
/// and a restart from the image gives the same files.
#[test]
fn saves_and_restarts_keep_cold_files() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let disk = |img: &Path| cold_disk(&["--image", s(img)]);
    let d = disk(&img);
    write_files(d.path(), 2);
    let files = 2 + 3;
    wait_cold(&d, files, 0);
    let want = files_of(d.path());
    wait_cold(&d, files, 0);
    let first = snapshot(&d);
    assert_eq!(first["full"], true, "{first}");
    // Nothing changed (reading moved files back and forth): no pages.
    let again = snapshot(&d);
    assert_eq!(
        (field(&again, "pages"), field(&again, "bytes")),
        (0, 0),
        "a snapshot of unchanged cold files wrote something: {again}"
    );
    // One file changed while cold... through an open, then cold again:
    // the next save writes its changed page only.
    sh(
        d.path(),
        "printf 'CHANGED' | dd of=log0.txt bs=1 seek=8192 conv=notrunc status=none",
    );
    wait_cold(&d, files, 0);
    let want = {
        let (stat, sums) = files_of(d.path());
        assert_ne!(sums, want.1, "the change shows");
        (stat, sums)
    };
    wait_cold(&d, files, 0);
    let third = snapshot(&d);
    assert_eq!(field(&third, "pages"), 1, "{third}");
    d.stop();

    let d = disk(&img);
    assert_eq!(
        files_of(d.path()).1,
        want.1,
        "after a clean stop and a load"
    );
    wait_cold(&d, files, 0);
    assert_eq!(files_of(d.path()).1, want.1, "loaded, gone cold, read back");
    d.stop();
}

/// `ramd snapshot NAME --json`; panics unless it succeeds.
fn snapshot(d: &FsDisk) -> Value {
    let out = ramd_cmd(d.run_dir(), &["snapshot", d.name(), "--json"]).ok();
    serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("`ramd snapshot --json` printed invalid JSON ({e}):\n{out}"))
}

/// SIGKILL while files move out: the image still holds the snapshot.
#[test]
fn sigkill_during_moves_then_a_load_from_the_image() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let mut d = cold_disk(&["--image", s(&img)]);
    for i in 0..40u64 {
        write_file(&d.join(&format!("f{i}")), &log_text(20_000, i + 100));
    }
    let want = files_of(d.path()).1;
    snapshot(&d);
    // Kill as soon as the moves have begun and before they are all done.
    wait_until(COLD_DEADLINE, "the first moves", || {
        field(&cold(&d), "moved_out") > 0
    });
    let moved = field(&cold(&d), "files");
    d.kill();
    eprintln!("killed with {moved} of 40 files cold");
    let d = cold_disk(&["--image", s(&img)]);
    assert_eq!(files_of(d.path()).1, want, "loaded after SIGKILL");
    d.stop();
}

/// Opens racing moves: readers open, read and check files over and over
/// while they go cold (`--compress-after 50ms`) and come back; every read
/// is exact, and both kinds of move happened.
#[test]
fn opens_racing_moves_read_exact() {
    let d = cold_disk_after("50ms", &[]);
    let n = 12u64;
    let mut sums = String::new();
    for i in 0..n {
        let t = log_text(10_000 + i * 3000, i + 40);
        write_file(&d.join(&format!("r{i}")), &t);
        sums.push_str(&format!("{} r{i}\n", sha256_of(&t)));
    }
    fs::write(d.join("sums"), sums).unwrap();
    let reader = r#"
import hashlib, os, random, sys, time
d = sys.argv[1]
sums = {}
for l in open(os.path.join(d, "sums")):
    h, n = l.split()
    sums[n] = h
rnd = random.Random(int(sys.argv[2]))
for i in range(150):
    n = rnd.choice(sorted(sums))
    with open(os.path.join(d, n), "rb") as f:
        data = f.read()
    got = hashlib.sha256(data).hexdigest()
    assert got == sums[n], f"{n}: {got} != {sums[n]} (read {len(data)} bytes, round {i})"
    time.sleep(rnd.random() * 0.12)
print("ok")
"#;
    let mut readers: Vec<Command> = Vec::new();
    for seed in 0..3 {
        let mut c = Command::new(python());
        c.arg("-c").arg(reader).arg(d.path()).arg(seed.to_string());
        readers.push(c);
    }
    for out in run_parallel_ok(readers, LONG_TIMEOUT) {
        assert_eq!(out.trim(), "ok");
    }
    let c = cold(&d);
    assert!(
        field(&c, "moved_out") >= n && field(&c, "moved_in") >= n,
        "files should have moved both ways many times: {c}"
    );
    assert_eq!(field(&c, "failed"), 0, "{c}");
    assert_nothing_left(&d);
    d.stop();
}

/// fsx on a disk whose files go cold as soon as they are closed
/// (`--compress-after 0`): its close/open operations race the mover.
#[test]
fn fsx_with_files_going_cold() {
    let mut d = cold_disk_after("0", &[]);
    let bin = cargo_tool("fsx");
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fsx/fsx.toml");
    let artifacts = scratch();
    let out = run(
        Command::new(bin)
            .arg("-f")
            .arg(&config)
            .args(["-N", "20000", "-S", "9090"])
            .arg("-P")
            .arg(artifacts.path())
            .arg(d.join("fsx.bin")),
        LONG_TIMEOUT,
    );
    let text = format!("{}{}", out.stdout, out.stderr);
    assert!(
        out.success() && text.contains("All operations completed A-OK!"),
        "fsx failed ({}): {text}\n--- ramd stderr ---\n{}",
        out.status,
        d.stderr()
    );
    let c = cold(&d);
    eprintln!("fsx with the cold tier: {c}");
    assert!(
        field(&c, "moved_out") + field(&c, "cancelled") > 0,
        "no move began during fsx: {c}"
    );
    assert_nothing_left(&d);
    d.assert_alive();
    d.stop();
}

/// The cold tier full (`--max-memory` below what the files need): moves
/// that do not fit fail, those files stay hot and whole, and the ones that
/// fit still move.
#[test]
fn a_full_cold_tier_leaves_files_hot_and_whole() {
    let d = cold_disk(&["--max-memory", "20M"]);
    for i in 0..4 {
        random_file(&d.join(&format!("r{i}")), 8 * MIB);
    }
    // Read once, so that relatime moved every atime already.
    files_of(d.path());
    let want = files_of(d.path());
    wait_until(COLD_DEADLINE, "failed moves", || {
        field(&cold(&d), "failed") >= 2
    });
    // One status: its figures are of one moment.
    let st = d.status();
    let c = &st["cold"];
    let moved = field(c, "files");
    assert!(
        (1..4).contains(&moved),
        "some but not all files fit the cold tier: {c}"
    );
    // What did not move is still in the tmpfs.
    let hot = field(&st, "hot_bytes");
    assert!(
        hot >= (4 - moved) * 8 * MIB,
        "the tmpfs holds {hot} bytes with {moved} of 4 files cold"
    );
    assert_eq!(files_of(d.path()), want, "every file, hot or cold");
    assert!(
        d.stderr().contains("to the cold tier") && d.stderr().contains("stays in the tmpfs"),
        "the failure is logged:\n{}",
        d.stderr()
    );
    assert_nothing_left(&d);
    d.stop();
}

/// chattr +A (noatime) goes with a file through the cold tier: it comes
/// back in a new tmpfs file, which must carry the flag, or reads move its
/// atime again.
#[test]
fn noatime_survives_a_move_to_the_cold_tier_and_back() {
    require_tool("chattr");
    let d = cold_disk(&[]);
    sh(
        d.path(),
        "echo data > f && chattr +A f && touch -a -d 2001-01-01 f && cat f >/dev/null",
    );
    wait_cold(&d, 1, 0);
    let out = sh(
        d.path(),
        "cat f >/dev/null && cat f >/dev/null && stat -c %X f",
    );
    assert_eq!(
        out.trim(),
        "978307200",
        "atime moved after the file came back"
    );
    assert_nothing_left(&d);
    d.stop();
}
