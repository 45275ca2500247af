//! ramd's `fs` disks: a tmpfs-like filesystem whose file data lives in the
//! page store (each file a sparse object), mounted through FUSE.
//!
//! [`fs::Fs`] holds all the semantics and is usable without a mount (unit
//! tests drive it directly); [`fuse::FuseFs`] only translates requests.
//! [`frontend`] is how a disk serves it: the FUSE factory (registered
//! with the daemon's protocols), which builds the `Fs` and mounts it.

pub mod frontend;
pub mod fs;
pub mod fuse;
pub mod hot;
pub mod ll;
pub mod settings;

use std::io;
use std::path::Path;
use std::sync::Arc;

pub use fs::{join_time, split_time, Atime, AtimeMode, Fs, FsConfig, FsStats, Ino};
pub use fuse::{FuseFs, FuseOptions, SyncFn};
pub use ll::dev::Session;
pub use ll::mountinfo::{
    is_mount_point, mount_device, mount_points_of, mount_read_only, mount_type_at,
    remount_read_write,
};

/// The mount's own flags (mount(8)'s `ro`, `nosuid`, ...) and its source.
/// The default is tmpfs's: read-write, devices and setuid honoured.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountFlags {
    /// The first field of /proc/mounts (default `ramd`).
    pub source: String,
    pub read_only: bool,
    pub nosuid: bool,
    pub nodev: bool,
    pub noexec: bool,
}

/// Mounts `fs` on `dir` and answers the kernel's INIT: a [`Session`] that
/// [`Session::run`] serves with `threads` workers until it is unmounted
/// (`umount DIR`). It shows as type `fuse.ramd` with `flags.source` as its
/// source. Needs root (CAP_SYS_ADMIN).
pub fn mount(
    fs: Arc<Fs>,
    dir: &Path,
    threads: usize,
    opts: FuseOptions,
    flags: &MountFlags,
) -> io::Result<Session> {
    let spec = ll::mount::MountSpec {
        source: flags.source.clone(),
        read_only: flags.read_only,
        nosuid: flags.nosuid,
        nodev: flags.nodev,
        noexec: flags.noexec,
        // strictatime and nodiratime have no place in a FUSE mount's
        // data: the mount helper sets them with a remount once the
        // filesystem serves (they are shown in /proc/mounts only; `Fs`
        // applies the rule either way).
        noatime: fs.atime().mode == AtimeMode::Never,
    };
    let fuse_fs = Arc::new(FuseFs::new(fs, opts));
    let fd = ll::mount::mount(dir, &spec)?;
    let session = Session::new(fd, dir, fuse_fs.clone(), fuse_fs.init_want(), threads)?;
    fuse_fs.set_notifier(session.notifier());
    fuse_fs.set_dev(session.dev_fd());
    fuse_fs.initialized(session.init());
    Ok(session)
}

#[cfg(test)]
mod fuse_tests;
#[cfg(test)]
mod tests;
