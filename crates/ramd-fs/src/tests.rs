//! The filesystem's semantics, checked without a mount.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ramd_store::{Store, StoreConfig, PAGE_SIZE};

use crate::fs::*;

const ME: Caller = Caller {
    uid: 1000,
    gid: 100,
    pid: 0,
    umask: 0,
};

/// A filesystem of `size` bytes and `nr_inodes` inodes over its own store.
pub(crate) fn fs_with(size: u64, nr_inodes: u64) -> Fs {
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
            atime: Atime::default(),
        },
    )
    .unwrap()
}

/// A SETATTR that changes only the size.
fn resize(size: u64) -> SetAttr {
    SetAttr {
        size: Some(size),
        ..Default::default()
    }
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
    assert_eq!(
        f.write(&f.change(), a.ino, 5000, b"hello", true, ME, false)
            .unwrap(),
        5
    );
    let mut buf = [9u8; 8192];
    assert_eq!(f.read(a.ino, 0, &mut buf).unwrap(), 5005);
    assert!(buf[..5000].iter().all(|&b| b == 0));
    assert_eq!(&buf[5000..5005], b"hello");
    assert_eq!(f.getattr(a.ino).unwrap().blocks, 8, "one 4 KiB page");
    let t = f.setattr(ME, a.ino, resize(5002)).unwrap();
    assert_eq!(t.size, 5002);
    // Growing again reads zeros where the cut tail was.
    f.setattr(ME, a.ino, resize(6000)).unwrap();
    assert_eq!(f.read(a.ino, 5000, &mut buf).unwrap(), 1000);
    assert_eq!(&buf[..5], b"he\0\0\0");
}

#[test]
fn unlink_frees_data_at_last_close() {
    let f = fs();
    let a = f.create(ME, ROOT_INO, n("a"), REG).unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i| (i % 253) as u8).collect();
    f.write(&f.change(), a.ino, 0, &data, true, ME, false)
        .unwrap();
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
    assert_eq!(f.rmdir(ROOT_INO, n("d")), Err(Errno::ENOTEMPTY));
    assert_eq!(f.unlink(ROOT_INO, n("d")), Err(Errno::EISDIR));
    assert_eq!(f.mkdir(ME, ROOT_INO, n("d"), 0o755), Err(Errno::EEXIST));
    assert_eq!(f.link(d.ino, ROOT_INO, n("dl")), Err(Errno::EPERM));
    f.unlink(d.ino, n("x")).unwrap();
    assert_eq!(f.getattr(x.ino).unwrap().nlink, 1);
    f.rmdir(ROOT_INO, n("d")).unwrap();
    assert_eq!(f.getattr(ROOT_INO).unwrap().nlink, 2);
    let long = "x".repeat(256);
    assert_eq!(
        f.mkdir(ME, ROOT_INO, n(&long), 0o755),
        Err(Errno::ENAMETOOLONG)
    );
    assert_eq!(f.mkdir(ME, x.ino, n("y"), 0o755), Err(Errno::ENOTDIR));
}

#[test]
fn rename_rules() {
    let f = fs();
    let a = f.mkdir(ME, ROOT_INO, n("a"), 0o755).unwrap();
    let b = f.mkdir(ME, ROOT_INO, n("b"), 0o755).unwrap();
    let file = f.create(ME, a.ino, n("f"), REG).unwrap();
    // Directory into its own subtree.
    assert_eq!(
        f.rename(ME, ROOT_INO, n("a"), a.ino, n("sub"), 0),
        Err(Errno::EINVAL)
    );
    // Non-directory over a directory and back.
    assert_eq!(
        f.rename(ME, a.ino, n("f"), ROOT_INO, n("b"), 0),
        Err(Errno::EISDIR)
    );
    f.create(ME, ROOT_INO, n("g"), REG).unwrap();
    assert_eq!(
        f.rename(ME, ROOT_INO, n("b"), ROOT_INO, n("g"), 0),
        Err(Errno::ENOTDIR)
    );
    // NOREPLACE refuses an existing target.
    assert_eq!(
        f.rename(ME, a.ino, n("f"), ROOT_INO, n("g"), libc::RENAME_NOREPLACE),
        Err(Errno::EEXIST)
    );
    // Moving a directory fixes both parents' link counts and "..".
    f.rename(ME, ROOT_INO, n("b"), a.ino, n("b"), 0).unwrap();
    assert_eq!(f.getattr(ROOT_INO).unwrap().nlink, 3);
    assert_eq!(f.getattr(a.ino).unwrap().nlink, 3);
    assert_eq!(f.list_dir(b.ino).unwrap()[1].ino, a.ino);
    // EXCHANGE swaps a file and a directory across parents.
    f.rename(ME, a.ino, n("f"), ROOT_INO, n("g"), 0).unwrap();
    assert_eq!(f.lookup(ROOT_INO, n("g")).unwrap().ino, file.ino);
    f.rename(ME, ROOT_INO, n("g"), a.ino, n("b"), libc::RENAME_EXCHANGE)
        .unwrap();
    assert_eq!(f.lookup(ROOT_INO, n("g")).unwrap().ino, b.ino);
    assert_eq!(f.lookup(a.ino, n("b")).unwrap().ino, file.ino);
    assert_eq!(f.getattr(a.ino).unwrap().nlink, 2);
    assert_eq!(f.getattr(ROOT_INO).unwrap().nlink, 4);
    // Renaming over a hard link of itself changes nothing.
    f.link(file.ino, a.ino, n("same")).unwrap();
    f.rename(ME, a.ino, n("b"), a.ino, n("same"), 0).unwrap();
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
    let other = Caller {
        uid: 5,
        gid: 6,
        pid: 0,
        umask: 0,
    };
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
    f.write(&f.change(), a.ino, 0, &data, true, ME, false)
        .unwrap();
    assert_eq!(
        f.write(&f.change(), a.ino, 1 << 20, &[1; 4096], true, ME, false),
        Err(Errno::ENOSPC)
    );
    let mut back = vec![0; 1 << 20];
    assert_eq!(f.read(a.ino, 0, &mut back).unwrap(), 1 << 20);
    assert_eq!(back, data);
    f.mkdir(ME, ROOT_INO, n("b"), 0o755).unwrap();
    f.mknod(ME, ROOT_INO, n("c"), libc::S_IFIFO | 0o644, 0)
        .unwrap();
    assert_eq!(
        f.mkdir(ME, ROOT_INO, n("d"), 0o755),
        Err(Errno::ENOSPC),
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
    f.write(&f.change(), a.ino, 0, &[1; PAGE_SIZE], true, ME, false)
        .unwrap();
    f.write(&f.change(), a.ino, 4 * p, &[2; PAGE_SIZE], true, ME, false)
        .unwrap();
    assert_eq!(f.seek(a.ino, 0, Whence::Hole).unwrap(), p);
    assert_eq!(f.seek(a.ino, p, Whence::Data).unwrap(), 4 * p);
    assert_eq!(f.seek(a.ino, 4 * p, Whence::Hole).unwrap(), 5 * p);
    assert_eq!(f.seek(a.ino, 5 * p, Whence::Data), Err(Errno::ENXIO));
    // Default mode allocates without touching data and extends the size.
    f.fallocate(ME, a.ino, 0, 8 * p, 0).unwrap();
    let attr = f.getattr(a.ino).unwrap();
    assert_eq!((attr.size, attr.blocks), (8 * p, 64));
    let mut b = [0; 4];
    f.read(a.ino, 4 * p, &mut b).unwrap();
    assert_eq!(b, [2; 4]);
    // Punch needs KEEP_SIZE, and frees the pages.
    assert_eq!(
        f.fallocate(ME, a.ino, 0, p, libc::FALLOC_FL_PUNCH_HOLE),
        Err(Errno::EOPNOTSUPP)
    );
    let keep = libc::FALLOC_FL_KEEP_SIZE;
    f.fallocate(ME, a.ino, 0, 8 * p, libc::FALLOC_FL_PUNCH_HOLE | keep)
        .unwrap();
    let attr = f.getattr(a.ino).unwrap();
    assert_eq!((attr.size, attr.blocks), (8 * p, 0));
    // KEEP_SIZE past the end allocates without growing; truncate frees it.
    f.fallocate(ME, a.ino, 8 * p, 8 * p, keep).unwrap();
    assert_eq!(f.getattr(a.ino).unwrap().size, 8 * p);
    assert_eq!(f.getattr(a.ino).unwrap().blocks, 64);
    f.setattr(ME, a.ino, resize(0)).unwrap();
    assert_eq!(f.getattr(a.ino).unwrap().blocks, 0);
    assert_eq!(f.store().pages_used().0, 0);
}

#[test]
fn xattrs() {
    let f = fs();
    let a = f.create(ME, ROOT_INO, n("a"), REG).unwrap();
    f.setxattr(a.ino, n("user.x"), b"1", 0, false).unwrap();
    assert_eq!(
        f.setxattr(a.ino, n("user.x"), b"2", libc::XATTR_CREATE, false),
        Err(Errno::EEXIST)
    );
    assert_eq!(
        f.setxattr(a.ino, n("user.y"), b"2", libc::XATTR_REPLACE, false),
        Err(Errno::ENODATA)
    );
    f.setxattr(a.ino, n("trusted.t"), b"", 0, false).unwrap();
    assert_eq!(f.getxattr(a.ino, n("user.x")).unwrap(), b"1");
    assert_eq!(f.listxattr(a.ino).unwrap(), b"trusted.t\0user.x\0");
    f.removexattr(a.ino, n("user.x")).unwrap();
    assert_eq!(f.getxattr(a.ino, n("user.x")), Err(Errno::ENODATA));
    // ACLs are the only system.* names (the kernel checks their format).
    assert_eq!(
        f.setxattr(a.ino, n("system.other"), b"", 0, false),
        Err(Errno::EOPNOTSUPP)
    );
}

#[test]
fn metadata_is_charged_and_returned() {
    let f = fs();
    let before = f.store().stats().memory_used;
    let d = f.mkdir(ME, ROOT_INO, n("dir"), 0o755).unwrap();
    let a = f.create(ME, d.ino, n("file"), REG).unwrap();
    f.setxattr(a.ino, n("user.k"), &[0; 100], 0, false).unwrap();
    f.symlink(ME, d.ino, n("ln"), n("file")).unwrap();
    assert!(f.store().stats().memory_used > before);
    f.release(a.ino);
    f.unlink(d.ino, n("file")).unwrap();
    f.unlink(d.ino, n("ln")).unwrap();
    f.rmdir(ROOT_INO, n("dir")).unwrap();
    for ino in [d.ino, a.ino, Ino(a.ino.0 + 1)] {
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
    f.write(&f.change(), a.ino, 0, b"abcdefgh", true, ME, false)
        .unwrap();
    assert_eq!(f.copy_range(ME, a.ino, 2, b.ino, 10, 100).unwrap(), 6);
    let mut buf = [0; 16];
    assert_eq!(f.read(b.ino, 0, &mut buf).unwrap(), 16);
    assert_eq!(&buf[10..], b"cdefgh");
    assert_eq!(
        f.write(&f.change(), a.ino, MAX_FILE_SIZE, b"xy", true, ME, false),
        Err(Errno::EFBIG)
    );
    assert_eq!(
        f.setattr(ME, a.ino, resize(MAX_FILE_SIZE + 1)).map(|_| ()),
        Err(Errno::EFBIG)
    );
}

#[test]
fn failed_write_and_fallocate_leave_nothing_behind() {
    let f = fs_with(1 << 20, 100);
    let a = f.create(ME, ROOT_INO, n("a"), REG).unwrap();
    let data: Vec<u8> = (0..2 << 20).map(|i| (i % 249) as u8).collect();
    // A cache flush fails whole and leaves nothing past EOF...
    assert_eq!(
        f.write(&f.change(), a.ino, 0, &data, false, ME, false),
        Err(Errno::ENOSPC)
    );
    assert_eq!(f.getattr(a.ino).unwrap().size, 0);
    // Nothing written past EOF shows when the file grows.
    f.setattr(ME, a.ino, resize(4096)).unwrap();
    let mut b = [1; 4096];
    f.read(a.ino, 0, &mut b).unwrap();
    assert_eq!(b, [0; 4096]);
    // ...a program's write is short, like tmpfs: what fits is stored.
    let c = f.create(ME, ROOT_INO, n("c"), REG).unwrap();
    let short = f
        .write(&f.change(), c.ino, 0, &data, true, ME, false)
        .unwrap();
    assert_eq!(
        short,
        1 << 20,
        "the disk holds 1 MiB, and a (grown by truncate) holds no page"
    );
    assert_eq!(
        f.write(&f.change(), c.ino, short as u64, &data, true, ME, false),
        Err(Errno::ENOSPC)
    );
    f.release(c.ino);
    f.unlink(ROOT_INO, n("c")).unwrap();
    let b2 = f.create(ME, ROOT_INO, n("b"), REG).unwrap();
    assert_eq!(f.fallocate(ME, b2.ino, 0, 4 << 20, 0), Err(Errno::ENOSPC));
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
    f.list_dir(d.ino).unwrap();
    assert!(
        f.getattr(d.ino).unwrap().atime > past,
        "listing moves a stale atime"
    );
}

#[test]
fn strictatime_noatime_and_nodiratime_change_with_set_atime() {
    let f = fs();
    let file = f.create(ME, ROOT_INO, n("f"), 0o644).unwrap().ino;
    // (A read at the end touches nothing: the kernel never sends one.)
    f.write(&f.change(), file, 0, b"some data", true, ME, false)
        .unwrap();
    let dir = f.mkdir(ME, ROOT_INO, n("d"), 0o755).unwrap().ino;
    let future = SystemTime::now() + Duration::from_secs(3600);
    let old = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
    let set = |ino, t| {
        let set = SetAttr {
            atime: Some(SetTime::At(t)),
            ..Default::default()
        };
        f.setattr(ME, ino, set).unwrap();
    };
    let atime = |ino| f.getattr(ino).unwrap().atime;
    let list = |ino| {
        f.list_dir(ino).unwrap();
    };
    let mut buf = [0u8; 8];
    // relatime (the default): a fresh atime stays, and open keeps the cache.
    set(file, future);
    assert!(!f.read_moves_atime(file));
    f.read(file, 0, &mut buf).unwrap();
    assert_eq!(atime(file), future);
    // strictatime: every access moves it, and every open must reach us.
    f.set_atime(Atime {
        mode: AtimeMode::Strict,
        nodiratime: false,
    });
    assert!(f.read_moves_atime(file));
    f.read(file, 0, &mut buf).unwrap();
    assert!(atime(file) < future, "strictatime: the read moved atime");
    // noatime: nothing does, however old.
    f.set_atime(Atime {
        mode: AtimeMode::Never,
        nodiratime: false,
    });
    set(file, old);
    assert!(!f.read_moves_atime(file));
    f.read(file, 0, &mut buf).unwrap();
    assert_eq!(atime(file), old);
    // nodiratime: directories stay, files follow relatime.
    f.set_atime(Atime {
        mode: AtimeMode::Relatime,
        nodiratime: true,
    });
    set(dir, old);
    list(dir);
    assert_eq!(atime(dir), old, "nodiratime: listing moved the dir's atime");
    assert!(f.read_moves_atime(file));
    // An atime equal to ctime still moves (relatime compares with <=):
    // read once the coarse clock has passed the ctime `set` gave.
    let ctime = f.getattr(file).unwrap().ctime;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while crate::fs::now() <= ctime {
        assert!(
            std::time::Instant::now() < deadline,
            "the clock stood still"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    f.read(file, 0, &mut buf).unwrap();
    assert!(atime(file) > old);
    assert!(!f.read_moves_atime(file), "moved once, it stays (relatime)");
    f.set_atime(Atime::default());
    list(dir);
    assert!(atime(dir) > old);
}

#[test]
fn chown_write_and_truncate_drop_setuid_like_the_vfs() {
    let f = fs();
    let a = f
        .create(ME, ROOT_INO, n("a"), libc::S_IFREG | 0o6755)
        .unwrap();
    f.setxattr(a.ino, n("security.capability"), b"cap", 0, false)
        .unwrap();
    // A write the kernel flags (writer without CAP_FSETID).
    f.write(&f.change(), a.ino, 0, b"x", true, ME, true)
        .unwrap();
    let attr = f.getattr(a.ino).unwrap();
    assert_eq!(attr.perm, 0o755, "setuid and (group-exec) setgid dropped");
    assert_eq!(
        f.getxattr(a.ino, n("security.capability")),
        Err(Errno::ENODATA)
    );
    // setgid without group-exec is mandatory locking, not privilege: kept.
    let mode = |m| SetAttr {
        mode: Some(m),
        ..Default::default()
    };
    f.setattr(ME, a.ino, mode(0o6745)).unwrap();
    let root = Caller {
        uid: 0,
        gid: 0,
        pid: 0,
        umask: 0,
    };
    let chown = SetAttr {
        uid: Some(5),
        ..Default::default()
    };
    assert_eq!(f.setattr(root, a.ino, chown).unwrap().perm, 0o2745);
    // Truncate by root keeps the bits; by anyone else drops them.
    f.setattr(root, a.ino, mode(0o4755)).unwrap();
    let trunc = resize(0);
    assert_eq!(f.setattr(root, a.ino, trunc).unwrap().perm, 0o4755);
    assert_eq!(f.setattr(ME, a.ino, trunc).unwrap().perm, 0o755);
}

#[test]
fn setgid_goes_for_a_writer_outside_the_group_as_on_tmpfs() {
    let f = fs();
    // pid 0: no /proc to read, so uid 0 stands in for CAP_FSETID.
    let other = Caller {
        uid: 5,
        gid: 6,
        pid: 0,
        umask: 0,
    };
    let mk = |name| {
        f.create(ME, ROOT_INO, n(name), libc::S_IFREG | 0o6666)
            .unwrap()
            .ino
    };
    let (w, fa, own) = (mk("w"), mk("fa"), mk("own"));
    f.write(&f.change(), w, 0, b"x", true, other, true).unwrap();
    assert_eq!(f.getattr(w).unwrap().perm, 0o666, "not in the file's group");
    f.fallocate(other, fa, 0, 4096, libc::FALLOC_FL_KEEP_SIZE)
        .unwrap();
    assert_eq!(f.getattr(fa).unwrap().perm, 0o666, "fallocate is a write");
    // In the group and not group-executable: setgid stays, setuid goes.
    f.write(&f.change(), own, 0, b"x", true, ME, false).unwrap();
    assert_eq!(f.getattr(own).unwrap().perm, 0o2666);
}

#[test]
fn lookup_of_dot_and_dotdot_for_file_handles() {
    let f = fs();
    let d = f.mkdir(ME, ROOT_INO, n("d"), 0o755).unwrap();
    let a = f.create(ME, d.ino, n("a"), libc::S_IFREG | 0o644).unwrap();
    assert_eq!(f.lookup(a.ino, n(".")).unwrap().ino, a.ino);
    assert_eq!(f.lookup(d.ino, n("..")).unwrap().ino, ROOT_INO);
    assert_eq!(f.lookup(a.ino, n("..")), Err(Errno::ENOTDIR));
}

#[test]
fn a_default_acl_replaces_the_umask_and_is_inherited() {
    let f = fs();
    let acl = |entries: &[(u16, u16, u32)]| {
        let mut v = 2u32.to_le_bytes().to_vec();
        for &(tag, perm, id) in entries {
            v.extend(tag.to_le_bytes());
            v.extend(perm.to_le_bytes());
            v.extend(id.to_le_bytes());
        }
        v
    };
    let d = f.mkdir(ME, ROOT_INO, n("d"), 0o755).unwrap().ino;
    // user::rwx user:42:rwx group::r-x mask::rwx other::---
    let default = acl(&[(1, 7, 0), (2, 7, 42), (4, 5, 0), (0x10, 7, 0), (0x20, 0, 0)]);
    f.setxattr(d, n("system.posix_acl_default"), &default, 0, false)
        .unwrap();
    let masked = Caller { umask: 0o077, ..ME };
    let a = f.create(masked, d, n("a"), libc::S_IFREG | 0o664).unwrap();
    assert_eq!(a.perm, 0o660, "mode limited by the ACL, not the umask");
    let access = f.getxattr(a.ino, n("system.posix_acl_access")).unwrap();
    assert_eq!(
        access,
        acl(&[(1, 6, 0), (2, 7, 42), (4, 5, 0), (0x10, 6, 0), (0x20, 0, 0)])
    );
    let sub = f.mkdir(masked, d, n("sub"), 0o777).unwrap().ino;
    assert_eq!(
        f.getxattr(sub, n("system.posix_acl_default")).unwrap(),
        default
    );
    // Without a default ACL the umask applies.
    let b = f
        .create(masked, ROOT_INO, n("b"), libc::S_IFREG | 0o666)
        .unwrap();
    assert_eq!(b.perm, 0o600);
}

#[test]
fn an_access_acl_drops_setgid_only_when_the_kernel_says_so() {
    let f = fs();
    // user::rwx user:42:r-- group::rwx mask::rwx other::---
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 7u16, 0u32),
        (2, 4, 42),
        (4, 7, 0),
        (0x10, 7, 0),
        (0x20, 0, 0),
    ] {
        acl.extend(tag.to_le_bytes());
        acl.extend(perm.to_le_bytes());
        acl.extend(id.to_le_bytes());
    }
    let access = n("system.posix_acl_access");
    let a = f
        .create(ME, ROOT_INO, n("a"), libc::S_IFREG | 0o2770)
        .unwrap()
        .ino;
    f.setxattr(a, access, &acl, 0, false).unwrap();
    assert_eq!(f.getattr(a).unwrap().perm, 0o2770, "caller may keep it");
    f.setxattr(a, access, &acl, 0, true).unwrap();
    assert_eq!(f.getattr(a).unwrap().perm, 0o770, "posix_acl_update_mode");
    // Only an access ACL moves the mode.
    let d = f.mkdir(ME, ROOT_INO, n("d"), 0o2770).unwrap().ino;
    f.setxattr(d, n("system.posix_acl_default"), &acl, 0, true)
        .unwrap();
    assert_eq!(f.getattr(d).unwrap().perm, 0o2770);
}

// ---- Saving and loading the tree (`save_meta`, `Fs::load`) ----

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::time::UNIX_EPOCH;

use ramd_store::{ExtentKind, CHUNK_BYTES};

use crate::fs::meta::{load_time, save_time, Bytes, SavedData, SavedKind, SavedMeta, META_VERSION};

const DISK: u64 = 64 << 20;

fn new_store(size: u64) -> Arc<Store> {
    Arc::new(
        Store::new(StoreConfig {
            page_limit: Some(size / PAGE_SIZE as u64),
            max_memory: Some(size * 2 + (16 << 20)),
            host_reserve: 0,
            ..StoreConfig::new(ramd_store::MAX_SIZE)
        })
        .unwrap(),
    )
}

/// noatime: walking a tree to compare it must not change it.
fn cfg(nr_inodes: u64) -> FsConfig {
    FsConfig {
        size: Some(DISK),
        nr_inodes,
        mode: 0o1777,
        uid: 0,
        gid: 0,
        atime: Atime {
            mode: AtimeMode::Never,
            nodiratime: false,
        },
    }
}

/// Everything a program can see of one name in the tree.
#[derive(Debug, PartialEq)]
struct Seen {
    path: OsString,
    attr: Attr,
    xattrs: Vec<(OsString, Vec<u8>)>,
    /// Directory listing (with "." and ".."), symlink target, or file data.
    entries: Vec<(OsString, Ino)>,
    target: Option<Vec<u8>>,
    data: Option<Vec<u8>>,
    /// (start, end) of each data run, by SEEK_DATA / SEEK_HOLE.
    runs: Vec<(u64, u64)>,
}

fn walk(f: &Fs) -> Vec<Seen> {
    let mut out = Vec::new();
    let mut todo = vec![(ROOT_INO, OsString::from("/"))];
    while let Some((ino, path)) = todo.pop() {
        let attr = f.getattr(ino).unwrap();
        let names = f.listxattr(ino).unwrap();
        let xattrs = names
            .split(|&b| b == 0)
            .filter(|n| !n.is_empty())
            .map(|n| {
                let n = OsStr::from_bytes(n);
                (n.to_owned(), f.getxattr(ino, n).unwrap())
            })
            .collect();
        let mut seen = Seen {
            path: path.clone(),
            attr,
            xattrs,
            entries: Vec::new(),
            target: None,
            data: None,
            runs: Vec::new(),
        };
        match attr.kind {
            Kind::Dir => {
                // By name: a listing goes in the order names were added,
                // which a load does not keep.
                let mut list = f.list_dir(ino).unwrap();
                list.sort_by(|a, b| a.name.cmp(&b.name));
                for e in list.iter() {
                    seen.entries.push((e.name.clone(), e.ino));
                    assert_eq!(e.kind, f.getattr(e.ino).unwrap().kind);
                    if e.name != "." && e.name != ".." {
                        let mut p = path.clone();
                        p.push(&e.name);
                        p.push("/");
                        todo.push((e.ino, p));
                    }
                }
            }
            Kind::Symlink => seen.target = Some(f.readlink(ino).unwrap()),
            Kind::File => {
                let mut data = vec![0; attr.size as usize];
                assert_eq!(f.read(ino, 0, &mut data).unwrap(), data.len());
                seen.data = Some(data);
                let mut pos = 0;
                while let Ok(start) = f.seek(ino, pos, Whence::Data) {
                    let end = f.seek(ino, start, Whence::Hole).unwrap();
                    seen.runs.push((start, end));
                    pos = end;
                }
            }
            _ => {}
        }
        out.push(seen);
    }
    out
}

fn set_times(f: &Fs, ino: Ino, atime: SystemTime, mtime: SystemTime, ctime: SystemTime) {
    let set = SetAttr {
        atime: Some(SetTime::At(atime)),
        mtime: Some(SetTime::At(mtime)),
        ctime: Some(ctime),
        ..Default::default()
    };
    f.setattr(ME, ino, set).unwrap();
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

struct Built {
    /// Unlinked but still open when saved.
    orphan: Ino,
    /// Removed directory still known to the kernel.
    gone_dir: Ino,
    orphan_pages: u64,
}

/// A tree with one of everything `Fs` keeps.
fn build_tree(f: &Fs) -> Built {
    let p = PAGE_SIZE as u64;
    let root = Caller {
        uid: 0,
        gid: 0,
        pid: 0,
        umask: 0,
    };
    let other = Caller {
        uid: 7,
        gid: 8,
        pid: 0,
        umask: 0,
    };
    let docs = f.mkdir(ME, ROOT_INO, n("docs"), 0o755).unwrap().ino;
    let a = f.create(ME, docs, n("a.txt"), REG).unwrap().ino;
    f.write(&f.change(), a, 0, &pattern(10_000, 1), true, ME, false)
        .unwrap();
    f.release(a);
    let mut dir = docs;
    for name in ["deep", "er", "est"] {
        dir = f.mkdir(other, dir, n(name), 0o700).unwrap().ino;
    }
    let bottom = f.create(other, dir, n("bottom"), REG).unwrap().ino;
    f.write(&f.change(), bottom, 0, b"at the bottom", true, ME, false)
        .unwrap();
    f.release(bottom);
    // Sparse: data, a 3 MiB hole, data.
    let sparse = f.create(ME, ROOT_INO, n("sparse"), REG).unwrap().ino;
    f.write(&f.change(), sparse, 0, &pattern(4096, 2), true, ME, false)
        .unwrap();
    f.write(
        &f.change(),
        sparse,
        (3 << 20) + 10,
        &pattern(100, 3),
        true,
        ME,
        false,
    )
    .unwrap();
    f.release(sparse);
    // Allocated past its size (KEEP_SIZE), in the next chunk too.
    let pre = f.create(ME, ROOT_INO, n("prealloc"), REG).unwrap().ino;
    f.write(&f.change(), pre, 0, &pattern(5000, 4), true, ME, false)
        .unwrap();
    f.fallocate(ME, pre, 8192, 300 << 10, libc::FALLOC_FL_KEEP_SIZE)
        .unwrap();
    f.release(pre);
    // Zero pages (fallocate) and a same-filled page.
    let filled = f.create(ME, ROOT_INO, n("filled"), REG).unwrap().ino;
    f.fallocate(ME, filled, 0, 4 * p, 0).unwrap();
    f.write(&f.change(), filled, 4 * p, &[7; PAGE_SIZE], true, ME, false)
        .unwrap();
    f.release(filled);
    let empty = f.mknod(ME, ROOT_INO, n("empty"), REG, 0).unwrap().ino;
    f.link(a, ROOT_INO, n("hard")).unwrap();
    f.link(a, dir, n("hard2")).unwrap();
    f.symlink(ME, ROOT_INO, n("ln"), n("docs/a.txt")).unwrap();
    let long = "x/".repeat(500);
    let ln2 = f.symlink(ME, docs, n("long"), n(&long)).unwrap().ino;
    f.mknod(ME, ROOT_INO, n("fifo"), libc::S_IFIFO | 0o600, 0)
        .unwrap();
    f.mknod(root, ROOT_INO, n("null"), libc::S_IFCHR | 0o666, 0x103)
        .unwrap();
    f.mknod(root, docs, n("blk"), libc::S_IFBLK | 0o660, 0x801)
        .unwrap();
    f.mknod(ME, docs, n("sock"), libc::S_IFSOCK | 0o755, 0)
        .unwrap();
    let suid = f
        .mknod(root, ROOT_INO, n("suid"), libc::S_IFREG | 0o4755, 0)
        .unwrap()
        .ino;
    let sgid = f.mkdir(ME, ROOT_INO, n("shared"), 0o2775).unwrap().ino;
    let sticky = f.mkdir(ME, sgid, n("tmp"), 0o1777).unwrap().ino;
    f.mknod(other, sticky, n("nothing"), libc::S_IFREG, 0)
        .unwrap();
    f.setattr(
        root,
        sgid,
        SetAttr {
            uid: Some(0),
            gid: Some(4242),
            ..Default::default()
        },
    )
    .unwrap();
    // Moved across directories: parents and ".." change.
    f.rename(ME, ROOT_INO, n("empty"), sticky, n("moved"), 0)
        .unwrap();
    let mv = f.mkdir(ME, ROOT_INO, n("mvdir"), 0o755).unwrap().ino;
    f.rename(ME, ROOT_INO, n("mvdir"), docs, n("mvdir"), 0)
        .unwrap();
    f.setxattr(a, n("user.bin"), &[0, 1, 2, 255, 0], 0, false)
        .unwrap();
    f.setxattr(a, n("user.big"), &pattern(60_000, 5), 0, false)
        .unwrap();
    f.setxattr(a, n("user.empty"), b"", 0, false).unwrap();
    f.setxattr(docs, n("trusted.x"), b"dir xattr", 0, false)
        .unwrap();
    f.setxattr(ROOT_INO, n("security.selinux"), b"root_t", 0, false)
        .unwrap();
    f.setxattr(ln2, n("trusted.l"), b"on a symlink", 0, false)
        .unwrap();
    // Unlinked but open, with data; and a removed directory still looked up.
    let orphan = f.create(ME, ROOT_INO, n("orphan"), REG).unwrap().ino;
    f.write(
        &f.change(),
        orphan,
        0,
        &pattern(1 << 20, 6),
        true,
        ME,
        false,
    )
    .unwrap();
    f.unlink(ROOT_INO, n("orphan")).unwrap();
    let gone_dir = f.mkdir(ME, ROOT_INO, n("gone"), 0o755).unwrap().ino;
    f.rmdir(ROOT_INO, n("gone")).unwrap();
    // Times last (every change above sets some), before 1970 too.
    let epoch = UNIX_EPOCH;
    let before = |s: u64, ns: u32| epoch - Duration::new(s, ns);
    set_times(
        f,
        a,
        before(1, 500_000_000),
        before(10_000_000_000, 0),
        epoch,
    );
    set_times(f, sparse, epoch, before(0, 1), before(1, 0));
    set_times(
        f,
        docs,
        epoch + Duration::new(4_000_000_000, 123),
        before(86_400 * 365, 999_999_999),
        epoch + Duration::new(1, 1),
    );
    set_times(f, mv, before(3, 3), before(3, 3), before(3, 3));
    set_times(f, suid, epoch, epoch, epoch);
    set_times(f, empty, before(1, 0), epoch, before(2, 0));
    Built {
        orphan,
        gone_dir,
        orphan_pages: 256,
    }
}

/// Copies every page of `from` to `to` as it is: holes stay holes, zero
/// pages zero pages, data (same-filled or not) data.
fn copy_store(from: &Store, to: &Store) {
    let mut buf = vec![0; CHUNK_BYTES as usize];
    for off in from.data_chunks() {
        let mut pos = off;
        for e in from.extents(off, CHUNK_BYTES, 64).unwrap() {
            match e.kind {
                ExtentKind::Hole => {}
                ExtentKind::Zero => to.change().allocate(pos, e.length, &mut 0).unwrap(),
                ExtentKind::Data => {
                    let b = &mut buf[..e.length as usize];
                    from.read(pos, b).unwrap();
                    to.change().write(pos, b).unwrap();
                }
            }
            pos += e.length;
        }
    }
}

/// The store counters a loaded tree must reproduce.
fn usage(s: &Store) -> (u64, u64, u64, u64, u64, u64, u64) {
    let st = s.stats();
    (
        st.memory_used,
        st.metadata_bytes,
        st.chunks,
        st.data_pages,
        st.fill_pages,
        st.zero_pages,
        s.pages_used().0,
    )
}

fn fs_counts(f: &Fs) -> (u64, u64, u64, u64, (u64, u64, u64, u64)) {
    let s = f.stats();
    (s.inodes, s.files, s.dirs, s.file_bytes, f.statfs())
}

#[test]
fn save_and_load_keep_everything_and_its_cost() {
    let a = new_store(DISK);
    let f1 = Fs::new(a.clone(), cfg(1000)).unwrap();
    let built = build_tree(&f1);
    let before = walk(&f1);
    let meta = f1.save_meta();
    assert_eq!(f1.save_meta(), meta, "saving is deterministic");
    // A second store holding the same pages, as loading an image makes it.
    let b = new_store(DISK);
    copy_store(&a, &b);
    assert_eq!(usage(&b).3, usage(&a).3);
    let f2 = Fs::load(b.clone(), cfg(1000), &meta).unwrap();
    assert_eq!(walk(&f2), before);
    assert_eq!(
        f2.getattr(built.orphan),
        Err(Errno::ENOENT),
        "unlinked inodes are not saved"
    );
    assert_eq!(f2.getattr(built.gone_dir), Err(Errno::ENOENT));
    // The original, once its unsaved inodes go, is what was loaded: same
    // memory, to the byte, and the orphan's data trimmed from the copy.
    let mut buf = [0; 4];
    assert_eq!(f1.read(built.orphan, 0, &mut buf).unwrap(), 4);
    assert_eq!(buf[..], pattern(4, 6)[..]);
    let (_, _, _, data_a, ..) = usage(&a);
    assert_eq!(usage(&b).3, data_a - built.orphan_pages);
    f1.release(built.orphan);
    f1.forget(built.orphan, 1);
    f1.forget(built.gone_dir, 1);
    assert_eq!(usage(&b), usage(&a));
    assert_eq!(fs_counts(&f2), fs_counts(&f1));

    // The loaded tree works on: a new file takes a free slot, not a
    // loaded file's, and its pages land in its own range.
    let c = f2.create(ME, ROOT_INO, n("new"), REG).unwrap().ino;
    f2.write(&f2.change(), c, 0, &pattern(300_000, 9), true, ME, false)
        .unwrap();
    let d = f2.mkdir(ME, ROOT_INO, n("newdir"), 0o755).unwrap().ino;
    assert!(c > built.gone_dir && d > c, "inode numbers not reused");
    let after = walk(&f2);
    for s in before.iter().filter(|s| s.path != "/") {
        assert!(after.contains(s), "{:?} changed", s.path);
    }
    f2.release(c);
    f2.forget(c, 1);
    f2.forget(d, 1);

    // Removing everything returns every byte charged at load.
    remove_all(&f2, ROOT_INO);
    f2.removexattr(ROOT_INO, n("security.selinux")).unwrap();
    let empty = Fs::new(new_store(DISK), cfg(1000)).unwrap();
    assert_eq!(usage(&b), usage(empty.store()));
    assert_eq!(f2.stats().inodes, 1);
}

/// Unlinks everything below `dir` (inodes with no lookups go at once).
fn remove_all(f: &Fs, dir: Ino) {
    let entries = f.list_dir(dir).unwrap();
    for e in entries.iter().skip(2) {
        if e.kind == Kind::Dir {
            remove_all(f, e.ino);
            f.rmdir(dir, &e.name).unwrap();
        } else {
            f.unlink(dir, &e.name).unwrap();
        }
    }
}

#[test]
fn load_on_the_same_store_trims_what_no_file_owns() {
    let s = new_store(DISK);
    let f1 = Fs::new(s.clone(), cfg(1000)).unwrap();
    let built = build_tree(&f1);
    let p = PAGE_SIZE as u64;
    // Find a file's slot from the chunks its first write creates.
    let chunks: BTreeSet<u64> = s.data_chunks().into_iter().collect();
    let a = f1.create(ME, ROOT_INO, n("five"), REG).unwrap().ino;
    f1.write(&f1.change(), a, 0, &pattern(5000, 10), true, ME, false)
        .unwrap();
    f1.release(a);
    let new: Vec<u64> = s
        .data_chunks()
        .into_iter()
        .filter(|c| !chunks.contains(c))
        .collect();
    assert_eq!(new.len(), 1);
    let base = new[0];
    assert_eq!(base % (1 << FILE_SHIFT), 0);
    let before = walk(&f1);
    let data_before = usage(&s).3;
    let meta = f1.save_meta();
    // Data a save never describes: past a file's last page (same chunk and
    // a later one) and in a slot no file owns.
    let junk = [0x5a; PAGE_SIZE];
    for at in [
        base + 2 * p,
        base + 63 * p,
        base + (10 << 20),
        999 << FILE_SHIFT,
    ] {
        s.change().write(at, &junk).unwrap();
    }
    // What a loaded file may keep: its last partial page.
    s.change().write(base + 6000, &junk[..100]).unwrap();
    drop(f1);
    let f2 = Fs::load(s.clone(), cfg(1000), &meta).unwrap();
    let after = walk(&f2);
    assert_eq!(after, before);
    assert_eq!(usage(&s).3, data_before - built.orphan_pages);
    assert_eq!(f2.getattr(a).unwrap().blocks, 16, "two pages");
    let mut page = [1; PAGE_SIZE];
    for at in [base + 2 * p, base + (10 << 20), 999 << FILE_SHIFT] {
        s.read(at, &mut page).unwrap();
        assert_eq!(page, [0; PAGE_SIZE], "{at:#x} trimmed");
    }
    assert!(!s
        .data_chunks()
        .iter()
        .any(|&c| c >= 999 << FILE_SHIFT || c == base + (10 << 20)));
}

#[test]
fn times_before_and_after_the_epoch_round_trip() {
    let e = UNIX_EPOCH;
    let ns = |n| Duration::from_nanos(n);
    let s = Duration::from_secs;
    for t in [
        e,
        e + ns(1),
        e - ns(1),
        e - s(1),
        e - s(1) - ns(1),
        e - s(1) + ns(1),
        e + s(1_700_000_000) + ns(999_999_999),
        e - s(62_135_596_800),
        e - s(i64::MAX as u64),
        e + s(i64::MAX as u64) + ns(999_999_999),
    ] {
        let saved = save_time(t);
        assert!(saved.nanos < 1_000_000_000);
        assert_eq!(load_time(saved), Some(t), "{t:?} as {saved:?}");
    }
    assert_eq!(save_time(e - ns(1)).secs, -1);
    assert_eq!(save_time(e - ns(1)).nanos, 999_999_999);
}

/// A small tree of each kind of inode, and its saved form.
fn small() -> (Fs, Vec<u8>) {
    let f = Fs::new(new_store(DISK), cfg(100)).unwrap();
    let d = f.mkdir(ME, ROOT_INO, n("d"), 0o755).unwrap().ino;
    let a = f.create(ME, d, n("a"), REG).unwrap().ino;
    f.write(&f.change(), a, 0, b"data", true, ME, false)
        .unwrap();
    f.link(a, ROOT_INO, n("b")).unwrap();
    f.create(ME, ROOT_INO, n("c"), REG).unwrap();
    f.symlink(ME, d, n("l"), n("a")).unwrap();
    f.mknod(ME, ROOT_INO, n("p"), libc::S_IFIFO | 0o644, 0)
        .unwrap();
    f.setxattr(a, n("user.x"), b"y", 0, false).unwrap();
    let meta = f.save_meta();
    (f, meta)
}

/// Loads `meta` on an empty store: Err, and the store left untouched.
fn refused(meta: &[u8]) -> String {
    let s = new_store(DISK);
    match Fs::load(s.clone(), cfg(100), meta) {
        Ok(_) => panic!("loaded a bad tree"),
        Err(e) => {
            assert_eq!(s.stats().memory_used, 0, "nothing charged: {e}");
            e
        }
    }
}

/// `meta` with its tree changed (what follows the tree kept).
fn edit(meta: &[u8], change: impl FnOnce(&mut SavedMeta<'static>)) -> Vec<u8> {
    let (mut m, rest): (SavedMeta<'static>, _) = postcard::take_from_bytes(meta).unwrap();
    change(&mut m);
    let mut out = postcard::to_stdvec(&m).unwrap();
    out.extend_from_slice(rest);
    out
}

fn inode<'m>(
    m: &'m mut SavedMeta<'static>,
    ino: Ino,
) -> &'m mut crate::fs::meta::SavedInode<'static> {
    m.inodes.iter_mut().find(|i| i.ino == ino.0).unwrap()
}

fn entries<'m>(m: &'m mut SavedMeta<'static>, ino: Ino) -> &'m mut Vec<(Bytes<'static>, u64)> {
    match &mut inode(m, ino).data {
        SavedData::Dir { entries, .. } => entries,
        _ => panic!("not a dir"),
    }
}

#[test]
fn every_truncation_is_refused() {
    let (_f, meta) = small();
    Fs::load(new_store(DISK), cfg(100), &meta).unwrap();
    for len in 0..meta.len() {
        refused(&meta[..len]);
    }
    let mut long = meta.clone();
    long.push(0);
    assert!(refused(&long).contains("after the end"));
}

#[test]
fn flipped_bits_never_panic() {
    let (_f, meta) = small();
    let (mut ok, mut bad) = (0, 0);
    let mut store = new_store(DISK);
    for i in 0..meta.len() {
        for bit in 0..8 {
            let mut m = meta.clone();
            m[i] ^= 1 << bit;
            match Fs::load(store.clone(), cfg(100), &m) {
                // A flip the checks cannot see (a time, a mode bit) must
                // still give a tree that works.
                Ok(f) => {
                    ok += 1;
                    walk(&f);
                    remove_all(&f, ROOT_INO);
                    store = new_store(DISK);
                }
                Err(_) => {
                    bad += 1;
                    assert_eq!(store.stats().memory_used, 0);
                }
            }
        }
    }
    eprintln!("{ok} loaded, {bad} refused");
    assert!(ok > 0 && bad > 0, "{ok} loaded, {bad} refused");
}

fn name(s: &str) -> Bytes<'static> {
    std::borrow::Cow::Owned(s.as_bytes().to_vec())
}

#[test]
fn inconsistent_trees_are_refused() {
    let (f, meta) = small();
    let ino = |path: &[&str]| {
        let mut i = ROOT_INO;
        for p in path {
            i = f.lookup(i, n(p)).unwrap().ino;
        }
        i
    };
    let (d, a, c, l, p) = (
        ino(&["d"]),
        ino(&["d", "a"]),
        ino(&["c"]),
        ino(&["d", "l"]),
        ino(&["p"]),
    );
    type Edit = Box<dyn FnOnce(&mut SavedMeta<'static>)>;
    let cases: Vec<(&str, Edit)> = vec![
        ("format version 3", Box::new(|m| m.version = 3)),
        (
            "inode 999, which was not saved",
            Box::new(|m| entries(m, ROOT_INO).push((name("ghost"), 999))),
        ),
        (
            "no root",
            Box::new(|m| m.inodes.retain(|i| i.ino != ROOT_INO.0)),
        ),
        (
            "root is not a directory",
            Box::new(move |m| {
                let r = inode(m, ROOT_INO);
                r.kind = SavedKind::Fifo;
                r.data = SavedData::Special;
            }),
        ),
        (
            "another kind",
            Box::new(move |m| inode(m, p).kind = SavedKind::Dir),
        ),
        (
            "owned by another file",
            Box::new(move |m| {
                let SavedData::File { slot, .. } = inode(m, a).data else {
                    panic!()
                };
                if let SavedData::File { slot: s, .. } = &mut inode(m, c).data {
                    *s = slot;
                }
            }),
        ),
        ("not below next", Box::new(|m| m.next_slot = 1)),
        ("too high", Box::new(|m| m.next_slot = u64::MAX)),
        ("too low", Box::new(|m| m.next_ino = 1)),
        ("number not below next", Box::new(|m| m.next_ino = 3)),
        (
            "saved twice",
            Box::new(move |m| {
                let copy = inode(m, p).clone();
                m.inodes.push(copy);
            }),
        ),
        (
            "bad entry name \"a/b\"",
            Box::new(|m| entries(m, ROOT_INO)[0].0 = name("a/b")),
        ),
        (
            "bad entry name \"..\"",
            Box::new(|m| entries(m, ROOT_INO)[0].0 = name("..")),
        ),
        (
            "bad entry name \"\"",
            Box::new(|m| entries(m, ROOT_INO)[0].0 = name("")),
        ),
        (
            "bad entry name",
            Box::new(|m| entries(m, ROOT_INO)[0].0 = name(&"n".repeat(256))),
        ),
        (
            "entry \"b\" twice",
            Box::new(|m| {
                let e = entries(m, ROOT_INO);
                let dup = e.iter().find(|(k, _)| &k[..] == b"b").unwrap().clone();
                e.push(dup);
            }),
        ),
        (
            "has 1 links but 2 entries",
            Box::new(move |m| inode(m, a).nlink = 1),
        ),
        (
            "links for 1 subdirectories",
            Box::new(|m| inode(m, ROOT_INO).nlink = 4),
        ),
        ("no links", Box::new(move |m| inode(m, p).nlink = 0)),
        (
            "is listed 2 times",
            Box::new(move |m| {
                entries(m, ROOT_INO).push((name("again"), d.0));
                inode(m, ROOT_INO).nlink += 1;
            }),
        ),
        (
            "names the root",
            Box::new(move |m| entries(m, d).push((name("up"), ROOT_INO.0))),
        ),
        (
            "its parent is",
            Box::new(move |m| {
                if let SavedData::Dir { parent, .. } = &mut inode(m, d).data {
                    *parent = d.0;
                }
            }),
        ),
        (
            "cut off from the root",
            Box::new(move |m| {
                // d listed in itself instead of the root: counts still add up.
                entries(m, ROOT_INO).retain(|e| e.1 != d.0);
                inode(m, ROOT_INO).nlink -= 1;
                entries(m, d).push((name("self"), d.0));
                inode(m, d).nlink += 1;
                if let SavedData::Dir { parent, .. } = &mut inode(m, d).data {
                    *parent = d.0;
                }
            }),
        ),
        (
            "bad time",
            Box::new(move |m| inode(m, a).times[1].nanos = 1_000_000_000),
        ),
        (
            "bad xattr",
            Box::new(move |m| inode(m, a).xattrs[0].0 = name("nospace.x")),
        ),
        (
            "beyond 07777",
            Box::new(move |m| inode(m, a).perm = 0o10644),
        ),
        (
            "impossible for a Symlink",
            Box::new(move |m| inode(m, l).size = 99),
        ),
        (
            "past the largest file",
            Box::new(move |m| {
                if let SavedData::File { alloc_end, .. } = &mut inode(m, a).data {
                    *alloc_end = u64::MAX;
                }
            }),
        ),
    ];
    for (want, change) in cases {
        let e = refused(&edit(&meta, change));
        assert!(e.contains(want), "{e:?} does not say {want:?}");
        assert!(e.starts_with("filesystem metadata: "), "{e}");
    }
    assert!(refused(&[]).contains("no format version"));
    // The edits themselves are sound: no change loads.
    Fs::load(new_store(DISK), cfg(100), &edit(&meta, |_| {})).unwrap();
    assert_eq!(META_VERSION, 2);
}

#[test]
fn chattr_flags_are_enforced_saved_and_loaded() {
    let f = fs();
    let d = f.mkdir(ME, ROOT_INO, n("d"), 0o755).unwrap().ino;
    let a = f.create(ME, d, n("a"), libc::S_IFREG | 0o644).unwrap().ino;
    let b = f.create(ME, d, n("b"), libc::S_IFREG | 0o644).unwrap().ino;
    f.write(&f.change(), a, 0, b"abc", true, ME, false).unwrap();
    assert_eq!(f.set_flags(a, 0x4000), Err(Errno::EOPNOTSUPP));
    f.set_flags(a, FL_APPEND | FL_NODUMP).unwrap();
    f.set_flags(b, FL_IMMUTABLE).unwrap();
    let trunc = resize(0);
    let eperm = Err(Errno::EPERM);
    assert_eq!(
        f.open(a, libc::O_WRONLY),
        eperm,
        "append-only needs O_APPEND"
    );
    f.open(a, libc::O_WRONLY | libc::O_APPEND).unwrap();
    assert_eq!(
        f.write(&f.change(), a, 0, b"x", true, ME, false),
        Err(Errno::EPERM)
    );
    f.write(&f.change(), a, 3, b"d", true, ME, false).unwrap();
    assert_eq!(f.setattr(ME, a, trunc).map(|_| ()), eperm);
    assert_eq!(f.unlink(d, n("a")), eperm);
    assert_eq!(f.open(b, libc::O_RDWR), eperm);
    f.open(b, libc::O_RDONLY).unwrap();
    assert_eq!(
        f.write(&f.change(), b, 0, b"x", true, ME, false),
        Err(Errno::EPERM)
    );
    assert_eq!(f.rename(ME, d, n("b"), d, n("c"), 0), eperm);
    assert_eq!(f.link(b, ROOT_INO, n("b2")).map(|_| ()), eperm);
    assert_eq!(f.fallocate(ME, b, 0, 4096, 0), eperm);
    f.set_flags(d, FL_IMMUTABLE).unwrap();
    assert_eq!(
        f.create(ME, d, n("new"), libc::S_IFREG | 0o644).map(|_| ()),
        eperm
    );
    f.set_flags(d, 0).unwrap();
    let meta = f.save_meta();
    let g = Fs::load(new_store(DISK), cfg(100), &meta).unwrap();
    assert_eq!(g.flags(a), Ok(FL_APPEND | FL_NODUMP));
    assert_eq!(g.flags(b), Ok(FL_IMMUTABLE));
    // Version 1 (no flags after the tree) still loads.
    let v1 = edit(&meta, |m| m.version = 1);
    let (_, rest) = postcard::take_from_bytes::<SavedMeta>(&v1).unwrap();
    let v1 = v1[..v1.len() - rest.len()].to_vec();
    let h = Fs::load(new_store(DISK), cfg(100), &v1).unwrap();
    assert_eq!(h.flags(a), Ok(0));
}

#[test]
fn limits_lower_than_the_tree_still_load() {
    let (f, meta) = small();
    let used = f.stats().inodes;
    let g = Fs::load(new_store(DISK), cfg(2), &meta).unwrap();
    assert_eq!(g.stats().inodes, used);
    assert_eq!(g.mkdir(ME, ROOT_INO, n("more"), 0o755), Err(Errno::ENOSPC));
    // Memory is a hard limit: a tree that does not fit is refused.
    let tiny = Arc::new(
        Store::new(StoreConfig {
            max_memory: Some(1 << 20),
            host_reserve: 0,
            ..StoreConfig::new(ramd_store::MAX_SIZE)
        })
        .unwrap(),
    );
    tiny.charge((1 << 20) - 1000).unwrap();
    let e = Fs::load(tiny, cfg(100), &meta).map(|_| ()).unwrap_err();
    assert!(e.contains("max_memory"), "{e}");
}

#[test]
fn a_partial_last_page_is_freed_too() {
    let f = fs();
    let a = f.create(ME, ROOT_INO, n("a"), REG).unwrap().ino;
    f.write(&f.change(), a, 0, &pattern(10_000, 1), true, ME, false)
        .unwrap();
    let trunc = resize(0);
    f.setattr(ME, a, trunc).unwrap();
    assert_eq!(f.getattr(a).unwrap().blocks, 0);
    assert_eq!(f.store().pages_used().0, 0);
    f.write(&f.change(), a, 0, &pattern(10_000, 1), true, ME, false)
        .unwrap();
    f.release(a);
    f.unlink(ROOT_INO, n("a")).unwrap();
    assert_eq!(f.store().pages_used().0, 0);
}

#[test]
fn tmpfile_is_unnamed_until_linked_and_freed_if_closed_unlinked() {
    let f = fs();
    let d = f.mkdir(ME, ROOT_INO, n("d"), 0o2775).unwrap();
    let t = f.tmpfile(ME, d.ino, REG | 0o666).unwrap();
    assert_eq!((t.nlink, t.perm, t.gid), (0, 0o666, d.gid));
    assert!(f.list_dir(d.ino).unwrap().len() == 2);
    f.write(&f.change(), t.ino, 0, b"kept", true, ME, false)
        .unwrap();
    let linked = f.link(t.ino, d.ino, n("named")).unwrap();
    assert_eq!(linked.nlink, 1);
    f.release(t.ino);
    let mut buf = [0u8; 8];
    let a = f.lookup(d.ino, n("named")).unwrap();
    assert_eq!(f.read(a.ino, 0, &mut buf).unwrap(), 4);

    // Closed before any link: its data goes, and no link can name it.
    let u = f.tmpfile(ME, d.ino, REG).unwrap();
    f.write(&f.change(), u.ino, 0, &[7u8; 8192], true, ME, false)
        .unwrap();
    let before = f.stats().file_bytes;
    f.release(u.ino);
    assert_eq!(f.stats().file_bytes, before - 8192);
    assert_eq!(f.link(u.ino, d.ino, n("late")).unwrap_err(), Errno::ENOENT);
    // An ordinary unlinked file cannot be linked back either.
    f.unlink(d.ino, n("named")).unwrap();
    assert_eq!(f.link(a.ino, d.ino, n("again")).unwrap_err(), Errno::ENOENT);
}

#[test]
fn files_open_uncached_within_the_write_reserve_one_mode_per_run_of_opens() {
    let f = fs_with(16 << 20, 100);
    // (relatime would drop the cache of a file never read: see atime tests)
    f.set_atime(Atime {
        mode: AtimeMode::Never,
        nodiratime: false,
    });
    let a = f.create(ME, ROOT_INO, n("a"), REG).unwrap().ino;
    // No reserve (no write-back cache): always cached.
    assert_eq!(f.open_cache(a), OpenCache::Keep);
    f.release(a);
    f.set_write_reserve(8 << 20);
    let big = vec![7u8; 9 << 20];
    f.open(a, libc::O_WRONLY).unwrap();
    assert_eq!(
        f.open_cache(a),
        OpenCache::Keep,
        "16 MiB free, 8 MiB reserve"
    );
    f.write(&f.change(), a, 0, &big, true, ME, false).unwrap();
    assert!(f.room() <= 8 << 20);
    // Still open cached: a new open of it joins that mode.
    f.open(a, libc::O_RDONLY).unwrap();
    assert_eq!(f.open_cache(a), OpenCache::Keep);
    f.release(a);
    f.release(a);
    // A new run of opens within the reserve: uncached, and so is a
    // file created now.
    f.open(a, libc::O_WRONLY).unwrap();
    assert_eq!(f.open_cache(a), OpenCache::Direct);
    let b = f.create(ME, ROOT_INO, n("b"), REG).unwrap().ino;
    assert_eq!(f.open_cache(b), OpenCache::Direct);
    f.release(a);
    f.release(b);
    // Room again: cached, but the pages cached before the uncached run
    // are dropped, once.
    f.setattr(ME, a, resize(0)).unwrap();
    f.open(a, libc::O_RDONLY).unwrap();
    assert_eq!(f.open_cache(a), OpenCache::Drop);
    f.release(a);
    f.open(a, libc::O_RDONLY).unwrap();
    assert_eq!(f.open_cache(a), OpenCache::Keep);
    f.release(a);
}

#[test]
fn a_failed_write_back_stops_cached_writes_until_the_reserve_is_free() {
    let f = fs_with(16 << 20, 100);
    f.set_write_reserve(4 << 20);
    let a = f.create(ME, ROOT_INO, n("a"), REG).unwrap().ino;
    assert_eq!(f.write_allowed(a), Ok(()));
    // The kernel's write-back (no short writes) of more than fits.
    let e = f.write(&f.change(), a, 0, &vec![1u8; 17 << 20], false, ME, false);
    assert_eq!(e, Err(Errno::ENOSPC));
    f.write(&f.change(), a, 0, &vec![1u8; 14 << 20], false, ME, false)
        .unwrap();
    assert_eq!(f.write_allowed(a), Err(Errno::ENOSPC));
    // Other files are not affected until their own write-back fails.
    let b = f.create(ME, ROOT_INO, n("b"), REG).unwrap().ino;
    assert_eq!(f.write_allowed(b), Ok(()));
    f.setattr(ME, a, resize(0)).unwrap();
    assert_eq!(f.write_allowed(a), Ok(()));
}

#[test]
fn under_the_write_back_cache_write_backs_leave_times_to_the_kernel() {
    let f = fs();
    let a = f.create(ME, ROOT_INO, n("a"), REG).unwrap().ino;
    let then = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let at = SetAttr {
        mtime: Some(SetTime::At(then)),
        ctime: Some(then),
        ..Default::default()
    };
    f.setattr(ME, a, at).unwrap();
    f.set_kernel_times(true);
    // The kernel's write-back (no short writes): the times it sent stay.
    f.write(&f.change(), a, 0, b"x", false, ME, false).unwrap();
    assert_eq!(f.getattr(a).unwrap().mtime, then);
    // A write the kernel did not cache (direct I/O) moves them.
    f.write(&f.change(), a, 0, b"x", true, ME, false).unwrap();
    assert!(f.getattr(a).unwrap().mtime > then);
    // Without the write-back cache (mmap write-backs), ramd keeps them.
    f.setattr(ME, a, at).unwrap();
    f.set_kernel_times(false);
    f.write(&f.change(), a, 0, b"x", false, ME, false).unwrap();
    assert!(f.getattr(a).unwrap().mtime > then);
}

/// A standby's apply (`fs/follow.rs`): the tree becomes the writer's new
/// one whole, what the kernel holds of a kept inode carries over, a
/// removed inode goes at once (even open), the tree's memory is what a load
/// of the new tree charges, and the kernel is told exactly the names and
/// inodes that changed.
#[test]
fn a_standby_installs_each_tree_and_says_what_changed() {
    use ramd_store::persist::FollowTree;
    use std::collections::HashSet;
    let a = new_store(DISK);
    let w = Arc::new(Fs::new(a.clone(), cfg(1000)).unwrap());
    let d = w.mkdir(ME, ROOT_INO, n("d"), 0o755).unwrap().ino;
    let x = w.create(ME, ROOT_INO, n("x"), REG).unwrap().ino;
    w.write(&w.change(), x, 0, &pattern(10_000, 1), true, ME, false)
        .unwrap();
    let y = w.create(ME, ROOT_INO, n("y"), REG).unwrap().ino;
    let l = w.symlink(ME, ROOT_INO, n("l"), n("x")).unwrap().ino;
    let same = w.create(ME, d, n("same"), REG).unwrap().ino;
    for ino in [x, y, same] {
        w.release(ino);
    }
    let b = new_store(DISK);
    copy_store(&a, &b);
    // The writer's full save, which the standby loads.
    let full = (w.save_tree(true))();
    let loaded = full.bytes.clone();
    (full.committed)();
    let s = Arc::new(Fs::load(b.clone(), cfg(1000), &loaded).unwrap());
    let told: Arc<parking_lot::Mutex<Vec<Inval>>> = Default::default();
    let t = told.clone();
    s.on_tree_change(Box::new(move |v| t.lock().extend_from_slice(v)));
    // The kernel looks x and l up and opens x, on the standby.
    s.lookup(ROOT_INO, n("x")).unwrap();
    s.lookup(ROOT_INO, n("l")).unwrap();
    s.open(x, libc::O_RDONLY).unwrap();

    // The writer rewrites x, moves y into d, removes l, creates z.
    w.write(&w.change(), x, 0, &pattern(20_000, 2), true, ME, false)
        .unwrap();
    w.rename(ME, ROOT_INO, n("y"), d, n("y2"), 0).unwrap();
    w.unlink(ROOT_INO, n("l")).unwrap();
    let z = w.create(ME, ROOT_INO, n("z"), REG).unwrap().ino;
    w.release(z);
    copy_store(&a, &b);
    let tree = StandbyTree::new(s.clone(), Some(&loaded));
    // The writer's next save holds a change to the tree, not all of it.
    let save = (w.save_tree(false))();
    assert!(save.delta && save.changed);
    assert!(save.bytes.len() < loaded.len());
    let prepared = tree.prepare(&save.bytes, true).unwrap();
    let chunks: HashSet<u64> = [(x_slot(&s, x) << FILE_SHIFT) / CHUNK_BYTES].into();
    let y_before = s.getattr(y).unwrap();
    tree.install(Some(prepared), Some(&chunks)).unwrap();
    assert!(told.lock().is_empty(), "told before the announcement");
    tree.announce();

    assert_eq!(walk(&s), walk(&w));
    let mut got = std::mem::take(&mut *told.lock());
    got.sort_by_key(|i| format!("{i:?}"));
    let mut want = vec![
        Inval::Entry(ROOT_INO, "y".into()),
        Inval::Entry(ROOT_INO, "l".into()),
        Inval::Entry(ROOT_INO, "z".into()),
        Inval::Entry(d, "y2".into()),
        Inval::Inode(ROOT_INO),
        Inval::Inode(d),
        Inval::Inode(x),
        Inval::Inode(l),
    ];
    // A rename changes the moved inode's ctime on tmpfs; if ramd's does,
    // it is named too.
    if s.getattr(y).unwrap() != y_before {
        want.push(Inval::Inode(y));
    }
    want.sort_by_key(|i| format!("{i:?}"));
    assert_eq!(got, want, "`same` and nothing else unchanged is named");
    assert_eq!(s.getattr(l), Err(Errno::ENOENT), "the removed link");
    // x's lookup and open carried over: its release and forget find them.
    let mut buf = vec![0; 20_000];
    assert_eq!(s.read(x, 0, &mut buf).unwrap(), 20_000);
    assert_eq!(buf, pattern(20_000, 2));
    s.release(x);
    s.forget(x, 1);
    assert_eq!(s.getattr(x).unwrap().size, 20_000, "linked: kept");
    // The tree's memory is what loading it charges.
    let c = new_store(DISK);
    copy_store(&a, &c);
    let _loaded = Fs::load(c.clone(), cfg(1000), &w.save_meta()).unwrap();
    assert_eq!(b.stats().metadata_bytes, c.stats().metadata_bytes);
    assert_eq!(b.stats().memory_used, c.stats().memory_used);

    // The next change applies to the tree installed last; one that changes
    // nothing of the tree (only file data) leaves it as it is.
    (save.committed)();
    w.unlink(d, n("y2")).unwrap();
    let save = (w.save_tree(false))();
    (save.committed)();
    let prepared = tree.prepare(&save.bytes, true).unwrap();
    tree.install(Some(prepared), Some(&HashSet::new())).unwrap();
    tree.announce();
    assert_eq!(walk(&s), walk(&w));
    assert!(told.lock().contains(&Inval::Entry(d, "y2".into())));
    told.lock().clear();
    let save = (w.save_tree(false))();
    assert!(!save.changed);
    let prepared = tree.prepare(&save.bytes, true).unwrap();
    tree.install(Some(prepared), Some(&HashSet::new())).unwrap();
    tree.announce();
    assert!(told.lock().is_empty(), "nothing changed: nothing to tell");
    assert_eq!(walk(&s), walk(&w));
    // A change with no tree to apply to is refused.
    let lost = StandbyTree::new(s.clone(), None);
    assert!(lost.prepare(&save.bytes, true).is_err());
}

fn x_slot(f: &Fs, ino: Ino) -> u64 {
    f.data_offset(ino).unwrap() >> FILE_SHIFT
}

// ---- Tree deltas (`Fs::save_tree`, `TreeRecords`) ----

/// A chain of saves as the image holds its trees: the full save's whole
/// tree, then each committed save's change.
struct TreeImage {
    chain: ramd_store::persist::TreeChain,
    sizes: Vec<usize>,
}

impl TreeImage {
    fn full(f: &Arc<Fs>) -> TreeImage {
        let s = (f.save_tree(true))();
        assert!(!s.delta);
        let whole = s.bytes.clone();
        (s.committed)();
        TreeImage {
            chain: ramd_store::persist::TreeChain {
                whole,
                deltas: Vec::new(),
            },
            sizes: Vec::new(),
        }
    }

    /// An incremental save, committed; returns whether its tree changed.
    fn save(&mut self, f: &Arc<Fs>) -> bool {
        let s = (f.save_tree(false))();
        assert!(s.delta, "an incremental save of a known tree is a delta");
        self.sizes.push(s.bytes.len());
        self.chain.deltas.push(s.bytes.clone());
        (s.committed)();
        s.changed
    }

    fn merged(&self) -> Vec<u8> {
        crate::fs::TreeRecords::merge(&self.chain).unwrap()
    }
}

/// Each kind of change, saved as a delta: the whole tree plus the deltas
/// is, byte for byte, the live tree's whole save, and loads as the live
/// tree; a delta holds only the inodes that changed.
#[test]
fn tree_deltas_rebuild_the_live_tree() {
    let a = new_store(DISK);
    let f = Arc::new(Fs::new(a.clone(), cfg(1000)).unwrap());
    let built = build_tree(&f);
    // Many small files, so that a one-inode delta is plainly smaller.
    let many = f.mkdir(ME, ROOT_INO, n("many"), 0o755).unwrap().ino;
    for i in 0..200 {
        let x = f.create(ME, many, n(&format!("f{i}")), REG).unwrap().ino;
        f.write(&f.change(), x, 0, b"small", true, ME, false)
            .unwrap();
        f.release(x);
    }
    let mut img = TreeImage::full(&f);
    let whole_len = img.chain.whole.len();
    assert!(!img.save(&f), "nothing changed");
    assert_eq!(img.merged(), f.save_meta());
    type Step = Box<dyn Fn(&Fs)>;
    let mut steps: Vec<(&str, Step)> = Vec::new();
    steps.push((
        "create",
        Box::new(|f: &Fs| {
            let x = f.create(ME, ROOT_INO, n("new"), REG).unwrap().ino;
            f.release(x);
        }),
    ));
    steps.push((
        "grow",
        Box::new(|f: &Fs| {
            let x = f.lookup(ROOT_INO, n("new")).unwrap().ino;
            f.write(&f.change(), x, 0, &pattern(70_000, 9), true, ME, false)
                .unwrap();
            f.release(x);
        }),
    ));
    steps.push((
        "truncate",
        Box::new(|f: &Fs| {
            let x = f.lookup(ROOT_INO, n("new")).unwrap().ino;
            f.setattr(ME, x, resize(100)).unwrap();
        }),
    ));
    steps.push((
        "rename across directories",
        Box::new(|f: &Fs| {
            let docs = f.lookup(ROOT_INO, n("docs")).unwrap().ino;
            f.rename(ME, ROOT_INO, n("new"), docs, n("moved"), 0)
                .unwrap();
        }),
    ));
    steps.push((
        "hardlink",
        Box::new(|f: &Fs| {
            let docs = f.lookup(ROOT_INO, n("docs")).unwrap().ino;
            let x = f.lookup(docs, n("moved")).unwrap().ino;
            f.link(x, ROOT_INO, n("moved-link")).unwrap();
        }),
    ));
    steps.push((
        "chmod",
        Box::new(|f: &Fs| {
            let x = f.lookup(ROOT_INO, n("moved-link")).unwrap().ino;
            let set = SetAttr {
                mode: Some(0o600),
                ..Default::default()
            };
            f.setattr(ME, x, set).unwrap();
        }),
    ));
    steps.push((
        "xattr",
        Box::new(|f: &Fs| {
            let x = f.lookup(ROOT_INO, n("moved-link")).unwrap().ino;
            f.setxattr(x, n("user.k"), b"v", 0, false).unwrap();
        }),
    ));
    steps.push((
        "xattr removed",
        Box::new(|f: &Fs| {
            let x = f.lookup(ROOT_INO, n("moved-link")).unwrap().ino;
            f.removexattr(x, n("user.k")).unwrap();
        }),
    ));
    steps.push((
        "chattr",
        Box::new(|f: &Fs| {
            let x = f.lookup(ROOT_INO, n("moved-link")).unwrap().ino;
            f.set_flags(x, FL_NODUMP).unwrap();
        }),
    ));
    steps.push((
        "chattr cleared",
        Box::new(|f: &Fs| {
            let x = f.lookup(ROOT_INO, n("moved-link")).unwrap().ino;
            f.set_flags(x, 0).unwrap();
        }),
    ));
    steps.push((
        "unlink",
        Box::new(|f: &Fs| {
            f.unlink(ROOT_INO, n("moved-link")).unwrap();
            let docs = f.lookup(ROOT_INO, n("docs")).unwrap().ino;
            f.unlink(docs, n("moved")).unwrap();
        }),
    ));
    steps.push((
        "mkdir and rmdir",
        Box::new(|f: &Fs| {
            f.mkdir(ME, ROOT_INO, n("gone-soon"), 0o700).unwrap();
            f.rmdir(ROOT_INO, n("gone-soon")).unwrap();
            let many = f.lookup(ROOT_INO, n("many")).unwrap().ino;
            f.mkdir(ME, many, n("sub"), 0o700).unwrap();
        }),
    ));
    steps.push((
        "rmdir",
        Box::new(|f: &Fs| {
            let many = f.lookup(ROOT_INO, n("many")).unwrap().ino;
            f.rmdir(many, n("sub")).unwrap();
        }),
    ));
    steps.push((
        "one small file written",
        Box::new(|f: &Fs| {
            let many = f.lookup(ROOT_INO, n("many")).unwrap().ino;
            let x = f.lookup(many, n("f7")).unwrap().ino;
            f.write(&f.change(), x, 0, b"changed", true, ME, false)
                .unwrap();
            f.release(x);
        }),
    ));
    for (what, step) in &steps {
        step(&f);
        assert!(img.save(&f), "{what}: the tree changed");
        assert_eq!(img.merged(), f.save_meta(), "after {what}");
    }
    let last = *img.sizes.last().unwrap();
    assert!(
        last * 20 < whole_len,
        "a delta of one file and its directory ({last} bytes) is far smaller than the \
         whole tree ({whole_len} bytes)"
    );
    assert!(!img.save(&f), "nothing changed since");
    // The merged tree loads as the live one, memory and all.
    let b = new_store(DISK);
    copy_store(&a, &b);
    let g = Fs::load(b.clone(), cfg(1000), &img.merged()).unwrap();
    assert_eq!(walk(&g), walk(&f));
    assert_eq!(g.getattr(built.orphan), Err(Errno::ENOENT));
}

/// What the image holds of the tree moves on only when a save commits:
/// the change of a save that failed goes with the next save.
#[test]
fn a_tree_delta_is_against_the_last_committed_save() {
    let f = Arc::new(Fs::new(new_store(DISK), cfg(1000)).unwrap());
    let d = f.mkdir(ME, ROOT_INO, n("d"), 0o755).unwrap().ino;
    let mut img = TreeImage::full(&f);
    let x = f.create(ME, d, n("x"), REG).unwrap().ino;
    f.release(x);
    let failed = (f.save_tree(false))();
    assert!(failed.changed && failed.delta);
    drop(failed); // never committed
    let y = f.create(ME, ROOT_INO, n("y"), REG).unwrap().ino;
    f.release(y);
    assert!(img.save(&f));
    assert_eq!(img.merged(), f.save_meta(), "x, from the failed save, too");
    // A full save starts over from the whole tree.
    f.unlink(d, n("x")).unwrap();
    let full = (f.save_tree(true))();
    assert!(full.changed && !full.delta);
    (full.committed)();
    let s = (f.save_tree(false))();
    assert!(!s.changed, "the full save holds it");
    // A loaded tree is what its image holds: its first save is a delta.
    let g = Arc::new(Fs::load(new_store(DISK), cfg(1000), &f.save_meta()).unwrap());
    let s = (g.save_tree(false))();
    assert!(s.delta && !s.changed, "a load knows the image's tree");
    // A new filesystem does not: its first save holds the whole tree.
    let h = Arc::new(Fs::new(new_store(DISK), cfg(1000)).unwrap());
    let s = (h.save_tree(false))();
    assert!(!s.delta && s.changed);
}

/// A delta applies only to the tree it was made against.
#[test]
fn a_tree_delta_checks_its_base() {
    let f = Arc::new(Fs::new(new_store(DISK), cfg(1000)).unwrap());
    let x = f.create(ME, ROOT_INO, n("x"), REG).unwrap().ino;
    f.release(x);
    let before = f.save_meta();
    let mut img = TreeImage::full(&f);
    f.unlink(ROOT_INO, n("x")).unwrap();
    img.save(&f);
    let delta = img.chain.deltas[0].clone();
    let mut t = crate::fs::TreeRecords::from_whole(&before).unwrap();
    assert!(t.apply_delta(&delta).unwrap());
    // Applied again: x is not there to remove.
    let e = t.apply_delta(&delta).unwrap_err();
    assert!(e.contains(&format!("removes inode {x}")), "{e}");
    let mut bad = delta.clone();
    bad[0] = 9;
    let e = t.apply_delta(&bad).unwrap_err();
    assert!(e.contains("format version 9"), "{e}");
    // A delta with no tree before it in a chain is refused.
    let mut chain = None;
    let e = ramd_store::persist::TreeChain::add(
        &mut chain,
        &ramd_store::persist::Record::MetaDelta(&delta),
    )
    .unwrap_err();
    assert!(e.to_string().contains("no whole tree before it"), "{e}");
}
