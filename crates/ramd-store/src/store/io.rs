//! What clients call: read, flush, extents on the store; write, zero,
//! trim and allocate only through a [`Change`], which holds the gate.

use std::sync::atomic::Ordering::Relaxed;

use parking_lot::RwLockReadGuard;

use crate::error::{Error, Result};
use crate::sys::PAGE_SIZE;

use super::compress::FrameCache;
use super::table::{
    chunk_spans, page_mut, page_ref, Chunk, Slot, ACCESSED, AGE_SHIFT, MAX_AGE, SETTLED,
};
use super::{FlushHook, Store, CHUNK_BYTES, CHUNK_PAGES, PAGE_SHIFT};

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

/// A client's licence to change the disk. It holds the store's *gate*
/// shared; a save's switch takes the gate exclusively, so every request
/// made under one `Change` is all in or all out of a saved image. Every
/// call that changes data (`write`, `write_prefix`, `zero`,
/// `zero_counted`, `trim`, `allocate`) is a method of `Change`: a frontend
/// cannot change the disk without holding it.
///
/// Take it once per request, before any frontend lock (lock order: gate,
/// frontend state, shard), and hold it from before the request's first
/// change to after its last. Never take a second one while holding one (a
/// save waiting for the gate would deadlock them), and never call
/// [`Store::flush`] while holding one: a flush may wait for a save, which
/// waits for the gate.
/// See [`Store::standby_hold`].
#[must_use = "a StandbyHold holds a standby's gate until it is dropped"]
pub struct StandbyHold<'a>(
    #[allow(dead_code)] pub(crate) Option<parking_lot::RwLockReadGuard<'a, ()>>,
);

#[must_use = "a Change holds the gate until it is dropped"]
pub struct Change<'a> {
    store: &'a Store,
    _gate: RwLockReadGuard<'a, ()>,
}

impl Change<'_> {
    /// Writes `data` at `offset`. On error the pages before the failing one
    /// hold the new data, the failing one and those after it the old data.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.store.write(offset, data)
    }

    /// [`Change::write`], adding to `pages` how many pages stopped being
    /// holes (even when it fails part way), so that a frontend can keep
    /// per-object block counts without scanning; it also says how many
    /// leading bytes of `data` are stored when it fails part way (pages are
    /// written in order and the first failure stops it), so a filesystem
    /// can answer with a short write as POSIX asks when the disk fills up.
    pub fn write_prefix(&self, offset: u64, data: &[u8], pages: &mut i64) -> (usize, Result<()>) {
        self.store.write_prefix(offset, data, pages)
    }

    /// Makes `[offset, offset+length)` read as zeros. With `punch`, whole
    /// pages become holes; without, they become zero pages (allocated zeros,
    /// as NBD's NO_HOLE asks). Needs memory only to rewrite part of a page
    /// that is not raw.
    pub fn zero(&self, offset: u64, length: u64, punch: bool) -> Result<()> {
        self.store.zero(offset, length, punch)
    }

    /// [`Change::zero`] with a page delta, as [`Change::write_prefix`].
    pub fn zero_counted(
        &self,
        offset: u64,
        length: u64,
        punch: bool,
        pages: &mut i64,
    ) -> Result<()> {
        self.store.zero_counted(offset, length, punch, pages)
    }

    /// Discards a range: it reads as zeros afterwards and costs nothing.
    pub fn trim(&self, offset: u64, length: u64) -> Result<()> {
        self.store.trim(offset, length)
    }

    /// Makes every hole that `[offset, offset+length)` touches an allocated
    /// zero page (fallocate's default mode); data is left alone. Counts
    /// against `page_limit`, costs no page memory. All or nothing: if the
    /// disk fills up part way, what this call allocated is given back.
    pub fn allocate(&self, offset: u64, length: u64, pages: &mut i64) -> Result<()> {
        self.store.allocate(offset, length, pages)
    }
}

impl Store {
    /// Takes the gate shared, for one request that changes the disk: see
    /// [`Change`].
    pub fn change(&self) -> Change<'_> {
        Change {
            store: self,
            _gate: self.gate.read(),
        }
    }
}

impl Store {
    /// Reads `buf.len()` bytes at `offset`.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let hold = self.standby_hold();
        self.read_held(&hold, offset, buf)
    }

    /// [`Store::read`] under a [`Store::standby_hold`] of this store.
    pub fn read_held(&self, _hold: &StandbyHold<'_>, offset: u64, buf: &mut [u8]) -> Result<()> {
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

    /// [`Change::write`]'s work; callers hold a `Change` (or are tests).
    pub(crate) fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write_prefix(offset, data, &mut 0).1
    }

    /// [`Change::write_prefix`]'s work; callers hold a `Change` (or are tests).
    pub(crate) fn write_prefix(
        &self,
        offset: u64,
        data: &[u8],
        pages: &mut i64,
    ) -> (usize, Result<()>) {
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

    pub(crate) fn write_spans(
        &self,
        offset: u64,
        data: &[u8],
        pages: &mut i64,
    ) -> (usize, Result<()>) {
        let mut done = 0;
        for span in chunk_spans(offset, data.len() as u64) {
            let src = &data[span.buf_range()];
            let r = self.with_client_chunk(span.chunk, true, pages, |c| {
                for ps in span.pages() {
                    let chunk = c.change(ps.slot);
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

    /// [`Change::zero`]'s work; callers hold a `Change` (or are tests).
    pub(crate) fn zero(&self, offset: u64, length: u64, punch: bool) -> Result<()> {
        self.zero_counted(offset, length, punch, &mut 0)
    }

    /// [`Change::zero_counted`]'s work; callers hold a `Change` (or are tests).
    pub(crate) fn zero_counted(
        &self,
        offset: u64,
        length: u64,
        punch: bool,
        pages: &mut i64,
    ) -> Result<()> {
        self.check_range(offset, length)?;
        for span in chunk_spans(offset, length) {
            // Punching a missing chunk is already done.
            self.with_client_chunk(span.chunk, !punch, pages, |c| {
                for ps in span.pages() {
                    let old = c.get(ps.slot);
                    if ps.len == PAGE_SIZE {
                        let new = if punch { Slot::Hole } else { Slot::Fill(0) };
                        if old == new {
                            continue;
                        }
                        if old == Slot::Hole {
                            self.claim_page()?;
                        }
                        self.replace(c.change(ps.slot), ps.slot, new, true);
                    } else if !matches!(old, Slot::Hole | Slot::Fill(0)) {
                        self.modify_page(c.change(ps.slot), ps.slot, |page| {
                            page[ps.start..ps.start + ps.len].fill(0)
                        })?;
                    }
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// [`Change::trim`]'s work; callers hold a `Change` (or are tests).
    pub(crate) fn trim(&self, offset: u64, length: u64) -> Result<()> {
        self.zero(offset, length, true)
    }

    /// [`Change::allocate`]'s work; callers hold a `Change` (or are tests).
    pub(crate) fn allocate(&self, offset: u64, length: u64, pages: &mut i64) -> Result<()> {
        self.check_range(offset, length)?;
        // Disk offsets of the pages this call turned from holes into zeros.
        let mut made = Vec::new();
        let mut result = Ok(());
        for span in chunk_spans(offset, length) {
            result = self.with_client_chunk(span.chunk, true, pages, |c| {
                for ps in span.pages() {
                    if c.get(ps.slot) == Slot::Hole {
                        self.claim_page()?;
                        self.replace(c.change(ps.slot), ps.slot, Slot::Fill(0), true);
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
                self.with_client_chunk(page / CHUNK_BYTES, false, pages, |c| {
                    let i = ((page >> PAGE_SHIFT) as usize) % CHUNK_PAGES;
                    if c.get(i) == Slot::Fill(0) {
                        self.replace(c.change(i), i, Slot::Hole, true);
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
        let hold = self.standby_hold();
        self.extents_held(&hold, offset, length, max_extents)
    }

    /// [`Store::extents`] under a [`Store::standby_hold`] of this store.
    pub fn extents_held(
        &self,
        _hold: &StandbyHold<'_>,
        offset: u64,
        length: u64,
        max_extents: usize,
    ) -> Result<Vec<Extent>> {
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

    pub(crate) fn check_range(&self, offset: u64, length: u64) -> Result<()> {
        match offset.checked_add(length) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(Error::OutOfRange {
                offset,
                length,
                size: self.size,
            }),
        }
    }

    pub(crate) fn write_page(
        &self,
        chunk: &mut Chunk,
        i: usize,
        start: usize,
        src: &[u8],
    ) -> Result<()> {
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
    pub(crate) fn modify_page(
        &self,
        chunk: &mut Chunk,
        i: usize,
        f: impl FnOnce(&mut [u8]),
    ) -> Result<()> {
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
    pub(crate) fn store_page(&self, chunk: &mut Chunk, i: usize, data: &[u8]) -> Result<()> {
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
}

/// `Some(p)` if every aligned 8 bytes of `page` equal `p` (native endian).
pub(crate) fn same_filled(page: &[u8]) -> Option<u64> {
    debug_assert_eq!(page.len(), PAGE_SIZE);
    let first = u64::from_ne_bytes(page[..8].try_into().expect("8 bytes"));
    page.chunks_exact(8)
        .all(|w| u64::from_ne_bytes(w.try_into().expect("8 bytes")) == first)
        .then_some(first)
}

/// Whether `src`, placed at `start` in a page filled with `pat`, changes nothing.
pub(crate) fn matches_pattern(src: &[u8], pat: u64, start: usize) -> bool {
    let pb = pat.to_ne_bytes();
    src.iter()
        .enumerate()
        .all(|(j, &b)| b == pb[(start + j) & 7])
}

/// Fills `dst` with the bytes a `pat`-filled page has from in-page `start` on.
pub(crate) fn fill_pattern(dst: &mut [u8], pat: u64, start: usize) {
    if pat == 0 {
        dst.fill(0);
        return;
    }
    let pb = pat.to_ne_bytes();
    for (j, b) in dst.iter_mut().enumerate() {
        *b = pb[(start + j) & 7];
    }
}
