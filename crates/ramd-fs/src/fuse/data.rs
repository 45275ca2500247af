//! FUSE requests on file data: OPEN, READ, WRITE, RELEASE, FALLOCATE,
//! LSEEK and COPY_FILE_RANGE.

use super::reply::{arg, caller, empty};
use super::seek::lseek_in;
use super::{Answer, FuseFs, Tally};
use crate::fs::{Errno, Ino};
use crate::ll::abi::{self, Rd, Wr};
use crate::ll::Request;

impl FuseFs {
    pub(super) fn open(&self, req: &Request<'_>, buf: &mut [u8]) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let flags = arg(Rd(req.arg0).u32())?;
        fs.open(ino, flags as i32)?;
        let (open_flags, backing) = match self.open_reply(ino, flags, false) {
            Ok(r) => r,
            Err(e) => {
                fs.release(ino);
                return Err(e);
            }
        };
        let mut w = Wr::new(buf);
        abi::encode_open_out(&mut w, 0, open_flags, backing);
        w.written().ok_or(Errno::EIO)
    }

    pub(super) fn read(&self, req: &Request<'_>, buf: &mut [u8], tally: &mut Tally) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let r = arg(abi::RwIn::parse(req.arg0))?;
        // Straight into the reply: no copy of the data here.
        let dst = buf.get_mut(..r.size as usize).ok_or(Errno::EINVAL)?;
        let res = fs.read(ino, r.offset, dst);
        tally.ran(*res.as_ref().unwrap_or(&0) as u64);
        res
    }

    pub(super) fn write(&self, req: &Request<'_>, buf: &mut [u8], tally: &mut Tally) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let w = arg(abi::RwIn::parse(req.arg0))?;
        if req.rest.len() != w.size as usize {
            return Err(Errno::EINVAL);
        }
        // Writes flushed from the kernel's cache must fail whole, so
        // that the error is kept for fsync/close; a program's own
        // write may be short.
        let short_ok = w.rw_flags & abi::WRITE_CACHE == 0;
        let kill = w.rw_flags & abi::WRITE_KILL_SUIDGID != 0;
        let res = fs.write(
            &fs.change(),
            ino,
            w.offset,
            req.rest,
            short_ok,
            caller(req),
            kill,
        );
        tally.ran(*res.as_ref().unwrap_or(&0) as u64);
        let n = res?;
        let mut out = Wr::new(buf);
        out.u32(n as u32).u32(0);
        out.written().ok_or(Errno::EIO)
    }

    pub(super) fn release(&self, req: &Request<'_>) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        // The backing id first: the last release frees an
        // unlinked file's backing file.
        // fuse_release_in: fh, then the open's flags (its length
        // was checked by the dispatcher; a release is never refused).
        let mut r = Rd(req.arg0);
        let flags = r.u64().and_then(|_fh| r.u32()).unwrap_or(0);
        self.released(ino, flags);
        fs.release(ino);
        Ok(0)
    }

    pub(super) fn fallocate(&self, req: &Request<'_>, tally: &mut Tally) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let mut r = Rd(req.arg0);
        let (_fh, offset, length, mode) = (
            arg(r.u64())?,
            arg(r.u64())?,
            arg(r.u64())?,
            arg(r.u32())? as i32,
        );
        let res = fs.fallocate(caller(req), ino, offset, length, mode);
        tally.ran(length);
        empty(res)
    }

    pub(super) fn lseek(&self, req: &Request<'_>, buf: &mut [u8], tally: &mut Tally) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let (offset, whence) = lseek_in(req)?;
        let res = fs.seek(ino, offset as u64, whence);
        tally.ran(0);
        let o = res?;
        let mut w = Wr::new(buf);
        w.u64(o);
        w.written().ok_or(Errno::EIO)
    }

    pub(super) fn copy_file_range(
        &self,
        req: &Request<'_>,
        buf: &mut [u8],
        tally: &mut Tally,
    ) -> Answer {
        let ino = Ino(req.header.nodeid);
        let fs = &*self.fs;
        let c = arg(abi::CopyRangeIn::parse(req.arg0))?;
        // One reply carries a u32 count; the kernel loops for the rest.
        let len = c.len.min(1 << 30);
        let res = fs.copy_range(
            caller(req),
            ino,
            c.off_in,
            Ino(c.nodeid_out),
            c.off_out,
            len,
        );
        tally.ran(*res.as_ref().unwrap_or(&0));
        let n = res?;
        let mut w = Wr::new(buf);
        w.u32(n as u32).u32(0);
        w.written().ok_or(Errno::EIO)
    }
}
