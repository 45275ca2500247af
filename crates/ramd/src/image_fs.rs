//! Filesystem images offline: one is loaded into memory the way the daemon
//! loads it (`persist::load`, then `Fs::load` decodes the tree), and its
//! tree is walked through `Fs`'s own calls to be written out as a
//! directory or a tar archive (`ramd image export`, `ramd image salvage
//! --export`). Nothing here reads the tree's encoding itself.

use std::collections::HashMap;
use std::ffi::{CString, OsStr, OsString};
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::{bail, Context, Result};

use ramd_fs::fs::{Attr, Kind, Whence, ROOT_INO};
use ramd_fs::{Atime, AtimeMode, Fs, FsConfig, Ino};
use ramd_store::persist::{self, DiskKind, ImageDir};
use ramd_store::{Errno, Store, StoreConfig};

/// A store for an image loaded offline: no page limit (an image is
/// loaded whole, whatever its disk's size said), memory bounded by the
/// host's, and change tracking only when a new image is to be saved.
pub fn offline_store(kind: DiskKind, size: u64, track: bool) -> Result<Arc<Store>> {
    let size = match kind {
        DiskKind::Block => size,
        // A filesystem's files live across the store's whole address space.
        DiskKind::Fs => ramd_store::MAX_SIZE,
    };
    let cfg = StoreConfig {
        max_memory: Some(ramd_store::mem_total().unwrap_or(0).max(1 << 30)),
        track_changes: track,
        ..StoreConfig::new(size)
    };
    Ok(Arc::new(
        Store::new(cfg).context("creating the in-memory store")?,
    ))
}

/// The settings a filesystem is rebuilt with offline: the image's size,
/// no inode limit, and reads that never move atime (walking the tree must
/// not change what is exported).
pub fn offline_fs_config(size: u64) -> FsConfig {
    FsConfig {
        size: (size > 0).then_some(size),
        nr_inodes: u64::MAX,
        mode: 0o755,
        uid: 0,
        gid: 0,
        atime: Atime {
            mode: AtimeMode::Never,
            nodiratime: true,
        },
    }
}

/// Loads a whole, healthy filesystem image (a damaged one is refused, as
/// `ramd serve` refuses it: `ramd image salvage` is for those).
pub fn load_fs(dir: &Path) -> Result<Fs> {
    let image = ImageDir::open_existing(dir)?;
    let m = image.manifest().expect("open_existing has a manifest");
    if m.kind != DiskKind::Fs {
        bail!("{} is a block image, not a filesystem image", dir.display());
    }
    let store = offline_store(DiskKind::Fs, m.size, false)?;
    let chain = persist::load(&image, &store, &mut crate::progress::load_progress())?
        .expect("fs images have a tree");
    Fs::load_chain(store, offline_fs_config(m.size), &chain)
        .map(|(fs, _)| fs)
        .map_err(|e| anyhow::anyhow!("loading image {}: the tree: {e}", dir.display()))
}

pub fn errno_text(e: Errno) -> String {
    io::Error::from_raw_os_error(e.get()).to_string()
}

fn fs_err(what: impl std::fmt::Display, e: Errno) -> anyhow::Error {
    anyhow::anyhow!("{what}: {}", errno_text(e))
}

/// One inode met on the walk, at one of its paths.
pub struct Node<'a> {
    /// Relative to the root; empty for the root itself.
    pub path: &'a Path,
    pub attr: Attr,
}

/// What a node is, for a sink.
pub enum Item<'a> {
    Dir,
    /// A regular file's first path: its data follows through `FileData`.
    File,
    /// A regular file seen before at `first`.
    HardLink {
        first: &'a Path,
    },
    Symlink(OsString),
    /// A fifo, socket or device node.
    Special,
}

/// Every regular file's paths, by inode (several for hard links).
pub type FilePaths = HashMap<Ino, Vec<PathBuf>>;

/// Where an exported tree goes: a directory or a tar archive.
pub trait Sink {
    fn put(
        &mut self,
        fs: &Fs,
        node: &Node<'_>,
        item: Item<'_>,
        xattrs: &[(OsString, Vec<u8>)],
    ) -> Result<()>;
    /// After a directory's children (its times are set last).
    fn leave_dir(&mut self, node: &Node<'_>, xattrs: &[(OsString, Vec<u8>)]) -> Result<()>;
}

/// Walks the whole tree from the root, parents before children, each
/// directory's entries in name order; a file with several links is handed
/// over whole at its first path and as a link at the others. Returns the
/// paths of every regular file by inode.
pub fn walk(fs: &Fs, sink: &mut dyn Sink) -> Result<FilePaths> {
    let mut files: HashMap<Ino, Vec<PathBuf>> = HashMap::new();
    walk_dir(fs, ROOT_INO, PathBuf::new(), sink, &mut files)?;
    Ok(files)
}

fn xattrs_of(fs: &Fs, ino: Ino, path: &Path) -> Result<Vec<(OsString, Vec<u8>)>> {
    let names = fs
        .listxattr(ino)
        .map_err(|e| fs_err(format!("{}: listing xattrs", shown(path)), e))?;
    let mut out = Vec::new();
    for name in names.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let name = OsStr::from_bytes(name);
        let value = fs
            .getxattr(ino, name)
            .map_err(|e| fs_err(format!("{}: xattr {name:?}", shown(path)), e))?;
        out.push((name.to_owned(), value));
    }
    Ok(out)
}

/// A path for messages: `/` for the root.
pub fn shown(path: &Path) -> String {
    format!("/{}", path.display())
}

fn walk_dir(
    fs: &Fs,
    ino: Ino,
    path: PathBuf,
    sink: &mut dyn Sink,
    files: &mut HashMap<Ino, Vec<PathBuf>>,
) -> Result<()> {
    let attr = fs
        .getattr(ino)
        .map_err(|e| fs_err(format!("{}: stat", shown(&path)), e))?;
    let xattrs = xattrs_of(fs, ino, &path)?;
    let node = Node { path: &path, attr };
    sink.put(fs, &node, Item::Dir, &xattrs)?;
    let entries = fs
        .list_dir(ino)
        .map_err(|e| fs_err(format!("{}: readdir", shown(&path)), e))?;
    for e in entries.iter().filter(|e| e.name != "." && e.name != "..") {
        let child = path.join(&e.name);
        if e.kind == Kind::Dir {
            walk_dir(fs, e.ino, child, sink, files)?;
            continue;
        }
        let attr = fs
            .getattr(e.ino)
            .map_err(|er| fs_err(format!("{}: stat", shown(&child)), er))?;
        let xattrs = xattrs_of(fs, e.ino, &child)?;
        let node = Node { path: &child, attr };
        match attr.kind {
            Kind::File => {
                let seen = files.entry(e.ino).or_default();
                match seen.first().cloned() {
                    Some(first) => {
                        sink.put(fs, &node, Item::HardLink { first: &first }, &xattrs)?
                    }
                    None => sink.put(fs, &node, Item::File, &xattrs)?,
                }
                seen.push(child.clone());
            }
            Kind::Symlink => {
                let target = fs
                    .readlink(e.ino)
                    .map_err(|er| fs_err(format!("{}: readlink", shown(&child)), er))?;
                sink.put(
                    fs,
                    &node,
                    Item::Symlink(OsString::from_vec(target)),
                    &xattrs,
                )?;
            }
            _ => sink.put(fs, &node, Item::Special, &xattrs)?,
        }
    }
    let attr = fs
        .getattr(ino)
        .map_err(|e| fs_err(format!("{}: stat", shown(&path)), e))?;
    sink.leave_dir(&Node { path: &path, attr }, &xattrs)
}

use std::os::unix::ffi::OsStringExt;

/// A regular file's data, read through `Fs` from its start.
pub struct FileData<'a> {
    fs: &'a Fs,
    ino: Ino,
    off: u64,
    path: &'a Path,
}

impl<'a> FileData<'a> {
    pub fn new(fs: &'a Fs, ino: Ino, path: &'a Path) -> Self {
        FileData {
            fs,
            ino,
            off: 0,
            path,
        }
    }
}

impl Read for FileData<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.fs.read(self.ino, self.off, buf).map_err(|e| {
            io::Error::other(format!(
                "{}: reading at offset {}: {}",
                shown(self.path),
                self.off,
                errno_text(e)
            ))
        })?;
        self.off += n as u64;
        Ok(n)
    }
}

/// The data extents of a regular file, `(offset, length)`, in order.
pub fn data_extents(fs: &Fs, ino: Ino, size: u64) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut off = 0;
    while off < size {
        let start = match fs.seek(ino, off, Whence::Data) {
            Ok(s) => s,
            Err(e) if e == Errno::ENXIO => break,
            Err(e) => return Err(fs_err("SEEK_DATA", e)),
        };
        let end = fs
            .seek(ino, start, Whence::Hole)
            .map_err(|e| fs_err("SEEK_HOLE", e))?
            .min(size);
        out.push((start, end - start));
        off = end;
    }
    Ok(out)
}

/// Refuses a destination that would overwrite something: a non-empty
/// directory always, an existing file unless `force`.
pub fn check_destination(to: &Path, as_dir: bool, force: bool) -> Result<()> {
    match std::fs::symlink_metadata(to) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| format!("{}", to.display())),
        Ok(m) if m.is_dir() => {
            let empty = std::fs::read_dir(to)
                .with_context(|| format!("{}", to.display()))?
                .next()
                .is_none();
            if !as_dir {
                bail!(
                    "{} is a directory: give a file name for the archive",
                    to.display()
                );
            }
            if !empty {
                bail!(
                    "{} is not empty: export writes into a new or empty directory only",
                    to.display()
                );
            }
            Ok(())
        }
        Ok(_) if as_dir => bail!("{} exists and is not a directory", to.display()),
        Ok(_) if force => Ok(()),
        Ok(_) => bail!("{} exists: not overwritten without --force", to.display()),
    }
}

/// Writes the tree as `to` (a directory, created if missing), or as a tar
/// archive at `to`. Returns the notes of what could not be set.
pub fn export_fs(fs: &Fs, to: &Path, tar: bool, force: bool) -> Result<(Vec<String>, FilePaths)> {
    check_destination(to, !tar, force)?;
    if tar {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(to)
            .with_context(|| format!("creating {}", to.display()))?;
        let mut sink = TarSink {
            b: tar::Builder::new(io::BufWriter::with_capacity(1 << 20, file)),
            notes: Vec::new(),
            to: to.to_path_buf(),
        };
        let files = walk(fs, &mut sink)?;
        let w = sink
            .b
            .into_inner()
            .with_context(|| format!("writing {}", to.display()))?;
        let file = w
            .into_inner()
            .map_err(|e| e.into_error())
            .with_context(|| format!("writing {}", to.display()))?;
        file.sync_all()
            .with_context(|| format!("syncing {}", to.display()))?;
        Ok((sink.notes, files))
    } else {
        if !to.exists() {
            std::fs::create_dir(to).with_context(|| format!("creating {}", to.display()))?;
        }
        let mut sink = DirSink {
            root: to.to_path_buf(),
            notes: Vec::new(),
        };
        let files = walk(fs, &mut sink)?;
        Ok((sink.notes, files))
    }
}

// ---------------------------------------------------------------------------
// Into a directory

struct DirSink {
    root: PathBuf,
    notes: Vec<String>,
}

fn cstr(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .with_context(|| format!("{}: a NUL in the path", p.display()))
}

fn timespec(t: SystemTime) -> libc::timespec {
    let (secs, nanos) = ramd_fs::split_time(t);
    libc::timespec {
        tv_sec: secs,
        tv_nsec: nanos.into(),
    }
}

fn last_os_error() -> io::Error {
    io::Error::last_os_error()
}

impl DirSink {
    fn full(&self, rel: &Path) -> PathBuf {
        if rel.as_os_str().is_empty() {
            self.root.clone()
        } else {
            self.root.join(rel)
        }
    }

    /// Owner, xattrs, mode and times, in the order that keeps each: chown
    /// first (it clears setuid bits and capabilities), xattrs while the
    /// mode still lets us write, the mode, then times (every change
    /// before moves them).
    fn set_attrs(&mut self, node: &Node<'_>, xattrs: &[(OsString, Vec<u8>)]) -> Result<()> {
        let full = self.full(node.path);
        let c = cstr(&full)?;
        let a = &node.attr;
        let link = a.kind == Kind::Symlink;
        let shown = shown(node.path);
        // SAFETY: plain syscalls on a NUL-terminated path.
        if unsafe { libc::lchown(c.as_ptr(), a.uid, a.gid) } != 0 {
            self.notes.push(format!(
                "{shown}: owner {}:{} not set: {}",
                a.uid,
                a.gid,
                last_os_error()
            ));
        }
        for (name, value) in xattrs {
            let n = CString::new(name.as_bytes()).expect("xattr names have no NUL");
            // SAFETY: as above; value is a live slice.
            let r = unsafe {
                libc::lsetxattr(
                    c.as_ptr(),
                    n.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    0,
                )
            };
            if r != 0 {
                self.notes.push(format!(
                    "{shown}: xattr {} not set: {}",
                    name.to_string_lossy(),
                    last_os_error()
                ));
            }
        }
        // SAFETY: as above.
        if !link && unsafe { libc::chmod(c.as_ptr(), a.perm as libc::mode_t) } != 0 {
            self.notes.push(format!(
                "{shown}: mode {:o} not set: {}",
                a.perm,
                last_os_error()
            ));
        }
        let times = [timespec(a.atime), timespec(a.mtime)];
        // SAFETY: as above; times is two timespecs.
        let r = unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c.as_ptr(),
                times.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if r != 0 {
            self.notes
                .push(format!("{shown}: times not set: {}", last_os_error()));
        }
        Ok(())
    }
}

/// A device number as FUSE hands it to a filesystem (the kernel's
/// `new_encode_dev`), as major and minor.
pub fn dev_parts(rdev: u32) -> (u32, u32) {
    (
        (rdev & 0xfff00) >> 8,
        (rdev & 0xff) | ((rdev >> 12) & 0xfff00),
    )
}

impl Sink for DirSink {
    fn put(
        &mut self,
        fs: &Fs,
        node: &Node<'_>,
        item: Item<'_>,
        xattrs: &[(OsString, Vec<u8>)],
    ) -> Result<()> {
        let full = self.full(node.path);
        let shown = shown(node.path);
        let a = node.attr;
        match item {
            Item::Dir => {
                if !node.path.as_os_str().is_empty() {
                    std::fs::create_dir(&full)
                        .with_context(|| format!("creating {}", full.display()))?;
                }
                // Attributes once its children are in (leave_dir).
                return Ok(());
            }
            Item::File => {
                let f = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&full)
                    .with_context(|| format!("creating {}", full.display()))?;
                write_sparse(fs, a.ino, a.size, node.path, &f, &full)?;
            }
            Item::HardLink { first } => {
                std::fs::hard_link(self.full(first), &full).with_context(|| {
                    format!("linking {} to {}", full.display(), first.display())
                })?;
                // The inode's attributes were set at its first path.
                return Ok(());
            }
            Item::Symlink(target) => {
                std::os::unix::fs::symlink(&target, &full)
                    .with_context(|| format!("creating symlink {}", full.display()))?;
            }
            Item::Special => {
                let kind = match a.kind {
                    Kind::Fifo => libc::S_IFIFO,
                    Kind::Socket => libc::S_IFSOCK,
                    Kind::CharDev => libc::S_IFCHR,
                    Kind::BlockDev => libc::S_IFBLK,
                    _ => unreachable!("special nodes only"),
                };
                let (major, minor) = dev_parts(a.rdev);
                let c = cstr(&full)?;
                // SAFETY: a plain syscall on a NUL-terminated path.
                let r =
                    unsafe { libc::mknod(c.as_ptr(), kind | 0o600, libc::makedev(major, minor)) };
                if r != 0 {
                    self.notes.push(format!(
                        "{shown}: {:?} {major}:{minor} not created: {}",
                        a.kind,
                        last_os_error()
                    ));
                    return Ok(());
                }
            }
        }
        self.set_attrs(node, xattrs)
    }

    fn leave_dir(&mut self, node: &Node<'_>, xattrs: &[(OsString, Vec<u8>)]) -> Result<()> {
        self.set_attrs(node, xattrs)
    }
}

/// Copies a file's data extents; holes (and all-zero stretches) stay
/// holes, and the length is set last.
fn write_sparse(fs: &Fs, ino: Ino, size: u64, rel: &Path, f: &File, full: &Path) -> Result<()> {
    let mut buf = vec![0u8; 1 << 20];
    for (start, len) in data_extents(fs, ino, size)? {
        let mut at = start;
        while at < start + len {
            let n = ((start + len - at) as usize).min(buf.len());
            let got = fs
                .read(ino, at, &mut buf[..n])
                .map_err(|e| fs_err(format!("{}: reading at offset {at}", shown(rel)), e))?;
            if got == 0 {
                break;
            }
            let piece = &buf[..got];
            if piece.iter().any(|&b| b != 0) {
                f.write_all_at(piece, at)
                    .with_context(|| format!("writing {} at offset {at}", full.display()))?;
            }
            at += got as u64;
        }
    }
    f.set_len(size)
        .with_context(|| format!("sizing {}", full.display()))?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Into a tar archive

struct TarSink {
    b: tar::Builder<io::BufWriter<File>>,
    notes: Vec<String>,
    to: PathBuf,
}

/// A PAX extended header record: "LEN key=value\n", LEN counting itself.
fn pax_record(out: &mut Vec<u8>, key: &str, value: &[u8]) {
    let rest = 1 + key.len() + 1 + value.len() + 1;
    let mut len = rest + 1;
    while len != rest + len.to_string().len() {
        len = rest + len.to_string().len();
    }
    out.extend_from_slice(format!("{len} {key}=").as_bytes());
    out.extend_from_slice(value);
    out.push(b'\n');
}

/// Seconds since the epoch with nanoseconds, as PAX writes times.
fn pax_time(t: SystemTime) -> String {
    let ts = timespec(t);
    if ts.tv_sec < 0 && ts.tv_nsec > 0 {
        // -1.5 s is (-2, 500000000).
        format!("-{}.{:09}", -(ts.tv_sec + 1), 1_000_000_000 - ts.tv_nsec)
    } else {
        format!("{}.{:09}", ts.tv_sec, ts.tv_nsec)
    }
}

impl TarSink {
    fn header(
        &mut self,
        node: &Node<'_>,
        ty: tar::EntryType,
        xattrs: &[(OsString, Vec<u8>)],
    ) -> Result<tar::Header> {
        let a = &node.attr;
        // Times to the nanosecond, atime, and xattrs ride in a PAX header
        // before the entry (GNU tar and bsdtar read SCHILY.xattr.*).
        let mut pax = Vec::new();
        pax_record(&mut pax, "mtime", pax_time(a.mtime).as_bytes());
        pax_record(&mut pax, "atime", pax_time(a.atime).as_bytes());
        for (name, value) in xattrs {
            match name.to_str() {
                Some(n) => pax_record(&mut pax, &format!("SCHILY.xattr.{n}"), value),
                None => self.notes.push(format!(
                    "{}: xattr {name:?} not archived (not UTF-8)",
                    shown(node.path)
                )),
            }
        }
        let mut x = tar::Header::new_ustar();
        x.set_entry_type(tar::EntryType::XHeader);
        x.set_path("PaxHeader").context("PAX header name")?;
        x.set_size(pax.len() as u64);
        x.set_mode(0o644);
        x.set_cksum();
        self.b
            .append(&x, &pax[..])
            .with_context(|| format!("writing {}", self.to.display()))?;

        let mut h = tar::Header::new_gnu();
        h.set_entry_type(ty);
        h.set_mode(a.perm as u32);
        h.set_uid(a.uid as u64);
        h.set_gid(a.gid as u64);
        h.set_mtime(timespec(a.mtime).tv_sec.max(0) as u64);
        h.set_size(0);
        Ok(h)
    }

    /// An entry's name: relative, as `tar -C DIR -c .` would give it (the
    /// root is `./`).
    fn name(path: &Path, dir: bool) -> PathBuf {
        if path.as_os_str().is_empty() {
            return PathBuf::from("./");
        }
        let mut s = path.as_os_str().to_owned();
        if dir {
            s.push("/");
        }
        PathBuf::from(s)
    }
}

impl Sink for TarSink {
    fn put(
        &mut self,
        fs: &Fs,
        node: &Node<'_>,
        item: Item<'_>,
        xattrs: &[(OsString, Vec<u8>)],
    ) -> Result<()> {
        let a = node.attr;
        let to = self.to.clone();
        let wrote = |r: io::Result<()>| {
            r.with_context(|| format!("writing {} to {}", shown(node.path), to.display()))
        };
        match item {
            Item::Dir => {
                let mut h = self.header(node, tar::EntryType::Directory, xattrs)?;
                wrote(
                    self.b
                        .append_data(&mut h, Self::name(node.path, true), io::empty()),
                )?;
            }
            Item::File => {
                // Holes are written as zeros: the tar crate writes no
                // sparse entries.
                let mut h = self.header(node, tar::EntryType::Regular, xattrs)?;
                h.set_size(a.size);
                let data = FileData::new(fs, a.ino, node.path).take(a.size);
                wrote(
                    self.b
                        .append_data(&mut h, Self::name(node.path, false), data),
                )?;
            }
            Item::HardLink { first } => {
                let mut h = self.header(node, tar::EntryType::Link, &[])?;
                wrote(self.b.append_link(
                    &mut h,
                    Self::name(node.path, false),
                    Self::name(first, false),
                ))?;
            }
            Item::Symlink(target) => {
                let mut h = self.header(node, tar::EntryType::Symlink, xattrs)?;
                wrote(self.b.append_link(
                    &mut h,
                    Self::name(node.path, false),
                    Path::new(&target),
                ))?;
            }
            Item::Special => {
                let ty = match a.kind {
                    Kind::Fifo => tar::EntryType::Fifo,
                    Kind::CharDev => tar::EntryType::Char,
                    Kind::BlockDev => tar::EntryType::Block,
                    _ => {
                        self.notes.push(format!(
                            "{}: a socket: tar has no entry for one, left out",
                            shown(node.path)
                        ));
                        return Ok(());
                    }
                };
                let mut h = self.header(node, ty, xattrs)?;
                let (major, minor) = dev_parts(a.rdev);
                h.set_device_major(major).context("device major")?;
                h.set_device_minor(minor).context("device minor")?;
                wrote(
                    self.b
                        .append_data(&mut h, Self::name(node.path, false), io::empty()),
                )?;
            }
        }
        Ok(())
    }

    fn leave_dir(&mut self, _node: &Node<'_>, _xattrs: &[(OsString, Vec<u8>)]) -> Result<()> {
        Ok(())
    }
}

/// Writes what export could not carry over, for the user.
pub fn print_notes(notes: &[String], out: &mut dyn Write) {
    for n in notes {
        let _ = writeln!(out, "not set: {n}");
    }
}
