//! The kernel's per-mount writeback settings of a FUSE mount (its "bdi",
//! /sys/class/bdi/MAJOR:MINOR): the cap on the pages the kernel may hold
//! dirty for it, which write-back caching's ENOSPC guarantee rests on
//! (`ramd_fs::fs::cache`), and its read-ahead.

use std::path::PathBuf;

/// Dirty pages the kernel may hold for one mount: a thirty-second of the
/// disk, between 1 and 32 MiB. Small, so the reserve kept for it costs
/// little space; 32 MiB is 32 of the 1 MiB WRITEs the kernel batches.
fn dirty_allowance(size: Option<u64>) -> u64 {
    const MIB: u64 = 1 << 20;
    size.map_or(32 * MIB, |s| (s / 32).clamp(MIB, 32 * MIB))
}

/// Beyond twice the allowance: what writers may dirty between two checks
/// of the limit (the kernel checks each task every few pages, per CPU).
const SLACK: u64 = 8 << 20;

/// Read-ahead for sequential reads (the kernel's default is 128 KiB):
/// BENCHMARKS.md measured 1 MiB cutting a cold read's READs eightfold.
const READ_AHEAD_KB: u32 = 1024;

fn knob(dev: (u32, u32), name: &str) -> PathBuf {
    PathBuf::from(format!("/sys/class/bdi/{}:{}/{name}", dev.0, dev.1))
}

/// Caps the dirty pages of the mount with device `dev` and returns the
/// write reserve to keep free for them: twice the cap the kernel reports
/// (the cap is kept as a share of the host's dirty limit, which grows
/// when memory is freed) plus [`SLACK`]. `u64::MAX` (never cache writes)
/// when this kernel has no per-mount cap (before 6.2).
pub fn limit_dirty(dev: (u32, u32), size: Option<u64>) -> u64 {
    let want = dirty_allowance(size);
    // strict_limit: the mount is held to its own cap even while the host
    // as a whole is under its dirty limit.
    for (name, value) in [("max_bytes", want), ("strict_limit", 1)] {
        let path = knob(dev, name);
        if let Err(e) = std::fs::write(&path, value.to_string()) {
            log::info!(
                "cannot set {} to {value} ({e}); the kernel's own value stands",
                path.display()
            );
        }
    }
    let path = knob(dev, "max_bytes");
    match std::fs::read_to_string(&path)
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
    {
        Some(cap) => cap.saturating_mul(2).saturating_add(SLACK),
        None => {
            log::warn!(
                "{} cannot be read (kernel older than 6.2?): files are opened \
                 uncached so that write(2) reports a full disk",
                path.display()
            );
            u64::MAX
        }
    }
}

/// Sets the mount's read-ahead; only logs if it cannot (not root).
pub fn set_read_ahead(dev: (u32, u32)) {
    let path = knob(dev, "read_ahead_kb");
    if let Err(e) = std::fs::write(&path, READ_AHEAD_KB.to_string()) {
        log::info!(
            "cannot set {} ({e}); read-ahead stays the kernel's",
            path.display()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allowance_is_a_thirty_second_of_the_disk_within_bounds() {
        assert_eq!(dirty_allowance(Some(64 << 20)), 2 << 20);
        assert_eq!(dirty_allowance(Some(8 << 20)), 1 << 20);
        assert_eq!(dirty_allowance(Some(64 << 30)), 32 << 20);
        assert_eq!(dirty_allowance(None), 32 << 20);
    }
}
