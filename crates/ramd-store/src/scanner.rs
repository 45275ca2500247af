//! The background scanner: runs [`Store::background_pass`] for each store
//! every [`Store::scanner_period`], at the lowest CPU priority (nice 19),
//! so compression work yields to I/O.
//!
//! A [`ScannerPool`] serves any number of stores (the disks of one daemon)
//! with one leader thread; a pass of one store is split over `threads`
//! threads, and passes of different stores take turns, so background work
//! never takes more than `threads` cores whatever the number of disks.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::store::Store;

struct Entry {
    id: u64,
    store: Arc<Store>,
    period: Duration,
    next: Instant,
    /// A pass of this store is running (its handle waits for it on drop).
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

    /// Adds a store; `None` if it has no background work.
    pub fn add(&self, store: Arc<Store>) -> Option<ScanHandle> {
        let period = store.scanner_period()?;
        let mut st = self.shared.state.lock();
        let id = st.next_id;
        st.next_id += 1;
        st.entries.push(Entry {
            id,
            store,
            period,
            next: Instant::now() + period,
            busy: false,
        });
        self.shared.changed.notify_all();
        Some(ScanHandle {
            shared: self.shared.clone(),
            id,
        })
    }
}

fn leader(shared: &Shared) {
    let mut st = shared.state.lock();
    loop {
        if st.stop {
            return;
        }
        let now = Instant::now();
        let due = st
            .entries
            .iter_mut()
            .filter(|e| !e.busy)
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
                    e.next = Instant::now() + e.period;
                }
                shared.changed.notify_all();
            }
            Some(e) => {
                let until = e.next;
                shared.changed.wait_until(&mut st, until);
            }
            None => shared.changed.wait(&mut st),
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

/// nice 19 for the calling thread only (Linux applies it per thread id).
fn lower_priority() {
    // SAFETY: plain syscalls on the calling thread's own id.
    unsafe {
        let tid = libc::syscall(libc::SYS_gettid) as libc::id_t;
        libc::setpriority(libc::PRIO_PROCESS, tid, 19);
    }
}
