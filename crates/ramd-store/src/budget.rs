//! A memory budget shared by several stores: the `[daemon] max_memory` of
//! `ramd up`. Each store still has its own `max_memory`; a reservation must
//! fit both, so whichever disk crosses the shared budget gets ENOSPC and
//! the others keep what they hold.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

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
