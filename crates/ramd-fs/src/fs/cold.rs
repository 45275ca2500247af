//! The cold tier of `--data-path kernel` with `--compress`: a regular file
//! that nobody holds open (no open, so no mapping either: a mapping holds
//! its open) and that nothing has touched through ramd for
//! `--compress-after` moves from its backing file in the hot tier into a
//! page store of its own (compressed and packed as the store path's
//! pages are, at the same per-file keys: slot `n`'s page `i` at store byte
//! `(n << FILE_SHIFT) + i * 4096`), and its backing file is removed, so
//! the tmpfs frees its pages. Anything that needs the backing file again
//! (an open, a truncate, fallocate, lseek, copy_file_range, a read or
//! write that reached ramd) takes a [`Pin`] first, which moves it back.
//!
//! A file is in one of three states (`Tier`), changed only under the state
//! lock:
//! - **Hot**: its data is its backing file (or it has none yet);
//! - **MovingOut**: the mover is copying the backing file into the store.
//!   The backing file stays whole and in charge: a pin taken now simply
//!   sets the file Hot again, and the mover, which checks under the lock
//!   before it commits, throws its copy away;
//! - **Cold**: its data is in the store only; the inode holds its size,
//!   blocks and times as the backing file had them, so a stat is exact.
//!   A pin copies the data into a fresh backing file (one move-in per inode
//!   at a time), sets it Hot, then frees the store's copy — unless a save
//!   is reading it (see `saves.rs`), which frees it when done.
//!
//! The mover is one thread per filesystem. Files come to it through a
//! queue of (when touched, inode), pushed as a file is closed or let go by
//! a pin; an entry is stale if the inode was touched since.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use ramd_store::{ExtentKind, Store};

use super::kernel::{fallocate, init_backing, ioerr, next_data, no_atime, read_full};
use super::{base, round_up, Data, Errno, Fs, Ino, Kind, Result};

/// What one copy step reads or writes at once.
const STEP: usize = 1 << 20;

/// Where an inode's data is (see the module's comment).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Tier {
    #[default]
    Hot,
    MovingOut,
    /// `blocks`: the backing file's st_blocks when it moved.
    Cold {
        blocks: u64,
    },
}

/// An inode's share of the cold tier's bookkeeping.
#[derive(Debug, Default)]
pub(super) struct ColdState {
    pub(super) tier: Tier,
    /// Calls under way that need the backing file: no move out while any.
    pins: u32,
    /// When the file was last closed or let go by a pin: the queue entry
    /// that names this time is the live one.
    touched: Option<Instant>,
}

impl ColdState {
    pub(super) fn is_cold(&self) -> bool {
        matches!(self.tier, Tier::Cold { .. })
    }

    /// st_blocks while cold.
    pub(super) fn cold_blocks(&self) -> Option<u64> {
        match self.tier {
            Tier::Cold { blocks } => Some(blocks),
            _ => None,
        }
    }
}

/// The cold tier of one filesystem.
pub struct ColdTier {
    store: Arc<Store>,
    mover: Arc<Mover>,
    /// Move-ins of one inode go one at a time (striped by inode number).
    thaw: [Mutex<()>; 64],
    /// Files cold now.
    files: AtomicU64,
    /// The 4 KiB blocks they held in the tmpfs: the tmpfs is that much
    /// smaller than the disk's size, so that hot and cold together stay
    /// within it and every cold file has room to come back.
    pages: Mutex<u64>,
    /// Moves each way since the start, and failed moves out.
    moved_out: AtomicU64,
    moved_in: AtomicU64,
    failed: AtomicU64,
    cancelled: AtomicU64,
}

/// What the mover thread shares with the filesystem.
#[derive(Default)]
struct Mover {
    queue: Mutex<Queue>,
    wake: Condvar,
}

#[derive(Default)]
struct Queue {
    idle: VecDeque<(Instant, Ino)>,
    stop: bool,
}

impl Drop for ColdTier {
    fn drop(&mut self) {
        self.mover.queue.lock().stop = true;
        self.mover.wake.notify_all();
    }
}

/// The cold tier's counters, for `ramd status`.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct ColdStats {
    /// Files whose data is in the cold tier now.
    pub files: u64,
    /// What their pages hold (data pages, uncompressed).
    pub data_bytes: u64,
    /// What the cold tier's store takes for them: compressed objects,
    /// allocator slack and page tables.
    pub memory_bytes: u64,
    pub moved_out: u64,
    pub moved_in: u64,
    /// Moves out that failed (the file stayed hot), e.g. the store full.
    pub failed: u64,
    /// Moves out given up because the file was opened (or needed) meanwhile.
    pub cancelled: u64,
}

/// A call's hold on a regular file's backing file: taken, the file is hot
/// (moved back if it was cold) and stays so until the pin goes.
pub(super) struct Pin<'a> {
    fs: &'a Fs,
    ino: Option<Ino>,
}

impl Drop for Pin<'_> {
    fn drop(&mut self) {
        let Some(ino) = self.ino else {
            return;
        };
        let mut st = self.fs.state.write();
        if let Ok(i) = st.get_mut(ino) {
            i.cold.pins -= 1;
            if i.cold.pins == 0 && i.opens == 0 {
                self.fs.went_idle(ino, &mut i.cold);
            }
        }
    }
}

/// 512-byte blocks to 4 KiB pages.
fn pages_of(blocks: u64) -> u64 {
    blocks.div_ceil(8)
}

/// A cold file's pages in the store, read as a file.
pub(super) struct ColdFile<'a> {
    pub(super) store: &'a Store,
    pub(super) base: u64,
    pub(super) size: u64,
}

impl ColdFile<'_> {
    /// The next run of pages holding data at or after `from` (page
    /// aligned): (its start, its end), or `None` past the last. Zero
    /// pages count as holes, as a save hashes them.
    pub(super) fn next_data(&self, from: u64) -> io::Result<Option<(u64, u64)>> {
        let mut pos = from;
        while pos < self.size {
            let len = (self.size - pos).min(1 << 30);
            let ext = self
                .store
                .extents(self.base + pos, len, 4096)
                .map_err(io::Error::other)?;
            let mut at = pos;
            let mut start = None;
            for e in ext {
                match (e.kind == ExtentKind::Data, start) {
                    (true, None) => start = Some(at),
                    (false, Some(s)) => return Ok(Some((s, at))),
                    _ => {}
                }
                at += e.length;
            }
            if let Some(s) = start {
                return Ok(Some((s, at)));
            }
            if at == pos {
                break;
            }
            pos = at;
        }
        Ok(None)
    }

    /// Reads until `buf` is full or the file ends; returns how much.
    pub(super) fn read(&self, buf: &mut [u8], at: u64) -> io::Result<usize> {
        let n = (self.size.saturating_sub(at)).min(buf.len() as u64) as usize;
        self.store
            .read(self.base + at, &mut buf[..n])
            .map_err(io::Error::other)?;
        Ok(n)
    }
}

impl Fs {
    /// Moves idle closed files into `store`, compressed, once untouched for
    /// `after` (`--data-path kernel --compress`). Needs the hot tier; starts
    /// the mover thread, which ends when the filesystem goes. Every
    /// regular file there is now counts as touched now.
    pub fn set_cold_tier(self: &Arc<Self>, store: Arc<Store>, after: Duration) -> Result<()> {
        if self.hot.get().is_none() {
            return Err(Errno::EINVAL);
        }
        let mover = Arc::new(Mover::default());
        let tier = ColdTier {
            store,
            mover: mover.clone(),
            thaw: std::array::from_fn(|_| Mutex::new(())),
            files: AtomicU64::new(0),
            pages: Mutex::new(0),
            moved_out: AtomicU64::new(0),
            moved_in: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
        };
        self.cold
            .set(tier)
            .map_err(|_| Errno::from_raw(libc::EBUSY))?;
        {
            let mut st = self.state.write();
            for (&ino, i) in st.inodes.iter_mut() {
                if i.kind == Kind::File && i.opens == 0 {
                    self.went_idle(ino, &mut i.cold);
                }
            }
        }
        let fs = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("ramd-cold".into())
            .spawn(move || run_mover(fs, mover, after))
            .map_err(ioerr)?;
        Ok(())
    }

    /// Resizes the tmpfs to the disk's size less what cold files hold
    /// (the caller holds the cold tier's `pages` lock, changed to `cold`).
    /// The tmpfs refuses a size below what it holds: then it stays larger
    /// until the next move, and says so.
    fn fit_hot(&self, size: Option<u64>, cold: u64, room: u64) -> io::Result<()> {
        let Some(size) = size else {
            return Ok(());
        };
        let hot = self.hot.get().expect("a cold tier needs the hot one");
        // tmpfs takes a size in bytes, rounded up to pages, and 0 would be
        // no limit: at least one page. That page, and a shrink the tmpfs
        // refused, may leave less room than a cold file needs to come
        // back: `room` bytes more than it holds are then allowed anyway.
        let want = size.saturating_sub(cold * 4096).max(4096);
        let want = match room {
            0 => want,
            r => want.max(hot.used_bytes() + r),
        };
        hot.resize(Some(want))
    }

    /// The tmpfs's size for a disk of `size` (a remount's new size).
    pub(super) fn resize_hot(&self, size: Option<u64>) -> io::Result<()> {
        let hot = self.hot.get().expect("only with a hot tier");
        match self.cold.get() {
            Some(c) => self.fit_hot(size, *c.pages.lock(), 0),
            None => hot.resize(size),
        }
    }

    /// 4 KiB pages the cold tier's files held in the tmpfs.
    pub(super) fn cold_pages(&self) -> u64 {
        self.cold.get().map_or(0, |c| *c.pages.lock())
    }

    /// `pages` more (or fewer) pages are cold: the tmpfs shrinks (or grows).
    fn count_cold(&self, more: bool, pages: u64) -> io::Result<()> {
        let cold = self.cold.get().expect("cold tier");
        let mut n = cold.pages.lock();
        *n = if more {
            *n + pages
        } else {
            n.saturating_sub(pages)
        };
        self.fit_hot(self.size(), *n, if more { 0 } else { pages * 4096 })
    }

    /// The cold tier's store, if there is one.
    pub fn cold_store(&self) -> Option<&Arc<Store>> {
        self.cold.get().map(|c| &c.store)
    }

    pub fn cold_stats(&self) -> Option<ColdStats> {
        let c = self.cold.get()?;
        let s = c.store.stats();
        Some(ColdStats {
            files: c.files.load(Relaxed),
            data_bytes: s.data_bytes,
            memory_bytes: s.memory_used,
            moved_out: c.moved_out.load(Relaxed),
            moved_in: c.moved_in.load(Relaxed),
            failed: c.failed.load(Relaxed),
            cancelled: c.cancelled.load(Relaxed),
        })
    }

    /// A closed file was let go: it may move out once `after` has passed.
    /// The caller holds the state lock (write).
    pub(super) fn went_idle(&self, ino: Ino, c: &mut ColdState) {
        let Some(cold) = self.cold.get() else {
            return;
        };
        if c.tier != Tier::Hot {
            return;
        }
        let now = Instant::now();
        c.touched = Some(now);
        // Lock order: state, then queue (the mover never holds the queue
        // while it takes the state).
        cold.mover.queue.lock().idle.push_back((now, ino));
        cold.mover.wake.notify_one();
    }

    /// Takes a pin on `ino` (see [`Pin`]): a regular file's backing file is
    /// there, and stays, until it goes. A no-op without a cold tier and
    /// for other kinds of inode. Fails if the file cannot be moved back
    /// (ENOSPC: the tmpfs is full); it then stays cold and whole.
    pub(super) fn hot_pin(&self, ino: Ino) -> Result<Pin<'_>> {
        let none = Pin {
            fs: self,
            ino: None,
        };
        if self.cold.get().is_none() {
            return Ok(none);
        }
        let cold = {
            let mut st = self.state.write();
            let i = st.get_mut(ino)?;
            if i.kind != Kind::File {
                return Ok(none);
            }
            i.cold.pins += 1;
            if i.cold.tier == Tier::MovingOut {
                // The mover's copy is thrown away (it checks before it
                // commits); the backing file was never touched.
                i.cold.tier = Tier::Hot;
            }
            i.cold.is_cold()
        };
        let pin = Pin {
            fs: self,
            ino: Some(ino),
        };
        if cold {
            self.thaw(ino)?;
        }
        Ok(pin)
    }

    /// Cancels a move out under way (the caller holds the state lock and is
    /// about to change the backing file itself).
    pub(super) fn cancel_move(c: &mut ColdState) {
        if c.tier == Tier::MovingOut {
            c.tier = Tier::Hot;
        }
    }

    /// Moves cold file `ino` back into a fresh backing file, then frees
    /// the store's copy. The caller holds a pin.
    fn thaw(&self, ino: Ino) -> Result<()> {
        let cold = self.cold.get().expect("a pin without a cold tier");
        let hot = self.hot.get().expect("a cold tier needs the hot one");
        let _one = cold.thaw[(ino.0 % 64) as usize].lock();
        let (slot, size, atime, mtime, flags, blocks) = {
            let st = self.state.read();
            let i = st.get(ino)?;
            let Some(blocks) = i.cold.cold_blocks() else {
                // Another pin moved it back while this one waited.
                return Ok(());
            };
            let Data::File { slot, .. } = i.data else {
                return Err(Errno::EIO);
            };
            (slot, i.size, i.atime, i.mtime, i.flags, blocks)
        };
        // Its room in the tmpfs comes back first.
        if let Err(e) = self.count_cold(false, pages_of(blocks)) {
            log::warn!("growing the tmpfs for inode {ino} back from the cold tier: {e}");
        }
        let src = ColdFile {
            store: &cold.store,
            base: base(slot),
            size,
        };
        // A backing file left from a move in that failed part way is stale.
        hot.remove(ino);
        let f = hot.open(ino, true).map_err(ioerr)?.ok_or(Errno::EIO)?;
        let copied = copy_in(&src, &f).and_then(|()| {
            f.set_len(size)?;
            // Its times, and chattr +A, which the new file must carry.
            init_backing(&f, atime, mtime, flags).map_err(|e| io::Error::from_raw_os_error(e.get()))
        });
        if let Err(e) = copied {
            hot.remove(ino);
            log::warn!("moving inode {ino} back from the cold tier: {e}");
            if let Err(e) = self.count_cold(true, pages_of(blocks)) {
                log::debug!("shrinking the tmpfs again: {e}");
            }
            return Err(ioerr(e));
        }
        let free_now = {
            let mut st = self.state.write();
            let i = st.get_mut(ino)?;
            if !i.cold.is_cold() {
                // Unlinked and closed meanwhile (`cold_free`): its data is
                // gone, and so goes what was copied.
                drop(st);
                hot.remove(ino);
                if let Err(e) = self.count_cold(true, pages_of(blocks)) {
                    log::debug!("shrinking the tmpfs again: {e}");
                }
                return Ok(());
            }
            i.cold.tier = Tier::Hot;
            cold.files.fetch_sub(1, Relaxed);
            cold.moved_in.fetch_add(1, Relaxed);
            // Under the state lock, so that no save switches in between.
            !self.saves.hold_cold(slot, size)
        };
        if free_now {
            self.cold_punch(slot, size);
        }
        Ok(())
    }

    /// Frees slot `slot`'s pages in the cold store (`size` bytes' worth).
    pub(super) fn cold_punch(&self, slot: u64, size: u64) {
        let Some(cold) = self.cold.get() else {
            return;
        };
        let len = round_up(size);
        if len == 0 {
            return;
        }
        if let Err(e) = cold.store.change().zero(base(slot), len, true) {
            // Punching needs no memory: this is a bug, not a full disk.
            log::error!("freeing file slot {slot}'s pages in the cold tier: {e}");
        }
    }

    /// A cold file's data goes with it (unlinked and closed); the caller
    /// holds the state lock. A move out under way is cancelled (the mover
    /// frees its copy).
    pub(super) fn cold_free(&self, c: &mut ColdState, slot: u64, size: u64) {
        Fs::cancel_move(c);
        if let Some(blocks) = c.cold_blocks() {
            c.tier = Tier::Hot;
            if let Err(e) = self.count_cold(false, pages_of(blocks)) {
                log::warn!("growing the tmpfs after a cold file went: {e}");
            }
            if let Some(cold) = self.cold.get() {
                cold.files.fetch_sub(1, Relaxed);
            }
            if !self.saves.hold_cold(slot, size) {
                self.cold_punch(slot, size);
            }
        }
    }

    /// One queued file, touched at `t`: moves it out if it is still idle
    /// since then, closed and hot.
    fn move_out(&self, ino: Ino, t: Instant) {
        let cold = self.cold.get().expect("the mover runs with a cold tier");
        let hot = self.hot.get().expect("a cold tier needs the hot one");
        let slot = {
            let mut st = self.state.write();
            let Ok(i) = st.get_mut(ino) else {
                return;
            };
            if i.kind != Kind::File
                || i.opens > 0
                || i.nlink == 0
                || i.cold.pins > 0
                || i.cold.tier != Tier::Hot
                || i.cold.touched != Some(t)
            {
                return;
            }
            let Data::File { slot, .. } = i.data else {
                return;
            };
            if self.saves.cold_held(slot) {
                // A save still reads the slot's last cold copy: later.
                self.went_idle(ino, &mut i.cold);
                return;
            }
            i.cold.tier = Tier::MovingOut;
            slot
        };
        // End of what the copy wrote: freed again if the move does not
        // happen.
        let mut written = 0;
        let copied = self.copy_out(ino, slot, &mut written);
        let cancelled = |r: &io::Result<_>| {
            r.as_ref()
                .is_err_and(|e| e.raw_os_error() == Some(libc::ECANCELED))
        };
        let mut st = self.state.write();
        let moved = match (st.get_mut(ino), &copied) {
            (Ok(i), Ok(Some(before)))
                if i.cold.tier == Tier::MovingOut && i.opens == 0 && i.cold.pins == 0 =>
            {
                // Nothing changed the file while it was copied (nothing
                // could without a pin, which would have cancelled).
                match hot.stat(ino) {
                    Ok(Some(now)) if same_file(before, &now) => {
                        let a = self.hot_attr(i, ino);
                        i.size = a.size;
                        i.atime = a.atime;
                        i.mtime = a.mtime;
                        i.ctime = a.ctime;
                        i.cold.tier = Tier::Cold { blocks: a.blocks };
                        hot.remove(ino);
                        cold.files.fetch_add(1, Relaxed);
                        cold.moved_out.fetch_add(1, Relaxed);
                        true
                    }
                    _ => {
                        i.cold.tier = Tier::Hot;
                        false
                    }
                }
            }
            (Ok(i), _) => {
                Fs::cancel_move(&mut i.cold);
                // A failure is tried again after another `after` (a
                // cancelled move's file is queued again when let go).
                if copied.is_err() && !cancelled(&copied) && i.opens == 0 && i.cold.pins == 0 {
                    self.went_idle(ino, &mut i.cold);
                }
                false
            }
            (Err(_), _) => false,
        };
        drop(st);
        if moved {
            let blocks = copied
                .as_ref()
                .map_or(0, |b| b.map_or(0, |b| b.st_blocks as u64));
            if let Err(e) = self.count_cold(true, pages_of(blocks)) {
                // New writes took the room meanwhile: the next move tries again.
                log::debug!("shrinking the tmpfs by inode {ino}'s pages: {e}");
            }
        }
        if !moved {
            self.cold_punch(slot, written);
        }
        match &copied {
            Err(e) if !cancelled(&copied) => {
                cold.failed.fetch_add(1, Relaxed);
                log::warn!("moving inode {ino} to the cold tier: {e} (it stays in the tmpfs)");
            }
            _ if !moved => {
                cold.cancelled.fetch_add(1, Relaxed);
            }
            _ => {}
        }
    }

    /// Copies `ino`'s backing file into the cold store at `slot`; returns
    /// its stat from before the copy, `None` if it has no backing file
    /// (nothing to move). Stops (Err ECANCELED) once the move is cancelled.
    /// `written`: the end of what it wrote, even when it fails.
    fn copy_out(&self, ino: Ino, slot: u64, written: &mut u64) -> io::Result<Option<libc::stat>> {
        let cold = self.cold.get().expect("cold tier");
        let hot = self.hot.get().expect("hot tier");
        let Some(f) = hot.open(ino, false)? else {
            return Ok(None);
        };
        // The mover's reads are no client's: atime stays.
        no_atime(&f);
        let Some(before) = hot.stat(ino)? else {
            return Ok(None);
        };
        let size = before.st_size as u64;
        let mut buf = vec![0u8; STEP];
        let mut at = 0;
        while at < size {
            let Some((data, hole)) = next_data(&f, at)? else {
                break;
            };
            let end = hole.min(size);
            let mut pos = data;
            while pos < end {
                let cancelled = self
                    .state
                    .read()
                    .get(ino)
                    .map_or(true, |i| i.cold.tier != Tier::MovingOut);
                if cancelled {
                    return Err(io::Error::from_raw_os_error(libc::ECANCELED));
                }
                let n = ((end - pos) as usize).min(STEP);
                let got = read_full(&f, &mut buf[..n], pos)?;
                if got == 0 {
                    break;
                }
                *written = pos + got as u64;
                cold.store
                    .change()
                    .write(base(slot) + pos, &buf[..got])
                    .map_err(|e| io::Error::from_raw_os_error(e.errno().get()))?;
                pos += got as u64;
            }
            at = end.max(data + 1);
        }
        Ok(Some(before))
    }
}

/// Whether two stats of a backing file show the same data.
fn same_file(a: &libc::stat, b: &libc::stat) -> bool {
    (
        a.st_size,
        a.st_blocks,
        a.st_mtime,
        a.st_mtime_nsec,
        a.st_ctime,
        a.st_ctime_nsec,
    ) == (
        b.st_size,
        b.st_blocks,
        b.st_mtime,
        b.st_mtime_nsec,
        b.st_ctime,
        b.st_ctime_nsec,
    )
}

/// Copies a cold file's pages into `f`: data written, zero pages
/// allocated, holes left.
fn copy_in(src: &ColdFile<'_>, f: &File) -> io::Result<()> {
    let mut buf = vec![0u8; STEP];
    let mut pos = 0;
    while pos < src.size {
        let len = (src.size - pos).min(1 << 30);
        let ext = src
            .store
            .extents(src.base + pos, len, 4096)
            .map_err(io::Error::other)?;
        let mut at = pos;
        for e in ext {
            let end = (at + e.length).min(src.size);
            match e.kind {
                ExtentKind::Hole => {}
                ExtentKind::Zero => fallocate(f, 0, at, end - at)?,
                ExtentKind::Data => {
                    let mut p = at;
                    while p < end {
                        let n = ((end - p) as usize).min(STEP);
                        let got = src.read(&mut buf[..n], p)?;
                        f.write_all_at(&buf[..got], p)?;
                        p += got as u64;
                    }
                }
            }
            at += e.length;
        }
        if at == pos {
            break;
        }
        pos = at;
    }
    Ok(())
}

/// The mover: waits for the oldest queued file to have been idle for
/// `after`, then moves every file that is due. Ends when the filesystem
/// (or its cold tier) goes.
fn run_mover(fs: Weak<Fs>, mover: Arc<Mover>, after: Duration) {
    loop {
        let due: Vec<(Instant, Ino)> = {
            let mut q = mover.queue.lock();
            loop {
                if q.stop {
                    return;
                }
                let now = Instant::now();
                match q.idle.front() {
                    Some(&(t, _)) if t + after <= now => break,
                    Some(&(t, _)) => {
                        mover.wake.wait_until(&mut q, t + after);
                    }
                    None => mover.wake.wait(&mut q),
                }
            }
            let now = Instant::now();
            let n = q.idle.iter().take_while(|(t, _)| *t + after <= now).count();
            q.idle.drain(..n.min(1024)).collect()
        };
        let Some(fs) = fs.upgrade() else {
            return;
        };
        for (t, ino) in due {
            fs.move_out(ino, t);
        }
    }
}
