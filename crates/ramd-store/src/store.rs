//! The sparse page table and the operations every frontend uses.
//!
//! Layout: the disk is cut into 256 KiB *chunks* of 64 page slots. A chunk
//! exists only while one of its slots holds something, so an untouched disk
//! costs nothing and a disk of 2^63 bytes is as cheap as one of 1 GiB.
//! Chunks live in `SHARDS` hash maps, each behind its own lock; consecutive
//! chunks land in different shards, so concurrent random I/O rarely meets on
//! one lock while a 1 MiB request takes at most five locks. Chunks are small
//! so that a small file of a filesystem disk (one object per file) costs
//! ~1 KiB of slot metadata, not the 8 KiB a 2 MiB chunk would.
//!
//! A slot is one of three things (16 bytes each):
//! - `Hole`: never written, trimmed, or zeroed with holes allowed;
//! - `Fill(p)`: every 8 bytes of the page equal `p` (zero pages included):
//!   no page memory;
//! - `Data(ptr)`: a 4 KiB frame from the pool.
//!
//! Invariants:
//! - `memory_used` = `data_pages * PAGE_SIZE + chunks * CHUNK_META_BYTES`,
//!   and it never exceeds `max_memory`: memory is reserved before it is taken.
//! - A page's old contents stay readable until its replacement is complete:
//!   a failed allocation leaves the slot as it was.
//! - A `Data` frame is referenced by exactly one slot; its bytes are touched
//!   only under its shard's lock (read lock to read, write lock to change).

use std::collections::hash_map::{Entry, HashMap};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::RwLock;

use crate::error::{Error, Result};
use crate::pool::{PagePool, PagePtr, PoolStats};
use crate::PAGE_SIZE;

const PAGE_SHIFT: u32 = 12;
const CHUNK_PAGES: usize = 64;
/// Bytes of disk one chunk covers.
pub const CHUNK_BYTES: u64 = (CHUNK_PAGES * PAGE_SIZE) as u64;
/// Power of two; 128 locks for 2 cores keeps collisions of 32 in-flight
/// random requests rare.
const SHARDS: usize = 128;

/// Largest disk: what qemu and the kernel accept (signed 64-bit offsets).
pub const MAX_SIZE: u64 = i64::MAX as u64;

/// Memory charged for one chunk: its slot array plus the hash-map entry and
/// allocator header that hold it.
pub const CHUNK_META_BYTES: u64 = (std::mem::size_of::<Chunk>() + 48) as u64;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Slot {
    Hole,
    Fill(u64),
    Data(PagePtr),
}

struct Chunk {
    slots: [Slot; CHUNK_PAGES],
    /// Slots that are not `Hole`; the chunk is dropped when this reaches 0.
    live: u32,
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

/// How a store is sized and guarded.
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
}

impl StoreConfig {
    pub fn new(size: u64) -> StoreConfig {
        StoreConfig {
            size,
            max_memory: None,
            warm_pool: 64 << 20,
            host_reserve: default_host_reserve(),
            page_limit: None,
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

/// A snapshot of the store's accounting, for `ramd status`.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct StoreStats {
    pub size: u64,
    pub max_memory: u64,
    /// Bytes of the disk that are not holes (data, zero and same-filled pages).
    pub used_bytes: u64,
    /// Pages + page-table metadata, as charged against `max_memory`.
    pub memory_used: u64,
    pub data_pages: u64,
    /// Same-filled pages other than zero, stored as their 8-byte pattern.
    pub fill_pages: u64,
    /// Pages written or zeroed to all-zero, stored as nothing.
    pub zero_pages: u64,
    pub chunks: u64,
    /// Page-table metadata plus what frontends charged (inodes, names...).
    pub metadata_bytes: u64,
    pub pool: PoolStats,
}

pub struct Store {
    size: u64,
    max_memory: u64,
    shards: Box<[Shard]>,
    memory_used: AtomicU64,
    data_pages: AtomicU64,
    fill_pages: AtomicU64,
    zero_pages: AtomicU64,
    chunks: AtomicU64,
    /// Slots that are not holes; bounded by `page_limit`.
    live_pages: AtomicU64,
    page_limit: u64,
    /// Bytes frontends charged for their own metadata (see `charge`).
    charged: AtomicU64,
    // Declared last: dropped after the page table that points into it.
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
        let max_memory = cfg.max_memory.unwrap_or_else(|| full_disk_memory(cfg.size));
        if max_memory < PAGE_SIZE as u64 + CHUNK_META_BYTES {
            return Err(Error::Invalid(format!(
                "max_memory {max_memory} bytes cannot hold a single page (needs {})",
                PAGE_SIZE as u64 + CHUNK_META_BYTES
            )));
        }
        let shards = (0..SHARDS)
            .map(|_| Shard(RwLock::new(HashMap::new())))
            .collect();
        Ok(Store {
            size: cfg.size,
            max_memory,
            shards,
            memory_used: AtomicU64::new(0),
            data_pages: AtomicU64::new(0),
            fill_pages: AtomicU64::new(0),
            zero_pages: AtomicU64::new(0),
            chunks: AtomicU64::new(0),
            live_pages: AtomicU64::new(0),
            page_limit: cfg.page_limit.unwrap_or(u64::MAX),
            charged: AtomicU64::new(0),
            pool: PagePool::new(cfg.warm_pool, cfg.host_reserve),
        })
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn max_memory(&self) -> u64 {
        self.max_memory
    }

    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_range(offset, buf.len() as u64)?;
        for span in chunk_spans(offset, buf.len() as u64) {
            let out = &mut buf[span.buf_range()];
            let map = self.shard(span.chunk).read();
            let Some(chunk) = map.get(&span.chunk) else {
                out.fill(0);
                continue;
            };
            for ps in span.pages() {
                let dst = &mut out[ps.buf_range()];
                match chunk.slots[ps.slot] {
                    Slot::Hole => dst.fill(0),
                    Slot::Fill(pat) => fill_pattern(dst, pat, ps.start),
                    Slot::Data(p) => {
                        // SAFETY: the frame belongs to this slot and we hold
                        // the shard's read lock, so nobody writes it now.
                        let page = unsafe { page_ref(p) };
                        dst.copy_from_slice(&page[ps.start..ps.start + ps.len]);
                    }
                }
            }
        }
        Ok(())
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
    /// as NBD's NO_HOLE asks). Never needs memory except to split a page
    /// of a non-zero pattern.
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
                    if ps.len == PAGE_SIZE {
                        let new = if punch { Slot::Hole } else { Slot::Fill(0) };
                        if chunk.slots[ps.slot] == Slot::Hole && new != Slot::Hole {
                            self.claim_page()?;
                        }
                        self.replace(chunk, ps.slot, new);
                    } else {
                        self.zero_partial(chunk, ps.slot, ps.start, ps.len)?;
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
                    if chunk.slots[ps.slot] == Slot::Hole {
                        self.claim_page()?;
                        self.replace(chunk, ps.slot, Slot::Fill(0));
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
                    if chunk.slots[i] == Slot::Fill(0) {
                        self.replace(chunk, i, Slot::Hole);
                    }
                    Ok(())
                })
                .expect("punching needs no memory");
            }
        }
        result
    }

    /// Memory is the medium: nothing is buffered above the page table.
    pub fn flush(&self) -> Result<()> {
        Ok(())
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
                let kind = match chunk.slots[ps.slot] {
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
        let chunks = self.chunks.load(Relaxed);
        let data = self.data_pages.load(Relaxed);
        let fill = self.fill_pages.load(Relaxed);
        let zero = self.zero_pages.load(Relaxed);
        StoreStats {
            size: self.size,
            max_memory: self.max_memory,
            used_bytes: ((data + fill + zero) * PAGE_SIZE as u64).min(self.size),
            memory_used: self.memory_used.load(Relaxed),
            data_pages: data,
            fill_pages: fill,
            zero_pages: zero,
            chunks,
            metadata_bytes: chunks * CHUNK_META_BYTES + self.charged.load(Relaxed),
            pool: self.pool.stats(),
        }
    }

    /// Charges `bytes` of a frontend's own metadata (inodes, directory
    /// entries, xattrs) against `max_memory`: ENOSPC if it does not fit.
    pub fn charge(&self, bytes: u64) -> Result<()> {
        self.reserve(bytes)?;
        self.charged.fetch_add(bytes, Relaxed);
        Ok(())
    }

    /// Returns what [`Store::charge`] took.
    pub fn uncharge(&self, bytes: u64) {
        let before = self.charged.fetch_sub(bytes, Relaxed);
        debug_assert!(before >= bytes, "uncharge of more than was charged");
        self.unreserve(bytes);
    }

    /// Pages that are not holes, and the cap on them.
    pub fn pages_used(&self) -> (u64, u64) {
        (self.live_pages.load(Relaxed), self.page_limit)
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
                self.chunks.fetch_add(1, Relaxed);
                e.insert(Box::new(Chunk {
                    slots: [Slot::Hole; CHUNK_PAGES],
                    live: 0,
                }))
            }
        };
        let before = chunk.live;
        let result = f(chunk);
        *pages += chunk.live as i64 - before as i64;
        if chunk.live == 0 {
            map.remove(&idx);
            self.chunks.fetch_sub(1, Relaxed);
            self.unreserve(CHUNK_META_BYTES);
        }
        result
    }

    fn write_page(&self, chunk: &mut Chunk, i: usize, start: usize, src: &[u8]) -> Result<()> {
        let full = src.len() == PAGE_SIZE;
        match chunk.slots[i] {
            Slot::Data(p) => {
                // SAFETY: we hold the shard's write lock; the frame is this slot's.
                let page = unsafe { page_mut(p) };
                page[start..start + src.len()].copy_from_slice(src);
                // A page can only have become same-filled if what we wrote
                // repeats with period 8; checking that first keeps the 4 KiB
                // scan off ordinary partial writes.
                if full || repeats_every_8(src) {
                    if let Some(pat) = same_filled(page) {
                        self.replace(chunk, i, Slot::Fill(pat));
                    }
                }
            }
            old @ (Slot::Hole | Slot::Fill(_)) => {
                let cur = if let Slot::Fill(pat) = old { pat } else { 0 };
                let same = if full { same_filled(src) } else { None };
                if !full && matches_pattern(src, cur, start) {
                    return Ok(());
                }
                if old == Slot::Hole {
                    self.claim_page()?;
                }
                if let Some(pat) = same {
                    self.replace(chunk, i, Slot::Fill(pat));
                    return Ok(());
                }
                let p = match self.alloc_page() {
                    Ok(p) => p,
                    Err(e) => {
                        if old == Slot::Hole {
                            self.live_pages.fetch_sub(1, Relaxed);
                        }
                        return Err(e);
                    }
                };
                // SAFETY: the frame is fresh from the pool and not yet shared.
                let page = unsafe { page_mut(p) };
                if !full {
                    fill_pattern(page, cur, 0);
                }
                page[start..start + src.len()].copy_from_slice(src);
                self.replace(chunk, i, Slot::Data(p));
            }
        }
        Ok(())
    }

    fn zero_partial(&self, chunk: &mut Chunk, i: usize, start: usize, len: usize) -> Result<()> {
        match chunk.slots[i] {
            Slot::Hole | Slot::Fill(0) => Ok(()),
            Slot::Data(p) => {
                // SAFETY: write lock held; the frame is this slot's.
                let page = unsafe { page_mut(p) };
                page[start..start + len].fill(0);
                if let Some(pat) = same_filled(page) {
                    self.replace(chunk, i, Slot::Fill(pat));
                }
                Ok(())
            }
            Slot::Fill(pat) => {
                let p = self.alloc_page()?;
                // SAFETY: fresh frame, not yet shared.
                let page = unsafe { page_mut(p) };
                fill_pattern(page, pat, 0);
                page[start..start + len].fill(0);
                self.replace(chunk, i, Slot::Data(p));
                Ok(())
            }
        }
    }

    /// Reserves and takes one frame; nothing is charged if either fails.
    fn alloc_page(&self) -> Result<PagePtr> {
        self.reserve(PAGE_SIZE as u64)?;
        self.pool
            .alloc()
            .inspect_err(|_| self.unreserve(PAGE_SIZE as u64))
    }

    /// Puts `new` in slot `i`, keeping counters right and returning a
    /// replaced frame to the pool. A `Data` frame in `new` must already be
    /// charged (see `alloc_page`).
    fn replace(&self, chunk: &mut Chunk, i: usize, new: Slot) {
        let old = std::mem::replace(&mut chunk.slots[i], new);
        debug_assert!(
            !matches!((old, new), (Slot::Data(a), Slot::Data(b)) if a == b),
            "a frame replaced by itself"
        );
        self.count(old, -1);
        self.count(new, 1);
        match (old, new) {
            (Slot::Hole, Slot::Hole) => {}
            // The caller claimed the page (see `claim_page`).
            (Slot::Hole, _) => chunk.live += 1,
            (_, Slot::Hole) => {
                chunk.live -= 1;
                self.live_pages.fetch_sub(1, Relaxed);
            }
            _ => {}
        }
        if let Slot::Data(p) = old {
            self.pool.free(p);
            self.unreserve(PAGE_SIZE as u64);
        }
    }

    fn count(&self, slot: Slot, delta: i64) {
        let counter = match slot {
            Slot::Hole => return,
            Slot::Fill(0) => &self.zero_pages,
            Slot::Fill(_) => &self.fill_pages,
            Slot::Data(_) => &self.data_pages,
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
        self.live_pages
            .fetch_update(Relaxed, Relaxed, |n| (n < self.page_limit).then_some(n + 1))
            .map(|_| ())
            .map_err(|_| Error::DiskFull {
                limit: self.page_limit.saturating_mul(PAGE_SIZE as u64),
            })
    }

    fn reserve(&self, bytes: u64) -> Result<()> {
        self.memory_used
            .fetch_update(Relaxed, Relaxed, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.max_memory)
            })
            .map(|_| ())
            .map_err(|_| Error::NoSpace {
                needed: bytes,
                limit: self.max_memory,
            })
    }

    fn unreserve(&self, bytes: u64) {
        let before = self.memory_used.fetch_sub(bytes, Relaxed);
        debug_assert!(before >= bytes, "memory accounting went negative");
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // Frames go back with the pool's mappings; nothing else to release.
        debug_assert_eq!(
            self.memory_used.load(Relaxed),
            self.data_pages.load(Relaxed) * PAGE_SIZE as u64
                + self.chunks.load(Relaxed) * CHUNK_META_BYTES
                + self.charged.load(Relaxed)
        );
        debug_assert_eq!(
            self.live_pages.load(Relaxed),
            self.data_pages.load(Relaxed)
                + self.fill_pages.load(Relaxed)
                + self.zero_pages.load(Relaxed)
        );
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

fn repeats_every_8(src: &[u8]) -> bool {
    src.len() < 8 || src[8..].iter().zip(src).all(|(a, b)| a == b)
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
