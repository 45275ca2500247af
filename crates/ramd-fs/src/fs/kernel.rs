//! `--data-path kernel`: regular files' data in the hot tier (a private
//! kernel tmpfs, [`HotTier`]), one backing file per inode; the namespace,
//! modes, owners, xattrs and flags stay in `Fs`. Reads and writes of open
//! files never come here (the kernel passes them through to the backing
//! file); what does come (truncate, fallocate, SEEK_DATA/SEEK_HOLE,
//! copy_file_range, and the size, blocks and times a stat shows) is
//! answered from the backing file, so writes through mmap or by any
//! opener show at once.
//!
//! A backing file is made when first needed (an open, a truncate, times
//! set) with the inode's times, and removed when the inode's data is
//! freed (unlinked and closed).

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::time::{SystemTime, UNIX_EPOCH};

use super::{err, Attr, Errno, Fs, Ino, Kind, Result, SetTime, Whence};
use crate::hot::HotTier;

pub(super) fn ioerr(e: io::Error) -> Errno {
    Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO))
}

fn time_of(secs: i64, nsec: i64) -> SystemTime {
    // The kernel's own times are always in range.
    super::join_time(secs, nsec.clamp(0, 999_999_999) as u32).unwrap_or(UNIX_EPOCH)
}

fn timespec_of(t: Option<SetTime>) -> libc::timespec {
    match t {
        None => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
        Some(SetTime::Now) => libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_NOW,
        },
        Some(SetTime::At(t)) => {
            let (tv_sec, nsec) = super::split_time(t);
            libc::timespec {
                tv_sec,
                tv_nsec: nsec.into(),
            }
        }
    }
}

pub(super) fn futimens(f: &File, atime: Option<SetTime>, mtime: Option<SetTime>) -> Result<()> {
    let ts = [timespec_of(atime), timespec_of(mtime)];
    // SAFETY: futimens reads two timespecs from `ts`.
    if unsafe { libc::futimens(f.as_raw_fd(), ts.as_ptr()) } < 0 {
        return Err(ioerr(io::Error::last_os_error()));
    }
    Ok(())
}

/// Sets or clears FS_NOATIME_FL (chattr +A) on a backing file: a read
/// passed through moves the backing file's atime, which is the one a stat
/// shows, so the flag must be where the kernel reads it. The other flags
/// ramd keeps stay with the inode (ramd's own writes to a backing file,
/// at a load or a truncate, must not be refused).
pub(super) fn set_noatime(f: &File, on: bool) -> io::Result<()> {
    let mut flags: libc::c_int = 0;
    // SAFETY: FS_IOC_GETFLAGS writes one int to `flags`.
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let noatime = super::FL_NOATIME as libc::c_int;
    let want = if on {
        flags | noatime
    } else {
        flags & !noatime
    };
    if want == flags {
        return Ok(());
    }
    // SAFETY: FS_IOC_SETFLAGS reads one int from `want`.
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &want) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// A new backing file takes its inode's atime, mtime and noatime flag.
pub(super) fn init_backing(
    f: &File,
    atime: SystemTime,
    mtime: SystemTime,
    flags: u32,
) -> Result<()> {
    futimens(f, Some(SetTime::At(atime)), Some(SetTime::At(mtime)))?;
    if flags & super::FL_NOATIME != 0 {
        set_noatime(f, true).map_err(ioerr)?;
    }
    Ok(())
}

/// fallocate(2) on a backing file.
pub(super) fn fallocate(f: &File, mode: i32, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: fallocate on an fd we own; no memory is passed.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as i64, len as i64) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The next data extent at or after `from`: (its start, its end), or
/// `None` past the last.
pub(in crate::fs) fn next_data(f: &File, from: u64) -> io::Result<Option<(u64, u64)>> {
    // SAFETY: lseek on an fd we own.
    let data = unsafe { libc::lseek(f.as_raw_fd(), from as i64, libc::SEEK_DATA) };
    if data < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        };
    }
    // SAFETY: as above.
    let hole = unsafe { libc::lseek(f.as_raw_fd(), data, libc::SEEK_HOLE) };
    if hole < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(Some((data as u64, hole as u64)))
}

/// A save's reads are no client's: they must not move the file's atime
/// (the tree's, saved with it), or every save of a file open for writing
/// would find the tree changed and write a new save. The fd is the
/// save's own (`HotTier::open` opens anew), so the flag touches no
/// client's reads. If it cannot be set, the atime moves, nothing worse.
pub(in crate::fs) fn no_atime(f: &File) {
    // SAFETY: fcntl on an fd we own; F_GETFL and F_SETFL take ints.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        if fl >= 0 {
            libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl | libc::O_NOATIME);
        }
    }
}

/// Reads until `buf` is full or the file ends; returns how much was read.
pub(in crate::fs) fn read_full(f: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match f.read_at(&mut buf[got..], at + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

impl Fs {
    /// Puts regular files' data in `tier` from now on (`--data-path
    /// kernel`). Only for a filesystem without regular files yet (a new
    /// one): EBUSY otherwise, or if it has a tier already.
    pub fn set_hot_tier(&self, tier: HotTier) -> Result<()> {
        let st = self.state.read();
        if st.inodes.values().any(|i| i.kind == Kind::File) {
            return err(Errno::from_raw(libc::EBUSY));
        }
        self.hot.set(tier).map_err(|_| Errno::from_raw(libc::EBUSY))
    }

    /// The hot tier, with `--data-path kernel`.
    pub fn hot_tier(&self) -> Option<&HotTier> {
        self.hot.get()
    }

    /// The largest file size: the store's 1 TiB per file, which an image
    /// also holds; with a hot tier and no image, tmpfs's own limit (the
    /// kernel's, 2^63 - 1), which passed-through writes have anyway.
    pub(super) fn max_file_size(&self) -> u64 {
        if self.hot.get().is_some() && !self.saves.imaged() {
            i64::MAX as u64
        } else {
            super::MAX_FILE_SIZE
        }
    }

    /// `ino`'s data may differ from the image's from now on (a save reads
    /// it again). Only with a hot tier and an image: without one no save
    /// reads the marks, and every file ever written would stay marked.
    pub(super) fn hot_changed(&self, ino: Ino) {
        if self.hot.get().is_some() && self.saves.imaged() {
            self.saves.mark(ino);
        }
    }

    /// Size, blocks and times of a regular file from its backing file:
    /// the kernel changed them without telling us. ctime is the later of
    /// ours (chmod, chown, xattrs move only ours) and the backing file's.
    /// The caller holds the state lock, in which `i` is inode `ino`.
    pub(super) fn hot_attr(&self, i: &super::Inode, ino: Ino) -> Attr {
        let mut a = i.attr(ino);
        let cold_blocks = i.cold.cold_blocks();
        let Some(hot) = self.hot.get() else {
            return a;
        };
        if a.kind != Kind::File {
            return a;
        }
        if let Some(blocks) = cold_blocks {
            // Cold: the inode holds what the backing file showed.
            a.blocks = blocks;
            return a;
        }
        match hot.stat(a.ino) {
            Ok(Some(st)) => {
                a.size = st.st_size as u64;
                a.blocks = st.st_blocks as u64;
                a.atime = time_of(st.st_atime, st.st_atime_nsec);
                a.mtime = time_of(st.st_mtime, st.st_mtime_nsec);
                // A write sets the backing file's mtime and ctime to one
                // value; a ctime alone moved only by our making the file
                // (the first open, a load) or setting its times says
                // nothing ours does not.
                if (st.st_ctime, st.st_ctime_nsec) == (st.st_mtime, st.st_mtime_nsec) {
                    a.ctime = a.ctime.max(time_of(st.st_ctime, st.st_ctime_nsec));
                }
            }
            Ok(None) => {}
            Err(e) => log::warn!("stat of inode {}'s backing file: {e}", a.ino),
        }
        a
    }

    /// `ino`'s backing file, made now (with the inode's atime, mtime and
    /// noatime flag) if it has none yet. The caller holds no state lock,
    /// or passes them itself (`made_with`).
    pub(super) fn backing_with(
        &self,
        ino: Ino,
        made_with: Option<(SystemTime, SystemTime, u32)>,
    ) -> Result<File> {
        let hot = self.hot.get().ok_or(Errno::EINVAL)?;
        if let Some(f) = hot.open(ino, false).map_err(ioerr)? {
            return Ok(f);
        }
        let (atime, mtime, flags) = match made_with {
            Some(t) => t,
            None => {
                let st = self.state.read();
                let i = st.get(ino)?;
                (i.atime, i.mtime, i.flags)
            }
        };
        let f = hot.open(ino, true).map_err(ioerr)?.ok_or(Errno::EIO)?;
        init_backing(&f, atime, mtime, flags)?;
        Ok(f)
    }

    /// The backing file to register for an open of regular file `ino`
    /// (FOPEN_PASSTHROUGH).
    pub fn backing_file(&self, ino: Ino) -> Result<File> {
        self.backing_with(ino, None)
    }

    /// As [`Fs::backing_file`], for the open of a CREATE: the inode is new,
    /// so its backing file is made without first looking for one.
    pub fn new_backing_file(&self, ino: Ino) -> Result<File> {
        let hot = self.hot.get().ok_or(Errno::EINVAL)?;
        let f = match hot.create_new(ino) {
            Ok(f) => f,
            // Not new after all: take it as any open would.
            Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
                return self.backing_with(ino, None)
            }
            Err(e) => return Err(ioerr(e)),
        };
        let (atime, mtime, flags) = {
            let st = self.state.read();
            let i = st.get(ino)?;
            (i.atime, i.mtime, i.flags)
        };
        init_backing(&f, atime, mtime, flags)?;
        Ok(f)
    }

    /// SETATTR's size and times of a regular file, on its backing file.
    /// The caller holds the state lock: `made_with` are the inode's atime,
    /// mtime and flags.
    pub(super) fn hot_setattr(
        &self,
        ino: Ino,
        made_with: (SystemTime, SystemTime, u32),
        size: Option<u64>,
        atime: Option<SetTime>,
        mtime: Option<SetTime>,
    ) -> Result<()> {
        if size.is_none() && atime.is_none() && mtime.is_none() {
            return Ok(());
        }
        if size.is_none() {
            // Times alone (tar's futimens of every file it writes): by
            // name, one syscall where opening the file would take three.
            let hot = self.hot.get().ok_or(Errno::EINVAL)?;
            let ts = [timespec_of(atime), timespec_of(mtime)];
            if hot.set_times(ino, &ts).map_err(ioerr)? {
                return Ok(());
            }
        }
        let f = self.backing_with(ino, Some(made_with))?;
        if let Some(size) = size {
            self.hot_changed(ino);
            f.set_len(size).map_err(ioerr)?;
        }
        if atime.is_some() || mtime.is_some() {
            futimens(&f, atime, mtime)?;
        }
        Ok(())
    }

    /// chattr +A/-A of regular file `ino`, on its backing file if it has
    /// one (one made later takes the flag then).
    pub(super) fn hot_noatime(&self, ino: Ino, on: bool) -> Result<()> {
        let Some(hot) = self.hot.get() else {
            return Ok(());
        };
        match hot.open(ino, false).map_err(ioerr)? {
            Some(f) => set_noatime(&f, on).map_err(ioerr),
            None => Ok(()),
        }
    }

    pub(super) fn hot_fallocate(&self, ino: Ino, off: u64, len: u64, mode: i32) -> Result<()> {
        let f = self.backing_with(ino, None)?;
        self.hot_changed(ino);
        fallocate(&f, mode, off, len).map_err(ioerr)
    }

    pub(super) fn hot_seek(&self, ino: Ino, off: u64, whence: Whence) -> Result<u64> {
        let Some(f) = self
            .hot
            .get()
            .ok_or(Errno::EINVAL)?
            .open(ino, false)
            .map_err(ioerr)?
        else {
            // No backing file: empty, so every offset is past the end.
            return err(Errno::ENXIO);
        };
        let w = match whence {
            Whence::Data => libc::SEEK_DATA,
            Whence::Hole => libc::SEEK_HOLE,
        };
        // SAFETY: lseek on an fd we own.
        let r = unsafe { libc::lseek(f.as_raw_fd(), off as i64, w) };
        if r < 0 {
            return Err(ioerr(io::Error::last_os_error()));
        }
        Ok(r as u64)
    }

    /// copy_file_range between two backing files (the tmpfs copies).
    pub(super) fn hot_copy(
        &self,
        ino_in: Ino,
        off_in: u64,
        ino_out: Ino,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let fin = self.backing_with(ino_in, None)?;
        let fout = self.backing_with(ino_out, None)?;
        self.hot_changed(ino_out);
        let (mut oi, mut oo) = (off_in as i64, off_out as i64);
        // SAFETY: copy_file_range between fds we own, with offsets it
        // reads and advances in `oi` and `oo`.
        let r = unsafe {
            libc::copy_file_range(
                fin.as_raw_fd(),
                &mut oi,
                fout.as_raw_fd(),
                &mut oo,
                len as usize,
                0,
            )
        };
        if r < 0 {
            return Err(ioerr(io::Error::last_os_error()));
        }
        Ok(r as u64)
    }

    /// A READ that reached ramd anyway (every open is passed through, so
    /// none should): served from the backing file.
    pub(super) fn hot_read(&self, ino: Ino, off: u64, buf: &mut [u8]) -> Result<usize> {
        match self
            .hot
            .get()
            .ok_or(Errno::EINVAL)?
            .open(ino, false)
            .map_err(ioerr)?
        {
            Some(f) => f.read_at(buf, off).map_err(ioerr),
            None => Ok(0),
        }
    }

    /// A WRITE that reached ramd anyway (see [`Fs::hot_read`]).
    pub(super) fn hot_write(&self, ino: Ino, off: u64, data: &[u8]) -> Result<usize> {
        self.hot_changed(ino);
        self.backing_with(ino, None)?
            .write_at(data, off)
            .map_err(ioerr)
    }

    /// Frees a regular file's data (the caller holds the state lock).
    pub(super) fn hot_free(&self, ino: Ino) {
        if let Some(hot) = self.hot.get() {
            hot.remove(ino);
        }
    }

    /// (used, total) 4 KiB pages of file data: the store's, or with a hot
    /// tier the tmpfs's own count (what the host sees it hold) plus what
    /// cold files held there.
    pub fn pages_used(&self) -> (u64, u64) {
        match self.hot.get().map(|h| h.blocks()) {
            Some(Ok((total, free))) => {
                // Cold files count where they would be hot: the tmpfs is
                // that much smaller (see `fs/cold.rs`).
                let cold = self.cold_pages();
                (total.saturating_sub(free) + cold, total + cold)
            }
            Some(Err(e)) => {
                log::warn!("statfs of the hot tier: {e}");
                (0, 0)
            }
            None => self.store.pages_used(),
        }
    }
}
