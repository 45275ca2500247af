//! ramd's engine: a sparse, memory-bounded store of 4 KiB pages.
//!
//! Every frontend (NBD, FUSE) goes through [`Store`]'s narrow interface:
//! `read`, `flush`, `extents`, `stats`, and, to change data, `write`,
//! `zero`, `trim` and `allocate` on a [`Change`] (which holds the save gate:
//! see [`Store::change`]). Callers validate requests at their own edge; the
//! store checks ranges once more and returns [`Error`], whose
//! [`Error::errno`] is the [`Errno`] a client should see. Images (saving,
//! loading, their format) live in [`persist`].

mod arena;
mod codec;
mod error;
mod identity;
pub mod metrics;
pub mod numa;
pub mod persist;
mod pool;
mod procmem;
mod scanner;
mod store;
mod sys;
mod units;
mod zs;

pub use arena::{HugePages, MemoryPolicy};
pub use codec::{Codec, ZSTD_DEFAULT_LEVEL, ZSTD_LEVELS};
pub use error::{Errno, Error, Result};
pub use identity::DiskId;
pub use pool::PoolStats;
pub use procmem::ProcessMemory;
pub use scanner::{ScanHandle, ScannerPool};
pub use store::{
    compress_page, default_host_reserve, default_max_memory, full_disk_memory, Budget, Change,
    Extent, ExtentKind, PageRef, SavePlan, SaveSession, StandbyHold, Store, StoreConfig,
    StoreStats, CHUNK_BYTES, CHUNK_META_BYTES, MAX_SIZE, PAGE_META_BYTES,
};
pub use sys::{map_anonymous, mem_available, mem_total, PAGE_SIZE};
pub use units::human;

#[cfg(test)]
mod tests;
