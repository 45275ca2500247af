//! Mounting: open /dev/fuse and mount(2) a filesystem of type `fuse` with
//! subtype `ramd` served through that fd. Needs root (CAP_SYS_ADMIN): ramd
//! runs as root wherever it mounts, so there is no fusermount path.

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// The mount's flags, as mount(8) spells them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountSpec {
    /// The first field of /proc/mounts.
    pub source: String,
    pub read_only: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
    pub noatime: bool,
}

/// mount(8)'s names of the VFS flags ramd sets, and their `MS_*` bits for
/// mount(2): the one table every mount and remount of a ramd disk reads.
pub const MS_FLAGS: [(&str, libc::c_ulong); 11] = [
    ("ro", libc::MS_RDONLY),
    ("nosuid", libc::MS_NOSUID),
    ("nodev", libc::MS_NODEV),
    ("noexec", libc::MS_NOEXEC),
    ("noatime", libc::MS_NOATIME),
    ("strictatime", libc::MS_STRICTATIME),
    ("relatime", libc::MS_RELATIME),
    ("nodiratime", libc::MS_NODIRATIME),
    ("sync", libc::MS_SYNCHRONOUS),
    ("dirsync", libc::MS_DIRSYNC),
    ("lazytime", libc::MS_LAZYTIME),
];

/// The `MS_*` bit of the mount(8) option `name`, if [`MS_FLAGS`] has it.
pub fn ms_flag(name: &str) -> Option<libc::c_ulong> {
    MS_FLAGS.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
}

/// The `MS_*` bits of the options in `set` whose flag is true.
///
/// # Panics
/// If a name is not in [`MS_FLAGS`]: the callers' names are literals.
pub fn ms_flags<'a>(set: impl IntoIterator<Item = (bool, &'a str)>) -> libc::c_ulong {
    set.into_iter()
        .filter(|(on, _)| *on)
        .map(|(_, name)| ms_flag(name).unwrap_or_else(|| panic!("no MS_* flag for {name:?}")))
        .fold(0, |f, bit| f | bit)
}

impl MountSpec {
    fn ms_flags(&self) -> libc::c_ulong {
        ms_flags([
            (self.read_only, "ro"),
            (self.nosuid, "nosuid"),
            (self.nodev, "nodev"),
            (self.noexec, "noexec"),
            (self.noatime, "noatime"),
        ])
    }

    /// The fuse mount data for `fd`: `rootmode` needs only the type bits
    /// (the root's real mode comes from GETATTR); `default_permissions`:
    /// the kernel checks permissions exactly as for tmpfs; `allow_other`:
    /// like tmpfs, everyone may use it; `subtype=ramd` makes the type
    /// `fuse.ramd`, which mount(8) needs to find mount.fuse.ramd for a
    /// remount (and umount.fuse.ramd).
    fn data(&self, fd: i32, uid: u32, gid: u32) -> String {
        format!(
            "fd={fd},rootmode=40000,user_id={uid},group_id={gid},\
             default_permissions,allow_other,subtype=ramd"
        )
    }
}

/// Opens /dev/fuse and mounts it on `dir`; the fd serves the mount.
pub fn mount(dir: &Path, spec: &MountSpec) -> io::Result<OwnedFd> {
    let dev = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .map_err(|e| {
            let hint = if e.kind() == io::ErrorKind::NotFound {
                " (is the fuse module loaded? modprobe fuse)"
            } else {
                ""
            };
            io::Error::new(e.kind(), format!("opening /dev/fuse: {e}{hint}"))
        })?;
    let fd = OwnedFd::from(dev);
    let source = match spec.source.as_str() {
        "" => "ramd",
        s => s,
    };
    let cstring = |s: &[u8], what: &str| {
        CString::new(s).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{what} contains a NUL byte"),
            )
        })
    };
    let c_source = cstring(source.as_bytes(), "mount source")?;
    let c_dir = cstring(dir.as_os_str().as_bytes(), "mount point")?;
    let c_type = cstring(b"fuse", "type")?;
    // SAFETY: getuid and getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let c_data = cstring(spec.data(fd.as_raw_fd(), uid, gid).as_bytes(), "options")?;
    // SAFETY: every pointer is a NUL-terminated string that outlives the call.
    let r = unsafe {
        libc::mount(
            c_source.as_ptr(),
            c_dir.as_ptr(),
            c_type.as_ptr(),
            spec.ms_flags(),
            c_data.as_ptr().cast(),
        )
    };
    if r != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EPERM) {
            return Err(io::Error::new(
                e.kind(),
                format!(
                    "mount(2) of {} refused: {e} (mounting a FUSE filesystem needs root, \
                     or CAP_SYS_ADMIN)",
                    dir.display()
                ),
            ));
        }
        return Err(io::Error::new(
            e.kind(),
            format!("mount(2) of {}: {e}", dir.display()),
        ));
    }
    Ok(fd)
}

/// Detaches the mount at `dir` (MNT_DETACH: open files keep it alive);
/// quiet if it is already gone.
pub fn unmount(dir: &Path) {
    if let Err(e) = umount2(dir, libc::MNT_DETACH) {
        if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOENT)) {
            log::warn!("unmounting {}: {e}", dir.display());
        }
    }
}

/// umount2(2) of `dir` with `flags` (0, `MNT_DETACH`...).
pub fn umount2(dir: &Path, flags: i32) -> io::Result<()> {
    let c = CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: umount2 takes a NUL-terminated path we own.
    if unsafe { libc::umount2(c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_data() {
        let spec = MountSpec {
            source: "x".into(),
            read_only: true,
            nodev: true,
            noatime: true,
            ..Default::default()
        };
        assert_eq!(
            spec.ms_flags(),
            libc::MS_RDONLY | libc::MS_NODEV | libc::MS_NOATIME
        );
        assert_eq!(ms_flag("sync"), Some(libc::MS_SYNCHRONOUS));
        assert_eq!(ms_flag("rw"), None);
        assert_eq!(
            spec.data(5, 0, 0),
            "fd=5,rootmode=40000,user_id=0,group_id=0,default_permissions,allow_other,subtype=ramd"
        );
    }
}
