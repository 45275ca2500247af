//! The filesystem itself, independent of FUSE: inodes, directories, links,
//! xattrs and file data, with tmpfs semantics. `fuse.rs` only translates.
//!
//! This file holds `Fs`'s state and what its concerns share; the requests
//! are in `fs/`, one concern a file: `namespace.rs`, `data.rs`, `attr.rs`,
//! `xattr.rs`, with the vocabulary they speak in `types.rs`.
//!
//! File data lives in the shared page store: file number `slot` owns the
//! store range `[slot << FILE_SHIFT, (slot + 1) << FILE_SHIFT)`, so every
//! file is a sparse object on the same engine as block disks (holes, same-
//! filled pages, memory budget and warm pool included).
//!
//! Locking: one `RwLock` over all metadata. Reads and writes of file data
//! hold it only to look up the slot and to update size and times; the page
//! copies run under the store's own shard locks. Every method that changes
//! the tree or file data first takes a [`Change`] (the store's save gate,
//! shared) for its whole run and hands it down to every store call that
//! changes data, so a save, which takes the gate exclusively, sees each
//! request all done or not begun; lock order is gate -> state -> store.
//! (atime updates skip it: one change under the state lock, in a save or
//! not.)
//!
//! Invariants:
//! - An inode exists while it is linked (`nlink > 0`), known to the kernel
//!   (`lookups > 0`) or open (`opens > 0`). Its data is freed as soon as it is
//!   neither linked nor open; the inode itself when the kernel forgets it.
//! - A directory's `nlink` is 2 + its subdirectories; `entries` never holds
//!   "." or "..".
//! - Every inode, name, xattr and symlink target is charged to the store's
//!   memory budget while it exists.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use ramd_store::{Change, Store, PAGE_SIZE};

mod acl;
mod attr;
mod cache;
mod cold;
mod data;
mod dir;
mod follow;
mod kernel;
mod loads;
mod marks;
pub(crate) mod meta;
pub use meta::TreeRecords;
mod namespace;
mod saves;
pub mod types;
mod xattr;

use acl::{ACL_ACCESS, ACL_DEFAULT};
pub use cache::OpenCache;
pub use cold::ColdStats;
use dir::Entries;
pub use follow::{Inval, StandbyTree, TreeHook};
pub(crate) use types::now;
use types::{err, Kill, MAX_SLOTS, XATTR_NAME_MAX, XATTR_SIZE_MAX};
pub use types::{
    join_time, split_time, Atime, AtimeMode, Attr, Caller, DirEntry, Errno, FsConfig, Ino, Kind,
    Result, SetAttr, SetTime, Whence, FILE_SHIFT, FL_APPEND, FL_IMMUTABLE, FL_NOATIME, FL_NODUMP,
    FL_SUPPORTED, MAX_FILE_SIZE, NAME_MAX, ROOT_INO,
};

/// Memory charged per inode and per directory entry, beyond their names
/// (an entry is held twice, by name and by cookie: see `fs/dir.rs`).
const INODE_COST: u64 = std::mem::size_of::<Inode>() as u64 + 64;
const DIRENT_COST: u64 = 96;

/// `Fs::size`'s encoding of "no size" (ramfs mode).
const UNLIMITED: u64 = u64::MAX;

#[derive(Debug)]
enum Data {
    File {
        slot: u64,
        /// Pages of the file that are not holes (for st_blocks).
        pages: u64,
        /// End of everything ever allocated, so freeing trims it all
        /// (fallocate KEEP_SIZE can allocate past `size`).
        alloc_end: u64,
    },
    Dir {
        entries: Entries,
        parent: Ino,
    },
    Symlink(OsString),
    Special,
}

#[derive(Debug)]
struct Inode {
    kind: Kind,
    perm: u16,
    nlink: u32,
    uid: u32,
    gid: u32,
    rdev: u32,
    size: u64,
    atime: SystemTime,
    mtime: SystemTime,
    ctime: SystemTime,
    btime: SystemTime,
    xattrs: BTreeMap<OsString, Vec<u8>>,
    lookups: u64,
    opens: u32,
    /// How its opens use the kernel's page cache (see `fs/cache.rs`).
    cache: cache::InodeCache,
    /// chattr(1) flags ([`FL_SUPPORTED`]).
    flags: u32,
    data: Data,
    /// Where a regular file's data is with a cold tier (see `fs/cold.rs`).
    cold: cold::ColdState,
}

struct State {
    inodes: HashMap<Ino, Inode>,
    next_ino: u64,
    free_slots: Vec<u64>,
    next_slot: u64,
    /// O_TMPFILE files not linked yet, which a link may give a name
    /// (the kernel has checked they were not opened with O_EXCL).
    linkable: HashSet<Ino>,
}

impl State {
    /// Whether one more inode fits under `nr_inodes`. Inodes that are
    /// unlinked and closed, which only wait for the kernel's FORGET
    /// (their data is already freed), do not count: tmpfs frees them at
    /// once, and the FORGET may come after the next create (over io_uring
    /// it comes on /dev/fuse, beside the ring). Counted only at the limit.
    fn room_for_inode(&self, nr_inodes: u64) -> bool {
        (self.inodes.len() as u64) < nr_inodes
            || (self
                .inodes
                .values()
                .filter(|i| i.nlink > 0 || i.opens > 0)
                .count() as u64)
                < nr_inodes
    }
}

/// Filesystem counters for `ramd status`.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct FsStats {
    pub inodes: u64,
    pub max_inodes: u64,
    pub files: u64,
    pub dirs: u64,
    pub file_bytes: u64,
    /// With `--data-path kernel`: bytes its tmpfs holds (what the host
    /// sees as shmem), cold files not included.
    #[serde(default)]
    pub hot_bytes: Option<u64>,
    /// With a cold tier (`--data-path kernel --compress`): what it holds.
    #[serde(default)]
    pub cold: Option<ColdStats>,
}

pub struct Fs {
    store: Arc<Store>,
    cfg: FsConfig,
    /// `cfg.size` and `cfg.atime` as they are now: a remount changes them.
    size: AtomicU64,
    atime: AtomicU8,
    state: RwLock<State>,
    /// Told when an inode's attributes change without the kernel asking
    /// (privilege bits dropped on a write): its cached copy is stale.
    on_attr_change: std::sync::OnceLock<AttrHook>,
    /// Free bytes at or under which files open uncached (see `fs/cache.rs`);
    /// 0: never.
    write_reserve: AtomicU64,
    /// The kernel keeps regular files' mtime and ctime (write-back cache).
    kernel_times: std::sync::atomic::AtomicBool,
    /// The host guard's room, sampled for [`Fs::room`].
    host_sample: cache::HostSample,
    /// Writes past a file's end take one of these (by inode), see
    /// [`Fs::write`].
    extending: [parking_lot::Mutex<()>; EXTEND_LOCKS],
    /// With `--data-path kernel`: where regular files' data lives instead
    /// of the store (see `fs/kernel.rs`).
    hot: std::sync::OnceLock<crate::hot::HotTier>,
    /// What saves of the hot tier remember (see `fs/saves.rs`).
    saves: marks::HotSaves,
    /// With a hot tier and compression: where idle closed files' data
    /// goes (see `fs/cold.rs`).
    cold: std::sync::OnceLock<cold::ColdTier>,
    /// A standby's (see `fs/follow.rs`): what its loaded or last applied
    /// tree was charged, which the next apply returns.
    tree_cost: AtomicU64,
    /// A standby's: what the applies since the last announcement changed,
    /// and whom to tell (the FUSE session).
    stale: parking_lot::Mutex<Vec<Inval>>,
    on_tree_change: std::sync::OnceLock<TreeHook>,
    /// What the image's last committed save holds of the tree, which the
    /// next save's delta is made against (see `fs/meta.rs`).
    tree_saved: parking_lot::Mutex<meta::TreeSaved>,
}

/// Stripes of [`Fs::extending`]: files written at their ends at once
/// rarely share one.
const EXTEND_LOCKS: usize = 64;

/// See [`Fs::on_attr_change`].
pub type AttrHook = Box<dyn Fn(Ino) + Send + Sync>;

fn name_cost(name: &OsStr) -> u64 {
    DIRENT_COST + 2 * name.len() as u64
}

fn check_name(name: &OsStr) -> Result<()> {
    if name.len() > NAME_MAX {
        return err(Errno::ENAMETOOLONG);
    }
    if name.is_empty() || name == "." || name == ".." || name.as_bytes().contains(&b'/') {
        return err(Errno::EINVAL);
    }
    Ok(())
}

fn xattr_cost(name: &OsStr, value: &[u8]) -> u64 {
    DIRENT_COST + name.len() as u64 + value.len() as u64
}

/// Namespaces tmpfs supports, and of system.* the two ACLs.
fn check_xattr_name(name: &OsStr) -> Result<()> {
    if name.len() > XATTR_NAME_MAX {
        return err(Errno::ERANGE);
    }
    if name == ACL_ACCESS || name == ACL_DEFAULT {
        return Ok(());
    }
    let b = name.as_bytes();
    let known = [&b"user."[..], b"trusted.", b"security."]
        .iter()
        .any(|p| b.starts_with(p) && b.len() > p.len());
    if known {
        Ok(())
    } else {
        err(Errno::EOPNOTSUPP)
    }
}

impl Inode {
    /// A new inode, all times `now`, with the one reference the kernel
    /// takes from the reply that announces it.
    fn new(kind: Kind, perm: u16, uid: u32, gid: u32, data: Data, now: SystemTime) -> Inode {
        Inode {
            kind,
            perm,
            nlink: if kind == Kind::Dir { 2 } else { 1 },
            uid,
            gid,
            rdev: 0,
            size: 0,
            atime: now,
            mtime: now,
            ctime: now,
            btime: now,
            xattrs: BTreeMap::new(),
            flags: 0,
            lookups: 1,
            opens: 0,
            cache: Default::default(),
            data,
            cold: Default::default(),
        }
    }

    fn attr(&self, ino: Ino) -> Attr {
        let blocks = match self.data {
            Data::File { pages, .. } => pages * (PAGE_SIZE as u64 / 512),
            Data::Symlink(ref t) => (t.len() as u64).div_ceil(512),
            _ => 0,
        };
        Attr {
            ino,
            kind: self.kind,
            perm: self.perm,
            nlink: self.nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: self.rdev,
            size: self.size,
            blocks,
            atime: self.atime,
            mtime: self.mtime,
            ctime: self.ctime,
            btime: self.btime,
            flags: self.flags,
        }
    }

    fn entries(&self) -> Result<&Entries> {
        match &self.data {
            Data::Dir { entries, .. } => Ok(entries),
            _ => err(Errno::ENOTDIR),
        }
    }

    fn entries_mut(&mut self) -> Result<&mut Entries> {
        match &mut self.data {
            Data::Dir { entries, .. } => Ok(entries),
            _ => err(Errno::ENOTDIR),
        }
    }

    /// EPERM if the inode is immutable or append-only: it may not be
    /// removed, renamed, linked, or have its attributes changed.
    fn check_fixed(&self) -> Result<()> {
        if self.flags & (FL_IMMUTABLE | FL_APPEND) != 0 {
            return err(Errno::EPERM);
        }
        Ok(())
    }

    fn check_mutable(&self) -> Result<()> {
        if self.flags & FL_IMMUTABLE != 0 {
            return err(Errno::EPERM);
        }
        Ok(())
    }

    fn touch_mc(&mut self, now: SystemTime) {
        self.mtime = now;
        self.ctime = now;
    }
}

impl State {
    fn get(&self, ino: Ino) -> Result<&Inode> {
        self.inodes.get(&ino).ok_or(Errno::ENOENT)
    }

    fn get_mut(&mut self, ino: Ino) -> Result<&mut Inode> {
        self.inodes.get_mut(&ino).ok_or(Errno::ENOENT)
    }

    /// Whether a new entry `name` may go into `parent`: a directory that
    /// still exists (not removed while a caller held it) without that name.
    fn check_new_entry(&self, parent: Ino, name: &OsStr) -> Result<&Inode> {
        let p = self.get(parent)?;
        if p.entries()?.contains_key(name) {
            return err(Errno::EEXIST);
        }
        if p.nlink == 0 {
            return err(Errno::ENOENT);
        }
        Ok(p)
    }

    fn child(&self, parent: Ino, name: &OsStr) -> Result<Ino> {
        self.get(parent)?
            .entries()?
            .get(name)
            .copied()
            .ok_or(Errno::ENOENT)
    }
}

/// The VFS's atime rules (`relatime_need_update` and friends).
fn atime_moves(a: Atime, i: &Inode, now: SystemTime) -> bool {
    if a.nodiratime && i.kind == Kind::Dir {
        return false;
    }
    match a.mode {
        AtimeMode::Never => false,
        AtimeMode::Strict => i.atime != now,
        AtimeMode::Relatime => {
            i.atime <= i.mtime
                || i.atime <= i.ctime
                || now
                    .duration_since(i.atime)
                    .is_ok_and(|d| d >= Duration::from_secs(86400))
        }
    }
}

impl Fs {
    pub fn new(store: Arc<Store>, cfg: FsConfig) -> Result<Fs> {
        let now = now();
        // The kernel holds the root without a lookup: its count of 1 is
        // never forgotten.
        let root = Inode::new(
            Kind::Dir,
            cfg.mode & 0o7777,
            cfg.uid,
            cfg.gid,
            Data::Dir {
                entries: Entries::new(),
                parent: ROOT_INO,
            },
            now,
        );
        store.charge(INODE_COST)?;
        let mut inodes = HashMap::new();
        inodes.insert(ROOT_INO, root);
        let st = State {
            inodes,
            next_ino: ROOT_INO.0 + 1,
            free_slots: Vec::new(),
            next_slot: 0,
            linkable: HashSet::new(),
        };
        Ok(Fs::with_state(store, cfg, st))
    }

    /// A filesystem holding `st` (new, or loaded from an image), with
    /// nothing else set yet: no hooks, no write reserve.
    fn with_state(store: Arc<Store>, cfg: FsConfig, st: State) -> Fs {
        Fs {
            size: AtomicU64::new(cfg.size.unwrap_or(UNLIMITED)),
            atime: AtomicU8::new(cfg.atime.bits()),
            store,
            cfg,
            state: RwLock::new(st),
            on_attr_change: std::sync::OnceLock::new(),
            write_reserve: AtomicU64::new(0),
            kernel_times: Default::default(),
            host_sample: Default::default(),
            extending: std::array::from_fn(|_| parking_lot::Mutex::new(())),
            hot: std::sync::OnceLock::new(),
            saves: Default::default(),
            cold: std::sync::OnceLock::new(),
            tree_cost: AtomicU64::new(0),
            stale: Default::default(),
            on_tree_change: std::sync::OnceLock::new(),
            tree_saved: Default::default(),
        }
    }

    /// Says that the kernel keeps regular files' mtime and ctime (the
    /// FUSE write-back cache was negotiated): its write-backs then leave
    /// them alone.
    pub fn set_kernel_times(&self, yes: bool) {
        self.kernel_times.store(yes, Relaxed);
    }

    /// Takes the store's gate for one changing request: what [`Fs::write`]
    /// needs (every other changing call takes its own).
    pub fn change(&self) -> Change<'_> {
        self.store.change()
    }

    /// Sets what to call (once, for the mount's life) when an inode's
    /// attributes change behind the kernel's back; called without locks.
    pub fn on_attr_change(&self, hook: AttrHook) {
        let _ = self.on_attr_change.set(hook);
    }

    fn attr_changed(&self, ino: Ino) {
        if let Some(hook) = self.on_attr_change.get() {
            hook(ino);
        }
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// The settings it was made with; see [`Fs::size`] and [`Fs::atime`]
    /// for the ones a remount changes.
    pub fn config(&self) -> &FsConfig {
        &self.cfg
    }

    /// The capacity now (`None`: ramfs mode).
    pub fn size(&self) -> Option<u64> {
        Some(self.size.load(Relaxed)).filter(|&s| s != UNLIMITED)
    }

    /// Records a new capacity, for statfs. The store's page limit, which
    /// enforces it, is the caller's to change first. With a hot tier (`--data-path kernel`) its tmpfs is resized too,
    /// which refuses a size below what it holds.
    pub fn set_size(&self, size: Option<u64>) -> std::io::Result<()> {
        if self.hot.get().is_some() {
            self.resize_hot(size)?;
        }
        self.size.store(size.unwrap_or(UNLIMITED), Relaxed);
        Ok(())
    }

    pub fn atime(&self) -> Atime {
        Atime::from_bits(self.atime.load(Relaxed))
    }

    pub fn set_atime(&self, a: Atime) {
        self.atime.store(a.bits(), Relaxed);
        if let Some(hot) = self.hot.get() {
            if let Err(e) = hot.set_atime(a.mode) {
                log::warn!("the hot tier's atime rule: {e}");
            }
        }
    }

    /// Whether reading `ino` now would move its atime: the kernel must then
    /// send the read here rather than serve it from its page cache.
    pub fn read_moves_atime(&self, ino: Ino) -> bool {
        let a = self.atime();
        let now = now();
        self.state
            .read()
            .get(ino)
            .is_ok_and(|i| i.flags & FL_NOATIME == 0 && atime_moves(a, i, now))
    }

    /// Turns `len` bytes of a file's store range at `at` into holes and
    /// returns the change in its non-hole pages. Punching needs no memory
    /// and the range lies inside the file's slot, so it cannot fail.
    fn punch(&self, c: &Change<'_>, at: u64, len: u64) -> i64 {
        let mut delta = 0;
        let r = c.zero_counted(at, len, true, &mut delta);
        debug_assert!(r.is_ok(), "punching a file's pages failed: {r:?}");
        delta
    }

    /// Drops what a change by `who` takes away from a non-directory, as
    /// the VFS does on tmpfs (`setattr_should_drop_suidgid`, `chown_common`):
    /// the `security.capability` xattr always; setuid, and setgid when the
    /// file is group-executable or `who` is not in its group, on a chown,
    /// and on a write, truncate or fallocate by a caller without CAP_FSETID.
    /// Returns whether the mode changed (the kernel's copy is then stale).
    fn drop_privileges(&self, inode: &mut Inode, who: Caller, why: Kill) -> bool {
        let regular = inode.kind == Kind::File;
        if inode.kind == Kind::Dir || (why != Kill::Chown && !regular) {
            return false;
        }
        if !inode.xattrs.is_empty() {
            let cap = OsStr::new("security.capability");
            if let Some(v) = inode.xattrs.remove(cap) {
                self.store.uncharge(xattr_cost(cap, &v));
            }
        }
        let (suid, sgid, xgrp) = (
            libc::S_ISUID as u16,
            libc::S_ISGID as u16,
            libc::S_IXGRP as u16,
        );
        if inode.perm & (suid | sgid) == 0 {
            return false;
        }
        let creds = who.creds();
        let fsetid = creds.fsetid && why != Kill::KernelSays;
        if fsetid && why != Kill::Chown {
            return false;
        }
        let mut kill = inode.perm & suid;
        if inode.perm & sgid != 0
            && (inode.perm & xgrp != 0 || !(fsetid || creds.groups.contains(&inode.gid)))
        {
            kill |= sgid;
        }
        inode.perm &= !kill;
        kill != 0
    }

    /// Marks an access (read, readlink, readdir) as the mount's atime rule
    /// says (relatime unless told otherwise).
    fn accessed(&self, ino: Ino) {
        let a = self.atime();
        // A standby's mount is read-only: its writer's saves bring the
        // times, and an apply would undo any moved here.
        if a.mode == AtimeMode::Never || self.store.standby() {
            return;
        }
        let now = now();
        if self
            .state
            .read()
            .get(ino)
            .is_ok_and(|i| i.flags & FL_NOATIME != 0 || !atime_moves(a, i, now))
        {
            return;
        }
        if let Ok(i) = self.state.write().get_mut(ino) {
            if atime_moves(a, i, now) {
                i.atime = now;
            }
        }
    }

    /// Frees what an inode no longer needs: data once unreachable and
    /// closed, the inode once the kernel forgot it too.
    fn maybe_free(&self, c: &Change<'_>, st: &mut State, ino: Ino) {
        let Some(inode) = st.inodes.get_mut(&ino) else {
            return;
        };
        if inode.nlink > 0 || inode.opens > 0 {
            return;
        }
        if inode.kind == Kind::File && self.hot.get().is_some() {
            if let Data::File { slot, .. } = inode.data {
                self.cold_free(&mut inode.cold, slot, inode.size);
            }
            self.hot_free(ino);
        } else if let Data::File {
            slot,
            ref mut pages,
            ref mut alloc_end,
        } = inode.data
        {
            // Whole pages: punching part of one would leave it allocated.
            let end = round_up((*alloc_end).max(inode.size));
            if end > 0 {
                let delta = self.punch(c, base(slot), end);
                *pages = pages.saturating_add_signed(delta);
                *alloc_end = 0;
                inode.size = 0;
            }
        }
        self.maybe_drop(st, ino);
    }

    /// Drops an inode that nothing names, holds open or remembers (its data
    /// freed already, see `maybe_free`).
    fn maybe_drop(&self, st: &mut State, ino: Ino) {
        match st.inodes.get(&ino) {
            Some(i) if i.nlink == 0 && i.opens == 0 && i.lookups == 0 => {}
            _ => return,
        }
        let inode = st.inodes.remove(&ino).expect("present");
        let mut cost = INODE_COST;
        match inode.data {
            Data::File { slot, .. } => {
                if self.hot.get().is_some() && self.saves.imaged() {
                    self.saves.freed(ino, slot);
                }
                st.free_slots.push(slot)
            }
            Data::Symlink(t) => cost += t.len() as u64,
            _ => {}
        }
        cost += inode
            .xattrs
            .iter()
            .map(|(k, v)| xattr_cost(k, v))
            .sum::<u64>();
        self.store.uncharge(cost);
    }

    /// Where a regular file's data starts in the store, its size and its
    /// chattr flags.
    fn file(&self, ino: Ino) -> Result<(u64, u64, u32)> {
        let st = self.state.read();
        let inode = st.get(ino)?;
        match inode.data {
            Data::File { slot, .. } => Ok((base(slot), inode.size, inode.flags)),
            _ if inode.kind == Kind::Dir => err(Errno::EISDIR),
            _ => err(Errno::EINVAL),
        }
    }

    pub fn stats(&self) -> FsStats {
        let st = self.state.read();
        let (mut files, mut dirs, mut bytes) = (0, 0, 0);
        for (&ino, i) in st.inodes.iter() {
            match i.kind {
                Kind::File => {
                    files += 1;
                    bytes += match self.hot.get() {
                        Some(_) if i.cold.is_cold() => i.size,
                        Some(h) => h.stat(ino).ok().flatten().map_or(0, |s| s.st_size as u64),
                        None => i.size,
                    };
                }
                Kind::Dir => dirs += 1,
                _ => {}
            }
        }
        FsStats {
            inodes: st.inodes.len() as u64,
            max_inodes: self.cfg.nr_inodes,
            files,
            dirs,
            file_bytes: bytes,
            hot_bytes: self.hot.get().map(|h| h.used_bytes()),
            cold: self.cold_stats(),
        }
    }
}

fn base(slot: u64) -> u64 {
    slot << FILE_SHIFT
}

/// `x` rounded up to a page; a file's offsets stay within its slot.
fn round_up(x: u64) -> u64 {
    x.div_ceil(PAGE_SIZE as u64) * PAGE_SIZE as u64
}
