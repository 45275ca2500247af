//! ramd's `fs` disks: a tmpfs-like filesystem whose file data lives in the
//! page store (each file a sparse object), mounted through FUSE.
//!
//! [`fs::Fs`] holds all the semantics and is usable without a mount (unit
//! tests drive it directly); [`fuse::FuseFs`] only translates requests.

pub mod fs;
pub mod fuse;

use std::io;
use std::path::Path;
use std::sync::Arc;

pub use fs::{Fh, Fs, FsConfig, FsStats, Ino};
pub use fuse::{is_mount_point, mount_device, FuseFs, FuseOptions, SyncFn};

/// A mounted filesystem, not yet serving: [`fuser::Session::run`] serves
/// until it is unmounted (`umount DIR`, or [`fuser::SessionUnmounter`]).
pub fn mount(
    fs: Arc<Fs>,
    dir: &Path,
    threads: usize,
    opts: FuseOptions,
) -> io::Result<fuser::Session<FuseFs>> {
    use fuser::MountOption as M;
    let mut options = vec![
        M::FSName("ramd".into()),
        M::Subtype("ramd".into()),
        // The kernel checks permissions (owner, mode, sticky directories)
        // exactly as for tmpfs; the filesystem only stores what it is told.
        M::DefaultPermissions,
        M::Dev,
        M::Suid,
        M::RW,
    ];
    if fs.config().noatime {
        options.push(M::NoAtime);
    }
    let mut config = fuser::Config::default();
    config.mount_options = options;
    // Like tmpfs, everyone may use it; permissions decide the rest.
    config.acl = fuser::SessionACL::All;
    config.n_threads = Some(threads.max(1));
    config.clone_fd = true;
    fuser::Session::new(FuseFs::new(fs, opts), dir, &config)
}

#[cfg(test)]
mod tests;
