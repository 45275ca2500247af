//! FUSE requests on attributes: SETATTR, STATX and STATFS (GETATTR is a
//! line in the dispatcher).

use std::time::SystemTime;

use super::reply::{arg, attr_out, caller, system_time, type_bits};
use super::{Answer, FuseFs};
use crate::fs::{split_time, Attr, Errno, Ino, SetAttr, SetTime, NAME_MAX};
use crate::ll::abi::{self, fattr, Wr};
use crate::ll::Request;

impl FuseFs {
    pub(super) fn setattr(&self, req: &Request<'_>, buf: &mut [u8]) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let s = arg(abi::SetattrIn::parse(req.arg0))?;
        let v = s.valid;
        let on = |bit: u32| v & bit != 0;
        let time = |t: (u64, u32), now: u32, at: u32| {
            if on(now) {
                Ok(Some(SetTime::Now))
            } else if on(at) {
                system_time(t).map(|t| Some(SetTime::At(t)))
            } else {
                Ok(None)
            }
        };
        let set = SetAttr {
            mode: on(fattr::MODE).then_some(s.mode),
            uid: on(fattr::UID).then_some(s.uid),
            gid: on(fattr::GID).then_some(s.gid),
            size: on(fattr::SIZE).then_some(s.size),
            atime: time(s.atime, fattr::ATIME_NOW, fattr::ATIME)?,
            mtime: time(s.mtime, fattr::MTIME_NOW, fattr::MTIME)?,
            ctime: if on(fattr::CTIME) {
                Some(system_time(s.ctime)?)
            } else {
                None
            },
            times_given: times_given(&s),
        };
        attr_out(self, buf, fs.setattr(caller(req), ino, set))
    }

    pub(super) fn statfs(&self, buf: &mut [u8]) -> Answer {
        let fs = &*self.fs;
        let (blocks, bfree, files, ffree) = fs.statfs();
        let mut w = Wr::new(buf);
        w.u64(blocks)
            .u64(bfree)
            .u64(bfree)
            .u64(files)
            .u64(ffree)
            .u32(4096)
            .u32(NAME_MAX as u32)
            .u32(4096)
            .u32(0)
            .zeros(24);
        w.written().ok_or(Errno::EIO)
    }

    pub(super) fn statx(&self, req: &Request<'_>, buf: &mut [u8]) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let sx = arg(abi::StatxIn::parse(req.arg0))?;
        let a = fs.getattr(ino)?;
        let mut w = Wr::new(buf);
        // attr_valid, its nanoseconds, flags, spare.
        w.u64(self.attr_ttl(&a)).u32(0).u32(0).zeros(16);
        encode_statx(&mut w, &a, sx.sx_mask);
        w.written().ok_or(Errno::EIO)
    }
}

/// The statx attributes tmpfs reports, each with the chattr flag it
/// stands for.
pub(super) const STATX_ATTRS: [(u32, u64); 3] = {
    use crate::fs::{FL_APPEND, FL_IMMUTABLE, FL_NODUMP};
    [
        (FL_IMMUTABLE, libc::STATX_ATTR_IMMUTABLE as u64),
        (FL_APPEND, libc::STATX_ATTR_APPEND as u64),
        (FL_NODUMP, libc::STATX_ATTR_NODUMP as u64),
    ]
};

/// `struct fuse_statx`: all basic fields always (the kernel refreshes its
/// cached attributes only from a full set), the birth time when asked,
/// and the attributes tmpfs reports (immutable, append-only, nodump) with
/// their mask. Linux 6.18 drops those two (`fuse_do_statx` in
/// fs/fuse/dir.c copies neither into the kstat, and `fuse_update_get_attr`
/// asks for basic stats and btime only), so `statx` shows only the VFS's
/// own; they are answered for a kernel that passes them on.
pub(super) fn encode_statx(w: &mut Wr<'_>, a: &Attr, want: u32) {
    let mask = libc::STATX_BASIC_STATS | (want & libc::STATX_BTIME);
    let time = |w: &mut Wr<'_>, t: SystemTime| {
        let (s, ns) = split_time(t);
        w.i64(s).u32(ns).u32(0);
    };
    // The kernel's 32-bit device encoding (new_encode_dev).
    let (major, minor) = (
        (a.rdev >> 8) & 0xfff,
        (a.rdev & 0xff) | ((a.rdev >> 12) & 0xfff00),
    );
    let attributes = STATX_ATTRS
        .iter()
        .filter(|(fl, _)| a.flags & fl != 0)
        .fold(0, |x, (_, attr)| x | attr);
    let attributes_mask = STATX_ATTRS.iter().fold(0, |x, (_, attr)| x | attr);
    w.u32(mask)
        .u32(4096)
        .u64(attributes)
        .u32(a.nlink)
        .u32(a.uid)
        .u32(a.gid)
        .u16((type_bits(a.kind) | a.perm as u32) as u16)
        .u16(0)
        .u64(a.ino.0)
        .u64(a.size)
        .u64(a.blocks)
        .u64(attributes_mask);
    time(w, a.atime);
    time(w, a.btime);
    time(w, a.ctime);
    time(w, a.mtime);
    w.u32(major).u32(minor).u32(0).u32(0).zeros(14 * 8);
}

/// Whether a SETATTR sets times other than "both to now" (utime(NULL)),
/// which is all an append-only file allows (the VFS's ATTR_TIMES_SET).
/// Under the write-back cache the kernel sends its own "now" as an
/// explicit mtime with ctime, the same instant (the VFS sets ctime to now
/// on every change), and it writes back the times it keeps as mtime and
/// ctime, never atime, with the handle of the open it writes through (at
/// every close of a written file, so one without a handle would be
/// a file dirtied with no writer open, which append-only leaves none of).
pub(super) fn times_given(s: &abi::SetattrIn) -> bool {
    let on = |bit: u32| s.valid & bit != 0;
    if !on(fattr::ATIME) && !on(fattr::MTIME) || on(fattr::FH) && !on(fattr::ATIME) {
        return false;
    }
    let atime_now = on(fattr::ATIME) && on(fattr::ATIME_NOW);
    let mtime_now =
        on(fattr::MTIME) && (on(fattr::MTIME_NOW) || on(fattr::CTIME) && s.mtime == s.ctime);
    !(atime_now && mtime_now)
}
