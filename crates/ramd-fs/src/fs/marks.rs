//! What the saves of a `--data-path kernel` filesystem remember between
//! saves (see `saves.rs`): which files may have changed since the last,
//! the image's page hashes per slot, the image chunks no file owns any
//! more, and the cold copies a save under way still reads. The rest of
//! `Fs` marks and frees here; only `saves.rs` reads it back.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Ino, FILE_SHIFT};

/// Image page of a slot's first page.
pub(super) const SLOT_PAGE_SHIFT: u32 = FILE_SHIFT - 12;
/// Pages of an image chunk (a GONE record's unit).
pub(super) const CHUNK_PAGES: u64 = 64;
/// A page's hash; 0: a hole or all zeros.
pub(super) type Hash = u128;

/// What the saves of a kernel-path filesystem remember between saves.
#[derive(Default)]
pub(crate) struct HotSaves {
    pub(super) inner: Mutex<Inner>,
    /// An image is kept ([`Fs::outer_pages`] was asked for): files are
    /// held to what an image holds.
    pub(super) imaged: std::sync::atomic::AtomicBool,
}

#[derive(Default)]
pub(super) struct Inner {
    /// Files whose data may differ from the image's copy.
    pub(super) changed: HashSet<Ino>,
    /// Per slot: the hashes of the image's copy of its pages (trailing
    /// holes left out), as of the last committed save or the load.
    pub(super) saved: HashMap<u64, Arc<[Hash]>>,
    /// Chunks that may hold pages in the image but belong to no file now.
    pub(super) dead: BTreeSet<u64>,
    /// A save is between its switch and its end.
    pub(super) saving: bool,
    /// Slots freed since that save's switch: its commit must not adopt them.
    pub(super) freed_in_save: HashSet<u64>,
    /// Slots of cold files that save reads from the cold store.
    pub(super) cold_read: HashSet<u64>,
    /// Of those, the ones whose cold copy is no longer wanted (moved back,
    /// or the file went), with their sizes: freed when the save ends.
    pub(super) deferred: Vec<(u64, u64)>,
}

/// The chunks of slot `slot` where `hashes` name data.
pub(super) fn data_chunks(slot: u64, hashes: &[Hash]) -> impl Iterator<Item = u64> + '_ {
    let first = (slot << SLOT_PAGE_SHIFT) / CHUNK_PAGES;
    hashes
        .chunks(CHUNK_PAGES as usize)
        .enumerate()
        .filter(|(_, c)| c.iter().any(|&h| h != 0))
        .map(move |(i, _)| first + i as u64)
}

impl HotSaves {
    /// `ino`'s data may have changed (an open for writing, a truncate...).
    pub(in crate::fs) fn mark(&self, ino: Ino) {
        self.inner.lock().changed.insert(ino);
    }

    /// The inode went, and its slot with it: the image's copy of the
    /// slot's pages must go at the next save.
    pub(in crate::fs) fn freed(&self, ino: Ino, slot: u64) {
        let mut inner = self.inner.lock();
        inner.changed.remove(&ino);
        if let Some(h) = inner.saved.remove(&slot) {
            let chunks: Vec<u64> = data_chunks(slot, &h).collect();
            inner.dead.extend(chunks);
        }
        if inner.saving {
            inner.freed_in_save.insert(slot);
        }
    }

    pub(in crate::fs) fn imaged(&self) -> bool {
        self.imaged.load(Relaxed)
    }

    /// Slot `slot`'s cold copy (`size` bytes) is no longer wanted: true if
    /// a save reads it now, which then frees it when done; false: the
    /// caller frees it. The caller holds the state lock, so no save
    /// switches meanwhile.
    pub(in crate::fs) fn hold_cold(&self, slot: u64, size: u64) -> bool {
        let mut inner = self.inner.lock();
        if inner.saving && inner.cold_read.contains(&slot) {
            inner.deferred.push((slot, size));
            return true;
        }
        false
    }

    /// Whether slot `slot` still has a cold copy a save reads (so no new
    /// one may be written there yet).
    pub(in crate::fs) fn cold_held(&self, slot: u64) -> bool {
        self.inner.lock().deferred.iter().any(|&(s, _)| s == slot)
    }
}
