//! The memory budget: reserving and giving back memory, frontends'
//! charges, the page limit, raw frames, and the pressure mark; and
//! [`Budget`], a budget shared by several stores: the `[daemon] max_memory`
//! of `ramd up`. Each store still has its own `max_memory`; a reservation
//! must fit both, so whichever disk crosses the shared budget gets ENOSPC
//! and the others keep what they hold.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::pool::PagePtr;
use crate::sys::PAGE_SIZE;

use super::{Store, CHUNK_META_BYTES};

/// Budget kept for the background scanner: a disk filled to `max_memory`
/// with raw (hot) pages could otherwise never compress them, since a
/// compressed copy needs memory before the raw page is freed. Enough for a
/// new zspage of the largest class (32 pages) and its descriptor.
pub(crate) const BACKGROUND_HEADROOM: u64 = 256 << 10;

impl Store {
    /// Charges `bytes` of a frontend's own metadata (inodes, directory
    /// entries, xattrs) against `max_memory`: ENOSPC if it does not fit.
    pub fn charge(&self, bytes: u64) -> Result<()> {
        self.reserve(bytes)?;
        self.c.charged.fetch_add(bytes, Relaxed);
        Ok(())
    }

    /// Returns what [`Store::charge`] took.
    pub fn uncharge(&self, bytes: u64) {
        let before = self.c.charged.fetch_sub(bytes, Relaxed);
        debug_assert!(before >= bytes, "uncharge of more than was charged");
        self.unreserve(bytes);
    }

    /// Pages that are not holes, and the cap on them.
    pub fn pages_used(&self) -> (u64, u64) {
        (
            self.c.live_pages.load(Relaxed),
            self.page_limit.load(Relaxed),
        )
    }

    /// Resizes a mounted filesystem disk: its page cap (`None`: no cap)
    /// and its memory budget. Growing always succeeds; shrinking only when
    /// what the disk holds now fits, else nothing changes. Runs with the
    /// gate held exclusively, so no client change is half-way through
    /// between the check and the new limits.
    pub fn set_limits(&self, page_limit: Option<u64>, max_memory: u64) -> Result<()> {
        let page_limit = page_limit.unwrap_or(u64::MAX);
        let _gate = self.gate.write();
        let pages = self.c.live_pages.load(Relaxed);
        if pages > page_limit {
            return Err(Error::Invalid(format!(
                "the disk holds {} in {pages} pages, more than the new size of {} \
                 (delete files first)",
                crate::units::human(pages * PAGE_SIZE as u64),
                crate::units::human(page_limit.saturating_mul(PAGE_SIZE as u64))
            )));
        }
        let used = self.c.memory_used.load(Relaxed);
        let least = PAGE_SIZE as u64 + CHUNK_META_BYTES + self.headroom;
        if max_memory < least || used > max_memory - self.headroom {
            return Err(Error::Invalid(format!(
                "the disk uses {} of memory, more than the new max_memory of {} allows",
                crate::units::human(used),
                crate::units::human(max_memory)
            )));
        }
        self.page_limit.store(page_limit, Relaxed);
        self.max_memory.store(max_memory, Relaxed);
        Ok(())
    }

    /// Gives back a raw frame and its budget.
    pub(crate) fn free_page(&self, p: PagePtr) {
        self.pool.free(p);
        self.unreserve(PAGE_SIZE as u64);
    }

    /// Reserves and takes one raw frame, for background work if `bg`;
    /// nothing is charged if either fails.
    pub(crate) fn alloc_page(&self, bg: bool) -> Result<PagePtr> {
        self.reserve_for(PAGE_SIZE as u64, bg)?;
        self.pool
            .alloc()
            .inspect_err(|_| self.unreserve(PAGE_SIZE as u64))
    }

    /// Counts one more non-hole page against `page_limit`; to be called
    /// before a hole is replaced by anything else.
    pub(crate) fn claim_page(&self) -> Result<()> {
        let limit = self.page_limit.load(Relaxed);
        self.c
            .live_pages
            .fetch_update(Relaxed, Relaxed, |n| (n < limit).then_some(n + 1))
            .map(|_| ())
            .map_err(|_| Error::DiskFull {
                limit: limit.saturating_mul(PAGE_SIZE as u64),
            })
    }

    /// Reserves budget for a client's request: everything but the
    /// background headroom.
    pub(crate) fn reserve(&self, bytes: u64) -> Result<()> {
        // Pages kept for a save under way do not count against clients:
        // saving must never make a write fail.
        let kept = self.c.kept.load(Relaxed);
        self.reserve_within(bytes, self.max_memory() - self.headroom + kept)
    }

    /// Reserves budget for background work (all of `max_memory`), or for a
    /// client if `bg` is false.
    pub(crate) fn reserve_for(&self, bytes: u64, bg: bool) -> Result<()> {
        match bg {
            true => self.reserve_within(bytes, self.max_memory()),
            false => self.reserve(bytes),
        }
    }

    pub(crate) fn reserve_within(&self, bytes: u64, limit: u64) -> Result<()> {
        self.c
            .memory_used
            .fetch_update(Relaxed, Relaxed, |used| {
                used.checked_add(bytes).filter(|&n| n <= limit)
            })
            .map_err(|_| Error::NoSpace {
                needed: bytes,
                limit: self.max_memory(),
            })?;
        match &self.shared {
            Some(b) if !b.try_take(bytes) => {
                self.c.memory_used.fetch_sub(bytes, Relaxed);
                Err(Error::SharedNoSpace {
                    needed: bytes,
                    limit: b.limit(),
                })
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn unreserve(&self, bytes: u64) {
        let before = self.c.memory_used.fetch_sub(bytes, Relaxed);
        debug_assert!(before >= bytes, "memory accounting went negative");
        if let Some(b) = &self.shared {
            b.give_back(bytes);
        }
    }

    /// Whether memory is tight enough that hot pages are compressed
    /// regardless of age: decided once per pass, so that one pass under
    /// pressure compresses every hot page rather than just enough to dip
    /// below the mark (which would have writers hit it again at once).
    pub(crate) fn under_pressure(&self) -> bool {
        self.c.pressure.load(Relaxed)
    }

    /// Memory use above which a pass compresses every hot page, and reads
    /// stop promoting: 7/8 of the clients' budget.
    pub(crate) fn pressure_mark(&self) -> u64 {
        (self.max_memory() - self.headroom) / 8 * 7
    }
}

#[derive(Debug)]
pub struct Budget {
    limit: u64,
    used: AtomicU64,
}

impl Budget {
    pub fn new(limit: u64) -> Arc<Budget> {
        Arc::new(Budget {
            limit,
            used: AtomicU64::new(0),
        })
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// What the stores drawing on it hold now.
    pub fn used(&self) -> u64 {
        self.used.load(Relaxed)
    }

    /// Takes `bytes` if they fit.
    pub(crate) fn try_take(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Relaxed, Relaxed, |u| {
                u.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .is_ok()
    }

    /// Takes `bytes` whatever the limit (copies a save keeps: a save never
    /// makes a write fail, see `Store::changing`).
    pub(crate) fn take(&self, bytes: u64) {
        self.used.fetch_add(bytes, Relaxed);
    }

    pub(crate) fn give_back(&self, bytes: u64) {
        let before = self.used.fetch_sub(bytes, Relaxed);
        debug_assert!(before >= bytes, "shared budget went negative");
    }
}
