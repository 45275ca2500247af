//! What `ramd bench` measures: a directory (files in a fresh subdirectory
//! of its own), a regular file or block device used as a raw disk, or an
//! NBD export. Opening a target checks everything that can refuse it, and
//! writes nothing; only [`Target::prepare`] does.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use parking_lot::Mutex;
use ramd_nbd::client::{Address, Client};

/// The first this many bytes of a raw or NBD target must read as zeros
/// unless `--destructive`: a disk that holds anything is not ours to write.
pub const ZERO_CHECK: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Directory,
    File,
    BlockDevice,
    Nbd,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Directory => "directory",
            Kind::File => "file",
            Kind::BlockDevice => "block-device",
            Kind::Nbd => "nbd",
        }
    }
}

/// One place to read and write bytes: a file (at an offset, for a region of
/// a raw disk) or a region of an NBD export.
pub trait Io: Send + Sync {
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()>;
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// fdatasync, or NBD_CMD_FLUSH.
    fn sync(&self) -> io::Result<()>;
    /// Asks the kernel to drop this file's clean cached pages, so that a
    /// read pass does not just copy from the page cache where something
    /// below it exists (a disk, a FUSE server). On tmpfs the cache is the
    /// storage and this does nothing.
    fn drop_cache(&self) {}
}

struct FileIo {
    file: File,
    base: u64,
}

impl Io for FileIo {
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.file.write_all_at(buf, self.base + off)
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, self.base + off)
    }
    fn sync(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn drop_cache(&self) {
        // SAFETY: posix_fadvise on an fd we own; it only changes cache
        // state. Failure is harmless (the read pass is then cached).
        unsafe {
            libc::posix_fadvise(self.file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
}

struct NbdIo {
    client: Arc<Mutex<Client>>,
    base: u64,
}

impl Io for NbdIo {
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.client.lock().write_at(buf, self.base + off)
    }
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.client.lock().read_at(buf, self.base + off)
    }
    fn sync(&self) -> io::Result<()> {
        self.client.lock().flush()
    }
}

enum Inner {
    /// The directory given; `work` is the bench's own subdirectory once
    /// prepared.
    Dir { dir: PathBuf, work: Option<PathBuf> },
    Raw {
        path: PathBuf,
        file: Arc<File>,
        size: u64,
    },
    Nbd {
        client: Arc<Mutex<Client>>,
        size: u64,
    },
}

pub struct Target {
    /// As given on the command line.
    pub spec: String,
    pub kind: Kind,
    inner: Inner,
    /// Highest byte offset written on a raw or NBD target (zeroed at the end).
    used: u64,
}

/// A set of equal regions (files in a directory, consecutive ranges of a
/// raw disk or export) for one workload; files are removed on drop.
pub struct Regions {
    pub io: Vec<Arc<dyn Io>>,
    pub len: u64,
    files: Vec<PathBuf>,
}

impl Drop for Regions {
    fn drop(&mut self) {
        self.io.clear();
        for f in &self.files {
            let _ = fs::remove_file(f);
        }
    }
}

fn access_writable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: access(2) with a valid NUL-terminated path.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// Free bytes for an unprivileged writer on the filesystem holding `dir`.
fn free_bytes(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"))?;
    // SAFETY: statvfs fills the zeroed struct we pass; the path is valid.
    unsafe {
        let mut s: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c.as_ptr(), &mut s) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(s.f_bavail as u64 * s.f_frsize as u64)
    }
}

pub fn human(n: u64) -> String {
    const UNITS: [(&str, u64); 3] = [("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)];
    for (u, m) in UNITS {
        if n >= m && n.is_multiple_of(m) {
            return format!("{}{u}", n / m);
        }
    }
    for (u, m) in UNITS {
        if n >= m {
            return format!("{:.1}{u}", n as f64 / m as f64);
        }
    }
    format!("{n}B")
}

/// Without --destructive, a raw target or export must read as zeros over
/// its first MiB: anything else may be someone's data.
fn refuse_data(spec: &str, first: &[u8]) -> Result<()> {
    if !all_zero(first) {
        bail!(
            "{spec}: its first MiB is not all zeros (it may hold data); \
             pass --destructive to overwrite it"
        );
    }
    Ok(())
}

fn all_zero(buf: &[u8]) -> bool {
    buf.iter().all(|&b| b == 0)
}

impl Target {
    /// Checks `spec` without writing anything: it exists, is writable, has
    /// room for `need_raw` bytes (a raw disk or export) or `need_dir` free
    /// bytes (a directory), and, unless `destructive`, a raw disk or export
    /// reads as zeros over its first MiB. `sizes` explains the need in
    /// errors.
    pub fn open(
        spec: &str,
        need_raw: u64,
        need_dir: u64,
        destructive: bool,
        sizes: &str,
    ) -> Result<Target> {
        if spec.starts_with("nbd://") || spec.starts_with("nbd+unix://") {
            return Target::open_nbd(spec, need_raw, destructive, sizes);
        }
        if spec.contains("://") {
            bail!("{spec}: only nbd:// and nbd+unix:// URIs are supported");
        }
        let path = PathBuf::from(spec);
        let meta = fs::metadata(&path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => anyhow::anyhow!("{spec}: does not exist"),
            _ => anyhow::anyhow!("{spec}: {e}"),
        })?;
        let ft = meta.file_type();
        if ft.is_dir() {
            if !access_writable(&path) {
                bail!("{spec}: directory is not writable");
            }
            let free = free_bytes(&path).with_context(|| format!("{spec}: statvfs"))?;
            if free < need_dir {
                bail!(
                    "{spec}: too small: {} free, the chosen sizes need {} ({sizes})",
                    human(free),
                    human(need_dir)
                );
            }
            return Ok(Target {
                spec: spec.to_string(),
                kind: Kind::Directory,
                inner: Inner::Dir {
                    dir: path,
                    work: None,
                },
                used: 0,
            });
        }
        let kind = if ft.is_file() {
            Kind::File
        } else if ft.is_block_device() {
            Kind::BlockDevice
        } else {
            bail!("{spec}: not a directory, regular file, block device or NBD URI");
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| match e.kind() {
                io::ErrorKind::PermissionDenied => anyhow::anyhow!("{spec}: not writable ({e})"),
                _ => anyhow::anyhow!("{spec}: {e}"),
            })?;
        let size = if kind == Kind::File {
            meta.len()
        } else {
            // A block device's size is where SEEK_END lands.
            use std::io::Seek;
            (&file)
                .seek(io::SeekFrom::End(0))
                .with_context(|| format!("{spec}: size"))?
        };
        if size < need_raw {
            bail!(
                "{spec}: too small: {} bytes ({}), the chosen sizes need {} ({sizes})",
                size,
                human(size),
                human(need_raw)
            );
        }
        if !destructive {
            let mut first = vec![0u8; ZERO_CHECK.min(size) as usize];
            file.read_exact_at(&mut first, 0)
                .with_context(|| format!("{spec}: reading its first MiB"))?;
            refuse_data(spec, &first)?;
        }
        Ok(Target {
            spec: spec.to_string(),
            kind,
            inner: Inner::Raw {
                path,
                file: Arc::new(file),
                size,
            },
            used: 0,
        })
    }

    fn open_nbd(spec: &str, need: u64, destructive: bool, sizes: &str) -> Result<Target> {
        let addr = Address::parse(spec).map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut client = Client::connect(&addr).with_context(|| format!("{spec}: connect"))?;
        if client.read_only() {
            bail!("{spec}: the export is read-only (not writable)");
        }
        let size = client.size();
        if size < need {
            bail!(
                "{spec}: too small: the export has {} bytes ({}), the chosen sizes need {} ({sizes})",
                size,
                human(size),
                human(need)
            );
        }
        if !destructive {
            let mut first = vec![0u8; ZERO_CHECK.min(size) as usize];
            client
                .read_at(&mut first, 0)
                .with_context(|| format!("{spec}: reading its first MiB"))?;
            refuse_data(spec, &first)?;
        }
        Ok(Target {
            spec: spec.to_string(),
            kind: Kind::Nbd,
            inner: Inner::Nbd {
                client: Arc::new(Mutex::new(client)),
                size,
            },
            used: 0,
        })
    }

    /// The first write: a directory gets its own `ramd-bench.*`
    /// subdirectory, removed by [`Target::finish`] (or on drop).
    pub fn prepare(&mut self) -> Result<()> {
        if let Inner::Dir { dir, work } = &mut self.inner {
            let pid = std::process::id();
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let w = dir.join(format!("ramd-bench.{pid}.{nanos:08x}"));
            fs::create_dir(&w).with_context(|| format!("{}: create", w.display()))?;
            *work = Some(w);
        }
        Ok(())
    }

    /// The bench's own directory (directory targets only).
    pub fn work_dir(&self) -> Option<&Path> {
        match &self.inner {
            Inner::Dir { work, .. } => work.as_deref(),
            _ => None,
        }
    }

    /// The NBD connection, for workloads that pipeline requests.
    pub fn nbd(&self) -> Option<Arc<Mutex<Client>>> {
        match &self.inner {
            Inner::Nbd { client, .. } => Some(client.clone()),
            _ => None,
        }
    }

    fn note_used(&mut self, end: u64) {
        self.used = self.used.max(end);
    }

    /// `n` regions of `len` bytes each, named `name.I` in a directory.
    pub fn regions(&mut self, name: &str, n: usize, len: u64) -> Result<Regions> {
        self.regions_with(name, n, len, false).map(|(r, _)| r)
    }

    /// One region of `len` bytes opened with O_DIRECT where the target
    /// allows it; otherwise buffered, with a note saying why.
    pub fn direct_region(&mut self, name: &str, len: u64) -> Result<(Regions, Option<String>)> {
        self.regions_with(name, 1, len, true)
    }

    fn regions_with(
        &mut self,
        name: &str,
        n: usize,
        len: u64,
        direct: bool,
    ) -> Result<(Regions, Option<String>)> {
        let mut note = None;
        let mut regions = Regions {
            io: Vec::new(),
            len,
            files: Vec::new(),
        };
        match &self.inner {
            Inner::Dir { work, .. } => {
                let work = work.as_ref().expect("prepared");
                for i in 0..n {
                    let p = work.join(format!("{name}.{i}"));
                    let open = |flags: i32| {
                        OpenOptions::new()
                            .read(true)
                            .write(true)
                            .create(true)
                            .truncate(true)
                            .custom_flags(flags)
                            .open(&p)
                    };
                    let file = if direct {
                        match open(libc::O_DIRECT) {
                            Ok(f) => f,
                            Err(e) => {
                                note = Some(format!("O_DIRECT refused ({e}): buffered I/O"));
                                open(0).with_context(|| format!("{}: create", p.display()))?
                            }
                        }
                    } else {
                        open(0).with_context(|| format!("{}: create", p.display()))?
                    };
                    regions.files.push(p);
                    regions.io.push(Arc::new(FileIo { file, base: 0 }));
                }
            }
            Inner::Raw { path, file, size } => {
                let total = len * n as u64;
                if total > *size {
                    bail!(
                        "{}: {name} needs {total} bytes, the target has {size}",
                        self.spec
                    );
                }
                for i in 0..n {
                    let f = if direct {
                        match OpenOptions::new()
                            .read(true)
                            .write(true)
                            .custom_flags(libc::O_DIRECT)
                            .open(path)
                        {
                            Ok(f) => f,
                            Err(e) => {
                                note = Some(format!("O_DIRECT refused ({e}): buffered I/O"));
                                file.try_clone()?
                            }
                        }
                    } else {
                        file.try_clone()?
                    };
                    regions.io.push(Arc::new(FileIo {
                        file: f,
                        base: i as u64 * len,
                    }));
                }
                self.note_used(total);
            }
            Inner::Nbd { client, size } => {
                let total = len * n as u64;
                if total > *size {
                    bail!(
                        "{}: {name} needs {total} bytes, the export has {size}",
                        self.spec
                    );
                }
                if direct {
                    note = Some("NBD: the client has no cache, so O_DIRECT does not apply".into());
                }
                for i in 0..n {
                    regions.io.push(Arc::new(NbdIo {
                        client: client.clone(),
                        base: i as u64 * len,
                    }));
                }
                self.note_used(total);
            }
        }
        Ok((regions, note))
    }

    /// Leaves the target as found: a directory loses the bench's
    /// subdirectory; a raw disk or export gets zeros over the range the
    /// bench wrote (so it passes the zero check of the next run).
    pub fn finish(&mut self) -> Result<()> {
        match &mut self.inner {
            Inner::Dir { work, .. } => {
                if let Some(w) = work.take() {
                    fs::remove_dir_all(&w).with_context(|| format!("{}: remove", w.display()))?;
                }
            }
            Inner::Raw { file, .. } => {
                let zeros = vec![0u8; 1 << 20];
                let mut off = 0;
                while off < self.used {
                    let n = (self.used - off).min(zeros.len() as u64) as usize;
                    file.write_all_at(&zeros[..n], off)
                        .with_context(|| format!("{}: zeroing", self.spec))?;
                    off += n as u64;
                }
                file.sync_data()?;
            }
            Inner::Nbd { client, .. } => {
                let zeros = vec![0u8; 1 << 20];
                let mut c = client.lock();
                let mut off = 0;
                while off < self.used {
                    let n = (self.used - off).min(zeros.len() as u64) as usize;
                    c.write_at(&zeros[..n], off)
                        .with_context(|| format!("{}: zeroing", self.spec))?;
                    off += n as u64;
                }
                c.flush()?;
                c.disconnect()?;
            }
        }
        self.used = 0;
        Ok(())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        // An error path: still remove the bench's own directory.
        if let Inner::Dir { work: Some(w), .. } = &self.inner {
            let _ = fs::remove_dir_all(w);
        }
    }
}
