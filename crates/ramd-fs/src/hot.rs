//! The hot tier of `--data-path kernel`: a private kernel tmpfs instance
//! that holds every regular file's data, one tmpfs file per inode (named by
//! its inode number), while `Fs` keeps the namespace. Made with
//! fsopen/fsconfig/fsmount and never attached anywhere: only its mount fd
//! reaches it (files are opened relative to it), so no user sees it, and
//! it goes when the fd is closed and its files are released.
//!
//! The FUSE layer registers these files as passthrough backing files, so
//! the kernel serves reads, writes, splice and mmap from them without
//! asking ramd; ENOSPC then comes from this tmpfs, at write(2).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use crate::fs::types::{AtimeMode, Ino};

/// What the private tmpfs is made with (tmpfs's own mount options).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HotConfig {
    /// `size=` in bytes; `None`: as much as the host's RAM (`size=100%`:
    /// unlimited, `size=0`, would leave statfs without block counts).
    pub size: Option<u64>,
    /// `nr_inodes=`; 0: unlimited.
    pub nr_inodes: u64,
    /// `huge=`: never, always, within_size or advise; `None`: tmpfs's default.
    pub huge: Option<&'static str>,
    /// `mpol=`, e.g. `bind:0-1`; `None`: the process's policy.
    pub mpol: Option<String>,
    /// The mount's atime rule, as the backing files' atime moves by it.
    pub atime: AtimeMode,
}

/// A private tmpfs instance (see the module's comment).
#[derive(Debug)]
pub struct HotTier {
    /// The detached mount (fsmount's fd): every path is relative to it.
    mnt: OwnedFd,
}

// The new mount API (linux/mount.h); the libc crate has the syscall
// numbers, not these.
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_SET_STRING: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSCONFIG_CMD_RECONFIGURE: libc::c_uint = 7;
const FSPICK_CLOEXEC: libc::c_uint = 1;
const FSPICK_EMPTY_PATH: libc::c_uint = 8;
const MOUNT_ATTR_ATIME_MASK: u64 = 0x70;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOUNT_ATTR_NOSUID: libc::c_uint = 0x2;
const MOUNT_ATTR_NODEV: libc::c_uint = 0x4;
const MOUNT_ATTR_NOEXEC: libc::c_uint = 0x8;
const MOUNT_ATTR_RELATIME: libc::c_uint = 0;
const MOUNT_ATTR_NOATIME: libc::c_uint = 0x10;
const MOUNT_ATTR_STRICTATIME: libc::c_uint = 0x20;

/// The result `r` of a call on a name of the tier: `None` if the name
/// does not exist (a file never opened has no backing file yet).
fn unless_missing(r: libc::c_int) -> io::Result<Option<()>> {
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOENT) {
            return Ok(None);
        }
        return Err(e);
    }
    Ok(Some(()))
}

fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// The fs context's own log says why a setting was refused; read it
/// (each message starts with "e ", "w " or "i ").
fn context_log(fsfd: &OwnedFd) -> String {
    let mut out = String::new();
    let mut buf = [0u8; 512];
    loop {
        // SAFETY: read(2) writes at most buf.len() bytes into buf.
        let n = unsafe { libc::read(fsfd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
        if n <= 0 {
            break;
        }
        let msg = String::from_utf8_lossy(&buf[..n as usize]);
        out.push_str(msg.get(2..).unwrap_or(&msg).trim_end());
        out.push_str("; ");
    }
    out.trim_end_matches("; ").to_string()
}

impl HotTier {
    /// Makes the private tmpfs. Needs CAP_SYS_ADMIN (fsopen).
    pub fn new(cfg: &HotConfig) -> io::Result<HotTier> {
        let fstype = cstring("tmpfs")?;
        // SAFETY: fsopen takes a NUL-terminated name and flags; it returns
        // a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("fsopen(\"tmpfs\"): {e} (it needs CAP_SYS_ADMIN)"),
            ));
        }
        // SAFETY: fd is a new fd that nothing else owns.
        let fsfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let mut opts = vec![
            (
                "size",
                cfg.size
                    .map_or_else(|| "100%".to_string(), |s| s.to_string()),
            ),
            ("nr_inodes", cfg.nr_inodes.to_string()),
            // Only ramd opens these files, and it runs as root.
            ("mode", "0700".to_string()),
        ];
        if let Some(h) = cfg.huge {
            opts.push(("huge", h.to_string()));
        }
        if let Some(m) = &cfg.mpol {
            opts.push(("mpol", m.clone()));
        }
        let opts: Vec<(&str, String)> = opts.into_iter().collect();
        configure(&fsfd, &opts, FSCONFIG_CMD_CREATE)
            .map_err(|e| io::Error::new(e.kind(), format!("creating the tmpfs: {e}")))?;
        // Nothing is executed or opened as a device from it, whatever
        // the file's mode says: the kernel checks those on the FUSE inode.
        let attrs =
            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC | atime_attr(cfg.atime);
        // SAFETY: fsmount takes the context fd and two flag words.
        let m =
            unsafe { libc::syscall(libc::SYS_fsmount, fsfd.as_raw_fd(), FSMOUNT_CLOEXEC, attrs) };
        if m < 0 {
            let e = io::Error::last_os_error();
            return Err(io::Error::new(
                e.kind(),
                format!("fsmount of the tmpfs: {e}"),
            ));
        }
        // SAFETY: m is a new fd that nothing else owns.
        let mnt = unsafe { OwnedFd::from_raw_fd(m as i32) };
        Ok(HotTier { mnt })
    }

    fn name(ino: Ino) -> CString {
        CString::new(ino.0.to_string()).expect("digits have no NUL")
    }

    /// The backing file of `ino`, opened read-write; created (empty) when
    /// `create`, else `None` if it does not exist yet.
    pub fn open(&self, ino: Ino, create: bool) -> io::Result<Option<File>> {
        self.open_c(&Self::name(ino), create)
    }

    /// A file of the tier by name (a load's per-slot files, before they
    /// are named by inode), as [`HotTier::open`].
    pub(crate) fn open_named(&self, name: &str, create: bool) -> io::Result<Option<File>> {
        self.open_c(&cstring(name)?, create)
    }

    /// A new backing file for `ino`, which has none (a CREATE's): EEXIST
    /// if it has one after all. One openat where `open` would need two.
    pub fn create_new(&self, ino: Ino) -> io::Result<File> {
        let flags = libc::O_CREAT | libc::O_EXCL;
        match self.open_flags(&Self::name(ino), flags)? {
            Some(f) => Ok(f),
            None => Err(io::Error::from_raw_os_error(libc::ENOENT)),
        }
    }

    fn open_c(&self, name: &CString, create: bool) -> io::Result<Option<File>> {
        self.open_flags(name, if create { libc::O_CREAT } else { 0 })
    }

    fn open_flags(&self, name: &CString, extra: i32) -> io::Result<Option<File>> {
        let create = extra & libc::O_CREAT != 0;
        let flags = libc::O_RDWR | libc::O_CLOEXEC | libc::O_LARGEFILE | libc::O_NOFOLLOW | extra;
        // SAFETY: openat takes a NUL-terminated name we own; it returns a
        // new fd or -1.
        let fd = unsafe { libc::openat(self.mnt.as_raw_fd(), name.as_ptr(), flags, 0o600) };
        if fd < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ENOENT) && !create {
                return Ok(None);
            }
            return Err(e);
        }
        // SAFETY: fd is a new fd that nothing else owns.
        Ok(Some(unsafe { File::from_raw_fd(fd) }))
    }

    /// Renames a file of the tier (replacing `to`).
    pub(crate) fn rename_named(&self, from: &str, to: &str) -> io::Result<()> {
        let (f, t) = (cstring(from)?, cstring(to)?);
        let dir = self.mnt.as_raw_fd();
        // SAFETY: renameat reads two NUL-terminated names we own.
        if unsafe { libc::renameat(dir, f.as_ptr(), dir, t.as_ptr()) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Removes a file of the tier by name, as [`HotTier::remove`].
    pub(crate) fn remove_named(&self, name: &str) {
        match cstring(name) {
            Ok(c) => self.remove_c(&c, name),
            Err(e) => log::warn!("freeing {name:?}: {e}"),
        }
    }

    /// Sets the backing file's atime and mtime (`UTIME_OMIT`/`UTIME_NOW`
    /// as utimensat(2) takes them) by name, without opening it: `false`
    /// if it does not exist yet.
    pub fn set_times(&self, ino: Ino, ts: &[libc::timespec; 2]) -> io::Result<bool> {
        let name = Self::name(ino);
        // SAFETY: utimensat reads a NUL-terminated name we own and two
        // timespecs from `ts`.
        let r = unsafe {
            libc::utimensat(
                self.mnt.as_raw_fd(),
                name.as_ptr(),
                ts.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        Ok(unless_missing(r)?.is_some())
    }

    /// The backing file's stat; `None` if it does not exist yet (an empty
    /// file, never opened).
    pub fn stat(&self, ino: Ino) -> io::Result<Option<libc::stat>> {
        let name = Self::name(ino);
        // SAFETY: an all-zero stat is a valid value to be overwritten.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstatat reads a NUL-terminated name we own and writes
        // one stat into `st`.
        let r = unsafe {
            libc::fstatat(
                self.mnt.as_raw_fd(),
                name.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        Ok(unless_missing(r)?.map(|()| st))
    }

    /// Frees `ino`'s data: the name goes, the tmpfs frees the pages once
    /// nothing holds the file open (a mapping may still).
    pub fn remove(&self, ino: Ino) {
        self.remove_c(&Self::name(ino), &format!("inode {ino}"));
    }

    fn remove_c(&self, name: &CString, what: &str) {
        // SAFETY: unlinkat reads a NUL-terminated name we own.
        let r = unsafe { libc::unlinkat(self.mnt.as_raw_fd(), name.as_ptr(), 0) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::ENOENT) {
                log::warn!("freeing the data of {what}: {e}");
            }
        }
    }

    /// (total, free) 4 KiB blocks of the tmpfs.
    pub fn blocks(&self) -> io::Result<(u64, u64)> {
        // SAFETY: an all-zero statfs is a valid value to be overwritten.
        let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: fstatfs writes one statfs into `sf`.
        if unsafe { libc::fstatfs(self.mnt.as_raw_fd(), &mut sf) } < 0 {
            return Err(io::Error::last_os_error());
        }
        let scale = sf.f_bsize as u64 / 4096;
        Ok((sf.f_blocks * scale.max(1), sf.f_bfree * scale.max(1)))
    }

    /// A new capacity (a remount's `size=`): the tmpfs refuses one below
    /// what it holds.
    pub fn resize(&self, size: Option<u64>) -> io::Result<()> {
        let path = cstring("")?;
        // SAFETY: fspick takes our mount fd and an empty NUL-terminated
        // path; it returns a new fd or -1.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_fspick,
                self.mnt.as_raw_fd(),
                path.as_ptr(),
                FSPICK_CLOEXEC | FSPICK_EMPTY_PATH,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a new fd that nothing else owns.
        let fsfd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
        let size = size.map_or_else(|| "100%".to_string(), |s| s.to_string());
        configure(&fsfd, &[("size", size)], FSCONFIG_CMD_RECONFIGURE)
    }

    /// A new atime rule (a remount's atime word): the backing files'
    /// atime moves by it.
    pub fn set_atime(&self, a: AtimeMode) -> io::Result<()> {
        // struct mount_attr: attr_set, attr_clr, propagation, userns_fd.
        let attr: [u64; 4] = [atime_attr(a) as u64, MOUNT_ATTR_ATIME_MASK, 0, 0];
        let path = cstring("")?;
        // SAFETY: mount_setattr reads an empty NUL-terminated path and
        // one 32-byte mount_attr (its size given) from pointers we own.
        let r = unsafe {
            libc::syscall(
                libc::SYS_mount_setattr,
                self.mnt.as_raw_fd(),
                path.as_ptr(),
                libc::AT_EMPTY_PATH,
                attr.as_ptr(),
                std::mem::size_of_val(&attr),
            )
        };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Bytes the tmpfs holds now: what the host sees it use.
    pub fn used_bytes(&self) -> u64 {
        self.blocks()
            .map(|(total, free)| total.saturating_sub(free) * 4096)
            .unwrap_or(0)
    }
}

/// `fsconfig(fd, FSCONFIG_SET_STRING, key, value)`, then `cmd`.
fn configure(fsfd: &OwnedFd, opts: &[(&str, String)], cmd: libc::c_uint) -> io::Result<()> {
    for (k, v) in opts {
        let (ck, cv) = (cstring(k)?, cstring(v)?);
        // SAFETY: fsconfig reads two NUL-terminated strings we own.
        let r = unsafe {
            libc::syscall(
                libc::SYS_fsconfig,
                fsfd.as_raw_fd(),
                FSCONFIG_SET_STRING,
                ck.as_ptr(),
                cv.as_ptr(),
                0,
            )
        };
        if r < 0 {
            let e = io::Error::last_os_error();
            let why = context_log(fsfd);
            return Err(io::Error::new(
                e.kind(),
                format!("tmpfs option {k}={v}: {e} {why}")
                    .trim_end()
                    .to_string(),
            ));
        }
    }
    // SAFETY: fsconfig with a command takes no strings.
    let r = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fsfd.as_raw_fd(),
            cmd,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if r < 0 {
        let e = io::Error::last_os_error();
        let why = context_log(fsfd);
        return Err(io::Error::new(
            e.kind(),
            format!("{e} {why}").trim_end().to_string(),
        ));
    }
    Ok(())
}

fn atime_attr(a: AtimeMode) -> libc::c_uint {
    match a {
        AtimeMode::Relatime => MOUNT_ATTR_RELATIME,
        AtimeMode::Strict => MOUNT_ATTR_STRICTATIME,
        AtimeMode::Never => MOUNT_ATTR_NOATIME,
    }
}
