//! Pages a disk keeps outside its store, saved beside the store's own: an
//! fs disk with `--data-path kernel` keeps its files' data in a private
//! kernel tmpfs, where ramd never sees a write. The disk tells a save what
//! may have changed and hands it the pages; the image format is the same
//! (file *n*'s data at page `n << 28`), so such an image loads either way.

use crate::error::Result;
use crate::store::PageRef;

/// The outside holder of a disk's pages ([`super::Persister::set_outer`]).
pub trait OuterPages: Send + Sync {
    /// Called at the switch, with every change through ramd held off (the
    /// store's gate): fixes what this save writes. `full`: every page, as
    /// for an empty image.
    fn switch(&self, full: bool) -> Box<dyn OuterSave>;
}

/// One save's share of the outside pages, from the switch to its commit.
/// Dropped without [`OuterSave::committed`] (the save failed), it leaves
/// the holder as if the save had not begun.
pub trait OuterSave: Send {
    /// Chunks (page number / 64) that are all holes now and may hold pages
    /// in the image: written before any page of the save.
    fn gone(&self) -> &[u64];

    /// Whether anything may have changed since the last save.
    fn changed(&self) -> bool;

    /// Hands `page` every page to save, in page order; returns how many.
    /// A page equal to the image's copy may be left out; one whose image
    /// copy must go is handed as [`PageRef::Hole`].
    fn write(&mut self, page: &mut dyn FnMut(u64, PageRef<'_>) -> Result<()>) -> Result<u64>;

    /// The save is committed: what it wrote is now the image's.
    fn committed(self: Box<Self>);
}
