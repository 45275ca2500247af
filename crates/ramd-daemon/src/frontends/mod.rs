//! The built-in frontends: NBD for block disks, FUSE for filesystem disks.

pub mod fuse;
pub mod nbd;
