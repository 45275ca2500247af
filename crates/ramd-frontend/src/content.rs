//! A disk's content: what a protocol builds over the disk's store before
//! its frontends serve it (a filesystem), through the factory's
//! [`prepare`](crate::FrontendFactory::prepare) hook, and the hooks the
//! disk's lifecycle calls on it (saving, status, remount, promotion). A
//! block disk has none: its frontends serve the store itself.

use std::any::Any;
use std::sync::Arc;

use ramd_store::numa::Placement;
use ramd_store::persist::{ImageDir, Persister};
use ramd_store::{Budget, Store};

use crate::DiskSettings;

/// What a factory's `prepare` gets: the disk's store, made and empty, and
/// what it needs to build (and load) its content.
pub struct Prepare<'a> {
    pub settings: &'a dyn DiskSettings,
    pub store: &'a Arc<Store>,
    /// The content's capacity (`None`: unlimited).
    pub size: Option<u64>,
    /// The image to load from, if it holds a save: the content loads it
    /// (the store's pages and its own metadata).
    pub image: Option<&'a ImageDir>,
    /// For a store of the content's own (a cold tier): the daemon's host
    /// reserve and memory budget, and the disk's NUMA placement.
    pub host_reserve: u64,
    pub budget: Option<Arc<Budget>>,
    pub placement: Option<&'a Placement>,
    /// Makes the reporter of the image load's progress.
    pub load_progress: LoadProgress,
}

/// Makes the reporter of one image load's progress (the engine only
/// reports it; the binary shows it).
pub type LoadProgress = fn() -> Box<dyn FnMut(ramd_store::persist::Progress)>;

/// What `prepare` built.
pub struct Prepared {
    pub content: Arc<dyn Content>,
    /// The content's metadata as loaded from the image, so that the first
    /// save knows whether it changed.
    pub loaded_meta: Option<Vec<u8>>,
}

/// A disk's content, as its lifecycle sees it.
pub trait Content: Send + Sync {
    /// The content itself, for its protocol's frontends to downcast
    /// ([`DiskContext::content`](crate::DiskContext::content)).
    fn as_any(&self) -> &(dyn Any + Send + Sync);

    /// Saving: what the persister saves beside the store's pages (its
    /// metadata, pages kept outside the store), and, for a standby, how
    /// it follows the writer's saves.
    fn attach(&self, persister: &mut Persister, standby: bool, loaded_meta: Option<&[u8]>);

    /// Stores of its own that background work (compression) scans.
    fn stores(&self) -> Vec<Arc<Store>>;

    /// Its capacity now (a remount may change it); `None`: unlimited.
    fn size(&self) -> Option<u64>;

    /// Pages used and the page limit, as status reports them.
    fn pages_used(&self) -> (u64, u64);

    /// Bytes held outside the store (a kernel tmpfs): unsaved data the
    /// store's figures miss.
    fn outside_bytes(&self) -> u64;

    /// The codec of what it holds, when that is not the store's (a cold
    /// tier's).
    fn codec(&self) -> Option<String>;

    /// How its data travels (`kernel`, `store`), for status.
    fn data_path(&self) -> String;

    /// Its inodes (or objects) at most, for the disk's description.
    fn max_objects(&self) -> u64;

    /// Its own figures for status, as JSON (the typed status reads them).
    fn stats(&self) -> serde_json::Value;

    /// Whether clients see it read-only now (a mount remounted `ro`),
    /// where that can change after start.
    fn read_only(&self) -> Option<bool>;

    /// A remount's new capacity and memory budget (the store's limits are
    /// set already): its own limits follow.
    fn resize(&self, size: Option<u64>, budget: u64) -> anyhow::Result<()>;

    /// A remount's other settings (`new`: the settings it gives, `None`
    /// when it leaves them): applies what changes in place and says what
    /// they are now, for the log.
    fn remount(&self, new: Option<&dyn DiskSettings>) -> String;

    /// A standby promoted to its image's writer: clients may write now.
    fn promote(&self, disk: &str) -> anyhow::Result<()>;
}
