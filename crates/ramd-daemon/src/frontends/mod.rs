//! The built-in frontends: NBD (its factory in `ramd_nbd::frontend`) for
//! block disks, FUSE (`ramd_fs::frontend`: the mount, and the filesystem
//! it serves, built by its `prepare` hook) for filesystem disks. iSCSI's
//! factory (`ramd_iscsi::frontend::Iscsi`) holds the daemon's one target,
//! so the binary registers it.

use crate::frontend::Registry;

/// The FUSE frontend, at the path the binary's mount helper names.
pub use ramd_fs::frontend as fuse;

/// NBD for block disks and FUSE for filesystem disks.
pub fn builtin() -> Registry {
    Registry::new()
        .with(ramd_nbd::frontend::Nbd)
        .with(ramd_fs::frontend::Fuse)
}
