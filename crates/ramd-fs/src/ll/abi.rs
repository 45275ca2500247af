//! The FUSE kernel ABI (`include/uapi/linux/fuse.h`, protocol 7.42): opcode
//! numbers, flags, and the layouts of the structures ramd reads and writes.
//! Every structure is native-endian with no implicit padding; decoding
//! checks lengths first, so a short or malformed request is an errno,
//! never a panic.

/// The protocol version ramd speaks (7.42 adds FUSE over io_uring).
pub const KERNEL_VERSION: u32 = 7;
pub const KERNEL_MINOR_VERSION: u32 = 42;
/// The root directory's node id.
pub const ROOT_ID: u64 = 1;

/// Opcodes (`enum fuse_opcode`).
pub mod op {
    pub const LOOKUP: u32 = 1;
    pub const FORGET: u32 = 2;
    pub const GETATTR: u32 = 3;
    pub const SETATTR: u32 = 4;
    pub const READLINK: u32 = 5;
    pub const SYMLINK: u32 = 6;
    pub const MKNOD: u32 = 8;
    pub const MKDIR: u32 = 9;
    pub const UNLINK: u32 = 10;
    pub const RMDIR: u32 = 11;
    pub const RENAME: u32 = 12;
    pub const LINK: u32 = 13;
    pub const OPEN: u32 = 14;
    pub const READ: u32 = 15;
    pub const WRITE: u32 = 16;
    pub const STATFS: u32 = 17;
    pub const RELEASE: u32 = 18;
    pub const FSYNC: u32 = 20;
    pub const SETXATTR: u32 = 21;
    pub const GETXATTR: u32 = 22;
    pub const LISTXATTR: u32 = 23;
    pub const REMOVEXATTR: u32 = 24;
    pub const FLUSH: u32 = 25;
    pub const INIT: u32 = 26;
    pub const OPENDIR: u32 = 27;
    pub const READDIR: u32 = 28;
    pub const RELEASEDIR: u32 = 29;
    pub const FSYNCDIR: u32 = 30;
    pub const GETLK: u32 = 31;
    pub const SETLK: u32 = 32;
    pub const SETLKW: u32 = 33;
    pub const ACCESS: u32 = 34;
    pub const CREATE: u32 = 35;
    pub const INTERRUPT: u32 = 36;
    pub const BMAP: u32 = 37;
    pub const DESTROY: u32 = 38;
    pub const IOCTL: u32 = 39;
    pub const POLL: u32 = 40;
    pub const NOTIFY_REPLY: u32 = 41;
    pub const BATCH_FORGET: u32 = 42;
    pub const FALLOCATE: u32 = 43;
    pub const READDIRPLUS: u32 = 44;
    pub const RENAME2: u32 = 45;
    pub const LSEEK: u32 = 46;
    pub const COPY_FILE_RANGE: u32 = 47;
    pub const SETUPMAPPING: u32 = 48;
    pub const REMOVEMAPPING: u32 = 49;
    pub const SYNCFS: u32 = 50;
    pub const TMPFILE: u32 = 51;
    pub const STATX: u32 = 52;
}

/// Notification codes (`enum fuse_notify_code`), sent as the out header's
/// error with unique 0.
pub mod notify_code {
    pub const INVAL_INODE: i32 = 2;
    pub const INVAL_ENTRY: i32 = 3;
    pub const DELETE: i32 = 6;
}

/// INIT flags; bits 32..63 travel in `flags2`.
pub mod init {
    pub const ASYNC_READ: u64 = 1 << 0;
    pub const POSIX_LOCKS: u64 = 1 << 1;
    pub const ATOMIC_O_TRUNC: u64 = 1 << 3;
    pub const EXPORT_SUPPORT: u64 = 1 << 4;
    pub const BIG_WRITES: u64 = 1 << 5;
    pub const DONT_MASK: u64 = 1 << 6;
    pub const FLOCK_LOCKS: u64 = 1 << 10;
    pub const AUTO_INVAL_DATA: u64 = 1 << 12;
    pub const DO_READDIRPLUS: u64 = 1 << 13;
    pub const READDIRPLUS_AUTO: u64 = 1 << 14;
    pub const ASYNC_DIO: u64 = 1 << 15;
    pub const WRITEBACK_CACHE: u64 = 1 << 16;
    pub const NO_OPEN_SUPPORT: u64 = 1 << 17;
    pub const PARALLEL_DIROPS: u64 = 1 << 18;
    pub const HANDLE_KILLPRIV: u64 = 1 << 19;
    pub const POSIX_ACL: u64 = 1 << 20;
    pub const ABORT_ERROR: u64 = 1 << 21;
    pub const MAX_PAGES: u64 = 1 << 22;
    pub const CACHE_SYMLINKS: u64 = 1 << 23;
    pub const NO_OPENDIR_SUPPORT: u64 = 1 << 24;
    pub const EXPLICIT_INVAL_DATA: u64 = 1 << 25;
    pub const HANDLE_KILLPRIV_V2: u64 = 1 << 28;
    pub const SETXATTR_EXT: u64 = 1 << 29;
    pub const INIT_EXT: u64 = 1 << 30;
    pub const SECURITY_CTX: u64 = 1 << 32;
    pub const CREATE_SUPP_GROUP: u64 = 1 << 34;
    pub const HAS_EXPIRE_ONLY: u64 = 1 << 35;
    pub const DIRECT_IO_ALLOW_MMAP: u64 = 1 << 36;
    pub const PASSTHROUGH: u64 = 1 << 37;
    pub const NO_EXPORT_SUPPORT: u64 = 1 << 38;
    pub const HAS_RESEND: u64 = 1 << 39;
    pub const ALLOW_IDMAP: u64 = 1 << 40;
    pub const OVER_IO_URING: u64 = 1 << 41;
}

/// `fuse_setattr_in.valid` bits.
pub mod fattr {
    pub const MODE: u32 = 1 << 0;
    pub const UID: u32 = 1 << 1;
    pub const GID: u32 = 1 << 2;
    pub const SIZE: u32 = 1 << 3;
    pub const ATIME: u32 = 1 << 4;
    pub const MTIME: u32 = 1 << 5;
    pub const FH: u32 = 1 << 6;
    pub const ATIME_NOW: u32 = 1 << 7;
    pub const MTIME_NOW: u32 = 1 << 8;
    pub const LOCKOWNER: u32 = 1 << 9;
    pub const CTIME: u32 = 1 << 10;
    pub const KILL_SUIDGID: u32 = 1 << 11;
}

/// `fuse_open_out.open_flags` bits.
pub const FOPEN_DIRECT_IO: u32 = 1 << 0;
pub const FOPEN_KEEP_CACHE: u32 = 1 << 1;
/// Reads, writes, splice and mmap of this open go to the backing file
/// named by `fuse_open_out.backing_id` (FUSE_PASSTHROUGH).
pub const FOPEN_PASSTHROUGH: u32 = 1 << 7;
/// `fuse_write_in.write_flags` bits.
pub const WRITE_CACHE: u32 = 1 << 0;
pub const WRITE_KILL_SUIDGID: u32 = 1 << 2;
/// `fuse_statx_in.getattr_flags`/`fuse_getattr_in` bit: `fh` is valid.
pub const GETATTR_FH: u32 = 1 << 0;

/// `_IOR(229, 0, uint32_t)`: gives a new /dev/fuse fd the connection of
/// another, with its own queue of requests being processed.
pub const FUSE_DEV_IOC_CLONE: libc::c_ulong = 0x8004_e500;
/// `_IOW(229, 1, struct fuse_backing_map)`: registers a backing file (an
/// fd, flags 0, padding 0: 16 bytes); returns its backing id.
pub const FUSE_DEV_IOC_BACKING_OPEN: libc::c_ulong = 0x4010_e501;
/// `_IOW(229, 2, uint32_t)`: drops a backing id.
pub const FUSE_DEV_IOC_BACKING_CLOSE: libc::c_ulong = 0x4004_e502;

/// Sizes of the fixed structures.
pub const INIT_IN_LEN: usize = 64;
/// The `fuse_init_in` of protocols before 7.36 (no flags2).
pub const INIT_IN_COMPAT_LEN: usize = 16;
pub const INIT_OUT_LEN: usize = 64;
pub const ATTR_LEN: usize = 88;
pub const ENTRY_OUT_LEN: usize = 40 + ATTR_LEN;
pub const ATTR_OUT_LEN: usize = 16 + ATTR_LEN;
pub const GETATTR_IN_LEN: usize = 16;
pub const SETATTR_IN_LEN: usize = 88;
pub const OPEN_IN_LEN: usize = 8;
pub const OPEN_OUT_LEN: usize = 16;
pub const READ_IN_LEN: usize = 40;
pub const WRITE_IN_LEN: usize = 40;
pub const WRITE_OUT_LEN: usize = 8;
pub const MKNOD_IN_LEN: usize = 16;
pub const MKDIR_IN_LEN: usize = 8;
pub const RENAME_IN_LEN: usize = 8;
pub const RENAME2_IN_LEN: usize = 16;
pub const LINK_IN_LEN: usize = 8;
pub const CREATE_IN_LEN: usize = 16;
pub const RELEASE_IN_LEN: usize = 24;
pub const FLUSH_IN_LEN: usize = 24;
pub const FSYNC_IN_LEN: usize = 16;
/// Without FUSE_SETXATTR_EXT: size and flags only.
pub const SETXATTR_IN_LEN: usize = 8;
/// With FUSE_SETXATTR_EXT: then `setxattr_flags` and padding.
pub const SETXATTR_EXT_IN_LEN: usize = 16;
/// `fuse_setxattr_in.setxattr_flags`: the kernel found the caller of a
/// POSIX ACL change outside the file's group and without CAP_FSETID.
pub const SETXATTR_ACL_KILL_SGID: u32 = 1 << 0;
pub const GETXATTR_IN_LEN: usize = 8;
pub const GETXATTR_OUT_LEN: usize = 8;
pub const LK_IN_LEN: usize = 48;
pub const ACCESS_IN_LEN: usize = 8;
pub const INTERRUPT_IN_LEN: usize = 8;
pub const BMAP_IN_LEN: usize = 16;
pub const IOCTL_IN_LEN: usize = 32;
pub const IOCTL_OUT_LEN: usize = 16;
pub const POLL_IN_LEN: usize = 24;
pub const FALLOCATE_IN_LEN: usize = 32;
pub const LSEEK_IN_LEN: usize = 24;
pub const LSEEK_OUT_LEN: usize = 8;
pub const COPY_FILE_RANGE_IN_LEN: usize = 56;
pub const STATFS_OUT_LEN: usize = 80;
pub const FORGET_IN_LEN: usize = 8;
pub const BATCH_FORGET_IN_LEN: usize = 8;
pub const FORGET_ONE_LEN: usize = 16;
pub const SYNCFS_IN_LEN: usize = 8;
pub const STATX_IN_LEN: usize = 24;
pub const STATX_LEN: usize = 256;
pub const STATX_OUT_LEN: usize = 32 + STATX_LEN;
/// `fuse_dirent` before its name.
pub const DIRENT_LEN: usize = 24;
/// `fuse_direntplus` before its name.
pub const DIRENTPLUS_LEN: usize = ENTRY_OUT_LEN + DIRENT_LEN;
pub const NOTIFY_INVAL_INODE_LEN: usize = 24;
pub const NOTIFY_INVAL_ENTRY_LEN: usize = 16;
pub const NOTIFY_DELETE_LEN: usize = 24;

/// Reads native-endian fields in order; `None` once past the end.
pub struct Rd<'a>(pub &'a [u8]);

impl<'a> Rd<'a> {
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    pub fn u16(&mut self) -> Option<u16> {
        Some(u16::from_ne_bytes(self.bytes(2)?.try_into().ok()?))
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_ne_bytes(self.bytes(4)?.try_into().ok()?))
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_ne_bytes(self.bytes(8)?.try_into().ok()?))
    }
}

/// Writes native-endian fields in order into a reply buffer; remembers an
/// overflow instead of panicking ([`Wr::written`] is then `None`).
pub struct Wr<'a> {
    buf: &'a mut [u8],
    at: usize,
    overflow: bool,
}

impl<'a> Wr<'a> {
    pub fn new(buf: &'a mut [u8]) -> Wr<'a> {
        Wr {
            buf,
            at: 0,
            overflow: false,
        }
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        match self.buf.get_mut(self.at..self.at + b.len()) {
            Some(dst) if !self.overflow => {
                dst.copy_from_slice(b);
                self.at += b.len();
            }
            _ => self.overflow = true,
        }
        self
    }
    pub fn zeros(&mut self, n: usize) -> &mut Self {
        match self.buf.get_mut(self.at..self.at + n) {
            Some(dst) if !self.overflow => {
                dst.fill(0);
                self.at += n;
            }
            _ => self.overflow = true,
        }
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.bytes(&v.to_ne_bytes())
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_ne_bytes())
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.bytes(&v.to_ne_bytes())
    }
    pub fn i64(&mut self, v: i64) -> &mut Self {
        self.bytes(&v.to_ne_bytes())
    }
    /// Bytes written so far; `None` if something did not fit.
    pub fn written(&self) -> Option<usize> {
        (!self.overflow).then_some(self.at)
    }
    /// Room left.
    pub fn room(&self) -> usize {
        self.buf.len().saturating_sub(self.at)
    }
}

/// `fuse_init_in`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitIn {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    /// `flags | flags2 << 32` (flags2 only with FUSE_INIT_EXT).
    pub flags: u64,
}

impl InitIn {
    pub fn parse(b: &[u8]) -> Option<InitIn> {
        let mut r = Rd(b);
        let (major, minor, max_readahead, flags) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
        let mut flags = flags as u64;
        if flags & init::INIT_EXT != 0 {
            flags |= (r.u32()? as u64) << 32;
        }
        Some(InitIn {
            major,
            minor,
            max_readahead,
            flags,
        })
    }
}

/// `fuse_init_out`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InitOut {
    pub major: u32,
    pub minor: u32,
    pub max_readahead: u32,
    pub flags: u64,
    pub max_background: u16,
    pub congestion_threshold: u16,
    pub max_write: u32,
    pub time_gran: u32,
    pub max_pages: u16,
    /// How deep filesystems may stack under this one (FUSE_PASSTHROUGH:
    /// at least 1, or the kernel leaves passthrough off).
    pub max_stack_depth: u32,
}

impl InitOut {
    pub fn encode(&self, w: &mut Wr<'_>) {
        w.u32(self.major)
            .u32(self.minor)
            .u32(self.max_readahead)
            .u32(self.flags as u32)
            .u16(self.max_background)
            .u16(self.congestion_threshold)
            .u32(self.max_write)
            .u32(self.time_gran)
            .u16(self.max_pages)
            .u16(0) // map_alignment
            .u32((self.flags >> 32) as u32)
            .u32(self.max_stack_depth)
            .u16(0) // request_timeout
            .zeros(22);
    }
}

/// `fuse_attr`, as ramd fills it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FAttr {
    pub ino: u64,
    pub size: u64,
    pub blocks: u64,
    /// Seconds (may be before 1970) and nanoseconds.
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub blksize: u32,
}

impl FAttr {
    pub fn encode(&self, w: &mut Wr<'_>) {
        w.u64(self.ino)
            .u64(self.size)
            .u64(self.blocks)
            .i64(self.atime.0)
            .i64(self.mtime.0)
            .i64(self.ctime.0)
            .u32(self.atime.1)
            .u32(self.mtime.1)
            .u32(self.ctime.1)
            .u32(self.mode)
            .u32(self.nlink)
            .u32(self.uid)
            .u32(self.gid)
            .u32(self.rdev)
            .u32(self.blksize)
            .u32(0); // flags
    }
}

/// A timeout as `fuse_entry_out`/`fuse_attr_out` carry it.
fn valid(w: &mut Wr<'_>, secs: u64) {
    w.u64(secs);
}

/// `fuse_entry_out`.
pub fn encode_entry(w: &mut Wr<'_>, generation: u64, ttl_secs: u64, attr_ttl: u64, attr: &FAttr) {
    w.u64(attr.ino).u64(generation);
    valid(w, ttl_secs); // entry_valid
    valid(w, attr_ttl); // attr_valid
    w.u32(0).u32(0); // their nanoseconds
    attr.encode(w);
}

/// `fuse_attr_out`.
pub fn encode_attr_out(w: &mut Wr<'_>, ttl_secs: u64, attr: &FAttr) {
    w.u64(ttl_secs).u32(0).u32(0);
    attr.encode(w);
}

/// `fuse_open_out`; `backing_id` counts with FOPEN_PASSTHROUGH only.
pub fn encode_open_out(w: &mut Wr<'_>, fh: u64, open_flags: u32, backing_id: i32) {
    w.u64(fh).u32(open_flags).u32(backing_id as u32);
}

/// `fuse_dirent` (8-byte aligned); false, writing nothing, if it does not
/// fit in `w`.
pub fn encode_dirent(w: &mut Wr<'_>, ino: u64, off: u64, typ: u32, name: &[u8]) -> bool {
    let len = dirent_len(DIRENT_LEN, name.len());
    if len > w.room() {
        return false;
    }
    w.u64(ino)
        .u64(off)
        .u32(name.len() as u32)
        .u32(typ)
        .bytes(name);
    w.zeros(len - DIRENT_LEN - name.len());
    true
}

/// The padded length of a dirent whose fixed part is `fixed` bytes.
pub fn dirent_len(fixed: usize, name_len: usize) -> usize {
    (fixed + name_len + 7) & !7
}

/// `fuse_setattr_in`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SetattrIn {
    pub valid: u32,
    pub fh: u64,
    pub size: u64,
    pub atime: (u64, u32),
    pub mtime: (u64, u32),
    pub ctime: (u64, u32),
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl SetattrIn {
    pub fn parse(b: &[u8]) -> Option<SetattrIn> {
        let mut r = Rd(b.get(..SETATTR_IN_LEN)?);
        let valid = r.u32()?;
        r.u32()?; // padding
        let fh = r.u64()?;
        let size = r.u64()?;
        r.u64()?; // lock_owner
        let (atime, mtime, ctime) = (r.u64()?, r.u64()?, r.u64()?);
        let (an, mn, cn) = (r.u32()?, r.u32()?, r.u32()?);
        let mode = r.u32()?;
        r.u32()?;
        let (uid, gid) = (r.u32()?, r.u32()?);
        Some(SetattrIn {
            valid,
            fh,
            size,
            atime: (atime, an),
            mtime: (mtime, mn),
            ctime: (ctime, cn),
            mode,
            uid,
            gid,
        })
    }
}

/// `fuse_read_in` and `fuse_write_in` share a layout.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RwIn {
    pub fh: u64,
    pub offset: u64,
    pub size: u32,
    /// read_flags or write_flags.
    pub rw_flags: u32,
    pub flags: u32,
}

impl RwIn {
    pub fn parse(b: &[u8]) -> Option<RwIn> {
        let mut r = Rd(b.get(..READ_IN_LEN)?);
        let (fh, offset, size, rw_flags) = (r.u64()?, r.u64()?, r.u32()?, r.u32()?);
        r.u64()?; // lock_owner
        let flags = r.u32()?;
        Some(RwIn {
            fh,
            offset,
            size,
            rw_flags,
            flags,
        })
    }
}

/// `fuse_copy_file_range_in`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyRangeIn {
    pub fh_in: u64,
    pub off_in: u64,
    pub nodeid_out: u64,
    pub fh_out: u64,
    pub off_out: u64,
    pub len: u64,
    pub flags: u64,
}

impl CopyRangeIn {
    pub fn parse(b: &[u8]) -> Option<CopyRangeIn> {
        let mut r = Rd(b.get(..COPY_FILE_RANGE_IN_LEN)?);
        Some(CopyRangeIn {
            fh_in: r.u64()?,
            off_in: r.u64()?,
            nodeid_out: r.u64()?,
            fh_out: r.u64()?,
            off_out: r.u64()?,
            len: r.u64()?,
            flags: r.u64()?,
        })
    }
}

/// `fuse_ioctl_in`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoctlIn {
    pub fh: u64,
    pub flags: u32,
    pub cmd: u32,
    pub arg: u64,
    pub in_size: u32,
    pub out_size: u32,
}

impl IoctlIn {
    pub fn parse(b: &[u8]) -> Option<IoctlIn> {
        let mut r = Rd(b.get(..IOCTL_IN_LEN)?);
        Some(IoctlIn {
            fh: r.u64()?,
            flags: r.u32()?,
            cmd: r.u32()?,
            arg: r.u64()?,
            in_size: r.u32()?,
            out_size: r.u32()?,
        })
    }
}

/// `fuse_statx_in`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatxIn {
    pub getattr_flags: u32,
    pub fh: u64,
    pub sx_flags: u32,
    pub sx_mask: u32,
}

impl StatxIn {
    pub fn parse(b: &[u8]) -> Option<StatxIn> {
        let mut r = Rd(b.get(..STATX_IN_LEN)?);
        let getattr_flags = r.u32()?;
        r.u32()?; // reserved
        Some(StatxIn {
            getattr_flags,
            fh: r.u64()?,
            sx_flags: r.u32()?,
            sx_mask: r.u32()?,
        })
    }
}

/// The first NUL-terminated string of `b` and what follows it; `None`
/// without a NUL.
pub fn cstr(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let nul = b.iter().position(|&c| c == 0)?;
    Some((&b[..nul], &b[nul + 1..]))
}

/// The `arg0` length of every opcode: the fixed structure the kernel puts
/// before names and data. 0 for opcodes with none, or unknown.
pub fn arg0_len(opcode: u32) -> usize {
    match opcode {
        op::FORGET => FORGET_IN_LEN,
        op::GETATTR => GETATTR_IN_LEN,
        op::SETATTR => SETATTR_IN_LEN,
        op::MKNOD => MKNOD_IN_LEN,
        op::MKDIR => MKDIR_IN_LEN,
        op::RENAME => RENAME_IN_LEN,
        op::LINK => LINK_IN_LEN,
        op::OPEN | op::OPENDIR => OPEN_IN_LEN,
        op::READ | op::READDIR | op::READDIRPLUS => READ_IN_LEN,
        op::WRITE => WRITE_IN_LEN,
        op::RELEASE | op::RELEASEDIR => RELEASE_IN_LEN,
        op::FSYNC | op::FSYNCDIR => FSYNC_IN_LEN,
        op::SETXATTR => SETXATTR_IN_LEN,
        op::GETXATTR | op::LISTXATTR => GETXATTR_IN_LEN,
        op::FLUSH => FLUSH_IN_LEN,
        op::INIT => INIT_IN_LEN,
        op::GETLK | op::SETLK | op::SETLKW => LK_IN_LEN,
        op::ACCESS => ACCESS_IN_LEN,
        op::CREATE | op::TMPFILE => CREATE_IN_LEN,
        op::INTERRUPT => INTERRUPT_IN_LEN,
        op::BMAP => BMAP_IN_LEN,
        op::IOCTL => IOCTL_IN_LEN,
        op::POLL => POLL_IN_LEN,
        op::BATCH_FORGET => BATCH_FORGET_IN_LEN,
        op::FALLOCATE => FALLOCATE_IN_LEN,
        op::RENAME2 => RENAME2_IN_LEN,
        op::LSEEK => LSEEK_IN_LEN,
        op::COPY_FILE_RANGE => COPY_FILE_RANGE_IN_LEN,
        op::SYNCFS => SYNCFS_IN_LEN,
        op::STATX => STATX_IN_LEN,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_have_the_kernel_sizes() {
        let mut b = [0u8; 512];
        let mut w = Wr::new(&mut b);
        InitOut::default().encode(&mut w);
        assert_eq!(w.written(), Some(INIT_OUT_LEN));
        let mut w = Wr::new(&mut b);
        FAttr::default().encode(&mut w);
        assert_eq!(w.written(), Some(ATTR_LEN));
        let mut w = Wr::new(&mut b);
        encode_entry(&mut w, 1, 1, 1, &FAttr::default());
        assert_eq!(w.written(), Some(ENTRY_OUT_LEN));
        let mut w = Wr::new(&mut b);
        encode_attr_out(&mut w, 1, &FAttr::default());
        assert_eq!(w.written(), Some(ATTR_OUT_LEN));
        let mut w = Wr::new(&mut b);
        assert!(encode_dirent(&mut w, 1, 1, 4, b"abc"));
        assert_eq!(w.written(), Some(32), "24 + 3, padded to 8");
    }

    #[test]
    fn writer_overflow_is_reported_not_a_panic() {
        let mut b = [0u8; 10];
        let mut w = Wr::new(&mut b);
        w.u64(1).u64(2);
        assert_eq!(w.written(), None);
        let mut w = Wr::new(&mut b);
        assert!(!encode_dirent(&mut w, 1, 1, 4, b"x"));
        assert_eq!(w.written(), Some(0));
    }

    #[test]
    fn init_in_reads_flags2_only_with_init_ext() {
        let mut b = [0u8; 64];
        b[0..4].copy_from_slice(&7u32.to_ne_bytes());
        b[4..8].copy_from_slice(&42u32.to_ne_bytes());
        b[12..16].copy_from_slice(&(init::INIT_EXT as u32 | 1).to_ne_bytes());
        b[16..20].copy_from_slice(&(1u32 << 9).to_ne_bytes());
        let i = InitIn::parse(&b).unwrap();
        assert_eq!(i.flags, init::INIT_EXT | 1 | init::OVER_IO_URING);
        // A pre-7.36 kernel's 16 bytes: no flags2.
        b[12..16].copy_from_slice(&1u32.to_ne_bytes());
        assert_eq!(InitIn::parse(&b[..16]).unwrap().flags, 1);
        assert_eq!(InitIn::parse(&b[..15]), None);
    }

    /// uapi fuse.h 7.42: `max_stack_depth` at bytes 36..40 of
    /// `fuse_init_out`, `backing_id` at 12..16 of `fuse_open_out`.
    #[test]
    fn passthrough_fields_sit_where_the_kernel_reads_them() {
        let mut b = [0u8; INIT_OUT_LEN];
        InitOut {
            max_stack_depth: 1,
            ..Default::default()
        }
        .encode(&mut Wr::new(&mut b));
        assert_eq!(b[36..40], 1u32.to_ne_bytes());
        let mut b = [0u8; OPEN_OUT_LEN];
        let mut w = Wr::new(&mut b);
        encode_open_out(&mut w, 0, FOPEN_PASSTHROUGH, 7);
        assert_eq!(w.written(), Some(OPEN_OUT_LEN));
        assert_eq!(b[8..12], 0x80u32.to_ne_bytes());
        assert_eq!(b[12..16], 7i32.to_ne_bytes());
    }

    #[test]
    fn cstr_needs_a_nul() {
        assert_eq!(cstr(b"ab\0cd\0"), Some((&b"ab"[..], &b"cd\0"[..])));
        assert_eq!(cstr(b"abc"), None);
    }
}
