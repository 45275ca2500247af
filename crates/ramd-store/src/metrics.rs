//! What frontends record about the requests they serve: per operation, a
//! count of bytes and errors and a latency histogram. It lives here because
//! every frontend crate depends on `ramd-store`; the daemon hands each
//! frontend its [`IoMetrics`] (`DiskContext::metrics`) and reports them in
//! `ramd status --json` and on `/metrics`.
//!
//! Recording a request is one `Instant::now()` before it and one
//! [`IoMetrics::record`] after: four relaxed atomic adds, no lock, no
//! allocation. A frontend's whole use of it:
//!
//! ```
//! use ramd_store::metrics::{DiskMetrics, Op};
//! let disk = DiskMetrics::default();
//! let io = disk.frontend("iscsi"); // once, when the frontend is built
//! let started = std::time::Instant::now();
//! // ... serve a 4 KiB read ...
//! io.record(Op::Read, 4096, started, true);
//! assert_eq!(disk.snapshot()[0].ops[0].count, 1);
//! ```

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

/// What a request did, as far as monitoring cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    /// Discard: NBD TRIM, FUSE `fallocate(PUNCH_HOLE)`, SCSI UNMAP.
    Trim,
    /// Writing zeros: NBD WRITE_ZEROES, `fallocate(ZERO_RANGE)`, WRITE SAME.
    Zero,
    /// NBD FLUSH (and FUA), `fsync`, SYNCHRONIZE CACHE.
    Flush,
    /// Everything else a frontend chooses to time (NBD BLOCK_STATUS and
    /// CACHE, `lseek(SEEK_DATA)`, `fallocate` that only reserves).
    Other,
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::Read,
        Op::Write,
        Op::Trim,
        Op::Zero,
        Op::Flush,
        Op::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Trim => "trim",
            Op::Zero => "zero",
            Op::Flush => "flush",
            Op::Other => "other",
        }
    }
}

/// Latency buckets: bucket `i` counts requests that took at most
/// `2^(i + FIRST_SHIFT)` ns (1.02 µs, 2.05 µs, ... 4.29 s), the last one
/// everything slower. Powers of two so that finding the bucket is a
/// leading-zero count, not a search.
pub const BUCKETS: usize = 24;
const FIRST_SHIFT: u32 = 10;

/// Upper bound of bucket `i` in nanoseconds (`None`: the last, unbounded).
pub fn bucket_bound_ns(i: usize) -> Option<u64> {
    (i + 1 < BUCKETS).then(|| 1u64 << (i as u32 + FIRST_SHIFT))
}

fn bucket(ns: u64) -> usize {
    // Values in (2^(k-1), 2^k] land in bucket k - FIRST_SHIFT.
    let k = u64::BITS - ns.saturating_sub(1).leading_zeros();
    (k.saturating_sub(FIRST_SHIFT) as usize).min(BUCKETS - 1)
}

/// One operation's counters: a fixed log-scale histogram of atomics.
#[derive(Default)]
struct OpCounters {
    buckets: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
    bytes: AtomicU64,
    errors: AtomicU64,
}

/// The requests one frontend (one protocol) of a disk served.
pub struct IoMetrics {
    protocol: &'static str,
    ops: [OpCounters; Op::ALL.len()],
}

impl IoMetrics {
    fn new(protocol: &'static str) -> IoMetrics {
        IoMetrics {
            protocol,
            ops: Default::default(),
        }
    }

    /// Counts one request of `bytes` (its length; 0 for a flush) that
    /// began at `started`; `ok` is false if the client got an error.
    #[inline]
    pub fn record(&self, op: Op, bytes: u64, started: Instant, ok: bool) {
        let ns = started.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        let c = &self.ops[op as usize];
        c.buckets[bucket(ns)].fetch_add(1, Relaxed);
        c.sum_ns.fetch_add(ns, Relaxed);
        if ok {
            c.bytes.fetch_add(bytes, Relaxed);
        } else {
            c.errors.fetch_add(1, Relaxed);
        }
    }

    pub fn protocol(&self) -> &'static str {
        self.protocol
    }

    /// The counters now. Each is read on its own, so a request being
    /// recorded meanwhile may be in some and not yet in others.
    pub fn snapshot(&self) -> FrontendIo {
        FrontendIo {
            frontend: self.protocol.to_string(),
            ops: Op::ALL
                .iter()
                .map(|&op| {
                    let c = &self.ops[op as usize];
                    let buckets: Vec<u64> = c.buckets.iter().map(|b| b.load(Relaxed)).collect();
                    OpStats {
                        op: op.name().to_string(),
                        count: buckets.iter().sum(),
                        bytes: c.bytes.load(Relaxed),
                        errors: c.errors.load(Relaxed),
                        latency_sum_ns: c.sum_ns.load(Relaxed),
                        latency_buckets: buckets,
                    }
                })
                .collect(),
        }
    }
}

/// The frontends' metrics of one disk: one [`IoMetrics`] per protocol,
/// shared by every instance of it (an NBD disk on a unix socket and TCP
/// counts both in `nbd`).
#[derive(Default)]
pub struct DiskMetrics {
    frontends: Mutex<Vec<Arc<IoMetrics>>>,
}

impl DiskMetrics {
    /// The metrics `protocol` records into (made on first use).
    pub fn frontend(&self, protocol: &'static str) -> Arc<IoMetrics> {
        let mut all = self.frontends.lock();
        if let Some(m) = all.iter().find(|m| m.protocol == protocol) {
            return m.clone();
        }
        let m = Arc::new(IoMetrics::new(protocol));
        all.push(m.clone());
        m
    }

    pub fn snapshot(&self) -> Vec<FrontendIo> {
        self.frontends.lock().iter().map(|m| m.snapshot()).collect()
    }
}

/// One frontend's requests, as `ramd status --json` shows them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FrontendIo {
    /// The protocol: `nbd`, `fuse`...
    pub frontend: String,
    /// One entry per [`Op`], in [`Op::ALL`] order.
    pub ops: Vec<OpStats>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct OpStats {
    pub op: String,
    /// Requests served (with or without an error).
    pub count: u64,
    /// Bytes of the requests that succeeded.
    pub bytes: u64,
    /// Requests answered with an error.
    pub errors: u64,
    /// Time spent serving them.
    pub latency_sum_ns: u64,
    /// Requests per latency bucket (not cumulative); bounds from
    /// [`bucket_bound_ns`].
    pub latency_buckets: Vec<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1024), 0);
        assert_eq!(bucket(1025), 1);
        assert_eq!(bucket(2048), 1);
        assert_eq!(bucket(2049), 2);
        assert_eq!(bucket(1 << 32), BUCKETS - 2);
        assert_eq!(bucket((1 << 32) + 1), BUCKETS - 1);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        assert_eq!(bucket_bound_ns(0), Some(1024));
        assert_eq!(bucket_bound_ns(BUCKETS - 2), Some(1 << 32));
        assert_eq!(bucket_bound_ns(BUCKETS - 1), None);
        // Every value is at most its bucket's bound, and above the one before.
        for ns in [1u64, 1000, 5000, 1 << 20, (1 << 20) + 1, 3 << 30] {
            let b = bucket(ns);
            if let Some(hi) = bucket_bound_ns(b) {
                assert!(ns <= hi, "{ns}");
            }
            assert!(b == 0 || ns > bucket_bound_ns(b - 1).unwrap(), "{ns}");
        }
    }

    #[test]
    fn records_per_op_and_protocol() {
        let disk = DiskMetrics::default();
        let nbd = disk.frontend("nbd");
        assert!(Arc::ptr_eq(&nbd, &disk.frontend("nbd")));
        let t = Instant::now();
        nbd.record(Op::Write, 4096, t, true);
        nbd.record(Op::Write, 4096, t, false);
        disk.frontend("fuse").record(Op::Read, 100, t, true);
        let s = disk.snapshot();
        assert_eq!(s.len(), 2);
        let w = &s[0].ops[Op::Write as usize];
        assert_eq!(
            (w.op.as_str(), w.count, w.bytes, w.errors),
            ("write", 2, 4096, 1)
        );
        assert_eq!(w.latency_buckets.iter().sum::<u64>(), 2);
        assert_eq!(s[1].frontend, "fuse");
        assert_eq!(s[1].ops[0].bytes, 100);
        assert_eq!(s[0].ops[0].count, 0);
    }
}
