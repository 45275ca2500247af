//! Page memory: 4 KiB frames carved from 2 MiB anonymous mappings.
//!
//! Why not `Box<[u8; 4096]>`: glibc serves 4 KiB blocks from its heap and
//! rarely gives them back, so a trimmed disk would keep its RSS. Owning the
//! mappings lets a free page either stay *warm* (kept resident and handed out
//! again: first-touch faults cost ~16 µs per page on our VMs, ≈0.25 GiB/s) or
//! go *cold* (`MADV_DONTNEED`: RSS drops at once, the address is reused later).
//! Up to `warm_limit` free pages stay warm; beyond that they are released in
//! batches, sorted and coalesced so one `madvise` covers many pages.
//!
//! The warm list also *decays* (as jemalloc's dirty pages do): every
//! [`DECAY_TICK`] the background thread calls [`PagePool::decay`], which
//! releases half of the pages that sat in the list through the whole last
//! tick (its low-water mark), all of them once that is under 1 MiB. Pages the
//! disk keeps reusing never reach the low-water mark, so a busy disk keeps
//! them; an idle one is back at its `memory_used` within a few seconds.

use std::collections::VecDeque;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::arena::{map_arena, promise_lock, Arena, MemoryPolicy, ARENA_BYTES, LOCK_PROMISED};
use crate::error::{Error, Result};
use crate::numa::NumaPolicy;
use crate::sys::{mem_available, mem_total, PAGE_SIZE};

const ARENA_PAGES: usize = ARENA_BYTES / PAGE_SIZE;
/// How many fresh (never-touched) pages may be handed out between two looks
/// at the host's `MemAvailable`.
const HOST_CHECK_PAGES: u64 = ARENA_PAGES as u64;
/// How often the warm list decays (see [`PagePool::decay`]).
pub const DECAY_TICK: std::time::Duration = std::time::Duration::from_secs(1);
/// Below this many idle warm pages (1 MiB) a decay releases them all rather
/// than half, so the list reaches zero instead of creeping towards it.
const DECAY_ALL_PAGES: usize = 256;

/// Page memory of every pool of the process, for the process-wide figures
/// of `ramd status` (see `crate::procmem`).
pub(crate) static PROCESS_IN_USE: AtomicU64 = AtomicU64::new(0);
pub(crate) static PROCESS_WARM: AtomicU64 = AtomicU64::new(0);
/// A pointer to one page frame owned by the pool's mappings.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct PagePtr(NonNull<u8>);

// SAFETY: a PagePtr is a plain address inside a mapping that lives as long as
// the pool; whoever holds it (one page-table slot, or the pool's free lists)
// is its only owner, and access to its bytes is serialised by the owner's lock.
unsafe impl Send for PagePtr {}
unsafe impl Sync for PagePtr {}

impl PagePtr {
    pub(crate) fn as_ptr(self) -> *mut u8 {
        self.0.as_ptr()
    }

    /// The inverse of `as_ptr() as u64`, for the packed page table.
    pub(crate) fn from_addr(addr: u64) -> PagePtr {
        PagePtr(NonNull::new(addr as *mut u8).expect("page address is not null"))
    }
}

struct Inner {
    /// Free, resident pages; the back is the most recently freed (cache-hot).
    warm: VecDeque<PagePtr>,
    /// Free pages already returned to the kernel with MADV_DONTNEED.
    cold: Vec<PagePtr>,
    arenas: Vec<Arena>,
    /// Untouched pages left at the end of the newest arena.
    bump_next: usize,
    /// Fresh pages that may be handed out before the next host memory check.
    host_budget: u64,
    /// The fewest warm pages since the last decay: that many sat unused
    /// through the whole tick.
    low: usize,
}

/// Counters readable without the pool lock.
#[derive(Default)]
struct Counters {
    mapped: AtomicU64,
    warm: AtomicU64,
    cold: AtomicU64,
    released: AtomicU64,
    in_use: AtomicU64,
    decayed: AtomicU64,
}

pub(crate) struct PagePool {
    inner: Mutex<Inner>,
    warm_limit: usize,
    host_reserve: u64,
    counters: Counters,
    policy: MemoryPolicy,
    /// What this pool added to `LOCK_PROMISED`.
    promised: u64,
    /// Fault in each new arena whole when it is mapped (see
    /// [`PagePool::set_populate`]).
    populate: AtomicBool,
}

/// Pool figures for `ramd status`, in bytes.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct PoolStats {
    /// Virtual memory mapped for pages (not all of it resident).
    pub mapped_bytes: u64,
    /// Free pages kept resident for reuse.
    pub warm_bytes: u64,
    /// Free pages whose memory went back to the kernel.
    pub cold_bytes: u64,
    /// Total bytes ever given back to the kernel with MADV_DONTNEED.
    pub released_bytes: u64,
    /// Pages handed out (holding data, zspages or frames): resident.
    #[serde(default)]
    pub in_use_bytes: u64,
    /// Of `released_bytes`, what the warm list's decay gave back.
    #[serde(default)]
    pub decayed_bytes: u64,
}

impl PagePool {
    #[cfg(test)]
    pub(crate) fn new(warm_limit_bytes: u64, host_reserve: u64) -> PagePool {
        PagePool::with_policy(warm_limit_bytes, host_reserve, MemoryPolicy::default(), 0)
            .expect("no policy to check")
    }

    /// A pool whose memory follows `policy`; with `mlock`, `max_bytes` is
    /// the most it will hold, checked against RLIMIT_MEMLOCK here (an error
    /// naming the limit and how to raise it), before anything is mapped.
    pub(crate) fn with_policy(
        warm_limit_bytes: u64,
        host_reserve: u64,
        policy: MemoryPolicy,
        max_bytes: u64,
    ) -> Result<PagePool> {
        let promised = match policy.mlock {
            // Arenas are locked whole: round up, plus the one being filled.
            true => promise_lock(
                max_bytes
                    .div_ceil(ARENA_BYTES as u64)
                    .saturating_add(1)
                    .saturating_mul(ARENA_BYTES as u64),
            )?,
            false => 0,
        };
        Ok(PagePool {
            inner: Mutex::new(Inner {
                warm: VecDeque::new(),
                cold: Vec::new(),
                arenas: Vec::new(),
                bump_next: ARENA_PAGES,
                host_budget: 0,
                low: 0,
            }),
            warm_limit: (warm_limit_bytes / PAGE_SIZE as u64) as usize,
            host_reserve,
            counters: Counters::default(),
            policy,
            promised,
            populate: AtomicBool::new(false),
        })
    }

    /// While `on`, each arena mapped is faulted in whole at once
    /// (MADV_POPULATE_WRITE), for a caller about to fill every page of it
    /// (a load: pages are handed out in address order): one call costs far
    /// less than 512 page faults, each a trap into the kernel, on a VM
    /// above all. Off (the default), RSS follows the pages handed out.
    pub(crate) fn set_populate(&self, on: bool) {
        self.populate.store(on, Relaxed);
    }

    /// Takes a free page. Its contents are unspecified: callers overwrite it.
    pub(crate) fn alloc(&self) -> Result<PagePtr> {
        let (p, new_arena) = self.alloc_inner()?;
        if new_arena && self.populate.load(Relaxed) {
            // Outside the pool's lock: faulting in leaves the contents of
            // pages already handed out alone. A kernel without
            // MADV_POPULATE_WRITE (before 5.14) refuses it, and the pages
            // fault in one by one as before; so does a host short of
            // memory, whose first touch then fails as it would have.
            // SAFETY: advice on the arena just mapped, which `p` starts.
            unsafe { libc::madvise(p.as_ptr().cast(), ARENA_BYTES, libc::MADV_POPULATE_WRITE) };
        }
        self.counters.in_use.fetch_add(PAGE_SIZE as u64, Relaxed);
        PROCESS_IN_USE.fetch_add(PAGE_SIZE as u64, Relaxed);
        Ok(p)
    }

    /// A page, and whether it is the first of a newly mapped arena.
    fn alloc_inner(&self) -> Result<(PagePtr, bool)> {
        let mut inner = self.inner.lock();
        if let Some(p) = inner.warm.pop_back() {
            inner.low = inner.low.min(inner.warm.len());
            self.sub_warm(1);
            return Ok((p, false));
        }
        // Everything below faults in new memory: guard the host first.
        if inner.host_budget == 0 {
            self.check_host()?;
            inner.host_budget = HOST_CHECK_PAGES;
        }
        inner.host_budget -= 1;
        if let Some(p) = inner.cold.pop() {
            self.counters.cold.fetch_sub(PAGE_SIZE as u64, Relaxed);
            return Ok((p, false));
        }
        let new_arena = inner.bump_next == ARENA_PAGES;
        if new_arena {
            let arena = map_arena(&self.policy)?;
            inner.arenas.push(arena);
            inner.bump_next = 0;
            self.counters.mapped.fetch_add(ARENA_BYTES as u64, Relaxed);
        }
        let base = inner.arenas.last().expect("arena just ensured").base;
        // SAFETY: bump_next < ARENA_PAGES, so the offset stays inside the mapping.
        let ptr = unsafe { base.as_ptr().add(inner.bump_next * PAGE_SIZE) };
        inner.bump_next += 1;
        Ok((
            PagePtr(NonNull::new(ptr).expect("mapping is not null")),
            new_arena,
        ))
    }

    /// Returns a page. The caller gives up every access to it.
    pub(crate) fn free(&self, page: PagePtr) {
        self.counters.in_use.fetch_sub(PAGE_SIZE as u64, Relaxed);
        PROCESS_IN_USE.fetch_sub(PAGE_SIZE as u64, Relaxed);
        let batch = {
            let mut inner = self.inner.lock();
            inner.warm.push_back(page);
            self.counters.warm.fetch_add(PAGE_SIZE as u64, Relaxed);
            PROCESS_WARM.fetch_add(PAGE_SIZE as u64, Relaxed);
            if inner.warm.len() <= self.warm_limit {
                return;
            }
            // Release down to 3/4 of the limit so that the next frees do not
            // each pay for a madvise.
            let keep = self.warm_limit * 3 / 4;
            let n = inner.warm.len() - keep;
            self.sub_warm(n);
            inner.low = inner.low.min(keep);
            inner.warm.drain(..n).collect::<Vec<_>>()
        };
        self.release(batch);
    }

    fn sub_warm(&self, pages: usize) {
        let bytes = (pages * PAGE_SIZE) as u64;
        self.counters.warm.fetch_sub(bytes, Relaxed);
        PROCESS_WARM.fetch_sub(bytes, Relaxed);
    }

    /// One decay tick: gives back half of the warm pages that went unused
    /// since the last tick (all of them under 1 MiB), oldest first, and
    /// returns the bytes released. Meant to run every [`DECAY_TICK`].
    pub(crate) fn decay(&self) -> u64 {
        let batch = {
            let mut inner = self.inner.lock();
            let idle = inner.low.min(inner.warm.len());
            let n = if idle <= DECAY_ALL_PAGES {
                idle
            } else {
                idle.div_ceil(2)
            };
            self.sub_warm(n);
            let batch: Vec<_> = inner.warm.drain(..n).collect();
            inner.low = inner.warm.len();
            batch
        };
        let bytes = (batch.len() * PAGE_SIZE) as u64;
        if bytes > 0 {
            self.counters.decayed.fetch_add(bytes, Relaxed);
            self.release(batch);
        }
        bytes
    }

    /// Gives the memory of `pages` back to the kernel, then files them as cold.
    fn release(&self, mut pages: Vec<PagePtr>) {
        pages.sort_unstable_by_key(|p| p.as_ptr() as usize);
        let mut i = 0;
        while i < pages.len() {
            let start = pages[i].as_ptr();
            let mut j = i + 1;
            while j < pages.len()
                && pages[j].as_ptr() as usize == start as usize + (j - i) * PAGE_SIZE
            {
                j += 1;
            }
            let (addr, len) = (start as *mut libc::c_void, (j - i) * PAGE_SIZE);
            // Locked pages cannot be dropped (EINVAL): unlock them first and
            // lock the range again on fault, which brings nothing back in.
            // SAFETY (all three): the range covers only free pages of our own
            // mappings, which nobody reads or writes while they sit in the pool.
            if self.policy.mlock {
                let rc = unsafe { libc::munlock(addr, len) };
                debug_assert_eq!(rc, 0, "munlock failed");
            }
            let rc = unsafe { libc::madvise(addr, len, libc::MADV_DONTNEED) };
            // madvise on our own private anonymous mapping cannot fail for
            // reasons we could act on; the pages stay usable either way.
            debug_assert_eq!(rc, 0, "madvise(MADV_DONTNEED) failed");
            if self.policy.mlock {
                // Within the limit: the same range was locked a moment ago.
                let rc = unsafe { libc::mlock2(addr, len, libc::MLOCK_ONFAULT) };
                debug_assert_eq!(rc, 0, "mlock2 failed");
            }
            i = j;
        }
        let bytes = (pages.len() * PAGE_SIZE) as u64;
        self.counters.released.fetch_add(bytes, Relaxed);
        self.counters.cold.fetch_add(bytes, Relaxed);
        self.inner.lock().cold.extend(pages);
    }

    fn check_host(&self) -> Result<()> {
        if self.host_reserve == 0 {
            return Ok(());
        }
        let available = mem_available().unwrap_or(u64::MAX);
        if available < self.host_reserve + ARENA_BYTES as u64 {
            log::warn!(
                "refusing page memory: host MemAvailable {available} bytes, reserve {} bytes",
                self.host_reserve
            );
            return Err(Error::HostMemoryLow {
                available,
                reserve: self.host_reserve,
            });
        }
        // Bound to some nodes, a fault the nodes cannot serve wakes the OOM
        // killer however much the others have: keep those nodes' share of
        // the reserve free too.
        if let Some(p) = self
            .policy
            .numa
            .as_ref()
            .filter(|p| p.policy == NumaPolicy::Bind)
        {
            if let (Some((free, total)), Some(host)) =
                (crate::numa::nodes_memory(&p.nodes), mem_total())
            {
                let share =
                    (self.host_reserve as u128 * total as u128 / host.max(1) as u128) as u64;
                if free < share + ARENA_BYTES as u64 {
                    log::warn!(
                        "refusing page memory: NUMA node(s) {} have {free} bytes free, their share of the reserve is {share} bytes",
                        crate::numa::list_text(&p.nodes)
                    );
                    return Err(Error::HostMemoryLow {
                        available: free,
                        reserve: share,
                    });
                }
            }
        }
        Ok(())
    }

    /// Bytes of new page memory the host guard would still allow (MemAvailable
    /// above the reserve, less the margin `check_host` keeps); `None`: no guard.
    pub(crate) fn host_room(&self) -> Option<u64> {
        if self.host_reserve == 0 {
            return None;
        }
        let available = mem_available()?;
        Some(available.saturating_sub(self.host_reserve + ARENA_BYTES as u64))
    }

    /// Whether the host is above its reserve (for memory not from the pool).
    pub(crate) fn host_has_room(&self) -> bool {
        self.check_host().is_ok()
    }

    /// Resident pages of this pool per NUMA node, from the kernel (see
    /// `numa::pages_per_node`), and the sampling step (1: every page).
    pub(crate) fn pages_per_node(&self) -> (std::collections::BTreeMap<u32, u64>, u64) {
        // Arenas live as long as the pool: their addresses stay valid to
        // ask about once the lock is let go.
        let ranges: Vec<(usize, usize)> = self
            .inner
            .lock()
            .arenas
            .iter()
            .map(|a| (a.base.as_ptr() as usize, ARENA_BYTES))
            .collect();
        crate::numa::pages_per_node(&ranges)
    }

    pub(crate) fn stats(&self) -> PoolStats {
        PoolStats {
            mapped_bytes: self.counters.mapped.load(Relaxed),
            warm_bytes: self.counters.warm.load(Relaxed),
            cold_bytes: self.counters.cold.load(Relaxed),
            released_bytes: self.counters.released.load(Relaxed),
            in_use_bytes: self.counters.in_use.load(Relaxed),
            decayed_bytes: self.counters.decayed.load(Relaxed),
        }
    }
}

impl Drop for PagePool {
    fn drop(&mut self) {
        LOCK_PROMISED.fetch_sub(self.promised, Relaxed);
        PROCESS_IN_USE.fetch_sub(self.counters.in_use.load(Relaxed), Relaxed);
        PROCESS_WARM.fetch_sub(self.counters.warm.load(Relaxed), Relaxed);
        for arena in self.inner.get_mut().arenas.drain(..) {
            // SAFETY: the store that owned every page of this arena is being
            // dropped, so no pointer into it is used again.
            unsafe { libc::munmap(arena.base.as_ptr() as *mut libc::c_void, ARENA_BYTES) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arena::HugePages;

    #[test]
    fn reuses_warm_pages_lifo() {
        let pool = PagePool::new(1 << 20, 0);
        let a = pool.alloc().unwrap();
        let b = pool.alloc().unwrap();
        assert_ne!(a, b);
        pool.free(a);
        assert_eq!(pool.alloc().unwrap(), a);
        assert_eq!(pool.stats().mapped_bytes, ARENA_BYTES as u64);
    }

    /// Pages of the arena that starts at `base` that are resident.
    fn resident(base: PagePtr) -> usize {
        let mut v = vec![0u8; ARENA_PAGES];
        // SAFETY: mincore of one of our own arenas, into a vector with a
        // byte per page of it.
        let rc = unsafe { libc::mincore(base.as_ptr().cast(), ARENA_BYTES, v.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        v.iter().filter(|&&b| b & 1 != 0).count()
    }

    /// While populating (a load), the first page taken from a new arena
    /// brings the whole arena in; otherwise nothing is resident until it
    /// is touched.
    #[test]
    fn populating_faults_in_whole_arenas_only_while_on() {
        let pool = PagePool::new(0, 0);
        pool.set_populate(true);
        let first = pool.alloc().unwrap();
        assert_eq!(
            resident(first),
            ARENA_PAGES,
            "MADV_POPULATE_WRITE did not fault the arena in (Linux 5.14 or later has it)"
        );
        let rest: Vec<_> = (1..ARENA_PAGES).map(|_| pool.alloc().unwrap()).collect();
        assert_eq!(pool.stats().mapped_bytes, ARENA_BYTES as u64);
        pool.set_populate(false);
        let second = pool.alloc().unwrap();
        assert_eq!(pool.stats().mapped_bytes, 2 * ARENA_BYTES as u64);
        assert_eq!(resident(second), 0);
        // SAFETY: ours; a fresh page reads as zeros and is writable.
        unsafe {
            assert_eq!(*first.as_ptr().add(PAGE_SIZE - 1), 0);
            second.as_ptr().write_bytes(3, PAGE_SIZE);
        }
        assert!((1..=ARENA_PAGES).contains(&resident(second)));
        for p in rest.into_iter().chain([first, second]) {
            pool.free(p);
        }
    }

    #[test]
    fn releases_beyond_warm_limit() {
        let limit_pages = 16;
        let pool = PagePool::new((limit_pages * PAGE_SIZE) as u64, 0);
        let pages: Vec<_> = (0..64).map(|_| pool.alloc().unwrap()).collect();
        for p in &pages {
            // SAFETY: test owns the page until it frees it below.
            unsafe { p.as_ptr().write_bytes(0xAB, PAGE_SIZE) };
        }
        for p in pages {
            pool.free(p);
        }
        let s = pool.stats();
        assert!(s.warm_bytes <= (limit_pages * PAGE_SIZE) as u64);
        assert_eq!(s.warm_bytes + s.cold_bytes, (64 * PAGE_SIZE) as u64);
        assert!(s.released_bytes > 0);
    }

    #[test]
    fn decay_gives_back_what_idles_and_keeps_what_is_reused() {
        let pool = PagePool::new(64 << 20, 0);
        let pages: Vec<_> = (0..2048).map(|_| pool.alloc().unwrap()).collect();
        for p in &pages {
            // SAFETY: test owns the page until it frees it below.
            unsafe { p.as_ptr().write_bytes(1, PAGE_SIZE) };
        }
        for p in pages {
            pool.free(p);
        }
        let page = PAGE_SIZE as u64;
        // The tick in which they were freed: none of them sat idle through it.
        assert_eq!(pool.decay(), 0);
        assert_eq!(pool.stats().warm_bytes, 2048 * page);
        // A disk reusing 100 pages each tick keeps those 100 warm while the
        // rest halves, then goes at once below 1 MiB.
        let mut warm = vec![];
        for _ in 0..12 {
            let reused: Vec<_> = (0..100).map(|_| pool.alloc().unwrap()).collect();
            reused.into_iter().for_each(|p| pool.free(p));
            pool.decay();
            warm.push(pool.stats().warm_bytes / page);
        }
        assert_eq!(&warm[..4], &[1074, 587, 343, 100], "{warm:?}");
        assert!(warm[4..].iter().all(|&w| w == 100), "{warm:?}");
        // Idle: all goes.
        pool.decay();
        let s = pool.stats();
        assert_eq!((s.warm_bytes, s.in_use_bytes), (0, 0));
        assert_eq!(s.cold_bytes, 2048 * page);
        assert_eq!(s.decayed_bytes, 2048 * page);
    }

    #[test]
    fn locked_pool_pages_can_still_be_released() {
        let policy = MemoryPolicy {
            mlock: true,
            ..MemoryPolicy::default()
        };
        // Root (CAP_IPC_LOCK) or a limit of at least two arenas.
        let Ok(pool) = PagePool::with_policy(0, 0, policy, 4096) else {
            panic!("RLIMIT_MEMLOCK below 4 MiB: run as root or raise it with ulimit -l")
        };
        let pages: Vec<_> = (0..64).map(|_| pool.alloc().unwrap()).collect();
        for p in &pages {
            // SAFETY: test owns the page until it frees it below.
            unsafe { p.as_ptr().write_bytes(7, PAGE_SIZE) };
        }
        pages.into_iter().for_each(|p| pool.free(p));
        assert_eq!(pool.stats().released_bytes, 64 * PAGE_SIZE as u64);
        let p = pool.alloc().unwrap();
        // SAFETY: ours; a released page reads as zeros and is writable.
        unsafe {
            assert_eq!(*p.as_ptr(), 0);
            p.as_ptr().write_bytes(9, PAGE_SIZE);
        }
    }

    #[test]
    fn huge_page_arenas_are_aligned_and_release_like_others() {
        for h in [HugePages::Never, HugePages::Madvise, HugePages::Always] {
            let policy = MemoryPolicy {
                huge_pages: Some(h),
                ..MemoryPolicy::default()
            };
            let pool = PagePool::with_policy(0, 0, policy, 0).unwrap();
            let pages: Vec<_> = (0..ARENA_PAGES + 1)
                .map(|_| pool.alloc().unwrap())
                .collect();
            if h != HugePages::Never {
                assert_eq!(pages[0].as_ptr() as usize % ARENA_BYTES, 0, "{h}");
            }
            for p in &pages {
                // SAFETY: the test owns the page until it frees it below.
                unsafe { p.as_ptr().write_bytes(3, PAGE_SIZE) };
            }
            pages.into_iter().for_each(|p| pool.free(p));
            let s = pool.stats();
            assert_eq!(
                s.released_bytes,
                ((ARENA_PAGES + 1) * PAGE_SIZE) as u64,
                "{h}"
            );
        }
    }
}
