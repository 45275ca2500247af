//! FUSE adapter: decodes the kernel's requests ([`crate::ll`]) into [`Fs`]
//! calls and encodes their replies. No filesystem logic lives here.
//!
//! This file is the dispatcher: the session's settings (INIT), the one
//! match from opcode to handler, the errno turned into the kernel's number
//! and the metrics recorded, each in one place per request. The handlers
//! are grouped by concern in `fuse/`: names (`namespace.rs`), file data
//! (`data.rs`, `seek.rs`), attributes (`attr.rs`), xattrs and chattr
//! (`xattr.rs`), backing files (`passthrough.rs`); `reply.rs` decodes
//! arguments and encodes answers for all of them.

use std::collections::HashSet;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use ramd_store::metrics::{IoMetrics, Op};

use crate::fs::{AtimeMode, Errno, Fs, Ino, Inval};
use crate::ll::abi::{self, init, op, Rd, Wr};
use crate::ll::dev::{InitWant, Negotiated};
use crate::ll::notify::Notifier;
use crate::ll::{Dispatch, Reply, Request};

mod attr;
mod data;
mod namespace;
mod passthrough;
mod reply;
mod seek;
mod xattr;

use passthrough::Backings;
use reply::{arg, attr_out, data_out, empty, last_name, lookup_out};
use seek::Seeker;

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

impl FuseFs {
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
            op::SETATTR => self.setattr(req, buf),
            op::READLINK => data_out(buf, &fs.readlink(ino)?),
            op::SYMLINK => self.symlink(req, buf),
            op::MKNOD => self.mknod(req, buf),
            op::MKDIR => self.mkdir(req, buf),
            op::UNLINK => empty(fs.unlink(ino, last_name(req.rest)?)),
            op::RMDIR => empty(fs.rmdir(ino, last_name(req.rest)?)),
            op::RENAME | op::RENAME2 => self.rename(req),
            op::LINK => self.link(req, buf),
            op::OPEN => self.open(req, buf),
            op::READ => self.read(req, buf, tally),
            op::WRITE => self.write(req, buf, tally),
            op::STATFS => self.statfs(buf),
            op::RELEASE => self.release(req),
            op::FSYNC | op::FSYNCDIR => self.sync(tally),
            op::SETXATTR => self.setxattr(req),
            op::GETXATTR | op::LISTXATTR => self.getxattr(req, buf),
            op::REMOVEXATTR => self.removexattr(req),
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
            op::CREATE | op::TMPFILE => self.create(req, buf),
            op::STATX => self.statx(req, buf),
            op::DESTROY => Ok(0),
            op::IOCTL => self.ioctl_request(req, buf),
            op::FALLOCATE => self.fallocate(req, tally),
            op::LSEEK => self.lseek(req, buf, tally),
            op::COPY_FILE_RANGE => self.copy_file_range(req, buf, tally),
            // Locks stay local to the kernel (as with fuser's defaults),
            // and the rest is not offered: ENOSYS.
            _ => Err(Errno::ENOSYS),
        }
    }
}
