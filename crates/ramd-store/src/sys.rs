//! The host beneath the store: the page size, fresh anonymous mappings,
//! and the readers of /proc (meminfo, this process's status) and of the C
//! heap's figures. It is the bottom of the crate: it imports nothing of it,
//! so the pool, NUMA placement and the process's memory figures can all
//! build on it without importing each other.

use std::ptr::NonNull;

/// The page size of the store: the unit of allocation, sharing and holes.
pub const PAGE_SIZE: usize = 4096;

/// A fresh private anonymous read-write mapping of `len` bytes, with
/// `flags` added to MAP_PRIVATE | MAP_ANONYMOUS; pages cost memory only
/// once touched. The caller unmaps it.
pub fn map_anonymous(len: usize, flags: libc::c_int) -> std::io::Result<NonNull<u8>> {
    // SAFETY: a fresh private anonymous mapping aliases nothing.
    let m = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | flags,
            -1,
            0,
        )
    };
    if m == libc::MAP_FAILED {
        return Err(std::io::Error::last_os_error());
    }
    NonNull::new(m.cast()).ok_or_else(|| std::io::Error::other("mmap returned address 0"))
}

/// linux/capability.h's number for CAP_IPC_LOCK.
const CAP_IPC_LOCK: u32 = 14;

/// Whether this process may lock memory beyond RLIMIT_MEMLOCK.
pub(crate) fn has_cap_ipc_lock() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// `MemAvailable` from /proc/meminfo, in bytes.
pub fn mem_available() -> Option<u64> {
    meminfo_field("MemAvailable:")
}

/// `MemTotal` from /proc/meminfo, in bytes.
pub fn mem_total() -> Option<u64> {
    meminfo_field("MemTotal:")
}

fn meminfo_field(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// A `Key:   123 kB` line of /proc/PID/status, in bytes (0 if absent).
pub(crate) fn status_kib(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |k| k * 1024)
}

/// (in use, free) bytes of the C heap.
pub(crate) fn heap() -> (u64, u64) {
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
    fn meminfo_is_readable() {
        assert!(mem_available().unwrap() > 0);
        assert!(mem_total().unwrap() >= mem_available().unwrap());
    }
}
