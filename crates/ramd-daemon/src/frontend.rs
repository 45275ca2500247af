//! How a protocol plugs into a disk. A frontend translates its protocol into
//! the store's calls and declares where clients reach it; it holds no
//! storage, persistence or lifecycle logic (that is [`crate::disk::Disk`]'s).
//!
//! Adding a frontend = one [`FrontendFactory`] (in its own crate if it likes)
//! plus one line in the binary's registry. The disk calls, in order:
//! [`FrontendFactory::claims`] (before anything is allocated, so that two
//! disks cannot share a socket or a mount point), [`FrontendFactory::build`]
//! (binds or mounts: everything that can fail, before any client), then
//! [`Frontend::serve`] on a thread of its own, and [`Frontend::stop`] at the
//! end.

use std::path::Path;
use std::sync::Arc;

use ramd_fs::Fs;
use ramd_store::metrics::DiskMetrics;
use ramd_store::persist::DiskKind;
use ramd_store::{DiskId, Store};

use crate::args::DiskArgs;
pub use ramd_frontend::{bind_unix_socket, Claim, Frontend, FrontendStatus, SocketFile};

/// A disk's content as a frontend sees it.
pub struct DiskContext<'a> {
    pub args: &'a DiskArgs,
    pub kind: DiskKind,
    /// The disk's identity: what a protocol's device identifiers (iSCSI
    /// NAA and serial, NBD description) come from.
    pub id: DiskId,
    pub store: &'a Arc<Store>,
    /// The filesystem of an `fs` disk.
    pub fs: Option<&'a Arc<Fs>>,
    pub run_dir: &'a Path,
    /// Where frontends count and time their requests: each takes
    /// `metrics.frontend("PROTOCOL")` once and calls `record` per request
    /// (see `ramd_store::metrics`); `ramd status --json` and `/metrics`
    /// report them.
    pub metrics: &'a DiskMetrics,
}

/// Makes a protocol's frontends for the disks that use it.
pub trait FrontendFactory: Send + Sync {
    /// What the disk's settings claim (socket paths, ports, mount points),
    /// checked without side effects; an error here (a mount point that does
    /// not exist) stops the disk before anything is allocated.
    fn claims(&self, args: &DiskArgs, run_dir: &Path) -> anyhow::Result<Vec<Claim>>;

    /// The disk's frontends of this protocol (none if it does not use it),
    /// bound or mounted and ready to serve.
    fn build(&self, disk: &DiskContext) -> anyhow::Result<Vec<Arc<dyn Frontend>>>;
}

/// The protocols a daemon knows, in the order their frontends are built.
#[derive(Clone, Default)]
pub struct Registry(Vec<Arc<dyn FrontendFactory>>);

impl Registry {
    pub fn new() -> Registry {
        Registry(Vec::new())
    }

    /// Registers a protocol.
    pub fn with(mut self, f: impl FrontendFactory + 'static) -> Registry {
        self.0.push(Arc::new(f));
        self
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn FrontendFactory>> {
        self.0.iter()
    }
}
