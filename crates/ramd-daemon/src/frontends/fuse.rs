//! FUSE: a filesystem disk mounted at `--mount DIR`. Stopping writes the
//! kernel's dirty pages back (syncfs), unmounts it (detaching it if files
//! are still open there) and, if the mount lives on elsewhere (open files
//! under the detached mount, a copy in another mount namespace: a
//! container, a `PrivateTmp=` service, `unshare -m`), ends the FUSE
//! connection from ramd's side after a short wait, so the stop always
//! completes and the stale copies get ENOTCONN. A second stop aborts the
//! connection at once. `umount DIR` by the user ends it too, and with it
//! the disk, even when another namespace still holds a copy (a watcher
//! sees the mount leave this namespace). A dead `fuse.ramd` mount left at
//! the mount point by a ramd that was killed is cleared at start.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use parking_lot::{Condvar, Mutex};
use ramd_fs::{FuseOptions, Session};
use ramd_store::persist::DiskKind;

use crate::args::{DataPath, DiskArgs, FuseTransport};
use crate::frontend::{
    Claim, DiskContext, DiskSettings, Frontend, FrontendFactory, FrontendStatus,
};
use ramd_fs::ll::uring;
use ramd_store::persist::FlushMode;

pub struct Fuse;

/// How long a stop waits for the mount to go by itself before it ends the
/// FUSE connection (a copy lives on elsewhere).
const GRACE: Duration = Duration::from_secs(3);

/// Checks a mount point before anything is allocated; its canonical path.
/// A dead `fuse.ramd` mount there (its ramd was killed) is cleared first.
pub fn check_mount_point(dir: &Path) -> anyhow::Result<PathBuf> {
    let meta = match std::fs::metadata(dir) {
        // ENOTCONN: the connection is gone; ECONNABORTED and ECANCELED:
        // requests that were queued (over io_uring) when it went.
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
            ) =>
        {
            clear_dead_mount(dir)?;
            std::fs::metadata(dir)
        }
        r => r,
    }
    .with_context(|| format!("mount point {}", dir.display()))?;
    if !meta.is_dir() {
        bail!("mount point {} is not a directory", dir.display());
    }
    if ramd_fs::is_mount_point(dir) {
        bail!(
            "mount point {} is busy: something is already mounted there (umount it first)",
            dir.display()
        );
    }
    dir.canonicalize()
        .with_context(|| format!("mount point {}", dir.display()))
}

/// `dir` answers ENOTCONN (or ECONNABORTED, ECANCELED): a FUSE mount
/// whose daemon is gone. If it is ramd's, detach it (nothing of it can be
/// served again: its data was in the dead process) and say so; anything
/// else is not ours to touch.
fn clear_dead_mount(dir: &Path) -> anyhow::Result<()> {
    match ramd_fs::mount_type_at(dir).as_deref() {
        Some("fuse.ramd") => {
            lazy_umount(dir).with_context(|| {
                format!(
                    "mount point {}: clearing the dead ramd mount there",
                    dir.display()
                )
            })?;
            log::warn!(
                "mount point {}: cleared a dead fuse.ramd mount left by a ramd that is gone \
                 (killed or crashed); its image, if any, is loaded now",
                dir.display()
            );
            Ok(())
        }
        Some(other) => bail!(
            "mount point {}: a dead {other} mount is there (\"Transport endpoint is not \
             connected\": its daemon is gone); `umount -l {}` clears it",
            dir.display(),
            dir.display()
        ),
        None => bail!(
            "mount point {}: Transport endpoint is not connected (a dead mount above it?)",
            dir.display()
        ),
    }
}

fn lazy_umount(dir: &Path) -> std::io::Result<()> {
    ramd_fs::ll::mount::umount2(dir, libc::MNT_DETACH)
}

impl FrontendFactory for Fuse {
    fn claims(&self, disk: &dyn DiskSettings, _run_dir: &Path) -> anyhow::Result<Vec<Claim>> {
        let Some(args) = disk.get::<DiskArgs>() else {
            return Ok(Vec::new());
        };
        match &args.fuse.mount {
            None => Ok(Vec::new()),
            Some(dir) => {
                let claim = Claim(format!("mount point {}", check_mount_point(dir)?.display()));
                // Asked for by name, io_uring that cannot be had stops the
                // disk before anything is allocated.
                if args.fuse.fuse_transport == FuseTransport::IoUring {
                    if let Err(e) = uring::availability() {
                        bail!("FUSE transport io-uring: {e}");
                    }
                }
                if args.fuse.data_path == DataPath::Kernel {
                    if let Some(why) = kernel_data_path_refusal(args) {
                        bail!("{why}");
                    }
                }
                Ok(vec![claim])
            }
        }
    }

    fn build(&self, disk: &DiskContext) -> anyhow::Result<Vec<Arc<dyn Frontend>>> {
        let Some(args) = disk.settings.get::<DiskArgs>() else {
            return Ok(Vec::new());
        };
        let fs = disk
            .content
            .and_then(|c| c.downcast_ref::<Arc<ramd_fs::Fs>>());
        let (DiskKind::Fs, Some(fs), Some(dir)) = (disk.kind, fs, &args.fuse.mount) else {
            return Ok(Vec::new());
        };
        let dir = check_mount_point(dir)?;
        let sync: Option<ramd_fs::fuse::SyncFn> = (args.flush == FlushMode::Persist).then(|| {
            let store = disk.store.clone();
            let f: ramd_fs::fuse::SyncFn = Arc::new(move || store.flush().map_err(|e| e.errno()));
            f
        });
        let io_uring = want_io_uring(args.fuse.fuse_transport, &dir)?;
        let (path, why) = data_path(args);
        let kernel_data = path == DataPath::Kernel;
        match why {
            Some(why) => log::info!(
                "{}: data path store (--data-path auto): {why}",
                dir.display()
            ),
            None => log::info!("{}: data path {path}", dir.display()),
        }
        // The disk made the tier with the filesystem (a load fills it).
        assert_eq!(
            kernel_data,
            fs.hot_tier().is_some(),
            "the tier comes with the data path"
        );
        let mut session = ramd_fs::mount(
            fs.clone(),
            &dir,
            args.threads as usize,
            FuseOptions {
                // The kernel refuses passthrough with the write-back cache.
                writeback_cache: args.writeback_cache() && !kernel_data,
                sync,
                metrics: Some(disk.metrics.frontend("fuse")),
                io_uring,
                passthrough: kernel_data,
            },
            &args.mount_flags(),
        )
        .with_context(|| format!("mounting {}", dir.display()))?;
        if kernel_data && session.init().flags & ramd_fs::ll::abi::init::PASSTHROUGH == 0 {
            // Dropping the session unmounts.
            bail!(
                "--data-path kernel: the kernel did not grant FUSE passthrough at INIT (it \
                 needs Linux 6.9+ built with CONFIG_FUSE_PASSTHROUGH); use --data-path store"
            );
        }
        let ring = Arc::new(AtomicBool::new(false));
        if session.init().io_uring {
            session.set_extra_transport(uring::session_transport(ring.clone()));
        } else if args.fuse.fuse_transport == FuseTransport::IoUring {
            // Dropping the session unmounts.
            bail!("FUSE transport io-uring: the kernel did not grant it at INIT");
        }
        // The FUSE connection's number in fusectl is the mount's device
        // minor. (Not from stat(2): the session is not serving yet.)
        let dev = ramd_fs::mount_device(&dir)
            .with_context(|| format!("{} is not in mountinfo after mounting", dir.display()))?;
        super::bdi::set_read_ahead(dev);
        if args.writeback_cache() && !kernel_data {
            let reserve = super::bdi::limit_dirty(dev, fs.size());
            fs.set_write_reserve(reserve);
            log::debug!(
                "{}: files open uncached once {} or less is free",
                dir.display(),
                ramd_store::human(reserve)
            );
        }
        Ok(vec![Arc::new(FuseFrontend {
            session: Mutex::new(Some(session)),
            dir,
            dev,
            stopping: AtomicBool::new(false),
            ended: Mutex::new(false),
            ended_cv: Condvar::new(),
            ring,
        })])
    }
}

/// The data path of a filesystem disk: `--data-path`, with auto resolved
/// (kernel unless a setting asks for the store or this host cannot give
/// passthrough), and, when auto chose the store, why.
pub(crate) fn data_path(args: &DiskArgs) -> (DataPath, Option<String>) {
    match args.fuse.data_path {
        DataPath::Auto => {
            // Compression under auto keeps its meaning from before auto:
            // every page compressed. The kernel path's cold tier (hot
            // files in the tmpfs, idle closed ones compressed) is asked
            // for by name.
            let why = if args.compresses() {
                Some(
                    "--compress and --recompress ask for the store path, which compresses every \
                     page (for the kernel path's cold tier, which compresses idle closed files, \
                     give --data-path kernel --compress)"
                        .to_string(),
                )
            } else {
                kernel_data_path_refusal(args)
            };
            match why {
                None => (DataPath::Kernel, None),
                Some(why) => (DataPath::Store, Some(why)),
            }
        }
        path => (path, None),
    }
}

/// Why this disk cannot have `--data-path kernel`: a setting it does not
/// have, or what this host or process lacks. Asked for by name, that
/// refuses the disk before anything is allocated; under auto, the disk
/// takes the store path.
fn kernel_data_path_refusal(args: &DiskArgs) -> Option<String> {
    if args.standby {
        return Some(
            "a standby (--standby) serves file data from the store, where each applied save \
             puts it; --data-path kernel keeps it in backing files the kernel reads directly"
                .into(),
        );
    }
    if args.compress.is_none() && args.compress_after.is_some() {
        return Some(
            "--compress-after needs --compress to name a codec (lz4 or zstd): with --data-path \
             kernel it is how long a closed file stays untouched before it moves, compressed, \
             to the cold tier"
                .into(),
        );
    }
    if !args.recompress.is_none() {
        return Some(
            "--data-path kernel cannot re-pack pages (--recompress): its cold tier compresses \
             whole idle files with --compress; leave --recompress out, or use --data-path store"
                .into(),
        );
    }
    if args.fuse.writeback_cache {
        return Some(
            "--data-path kernel cannot use the write-back cache (--writeback-cache): the \
             kernel refuses FUSE passthrough with it; leave the flag out"
                .into(),
        );
    }
    if !has_cap_sys_admin() {
        return Some(
            "--data-path kernel needs CAP_SYS_ADMIN (to make its private tmpfs and to register \
             backing files with FUSE); run ramd as root or use --data-path store"
                .into(),
        );
    }
    if !kernel_has_passthrough() {
        return Some(
            "--data-path kernel needs FUSE passthrough, which this kernel lacks (Linux 6.9+ \
             built with CONFIG_FUSE_PASSTHROUGH: no fuse_passthrough_open in /proc/kallsyms); \
             use --data-path store"
                .into(),
        );
    }
    None
}

/// Whether this kernel has FUSE passthrough: its code is listed in
/// /proc/kallsyms (names are listed even where addresses are hidden).
/// Looked up once per process.
fn kernel_has_passthrough() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        use std::io::BufRead;
        // A fuse module not loaded yet is loaded by an open of /dev/fuse.
        drop(std::fs::File::open("/dev/fuse"));
        let Ok(f) = std::fs::File::open("/proc/kallsyms") else {
            return false;
        };
        std::io::BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.split_whitespace().nth(2) == Some("fuse_passthrough_open"))
    })
}

/// Whether this process has CAP_SYS_ADMIN in effect (CapEff, bit 21).
fn has_cap_sys_admin() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 21) != 0)
}

/// The private tmpfs of `--data-path kernel`, from the disk's settings:
/// its size, inode limit (one more for the tmpfs's own root), huge pages
/// and NUMA nodes and policy.
pub(crate) fn hot_config(args: &DiskArgs, cfg: &ramd_fs::FsConfig) -> ramd_fs::hot::HotConfig {
    use ramd_store::numa::NumaPolicy;
    use ramd_store::HugePages;
    let huge = args.huge_pages.map(|h| match h {
        HugePages::Never => "never",
        HugePages::Madvise => "advise",
        HugePages::Always => "always",
    });
    let mpol = args.numa_nodes.as_ref().map(|nodes| {
        let list = nodes
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        match args.numa_policy.unwrap_or_default() {
            NumaPolicy::Bind => format!("bind:{list}"),
            // tmpfs prefers one node: the first.
            NumaPolicy::Preferred => format!("prefer:{}", nodes.first().copied().unwrap_or(0)),
            NumaPolicy::Interleave => format!("interleave:{list}"),
        }
    });
    ramd_fs::hot::HotConfig {
        size: cfg.size,
        nr_inodes: cfg.nr_inodes.saturating_add(1),
        huge,
        mpol,
        atime: cfg.atime.mode,
    }
}

struct FuseFrontend {
    /// Taken by `serve`.
    session: Mutex<Option<Session>>,
    dir: PathBuf,
    /// The mount's device; its minor is the connection's number in fusectl.
    dev: (u32, u32),
    stopping: AtomicBool,
    /// Set once `serve` returns: the connection is gone.
    ended: Mutex<bool>,
    ended_cv: Condvar,
    /// Set once the io_uring queues serve.
    ring: Arc<AtomicBool>,
}

impl Frontend for FuseFrontend {
    fn serve(&self) -> anyhow::Result<()> {
        let Some(session) = self.session.lock().take() else {
            bail!("{}: served twice", self.dir.display());
        };
        let result = std::thread::scope(|scope| {
            let watcher = std::thread::Builder::new()
                .name("fuse-watch".into())
                .spawn_scoped(scope, || self.watch_unmount());
            if let Err(e) = watcher {
                log::warn!("{}: not watching for unmounts: {e}", self.dir.display());
            }
            let r = session.run();
            *self.ended.lock() = true;
            self.ended_cv.notify_all();
            r
        });
        match result {
            // A detached mount ends with the connection aborted by the kernel
            // once its last file closes (or by us on a second stop).
            Err(e)
                if e.raw_os_error() == Some(libc::ECONNABORTED)
                    && self.stopping.load(Ordering::SeqCst) =>
            {
                Ok(())
            }
            r => r.context("serving FUSE"),
        }
    }

    fn stop(&self, force: bool) {
        let first = !self.stopping.swap(true, Ordering::SeqCst);
        if force {
            return self.abort();
        }
        if !first || *self.ended.lock() {
            return;
        }
        // The write-back cache's dirty pages come to us now, while we serve.
        if let Err(e) = syncfs(&self.dir) {
            log::warn!("{}: syncfs before unmounting: {e}", self.dir.display());
        }
        stop_mount(&self.dir);
        let mut said = false;
        while !self.wait_ended(GRACE) {
            if !holders(self.dev).is_empty() {
                return self.end_held_elsewhere("is still mounted after the unmount");
            }
            // Only files still open under the detached mount, here: they
            // keep working until closed, as on a lazily unmounted tmpfs.
            if !said {
                log::warn!(
                    "{}: waiting for the files still open there to be closed (a second \
                     signal, or `ramd down --force`, ends them now)",
                    self.dir.display()
                );
                said = true;
            }
        }
    }

    fn status(&self) -> FrontendStatus {
        FrontendStatus {
            protocol: "fuse".into(),
            endpoint: self.dir.display().to_string(),
            connections: None,
            transport: Some(
                if self.ring.load(Ordering::SeqCst) {
                    "io-uring"
                } else {
                    "dev"
                }
                .into(),
            ),
        }
    }
}

impl FuseFrontend {
    /// Whether the session ended within `d`.
    fn wait_ended(&self, d: Duration) -> bool {
        let mut ended = self.ended.lock();
        if !*ended {
            self.ended_cv.wait_for(&mut ended, d);
        }
        *ended
    }

    /// The mount left this namespace but lives on elsewhere: write back
    /// what the kernel holds through a copy that remains, then end the
    /// connection so that the copies fail with ENOTCONN instead of keeping
    /// a disk nobody can stop.
    fn end_held_elsewhere(&self, what: &str) {
        let holders = holders(self.dev);
        let named: Vec<String> = holders
            .iter()
            .map(|(pid, mp)| format!("pid {pid} ({}) at {}", comm(*pid), mp.display()))
            .collect();
        log::warn!(
            "{} {what}{}: saving and ending its FUSE connection; those copies now fail with \
             ENOTCONN (`umount` there clears them)",
            self.dir.display(),
            if named.is_empty() {
                " (open files under a detached mount)".to_string()
            } else {
                format!(", held by another mount namespace: {}", named.join(", "))
            }
        );
        if let Some((pid, mp)) = holders.first() {
            let via = Path::new("/proc")
                .join(pid.to_string())
                .join("root")
                .join(mp.strip_prefix("/").unwrap_or(mp));
            if let Err(e) = syncfs(&via) {
                log::warn!("syncfs through {}: {e}", via.display());
            }
        }
        self.abort();
    }

    /// Ends the connection, and clears our mount of it if it is still
    /// here: a dead mount would answer ENOTCONN to everyone.
    fn abort(&self) {
        abort_fuse_connection(self.dev.1);
        if self.mounted_here() == Some(true) {
            if let Err(e) = lazy_umount(&self.dir) {
                log::warn!("detaching {}: {e}", self.dir.display());
            }
        }
    }

    /// Whether this namespace still has the mount (None: mountinfo is
    /// unreadable).
    fn mounted_here(&self) -> Option<bool> {
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        Some(!ramd_fs::mount_points_of(&info, self.dev).is_empty())
    }

    /// Until the session ends: if the mount leaves this namespace (the
    /// user's `umount`) while the connection lives on (a copy in another
    /// namespace), end it, so that the disk stops and saves as it would
    /// have.
    fn watch_unmount(&self) {
        let Ok(info) = std::fs::File::open("/proc/self/mountinfo") else {
            return;
        };
        use std::os::fd::AsRawFd;
        loop {
            // POLLPRI: the mount table changed (proc(5)); the timeout only
            // bounds how long an ended session keeps this thread.
            let mut pfd = libc::pollfd {
                fd: info.as_raw_fd(),
                events: libc::POLLPRI,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe { libc::poll(&mut pfd, 1, 1000) };
            if *self.ended.lock() || self.stopping.load(Ordering::SeqCst) {
                return;
            }
            // Unreadable: assume nothing changed.
            if self.mounted_here() != Some(false) {
                continue;
            }
            // The usual `umount`: the session ends by itself at once; a
            // lazy one here ends when the last file is closed.
            if self.wait_ended(Duration::from_secs(1)) || holders(self.dev).is_empty() {
                continue;
            }
            if self.stopping.swap(true, Ordering::SeqCst) {
                return;
            }
            self.end_held_elsewhere("was unmounted here");
            return;
        }
    }
}

/// Processes in other mount namespaces that have device `dev` mounted,
/// with the mount point as their namespace names it (one per namespace).
fn holders(dev: (u32, u32)) -> Vec<(u32, PathBuf)> {
    let ns = |pid: &str| std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok();
    let mine = ns("self");
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let name = p.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Some(their) = ns(&pid.to_string()) else {
            continue;
        };
        if Some(&their) == mine.as_ref() || !seen.insert(their) {
            continue;
        }
        let Ok(info) = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")) else {
            continue;
        };
        if let Some(mp) = ramd_fs::mount_points_of(&info, dev).into_iter().next() {
            out.push((pid, mp));
        }
    }
    out
}

fn comm(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// syncfs(2) of the filesystem `path` is on.
fn syncfs(path: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(path)?;
    // SAFETY: a valid open fd.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Whether to ask the kernel for FUSE over io_uring. `auto` takes it where
/// it can be had (turning the fuse module's switch on as root, logged) and
/// says in one line why not otherwise.
fn want_io_uring(transport: FuseTransport, dir: &Path) -> anyhow::Result<bool> {
    if transport == FuseTransport::Dev {
        return Ok(false);
    }
    match uring::enable() {
        Ok(_) => Ok(true),
        Err(e) if transport == FuseTransport::IoUring => bail!("FUSE transport io-uring: {e}"),
        Err(e) => {
            log::info!("{}: FUSE through /dev/fuse: {e}", dir.display());
            Ok(false)
        }
    }
}

/// Unmounts `dir`; if files are still open there, detaches it (it vanishes
/// from the namespace now; the caller ends the connection if it lives on).
fn stop_mount(dir: &Path) {
    let Err(e) = ramd_fs::ll::mount::umount2(dir, 0) else {
        return;
    };
    // EINVAL: no longer a mount point (the user's umount came first).
    if e.raw_os_error() == Some(libc::EINVAL) {
        return;
    }
    if e.raw_os_error() != Some(libc::EBUSY) {
        log::warn!("unmounting {}: {e}", dir.display());
        return;
    }
    match lazy_umount(dir) {
        Ok(()) => log::warn!(
            "{} is busy (files open there): detached; the disk stops once they are closed",
            dir.display()
        ),
        Err(e) => log::warn!("detaching {}: {e}", dir.display()),
    }
}

/// Ends a FUSE connection through fusectl: pending and future requests of
/// open files fail, and the session returns.
fn abort_fuse_connection(conn: u32) {
    let base = Path::new("/sys/fs/fuse/connections");
    let abort = base.join(conn.to_string()).join("abort");
    if !abort.exists() {
        // fusectl is usually mounted by systemd; mount it if it is not.
        let _ = std::process::Command::new("mount")
            .args(["-t", "fusectl", "fusectl"])
            .arg(base)
            .status();
    }
    match std::fs::write(&abort, "1") {
        Ok(()) => log::warn!("aborted FUSE connection {conn}: open files get ENOTCONN"),
        Err(e) => log::warn!("aborting FUSE connection via {}: {e}", abort.display()),
    }
}
