//! FUSE adapter: translates fuser's requests into [`Fs`] calls and replies.
//! No filesystem logic lives here.

use std::collections::HashSet;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime};

use fuser::{
    AccessFlags, CopyFileRangeFlags, Errno as FErrno, FileAttr, FileHandle, FileType, FopenFlags,
    Generation, INodeNo, InitFlags, IoctlFlags, KernelConfig, LockOwner, Notifier, OpenFlags,
    RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyIoctl, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow, WriteFlags,
};

use ramd_store::metrics::{IoMetrics, Op};

use crate::fs::{
    Attr, Caller, Errno, Fh, Fs, Ino, Kind, OpenCache, SetAttr, SetTime, Whence, NAME_MAX,
};

/// How long the kernel may trust names (also a name's absence) and
/// attributes it was given. The kernel is the only writer: it updates or
/// invalidates what its own requests change, and `Fs` invalidates what it
/// changes on its own (`on_attr_change`: privilege bits dropped, chattr's
/// ctime); atime is the kernel's to reread after a read. So the dcache
/// answers repeated lookups and stats as on tmpfs. Finite, an hour, so a
/// change we failed to announce would not stay wrong for the mount's life.
const TTL: Duration = Duration::from_secs(3600);
/// The generation of every inode: inode numbers are never reused (not
/// across a save and load either), so the number alone names one inode for
/// its life, which file handles need; 1 rather than 0, which reads as unset.
const GENERATION: Generation = Generation(1);
/// Largest write the kernel may send in one request.
const MAX_WRITE: u32 = 1 << 20;

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
}

impl std::fmt::Debug for FuseOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FuseOptions")
            .field("writeback_cache", &self.writeback_cache)
            .field("sync", &self.sync.is_some())
            .field("metrics", &self.metrics.is_some())
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
}

impl FuseFs {
    pub fn new(fs: Arc<Fs>, opts: FuseOptions) -> FuseFs {
        let notifier = Arc::new(OnceLock::<Notifier>::new());
        let n = notifier.clone();
        // Attributes only (a negative offset): the kernel rereads them.
        fs.on_attr_change(Box::new(move |ino| {
            if let Some(n) = n.get() {
                if let Err(e) = n.inval_inode(INodeNo(ino.0), -1, 0) {
                    log::warn!("invalidating the kernel's attributes of inode {ino}: {e}");
                }
            }
        }));
        FuseFs {
            fs,
            opts,
            notifier,
            unknown_ioctls: Mutex::new(HashSet::new()),
        }
    }

    /// Where [`crate::mount`] puts the session's notifier.
    pub(crate) fn notifier_cell(&self) -> Arc<OnceLock<Notifier>> {
        self.notifier.clone()
    }

    /// fsync and fsyncdir: the whole disk is saved at once, so both wait
    /// for the same thing. ENOSYS when there is nothing to wait for.
    fn sync(&self, reply: ReplyEmpty) {
        match &self.opts.sync {
            None => reply.error(FErrno::ENOSYS),
            Some(sync) => {
                let started = Instant::now();
                let r = sync();
                self.record(Op::Flush, 0, started, r.is_ok());
                match r {
                    Ok(()) => reply.ok(),
                    Err(e) => reply.error(ferr(e)),
                }
            }
        }
    }

    /// Counts a request that began at `started` (see `ramd_store::metrics`).
    #[inline]
    fn record(&self, op: Op, bytes: u64, started: Instant, ok: bool) {
        if let Some(m) = &self.opts.metrics {
            m.record(op, bytes, started, ok);
        }
    }
}

fn ferr(e: Errno) -> FErrno {
    FErrno::from_i32(e.get())
}

fn file_type(k: Kind) -> FileType {
    match k {
        Kind::File => FileType::RegularFile,
        Kind::Dir => FileType::Directory,
        Kind::Symlink => FileType::Symlink,
        Kind::Fifo => FileType::NamedPipe,
        Kind::Socket => FileType::Socket,
        Kind::CharDev => FileType::CharDevice,
        Kind::BlockDev => FileType::BlockDevice,
    }
}

fn fattr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino.0),
        size: a.size,
        blocks: a.blocks,
        atime: a.atime,
        mtime: a.mtime,
        ctime: a.ctime,
        crtime: a.btime,
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev,
        blksize: 4096,
        flags: 0,
    }
}

fn caller(req: &Request) -> Caller {
    Caller {
        uid: req.uid(),
        gid: req.gid(),
        pid: req.pid(),
        umask: 0,
    }
}

fn set_time(t: TimeOrNow) -> SetTime {
    match t {
        TimeOrNow::SpecificTime(t) => SetTime::At(t),
        TimeOrNow::Now => SetTime::Now,
    }
}

fn entry(reply: ReplyEntry, r: crate::fs::Result<Attr>) {
    match r {
        Ok(a) => reply.entry(&TTL, &fattr(&a), GENERATION),
        Err(e) => reply.error(ferr(e)),
    }
}

/// A failed LOOKUP: ENOENT as an entry with inode 0, which the kernel
/// keeps as a negative dentry for `TTL`, so asking again for a missing
/// name (open(O_CREAT), a build's probes) is free; creating the name
/// through the kernel replaces it.
fn lookup_reply(reply: ReplyEntry, r: crate::fs::Result<Attr>) {
    match r {
        Err(e) if e == Errno::ENOENT => {
            let none = FileAttr {
                ino: INodeNo(0),
                size: 0,
                blocks: 0,
                atime: SystemTime::UNIX_EPOCH,
                mtime: SystemTime::UNIX_EPOCH,
                ctime: SystemTime::UNIX_EPOCH,
                crtime: SystemTime::UNIX_EPOCH,
                kind: FileType::RegularFile,
                perm: 0,
                nlink: 0,
                uid: 0,
                gid: 0,
                rdev: 0,
                blksize: 0,
                flags: 0,
            };
            reply.entry(&TTL, &none, Generation(0))
        }
        r => entry(reply, r),
    }
}

fn empty(reply: ReplyEmpty, r: crate::fs::Result<()>) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(ferr(e)),
    }
}

/// Page cache kept across opens (every change goes through this mount),
/// dropped or not used at all as `Fs` says (`fs/cache.rs`).
fn open_flags(fs: &Fs, ino: Ino) -> FopenFlags {
    match fs.open_cache(ino) {
        OpenCache::Keep => FopenFlags::FOPEN_KEEP_CACHE,
        OpenCache::Drop => FopenFlags::empty(),
        OpenCache::Direct => FopenFlags::FOPEN_DIRECT_IO,
    }
}

impl fuser::Filesystem for FuseFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE);
        // HANDLE_KILLPRIV_V2: without it the kernel asks for the
        // security.capability xattr before every write, a second round
        // trip per write; with it, dropping setuid/setgid is ours (fs.rs).
        let mut wanted = InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_HANDLE_KILLPRIV_V2
            | InitFlags::FUSE_PARALLEL_DIROPS
            // File handles (open_by_handle_at, NFS export) that work after
            // the kernel dropped the inode: it then looks up "." by number.
            | InitFlags::FUSE_EXPORT_SUPPORT
            // POSIX ACLs: the kernel checks them and keeps them in step
            // with chmod; new inodes inherit a default ACL here, which is
            // why the umask is left to `Fs` too (DONT_MASK).
            | InitFlags::FUSE_POSIX_ACL
            | InitFlags::FUSE_DONT_MASK
            // Idmapped mounts: the kernel maps the ids of requests made
            // through one before they come here (it needs default_permissions).
            | InitFlags::FUSE_ALLOW_IDMAP
            | InitFlags::FUSE_CACHE_SYMLINKS;
        // Not FUSE_ASYNC_DIO: the kernel skips its page-cache invalidation
        // after an asynchronous direct write, so a buffered read racing one
        // would stay cached with the old data. Dropping the range ourselves
        // before answering deadlocks: the held answers fill the kernel's
        // background slots, and the read-ahead whose page lock the drop
        // waits for is queued behind them. Without it an io_submit'ed
        // direct write is served synchronously (slower at depth, never stale).
        if self.opts.writeback_cache {
            // Files opened uncached near a full disk (fs/cache.rs) may
            // still be mapped shared (without it such an mmap fails with
            // ENODEV); a mapping goes through the page cache, so its
            // errors reach msync, fsync or close.
            wanted |= InitFlags::FUSE_WRITEBACK_CACHE | InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP;
        }
        // Ask only for what this kernel offers.
        let offered = wanted & config.capabilities();
        if config.add_capabilities(offered).is_err() {
            log::warn!("kernel refused FUSE capabilities {offered:?}");
        }
        if self.opts.writeback_cache && !offered.contains(InitFlags::FUSE_WRITEBACK_CACHE) {
            log::warn!("this kernel has no FUSE writeback cache; writes go through");
        }
        self.fs
            .set_kernel_times(offered.contains(InitFlags::FUSE_WRITEBACK_CACHE));
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        lookup_reply(reply, self.fs.lookup(Ino(parent.0), name));
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.fs.forget(Ino(ino.0), nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        // With a handle: the kernel is about to take a cached write.
        if fh.is_some() {
            if let Err(e) = self.fs.write_allowed(Ino(ino.0)) {
                return reply.error(ferr(e));
            }
        }
        match self.fs.getattr(Ino(ino.0)) {
            Ok(a) => reply.attr(&TTL, &fattr(&a)),
            Err(e) => reply.error(ferr(e)),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let set = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(set_time),
            mtime: mtime.map(set_time),
            ctime,
        };
        match self.fs.setattr(caller(req), Ino(ino.0), set) {
            Ok(a) => reply.attr(&TTL, &fattr(&a)),
            Err(e) => reply.error(ferr(e)),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.fs.readlink(Ino(ino.0)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(ferr(e)),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let who = Caller {
            umask,
            ..caller(req)
        };
        entry(reply, self.fs.mknod(who, Ino(parent.0), name, mode, rdev));
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        reply: ReplyEntry,
    ) {
        let who = Caller {
            umask,
            ..caller(req)
        };
        entry(reply, self.fs.mkdir(who, Ino(parent.0), name, mode));
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fs.unlink(Ino(parent.0), name));
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fs.rmdir(Ino(parent.0), name));
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let r = self
            .fs
            .symlink(caller(req), Ino(parent.0), link_name, target.as_os_str());
        entry(reply, r);
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = self.fs.rename(
            caller(req),
            Ino(parent.0),
            name,
            Ino(newparent.0),
            newname,
            flags.bits(),
        );
        empty(reply, r);
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        entry(reply, self.fs.link(Ino(ino.0), Ino(newparent.0), newname));
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.open(Ino(ino.0), flags.0) {
            Ok(()) => reply.opened(FileHandle(0), open_flags(&self.fs, Ino(ino.0))),
            Err(e) => reply.error(ferr(e)),
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        thread_local! {
            // One buffer per FUSE thread: reads are up to 1 MiB each.
            static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        let started = Instant::now();
        BUF.with_borrow_mut(|buf| {
            if buf.len() < size as usize {
                buf.resize(size as usize, 0);
            }
            let r = self.fs.read(Ino(ino.0), offset, &mut buf[..size as usize]);
            let n = *r.as_ref().unwrap_or(&0);
            self.record(Op::Read, n as u64, started, r.is_ok());
            match r {
                Ok(n) => reply.data(&buf[..n]),
                Err(e) => reply.error(ferr(e)),
            }
        });
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        // Writes flushed from the kernel's cache must fail whole, so that
        // the error is kept for fsync/close; a program's own write may be short.
        let short_ok = !write_flags.contains(WriteFlags::FUSE_WRITE_CACHE);
        let kill = write_flags.contains(WriteFlags::FUSE_WRITE_KILL_SUIDGID);
        let started = Instant::now();
        let r = self.fs.write(
            &self.fs.change(),
            Ino(ino.0),
            offset,
            data,
            short_ok,
            caller(req),
            kill,
        );
        let n = *r.as_ref().unwrap_or(&0);
        self.record(Op::Write, n as u64, started, r.is_ok());
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(ferr(e)),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // Nothing is buffered here, so close() needs no round trip: ENOSYS
        // tells the kernel to stop sending FLUSH (it then succeeds at once).
        reply.error(FErrno::ENOSYS);
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.fs.release(Ino(ino.0));
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // Without `sync`, once the data is here it is as durable as a RAM
        // disk makes it: ENOSYS makes the kernel stop sending FSYNC and
        // succeed locally (after writing back any cached pages, which still
        // reach us).
        self.sync(reply);
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.fs.opendir(Ino(ino.0)) {
            Ok(fh) => reply.opened(FileHandle(fh.0), FopenFlags::empty()),
            Err(e) => reply.error(ferr(e)),
        }
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.fs.dir_entries(Ino(ino.0), Fh(fh.0), offset) {
            Ok(e) => e,
            Err(e) => return reply.error(ferr(e)),
        };
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            // The offset handed back is where the next call resumes.
            if reply.add(INodeNo(e.ino.0), i as u64 + 1, file_type(e.kind), &e.name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries = match self.fs.dir_entries(Ino(ino.0), Fh(fh.0), offset) {
            Ok(e) => e,
            Err(e) => return reply.error(ferr(e)),
        };
        for (i, e) in entries.iter().enumerate().skip(offset as usize) {
            let dot = e.name == "." || e.name == "..";
            // The kernel counts a lookup for every entry but "." and "..".
            let attr = if dot {
                self.fs.getattr(e.ino)
            } else {
                self.fs.lookup_ino(e.ino)
            };
            let Ok(attr) = attr else {
                // Removed since opendir: leave it out.
                continue;
            };
            if reply.add(
                INodeNo(e.ino.0),
                i as u64 + 1,
                &e.name,
                &TTL,
                &fattr(&attr),
                GENERATION,
            ) {
                // Not sent: give back the lookup just counted.
                if !dot {
                    self.fs.forget(e.ino, 1);
                }
                break;
            }
        }
        reply.ok();
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.fs.releasedir(Fh(fh.0));
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        // As for fsync: without `sync`, nothing to make durable, so stop
        // the round trips.
        self.sync(reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let (blocks, bfree, files, ffree) = self.fs.statfs();
        reply.statfs(
            blocks,
            bfree,
            bfree,
            files,
            ffree,
            4096,
            NAME_MAX as u32,
            4096,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        empty(reply, self.fs.setxattr(Ino(ino.0), name, value, flags));
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        xattr_reply(reply, size, self.fs.getxattr(Ino(ino.0), name));
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        xattr_reply(reply, size, self.fs.listxattr(Ino(ino.0)));
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        empty(reply, self.fs.removexattr(Ino(ino.0), name));
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: AccessFlags, reply: ReplyEmpty) {
        // With default_permissions the kernel checks access itself.
        reply.ok();
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        let who = Caller {
            umask,
            ..caller(req)
        };
        match self.fs.create(who, Ino(parent.0), name, mode) {
            Ok(a) => reply.created(
                &TTL,
                &fattr(&a),
                GENERATION,
                FileHandle(0),
                open_flags(&self.fs, a.ino),
            ),
            Err(e) => reply.error(ferr(e)),
        }
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let started = Instant::now();
        let r = self
            .fs
            .fallocate(caller(req), Ino(ino.0), offset, length, mode);
        let op = if mode & libc::FALLOC_FL_PUNCH_HOLE != 0 {
            Op::Trim
        } else if mode & libc::FALLOC_FL_ZERO_RANGE != 0 {
            Op::Zero
        } else {
            Op::Other
        };
        self.record(op, length, started, r.is_ok());
        empty(reply, r);
    }

    fn lseek(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: i64,
        whence: i32,
        reply: ReplyLseek,
    ) {
        let whence = match whence {
            libc::SEEK_DATA => Whence::Data,
            libc::SEEK_HOLE => Whence::Hole,
            // The kernel handles SEEK_SET/CUR/END itself.
            _ => return reply.error(FErrno::EINVAL),
        };
        if offset < 0 {
            return reply.error(FErrno::ENXIO);
        }
        let started = Instant::now();
        let r = self.fs.seek(Ino(ino.0), offset as u64, whence);
        self.record(Op::Other, 0, started, r.is_ok());
        match r {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(ferr(e)),
        }
    }

    fn ioctl(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        // The kernel sends chattr's flags as an unsigned int, whichever
        // width the command's number says (fs/fuse/ioctl.c).
        const GETFLAGS: [u32; 2] = [libc::FS_IOC_GETFLAGS as u32, libc::FS_IOC32_GETFLAGS as u32];
        const SETFLAGS: [u32; 2] = [libc::FS_IOC_SETFLAGS as u32, libc::FS_IOC32_SETFLAGS as u32];
        // _IOR('X', 31, struct fsxattr): the kernel asks for it before
        // it sets chattr flags, and for a fileattr query.
        const FSGETXATTR: u32 = 0x801c_581f;
        let ino = Ino(ino.0);
        if cmd == FSGETXATTR {
            match self.fs.flags(ino) {
                Ok(f) => {
                    // struct fsxattr: xflags, then four u32 and 8 bytes
                    // of padding, all zero here.
                    let mut b = [0u8; 28];
                    b[..4].copy_from_slice(&xflags(f).to_ne_bytes());
                    reply.ioctl(0, &b[..b.len().min(out_size as usize)]);
                }
                Err(e) => reply.error(ferr(e)),
            }
        } else if GETFLAGS.contains(&cmd) {
            match self.fs.flags(ino) {
                Ok(f) => {
                    let b = f.to_ne_bytes();
                    reply.ioctl(0, &b[..b.len().min(out_size as usize)]);
                }
                Err(e) => reply.error(ferr(e)),
            }
        } else if SETFLAGS.contains(&cmd) {
            let Some(b) = in_data.get(..4) else {
                return reply.error(FErrno::EINVAL);
            };
            let f = u32::from_ne_bytes(b.try_into().expect("4 bytes"));
            match self.fs.set_flags(ino, f) {
                Ok(()) => reply.ioctl(0, &[]),
                Err(e) => reply.error(ferr(e)),
            }
        } else {
            // ENOTTY, as tmpfs; said once per command, not once per call.
            if self
                .unknown_ioctls
                .lock()
                .expect("not poisoned")
                .insert(cmd)
            {
                log::info!("unsupported ioctl {cmd:#x} (answered ENOTTY; not logged again)");
            }
            reply.error(FErrno::ENOTTY);
        }
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        // One reply carries a u32 count; the kernel loops for the rest.
        let len = len.min(1 << 30);
        let started = Instant::now();
        let r = self.fs.copy_range(
            caller(req),
            Ino(ino_in.0),
            offset_in,
            Ino(ino_out.0),
            offset_out,
            len,
        );
        // A copy inside the disk: counted as the write it ends in.
        let n = *r.as_ref().unwrap_or(&0);
        self.record(Op::Write, n, started, r.is_ok());
        match r {
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(ferr(e)),
        }
    }
}

/// The FS_XFLAG_* spelling of chattr flags (only those `Fs` keeps).
fn xflags(flags: u32) -> u32 {
    use crate::fs::{FL_APPEND, FL_IMMUTABLE, FL_NOATIME, FL_NODUMP};
    [
        (FL_IMMUTABLE, 0x8),
        (FL_APPEND, 0x10),
        (FL_NOATIME, 0x40),
        (FL_NODUMP, 0x80),
    ]
    .iter()
    .filter(|(fl, _)| flags & fl != 0)
    .fold(0, |x, (_, xf)| x | xf)
}

fn xattr_reply(reply: ReplyXattr, size: u32, r: crate::fs::Result<Vec<u8>>) {
    match r {
        Err(e) => reply.error(ferr(e)),
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(FErrno::ERANGE),
        Ok(v) => reply.data(&v),
    }
}

/// Whether `path` is already a mount point (listed in /proc/self/mountinfo).
pub fn is_mount_point(path: &Path) -> bool {
    mount_device(path).is_some()
}

/// The device (major, minor) of the topmost mount at `path`, from
/// /proc/self/mountinfo. Unlike stat(2), this never asks the filesystem,
/// so it is safe on a FUSE mount whose daemon is not serving yet.
pub fn mount_device(path: &Path) -> Option<(u32, u32)> {
    let line = mountinfo_line(path)?;
    let dev = line.split(' ').nth(2)?;
    let (major, minor) = dev.split_once(':')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// Whether the topmost mount at `path` is read-only (the mount's own flag
/// or its superblock's), from /proc/self/mountinfo: a remount changes it
/// behind the filesystem's back.
pub fn mount_read_only(path: &Path) -> Option<bool> {
    let line = mountinfo_line(path)?;
    let mount_opts = line.split(' ').nth(5)?;
    let (_, tail) = line.split_once(" - ")?;
    let super_opts = tail.split(' ').nth(2)?;
    let ro = |opts: &str| opts.split(',').any(|o| o == "ro");
    Some(ro(mount_opts) || ro(super_opts))
}

/// The /proc/self/mountinfo line of the topmost mount at `path`.
fn mountinfo_line(path: &Path) -> Option<String> {
    let canon = path.canonicalize().ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let want = canon.as_os_str().as_bytes();
    // Later lines are mounted on top of earlier ones.
    info.lines()
        .rev()
        .find(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|mp| unescape_mountinfo(mp) == want)
        })
        .map(str::to_string)
}

/// mountinfo writes space, tab, newline and backslash as octal escapes.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}
