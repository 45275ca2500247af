//! The built-in frontends: NBD (its factory in `ramd_nbd::frontend`) for
//! block disks, FUSE (here, with the mount's bdi settings) for filesystem
//! disks. iSCSI's factory (`ramd_iscsi::frontend::Iscsi`) holds the
//! daemon's one target, so the binary registers it.

pub(crate) mod bdi;
pub mod fuse;

use crate::frontend::Registry;

/// NBD for block disks and FUSE for filesystem disks.
pub fn builtin() -> Registry {
    Registry::new()
        .with(ramd_nbd::frontend::Nbd)
        .with(fuse::Fuse)
}
