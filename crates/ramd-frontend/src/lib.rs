//! The seam between a ramd disk and the protocols that serve it. A
//! frontend translates its protocol into the store's calls and declares
//! where clients reach it; it holds no storage, persistence or lifecycle
//! logic (that is the daemon's disk's).
//!
//! Adding a frontend = one [`FrontendFactory`] (in its protocol's crate,
//! beside its settings group) plus one line in the binary's [`Registry`].
//! The disk calls, in order: [`FrontendFactory::claims`] (before anything
//! is allocated, so that two disks cannot share a socket or a mount point),
//! [`FrontendFactory::prepare`] (the content its frontends serve, built
//! over the new store: a filesystem; see [`Content`]),
//! [`FrontendFactory::build`] (binds or mounts: everything that can fail,
//! before any client), then [`Frontend::serve`] on a thread of its own, and
//! [`Frontend::stop`] at the end.
//!
//! Also here: the unix sockets that the protocols and the daemon's control
//! sockets bind ([`bind_unix_socket`]). The protocol crates and the daemon
//! both depend on this crate; it depends on no protocol.

mod content;
pub mod groups;
mod socket;
mod store_settings;

pub use content::{Content, LoadProgress, Prepare, Prepared};
pub use groups::{Group, GroupDef, Groups};
pub use socket::{bind_unix_socket, SocketFile};
pub use store_settings::{mem_total, StoreSettings};

use std::any::{Any, TypeId};
use std::path::Path;
use std::sync::Arc;

use ramd_store::metrics::DiskMetrics;
use ramd_store::persist::DiskKind;
use ramd_store::{DiskId, Store};
use serde::{Deserialize, Serialize};

/// What a frontend reports for `ramd status`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FrontendStatus {
    /// The protocol: `nbd`, `fuse`...
    pub protocol: String,
    /// Where clients reach it: an NBD URI, a mount point...
    pub endpoint: String,
    /// Clients connected now, where the protocol has connections.
    pub connections: Option<u64>,
    /// How requests travel, where the protocol has a choice: FUSE's
    /// `io-uring` or `dev` (/dev/fuse).
    #[serde(default)]
    pub transport: Option<String>,
}

/// One serving instance: a listening socket, a mount.
pub trait Frontend: Send + Sync {
    /// Serves until [`Frontend::stop`] or until it ends by itself (a FUSE
    /// mount unmounted by the user); returns once its clients are gone.
    fn serve(&self) -> anyhow::Result<()>;

    /// Asks `serve` to return; `force` (a second stop signal) may fail the
    /// I/O of clients still there rather than wait for them.
    fn stop(&self, force: bool);

    fn status(&self) -> FrontendStatus;
}

/// Something a disk's frontends take for themselves; two disks of one daemon
/// claiming the same thing is refused before either starts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Claim(pub String);

/// A disk's settings as a frontend reads them: the few that any protocol
/// may use, and each protocol's own settings group, found by its type.
pub trait DiskSettings {
    /// The disk's name: an NBD export's, a status row's.
    fn name(&self) -> &str;
    fn kind(&self) -> DiskKind;
    /// Writes are refused.
    fn read_only(&self) -> bool;
    /// Requests served at once per connection, or worker threads.
    fn threads(&self) -> u16;
    /// Clients connected at once (per listening socket).
    fn max_connections(&self) -> u16;
    /// Whether the disk keeps an image, so that a flush means something.
    fn has_image(&self) -> bool;
    /// Its memory, compression and saving settings.
    fn store(&self) -> StoreSettings;
    /// The settings group of type `t` (a protocol's `clap::Args` group),
    /// if the disk's settings hold one; see `get` on a `dyn DiskSettings`.
    fn group(&self, t: TypeId) -> Option<&dyn Any>;
}

impl dyn DiskSettings + '_ {
    /// The protocol's own settings group: `disk.get::<NbdArgs>()`.
    pub fn get<T: Any>(&self) -> Option<&T> {
        self.group(TypeId::of::<T>())?.downcast_ref()
    }
}

/// A disk's content as a frontend sees it.
pub struct DiskContext<'a> {
    pub settings: &'a dyn DiskSettings,
    pub kind: DiskKind,
    /// The disk's identity: what a protocol's device identifiers (iSCSI
    /// NAA and serial, NBD description) come from.
    pub id: DiskId,
    pub store: &'a Arc<Store>,
    /// What a factory's [`FrontendFactory::prepare`] built over the store
    /// for its frontends to serve ([`Content::as_any`]), by type: a
    /// filesystem disk's `Arc<ramd_fs::Fs>`; `None` for a block disk.
    pub content: Option<&'a (dyn Any + Send + Sync)>,
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
    fn claims(&self, disk: &dyn DiskSettings, run_dir: &Path) -> anyhow::Result<Vec<Claim>>;

    /// The disk's content, if this protocol serves one of its own over the
    /// store (a filesystem) and the disk's settings ask for it; at most one
    /// factory prepares a disk's content. Loads it from `p.image`.
    fn prepare(&self, _p: &Prepare) -> anyhow::Result<Option<Prepared>> {
        Ok(None)
    }

    /// Whether the content this protocol prepares for the disk keeps its
    /// data outside the disk's store (a kernel tmpfs, a cold tier's store
    /// of its own): the store then compresses nothing, and background
    /// compression of it has nothing to say. Asked before the store is
    /// made.
    fn data_outside_store(&self, _disk: &dyn DiskSettings) -> bool {
        false
    }

    /// The disk's frontends of this protocol (none if it does not use it),
    /// bound or mounted and ready to serve.
    fn build(&self, disk: &DiskContext) -> anyhow::Result<Vec<Arc<dyn Frontend>>>;

    /// This protocol's own settings group, added to every disk's flags
    /// when it is registered ([`GroupDef::of`]); `None` for a protocol
    /// whose settings are among the disk's own (the built-in ones).
    fn settings(&self) -> Option<GroupDef> {
        None
    }
}

/// The protocols a daemon knows, in the order their frontends are built.
#[derive(Clone, Default)]
pub struct Registry(Vec<Arc<dyn FrontendFactory>>);

impl Registry {
    pub fn new() -> Registry {
        Registry(Vec::new())
    }

    /// Registers a protocol, and its settings group if it has one (see
    /// [`groups`]): register before parsing any disk's settings.
    pub fn with(mut self, f: impl FrontendFactory + 'static) -> Registry {
        if let Some(g) = f.settings() {
            groups::register(g);
        }
        self.0.push(Arc::new(f));
        self
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<dyn FrontendFactory>> {
        self.0.iter()
    }
}
