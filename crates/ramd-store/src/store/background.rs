//! Background work: ageing, compressing hot pages, re-packing idle ones
//! into frames, splitting frames, compaction (moving objects).

use std::collections::hash_map::HashMap;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

use parking_lot::{MutexGuard, RwLock, RwLockUpgradableReadGuard};

use crate::codec::{self, Codec};
use crate::error::{Error, Result};
use crate::sys::PAGE_SIZE;
use crate::zs;

use super::compress::{codec_id, timed, FrameCache};
use super::frame::{frame_len, FRAME_HEADER, FRAME_PAGES};
use super::table::{
    page_ref, Chunk, Slot, ACCESSED, AGE_SHIFT, KIND_MASK, K_FILL, K_FRAME, K_HOLE, K_LZ4,
    K_RAW_HOT, K_RAW_HUGE, K_ZSTD, MAX_AGE, SETTLED,
};
use super::{Store, StoreConfig, CHUNK_PAGES, SHARDS};

/// Proof that a background pass is under way (from [`Store::begin_pass`],
/// handed back to [`Store::end_pass`]): passes and client compaction take
/// turns.
pub(crate) struct PassGuard<'a>(#[allow(dead_code)] MutexGuard<'a, ()>);

/// What one background pass did, for tests and logs.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PassReport {
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

/// Background work: ageing, compressing idle pages, re-packing cold ones
/// into frames, compaction. Run by `ramd`'s scanner threads every
/// [`Store::scanner_period`]; each call is one pass over the shards that
/// `part % parts` selects.
impl Store {
    /// Starts a pass: plans compaction if the allocator is fragmented.
    /// Call once, before the `background_pass` calls of every part.
    pub(crate) fn begin_pass(&self) -> PassGuard<'_> {
        let guard = PassGuard(self.passing.lock());
        self.c.idle_pass.store(0, Relaxed);
        let tight = self.c.memory_used.load(Relaxed) > self.pressure_mark();
        self.c.pressure.store(tight, Relaxed);
        self.zs.plan_compaction();
        guard
    }

    /// Ends a pass: zspages that could not be emptied take objects again.
    pub(crate) fn end_pass(&self, guard: PassGuard<'_>) {
        self.zs.finish_compaction();
        self.c.idle.store(self.c.idle_pass.load(Relaxed), Relaxed);
        drop(guard);
    }

    /// Compaction on a client's behalf, when its request found no memory:
    /// moves the objects out of the emptiest zspages of fragmented classes,
    /// so the zspages go back to the pool. Waits for a background pass
    /// under way. Returns whether it moved anything (so a retry may fit).
    pub(crate) fn compact_now(&self) -> bool {
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
    pub(crate) fn background_pass(&self, part: usize, parts: usize) -> PassReport {
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
    #[cfg(test)]
    pub(crate) fn background_pass_all(&self) -> PassReport {
        let guard = self.begin_pass();
        let r = self.background_pass(0, 1);
        self.end_pass(guard);
        r
    }

    /// Ages one chunk's pages and does what is due; returns its idle pages.
    pub(crate) fn scan_chunk(&self, shard: usize, key: u64, report: &mut PassReport) -> u64 {
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
    pub(crate) fn plan_repack(&self, chunk: &Chunk, due: &mut Vec<Due>) {
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

    pub(crate) fn run_due(
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

    pub(crate) fn compress_hot(
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
                limit: self.max_memory(),
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
    pub(crate) fn repack(
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
    pub(crate) fn split_frame(
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
    pub(crate) fn move_object(
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
    pub(crate) fn drop_unpublished(&self, s: Slot) {
        match s {
            Slot::Raw { p, .. } => self.free_page(p),
            Slot::Packed { h, .. } => self.free_object(h),
            _ => {}
        }
    }
}

#[derive(Clone, Copy)]
pub(crate) enum Due {
    Compress(usize),
    Repack(usize, usize),
    Split(u64),
    Move(usize),
}

/// The scanner's period: a quarter of the shortest delay it must notice,
/// between 50 ms and 1 s, and long enough that the longest fits the age
/// field.
pub(crate) fn scanner_tick(cfg: &StoreConfig) -> Duration {
    let delays = [cfg.compress_after, cfg.idle_after];
    let shortest = delays.iter().filter(|d| !d.is_zero()).min().copied();
    let mut tick = shortest.map_or(Duration::from_secs(1), |d| d / 4);
    tick = tick.clamp(Duration::from_millis(50), Duration::from_secs(1));
    let longest = delays.iter().max().copied().unwrap_or_default();
    tick.max(longest / (MAX_AGE as u32 - 1))
}

pub(crate) fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a pointer to a local timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
