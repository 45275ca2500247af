//! FUSE_PASSTHROUGH: regular files opened on their backing files in the
//! hot tier, with one backing id per inode while it is open; and the open
//! flags that say how an open uses the kernel's page cache.

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::OnceLock;

use super::{FuseFs, TTL};
use crate::fs::{Attr, Errno, Fs, Ino, Kind, OpenCache};
use crate::ll::abi;

/// The backing ids of open regular files. The kernel refuses a
/// passthrough open that names another backing file than the inode's
/// open ones already use (`fuse_inode_uncached_io_start`: EBUSY), so an
/// inode keeps one id while any open of it exists: registered at its
/// first open, closed at its last release.
#[derive(Default)]
pub(super) struct Backings {
    /// The mount's /dev/fuse fd, once mounted.
    dev: OnceLock<Arc<std::os::fd::OwnedFd>>,
    /// INIT granted FUSE_PASSTHROUGH.
    pub(super) granted: AtomicBool,
    /// Inode → its backing id and the opens answered with it.
    ids: Mutex<std::collections::HashMap<Ino, Backed>>,
}

/// A regular file's backing id and its opens (see [`Backings`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Backed {
    id: i32,
    /// Opens answered with `id`, not yet released.
    opens: u32,
    /// Of those, opened O_RDWR: only such an open can map the file shared
    /// and writable, and so change its blocks and times without a request
    /// here (mmap of an O_WRONLY fd is refused, and an O_RDONLY one cannot
    /// be made writable).
    read_write: u32,
}

/// Whether an open with these flags could map the file shared and writable.
pub(super) fn read_write(flags: u32) -> bool {
    flags as i32 & libc::O_ACCMODE == libc::O_RDWR
}

/// Page cache kept across opens (every change goes through this mount),
/// dropped or not used at all as `Fs` says (`fs/cache.rs`).
pub(super) fn open_flags(fs: &Fs, ino: Ino) -> u32 {
    match fs.open_cache(ino) {
        OpenCache::Keep => abi::FOPEN_KEEP_CACHE,
        OpenCache::Drop => 0,
        OpenCache::Direct => abi::FOPEN_DIRECT_IO,
    }
}

impl FuseFs {
    /// Where [`crate::mount`] puts the mount's /dev/fuse fd.
    pub(crate) fn set_dev(&self, fd: Arc<std::os::fd::OwnedFd>) {
        let _ = self.backings.dev.set(fd);
    }

    /// Whether INIT granted FUSE_PASSTHROUGH.
    pub fn passthrough(&self) -> bool {
        self.backings.granted.load(Relaxed)
    }

    /// The open flags and backing id for an open of `ino` just counted in
    /// `Fs`: with passthrough, a regular file's backing file (registered
    /// at its first open, see [`Backings`]); otherwise the page-cache mode
    /// `Fs` says, no backing.
    /// `created`: the open of a CREATE, whose inode has no backing file yet.
    pub(super) fn open_reply(
        &self,
        ino: Ino,
        flags: u32,
        created: bool,
    ) -> std::result::Result<(u32, i32), Errno> {
        if !self.passthrough() || self.fs.hot_tier().is_none() {
            return Ok((open_flags(&self.fs, ino), 0));
        }
        let rw = u32::from(read_write(flags));
        let mut ids = self.backings.ids.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = ids.get_mut(&ino) {
            b.opens += 1;
            b.read_write += rw;
            return Ok((abi::FOPEN_PASSTHROUGH, b.id));
        }
        let dev = self.backings.dev.get().ok_or(Errno::EIO)?;
        let file = if created {
            self.fs.new_backing_file(ino)
        } else {
            self.fs.backing_file(ino)
        };
        let file = file?;
        let id = backing_open(dev, &file).map_err(|e| {
            log::warn!("registering inode {ino}'s backing file: {e}");
            e.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
        })?;
        // The kernel holds its own reference: ours may go now.
        drop(file);
        ids.insert(
            ino,
            Backed {
                id,
                opens: 1,
                read_write: rw,
            },
        );
        Ok((abi::FOPEN_PASSTHROUGH, id))
    }

    /// A RELEASE of `ino` by an open with `flags`: its last drops the
    /// backing id.
    pub(super) fn released(&self, ino: Ino, flags: u32) {
        if !self.passthrough() {
            return;
        }
        let mut ids = self.backings.ids.lock().unwrap_or_else(|p| p.into_inner());
        let Some(b) = ids.get_mut(&ino) else {
            return;
        };
        b.opens -= 1;
        if read_write(flags) {
            b.read_write = b.read_write.saturating_sub(1);
        }
        if b.opens > 0 {
            return;
        }
        let id = b.id;
        ids.remove(&ino);
        if let Some(dev) = self.backings.dev.get() {
            if let Err(e) = backing_close(dev, id) {
                log::warn!("closing backing id {id} of inode {ino}: {e}");
            }
        }
    }

    /// How long the kernel may keep an inode's attributes. A regular
    /// file's on the hot tier (`--data-path kernel`) not at all while an
    /// open of it could map it shared and writable (O_RDWR): a write
    /// through such a mapping changes the backing file's blocks and times
    /// without a request here. Other opens change nothing behind ramd's
    /// back that the kernel keeps: after a passed-through write it drops
    /// what it knows of size and times itself, after a read its atime.
    /// What the kernel cached before an O_RDWR open goes at the open's
    /// first read, write or mmap (each drops the kernel's atime, and a
    /// stat then asks for everything). Keeping the attributes of an
    /// O_WRONLY open (an untar's, a compiler's) saves the GETATTR that
    /// the permission check of the open itself would send.
    pub(super) fn attr_ttl(&self, a: &Attr) -> u64 {
        if a.kind != Kind::File || self.fs.hot_tier().is_none() {
            return TTL;
        }
        let ids = self.backings.ids.lock().unwrap_or_else(|p| p.into_inner());
        match ids.get(&a.ino) {
            Some(b) if b.read_write > 0 => 0,
            _ => TTL,
        }
    }
}

/// FUSE_DEV_IOC_BACKING_OPEN: registers `file` as a backing file on the
/// connection of `dev`; its backing id. Needs CAP_SYS_ADMIN, and a
/// regular file on a filesystem stacked less deep than the
/// `max_stack_depth` given at INIT (`fuse_backing_open`).
pub(super) fn backing_open(
    dev: &std::os::fd::OwnedFd,
    file: &std::fs::File,
) -> std::io::Result<i32> {
    use std::os::fd::AsRawFd;
    // struct fuse_backing_map: fd, flags, padding.
    #[repr(C)]
    struct BackingMap {
        fd: i32,
        flags: u32,
        padding: u64,
    }
    let map = BackingMap {
        fd: file.as_raw_fd(),
        flags: 0,
        padding: 0,
    };
    // SAFETY: the ioctl reads one fuse_backing_map (16 bytes, as
    // `BackingMap` is laid out) from the pointer.
    let r = unsafe { libc::ioctl(dev.as_raw_fd(), abi::FUSE_DEV_IOC_BACKING_OPEN, &map) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}

/// FUSE_DEV_IOC_BACKING_CLOSE: drops backing id `id`.
pub(super) fn backing_close(dev: &std::os::fd::OwnedFd, id: i32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let id = id as u32;
    // SAFETY: the ioctl reads one u32 from the pointer.
    let r = unsafe { libc::ioctl(dev.as_raw_fd(), abi::FUSE_DEV_IOC_BACKING_CLOSE, &id) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
