//! Filesystem disks under the programs people run on a tmpfs: tar, diff,
//! git, SQLite, cp -a, df/du, dd to a full disk (with and without the
//! writeback cache), inode exhaustion, memory given back on rm/truncate/punch,
//! fallocate, mmap, lseek, renameat2, xattrs, atime, parallel writers, large
//! directories, device nodes/FIFOs/sockets/setuid; plus the daemon's
//! mount-point errors and clean stops (umount, SIGINT, SIGTERM, busy mount).
//!
//! Where the kernel's tmpfs is the natural oracle (SEEK_DATA/SEEK_HOLE,
//! xattrs, renameat2, copy_file_range, relatime), the same script runs on a
//! kernel tmpfs and on ramd and the outputs must be identical.

mod common;
mod fs_common;

use common::*;
use fs_common::*;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// How long freed space may take to show (the kernel sends the last
/// release of a file asynchronously after close).
const SETTLE: Duration = Duration::from_secs(10);

fn sh(script: &str) -> Output {
    run(Command::new("sh").args(["-c", script]), LONG_TIMEOUT)
}

fn sh_ok(script: &str) -> String {
    sh(script).ok()
}

/// `dd if=SRC of=PATH bs=1M count=MIB` (full blocks), asserting success.
fn dd(src: &str, path: &Path, mib: u64) {
    require_tool("dd");
    run(
        Command::new("dd")
            .arg(format!("if={src}"))
            .arg(format!("of={}", s(path)))
            .args(["bs=1M", &format!("count={mib}"), "iflag=fullblock"]),
        LONG_TIMEOUT,
    )
    .ok();
}

/// Runs a python snippet on a kernel tmpfs and on `disk` (arg 1: a fresh
/// directory on each); asserts identical output and returns it.
fn same_as_tmpfs(disk: &FsDisk, what: &str, script: &str) -> String {
    let tmpfs = KernelTmpfs::mount("size=64M");
    let on_tmpfs = {
        let d = tmpfs.path().join(what);
        fs::create_dir(&d).unwrap();
        py_ok(script, &[s(&d)])
    };
    let d = disk.join(what);
    fs::create_dir(&d).unwrap();
    let on_ramd = py_ok(script, &[s(&d)]);
    if on_ramd != on_tmpfs {
        let diff: Vec<String> = on_tmpfs
            .lines()
            .zip(on_ramd.lines())
            .filter(|(a, b)| a != b)
            .take(30)
            .map(|(a, b)| format!("  tmpfs: {a}\n  ramd:  {b}"))
            .collect();
        panic!(
            "{what}: ramd differs from kernel tmpfs ({} vs {} lines); first differences:\n{}",
            on_ramd.lines().count(),
            on_tmpfs.lines().count(),
            diff.join("\n")
        );
    }
    assert!(
        !on_ramd.trim().is_empty(),
        "{what}: the script printed nothing"
    );
    on_ramd
}

fn num(v: &serde_json::Value, key: &str) -> u64 {
    field(v, key)
}

/// Waits until `df` shows `want` bytes available; on timeout fails with
/// what df and `ramd status` say.
fn wait_avail(disk: &FsDisk, want: u64, what: &str) {
    let deadline = std::time::Instant::now() + SETTLE;
    loop {
        let d = df(disk.path());
        if d.avail == want {
            return;
        }
        if std::time::Instant::now() >= deadline {
            panic!(
                "{what}: df shows {} bytes available after {SETTLE:?}, expected {want} \
                 ({} bytes short);\ndf: {d:?}\nstatus: {}",
                d.avail,
                want as i64 - d.avail as i64,
                disk.status()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------
// Real programs

/// /usr/include (~130 MiB, ~9000 entries, symlinks) archived into the disk,
/// extracted, compared with `diff -r`, archived again: same archive.
#[test]
fn tar_of_usr_include_extracts_and_rearchives_identically() {
    for t in ["tar", "diff", "cmp"] {
        require_tool(t);
    }
    let src = Path::new("/usr/include");
    assert!(
        src.join("stdio.h").exists(),
        "/usr/include/stdio.h is missing: install libc6-dev (scripts/install-test-tools)"
    );
    let disk = FsDisk::mount(&["--size", "512M", "--threads", "4"]);
    let a = disk.join("a.tar");
    let b = disk.join("b.tar");
    let x = disk.join("x");
    fs::create_dir(&x).unwrap();
    let tar_c = |archive: &Path, dir: &Path| {
        run(
            Command::new("tar")
                .args(["--sort=name", "--numeric-owner", "--format=gnu", "-cf"])
                .arg(archive)
                .arg("-C")
                .arg(dir)
                .arg("include"),
            LONG_TIMEOUT,
        )
        .ok();
    };
    tar_c(&a, Path::new("/usr"));
    run(
        Command::new("tar")
            .args(["--numeric-owner", "-xpf"])
            .arg(&a)
            .arg("-C")
            .arg(&x),
        LONG_TIMEOUT,
    )
    .ok();
    run(
        Command::new("diff")
            .args(["-r", "--no-dereference"])
            .arg(src)
            .arg(x.join("include")),
        LONG_TIMEOUT,
    )
    .ok();
    tar_c(&b, &x);
    let list = |archive: &Path| {
        run(
            Command::new("tar")
                .args(["--numeric-owner", "--full-time", "-tvf"])
                .arg(archive),
            LONG_TIMEOUT,
        )
        .ok()
    };
    let (la, lb) = (list(&a), list(&b));
    assert!(la.lines().count() > 1000, "archive lists only:\n{la}");
    if la != lb {
        let first = la
            .lines()
            .zip(lb.lines())
            .find(|(p, q)| p != q)
            .map(|(p, q)| format!("source: {p}\nramd:   {q}"))
            .unwrap_or_else(|| "(one listing is a prefix of the other)".into());
        panic!("re-archived listing differs (names, modes, owners, sizes, mtimes):\n{first}");
    }
    run(Command::new("cmp").arg(&a).arg(&b), LONG_TIMEOUT).ok();
    disk.stop();
}

/// A git repository with several commits, a branch, a merge and a gc
/// (pack files, renames, mmap), on a writeback-cache mount.
#[test]
fn git_repository_survives_commits_gc_and_fsck() {
    let git = require_tool("git");
    let disk = FsDisk::mount(&["--size", "256M", "--writeback-cache"]);
    let repo = disk.join("repo");
    fs::create_dir(&repo).unwrap();
    let home = scratch();
    let g = |args: &[&str]| {
        run(
            Command::new(&git)
                .arg("-C")
                .arg(&repo)
                .args([
                    "-c",
                    "user.name=ramd test",
                    "-c",
                    "user.email=test@ramd.invalid",
                    "-c",
                    "init.defaultBranch=main",
                ])
                .args(args)
                .env("HOME", home.path())
                .env("GIT_CONFIG_NOSYSTEM", "1"),
            LONG_TIMEOUT,
        )
        .ok()
    };
    g(&["init", "-q"]);
    let mut rng = Rng::new(99);
    for c in 0..8u64 {
        if c == 4 {
            g(&["checkout", "-q", "-b", "side"]);
        }
        if c == 6 {
            g(&["checkout", "-q", "main"]);
            fs::write(repo.join("main-only.txt"), b"main\n").unwrap();
        }
        for f in 0..40u64 {
            let dir = repo.join(format!("d{}", f % 5));
            fs::create_dir_all(&dir).unwrap();
            if rng.below(3) == 0 || c == 0 {
                let mut buf = vec![0u8; (rng.below(64 * 1024) + 1) as usize];
                if f % 2 == 0 {
                    // Text-like, compressible and delta-able.
                    for (i, b) in buf.iter_mut().enumerate() {
                        *b = b"abcdefgh \n"[(i + c as usize) % 10];
                    }
                } else {
                    rng.fill(&mut buf);
                }
                fs::write(dir.join(format!("f{f}.dat")), &buf).unwrap();
            }
        }
        g(&["add", "-A"]);
        g(&["commit", "-q", "-m", &format!("commit {c}")]);
    }
    g(&["merge", "-q", "--no-edit", "-X", "theirs", "side"]);
    g(&["mv", "d0", "moved"]);
    g(&["commit", "-q", "-m", "rename"]);
    g(&["gc", "-q", "--aggressive", "--prune=now"]);
    g(&["fsck", "--full", "--strict", "--no-progress"]);
    assert_eq!(g(&["status", "--porcelain"]), "", "work tree not clean");
    let log = g(&["log", "--oneline"]);
    assert!(log.lines().count() >= 10, "git log:\n{log}");
    // A fresh clone from the packed repository checks out the same tree.
    let clone = disk.join("clone");
    run(
        Command::new(&git)
            .args(["clone", "-q"])
            .arg(&repo)
            .arg(&clone)
            .env("HOME", home.path())
            .env("GIT_CONFIG_NOSYSTEM", "1"),
        LONG_TIMEOUT,
    )
    .ok();
    run(
        Command::new("diff")
            .args(["-r", "--exclude=.git"])
            .arg(&repo)
            .arg(&clone),
        LONG_TIMEOUT,
    )
    .ok();
    disk.stop();
}

/// Two processes inserting into one SQLite database at once (POSIX locks,
/// journal or WAL with its mmapped -shm), then integrity_check.
const SQLITE_WRITER: &str = r#"
import os, random, sqlite3, sys
db, journal, wid, txns, rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
con = sqlite3.connect(db, timeout=120, isolation_level=None)
con.execute(f"PRAGMA journal_mode={journal}")
con.execute("CREATE TABLE IF NOT EXISTS t (w INTEGER, k INTEGER, v BLOB, PRIMARY KEY (w, k))")
rnd = random.Random(wid)
for t in range(txns):
    con.execute("BEGIN IMMEDIATE")
    for i in range(rows):
        k = t * rows + i
        con.execute("INSERT INTO t VALUES (?, ?, ?)", (wid, k, rnd.randbytes(rnd.randrange(0, 3000))))
    # Rewrite some earlier rows: page splits and overflow chains change.
    con.execute("UPDATE t SET v = randomblob(5000) WHERE w = ? AND k % 97 = ?", (wid, t % 97))
    con.execute("COMMIT")
con.execute("DELETE FROM t WHERE w = ? AND k % 10 = 0", (wid,))
con.close()
"#;

fn sqlite_load(disk: &FsDisk, journal: &str) {
    let sqlite3 = require_tool("sqlite3");
    let db = disk.join(&format!("load-{journal}.db"));
    let (txns, rows) = (40u64, 250u64);
    // Set the journal mode once, before the writers race: switching a
    // database into WAL needs an exclusive lock that SQLite may refuse at
    // once (SQLITE_BUSY, no busy wait) when two connections try together.
    run(
        Command::new(&sqlite3).arg(&db).arg(format!(
            "PRAGMA journal_mode={journal}; \
             CREATE TABLE IF NOT EXISTS t (w INTEGER, k INTEGER, v BLOB, PRIMARY KEY (w, k));"
        )),
        CMD_TIMEOUT,
    )
    .ok();
    let writers: Vec<Command> = (0..2)
        .map(|w| {
            let mut c = Command::new(python());
            c.arg("-c").arg(SQLITE_WRITER).args([
                s(&db),
                journal,
                &w.to_string(),
                &txns.to_string(),
                &rows.to_string(),
            ]);
            c
        })
        .collect();
    run_parallel_ok(writers, LONG_TIMEOUT);
    let mut vacuum = Command::new(&sqlite3);
    vacuum.arg(&db).arg("VACUUM;");
    run(&mut vacuum, LONG_TIMEOUT).ok();
    let out = run(
        Command::new(&sqlite3)
            .arg(&db)
            .arg("PRAGMA integrity_check; SELECT count(*) FROM t; PRAGMA journal_mode;"),
        LONG_TIMEOUT,
    )
    .ok();
    let expect = 2 * txns * rows * 9 / 10;
    assert_eq!(
        out.trim(),
        format!("ok\n{expect}\n{}", journal.to_lowercase()),
        "sqlite {journal}: integrity_check, row count, journal mode"
    );
}

#[test]
fn sqlite_under_concurrent_writers_passes_integrity_check() {
    let disk = FsDisk::mount(&["--size", "256M"]);
    sqlite_load(&disk, "DELETE");
    sqlite_load(&disk, "WAL");
    disk.stop();
}

// ---------------------------------------------------------------------------
// Metadata preserved by cp -a

/// `find DIR -printf` of everything `cp -a` must preserve: type and mode,
/// owner, size, link count, mtime and atime (ns), symlink target.
fn tree_listing(dir: &Path) -> String {
    require_tool("find");
    let out = run(
        Command::new("find")
            .arg(".")
            .args(["-printf", "%p %y %m %U %G %s %n %T@ %A@ %l\\n"])
            .current_dir(dir),
        CMD_TIMEOUT,
    )
    .ok();
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    lines.join("\n")
}

/// Every xattr of every entry, all namespaces (`getfattr -d -m -`).
/// Every file's xattrs under `dir`, by file name: `getfattr -R` goes in
/// the order a directory lists, which is the order its names were made.
fn xattr_dump(dir: &Path) -> String {
    require_tool("getfattr");
    let out = run(
        Command::new("getfattr")
            .args(["-R", "-h", "-d", "-m", "-", "-e", "hex", "."])
            .current_dir(dir),
        CMD_TIMEOUT,
    )
    .ok();
    let mut files: Vec<&str> = out.split("\n\n").filter(|b| !b.is_empty()).collect();
    files.sort();
    files.join("\n\n")
}

#[test]
fn cp_a_preserves_modes_owners_times_and_xattrs() {
    for t in ["cp", "touch", "chown", "chmod", "setfattr", "mkfifo", "ln"] {
        require_tool(t);
    }
    let disk = FsDisk::mount(&["--size", "128M"]);
    let src = disk.join("src");
    fs::create_dir(&src).unwrap();
    sh_ok(&format!(
        r#"set -e
cd '{}'
printf 'alpha\n' > a; chown 1001:1001 a; chmod 0640 a
setfattr -n user.color -v red a
setfattr -n user.empty a
setfattr -n trusted.level -v 0x0102ff a
setfattr -n security.label -v secret a
printf 'suid\n' > b; chmod 4755 b
printf 'sgid\n' > c; chown 0:1001 c; chmod 2750 c
mkdir d; chown 65534:65534 d; chmod 1777 d
printf 'deep\n' > d/e; chmod 0600 d/e; setfattr -n user.deep -v 1 d/e
setfattr -n user.dir -v yes d
ln -s a l; chown -h 1001:1001 l
ln a h
mkfifo -m 0620 p
: > empty
dd if=/dev/urandom of=sparse bs=4096 count=3 seek=256 status=none
truncate -s 4M sparse
touch -m -h -d '2001-02-03 04:05:06.123456789' a b c d/e l p empty sparse
touch -m -d '1999-12-31 23:59:59.5' d
touch -m -d '2010-10-10 10:10:10.000000001' .
# atime after ctime, so reads (find, cp) do not move it under relatime.
touch -a -h -d '2035-05-06 07:08:09.987654321' a b c d/e l p empty sparse d .
"#,
        s(&src)
    ));
    let before = tree_listing(&src);
    let xattrs = xattr_dump(&src);
    for needle in [
        "user.color",
        "user.empty",
        "trusted.level",
        "security.label",
        "user.deep",
        "user.dir",
    ] {
        assert!(
            xattrs.contains(needle),
            "{needle} not set on the source:\n{xattrs}"
        );
    }

    let dst = disk.join("dst");
    run(
        Command::new("cp").arg("-a").arg(&src).arg(&dst),
        LONG_TIMEOUT,
    )
    .ok();

    let after = tree_listing(&dst);
    if before != after {
        let diff: Vec<String> = before
            .lines()
            .zip(after.lines())
            .filter(|(p, q)| p != q)
            .map(|(p, q)| format!("  src: {p}\n  dst: {q}"))
            .collect();
        panic!(
            "cp -a did not preserve metadata (path type mode uid gid size nlink mtime atime target):\n{}",
            diff.join("\n")
        );
    }
    assert_eq!(xattr_dump(&dst), xattrs, "cp -a did not preserve xattrs");
    // GNU diff reports any two FIFOs as different (on every filesystem);
    // `p`'s type and mode are already compared in the listing above.
    run(
        Command::new("diff")
            .args(["-r", "--no-dereference", "--exclude=p"])
            .arg(&src)
            .arg(&dst),
        CMD_TIMEOUT,
    )
    .ok();
    // Hard links stay linked, sparse files stay sparse.
    let (a, h) = (
        fs::metadata(dst.join("a")).unwrap(),
        fs::metadata(dst.join("h")).unwrap(),
    );
    assert_eq!(a.ino(), h.ino(), "cp -a did not keep the hard link");
    let sp = fs::metadata(dst.join("sparse")).unwrap();
    assert_eq!(sp.len(), 4 * MIB);
    assert!(
        sp.blocks() * 512 <= 64 * KIB,
        "copied sparse file uses {} bytes",
        sp.blocks() * 512
    );
    disk.stop();
}

// ---------------------------------------------------------------------------
// Space and inodes: df, du, ENOSPC, memory

#[test]
fn df_follows_writes_deletes_and_inode_use() {
    let disk = FsDisk::mount(&["--size", "256M", "--nr-inodes", "5000"]);
    let d0 = df(disk.path());
    assert_eq!(d0.size, 256 * MIB, "df size: {d0:?}");
    assert_eq!(d0.itotal, 5000, "df -i total: {d0:?}");
    assert_eq!(d0.used + d0.avail, d0.size, "{d0:?}");
    assert_eq!(d0.iused + d0.ifree, d0.itotal, "{d0:?}");
    assert!(d0.iused >= 1, "the root directory is an inode: {d0:?}");

    let f = disk.join("big");
    dd("/dev/urandom", &f, 64);
    let d1 = df(disk.path());
    assert_eq!(
        d1.used - d0.used,
        64 * MIB,
        "df after writing 64 MiB: {d0:?} -> {d1:?}"
    );
    assert_eq!(d0.avail - d1.avail, 64 * MIB, "{d0:?} -> {d1:?}");
    assert_eq!(d1.iused, d0.iused + 1, "{d0:?} -> {d1:?}");
    let st = disk.status();
    assert_eq!(num(&st, "used_bytes"), d1.used, "status vs df: {st}");

    fs::remove_file(&f).unwrap();
    wait_until(SETTLE, "df to show the deleted file's space free", || {
        df(disk.path()).used == d0.used
    });

    let py = r#"
import os, sys
d = sys.argv[1]
for i in range(1000):
    os.close(os.open(os.path.join(d, f"f{i}"), os.O_CREAT | os.O_WRONLY, 0o644))
for i in range(10):
    os.mkdir(os.path.join(d, f"dir{i}"))
    os.symlink("f0", os.path.join(d, f"dir{i}", "link"))
"#;
    let dir = disk.join("many");
    fs::create_dir(&dir).unwrap();
    py_ok(py, &[s(&dir)]);
    let d2 = df(disk.path());
    assert_eq!(
        d2.iused,
        d0.iused + 1 + 1000 + 10 + 10,
        "df -i: {d0:?} -> {d2:?}"
    );
    assert_eq!(d2.ifree, d0.ifree - 1021, "{d0:?} -> {d2:?}");
    let st = disk.status();
    assert_eq!(num(&st, "inodes"), d2.iused, "status vs df -i: {st}");
    fs::remove_dir_all(&dir).unwrap();
    wait_until(SETTLE, "df -i to show the inodes free", || {
        df(disk.path()).iused == d0.iused
    });
    disk.stop();
}

/// Without the write-back cache, a full disk is tmpfs's to the byte: each
/// write(2) that does not fit fails (or is short) itself. (The default's
/// guarantee: a_full_disk_under_the_default_writeback_cache_loses_nothing_silently.)
#[test]
fn a_full_disk_gives_enospc_keeps_data_and_recovers() {
    require_tool("dd");
    let disk = FsDisk::mount(&[
        "--size",
        "64M",
        "--no-writeback-cache",
        "--data-path",
        "store",
    ]);
    let keep = disk.join("keep");
    dd("/dev/urandom", &keep, 8);
    let keep_sum = sha256(&keep);

    // Zeros count like any data (tmpfs allocates them too).
    let fill = disk.join("fill");
    let out = run(
        Command::new("dd")
            .arg("if=/dev/zero")
            .arg(format!("of={}", s(&fill)))
            .arg("bs=1M"),
        LONG_TIMEOUT,
    );
    let out = out.failed();
    assert!(
        out.stderr.contains("No space left on device"),
        "dd to a full disk: {}",
        out.stderr
    );
    let filled = fs::metadata(&fill).unwrap().len();
    assert_eq!(
        filled,
        56 * MIB,
        "the disk filled at {filled} bytes, not at its size"
    );
    let d = df(disk.path());
    assert_eq!(d.avail, 0, "{d:?}");
    assert_eq!(d.used, 64 * MIB, "{d:?}");

    // Still usable: reads, metadata, empty files; but no new data.
    assert_eq!(sha256(&keep), keep_sum, "existing file changed by ENOSPC");
    fs::write(disk.join("empty"), b"").unwrap();
    fs::create_dir(disk.join("dir")).unwrap();
    let err = fs::write(disk.join("small"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    // (bash, not sh: dash reports every write error as "I/O error".)
    let bash = require_tool("bash");
    let out = run(
        Command::new(bash).args(["-c", &format!("echo hi >> '{}'", s(&keep))]),
        CMD_TIMEOUT,
    )
    .failed();
    assert!(out.stderr.contains("No space left"), "{}", out.stderr);
    assert_eq!(sha256(&keep), keep_sum, "a failed append changed the file");

    fs::remove_file(&fill).unwrap();
    wait_avail(&disk, 56 * MIB, "space after rm");
    // Filling again with a pattern: every byte write(2) accepted is there.
    let pat = disk.join("pattern");
    let out = py_ok(OVERFILL, &[s(&pat), &(100 * MIB).to_string()]);
    assert_eq!(
        out.trim(),
        format!("{} True write ENOSPC", 56 * MIB),
        "written bytes, read back intact, errors"
    );
    fs::remove_file(&pat).unwrap();
    wait_avail(&disk, 56 * MIB, "space after rm");
    let again = disk.join("again");
    dd("/dev/urandom", &again, 32);
    assert_eq!(fs::metadata(&again).unwrap().len(), 32 * MIB);
    assert_eq!(sha256(&keep), keep_sum);
    disk.stop();
}

/// Writes TOTAL bytes of a pattern (byte at offset o is o % 256) until done
/// or an error; fsyncs; drops the page cache of the file and reads back what
/// ramd holds. Prints: bytes accepted, whether they read back intact, errors.
const OVERFILL: &str = r#"
import errno, os, sys
p, total = sys.argv[1], int(sys.argv[2])
pat = bytes(range(256)) * 4097
fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
written, errs = 0, []
try:
    while written < total:
        n = min(1 << 20, total - written)
        written += os.write(fd, pat[written % 256:written % 256 + n])
except OSError as e:
    errs.append("write " + errno.errorcode[e.errno])
try:
    os.fsync(fd)
except OSError as e:
    errs.append("fsync " + errno.errorcode[e.errno])
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
back = os.pread(fd, written, 0)
intact = back == (bytes(range(256)) * (written // 256 + 1))[:written]
try:
    os.close(fd)
except OSError as e:
    errs.append("close " + errno.errorcode[e.errno])
print(written, intact, *errs)
"#;

/// With --writeback-cache the kernel takes writes into its cache and sends
/// them later: running out of space must still reach the program (at write,
/// fsync or close), never vanish, and the disk must recover after rm.
#[test]
fn a_full_disk_with_writeback_cache_still_reports_enospc() {
    let disk = FsDisk::mount(&["--size", "64M", "--writeback-cache"]);
    let keep = disk.join("keep");
    dd("/dev/urandom", &keep, 8);
    let keep_sum = sha256(&keep);
    let fill = disk.join("fill");
    let out = py_ok(OVERFILL, &[s(&fill), &(100 * MIB).to_string()]);
    assert!(
        out.contains("ENOSPC"),
        "100 MiB into a 64 MiB disk (8 MiB used) reported no error: {out}"
    );
    // A flush from the kernel's cache fails whole (so that its error reaches
    // fsync/close), so less than one flush request (max_write, 1 MiB) may
    // stay free; a program's own writes fill the disk to the byte.
    assert!(df(disk.path()).avail < MIB, "{:?}", df(disk.path()));
    let out = py_ok(OVERFILL, &[s(&disk.join("more")), &MIB.to_string()]);
    assert!(
        out.contains("ENOSPC"),
        "a write to a full disk reported no error: {out}"
    );
    assert_eq!(sha256(&keep), keep_sum, "existing file changed by ENOSPC");

    fs::remove_file(&fill).unwrap();
    fs::remove_file(disk.join("more")).unwrap();
    wait_avail(&disk, 56 * MIB, "space after rm");
    let out = py_ok(OVERFILL, &[s(&disk.join("again")), &(32 * MIB).to_string()]);
    assert_eq!(out.trim(), format!("{} True", 32 * MIB), "after rm: {out}");
    assert_eq!(sha256(&keep), keep_sum);
    disk.stop();
}

#[test]
fn running_out_of_inodes_gives_enospc_and_recovers() {
    let disk = FsDisk::mount(&["--size", "64M", "--nr-inodes", "64"]);
    let py = r#"
import errno, os, sys
d = sys.argv[1]
n = 0
try:
    while True:
        os.close(os.open(os.path.join(d, f"f{n}"), os.O_CREAT | os.O_WRONLY, 0o644))
        n += 1
except OSError as e:
    print(n, errno.errorcode[e.errno])
for what, fn in [("mkdir", lambda p: os.mkdir(p)),
                 ("symlink", lambda p: os.symlink("f0", p)),
                 ("mkfifo", lambda p: os.mkfifo(p)),
                 ("mknod", lambda p: os.mknod(p, 0o600 | 0o020000, os.makedev(1, 3)))]:
    try:
        fn(os.path.join(d, "x-" + what))
        print(what, "ok")
    except OSError as e:
        print(what, errno.errorcode[e.errno])
# Data still goes into existing files.
with open(os.path.join(d, "f0"), "wb") as f:
    f.write(b"still writable")
os.unlink(os.path.join(d, "f1"))
os.close(os.open(os.path.join(d, "after-rm"), os.O_CREAT | os.O_WRONLY, 0o644))
print("create after rm ok")
"#;
    let out = py_ok(py, &[s(disk.path())]);
    // The root directory is one of the 64.
    assert_eq!(
        out,
        "63 ENOSPC\nmkdir ENOSPC\nsymlink ENOSPC\nmkfifo ENOSPC\nmknod ENOSPC\ncreate after rm ok\n"
    );
    let d = df(disk.path());
    assert_eq!((d.itotal, d.iused, d.ifree), (64, 64, 0), "{d:?}");
    assert_eq!(fs::read(disk.join("f0")).unwrap(), b"still writable");
    disk.stop();
}

#[test]
fn deleting_and_truncating_free_memory() {
    require_tool("fallocate");
    // The store's own page counts (the kernel path's memory is tmpfs's:
    // fs_kernel_data's unlink_frees_the_hot_tier).
    let disk = FsDisk::mount(&["--size", "512M", "--data-path", "store"]);
    let s0 = disk.status();
    let base = num(&s0, "data_pages");
    let f = disk.join("f");
    dd("/dev/urandom", &f, 128);
    let s1 = disk.status();
    assert!(
        num(&s1, "data_pages") >= base + 128 * MIB / PAGE,
        "128 MiB written but: {s0} -> {s1}"
    );
    assert!(
        num(&s1, "memory_used") >= num(&s0, "memory_used") + 128 * MIB,
        "{s0} -> {s1}"
    );

    // Unlinked while open: the data stays until the last close.
    let marker = scratch();
    let ready = marker.path().join("unlinked");
    let hold = r#"
import hashlib, os, sys
path, ready = sys.argv[1], sys.argv[2]
fd = os.open(path, os.O_RDONLY)
before = hashlib.sha256(os.pread(fd, 128 << 20, 0)).hexdigest()
os.unlink(path)
open(ready, "w").close()
sys.stdin.read()
after = hashlib.sha256(os.pread(fd, 128 << 20, 0)).hexdigest()
assert before == after, "an unlinked open file changed"
os.close(fd)
print("same")
"#;
    let mut holder = Background::spawn(
        Command::new(python())
            .arg("-c")
            .arg(hold)
            .arg(&f)
            .arg(&ready),
    );
    wait_until(CMD_TIMEOUT, "the holder to unlink the file", || {
        holder.assert_running();
        ready.exists()
    });
    assert!(!f.exists());
    let s2 = disk.status();
    assert!(
        num(&s2, "data_pages") >= base + 128 * MIB / PAGE,
        "an unlinked but open file lost its pages: {s2}"
    );
    assert_eq!(holder.finish_ok().trim(), "same");
    wait_until(SETTLE, "pages of the deleted file to be freed", || {
        num(&disk.status(), "data_pages") <= base
    });
    let s3 = disk.status();
    assert!(
        num(&s3, "memory_used") <= num(&s0, "memory_used") + MIB,
        "memory not given back after rm: {s0} -> {s3}"
    );

    // Truncate and punch hole free pages too.
    dd("/dev/urandom", &f, 64);
    let full = num(&disk.status(), "data_pages");
    fs::OpenOptions::new()
        .write(true)
        .open(&f)
        .unwrap()
        .set_len(4096)
        .unwrap();
    wait_until(SETTLE, "truncate to free pages", || {
        num(&disk.status(), "data_pages") <= full - (64 * MIB / PAGE - 1)
    });
    dd("/dev/urandom", &f, 64);
    let full = num(&disk.status(), "data_pages");
    run(
        Command::new("fallocate")
            .args(["-p", "-o", "16M", "-l", "32M"])
            .arg(&f),
        CMD_TIMEOUT,
    )
    .ok();
    wait_until(SETTLE, "punch hole to free pages", || {
        num(&disk.status(), "data_pages") <= full - 32 * MIB / PAGE
    });
    disk.stop();
}

#[test]
fn fallocate_modes_and_du_show_allocation() {
    require_tool("fallocate");
    require_tool("truncate");
    // The store path: it has FALLOC_FL_ZERO_RANGE, which tmpfs (and so
    // the kernel path) has not.
    let disk = FsDisk::mount(&["--size", "256M", "--data-path", "store"]);
    let f = disk.join("f");
    let fa = |args: &[&str], path: &Path| {
        let mut c = Command::new("fallocate");
        c.args(args).arg(path);
        run(&mut c, CMD_TIMEOUT)
    };
    let size = |p: &Path| fs::metadata(p).unwrap().len();
    let zeros_at = |p: &Path, off: u64, len: u64| {
        let out = py_ok(
            "import sys\nf=open(sys.argv[1],'rb'); f.seek(int(sys.argv[2]))\n\
             d=f.read(int(sys.argv[3])); print(len(d), d.count(0))",
            &[s(p), &off.to_string(), &len.to_string()],
        );
        assert_eq!(
            out.trim(),
            format!("{len} {len}"),
            "[{off}, +{len}) is not all zeros"
        );
    };
    let d0 = df(disk.path());

    // Mode 0: allocated, counted, reads as zeros.
    fa(&["-l", "64M"], &f).ok();
    assert_eq!(size(&f), 64 * MIB);
    assert_eq!(du(&f, false), 64 * MIB, "du after fallocate -l 64M");
    assert_eq!(df(disk.path()).used, d0.used + 64 * MIB);
    zeros_at(&f, 0, 64 * MIB);

    // Punch a hole: blocks go, size stays.
    fa(&["-p", "-o", "16M", "-l", "16M"], &f).ok();
    assert_eq!(size(&f), 64 * MIB);
    assert_eq!(du(&f, false), 48 * MIB, "du after punching 16 MiB");
    assert_eq!(du(&f, true), 64 * MIB, "apparent size after punch");

    // Zero range over data: reads as zeros, size unchanged.
    let data = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_WRONLY)
os.pwrite(fd, b"\x5a" * (8 << 20), 32 << 20)
os.close(fd)
"#;
    py_ok(data, &[s(&f)]);
    fa(&["-z", "-o", "34M", "-l", "4M"], &f).ok();
    assert_eq!(size(&f), 64 * MIB);
    zeros_at(&f, 34 * MIB, 4 * MIB);
    let out = py_ok(
        "import sys\nf=open(sys.argv[1],'rb'); f.seek(32<<20); d=f.read(8<<20)\n\
         print(d[:2<<20].count(0x5a), d[6<<20:].count(0x5a))",
        &[s(&f)],
    );
    assert_eq!(
        out.trim(),
        format!("{} {}", 2 * MIB, 2 * MIB),
        "zero range overran"
    );
    // fallocate(2): "blocks are preallocated for the regions that span holes"
    // and the range stays allocated.
    assert_eq!(du(&f, false), 48 * MIB, "du after zeroing allocated blocks");
    fa(&["-z", "-o", "20M", "-l", "4M"], &f).ok();
    assert_eq!(du(&f, false), 52 * MIB, "du after zeroing 4 MiB of a hole");
    zeros_at(&f, 16 * MIB, 16 * MIB);
    assert_eq!(size(&f), 64 * MIB);

    // Keep size: blocks past EOF, size unchanged.
    fa(&["-n", "-o", "64M", "-l", "16M"], &f).ok();
    assert_eq!(size(&f), 64 * MIB, "fallocate -n changed the size");
    assert_eq!(du(&f, false), 68 * MIB, "52 MiB + 16 MiB kept past EOF");

    // More than the free space: ENOSPC, and nothing half-allocated.
    let big = disk.join("big");
    let before = df(disk.path());
    let out = fa(&["-l", "1G"], &big).failed();
    assert!(out.stderr.contains("No space left"), "{}", out.stderr);
    assert_eq!(size(&big), 0, "a failed fallocate changed the size");
    assert_eq!(
        df(disk.path()).used,
        before.used,
        "a failed fallocate kept blocks"
    );

    // Sparse files may be bigger than the disk; they use what is written.
    let sp = disk.join("sparse");
    run(
        Command::new("truncate").args(["-s", "1G"]).arg(&sp),
        CMD_TIMEOUT,
    )
    .ok();
    assert_eq!(size(&sp), 1 << 30);
    assert_eq!(du(&sp, false), 0);
    py_ok(
        "import os,sys\nfd=os.open(sys.argv[1],os.O_WRONLY); os.pwrite(fd,b'x',100<<20); os.close(fd)",
        &[s(&sp)],
    );
    assert_eq!(du(&sp, false), PAGE, "one byte written in a sparse file");
    assert_eq!(size(&sp), 1 << 30);
    disk.stop();
}

// ---------------------------------------------------------------------------
// Syscall semantics compared with kernel tmpfs

#[test]
fn mmap_writes_and_reads_reach_the_daemon() {
    let disk = FsDisk::mount(&["--size", "128M"]);
    let py = r#"
import mmap, os, sys
path = sys.argv[1]
size = (8 << 20) + 123
fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
os.ftruncate(fd, size)
m = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
spots = [(0, b"start"), (4093, b"across-page"), ((1 << 20) - 3, b"x" * 4099), (size - 7, b"the-end")]
for off, data in spots:
    m[off:off + len(data)] = data
m.flush()
# A second shared mapping sees the same bytes; pread too.
m2 = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
for off, data in spots:
    assert m2[off:off + len(data)] == data, ("mapping", off)
    assert os.pread(fd, len(data), off) == data, ("pread", off)
# pwrite shows through an existing mapping.
os.pwrite(fd, b"pwritten", 5 << 20)
assert m[5 << 20:(5 << 20) + 8] == b"pwritten"
# A private mapping's writes stay private.
p = mmap.mmap(fd, size, mmap.MAP_PRIVATE, mmap.PROT_READ | mmap.PROT_WRITE)
p[0:5] = b"PRIVA"
assert os.pread(fd, 5, 0) == b"start"
for x in (p, m2, m):
    x.close()
os.close(fd)
# O_DIRECT reads come from ramd, not the page cache.
buf = mmap.mmap(-1, size + 4096)
fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
n = os.preadv(fd, [memoryview(buf)[:(size + 4095) // 4096 * 4096]], 0)
os.close(fd)
assert n == size, n
for off, data in spots + [(5 << 20, b"pwritten")]:
    assert buf[off:off + len(data)] == data, ("O_DIRECT", off)
assert buf[2 << 20:(2 << 20) + 4096] == bytes(4096)
print("ok")
"#;
    assert_eq!(py_ok(py, &[s(&disk.join("mapped"))]).trim(), "ok");
    disk.stop();
}

const SEEK_SCRIPT: &str = r#"
import ctypes, errno, os, sys
d = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
M = 1 << 20
def make(name, size, writes=(), punches=()):
    fd = os.open(os.path.join(d, name), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    os.ftruncate(fd, size)
    for off, n in writes:
        os.pwrite(fd, b"\xa5" * n, off)
    for off, n in punches:
        if libc.fallocate(fd, 3, off, n) != 0:  # PUNCH_HOLE | KEEP_SIZE
            raise OSError(ctypes.get_errno(), "punch")
    os.close(fd)
make("empty", 0)
make("sparse", 4 * M)
make("mixed", 4 * M + 1000,
     [(0, 4096), (M + 100, 100), (2 * M - 10, 20), (3 * M, 256 << 10), (4 * M + 500, 10)],
     [(3 * M + (64 << 10), 64 << 10)])
make("dense", 10000, [(0, 10000)])
make("punched", 1 * M, [(0, M)], [(0, M)])
for name in ["empty", "sparse", "mixed", "dense", "punched"]:
    fd = os.open(os.path.join(d, name), os.O_RDONLY)
    size = os.fstat(fd).st_size
    offs = sorted(set(list(range(0, size + 8192, 2048)) + [max(size - 1, 0), size, size + 1]))
    for off in offs:
        r = []
        for how in (os.SEEK_DATA, os.SEEK_HOLE):
            try:
                r.append(str(os.lseek(fd, off, how)))
            except OSError as e:
                r.append(errno.errorcode[e.errno])
        print(name, off, *r)
    os.close(fd)
"#;

#[test]
fn seek_data_and_seek_hole_match_kernel_tmpfs() {
    let disk = FsDisk::mount(&["--size", "64M"]);
    let out = same_as_tmpfs(&disk, "seek", SEEK_SCRIPT);
    // Not vacuous: the mixed file has holes where expected.
    assert!(out.contains("mixed 4096 1048576 4096"), "{out}");
    disk.stop();
}

const XATTR_SCRIPT: &str = r#"
import errno, os, sys
d = sys.argv[1]
f = os.path.join(d, "f"); open(f, "w").close()
os.mkdir(os.path.join(d, "dir"))
os.symlink("f", os.path.join(d, "link"))
def t(what, fn):
    try:
        r = fn()
        print(what, "ok" if r is None else r)
    except OSError as e:
        print(what, errno.errorcode[e.errno])
for ns in ["user", "trusted", "security"]:
    n = ns + ".k"
    t(f"set {n}", lambda: os.setxattr(f, n, b"v1"))
    t(f"get {n}", lambda: os.getxattr(f, n))
    t(f"create existing {n}", lambda: os.setxattr(f, n, b"v2", os.XATTR_CREATE))
    t(f"replace {n}", lambda: os.setxattr(f, n, b"v3", os.XATTR_REPLACE))
    t(f"get {n}", lambda: os.getxattr(f, n))
    t(f"replace missing {n}", lambda: os.setxattr(f, n + "2", b"x", os.XATTR_REPLACE))
    t(f"empty value {n}", lambda: os.setxattr(f, n + "e", b""))
    t(f"get empty {n}", lambda: os.getxattr(f, n + "e"))
    t(f"on dir {n}", lambda: os.setxattr(os.path.join(d, "dir"), n, b"d"))
t("list", lambda: sorted(os.listxattr(f)))
t("remove user.k", lambda: os.removexattr(f, "user.k"))
t("get removed", lambda: os.getxattr(f, "user.k"))
t("remove missing", lambda: os.removexattr(f, "user.nope"))
t("list after remove", lambda: sorted(os.listxattr(f)))
big = bytes(range(256)) * 256
t("set 64KiB", lambda: os.setxattr(f, "user.big", big))
t("get 64KiB", lambda: os.getxattr(f, "user.big") == big)
t("set 64KiB+1", lambda: os.setxattr(f, "user.big2", big + b"x"))
t("name 255", lambda: os.setxattr(f, "user." + "n" * 250, b"1"))
t("name 256", lambda: os.setxattr(f, "user." + "n" * 251, b"1"))
t("unknown namespace", lambda: os.setxattr(f, "bogus.k", b"1"))
t("user on symlink", lambda: os.setxattr(os.path.join(d, "link"), "user.k", b"1", follow_symlinks=False))
t("trusted on symlink", lambda: os.setxattr(os.path.join(d, "link"), "trusted.k", b"1", follow_symlinks=False))
t("get via symlink", lambda: os.getxattr(os.path.join(d, "link"), "trusted.k", follow_symlinks=False))
t("list dir", lambda: sorted(os.listxattr(os.path.join(d, "dir"))))
"#;

#[test]
fn xattrs_match_kernel_tmpfs() {
    let disk = FsDisk::mount(&["--size", "64M"]);
    let out = same_as_tmpfs(&disk, "xattr", XATTR_SCRIPT);
    assert!(out.contains("get user.k b'v3'"), "{out}");
    // POSIX ACLs as raw system.* xattrs: an access ACL that says no more
    // than the mode is folded into the mode and not kept, as on tmpfs.
    let acl = r#"
import errno, os, sys
f = os.path.join(sys.argv[1], "acl"); os.mkdir(f)
# A minimal valid ACL: user::rw- group::r-- other::r--
acl = bytes.fromhex("02000000" "0100" "0600" "ffffffff" "0400" "0400" "ffffffff" "2000" "0400" "ffffffff")
for n in ["system.posix_acl_access", "system.posix_acl_default"]:
    try:
        os.setxattr(f, n, acl); print(n, "ok")
    except OSError as e:
        print(n, errno.errorcode[e.errno])
print("list", sorted(os.listxattr(f)))
"#;
    let out = same_as_tmpfs(&disk, "acl", acl);
    assert_eq!(
        out,
        "system.posix_acl_access ok\nsystem.posix_acl_default ok\nlist ['system.posix_acl_default']\n"
    );
    disk.stop();
}

const RENAME_SCRIPT: &str = r#"
import ctypes, errno, os, sys
d = sys.argv[1]
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD = -100
NOREPLACE, EXCHANGE = 1, 2
def renameat2(a, b, flags):
    if libc.renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), flags) != 0:
        e = ctypes.get_errno()
        return errno.errorcode[e]
    return "ok"
j = lambda *p: os.path.join(d, *p)
os.mkdir(j("d1")); os.mkdir(j("d2"))
with open(j("d1", "file"), "w") as f: f.write("A")
os.mkdir(j("d2", "sub")); open(j("d2", "sub", "child"), "w").close()
ino_f, ino_s = os.lstat(j("d1", "file")).st_ino, os.lstat(j("d2", "sub")).st_ino
print("nlink before", os.lstat(j("d1")).st_nlink, os.lstat(j("d2")).st_nlink)
# Exchange a file and a directory across parents.
print("exchange", renameat2(j("d1", "file"), j("d2", "sub"), EXCHANGE))
print("swapped", os.lstat(j("d1", "file")).st_ino == ino_s, os.lstat(j("d2", "sub")).st_ino == ino_f)
print("content", open(j("d2", "sub")).read(), sorted(os.listdir(j("d1", "file"))))
print("dotdot", os.stat(j("d1", "file", "..")).st_ino == os.stat(j("d1")).st_ino)
print("nlink after", os.lstat(j("d1")).st_nlink, os.lstat(j("d2")).st_nlink)
# Exchange needs both; NOREPLACE refuses an existing target.
print("exchange missing", renameat2(j("d2", "sub"), j("d2", "nope"), EXCHANGE))
open(j("a"), "w").close(); open(j("b"), "w").close()
print("noreplace existing", renameat2(j("a"), j("b"), NOREPLACE))
print("noreplace new", renameat2(j("a"), j("c"), NOREPLACE))
print("both flags", renameat2(j("b"), j("c"), NOREPLACE | EXCHANGE))
print("exchange same", renameat2(j("b"), j("b"), EXCHANGE))
print("exchange into own child", renameat2(j("d1"), j("d1", "file", "child"), EXCHANGE))
print("names", sorted(os.listdir(d)))
"#;

#[test]
fn renameat2_exchange_and_noreplace_match_kernel_tmpfs() {
    let disk = FsDisk::mount(&["--size", "64M"]);
    let out = same_as_tmpfs(&disk, "rename", RENAME_SCRIPT);
    assert!(
        out.contains("exchange ok\nswapped True True\ncontent A ['child']"),
        "{out}"
    );
    assert!(out.contains("noreplace existing EEXIST"), "{out}");
    disk.stop();
}

const COPY_RANGE_SCRIPT: &str = r#"
import hashlib, os, sys
d = sys.argv[1]
M = 1 << 20
src = os.open(os.path.join(d, "src"), os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(src, 8 * M + 17)
data = bytes((i * 7 + 3) % 251 for i in range(M + 333))
os.pwrite(src, data, 0)
os.pwrite(src, data, 5 * M + 1)
dst = os.open(os.path.join(d, "dst"), os.O_RDWR | os.O_CREAT, 0o644)
total = 0
while total < 8 * M + 17:
    n = os.copy_file_range(src, dst, 8 * M + 17 - total, total, total)
    assert n > 0
    total += n
# Unaligned copy into the middle of an existing file, and past its end.
n = os.copy_file_range(src, dst, 3 * M + 5, 5 * M - 7, M + 11)
print("copied", total, n)
print("sizes", os.fstat(src).st_size, os.fstat(dst).st_size)
h = lambda fd: hashlib.sha256(os.pread(fd, 16 * M, 0)).hexdigest()[:16]
print("src", h(src))
print("dst", h(dst))
# Within one file, non-overlapping.
n = os.copy_file_range(src, src, M, 0, 6 * M)
print("same file", n, h(src))
"#;

#[test]
fn copy_file_range_matches_kernel_tmpfs() {
    let disk = FsDisk::mount(&["--size", "64M"]);
    same_as_tmpfs(&disk, "copy", COPY_RANGE_SCRIPT);
    disk.stop();
}

/// Each process writes its files in shuffled, unaligned pieces, then drops
/// them from the page cache and checks every byte ramd gives back.
const PARALLEL_WRITER: &str = r#"
import hashlib, os, random, sys
d, wid = sys.argv[1], int(sys.argv[2])
rnd = random.Random(wid)
files = {}
for f in range(12):
    size = rnd.randrange(1, 3 << 20)
    data = rnd.randbytes(size)
    p = os.path.join(d, f"w{wid}-f{f}")
    fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    cuts = sorted(set([0, size] + [rnd.randrange(size) for _ in range(rnd.randrange(1, 40))]))
    pieces = list(zip(cuts, cuts[1:]))
    rnd.shuffle(pieces)
    for a, b in pieces:
        assert os.pwrite(fd, data[a:b], a) == b - a
    os.fsync(fd)
    os.close(fd)
    files[p] = hashlib.sha256(data).hexdigest()
bad = []
for p, want in files.items():
    fd = os.open(p, os.O_RDONLY)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    got = hashlib.sha256(os.pread(fd, 4 << 20, 0)).hexdigest()
    os.close(fd)
    if got != want:
        bad.append(p)
print("bad", bad)
"#;

#[test]
fn parallel_writers_keep_their_data() {
    for args in [
        // The store path with its write-back cache and with every write
        // sent through; the kernel path.
        &["--size", "256M", "--threads", "4", "--data-path", "store"][..],
        &[
            "--size",
            "256M",
            "--no-writeback-cache",
            "--data-path",
            "store",
        ][..],
        &["--size", "256M", "--threads", "4", "--data-path", "kernel"][..],
    ] {
        let disk = FsDisk::mount(args);
        let cmds: Vec<Command> = (0..4)
            .map(|w| {
                let mut c = Command::new(python());
                c.arg("-c")
                    .arg(PARALLEL_WRITER)
                    .arg(disk.path())
                    .arg(w.to_string());
                c
            })
            .collect();
        for out in run_parallel_ok(cmds, LONG_TIMEOUT) {
            assert_eq!(out.trim(), "bad []", "ramd {args:?}");
        }
        disk.stop();
    }
}

/// A directory of 20 000 entries with long names: listed completely (FUSE
/// readdir in many batches), then emptied while being listed, as `rm -rf`
/// does, without skipping an entry.
#[test]
fn large_directory_lists_and_empties_completely() {
    let disk = FsDisk::mount(&["--size", "64M"]);
    let py = r#"
import os, sys
d = os.path.join(sys.argv[1], "big")
os.mkdir(d)
names = set()
for i in range(20000):
    n = f"{i:05d}-" + "n" * (10 + i % 240)
    names.add(n)
    os.close(os.open(os.path.join(d, n), os.O_CREAT | os.O_WRONLY, 0o644))
listed = os.listdir(d)
print("listed", len(listed), len(set(listed)), set(listed) == names)
print("nlink", os.stat(d).st_nlink)
removed = 0
with os.scandir(d) as it:
    for e in it:
        os.unlink(e.path)
        removed += 1
print("removed while listing", removed, "left", len(os.listdir(d)))
os.rmdir(d)
print("rmdir ok")
"#;
    assert_eq!(
        py_ok(py, &[s(disk.path())]),
        "listed 20000 20000 True\nnlink 2\nremoved while listing 20000 left 0\nrmdir ok\n"
    );
    disk.stop();
}

/// The mount is dev and suid like tmpfs: device nodes work, setuid programs
/// run with their owner's id; FIFOs and Unix sockets can live in it.
#[test]
fn device_nodes_setuid_fifos_and_sockets_work() {
    let setpriv = require_tool("setpriv");
    let disk = FsDisk::mount(&["--size", "16M"]);
    let line = mountinfo_line(disk.path()).unwrap();
    let opts = line.split(' ').nth(5).unwrap_or("");
    for bad in ["nodev", "nosuid", "noexec", "ro"] {
        assert!(!opts.split(',').any(|o| o == bad), "mounted {bad}: {line}");
    }
    let py = r#"
import os, socket, stat, sys
d = sys.argv[1]
null = os.path.join(d, "null")
os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
fd = os.open(null, os.O_RDWR)
print("chardev write", os.write(fd, b"x" * 10), "read", os.read(fd, 10))
os.close(fd)
fifo = os.path.join(d, "fifo")
os.mkfifo(fifo)
fd = os.open(fifo, os.O_RDWR)
os.write(fd, b"through the fifo")
print("fifo", os.read(fd, 100))
os.close(fd)
path = os.path.join(d, "sock")
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(1)
cli = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
cli.connect(path)
conn, _ = srv.accept()
cli.sendall(b"through the socket")
print("socket", conn.recv(100), stat.S_ISSOCK(os.lstat(path).st_mode))
"#;
    assert_eq!(
        py_ok(py, &[s(disk.path())]),
        "chardev write 10 read b''\nfifo b'through the fifo'\n\
         socket b'through the socket' True\n"
    );
    // A setuid-root copy of id(1), run by nobody, has effective uid 0.
    let id = disk.join("id");
    fs::copy("/usr/bin/id", &id).unwrap();
    fs::set_permissions(&id, fs::Permissions::from_mode(0o4755)).unwrap();
    let out = run(
        Command::new(setpriv)
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(&id)
            .arg("-u"),
        CMD_TIMEOUT,
    )
    .ok();
    assert_eq!(out.trim(), "0", "setuid bit not honoured");
    disk.stop();
}

// ---------------------------------------------------------------------------
// Options of the mount

#[test]
fn root_options_and_setgid_directories() {
    let disk = FsDisk::mount(&[
        "--size", "64M", "--mode", "0750", "--uid", "1001", "--gid", "65534",
    ]);
    let root = fs::metadata(disk.path()).unwrap();
    assert_eq!(root.mode() & 0o7777, 0o750);
    assert_eq!((root.uid(), root.gid()), (1001, 65534));
    // Default root: 1777 root:root, like tmpfs.
    let disk2 = FsDisk::mount(&["--size", "64M"]);
    let root2 = fs::metadata(disk2.path()).unwrap();
    assert_eq!(root2.mode() & 0o7777, 0o1777);
    assert_eq!((root2.uid(), root2.gid()), (0, 0));

    let sg = disk2.join("sg");
    fs::create_dir(&sg).unwrap();
    std::os::unix::fs::chown(&sg, None, Some(1001)).unwrap();
    fs::set_permissions(&sg, fs::Permissions::from_mode(0o2775)).unwrap();
    fs::write(sg.join("file"), b"x").unwrap();
    fs::create_dir(sg.join("sub")).unwrap();
    let f = fs::metadata(sg.join("file")).unwrap();
    let sub = fs::metadata(sg.join("sub")).unwrap();
    assert_eq!(f.gid(), 1001, "file in a setgid dir takes the dir's group");
    assert_eq!(sub.gid(), 1001, "dir in a setgid dir takes the dir's group");
    assert!(sub.mode() & 0o2000 != 0, "subdir of a setgid dir is setgid");
    disk.stop();
    disk2.stop();
}

/// relatime as tmpfs does it: an access moves atime only when atime is not
/// after mtime/ctime (or is a day old), for reads, readdir and readlink.
const ATIME_SCRIPT: &str = r#"
import os, sys, time
d = sys.argv[1]
OLD = 946684800 * 10**9       # 2000-01-01
FUTURE = 2062048089 * 10**9   # 2035-05-06
def setup(kind, name):
    p = os.path.join(d, name)
    if kind == "file":
        with open(p, "wb") as f:
            f.write(b"data" * 1000)
    elif kind == "dir":
        os.mkdir(p)
        open(os.path.join(p, "x"), "w").close()
    else:
        os.symlink("target-of-" + name, p)
    return p
def access(kind, p):
    if kind == "file":
        with open(p, "rb") as f:
            f.read()
    elif kind == "dir":
        os.listdir(p)
    else:
        os.readlink(p)
def state(a, before):
    if a == before:
        return "kept"
    return "now" if abs(a - time.time_ns()) < 3600 * 10**9 else f"moved to {a}"
for kind in ["file", "dir", "symlink"]:
    for label, atime in [("old", OLD), ("future", FUTURE)]:
        p = setup(kind, f"{kind}-{label}")
        os.utime(p, ns=(atime, OLD), follow_symlinks=False)
        access(kind, p)
        # (A second access is not compared: whether it moves atime again
        # depends on the kernel's coarse clock ticking between the two.)
        print(kind, label, "access:", state(os.lstat(p).st_atime_ns, atime))
# Written, then read back (the mail-reader "read since written?" check).
p = setup("file", "fresh")
time.sleep(0.01)
with open(p, "ab") as f:
    f.write(b"more")
st = os.stat(p)
access("file", p)
a = os.stat(p).st_atime_ns
print("fresh file read after write:", "atime >= mtime" if a >= st.st_mtime_ns else "atime < mtime")
"#;

#[test]
fn atime_follows_relatime_like_tmpfs() {
    let disk = FsDisk::mount(&["--size", "16M"]);
    same_as_tmpfs(&disk, "atime", ATIME_SCRIPT);
    disk.stop();
}

#[test]
fn noatime_never_moves_atime() {
    let disk = FsDisk::mount(&["--size", "16M", "--noatime"]);
    let d = disk.join("atime");
    fs::create_dir(&d).unwrap();
    let out = py_ok(ATIME_SCRIPT, &[s(&d)]);
    for line in out.lines().filter(|l| !l.starts_with("fresh")) {
        assert!(
            line.ends_with("access: kept"),
            "noatime: an access moved atime: {line}\n{out}"
        );
    }
    assert!(out.contains("atime < mtime"), "{out}");
    disk.stop();
}

#[test]
fn unlimited_size_is_ramfs_mode() {
    // The store's page counts below.
    let disk = FsDisk::mount(&[
        "--size",
        "unlimited",
        "--max-memory",
        "256M",
        "--data-path",
        "store",
    ]);
    let st = disk.status();
    assert_eq!(st["unlimited"], true, "{st}");
    assert_eq!(st["kind"], "fs", "{st}");
    assert_eq!(st["mount"], s(disk.path()), "{st}");
    let f = disk.join("f");
    dd("/dev/urandom", &f, 64);
    assert_eq!(fs::metadata(&f).unwrap().len(), 64 * MIB);
    assert!(num(&disk.status(), "data_pages") >= 64 * MIB / PAGE);
    // df works (ramfs reports what it can).
    df(disk.path());
    disk.stop();
}

// ---------------------------------------------------------------------------
// The daemon's edges

#[test]
fn bad_mount_points_exit_1_naming_the_directory() {
    let tmp = scratch();
    let expect_failure = |dir: &Path, needle: &str| {
        let f = match FsDisk::mount_at(dir, &["--size", "16M"]) {
            Ok(d) => {
                drop(d);
                panic!("ramd mounted on {dir:?}, which should have been refused");
            }
            Err(f) => f,
        };
        assert_eq!(f.code, Some(1), "{dir:?}: {f:?}");
        assert!(
            f.stderr.contains(s(dir)),
            "error for {dir:?} does not name it: {}",
            f.stderr
        );
        assert!(
            f.stderr.to_lowercase().contains(needle),
            "error for {dir:?} does not say {needle:?}: {}",
            f.stderr
        );
        assert!(f.stdout.is_empty(), "stdout: {:?}", f.stdout);
    };
    expect_failure(&tmp.path().join("missing"), "no such file");
    let file = tmp.path().join("file");
    fs::write(&file, b"").unwrap();
    expect_failure(&file, "not a directory");

    let busy_tmpfs = KernelTmpfs::mount("size=1M");
    expect_failure(busy_tmpfs.path(), "busy");
    assert_eq!(mount_fstype(busy_tmpfs.path()).as_deref(), Some("tmpfs"));

    let disk = FsDisk::mount(&["--size", "16M"]);
    fs::write(disk.join("mine"), b"still here").unwrap();
    expect_failure(disk.path(), "busy");
    assert_eq!(fs::read(disk.join("mine")).unwrap(), b"still here");
    disk.stop();
}

#[test]
fn umount_sigint_and_sigterm_stop_cleanly() {
    let mut a = FsDisk::mount(&["--size", "16M"]);
    fs::write(a.join("x"), b"x").unwrap();
    let status = a.umount_externally();
    assert!(
        status.success(),
        "ramd after umount: {status}; stderr:\n{}",
        a.stderr()
    );
    assert!(!is_mounted(a.path()));

    let mut b = FsDisk::mount(&["--size", "16M"]);
    let status = b.stop_with(libc::SIGINT);
    assert!(
        status.success(),
        "ramd after SIGINT: {status}; stderr:\n{}",
        b.stderr()
    );

    let c = FsDisk::mount(&["--size", "16M"]);
    c.stop();
}

/// SIGTERM while a file in the mount is open: the holder keeps working, and
/// once it lets go ramd stops with 0 (a repeated SIGTERM is allowed to be
/// what finishes the job, but it must not be ignored).
#[test]
fn sigterm_while_busy_still_stops_once_released() {
    let mut disk = FsDisk::mount(&["--size", "16M"]);
    let f = disk.join("held");
    fs::write(&f, b"held open").unwrap();
    let marker = scratch();
    let ready = marker.path().join("open");
    let hold = r#"
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
open(sys.argv[2], "w").close()
sys.stdin.read()
print(os.pread(fd, 100, 0).decode())
os.close(fd)
"#;
    let mut holder = Background::spawn(
        Command::new(python())
            .arg("-c")
            .arg(hold)
            .arg(&f)
            .arg(&ready),
    );
    wait_until(CMD_TIMEOUT, "the holder to open the file", || {
        holder.assert_running();
        ready.exists()
    });
    let pid = disk.pid() as i32;
    // SAFETY: kill(2) to our own child, not yet reaped.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    assert_eq!(
        holder.finish_ok().trim(),
        "held open",
        "an open file stopped working after SIGTERM"
    );
    // Released. Whether the first SIGTERM detached the mount or could not
    // unmount it, another SIGTERM now must end the daemon (harmless if it is
    // already on its way out).
    let status = disk.stop_with(libc::SIGTERM);
    assert!(
        status.success(),
        "ramd after SIGTERM on a busy mount: {status}; stderr:\n{}",
        disk.stderr()
    );
}

/// Writers of the write-back ENOSPC test. Every record is 64 KiB of a
/// pattern naming its file and index, so any byte can be checked. Prints
/// one JSON line per file: its path, the bytes write(2) accepted, and each
/// error with the call that reported it.
/// `long PATH MAX`: one file opened at once (cached while the disk is
/// empty), written up to MAX bytes or the first error, then fsync, close.
/// `files DIR`: 1 MiB files one after another (open, write, fsync, close)
/// until a write(2) fails. `direct PATH`: O_DIRECT writes of 1 MiB until
/// one fails. `mmap PATH SIZE`: a file of SIZE mapped shared and written
/// through the mapping, then msync, fsync, close.
const ENOSPC_WRITER: &str = r#"
import errno, json, mmap, os, struct, sys

REC = 64 << 10

def record(path, i):
    tag = os.path.basename(path).encode().rjust(16, b".")
    return struct.pack("<16sQ", tag, i) * (REC // 24) + b"\0" * (REC % 24)

def one(path, limit, flags=0, chunk=REC):
    res = {"path": path, "acked": 0, "errors": []}
    def err(call, e):
        res["errors"].append(call + " " + errno.errorcode.get(e.errno, str(e.errno)))
    try:
        fd = os.open(path, os.O_CREAT | os.O_WRONLY | flags, 0o644)
    except OSError as e:
        err("open", e)
        return res
    buf = mmap.mmap(-1, chunk) if flags & os.O_DIRECT else None
    while res["acked"] < limit:
        off = res["acked"]
        # From the pattern at off, not at a record's start: a short write
        # may have stopped inside a record.
        first = off // REC
        data = b"".join(record(path, first + k) for k in range(chunk // REC + 1))
        data = data[off - first * REC :][:chunk]
        if buf is not None:
            buf.seek(0)
            buf.write(data)
            data = buf
        try:
            n = os.pwrite(fd, data, off)
        except OSError as e:
            err("write", e)
            break
        # Short: the next write says why (or, if space came back, goes on).
        if n < len(data):
            res["short"] = res.get("short", 0) + 1
        res["acked"] += n
    for call, fn in (("fsync", os.fsync), ("close", os.close)):
        try:
            fn(fd)
        except OSError as e:
            err(call, e)
    return res

def mapped(path, size):
    res = {"path": path, "acked": 0, "errors": []}
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o644)
    os.ftruncate(fd, size)
    m = mmap.mmap(fd, size)
    for off in range(0, size, REC):
        m[off : off + REC] = record(path, off // REC)
    res["acked"] = size
    for call, fn in (("msync", m.flush), ("fsync", lambda: os.fsync(fd)), ("close", lambda: os.close(fd))):
        try:
            fn()
        except OSError as e:
            res["errors"].append(call + " " + errno.errorcode.get(e.errno, str(e.errno)))
    m.close()
    return res

mode = sys.argv[1]
if mode == "mmap":
    print(json.dumps(mapped(sys.argv[2], int(sys.argv[3]))))
elif mode == "long":
    print(json.dumps(one(sys.argv[2], int(sys.argv[3]))))
elif mode == "direct":
    print(json.dumps(one(sys.argv[2], 1 << 40, os.O_DIRECT, 1 << 20)))
else:
    for i in range(1000):
        r = one(os.path.join(sys.argv[2], f"f{i}"), 1 << 20)
        print(json.dumps(r))
        if any(e.startswith("write") for e in r["errors"]):
            break
"#;

/// Checks the files the writers reported: every
/// byte that write(2) accepted reads back, unless fsync or close reported
/// an error for that file. Prints one line per problem.
/// `python3 -c ENOSPC_CHECK REPORTS OLD NEW`: the writers' JSON lines (a
/// file), and the mount point they wrote under and the one to read from.
const ENOSPC_CHECK: &str = r#"
import json, os, struct, sys

REC = 64 << 10

def record(path, i):
    tag = os.path.basename(path).encode().rjust(16, b".")
    return struct.pack("<16sQ", tag, i) * (REC // 24) + b"\0" * (REC % 24)

for line in open(sys.argv[1]):
    r = json.loads(line)
    r["path"] = sys.argv[3] + r["path"][len(sys.argv[2]):]
    told = [e for e in r["errors"] if not e.startswith("write")]
    if told:
        continue
    with open(r["path"], "rb") as f:
        data = f.read(r["acked"])
    if len(data) < r["acked"]:
        print(f"{r['path']}: {r['acked']} bytes accepted, no error reported, only {len(data)} there")
        continue
    for off in range(0, r["acked"], REC):
        want = record(r["path"], off // REC)[: r["acked"] - off]
        if data[off : off + len(want)] != want:
            print(f"{r['path']}: bytes at {off} differ from what was written, no error reported")
            break
"#;

/// The issue's test for the default write-back cache: several writers
/// (cached files opened on an empty disk, one file after another, O_DIRECT,
/// mmap, dd) overfill a disk with `--flush persist` at once. Nothing may be
/// lost silently: every byte a program was told was written reads back
/// after the kernel's caches are dropped, and (if fsynced) after SIGKILL
/// and a restart from the image; every error is ENOSPC and reached the
/// program through write, msync, fsync or close; files opened once the
/// disk is nearly full, and files written with write(2) while it fills,
/// learn it from write(2).
#[test]
fn a_full_disk_under_the_default_writeback_cache_loses_nothing_silently() {
    // The store path, whose default is the write-back cache.
    overfill_with_many_writers("store");
}

/// The same on the kernel path (the default where passthrough can be had):
/// no write-back cache, so every writer learns of the full disk from
/// write(2) itself, as on tmpfs. Without the mapping writer: a store
/// through a shared mapping of a full tmpfs raises SIGBUS, as on tmpfs.
#[test]
fn a_full_disk_on_the_kernel_path_loses_nothing_silently() {
    overfill_with_many_writers("kernel");
}

/// Several writers at once (cached files opened on an empty disk, one file
/// after another, O_DIRECT, on the store path also mmap, and dd) overfill a
/// 64 MiB disk with `--flush persist` on data path `path`; see the test
/// above for what must hold.
fn overfill_with_many_writers(path: &str) {
    require_tool("dd");
    let tmp = scratch();
    let img = tmp.path().join("img");
    let src = tmp.path().join("src");
    fs::write(
        &src,
        (0..80u32 << 10)
            .flat_map(|i| [i.to_le_bytes(); 256].concat())
            .collect::<Vec<u8>>(),
    )
    .unwrap();
    let args = [
        "--size",
        "64M",
        "--image",
        s(&img),
        "--flush",
        "persist",
        "--data-path",
        path,
    ];
    let mut disk = FsDisk::mount(&args);
    fs::create_dir(disk.join("many")).unwrap();
    let mut writers: Vec<Vec<String>> = vec![
        // Unbounded: only an error stops them.
        vec![
            "long".into(),
            s(&disk.join("long1")).into(),
            (1u64 << 40).to_string(),
        ],
        vec![
            "long".into(),
            s(&disk.join("long2")).into(),
            (1u64 << 40).to_string(),
        ],
        vec!["files".into(), s(&disk.join("many")).into()],
        vec!["direct".into(), s(&disk.join("direct")).into()],
    ];
    if path == "store" {
        writers.push(vec![
            "mmap".into(),
            s(&disk.join("mapped")).into(),
            (24 * MIB).to_string(),
        ]);
    }
    let dd_out = disk.join("dd");
    let (reports, dd) = std::thread::scope(|sc| {
        let ws: Vec<_> = writers
            .iter()
            .map(|a| {
                sc.spawn(move || {
                    let args: Vec<&str> = a.iter().map(String::as_str).collect();
                    py_ok(ENOSPC_WRITER, &args)
                })
            })
            .collect();
        let dd = sc.spawn(|| {
            run(
                Command::new("dd")
                    .arg(format!("if={}", s(&src)))
                    .arg(format!("of={}", s(&dd_out)))
                    .arg("bs=64k"),
                LONG_TIMEOUT,
            )
        });
        let reports: Vec<String> = ws.into_iter().map(|w| w.join().unwrap()).collect();
        (reports, dd.join().unwrap())
    });
    let all: String = reports.concat();
    eprintln!("writers:\n{all}dd: {}", dd.stderr);
    let report_file = tmp.path().join("reports");
    fs::write(&report_file, &all).unwrap();
    let lines: Vec<serde_json::Value> = all
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    for r in &lines {
        for e in r["errors"].as_array().unwrap() {
            assert!(e.as_str().unwrap().ends_with("ENOSPC"), "{r}");
        }
    }
    let errors = |r: &serde_json::Value| r["errors"].to_string();
    // Opened once the disk was within the reserve of full: uncached, so
    // the write itself fails.
    let last_file = lines
        .iter()
        .rev()
        .find(|r| r["path"].as_str().unwrap().contains("/many/"))
        .unwrap();
    assert!(
        errors(last_file).contains("write ENOSPC"),
        "the last new file did not get ENOSPC from write: {all}"
    );
    // Open (cached) before the disk filled: they too stop at a write.
    for r in lines
        .iter()
        .filter(|r| r["path"].as_str().unwrap().contains("/long"))
    {
        assert!(errors(r).contains("write ENOSPC"), "{all}");
    }
    let direct = lines
        .iter()
        .find(|r| r["path"].as_str().unwrap().ends_with("/direct"))
        .unwrap();
    assert!(errors(direct).contains("write ENOSPC"), "{all}");
    assert!(
        !dd.success() && dd.stderr.contains("No space left on device"),
        "dd of 80 MiB onto a 64 MiB disk: {dd:?}"
    );
    // dd's error came from a write (then what it copied before is there)
    // or from close (then nothing is promised).
    let dd_told_at_close = dd.stderr.contains("closing output file");
    let dd_copied = || -> usize {
        dd.stderr
            .lines()
            .find_map(|l| l.split_once(" bytes").and_then(|(n, _)| n.parse().ok()))
            .unwrap_or_else(|| panic!("no byte count from dd: {}", dd.stderr))
    };

    let first_mount = disk.path().to_path_buf();
    let check = |when: &str, mount: &Path| {
        let out = py_ok(ENOSPC_CHECK, &[s(&report_file), s(&first_mount), s(mount)]);
        assert!(out.trim().is_empty(), "{when}:\n{out}\nwriters:\n{all}");
        // dd does not fsync: its data is promised until a crash.
        if !dd_told_at_close && mount == first_mount {
            let got = fs::read(mount.join("dd")).unwrap();
            let n = dd_copied();
            let want = &fs::read(&src).unwrap()[..n];
            assert!(
                got.len() >= n && &got[..n] == want,
                "{when}: dd copied {n} bytes without a close error, {} read back differently",
                got.len()
            );
        }
    };
    fs::write("/proc/sys/vm/drop_caches", "3").expect("drop the kernel's caches (root)");
    check("after drop_caches", disk.path());
    // --flush persist: what fsync accepted is in the image even after a crash.
    disk.kill();
    let disk = FsDisk::mount(&["--image", s(&img)]);
    check("after SIGKILL and a restart from the image", disk.path());
    disk.stop();
}
