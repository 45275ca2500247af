//! FUSE adapter: decodes the kernel's requests ([`crate::ll`]) into [`Fs`]
//! calls and encodes their replies. No filesystem logic lives here.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Instant, SystemTime};

use ramd_store::metrics::{IoMetrics, Op};

use crate::fs::{
    split_time, AtimeMode, Attr, Caller, Errno, Fs, Ino, Inval, Kind, OpenCache, SetAttr, SetTime,
    Whence, NAME_MAX,
};
use crate::ll::abi::{self, fattr, init, op, Rd, Wr};
use crate::ll::dev::{InitWant, Negotiated};
use crate::ll::notify::Notifier;
use crate::ll::{Dispatch, Reply, Request};

// Where they were before they moved to the transport, for callers outside.
pub use crate::ll::mountinfo::{
    is_mount_point, mount_device, mount_points_of, mount_read_only, mount_type_at,
    remount_read_write,
};

/// How long the kernel may trust names (also a name's absence) and
/// attributes it was given, in seconds. The kernel is the only writer: it
/// updates or invalidates what its own requests change, and `Fs`
/// invalidates what it changes on its own (`on_attr_change`: privilege
/// bits dropped, chattr's ctime, a failed write-back); atime is the
/// kernel's to reread after a read. So the dcache answers repeated lookups
/// and stats as on tmpfs. Finite, an hour, so a change we failed to
/// announce would not stay wrong for the mount's life.
const TTL: u64 = 3600;
/// The generation of every inode: inode numbers are never reused (not
/// across a save and load either), so the number alone names one inode for
/// its life, which file handles need; 1 rather than 0, which reads as unset.
const GENERATION: u64 = 1;
/// Largest write the kernel may send in one request.
const MAX_WRITE: u32 = 1 << 20;
/// Pages per request: MAX_WRITE's worth.
const MAX_PAGES: u16 = (MAX_WRITE / 4096) as u16;

/// Makes everything written so far durable; an errno if it could not.
pub type SyncFn = Arc<dyn Fn() -> std::result::Result<(), Errno> + Send + Sync>;

/// Options of the FUSE session beyond the filesystem's own.
#[derive(Clone, Default)]
pub struct FuseOptions {
    /// Let the kernel cache writes and send them in large batches.
    pub writeback_cache: bool,
    /// What fsync and fsyncdir wait for (a save, with `--flush persist`);
    /// `None`: they are not sent at all (see `fsync`).
    pub sync: Option<SyncFn>,
    /// Where the data requests (read, write, fsync, fallocate, lseek,
    /// copy_file_range) are timed and counted.
    pub metrics: Option<Arc<IoMetrics>>,
    /// Ask the kernel for FUSE over io_uring (granted only where the fuse
    /// module's `enable_uring` is Y); see [`crate::ll::dev::Negotiated`].
    pub io_uring: bool,
    /// Ask for FUSE_PASSTHROUGH: regular files are opened on their backing
    /// files in the filesystem's hot tier (`--data-path kernel`); the
    /// kernel refuses it together with the write-back cache, which is
    /// then not asked for.
    pub passthrough: bool,
}

impl std::fmt::Debug for FuseOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FuseOptions")
            .field("writeback_cache", &self.writeback_cache)
            .field("sync", &self.sync.is_some())
            .field("metrics", &self.metrics.is_some())
            .field("io_uring", &self.io_uring)
            .field("passthrough", &self.passthrough)
            .finish()
    }
}

pub struct FuseFs {
    fs: Arc<Fs>,
    opts: FuseOptions,
    /// The session's notifier, once the session exists ([`crate::mount`]).
    notifier: Arc<OnceLock<Notifier>>,
    /// The ioctl commands already logged as unsupported (each once).
    unknown_ioctls: Mutex<HashSet<u32>>,
    /// INIT granted FUSE_SETXATTR_EXT: SETXATTR's argument is the longer one.
    setxattr_ext: AtomicBool,
    /// The kernel offered FUSE_NO_OPENDIR_SUPPORT: OPENDIR is answered
    /// ENOSYS, after which the kernel sends no OPENDIR or RELEASEDIR.
    no_opendir: AtomicBool,
    /// OPENDIR was answered ENOSYS: the kernel keeps directory listings.
    listings_cached: AtomicBool,
    /// Backing files registered for passthrough opens (FUSE_PASSTHROUGH).
    backings: Backings,
    /// Answers seeks that wait for the kernel's write-back.
    seeker: Seeker,
    /// Seeks waiting for the kernel's write-back in place (io_uring).
    in_place_seeks: std::sync::atomic::AtomicUsize,
}

/// The backing ids of open regular files. The kernel refuses a
/// passthrough open that names another backing file than the inode's
/// open ones already use (`fuse_inode_uncached_io_start`: EBUSY), so an
/// inode keeps one id while any open of it exists: registered at its
/// first open, closed at its last release.
#[derive(Default)]
struct Backings {
    /// The mount's /dev/fuse fd, once mounted.
    dev: OnceLock<Arc<std::os::fd::OwnedFd>>,
    /// INIT granted FUSE_PASSTHROUGH.
    granted: AtomicBool,
    /// Inode → its backing id and the opens answered with it.
    ids: Mutex<std::collections::HashMap<Ino, Backed>>,
}

/// A regular file's backing id and its opens (see [`Backings`]).
#[derive(Debug, Clone, Copy)]
struct Backed {
    id: i32,
    /// Opens answered with `id`, not yet released.
    opens: u32,
    /// Of those, opened O_RDWR: only such an open can map the file shared
    /// and writable, and so change its blocks and times without a request
    /// here (mmap of an O_WRONLY fd is refused, and an O_RDONLY one cannot
    /// be made writable).
    read_write: u32,
}

/// Whether an open with these flags could map the file shared and writable.
fn read_write(flags: u32) -> bool {
    flags as i32 & libc::O_ACCMODE == libc::O_RDWR
}

/// An answer: the payload's length in the reply buffer, or an errno.
type Answer = std::result::Result<usize, Errno>;

impl FuseFs {
    pub fn new(fs: Arc<Fs>, opts: FuseOptions) -> FuseFs {
        let notifier = Arc::new(OnceLock::<Notifier>::new());
        let n = notifier.clone();
        // Attributes only (a negative offset): the kernel rereads them.
        fs.on_attr_change(Box::new(move |ino| {
            if let Some(n) = n.get() {
                if let Err(e) = n.inval_inode(ino.0, -1, 0) {
                    log::warn!("invalidating the kernel's attributes of inode {ino}: {e}");
                }
            }
        }));
        // A standby's applied saves: names first, then inodes, whose
        // cached pages go too (offset 0, length 0: to the end).
        let n = notifier.clone();
        fs.on_tree_change(Box::new(move |stale| {
            let Some(n) = n.get() else { return };
            let mut inodes = Vec::new();
            for s in stale {
                match s {
                    Inval::Entry(parent, name) => {
                        if let Err(e) = n.inval_entry(parent.0, name.as_bytes()) {
                            log::warn!(
                                "invalidating the kernel's entry {name:?} in inode {parent}: {e}"
                            );
                        }
                    }
                    Inval::Inode(ino) => inodes.push(*ino),
                }
            }
            for ino in inodes {
                if let Err(e) = n.inval_inode(ino.0, 0, 0) {
                    log::warn!("invalidating the kernel's copy of inode {ino}: {e}");
                }
            }
        }));
        FuseFs {
            fs,
            opts,
            notifier,
            unknown_ioctls: Mutex::new(HashSet::new()),
            setxattr_ext: AtomicBool::new(false),
            no_opendir: AtomicBool::new(false),
            listings_cached: AtomicBool::new(false),
            backings: Backings::default(),
            seeker: Seeker::default(),
            in_place_seeks: Default::default(),
        }
    }

    /// Where [`crate::mount`] puts the mount's /dev/fuse fd.
    pub(crate) fn set_dev(&self, fd: Arc<std::os::fd::OwnedFd>) {
        let _ = self.backings.dev.set(fd);
    }

    /// Whether INIT granted FUSE_PASSTHROUGH.
    pub fn passthrough(&self) -> bool {
        self.backings.granted.load(Relaxed)
    }

    /// The open flags and backing id for an open of `ino` just counted in
    /// `Fs`: with passthrough, a regular file's backing file (registered
    /// at its first open, see [`Backings`]); otherwise the page-cache mode
    /// `Fs` says, no backing.
    /// `created`: the open of a CREATE, whose inode has no backing file yet.
    fn open_reply(
        &self,
        ino: Ino,
        flags: u32,
        created: bool,
    ) -> std::result::Result<(u32, i32), Errno> {
        if !self.passthrough() || self.fs.hot_tier().is_none() {
            return Ok((open_flags(&self.fs, ino), 0));
        }
        let rw = u32::from(read_write(flags));
        let mut ids = self.backings.ids.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(b) = ids.get_mut(&ino) {
            b.opens += 1;
            b.read_write += rw;
            return Ok((abi::FOPEN_PASSTHROUGH, b.id));
        }
        let dev = self.backings.dev.get().ok_or(Errno::EIO)?;
        let file = if created {
            self.fs.new_backing_file(ino)
        } else {
            self.fs.backing_file(ino)
        };
        let file = file?;
        let id = backing_open(dev, &file).map_err(|e| {
            log::warn!("registering inode {ino}'s backing file: {e}");
            e.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
        })?;
        // The kernel holds its own reference: ours may go now.
        drop(file);
        ids.insert(
            ino,
            Backed {
                id,
                opens: 1,
                read_write: rw,
            },
        );
        Ok((abi::FOPEN_PASSTHROUGH, id))
    }

    /// A RELEASE of `ino` by an open with `flags`: its last drops the
    /// backing id.
    fn released(&self, ino: Ino, flags: u32) {
        if !self.passthrough() {
            return;
        }
        let mut ids = self.backings.ids.lock().unwrap_or_else(|p| p.into_inner());
        let Some(b) = ids.get_mut(&ino) else {
            return;
        };
        b.opens -= 1;
        if read_write(flags) {
            b.read_write = b.read_write.saturating_sub(1);
        }
        if b.opens > 0 {
            return;
        }
        let id = b.id;
        ids.remove(&ino);
        if let Some(dev) = self.backings.dev.get() {
            if let Err(e) = backing_close(dev, id) {
                log::warn!("closing backing id {id} of inode {ino}: {e}");
            }
        }
    }

    /// How long the kernel may keep an inode's attributes. A regular
    /// file's on the hot tier (`--data-path kernel`) not at all while an
    /// open of it could map it shared and writable (O_RDWR): a write
    /// through such a mapping changes the backing file's blocks and times
    /// without a request here. Other opens change nothing behind ramd's
    /// back that the kernel keeps: after a passed-through write it drops
    /// what it knows of size and times itself, after a read its atime.
    /// What the kernel cached before an O_RDWR open goes at the open's
    /// first read, write or mmap (each drops the kernel's atime, and a
    /// stat then asks for everything). Keeping the attributes of an
    /// O_WRONLY open (an untar's, a compiler's) saves the GETATTR that
    /// the permission check of the open itself would send.
    fn attr_ttl(&self, a: &Attr) -> u64 {
        if a.kind != Kind::File || self.fs.hot_tier().is_none() {
            return TTL;
        }
        let ids = self.backings.ids.lock().unwrap_or_else(|p| p.into_inner());
        match ids.get(&a.ino) {
            Some(b) if b.read_write > 0 => 0,
            _ => TTL,
        }
    }

    /// Where [`crate::mount`] puts the session's notifier.
    pub(crate) fn set_notifier(&self, n: Notifier) {
        let _ = self.notifier.set(n);
    }

    /// What to ask the kernel for at INIT.
    pub fn init_want(&self) -> InitWant {
        // fuser's defaults, kept: asynchronous reads, writes above a page,
        // and max_pages.
        let mut flags = init::ASYNC_READ
            | init::BIG_WRITES
            | init::MAX_PAGES
            | init::DO_READDIRPLUS
            // HANDLE_KILLPRIV_V2: without it the kernel asks for the
            // security.capability xattr before every write, a second round
            // trip per write, and a GETATTR before every chown; with it,
            // dropping setuid/setgid is ours (fs.rs), also for writes passed
            // through (the kernel then sends an empty SETATTR).
            | init::HANDLE_KILLPRIV_V2
            | init::PARALLEL_DIROPS
            // File handles (open_by_handle_at, NFS export) that work after
            // the kernel dropped the inode: it then looks up "." by number.
            | init::EXPORT_SUPPORT
            // POSIX ACLs: the kernel checks them and keeps them in step
            // with chmod; new inodes inherit a default ACL here, which is
            // why the umask is left to `Fs` too (DONT_MASK).
            | init::POSIX_ACL
            | init::DONT_MASK
            // Idmapped mounts: the kernel maps the ids of requests made
            // through one before they come here (it needs default_permissions).
            | init::ALLOW_IDMAP
            | init::CACHE_SYMLINKS
            // The kernel says when an ACL change must drop setgid (its
            // caller outside the group, without CAP_FSETID), as
            // posix_acl_update_mode does on tmpfs.
            | init::SETXATTR_EXT;
        if self.opts.passthrough {
            flags |= init::PASSTHROUGH;
        }
        // Not FUSE_ASYNC_DIO: the kernel skips its page-cache invalidation
        // after an asynchronous direct write, so a buffered read racing one
        // would stay cached with the old data. Dropping the range ourselves
        // before answering deadlocks: the held answers fill the kernel's
        // background slots, and the read-ahead whose page lock the drop
        // waits for is queued behind them. Without it an io_submit'ed
        // direct write is served synchronously (slower at depth, never stale).
        if self.opts.writeback_cache && !self.opts.passthrough {
            // Files opened uncached near a full disk (fs/cache.rs) may
            // still be mapped shared (without it such an mmap fails with
            // ENODEV); a mapping goes through the page cache, so its
            // errors reach msync, fsync or close.
            flags |= init::WRITEBACK_CACHE | init::DIRECT_IO_ALLOW_MMAP;
        }
        if self.opts.io_uring {
            flags |= init::OVER_IO_URING;
        }
        InitWant {
            flags,
            max_write: MAX_WRITE,
            max_readahead: MAX_WRITE,
            max_pages: MAX_PAGES,
            // fuser's defaults, kept.
            max_background: 16,
            congestion_threshold: 12,
            time_gran: 1,
            // Backing files on a filesystem that stacks on none (tmpfs:
            // 0); the kernel needs at least 1 to grant passthrough.
            max_stack_depth: if self.opts.passthrough { 1 } else { 0 },
        }
    }

    /// Told what INIT settled: says what was asked for and not granted.
    pub fn initialized(&self, n: &Negotiated) {
        self.setxattr_ext
            .store(n.flags & init::SETXATTR_EXT != 0, Relaxed);
        self.no_opendir
            .store(n.offered & init::NO_OPENDIR_SUPPORT != 0, Relaxed);
        self.backings
            .granted
            .store(n.flags & init::PASSTHROUGH != 0, Relaxed);
        self.fs
            .set_kernel_times(n.flags & init::WRITEBACK_CACHE != 0);
        if self.opts.writeback_cache
            && !self.opts.passthrough
            && n.flags & init::WRITEBACK_CACHE == 0
        {
            log::warn!("this kernel has no FUSE writeback cache; writes go through");
        }
        if self.opts.io_uring && !n.io_uring {
            log::warn!(
                "the kernel did not offer FUSE over io_uring (it needs Linux 6.14+ built with \
                 CONFIG_FUSE_IO_URING, and /sys/module/fuse/parameters/enable_uring set to Y); \
                 serving through /dev/fuse"
            );
        }
    }

    /// fsync and fsyncdir: the whole disk is saved at once, so both wait
    /// for the same thing. ENOSYS when there is nothing to wait for: the
    /// kernel then stops sending them and succeeds locally (after writing
    /// back any cached pages, which still reach us).
    fn sync(&self, tally: &mut Tally) -> Answer {
        match &self.opts.sync {
            None => Err(Errno::ENOSYS),
            Some(sync) => {
                tally.ran(0);
                sync().map(|()| 0)
            }
        }
    }
}

/// What metrics count of one request, told by its handler: whether the
/// `Fs` call ran (a request refused before it is not counted), and the
/// bytes it moved.
#[derive(Default)]
struct Tally {
    ran: bool,
    bytes: u64,
}

impl Tally {
    fn ran(&mut self, bytes: u64) {
        self.ran = true;
        self.bytes = bytes;
    }
}

/// The metrics op of a request, for the opcodes that are timed and
/// counted (see [`FuseOptions::metrics`]); the one map from FUSE opcodes
/// to [`Op`].
fn metric_op(req: &Request<'_>) -> Option<Op> {
    Some(match req.header.opcode {
        op::READ => Op::Read,
        // A copy inside the disk: counted as the write it ends in.
        op::WRITE | op::COPY_FILE_RANGE => Op::Write,
        op::FSYNC | op::FSYNCDIR => Op::Flush,
        op::LSEEK => Op::Other,
        op::FALLOCATE => {
            // fuse_fallocate_in: fh, offset, length, mode.
            let mode = Rd(req.arg0.get(24..).unwrap_or(&[])).u32().unwrap_or(0) as i32;
            if mode & libc::FALLOC_FL_PUNCH_HOLE != 0 {
                Op::Trim
            } else if mode & libc::FALLOC_FL_ZERO_RANGE != 0 {
                Op::Zero
            } else {
                Op::Other
            }
        }
        _ => return None,
    })
}

/// The `S_IFMT` bits of a kind.
fn type_bits(k: Kind) -> u32 {
    match k {
        Kind::File => libc::S_IFREG,
        Kind::Dir => libc::S_IFDIR,
        Kind::Symlink => libc::S_IFLNK,
        Kind::Fifo => libc::S_IFIFO,
        Kind::Socket => libc::S_IFSOCK,
        Kind::CharDev => libc::S_IFCHR,
        Kind::BlockDev => libc::S_IFBLK,
    }
}

/// The instant a request's (seconds, nanoseconds) names; EINVAL when out
/// of range.
fn system_time((secs, nsec): (u64, u32)) -> std::result::Result<SystemTime, Errno> {
    crate::fs::join_time(secs as i64, nsec).ok_or(Errno::EINVAL)
}

fn fattr_of(a: &Attr) -> abi::FAttr {
    abi::FAttr {
        ino: a.ino.0,
        size: a.size,
        blocks: a.blocks,
        atime: split_time(a.atime),
        mtime: split_time(a.mtime),
        ctime: split_time(a.ctime),
        mode: type_bits(a.kind) | a.perm as u32,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
    }
}

/// The statx attributes tmpfs reports, each with the chattr flag it
/// stands for.
const STATX_ATTRS: [(u32, u64); 3] = {
    use crate::fs::{FL_APPEND, FL_IMMUTABLE, FL_NODUMP};
    [
        (FL_IMMUTABLE, libc::STATX_ATTR_IMMUTABLE as u64),
        (FL_APPEND, libc::STATX_ATTR_APPEND as u64),
        (FL_NODUMP, libc::STATX_ATTR_NODUMP as u64),
    ]
};

/// `struct fuse_statx`: all basic fields always (the kernel refreshes its
/// cached attributes only from a full set), the birth time when asked,
/// and the attributes tmpfs reports (immutable, append-only, nodump) with
/// their mask. Linux 6.18 drops those two (`fuse_do_statx` in
/// fs/fuse/dir.c copies neither into the kstat, and `fuse_update_get_attr`
/// asks for basic stats and btime only), so `statx` shows only the VFS's
/// own; they are answered for a kernel that passes them on.
fn encode_statx(w: &mut Wr<'_>, a: &Attr, want: u32) {
    let mask = libc::STATX_BASIC_STATS | (want & libc::STATX_BTIME);
    let time = |w: &mut Wr<'_>, t: SystemTime| {
        let (s, ns) = split_time(t);
        w.i64(s).u32(ns).u32(0);
    };
    // The kernel's 32-bit device encoding (new_encode_dev).
    let (major, minor) = (
        (a.rdev >> 8) & 0xfff,
        (a.rdev & 0xff) | ((a.rdev >> 12) & 0xfff00),
    );
    let attributes = STATX_ATTRS
        .iter()
        .filter(|(fl, _)| a.flags & fl != 0)
        .fold(0, |x, (_, attr)| x | attr);
    let attributes_mask = STATX_ATTRS.iter().fold(0, |x, (_, attr)| x | attr);
    w.u32(mask)
        .u32(4096)
        .u64(attributes)
        .u32(a.nlink)
        .u32(a.uid)
        .u32(a.gid)
        .u16((type_bits(a.kind) | a.perm as u32) as u16)
        .u16(0)
        .u64(a.ino.0)
        .u64(a.size)
        .u64(a.blocks)
        .u64(attributes_mask);
    time(w, a.atime);
    time(w, a.btime);
    time(w, a.ctime);
    time(w, a.mtime);
    w.u32(major).u32(minor).u32(0).u32(0).zeros(14 * 8);
}

/// Whether a SETATTR sets times other than "both to now" (utime(NULL)),
/// which is all an append-only file allows (the VFS's ATTR_TIMES_SET).
/// Under the write-back cache the kernel sends its own "now" as an
/// explicit mtime with ctime, the same instant (the VFS sets ctime to now
/// on every change), and it writes back the times it keeps as mtime and
/// ctime, never atime, with the handle of the open it writes through (at
/// every close of a written file, so one without a handle would be
/// a file dirtied with no writer open, which append-only leaves none of).
fn times_given(s: &abi::SetattrIn) -> bool {
    let on = |bit: u32| s.valid & bit != 0;
    if !on(fattr::ATIME) && !on(fattr::MTIME) || on(fattr::FH) && !on(fattr::ATIME) {
        return false;
    }
    let atime_now = on(fattr::ATIME) && on(fattr::ATIME_NOW);
    let mtime_now =
        on(fattr::MTIME) && (on(fattr::MTIME_NOW) || on(fattr::CTIME) && s.mtime == s.ctime);
    !(atime_now && mtime_now)
}

fn caller(req: &Request<'_>) -> Caller {
    Caller {
        uid: req.header.uid,
        gid: req.header.gid,
        pid: req.header.pid,
        umask: 0,
    }
}

/// The caller of a request that creates an inode, with the umask it sent.
fn creator(req: &Request<'_>, umask: u32) -> Caller {
    Caller {
        umask,
        ..caller(req)
    }
}

/// CREATE's and TMPFILE's answer: the new inode's entry, then its open.
fn created_out(t: &FuseFs, buf: &mut [u8], a: &Attr, open: (u32, i32)) -> Answer {
    let mut w = Wr::new(buf);
    abi::encode_entry(&mut w, GENERATION, TTL, t.attr_ttl(a), &fattr_of(a));
    abi::encode_open_out(&mut w, 0, open.0, open.1);
    w.written().ok_or(Errno::EIO)
}

/// A directory entry's name: NUL-terminated, at most NAME_MAX bytes; and
/// what follows it.
fn name(b: &[u8]) -> std::result::Result<(&OsStr, &[u8]), Errno> {
    let (n, rest) = abi::cstr(b).ok_or(Errno::EINVAL)?;
    if n.len() > NAME_MAX {
        return Err(Errno::ENAMETOOLONG);
    }
    Ok((OsStr::from_bytes(n), rest))
}

/// A name that must be all that is left of the request.
fn last_name(b: &[u8]) -> std::result::Result<&OsStr, Errno> {
    let (n, rest) = name(b)?;
    if !rest.is_empty() {
        return Err(Errno::EINVAL);
    }
    Ok(n)
}

/// Decodes a fixed argument; EINVAL when it is short.
fn arg<T>(v: Option<T>) -> std::result::Result<T, Errno> {
    v.ok_or(Errno::EINVAL)
}

fn entry_out(t: &FuseFs, buf: &mut [u8], r: crate::fs::Result<Attr>) -> Answer {
    let a = r?;
    let mut w = Wr::new(buf);
    abi::encode_entry(&mut w, GENERATION, TTL, t.attr_ttl(&a), &fattr_of(&a));
    w.written().ok_or(Errno::EIO)
}

/// A LOOKUP's answer. A missing name is an entry with inode 0, which the
/// kernel keeps as a negative dentry for `TTL`, so asking again for it
/// (open(O_CREAT), a build's probes) is free; creating the name through
/// the kernel replaces it.
fn lookup_out(t: &FuseFs, buf: &mut [u8], r: crate::fs::Result<Attr>) -> Answer {
    match r {
        Err(e) if e == Errno::ENOENT => {
            let mut w = Wr::new(buf);
            abi::encode_entry(&mut w, 0, TTL, TTL, &abi::FAttr::default());
            w.written().ok_or(Errno::EIO)
        }
        r => entry_out(t, buf, r),
    }
}

fn attr_out(t: &FuseFs, buf: &mut [u8], r: crate::fs::Result<Attr>) -> Answer {
    let a = r?;
    let mut w = Wr::new(buf);
    abi::encode_attr_out(&mut w, t.attr_ttl(&a), &fattr_of(&a));
    w.written().ok_or(Errno::EIO)
}

fn empty(r: crate::fs::Result<()>) -> Answer {
    r.map(|()| 0)
}

/// Copies `data` into the reply; ERANGE if it does not fit.
fn data_out(buf: &mut [u8], data: &[u8]) -> Answer {
    let dst = buf.get_mut(..data.len()).ok_or(Errno::ERANGE)?;
    dst.copy_from_slice(data);
    Ok(data.len())
}

/// Page cache kept across opens (every change goes through this mount),
/// dropped or not used at all as `Fs` says (`fs/cache.rs`).
fn open_flags(fs: &Fs, ino: Ino) -> u32 {
    match fs.open_cache(ino) {
        OpenCache::Keep => abi::FOPEN_KEEP_CACHE,
        OpenCache::Drop => 0,
        OpenCache::Direct => abi::FOPEN_DIRECT_IO,
    }
}

impl Dispatch for FuseFs {
    fn arg0_len(&self, opcode: u32) -> usize {
        if opcode == op::SETXATTR && self.setxattr_ext.load(Relaxed) {
            return abi::SETXATTR_EXT_IN_LEN;
        }
        abi::arg0_len(opcode)
    }

    fn dispatch(&self, req: &Request<'_>, reply: &mut dyn Reply) {
        let h = &req.header;
        match h.opcode {
            // No answer to these.
            op::FORGET => {
                if let Some(n) = Rd(req.arg0).u64() {
                    self.fs.forget(Ino(h.nodeid), n);
                }
                return;
            }
            op::BATCH_FORGET => {
                let Some(count) = Rd(req.arg0).u32() else {
                    return;
                };
                for one in req
                    .rest
                    .chunks_exact(abi::FORGET_ONE_LEN)
                    .take(count as usize)
                {
                    let mut r = Rd(one);
                    if let (Some(ino), Some(n)) = (r.u64(), r.u64()) {
                        self.fs.forget(Ino(ino), n);
                    }
                }
                return;
            }
            // Requests are not cancelled: each is answered when done.
            op::INTERRUPT => return,
            op::LSEEK if self.kernel_holds_pages() => return self.lseek_written_back(req, reply),
            _ => {}
        }
        // Timed and counted here, once per request (a seek that waits
        // for write-back, above, where it is answered).
        let metered = self
            .opts
            .metrics
            .as_deref()
            .and_then(|m| Some((m, metric_op(req)?, Instant::now())));
        let mut tally = Tally::default();
        let answer = self.serve(req, reply.buf(), &mut tally);
        if let Some((m, op, started)) = metered.filter(|_| tally.ran) {
            m.record(op, tally.bytes, started, answer.is_ok());
        }
        if answer.is_ok() {
            self.listing_may_move_atime(h.opcode, Ino(h.nodeid));
        }
        // The one place an errno becomes the kernel's number.
        if let Err(e) = reply.send(answer.map_err(Errno::get)) {
            log::debug!("answering FUSE opcode {}: {e}", h.opcode);
        }
    }
}

/// Whether `req` would change the tree or a file: refused on a standby
/// even if its mount was made read-write behind ramd's back (`mount -o
/// remount,rw` without the mount helper), since the next applied save
/// would undo it and the promoted disk would differ from its image.
/// chattr's FS_IOC_SETFLAGS is refused by `Fs::set_flags`.
fn changes(req: &Request<'_>) -> bool {
    match req.header.opcode {
        op::SETATTR
        | op::SYMLINK
        | op::MKNOD
        | op::MKDIR
        | op::UNLINK
        | op::RMDIR
        | op::RENAME
        | op::RENAME2
        | op::LINK
        | op::WRITE
        | op::SETXATTR
        | op::REMOVEXATTR
        | op::CREATE
        | op::TMPFILE
        | op::FALLOCATE
        | op::COPY_FILE_RANGE => true,
        op::OPEN => Rd(req.arg0).u32().is_some_and(|f| {
            let f = f as i32;
            f & libc::O_ACCMODE != libc::O_RDONLY || f & libc::O_TRUNC != 0
        }),
        _ => false,
    }
}

impl FuseFs {
    /// After a change of a directory's times, mode, owner, xattrs or
    /// flags (its ctime moved, or its atime was set): the next listing of
    /// it must come here, where relatime moves its atime (atime <= ctime),
    /// not from the listing the kernel keeps since OPENDIR went (its cache
    /// goes only when entries change). Dropping the directory's pages
    /// drops that listing; they are never dirty, so this waits for nothing.
    fn listing_may_move_atime(&self, opcode: u32, ino: Ino) {
        if !matches!(
            opcode,
            op::SETATTR | op::SETXATTR | op::REMOVEXATTR | op::IOCTL
        ) || !self.listings_cached.load(Relaxed)
        {
            return;
        }
        // Only a directory listed since: one never listed has no kept
        // listing, and the notification costs a GETATTR (it drops the
        // attributes too), which tar's setting of every directory's times
        // would pay.
        if !self.fs.take_listed(ino) {
            return;
        }
        if let Some(n) = self.notifier.get() {
            if let Err(e) = n.inval_inode(ino.0, 0, 0) {
                log::warn!("dropping the kernel's listing of directory {ino}: {e}");
            }
        }
    }
}

/// A seek answered from the seeker thread ([`FuseFs::lseek_written_back`]).
type SeekJob = Box<dyn FnOnce() + Send>;

/// The thread that answers seeks which wait for the kernel's write-back,
/// started at the first; it ends when the filesystem's sender goes.
#[derive(Default)]
struct Seeker {
    tx: Mutex<Option<std::sync::mpsc::Sender<SeekJob>>>,
}

impl Seeker {
    /// Hands `job` to the thread; back if no thread could be started.
    fn send(&self, job: SeekJob) -> std::result::Result<(), std::sync::mpsc::SendError<SeekJob>> {
        let mut tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        if tx.is_none() {
            let (t, rx) = std::sync::mpsc::channel::<SeekJob>();
            let started = std::thread::Builder::new()
                .name("ramd-fuse-seek".into())
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                });
            match started {
                Ok(_) => *tx = Some(t),
                Err(e) => {
                    log::warn!("starting the seek thread: {e}; seeks answered in place");
                    return Err(std::sync::mpsc::SendError(job));
                }
            }
        }
        tx.as_ref().expect("started").send(job)
    }
}

/// LSEEK's offset and whence; ENXIO for a negative offset, EINVAL for a
/// whence other than SEEK_DATA and SEEK_HOLE (the kernel handles
/// SEEK_SET/CUR/END itself).
fn lseek_in(req: &Request<'_>) -> std::result::Result<(i64, Whence), Errno> {
    let mut r = Rd(req.arg0);
    let (_fh, offset, whence) = (arg(r.u64())?, arg(r.u64())? as i64, arg(r.u32())?);
    let whence = match whence as i32 {
        libc::SEEK_DATA => Whence::Data,
        libc::SEEK_HOLE => Whence::Hole,
        _ => return Err(Errno::EINVAL),
    };
    if offset < 0 {
        return Err(Errno::ENXIO);
    }
    Ok((offset, whence))
}

impl FuseFs {
    /// Whether regular files' pages live in the kernel's page cache, where
    /// it may hold written pages it has not written back yet: under the
    /// write-back cache, and without it too for a shared writable mmap. Not
    /// with passthrough, whose pages are the backing file's.
    fn kernel_holds_pages(&self) -> bool {
        !self.passthrough() || self.fs.hot_tier().is_none()
    }

    /// SEEK_DATA/SEEK_HOLE where the kernel may hold pages written but not
    /// yet written back ([`FuseFs::kernel_holds_pages`]), which ramd has not
    /// seen. `fuse_lseek` (fs/fuse/file.c) sends FUSE_LSEEK without writing them
    /// back first (unlike fallocate and copy_file_range), so a seek right
    /// after a write found no data where tmpfs finds it. The way a server
    /// has to get them: FUSE_NOTIFY_INVAL_INODE for the range from the
    /// offset on, whose page-cache invalidation (invalidate_inode_pages2_range)
    /// launders each dirty page, a WRITE here, and waits for it, before it
    /// drops the page (clean pages of the range go too: the price, paid
    /// only by seeks). Pages before the offset cannot change the answer
    /// (one that extends the file holds the offset). The WRITEs must be
    /// served while the notification waits, so on `/dev/fuse` the answer is
    /// sent from the seeker thread and the worker goes on serving (with
    /// `--threads 1` it is the only one); io_uring cannot hand an answer
    /// over, and keeps an entry of every queue free for them (below).
    fn lseek_written_back(&self, req: &Request<'_>, reply: &mut dyn Reply) {
        let ino = Ino(req.header.nodeid);
        let (offset, whence) = match lseek_in(req) {
            Ok(a) => a,
            Err(e) => {
                if let Err(e) = reply.send(Err(e.get())) {
                    log::debug!("answering FUSE_LSEEK: {e}");
                }
                return;
            }
        };
        let (fs, notifier) = (self.fs.clone(), self.notifier.clone());
        let metrics = self.opts.metrics.clone().zip(metric_op(req));
        let answer = move |write_back: bool| {
            if let Some(n) = notifier.get().filter(|_| write_back) {
                if let Err(e) = n.inval_inode(ino.0, offset, 0) {
                    log::warn!("writing back inode {ino}'s cached pages before a seek: {e}");
                }
            }
            let started = Instant::now();
            let res = fs.seek(ino, offset as u64, whence);
            if let Some((m, op)) = &metrics {
                m.record(*op, 0, started, res.is_ok());
            }
            res
        };
        let Some(later) = reply.detach() else {
            // In place (io_uring): the request keeps its ring entry until
            // answered, and the write-back's WRITEs need a free entry in
            // the queue of the CPU the notification runs on. So at most a
            // queue's depth less one seeks wait at once, whichever queues
            // they are on: every queue keeps an entry for the WRITEs. A
            // seek past that is answered from what ramd has seen.
            let limit =
                usize::from(crate::ll::uring::UringConfig::default().queue_depth).saturating_sub(1);
            let waiting = &self.in_place_seeks;
            let write_back = waiting
                .fetch_update(Relaxed, Relaxed, |n| (n < limit).then_some(n + 1))
                .is_ok();
            if !write_back {
                log::debug!(
                    "seek in inode {ino} answered without write-back: {limit} already wait"
                );
            }
            let res = answer(write_back);
            if write_back {
                waiting.fetch_sub(1, Relaxed);
            }
            let res = res.and_then(|o| {
                let mut w = Wr::new(reply.buf());
                w.u64(o);
                w.written().ok_or(Errno::EIO)
            });
            if let Err(e) = reply.send(res.map_err(Errno::get)) {
                log::debug!("answering FUSE_LSEEK: {e}");
            }
            return;
        };
        let job: SeekJob = Box::new(move || {
            let bytes = answer(true).map(u64::to_ne_bytes);
            if let Err(e) = later(bytes.as_ref().map(|b| &b[..]).map_err(|e| e.get())) {
                log::debug!("answering FUSE_LSEEK: {e}");
            }
        });
        if let Err(job) = self.seeker.send(job) {
            // No thread to answer from (it could not be started): here,
            // at the risk the notification waits on this worker.
            (job.0)();
        }
    }

    /// Serves one request that has an answer, built in `buf`.
    fn serve(&self, req: &Request<'_>, buf: &mut [u8], tally: &mut Tally) -> Answer {
        let h = &req.header;
        let ino = Ino(h.nodeid);
        let fs = &*self.fs;
        // Every fixed argument whole (INIT's is shorter on old kernels,
        // and answered by the session anyway).
        if h.opcode != op::INIT && req.arg0.len() < self.arg0_len(h.opcode) {
            return Err(Errno::EINVAL);
        }
        if fs.store().standby() && changes(req) {
            return Err(Errno::EROFS);
        }
        match h.opcode {
            op::LOOKUP => lookup_out(self, buf, fs.lookup(ino, last_name(req.rest)?)),
            op::GETATTR => {
                let flags = arg(abi::Rd(req.arg0).u32())?;
                // With a handle: the kernel is about to take a cached write.
                if flags & abi::GETATTR_FH != 0 {
                    fs.write_allowed(ino)?;
                }
                attr_out(self, buf, fs.getattr(ino))
            }
            op::SETATTR => {
                let s = arg(abi::SetattrIn::parse(req.arg0))?;
                let v = s.valid;
                let on = |bit: u32| v & bit != 0;
                let time = |t: (u64, u32), now: u32, at: u32| {
                    if on(now) {
                        Ok(Some(SetTime::Now))
                    } else if on(at) {
                        system_time(t).map(|t| Some(SetTime::At(t)))
                    } else {
                        Ok(None)
                    }
                };
                let set = SetAttr {
                    mode: on(fattr::MODE).then_some(s.mode),
                    uid: on(fattr::UID).then_some(s.uid),
                    gid: on(fattr::GID).then_some(s.gid),
                    size: on(fattr::SIZE).then_some(s.size),
                    atime: time(s.atime, fattr::ATIME_NOW, fattr::ATIME)?,
                    mtime: time(s.mtime, fattr::MTIME_NOW, fattr::MTIME)?,
                    ctime: if on(fattr::CTIME) {
                        Some(system_time(s.ctime)?)
                    } else {
                        None
                    },
                    times_given: times_given(&s),
                };
                attr_out(self, buf, fs.setattr(caller(req), ino, set))
            }
            op::READLINK => data_out(buf, &fs.readlink(ino)?),
            op::SYMLINK => {
                let (link, rest) = name(req.rest)?;
                let (target, tail) = abi::cstr(rest).ok_or(Errno::EINVAL)?;
                if !tail.is_empty() {
                    return Err(Errno::EINVAL);
                }
                let target = OsStr::from_bytes(target);
                entry_out(self, buf, fs.symlink(caller(req), ino, link, target))
            }
            op::MKNOD => {
                let mut r = Rd(req.arg0);
                let (mode, rdev, umask) = (arg(r.u32())?, arg(r.u32())?, arg(r.u32())?);
                let who = creator(req, umask);
                entry_out(
                    self,
                    buf,
                    fs.mknod(who, ino, last_name(req.rest)?, mode, rdev),
                )
            }
            op::MKDIR => {
                let mut r = Rd(req.arg0);
                let (mode, umask) = (arg(r.u32())?, arg(r.u32())?);
                let who = creator(req, umask);
                entry_out(self, buf, fs.mkdir(who, ino, last_name(req.rest)?, mode))
            }
            op::UNLINK => empty(fs.unlink(ino, last_name(req.rest)?)),
            op::RMDIR => empty(fs.rmdir(ino, last_name(req.rest)?)),
            op::RENAME | op::RENAME2 => {
                let mut r = Rd(req.arg0);
                let newdir = arg(r.u64())?;
                let flags = if h.opcode == op::RENAME2 {
                    arg(r.u32())?
                } else {
                    0
                };
                let (old, rest) = name(req.rest)?;
                let new = last_name(rest)?;
                empty(fs.rename(caller(req), ino, old, Ino(newdir), new, flags))
            }
            op::LINK => {
                let old = arg(Rd(req.arg0).u64())?;
                entry_out(self, buf, fs.link(Ino(old), ino, last_name(req.rest)?))
            }
            op::OPEN => {
                let flags = arg(Rd(req.arg0).u32())?;
                fs.open(ino, flags as i32)?;
                let (open_flags, backing) = match self.open_reply(ino, flags, false) {
                    Ok(r) => r,
                    Err(e) => {
                        fs.release(ino);
                        return Err(e);
                    }
                };
                let mut w = Wr::new(buf);
                abi::encode_open_out(&mut w, 0, open_flags, backing);
                w.written().ok_or(Errno::EIO)
            }
            op::READ => {
                let r = arg(abi::RwIn::parse(req.arg0))?;
                // Straight into the reply: no copy of the data here.
                let dst = buf.get_mut(..r.size as usize).ok_or(Errno::EINVAL)?;
                let res = fs.read(ino, r.offset, dst);
                tally.ran(*res.as_ref().unwrap_or(&0) as u64);
                res
            }
            op::WRITE => {
                let w = arg(abi::RwIn::parse(req.arg0))?;
                if req.rest.len() != w.size as usize {
                    return Err(Errno::EINVAL);
                }
                // Writes flushed from the kernel's cache must fail whole, so
                // that the error is kept for fsync/close; a program's own
                // write may be short.
                let short_ok = w.rw_flags & abi::WRITE_CACHE == 0;
                let kill = w.rw_flags & abi::WRITE_KILL_SUIDGID != 0;
                let res = fs.write(
                    &fs.change(),
                    ino,
                    w.offset,
                    req.rest,
                    short_ok,
                    caller(req),
                    kill,
                );
                tally.ran(*res.as_ref().unwrap_or(&0) as u64);
                let n = res?;
                let mut out = Wr::new(buf);
                out.u32(n as u32).u32(0);
                out.written().ok_or(Errno::EIO)
            }
            op::STATFS => {
                let (blocks, bfree, files, ffree) = fs.statfs();
                let mut w = Wr::new(buf);
                w.u64(blocks)
                    .u64(bfree)
                    .u64(bfree)
                    .u64(files)
                    .u64(ffree)
                    .u32(4096)
                    .u32(NAME_MAX as u32)
                    .u32(4096)
                    .u32(0)
                    .zeros(24);
                w.written().ok_or(Errno::EIO)
            }
            op::RELEASE => {
                // The backing id first: the last release frees an
                // unlinked file's backing file.
                // fuse_release_in: fh, then the open's flags (its length
                // was checked above; a release is never refused).
                let mut r = Rd(req.arg0);
                let flags = r.u64().and_then(|_fh| r.u32()).unwrap_or(0);
                self.released(ino, flags);
                fs.release(ino);
                Ok(0)
            }
            op::FSYNC | op::FSYNCDIR => self.sync(tally),
            op::SETXATTR => {
                let mut r = Rd(req.arg0);
                let (size, flags) = (arg(r.u32())?, arg(r.u32())?);
                let kill_sgid = self.setxattr_ext.load(Relaxed)
                    && arg(r.u32())? & abi::SETXATTR_ACL_KILL_SGID != 0;
                let (n, value) = abi::cstr(req.rest).ok_or(Errno::EINVAL)?;
                if value.len() != size as usize {
                    return Err(Errno::EINVAL);
                }
                let n = OsStr::from_bytes(n);
                empty(fs.setxattr(ino, n, value, flags as i32, kill_sgid))
            }
            op::GETXATTR | op::LISTXATTR => {
                let size = arg(Rd(req.arg0).u32())?;
                let v = if h.opcode == op::GETXATTR {
                    let (n, tail) = abi::cstr(req.rest).ok_or(Errno::EINVAL)?;
                    if !tail.is_empty() {
                        return Err(Errno::EINVAL);
                    }
                    fs.getxattr(ino, OsStr::from_bytes(n))
                } else {
                    fs.listxattr(ino)
                }?;
                if size == 0 {
                    // fuse_getxattr_out: the size it would take.
                    let mut w = Wr::new(buf);
                    w.u32(v.len() as u32).u32(0);
                    w.written().ok_or(Errno::EIO)
                } else if v.len() > size as usize {
                    Err(Errno::ERANGE)
                } else {
                    data_out(buf, &v)
                }
            }
            op::REMOVEXATTR => {
                let (n, tail) = abi::cstr(req.rest).ok_or(Errno::EINVAL)?;
                if !tail.is_empty() {
                    return Err(Errno::EINVAL);
                }
                empty(fs.removexattr(ino, OsStr::from_bytes(n)))
            }
            // Nothing is buffered here, so close() needs no round trip:
            // ENOSYS tells the kernel to stop sending FLUSH (it then
            // succeeds at once).
            op::FLUSH => Err(Errno::ENOSYS),
            // Answered once, by the session, before any other request.
            op::INIT => Err(Errno::EIO),
            // A listing keeps nothing per open (fs/dir.rs): when the kernel
            // can do without, ENOSYS saves this round trip and RELEASEDIR's
            // for every later open of any directory. The kernel then
            // caches listings itself (FOPEN_CACHE_DIR, its default for a
            // directory opened without OPENDIR), dropping the cache when
            // the directory changes through it, and ramd drops it when the
            // directory's ctime or atime moves (`listing_may_move_atime`).
            // So relatime holds (but for its rule of a day), not
            // strictatime, which keeps OPENDIR (and so every listing)
            // coming here.
            op::OPENDIR
                if self.no_opendir.load(Relaxed) && fs.atime().mode != AtimeMode::Strict =>
            {
                self.listings_cached.store(true, Relaxed);
                Err(Errno::ENOSYS)
            }
            op::OPENDIR => {
                fs.opendir(ino)?;
                let mut w = Wr::new(buf);
                abi::encode_open_out(&mut w, 0, 0, 0);
                w.written().ok_or(Errno::EIO)
            }
            op::READDIR => {
                let r = arg(abi::RwIn::parse(req.arg0))?;
                self.readdir(ino, r, buf)
            }
            op::READDIRPLUS => {
                let r = arg(abi::RwIn::parse(req.arg0))?;
                self.readdirplus(ino, r, buf)
            }
            op::RELEASEDIR => Ok(0),
            // With default_permissions the kernel checks access itself.
            op::ACCESS => Ok(0),
            op::CREATE | op::TMPFILE => {
                // fuse_create_in: flags, mode, umask.
                let mut r = Rd(req.arg0);
                let (flags, mode, umask) = (arg(r.u32())?, arg(r.u32())?, arg(r.u32())?);
                let who = creator(req, umask);
                let a = if h.opcode == op::CREATE {
                    fs.create(who, ino, last_name(req.rest)?, mode)
                } else {
                    // The name the kernel sends ("/") names nothing.
                    fs.tmpfile(who, ino, mode)
                };
                let a = a?;
                let open = match self.open_reply(a.ino, flags, true) {
                    Ok(r) => r,
                    Err(e) => {
                        // Created but not opened: the kernel will not
                        // release it, and (for O_TMPFILE) nothing names it.
                        fs.release(a.ino);
                        return Err(e);
                    }
                };
                created_out(self, buf, &a, open)
            }
            op::STATX => {
                let sx = arg(abi::StatxIn::parse(req.arg0))?;
                let a = fs.getattr(ino)?;
                let mut w = Wr::new(buf);
                // attr_valid, its nanoseconds, flags, spare.
                w.u64(self.attr_ttl(&a)).u32(0).u32(0).zeros(16);
                encode_statx(&mut w, &a, sx.sx_mask);
                w.written().ok_or(Errno::EIO)
            }
            op::DESTROY => Ok(0),
            op::IOCTL => {
                let i = arg(abi::IoctlIn::parse(req.arg0))?;
                let in_data = req.rest.get(..i.in_size as usize).ok_or(Errno::EINVAL)?;
                self.ioctl(ino, i.cmd, in_data, i.out_size, buf)
            }
            op::FALLOCATE => {
                let mut r = Rd(req.arg0);
                let (_fh, offset, length, mode) = (
                    arg(r.u64())?,
                    arg(r.u64())?,
                    arg(r.u64())?,
                    arg(r.u32())? as i32,
                );
                let res = fs.fallocate(caller(req), ino, offset, length, mode);
                tally.ran(length);
                empty(res)
            }
            op::LSEEK => {
                let (offset, whence) = lseek_in(req)?;
                let res = fs.seek(ino, offset as u64, whence);
                tally.ran(0);
                let o = res?;
                let mut w = Wr::new(buf);
                w.u64(o);
                w.written().ok_or(Errno::EIO)
            }
            op::COPY_FILE_RANGE => {
                let c = arg(abi::CopyRangeIn::parse(req.arg0))?;
                // One reply carries a u32 count; the kernel loops for the rest.
                let len = c.len.min(1 << 30);
                let res = fs.copy_range(
                    caller(req),
                    ino,
                    c.off_in,
                    Ino(c.nodeid_out),
                    c.off_out,
                    len,
                );
                tally.ran(*res.as_ref().unwrap_or(&0));
                let n = res?;
                let mut w = Wr::new(buf);
                w.u32(n as u32).u32(0);
                w.written().ok_or(Errno::EIO)
            }
            // Locks stay local to the kernel (as with fuser's defaults),
            // and the rest is not offered: ENOSYS.
            _ => Err(Errno::ENOSYS),
        }
    }

    fn readdir(&self, ino: Ino, r: abi::RwIn, buf: &mut [u8]) -> Answer {
        let size = (r.size as usize).min(buf.len());
        let most = size / abi::dirent_len(abi::DIRENT_LEN, 1);
        let entries = self.fs.read_dir(ino, r.offset, most)?;
        let mut w = Wr::new(&mut buf[..size]);
        for (cookie, e) in &entries {
            // The offset handed back is where the next call resumes.
            let typ = type_bits(e.kind) >> 12;
            if !abi::encode_dirent(&mut w, e.ino.0, *cookie, typ, e.name.as_bytes()) {
                break;
            }
        }
        w.written().ok_or(Errno::EIO)
    }

    fn readdirplus(&self, ino: Ino, r: abi::RwIn, buf: &mut [u8]) -> Answer {
        let size = (r.size as usize).min(buf.len());
        let most = size / abi::dirent_len(abi::DIRENTPLUS_LEN, 1);
        let entries = self.fs.read_dir(ino, r.offset, most)?;
        let mut w = Wr::new(&mut buf[..size]);
        for (cookie, e) in &entries {
            if abi::dirent_len(abi::DIRENTPLUS_LEN, e.name.len()) > w.room() {
                break;
            }
            let dot = e.name == "." || e.name == "..";
            // The kernel counts a lookup for every entry but "." and "..".
            let attr = if dot {
                self.fs.getattr(e.ino)
            } else {
                self.fs.lookup_ino(e.ino)
            };
            let Ok(attr) = attr else {
                // Removed since it was listed: leave it out.
                continue;
            };
            let ttl = self.attr_ttl(&attr);
            abi::encode_entry(&mut w, GENERATION, TTL, ttl, &fattr_of(&attr));
            let typ = type_bits(e.kind) >> 12;
            abi::encode_dirent(&mut w, e.ino.0, *cookie, typ, e.name.as_bytes());
        }
        w.written().ok_or(Errno::EIO)
    }

    fn ioctl(&self, ino: Ino, cmd: u32, in_data: &[u8], out_size: u32, buf: &mut [u8]) -> Answer {
        // The kernel sends chattr's flags as an unsigned int, whichever
        // width the command's number says (fs/fuse/ioctl.c).
        const GETFLAGS: [u32; 2] = [libc::FS_IOC_GETFLAGS as u32, libc::FS_IOC32_GETFLAGS as u32];
        const SETFLAGS: [u32; 2] = [libc::FS_IOC_SETFLAGS as u32, libc::FS_IOC32_SETFLAGS as u32];
        // _IOR('X', 31, struct fsxattr): the kernel asks for it before
        // it sets chattr flags, and for a fileattr query.
        const FSGETXATTR: u32 = 0x801c_581f;
        // _IOW('X', 32, struct fsxattr): xfs_io's chattr, file_setattr(2).
        const FSSETXATTR: u32 = 0x401c_5820;
        let out = |buf: &mut [u8], data: &[u8]| {
            // fuse_ioctl_out: result 0, no retry, then the data.
            let data = &data[..data.len().min(out_size as usize)];
            let mut w = Wr::new(buf);
            w.u32(0).u32(0).u32(0).u32(0).bytes(data);
            w.written().ok_or(Errno::EIO)
        };
        if cmd == FSGETXATTR {
            let f = self.fs.flags(ino)?;
            // struct fsxattr: xflags, then four u32 and 8 bytes of
            // padding, all zero here.
            let mut b = [0u8; 28];
            b[..4].copy_from_slice(&xflags(f).to_ne_bytes());
            out(buf, &b)
        } else if cmd == FSSETXATTR {
            // struct fsxattr: xflags, extsize, nextents (ignored), projid,
            // cowextsize. The VFS has checked permissions and cleared
            // the extent size flags when their sizes are 0; like tmpfs,
            // any other flag or a size or project is EOPNOTSUPP.
            let mut r = Rd(in_data);
            let (xf, extsize, _nextents, projid, cowextsize) = (
                arg(r.u32())?,
                arg(r.u32())?,
                arg(r.u32())?,
                arg(r.u32())?,
                arg(r.u32())?,
            );
            let flags = flags_of_xflags(xf)
                .filter(|_| extsize == 0 && projid == 0 && cowextsize == 0)
                .ok_or(Errno::EOPNOTSUPP)?;
            self.fs.set_flags(ino, flags)?;
            out(buf, &[])
        } else if GETFLAGS.contains(&cmd) {
            let f = self.fs.flags(ino)?;
            out(buf, &f.to_ne_bytes())
        } else if SETFLAGS.contains(&cmd) {
            let f = arg(Rd(in_data).u32())?;
            self.fs.set_flags(ino, f)?;
            out(buf, &[])
        } else {
            // ENOTTY, as tmpfs; said once per command, not once per call.
            if self
                .unknown_ioctls
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(cmd)
            {
                log::info!("unsupported ioctl {cmd:#x} (answered ENOTTY; not logged again)");
            }
            Err(Errno::ENOTTY)
        }
    }
}

/// The chattr flags `Fs` keeps and their FS_XFLAG_* spelling.
const XFLAGS: [(u32, u32); 4] = {
    use crate::fs::{FL_APPEND, FL_IMMUTABLE, FL_NOATIME, FL_NODUMP};
    [
        (FL_IMMUTABLE, 0x8),
        (FL_APPEND, 0x10),
        (FL_NOATIME, 0x40),
        (FL_NODUMP, 0x80),
    ]
};

/// The FS_XFLAG_* spelling of chattr flags.
fn xflags(flags: u32) -> u32 {
    XFLAGS
        .iter()
        .filter(|(fl, _)| flags & fl != 0)
        .fold(0, |x, (_, xf)| x | xf)
}

/// The chattr flags FS_XFLAG_* flags stand for; `None` if any is one
/// `Fs` does not keep.
fn flags_of_xflags(xf: u32) -> Option<u32> {
    let known = XFLAGS.iter().fold(0, |k, (_, x)| k | x);
    (xf & !known == 0).then(|| {
        XFLAGS
            .iter()
            .filter(|(_, x)| xf & x != 0)
            .fold(0, |f, (fl, _)| f | fl)
    })
}

/// FUSE_DEV_IOC_BACKING_OPEN: registers `file` as a backing file on the
/// connection of `dev`; its backing id. Needs CAP_SYS_ADMIN, and a
/// regular file on a filesystem stacked less deep than the
/// `max_stack_depth` given at INIT (`fuse_backing_open`).
fn backing_open(dev: &std::os::fd::OwnedFd, file: &std::fs::File) -> std::io::Result<i32> {
    use std::os::fd::AsRawFd;
    // struct fuse_backing_map: fd, flags, padding.
    #[repr(C)]
    struct BackingMap {
        fd: i32,
        flags: u32,
        padding: u64,
    }
    let map = BackingMap {
        fd: file.as_raw_fd(),
        flags: 0,
        padding: 0,
    };
    // SAFETY: the ioctl reads one fuse_backing_map (16 bytes, as
    // `BackingMap` is laid out) from the pointer.
    let r = unsafe { libc::ioctl(dev.as_raw_fd(), abi::FUSE_DEV_IOC_BACKING_OPEN, &map) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(r)
}

/// FUSE_DEV_IOC_BACKING_CLOSE: drops backing id `id`.
fn backing_close(dev: &std::os::fd::OwnedFd, id: i32) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let id = id as u32;
    // SAFETY: the ioctl reads one u32 from the pointer.
    let r = unsafe { libc::ioctl(dev.as_raw_fd(), abi::FUSE_DEV_IOC_BACKING_CLOSE, &id) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
