//! The store's side of persistence: which pages changed since the last
//! save (each chunk's `SaveState::dirty`, and `Store::gone` for chunks that
//! emptied), a save's point-in-time view while clients keep writing
//! (copy-on-write of the pages a save still has to write:
//! `SaveState::saving`, `SaveState::kept`), and putting saved pages back on
//! load. The image file format is `persist/format.rs`'s;
//! `persist/` reads a save through [`SaveSession`] and [`PageRef`] alone.
//!
//! A save runs in three steps:
//! 1. [`Store::begin_save`]: under the gate (no request in flight) and every
//!    shard's write lock, each chunk's pages to save (changed ones, or all
//!    for a full save) move from `dirty` to `saving`. This is the switch;
//!    it returns a [`SaveSession`].
//! 2. [`SaveSession::save_chunk`] for every chunk of the plan: hands each
//!    page to save as it was at the switch. A client that changes a page
//!    still in `saving` first copies its old contents into `kept`
//!    (`changing`).
//! 3. [`SaveSession::finish`]; a session dropped unfinished (writing
//!    failed, an early return, a panic) aborts the save: `saving` and
//!    `kept` are cleared, and the next save must be full.

use std::sync::atomic::Ordering::Relaxed;

use crate::error::{Error, Result};
use crate::sys::PAGE_SIZE;
use crate::zs;

use super::compress::{codec_of, FrameCache, MAX_PACKED};
use super::frame::{frame_len, FRAME_HEADER, FRAME_PAGES};
use super::page::{Kept, PageRef};
use super::table::{page_mut, page_ref, Chunk, Slot, K_HOLE};
use super::{Store, CHUNK_PAGES};

/// What one save writes, fixed at the switch.
#[derive(Debug, Default, Clone)]
pub struct SavePlan {
    pub full: bool,
    /// Chunks (disk offset / `CHUNK_BYTES`) with pages to save, in disk
    /// order, and which of their slots.
    pub chunks: Vec<(u64, u64)>,
    /// Chunks that emptied (all holes) since the last save: an image
    /// applies these before any page of the save.
    pub gone: Vec<u64>,
    /// Pages to save in all.
    pub pages: u64,
}

/// A save under way, from its switch ([`Store::begin_save`]) to
/// [`SaveSession::finish`]. Dropped unfinished, it aborts the save, so no
/// path out of a saver (an error, an early return, a panic) can leave pages
/// marked `saving` or kept copies behind.
#[must_use = "dropping a SaveSession aborts the save"]
pub struct SaveSession<'a> {
    store: &'a Store,
    plan: SavePlan,
    finished: bool,
}

impl SaveSession<'_> {
    /// What this save writes, fixed at the switch.
    pub fn plan(&self) -> &SavePlan {
        &self.plan
    }

    /// Hands `f` every page of chunk `key` that the plan names (`mask`), as
    /// it was at the switch: pages by their disk page number, a frame once
    /// with the chunk's first page number and its mask.
    pub fn save_chunk(&self, key: u64, mask: u64, f: impl FnMut(u64, PageRef<'_>)) {
        self.store.save_chunk(key, mask, f)
    }

    /// Whether clients changed more during this save than could be kept
    /// for it: the save must be abandoned (dropped).
    pub fn broken(&self) -> bool {
        self.store.save_broken()
    }

    /// Ends a save whose chunks all went through `save_chunk`.
    pub fn finish(mut self) {
        self.finished = true;
        self.store.end_save();
    }
}

impl Drop for SaveSession<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.store.abort_save();
        }
    }
}

impl Store {
    /// A client is about to change slot `i`: remember it for the next save,
    /// and if the save under way still has to write it, keep its contents
    /// as they were at the switch. Call under the shard's write lock.
    pub(crate) fn changing(&self, chunk: &mut Chunk, i: usize) {
        if !self.track {
            return;
        }
        let bit = 1u64 << i;
        chunk.save.dirty |= bit;
        if chunk.save.saving.load(Relaxed) & bit == 0 {
            return;
        }
        let kept = self.capture(chunk, i);
        let cost = kept.cost();
        if !self.room_to_keep(cost) {
            // The save can no longer be the disk at its switch: it fails
            // (the saver checks `SaveSession::broken`) and the next one is full.
            self.c.save_broken.store(true, Relaxed);
            chunk.save.saving.fetch_and(!bit, Relaxed);
            return;
        }
        // Never refused: the client's own budget grows by the same amount
        // (see `reserve`), so a save never makes a write fail.
        self.c.memory_used.fetch_add(cost, Relaxed);
        if let Some(b) = &self.shared {
            b.take(cost);
        }
        self.c.kept.fetch_add(cost, Relaxed);
        chunk.save.saving.fetch_and(!bit, Relaxed);
        chunk
            .save
            .kept
            .get_or_insert_with(Default::default)
            .push((i as u8, kept));
    }

    /// Kept copies may take as much memory again as the disk's budget,
    /// and never the host's reserve (checked every 64 MiB of them).
    fn room_to_keep(&self, cost: u64) -> bool {
        let before = self.c.kept.load(Relaxed);
        if self.c.save_broken.load(Relaxed) || before + cost > self.max_memory() {
            return false;
        }
        const STEP: u64 = 64 << 20;
        if (before + cost) / STEP == before / STEP {
            return true;
        }
        self.pool.host_has_room()
    }

    /// Whether clients changed more during the save under way than could
    /// be kept for it: the save must be abandoned.
    fn save_broken(&self) -> bool {
        self.c.save_broken.load(Relaxed)
    }

    fn capture(&self, chunk: &Chunk, i: usize) -> Kept {
        match chunk.get(i) {
            Slot::Hole => Kept::Hole,
            Slot::Fill(p) => Kept::Fill(p),
            // SAFETY: the slot's frame, under the write lock.
            Slot::Raw { p, hot } => Kept::Raw {
                data: unsafe { page_ref(p) }.into(),
                hot,
            },
            Slot::Packed { zstd, h, len } => {
                let mut data = vec![0u8; len as usize].into_boxed_slice();
                // SAFETY: the slot's object, under the write lock.
                unsafe { self.zs.read(h, &mut data) };
                Kept::Packed { zstd, data }
            }
            slot @ Slot::Frame(_) => {
                // One page of a frame is kept decompressed: copying the
                // whole frame for it would cost up to 16 times more.
                let mut data = vec![0u8; PAGE_SIZE].into_boxed_slice();
                match self.decode_into(slot, chunk, &mut FrameCache::default(), i, &mut data) {
                    Ok(()) => Kept::Raw { data, hot: false },
                    Err(e) => {
                        // Reads of this page fail the same way; the image
                        // gets the zero page rather than nothing at all.
                        log::error!("keeping a page for the save under way: {e}");
                        Kept::Fill(0)
                    }
                }
            }
        }
    }

    /// The switch: fixes what this save writes. `under_gate` runs while no
    /// request is in flight (a filesystem serializes its tree there).
    /// Every chunk of the session's plan must then go through
    /// [`SaveSession::save_chunk`] before [`SaveSession::finish`]; dropping
    /// the session unfinished aborts the save.
    pub fn begin_save<T>(
        &self,
        full: bool,
        under_gate: impl FnOnce() -> T,
    ) -> (SaveSession<'_>, T) {
        let (plan, extra) = self.switch(full, under_gate);
        let session = SaveSession {
            store: self,
            plan,
            finished: false,
        };
        (session, extra)
    }

    fn switch<T>(&self, full: bool, under_gate: impl FnOnce() -> T) -> (SavePlan, T) {
        assert!(
            self.track,
            "begin_save on a store that does not track changes"
        );
        let _gate = self.gate.write();
        self.c.save_broken.store(false, Relaxed);
        let extra = under_gate();
        let mut plan = SavePlan {
            full,
            ..SavePlan::default()
        };
        for shard in self.shards.iter() {
            let mut map = shard.0.write();
            for (&key, chunk) in map.iter_mut() {
                debug_assert_eq!(chunk.save.saving.load(Relaxed), 0, "a save is under way");
                let mask = if full {
                    (0..CHUNK_PAGES)
                        .filter(|&i| chunk.kind(i) != K_HOLE)
                        .fold(0u64, |m, i| m | 1 << i)
                } else {
                    chunk.save.dirty
                };
                chunk.save.dirty = 0;
                if mask != 0 {
                    chunk.save.saving.store(mask, Relaxed);
                    plan.chunks.push((key, mask));
                    plan.pages += mask.count_ones() as u64;
                }
            }
        }
        let gone = std::mem::take(&mut *self.gone.lock());
        if !full {
            plan.gone = gone.into_iter().collect();
            plan.gone.sort_unstable();
        }
        plan.chunks.sort_unstable();
        (plan, extra)
    }

    /// Hands `f` every page of chunk `key` that the save plans (`mask`), as
    /// it was at the switch: pages by their disk page number, a frame once
    /// with the chunk's first page number and its mask.
    fn save_chunk(&self, key: u64, mask: u64, mut f: impl FnMut(u64, PageRef<'_>)) {
        let base = key * CHUNK_PAGES as u64;
        let lock = self.shard(key);
        let mut map = lock.upgradable_read();
        let mut left = mask;
        if let Some(chunk) = map.get(&key) {
            // Writers wait; readers and the scanner's reads go on.
            let saving = chunk.save.saving.load(Relaxed) & mask;
            let mut scratch = [0u8; PAGE_SIZE];
            let mut done = 0u64;
            for i in 0..CHUNK_PAGES {
                if saving & !done & 1 << i == 0 {
                    continue;
                }
                let page = base + i as u64;
                match chunk.get(i) {
                    Slot::Hole => f(page, PageRef::Hole),
                    Slot::Fill(p) => f(page, PageRef::Fill(p)),
                    // SAFETY: the slot's frame; writers are held off.
                    Slot::Raw { p, hot } => f(
                        page,
                        PageRef::Raw {
                            data: unsafe { page_ref(p) },
                            hot,
                        },
                    ),
                    Slot::Packed { zstd, h, len } => {
                        let data = &mut scratch[..len as usize];
                        // SAFETY: the slot's object; writers are held off.
                        unsafe { self.zs.read(h, data) };
                        f(page, PageRef::Packed { zstd, data });
                    }
                    Slot::Frame(h) => {
                        // Members that are saved now, or unchanged since the
                        // last save (the image holds them as they are):
                        // not those rewritten since the switch and then
                        // re-packed, which are the next save's.
                        let val = chunk.vals[i];
                        let members = std::iter::once(i)
                            .chain(chunk.frame_members(val))
                            .filter(|&j| (saving | !chunk.save.dirty) & 1 << j != 0)
                            .fold(0u64, |m, j| m | 1 << j);
                        // SAFETY: the slot's frame object; writers held off.
                        let header = unsafe { self.frame_header(h) };
                        let mut data = vec![0u8; FRAME_HEADER + frame_len(&header)];
                        // SAFETY: as above.
                        unsafe { self.zs.read(h, &mut data) };
                        f(
                            base,
                            PageRef::Frame {
                                mask: members,
                                data: &data,
                            },
                        );
                        done |= members;
                    }
                }
                done |= 1 << i;
            }
            chunk.save.saving.fetch_and(!saving, Relaxed);
            left &= !saving;
        }
        if left == 0 {
            return;
        }
        // The rest changed after the switch: kept copies, or (when the chunk
        // emptied and went) holes.
        map.with_upgraded(|map| {
            let mut empty = false;
            if let Some(chunk) = map.get_mut(&key) {
                for (i, kept) in chunk.save.kept.take().map(|b| *b).unwrap_or_default() {
                    if left & 1 << i != 0 {
                        f(base + i as u64, kept.as_ref());
                        left &= !(1 << i);
                    }
                    let cost = kept.cost();
                    self.c.kept.fetch_sub(cost, Relaxed);
                    self.unreserve(cost);
                }
                empty = chunk.live == 0;
            }
            for i in (0..CHUNK_PAGES).filter(|&i| left & 1 << i != 0) {
                f(base + i as u64, PageRef::Hole);
            }
            if empty {
                self.drop_chunk(map, key);
            }
        });
    }

    /// Ends a save whose chunks all went through `save_chunk`.
    fn end_save(&self) {
        debug_assert_eq!(self.c.kept.load(Relaxed), 0, "kept pages left after a save");
    }

    /// Ends a save that failed part way: what it did not write is
    /// forgotten, so the next save must be a full one.
    fn abort_save(&self) {
        for shard in self.shards.iter() {
            let mut map = shard.0.write();
            let mut empty = Vec::new();
            for (&key, chunk) in map.iter_mut() {
                chunk.save.saving.store(0, Relaxed);
                for (_, kept) in chunk.save.kept.take().map(|b| *b).unwrap_or_default() {
                    let cost = kept.cost();
                    self.c.kept.fetch_sub(cost, Relaxed);
                    self.unreserve(cost);
                }
                if chunk.live == 0 {
                    empty.push(key);
                }
            }
            for key in empty {
                self.drop_chunk(&mut map, key);
            }
        }
    }

    /// Load: makes page `page` hold `p` (not a frame), whatever it held.
    pub fn restore_page(&self, page: u64, p: PageRef<'_>) -> Result<()> {
        let (key, i) = (
            page / CHUNK_PAGES as u64,
            (page % CHUNK_PAGES as u64) as usize,
        );
        self.check_pages(page, 1)?;
        self.with_chunk(key, p != PageRef::Hole, &mut 0, |chunk| {
            // What an earlier save put here goes first: a full disk has
            // no room for both.
            self.replace(chunk, i, Slot::Hole, true);
            let new = match p {
                PageRef::Hole => Slot::Hole,
                PageRef::Fill(pat) => Slot::Fill(pat),
                PageRef::Raw { data, hot } => {
                    if data.len() != PAGE_SIZE {
                        return Err(Error::Invalid(format!("raw page of {} bytes", data.len())));
                    }
                    let p = self.alloc_page(false)?;
                    // SAFETY: fresh frame, not yet shared.
                    unsafe { page_mut(p) }.copy_from_slice(data);
                    Slot::Raw { p, hot }
                }
                PageRef::Packed { zstd, data } => {
                    if data.is_empty() || data.len() > MAX_PACKED {
                        return Err(Error::Invalid(format!(
                            "compressed page of {} bytes (1..={MAX_PACKED})",
                            data.len()
                        )));
                    }
                    let h = self.alloc_object(data.len(), false)?;
                    // SAFETY: fresh object, not yet published.
                    unsafe { self.zs.write(h, data) };
                    Slot::Packed {
                        zstd,
                        h,
                        len: data.len() as u16,
                    }
                }
                PageRef::Frame { .. } => unreachable!("frames go through restore_frame"),
            };
            self.restore_slot(chunk, i, new)
        })
    }

    /// Load: makes the slots of chunk `key` in `mask` pages of this frame.
    pub fn restore_frame(&self, key: u64, mask: u64, data: &[u8]) -> Result<()> {
        // Up to the highest page the mask names.
        let span = (64 - mask.leading_zeros() as u64).max(1);
        self.check_pages(key.saturating_mul(CHUNK_PAGES as u64), span)?;
        let bad = |why: String| Err(Error::Invalid(format!("frame: {why}")));
        if data.len() < FRAME_HEADER || data.len() > zs::MAX_OBJECT {
            return bad(format!("{} bytes", data.len()));
        }
        let header: [u8; FRAME_HEADER] = data[..FRAME_HEADER].try_into().expect("length checked");
        let (start, n) = (header[0] as usize, header[1] as usize);
        if !(2..=FRAME_PAGES).contains(&n) || start + n > CHUNK_PAGES {
            return bad(format!("pages {start}..{}", start + n));
        }
        let members = ((1u64 << n) - 1) << start;
        if mask == 0 || mask & !members != 0 {
            return bad(format!(
                "slots {mask:#x} outside pages {start}..{}",
                start + n
            ));
        }
        if FRAME_HEADER + frame_len(&header) != data.len() {
            return bad("length does not match its header".into());
        }
        if codec_of(header[2]).is_err() {
            return bad(format!("unknown codec {}", header[2]));
        }
        self.with_chunk(key, true, &mut 0, |chunk| {
            for i in (0..CHUNK_PAGES).filter(|&i| mask & 1 << i != 0) {
                self.replace(chunk, i, Slot::Hole, true);
            }
            let h = self.alloc_object(data.len(), false)?;
            // SAFETY: fresh object, not yet published.
            unsafe { self.zs.write(h, data) };
            self.c
                .compressed_bytes
                .fetch_add(data.len() as u64, Relaxed);
            self.c.frames.fetch_add(1, Relaxed);
            let mut result = Ok(());
            let mut used = false;
            for i in (0..CHUNK_PAGES).filter(|&i| mask & 1 << i != 0) {
                // Only the disk's page limit can refuse a member.
                result = self.restore_slot(chunk, i, Slot::Frame(h));
                if result.is_err() {
                    break;
                }
                used = true;
            }
            if !used {
                self.c
                    .compressed_bytes
                    .fetch_sub(data.len() as u64, Relaxed);
                self.c.frames.fetch_sub(1, Relaxed);
                self.free_object(h);
            }
            result
        })
    }

    /// Load: every page of chunk `key` becomes a hole.
    pub fn restore_gone(&self, key: u64) -> Result<()> {
        self.check_pages(key.saturating_mul(CHUNK_PAGES as u64), 1)?;
        self.with_chunk(key, false, &mut 0, |chunk| {
            for i in 0..CHUNK_PAGES {
                self.replace(chunk, i, Slot::Hole, true);
            }
            Ok(())
        })
    }

    /// Load: a record for pages `page..page + n` must name pages of this
    /// disk (the last may be partial on a disk whose size is not a
    /// multiple of the page size).
    fn check_pages(&self, page: u64, n: u64) -> Result<()> {
        let pages = self.size.div_ceil(PAGE_SIZE as u64);
        match page.checked_add(n) {
            Some(end) if end <= pages => Ok(()),
            _ => Err(Error::Invalid(format!(
                "page {page} (+{n}) is outside the disk's {pages} pages"
            ))),
        }
    }

    /// Load: until the guard is dropped, page memory is faulted in a whole
    /// arena at a time rather than a page at a time
    /// (`PagePool::set_populate`): a load fills each arena's pages one
    /// after another.
    pub(crate) fn populating(&self) -> Populating<'_> {
        self.pool.set_populate(true);
        Populating(self)
    }

    /// Ends a load: what the load emptied is not a change to save (the
    /// image has it already).
    pub fn end_restore(&self) {
        self.gone.lock().clear();
    }

    fn restore_slot(&self, chunk: &mut Chunk, i: usize, new: Slot) -> Result<()> {
        if chunk.get(i) == Slot::Hole && new != Slot::Hole {
            if let Err(e) = self.claim_page() {
                self.drop_unpublished(new);
                return Err(e);
            }
        }
        self.replace(chunk, i, new, true);
        Ok(())
    }
}

/// See [`Store::populating`].
pub(crate) struct Populating<'a>(&'a Store);

impl Drop for Populating<'_> {
    fn drop(&mut self) {
        self.0.pool.set_populate(false);
    }
}

impl Store {
    /// [`Store::with_chunk`] for a client's change: the chunk is handed
    /// out as a [`ClientChunk`], whose slots change only through
    /// [`ClientChunk::change`], which records each change for saves.
    pub(crate) fn with_client_chunk(
        &self,
        idx: u64,
        create: bool,
        pages: &mut i64,
        f: impl FnOnce(&mut ClientChunk<'_>) -> Result<()>,
    ) -> Result<()> {
        self.with_chunk(idx, create, pages, |chunk| {
            f(&mut ClientChunk { store: self, chunk })
        })
    }
}

/// A chunk as a client's request holds it (under its shard's write lock).
/// The one way to change one of its slots is [`ClientChunk::change`], so
/// no client path can forget to tell the save under way (and the next
/// one) about it.
pub(crate) struct ClientChunk<'a> {
    pub(super) store: &'a Store,
    pub(super) chunk: &'a mut Chunk,
}

impl ClientChunk<'_> {
    pub(crate) fn get(&self, i: usize) -> Slot {
        self.chunk.get(i)
    }

    /// Slot `i` is about to change: records it for saves (see
    /// `Store::changing`) and hands out the chunk to change it.
    pub(crate) fn change(&mut self, i: usize) -> &mut Chunk {
        self.store.changing(self.chunk, i);
        self.chunk
    }
}
