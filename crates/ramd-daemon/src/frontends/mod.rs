//! The built-in frontends: NBD (and iSCSI, with --iscsi) for block disks,
//! FUSE for filesystem disks.

pub(crate) mod bdi;
pub mod fuse;

use crate::frontend::Registry;

/// NBD for block disks and FUSE for filesystem disks.
pub fn builtin() -> Registry {
    Registry::new()
        .with(ramd_nbd::frontend::Nbd)
        .with(fuse::Fuse)
}
