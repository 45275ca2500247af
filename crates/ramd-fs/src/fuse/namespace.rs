//! FUSE requests on names: SYMLINK, MKNOD, MKDIR, RENAME, LINK, CREATE and
//! TMPFILE, and directory listings (READDIR, READDIRPLUS).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::reply::{
    arg, caller, created_out, creator, empty, entry_out, fattr_of, last_name, name, type_bits,
};
use super::{Answer, FuseFs, GENERATION, TTL};
use crate::fs::{Errno, Ino};
use crate::ll::abi::{self, op, Rd, Wr};
use crate::ll::Request;

impl FuseFs {
    pub(super) fn symlink(&self, req: &Request<'_>, buf: &mut [u8]) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let (link, rest) = name(req.rest)?;
        let (target, tail) = abi::cstr(rest).ok_or(Errno::EINVAL)?;
        if !tail.is_empty() {
            return Err(Errno::EINVAL);
        }
        let target = OsStr::from_bytes(target);
        entry_out(self, buf, fs.symlink(caller(req), ino, link, target))
    }

    pub(super) fn mknod(&self, req: &Request<'_>, buf: &mut [u8]) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let mut r = Rd(req.arg0);
        let (mode, rdev, umask) = (arg(r.u32())?, arg(r.u32())?, arg(r.u32())?);
        let who = creator(req, umask);
        entry_out(
            self,
            buf,
            fs.mknod(who, ino, last_name(req.rest)?, mode, rdev),
        )
    }

    pub(super) fn mkdir(&self, req: &Request<'_>, buf: &mut [u8]) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let mut r = Rd(req.arg0);
        let (mode, umask) = (arg(r.u32())?, arg(r.u32())?);
        let who = creator(req, umask);
        entry_out(self, buf, fs.mkdir(who, ino, last_name(req.rest)?, mode))
    }

    pub(super) fn rename(&self, req: &Request<'_>) -> Answer {
        let h = &req.header;
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let mut r = Rd(req.arg0);
        let newdir = arg(r.u64())?;
        let flags = if h.opcode == op::RENAME2 {
            arg(r.u32())?
        } else {
            0
        };
        let (old, rest) = name(req.rest)?;
        let new = last_name(rest)?;
        empty(fs.rename(caller(req), ino, old, Ino(newdir), new, flags))
    }

    pub(super) fn create(&self, req: &Request<'_>, buf: &mut [u8]) -> Answer {
        let h = &req.header;
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        // fuse_create_in: flags, mode, umask.
        let mut r = Rd(req.arg0);
        let (flags, mode, umask) = (arg(r.u32())?, arg(r.u32())?, arg(r.u32())?);
        let who = creator(req, umask);
        let a = if h.opcode == op::CREATE {
            fs.create(who, ino, last_name(req.rest)?, mode)
        } else {
            // The name the kernel sends ("/") names nothing.
            fs.tmpfile(who, ino, mode)
        };
        let a = a?;
        let open = match self.open_reply(a.ino, flags, true) {
            Ok(r) => r,
            Err(e) => {
                // Created but not opened: the kernel will not
                // release it, and (for O_TMPFILE) nothing names it.
                fs.release(a.ino);
                return Err(e);
            }
        };
        created_out(self, buf, &a, open)
    }

    pub(super) fn link(&self, req: &Request<'_>, buf: &mut [u8]) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let old = arg(Rd(req.arg0).u64())?;
        entry_out(self, buf, fs.link(Ino(old), ino, last_name(req.rest)?))
    }
}

impl FuseFs {
    pub(super) fn readdir(&self, ino: Ino, r: abi::RwIn, buf: &mut [u8]) -> Answer {
        let size = (r.size as usize).min(buf.len());
        let most = size / abi::dirent_len(abi::DIRENT_LEN, 1);
        let entries = self.fs.read_dir(ino, r.offset, most)?;
        let mut w = Wr::new(&mut buf[..size]);
        for (cookie, e) in &entries {
            // The offset handed back is where the next call resumes.
            let typ = type_bits(e.kind) >> 12;
            if !abi::encode_dirent(&mut w, e.ino.0, *cookie, typ, e.name.as_bytes()) {
                break;
            }
        }
        w.written().ok_or(Errno::EIO)
    }

    pub(super) fn readdirplus(&self, ino: Ino, r: abi::RwIn, buf: &mut [u8]) -> Answer {
        let size = (r.size as usize).min(buf.len());
        let most = size / abi::dirent_len(abi::DIRENTPLUS_LEN, 1);
        let entries = self.fs.read_dir(ino, r.offset, most)?;
        let mut w = Wr::new(&mut buf[..size]);
        for (cookie, e) in &entries {
            if abi::dirent_len(abi::DIRENTPLUS_LEN, e.name.len()) > w.room() {
                break;
            }
            let dot = e.name == "." || e.name == "..";
            // The kernel counts a lookup for every entry but "." and "..".
            let attr = if dot {
                self.fs.getattr(e.ino)
            } else {
                self.fs.lookup_ino(e.ino)
            };
            let Ok(attr) = attr else {
                // Removed since it was listed: leave it out.
                continue;
            };
            let ttl = self.attr_ttl(&attr);
            abi::encode_entry(&mut w, GENERATION, TTL, ttl, &fattr_of(&attr));
            let typ = type_bits(e.kind) >> 12;
            abi::encode_dirent(&mut w, e.ino.0, *cookie, typ, e.name.as_bytes());
        }
        w.written().ok_or(Errno::EIO)
    }
}
