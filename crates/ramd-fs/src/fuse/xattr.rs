//! FUSE requests on extended attributes (SETXATTR, GETXATTR, LISTXATTR,
//! REMOVEXATTR) and the chattr ioctls.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering::Relaxed;

use super::reply::{arg, data_out, empty};
use super::{Answer, FuseFs};
use crate::fs::{Errno, Ino};
use crate::ll::abi::{self, op, Rd, Wr};
use crate::ll::Request;

impl FuseFs {
    pub(super) fn setxattr(&self, req: &Request<'_>) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let mut r = Rd(req.arg0);
        let (size, flags) = (arg(r.u32())?, arg(r.u32())?);
        let kill_sgid =
            self.setxattr_ext.load(Relaxed) && arg(r.u32())? & abi::SETXATTR_ACL_KILL_SGID != 0;
        let (n, value) = abi::cstr(req.rest).ok_or(Errno::EINVAL)?;
        if value.len() != size as usize {
            return Err(Errno::EINVAL);
        }
        let n = OsStr::from_bytes(n);
        empty(fs.setxattr(ino, n, value, flags as i32, kill_sgid))
    }

    pub(super) fn getxattr(&self, req: &Request<'_>, buf: &mut [u8]) -> Answer {
        let h = &req.header;
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let size = arg(Rd(req.arg0).u32())?;
        let v = if h.opcode == op::GETXATTR {
            let (n, tail) = abi::cstr(req.rest).ok_or(Errno::EINVAL)?;
            if !tail.is_empty() {
                return Err(Errno::EINVAL);
            }
            fs.getxattr(ino, OsStr::from_bytes(n))
        } else {
            fs.listxattr(ino)
        }?;
        if size == 0 {
            // fuse_getxattr_out: the size it would take.
            let mut w = Wr::new(buf);
            w.u32(v.len() as u32).u32(0);
            w.written().ok_or(Errno::EIO)
        } else if v.len() > size as usize {
            Err(Errno::ERANGE)
        } else {
            data_out(buf, &v)
        }
    }

    pub(super) fn removexattr(&self, req: &Request<'_>) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let (n, tail) = abi::cstr(req.rest).ok_or(Errno::EINVAL)?;
        if !tail.is_empty() {
            return Err(Errno::EINVAL);
        }
        empty(fs.removexattr(ino, OsStr::from_bytes(n)))
    }

    pub(super) fn ioctl_request(&self, req: &Request<'_>, buf: &mut [u8]) -> Answer {
        let ino = Ino(req.header.nodeid);
        let i = arg(abi::IoctlIn::parse(req.arg0))?;
        let in_data = req.rest.get(..i.in_size as usize).ok_or(Errno::EINVAL)?;
        self.ioctl(ino, i.cmd, in_data, i.out_size, buf)
    }
}

impl FuseFs {
    pub(super) fn ioctl(
        &self,
        ino: Ino,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        buf: &mut [u8],
    ) -> Answer {
        // The kernel sends chattr's flags as an unsigned int, whichever
        // width the command's number says (fs/fuse/ioctl.c).
        const GETFLAGS: [u32; 2] = [libc::FS_IOC_GETFLAGS as u32, libc::FS_IOC32_GETFLAGS as u32];
        const SETFLAGS: [u32; 2] = [libc::FS_IOC_SETFLAGS as u32, libc::FS_IOC32_SETFLAGS as u32];
        // _IOR('X', 31, struct fsxattr): the kernel asks for it before
        // it sets chattr flags, and for a fileattr query.
        const FSGETXATTR: u32 = 0x801c_581f;
        // _IOW('X', 32, struct fsxattr): xfs_io's chattr, file_setattr(2).
        const FSSETXATTR: u32 = 0x401c_5820;
        let out = |buf: &mut [u8], data: &[u8]| {
            // fuse_ioctl_out: result 0, no retry, then the data.
            let data = &data[..data.len().min(out_size as usize)];
            let mut w = Wr::new(buf);
            w.u32(0).u32(0).u32(0).u32(0).bytes(data);
            w.written().ok_or(Errno::EIO)
        };
        if cmd == FSGETXATTR {
            let f = self.fs.flags(ino)?;
            // struct fsxattr: xflags, then four u32 and 8 bytes of
            // padding, all zero here.
            let mut b = [0u8; 28];
            b[..4].copy_from_slice(&xflags(f).to_ne_bytes());
            out(buf, &b)
        } else if cmd == FSSETXATTR {
            // struct fsxattr: xflags, extsize, nextents (ignored), projid,
            // cowextsize. The VFS has checked permissions and cleared
            // the extent size flags when their sizes are 0; like tmpfs,
            // any other flag or a size or project is EOPNOTSUPP.
            let mut r = Rd(in_data);
            let (xf, extsize, _nextents, projid, cowextsize) = (
                arg(r.u32())?,
                arg(r.u32())?,
                arg(r.u32())?,
                arg(r.u32())?,
                arg(r.u32())?,
            );
            let flags = flags_of_xflags(xf)
                .filter(|_| extsize == 0 && projid == 0 && cowextsize == 0)
                .ok_or(Errno::EOPNOTSUPP)?;
            self.fs.set_flags(ino, flags)?;
            out(buf, &[])
        } else if GETFLAGS.contains(&cmd) {
            let f = self.fs.flags(ino)?;
            out(buf, &f.to_ne_bytes())
        } else if SETFLAGS.contains(&cmd) {
            let f = arg(Rd(in_data).u32())?;
            self.fs.set_flags(ino, f)?;
            out(buf, &[])
        } else {
            // ENOTTY, as tmpfs; said once per command, not once per call.
            if self
                .unknown_ioctls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(cmd)
            {
                log::info!("unsupported ioctl {cmd:#x} (answered ENOTTY; not logged again)");
            }
            Err(Errno::ENOTTY)
        }
    }
}

/// The chattr flags `Fs` keeps and their FS_XFLAG_* spelling.
pub(super) const XFLAGS: [(u32, u32); 4] = {
    use crate::fs::{FL_APPEND, FL_IMMUTABLE, FL_NOATIME, FL_NODUMP};
    [
        (FL_IMMUTABLE, 0x8),
        (FL_APPEND, 0x10),
        (FL_NOATIME, 0x40),
        (FL_NODUMP, 0x80),
    ]
};

/// The FS_XFLAG_* spelling of chattr flags.
pub(super) fn xflags(flags: u32) -> u32 {
    XFLAGS
        .iter()
        .filter(|(fl, _)| flags & fl != 0)
        .fold(0, |x, (_, xf)| x | xf)
}

/// The chattr flags FS_XFLAG_* flags stand for; `None` if any is one
/// `Fs` does not keep.
pub(super) fn flags_of_xflags(xf: u32) -> Option<u32> {
    let known = XFLAGS.iter().fold(0, |k, (_, x)| k | x);
    (xf & !known == 0).then(|| {
        XFLAGS
            .iter()
            .filter(|(_, x)| xf & x != 0)
            .fold(0, |f, (fl, _)| f | fl)
    })
}
