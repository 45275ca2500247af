//! The page memory a pool maps, as its policy holds it: `MemoryPolicy`
//! (`--mlock`, `--huge-pages`, `--numa-nodes`), a 2 MiB arena mapped with
//! that policy (`map_arena`: aligned for huge pages, bound to NUMA nodes,
//! locked on fault), and what `--mlock` promises against RLIMIT_MEMLOCK.

use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use crate::error::{Error, Result};
use crate::sys::{has_cap_ipc_lock, map_anonymous};

/// Size of one anonymous mapping that pages are carved from.
pub(crate) const ARENA_BYTES: usize = 2 << 20;

/// Bytes the pools of this process with `mlock` may lock, together: what
/// RLIMIT_MEMLOCK must allow.
pub(crate) static LOCK_PROMISED: AtomicU64 = AtomicU64::new(0);

/// How a pool's page memory is held: locked, and (see `numa.rs`)
/// placed on NUMA nodes and backed by huge pages.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryPolicy {
    /// Lock page memory (`mlock2(MLOCK_ONFAULT)` on every arena): never swapped.
    pub mlock: bool,
    /// The NUMA nodes and policy every arena is `mbind`-ed to before its
    /// first touch; `None`: the kernel's default (the faulting CPU's node).
    pub numa: Option<crate::numa::Placement>,
    /// Transparent huge pages for the arenas; `None`: no advice, the
    /// system's setting applies.
    pub huge_pages: Option<HugePages>,
}

/// `--huge-pages`: whether 2 MiB arenas are backed by transparent huge
/// pages. A huge page cannot be partly given back: releasing 4 KiB of it
/// (a trim, the decay) makes the kernel split it, so RSS still follows
/// `memory_used` and that arena goes on in 4 KiB pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HugePages {
    /// `MADV_NOHUGEPAGE`: 4 KiB pages even where the system says `always`.
    Never,
    /// `MADV_HUGEPAGE`: a huge page at an arena's first touch, when the
    /// kernel has one.
    Madvise,
    /// As `madvise`, and each arena is faulted in whole when it is mapped
    /// (`MADV_POPULATE_WRITE`): no 4 KiB first-touch faults at all, at the
    /// cost of up to 2 MiB resident ahead of use.
    Always,
}

impl HugePages {
    pub fn parse(s: &str) -> std::result::Result<HugePages, String> {
        match s {
            "never" => Ok(HugePages::Never),
            "madvise" => Ok(HugePages::Madvise),
            "always" => Ok(HugePages::Always),
            _ => Err(format!(
                "unknown huge-pages mode {s:?} (valid: never, madvise, always)"
            )),
        }
    }

    /// Refuses `madvise` and `always` where transparent huge pages are not
    /// available: `enabled` is the text of
    /// /sys/kernel/mm/transparent_hugepage/enabled (`None`: no such file).
    pub fn check(self, enabled: Option<&str>) -> Result<()> {
        if self == HugePages::Never {
            return Ok(());
        }
        let mode = enabled.and_then(|t| {
            let (_, rest) = t.split_once('[')?;
            Some(rest.split_once(']')?.0.to_string())
        });
        match mode.as_deref() {
            Some("always" | "madvise") => Ok(()),
            Some(m) => Err(Error::Invalid(format!(
                "--huge-pages {self}: transparent huge pages are set to {m:?} on this host \
                 (/sys/kernel/mm/transparent_hugepage/enabled); set it to madvise or always, \
                 or use --huge-pages never"
            ))),
            None => Err(Error::Invalid(format!(
                "--huge-pages {self}: this kernel has no transparent huge pages \
                 (/sys/kernel/mm/transparent_hugepage/enabled is missing); use --huge-pages never"
            ))),
        }
    }

    /// [`HugePages::check`] against this host.
    pub fn check_host(self) -> Result<()> {
        let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok();
        self.check(text.as_deref())
    }
}

impl std::fmt::Display for HugePages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HugePages::Never => "never",
            HugePages::Madvise => "madvise",
            HugePages::Always => "always",
        })
    }
}

pub(crate) struct Arena {
    pub(crate) base: NonNull<u8>,
}

// SAFETY: the arena is only an owned mapping address, unmapped once in Drop.
unsafe impl Send for Arena {}

pub(crate) fn map_arena(policy: &MemoryPolicy) -> Result<Arena> {
    // A huge page needs a 2 MiB-aligned arena: map twice the size and trim.
    let huge = matches!(
        policy.huge_pages,
        Some(HugePages::Madvise | HugePages::Always)
    );
    let len = if huge { 2 * ARENA_BYTES } else { ARENA_BYTES };
    let m = map_anonymous(len, libc::MAP_NORESERVE)
        .map_err(|err| Error::Os {
            what: "mmap of page arena",
            err,
        })?
        .as_ptr()
        .cast::<libc::c_void>();
    let p = if huge {
        let start = m as usize;
        let aligned = start.next_multiple_of(ARENA_BYTES);
        let (head, tail) = (aligned - start, len - ARENA_BYTES - (aligned - start));
        // SAFETY: both pieces lie inside the mapping just made, outside the
        // aligned arena we keep; nothing points into them.
        unsafe {
            if head > 0 {
                libc::munmap(m, head);
            }
            if tail > 0 {
                libc::munmap((aligned + ARENA_BYTES) as *mut libc::c_void, tail);
            }
        }
        aligned as *mut libc::c_void
    } else {
        m
    };
    if let Some(h) = policy.huge_pages {
        let advice = match h {
            HugePages::Never => libc::MADV_NOHUGEPAGE,
            HugePages::Madvise | HugePages::Always => libc::MADV_HUGEPAGE,
        };
        // SAFETY: advice on our own fresh mapping. Checked at start that
        // the kernel has THP; a failure here only loses the advice.
        let rc = unsafe { libc::madvise(p, ARENA_BYTES, advice) };
        debug_assert_eq!(rc, 0, "madvise({advice}) of an arena failed");
    }
    // Placed before anything touches it: the policy decides where each
    // page goes at its first fault.
    if let Some(placement) = &policy.numa {
        if let Err(e) = placement.bind(p, ARENA_BYTES) {
            // SAFETY: just mapped, nothing points into it.
            unsafe { libc::munmap(p, ARENA_BYTES) };
            return Err(Error::Os {
                what: "mbind of page arena (--numa-nodes)",
                err: e,
            });
        }
    }
    // Locked as each page is first touched (MLOCK_ONFAULT), not all at
    // once: locking populates nothing ahead of use, so RSS still follows the
    // pages in use; and released pages stay releasable (see `release`).
    // SAFETY: our own fresh mapping.
    if policy.mlock && unsafe { libc::mlock2(p, ARENA_BYTES, libc::MLOCK_ONFAULT) } != 0 {
        let e = Error::os("mlock2 of page arena (--mlock)");
        // SAFETY: just mapped, nothing points into it.
        unsafe { libc::munmap(p, ARENA_BYTES) };
        return Err(e);
    }
    if policy.huge_pages == Some(HugePages::Always) {
        // SAFETY: our own mapping; populating writes nothing we read.
        // Refused by kernels before 5.14: the pages then fault in on use.
        unsafe { libc::madvise(p, ARENA_BYTES, libc::MADV_POPULATE_WRITE) };
    }
    Ok(Arena {
        base: NonNull::new(p as *mut u8).expect("mmap returned null"),
    })
}

/// Adds `bytes` to what this process's pools may lock, or says why
/// RLIMIT_MEMLOCK does not allow it and how to raise it. Root with
/// CAP_IPC_LOCK has no limit.
pub(crate) fn promise_lock(bytes: u64) -> Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct we pass.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Err(Error::os("getrlimit(RLIMIT_MEMLOCK)"));
    }
    let before = LOCK_PROMISED.fetch_add(bytes, Relaxed);
    if lim.rlim_cur != libc::RLIM_INFINITY && !has_cap_ipc_lock() {
        let limit = lim.rlim_cur;
        if before.saturating_add(bytes) > limit {
            LOCK_PROMISED.fetch_sub(bytes, Relaxed);
            return Err(Error::Unusable(lock_limit_message(bytes, before, limit)));
        }
    }
    Ok(bytes)
}

fn lock_limit_message(bytes: u64, others: u64, limit: u64) -> String {
    format!(
        "--mlock: the disk may lock up to {} of page memory{}, but RLIMIT_MEMLOCK \
         (the locked-memory limit) is {}: raise it where ramd starts, with `ulimit -l unlimited` \
         (or `ulimit -l KIB`) in its shell, `prlimit --memlock=unlimited`, or \
         `LimitMEMLOCK=infinity` in its systemd unit (the one `ramd install-systemd` writes \
         has it); or give the disk a smaller --max-memory",
        crate::units::human(bytes),
        match others {
            0 => String::new(),
            n => format!(
                " (beside {} for other disks of this process)",
                crate::units::human(n)
            ),
        },
        crate::units::human(limit)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_limit_message_names_the_limit_and_the_ways_to_raise_it() {
        let m = lock_limit_message(130 << 20, 0, 8 << 20);
        for want in [
            "up to 130M",
            "RLIMIT_MEMLOCK",
            "is 8M",
            "ulimit -l",
            "LimitMEMLOCK=infinity",
        ] {
            assert!(m.contains(want), "{want:?} not in {m}");
        }
        assert!(lock_limit_message(4 << 20, 2 << 20, 1 << 20).contains("beside 2M"));
    }

    #[test]
    fn huge_pages_need_the_kernels_thp() {
        let ok = "always [madvise] never\n";
        for h in [HugePages::Never, HugePages::Madvise, HugePages::Always] {
            assert!(h.check(Some(ok)).is_ok(), "{h}");
            assert!(h.check(Some("[always] madvise never")).is_ok(), "{h}");
        }
        assert!(HugePages::Never.check(None).is_ok());
        let e = HugePages::Madvise
            .check(Some("always madvise [never]"))
            .unwrap_err();
        assert!(e.to_string().contains("set to \"never\""), "{e}");
        let e = HugePages::Always.check(None).unwrap_err();
        assert!(e.to_string().contains("no transparent huge pages"), "{e}");
        assert_eq!(HugePages::parse("madvise"), Ok(HugePages::Madvise));
        assert!(HugePages::parse("sometimes")
            .unwrap_err()
            .contains("valid: never"));
    }
}
