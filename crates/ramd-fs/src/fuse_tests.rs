//! The FUSE decoder and encoder, driven with raw requests as the kernel
//! lays them out on /dev/fuse (no mount): bad input gets an errno, never a
//! panic, and good input the kernel's layouts.

use std::sync::Arc;

use crate::fuse::{FuseFs, FuseOptions};
use crate::ll::abi::{self, op};
use crate::ll::dev::split;
use crate::ll::{Dispatch, Reply, IN_HEADER_LEN};
use crate::tests::fs_with;

fn fuse_fs() -> FuseFs {
    FuseFs::new(Arc::new(fs_with(64 << 20, 1000)), FuseOptions::default())
}

/// What a request was answered, as a transport sees it.
struct Captured {
    buf: Vec<u8>,
    sent: Vec<Result<Vec<u8>, i32>>,
}

impl Captured {
    fn new() -> Captured {
        Captured {
            buf: vec![0u8; (1 << 20) + 4096],
            sent: Vec::new(),
        }
    }
}

impl Reply for Captured {
    fn buf(&mut self) -> &mut [u8] {
        &mut self.buf
    }
    fn send(&mut self, outcome: Result<usize, i32>) -> std::io::Result<()> {
        let r = outcome.map(|n| self.buf[..n].to_vec());
        self.sent.push(r);
        Ok(())
    }
}

/// A request as /dev/fuse delivers it: header, arg0, rest.
fn raw(opcode: u32, nodeid: u64, arg0: &[u8], rest: &[u8]) -> Vec<u8> {
    let len = IN_HEADER_LEN + arg0.len() + rest.len();
    let mut b = Vec::with_capacity(len);
    b.extend_from_slice(&(len as u32).to_ne_bytes());
    b.extend_from_slice(&opcode.to_ne_bytes());
    b.extend_from_slice(&7u64.to_ne_bytes()); // unique
    b.extend_from_slice(&nodeid.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes()); // uid
    b.extend_from_slice(&0u32.to_ne_bytes()); // gid
    b.extend_from_slice(&0u32.to_ne_bytes()); // pid
    b.extend_from_slice(&0u16.to_ne_bytes()); // total_extlen
    b.extend_from_slice(&0u16.to_ne_bytes());
    b.extend_from_slice(arg0);
    b.extend_from_slice(rest);
    b
}

/// Splits and dispatches one raw request; what was sent back.
fn call(f: &FuseFs, buf: &[u8]) -> Vec<Result<Vec<u8>, i32>> {
    let req = split(buf, f).expect("well-formed framing");
    let mut c = Captured::new();
    f.dispatch(&req, &mut c);
    c.sent
}

fn one(f: &FuseFs, buf: &[u8]) -> Result<Vec<u8>, i32> {
    let mut sent = call(f, buf);
    assert_eq!(sent.len(), 1, "answered exactly once");
    sent.pop().unwrap()
}

fn no_reply(opcode: u32) -> bool {
    matches!(opcode, op::FORGET | op::BATCH_FORGET | op::INTERRUPT)
}

#[test]
fn every_opcode_with_a_short_fixed_argument_gets_einval() {
    let f = fuse_fs();
    for opcode in 0..=64 {
        let need = abi::arg0_len(opcode);
        if no_reply(opcode) {
            // No answer, and nothing done: no panic either.
            for n in 0..need {
                assert!(call(&f, &raw(opcode, 1, &vec![0xff; n], &[])).is_empty());
            }
            continue;
        }
        if need == 0 || opcode == op::INIT {
            continue;
        }
        for n in [0, need / 2, need - 1] {
            let r = one(&f, &raw(opcode, 1, &vec![0xff; n], &[]));
            assert_eq!(r, Err(libc::EINVAL), "opcode {opcode}, arg0 of {n} bytes");
        }
    }
}

#[test]
fn garbage_arguments_get_an_answer_never_a_panic() {
    let f = fuse_fs();
    let junk: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xff; 7],
        vec![b'a'; 300],
        b"x\0".to_vec(),
        b"x\0y\0z\0".to_vec(),
    ];
    for opcode in 0..=64 {
        for fill in [0x00u8, 0x01, 0xff] {
            let arg0 = vec![fill; abi::arg0_len(opcode)];
            for rest in &junk {
                for nodeid in [0, 1, 2, u64::MAX] {
                    let sent = call(&f, &raw(opcode, nodeid, &arg0, rest));
                    let want = if no_reply(opcode) { 0 } else { 1 };
                    assert_eq!(sent.len(), want, "opcode {opcode}");
                }
            }
        }
    }
    // Unknown opcodes: ENOSYS.
    assert_eq!(one(&f, &raw(9999, 1, &[], &[])), Err(libc::ENOSYS));
    // INIT comes once, before the session serves: EIO after.
    let init = vec![0u8; abi::INIT_IN_LEN];
    assert_eq!(one(&f, &raw(op::INIT, 0, &init, &[])), Err(libc::EIO));
}

#[test]
fn names_need_a_nul_and_at_most_255_bytes() {
    let f = fuse_fs();
    assert_eq!(one(&f, &raw(op::LOOKUP, 1, &[], b"abc")), Err(libc::EINVAL));
    let mut long = vec![b'a'; 256];
    long.push(0);
    assert_eq!(
        one(&f, &raw(op::LOOKUP, 1, &[], &long)),
        Err(libc::ENAMETOOLONG)
    );
    // Something after the name: malformed.
    assert_eq!(
        one(&f, &raw(op::UNLINK, 1, &[], b"a\0b\0")),
        Err(libc::EINVAL)
    );
    // RENAME needs two names; SYMLINK a name and a target.
    let newdir = 1u64.to_ne_bytes();
    assert_eq!(
        one(&f, &raw(op::RENAME, 1, &newdir, b"a\0")),
        Err(libc::EINVAL)
    );
    assert_eq!(
        one(&f, &raw(op::SYMLINK, 1, &[], b"l\0target")),
        Err(libc::EINVAL)
    );
    // A missing name is an entry for inode 0 (a negative dentry) with a
    // timeout, not ENOENT.
    let r = one(&f, &raw(op::LOOKUP, 1, &[], b"missing\0")).unwrap();
    assert_eq!(r[..8], 0u64.to_ne_bytes(), "nodeid");
    assert_ne!(r[16..24], 0u64.to_ne_bytes(), "entry_valid");
}

#[test]
fn framing_errors_are_eio() {
    let f = fuse_fs();
    let mut b = raw(op::LOOKUP, 1, &[], b"a\0");
    assert!(split(&b[..IN_HEADER_LEN - 1], &f).is_err(), "short header");
    // The header's length disagrees with what was read.
    b[0..4].copy_from_slice(&100u32.to_ne_bytes());
    assert_eq!(split(&b, &f).unwrap_err().1, libc::EIO);
    // Extensions longer than the request.
    let mut b = raw(op::LOOKUP, 1, &[], b"a\0");
    b[36..38].copy_from_slice(&9u16.to_ne_bytes());
    assert_eq!(split(&b, &f).unwrap_err().1, libc::EIO);
}

fn create_in(mode: u32) -> Vec<u8> {
    let mut a = Vec::new();
    for v in [libc::O_RDWR as u32, mode, 0o022, 0] {
        a.extend_from_slice(&v.to_ne_bytes());
    }
    a
}

fn rw_in(offset: u64, size: u32) -> Vec<u8> {
    let mut a = vec![0u8; abi::WRITE_IN_LEN];
    a[8..16].copy_from_slice(&offset.to_ne_bytes());
    a[16..20].copy_from_slice(&size.to_ne_bytes());
    a
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    u64::from_ne_bytes(b[o..o + 8].try_into().unwrap())
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_ne_bytes(b[o..o + 4].try_into().unwrap())
}

#[test]
fn create_write_read_readdir_in_the_kernels_layouts() {
    let f = fuse_fs();
    let out = one(
        &f,
        &raw(op::CREATE, 1, &create_in(libc::S_IFREG | 0o644), b"f\0"),
    )
    .unwrap();
    assert_eq!(out.len(), abi::ENTRY_OUT_LEN + abi::OPEN_OUT_LEN);
    let ino = u64_at(&out, 0);
    assert_eq!(u64_at(&out, 8), 1, "generation");
    // fuse_attr.mode is at 40 + 60; umask 022 applied.
    assert_eq!(u32_at(&out, 40 + 60), libc::S_IFREG | 0o644);

    // A write whose data disagrees with its size: EINVAL.
    assert_eq!(
        one(&f, &raw(op::WRITE, ino, &rw_in(0, 9), b"hello")),
        Err(libc::EINVAL)
    );
    let out = one(&f, &raw(op::WRITE, ino, &rw_in(3, 5), b"hello")).unwrap();
    assert_eq!(out.len(), abi::WRITE_OUT_LEN);
    assert_eq!(u32_at(&out, 0), 5);
    let out = one(&f, &raw(op::READ, ino, &rw_in(0, 100), &[])).unwrap();
    assert_eq!(out, b"\0\0\0hello");

    let out = one(&f, &raw(op::GETATTR, ino, &[0; 16], &[])).unwrap();
    assert_eq!(out.len(), abi::ATTR_OUT_LEN);
    assert_eq!(u64_at(&out, 16 + 8), 8, "size");

    let open = one(&f, &raw(op::OPENDIR, 1, &[0; 8], &[])).unwrap();
    let fh = u64_at(&open, 0);
    let mut a = rw_in(0, 4096);
    a[0..8].copy_from_slice(&fh.to_ne_bytes());
    let out = one(&f, &raw(op::READDIR, 1, &a, &[])).unwrap();
    let mut names = Vec::new();
    let mut at = 0;
    while at < out.len() {
        let namelen = u32_at(&out, at + 16) as usize;
        names.push(String::from_utf8(out[at + 24..at + 24 + namelen].to_vec()).unwrap());
        assert_eq!(u64_at(&out, at + 8), names.len() as u64, "next offset");
        at += abi::dirent_len(abi::DIRENT_LEN, namelen);
    }
    assert_eq!(names, [".", "..", "f"]);
    // A buffer too small for one entry: an empty answer, not an error.
    let mut a = rw_in(0, 10);
    a[0..8].copy_from_slice(&fh.to_ne_bytes());
    assert_eq!(one(&f, &raw(op::READDIR, 1, &a, &[])), Ok(Vec::new()));

    // getxattr with size 0 asks for the size.
    let mut sx = Vec::new();
    sx.extend_from_slice(&3u32.to_ne_bytes());
    sx.extend_from_slice(&0u32.to_ne_bytes());
    assert_eq!(
        one(&f, &raw(op::SETXATTR, ino, &sx, b"user.k\0abc")),
        Ok(Vec::new())
    );
    let out = one(&f, &raw(op::GETXATTR, ino, &[0; 8], b"user.k\0")).unwrap();
    assert_eq!(u32_at(&out, 0), 3);
    let mut gx = [0u8; 8];
    gx[..4].copy_from_slice(&2u32.to_ne_bytes());
    assert_eq!(
        one(&f, &raw(op::GETXATTR, ino, &gx, b"user.k\0")),
        Err(libc::ERANGE)
    );
}

/// STATX answers chattr's immutable, append-only and nodump flags as statx
/// attributes, with the mask tmpfs reports (0x70), as set by FS_IOC_SETFLAGS.
#[test]
fn statx_answers_the_chattr_attributes_tmpfs_reports() {
    let f = fuse_fs();
    let out = one(
        &f,
        &raw(op::CREATE, 1, &create_in(libc::S_IFREG | 0o644), b"f\0"),
    )
    .unwrap();
    let ino = u64_at(&out, 0);
    let statx = |f: &FuseFs| {
        // fuse_statx_in: getattr_flags, reserved, fh, sx_flags, sx_mask.
        let mut sx = [0u8; 24];
        sx[20..24].copy_from_slice(&(libc::STATX_BASIC_STATS | libc::STATX_BTIME).to_ne_bytes());
        let out = one(f, &raw(op::STATX, ino, &sx, &[])).unwrap();
        // fuse_statx_out is 32 bytes of validity, then fuse_statx, whose
        // attributes are at 8 and attributes_mask at 56.
        (u64_at(&out, 32 + 8), u64_at(&out, 32 + 56))
    };
    assert_eq!(statx(&f), (0, 0x70));
    for (flags, want) in [
        (crate::fs::FL_APPEND | crate::fs::FL_NODUMP, 0x60),
        (crate::fs::FL_IMMUTABLE | crate::fs::FL_NOATIME, 0x10),
        (0, 0),
    ] {
        // fuse_ioctl_in: fh, flags, cmd, arg, in_size, out_size.
        let mut io = Vec::new();
        io.extend_from_slice(&0u64.to_ne_bytes());
        io.extend_from_slice(&0u32.to_ne_bytes());
        io.extend_from_slice(&(libc::FS_IOC_SETFLAGS as u32).to_ne_bytes());
        io.extend_from_slice(&0u64.to_ne_bytes());
        io.extend_from_slice(&4u32.to_ne_bytes());
        io.extend_from_slice(&0u32.to_ne_bytes());
        one(&f, &raw(op::IOCTL, ino, &io, &flags.to_ne_bytes())).unwrap();
        assert_eq!(statx(&f), (want, 0x70), "flags {flags:#x}");
    }
}
