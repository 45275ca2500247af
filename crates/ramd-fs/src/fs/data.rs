//! `Fs`'s file data: open and release, read, write, fallocate, seek and
//! copy_file_range, on the store or on the hot tier.

use std::sync::atomic::Ordering::Relaxed;

use ramd_store::{Change, ExtentKind};

use super::types::{err, Kill};
use super::{
    now, Caller, Data, Errno, Fs, Ino, Kind, Result, Whence, EXTEND_LOCKS, FL_APPEND, FL_IMMUTABLE,
};

impl Fs {
    /// Opens a non-directory with open(2)'s `flags`.
    pub fn open(&self, ino: Ino, flags: i32) -> Result<()> {
        // A cold file moves back first; the open then holds it hot.
        let _pin = self.hot_pin(ino)?;
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        if inode.kind == Kind::Dir {
            return err(Errno::EISDIR);
        }
        let writing = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        if writing {
            inode.check_mutable()?;
            if inode.flags & FL_APPEND != 0
                && (flags & libc::O_APPEND == 0 || flags & libc::O_TRUNC != 0)
            {
                return err(Errno::EPERM);
            }
            self.hot_changed(ino);
        }
        self.opened(inode);
        Ok(())
    }

    /// Takes the gate: the last close of an unlinked file frees its data.
    pub fn release(&self, ino: Ino) {
        let c = self.store.change();
        let mut st = self.state.write();
        if let Some(inode) = st.inodes.get_mut(&ino) {
            inode.opens = inode.opens.saturating_sub(1);
            if inode.opens == 0 {
                if inode.kind == Kind::File {
                    self.went_idle(ino, &mut inode.cold);
                }
                // Closed unlinked: no link can name it any more.
                st.linkable.remove(&ino);
            }
        }
        self.maybe_free(&c, &mut st, ino);
    }

    /// Where regular file `ino`'s data starts in the store (its slot's
    /// first byte): for tools that map store ranges back to files, such as
    /// `ramd image salvage` naming the files a damaged page belongs to.
    pub fn data_offset(&self, ino: Ino) -> Result<u64> {
        Ok(self.file(ino)?.0)
    }

    /// Reads up to `buf.len()` bytes at `off`; returns how many (short at EOF).
    pub fn read(&self, ino: Ino, off: u64, buf: &mut [u8]) -> Result<usize> {
        // A standby: the size and the data from one save (an apply waits).
        let standby = self.store.standby_hold();
        let (base, size, _) = self.file(ino)?;
        if self.hot.get().is_some() {
            let _pin = self.hot_pin(ino)?;
            return self.hot_read(ino, off, buf);
        }
        if off >= size {
            return Ok(0);
        }
        let n = (size - off).min(buf.len() as u64) as usize;
        self.store.read_held(&standby, base + off, &mut buf[..n])?;
        drop(standby);
        self.accessed(ino);
        Ok(n)
    }

    /// Writes `data` at `off`. When the disk fills part way, a write that
    /// allows it (`short_ok`) stores what fits and returns that count, as
    /// POSIX and tmpfs do; otherwise (the kernel flushing its page cache,
    /// which would take a short count as success) it fails whole. With
    /// setuid, setgid and capabilities go as [`Fs::drop_privileges`] says
    /// (`kernel_kill`: the kernel flagged the writer as lacking CAP_FSETID).
    /// The caller holds `c` ([`Fs::change`]) over the whole request.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        c: &Change<'_>,
        ino: Ino,
        off: u64,
        data: &[u8],
        short_ok: bool,
        who: Caller,
        kernel_kill: bool,
    ) -> Result<usize> {
        let (base, size, flags) = self.file(ino)?;
        // Append-only: a program's write lands at the end (O_APPEND was
        // required to open); the kernel's write-back may rewrite a page.
        if flags & FL_IMMUTABLE != 0 || (flags & FL_APPEND != 0 && short_ok && off < size) {
            return err(Errno::EPERM);
        }
        let end = off
            .checked_add(data.len() as u64)
            .filter(|&e| e <= self.max_file_size() + 1)
            .ok_or(Errno::EFBIG)?;
        if self.hot.get().is_some() {
            let n = {
                let _pin = self.hot_pin(ino)?;
                self.hot_write(ino, off, data)?
            };
            let killed = {
                let mut st = self.state.write();
                let why = if kernel_kill {
                    Kill::KernelSays
                } else {
                    Kill::Modify
                };
                self.drop_privileges(st.get_mut(ino)?, who, why)
            };
            if killed {
                self.attr_changed(ino);
            }
            return Ok(n);
        }
        // A write past EOF that fails takes back what it put past EOF
        // (below), reading EOF after its copy. Two such writes to one file
        // at once would race: the failing one could take back bytes the
        // other has copied but not yet counted in the size. So writes past
        // EOF of one file go one at a time; writes inside it never take
        // anything back.
        let _extending =
            (end > size).then(|| self.extending[(ino.0 % EXTEND_LOCKS as u64) as usize].lock());
        let mut delta = 0;
        let (done, r) = c.write_prefix(base + off, data, &mut delta);
        let (end, r) = match r {
            Err(_) if short_ok && done > 0 => (off + done as u64, Ok(())),
            r => (end, r),
        };
        let now = now();
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        let size = inode.size;
        if let Data::File {
            ref mut pages,
            ref mut alloc_end,
            ..
        } = inode.data
        {
            // Even a failed write may have filled pages up to `end`: they
            // must be counted and freed with the file.
            *alloc_end = (*alloc_end).max(end);
            if r.is_err() && end > size {
                // What landed past EOF must not show if the file grows later.
                let from = off.max(size);
                delta += self.punch(c, base + from, end - from);
            }
            *pages = pages.saturating_add_signed(delta);
        }
        if let Err(e) = r {
            let e = Errno::from(e);
            // The kernel's write-back hit a full disk: see `Fs::write_allowed`.
            let full = !short_ok && e == Errno::ENOSPC;
            inode.cache.full |= full;
            drop(st);
            if full {
                self.attr_changed(ino);
            }
            return Err(e);
        }
        let why = if kernel_kill {
            Kill::KernelSays
        } else {
            Kill::Modify
        };
        let killed = self.drop_privileges(inode, who, why);
        inode.size = inode.size.max(end);
        // Under the write-back cache the kernel keeps a file's mtime and
        // ctime and sends them itself (SETATTR); its write-back may come
        // later than that, and must not move them past what it sent.
        if short_ok || !self.kernel_times.load(Relaxed) {
            inode.touch_mc(now);
        }
        drop(st);
        if killed {
            self.attr_changed(ino);
        }
        Ok((end - off) as usize)
    }

    /// fallocate(2) for `who`: like a write, it drops privilege bits.
    pub fn fallocate(&self, who: Caller, ino: Ino, off: u64, len: u64, mode: i32) -> Result<()> {
        const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        let c = self.store.change();
        if mode & !(KEEP_SIZE | PUNCH | ZERO) != 0 || (mode & PUNCH != 0 && mode & ZERO != 0) {
            return err(Errno::EOPNOTSUPP);
        }
        if mode & PUNCH != 0 && mode & KEEP_SIZE == 0 {
            return err(Errno::EOPNOTSUPP);
        }
        let (base, size, flags) = self.file(ino)?;
        if flags & FL_IMMUTABLE != 0 || (flags & FL_APPEND != 0 && mode & !KEEP_SIZE != 0) {
            return err(Errno::EPERM);
        }
        let end = off
            .checked_add(len)
            .filter(|&e| e <= self.max_file_size() + 1)
            .ok_or(Errno::EFBIG)?;
        if len == 0 {
            return err(Errno::EINVAL);
        }
        if self.hot.get().is_some() {
            {
                let _pin = self.hot_pin(ino)?;
                self.hot_fallocate(ino, off, len, mode)?;
            }
            let killed = {
                let mut st = self.state.write();
                self.drop_privileges(st.get_mut(ino)?, who, Kill::Modify)
            };
            if killed {
                self.attr_changed(ino);
            }
            return Ok(());
        }
        let mut delta = 0;
        let r = if mode & PUNCH != 0 {
            // Only what lies inside the file is punched.
            let end = end.min(size);
            if end > off {
                c.zero_counted(base + off, end - off, true, &mut delta)
            } else {
                Ok(())
            }
        } else if mode & ZERO != 0 {
            c.zero_counted(base + off, len, false, &mut delta)
        } else {
            c.allocate(base + off, len, &mut delta)
        };
        let now = now();
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        if let Data::File {
            ref mut pages,
            ref mut alloc_end,
            ..
        } = inode.data
        {
            *pages = pages.saturating_add_signed(delta);
            // Zeroing may have allocated part of the range before failing;
            // (allocate gives back its own on failure).
            if mode & PUNCH == 0 {
                *alloc_end = (*alloc_end).max(end);
            }
        }
        r?;
        if mode & KEEP_SIZE == 0 && end > inode.size {
            inode.size = end;
            inode.touch_mc(now);
        } else if mode & (PUNCH | ZERO) != 0 {
            inode.touch_mc(now);
        }
        let killed = self.drop_privileges(inode, who, Kill::Modify);
        drop(st);
        if killed {
            self.attr_changed(ino);
        }
        Ok(())
    }

    /// SEEK_DATA / SEEK_HOLE. Written or allocated pages are data, holes
    /// are holes; the end of the file is a hole.
    pub fn seek(&self, ino: Ino, off: u64, whence: Whence) -> Result<u64> {
        // A standby: the size and the extents from one save.
        let standby = self.store.standby_hold();
        let (base, size, _) = self.file(ino)?;
        if self.hot.get().is_some() {
            let _pin = self.hot_pin(ino)?;
            return self.hot_seek(ino, off, whence);
        }
        if off >= size {
            return err(Errno::ENXIO);
        }
        let mut pos = off;
        while pos < size {
            // Extents are asked for in pieces so one call stays bounded.
            let len = (size - pos).min(1 << 30);
            for e in self.store.extents_held(&standby, base + pos, len, 4096)? {
                let hole = e.kind == ExtentKind::Hole;
                if hole == (whence == Whence::Hole) {
                    return Ok(pos);
                }
                pos += e.length;
            }
        }
        match whence {
            Whence::Hole => Ok(size),
            Whence::Data => err(Errno::ENXIO),
        }
    }

    /// Copies file data within the store; returns bytes copied.
    pub fn copy_range(
        &self,
        who: Caller,
        ino_in: Ino,
        off_in: u64,
        ino_out: Ino,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let c = self.store.change();
        let (_, size_in, _) = self.file(ino_in)?;
        if ino_in == ino_out && off_in < off_out + len && off_out < off_in + len {
            return err(Errno::EINVAL);
        }
        if self.hot.get().is_some() {
            let (_, _, flags) = self.file(ino_out)?;
            if flags & (FL_IMMUTABLE | FL_APPEND) != 0 {
                return err(Errno::EPERM);
            }
            let n = {
                let _pins = (self.hot_pin(ino_in)?, self.hot_pin(ino_out)?);
                self.hot_copy(ino_in, off_in, ino_out, off_out, len)?
            };
            let killed = {
                let mut st = self.state.write();
                self.drop_privileges(st.get_mut(ino_out)?, who, Kill::Modify)
            };
            if killed {
                self.attr_changed(ino_out);
            }
            return Ok(n);
        }
        let len = len.min(size_in.saturating_sub(off_in));
        let mut buf = vec![0; len.min(1 << 20) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            let got = self.read(ino_in, off_in + done, &mut buf[..n])?;
            if got == 0 {
                break;
            }
            let put = self.write(&c, ino_out, off_out + done, &buf[..got], true, who, false)?;
            done += put as u64;
            if put < got {
                break;
            }
        }
        Ok(done)
    }
}
