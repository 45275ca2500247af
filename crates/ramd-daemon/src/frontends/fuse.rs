//! FUSE: a filesystem disk mounted at `--mount DIR`. Stopping unmounts it
//! (detaching it if files are still open there); a second stop aborts the
//! FUSE connection. `umount DIR` by the user ends it too, and with it the
//! disk.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context};
use parking_lot::Mutex;
use ramd_fs::{FuseOptions, Session};
use ramd_store::persist::DiskKind;

use crate::args::{DiskArgs, FuseTransport};
use crate::frontend::{Claim, DiskContext, Frontend, FrontendFactory, FrontendStatus};
use ramd_fs::ll::uring;
use ramd_store::persist::FlushMode;

pub struct Fuse;

/// Checks a mount point before anything is allocated; its canonical path.
pub fn check_mount_point(dir: &Path) -> anyhow::Result<PathBuf> {
    let meta = std::fs::metadata(dir).with_context(|| format!("mount point {}", dir.display()))?;
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

impl FrontendFactory for Fuse {
    fn claims(&self, args: &DiskArgs, _run_dir: &Path) -> anyhow::Result<Vec<Claim>> {
        match &args.mount {
            None => Ok(Vec::new()),
            Some(dir) => {
                let claim = Claim(format!("mount point {}", check_mount_point(dir)?.display()));
                // Asked for by name, io_uring that cannot be had stops the
                // disk before anything is allocated.
                if args.fuse_transport == FuseTransport::IoUring {
                    if let Err(e) = uring::availability() {
                        bail!("FUSE transport io-uring: {e}");
                    }
                }
                Ok(vec![claim])
            }
        }
    }

    fn build(&self, disk: &DiskContext) -> anyhow::Result<Vec<Arc<dyn Frontend>>> {
        let (DiskKind::Fs, Some(fs), Some(dir)) = (disk.kind, disk.fs, &disk.args.mount) else {
            return Ok(Vec::new());
        };
        let dir = check_mount_point(dir)?;
        let sync: Option<ramd_fs::fuse::SyncFn> =
            (disk.args.flush == FlushMode::Persist).then(|| {
                let store = disk.store.clone();
                let f: ramd_fs::fuse::SyncFn =
                    Arc::new(move || store.flush().map_err(|e| e.errno()));
                f
            });
        let io_uring = want_io_uring(disk.args.fuse_transport, &dir)?;
        let mut session = ramd_fs::mount(
            fs.clone(),
            &dir,
            disk.args.threads as usize,
            FuseOptions {
                writeback_cache: disk.args.writeback_cache(),
                sync,
                metrics: Some(disk.metrics.frontend("fuse")),
                io_uring,
            },
            &disk.args.mount_flags(),
        )
        .with_context(|| format!("mounting {}", dir.display()))?;
        let ring = Arc::new(AtomicBool::new(false));
        if session.init().io_uring {
            session.set_extra_transport(uring::session_transport(ring.clone()));
        } else if disk.args.fuse_transport == FuseTransport::IoUring {
            // Dropping the session unmounts.
            bail!("FUSE transport io-uring: the kernel did not grant it at INIT");
        }
        // The FUSE connection's number in fusectl is the mount's device
        // minor. (Not from stat(2): the session is not serving yet.)
        let dev = ramd_fs::mount_device(&dir)
            .with_context(|| format!("{} is not in mountinfo after mounting", dir.display()))?;
        let conn = dev.1;
        super::bdi::set_read_ahead(dev);
        if disk.args.writeback_cache() {
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
            conn,
            stopping: AtomicBool::new(false),
            ring,
        })])
    }
}

struct FuseFrontend {
    /// Taken by `serve`.
    session: Mutex<Option<Session>>,
    dir: PathBuf,
    conn: u32,
    stopping: AtomicBool,
    /// Set once the io_uring queues serve.
    ring: Arc<AtomicBool>,
}

impl Frontend for FuseFrontend {
    fn serve(&self) -> anyhow::Result<()> {
        let Some(session) = self.session.lock().take() else {
            bail!("{}: served twice", self.dir.display());
        };
        match session.run() {
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
        self.stopping.store(true, Ordering::SeqCst);
        if force {
            abort_fuse_connection(self.conn)
        } else {
            stop_mount(&self.dir)
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
/// from the namespace now, and the session ends once the last file is
/// closed).
fn stop_mount(dir: &Path) {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return;
    };
    // SAFETY: umount2 takes a NUL-terminated path we own.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        return;
    }
    let e = std::io::Error::last_os_error();
    // EINVAL: no longer a mount point (the user's umount came first).
    if e.raw_os_error() == Some(libc::EINVAL) {
        return;
    }
    if e.raw_os_error() != Some(libc::EBUSY) {
        log::warn!("unmounting {}: {e}", dir.display());
        return;
    }
    // SAFETY: as above.
    if unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) } == 0 {
        log::warn!(
            "{} is busy: detached; its disk stops when its last open file is closed \
             (signal again to stop now and fail those files' I/O)",
            dir.display()
        );
    } else {
        let e = std::io::Error::last_os_error();
        log::warn!("detaching {}: {e}", dir.display());
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
