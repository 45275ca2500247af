//! The compressed-object allocator: size classes packed into multi-page
//! *zspages*, after the kernel's zsmalloc.
//!
//! Why not one compressed page per 4 KiB frame: a 1.6 KiB object would waste
//! 60% of its frame. Why not the heap: malloc rounds and fragments, and never
//! says how much it wastes. Here every class has a fixed object size (16-byte
//! steps up to 4 KiB, 256-byte steps up to 64 KiB for multi-page frames),
//! and each zspage is as many pool pages as make that size pack with under
//! 1% tail waste. Objects may straddle the pages of a zspage (the pages are
//! not contiguous); readers then copy the two pieces into a buffer.
//!
//! Invariants:
//! - A zspage's page list and class never change while it lives; its free
//!   list and counters change only under its class's lock.
//! - An object's bytes are touched only by the page-table slot that owns its
//!   handle (under that slot's shard lock) or, before it is published, by
//!   the thread that allocated it.
//! - A zspage is freed (pages back to the pool, memory unreserved) the moment
//!   its last object is; an *evacuating* zspage takes no new objects, so
//!   compaction (moving its objects elsewhere) empties it.

use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::pool::{PagePool, PagePtr};
use crate::sys::PAGE_SIZE;

const SMALL_STEP: usize = 16;
const MIN_OBJECT: usize = 32;
const SMALL_CLASSES: usize = (PAGE_SIZE - MIN_OBJECT) / SMALL_STEP + 1;
const LARGE_STEP: usize = 256;
/// Largest object: a frame of 16 pages that did not shrink is never kept.
pub(crate) const MAX_OBJECT: usize = 16 * PAGE_SIZE;
const LARGE_CLASSES: usize = (MAX_OBJECT - PAGE_SIZE) / LARGE_STEP;
const CLASSES: usize = SMALL_CLASSES + LARGE_CLASSES;
/// Bits of a handle's object index: a zspage holds at most 4096 objects.
const IDX_BITS: u32 = 12;
const NO_FREE: u16 = u16::MAX;

/// Memory charged per zspage for its descriptor and page list.
pub(crate) fn zspage_meta_bytes(pages: usize) -> u64 {
    (std::mem::size_of::<ZsPage>() + 16 + pages * std::mem::size_of::<PagePtr>()) as u64
}

/// An allocated object: its zspage and index. Packs into 56 bits.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Handle {
    zspage: NonNull<ZsPage>,
    idx: u16,
}

// SAFETY: a handle is an address plus index; who may touch the object is
// governed by the page table's locks (see the module invariants).
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

impl Handle {
    /// The low 56 bits of a page-table slot.
    pub(crate) fn encode(self) -> u64 {
        let addr = self.zspage.as_ptr() as u64;
        debug_assert!(
            addr & 15 == 0 && addr >> 48 == 0,
            "zspage address {addr:#x}"
        );
        (addr >> 4) << IDX_BITS | self.idx as u64
    }

    /// SAFETY: `bits` came from [`Handle::encode`] of a live handle.
    pub(crate) unsafe fn decode(bits: u64) -> Handle {
        let bits = bits & ((1 << 56) - 1);
        let addr = (bits >> IDX_BITS) << 4;
        Handle {
            zspage: NonNull::new_unchecked(addr as *mut ZsPage),
            idx: (bits & ((1 << IDX_BITS) - 1)) as u16,
        }
    }

    fn page(&self) -> &ZsPage {
        // SAFETY: a live handle's zspage lives until its last object is freed.
        unsafe { self.zspage.as_ref() }
    }

    /// The size of the object's class: at least what was asked for.
    pub(crate) fn capacity(&self) -> usize {
        CLASS_SIZE[self.page().class as usize] as usize
    }
}

impl ZsPage {
    fn free_objects(&self) -> u64 {
        (self.objs - self.inuse) as u64
    }
}

#[repr(align(16))]
struct ZsPage {
    pages: Box<[PagePtr]>,
    class: u16,
    /// Objects it holds: usually `objs_per(class)`, fewer for a zspage
    /// made small because memory was short.
    objs: u16,
    /// Objects handed out and not freed.
    inuse: u16,
    /// Objects `next_fresh..` have never been handed out.
    next_fresh: u16,
    /// Head of the list of freed objects; each holds the next index in its
    /// first two bytes.
    free_head: u16,
    /// Position in the class's `partial` list, or `u32::MAX`.
    partial_at: u32,
    evacuating: AtomicBool,
}

struct Class {
    /// Zspages with room that take new objects.
    partial: Vec<NonNull<ZsPage>>,
    /// Every zspage of this class, for compaction's choice.
    zspages: u64,
    /// Objects its zspages hold, and those in use.
    capacity: u64,
    inuse: u64,
    /// Zspages set aside by [`ZsAlloc::plan_compaction`].
    evacuating: Vec<NonNull<ZsPage>>,
}

// SAFETY: the NonNulls are owned zspage descriptors, used under the class lock.
unsafe impl Send for Class {}

/// What the allocator holds, for `ramd status`.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ZsStats {
    pub pages: u64,
    pub zspages: u64,
}

pub(crate) struct ZsAlloc {
    classes: Box<[Mutex<Class>]>,
    pages: AtomicU64,
    zspages: AtomicU64,
}

const fn class_size(c: usize) -> usize {
    if c < SMALL_CLASSES {
        MIN_OBJECT + c * SMALL_STEP
    } else {
        PAGE_SIZE + (c - SMALL_CLASSES + 1) * LARGE_STEP
    }
}

const CLASS_SIZE: [u32; CLASSES] = {
    let mut t = [0u32; CLASSES];
    let mut c = 0;
    while c < CLASSES {
        t[c] = class_size(c) as u32;
        c += 1;
    }
    t
};

fn class_of(len: usize) -> usize {
    debug_assert!((1..=MAX_OBJECT).contains(&len));
    if len <= PAGE_SIZE {
        len.max(MIN_OBJECT).div_ceil(SMALL_STEP) - MIN_OBJECT / SMALL_STEP
    } else {
        SMALL_CLASSES + (len - PAGE_SIZE).div_ceil(LARGE_STEP) - 1
    }
}

/// Pages per zspage for objects of `size`: the fewest that waste under 1%
/// at the tail, else the least wasteful up to a cap.
fn zspage_pages(size: usize) -> usize {
    // Caps: bigger zspages waste less at the tail but hold more memory in
    // a class's last, partly used zspage (see `one_zspage_per_class_bytes`).
    let cap = if size <= PAGE_SIZE { 16 } else { 32 };
    let waste = |p: usize| (p * PAGE_SIZE) % size;
    let fits = |p: usize| (p * PAGE_SIZE) / size <= 1 << IDX_BITS;
    (1..=cap)
        .filter(|&p| fits(p) && p * PAGE_SIZE >= size)
        .find(|&p| waste(p) * 100 < p * PAGE_SIZE)
        .unwrap_or_else(|| {
            (1..=cap)
                .filter(|&p| fits(p) && p * PAGE_SIZE >= size)
                .min_by(|&a, &b| (waste(a) * b).cmp(&(waste(b) * a)))
                .expect("some zspage size fits")
        })
}

/// Memory held if every class has one zspage: the slack a store must
/// allow for beyond its pages, since each class's newest zspage fills up
/// object by object.
pub(crate) fn one_zspage_per_class_bytes() -> u64 {
    (0..CLASSES)
        .map(|c| {
            let n = zspage_pages(class_size(c));
            (n * PAGE_SIZE) as u64 + zspage_meta_bytes(n)
        })
        .sum()
}

/// Largest compressed size that fits the class `len` rounds up to.
pub(crate) fn rounded(len: usize) -> usize {
    class_size(class_of(len))
}

impl ZsAlloc {
    pub(crate) fn new() -> ZsAlloc {
        ZsAlloc {
            classes: (0..CLASSES)
                .map(|_| {
                    Mutex::new(Class {
                        partial: Vec::new(),
                        zspages: 0,
                        capacity: 0,
                        inuse: 0,
                        evacuating: Vec::new(),
                    })
                })
                .collect(),
            pages: AtomicU64::new(0),
            zspages: AtomicU64::new(0),
        }
    }

    /// Allocates an object of at least `len` bytes. A new zspage's memory is
    /// taken through `reserve(bytes)` first (pages + descriptor) and given
    /// back through `unreserve` when it is freed; nothing is charged if
    /// either the reservation or the pool fails.
    pub(crate) fn alloc(
        &self,
        len: usize,
        pool: &PagePool,
        reserve: impl Fn(u64) -> Result<()>,
        unreserve: impl Fn(u64),
    ) -> Result<Handle> {
        let c = class_of(len);
        let size = CLASS_SIZE[c] as usize;
        let mut class = self.classes[c].lock();
        let zp = match class.partial.last() {
            Some(&zp) => zp,
            None => {
                // Short of memory, a zspage of as few pages as the object
                // needs still lets compression go on (and free raw pages):
                // it packs worse, and compaction later moves its objects.
                let zp = match self.new_zspage(c, zspage_pages(size), pool, &reserve, &unreserve) {
                    Err(Error::NoSpace { .. } | Error::SharedNoSpace { .. })
                        if zspage_pages(size) > size.div_ceil(PAGE_SIZE) =>
                    {
                        self.new_zspage(c, size.div_ceil(PAGE_SIZE), pool, &reserve, &unreserve)?
                    }
                    r => r?,
                };
                class.zspages += 1;
                // SAFETY: just created, ours.
                class.capacity += unsafe { zp.as_ref() }.objs as u64;
                Self::push_partial(&mut class, zp);
                zp
            }
        };
        // SAFETY: zspages in `partial` are live and ours under the class lock.
        let z = unsafe { &mut *zp.as_ptr() };
        let idx = if z.free_head != NO_FREE {
            let idx = z.free_head;
            let mut next = [0u8; 2];
            // SAFETY: a freed object belongs to the allocator.
            unsafe { read_bytes(z, size, idx, &mut next) };
            z.free_head = u16::from_ne_bytes(next);
            idx
        } else {
            z.next_fresh += 1;
            z.next_fresh - 1
        };
        z.inuse += 1;
        class.inuse += 1;
        if z.inuse == z.objs {
            Self::remove_partial(&mut class, zp);
        }
        Ok(Handle { zspage: zp, idx })
    }

    /// Frees an object; the caller gives up the handle.
    pub(crate) fn free(&self, h: Handle, pool: &PagePool, unreserve: impl Fn(u64)) {
        let c = h.page().class as usize;
        let size = CLASS_SIZE[c] as usize;
        let mut class = self.classes[c].lock();
        // SAFETY: the zspage lives while `h` does; we hold its class lock.
        let z = unsafe { &mut *h.zspage.as_ptr() };
        let was_full = z.inuse == z.objs;
        // SAFETY: the object is being given back; nobody reads it any more.
        unsafe { write_bytes(z, size, h.idx, &z.free_head.to_ne_bytes()) };
        z.free_head = h.idx;
        z.inuse -= 1;
        class.inuse -= 1;
        let evacuating = z.evacuating.load(Relaxed);
        if z.inuse == 0 {
            if evacuating {
                class.evacuating.retain(|&p| p != h.zspage);
            } else if z.partial_at != u32::MAX {
                Self::remove_partial(&mut class, h.zspage);
            }
            class.zspages -= 1;
            class.capacity -= z.objs as u64;
            drop(class);
            self.free_zspage(h.zspage, pool, unreserve);
        } else if was_full && !evacuating {
            Self::push_partial(&mut class, h.zspage);
        }
    }

    /// Copies the object's first `dst.len()` bytes out.
    ///
    /// SAFETY: the caller owns `h` (holds the lock of the slot that does, or
    /// allocated it and has not published it).
    pub(crate) unsafe fn read(&self, h: Handle, dst: &mut [u8]) {
        let z = h.page();
        read_bytes(z, CLASS_SIZE[z.class as usize] as usize, h.idx, dst);
    }

    /// The object's first `len` bytes, if they lie in one page.
    ///
    /// SAFETY: as [`ZsAlloc::read`], for the lifetime of the slice.
    pub(crate) unsafe fn slice<'a>(&self, h: Handle, len: usize) -> Option<&'a [u8]> {
        let z = h.page();
        let off = h.idx as usize * CLASS_SIZE[z.class as usize] as usize;
        let (pg, at) = (off / PAGE_SIZE, off % PAGE_SIZE);
        (at + len <= PAGE_SIZE)
            .then(|| std::slice::from_raw_parts(z.pages[pg].as_ptr().add(at), len))
    }

    /// Copies `src` into the object's first bytes.
    ///
    /// SAFETY: as [`ZsAlloc::read`], with exclusive access.
    pub(crate) unsafe fn write(&self, h: Handle, src: &[u8]) {
        let z = h.page();
        write_bytes(z, CLASS_SIZE[z.class as usize] as usize, h.idx, src);
    }

    /// Whether `h` sits in a zspage that compaction is emptying.
    pub(crate) fn is_evacuating(&self, h: Handle) -> bool {
        h.page().evacuating.load(Relaxed)
    }

    /// Sets aside the emptiest zspages of every class whose free objects
    /// amount to at least two zspages and an eighth of its capacity, as
    /// long as the rest of the class has room for their objects. Returns the
    /// objects that need moving (0: nothing to do).
    pub(crate) fn plan_compaction(&self) -> u64 {
        let mut moves = 0;
        for (c, class) in self.classes.iter().enumerate() {
            let mut class = class.lock();
            let objs = objs_per(c) as u64;
            let capacity = class.capacity;
            let free = capacity - class.inuse;
            if free < 2 * objs || free * 8 < capacity {
                continue;
            }
            // SAFETY (all derefs below): zspages listed in `partial` are live
            // and ours under the class lock.
            let mut partial = std::mem::take(&mut class.partial);
            partial.sort_unstable_by_key(|zp| std::cmp::Reverse(unsafe { zp.as_ref() }.inuse));
            // Room left in the fuller zspages we keep, taken from the back.
            let mut room: u64 = partial
                .iter()
                .map(|zp| unsafe { zp.as_ref() }.free_objects())
                .sum();
            while let Some(&zp) = partial.last() {
                let z = unsafe { zp.as_ref() };
                let (live, own_room) = (z.inuse as u64, z.free_objects());
                // Room in the other zspages, less what earlier picks will use.
                if room < own_room || live > room - own_room {
                    break;
                }
                room -= own_room + live;
                moves += live;
                z.evacuating.store(true, Relaxed);
                unsafe { (*zp.as_ptr()).partial_at = u32::MAX };
                class.evacuating.push(zp);
                partial.pop();
            }
            for zp in partial {
                unsafe { (*zp.as_ptr()).partial_at = u32::MAX };
                Self::push_partial(&mut class, zp);
            }
        }
        moves
    }

    /// Ends a compaction pass: zspages that could not be emptied take new
    /// objects again.
    pub(crate) fn finish_compaction(&self) {
        for class in self.classes.iter() {
            let mut class = class.lock();
            for zp in std::mem::take(&mut class.evacuating) {
                // SAFETY: listed zspages are live; class lock held.
                unsafe { zp.as_ref() }.evacuating.store(false, Relaxed);
                Self::push_partial(&mut class, zp);
            }
        }
    }

    pub(crate) fn stats(&self) -> ZsStats {
        ZsStats {
            pages: self.pages.load(Relaxed),
            zspages: self.zspages.load(Relaxed),
        }
    }

    /// Memory charged for zspage descriptors.
    pub(crate) fn meta_bytes(&self) -> u64 {
        // Page lists are charged per zspage; recomputed from the counts so
        // the figure needs no lock.
        self.zspages.load(Relaxed) * zspage_meta_bytes(0)
            + self.pages.load(Relaxed) * std::mem::size_of::<PagePtr>() as u64
    }

    fn new_zspage(
        &self,
        c: usize,
        n: usize,
        pool: &PagePool,
        reserve: &impl Fn(u64) -> Result<()>,
        unreserve: &impl Fn(u64),
    ) -> Result<NonNull<ZsPage>> {
        let charge = (n * PAGE_SIZE) as u64 + zspage_meta_bytes(n);
        reserve(charge)?;
        let mut pages = Vec::with_capacity(n);
        for _ in 0..n {
            match pool.alloc() {
                Ok(p) => pages.push(p),
                Err(e) => {
                    pages.into_iter().for_each(|p| pool.free(p));
                    unreserve(charge);
                    return Err(e);
                }
            }
        }
        self.pages.fetch_add(n as u64, Relaxed);
        self.zspages.fetch_add(1, Relaxed);
        let z = Box::new(ZsPage {
            pages: pages.into_boxed_slice(),
            class: c as u16,
            objs: (n * PAGE_SIZE / CLASS_SIZE[c] as usize) as u16,
            inuse: 0,
            next_fresh: 0,
            free_head: NO_FREE,
            partial_at: u32::MAX,
            evacuating: AtomicBool::new(false),
        });
        Ok(NonNull::from(Box::leak(z)))
    }

    fn free_zspage(&self, zp: NonNull<ZsPage>, pool: &PagePool, unreserve: impl Fn(u64)) {
        // SAFETY: the zspage has no objects left, so no handle refers to it;
        // it was leaked from a Box in `new_zspage`.
        let z = unsafe { Box::from_raw(zp.as_ptr()) };
        let n = z.pages.len();
        for &p in z.pages.iter() {
            pool.free(p);
        }
        self.pages.fetch_sub(n as u64, Relaxed);
        self.zspages.fetch_sub(1, Relaxed);
        unreserve((n * PAGE_SIZE) as u64 + zspage_meta_bytes(n));
    }

    fn push_partial(class: &mut Class, zp: NonNull<ZsPage>) {
        // SAFETY: class lock held; the zspage is live.
        let z = unsafe { &mut *zp.as_ptr() };
        debug_assert_eq!(z.partial_at, u32::MAX);
        z.partial_at = class.partial.len() as u32;
        class.partial.push(zp);
    }

    fn remove_partial(class: &mut Class, zp: NonNull<ZsPage>) {
        // SAFETY: class lock held; listed zspages are live.
        let at = unsafe { zp.as_ref() }.partial_at as usize;
        debug_assert!(class.partial[at] == zp);
        class.partial.swap_remove(at);
        if let Some(&moved) = class.partial.get(at) {
            unsafe { (*moved.as_ptr()).partial_at = at as u32 };
        }
        unsafe { (*zp.as_ptr()).partial_at = u32::MAX };
    }
}

impl Drop for ZsAlloc {
    fn drop(&mut self) {
        // The page table has freed every object before the store drops us,
        // so only descriptors of empty zspages could remain: none, as they
        // are freed with their last object. Page memory goes with the pool.
        if !std::thread::panicking() {
            debug_assert_eq!(self.zspages.load(Relaxed), 0, "zspages leaked");
        }
    }
}

fn objs_per(c: usize) -> usize {
    let size = CLASS_SIZE[c] as usize;
    zspage_pages(size) * PAGE_SIZE / size
}

/// SAFETY: the caller owns object `idx` of `z` (see the module invariants).
unsafe fn read_bytes(z: &ZsPage, size: usize, idx: u16, dst: &mut [u8]) {
    let mut off = idx as usize * size;
    let mut done = 0;
    while done < dst.len() {
        let (pg, at) = (off / PAGE_SIZE, off % PAGE_SIZE);
        let n = (PAGE_SIZE - at).min(dst.len() - done);
        std::ptr::copy_nonoverlapping(z.pages[pg].as_ptr().add(at), dst[done..].as_mut_ptr(), n);
        done += n;
        off += n;
    }
}

/// SAFETY: as [`read_bytes`], with exclusive access.
unsafe fn write_bytes(z: &ZsPage, size: usize, idx: u16, src: &[u8]) {
    let mut off = idx as usize * size;
    let mut done = 0;
    while done < src.len() {
        let (pg, at) = (off / PAGE_SIZE, off % PAGE_SIZE);
        let n = (PAGE_SIZE - at).min(src.len() - done);
        std::ptr::copy_nonoverlapping(src[done..].as_ptr(), z.pages[pg].as_ptr().add(at), n);
        done += n;
        off += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_every_size_and_pack_tightly() {
        for len in 1..=MAX_OBJECT {
            let c = class_of(len);
            assert!(class_size(c) >= len, "{len}");
            assert!(c == 0 || class_size(c - 1) < len, "{len}");
        }
        assert_eq!(class_of(MAX_OBJECT), CLASSES - 1);
        let mut total_waste = 0.0;
        for c in 0..CLASSES {
            let size = class_size(c);
            let p = zspage_pages(size);
            let objs = objs_per(c);
            assert!((1..=1 << IDX_BITS).contains(&objs), "class {c}");
            total_waste += ((p * PAGE_SIZE) % size) as f64 / (p * PAGE_SIZE) as f64;
        }
        assert!(total_waste / (CLASSES as f64) < 0.01);
    }

    #[test]
    fn handles_round_trip_and_objects_keep_their_bytes() {
        let pool = PagePool::new(1 << 20, 0);
        let zs = ZsAlloc::new();
        let charged = AtomicU64::new(0);
        let reserve = |b| {
            charged.fetch_add(b, Relaxed);
            Ok(())
        };
        let unreserve = |b| {
            charged.fetch_sub(b, Relaxed);
        };
        let mut objs = Vec::new();
        for i in 0..3000usize {
            let len = 1 + (i * 7919) % 5000;
            let h = zs.alloc(len, &pool, reserve, unreserve).unwrap();
            assert_eq!(unsafe { Handle::decode(h.encode() | 0xAB << 56) }, h);
            let data: Vec<u8> = (0..len).map(|j| (i + j) as u8).collect();
            unsafe { zs.write(h, &data) };
            objs.push((h, data));
        }
        // Free every other object, then check the rest survived.
        for (h, _) in objs.iter().step_by(2) {
            zs.free(*h, &pool, unreserve);
        }
        for (h, data) in objs.iter().skip(1).step_by(2) {
            let mut back = vec![0; data.len()];
            unsafe { zs.read(*h, &mut back) };
            assert_eq!(&back, data);
        }
        for (h, _) in objs.iter().skip(1).step_by(2) {
            zs.free(*h, &pool, unreserve);
        }
        let st = zs.stats();
        assert_eq!((st.pages, st.zspages), (0, 0));
        assert_eq!(charged.load(Relaxed), 0);
    }
}
