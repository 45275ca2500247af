//! A disk's memory, compression and saving settings as a protocol reads
//! them: one that keeps data outside the store (the FUSE kernel data
//! path's tmpfs, a cold tier's store of its own) sizes, places and
//! compresses it as the store would be.

use std::collections::BTreeSet;
use std::time::Duration;

use ramd_store::numa::NumaPolicy;
use ramd_store::persist::FlushMode;
use ramd_store::{Codec, HugePages};

/// The disk's settings of those names (see `ramd serve --help`).
#[derive(Clone, Debug)]
pub struct StoreSettings {
    pub max_memory: Option<u64>,
    pub warm_pool: u64,
    pub mlock: bool,
    pub huge_pages: Option<HugePages>,
    pub numa_nodes: Option<BTreeSet<u32>>,
    pub numa_policy: Option<NumaPolicy>,
    pub compress: Codec,
    pub recompress: Codec,
    pub compress_after: Option<Duration>,
    pub flush: FlushMode,
    /// The disk follows an image's writer (`--standby`).
    pub standby: bool,
}

impl StoreSettings {
    /// Whether the disk has background work (compression, re-packing).
    pub fn compresses(&self) -> bool {
        !self.compress.is_none() || !self.recompress.is_none()
    }

    /// A filesystem disk's default budget: every page of `size`, plus room
    /// for the page tables of many small files and for inodes and names
    /// (1/8 of size, ≥ 64 MiB). ramfs mode (`None`): the host's memory,
    /// still guarded by the host reserve. `loaded`: it may hold compressed
    /// pages from an image.
    pub fn fs_max_memory(&self, size: Option<u64>, loaded: bool) -> u64 {
        let compressed = self.compresses() || loaded;
        match size {
            Some(n) => {
                ramd_store::default_max_memory(n, compressed).saturating_add((n / 8).max(64 << 20))
            }
            None => mem_total(),
        }
    }
}

/// The host's memory, or 1 GiB if /proc/meminfo cannot say.
pub fn mem_total() -> u64 {
    ramd_store::mem_total().unwrap_or(1 << 30)
}
