//! How a protocol plugs into a disk: the seam's traits and types (see
//! `ramd_frontend`), re-exported here, and a disk's settings as the seam's
//! [`DiskSettings`]: the common ones, and each protocol's group by type.

use std::any::{Any, TypeId};

use ramd_store::persist::DiskKind;

pub use ramd_frontend::{
    bind_unix_socket, Claim, DiskContext, DiskSettings, Frontend, FrontendFactory, FrontendStatus,
    Registry, SocketFile,
};

use crate::args::{DiskArgs, FuseArgs, IscsiArgs, NbdArgs};

impl DiskSettings for DiskArgs {
    fn name(&self) -> &str {
        &self.name
    }

    fn kind(&self) -> DiskKind {
        DiskArgs::kind(self)
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn threads(&self) -> u16 {
        self.threads
    }

    fn max_connections(&self) -> u16 {
        self.max_connections
    }

    fn has_image(&self) -> bool {
        self.image.is_some()
    }

    /// Each protocol's group; and the whole of a disk's settings, for the
    /// FUSE frontend, which sizes its kernel tmpfs and picks its data path
    /// from the disk's memory and compression settings.
    fn group(&self, t: TypeId) -> Option<&dyn Any> {
        if t == TypeId::of::<NbdArgs>() {
            Some(&self.nbd)
        } else if t == TypeId::of::<IscsiArgs>() {
            Some(&self.iscsi)
        } else if t == TypeId::of::<FuseArgs>() {
            Some(&self.fuse)
        } else if t == TypeId::of::<DiskArgs>() {
            Some(self)
        } else {
            self.more.get(t)
        }
    }
}
