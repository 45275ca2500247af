//! Whether this system lets a FUSE mount use io_uring, and why not.

use std::fmt;
use std::fs;
use std::path::Path;

use io_uring::{cqueue, squeue, IoUring};

/// The fuse module's switch: the kernel offers `FUSE_OVER_IO_URING` at
/// INIT only while it reads Y. It is global (every FUSE mount made after
/// the change may use io_uring) and resets at reboot.
pub const ENABLE_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
const IO_URING_DISABLED: &str = "/proc/sys/kernel/io_uring_disabled";
const IO_URING_GROUP: &str = "/proc/sys/kernel/io_uring_group";

/// Why FUSE over io_uring cannot be had, as a user can act on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unavailable {
    /// The fuse module has no `enable_uring` parameter.
    NoKernelSupport { release: String },
    /// The parameter is N and only root may set it.
    NotRoot,
    /// `kernel.io_uring_disabled` forbids io_uring to this process.
    Sysctl { value: String },
    /// io_uring_setup(2) failed anyway (seccomp, memory limits...).
    Setup(String),
    /// Root, yet writing Y to the parameter failed.
    Enable(String),
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NoKernelSupport { release } => write!(
                f,
                "this kernel ({release}) cannot carry FUSE over io_uring: {ENABLE_PARAM} does not exist \
                 (it needs Linux 6.14 or later built with CONFIG_FUSE_IO_URING=y)"
            ),
            Unavailable::NotRoot => write!(
                f,
                "FUSE over io_uring is off ({ENABLE_PARAM} is N) and only root may turn it on: \
                 run ramd as root, or as root `echo Y > {ENABLE_PARAM}`"
            ),
            Unavailable::Sysctl { value } => write!(
                f,
                "io_uring is not allowed to this process ({IO_URING_DISABLED} is {value}; \
                 `sysctl kernel.io_uring_disabled=0` allows it to everyone)"
            ),
            Unavailable::Setup(e) => write!(f, "io_uring cannot be set up here: io_uring_setup: {e}"),
            Unavailable::Enable(e) => {
                write!(f, "could not turn FUSE over io_uring on: writing Y to {ENABLE_PARAM}: {e}")
            }
        }
    }
}

impl std::error::Error for Unavailable {}

/// What [`enable`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Enabled {
    /// The parameter was Y already.
    Already,
    /// It was N; ramd wrote Y (and logged it).
    Now,
}

/// Whether a mount made now could use io_uring, [`enable`] permitting:
/// `Ok` when the parameter is Y, or N and we are root.
pub fn availability() -> Result<(), Unavailable> {
    check(Path::new(ENABLE_PARAM)).map(|_| ())
}

/// Makes io_uring available to FUSE mounts made from now on: writes Y to
/// the module parameter if it is N (as root; logged). Must happen before
/// the mount's INIT, which is when the kernel offers it.
pub fn enable() -> Result<Enabled, Unavailable> {
    let param = Path::new(ENABLE_PARAM);
    if check(param)? {
        return Ok(Enabled::Already);
    }
    fs::write(param, "Y\n").map_err(|e| Unavailable::Enable(e.to_string()))?;
    if read_param(param) != Some(true) {
        return Err(Unavailable::Enable("it still reads N".into()));
    }
    log::info!("turned FUSE over io_uring on for this system: wrote Y to {ENABLE_PARAM}");
    Ok(Enabled::Now)
}

/// The parameter's value if io_uring can be had (Y, or N and root).
fn check(param: &Path) -> Result<bool, Unavailable> {
    if !param.exists() {
        // The fuse module may just not be loaded yet: opening the device
        // loads it.
        let _ = fs::File::open("/dev/fuse");
        if !param.exists() {
            return Err(Unavailable::NoKernelSupport {
                release: kernel_release(),
            });
        }
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if let Ok(v) = fs::read_to_string(IO_URING_DISABLED) {
        let v = v.trim().to_string();
        // 1: only CAP_SYS_ADMIN and members of kernel.io_uring_group.
        let allowed = match v.as_str() {
            "0" => true,
            "1" => root || in_io_uring_group(),
            _ => false,
        };
        if !allowed {
            return Err(Unavailable::Sysctl { value: v });
        }
    }
    if let Err(e) = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2) {
        return Err(Unavailable::Setup(e.to_string()));
    }
    match read_param(param) {
        Some(true) => Ok(true),
        Some(false) if root => Ok(false),
        Some(false) => Err(Unavailable::NotRoot),
        None => Err(Unavailable::Setup(format!(
            "{ENABLE_PARAM} is neither Y nor N"
        ))),
    }
}

fn read_param(param: &Path) -> Option<bool> {
    match fs::read_to_string(param).ok()?.trim() {
        "Y" | "y" | "1" => Some(true),
        "N" | "n" | "0" => Some(false),
        _ => None,
    }
}

fn in_io_uring_group() -> bool {
    let Some(gid) = fs::read_to_string(IO_URING_GROUP)
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
    else {
        return false;
    };
    // SAFETY: getegid has no preconditions; getgroups writes at most
    // `groups.len()` entries.
    unsafe {
        if i64::from(libc::getegid()) == gid {
            return true;
        }
        let mut groups = vec![0 as libc::gid_t; 256];
        let n = libc::getgroups(groups.len() as i32, groups.as_mut_ptr());
        n > 0 && groups[..n as usize].iter().any(|&g| i64::from(g) == gid)
    }
}

fn kernel_release() -> String {
    fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| format!("Linux {}", s.trim()))
        .unwrap_or_else(|e| format!("release unknown: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_fix() {
        let m = Unavailable::NoKernelSupport {
            release: "Linux 6.1.0".into(),
        }
        .to_string();
        assert!(
            m.contains("Linux 6.1.0") && m.contains("6.14") && m.contains("CONFIG_FUSE_IO_URING"),
            "{m}"
        );
        let m = Unavailable::NotRoot.to_string();
        assert!(m.contains(ENABLE_PARAM) && m.contains("root"), "{m}");
        let m = Unavailable::Sysctl { value: "2".into() }.to_string();
        assert!(m.contains("io_uring_disabled is 2"), "{m}");
    }

    #[test]
    fn an_absent_parameter_is_no_kernel_support() {
        let r = check(Path::new("/sys/module/fuse/parameters/no_such_parameter"));
        assert!(
            matches!(r, Err(Unavailable::NoKernelSupport { .. })),
            "{r:?}"
        );
    }
}
