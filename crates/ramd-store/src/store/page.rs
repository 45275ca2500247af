//! Pages and chunks as a save sees them: `PageRef`, a page borrowed from
//! the page table (or from a kept copy); `Kept`, the copy of a page taken
//! before a client changed it while a save still had to write it; and
//! `SaveState`, a chunk's part in saves.

use std::sync::atomic::AtomicU64;

/// One page (or one frame of pages) as an image holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageRef<'a> {
    Hole,
    /// Every 8 bytes of the page are this (little-endian order of memory).
    Fill(u64),
    /// An uncompressed page; `hot`: waiting to be compressed (else it did
    /// not compress).
    Raw {
        data: &'a [u8],
        hot: bool,
    },
    /// One page compressed alone.
    Packed {
        zstd: bool,
        data: &'a [u8],
    },
    /// A frame object (header and compressed data) and the slots of its
    /// chunk that name it.
    Frame {
        mask: u64,
        data: &'a [u8],
    },
}

/// A page's contents at the switch, copied before a client changed it.
pub(crate) enum Kept {
    Hole,
    Fill(u64),
    Raw { data: Box<[u8]>, hot: bool },
    Packed { zstd: bool, data: Box<[u8]> },
}

impl Kept {
    /// Memory charged while it is held.
    pub(super) fn cost(&self) -> u64 {
        let data = match self {
            Kept::Raw { data, .. } | Kept::Packed { data, .. } => data.len(),
            Kept::Hole | Kept::Fill(_) => 0,
        };
        (data + std::mem::size_of::<(u8, Kept)>()) as u64
    }

    pub(super) fn as_ref(&self) -> PageRef<'_> {
        match self {
            Kept::Hole => PageRef::Hole,
            Kept::Fill(p) => PageRef::Fill(*p),
            Kept::Raw { data, hot } => PageRef::Raw { data, hot: *hot },
            Kept::Packed { zstd, data } => PageRef::Packed { zstd: *zstd, data },
        }
    }
}

/// A chunk's part in saves: which of its slots changed since the last
/// save's switch, which the save under way has still to write, and the
/// copies kept of those that clients changed since.
#[derive(Default)]
pub(crate) struct SaveState {
    /// Slots changed since the last save's switch.
    pub(crate) dirty: u64,
    /// Slots the save under way has still to write; atomic because the
    /// saver clears them under a shared lock.
    pub(crate) saving: AtomicU64,
    /// Contents at the switch of `saving` slots that clients changed since.
    // Boxed: 8 bytes per chunk rather than a Vec's 24, for a rare case.
    #[allow(clippy::box_collection)]
    pub(crate) kept: Option<Box<Vec<(u8, Kept)>>>,
}
