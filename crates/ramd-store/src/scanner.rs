//! The background scanner: runs [`Store::background_pass`] for each store
//! every [`Store::scanner_period`], at the lowest CPU priority (nice 19),
//! so compression work yields to I/O.
//!
//! A [`ScannerPool`] serves any number of stores (the disks of one daemon)
//! with one leader thread; a pass of one store is split over `threads`
//! threads, and passes of different stores take turns, so background work
//! never takes more than `threads` cores whatever the number of disks.
//!
//! The same leader also ticks every store's warm-page decay once a
//! [`DECAY_TICK`] (see `pool.rs`), compressed or not: no other thread wakes
//! up for it, and a tick that finds nothing idle costs one lock.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::pool::DECAY_TICK;
use crate::store::Store;

struct Entry {
    id: u64,
    store: Arc<Store>,
    /// `None`: no background passes, only the decay.
    period: Option<Duration>,
    next: Instant,
    decay_next: Instant,
    /// A pass or decay of this store is running (its handle waits for it
    /// on drop).
    busy: bool,
}

#[derive(Default)]
struct State {
    entries: Vec<Entry>,
    next_id: u64,
    stop: bool,
}

struct Shared {
    threads: usize,
    state: Mutex<State>,
    changed: Condvar,
}

/// Background threads shared by stores; dropping it stops them (after
/// every [`ScanHandle`] is gone or not).
pub struct ScannerPool {
    shared: Arc<Shared>,
    leader: Option<JoinHandle<()>>,
}

/// A store's place in a [`ScannerPool`]; dropping it takes the store out,
/// waiting for a pass of it that is under way.
pub struct ScanHandle {
    shared: Arc<Shared>,
    id: u64,
}

impl ScannerPool {
    /// A pool whose passes use `threads` threads (at least one).
    pub fn new(threads: usize) -> std::io::Result<ScannerPool> {
        let shared = Arc::new(Shared {
            threads: threads.max(1),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
        });
        let leader = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("ramd-scan".into())
                .spawn(move || {
                    lower_priority();
                    leader(&shared)
                })?
        };
        Ok(ScannerPool {
            shared,
            leader: Some(leader),
        })
    }

    /// Adds a store: its passes if it has background work, its decay
    /// whatever it has.
    pub fn add(&self, store: Arc<Store>) -> ScanHandle {
        let period = store.scanner_period();
        let mut st = self.shared.state.lock();
        let id = st.next_id;
        st.next_id += 1;
        let now = Instant::now();
        st.entries.push(Entry {
            id,
            store,
            period,
            next: now + period.unwrap_or(Duration::ZERO),
            decay_next: now + DECAY_TICK,
            busy: false,
        });
        self.shared.changed.notify_all();
        ScanHandle {
            shared: self.shared.clone(),
            id,
        }
    }
}

fn leader(shared: &Shared) {
    let mut st = shared.state.lock();
    loop {
        if st.stop {
            return;
        }
        let now = Instant::now();
        // Decay first: a tick is cheap, and a long pass of one store must
        // not keep another's idle pages resident.
        let decays: Vec<(u64, Arc<Store>)> = st
            .entries
            .iter_mut()
            .filter(|e| !e.busy && e.decay_next <= now)
            .map(|e| {
                e.busy = true;
                (e.id, e.store.clone())
            })
            .collect();
        if !decays.is_empty() {
            drop(st);
            let released: u64 = decays.iter().map(|(_, s)| s.decay()).sum();
            // Heap memory freed with the pages (chunks, zspage
            // descriptors) goes back too, and so do the request buffers a
            // client that left freed (glibc keeps them resident).
            trim_heap(released > 0);
            st = shared.state.lock();
            let next = Instant::now() + DECAY_TICK;
            for (id, _) in decays {
                if let Some(e) = st.entries.iter_mut().find(|e| e.id == id) {
                    e.busy = false;
                    e.decay_next = next;
                }
            }
            shared.changed.notify_all();
            continue;
        }
        let due = st
            .entries
            .iter_mut()
            .filter(|e| !e.busy && e.period.is_some())
            .min_by_key(|e| e.next);
        match due {
            Some(e) if e.next <= now => {
                e.busy = true;
                let (id, store) = (e.id, e.store.clone());
                drop(st);
                run_pass(&store, shared.threads);
                st = shared.state.lock();
                if let Some(e) = st.entries.iter_mut().find(|e| e.id == id) {
                    e.busy = false;
                    e.next = Instant::now() + e.period.unwrap_or(DECAY_TICK);
                }
                shared.changed.notify_all();
            }
            due => {
                let pass = due.map(|e| e.next);
                let decay = st
                    .entries
                    .iter()
                    .filter(|e| !e.busy)
                    .map(|e| e.decay_next)
                    .min();
                match pass.into_iter().chain(decay).min() {
                    Some(until) => {
                        shared.changed.wait_until(&mut st, until);
                    }
                    None => shared.changed.wait(&mut st),
                }
            }
        }
    }
}

impl Drop for ScanHandle {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock();
        while st.entries.iter().any(|e| e.id == self.id && e.busy) {
            self.shared.changed.wait(&mut st);
        }
        st.entries.retain(|e| e.id != self.id);
        self.shared.changed.notify_all();
    }
}

impl Drop for ScannerPool {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.changed.notify_all();
        if let Some(t) = self.leader.take() {
            let _ = t.join();
        }
    }
}

/// One pass, its shards split over `threads` threads (helpers live for the
/// pass only: passes are seconds apart, a thread start is microseconds).
fn run_pass(store: &Store, threads: usize) {
    let pass = store.begin_pass();
    let report = std::thread::scope(|s| {
        let helpers: Vec<_> = (1..threads)
            .map(|part| {
                s.spawn(move || {
                    lower_priority();
                    store.background_pass(part, threads)
                })
            })
            .collect();
        let mut total = store.background_pass(0, threads);
        for h in helpers {
            let r = h.join().expect("scanner helper panicked");
            total.compressed += r.compressed;
            total.repacked += r.repacked;
            total.split += r.split;
            total.moved += r.moved;
            total.starved |= r.starved;
        }
        total
    });
    store.end_pass(pass);
    if report != Default::default() {
        log::debug!("background pass: {report:?}");
    }
}

/// Gives the C heap's free memory back to the kernel (glibc keeps it
/// otherwise: freed chunk maps and buffers would stay in RSS): when `force`d
/// (pages were released), or when the heap's free space has grown by a MiB
/// since the last trim, so that an idle daemon does not trim every tick.
fn trim_heap(force: bool) {
    #[cfg(target_env = "gnu")]
    {
        use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
        static FREE_AFTER_LAST: AtomicU64 = AtomicU64::new(0);
        // SAFETY: mallinfo2 only reads the allocator's statistics, and
        // malloc_trim only reorganises its own free lists.
        unsafe {
            let free = libc::mallinfo2().fordblks as u64;
            if force || free > FREE_AFTER_LAST.load(Relaxed) + (1 << 20) {
                libc::malloc_trim(0);
                FREE_AFTER_LAST.store(libc::mallinfo2().fordblks as u64, Relaxed);
            }
        }
    }
    #[cfg(not(target_env = "gnu"))]
    let _ = force;
}

/// nice 19 for the calling thread only (Linux applies it per thread id).
fn lower_priority() {
    // SAFETY: plain syscalls on the calling thread's own id.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19);
    }
}
