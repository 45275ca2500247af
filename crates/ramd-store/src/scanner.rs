//! The background scanner: runs [`Store::background_pass`] every
//! [`Store::scanner_period`] on `threads` threads at the lowest CPU
//! priority (nice 19), so compression work yields to I/O and is bounded to
//! `threads` cores. Dropping the [`Scanner`] stops it and waits.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::store::Store;

pub struct Scanner {
    stop: Arc<(Mutex<bool>, Condvar)>,
    leader: Option<JoinHandle<()>>,
}

impl Scanner {
    /// Starts the scanner if the store has background work (`None` if not).
    pub fn start(store: Arc<Store>, threads: usize) -> std::io::Result<Option<Scanner>> {
        let Some(period) = store.scanner_period() else {
            return Ok(None);
        };
        let threads = threads.max(1);
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let leader = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("ramd-scan".into())
                .spawn(move || {
                    lower_priority();
                    let mut next = Instant::now() + period;
                    loop {
                        {
                            let mut stopped = stop.0.lock();
                            while !*stopped && Instant::now() < next {
                                stop.1.wait_until(&mut stopped, next);
                            }
                            if *stopped {
                                return;
                            }
                        }
                        next = Instant::now() + period;
                        run_pass(&store, threads);
                    }
                })?
        };
        Ok(Some(Scanner {
            stop,
            leader: Some(leader),
        }))
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

impl Drop for Scanner {
    fn drop(&mut self) {
        *self.stop.0.lock() = true;
        self.stop.1.notify_all();
        if let Some(t) = self.leader.take() {
            let _ = t.join();
        }
    }
}
