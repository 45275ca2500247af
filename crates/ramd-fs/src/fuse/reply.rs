//! Decoding requests' arguments and encoding replies: names, callers,
//! attributes and entries, in the kernel's layout (`ll/abi.rs`).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::time::SystemTime;

use super::{Answer, FuseFs, GENERATION, TTL};
use crate::fs::{split_time, Attr, Caller, Errno, Kind, NAME_MAX};
use crate::ll::abi::{self, Wr};
use crate::ll::Request;

/// The `S_IFMT` bits of a kind.
pub(super) fn type_bits(k: Kind) -> u32 {
    match k {
        Kind::File => libc::S_IFREG,
        Kind::Dir => libc::S_IFDIR,
        Kind::Symlink => libc::S_IFLNK,
        Kind::Fifo => libc::S_IFIFO,
        Kind::Socket => libc::S_IFSOCK,
        Kind::CharDev => libc::S_IFCHR,
        Kind::BlockDev => libc::S_IFBLK,
    }
}

/// The instant a request's (seconds, nanoseconds) names; EINVAL when out
/// of range.
pub(super) fn system_time((secs, nsec): (u64, u32)) -> std::result::Result<SystemTime, Errno> {
    crate::fs::join_time(secs as i64, nsec).ok_or(Errno::EINVAL)
}

pub(super) fn fattr_of(a: &Attr) -> abi::FAttr {
    abi::FAttr {
        ino: a.ino.0,
        size: a.size,
        blocks: a.blocks,
        atime: split_time(a.atime),
        mtime: split_time(a.mtime),
        ctime: split_time(a.ctime),
        mode: type_bits(a.kind) | a.perm as u32,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
    }
}

pub(super) fn caller(req: &Request<'_>) -> Caller {
    Caller {
        uid: req.header.uid,
        gid: req.header.gid,
        pid: req.header.pid,
        umask: 0,
    }
}

/// The caller of a request that creates an inode, with the umask it sent.
pub(super) fn creator(req: &Request<'_>, umask: u32) -> Caller {
    Caller {
        umask,
        ..caller(req)
    }
}

/// CREATE's and TMPFILE's answer: the new inode's entry, then its open.
pub(super) fn created_out(t: &FuseFs, buf: &mut [u8], a: &Attr, open: (u32, i32)) -> Answer {
    let mut w = Wr::new(buf);
    abi::encode_entry(&mut w, GENERATION, TTL, t.attr_ttl(a), &fattr_of(a));
    abi::encode_open_out(&mut w, 0, open.0, open.1);
    w.written().ok_or(Errno::EIO)
}

/// A directory entry's name: NUL-terminated, at most NAME_MAX bytes; and
/// what follows it.
pub(super) fn name(b: &[u8]) -> std::result::Result<(&OsStr, &[u8]), Errno> {
    let (n, rest) = abi::cstr(b).ok_or(Errno::EINVAL)?;
    if n.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok((OsStr::from_bytes(n), rest))
}

/// A name that must be all that is left of the request.
pub(super) fn last_name(b: &[u8]) -> std::result::Result<&OsStr, Errno> {
    let (n, rest) = name(b)?;
    if !rest.is_empty() {
        return Err(Errno::EINVAL);
    }
    Ok(n)
}

/// Decodes a fixed argument; EINVAL when it is short.
pub(super) fn arg<T>(v: Option<T>) -> std::result::Result<T, Errno> {
    v.ok_or(Errno::EINVAL)
}

pub(super) fn entry_out(t: &FuseFs, buf: &mut [u8], r: crate::fs::Result<Attr>) -> Answer {
    let a = r?;
    let mut w = Wr::new(buf);
    abi::encode_entry(&mut w, GENERATION, TTL, t.attr_ttl(&a), &fattr_of(&a));
    w.written().ok_or(Errno::EIO)
}

/// A LOOKUP's answer. A missing name is an entry with inode 0, which the
/// kernel keeps as a negative dentry for `TTL`, so asking again for it
/// (open(O_CREAT), a build's probes) is free; creating the name through
/// the kernel replaces it.
pub(super) fn lookup_out(t: &FuseFs, buf: &mut [u8], r: crate::fs::Result<Attr>) -> Answer {
    match r {
        Err(e) if e == Errno::ENOENT => {
            let mut w = Wr::new(buf);
            abi::encode_entry(&mut w, 0, TTL, TTL, &abi::FAttr::default());
            w.written().ok_or(Errno::EIO)
        }
        r => entry_out(t, buf, r),
    }
}

pub(super) fn attr_out(t: &FuseFs, buf: &mut [u8], r: crate::fs::Result<Attr>) -> Answer {
    let a = r?;
    let mut w = Wr::new(buf);
    abi::encode_attr_out(&mut w, t.attr_ttl(&a), &fattr_of(&a));
    w.written().ok_or(Errno::EIO)
}

pub(super) fn empty(r: crate::fs::Result<()>) -> Answer {
    r.map(|()| 0)
}

/// Copies `data` into the reply; ERANGE if it does not fit.
pub(super) fn data_out(buf: &mut [u8], data: &[u8]) -> Answer {
    let dst = buf.get_mut(..data.len()).ok_or(Errno::ERANGE)?;
    dst.copy_from_slice(data);
    Ok(data.len())
}
