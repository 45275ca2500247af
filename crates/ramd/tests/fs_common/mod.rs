//! Harness for the filesystem-disk tests (`ramd serve --mount`).
//!
//! Test files use it as
//! ```ignore
//! mod common;
//! mod fs_common;
//! ```
//! and get from here: [`FsDisk`] (a mounted ramd filesystem, always unmounted
//! on drop, also when the test panics), [`KernelTmpfs`] (a kernel tmpfs, the
//! reference the semantics are compared with), and small clients (`df`,
//! python snippets, tools installed with cargo). Rules, as in `common`: a
//! missing tool fails the test (never a skip), every wait is a poll with a
//! deadline, nothing is left mounted.

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::fs::{self, File};
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

use crate::common::{
    accounted_status, ramd_bin, require_tool, run, wait_child, wait_until, Output, CMD_TIMEOUT,
    START_DEADLINE, STOP_DEADLINE,
};

/// How long an unmount (or the daemon's exit after one) may take.
pub const UNMOUNT_DEADLINE: Duration = Duration::from_secs(20);

// ---------------------------------------------------------------------------
// Mount table

/// mountinfo writes space, tab, newline and backslash as `\ooo`.
fn unescape_mountinfo(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(u8::is_ascii_digit) {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

/// The mountinfo line of the mount at `path` (the topmost one), if any.
pub fn mountinfo_line(path: &Path) -> Option<String> {
    use std::os::unix::ffi::OsStrExt;
    let want = path.as_os_str().as_bytes();
    let info = fs::read_to_string("/proc/self/mountinfo").expect("read /proc/self/mountinfo");
    info.lines()
        .rfind(|l| {
            l.split(' ')
                .nth(4)
                .is_some_and(|mp| unescape_mountinfo(mp) == want)
        })
        .map(str::to_string)
}

/// The filesystem type of the mount at `path` ("fuse", "tmpfs"…).
pub fn mount_fstype(path: &Path) -> Option<String> {
    let line = mountinfo_line(path)?;
    let (_, after) = line.split_once(" - ")?;
    after.split(' ').next().map(str::to_string)
}

pub fn is_mounted(path: &Path) -> bool {
    mountinfo_line(path).is_some()
}

/// `umount PATH`, retried while busy; then `umount -l` past the deadline.
/// Returns whether the plain unmount worked.
pub fn umount_or_detach(path: &Path) -> bool {
    let mut last = String::new();
    let mut ok = false;
    let deadline = std::time::Instant::now() + UNMOUNT_DEADLINE;
    while is_mounted(path) {
        let out = run(Command::new("umount").arg(path), CMD_TIMEOUT);
        if out.success() {
            ok = true;
            break;
        }
        last = out.stderr;
        if std::time::Instant::now() >= deadline {
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    if is_mounted(path) {
        eprintln!("umount {path:?} failed ({last}); detaching lazily");
        let _ = run(Command::new("umount").arg("-l").arg(path), CMD_TIMEOUT);
        return false;
    }
    ok || last.is_empty()
}

// ---------------------------------------------------------------------------
// Tools

/// A tool installed with `cargo install` (pjdfstest, fsx): PATH first, then
/// `$CARGO_HOME/bin`, then `~/.cargo/bin`. Panics with the install hint.
pub fn cargo_tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    if let Some(h) = std::env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(h).join("bin"));
    }
    if let Some(h) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(h).join(".cargo/bin"));
    }
    for d in dirs {
        let p = d.join(name);
        if fs::metadata(&p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0) {
            return p;
        }
    }
    panic!(
        "required tool `{name}` is not installed (not in PATH, $CARGO_HOME/bin or \
         ~/.cargo/bin); run scripts/install-test-tools (cargo install --locked {name})"
    );
}

/// A python3 for the snippets: the distribution's first (it has sqlite3,
/// mmap and ctypes), else the one in PATH.
pub fn python() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let sys = PathBuf::from("/usr/bin/python3");
        if sys.exists() {
            sys
        } else {
            require_tool("python3")
        }
    })
}

/// `python3 -c SCRIPT ARGS…` with [`CMD_TIMEOUT`].
pub fn py(script: &str, args: &[&str]) -> Output {
    let mut c = Command::new(python());
    c.arg("-c").arg(script).args(args);
    run(&mut c, CMD_TIMEOUT)
}

/// Like [`py`], asserting success; returns stdout.
pub fn py_ok(script: &str, args: &[&str]) -> String {
    py(script, args).ok()
}

/// A path as a `&str` (test paths are always UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().expect("test paths are UTF-8")
}

/// What `df` says about the filesystem holding `path`, in bytes and inodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Df {
    pub size: u64,
    pub used: u64,
    pub avail: u64,
    pub itotal: u64,
    pub iused: u64,
    pub ifree: u64,
}

/// Runs `df -B1 --output=size,used,avail,itotal,iused,iavail PATH` (the real
/// tool, so what users see is what is checked).
pub fn df(path: &Path) -> Df {
    require_tool("df");
    let out = run(
        Command::new("df")
            .args(["-B1", "--output=size,used,avail,itotal,iused,iavail"])
            .arg(path),
        CMD_TIMEOUT,
    )
    .ok();
    let line = out
        .lines()
        .nth(1)
        .unwrap_or_else(|| panic!("df printed no data line:\n{out}"));
    let v: Vec<u64> = line
        .split_whitespace()
        .map(|x| {
            x.parse()
                .unwrap_or_else(|_| panic!("df value {x:?} is not a number:\n{out}"))
        })
        .collect();
    assert_eq!(v.len(), 6, "df line {line:?}");
    Df {
        size: v[0],
        used: v[1],
        avail: v[2],
        itotal: v[3],
        iused: v[4],
        ifree: v[5],
    }
}

/// `du -B1 [--apparent-size] PATH`, the number.
pub fn du(path: &Path, apparent: bool) -> u64 {
    require_tool("du");
    let mut c = Command::new("du");
    c.arg("-B1");
    if apparent {
        c.arg("--apparent-size");
    }
    let out = run(c.arg(path), CMD_TIMEOUT).ok();
    out.split_whitespace()
        .next()
        .and_then(|x| x.parse().ok())
        .unwrap_or_else(|| panic!("du printed {out:?}"))
}

// ---------------------------------------------------------------------------
// A ramd filesystem disk

static SEQ: AtomicUsize = AtomicUsize::new(0);

/// A unique disk name per test process and disk.
fn unique_name() -> String {
    format!(
        "fs{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// A fresh directory `/tmp/ramd-fs.XXXXXX/mnt` (parent 0755, so the other
/// users that pjdfstest and the chown tests switch to can reach the mount).
///
/// Keep the path's length as it is: pjdfstest 0.2.2's `create_path_max`
/// computes `(4095 - len(base)) % 127 - 1`, which underflows (and panics
/// with "capacity overflow" in every `enametoolong_path` case, on tmpfs
/// too) when the base path's length makes that remainder 0. This length,
/// like the kernel tmpfs paths beside it, does not.
fn fresh_mount_dir() -> (TempDir, PathBuf) {
    let parent = tempfile::Builder::new()
        .prefix("ramd-fs.")
        .tempdir()
        .expect("tempdir");
    fs::set_permissions(parent.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let mnt = parent.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let mnt = mnt.canonicalize().unwrap();
    (parent, mnt)
}

/// Why a `ramd serve --mount` did not come up.
#[derive(Debug)]
pub struct MountFailure {
    pub status: String,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

/// `ramd --run-dir TMP serve --mount TMP/mnt --name UNIQUE ARGS…`, mounted
/// and ready. Drop: SIGTERM and wait; past the deadline SIGKILL and
/// `umount -l`; never leaves a mount behind. A daemon that crashed, or did not
/// exit 0, fails the test on drop (unless it is already failing).
pub struct FsDisk {
    child: Option<Child>,
    mount: PathBuf,
    name: String,
    stderr_path: PathBuf,
    stdout_rest: Option<JoinHandle<Vec<String>>>,
    run_dir: TempDir,
    // Removed only after the daemon is gone and the mount with it.
    _logs: TempDir,
    _mount_parent: Option<TempDir>,
}

impl FsDisk {
    /// Mounts a fresh disk with `args` (e.g. `["--size", "64M"]`).
    pub fn mount(args: &[&str]) -> FsDisk {
        FsDisk::mount_with_env(args, &[])
    }

    /// Like [`FsDisk::mount`], with extra environment variables for the
    /// daemon (an object store's endpoint and credentials).
    pub fn mount_with_env(args: &[&str], env: &[(&str, &str)]) -> FsDisk {
        let (parent, mnt) = fresh_mount_dir();
        let mut d = FsDisk::mount_at_env(&mnt, args, env).unwrap_or_else(|f| {
            panic!(
                "ramd serve --mount {mnt:?} {args:?} did not become ready ({}); stderr:\n{}",
                f.status, f.stderr
            )
        });
        d._mount_parent = Some(parent);
        // A transport asked for by name is the one serving (`ramd status`).
        if let Some(w) = args.windows(2).find(|w| w[0] == "--fuse-transport") {
            let want = if w[1] == "io_uring" { "io-uring" } else { w[1] };
            wait_until(START_DEADLINE, &format!("FUSE transport {want}"), || {
                d.transport().as_deref() == Some(want)
            });
        }
        d
    }

    /// How its FUSE requests travel, as `ramd status --json` says: io-uring
    /// or dev.
    pub fn transport(&self) -> Option<String> {
        self.status()["frontends"]
            .as_array()?
            .iter()
            .find(|f| f["protocol"] == "fuse")?["transport"]
            .as_str()
            .map(String::from)
    }

    /// Starts ramd on an existing `dir`; if it exits before printing its
    /// mount point, returns how it failed. A daemon that neither exits nor
    /// prints within the start deadline fails the test.
    pub fn mount_at(dir: &Path, args: &[&str]) -> Result<FsDisk, MountFailure> {
        FsDisk::mount_at_env(dir, args, &[])
    }

    /// [`FsDisk::mount_at`] with extra environment variables.
    pub fn mount_at_env(
        dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<FsDisk, MountFailure> {
        let run_dir = tempfile::Builder::new()
            .prefix("ramd-fsrun.")
            .tempdir()
            .expect("tempdir");
        let logs = tempfile::Builder::new()
            .prefix("ramd-fslog.")
            .tempdir()
            .expect("tempdir");
        let stderr_path = logs.path().join("stderr");
        let name = unique_name();
        let mut child = Command::new(ramd_bin())
            .arg("--run-dir")
            .arg(run_dir.path())
            .env_remove("RAMD_RUN_DIR")
            .env("RUST_BACKTRACE", "1")
            .envs(env.iter().copied())
            .arg("serve")
            .arg("--mount")
            .arg(dir)
            .args(["--name", &name])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr_path).expect("create stderr log"))
            .spawn()
            .expect("spawn ramd");

        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let reader = thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = tx.send(first);
            }
            drop(tx);
            lines.map_while(Result::ok).collect::<Vec<_>>()
        });

        let line = match rx.recv_timeout(START_DEADLINE) {
            Ok(line) => line,
            Err(e) => {
                let (status, code) = match wait_child(&mut child, Duration::from_secs(5)) {
                    Some(s) => (format!("exited: {s}"), s.code()),
                    None => {
                        let _ = child.kill();
                        let _ = child.wait();
                        if is_mounted(dir) {
                            umount_or_detach(dir);
                        }
                        (
                            format!("no mount point line after {START_DEADLINE:?} ({e}); killed"),
                            None,
                        )
                    }
                };
                let rest = reader.join().unwrap_or_default();
                return Err(MountFailure {
                    status,
                    code,
                    stdout: rest.join("\n"),
                    stderr: fs::read_to_string(&stderr_path).unwrap_or_default(),
                });
            }
        };

        let canon = dir.canonicalize().expect("canonical mount dir");
        let disk = FsDisk {
            child: Some(child),
            mount: canon.clone(),
            name,
            stderr_path,
            stdout_rest: Some(reader),
            run_dir,
            _logs: logs,
            _mount_parent: None,
        };
        assert_eq!(
            Path::new(&line),
            canon,
            "ramd printed {line:?} as its mount point, expected {canon:?}"
        );
        let fstype = mount_fstype(&canon)
            .unwrap_or_else(|| panic!("ramd said it mounted {canon:?} but mountinfo lacks it"));
        assert!(
            fstype == "fuse" || fstype.starts_with("fuse."),
            "{canon:?} is mounted as {fstype:?}, not a FUSE filesystem"
        );
        Ok(disk)
    }

    /// The mount point (canonical).
    pub fn path(&self) -> &Path {
        &self.mount
    }

    /// `MOUNT/rel`.
    pub fn join(&self, rel: &str) -> PathBuf {
        self.mount.join(rel)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn run_dir(&self) -> &Path {
        self.run_dir.path()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon already stopped").id()
    }

    /// The daemon's stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// This disk's entry in `ramd status --json` (see [`accounted_status`]).
    pub fn status(&self) -> Value {
        accounted_status(self.run_dir.path(), &self.name)
    }

    /// Panics (with stderr) unless the daemon is still running.
    pub fn assert_alive(&mut self) {
        let child = self.child.as_mut().expect("daemon already stopped");
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!("ramd died ({status}); stderr:\n{}", self.stderr());
        }
    }

    fn reap(&mut self, what: &str) -> ExitStatus {
        let mut child = self.child.take().expect("daemon already stopped");
        let status = match wait_child(&mut child, STOP_DEADLINE) {
            Some(s) => s,
            None => {
                let _ = child.kill();
                let _ = child.wait();
                umount_or_detach(&self.mount);
                panic!(
                    "ramd did not exit within {STOP_DEADLINE:?} of {what}; stderr:\n{}",
                    self.stderr()
                );
            }
        };
        let rest = self
            .stdout_rest
            .take()
            .map(|h| h.join().unwrap_or_default())
            .unwrap_or_default();
        assert!(
            rest.is_empty(),
            "ramd printed more than the mount point on stdout: {rest:?}"
        );
        status
    }

    /// Sends `sig`; returns the exit status. Asserts the mount is gone.
    pub fn stop_with(&mut self, sig: i32) -> ExitStatus {
        let pid = self.pid();
        // SAFETY: kill(2) to our own child, which we have not reaped yet.
        unsafe {
            libc::kill(pid as i32, sig);
        }
        let status = self.reap(&format!("signal {sig}"));
        assert!(
            !is_mounted(&self.mount),
            "{:?} still mounted after ramd exited ({status}); stderr:\n{}",
            self.mount,
            self.stderr()
        );
        status
    }

    /// SIGKILL, as a crash: then unmounts what it left (a FUSE mount
    /// whose daemon died stays until unmounted) and asserts it died of it.
    pub fn kill(&mut self) {
        use std::os::unix::process::ExitStatusExt;
        let pid = self.pid();
        // SAFETY: kill(2) to our own child, not yet reaped.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
        crate::common::wait_until(STOP_DEADLINE, "ramd to die of SIGKILL", || {
            crate::common::process_exited(pid)
        });
        if is_mounted(&self.mount) {
            umount_or_detach(&self.mount);
        }
        let status = self.stop_with(libc::SIGKILL);
        assert_eq!(
            status.signal(),
            Some(libc::SIGKILL),
            "expected death by SIGKILL, got {status}; stderr:\n{}",
            self.stderr()
        );
    }

    /// SIGKILL, as a crash, leaving the dead mount where it is (as a
    /// killed ramd does); returns how it died.
    pub fn kill_leaving_mount(&mut self) -> ExitStatus {
        let pid = self.pid();
        // SAFETY: kill(2) to our own child, not yet reaped.
        unsafe {
            libc::kill(pid as i32, libc::SIGKILL);
        }
        self.reap("SIGKILL")
    }

    /// Waits for the daemon to exit by itself (after `ramd down`, a forced
    /// stop, an unmount seen elsewhere); returns how it ended.
    pub fn wait_exit(&mut self) -> ExitStatus {
        self.reap("waiting for it to exit")
    }

    /// SIGTERM; asserts exit code 0 and that the mount is gone.
    pub fn stop(mut self) {
        let status = self.stop_with(libc::SIGTERM);
        assert!(
            status.success(),
            "ramd exited with {status} after SIGTERM; stderr:\n{}",
            self.stderr()
        );
    }

    /// `umount MOUNT` from outside; returns ramd's exit status (it must exit
    /// by itself within the deadline).
    pub fn umount_externally(&mut self) -> ExitStatus {
        require_tool("umount");
        let out = run(Command::new("umount").arg(&self.mount), CMD_TIMEOUT);
        assert!(
            out.success(),
            "umount {:?} failed: {}{}",
            self.mount,
            out.stdout,
            out.stderr
        );
        self.reap("umount")
    }
}

impl Drop for FsDisk {
    fn drop(&mut self) {
        let panicking = thread::panicking();
        let Some(mut child) = self.child.take() else {
            // Stopped by the test; make sure nothing is left anyway.
            if is_mounted(&self.mount) {
                umount_or_detach(&self.mount);
            }
            return;
        };
        let crashed = child.try_wait().ok().flatten();
        let status = match crashed {
            Some(s) => Some(s),
            None => {
                // SAFETY: kill(2) to our own, not yet reaped, child.
                unsafe {
                    libc::kill(child.id() as i32, libc::SIGTERM);
                }
                let s = wait_child(&mut child, STOP_DEADLINE);
                if s.is_none() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                s
            }
        };
        let left_mounted = is_mounted(&self.mount);
        if left_mounted {
            umount_or_detach(&self.mount);
        }
        if panicking {
            eprintln!(
                "ramd ({}) stderr (test failed):\n{}",
                self.name,
                self.stderr()
            );
            return;
        }
        let err = self.stderr();
        match (crashed, status) {
            (Some(s), _) => panic!("ramd exited on its own during the test ({s}); stderr:\n{err}"),
            (None, None) => {
                panic!("ramd ignored SIGTERM for {STOP_DEADLINE:?} and was killed; stderr:\n{err}")
            }
            (None, Some(s)) if !s.success() => {
                panic!("ramd exited with {s} after SIGTERM; stderr:\n{err}")
            }
            _ if left_mounted => panic!(
                "ramd exited after SIGTERM but left {:?} mounted; stderr:\n{err}",
                self.mount
            ),
            _ => {}
        }
    }
}

// ---------------------------------------------------------------------------
// The reference: a kernel tmpfs

/// A kernel tmpfs mounted on a fresh directory, unmounted on drop.
pub struct KernelTmpfs {
    mount: PathBuf,
    _parent: TempDir,
}

impl KernelTmpfs {
    /// `mount -t tmpfs -o OPTIONS tmpfs DIR`.
    pub fn mount(options: &str) -> KernelTmpfs {
        require_tool("mount");
        let (parent, mnt) = fresh_mount_dir();
        let out = run(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", options, "tmpfs"])
                .arg(&mnt),
            CMD_TIMEOUT,
        );
        assert!(
            out.success(),
            "mount -t tmpfs -o {options} failed: {}",
            out.stderr
        );
        wait_until(Duration::from_secs(5), "tmpfs in mountinfo", || {
            is_mounted(&mnt)
        });
        KernelTmpfs {
            mount: mnt,
            _parent: parent,
        }
    }

    pub fn path(&self) -> &Path {
        &self.mount
    }
}

impl Drop for KernelTmpfs {
    fn drop(&mut self) {
        umount_or_detach(&self.mount);
    }
}

// ---------------------------------------------------------------------------
// Small C clients

/// A C program compiled for one test; removed on drop.
pub struct CProgram {
    pub path: PathBuf,
    _dir: TempDir,
}

/// Compiles `src` with gcc (`-Wall -Werror -O1`); a compile error fails the
/// test with gcc's output.
pub fn c_program(name: &str, src: &str) -> CProgram {
    require_tool("gcc");
    let dir = tempfile::Builder::new()
        .prefix("ramd-cc.")
        .tempdir()
        .expect("tempdir");
    let c = dir.path().join(format!("{name}.c"));
    fs::write(&c, src).unwrap();
    let path = dir.path().join(name);
    let out = run(
        Command::new("gcc")
            .args(["-Wall", "-Werror", "-O1", "-D_GNU_SOURCE", "-o"])
            .arg(&path)
            .arg(&c),
        CMD_TIMEOUT,
    );
    assert!(out.success(), "gcc {name}.c failed:\n{}", out.stderr);
    // Tests run it as other users too.
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    CProgram { path, _dir: dir }
}
