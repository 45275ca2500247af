//! The filesystem itself, independent of FUSE: inodes, directories, links,
//! xattrs and file data, with tmpfs semantics. `fuse.rs` only translates.
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
use ramd_store::{Change, ExtentKind, Store, PAGE_SIZE};

mod acl;
mod cache;
mod cold;
mod dir;
mod follow;
mod kernel;
pub(crate) mod meta;
mod saves;

pub use cache::OpenCache;
pub use cold::ColdStats;
use dir::Entries;
pub use follow::{Inval, StandbyTree, TreeHook};

/// File data of one file spans at most 1 TiB of store address space.
pub const FILE_SHIFT: u32 = 40;
/// Largest file size; writes past it get EFBIG.
pub const MAX_FILE_SIZE: u64 = (1 << FILE_SHIFT) - 1;
/// Files with data that fit in the store's 2^63-byte address space.
const MAX_SLOTS: u64 = ramd_store::MAX_SIZE >> FILE_SHIFT;
pub const ROOT_INO: Ino = Ino(1);

/// An inode number, as the kernel knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ino(pub u64);

impl std::fmt::Display for Ino {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

pub const NAME_MAX: usize = 255;
const XATTR_NAME_MAX: usize = 255;
const XATTR_SIZE_MAX: usize = 64 << 10;
/// Memory charged per inode and per directory entry, beyond their names
/// (an entry is held twice, by name and by cookie: see `fs/dir.rs`).
const INODE_COST: u64 = std::mem::size_of::<Inode>() as u64 + 64;
const DIRENT_COST: u64 = 96;

/// The chattr(1) flags tmpfs keeps (FS_IOC_GETFLAGS/SETFLAGS): immutable,
/// append-only, no dump, no atime. The VFS enforces the first two through
/// inode flags FUSE never sets, so `Fs` enforces them itself.
pub const FL_IMMUTABLE: u32 = 0x10;
pub const FL_APPEND: u32 = 0x20;
pub const FL_NODUMP: u32 = 0x40;
pub const FL_NOATIME: u32 = 0x80;
pub const FL_SUPPORTED: u32 = FL_IMMUTABLE | FL_APPEND | FL_NODUMP | FL_NOATIME;

/// What a failed call answers the kernel: the store's errno vocabulary.
pub use ramd_store::Errno;

/// A call's result; store errors become their errno with `?`.
pub type Result<T> = std::result::Result<T, Errno>;

fn err<T>(e: Errno) -> Result<T> {
    Err(e)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

impl Kind {
    /// The kind a `st_mode` names, if any.
    pub fn from_mode(mode: u32) -> Option<Kind> {
        Some(match mode & libc::S_IFMT {
            libc::S_IFREG => Kind::File,
            libc::S_IFDIR => Kind::Dir,
            libc::S_IFLNK => Kind::Symlink,
            libc::S_IFIFO => Kind::Fifo,
            libc::S_IFSOCK => Kind::Socket,
            libc::S_IFCHR => Kind::CharDev,
            libc::S_IFBLK => Kind::BlockDev,
            _ => return None,
        })
    }
}

/// What a caller is, for ownership of what it creates.
#[derive(Debug, Clone, Copy)]
pub struct Caller {
    pub uid: u32,
    pub gid: u32,
    /// Its thread id, to read what FUSE does not pass (capabilities and
    /// supplementary groups) from /proc; 0 when unknown.
    pub pid: u32,
    /// Its umask, for what it creates: the mount negotiates POSIX ACLs
    /// (and FUSE_DONT_MASK), so `Fs` applies it unless a default ACL rules.
    pub umask: u32,
}

/// What the VFS weighs before dropping setuid and setgid and FUSE does not
/// pass: CAP_FSETID and the groups a caller is in.
struct Creds {
    fsetid: bool,
    /// The filesystem gid first, then the supplementary groups.
    groups: Vec<u32>,
}

impl Caller {
    /// Read from /proc/PID/status only when a privilege bit is at stake
    /// (rare); without it, root stands in for CAP_FSETID.
    fn creds(self) -> Creds {
        const CAP_FSETID: u32 = 4;
        let mut c = Creds {
            fsetid: self.uid == 0,
            groups: vec![self.gid],
        };
        if self.pid == 0 {
            return c;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{}/status", self.pid)) else {
            return c;
        };
        for line in status.lines() {
            let Some((key, val)) = line.split_once(':') else {
                continue;
            };
            let mut nums = val.split_whitespace();
            match key {
                "CapEff" => {
                    if let Some(caps) = nums.next().and_then(|h| u64::from_str_radix(h, 16).ok()) {
                        c.fsetid = caps & (1 << CAP_FSETID) != 0;
                    }
                }
                // Real, effective, saved, filesystem: the last one counts.
                "Gid" => {
                    if let Some(fsgid) = nums.nth(3).and_then(|g| g.parse().ok()) {
                        c.groups[0] = fsgid;
                    }
                }
                "Groups" => c.groups.extend(nums.filter_map(|g| g.parse::<u32>().ok())),
                _ => {}
            }
        }
        c
    }
}

/// Why privilege bits may go ([`Fs::drop_privileges`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kill {
    Chown,
    /// A write, truncate or fallocate.
    Modify,
    /// A write the kernel flagged (FUSE_WRITE_KILL_SUIDGID): it found the
    /// writer without CAP_FSETID.
    KernelSays,
}

/// A stat result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attr {
    pub ino: Ino,
    pub kind: Kind,
    /// Permission bits including setuid, setgid and sticky (07777).
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    /// 512-byte blocks allocated.
    pub blocks: u64,
    pub atime: SystemTime,
    pub mtime: SystemTime,
    pub ctime: SystemTime,
    pub btime: SystemTime,
    /// chattr's flags (`FL_*`).
    pub flags: u32,
}

/// A time to set: a given instant or now.
#[derive(Debug, Clone, Copy)]
pub enum SetTime {
    At(SystemTime),
    Now,
}

/// The changes of one setattr; `None` leaves a field alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<SetTime>,
    pub mtime: Option<SetTime>,
    pub ctime: Option<SystemTime>,
    /// The caller sets times other than both to now (utimensat with
    /// times, or one of them left alone), which an append-only file
    /// refuses; not for the kernel's write-back of the times it keeps
    /// under the write-back cache.
    pub times_given: bool,
}

impl SetAttr {
    /// Nothing to set: from the kernel, its word that setuid and setgid
    /// must go (see [`Fs::setattr`]).
    pub fn is_empty(&self) -> bool {
        self.mode.is_none()
            && self.uid.is_none()
            && self.gid.is_none()
            && self.size.is_none()
            && self.atime.is_none()
            && self.mtime.is_none()
            && self.ctime.is_none()
    }
}

/// One directory entry as readdir returns it.
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub ino: Ino,
    pub kind: Kind,
    pub name: OsString,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Whence {
    Data,
    Hole,
}

/// Mount-time settings, like tmpfs's mount options.
#[derive(Debug, Clone)]
pub struct FsConfig {
    /// Capacity in bytes for file data; `None`: ramfs mode, only memory bounds it.
    pub size: Option<u64>,
    pub nr_inodes: u64,
    /// Root directory permissions, owner and group.
    pub mode: u16,
    pub uid: u32,
    pub gid: u32,
    /// When reads move atime (changeable while mounted: [`Fs::set_atime`]).
    pub atime: Atime,
}

/// The mount's atime rule. FUSE leaves atime to the filesystem (the kernel
/// marks FUSE inodes `S_NOATIME`), so `Fs` applies the VFS's rules itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AtimeMode {
    /// Moves when older than mtime or ctime, or a day old (the default).
    #[default]
    Relatime,
    /// Moves on every access.
    Strict,
    /// Never moves.
    Never,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Atime {
    pub mode: AtimeMode,
    /// Directories' atime never moves.
    pub nodiratime: bool,
}

impl Atime {
    fn bits(self) -> u8 {
        let mode = match self.mode {
            AtimeMode::Relatime => 0,
            AtimeMode::Strict => 1,
            AtimeMode::Never => 2,
        };
        mode | (self.nodiratime as u8) << 2
    }

    fn from_bits(b: u8) -> Atime {
        let mode = match b & 3 {
            1 => AtimeMode::Strict,
            2 => AtimeMode::Never,
            _ => AtimeMode::Relatime,
        };
        Atime {
            mode,
            nodiratime: b & 4 != 0,
        }
    }
}

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
    saves: saves::HotSaves,
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

/// The time every timestamp is taken from: CLOCK_REALTIME_COARSE, the
/// clock of the kernel's `current_time()`, which sets mtime and ctime
/// itself under the write-back cache. One clock for all keeps their order
/// (birth <= mtime, atime <= mtime right after a write, so relatime moves
/// atime on the first read), as on tmpfs; the kernel's granularity is 1 ns
/// (`time_gran` at INIT), so nothing is truncated.
pub(crate) fn now() -> SystemTime {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec, which `ts` is.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_REALTIME_COARSE, &mut ts) };
    if r != 0 || ts.tv_sec < 0 {
        return SystemTime::now();
    }
    SystemTime::UNIX_EPOCH + Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// `t` as seconds since 1970 (negative before) and nanoseconds, the way
/// a timespec, FUSE and the image carry a time.
pub fn split_time(t: SystemTime) -> (i64, u32) {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
        Err(e) => {
            let d = e.duration();
            match d.subsec_nanos() {
                0 => (-(d.as_secs() as i64), 0),
                n => (-(d.as_secs() as i64) - 1, 1_000_000_000 - n),
            }
        }
    }
}

/// The instant `secs` (since 1970, negative before) and `nsec` name; None
/// when `nsec` is not below 10^9 or the instant is out of range.
pub fn join_time(secs: i64, nsec: u32) -> Option<SystemTime> {
    if nsec >= 1_000_000_000 {
        return None;
    }
    if secs >= 0 {
        SystemTime::UNIX_EPOCH.checked_add(Duration::new(secs as u64, nsec))
    } else {
        SystemTime::UNIX_EPOCH
            .checked_sub(Duration::from_secs(secs.unsigned_abs()))?
            .checked_add(Duration::from_nanos(nsec.into()))
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

    /// Looks `name` up in `parent`, counting a lookup. "." and ".." are
    /// what the kernel asks for to open a file handle whose inode it no
    /// longer caches (`.` of any inode, `..` of a directory).
    pub fn lookup(&self, parent: Ino, name: &OsStr) -> Result<Attr> {
        if name.len() > NAME_MAX {
            return err(Errno::ENAMETOOLONG);
        }
        let mut st = self.state.write();
        let ino = match name.as_bytes() {
            b"." => parent,
            b".." => match st.get(parent)?.data {
                Data::Dir { parent, .. } => parent,
                _ => return err(Errno::ENOTDIR),
            },
            _ => st.child(parent, name)?,
        };
        let inode = st.get_mut(ino)?;
        inode.lookups += 1;
        Ok(self.hot_attr(inode, ino))
    }

    /// The kernel dropped `n` references taken by lookups and creations.
    /// Takes the gate: dropping the inode frees its slot for reuse.
    pub fn forget(&self, ino: Ino, n: u64) {
        let _gate = self.store.change();
        let mut st = self.state.write();
        if let Some(inode) = st.inodes.get_mut(&ino) {
            inode.lookups = inode.lookups.saturating_sub(n);
        }
        // Fewer lookups reach no data: an unreachable inode's went when
        // its last link or open did (`maybe_free`).
        self.maybe_drop(&mut st, ino);
    }

    pub fn getattr(&self, ino: Ino) -> Result<Attr> {
        let st = self.state.read();
        Ok(self.hot_attr(st.get(ino)?, ino))
    }

    /// Applies `set` for `who`. Like the VFS (the mount negotiates
    /// FUSE_HANDLE_KILLPRIV_V2, which leaves this to the filesystem), a
    /// chown of a non-directory, and a truncate by a caller without
    /// CAP_FSETID, drop setuid, setgid and file capabilities; so does an
    /// empty SETATTR, the kernel's word that a change needs it.
    pub fn setattr(&self, who: Caller, ino: Ino, set: SetAttr) -> Result<Attr> {
        // A new size needs the data in the backing file; times alone are
        // the inode's while it is cold.
        let _pin = match set.size {
            Some(_) => Some(self.hot_pin(ino)?),
            None => None,
        };
        let c = self.store.change();
        let now = now();
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        inode.check_mutable()?;
        // Append-only: times may still move both to now (utime(NULL)),
        // and the kernel write back its own, nothing else (the VFS's
        // rule in notify_change, which FUSE inodes never reach).
        if set.mode.is_some()
            || set.uid.is_some()
            || set.gid.is_some()
            || set.size.is_some()
            || set.times_given
        {
            inode.check_fixed()?;
        }
        if set.uid.is_some() || set.gid.is_some() {
            self.drop_privileges(inode, who, Kill::Chown);
        }
        if set.size.is_some() {
            self.drop_privileges(inode, who, Kill::Modify);
        }
        if set.is_empty() && inode.kind == Kind::File {
            // The kernel found that a change by `who` (a write, fallocate
            // or copy it did not send us: passed through to the backing
            // file, or a fallocate) must drop setuid/setgid, and with
            // HANDLE_KILLPRIV_V2 leaves that to us, sending nothing else.
            self.drop_privileges(inode, who, Kill::KernelSays);
        }
        if inode.kind == Kind::File && self.hot.get().is_some() {
            if set.size.is_some_and(|s| s > self.max_file_size()) {
                return err(Errno::EFBIG);
            }
            let made_with = (inode.atime, inode.mtime, inode.flags);
            Fs::cancel_move(&mut inode.cold);
            if !inode.cold.is_cold() {
                self.hot_setattr(ino, made_with, set.size, set.atime, set.mtime)?;
            }
        } else if let Some(size) = set.size {
            let Data::File {
                slot,
                ref mut pages,
                ref mut alloc_end,
            } = inode.data
            else {
                return err(if inode.kind == Kind::Dir {
                    Errno::EISDIR
                } else {
                    Errno::EINVAL
                });
            };
            if size > MAX_FILE_SIZE {
                return err(Errno::EFBIG);
            }
            if size < inode.size || size < *alloc_end {
                // Freed at once, like tmpfs: the tail becomes holes (the
                // last page whole: past the old end it holds only zeros).
                let end = round_up((*alloc_end).max(inode.size));
                if end > size {
                    let delta = self.punch(&c, base(slot) + size, end - size);
                    *pages = pages.saturating_add_signed(delta);
                }
                *alloc_end = size;
            }
            if size != inode.size {
                inode.size = size;
                inode.touch_mc(now);
            }
        }
        if let Some(mode) = set.mode {
            inode.perm = (mode & 0o7777) as u16;
        }
        if let Some(uid) = set.uid {
            inode.uid = uid;
        }
        if let Some(gid) = set.gid {
            inode.gid = gid;
        }
        let resolve = |t: SetTime| match t {
            SetTime::At(t) => t,
            SetTime::Now => now,
        };
        if let Some(t) = set.atime {
            inode.atime = resolve(t);
        }
        if let Some(t) = set.mtime {
            inode.mtime = resolve(t);
        }
        inode.ctime = set.ctime.unwrap_or(now);
        Ok(self.hot_attr(inode, ino))
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

    pub fn readlink(&self, ino: Ino) -> Result<Vec<u8>> {
        let target = match &self.state.read().get(ino)?.data {
            Data::Symlink(t) => t.as_bytes().to_vec(),
            _ => return err(Errno::EINVAL),
        };
        self.accessed(ino);
        Ok(target)
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

    /// Creates a node of any kind but symlink. `mode` carries the type bits
    /// and permissions (already masked by the kernel's umask).
    pub fn mknod(
        &self,
        who: Caller,
        parent: Ino,
        name: &OsStr,
        mode: u32,
        rdev: u32,
    ) -> Result<Attr> {
        let _change = self.store.change();
        let kind = Kind::from_mode(mode).ok_or(Errno::EINVAL)?;
        if kind == Kind::Symlink {
            return err(Errno::EINVAL);
        }
        self.create_node(who, parent, Some(name), kind, mode, rdev, None)
    }

    pub fn mkdir(&self, who: Caller, parent: Ino, name: &OsStr, mode: u32) -> Result<Attr> {
        let _change = self.store.change();
        self.create_node(who, parent, Some(name), Kind::Dir, mode, 0, None)
    }

    pub fn symlink(&self, who: Caller, parent: Ino, name: &OsStr, target: &OsStr) -> Result<Attr> {
        let _change = self.store.change();
        if target.len() >= libc::PATH_MAX as usize {
            return err(Errno::ENAMETOOLONG);
        }
        self.create_node(
            who,
            parent,
            Some(name),
            Kind::Symlink,
            0o777,
            0,
            Some(target),
        )
    }

    /// Creates and opens a regular file.
    pub fn create(&self, who: Caller, parent: Ino, name: &OsStr, mode: u32) -> Result<Attr> {
        let _change = self.store.change();
        let attr = self.create_node(who, parent, Some(name), Kind::File, mode, 0, None)?;
        self.opened(self.state.write().get_mut(attr.ino)?);
        self.hot_changed(attr.ino);
        Ok(attr)
    }

    /// Creates and opens a regular file with no name in `parent`
    /// (O_TMPFILE): freed when closed unless a link names it first.
    pub fn tmpfile(&self, who: Caller, parent: Ino, mode: u32) -> Result<Attr> {
        let _change = self.store.change();
        let attr = self.create_node(who, parent, None, Kind::File, mode, 0, None)?;
        let mut st = self.state.write();
        self.opened(st.get_mut(attr.ino)?);
        st.linkable.insert(attr.ino);
        self.hot_changed(attr.ino);
        Ok(attr)
    }

    /// The caller holds the gate. Without a name (O_TMPFILE) the inode is
    /// made unlinked.
    #[allow(clippy::too_many_arguments)]
    fn create_node(
        &self,
        who: Caller,
        parent: Ino,
        name: Option<&OsStr>,
        kind: Kind,
        mode: u32,
        rdev: u32,
        target: Option<&OsStr>,
    ) -> Result<Attr> {
        if let Some(name) = name {
            check_name(name)?;
        }
        let now = now();
        let mut st = self.state.write();
        let p = match name {
            Some(name) => st.check_new_entry(parent, name)?,
            None => {
                let p = st.get(parent)?;
                p.entries()?;
                if p.nlink == 0 {
                    return err(Errno::ENOENT);
                }
                p
            }
        };
        p.check_mutable()?;
        if !st.room_for_inode(self.cfg.nr_inodes) {
            return err(Errno::ENOSPC);
        }
        // A default ACL replaces the umask (POSIX.1e, as posix_acl_create).
        let default_acl = p.xattrs.get(OsStr::new(ACL_DEFAULT)).cloned();
        let mut xattrs = BTreeMap::new();
        let mut mode = mode & 0o7777;
        match default_acl {
            Some(acl) if kind != Kind::Symlink => {
                if let Some(access) = acl::inherit(&acl, &mut mode) {
                    xattrs.insert(OsString::from(ACL_ACCESS), access);
                }
                if kind == Kind::Dir {
                    xattrs.insert(OsString::from(ACL_DEFAULT), acl);
                }
            }
            _ if kind != Kind::Symlink => mode &= !who.umask,
            _ => {}
        }
        // setgid directories hand their group, and to subdirectories the
        // setgid bit, down to what is created in them.
        let mut perm = mode as u16;
        let gid = if p.perm & libc::S_ISGID as u16 != 0 {
            if kind == Kind::Dir {
                perm |= libc::S_ISGID as u16;
            }
            p.gid
        } else {
            who.gid
        };
        let cost = INODE_COST
            + name.map_or(0, name_cost)
            + target.map_or(0, |t| t.len() as u64)
            + xattrs.iter().map(|(k, v)| xattr_cost(k, v)).sum::<u64>();
        self.store.charge(cost)?;
        let data = match kind {
            Kind::File => {
                let slot = match st.free_slots.pop() {
                    Some(s) => s,
                    None if st.next_slot < MAX_SLOTS => {
                        st.next_slot += 1;
                        st.next_slot - 1
                    }
                    None => {
                        self.store.uncharge(cost);
                        return err(Errno::ENOSPC);
                    }
                };
                Data::File {
                    slot,
                    pages: 0,
                    alloc_end: 0,
                }
            }
            Kind::Dir => Data::Dir {
                entries: Entries::new(),
                parent,
            },
            Kind::Symlink => Data::Symlink(target.expect("symlink target").to_owned()),
            _ => Data::Special,
        };
        let ino = Ino(st.next_ino);
        st.next_ino += 1;
        let mut inode = Inode::new(kind, perm, who.uid, gid, data, now);
        inode.rdev = rdev;
        inode.size = target.map_or(0, |t| t.len() as u64);
        inode.xattrs = xattrs;
        let Some(name) = name else {
            inode.nlink = 0;
            let attr = inode.attr(ino);
            st.inodes.insert(ino, inode);
            return Ok(attr);
        };
        let attr = inode.attr(ino);
        st.inodes.insert(ino, inode);
        let p = st.get_mut(parent)?;
        p.entries_mut()?.insert(name.to_owned(), ino);
        if kind == Kind::Dir {
            p.nlink += 1;
        }
        p.touch_mc(now);
        Ok(attr)
    }

    pub fn link(&self, ino: Ino, newparent: Ino, newname: &OsStr) -> Result<Attr> {
        let _change = self.store.change();
        check_name(newname)?;
        let now = now();
        let mut st = self.state.write();
        st.check_new_entry(newparent, newname)?.check_mutable()?;
        let inode = st.get(ino)?;
        inode.check_fixed()?;
        if inode.kind == Kind::Dir {
            return err(Errno::EPERM);
        }
        if inode.nlink == 0 && !st.linkable.contains(&ino) {
            return err(Errno::ENOENT);
        }
        if inode.nlink >= u32::MAX - 1 {
            return err(Errno::EMLINK);
        }
        self.store.charge(name_cost(newname))?;
        let np = st.get_mut(newparent)?;
        np.entries_mut()?.insert(newname.to_owned(), ino);
        np.touch_mc(now);
        st.linkable.remove(&ino);
        let inode = st.get_mut(ino)?;
        inode.nlink += 1;
        inode.lookups += 1;
        inode.ctime = now;
        Ok(self.hot_attr(inode, ino))
    }

    pub fn unlink(&self, parent: Ino, name: &OsStr) -> Result<()> {
        let c = self.store.change();
        let mut st = self.state.write();
        let ino = st.child(parent, name)?;
        // EPERM before the kind, as the VFS's may_delete.
        st.get(parent)?.check_fixed()?;
        st.get(ino)?.check_fixed()?;
        if st.get(ino)?.kind == Kind::Dir {
            return err(Errno::EISDIR);
        }
        self.remove_entry(&c, &mut st, parent, name, ino);
        Ok(())
    }

    pub fn rmdir(&self, parent: Ino, name: &OsStr) -> Result<()> {
        let c = self.store.change();
        if name == "." {
            return err(Errno::EINVAL);
        }
        if name == ".." {
            return err(Errno::ENOTEMPTY);
        }
        let mut st = self.state.write();
        let ino = st.child(parent, name)?;
        // The VFS's may_delete checks the parent's and the victim's
        // immutable and append-only flags (EPERM) before the kind, and
        // the filesystem's emptiness (ENOTEMPTY) comes after both.
        st.get(parent)?.check_fixed()?;
        let d = st.get(ino)?;
        d.check_fixed()?;
        if !d.entries()?.is_empty() {
            return err(Errno::ENOTEMPTY);
        }
        self.remove_entry(&c, &mut st, parent, name, ino);
        Ok(())
    }

    /// Drops the entry `name` → `ino` from `parent`, with link counts, times
    /// and memory.
    fn remove_entry(&self, c: &Change<'_>, st: &mut State, parent: Ino, name: &OsStr, ino: Ino) {
        let now = now();
        let p = st.inodes.get_mut(&parent).expect("parent exists");
        p.entries_mut().expect("parent is a dir").remove(name);
        p.touch_mc(now);
        let inode = st.inodes.get_mut(&ino).expect("child exists");
        inode.ctime = now;
        if inode.kind == Kind::Dir {
            inode.nlink = 0;
            st.inodes.get_mut(&parent).expect("parent").nlink -= 1;
        } else {
            inode.nlink -= 1;
        }
        self.store.uncharge(name_cost(name));
        self.maybe_free(c, st, ino);
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

    /// renameat2(2) by `who`. RENAME_WHITEOUT leaves a whiteout (a
    /// character device 0:0, mode 0, `who`'s) at the old name, as tmpfs
    /// does for overlayfs; the kernel has checked CAP_MKNOD.
    pub fn rename(
        &self,
        who: Caller,
        parent: Ino,
        name: &OsStr,
        newparent: Ino,
        newname: &OsStr,
        flags: u32,
    ) -> Result<()> {
        const NOREPLACE: u32 = libc::RENAME_NOREPLACE;
        const EXCHANGE: u32 = libc::RENAME_EXCHANGE;
        const WHITEOUT: u32 = libc::RENAME_WHITEOUT;
        let c = self.store.change();
        if flags & !(NOREPLACE | EXCHANGE | WHITEOUT) != 0
            || flags & EXCHANGE != 0 && flags & (NOREPLACE | WHITEOUT) != 0
        {
            return err(Errno::EINVAL);
        }
        check_name(newname)?;
        let now = now();
        let mut st = self.state.write();
        let src = st.child(parent, name)?;
        let dst = match st.child(newparent, newname) {
            Ok(d) => Some(d),
            Err(Errno::ENOENT) => None,
            Err(e) => return Err(e),
        };
        if st.get(newparent)?.nlink == 0 {
            return err(Errno::ENOENT);
        }
        st.get(src)?.check_fixed()?;
        st.get(parent)?.check_fixed()?;
        st.get(newparent)?.check_mutable()?;
        if let Some(dst) = dst {
            st.get(dst)?.check_fixed()?;
            // An entry replaced or exchanged leaves the new parent.
            st.get(newparent)?.check_fixed()?;
        }
        let src_dir = st.get(src)?.kind == Kind::Dir;
        // Moving a directory below itself is refused by the VFS already;
        // checked again because a loop would orphan a subtree.
        if src_dir && parent != newparent && self.is_ancestor(&st, src, newparent) {
            return err(Errno::EINVAL);
        }
        if flags & EXCHANGE != 0 {
            let dst = dst.ok_or(Errno::ENOENT)?;
            let dst_dir = st.get(dst)?.kind == Kind::Dir;
            if dst_dir && parent != newparent && self.is_ancestor(&st, dst, parent) {
                return err(Errno::EINVAL);
            }
            st.get_mut(parent)?
                .entries_mut()?
                .insert(name.to_owned(), dst);
            st.get_mut(newparent)?
                .entries_mut()?
                .insert(newname.to_owned(), src);
            if parent != newparent {
                self.reparent(&mut st, src, parent, newparent);
                self.reparent(&mut st, dst, newparent, parent);
            }
            for ino in [src, dst] {
                st.get_mut(ino)?.ctime = now;
            }
            for p in [parent, newparent] {
                st.get_mut(p)?.touch_mc(now);
            }
            return Ok(());
        }
        if let Some(dst) = dst {
            if flags & NOREPLACE != 0 {
                return err(Errno::EEXIST);
            }
            if dst == src {
                // Two names of one inode: POSIX says do nothing.
                return Ok(());
            }
            let d = st.get(dst)?;
            match (src_dir, d.kind == Kind::Dir) {
                (true, false) => return err(Errno::ENOTDIR),
                (false, true) => return err(Errno::EISDIR),
                (true, true) if !d.entries()?.is_empty() => return err(Errno::ENOTEMPTY),
                _ => {}
            }
        }
        // Nothing may fail after the replaced entry is gone: charge first.
        let whiteout_cost = INODE_COST + name_cost(name);
        if flags & WHITEOUT != 0 {
            if !st.room_for_inode(self.cfg.nr_inodes) {
                return err(Errno::ENOSPC);
            }
            self.store.charge(whiteout_cost)?;
        }
        if let Err(e) = self.store.charge(name_cost(newname)) {
            if flags & WHITEOUT != 0 {
                self.store.uncharge(whiteout_cost);
            }
            return Err(e.into());
        }
        if let Some(dst) = dst {
            self.remove_entry(&c, &mut st, newparent, newname, dst);
        }
        st.get_mut(parent)?.entries_mut()?.remove(name);
        self.store.uncharge(name_cost(name));
        st.get_mut(newparent)?
            .entries_mut()?
            .insert(newname.to_owned(), src);
        if parent != newparent {
            self.reparent(&mut st, src, parent, newparent);
        }
        st.get_mut(src)?.ctime = now;
        for p in [parent, newparent] {
            st.get_mut(p)?.touch_mc(now);
        }
        if flags & WHITEOUT != 0 {
            let ino = Ino(st.next_ino);
            st.next_ino += 1;
            let mut w = Inode::new(Kind::CharDev, 0, who.uid, who.gid, Data::Special, now);
            // No reply announces it: the kernel looks it up when it wants it.
            w.lookups = 0;
            st.inodes.insert(ino, w);
            st.get_mut(parent)?
                .entries_mut()?
                .insert(name.to_owned(), ino);
        }
        Ok(())
    }

    /// Fixes ".." and the parents' link counts when a directory moves.
    fn reparent(&self, st: &mut State, ino: Ino, from: Ino, to: Ino) {
        let Some(Inode {
            data: Data::Dir { parent, .. },
            ..
        }) = st.inodes.get_mut(&ino)
        else {
            return;
        };
        *parent = to;
        st.inodes.get_mut(&from).expect("old parent").nlink -= 1;
        st.inodes.get_mut(&to).expect("new parent").nlink += 1;
    }

    /// Whether `a` is `b` or one of its ancestors.
    fn is_ancestor(&self, st: &State, a: Ino, mut b: Ino) -> bool {
        loop {
            if a == b {
                return true;
            }
            match st.inodes.get(&b).map(|i| &i.data) {
                Some(Data::Dir { parent, .. }) if *parent != b => b = *parent,
                _ => return false,
            }
        }
    }

    /// Opens a non-directory with open(2)'s `flags`.
    pub fn open(&self, ino: Ino, flags: i32) -> Result<()> {
        // A cold file moves back first; the open then holds it hot.
        let _pin = self.hot_pin(ino)?;
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        if inode.kind == Kind::Dir {
            return err(Errno::EISDIR);
        }
        let writing = flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0;
        if writing {
            inode.check_mutable()?;
            if inode.flags & FL_APPEND != 0
                && (flags & libc::O_APPEND == 0 || flags & libc::O_TRUNC != 0)
            {
                return err(Errno::EPERM);
            }
            self.hot_changed(ino);
        }
        self.opened(inode);
        Ok(())
    }

    /// Takes the gate: the last close of an unlinked file frees its data.
    pub fn release(&self, ino: Ino) {
        let c = self.store.change();
        let mut st = self.state.write();
        if let Some(inode) = st.inodes.get_mut(&ino) {
            inode.opens = inode.opens.saturating_sub(1);
            if inode.opens == 0 {
                if inode.kind == Kind::File {
                    self.went_idle(ino, &mut inode.cold);
                }
                // Closed unlinked: no link can name it any more.
                st.linkable.remove(&ino);
            }
        }
        self.maybe_free(&c, &mut st, ino);
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

    /// Where regular file `ino`'s data starts in the store (its slot's
    /// first byte): for tools that map store ranges back to files, such as
    /// `ramd image salvage` naming the files a damaged page belongs to.
    pub fn data_offset(&self, ino: Ino) -> Result<u64> {
        Ok(self.file(ino)?.0)
    }

    /// Reads up to `buf.len()` bytes at `off`; returns how many (short at EOF).
    pub fn read(&self, ino: Ino, off: u64, buf: &mut [u8]) -> Result<usize> {
        // A standby: the size and the data from one save (an apply waits).
        let standby = self.store.standby_hold();
        let (base, size, _) = self.file(ino)?;
        if self.hot.get().is_some() {
            let _pin = self.hot_pin(ino)?;
            return self.hot_read(ino, off, buf);
        }
        if off >= size {
            return Ok(0);
        }
        let n = (size - off).min(buf.len() as u64) as usize;
        self.store.read_held(&standby, base + off, &mut buf[..n])?;
        drop(standby);
        self.accessed(ino);
        Ok(n)
    }

    /// Writes `data` at `off`. When the disk fills part way, a write that
    /// allows it (`short_ok`) stores what fits and returns that count, as
    /// POSIX and tmpfs do; otherwise (the kernel flushing its page cache,
    /// which would take a short count as success) it fails whole. With
    /// setuid, setgid and capabilities go as [`Fs::drop_privileges`] says
    /// (`kernel_kill`: the kernel flagged the writer as lacking CAP_FSETID).
    /// The caller holds `c` ([`Fs::change`]) over the whole request.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        c: &Change<'_>,
        ino: Ino,
        off: u64,
        data: &[u8],
        short_ok: bool,
        who: Caller,
        kernel_kill: bool,
    ) -> Result<usize> {
        let (base, size, flags) = self.file(ino)?;
        // Append-only: a program's write lands at the end (O_APPEND was
        // required to open); the kernel's write-back may rewrite a page.
        if flags & FL_IMMUTABLE != 0 || (flags & FL_APPEND != 0 && short_ok && off < size) {
            return err(Errno::EPERM);
        }
        let end = off
            .checked_add(data.len() as u64)
            .filter(|&e| e <= self.max_file_size() + 1)
            .ok_or(Errno::EFBIG)?;
        if self.hot.get().is_some() {
            let n = {
                let _pin = self.hot_pin(ino)?;
                self.hot_write(ino, off, data)?
            };
            let killed = {
                let mut st = self.state.write();
                let why = if kernel_kill {
                    Kill::KernelSays
                } else {
                    Kill::Modify
                };
                self.drop_privileges(st.get_mut(ino)?, who, why)
            };
            if killed {
                self.attr_changed(ino);
            }
            return Ok(n);
        }
        // A write past EOF that fails takes back what it put past EOF
        // (below), reading EOF after its copy. Two such writes to one file
        // at once would race: the failing one could take back bytes the
        // other has copied but not yet counted in the size. So writes past
        // EOF of one file go one at a time; writes inside it never take
        // anything back.
        let _extending =
            (end > size).then(|| self.extending[(ino.0 % EXTEND_LOCKS as u64) as usize].lock());
        let mut delta = 0;
        let (done, r) = c.write_prefix(base + off, data, &mut delta);
        let (end, r) = match r {
            Err(_) if short_ok && done > 0 => (off + done as u64, Ok(())),
            r => (end, r),
        };
        let now = now();
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        let size = inode.size;
        if let Data::File {
            ref mut pages,
            ref mut alloc_end,
            ..
        } = inode.data
        {
            // Even a failed write may have filled pages up to `end`: they
            // must be counted and freed with the file.
            *alloc_end = (*alloc_end).max(end);
            if r.is_err() && end > size {
                // What landed past EOF must not show if the file grows later.
                let from = off.max(size);
                delta += self.punch(c, base + from, end - from);
            }
            *pages = pages.saturating_add_signed(delta);
        }
        if let Err(e) = r {
            let e = Errno::from(e);
            // The kernel's write-back hit a full disk: see `Fs::write_allowed`.
            let full = !short_ok && e == Errno::ENOSPC;
            inode.cache.full |= full;
            drop(st);
            if full {
                self.attr_changed(ino);
            }
            return Err(e);
        }
        let why = if kernel_kill {
            Kill::KernelSays
        } else {
            Kill::Modify
        };
        let killed = self.drop_privileges(inode, who, why);
        inode.size = inode.size.max(end);
        // Under the write-back cache the kernel keeps a file's mtime and
        // ctime and sends them itself (SETATTR); its write-back may come
        // later than that, and must not move them past what it sent.
        if short_ok || !self.kernel_times.load(Relaxed) {
            inode.touch_mc(now);
        }
        drop(st);
        if killed {
            self.attr_changed(ino);
        }
        Ok((end - off) as usize)
    }

    /// fallocate(2) for `who`: like a write, it drops privilege bits.
    pub fn fallocate(&self, who: Caller, ino: Ino, off: u64, len: u64, mode: i32) -> Result<()> {
        const KEEP_SIZE: i32 = libc::FALLOC_FL_KEEP_SIZE;
        const PUNCH: i32 = libc::FALLOC_FL_PUNCH_HOLE;
        const ZERO: i32 = libc::FALLOC_FL_ZERO_RANGE;
        let c = self.store.change();
        if mode & !(KEEP_SIZE | PUNCH | ZERO) != 0 || (mode & PUNCH != 0 && mode & ZERO != 0) {
            return err(Errno::EOPNOTSUPP);
        }
        if mode & PUNCH != 0 && mode & KEEP_SIZE == 0 {
            return err(Errno::EOPNOTSUPP);
        }
        let (base, size, flags) = self.file(ino)?;
        if flags & FL_IMMUTABLE != 0 || (flags & FL_APPEND != 0 && mode & !KEEP_SIZE != 0) {
            return err(Errno::EPERM);
        }
        let end = off
            .checked_add(len)
            .filter(|&e| e <= self.max_file_size() + 1)
            .ok_or(Errno::EFBIG)?;
        if len == 0 {
            return err(Errno::EINVAL);
        }
        if self.hot.get().is_some() {
            {
                let _pin = self.hot_pin(ino)?;
                self.hot_fallocate(ino, off, len, mode)?;
            }
            let killed = {
                let mut st = self.state.write();
                self.drop_privileges(st.get_mut(ino)?, who, Kill::Modify)
            };
            if killed {
                self.attr_changed(ino);
            }
            return Ok(());
        }
        let mut delta = 0;
        let r = if mode & PUNCH != 0 {
            // Only what lies inside the file is punched.
            let end = end.min(size);
            if end > off {
                c.zero_counted(base + off, end - off, true, &mut delta)
            } else {
                Ok(())
            }
        } else if mode & ZERO != 0 {
            c.zero_counted(base + off, len, false, &mut delta)
        } else {
            c.allocate(base + off, len, &mut delta)
        };
        let now = now();
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        if let Data::File {
            ref mut pages,
            ref mut alloc_end,
            ..
        } = inode.data
        {
            *pages = pages.saturating_add_signed(delta);
            // Zeroing may have allocated part of the range before failing;
            // (allocate gives back its own on failure).
            if mode & PUNCH == 0 {
                *alloc_end = (*alloc_end).max(end);
            }
        }
        r?;
        if mode & KEEP_SIZE == 0 && end > inode.size {
            inode.size = end;
            inode.touch_mc(now);
        } else if mode & (PUNCH | ZERO) != 0 {
            inode.touch_mc(now);
        }
        let killed = self.drop_privileges(inode, who, Kill::Modify);
        drop(st);
        if killed {
            self.attr_changed(ino);
        }
        Ok(())
    }

    /// SEEK_DATA / SEEK_HOLE. Written or allocated pages are data, holes
    /// are holes; the end of the file is a hole.
    pub fn seek(&self, ino: Ino, off: u64, whence: Whence) -> Result<u64> {
        // A standby: the size and the extents from one save.
        let standby = self.store.standby_hold();
        let (base, size, _) = self.file(ino)?;
        if self.hot.get().is_some() {
            let _pin = self.hot_pin(ino)?;
            return self.hot_seek(ino, off, whence);
        }
        if off >= size {
            return err(Errno::ENXIO);
        }
        let mut pos = off;
        while pos < size {
            // Extents are asked for in pieces so one call stays bounded.
            let len = (size - pos).min(1 << 30);
            for e in self.store.extents_held(&standby, base + pos, len, 4096)? {
                let hole = e.kind == ExtentKind::Hole;
                if hole == (whence == Whence::Hole) {
                    return Ok(pos);
                }
                pos += e.length;
            }
        }
        match whence {
            Whence::Hole => Ok(size),
            Whence::Data => err(Errno::ENXIO),
        }
    }

    /// Copies file data within the store; returns bytes copied.
    pub fn copy_range(
        &self,
        who: Caller,
        ino_in: Ino,
        off_in: u64,
        ino_out: Ino,
        off_out: u64,
        len: u64,
    ) -> Result<u64> {
        let c = self.store.change();
        let (_, size_in, _) = self.file(ino_in)?;
        if ino_in == ino_out && off_in < off_out + len && off_out < off_in + len {
            return err(Errno::EINVAL);
        }
        if self.hot.get().is_some() {
            let (_, _, flags) = self.file(ino_out)?;
            if flags & (FL_IMMUTABLE | FL_APPEND) != 0 {
                return err(Errno::EPERM);
            }
            let n = {
                let _pins = (self.hot_pin(ino_in)?, self.hot_pin(ino_out)?);
                self.hot_copy(ino_in, off_in, ino_out, off_out, len)?
            };
            let killed = {
                let mut st = self.state.write();
                self.drop_privileges(st.get_mut(ino_out)?, who, Kill::Modify)
            };
            if killed {
                self.attr_changed(ino_out);
            }
            return Ok(n);
        }
        let len = len.min(size_in.saturating_sub(off_in));
        let mut buf = vec![0; len.min(1 << 20) as usize];
        let mut done = 0;
        while done < len {
            let n = (len - done).min(buf.len() as u64) as usize;
            let got = self.read(ino_in, off_in + done, &mut buf[..n])?;
            if got == 0 {
                break;
            }
            let put = self.write(&c, ino_out, off_out + done, &buf[..got], true, who, false)?;
            done += put as u64;
            if put < got {
                break;
            }
        }
        Ok(done)
    }

    /// OPENDIR: `ino` must be a directory. Nothing is kept per open: a
    /// listing goes on from its offset alone (see `fs/dir.rs`).
    pub fn opendir(&self, ino: Ino) -> Result<()> {
        self.state.read().get(ino)?.entries()?;
        Ok(())
    }

    /// Up to `max` entries of directory `ino` after `offset` (0, or the
    /// cookie of the last entry a listing returned), with their cookies:
    /// ".", "..", then the names in the order they were added. Reading
    /// from the start counts as an access of the directory.
    pub fn read_dir(&self, ino: Ino, offset: u64, max: usize) -> Result<Vec<(u64, DirEntry)>> {
        let list = {
            let st = self.state.read();
            let d = st.get(ino)?;
            let Data::Dir { entries, parent } = &d.data else {
                return err(Errno::ENOTDIR);
            };
            if offset == 0 {
                entries.set_listed();
            }
            let dots = [(1, ".", ino), (2, "..", *parent)];
            let dots = dots
                .into_iter()
                .filter(|&(c, ..)| c > offset)
                .map(|(c, n, i)| {
                    let e = DirEntry {
                        ino: i,
                        kind: Kind::Dir,
                        name: n.into(),
                    };
                    (c, e)
                });
            let named = entries.after(offset).map(|(c, name, child)| {
                let kind = st.inodes.get(&child).map_or(Kind::File, |i| i.kind);
                let e = DirEntry {
                    ino: child,
                    kind,
                    name: name.clone(),
                };
                (c, e)
            });
            dots.chain(named).take(max).collect()
        };
        if offset == 0 {
            self.accessed(ino);
        }
        Ok(list)
    }

    /// Whether directory `ino` was listed from the start since the last
    /// call said so (false for anything else).
    pub fn take_listed(&self, ino: Ino) -> bool {
        self.state
            .read()
            .get(ino)
            .and_then(|i| i.entries())
            .is_ok_and(|e| e.take_listed())
    }

    /// Every entry of directory `ino`, "." and ".." first, as
    /// [`Fs::read_dir`] lists them.
    pub fn list_dir(&self, ino: Ino) -> Result<Vec<DirEntry>> {
        let list = self.read_dir(ino, 0, usize::MAX)?;
        Ok(list.into_iter().map(|(_, e)| e).collect())
    }

    /// The chattr flags (FS_IOC_GETFLAGS).
    pub fn flags(&self, ino: Ino) -> Result<u32> {
        Ok(self.state.read().get(ino)?.flags)
    }

    /// FS_IOC_SETFLAGS: only the flags tmpfs keeps (EOPNOTSUPP otherwise,
    /// as tmpfs). The kernel has checked ownership and CAP_LINUX_IMMUTABLE.
    pub fn set_flags(&self, ino: Ino, flags: u32) -> Result<()> {
        let _change = self.store.change();
        // A standby's tree is its writer's (see `fuse.rs`'s `changes`).
        if self.store.standby() {
            return err(Errno::EROFS);
        }
        if flags & !FL_SUPPORTED != 0 {
            return err(Errno::EOPNOTSUPP);
        }
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        if inode.kind == Kind::File && (inode.flags ^ flags) & FL_NOATIME != 0 {
            self.hot_noatime(ino, flags & FL_NOATIME != 0)?;
        }
        inode.flags = flags;
        inode.ctime = now();
        drop(st);
        // The kernel does not know an ioctl moved ctime.
        self.attr_changed(ino);
        Ok(())
    }

    /// For readdirplus: the attributes of an entry, counting a lookup.
    pub fn lookup_ino(&self, ino: Ino) -> Result<Attr> {
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        inode.lookups += 1;
        Ok(self.hot_attr(inode, ino))
    }

    /// (total blocks, free blocks, total inodes, free inodes), 4 KiB blocks.
    pub fn statfs(&self) -> (u64, u64, u64, u64) {
        let (used, limit) = self.pages_used();
        let total = match self.size() {
            Some(_) => limit,
            // ramfs mode: what is used plus what the host could still give.
            None => used + ramd_store::mem_available().unwrap_or(0) / PAGE_SIZE as u64,
        };
        let inodes = self.state.read().inodes.len() as u64;
        (
            total,
            total.saturating_sub(used),
            self.cfg.nr_inodes,
            self.cfg.nr_inodes.saturating_sub(inodes),
        )
    }

    /// Sets an xattr. An access ACL also sets the mode's permission bits,
    /// and drops setgid when the kernel says its caller may not keep it
    /// (`kill_sgid`: outside the file's group, without CAP_FSETID), as
    /// posix_acl_update_mode does.
    pub fn setxattr(
        &self,
        ino: Ino,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        kill_sgid: bool,
    ) -> Result<()> {
        let _change = self.store.change();
        check_xattr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return err(Errno::E2BIG);
        }
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        inode.check_fixed()?;
        if name == ACL_ACCESS {
            // The mode follows an access ACL, and one that says no more
            // than the mode is not kept (the kernel leaves both to us).
            let (mode, extended) = acl::mode_of(value).ok_or(Errno::EINVAL)?;
            inode.perm = (inode.perm & !0o777) | mode as u16;
            if kill_sgid {
                inode.perm &= !(libc::S_ISGID as u16);
            }
            inode.ctime = now();
            if !extended {
                if let Some(v) = inode.xattrs.remove(name) {
                    self.store.uncharge(xattr_cost(name, &v));
                }
                return Ok(());
            }
        }
        let old = inode.xattrs.get(name);
        if flags & libc::XATTR_CREATE != 0 && old.is_some() {
            return err(Errno::EEXIST);
        }
        if flags & libc::XATTR_REPLACE != 0 && old.is_none() {
            return err(Errno::ENODATA);
        }
        let new_cost = xattr_cost(name, value);
        let old_cost = old.map_or(0, |v| xattr_cost(name, v));
        if new_cost > old_cost {
            self.store.charge(new_cost - old_cost)?;
        } else {
            self.store.uncharge(old_cost - new_cost);
        }
        inode.xattrs.insert(name.to_owned(), value.to_vec());
        inode.ctime = now();
        Ok(())
    }

    pub fn getxattr(&self, ino: Ino, name: &OsStr) -> Result<Vec<u8>> {
        check_xattr_name(name)?;
        let st = self.state.read();
        st.get(ino)?.xattrs.get(name).cloned().ok_or(Errno::ENODATA)
    }

    /// All names, each followed by a NUL, as listxattr(2) returns them.
    pub fn listxattr(&self, ino: Ino) -> Result<Vec<u8>> {
        let st = self.state.read();
        let mut out = Vec::new();
        for name in st.get(ino)?.xattrs.keys() {
            out.extend_from_slice(name.as_bytes());
            out.push(0);
        }
        Ok(out)
    }

    pub fn removexattr(&self, ino: Ino, name: &OsStr) -> Result<()> {
        let _change = self.store.change();
        check_xattr_name(name)?;
        let mut st = self.state.write();
        let inode = st.get_mut(ino)?;
        inode.check_fixed()?;
        let v = inode.xattrs.remove(name).ok_or(Errno::ENODATA)?;
        self.store.uncharge(xattr_cost(name, &v));
        inode.ctime = now();
        Ok(())
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

fn xattr_cost(name: &OsStr, value: &[u8]) -> u64 {
    DIRENT_COST + name.len() as u64 + value.len() as u64
}

/// Where POSIX ACLs live (the kernel reads and checks them itself).
const ACL_ACCESS: &str = "system.posix_acl_access";
const ACL_DEFAULT: &str = "system.posix_acl_default";

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
