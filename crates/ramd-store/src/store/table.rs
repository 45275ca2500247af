//! The page table: slot encoding, chunks of 64 slots, shards, putting a
//! new slot in place (`replace`), and how a request is cut into chunk and
//! page spans.

use std::collections::hash_map::{Entry, HashMap};
use std::sync::atomic::AtomicU16;
use std::sync::atomic::Ordering::Relaxed;

use parking_lot::RwLock;

use crate::error::Result;
use crate::pool::PagePtr;
use crate::sys::PAGE_SIZE;
use crate::zs::Handle;

use super::frame::{frame_len, FRAME_HEADER};
use super::page::SaveState;
use super::{Store, CHUNK_BYTES, CHUNK_META_BYTES, CHUNK_PAGES, PAGE_SHIFT, SHARDS};

// Slot metadata: kind in the low 3 bits, then flags, then the age in passes
// of the background scanner.
pub(crate) const KIND_MASK: u16 = 0b111;
pub(crate) const K_HOLE: u16 = 0;
pub(crate) const K_FILL: u16 = 1;
pub(crate) const K_RAW_HOT: u16 = 2;
pub(crate) const K_RAW_HUGE: u16 = 3;
pub(crate) const K_LZ4: u16 = 4;
pub(crate) const K_ZSTD: u16 = 5;
pub(crate) const K_FRAME: u16 = 6;
/// Read or written since the scanner last looked.
pub(crate) const ACCESSED: u16 = 1 << 3;
/// The scanner has nothing more to do with this page until it is written.
pub(crate) const SETTLED: u16 = 1 << 4;
pub(crate) const AGE_SHIFT: u32 = 5;
pub(crate) const MAX_AGE: u16 = u16::MAX >> AGE_SHIFT;

/// What a slot holds, decoded from its value and kind.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Slot {
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
    pub(crate) fn encode(self) -> (u64, u16) {
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
    pub(crate) unsafe fn decode(val: u64, kind: u16) -> Slot {
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

pub(crate) struct Chunk {
    pub(crate) vals: [u64; CHUNK_PAGES],
    /// Atomic so that readers (under the shared lock) can set ACCESSED.
    pub(crate) meta: [AtomicU16; CHUNK_PAGES],
    /// Slots that are not `Hole`; the chunk is dropped when this reaches 0
    /// (and it keeps no pages for a save).
    pub(crate) live: u32,
    /// The chunk's part in saves (see `save.rs`).
    pub(crate) save: SaveState,
}

impl Chunk {
    pub(crate) fn new() -> Box<Chunk> {
        Box::new(Chunk {
            vals: [0; CHUNK_PAGES],
            meta: std::array::from_fn(|_| AtomicU16::new(K_HOLE)),
            live: 0,
            save: SaveState::default(),
        })
    }

    pub(crate) fn get(&self, i: usize) -> Slot {
        let kind = self.meta[i].load(Relaxed) & KIND_MASK;
        // SAFETY: slots are written only through `Store::replace`, from
        // `Slot::encode` of what they hold.
        unsafe { Slot::decode(self.vals[i], kind) }
    }

    pub(crate) fn kind(&self, i: usize) -> u16 {
        self.meta[i].load(Relaxed) & KIND_MASK
    }

    pub(crate) fn touch(&self, i: usize) {
        let m = &self.meta[i];
        if m.load(Relaxed) & ACCESSED == 0 {
            m.fetch_or(ACCESSED, Relaxed);
        }
    }

    /// Other slots naming the same frame as slot `i`.
    pub(crate) fn frame_members(&self, val: u64) -> impl Iterator<Item = usize> + '_ {
        (0..CHUNK_PAGES).filter(move |&j| self.kind(j) == K_FRAME && self.vals[j] == val)
    }
}

#[repr(align(64))]
pub(crate) struct Shard(pub(crate) RwLock<HashMap<u64, Box<Chunk>>>);

impl Store {
    pub(crate) fn shard(&self, chunk: u64) -> &RwLock<HashMap<u64, Box<Chunk>>> {
        &self.shards[chunk as usize & (SHARDS - 1)].0
    }

    /// Runs `f` on a chunk under its shard's write lock, creating the chunk
    /// if `create`, and dropping it afterwards if it ended up empty.
    pub(crate) fn with_chunk(
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
        if chunk.live == 0 && chunk.save.kept.is_none() {
            self.drop_chunk(&mut map, idx);
        }
        result
    }

    /// Drops an empty chunk, remembering it for the next save.
    pub(crate) fn drop_chunk(&self, map: &mut HashMap<u64, Box<Chunk>>, key: u64) {
        if let Some(chunk) = map.remove(&key) {
            debug_assert!(chunk.live == 0 && chunk.save.kept.is_none());
            self.c.chunks.fetch_sub(1, Relaxed);
            self.unreserve(CHUNK_META_BYTES);
            if self.track {
                self.gone.lock().insert(key);
            }
        }
    }

    /// Puts `new` in slot `i`, keeping counters right and giving back what
    /// the old slot held (a raw frame, a compressed object, its share of a
    /// frame). Memory `new` holds must already be charged. `touch`: this is
    /// a client's write (the page turns hot and young); else the scanner's
    /// change, which keeps the age.
    pub(crate) fn replace(&self, chunk: &mut Chunk, i: usize, new: Slot, touch: bool) {
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

    pub(crate) fn count(&self, slot: Slot, delta: i64) {
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
}

/// SAFETY: the caller owns `p` (it is in a slot whose shard lock it holds
/// for reading, or it is fresh from the pool) and nobody mutates it meanwhile.
pub(crate) unsafe fn page_ref<'a>(p: PagePtr) -> &'a [u8] {
    std::slice::from_raw_parts(p.as_ptr(), PAGE_SIZE)
}

/// SAFETY: the caller has exclusive access to `p` (write lock on its shard,
/// or fresh from the pool) for the lifetime of the returned slice.
#[allow(clippy::mut_from_ref)]
pub(crate) unsafe fn page_mut<'a>(p: PagePtr) -> &'a mut [u8] {
    std::slice::from_raw_parts_mut(p.as_ptr(), PAGE_SIZE)
}

/// One chunk's share of a request.
pub(crate) struct ChunkSpan {
    pub(crate) chunk: u64,
    /// Disk offset where this share starts.
    pub(crate) offset: u64,
    pub(crate) len: u64,
    /// Where this share starts in the request's buffer.
    pub(crate) buf_off: usize,
}

/// One page's share of a chunk span.
pub(crate) struct PageSpan {
    pub(crate) slot: usize,
    /// Offset inside the page.
    pub(crate) start: usize,
    pub(crate) len: usize,
    /// Offset inside the chunk span's buffer.
    pub(crate) buf_off: usize,
}

impl ChunkSpan {
    pub(crate) fn buf_range(&self) -> std::ops::Range<usize> {
        self.buf_off..self.buf_off + self.len as usize
    }

    pub(crate) fn pages(&self) -> impl Iterator<Item = PageSpan> {
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
    pub(crate) fn buf_range(&self) -> std::ops::Range<usize> {
        self.buf_off..self.buf_off + self.len
    }
}

/// Cuts `[offset, offset+length)` at chunk boundaries. The caller has checked
/// that the range does not overflow.
pub(crate) fn chunk_spans(offset: u64, length: u64) -> impl Iterator<Item = ChunkSpan> {
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
