//! The process's memory as the host sees it (resident set, locked memory)
//! and where it goes: page memory in use and kept warm by every store's
//! pool, the C heap (page tables, zspage descriptors, request buffers,
//! filesystem metadata) and its free space, the program's own pages, and
//! the rest (thread stacks, io_uring rings...).
//!
//! Users judge a RAM disk by its RSS, so `ramd status` shows this beside
//! `memory_used`. The parts always add up to `resident_bytes` (VmRSS) and
//! none is negative: each is what is resident of it, as far as cheap
//! counters can tell (see [`ProcessMemory::now`]).

use std::sync::atomic::Ordering::Relaxed;

use crate::pool::{PROCESS_IN_USE, PROCESS_WARM};
use crate::sys::{heap, status_kib};

/// Bytes, for one process. `resident_bytes` is exactly the sum of
/// `pages_bytes`, `warm_bytes`, `heap_bytes`, `heap_free_bytes`,
/// `program_bytes` and `other_bytes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ProcessMemory {
    /// VmRSS: what the host counts against the process.
    pub resident_bytes: u64,
    /// VmLck: memory locked with `--mlock`.
    pub locked_bytes: u64,
    /// Page frames every disk's pool has handed out (data, zspages).
    pub pages_bytes: u64,
    /// Free frames kept resident for reuse (they decay while idle).
    pub warm_bytes: u64,
    /// C heap in use, as far as it is resident: page tables, zspage
    /// descriptors, buffers, inodes.
    pub heap_bytes: u64,
    /// Free space inside the C heap (allocator slack), as far as it is
    /// resident.
    pub heap_free_bytes: u64,
    /// File-backed resident pages: the program and its libraries.
    pub program_bytes: u64,
    /// The rest of the anonymous memory: thread stacks, io_uring rings,
    /// and the like. Never negative (an i64 for the JSON's sake: it once
    /// could be).
    pub other_bytes: i64,
}

impl ProcessMemory {
    /// This process, now.
    ///
    /// The kernel counts resident pages exactly, but only as file-backed
    /// (RssFile, RssShmem: the program) and anonymous (RssAnon: the rest).
    /// The anonymous part is split in order: the pools' frames (resident
    /// by construction: each was written when handed out, and warm ones
    /// are kept), then the C heap in use and its free space. mallinfo2
    /// counts the heap's address space, not its resident pages: large and
    /// zeroed allocations are fresh mappings the kernel fills on first
    /// touch (each FUSE worker's request buffers, mostly never touched),
    /// thread arenas reserve more than they use, and free space that
    /// `malloc_trim` gave back still counts as free. So each heap figure
    /// is at most what is left of RssAnon, and the remainder is `other`.
    /// Finding the heap's resident pages exactly would mean walking page
    /// tables (/proc/self/smaps), too slow for every status request of a
    /// disk of many GiB.
    pub fn now() -> ProcessMemory {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let resident_bytes = status_kib(&status, "VmRSS:");
        let program_bytes = (status_kib(&status, "RssFile:") + status_kib(&status, "RssShmem:"))
            .min(resident_bytes);
        // VmRSS is RssAnon + RssFile + RssShmem, all read at once here.
        let mut left = resident_bytes - program_bytes;
        let mut take = |bytes: u64| {
            let part = bytes.min(left);
            left -= part;
            part
        };
        let (heap_used, heap_free) = heap();
        let pages_bytes = take(PROCESS_IN_USE.load(Relaxed));
        let warm_bytes = take(PROCESS_WARM.load(Relaxed));
        let heap_bytes = take(heap_used);
        let heap_free_bytes = take(heap_free);
        ProcessMemory {
            resident_bytes,
            locked_bytes: status_kib(&status, "VmLck:"),
            pages_bytes,
            warm_bytes,
            heap_bytes,
            heap_free_bytes,
            program_bytes,
            other_bytes: left as i64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_adds_up() {
        // 64 MiB allocated and never touched: the heap's address space,
        // not its resident pages.
        let untouched: Vec<u8> = vec![0; 64 << 20];
        let m = ProcessMemory::now();
        assert!(m.resident_bytes > 0 && m.program_bytes > 0, "{m:?}");
        assert!(m.heap_bytes > 0, "{m:?}");
        assert!(m.other_bytes >= 0, "{m:?}");
        assert!(m.heap_bytes < m.resident_bytes, "{m:?}");
        assert_eq!(
            m.resident_bytes as i64,
            (m.pages_bytes + m.warm_bytes + m.heap_bytes + m.heap_free_bytes + m.program_bytes)
                as i64
                + m.other_bytes
        );
        std::hint::black_box(&untouched);
    }
}
