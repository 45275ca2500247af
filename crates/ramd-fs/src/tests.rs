//! The filesystem's semantics, checked without a mount.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ramd_store::{Store, StoreConfig, PAGE_SIZE};

use crate::fs::*;

const ME: Caller = Caller {
    uid: 1000,
    gid: 100,
};

fn fs_with(size: u64, nr_inodes: u64) -> Fs {
    let store = Store::new(StoreConfig {
        page_limit: Some(size / PAGE_SIZE as u64),
        max_memory: Some(size * 2 + (16 << 20)),
        host_reserve: 0,
        ..StoreConfig::new(ramd_store::MAX_SIZE)
    })
    .unwrap();
    Fs::new(
        Arc::new(store),
        FsConfig {
            size: Some(size),
            nr_inodes,
            mode: 0o1777,
            uid: 0,
            gid: 0,
            noatime: false,
        },
    )
    .unwrap()
}

fn fs() -> Fs {
    fs_with(64 << 20, 1000)
}

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

const REG: u32 = libc::S_IFREG | 0o644;

#[test]
fn create_write_read_truncate() {
    let f = fs();
    let a = f.create(ME, ROOT_INO, n("a"), REG).unwrap();
    assert_eq!((a.uid, a.gid, a.perm, a.nlink), (1000, 100, 0o644, 1));
    assert_eq!(f.write(a.ino, 5000, b"hello", true, false).unwrap(), 5);
    let mut buf = [9u8; 8192];
    assert_eq!(f.read(a.ino, 0, &mut buf).unwrap(), 5005);
    assert!(buf[..5000].iter().all(|&b| b == 0));
    assert_eq!(&buf[5000..5005], b"hello");
    assert_eq!(f.getattr(a.ino).unwrap().blocks, 8, "one 4 KiB page");
    let t = f
        .setattr(
            ME,
            a.ino,
            SetAttr {
                size: Some(5002),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(t.size, 5002);
    // Growing again reads zeros where the cut tail was.
    f.setattr(
        ME,
        a.ino,
        SetAttr {
            size: Some(6000),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(f.read(a.ino, 5000, &mut buf).unwrap(), 1000);
    assert_eq!(&buf[..5], b"he\0\0\0");
}

#[test]
fn unlink_frees_data_at_last_close() {
    let f = fs();
    let a = f.create(ME, ROOT_INO, n("a"), REG).unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i| (i % 253) as u8).collect();
    f.write(a.ino, 0, &data, true, false).unwrap();
    assert_eq!(f.store().stats().data_pages, 256);
    f.unlink(ROOT_INO, n("a")).unwrap();
    // Still open: the data stays readable.
    let mut b = [0; 4];
    assert_eq!(f.read(a.ino, 0, &mut b).unwrap(), 4);
    assert_eq!(b, [0, 1, 2, 3]);
    assert_eq!(f.store().stats().data_pages, 256);
    f.release(a.ino);
    assert_eq!(f.store().pages_used().0, 0);
    assert_eq!(f.store().stats().data_pages, 0);
    f.forget(a.ino, 1);
    assert!(f.getattr(a.ino).is_err());
}

#[test]
fn directories_links_and_counts() {
    let f = fs();
    let d = f.mkdir(ME, ROOT_INO, n("d"), 0o755).unwrap();
    assert_eq!(f.getattr(ROOT_INO).unwrap().nlink, 3);
    let x = f.mknod(ME, d.ino, n("x"), REG, 0).unwrap();
    let l = f.link(x.ino, ROOT_INO, n("x2")).unwrap();
    assert_eq!(l.nlink, 2);
    assert_eq!(f.rmdir(ROOT_INO, n("d")), Err(Errno(libc::ENOTEMPTY)));
    assert_eq!(f.unlink(ROOT_INO, n("d")), Err(Errno(libc::EISDIR)));
    assert_eq!(
        f.mkdir(ME, ROOT_INO, n("d"), 0o755),
        Err(Errno(libc::EEXIST))
    );
    assert_eq!(f.link(d.ino, ROOT_INO, n("dl")), Err(Errno(libc::EPERM)));
    f.unlink(d.ino, n("x")).unwrap();
    assert_eq!(f.getattr(x.ino).unwrap().nlink, 1);
    f.rmdir(ROOT_INO, n("d")).unwrap();
    assert_eq!(f.getattr(ROOT_INO).unwrap().nlink, 2);
    let long = "x".repeat(256);
    assert_eq!(
        f.mkdir(ME, ROOT_INO, n(&long), 0o755),
        Err(Errno(libc::ENAMETOOLONG))
    );
    assert_eq!(f.mkdir(ME, x.ino, n("y"), 0o755), Err(Errno(libc::ENOTDIR)));
}

#[test]
fn rename_rules() {
    let f = fs();
    let a = f.mkdir(ME, ROOT_INO, n("a"), 0o755).unwrap();
    let b = f.mkdir(ME, ROOT_INO, n("b"), 0o755).unwrap();
    let file = f.create(ME, a.ino, n("f"), REG).unwrap();
    // Directory into its own subtree.
    assert_eq!(
        f.rename(ROOT_INO, n("a"), a.ino, n("sub"), 0),
        Err(Errno(libc::EINVAL))
    );
    // Non-directory over a directory and back.
    assert_eq!(
        f.rename(a.ino, n("f"), ROOT_INO, n("b"), 0),
        Err(Errno(libc::EISDIR))
    );
    f.create(ME, ROOT_INO, n("g"), REG).unwrap();
    assert_eq!(
        f.rename(ROOT_INO, n("b"), ROOT_INO, n("g"), 0),
        Err(Errno(libc::ENOTDIR))
    );
    // NOREPLACE refuses an existing target.
    assert_eq!(
        f.rename(a.ino, n("f"), ROOT_INO, n("g"), libc::RENAME_NOREPLACE),
        Err(Errno(libc::EEXIST))
    );
    // Moving a directory fixes both parents' link counts and "..".
    f.rename(ROOT_INO, n("b"), a.ino, n("b"), 0).unwrap();
    assert_eq!(f.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(f.getattr(a.ino).unwrap().nlink, 3);
    let fh = f.opendir(b.ino).unwrap();
    assert_eq!(f.dir_entries(b.ino, fh, 0).unwrap()[1].ino, a.ino);
    // EXCHANGE swaps a file and a directory across parents.
    f.rename(a.ino, n("f"), ROOT_INO, n("g"), 0).unwrap();
    assert_eq!(f.lookup(ROOT_INO, n("g")).unwrap().ino, file.ino);
    f.rename(ROOT_INO, n("g"), a.ino, n("b"), libc::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(f.lookup(ROOT_INO, n("g")).unwrap().ino, b.ino);
    assert_eq!(f.lookup(a.ino, n("b")).unwrap().ino, file.ino);
    assert_eq!(f.getattr(a.ino).unwrap().nlink, 2);
    assert_eq!(f.getattr(ROOT_INO).unwrap().nlink, 4);
    // Renaming over a hard link of itself changes nothing.
    f.link(file.ino, a.ino, n("same")).unwrap();
    f.rename(a.ino, n("b"), a.ino, n("same"), 0).unwrap();
    assert_eq!(f.getattr(file.ino).unwrap().nlink, 2);
}

#[test]
fn setgid_directories_pass_group_down() {
    let f = fs();
    let d = f.mkdir(ME, ROOT_INO, n("d"), 0o2775).unwrap();
    f.setattr(
        ME,
        d.ino,
        SetAttr {
            gid: Some(42),
            mode: Some(0o2775),
            ..Default::default()
        },
    )
    .unwrap();
    let other = Caller { uid: 5, gid: 6 };
    let file = f.create(other, d.ino, n("f"), REG).unwrap();
    assert_eq!(file.gid, 42);
    let sub = f.mkdir(other, d.ino, n("s"), 0o755).unwrap();
    assert_eq!((sub.gid, sub.perm & 0o2000), (42, 0o2000));
}

#[test]
fn limits_give_enospc_and_keep_data() {
    let f = fs_with(1 << 20, 4);
    let a = f.create(ME, ROOT_INO, n("a"), REG).unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
    f.write(a.ino, 0, &data, true, false).unwrap();
    assert_eq!(
        f.write(a.ino, 1 << 20, &[1; 4096], true, false),
        Err(Errno(libc::ENOSPC))
    );
    let mut back = vec![0; 1 << 20];
    assert_eq!(f.read(a.ino, 0, &mut back).unwrap(), 1 << 20);
    assert_eq!(back, data);
    f.mkdir(ME, ROOT_INO, n("b"), 0o755).unwrap();
    f.mknod(ME, ROOT_INO, n("c"), libc::S_IFIFO | 0o644, 0)
        .unwrap();
    assert_eq!(
        f.mkdir(ME, ROOT_INO, n("d"), 0o755),
        Err(Errno(libc::ENOSPC)),
        "4 inodes: root, a, b, c"
    );
    let (blocks, bfree, files, ffree) = f.statfs();
    assert_eq!((blocks, bfree, files, ffree), (256, 0, 4, 0));
}

#[test]
fn fallocate_modes_and_seek() {
    let f = fs();
    let a = f.create(ME, ROOT_INO, n("a"), REG).unwrap();
    let p = PAGE_SIZE as u64;
    f.write(a.ino, 0, &[1; PAGE_SIZE], true, false).unwrap();
    f.write(a.ino, 4 * p, &[2; PAGE_SIZE], true, false).unwrap();
    assert_eq!(f.seek(a.ino, 0, Whence::Hole).unwrap(), p);
    assert_eq!(f.seek(a.ino, p, Whence::Data).unwrap(), 4 * p);
    assert_eq!(f.seek(a.ino, 4 * p, Whence::Hole).unwrap(), 5 * p);
    assert_eq!(f.seek(a.ino, 5 * p, Whence::Data), Err(Errno(libc::ENXIO)));
    // Default mode allocates without touching data and extends the size.
    f.fallocate(a.ino, 0, 8 * p, 0).unwrap();
    let attr = f.getattr(a.ino).unwrap();
    assert_eq!((attr.size, attr.blocks), (8 * p, 64));
    let mut b = [0; 4];
    f.read(a.ino, 4 * p, &mut b).unwrap();
    assert_eq!(b, [2; 4]);
    // Punch needs KEEP_SIZE, and frees the pages.
    assert_eq!(
        f.fallocate(a.ino, 0, p, libc::FALLOC_FL_PUNCH_HOLE),
        Err(Errno(libc::EOPNOTSUPP))
    );
    let keep = libc::FALLOC_FL_KEEP_SIZE;
    f.fallocate(a.ino, 0, 8 * p, libc::FALLOC_FL_PUNCH_HOLE | keep)
        .unwrap();
    let attr = f.getattr(a.ino).unwrap();
    assert_eq!((attr.size, attr.blocks), (8 * p, 0));
    // KEEP_SIZE past the end allocates without growing; truncate frees it.
    f.fallocate(a.ino, 8 * p, 8 * p, keep).unwrap();
    assert_eq!(f.getattr(a.ino).unwrap().size, 8 * p);
    assert_eq!(f.getattr(a.ino).unwrap().blocks, 64);
    f.setattr(
        ME,
        a.ino,
        SetAttr {
            size: Some(0),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(f.getattr(a.ino).unwrap().blocks, 0);
    assert_eq!(f.store().pages_used().0, 0);
}

#[test]
fn xattrs() {
    let f = fs();
    let a = f.create(ME, ROOT_INO, n("a"), REG).unwrap();
    f.setxattr(a.ino, n("user.x"), b"1", 0).unwrap();
    assert_eq!(
        f.setxattr(a.ino, n("user.x"), b"2", libc::XATTR_CREATE),
        Err(Errno(libc::EEXIST))
    );
    assert_eq!(
        f.setxattr(a.ino, n("user.y"), b"2", libc::XATTR_REPLACE),
        Err(Errno(libc::ENODATA))
    );
    f.setxattr(a.ino, n("trusted.t"), b"", 0).unwrap();
    assert_eq!(f.getxattr(a.ino, n("user.x")).unwrap(), b"1");
    assert_eq!(f.listxattr(a.ino).unwrap(), b"trusted.t\0user.x\0");
    f.removexattr(a.ino, n("user.x")).unwrap();
    assert_eq!(f.getxattr(a.ino, n("user.x")), Err(Errno(libc::ENODATA)));
    assert_eq!(
        f.setxattr(a.ino, n("system.posix_acl_access"), b"", 0),
        Err(Errno(libc::EOPNOTSUPP))
    );
}

#[test]
fn metadata_is_charged_and_returned() {
    let f = fs();
    let before = f.store().stats().memory_used;
    let d = f.mkdir(ME, ROOT_INO, n("dir"), 0o755).unwrap();
    let a = f.create(ME, d.ino, n("file"), REG).unwrap();
    f.setxattr(a.ino, n("user.k"), &[0; 100], 0).unwrap();
    f.symlink(ME, d.ino, n("ln"), n("file")).unwrap();
    assert!(f.store().stats().memory_used > before);
    f.release(a.ino);
    f.unlink(d.ino, n("file")).unwrap();
    f.unlink(d.ino, n("ln")).unwrap();
    f.rmdir(ROOT_INO, n("dir")).unwrap();
    for ino in [d.ino, a.ino, a.ino + 1] {
        f.forget(ino, 1);
    }
    assert_eq!(f.store().stats().memory_used, before);
    assert_eq!(f.stats().inodes, 1);
}

#[test]
fn copy_range_and_efbig() {
    let f = fs();
    let a = f.create(ME, ROOT_INO, n("a"), REG).unwrap();
    let b = f.create(ME, ROOT_INO, n("b"), REG).unwrap();
    f.write(a.ino, 0, b"abcdefgh", true, false).unwrap();
    assert_eq!(f.copy_range(a.ino, 2, b.ino, 10, 100).unwrap(), 6);
    let mut buf = [0; 16];
    assert_eq!(f.read(b.ino, 0, &mut buf).unwrap(), 16);
    assert_eq!(&buf[10..], b"cdefgh");
    assert_eq!(
        f.write(a.ino, MAX_FILE_SIZE, b"xy", true, false),
        Err(Errno(libc::EFBIG))
    );
    assert_eq!(
        f.setattr(
            ME,
            a.ino,
            SetAttr {
                size: Some(MAX_FILE_SIZE + 1),
                ..Default::default()
            }
        )
        .map(|_| ()),
        Err(Errno(libc::EFBIG))
    );
}

#[test]
fn failed_write_and_fallocate_leave_nothing_behind() {
    let f = fs_with(1 << 20, 100);
    let a = f.create(ME, ROOT_INO, n("a"), REG).unwrap();
    let data: Vec<u8> = (0..2 << 20).map(|i| (i % 249) as u8).collect();
    // A cache flush fails whole and leaves nothing past EOF...
    assert_eq!(
        f.write(a.ino, 0, &data, false, false),
        Err(Errno(libc::ENOSPC))
    );
    assert_eq!(f.getattr(a.ino).unwrap().size, 0);
    // Nothing written past EOF shows when the file grows.
    f.setattr(
        ME,
        a.ino,
        SetAttr {
            size: Some(4096),
            ..Default::default()
        },
    )
    .unwrap();
    let mut b = [1; 4096];
    f.read(a.ino, 0, &mut b).unwrap();
    assert_eq!(b, [0; 4096]);
    // ...a program's write is short, like tmpfs: what fits is stored.
    let c = f.create(ME, ROOT_INO, n("c"), REG).unwrap();
    let short = f.write(c.ino, 0, &data, true, false).unwrap();
    assert_eq!(
        short,
        1 << 20,
        "the disk holds 1 MiB, and a (grown by truncate) holds no page"
    );
    assert_eq!(
        f.write(c.ino, short as u64, &data, true, false),
        Err(Errno(libc::ENOSPC))
    );
    f.release(c.ino);
    f.unlink(ROOT_INO, n("c")).unwrap();
    let b2 = f.create(ME, ROOT_INO, n("b"), REG).unwrap();
    assert_eq!(f.fallocate(b2.ino, 0, 4 << 20, 0), Err(Errno(libc::ENOSPC)));
    assert_eq!(f.getattr(b2.ino).unwrap().blocks, 0);
    for (ino, name) in [(a.ino, "a"), (b2.ino, "b")] {
        f.release(ino);
        f.unlink(ROOT_INO, n(name)).unwrap();
    }
    assert_eq!(f.store().pages_used().0, 0, "every page freed");
}

#[test]
fn readlink_and_readdir_follow_relatime() {
    let f = fs();
    let l = f.symlink(ME, ROOT_INO, n("l"), n("target")).unwrap();
    let future = SystemTime::now() + Duration::from_secs(3600);
    let set = SetAttr {
        atime: Some(SetTime::At(future)),
        ..Default::default()
    };
    f.setattr(ME, l.ino, set).unwrap();
    f.readlink(l.ino).unwrap();
    assert_eq!(
        f.getattr(l.ino).unwrap().atime,
        future,
        "atime newer than mtime stays"
    );
    let past = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let d = f.mkdir(ME, ROOT_INO, n("d"), 0o755).unwrap();
    f.setattr(
        ME,
        d.ino,
        SetAttr {
            atime: Some(SetTime::At(past)),
            mtime: Some(SetTime::At(past)),
            ..Default::default()
        },
    )
    .unwrap();
    let fh = f.opendir(d.ino).unwrap();
    f.dir_entries(d.ino, fh, 0).unwrap();
    assert!(
        f.getattr(d.ino).unwrap().atime > past,
        "listing moves a stale atime"
    );
}

#[test]
fn chown_write_and_truncate_drop_setuid_like_the_vfs() {
    let f = fs();
    let a = f
        .create(ME, ROOT_INO, n("a"), libc::S_IFREG | 0o6755)
        .unwrap();
    f.setxattr(a.ino, n("security.capability"), b"cap", 0)
        .unwrap();
    // A write the kernel flags (writer without CAP_FSETID).
    f.write(a.ino, 0, b"x", true, true).unwrap();
    let attr = f.getattr(a.ino).unwrap();
    assert_eq!(attr.perm, 0o755, "setuid and (group-exec) setgid dropped");
    assert_eq!(
        f.getxattr(a.ino, n("security.capability")),
        Err(Errno(libc::ENODATA))
    );
    // setgid without group-exec is mandatory locking, not privilege: kept.
    let mode = |m| SetAttr {
        mode: Some(m),
        ..Default::default()
    };
    f.setattr(ME, a.ino, mode(0o6745)).unwrap();
    let root = Caller { uid: 0, gid: 0 };
    let chown = SetAttr {
        uid: Some(5),
        ..Default::default()
    };
    assert_eq!(f.setattr(root, a.ino, chown).unwrap().perm, 0o2745);
    // Truncate by root keeps the bits; by anyone else drops them.
    f.setattr(root, a.ino, mode(0o4755)).unwrap();
    let trunc = SetAttr {
        size: Some(0),
        ..Default::default()
    };
    assert_eq!(f.setattr(root, a.ino, trunc).unwrap().perm, 0o4755);
    assert_eq!(f.setattr(ME, a.ino, trunc).unwrap().perm, 0o755);
}
