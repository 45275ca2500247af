//! A real filesystem on the disk: nbdfuse → loop device → ext4, written,
//! checked with fsck, and read back through fresh mounts.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::{symlink, MetadataExt};
use std::path::Path;

/// A deterministic tree of ~50 MiB: nested directories, files from empty to
/// 8 MiB (random, zero, patterned), a sparse file, symlinks, a hard link,
/// odd names. Returns the number of regular files.
fn make_tree(root: &Path) -> usize {
    let mut rng = Rng::new(2024);
    let mut files = 0;
    fs::create_dir_all(root.join("empty dir")).unwrap();
    for d in 0..6 {
        for s in 0..4 {
            let dir = root.join(format!("d{d}")).join(format!("s{s}"));
            fs::create_dir_all(&dir).unwrap();
            for f in 0..16 {
                let len = match rng.below(10) {
                    0..=5 => rng.below(16 * KIB),
                    6..=8 => 16 * KIB + rng.below(240 * KIB),
                    _ => 256 * KIB + rng.below(768 * KIB),
                } as usize;
                let mut buf = vec![0u8; len];
                match rng.below(8) {
                    0 => {}                               // zeros
                    1 => buf.fill(b'a' + (f % 26) as u8), // one byte repeated
                    _ => rng.fill(&mut buf),
                }
                write_file(&dir.join(format!("f{f:02}.bin")), &buf);
                files += 1;
            }
        }
    }
    let mut big = vec![0u8; (8 * MIB) as usize];
    rng.fill(&mut big);
    write_file(&root.join("big.bin"), &big);
    let sparse = fs::File::create(root.join("sparse.bin")).unwrap();
    sparse.set_len(16 * MIB).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, b"middle", 4 * MIB).unwrap();
    write_file(
        &root.join("naïve name with spaces.txt"),
        "héllo\n".as_bytes(),
    );
    fs::hard_link(root.join("big.bin"), root.join("d0/big-link.bin")).unwrap();
    symlink("../big.bin", root.join("d1/big-symlink")).unwrap();
    symlink("nowhere", root.join("dangling")).unwrap();
    files + 4 // big.bin, sparse.bin, the odd name, the hard link
}

fn fsck_clean(dev: &str) {
    require_tool("fsck.ext4");
    let out = run(&mut cmd("fsck.ext4", ["-fn", dev]), LONG_TIMEOUT);
    assert!(
        out.success(),
        "fsck.ext4 -fn {dev} found problems ({}):\n{}\n{}",
        out.status,
        out.stdout,
        out.stderr
    );
}

fn diff_trees(a: &Path, b: &Path) {
    require_tool("diff");
    let mut c = cmd("diff", ["-r", "--no-dereference", "--exclude=lost+found"]);
    c.arg(a).arg(b);
    run(&mut c, LONG_TIMEOUT).ok();
}

#[test]
fn ext4_through_nbdfuse_and_loop_survives_remount_and_fsck() {
    for t in ["mkfs.ext4", "cp", "mount", "umount"] {
        require_tool(t);
    }
    let tmp = scratch();
    let src = tmp.path().join("src");
    let nfiles = make_tree(&src);
    let d = Ramd::start(&["--size", "256M", "--name", "fs"]);

    // Round 1: make the filesystem and fill it.
    {
        let fuse = Fuse::start(&tmp.path().join("fuse1"), d.uri());
        assert_eq!(fs::metadata(fuse.file()).unwrap().len(), 256 * MIB);
        let lo = Loop::attach(&fuse.file());
        run(&mut cmd("mkfs.ext4", ["-F", "-q", lo.dev()]), LONG_TIMEOUT).ok();
        let m = Mount::on(lo.dev(), &tmp.path().join("mnt1"));
        let mut c = cmd("cp", ["-a"]);
        c.arg(src.join(".")).arg(m.path());
        run(&mut c, LONG_TIMEOUT).ok();
        diff_trees(&src, m.path());
        m.unmount();
        fsck_clean(lo.dev());
        lo.detach();
        fuse.unmount();
    }

    let s = d.stats();
    assert!(
        field(&s, "data_pages") * PAGE >= 40 * MIB,
        "the filesystem's data is not in the disk: {s}"
    );
    assert_accounting(&s);

    // Round 2: fresh FUSE mount and loop device (no cache left from round
    // 1): everything reads back from ramd.
    {
        let fuse = Fuse::start(&tmp.path().join("fuse2"), d.uri());
        let lo = Loop::attach(&fuse.file());
        fsck_clean(lo.dev());
        let m = Mount::on(lo.dev(), &tmp.path().join("mnt2"));
        diff_trees(&src, m.path());
        let mut count = 0;
        count_files(m.path(), &mut count);
        assert_eq!(count, nfiles, "regular files in the mounted copy");
        let a = fs::metadata(m.path().join("big.bin")).unwrap();
        let b = fs::metadata(m.path().join("d0/big-link.bin")).unwrap();
        assert_eq!(
            (a.ino(), a.nlink()),
            (b.ino(), 2),
            "hard link not preserved"
        );
        // Write more, then check again after the next unmount.
        write_file(&m.path().join("late.txt"), b"written in round 2\n");
        m.unmount();
        fsck_clean(lo.dev());
        lo.detach();
        fuse.unmount();
    }

    // Round 3: the late write is there too.
    let fuse = Fuse::start(&tmp.path().join("fuse3"), d.uri());
    let lo = Loop::attach(&fuse.file());
    let m = Mount::on(lo.dev(), &tmp.path().join("mnt3"));
    assert_eq!(
        fs::read(m.path().join("late.txt")).unwrap(),
        b"written in round 2\n"
    );
    // Guards drop in reverse: unmount, detach, fusermount3 -u.
}

fn count_files(dir: &Path, n: &mut usize) {
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if e.file_name() == "lost+found" {
            continue;
        }
        if t.is_dir() {
            count_files(&e.path(), n);
        } else if t.is_file() {
            *n += 1;
        }
    }
}
