//! The sparse page table and the operations every frontend uses.
//!
//! Layout: the disk is cut into 256 KiB *chunks* of 64 page slots. A chunk
//! exists only while one of its slots holds something, so an untouched disk
//! costs nothing and a disk of 2^63 bytes is as cheap as one of 1 GiB.
//! Chunks live in `SHARDS` hash maps, each behind its own lock; consecutive
//! chunks land in different shards, so concurrent random I/O rarely meets on
//! one lock while a 1 MiB request takes at most five locks. Chunks are small
//! so that a small file of a filesystem disk (one object per file) costs
//! well under 1 KiB of slot metadata.
//!
//! A slot is a 64-bit value plus 16 bits of metadata (kind, accessed bit,
//! settled bit, age); see [`Slot`] for the kinds. With the chunk's share
//! that is 11.25 bytes of page table per 4 KiB page on a dense disk (zram's
//! table entry is 16), see `PAGE_META_BYTES`.
//!
//! Invariants:
//! - `memory_used` = raw pages × 4 KiB + zspage pages × 4 KiB + chunk,
//!   zspage and frontend metadata, and it never exceeds `max_memory`:
//!   memory is reserved before it is taken.
//! - A page's old contents stay readable until its replacement is complete:
//!   a failed compression or allocation leaves the slot as it was (the new
//!   page is built, then swapped in).
//! - A raw frame or compressed object is owned by exactly one slot, except
//!   a multi-page frame, owned by the slots of its chunk that name it; its
//!   bytes are touched only under that chunk's shard lock (read lock to
//!   read, write lock to change).
//!
//! Where things are: this file has [`Store`], its configuration, counters
//! and `stats`; `table.rs` the slot encoding, chunks, shards and spans;
//! `io.rs` what clients call; `budget.rs` the memory budget; `compress.rs`
//! packing and decoding pages; `background.rs` the scanner's passes;
//! `save.rs` the store's side of saves and loads.

use std::collections::hash_map::HashMap;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use background::scanner_tick;
use budget::BACKGROUND_HEADROOM;
use parking_lot::{Mutex, RwLock};
use table::{Chunk, Shard, Slot, MAX_AGE};

use crate::arena::MemoryPolicy;
use crate::codec::Codec;
use crate::error::{Error, Result};
use crate::pool::{PagePool, PoolStats};
use crate::sys::PAGE_SIZE;
use crate::zs::{self, ZsAlloc};

const PAGE_SHIFT: u32 = 12;
pub(crate) const CHUNK_PAGES: usize = 64;
/// Bytes of disk one chunk covers.
pub const CHUNK_BYTES: u64 = (CHUNK_PAGES * PAGE_SIZE) as u64;
/// Power of two; 128 locks for 2 cores keeps collisions of 32 in-flight
/// random requests rare.
const SHARDS: usize = 128;

/// Largest disk: what qemu and the kernel accept (signed 64-bit offsets).
pub const MAX_SIZE: u64 = i64::MAX as u64;

/// Memory charged for one chunk: its slot arrays plus the hash-map entry and
/// allocator header that hold it.
pub const CHUNK_META_BYTES: u64 = (std::mem::size_of::<Chunk>() + 48) as u64;

/// Page-table bytes per 4 KiB page of a fully written chunk.
pub const PAGE_META_BYTES: f64 = CHUNK_META_BYTES as f64 / CHUNK_PAGES as f64;
// What ARCHITECTURE.md documents, and never more than zram's 16-byte entry.
const _: () = assert!(CHUNK_META_BYTES == 720 && CHUNK_META_BYTES <= 16 * CHUNK_PAGES as u64);

mod background;
mod budget;
pub(crate) mod compress;
pub(crate) mod frame;
mod io;
mod page;
mod save;
pub(crate) mod table;
pub use budget::Budget;
pub use compress::compress_page;
pub(crate) use compress::MAX_PACKED;
pub use io::{Change, Extent, ExtentKind, StandbyHold};
pub use page::PageRef;
pub use save::{SavePlan, SaveSession};

/// How a store is sized, guarded and compressed.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Logical capacity in bytes.
    pub size: u64,
    /// Cap on memory used (pages + page-table metadata). `None`: room for
    /// every page of `size` plus the metadata a full disk needs.
    pub max_memory: Option<u64>,
    /// Free page memory kept resident for reuse rather than returned.
    pub warm_pool: u64,
    /// Page memory is refused while the host's MemAvailable is below this.
    pub host_reserve: u64,
    /// Cap on pages that are not holes (data, zero and same-filled pages
    /// alike), like tmpfs's `size=`: a filesystem disk's capacity is what its
    /// files may occupy, not an address range. `None`: no cap beyond `size`.
    pub page_limit: Option<u64>,
    /// Codec for pages as they are written (or once idle, see below).
    pub compress: Codec,
    /// Zero: pages are compressed as they are written (zram's way). Else
    /// written pages stay raw ("hot") and the background scanner
    /// compresses them once untouched this long.
    pub compress_after: Duration,
    /// Codec for idle pages, packed with their idle neighbours into frames
    /// of up to 16 pages. `None`: idle pages stay as they are.
    pub recompress: Codec,
    /// How long a page must go untouched to count as idle.
    pub idle_after: Duration,
    /// Keep track of changed pages for incremental saves to an image.
    pub track_changes: bool,
    /// A budget shared with other stores (a daemon's), on top of
    /// `max_memory`.
    pub shared_budget: Option<Arc<Budget>>,
    /// How page memory is held: locked, placed, huge pages.
    pub memory: MemoryPolicy,
}

impl StoreConfig {
    pub fn new(size: u64) -> StoreConfig {
        StoreConfig {
            size,
            max_memory: None,
            warm_pool: 64 << 20,
            host_reserve: default_host_reserve(),
            page_limit: None,
            compress: Codec::None,
            compress_after: Duration::ZERO,
            recompress: Codec::None,
            idle_after: Duration::from_secs(300),
            track_changes: false,
            shared_budget: None,
            memory: MemoryPolicy::default(),
        }
    }
}

/// 2% of the host's memory, at least 256 MiB: what ramd leaves to everyone else.
pub fn default_host_reserve() -> u64 {
    let total = crate::sys::mem_total().unwrap_or(0);
    (total / 50).max(256 << 20)
}

/// Memory that holding every page of a `size`-byte disk takes.
pub fn full_disk_memory(size: u64) -> u64 {
    let pages = size.div_ceil(PAGE_SIZE as u64);
    let chunks = size.div_ceil(CHUNK_BYTES);
    pages
        .saturating_mul(PAGE_SIZE as u64)
        .saturating_add(chunks.saturating_mul(CHUNK_META_BYTES))
}

/// `max_memory` when none is given: room for every page of the disk, raw,
/// and with compression for one partly used zspage per size class too, so
/// that a disk of `size` bytes always holds `size` bytes.
pub fn default_max_memory(size: u64, compressed: bool) -> u64 {
    let slack = if compressed {
        zs::one_zspage_per_class_bytes()
    } else {
        0
    };
    full_disk_memory(size).saturating_add(slack)
}

/// A snapshot of the store's accounting, for `ramd status`.
///
/// `memory_used = stored_bytes + slack_bytes + metadata_bytes + kept_bytes`.
///
/// Each counter is read on its own, so a snapshot taken while pages move
/// (a client request, a scanner pass) may straddle a move; the identity
/// holds whenever the store is quiet.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StoreStats {
    pub size: u64,
    pub max_memory: u64,
    /// Bytes of the disk that are not holes (data, zero and same-filled pages).
    pub used_bytes: u64,
    /// Pages + allocator slack + metadata, as charged against `max_memory`.
    pub memory_used: u64,
    /// Pages holding data, raw or compressed (`data_bytes` / 4096).
    pub data_pages: u64,
    /// What those pages hold before compression.
    pub data_bytes: u64,
    /// What they take: 4 KiB per raw page plus each compressed object's
    /// exact size.
    pub stored_bytes: u64,
    /// Compressed-allocator memory not holding compressed bytes: class
    /// rounding, zspage tails, free objects.
    pub slack_bytes: u64,
    /// Page-table and allocator metadata plus what frontends charged
    /// (inodes, names...).
    pub metadata_bytes: u64,
    /// Old copies of pages that clients changed while a save was under way,
    /// held until the save has written them. They raise the clients'
    /// budget by their own size, so `memory_used` may pass `max_memory` by
    /// this much.
    pub kept_bytes: u64,
    /// Same-filled pages other than zero, stored as their 8-byte pattern.
    pub fill_pages: u64,
    /// Pages written or zeroed to all-zero, stored as nothing.
    pub zero_pages: u64,
    /// Raw pages not compressed yet (all raw pages when compression is off).
    pub hot_pages: u64,
    /// Raw pages that did not compress well enough to keep compressed.
    pub incompressible_pages: u64,
    /// Pages compressed one by one.
    pub compressed_pages: u64,
    /// Pages packed into multi-page frames, and the frames.
    pub frame_pages: u64,
    pub frames: u64,
    /// Pages untouched for `idle_after`, as of the scanner's last pass.
    pub idle_pages: u64,
    /// `data_bytes` / `memory_used` (1.0 when nothing is stored).
    pub ratio: f64,
    pub compress: String,
    pub recompress: String,
    /// Time spent in the codec compressing and decompressing, summed over
    /// threads (CPU time unless threads outnumber cores).
    pub compress_time_ns: u64,
    pub decompress_time_ns: u64,
    /// CPU time of the background threads (scanning, compressing, moving).
    pub background_cpu_ns: u64,
    /// Objects moved by compaction, and zspages it emptied.
    pub compacted_objects: u64,
    /// Zspages of the compressed-object allocator.
    pub zspages: u64,
    pub chunks: u64,
    pub pool: PoolStats,
}

/// Counters, each kept exact under the locks that change what it counts.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) memory_used: AtomicU64,
    pub(crate) hot: AtomicU64,
    pub(crate) huge: AtomicU64,
    pub(crate) packed: AtomicU64,
    pub(crate) frame_pages: AtomicU64,
    pub(crate) frames: AtomicU64,
    pub(crate) fill: AtomicU64,
    pub(crate) zero: AtomicU64,
    pub(crate) chunks: AtomicU64,
    /// Exact bytes of compressed objects (a frame counted once).
    pub(crate) compressed_bytes: AtomicU64,
    /// Slots that are not holes; bounded by `page_limit`.
    pub(crate) live_pages: AtomicU64,
    /// Bytes frontends charged for their own metadata (see `charge`).
    pub(crate) charged: AtomicU64,
    pub(crate) idle: AtomicU64,
    /// Idle pages counted so far by the pass under way.
    pub(crate) idle_pass: AtomicU64,
    /// This pass compresses hot pages whatever their age (see `under_pressure`).
    pub(crate) pressure: std::sync::atomic::AtomicBool,
    pub(crate) compress_ns: AtomicU64,
    pub(crate) decompress_ns: AtomicU64,
    pub(crate) background_ns: AtomicU64,
    pub(crate) compacted: AtomicU64,
    /// Bytes of pages kept for the save under way (see `save.rs`).
    pub(crate) kept: AtomicU64,
    /// The save under way could not keep a page it needed.
    pub(crate) save_broken: std::sync::atomic::AtomicBool,
}

/// What makes a flush durable (a save to the disk's image).
pub type FlushHook = Box<dyn Fn() -> Result<()> + Send + Sync>;

pub struct Store {
    pub(crate) size: u64,
    /// Atomic so a filesystem disk can be resized while mounted
    /// ([`Store::set_limits`]); read with Relaxed, as every counter here.
    pub(crate) max_memory: AtomicU64,
    pub(crate) shards: Box<[Shard]>,
    pub(crate) c: Counters,
    pub(crate) page_limit: AtomicU64,
    pub(crate) compress: Codec,
    pub(crate) recompress: Codec,
    /// Scanner passes a hot page waits, and an idle page has waited.
    pub(crate) compress_after: u16,
    pub(crate) idle_after: u16,
    pub(crate) tick: Duration,
    /// Budget only background work may use (see `reserve`).
    pub(crate) headroom: u64,
    /// Held for a whole background pass, and by a client's compaction
    /// (`compact_now`): compaction plans are global, one at a time.
    pub(crate) passing: Mutex<()>,
    /// Frontends hold it shared over each request that changes the disk;
    /// a save holds it exclusively for its switch, so every request is all
    /// in or all out of a saved image (see [`Change`]).
    pub(crate) gate: RwLock<()>,
    /// A standby's store (`--standby`): clients may only read, and each
    /// read holds the gate shared, so that a save being applied (which
    /// holds it exclusively) is all in or all out of every read.
    pub(crate) standby: std::sync::atomic::AtomicBool,
    /// Whether changes are tracked for saves (`StoreConfig::track_changes`).
    pub(crate) track: bool,
    /// The daemon's budget, shared with its other disks.
    pub(crate) shared: Option<Arc<Budget>>,
    /// Chunks dropped (emptied) since the last save's switch.
    pub(crate) gone: Mutex<HashSet<u64>>,
    /// Called by `flush` (NBD FLUSH and FUA, fsync) once set.
    pub(crate) flush_hook: OnceLock<FlushHook>,
    // Declared last: dropped after the page table that points into them.
    pub(crate) zs: ZsAlloc,
    pub(crate) pool: PagePool,
}

impl Store {
    pub fn new(cfg: StoreConfig) -> Result<Store> {
        if cfg.size == 0 || cfg.size > MAX_SIZE {
            return Err(Error::Invalid(format!(
                "disk size {} is outside 1..={MAX_SIZE} bytes",
                cfg.size
            )));
        }
        let compressed = !cfg.compress.is_none() || !cfg.recompress.is_none();
        let max_memory = cfg
            .max_memory
            .unwrap_or_else(|| default_max_memory(cfg.size, compressed));
        let headroom = if compressed { BACKGROUND_HEADROOM } else { 0 };
        let least = PAGE_SIZE as u64 + CHUNK_META_BYTES + headroom;
        if max_memory < least {
            return Err(Error::Invalid(format!(
                "max_memory {max_memory} bytes cannot hold a single page (needs {least}{})",
                if compressed {
                    ", with room for background compression"
                } else {
                    ""
                }
            )));
        }
        if cfg.compress.is_none() && !cfg.compress_after.is_zero() {
            return Err(Error::Invalid(
                "compress-after needs compress to name a codec (lz4 or zstd)".into(),
            ));
        }
        let tick = scanner_tick(&cfg);
        let passes = |d: Duration| -> u16 {
            let n = d.as_nanos().div_ceil(tick.as_nanos().max(1));
            n.min(MAX_AGE as u128) as u16
        };
        let pool = PagePool::with_policy(cfg.warm_pool, cfg.host_reserve, cfg.memory, max_memory)?;
        let shards = (0..SHARDS)
            .map(|_| Shard(RwLock::new(HashMap::new())))
            .collect();
        Ok(Store {
            size: cfg.size,
            max_memory: AtomicU64::new(max_memory),
            shards,
            c: Counters::default(),
            page_limit: AtomicU64::new(cfg.page_limit.unwrap_or(u64::MAX)),
            compress: cfg.compress,
            recompress: cfg.recompress,
            compress_after: passes(cfg.compress_after),
            idle_after: passes(cfg.idle_after).max(1),
            tick,
            headroom,
            passing: Mutex::new(()),
            gate: RwLock::new(()),
            standby: std::sync::atomic::AtomicBool::new(false),
            track: cfg.track_changes,
            shared: cfg.shared_budget.clone(),
            gone: Mutex::new(HashSet::new()),
            flush_hook: OnceLock::new(),
            zs: ZsAlloc::new(),
            pool,
        })
    }

    /// Makes the store a standby's (`true`: clients may only read, and
    /// every read is all before or all after a save being applied) or a
    /// writable one again (a promotion).
    pub fn set_standby(&self, on: bool) {
        let _gate = self.gate.write();
        self.standby.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether the store is a standby's: frontends refuse writes as on a
    /// read-only disk.
    pub fn standby(&self) -> bool {
        self.standby.load(std::sync::atomic::Ordering::Acquire)
    }

    /// A standby's read: holds the gate shared (see `standby`); `None` for
    /// any other store, whose reads need no gate.
    pub(crate) fn standby_read(&self) -> Option<parking_lot::RwLockReadGuard<'_, ()>> {
        self.standby().then(|| self.gate.read())
    }

    /// Holds a standby's gate shared over a request that reads more than
    /// once (a filesystem's tree, then the file's data), so that a save
    /// being applied is all in or all out of the whole request; holds
    /// nothing for any other store. Its reads go through
    /// [`Store::read_held`] and [`Store::extents_held`], which do not take
    /// the gate again: a second shared hold would wait behind an apply
    /// waiting for the first (the lock is fair, so that steady reads
    /// cannot keep an apply out).
    pub fn standby_hold(&self) -> StandbyHold<'_> {
        StandbyHold(self.standby_read())
    }

    /// Runs `f` (restore calls) with the gate held exclusively: no client
    /// request is in flight, and a standby's reads wait, so that they see
    /// all of what `f` applies or none of it. `clear`: every page becomes
    /// a hole first (a new chain's full save replaces the whole disk).
    pub(crate) fn apply_exclusive<T>(
        &self,
        clear: bool,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let _gate = self.gate.write();
        if clear {
            let keys: Vec<u64> = self
                .shards
                .iter()
                .flat_map(|s| s.0.read().keys().copied().collect::<Vec<_>>())
                .collect();
            for key in keys {
                self.restore_gone(key)?;
            }
        }
        let r = f();
        self.end_restore();
        r
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn max_memory(&self) -> u64 {
        self.max_memory.load(Relaxed)
    }

    /// How often the background scanner ([`crate::ScannerPool`]) should run a pass;
    /// `None` when this store needs no background work.
    pub fn scanner_period(&self) -> Option<Duration> {
        (!self.compress.is_none() || !self.recompress.is_none()).then_some(self.tick)
    }

    /// Resident page memory of this disk per NUMA node as the kernel
    /// reports it (`move_pages`), in pages, and the sampling step (1: every
    /// page was asked; n: every n-th, counts scaled by n).
    pub fn pages_per_node(&self) -> (std::collections::BTreeMap<u32, u64>, u64) {
        self.pool.pages_per_node()
    }

    /// The most memory this disk could hold now, and which limit binds:
    /// `"max_memory"`, `"daemon"` (the shared budget has less room left) or
    /// `"host"` (the host is nearer its reserve: new pages would get ENOSPC
    /// before `max_memory`). Warm pages count as room the host guard does
    /// not check, so the host figure is what new memory could reach.
    pub fn effective_limit(&self) -> (u64, &'static str) {
        let used = self.c.memory_used.load(Relaxed);
        // The accessor, not the field: it survives the field becoming an
        // atomic (a remount may change the limit).
        let mut limit = (self.max_memory(), "max_memory");
        if let Some(b) = &self.shared {
            let room = b.limit().saturating_sub(b.used());
            limit = limit.min((used.saturating_add(room), "daemon"));
        }
        if let Some(room) = self.pool.host_room() {
            let warm = self.pool.stats().warm_bytes;
            limit = limit.min((used.saturating_add(room).saturating_add(warm), "host"));
        }
        limit
    }

    /// Memory this disk could still take before `max_memory` or the
    /// daemon's shared budget refuses a new page (atomics only; the host
    /// guard is [`Store::host_room`]).
    pub fn budget_room(&self) -> u64 {
        let used = self.c.memory_used.load(Relaxed);
        let mut room = self.max_memory().saturating_sub(used);
        if let Some(b) = &self.shared {
            room = room.min(b.limit().saturating_sub(b.used()));
        }
        room
    }

    /// Memory the host guard would still let this disk take, warm pages
    /// included (as [`Store::effective_limit`]); `None`: no guard. Reads
    /// /proc/meminfo.
    pub fn host_room(&self) -> Option<u64> {
        let room = self.pool.host_room()?;
        Some(room.saturating_add(self.pool.stats().warm_bytes))
    }

    /// One tick of the warm pool's decay (see `pool.rs`): bytes given back.
    pub(crate) fn decay(&self) -> u64 {
        self.pool.decay()
    }

    /// Disk offsets of the chunks (`CHUNK_BYTES` each) that hold any page
    /// that is not a hole, in no particular order.
    pub fn data_chunks(&self) -> Vec<u64> {
        let mut v = Vec::new();
        for shard in self.shards.iter() {
            v.extend(shard.0.read().keys().map(|k| k * CHUNK_BYTES));
        }
        v
    }

    pub fn stats(&self) -> StoreStats {
        let c = &self.c;
        let chunks = c.chunks.load(Relaxed);
        let (hot, huge) = (c.hot.load(Relaxed), c.huge.load(Relaxed));
        let (packed, framed) = (c.packed.load(Relaxed), c.frame_pages.load(Relaxed));
        let (fill, zero) = (c.fill.load(Relaxed), c.zero.load(Relaxed));
        let data = hot + huge + packed + framed;
        let compressed = c.compressed_bytes.load(Relaxed);
        let zs = self.zs.stats();
        let memory_used = c.memory_used.load(Relaxed);
        let used_bytes = ((data + fill + zero) * PAGE_SIZE as u64).min(self.size);
        StoreStats {
            size: self.size,
            max_memory: self.max_memory(),
            used_bytes,
            memory_used,
            data_pages: data,
            data_bytes: data * PAGE_SIZE as u64,
            stored_bytes: (hot + huge) * PAGE_SIZE as u64 + compressed,
            slack_bytes: (zs.pages * PAGE_SIZE as u64).saturating_sub(compressed),
            metadata_bytes: chunks * CHUNK_META_BYTES
                + self.zs.meta_bytes()
                + c.charged.load(Relaxed),
            kept_bytes: c.kept.load(Relaxed),
            fill_pages: fill,
            zero_pages: zero,
            hot_pages: hot,
            incompressible_pages: huge,
            compressed_pages: packed,
            frame_pages: framed,
            frames: c.frames.load(Relaxed),
            idle_pages: c.idle.load(Relaxed),
            ratio: if memory_used == 0 {
                1.0
            } else {
                (data * PAGE_SIZE as u64) as f64 / memory_used as f64
            },
            compress: self.compress.to_string(),
            recompress: self.recompress.to_string(),
            compress_time_ns: c.compress_ns.load(Relaxed),
            decompress_time_ns: c.decompress_ns.load(Relaxed),
            background_cpu_ns: c.background_ns.load(Relaxed),
            compacted_objects: c.compacted.load(Relaxed),
            zspages: zs.zspages,
            chunks,
            pool: self.pool.stats(),
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let c = &self.c;
        // Whatever it holds goes back to the daemon's budget with it.
        if let Some(b) = &self.shared {
            b.give_back(c.memory_used.load(Relaxed));
        }
        debug_assert_eq!(
            c.memory_used.load(Relaxed),
            (c.hot.load(Relaxed) + c.huge.load(Relaxed) + self.zs.stats().pages) * PAGE_SIZE as u64
                + self.zs.meta_bytes()
                + c.chunks.load(Relaxed) * CHUNK_META_BYTES
                + c.charged.load(Relaxed)
        );
        debug_assert_eq!(
            c.live_pages.load(Relaxed),
            [&c.hot, &c.huge, &c.packed, &c.frame_pages, &c.fill, &c.zero]
                .iter()
                .map(|n| n.load(Relaxed))
                .sum::<u64>()
        );
        // Raw frames go back with the pool's mappings; compressed objects
        // are freed so that their zspage descriptors are.
        for shard in self.shards.iter_mut() {
            for (_, chunk) in shard.0.get_mut().drain() {
                let mut frames = Vec::new();
                for i in 0..CHUNK_PAGES {
                    match chunk.get(i) {
                        Slot::Packed { h, .. } => self.zs.free(h, &self.pool, |_| {}),
                        Slot::Frame(h) if !frames.contains(&chunk.vals[i]) => {
                            frames.push(chunk.vals[i]);
                            self.zs.free(h, &self.pool, |_| {});
                        }
                        _ => {}
                    }
                }
            }
        }
    }
}
