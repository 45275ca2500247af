//! What recording one request costs (BENCHMARKS.md, "Request metrics
//! overhead"): `Instant::now()` plus `IoMetrics::record`, from one thread
//! and from two threads recording into the same counters (the worst case:
//! every add contends for the same cache lines).
//!
//! cargo run --release -p ramd-store --example record_cost

use std::hint::black_box;
use std::time::Instant;

use ramd_store::metrics::{DiskMetrics, Op};

const N: u64 = 20_000_000;

fn main() {
    let disk = DiskMetrics::default();
    let m = disk.frontend("nbd");
    // The floor: the two clock reads any timing needs.
    let t = Instant::now();
    for _ in 0..N {
        black_box(black_box(Instant::now()).elapsed());
    }
    let clock = t.elapsed().as_nanos() as f64 / N as f64;
    println!("Instant::now() + elapsed():            {clock:6.1} ns");
    for threads in [1, 2] {
        let t = Instant::now();
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for i in 0..N {
                        let started = Instant::now();
                        m.record(Op::Read, black_box(4096 + (i & 1)), started, true);
                    }
                });
            }
        });
        let per = t.elapsed().as_nanos() as f64 / N as f64;
        println!("Instant::now() + record(), {threads} thread(s): {per:6.1} ns per request");
    }
    let read = &disk.snapshot()[0].ops[Op::Read as usize];
    assert_eq!(read.count, 3 * N, "every request counted");
}
