//! A standby's tree (`ramd serve --image s3://… --mount DIR --standby`):
//! each save its writer commits replaces the whole tree (a full save's, or
//! the tree installed last with an incremental save's change applied:
//! see `TreeRecords`), in the hold in
//! which the save's file data is applied to the store (see
//! `ramd_store::persist::FollowTree`), and the kernel is then told what
//! it may have cached that changed.
//!
//! Inode numbers are the image's (saved by number, never reused by the
//! writer), so an inode the kernel knows keeps meaning the same file from
//! one save to the next: what the kernel holds of it (lookups, opens, the
//! page-cache mode of its opens) carries over. An inode the new tree lacks
//! (its writer removed it) is dropped at once, even if open here: its data
//! slot may already hold another file's data, so requests on it answer
//! ENOENT, as they do for any inode the filesystem does not know.
//!
//! Told after the hold (the kernel's invalidation may wait for requests
//! that wait for the gate): every inode whose attributes, data, target or
//! extended attributes changed, or that went (its cached attributes and
//! pages), and every name that appeared, went or names another inode (the
//! kernel caches a name's absence too).

use std::any::Any;
use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use ramd_store::persist::{FollowTree, TreeSave};
use ramd_store::CHUNK_BYTES;

use super::meta::{parse, TreeRecords};
use super::{Data, Fs, Ino, State, FILE_SHIFT, ROOT_INO};

/// What the kernel may have cached that an applied save changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Inval {
    /// An inode's attributes and cached pages.
    Inode(Ino),
    /// A name in a directory.
    Entry(Ino, OsString),
}

/// Told the [`Inval`]s of the applies since it was last called.
pub type TreeHook = Box<dyn Fn(&[Inval]) + Send + Sync>;

/// A checked tree waiting to be installed, what it costs, and its records
/// (which the next save's change applies to).
struct Prepared {
    st: State,
    cost: u64,
    records: TreeRecords,
}

/// The [`FollowTree`] of a standby's filesystem.
pub struct StandbyTree {
    fs: Arc<Fs>,
    /// The records of the tree installed last, as the image holds it: a
    /// save's change (META variant 1) applies to them.
    records: parking_lot::Mutex<Option<TreeRecords>>,
}

impl StandbyTree {
    /// The standby of `fs`, loaded from `loaded`, the whole tree its image
    /// held.
    pub fn new(fs: Arc<Fs>, loaded: Option<&[u8]>) -> StandbyTree {
        let records = loaded.and_then(|m| match TreeRecords::from_whole(m) {
            Ok(t) => Some(t),
            // Not expected: the filesystem was loaded from it. A change
            // then finds no tree to apply to, and says so.
            Err(e) => {
                log::error!("standby: the loaded tree: {e}");
                None
            }
        });
        StandbyTree {
            fs,
            records: parking_lot::Mutex::new(records),
        }
    }
}

impl FollowTree for StandbyTree {
    fn prepare(&self, meta: &[u8], delta: bool) -> ramd_store::Result<Box<dyn Any + Send>> {
        let invalid = ramd_store::Error::Invalid;
        let (records, whole) = if delta {
            let mut t = self.records.lock().clone().ok_or_else(|| {
                invalid("a change to the tree (META variant 1), but no tree to apply it to".into())
            })?;
            if !t.apply_delta(meta).map_err(invalid)? {
                // Only file data changed: the installed tree stays.
                return Ok(Box::new(None::<Prepared>));
            }
            let whole = t.whole();
            (t, whole)
        } else {
            (
                TreeRecords::from_whole(meta).map_err(invalid)?,
                meta.to_vec(),
            )
        };
        let (st, cost) = parse(&whole).map_err(invalid)?;
        Ok(Box::new(Some(Prepared { st, cost, records })))
    }

    fn install(
        &self,
        tree: Option<Box<dyn Any + Send>>,
        chunks: Option<&HashSet<u64>>,
    ) -> ramd_store::Result<()> {
        let tree = tree.and_then(|t| {
            *t.downcast::<Option<Prepared>>()
                .expect("prepared by this tree")
        });
        let Some(Prepared { st, cost, records }) = tree else {
            return self.fs.install_tree(None, chunks);
        };
        self.fs.install_tree(Some((st, cost)), chunks)?;
        *self.records.lock() = Some(records);
        Ok(())
    }

    fn announce(&self) {
        self.fs.announce();
    }

    fn save(&self) -> TreeSave {
        (self.fs.save_tree(true))()
    }
}

impl Fs {
    /// Sets whom to tell what applied saves changed (once, for the
    /// mount's life); called without locks.
    pub fn on_tree_change(&self, hook: TreeHook) {
        let _ = self.on_tree_change.set(hook);
    }

    /// Swaps in `new` (`None`: the save had no tree, only file data), the
    /// store's gate held exclusively; `chunks`: the store chunks the save
    /// set (`None`: all). Remembers what changed for [`Fs::announce`].
    fn install_tree(
        &self,
        new: Option<(State, u64)>,
        chunks: Option<&HashSet<u64>>,
    ) -> ramd_store::Result<()> {
        let slots: Option<HashSet<u64>> =
            chunks.map(|c| c.iter().map(|k| (k * CHUNK_BYTES) >> FILE_SHIFT).collect());
        let touched = |d: &Data| match (d, &slots) {
            (Data::File { .. }, None) => true,
            (Data::File { slot, .. }, Some(s)) => s.contains(slot),
            _ => false,
        };
        let mut st = self.state.write();
        let mut out = Vec::new();
        let Some((mut new, cost)) = new else {
            for (&ino, i) in &st.inodes {
                if touched(&i.data) {
                    out.push(Inval::Inode(ino));
                }
            }
            self.stale.lock().extend(out);
            return Ok(());
        };
        let old_cost = self.tree_cost.load(Relaxed);
        self.store.uncharge(old_cost);
        if let Err(e) = self.store.charge(cost) {
            // What was just returned fits again.
            let _ = self.store.charge(old_cost);
            return Err(ramd_store::Error::Invalid(format!(
                "the tree needs {cost} bytes of memory, more than the disk's max_memory \
                 leaves: {e}"
            )));
        }
        self.tree_cost.store(cost, Relaxed);
        let mut old = std::mem::replace(&mut *st, State::empty());
        for (&ino, n) in new.inodes.iter_mut() {
            let Some(o) = old.inodes.get_mut(&ino) else {
                // The kernel knows nothing of a new inode but the root,
                // whose count of 1 `rebuild` gave it.
                continue;
            };
            n.lookups = o.lookups;
            n.opens = o.opens;
            n.cache = std::mem::take(&mut o.cache);
            let same = o.attr(ino) == n.attr(ino)
                && o.xattrs == n.xattrs
                && !touched(&n.data)
                && match (&o.data, &n.data) {
                    (Data::Symlink(a), Data::Symlink(b)) => a == b,
                    (Data::File { slot: a, .. }, Data::File { slot: b, .. }) => a == b,
                    _ => true,
                };
            if !same {
                out.push(Inval::Inode(ino));
            }
            if let (Data::Dir { entries: a, .. }, Data::Dir { entries: b, .. }) =
                (&o.data, &mut n.data)
            {
                // A listing going on across the apply returns each name
                // that stayed exactly once (fs/dir.rs).
                b.keep_cookies_of(a);
                let b = &*b;
                // Its listing, which the kernel may cache.
                if same && a != b {
                    out.push(Inval::Inode(ino));
                }
                for (name, child) in a {
                    if b.get(name) != Some(child) {
                        out.push(Inval::Entry(ino, name.clone()));
                    }
                }
                for name in b.keys().filter(|k| !a.contains_key(k)) {
                    out.push(Inval::Entry(ino, name.clone()));
                }
            }
        }
        for &ino in old.inodes.keys().filter(|i| !new.inodes.contains_key(i)) {
            out.push(Inval::Inode(ino));
        }
        *st = new;
        drop(st);
        self.stale.lock().extend(out);
        Ok(())
    }

    /// Tells the hook what the applies since the last call changed.
    fn announce(&self) {
        let stale = std::mem::take(&mut *self.stale.lock());
        if stale.is_empty() {
            return;
        }
        if let Some(hook) = self.on_tree_change.get() {
            hook(&stale);
        }
    }
}

impl State {
    /// A placeholder while a tree is swapped.
    fn empty() -> State {
        State {
            inodes: HashMap::new(),
            next_ino: ROOT_INO.0 + 1,
            free_slots: Vec::new(),
            next_slot: 0,
            linkable: HashSet::new(),
        }
    }
}
