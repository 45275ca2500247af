//! ramd's `fs` disks: a tmpfs-like filesystem whose file data lives in the
//! page store (each file a sparse object), mounted through FUSE.
//!
//! [`fs::Fs`] holds all the semantics and is usable without a mount (unit
//! tests drive it directly); [`fuse::FuseFs`] only translates requests.

pub mod fs;
pub mod fuse;
pub mod ll;

use std::io;
use std::path::Path;
use std::sync::Arc;

pub use fs::{Atime, AtimeMode, Fh, Fs, FsConfig, FsStats, Ino};
pub use fuse::{is_mount_point, mount_device, mount_read_only, FuseFs, FuseOptions, SyncFn};

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

/// A mounted filesystem, not yet serving: [`fuser::Session::run`] serves
/// until it is unmounted (`umount DIR`, or [`fuser::SessionUnmounter`]).
/// It shows as type `fuse.ramd` with `flags.source` as its source.
pub fn mount(
    fs: Arc<Fs>,
    dir: &Path,
    threads: usize,
    opts: FuseOptions,
    flags: &MountFlags,
) -> io::Result<fuser::Session<FuseFs>> {
    use fuser::MountOption as M;
    let source = match flags.source.as_str() {
        "" => "ramd",
        s => s,
    };
    let on = |yes: bool, a: M, b: M| if yes { a } else { b };
    let mut options = vec![
        M::FSName(source.into()),
        // fuser's Subtype only reaches fusermount; as a kernel option it
        // makes the type `fuse.ramd`, which mount(8) needs to find
        // mount.fuse.ramd for a remount (and umount.fuse.ramd).
        M::CUSTOM("subtype=ramd".into()),
        // The kernel checks permissions (owner, mode, sticky directories)
        // exactly as for tmpfs; the filesystem only stores what it is told.
        M::DefaultPermissions,
        on(flags.nodev, M::NoDev, M::Dev),
        on(flags.nosuid, M::NoSuid, M::Suid),
        on(flags.read_only, M::RO, M::RW),
        on(flags.noexec, M::NoExec, M::Exec),
    ];
    // strictatime and nodiratime have no fuser option: the mount helper
    // sets them with a remount once the filesystem serves (they are
    // shown in /proc/mounts only; `Fs` applies the rule either way).
    if fs.atime().mode == AtimeMode::Never {
        options.push(M::NoAtime);
    }
    let mut config = fuser::Config::default();
    config.mount_options = options;
    // Like tmpfs, everyone may use it; permissions decide the rest.
    config.acl = fuser::SessionACL::All;
    config.n_threads = Some(threads.max(1));
    config.clone_fd = true;
    let fuse_fs = FuseFs::new(fs, opts);
    let notifier = fuse_fs.notifier_cell();
    let session = fuser::Session::new(fuse_fs, dir, &config)?;
    let _ = notifier.set(session.notifier());
    Ok(session)
}

#[cfg(test)]
mod tests;
