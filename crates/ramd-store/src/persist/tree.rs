//! A filesystem disk's tree as a save takes it: the hooks a filesystem
//! gives the persister ([`super::Persister::set_meta`]) and the standby
//! (`FollowTree::save`), which the save writes as its META record, whole
//! or as a delta (FORMAT.md).

/// Takes a filesystem's tree at a save's switch, while no request is in
/// flight, for a full save (`true`: the whole tree) or an incremental one
/// (what changed since the last committed save, if the filesystem can
/// tell): only what must be taken then, so that the switch stays short.
pub type MetaFn = Box<dyn Fn(bool) -> TreeFn + Send + Sync>;

/// The rest of a [`MetaFn`]'s work, once requests go on again: the tree
/// as the save writes it.
pub type TreeFn = Box<dyn FnOnce() -> TreeSave + Send>;

/// A filesystem's tree as one save writes it (its META record).
pub struct TreeSave {
    pub bytes: Vec<u8>,
    /// `bytes` change the tree of the chain's saves before this one (META
    /// variant 1) rather than replace it (variant 0).
    pub delta: bool,
    /// The tree differs from the one the image's last committed save
    /// holds: an unchanged tree alone is no reason to save.
    pub changed: bool,
    /// Run once the save is committed, never for one that fails or writes
    /// nothing: the filesystem then knows what the image holds (a delta is
    /// always against the last committed save's tree).
    pub committed: Box<dyn FnOnce() + Send>,
}
