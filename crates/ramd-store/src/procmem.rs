//! The process's memory as the host sees it (resident set, locked memory)
//! and where it goes: page memory in use and kept warm by every store's
//! pool, the C heap (page tables, zspage descriptors, request buffers,
//! filesystem metadata) and its free space, the program's own pages.
//!
//! Users judge a RAM disk by its RSS, so `ramd status` shows this beside
//! `memory_used`: the parts add up to `resident_bytes` but for `other_bytes`
//! (thread stacks, and free heap memory that was trimmed, which makes it
//! negative).

use std::sync::atomic::Ordering::Relaxed;

use crate::pool::{PROCESS_IN_USE, PROCESS_WARM};

/// Bytes, for one process.
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
    /// C heap in use: page tables, zspage descriptors, buffers, inodes.
    pub heap_bytes: u64,
    /// Free space inside the C heap (allocator slack), at most resident.
    pub heap_free_bytes: u64,
    /// File-backed resident pages: the program and its libraries.
    pub program_bytes: u64,
    /// `resident_bytes` less every figure above: stacks and the like, or
    /// below zero by the heap's free space that is not resident.
    pub other_bytes: i64,
}

impl ProcessMemory {
    /// This process, now.
    pub fn now() -> ProcessMemory {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let (heap_bytes, heap_free_bytes) = heap();
        let mut m = ProcessMemory {
            resident_bytes: status_kib(&status, "VmRSS:"),
            locked_bytes: status_kib(&status, "VmLck:"),
            pages_bytes: PROCESS_IN_USE.load(Relaxed),
            warm_bytes: PROCESS_WARM.load(Relaxed),
            heap_bytes,
            heap_free_bytes,
            program_bytes: status_kib(&status, "RssFile:") + status_kib(&status, "RssShmem:"),
            other_bytes: 0,
        };
        m.other_bytes = m.resident_bytes as i64
            - (m.pages_bytes + m.warm_bytes + m.heap_bytes + m.heap_free_bytes + m.program_bytes)
                as i64;
        m
    }
}

/// A `Key:   123 kB` line of /proc/PID/status, in bytes (0 if absent).
pub(crate) fn status_kib(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |k| k * 1024)
}

/// (in use, free) bytes of the C heap.
fn heap() -> (u64, u64) {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallinfo2 only reads the allocator's statistics.
        let mi = unsafe { libc::mallinfo2() };
        ((mi.uordblks + mi.hblkhd) as u64, mi.fordblks as u64)
    }
    #[cfg(not(target_env = "gnu"))]
    {
        (0, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_parse() {
        let t = "Name:\tramd\nVmRSS:\t  2048 kB\nVmLck:\t       0 kB\n";
        assert_eq!(status_kib(t, "VmRSS:"), 2 << 20);
        assert_eq!(status_kib(t, "VmLck:"), 0);
        assert_eq!(status_kib(t, "RssFile:"), 0);
    }

    #[test]
    fn this_process_adds_up() {
        let m = ProcessMemory::now();
        assert!(m.resident_bytes > 0 && m.program_bytes > 0, "{m:?}");
        assert!(m.heap_bytes > 0, "{m:?}");
        assert_eq!(
            m.resident_bytes as i64,
            (m.pages_bytes + m.warm_bytes + m.heap_bytes + m.heap_free_bytes + m.program_bytes)
                as i64
                + m.other_bytes
        );
    }
}
