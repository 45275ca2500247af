//! Whether an open file uses the kernel's page cache, so that a full disk
//! is still reported by write(2).
//!
//! With FUSE's write-back cache a write(2) lands in the kernel's page cache
//! and reaches [`Fs::write`] later; if the disk is full by then, the error
//! can only be reported by fsync(2) or close(2). The daemon caps the
//! kernel's dirty pages for this mount (the bdi's `max_bytes`) and sets a
//! *write reserve* above that cap ([`Fs::set_write_reserve`]). A file whose
//! opens begin while more than the reserve is free is cached: everything
//! the kernel may hold back for it fits in the reserve. A file whose opens
//! begin once free space is at or under the reserve is opened uncached
//! (FOPEN_DIRECT_IO): each write(2) is sent here at once and gets ENOSPC
//! itself. A file keeps its mode while any open of it lasts, so cached and
//! uncached opens of one file never mix (the kernel keeps no page-cache
//! coherence between the two); when an uncached period ends, the next
//! cached open drops the pages cached before it.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use ramd_store::{Store, PAGE_SIZE};

use super::{err, Errno, Fs, Ino, Inode, Result};

/// How an open of a file uses the kernel's page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenCache {
    /// Cached, and pages cached by earlier opens are still right.
    Keep,
    /// Cached, but the pages cached before must be dropped (the file was
    /// written uncached since, or a read must reach `Fs` to move atime).
    Drop,
    /// Uncached: every read and write is sent to `Fs`.
    Direct,
}

/// How often [`Fs::room`] rereads the host guard's room.
pub const HOST_SAMPLE: std::time::Duration = std::time::Duration::from_millis(100);

/// The host guard's room as last read, and when.
#[derive(Debug)]
pub(crate) struct HostSample {
    origin: std::time::Instant,
    /// Milliseconds after `origin` of the last reading (0: none yet).
    at_ms: AtomicU64,
    room: AtomicU64,
}

impl Default for HostSample {
    fn default() -> Self {
        HostSample {
            origin: std::time::Instant::now(),
            at_ms: AtomicU64::new(0),
            room: AtomicU64::new(u64::MAX),
        }
    }
}

impl HostSample {
    fn room(&self, store: &Store) -> u64 {
        // +1: a reading at `origin` is still a reading.
        let now = self.origin.elapsed().as_millis() as u64 + 1;
        let at = self.at_ms.load(Relaxed);
        if at == 0 || now.saturating_sub(at) >= HOST_SAMPLE.as_millis() as u64 {
            let room = store.host_room().unwrap_or(u64::MAX);
            self.room.store(room, Relaxed);
            self.at_ms.store(now, Relaxed);
            return room;
        }
        self.room.load(Relaxed)
    }
}

/// Per inode: the mode its current opens share.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct InodeCache {
    /// Its opens are uncached.
    direct: bool,
    /// It was opened uncached since it was last opened cached.
    stale: bool,
    /// A write-back of it failed with ENOSPC, and the reserve has not been
    /// free since.
    pub(super) full: bool,
}

impl Fs {
    /// Files opened while no more than `bytes` are free are opened
    /// uncached (0: never; `u64::MAX`: always).
    pub fn set_write_reserve(&self, bytes: u64) {
        self.write_reserve.store(bytes, Relaxed);
    }

    pub fn write_reserve(&self) -> u64 {
        self.write_reserve.load(Relaxed)
    }

    /// Bytes that writes of new data may still take: the tighter of the
    /// page cap (`size`) and the memory budget (`max_memory`, the daemon's
    /// shared budget, the host guard). Compression is not counted on: a
    /// written page is stored raw until the scanner packs it. The host
    /// guard's figure is sampled at most every [`HOST_SAMPLE`] (reading
    /// /proc/meminfo on every open would cost about as much as the open);
    /// other programs move it anyway, so it is a best effort.
    pub fn room(&self) -> u64 {
        let (used, limit) = self.store.pages_used();
        let pages = limit.saturating_sub(used).saturating_mul(PAGE_SIZE as u64);
        let room = pages.min(self.store.budget_room());
        room.min(self.host_sample.room(&self.store))
    }

    /// Counts an open of `inode`; the first of a run of opens picks the
    /// mode they all share.
    pub(super) fn opened(&self, inode: &mut Inode) {
        if inode.opens == 0 {
            let reserve = self.write_reserve();
            let direct = reserve > 0 && self.room() <= reserve;
            let c = &mut inode.cache;
            c.stale |= c.direct && !direct;
            c.direct = direct;
        }
        inode.opens += 1;
    }

    /// How the open of `ino` just counted ([`Fs::open`], [`Fs::create`])
    /// uses the page cache.
    pub fn open_cache(&self, ino: Ino) -> OpenCache {
        // A read served from the cache never reaches `Fs`, so when a read
        // now would move atime the first read must come here (relatime:
        // once after each change; strictatime: once per open).
        let atime = self.read_moves_atime(ino);
        let mut st = self.state.write();
        let Ok(i) = st.get_mut(ino) else {
            return OpenCache::Drop;
        };
        if i.cache.direct {
            return OpenCache::Direct;
        }
        if std::mem::take(&mut i.cache.stale) || atime {
            OpenCache::Drop
        } else {
            OpenCache::Keep
        }
    }

    /// Whether the kernel may take another write(2) of `ino` into its
    /// cache: asked as it refreshes the attributes of a file open for
    /// writing (GETATTR with a file handle), which it does before a cached
    /// write once they were invalidated. ENOSPC after a write-back of the
    /// file failed for lack of space, until the write reserve (or 1 MiB,
    /// a whole write-back request) is free again.
    pub fn write_allowed(&self, ino: Ino) -> Result<()> {
        let mut st = self.state.write();
        let Ok(i) = st.get_mut(ino) else {
            return Ok(());
        };
        if !i.cache.full {
            return Ok(());
        }
        if self.room() <= self.write_reserve().clamp(1 << 20, u64::MAX - 1) {
            return err(Errno::ENOSPC);
        }
        i.cache.full = false;
        Ok(())
    }
}
