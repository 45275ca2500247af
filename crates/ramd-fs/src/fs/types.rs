//! The filesystem's vocabulary, below everything else in the crate:
//! inode numbers, kinds, attributes, the requests' arguments, the mount's
//! settings and the clock every timestamp is read from. `hot.rs` and the
//! FUSE layer use these without reaching into `Fs`.

use std::ffi::OsString;
use std::time::{Duration, SystemTime};

/// File data of one file spans at most 1 TiB of store address space.
pub const FILE_SHIFT: u32 = 40;
/// Largest file size; writes past it get EFBIG.
pub const MAX_FILE_SIZE: u64 = (1 << FILE_SHIFT) - 1;
/// Files with data that fit in the store's 2^63-byte address space.
pub(super) const MAX_SLOTS: u64 = ramd_store::MAX_SIZE >> FILE_SHIFT;
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
pub(super) const XATTR_NAME_MAX: usize = 255;
pub(super) const XATTR_SIZE_MAX: usize = 64 << 10;

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

pub(super) fn err<T>(e: Errno) -> Result<T> {
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
pub(super) struct Creds {
    pub(super) fsetid: bool,
    /// The filesystem gid first, then the supplementary groups.
    pub(super) groups: Vec<u32>,
}

impl Caller {
    /// Read from /proc/PID/status only when a privilege bit is at stake
    /// (rare); without it, root stands in for CAP_FSETID.
    pub(super) fn creds(self) -> Creds {
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
pub(super) enum Kill {
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
    pub(super) fn bits(self) -> u8 {
        let mode = match self.mode {
            AtimeMode::Relatime => 0,
            AtimeMode::Strict => 1,
            AtimeMode::Never => 2,
        };
        mode | (self.nodiratime as u8) << 2
    }

    pub(super) fn from_bits(b: u8) -> Atime {
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
