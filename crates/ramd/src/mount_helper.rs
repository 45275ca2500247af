//! The mount(8) and umount(8) helpers: the `ramd` binary run as
//! `/sbin/mount.fuse.ramd` or `/sbin/umount.fuse.ramd` (symlinks made by
//! `ramd install-mount-helper`), which util-linux runs for filesystems of
//! type `fuse.ramd`:
//!
//! - `mount.fuse.ramd SOURCE DIR [-sfnv] -o OPTIONS`: checks the options
//!   and the mount point, forks a daemon (its own session, no terminal, its
//!   log in the journal under systemd, else in `RUN_DIR/NAME.log`) that
//!   serves the disk as `ramd serve` would,
//!   and returns once the filesystem is mounted and serving, or with the
//!   daemon's error (the daemon has then stopped: nothing is left mounted).
//!   Then it sets the VFS flags with `mount(2)` `MS_REMOUNT`.
//! - `... -o remount,...`: the disk's own settings (size, atime) through
//!   its control socket first (a refusal changes nothing), then the VFS
//!   flags (`ro`, `nosuid`...) with `MS_REMOUNT`.
//! - `umount.fuse.ramd DIR`: unmounts, then waits until the daemon has
//!   saved (if the disk has an image) and stopped, so the image is whole
//!   when umount returns, and a save that failed is umount's failure. It
//!   finds the daemon in the run directory the mount recorded in
//!   libmount's utab (`x-ramd.run_dir=`), as remount does.

use std::ffi::{CString, OsString};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use ramd_daemon::control;
use ramd_daemon::daemon::{Daemon, Hangup, Setup};
use ramd_daemon::frontends::fuse::check_mount_point;
use ramd_daemon::mount_opts::{self, MountRequest};

/// How long a mount waits for its daemon (loading a large image takes a
/// while), and umount for the save at stop.
const READY_DEADLINE: Duration = Duration::from_secs(600);
const SAVE_DEADLINE: Duration = Duration::from_secs(900);

/// mount(8)'s exit codes: incorrect invocation, and mount failure.
const EX_USAGE: i32 = 1;
const EX_FAIL: i32 = 32;

/// Runs the helper `argv[0]` names, if it names one; its exit code.
pub fn run_if_helper() -> Option<i32> {
    let argv: Vec<OsString> = std::env::args_os().collect();
    let name = Path::new(argv.first()?).file_name()?.to_str()?.to_string();
    let result = match name.as_str() {
        "mount.fuse.ramd" => mount(&argv[1..]),
        "umount.fuse.ramd" => umount(&argv[1..]),
        _ => return None,
    };
    Some(match result {
        Ok(code) => code,
        Err(e) => {
            // Shared code (the daemon's checks above all) names flags; the
            // user wrote mount options.
            eprintln!(
                "{name}: {}",
                mount_opts::as_mount_options(&format!("{e:#}"))
            );
            EX_FAIL
        }
    })
}

/// `ramd install-mount-helper`: the two symlinks mount(8) and umount(8)
/// look for.
pub fn install(dir: &Path, bin: Option<&Path>) -> Result<()> {
    let bin = match bin {
        Some(b) => b.to_path_buf(),
        None => std::env::current_exe().context("finding this ramd binary")?,
    };
    let bin = bin
        .canonicalize()
        .with_context(|| format!("ramd binary {}", bin.display()))?;
    for name in ["mount.fuse.ramd", "umount.fuse.ramd"] {
        let link = dir.join(name);
        match std::fs::symlink_metadata(&link) {
            Ok(m) if m.file_type().is_symlink() => std::fs::remove_file(&link)
                .with_context(|| format!("replacing {}", link.display()))?,
            Ok(_) => bail!(
                "{} exists and is not a symlink: remove it first",
                link.display()
            ),
            Err(_) => {}
        }
        std::os::unix::fs::symlink(&bin, &link)
            .with_context(|| format!("creating {}", link.display()))?;
        println!("{} -> {}", link.display(), bin.display());
    }
    Ok(())
}

/// `mount.fuse.ramd SOURCE DIR [-sfnv] [-N NS] [-o OPTIONS] [-t TYPE]`.
fn mount(argv: &[OsString]) -> Result<i32> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut fake = false;
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-o") => match it.next() {
                Some(o) => options.push(o.to_string_lossy().into_owned()),
                None => return usage("-o needs OPTIONS"),
            },
            Some("-t") => match it.next().and_then(|t| t.to_str()) {
                Some("fuse.ramd") => {}
                Some(t) => return usage(&format!("type {t:?} is not fuse.ramd")),
                None => return usage("-t needs a type"),
            },
            Some("-N") => return usage("mount namespaces (-N) are not supported"),
            Some(f) if f.starts_with('-') && f.len() > 1 => {
                for c in f[1..].chars() {
                    match c {
                        'f' => fake = true,
                        // No mtab and verbose: nothing to do. Sloppy: an
                        // unknown option stays an error (it may be a typo
                        // of a size or an image path).
                        's' | 'n' | 'v' => {}
                        c => return usage(&format!("unknown flag -{c}")),
                    }
                }
            }
            _ => positional.push(a.clone()),
        }
    }
    let [source, dir] = positional.as_slice() else {
        return usage("expected SOURCE and DIR");
    };
    let source = source.to_string_lossy();
    let options = options.join(",");
    let req = mount_opts::parse(&source, Path::new(dir), &options)?;
    if fake {
        return Ok(0);
    }
    if req.remount {
        // The mount's own run directory unless the options name one.
        let run_dir = match &req.run_dir {
            Some(d) => d.clone(),
            None => recorded_run_dir(Path::new(dir)).unwrap_or_else(env_run_dir),
        };
        return remount(Path::new(dir), &options, &req, &run_dir);
    }
    // Absolute: the daemon leaves for `/`, and umount must find it from
    // anywhere.
    let run_dir = req.run_dir.clone().unwrap_or_else(env_run_dir);
    let run_dir = std::path::absolute(&run_dir)
        .with_context(|| format!("run directory {}", run_dir.display()))?;
    start(req, &run_dir)?;
    Ok(0)
}

fn usage(msg: &str) -> Result<i32> {
    eprintln!(
        "mount.fuse.ramd: {msg}\nusage: mount.fuse.ramd SOURCE DIR [-sfnv] [-o OPTIONS] \
         (run by mount -t fuse.ramd)"
    );
    Ok(EX_USAGE)
}

/// `RAMD_RUN_DIR`, else `ramd`'s own default.
fn env_run_dir() -> PathBuf {
    std::env::var_os("RAMD_RUN_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(crate::default_run_dir)
}

/// libmount's userspace option that records a mount's run directory
/// beside the `helper=` marker (`x-` options are kept in utab, for umount
/// and other tools, and never passed to mount(2)).
const RUN_DIR_OPTION: &str = "x-ramd.run_dir";

/// The run directory the mount at `dir` was made with, as its utab entry
/// records it (`findmnt --mtab` merges utab into the kernel's table).
/// `None` for a mount without one (made before ramd recorded it, or
/// whose utab entry is lost): the caller falls back to the default.
fn recorded_run_dir(dir: &Path) -> Option<PathBuf> {
    let out = std::process::Command::new("findmnt")
        .args([
            "--mtab",
            "--noheadings",
            "--output",
            "OPTIONS",
            "--mountpoint",
        ])
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    // The topmost mount at `dir` is listed last.
    let line = text.lines().last()?;
    line.split(',').find_map(|o| {
        let v = o.strip_prefix(RUN_DIR_OPTION)?.strip_prefix('=')?;
        Some(PathBuf::from(v))
    })
}

/// Starts the daemon of a new mount and waits until it serves.
fn start(mut req: MountRequest, run_dir: &Path) -> Result<()> {
    // The daemon leaves the caller's directory (so that it never keeps a
    // filesystem busy): a relative image path is taken from here.
    // (an s3:// URL is no path).
    let relative = |i: &&mut PathBuf| i.is_relative() && !ramd_store::persist::is_url(i);
    if let Some(img) = req.disk.image.as_mut().filter(relative) {
        *img = std::env::current_dir()
            .context("the current directory (image= is relative)")?
            .join(&*img);
    }
    let dir = req
        .disk
        .fuse
        .mount
        .clone()
        .expect("parse sets the mount point");
    let mut flags = VfsFlags::of(&req);
    // A standby's mount is read-only until its promotion (a remount's
    // `standby` may be a promoted disk's: the daemon refuses `rw` on a
    // standby itself).
    if req.disk.standby {
        flags.0 |= libc::MS_RDONLY;
    }
    let source = req.disk.mount_flags().source;
    // The checks that need no daemon, before anything starts.
    let dir = check_mount_point(&dir)?;
    let name = req.disk.name.clone();
    ramd_daemon::disk::make_run_dir(run_dir)?;
    let ctl = control::disk_socket(run_dir, &name);
    if std::os::unix::net::UnixStream::connect(&ctl).is_ok() {
        bail!(
            "a disk named {name:?} is already running (control socket {}): give this mount \
             another name with -o name=NAME",
            ctl.display()
        );
    }
    // Under systemd (a mount unit, an fstab line at boot) stderr is the
    // journal, and the daemon keeps it; anywhere else a terminal or a pipe
    // must not be held, so it gets a file.
    let (log, log_file) = if stderr_is_journal() {
        ("the journal".to_string(), None)
    } else {
        let path = run_dir.join(format!("{name}.log"));
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("opening the daemon's log {}", path.display()))?;
        (path.display().to_string(), Some(f))
    };
    let (read_end, write_end) = pipe()?;
    // SAFETY: nothing else runs in this process yet (no thread has been
    // started: parsing and the checks above are single-threaded), so the
    // child may go on running Rust code after fork.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(std::io::Error::last_os_error()).context("fork");
    }
    if pid == 0 {
        drop(read_end);
        let code = daemon_child(req.disk, run_dir, log_file, write_end);
        std::process::exit(code);
    }
    drop(write_end);
    drop(log_file);
    let answer = read_until(read_end, READY_DEADLINE)?;
    match answer.as_deref() {
        Some("ok") => {}
        Some(err) => bail!(
            "{}\n(nothing was mounted; the daemon's log: {log})",
            err.trim_end(),
        ),
        None => {
            // SAFETY: kill(2) of the child we forked, which has not
            // answered: it stops cleanly on SIGTERM (unmounting).
            unsafe { libc::kill(pid, libc::SIGTERM) };
            bail!(
                "the daemon did not become ready within {}s or died; stopped it (its log: {log})",
                READY_DEADLINE.as_secs(),
            );
        }
    }
    set_vfs_flags(&dir, &flags)?;
    register_umount_helper(&source, &dir, run_dir);
    Ok(())
}

/// Makes umount(8) run umount.fuse.ramd for this mount. Without a
/// userspace option in libmount's utab, umount only asks statfs(2) for
/// the type, which says `fuse`, and never looks for a helper; a
/// `helper=fuse.ramd` marker (umount(8), EXTERNAL HELPERS) sends every
/// umount of the mount point to ours. Beside it, the run directory
/// (`x-ramd.run_dir=`), where umount and remount find the disk's control
/// socket whatever their own environment says. `mount --fake` writes both
/// the way libmount keeps them; umount removes them. Failing only costs the
/// wait for the save at umount, so it is a warning.
fn register_umount_helper(source: &str, dir: &Path, run_dir: &Path) {
    let mut options = "helper=fuse.ramd".to_string();
    // A comma, quote or blank would split or end the option: such a
    // directory is left unrecorded (RAMD_RUN_DIR still finds it).
    match run_dir.to_str() {
        Some(d) if !d.contains(|c: char| c == ',' || c == '"' || c.is_whitespace()) => {
            options += &format!(",{RUN_DIR_OPTION}={d}");
        }
        _ => eprintln!(
            "mount.fuse.ramd: warning: run directory {} cannot be recorded for umount: \
             umount will look in RAMD_RUN_DIR or the default",
            run_dir.display()
        ),
    }
    let out = std::process::Command::new("mount")
        .args(["--fake", "--internal-only", "-t", "fuse.ramd", "-o"])
        .arg(&options)
        .arg(source)
        .arg(dir)
        .stdin(std::process::Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => eprintln!(
            "mount.fuse.ramd: warning: umount will not wait for the save at stop: mount --fake: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Err(e) => eprintln!(
            "mount.fuse.ramd: warning: umount will not wait for the save at stop: running mount: {e}"
        ),
    }
}

/// Whether stderr is the journal's stream: systemd says so in
/// `JOURNAL_STREAM` (`DEVICE:INODE` of that stream, systemd.exec(5)).
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    // SAFETY: fd 2 is borrowed for fstat only, and not closed.
    let stderr = unsafe { std::os::fd::BorrowedFd::borrow_raw(2) };
    let Ok(f) = stderr.try_clone_to_owned().map(std::fs::File::from) else {
        return false;
    };
    f.metadata()
        .is_ok_and(|m| dev.parse() == Ok(m.dev()) && ino.parse() == Ok(m.ino()))
}

/// The forked daemon: a session of its own, no terminal, logs to `log`
/// (`None`: the inherited stderr, the journal);
/// tells the helper "ok" once serving, or the error that stopped it.
fn daemon_child(
    disk: ramd_daemon::args::DiskArgs,
    run_dir: &Path,
    log: Option<std::fs::File>,
    ready: OwnedFd,
) -> i32 {
    // SAFETY: setsid, open, dup2, chdir and prctl on fds and strings we
    // own.
    unsafe {
        libc::setsid();
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        if null >= 0 {
            libc::dup2(null, 0);
            libc::dup2(null, 1);
            libc::close(null);
        }
        if let Some(log) = &log {
            libc::dup2(log.as_raw_fd(), 2);
        }
        libc::chdir(c"/".as_ptr());
        libc::prctl(libc::PR_SET_NAME, c"ramd".as_ptr());
    }
    drop(log);
    crate::init_logging();
    let ready = std::sync::Arc::new(std::sync::Mutex::new(Some(std::fs::File::from(ready))));
    let on_ready = {
        let ready = ready.clone();
        Box::new(move || {
            if let Some(mut f) = ready.lock().expect("not poisoned").take() {
                let _ = f.write_all(b"ok");
            }
        })
    };
    log::info!(
        "mount.fuse.ramd: serving {} as disk {:?}",
        disk.fuse
            .mount
            .as_deref()
            .unwrap_or(Path::new(""))
            .display(),
        disk.name
    );
    let result = Daemon::serve(
        disk,
        Setup {
            run_dir: run_dir.to_path_buf(),
            registry: crate::registry(),
            on_ready: Some(on_ready),
            metrics: None,
            // Detached (setsid): no terminal of its own can hang up.
            hangup: Hangup::Ignore,
            all_or_nothing: false,
            load_progress: crate::progress::load_progress,
        },
    );
    match result {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("ramd: error: {e:#}");
            // Not ready yet: the helper reports it.
            if let Some(mut f) = ready.lock().expect("not poisoned").take() {
                let _ = write!(f, "{e:#}");
            }
            1
        }
    }
}

fn pipe() -> Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two fds we then own.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error()).context("pipe");
    }
    // SAFETY: both fds are open and owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Everything written to `fd` until EOF, or `None` if nothing came by
/// the deadline (or EOF came with nothing).
fn read_until(fd: OwnedFd, deadline: Duration) -> Result<Option<String>> {
    let end = Instant::now() + deadline;
    let mut out = Vec::new();
    let mut f = std::fs::File::from(fd);
    loop {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(None);
        }
        let mut p = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = left.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: poll on one pollfd we own.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e).context("waiting for the daemon");
        }
        if n == 0 {
            continue;
        }
        let mut buf = [0u8; 4096];
        match f.read(&mut buf)? {
            0 => break,
            k => out.extend_from_slice(&buf[..k]),
        }
    }
    Ok((!out.is_empty()).then(|| String::from_utf8_lossy(&out).into_owned()))
}

/// The VFS side of a mount: `MS_*` flags for mount(2).
struct VfsFlags(libc::c_ulong);

impl VfsFlags {
    fn of(req: &MountRequest) -> VfsFlags {
        let d = &req.disk;
        VfsFlags(ramd_fs::ll::mount::ms_flags([
            (d.read_only, "ro"),
            (d.fuse.nosuid, "nosuid"),
            (d.fuse.nodev, "nodev"),
            (d.fuse.noexec, "noexec"),
            (d.fuse.noatime, "noatime"),
            (d.fuse.strictatime, "strictatime"),
            (!d.fuse.noatime && !d.fuse.strictatime, "relatime"),
            (d.fuse.nodiratime, "nodiratime"),
            (req.sync, "sync"),
            (req.dirsync, "dirsync"),
            (req.lazytime, "lazytime"),
        ]))
    }
}

/// Applies the VFS flags to the mount at `dir` (`MS_REMOUNT`: the
/// superblock's read-only flag and the mount's own flags, all at once).
fn set_vfs_flags(dir: &Path, flags: &VfsFlags) -> Result<()> {
    let c = CString::new(dir.as_os_str().as_bytes()).context("mount point")?;
    // SAFETY: mount(2) with a NUL-terminated path we own; no source, type
    // or data (FUSE takes none on a remount).
    let r = unsafe {
        libc::mount(
            std::ptr::null(),
            c.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | flags.0,
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("setting the mount flags of {}", dir.display()));
    }
    Ok(())
}

/// The control socket of the disk mounted at `dir`, in `run_dir`.
fn disk_at(dir: &Path, run_dir: &Path) -> Result<Option<PathBuf>> {
    let want = dir.display().to_string();
    for ctl in control::sockets(run_dir, "ctl")? {
        let Ok(v) = control::request(&ctl, "status", Some(Duration::from_secs(5))) else {
            continue;
        };
        let mounted = v["disks"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|d| d["mount"].as_str() == Some(want.as_str()));
        if mounted {
            return Ok(Some(ctl));
        }
    }
    Ok(None)
}

/// `mount -o remount,...`.
fn remount(dir: &Path, options: &str, req: &MountRequest, run_dir: &Path) -> Result<i32> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("mount point {}", dir.display()))?;
    let Some(ctl) = disk_at(&dir, run_dir)? else {
        bail!(
            "no ramd disk is mounted at {} (looked in run directory {}; give -o run_dir=DIR if \
             it was mounted with another)",
            dir.display(),
            run_dir.display()
        );
    };
    control::request(&ctl, &format!("remount {options}"), Some(SAVE_DEADLINE))?;
    let mut flags = VfsFlags::of(req);
    if !req.atime_given {
        // No atime flag at all: mount(2) keeps the mount's own.
        flags.0 &=
            !(libc::MS_NOATIME | libc::MS_RELATIME | libc::MS_STRICTATIME | libc::MS_NODIRATIME);
    }
    set_vfs_flags(&dir, &flags)?;
    Ok(0)
}

/// `umount.fuse.ramd DIR [-nlfvr] [-N NS] [-t TYPE]`.
fn umount(argv: &[OsString]) -> Result<i32> {
    let mut dir = None;
    let mut flags = 0;
    let mut it = argv.iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-t") => {
                it.next();
            }
            Some("-N") => {
                eprintln!("umount.fuse.ramd: mount namespaces (-N) are not supported");
                return Ok(EX_USAGE);
            }
            Some(f) if f.starts_with('-') && f.len() > 1 => {
                for c in f[1..].chars() {
                    match c {
                        'l' => flags |= libc::MNT_DETACH,
                        'f' => flags |= libc::MNT_FORCE,
                        // no mtab, verbose, read-only fallback: nothing to do.
                        'n' | 'v' | 'r' | 'i' => {}
                        c => {
                            eprintln!("umount.fuse.ramd: unknown flag -{c}");
                            return Ok(EX_USAGE);
                        }
                    }
                }
            }
            _ => dir = Some(PathBuf::from(a)),
        }
    }
    let Some(dir) = dir else {
        eprintln!("umount.fuse.ramd: usage: umount.fuse.ramd DIR [-nlfv]");
        return Ok(EX_USAGE);
    };
    // Where the mount helper recorded the disk's control socket: with
    // `run_dir=` that is not where this process would look by default.
    let run_dir = recorded_run_dir(&dir).unwrap_or_else(env_run_dir);
    // Asked before unmounting: afterwards the disk may be gone already.
    // A lazy unmount waits for nobody.
    let waiting = match disk_at(&dir, &run_dir)? {
        Some(ctl) if flags & libc::MNT_DETACH == 0 => Some(send_wait(&ctl)?),
        _ => None,
    };
    let c = CString::new(dir.as_os_str().as_bytes()).context("mount point")?;
    // SAFETY: umount2 with a NUL-terminated path we own.
    if unsafe { libc::umount2(c.as_ptr(), flags) } != 0 {
        let e = std::io::Error::last_os_error();
        let why = if e.raw_os_error() == Some(libc::EBUSY) {
            "target is busy".to_string()
        } else {
            e.to_string()
        };
        eprintln!("umount: {}: {why}.", dir.display());
        return Ok(EX_FAIL);
    }
    if let Some(mut conn) = waiting {
        // The daemon answers once the disk is gone: saved (with an image)
        // and stopped. A failed save fails the umount (the image keeps its
        // previous save).
        let v = read_answer(&mut conn).with_context(|| {
            format!(
                "{} is unmounted, but its disk did not stop cleanly",
                dir.display()
            )
        })?;
        if v.get("saved").and_then(|s| s.as_bool()) == Some(true) {
            log::debug!("{}: saved", dir.display());
        }
    }
    Ok(0)
}

type Lines = std::io::BufReader<std::os::unix::net::UnixStream>;

/// Sends `wait` and returns once the daemon has registered it (its first
/// line), so that the unmount that follows cannot end the disk first.
fn send_wait(ctl: &Path) -> Result<Lines> {
    let mut conn = std::os::unix::net::UnixStream::connect(ctl)
        .with_context(|| format!("control socket {}", ctl.display()))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    writeln!(conn, "wait")?;
    let mut lines = std::io::BufReader::new(conn);
    read_answer(&mut lines).context("registering the wait for the save")?;
    lines.get_ref().set_read_timeout(Some(SAVE_DEADLINE))?;
    Ok(lines)
}

/// The next JSON line; an `{"error": ...}` line is an error.
fn read_answer(lines: &mut Lines) -> Result<serde_json::Value> {
    use std::io::BufRead;
    let mut text = String::new();
    lines.read_line(&mut text)?;
    if text.is_empty() {
        bail!("the daemon closed its control socket without answering");
    }
    let v: serde_json::Value = serde_json::from_str(&text)?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        bail!("{e}");
    }
    Ok(v)
}
