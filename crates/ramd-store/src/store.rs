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

use std::collections::hash_map::{Entry, HashMap};
use std::collections::HashSet;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockUpgradableReadGuard};

use crate::budget::Budget;
use crate::codec::{self, Codec};
use crate::error::{Error, Result};
use crate::pool::{PagePool, PagePtr, PoolStats};
use crate::zs::{self, Handle, ZsAlloc};
use crate::PAGE_SIZE;

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

mod persist;
pub use persist::{PageRef, SavePlan};

/// A compressed page is kept only if its object is at most this big; above
/// it the page is stored raw (decompressing for a 6% saving is a poor trade).
pub(crate) const MAX_PACKED: usize = PAGE_SIZE - PAGE_SIZE / 16;
/// Budget kept for the background scanner: a disk filled to `max_memory`
/// with raw (hot) pages could otherwise never compress them, since a
/// compressed copy needs memory before the raw page is freed. Enough for a
/// new zspage of the largest class (32 pages) and its descriptor.
const BACKGROUND_HEADROOM: u64 = 256 << 10;
/// Pages one multi-page frame holds at most.
const FRAME_PAGES: usize = 16;
/// Bytes before a frame's compressed data: first slot, page count, codec,
/// a spare byte, compressed length (u32 LE).
const FRAME_HEADER: usize = 8;

// Slot metadata: kind in the low 3 bits, then flags, then the age in passes
// of the background scanner.
const KIND_MASK: u16 = 0b111;
const K_HOLE: u16 = 0;
const K_FILL: u16 = 1;
const K_RAW_HOT: u16 = 2;
const K_RAW_HUGE: u16 = 3;
const K_LZ4: u16 = 4;
const K_ZSTD: u16 = 5;
const K_FRAME: u16 = 6;
/// Read or written since the scanner last looked.
const ACCESSED: u16 = 1 << 3;
/// The scanner has nothing more to do with this page until it is written.
const SETTLED: u16 = 1 << 4;
const AGE_SHIFT: u32 = 5;
const MAX_AGE: u16 = u16::MAX >> AGE_SHIFT;

/// What a slot holds, decoded from its value and kind.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Slot {
    /// Never written, trimmed, or zeroed with holes allowed.
    Hole,
    /// Every 8 bytes of the page equal this (zero pages included): no memory.
    Fill(u64),
    /// A 4 KiB frame from the pool. `hot`: waiting to be compressed (or
    /// compression is off); otherwise it did not compress.
    Raw { p: PagePtr, hot: bool },
    /// One page compressed alone: `len` bytes at the start of object `h`.
    Packed { zstd: bool, h: Handle, len: u16 },
    /// One page of a multi-page frame (object `h`, header first).
    Frame(Handle),
}

impl Slot {
    fn encode(self) -> (u64, u16) {
        match self {
            Slot::Hole => (0, K_HOLE),
            Slot::Fill(pat) => (pat, K_FILL),
            Slot::Raw { p, hot } => (p.as_ptr() as u64, if hot { K_RAW_HOT } else { K_RAW_HUGE }),
            Slot::Packed { zstd, h, len } => {
                let pad = (h.capacity() - len as usize) as u64;
                debug_assert!(pad < 256);
                (h.encode() | pad << 56, if zstd { K_ZSTD } else { K_LZ4 })
            }
            Slot::Frame(h) => (h.encode(), K_FRAME),
        }
    }

    /// SAFETY: `(val, kind)` came from `encode` of a slot that is still live.
    unsafe fn decode(val: u64, kind: u16) -> Slot {
        match kind {
            K_HOLE => Slot::Hole,
            K_FILL => Slot::Fill(val),
            K_RAW_HOT | K_RAW_HUGE => Slot::Raw {
                p: PagePtr::from_addr(val),
                hot: kind == K_RAW_HOT,
            },
            K_LZ4 | K_ZSTD => {
                let h = Handle::decode(val);
                Slot::Packed {
                    zstd: kind == K_ZSTD,
                    h,
                    len: (h.capacity() - (val >> 56) as usize) as u16,
                }
            }
            K_FRAME => Slot::Frame(Handle::decode(val)),
            _ => unreachable!("slot kind {kind}"),
        }
    }
}

struct Chunk {
    vals: [u64; CHUNK_PAGES],
    /// Atomic so that readers (under the shared lock) can set ACCESSED.
    meta: [AtomicU16; CHUNK_PAGES],
    /// Slots that are not `Hole`; the chunk is dropped when this reaches 0
    /// (and it keeps no pages for a save).
    live: u32,
    /// Slots changed since the last save's switch (see `persist.rs`).
    dirty: u64,
    /// Slots the save under way has still to write; atomic because the
    /// saver clears them under a shared lock.
    saving: AtomicU64,
    /// Contents at the switch of `saving` slots that clients changed since.
    // Boxed: 8 bytes per chunk rather than a Vec's 24, for a rare case.
    #[allow(clippy::box_collection)]
    kept: Option<Box<Vec<(u8, persist::Kept)>>>,
}

impl Chunk {
    fn new() -> Box<Chunk> {
        Box::new(Chunk {
            vals: [0; CHUNK_PAGES],
            meta: std::array::from_fn(|_| AtomicU16::new(K_HOLE)),
            live: 0,
            dirty: 0,
            saving: AtomicU64::new(0),
            kept: None,
        })
    }

    fn get(&self, i: usize) -> Slot {
        let kind = self.meta[i].load(Relaxed) & KIND_MASK;
        // SAFETY: slots are written only through `Store::replace`, from
        // `Slot::encode` of what they hold.
        unsafe { Slot::decode(self.vals[i], kind) }
    }

    fn kind(&self, i: usize) -> u16 {
        self.meta[i].load(Relaxed) & KIND_MASK
    }

    fn touch(&self, i: usize) {
        let m = &self.meta[i];
        if m.load(Relaxed) & ACCESSED == 0 {
            m.fetch_or(ACCESSED, Relaxed);
        }
    }

    /// Other slots naming the same frame as slot `i`.
    fn frame_members(&self, val: u64) -> impl Iterator<Item = usize> + '_ {
        (0..CHUNK_PAGES).filter(move |&j| self.kind(j) == K_FRAME && self.vals[j] == val)
    }
}

#[repr(align(64))]
struct Shard(RwLock<HashMap<u64, Box<Chunk>>>);

/// What the page table says about a stretch of the disk.
#[derive(Clone, Copy, PartialEq, Eq, Debug, serde::Serialize)]
pub enum ExtentKind {
    /// Never written or trimmed: reads as zeros, costs nothing.
    Hole,
    /// Written (or zeroed without punching) and reads as zeros.
    Zero,
    /// Anything else.
    Data,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Extent {
    pub length: u64,
    pub kind: ExtentKind,
}

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
        }
    }
}

/// 2% of the host's memory, at least 256 MiB: what ramd leaves to everyone else.
pub fn default_host_reserve() -> u64 {
    let total = crate::pool::mem_total().unwrap_or(0);
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
struct Counters {
    memory_used: AtomicU64,
    hot: AtomicU64,
    huge: AtomicU64,
    packed: AtomicU64,
    frame_pages: AtomicU64,
    frames: AtomicU64,
    fill: AtomicU64,
    zero: AtomicU64,
    chunks: AtomicU64,
    /// Exact bytes of compressed objects (a frame counted once).
    compressed_bytes: AtomicU64,
    /// Slots that are not holes; bounded by `page_limit`.
    live_pages: AtomicU64,
    /// Bytes frontends charged for their own metadata (see `charge`).
    charged: AtomicU64,
    idle: AtomicU64,
    /// Idle pages counted so far by the pass under way.
    idle_pass: AtomicU64,
    /// This pass compresses hot pages whatever their age (see `under_pressure`).
    pressure: std::sync::atomic::AtomicBool,
    compress_ns: AtomicU64,
    decompress_ns: AtomicU64,
    background_ns: AtomicU64,
    compacted: AtomicU64,
    /// Bytes of pages kept for the save under way (see `persist.rs`).
    kept: AtomicU64,
    /// The save under way could not keep a page it needed.
    save_broken: std::sync::atomic::AtomicBool,
}

/// Proof that a background pass is under way (from [`Store::begin_pass`],
/// handed back to [`Store::end_pass`]): passes and client compaction take
/// turns.
pub struct PassGuard<'a>(#[allow(dead_code)] MutexGuard<'a, ()>);

/// What one background pass did, for tests and logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    /// Hot pages compressed (or found incompressible).
    pub compressed: u64,
    /// Idle pages re-packed with the recompress codec.
    pub repacked: u64,
    /// Frames split because most of their pages were rewritten.
    pub split: u64,
    /// Objects moved out of zspages being emptied.
    pub moved: u64,
    /// Memory ran out: the pass stopped early.
    pub starved: bool,
}

/// What makes a flush durable (a save to the disk's image).
pub type FlushHook = Box<dyn Fn() -> Result<()> + Send + Sync>;

pub struct Store {
    size: u64,
    max_memory: u64,
    shards: Box<[Shard]>,
    c: Counters,
    page_limit: u64,
    compress: Codec,
    recompress: Codec,
    /// Scanner passes a hot page waits, and an idle page has waited.
    compress_after: u16,
    idle_after: u16,
    tick: Duration,
    /// Budget only background work may use (see `reserve`).
    headroom: u64,
    /// Held for a whole background pass, and by a client's compaction
    /// (`compact_now`): compaction plans are global, one at a time.
    passing: Mutex<()>,
    /// Frontends hold it shared over each request that changes the disk;
    /// a save holds it exclusively for its switch, so every request is all
    /// in or all out of a saved image (see `gate`).
    gate: RwLock<()>,
    /// Whether changes are tracked for saves (`StoreConfig::track_changes`).
    track: bool,
    /// The daemon's budget, shared with its other disks.
    shared: Option<Arc<Budget>>,
    /// Chunks dropped (emptied) since the last save's switch.
    gone: Mutex<HashSet<u64>>,
    /// Called by `flush` (NBD FLUSH and FUA, fsync) once set.
    flush_hook: OnceLock<FlushHook>,
    // Declared last: dropped after the page table that points into them.
    zs: ZsAlloc,
    pool: PagePool,
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
        let shards = (0..SHARDS)
            .map(|_| Shard(RwLock::new(HashMap::new())))
            .collect();
        Ok(Store {
            size: cfg.size,
            max_memory,
            shards,
            c: Counters::default(),
            page_limit: cfg.page_limit.unwrap_or(u64::MAX),
            compress: cfg.compress,
            recompress: cfg.recompress,
            compress_after: passes(cfg.compress_after),
            idle_after: passes(cfg.idle_after).max(1),
            tick,
            headroom,
            passing: Mutex::new(()),
            gate: RwLock::new(()),
            track: cfg.track_changes,
            shared: cfg.shared_budget.clone(),
            gone: Mutex::new(HashSet::new()),
            flush_hook: OnceLock::new(),
            zs: ZsAlloc::new(),
            pool: PagePool::new(cfg.warm_pool, cfg.host_reserve),
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn max_memory(&self) -> u64 {
        self.max_memory
    }

    /// How often the background scanner should run [`Store::background_pass`];
    /// `None` when this store needs no background work.
    pub fn scanner_period(&self) -> Option<Duration> {
        (!self.compress.is_none() || !self.recompress.is_none()).then_some(self.tick)
    }

    /// Held (shared) by a frontend over each request that changes the disk,
    /// from before its first change to after its last, so that a save's
    /// switch, which takes it exclusively, sees every request whole. Take it
    /// before any frontend lock; the store's own calls never take it.
    pub fn gate(&self) -> RwLockReadGuard<'_, ()> {
        self.gate.read()
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

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        let promote = self.compress_after > 0;
        for span in chunk_spans(offset, buf.len() as u64) {
            let out = &mut buf[span.buf_range()];
            let mut cold = 0u64;
            {
                let map = self.shard(span.chunk).read();
                let Some(chunk) = map.get(&span.chunk) else {
                    out.fill(0);
                    continue;
                };
                let mut frame = FrameCache::default();
                for ps in span.pages() {
                    let dst = &mut out[ps.buf_range()];
                    let slot = chunk.get(ps.slot);
                    // Read before, since the scanner last looked?
                    let again = chunk.meta[ps.slot].load(Relaxed) & ACCESSED != 0;
                    if !matches!(slot, Slot::Hole | Slot::Fill(_)) {
                        chunk.touch(ps.slot);
                    }
                    match slot {
                        Slot::Hole => dst.fill(0),
                        Slot::Fill(pat) => fill_pattern(dst, pat, ps.start),
                        Slot::Raw { p, .. } => {
                            // SAFETY: the frame belongs to this slot and we
                            // hold the shard's read lock: nobody writes it.
                            let page = unsafe { page_ref(p) };
                            dst.copy_from_slice(&page[ps.start..ps.start + ps.len]);
                        }
                        Slot::Packed { .. } | Slot::Frame(_) => {
                            if ps.len == PAGE_SIZE {
                                self.decode_into(slot, chunk, &mut frame, ps.slot, dst)?;
                            } else {
                                let mut page = [0u8; PAGE_SIZE];
                                self.decode_into(slot, chunk, &mut frame, ps.slot, &mut page)?;
                                dst.copy_from_slice(&page[ps.start..ps.start + ps.len]);
                            }
                            // A second whole-page read within one scanner
                            // period makes the page hot; a single pass (a
                            // backup, a scrub) leaves the disk compressed.
                            if promote && again && ps.len == PAGE_SIZE {
                                cold |= 1 << ps.slot;
                            }
                        }
                    }
                }
            }
            if cold != 0 {
                self.promote(&span, cold);
            }
        }
        Ok(())
    }

    /// Hot/cold tiering: compressed pages read whole a second time since the
    /// scanner's last pass go back to raw, so a working set that is read
    /// again and again is served at memory speed. Best
    /// effort: skipped when memory is short. Pages are decompressed again
    /// under the write lock: what the read saw may have been rewritten since
    /// (even into the same object), so `out` cannot be trusted here.
    fn promote(&self, span: &ChunkSpan, cold: u64) {
        let mut map = self.shard(span.chunk).write();
        let Some(chunk) = map.get_mut(&span.chunk) else {
            return;
        };
        let mut frame = FrameCache::default();
        for ps in span.pages().filter(|ps| cold & 1 << ps.slot != 0) {
            let slot = chunk.get(ps.slot);
            if !matches!(slot, Slot::Packed { .. } | Slot::Frame(_)) {
                continue;
            }
            // Reads must not take the memory writes need: promote only
            // below the mark where the scanner starts compressing anyway.
            if self.c.memory_used.load(Relaxed) + PAGE_SIZE as u64 > self.pressure_mark() {
                return;
            }
            let Ok(p) = self.alloc_page(false) else {
                return;
            };
            // SAFETY: fresh frame, not yet shared.
            let page = unsafe { page_mut(p) };
            if self
                .decode_into(slot, chunk, &mut frame, ps.slot, page)
                .is_err()
            {
                self.free_page(p);
                return;
            }
            self.replace(chunk, ps.slot, Slot::Raw { p, hot: true }, true);
        }
    }

    /// Writes `data` at `offset`. On error the pages before the failing one
    /// hold the new data, the failing one and those after it the old data.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_prefix(offset, data, &mut 0).1
    }

    /// [`Store::write`], adding to `pages` how many pages stopped being
    /// holes (even when it fails part way), so that a frontend can keep
    /// per-object block counts without scanning; it also says how many
    /// leading bytes of `data` are stored when it fails part way (pages are
    /// written in order and the first failure stops it), so a filesystem
    /// can answer with a short write as POSIX asks when the disk fills up.
    pub fn write_prefix(&self, offset: u64, data: &[u8], pages: &mut i64) -> (usize, Result<()>) {
        if let Err(e) = self.check_range(offset, data.len() as u64) {
            return (0, Err(e));
        }
        let (done, r) = self.write_spans(offset, data, pages);
        match r {
            // Overwrites free objects one by one and a zspage goes back only
            // with its last one, so a disk that held compressed pages can
            // be out of budget while holding whole zspages of free space:
            // compact now rather than at the scanner's next pass.
            Err(Error::NoSpace { .. } | Error::SharedNoSpace { .. }) if self.compact_now() => {
                let (more, r) = self.write_spans(offset + done as u64, &data[done..], pages);
                (done + more, r)
            }
            r => (done, r),
        }
    }

    fn write_spans(&self, offset: u64, data: &[u8], pages: &mut i64) -> (usize, Result<()>) {
        let mut done = 0;
        for span in chunk_spans(offset, data.len() as u64) {
            let src = &data[span.buf_range()];
            let r = self.with_chunk(span.chunk, true, pages, |chunk| {
                for ps in span.pages() {
                    self.write_page(chunk, ps.slot, ps.start, &src[ps.buf_range()])?;
                    done += ps.len;
                }
                Ok(())
            });
            if r.is_err() {
                return (done, r);
            }
        }
        (done, Ok(()))
    }

    /// Makes `[offset, offset+length)` read as zeros. With `punch`, whole
    /// pages become holes; without, they become zero pages (allocated zeros,
    /// as NBD's NO_HOLE asks). Needs memory only to rewrite part of a page
    /// that is not raw.
    pub fn zero(&self, offset: u64, length: u64, punch: bool) -> Result<()> {
        self.zero_counted(offset, length, punch, &mut 0)
    }

    /// [`Store::zero`] with a page delta, as [`Store::write_prefix`].
    pub fn zero_counted(
        &self,
        offset: u64,
        length: u64,
        punch: bool,
        pages: &mut i64,
    ) -> Result<()> {
        self.check_range(offset, length)?;
        for span in chunk_spans(offset, length) {
            // Punching a missing chunk is already done.
            self.with_chunk(span.chunk, !punch, pages, |chunk| {
                for ps in span.pages() {
                    let old = chunk.get(ps.slot);
                    if ps.len == PAGE_SIZE {
                        let new = if punch { Slot::Hole } else { Slot::Fill(0) };
                        if old == new {
                            continue;
                        }
                        if old == Slot::Hole {
                            self.claim_page()?;
                        }
                        self.changing(chunk, ps.slot);
                        self.replace(chunk, ps.slot, new, true);
                    } else if !matches!(old, Slot::Hole | Slot::Fill(0)) {
                        self.changing(chunk, ps.slot);
                        self.modify_page(chunk, ps.slot, |page| {
                            page[ps.start..ps.start + ps.len].fill(0)
                        })?;
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// Discards a range: it reads as zeros afterwards and costs nothing.
    pub fn trim(&self, offset: u64, length: u64) -> Result<()> {
        self.zero(offset, length, true)
    }

    /// Makes every hole that `[offset, offset+length)` touches an allocated
    /// zero page (fallocate's default mode); data is left alone. Counts
    /// against `page_limit`, costs no page memory. All or nothing: if the
    /// disk fills up part way, what this call allocated is given back.
    pub fn allocate(&self, offset: u64, length: u64, pages: &mut i64) -> Result<()> {
        self.check_range(offset, length)?;
        // Disk offsets of the pages this call turned from holes into zeros.
        let mut made = Vec::new();
        let mut result = Ok(());
        for span in chunk_spans(offset, length) {
            result = self.with_chunk(span.chunk, true, pages, |chunk| {
                for ps in span.pages() {
                    if chunk.get(ps.slot) == Slot::Hole {
                        self.claim_page()?;
                        self.changing(chunk, ps.slot);
                        self.replace(chunk, ps.slot, Slot::Fill(0), true);
                        made.push(span.offset + ps.buf_off as u64 - ps.start as u64);
                    }
                }
                Ok(())
            });
            if result.is_err() {
                break;
            }
        }
        if result.is_err() {
            for page in made {
                // Only pages still as we left them: a write may have landed.
                self.with_chunk(page / CHUNK_BYTES, false, pages, |chunk| {
                    let i = ((page >> PAGE_SHIFT) as usize) % CHUNK_PAGES;
                    if chunk.get(i) == Slot::Fill(0) {
                        self.changing(chunk, i);
                        self.replace(chunk, i, Slot::Hole, true);
                    }
                    Ok(())
                })
                .expect("punching needs no memory");
            }
        }
        result
    }

    /// Memory is the medium: nothing is buffered above the page table.
    /// With a flush hook (`flush = "persist"`), returns once the hook has
    /// made everything written so far durable. Never call it while holding
    /// the gate: the save it waits for takes the gate.
    pub fn flush(&self) -> Result<()> {
        match self.flush_hook.get() {
            Some(hook) => hook(),
            None => Ok(()),
        }
    }

    /// Sets what `flush` does; once only (later calls are ignored).
    pub fn set_flush_hook(&self, hook: FlushHook) {
        let _ = self.flush_hook.set(hook);
    }

    /// Describes `[offset, offset+length)` as at most `max_extents` runs
    /// (the last one may be cut short). Returns at least one extent when
    /// `length > 0`.
    pub fn extents(&self, offset: u64, length: u64, max_extents: usize) -> Result<Vec<Extent>> {
        self.check_range(offset, length)?;
        let mut out: Vec<Extent> = Vec::new();
        let mut push = |len: u64, kind: ExtentKind| -> bool {
            if let Some(last) = out.last_mut().filter(|l| l.kind == kind) {
                last.length += len;
            } else if out.len() == max_extents {
                return false;
            } else {
                out.push(Extent { length: len, kind });
            }
            true
        };
        'spans: for span in chunk_spans(offset, length) {
            let map = self.shard(span.chunk).read();
            let Some(chunk) = map.get(&span.chunk) else {
                if !push(span.len, ExtentKind::Hole) {
                    break;
                }
                continue;
            };
            for ps in span.pages() {
                let kind = match chunk.get(ps.slot) {
                    Slot::Hole => ExtentKind::Hole,
                    Slot::Fill(0) => ExtentKind::Zero,
                    _ => ExtentKind::Data,
                };
                if !push(ps.len as u64, kind) {
                    break 'spans;
                }
            }
        }
        Ok(out)
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
            max_memory: self.max_memory,
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
        (self.c.live_pages.load(Relaxed), self.page_limit)
    }

    fn check_range(&self, offset: u64, length: u64) -> Result<()> {
        match offset.checked_add(length) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::OutOfRange {
                offset,
                length,
                size: self.size,
            }),
        }
    }

    fn shard(&self, chunk: u64) -> &RwLock<HashMap<u64, Box<Chunk>>> {
        &self.shards[chunk as usize & (SHARDS - 1)].0
    }

    /// Runs `f` on a chunk under its shard's write lock, creating the chunk
    /// if `create`, and dropping it afterwards if it ended up empty.
    fn with_chunk(
        &self,
        idx: u64,
        create: bool,
        pages: &mut i64,
        f: impl FnOnce(&mut Chunk) -> Result<()>,
    ) -> Result<()> {
        let mut map = self.shard(idx).write();
        let chunk = match map.entry(idx) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(_) if !create => return Ok(()),
            Entry::Vacant(e) => {
                self.reserve(CHUNK_META_BYTES)?;
                self.c.chunks.fetch_add(1, Relaxed);
                e.insert(Chunk::new())
            }
        };
        let before = chunk.live;
        let result = f(chunk);
        *pages += chunk.live as i64 - before as i64;
        if chunk.live == 0 && chunk.kept.is_none() {
            self.drop_chunk(&mut map, idx);
        }
        result
    }

    /// Drops an empty chunk, remembering it for the next save.
    fn drop_chunk(&self, map: &mut HashMap<u64, Box<Chunk>>, key: u64) {
        if let Some(chunk) = map.remove(&key) {
            debug_assert!(chunk.live == 0 && chunk.kept.is_none());
            self.c.chunks.fetch_sub(1, Relaxed);
            self.unreserve(CHUNK_META_BYTES);
            if self.track {
                self.gone.lock().insert(key);
            }
        }
    }

    fn write_page(&self, chunk: &mut Chunk, i: usize, start: usize, src: &[u8]) -> Result<()> {
        self.changing(chunk, i);
        let old = chunk.get(i);
        let tiered = self.compress.is_none() || self.compress_after > 0;
        if src.len() == PAGE_SIZE {
            if matches!(old, Slot::Raw { .. }) && tiered {
                // A rewritten raw page keeps its frame, and is hot again.
                return self.modify_page(chunk, i, |page| page.copy_from_slice(src));
            }
            if old == Slot::Hole {
                self.claim_page()?;
            }
            let r = self.store_page(chunk, i, src);
            if r.is_err() && old == Slot::Hole {
                self.c.live_pages.fetch_sub(1, Relaxed);
            }
            return r;
        }
        let cur = match old {
            Slot::Hole => Some(0),
            Slot::Fill(pat) => Some(pat),
            _ => None,
        };
        if cur.is_some_and(|pat| matches_pattern(src, pat, start)) {
            return Ok(());
        }
        if old == Slot::Hole {
            self.claim_page()?;
        }
        let r = self.modify_page(chunk, i, |page| {
            page[start..start + src.len()].copy_from_slice(src)
        });
        if r.is_err() && old == Slot::Hole {
            self.c.live_pages.fetch_sub(1, Relaxed);
        }
        r
    }

    /// Applies `f` to the contents of page `i`: in place for a raw page,
    /// else on a copy that then replaces the slot. A hole must have been
    /// claimed by the caller.
    fn modify_page(&self, chunk: &mut Chunk, i: usize, f: impl FnOnce(&mut [u8])) -> Result<()> {
        let old = chunk.get(i);
        if let Slot::Raw { p, .. } = old {
            // SAFETY: we hold the shard's write lock; the frame is this slot's.
            let page = unsafe { page_mut(p) };
            f(page);
            if let Some(pat) = same_filled(page) {
                self.replace(chunk, i, Slot::Fill(pat), true);
            } else if matches!(old, Slot::Raw { hot: false, .. }) && self.compress_after > 0 {
                // New contents may compress: the scanner gets another look.
                self.replace(chunk, i, Slot::Raw { p, hot: true }, true);
            } else {
                chunk.touch(i);
                // A rewritten page is the scanner's business again.
                chunk.meta[i].fetch_and(!(SETTLED | (MAX_AGE << AGE_SHIFT)), Relaxed);
            }
            return Ok(());
        }
        let mut page = [0u8; PAGE_SIZE];
        match old {
            Slot::Hole => {}
            Slot::Fill(pat) => fill_pattern(&mut page, pat, 0),
            _ => self.decode_into(old, chunk, &mut FrameCache::default(), i, &mut page)?,
        }
        f(&mut page);
        self.store_page(chunk, i, &page)
    }

    /// Replaces slot `i` with a page holding `data`: same-filled, raw or
    /// compressed as the disk's settings and the data say. The slot keeps
    /// its old contents if this fails.
    fn store_page(&self, chunk: &mut Chunk, i: usize, data: &[u8]) -> Result<()> {
        if let Some(pat) = same_filled(data) {
            self.replace(chunk, i, Slot::Fill(pat), true);
            return Ok(());
        }
        if self.compress.is_none() || self.compress_after > 0 {
            match self.alloc_page(false) {
                Ok(p) => {
                    // SAFETY: fresh frame, not yet shared.
                    unsafe { page_mut(p) }.copy_from_slice(data);
                    self.replace(chunk, i, Slot::Raw { p, hot: true }, true);
                    return Ok(());
                }
                // Short of memory for a raw page: a compressed one may fit.
                Err(Error::NoSpace { .. } | Error::SharedNoSpace { .. })
                    if !self.compress.is_none() => {}
                Err(e) => return Err(e),
            }
        }
        let new = self.pack(self.compress, data, chunk.get(i), false)?;
        self.replace(chunk, i, new, true);
        Ok(())
    }

    /// Builds the slot for `data` compressed with `codec`, or a raw page if
    /// it does not compress to `MAX_PACKED`. If `old` is a compressed
    /// object of the same class, or a raw frame that the result needs, it
    /// is reused in place; then the caller must hold the write lock.
    fn pack(&self, codec: Codec, data: &[u8], old: Slot, bg: bool) -> Result<Slot> {
        let mut out = [0u8; MAX_PACKED];
        let n = timed(&self.c.compress_ns, || {
            codec::compress(codec, data, &mut out)
        });
        let Some(n) = n else {
            if let Slot::Raw { p, .. } = old {
                // Keep the frame the page already has (the caller may be
                // compressing that very frame: then there is nothing to copy).
                if !std::ptr::eq(data.as_ptr(), p.as_ptr()) {
                    // SAFETY: the caller holds the write lock over `old`.
                    unsafe { page_mut(p) }.copy_from_slice(data);
                }
                return Ok(Slot::Raw { p, hot: false });
            }
            let p = self.alloc_page(bg)?;
            // SAFETY: fresh frame, not yet shared.
            unsafe { page_mut(p) }.copy_from_slice(data);
            return Ok(Slot::Raw { p, hot: false });
        };
        let h = match old {
            Slot::Packed { h, .. } if h.capacity() == zs::rounded(n) => h,
            _ => match self.alloc_object(n, bg) {
                Ok(h) => h,
                // A new zspage does not fit: a raw page may, better than
                // ENOSPC (the old slot's own frame, if it has one). It is
                // left hot, for the scanner to compress when memory allows.
                Err(Error::NoSpace { .. } | Error::SharedNoSpace { .. }) => {
                    let p = match old {
                        Slot::Raw { p, .. } => p,
                        _ => self.alloc_page(bg)?,
                    };
                    if !std::ptr::eq(data.as_ptr(), p.as_ptr()) {
                        // SAFETY: a fresh frame, or the old slot's frame under
                        // the caller's write lock.
                        unsafe { page_mut(p) }.copy_from_slice(data);
                    }
                    return Ok(Slot::Raw { p, hot: true });
                }
                Err(e) => return Err(e),
            },
        };
        // SAFETY: `h` is fresh, or the old slot's object, whose owner (the
        // caller, under the write lock) is replacing it with this one.
        unsafe { self.zs.write(h, &out[..n]) };
        Ok(Slot::Packed {
            zstd: matches!(codec, Codec::Zstd(_)),
            h,
            len: n as u16,
        })
    }

    fn alloc_object(&self, len: usize, bg: bool) -> Result<Handle> {
        self.zs.alloc(
            len,
            &self.pool,
            |b| self.reserve_for(b, bg),
            |b| self.unreserve(b),
        )
    }

    fn free_object(&self, h: Handle) {
        self.zs.free(h, &self.pool, |b| self.unreserve(b));
    }

    /// Decompresses page `i` (`slot`, compressed) into `dst` (4 KiB).
    fn decode_into(
        &self,
        slot: Slot,
        chunk: &Chunk,
        frame: &mut FrameCache,
        i: usize,
        dst: &mut [u8],
    ) -> Result<()> {
        timed(&self.c.decompress_ns, || match slot {
            Slot::Packed { zstd, h, len } => {
                let codec = if zstd { Codec::Zstd(0) } else { Codec::Lz4 };
                let mut tmp = [0u8; PAGE_SIZE];
                // SAFETY: the object is this slot's and the caller holds the
                // shard lock, so it neither changes nor goes away.
                let src = match unsafe { self.zs.slice(h, len as usize) } {
                    Some(s) => s,
                    None => {
                        unsafe { self.zs.read(h, &mut tmp[..len as usize]) };
                        &tmp[..len as usize]
                    }
                };
                codec::decompress(codec, src, dst)
            }
            Slot::Frame(h) => frame.page(self, chunk.vals[i], h, i, dst),
            _ => unreachable!("decode of an uncompressed slot"),
        })
    }

    /// Gives back a raw frame and its budget.
    fn free_page(&self, p: PagePtr) {
        self.pool.free(p);
        self.unreserve(PAGE_SIZE as u64);
    }

    /// A frame's header: first slot, page count, codec, compressed length.
    ///
    /// SAFETY: the caller holds the shard lock of a slot naming `h`.
    unsafe fn frame_header(&self, h: Handle) -> [u8; FRAME_HEADER] {
        let mut header = [0u8; FRAME_HEADER];
        self.zs.read(h, &mut header);
        header
    }

    /// Reserves and takes one raw frame, for background work if `bg`;
    /// nothing is charged if either fails.
    fn alloc_page(&self, bg: bool) -> Result<PagePtr> {
        self.reserve_for(PAGE_SIZE as u64, bg)?;
        self.pool
            .alloc()
            .inspect_err(|_| self.unreserve(PAGE_SIZE as u64))
    }

    /// Puts `new` in slot `i`, keeping counters right and giving back what
    /// the old slot held (a raw frame, a compressed object, its share of a
    /// frame). Memory `new` holds must already be charged. `touch`: this is
    /// a client's write (the page turns hot and young); else the scanner's
    /// change, which keeps the age.
    fn replace(&self, chunk: &mut Chunk, i: usize, new: Slot, touch: bool) {
        let old = chunk.get(i);
        let (val, kind) = new.encode();
        let old_val = chunk.vals[i];
        chunk.vals[i] = val;
        let meta = chunk.meta[i].load(Relaxed);
        let keep = if touch {
            ACCESSED
        } else {
            meta & !(KIND_MASK | ACCESSED)
        };
        chunk.meta[i].store(kind | keep, Relaxed);
        self.count(old, -1);
        self.count(new, 1);
        match (old, new) {
            (Slot::Hole, Slot::Hole) => {}
            // The caller claimed the page (see `claim_page`).
            (Slot::Hole, _) => chunk.live += 1,
            (_, Slot::Hole) => {
                chunk.live -= 1;
                self.c.live_pages.fetch_sub(1, Relaxed);
            }
            _ => {}
        }
        match old {
            Slot::Raw { p, .. } => {
                if !matches!(new, Slot::Raw { p: np, .. } if np == p) {
                    self.free_page(p);
                }
            }
            Slot::Packed { h, len, .. } => {
                self.c.compressed_bytes.fetch_sub(len as u64, Relaxed);
                if !matches!(new, Slot::Packed { h: nh, .. } if nh == h) {
                    self.free_object(h);
                }
            }
            Slot::Frame(h) => {
                if new != old && chunk.frame_members(old_val).next().is_none() {
                    // SAFETY: the frame's last page is leaving it; we hold
                    // the write lock over every slot that could name it.
                    let header = unsafe { self.frame_header(h) };
                    let len = FRAME_HEADER as u64 + frame_len(&header) as u64;
                    self.c.compressed_bytes.fetch_sub(len, Relaxed);
                    self.c.frames.fetch_sub(1, Relaxed);
                    self.free_object(h);
                }
            }
            Slot::Hole | Slot::Fill(_) => {}
        }
        if let Slot::Packed { len, .. } = new {
            self.c.compressed_bytes.fetch_add(len as u64, Relaxed);
        }
    }

    fn count(&self, slot: Slot, delta: i64) {
        let c = &self.c;
        let counter = match slot {
            Slot::Hole => return,
            Slot::Fill(0) => &c.zero,
            Slot::Fill(_) => &c.fill,
            Slot::Raw { hot: true, .. } => &c.hot,
            Slot::Raw { hot: false, .. } => &c.huge,
            Slot::Packed { .. } => &c.packed,
            Slot::Frame(_) => &c.frame_pages,
        };
        if delta > 0 {
            counter.fetch_add(1, Relaxed);
        } else {
            counter.fetch_sub(1, Relaxed);
        }
    }

    /// Counts one more non-hole page against `page_limit`; to be called
    /// before a hole is replaced by anything else.
    fn claim_page(&self) -> Result<()> {
        self.c
            .live_pages
            .fetch_update(Relaxed, Relaxed, |n| (n < self.page_limit).then_some(n + 1))
            .map(|_| ())
            .map_err(|_| Error::DiskFull {
                limit: self.page_limit.saturating_mul(PAGE_SIZE as u64),
            })
    }

    /// Reserves budget for a client's request: everything but the
    /// background headroom.
    fn reserve(&self, bytes: u64) -> Result<()> {
        // Pages kept for a save under way do not count against clients:
        // saving must never make a write fail.
        let kept = self.c.kept.load(Relaxed);
        self.reserve_within(bytes, self.max_memory - self.headroom + kept)
    }

    /// Reserves budget for background work (all of `max_memory`), or for a
    /// client if `bg` is false.
    fn reserve_for(&self, bytes: u64, bg: bool) -> Result<()> {
        match bg {
            true => self.reserve_within(bytes, self.max_memory),
            false => self.reserve(bytes),
        }
    }

    fn reserve_within(&self, bytes: u64, limit: u64) -> Result<()> {
        self.c
            .memory_used
            .fetch_update(Relaxed, Relaxed, |used| {
                used.checked_add(bytes).filter(|&n| n <= limit)
            })
            .map_err(|_| Error::NoSpace {
                needed: bytes,
                limit: self.max_memory,
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

    fn unreserve(&self, bytes: u64) {
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
    fn under_pressure(&self) -> bool {
        self.c.pressure.load(Relaxed)
    }

    /// Memory use above which a pass compresses every hot page, and reads
    /// stop promoting: 7/8 of the clients' budget.
    fn pressure_mark(&self) -> u64 {
        (self.max_memory - self.headroom) / 8 * 7
    }
}

/// Background work: ageing, compressing idle pages, re-packing cold ones
/// into frames, compaction. Run by `ramd`'s scanner threads every
/// [`Store::scanner_period`]; each call is one pass over the shards that
/// `part % parts` selects.
impl Store {
    /// Starts a pass: plans compaction if the allocator is fragmented.
    /// Call once, before the `background_pass` calls of every part.
    pub fn begin_pass(&self) -> PassGuard<'_> {
        let guard = PassGuard(self.passing.lock());
        self.c.idle_pass.store(0, Relaxed);
        let tight = self.c.memory_used.load(Relaxed) > self.pressure_mark();
        self.c.pressure.store(tight, Relaxed);
        self.zs.plan_compaction();
        guard
    }

    /// Ends a pass: zspages that could not be emptied take objects again.
    pub fn end_pass(&self, guard: PassGuard<'_>) {
        self.zs.finish_compaction();
        self.c.idle.store(self.c.idle_pass.load(Relaxed), Relaxed);
        drop(guard);
    }

    /// Compaction on a client's behalf, when its request found no memory:
    /// moves the objects out of the emptiest zspages of fragmented classes,
    /// so the zspages go back to the pool. Waits for a background pass
    /// under way. Returns whether it moved anything (so a retry may fit).
    fn compact_now(&self) -> bool {
        let _pass = self.passing.lock();
        let mut report = PassReport::default();
        if self.zs.plan_compaction() > 0 {
            for shard in self.shards.iter() {
                let keys: Vec<u64> = shard.0.read().keys().copied().collect();
                for key in keys {
                    let moves: Vec<usize> = {
                        let map = shard.0.read();
                        let Some(chunk) = map.get(&key) else { continue };
                        (0..CHUNK_PAGES)
                            .filter(|&i| match chunk.get(i) {
                                Slot::Packed { h, .. } | Slot::Frame(h) => self.zs.is_evacuating(h),
                                _ => false,
                            })
                            .collect()
                    };
                    for i in moves {
                        if report.starved {
                            break;
                        }
                        self.run_due(&shard.0, key, Due::Move(i), &mut report);
                    }
                }
            }
        }
        self.zs.finish_compaction();
        if report.moved > 0 {
            log::debug!("compaction for a client: {report:?}");
        }
        report.moved > 0
    }

    /// One pass over the shards `s` with `s % parts == part`.
    pub fn background_pass(&self, part: usize, parts: usize) -> PassReport {
        let cpu = thread_cpu_ns();
        let mut report = PassReport::default();
        let mut idle = 0;
        for s in (part..SHARDS).step_by(parts.max(1)) {
            let keys: Vec<u64> = self.shards[s].0.read().keys().copied().collect();
            for key in keys {
                // Ages and idle counts go on when starved; new work does not.
                idle += self.scan_chunk(s, key, &mut report);
            }
        }
        // Each part adds its share; end_pass publishes the sum.
        self.c.idle_pass.fetch_add(idle, Relaxed);
        self.c
            .background_ns
            .fetch_add(thread_cpu_ns().saturating_sub(cpu), Relaxed);
        report
    }

    /// Runs [`Store::begin_pass`], every part, [`Store::end_pass`] on this
    /// thread: what tests and single-threaded callers want.
    pub fn background_pass_all(&self) -> PassReport {
        let guard = self.begin_pass();
        let r = self.background_pass(0, 1);
        self.end_pass(guard);
        r
    }

    /// Ages one chunk's pages and does what is due; returns its idle pages.
    fn scan_chunk(&self, shard: usize, key: u64, report: &mut PassReport) -> u64 {
        let lock = &self.shards[shard].0;
        let mut idle = 0;
        let mut due = Vec::new();
        {
            let map = lock.read();
            let Some(chunk) = map.get(&key) else { return 0 };
            let pressure = self.under_pressure();
            for i in 0..CHUNK_PAGES {
                let m = &chunk.meta[i];
                let old = m.load(Relaxed);
                let kind = old & KIND_MASK;
                if kind == K_HOLE || kind == K_FILL {
                    continue;
                }
                let age = if old & ACCESSED != 0 {
                    0
                } else {
                    ((old >> AGE_SHIFT) + 1).min(MAX_AGE)
                };
                let new = (old & (KIND_MASK | SETTLED)) | age << AGE_SHIFT;
                // A reader that sets ACCESSED meanwhile wins: the page is in use.
                let _ = m.compare_exchange(old, new, Relaxed, Relaxed);
                if age >= self.idle_after {
                    idle += 1;
                }
                let evacuate = match chunk.get(i) {
                    Slot::Packed { h, .. } | Slot::Frame(h) => self.zs.is_evacuating(h),
                    _ => false,
                };
                if evacuate {
                    due.push(Due::Move(i));
                } else if kind == K_RAW_HOT
                    && !self.compress.is_none()
                    && (age >= self.compress_after || pressure)
                {
                    due.push(Due::Compress(i));
                }
            }
            if !self.recompress.is_none() {
                self.plan_repack(chunk, &mut due);
            }
        }
        for d in due {
            if report.starved {
                break;
            }
            self.run_due(lock, key, d, report);
        }
        idle
    }

    /// Finds runs of idle, unsettled pages to re-pack, and frames that lost
    /// most of their pages.
    fn plan_repack(&self, chunk: &Chunk, due: &mut Vec<Due>) {
        let idle = |i: usize| {
            let m = chunk.meta[i].load(Relaxed);
            let kind = m & KIND_MASK;
            // Pages the first codec found incompressible too: a frame of
            // neighbours, or a stronger codec, may still shrink them.
            m & SETTLED == 0
                && (m >> AGE_SHIFT) >= self.idle_after
                && matches!(kind, K_RAW_HOT | K_RAW_HUGE | K_LZ4 | K_ZSTD)
        };
        let mut i = 0;
        while i < CHUNK_PAGES {
            if !idle(i) {
                i += 1;
                continue;
            }
            let start = i;
            while i < CHUNK_PAGES && i - start < FRAME_PAGES && idle(i) {
                i += 1;
            }
            due.push(Due::Repack(start, i - start));
        }
        let mut seen = Vec::new();
        for i in 0..CHUNK_PAGES {
            if chunk.kind(i) != K_FRAME || seen.contains(&chunk.vals[i]) {
                continue;
            }
            seen.push(chunk.vals[i]);
            let Slot::Frame(h) = chunk.get(i) else {
                unreachable!()
            };
            // SAFETY: read lock held; the frame is named by slot i.
            let header = unsafe { self.frame_header(h) };
            let members = chunk.frame_members(chunk.vals[i]).count();
            if members * 2 <= header[1] as usize {
                due.push(Due::Split(chunk.vals[i]));
            }
        }
    }

    fn run_due(
        &self,
        lock: &RwLock<HashMap<u64, Box<Chunk>>>,
        key: u64,
        due: Due,
        report: &mut PassReport,
    ) {
        // Upgradable: readers go on while we compress; writers wait, so
        // what we compressed is still what the slot holds when we swap.
        let map = lock.upgradable_read();
        let Some(chunk) = map.get(&key) else { return };
        let r = match due {
            Due::Compress(i) => self.compress_hot(map, key, i, report),
            Due::Repack(start, n) => self.repack(map, key, start, n, report),
            Due::Split(val) => self.split_frame(map, key, val, report),
            Due::Move(i) => {
                let _ = chunk;
                self.move_object(map, key, i, report)
            }
        };
        match r {
            Ok(()) => {}
            // Even the headroom is used up (by zspages of other classes):
            // this pass stops compressing; the next one tries again.
            Err(
                Error::NoSpace { .. } | Error::SharedNoSpace { .. } | Error::HostMemoryLow { .. },
            ) => report.starved = true,
            // Data failed to decode: the page keeps what it held.
            Err(e) => log::warn!("background work on chunk {key}: {e}"),
        }
    }

    fn compress_hot(
        &self,
        map: RwLockUpgradableReadGuard<'_, HashMap<u64, Box<Chunk>>>,
        key: u64,
        i: usize,
        report: &mut PassReport,
    ) -> Result<()> {
        let chunk = &map[&key];
        let Slot::Raw { p, hot: true } = chunk.get(i) else {
            return Ok(());
        };
        // SAFETY: the frame is slot i's; writers are held off by our lock.
        let data = unsafe { page_ref(p) };
        // Passing the raw slot lets an incompressible page keep its frame
        // (nothing is written to it: `data` is that frame).
        let new = self.pack(self.compress, data, chunk.get(i), true)?;
        if matches!(new, Slot::Raw { hot: true, .. }) {
            // It compressed, but no zspage fits even in the headroom: the
            // page stays as it is, and this pass stops trying.
            return Err(Error::NoSpace {
                needed: PAGE_SIZE as u64,
                limit: self.max_memory,
            });
        }
        let mut map = RwLockUpgradableReadGuard::upgrade(map);
        let chunk = map.get_mut(&key).expect("chunk kept under lock");
        self.replace(chunk, i, new, false);
        report.compressed += 1;
        Ok(())
    }

    /// Re-packs pages `start..start+n` with the recompress codec: into one
    /// frame if `n > 1`, else alone. Kept only if it saves memory; the
    /// pages are settled either way so the next pass does not retry.
    fn repack(
        &self,
        map: RwLockUpgradableReadGuard<'_, HashMap<u64, Box<Chunk>>>,
        key: u64,
        start: usize,
        n: usize,
        report: &mut PassReport,
    ) -> Result<()> {
        let chunk = &map[&key];
        let codec = self.recompress;
        let mut plain = vec![0u8; n * PAGE_SIZE];
        let mut before = 0usize;
        for (k, page) in plain.chunks_exact_mut(PAGE_SIZE).enumerate() {
            let slot = chunk.get(start + k);
            match slot {
                Slot::Raw { p, .. } => {
                    // SAFETY: slot's frame; writers held off by our lock.
                    page.copy_from_slice(unsafe { page_ref(p) });
                    before += PAGE_SIZE;
                }
                Slot::Packed { h, .. } => {
                    self.decode_into(slot, chunk, &mut FrameCache::default(), start + k, page)?;
                    before += h.capacity();
                }
                // Changed since planned (the plan is made under another lock).
                _ => return Ok(()),
            }
        }
        let new: Vec<Slot> = if n == 1 {
            let old = chunk.get(start);
            if matches!(old, Slot::Packed { zstd, .. } if zstd == matches!(codec, Codec::Zstd(_))) {
                vec![]
            } else {
                let s = self.pack(codec, &plain, Slot::Hole, true)?;
                vec![s]
            }
        } else {
            let mut out = vec![0u8; FRAME_HEADER + before.min(zs::MAX_OBJECT - FRAME_HEADER)];
            let len = timed(&self.c.compress_ns, || {
                codec::compress(codec, &plain, &mut out[FRAME_HEADER..])
            });
            match len.filter(|&l| zs::rounded(FRAME_HEADER + l) < before) {
                Some(len) => {
                    out[0] = start as u8;
                    out[1] = n as u8;
                    out[2] = codec_id(codec);
                    out[4..8].copy_from_slice(&(len as u32).to_le_bytes());
                    let h = self.alloc_object(FRAME_HEADER + len, true)?;
                    // SAFETY: fresh object, not yet published.
                    unsafe { self.zs.write(h, &out[..FRAME_HEADER + len]) };
                    self.c
                        .compressed_bytes
                        .fetch_add((FRAME_HEADER + len) as u64, Relaxed);
                    self.c.frames.fetch_add(1, Relaxed);
                    vec![Slot::Frame(h); n]
                }
                None => vec![],
            }
        };
        let mut map = RwLockUpgradableReadGuard::upgrade(map);
        let chunk = map.get_mut(&key).expect("chunk kept under lock");
        for (k, slot) in new.iter().enumerate() {
            if let Slot::Raw { .. } = slot {
                // Did not compress; a raw copy would only churn.
                self.drop_unpublished(*slot);
                continue;
            }
            self.replace(chunk, start + k, *slot, false);
        }
        for k in 0..n {
            chunk.meta[start + k].fetch_or(SETTLED, Relaxed);
        }
        report.repacked += new.len() as u64;
        Ok(())
    }

    /// Stores the pages still in a frame alone, freeing the frame.
    fn split_frame(
        &self,
        map: RwLockUpgradableReadGuard<'_, HashMap<u64, Box<Chunk>>>,
        key: u64,
        val: u64,
        report: &mut PassReport,
    ) -> Result<()> {
        let chunk = &map[&key];
        let members: Vec<usize> = chunk.frame_members(val).collect();
        let codec = if self.compress.is_none() {
            self.recompress
        } else {
            self.compress
        };
        let mut frame = FrameCache::default();
        let mut new = Vec::with_capacity(members.len());
        for &i in &members {
            let mut page = [0u8; PAGE_SIZE];
            self.decode_into(chunk.get(i), chunk, &mut frame, i, &mut page)?;
            match self.pack(codec, &page, Slot::Hole, true) {
                Ok(s) => new.push(s),
                Err(e) => {
                    new.into_iter().for_each(|s| self.drop_unpublished(s));
                    return Err(e);
                }
            }
        }
        let mut map = RwLockUpgradableReadGuard::upgrade(map);
        let chunk = map.get_mut(&key).expect("chunk kept under lock");
        for (&i, s) in members.iter().zip(new) {
            self.replace(chunk, i, s, false);
            chunk.meta[i].fetch_or(SETTLED, Relaxed);
        }
        report.split += 1;
        Ok(())
    }

    /// Moves the object slot `i` names (and every slot sharing it) out of a
    /// zspage that compaction is emptying.
    fn move_object(
        &self,
        map: RwLockUpgradableReadGuard<'_, HashMap<u64, Box<Chunk>>>,
        key: u64,
        i: usize,
        report: &mut PassReport,
    ) -> Result<()> {
        let mut map = RwLockUpgradableReadGuard::upgrade(map);
        let chunk = map.get_mut(&key).expect("chunk kept under lock");
        let (val, kind) = (chunk.vals[i], chunk.kind(i));
        let (h, len) = match chunk.get(i) {
            Slot::Packed { h, len, .. } => (h, len as usize),
            Slot::Frame(h) => {
                // SAFETY: write lock held; slot i names this frame.
                let header = unsafe { self.frame_header(h) };
                (h, FRAME_HEADER + frame_len(&header))
            }
            _ => return Ok(()),
        };
        if !self.zs.is_evacuating(h) {
            return Ok(());
        }
        let nh = self.alloc_object(len, true)?;
        let mut buf = vec![0u8; len];
        // SAFETY: write lock held over every slot naming `h`; `nh` is fresh.
        unsafe {
            self.zs.read(h, &mut buf);
            self.zs.write(nh, &buf);
        }
        let pad = val >> 56;
        let nval = nh.encode() | if kind == K_FRAME { 0 } else { pad << 56 };
        debug_assert_eq!(h.capacity(), nh.capacity());
        for j in 0..CHUNK_PAGES {
            if chunk.vals[j] == val && chunk.kind(j) == kind {
                chunk.vals[j] = nval;
            }
        }
        self.free_object(h);
        self.c.compacted.fetch_add(1, Relaxed);
        report.moved += 1;
        Ok(())
    }

    /// Gives back what a slot built by `pack` holds, before it is published.
    fn drop_unpublished(&self, s: Slot) {
        match s {
            Slot::Raw { p, .. } => self.free_page(p),
            Slot::Packed { h, .. } => self.free_object(h),
            _ => {}
        }
    }
}

#[derive(Clone, Copy)]
enum Due {
    Compress(usize),
    Repack(usize, usize),
    Split(u64),
    Move(usize),
}

/// The frame last decompressed while one shard lock is held, so that a
/// request over many pages of one frame decompresses it once.
#[derive(Default)]
struct FrameCache {
    val: Option<u64>,
    data: Vec<u8>,
    start: usize,
}

impl FrameCache {
    fn page(&mut self, store: &Store, val: u64, h: Handle, i: usize, dst: &mut [u8]) -> Result<()> {
        if self.val != Some(val) {
            // SAFETY: the caller holds the shard lock of a slot naming `h`.
            let header = unsafe { store.frame_header(h) };
            let (start, n, len) = (header[0] as usize, header[1] as usize, frame_len(&header));
            if n == 0 || start + n > CHUNK_PAGES || FRAME_HEADER + len > h.capacity() {
                return Err(Error::Corrupt(format!("frame header {header:?}")));
            }
            let mut packed = vec![0u8; FRAME_HEADER + len];
            unsafe { store.zs.read(h, &mut packed) };
            self.data.resize(n * PAGE_SIZE, 0);
            codec::decompress(
                codec_of(header[2])?,
                &packed[FRAME_HEADER..],
                &mut self.data,
            )?;
            self.val = Some(val);
            self.start = start;
        }
        let k = i
            .checked_sub(self.start)
            .filter(|k| k * PAGE_SIZE < self.data.len());
        let Some(k) = k else {
            return Err(Error::Corrupt(format!("page {i} outside its frame")));
        };
        dst.copy_from_slice(&self.data[k * PAGE_SIZE..(k + 1) * PAGE_SIZE]);
        Ok(())
    }
}

fn frame_len(header: &[u8; FRAME_HEADER]) -> usize {
    u32::from_le_bytes(header[4..8].try_into().expect("4 bytes")) as usize
}

fn codec_id(c: Codec) -> u8 {
    match c {
        Codec::None => 0,
        Codec::Lz4 => 1,
        Codec::Zstd(_) => 2,
    }
}

fn codec_of(id: u8) -> Result<Codec> {
    match id {
        1 => Ok(Codec::Lz4),
        2 => Ok(Codec::Zstd(0)),
        _ => Err(Error::Corrupt(format!("frame codec id {id}"))),
    }
}

/// Compresses one page as a store would keep it: `Some((zstd, len))` if
/// `codec` shrinks it to at most `MAX_PACKED` bytes of `out`, else `None`
/// (the page stays raw). For tools that build images (`ramd image import`).
pub fn compress_page(
    codec: Codec,
    page: &[u8],
    out: &mut [u8; PAGE_SIZE],
) -> Option<(bool, usize)> {
    if codec.is_none() {
        return None;
    }
    let n = codec::compress(codec, page, &mut out[..MAX_PACKED])?;
    Some((matches!(codec, Codec::Zstd(_)), n))
}

/// The scanner's period: a quarter of the shortest delay it must notice,
/// between 50 ms and 1 s, and long enough that the longest fits the age
/// field.
fn scanner_tick(cfg: &StoreConfig) -> Duration {
    let delays = [cfg.compress_after, cfg.idle_after];
    let shortest = delays.iter().filter(|d| !d.is_zero()).min().copied();
    let mut tick = shortest.map_or(Duration::from_secs(1), |d| d / 4);
    tick = tick.clamp(Duration::from_millis(50), Duration::from_secs(1));
    let longest = delays.iter().max().copied().unwrap_or_default();
    tick.max(longest / (MAX_AGE as u32 - 1))
}

/// Runs `f`, adding its elapsed time to `counter`. Codec calls are pure
/// computation, so this is their CPU time unless threads outnumber cores
/// and the call is preempted. (The thread CPU clock would say it exactly,
/// but it is a system call, ~0.5 µs here, and timing only some calls with
/// it was measured to overstate them by 3-20%: the system call itself slows
/// the compression that follows it.)
fn timed<T>(counter: &AtomicU64, f: impl FnOnce() -> T) -> T {
    let start = std::time::Instant::now();
    let r = f();
    counter.fetch_add(start.elapsed().as_nanos() as u64, Relaxed);
    r
}

fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a pointer to a local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
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

/// SAFETY: the caller owns `p` (it is in a slot whose shard lock it holds
/// for reading, or it is fresh from the pool) and nobody mutates it meanwhile.
unsafe fn page_ref<'a>(p: PagePtr) -> &'a [u8] {
    std::slice::from_raw_parts(p.as_ptr(), PAGE_SIZE)
}

/// SAFETY: the caller has exclusive access to `p` (write lock on its shard,
/// or fresh from the pool) for the lifetime of the returned slice.
#[allow(clippy::mut_from_ref)]
unsafe fn page_mut<'a>(p: PagePtr) -> &'a mut [u8] {
    std::slice::from_raw_parts_mut(p.as_ptr(), PAGE_SIZE)
}

/// `Some(p)` if every aligned 8 bytes of `page` equal `p` (native endian).
fn same_filled(page: &[u8]) -> Option<u64> {
    debug_assert_eq!(page.len(), PAGE_SIZE);
    let first = u64::from_ne_bytes(page[..8].try_into().expect("8 bytes"));
    page.chunks_exact(8)
        .all(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")) == first)
        .then_some(first)
}

/// Whether `src`, placed at `start` in a page filled with `pat`, changes nothing.
fn matches_pattern(src: &[u8], pat: u64, start: usize) -> bool {
    let pb = pat.to_ne_bytes();
    src.iter()
        .enumerate()
        .all(|(j, &b)| b == pb[(start + j) & 7])
}

/// Fills `dst` with the bytes a `pat`-filled page has from in-page `start` on.
fn fill_pattern(dst: &mut [u8], pat: u64, start: usize) {
    if pat == 0 {
        dst.fill(0);
        return;
    }
    let pb = pat.to_ne_bytes();
    for (j, b) in dst.iter_mut().enumerate() {
        *b = pb[(start + j) & 7];
    }
}

/// One chunk's share of a request.
struct ChunkSpan {
    chunk: u64,
    /// Disk offset where this share starts.
    offset: u64,
    len: u64,
    /// Where this share starts in the request's buffer.
    buf_off: usize,
}

/// One page's share of a chunk span.
struct PageSpan {
    slot: usize,
    /// Offset inside the page.
    start: usize,
    len: usize,
    /// Offset inside the chunk span's buffer.
    buf_off: usize,
}

impl ChunkSpan {
    fn buf_range(&self) -> std::ops::Range<usize> {
        self.buf_off..self.buf_off + self.len as usize
    }

    fn pages(&self) -> impl Iterator<Item = PageSpan> {
        let (mut off, end, base) = (self.offset, self.offset + self.len, self.offset);
        std::iter::from_fn(move || {
            if off >= end {
                return None;
            }
            let start = (off % PAGE_SIZE as u64) as usize;
            let len = (PAGE_SIZE - start).min((end - off) as usize);
            let ps = PageSpan {
                slot: ((off >> PAGE_SHIFT) as usize) % CHUNK_PAGES,
                start,
                len,
                buf_off: (off - base) as usize,
            };
            off += len as u64;
            Some(ps)
        })
    }
}

impl PageSpan {
    fn buf_range(&self) -> std::ops::Range<usize> {
        self.buf_off..self.buf_off + self.len
    }
}

/// Cuts `[offset, offset+length)` at chunk boundaries. The caller has checked
/// that the range does not overflow.
fn chunk_spans(offset: u64, length: u64) -> impl Iterator<Item = ChunkSpan> {
    let end = offset + length;
    let mut off = offset;
    std::iter::from_fn(move || {
        if off >= end {
            return None;
        }
        let chunk = off / CHUNK_BYTES;
        let len = ((chunk + 1) * CHUNK_BYTES).min(end) - off;
        let span = ChunkSpan {
            chunk,
            offset: off,
            len,
            buf_off: (off - offset) as usize,
        };
        off += len;
        Some(span)
    })
}
