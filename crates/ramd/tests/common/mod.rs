//! Shared harness for ramd's integration tests.
//!
//! Every test drives the real `ramd` binary with real clients (libnbd tools,
//! qemu, fio, the kernel's loop driver and ext4). Rules this file enforces:
//! - a missing tool is a failure ([`require_tool`]), never a skip;
//! - every wait is a poll with a deadline ([`wait_until`], [`run`]);
//! - everything started is torn down on `Drop`, also when the test panics
//!   ([`Ramd`], [`Fuse`], [`Loop`], [`Mount`]).

// Each test binary uses a different part of this module.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

pub mod layout;
pub mod wire;

/// How long `ramd serve` may take to print its URI.
pub const START_DEADLINE: Duration = Duration::from_secs(20);
/// How long a daemon may take to exit after SIGTERM before it gets SIGKILL.
pub const STOP_DEADLINE: Duration = Duration::from_secs(20);
/// How long [`Ramd::stats`] waits for a reading whose accounting adds up.
pub const STATS_DEADLINE: Duration = Duration::from_secs(20);
/// Default limit for one client command (nbdinfo, qemu-io, a python script…).
pub const CMD_TIMEOUT: Duration = Duration::from_secs(180);
/// Limit for heavy commands (fio, copies of a few hundred MiB, mkfs).
pub const LONG_TIMEOUT: Duration = Duration::from_secs(600);

pub const KIB: u64 = 1 << 10;
pub const MIB: u64 = 1 << 20;
pub const GIB: u64 = 1 << 30;
pub const PAGE: u64 = 4096;

pub fn ramd_bin() -> &'static str {
    env!("CARGO_BIN_EXE_ramd")
}

/// `crates/ramd/tests/nbdsh/NAME`.
pub fn nbdsh_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/nbdsh")
        .join(name)
}

// ---------------------------------------------------------------------------
// Waiting and running commands

/// Polls `cond` until it holds; panics naming `what` once `timeout` passes.
pub fn wait_until(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        if cond() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// Waits for `child` to exit, up to `timeout`.
pub fn wait_child(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) => {}
            Err(e) => panic!("waiting for child {}: {e}", child.id()),
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

fn reader_thread(mut r: impl Read + Send + 'static) -> JoinHandle<Vec<u8>> {
    thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        buf
    })
}

/// What a finished command left behind.
#[derive(Debug)]
pub struct Output {
    pub what: String,
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Panics unless the command succeeded; returns its stdout.
    pub fn ok(self) -> String {
        assert!(
            self.status.success(),
            "command failed ({}): {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.status,
            self.what,
            self.stdout,
            self.stderr
        );
        self.stdout
    }

    /// Panics if the command succeeded; returns the output for more checks.
    pub fn failed(self) -> Output {
        assert!(
            !self.status.success(),
            "command unexpectedly succeeded: {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what,
            self.stdout,
            self.stderr
        );
        self
    }
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        let a = a.to_string_lossy();
        if a.is_empty() || a.contains([' ', '\'', '"', '?', '&', '*']) {
            s.push_str(&format!("'{a}'"));
        } else {
            s.push_str(&a);
        }
    }
    s
}

/// Runs `cmd` to completion with no stdin, capturing its output. Past
/// `timeout` the command's whole process group is killed and the test fails.
pub fn run(cmd: &mut Command, timeout: Duration) -> Output {
    let what = describe(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let out = reader_thread(child.stdout.take().unwrap());
    let err = reader_thread(child.stderr.take().unwrap());
    let status = match wait_child(&mut child, timeout) {
        Some(status) => status,
        None => {
            kill_group(&mut child);
            let stdout = String::from_utf8_lossy(&out.join().unwrap()).into_owned();
            let stderr = String::from_utf8_lossy(&err.join().unwrap()).into_owned();
            panic!(
                "command timed out after {timeout:?}: {what}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
            );
        }
    };
    Output {
        what,
        status,
        stdout: String::from_utf8_lossy(&out.join().unwrap()).into_owned(),
        stderr: String::from_utf8_lossy(&err.join().unwrap()).into_owned(),
    }
}

/// Runs all `cmds` at the same time (each with `timeout`); asserts every one
/// succeeded and returns their stdouts in order.
pub fn run_parallel_ok(cmds: Vec<Command>, timeout: Duration) -> Vec<String> {
    let handles: Vec<_> = cmds
        .into_iter()
        .map(|mut c| thread::spawn(move || run(&mut c, timeout)))
        .collect();
    let outs: Vec<Output> = handles
        .into_iter()
        .map(|h| h.join().expect("command thread panicked"))
        .collect();
    outs.into_iter().map(Output::ok).collect()
}

/// A command running `tests/nbdsh/SCRIPT ARGS…` with the libnbd python.
pub fn nbd_script_cmd(script: &str, args: &[&str]) -> Command {
    let mut c = Command::new(python_nbd());
    c.arg(nbdsh_script(script)).args(args);
    c
}

/// Runs `cmd` with [`CMD_TIMEOUT`], asserts success, returns stdout.
pub fn run_ok(cmd: &mut Command) -> String {
    run(cmd, CMD_TIMEOUT).ok()
}

/// `Command::new(program).args(args)`.
pub fn cmd<S: AsRef<OsStr>>(program: &str, args: impl IntoIterator<Item = S>) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    c
}

/// SIGKILL to the child's process group (children were started with
/// `process_group(0)`), then reap it.
fn kill_group(child: &mut Child) {
    // SAFETY: kill(2) with a negative pid signals a process group; the group
    // id is our own child's pid, which we have not reaped yet, so it cannot
    // have been reused.
    unsafe {
        libc::kill(-(child.id() as i32), libc::SIGKILL);
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: plain kill(2) to our own, not yet reaped, child.
    unsafe {
        libc::kill(child.id() as i32, sig);
    }
}

/// A helper process running beside the test, with a pipe on its stdin;
/// killed (with its process group) on drop.
pub struct Background {
    child: Option<Child>,
    what: String,
    out: Option<JoinHandle<Vec<u8>>>,
    err: Option<JoinHandle<Vec<u8>>>,
}

impl Background {
    pub fn spawn(cmd: &mut Command) -> Background {
        let what = describe(cmd);
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        let out = Some(reader_thread(child.stdout.take().unwrap()));
        let err = Some(reader_thread(child.stderr.take().unwrap()));
        Background {
            child: Some(child),
            what,
            out,
            err,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Panics (with its output) if the process has exited.
    pub fn assert_running(&mut self) {
        let child = self.child.as_mut().unwrap();
        if let Some(s) = child.try_wait().unwrap() {
            let err = self
                .err
                .take()
                .map(|h| h.join().unwrap())
                .unwrap_or_default();
            panic!(
                "{} exited early ({s}): {}",
                self.what,
                String::from_utf8_lossy(&err)
            );
        }
    }

    /// Closes its stdin, waits (with [`CMD_TIMEOUT`]) and asserts success.
    pub fn finish_ok(mut self) -> String {
        let mut child = self.child.take().unwrap();
        drop(child.stdin.take());
        let status = match wait_child(&mut child, CMD_TIMEOUT) {
            Some(s) => s,
            None => {
                kill_group(&mut child);
                panic!("{} did not exit after its stdin closed", self.what);
            }
        };
        let out = String::from_utf8_lossy(&self.out.take().unwrap().join().unwrap()).into_owned();
        let err = String::from_utf8_lossy(&self.err.take().unwrap().join().unwrap()).into_owned();
        assert!(
            status.success(),
            "{} failed ({status}): {out}\n{err}",
            self.what
        );
        out
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_group(&mut child);
        }
    }
}

// ---------------------------------------------------------------------------
// Tools

/// Full path of `name` from PATH. Panics if it is missing: tests never skip.
pub fn require_tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let p = dir.join(name);
        if let Ok(meta) = fs::metadata(&p) {
            use std::os::unix::fs::PermissionsExt;
            if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                return p;
            }
        }
    }
    panic!(
        "required tool `{name}` is not installed (not found in PATH); \
         run scripts/install-test-tools"
    );
}

/// A python3 that can `import nbd` (python3-libnbd).
///
/// The scripts in tests/nbdsh are what `nbdsh -c` would run, but `nbdsh`
/// execs whichever `python3` comes first in PATH; on machines where that is
/// a pyenv or venv interpreter the distribution's libnbd module is missing.
/// So we look for an interpreter that has it, the system one first.
pub fn python_nbd() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        let mut tried = Vec::new();
        for cand in ["/usr/bin/python3", "python3"] {
            let ok = Command::new(cand)
                .args(["-c", "import nbd"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return PathBuf::from(cand);
            }
            tried.push(cand);
        }
        panic!(
            "no python3 among {tried:?} can `import nbd`; install python3-libnbd \
             (scripts/install-test-tools)"
        );
    })
}

/// Runs `tests/nbdsh/SCRIPT ARGS…` with the libnbd python; asserts success and
/// returns stdout.
pub fn nbd_script(script: &str, args: &[&str]) -> String {
    run(&mut nbd_script_cmd(script, args), LONG_TIMEOUT).ok()
}

/// The byte count of io.py's `written N` line (`fill-until-enospc`).
pub fn written(out: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix("written "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no 'written N' in {out:?}"))
}

/// Runs `qemu-io -f raw` with one `-c` per command; asserts success and that
/// no command reported a failure (pattern mismatch, I/O error).
pub fn qemu_io(uri: &str, cmds: &[String]) -> String {
    require_tool("qemu-io");
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for x in cmds {
        c.args(["-c", x]);
    }
    c.arg(uri);
    let out = run(&mut c, LONG_TIMEOUT);
    let what = out.what.clone();
    let stderr = out.stderr.clone();
    let stdout = out.ok();
    for text in [&stdout, &stderr] {
        assert!(
            !text.contains("failed") && !text.contains("error"),
            "qemu-io reported a failure: {what}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        );
    }
    stdout
}

// ---------------------------------------------------------------------------
// The daemon

/// A running `ramd serve`, stopped with SIGTERM (then SIGKILL) on drop.
///
/// Dropping a daemon that crashed, or that did not exit 0 after SIGTERM,
/// fails the test (unless the test is already failing).
pub struct Ramd {
    child: Option<Child>,
    run_dir: PathBuf,
    name: String,
    uri: String,
    /// Every endpoint of its ready line (`uri` is the first).
    endpoints: Vec<String>,
    stderr_path: PathBuf,
    extra_stdout: Arc<Mutex<Vec<String>>>,
    stdout_reader: Option<JoinHandle<()>>,
    // Declared last: removed after the daemon is gone.
    _logs: TempDir,
    _own_run_dir: Option<TempDir>,
}

impl Ramd {
    /// `ramd --run-dir FRESH_TEMPDIR serve ARGS…`, waiting for its URI line.
    pub fn start(args: &[&str]) -> Ramd {
        let dir = tempfile::Builder::new()
            .prefix("ramd-run.")
            .tempdir()
            .expect("tempdir");
        let mut r = Ramd::start_in(dir.path(), args);
        r._own_run_dir = Some(dir);
        r
    }

    /// Like [`Ramd::start`], in a run dir shared with other daemons.
    pub fn start_in(run_dir: &Path, args: &[&str]) -> Ramd {
        match Ramd::try_start_in(run_dir, args) {
            Ok(r) => r,
            Err((status, stderr)) => {
                panic!("ramd serve {args:?} did not become ready ({status}); stderr:\n{stderr}")
            }
        }
    }

    /// Starts a daemon; if it exits before printing its URI, returns its exit
    /// description and stderr instead. A daemon that neither exits nor prints
    /// within [`START_DEADLINE`] fails the test.
    pub fn try_start_in(run_dir: &Path, args: &[&str]) -> Result<Ramd, (String, String)> {
        Ramd::spawn(run_dir, args, false, &[], None)
    }

    /// Like [`Ramd::start_in`], naming the run dir with `RAMD_RUN_DIR`
    /// instead of `--run-dir`.
    pub fn start_with_env_run_dir(run_dir: &Path, args: &[&str]) -> Ramd {
        Ramd::spawn(run_dir, args, true, &[], None).unwrap_or_else(|(status, stderr)| {
            panic!("ramd serve {args:?} did not become ready ({status}); stderr:\n{stderr}")
        })
    }

    fn spawn(
        run_dir: &Path,
        args: &[&str],
        via_env: bool,
        env: &[(&str, &str)],
        umask: Option<u32>,
    ) -> Result<Ramd, (String, String)> {
        let logs = tempfile::Builder::new()
            .prefix("ramd-log.")
            .tempdir()
            .expect("tempdir");
        let stderr_path = logs.path().join("stderr");
        let stderr_file = File::create(&stderr_path).expect("create stderr log");
        let name = args
            .iter()
            .position(|a| *a == "--name")
            .map(|i| args[i + 1].to_string())
            .unwrap_or_else(|| "ram0".to_string());
        let mut c = Command::new(ramd_bin());
        if via_env {
            c.env("RAMD_RUN_DIR", run_dir);
        } else {
            c.arg("--run-dir").arg(run_dir).env_remove("RAMD_RUN_DIR");
        }
        for (k, v) in env {
            c.env(k, v);
        }
        if let Some(mask) = umask {
            // SAFETY: umask(2) is async-signal-safe and touches nothing but
            // the new process's own file-creation mask.
            unsafe {
                c.pre_exec(move || {
                    libc::umask(mask as libc::mode_t);
                    Ok(())
                });
            }
        }
        let mut child = c
            .arg("serve")
            .args(args)
            .env("RUST_BACKTRACE", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr_file)
            .spawn()
            .expect("spawn ramd");

        let (tx, rx) = mpsc::channel();
        let extra_stdout = Arc::new(Mutex::new(Vec::new()));
        let extra = extra_stdout.clone();
        let stdout = child.stdout.take().unwrap();
        let stdout_reader = thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(first)) = lines.next() {
                let _ = tx.send(first);
            }
            drop(tx);
            for line in lines.map_while(Result::ok) {
                extra.lock().unwrap().push(line);
            }
        });

        let uri = match rx.recv_timeout(START_DEADLINE) {
            Ok(line) => line,
            Err(e) => {
                // Closed stdout: the daemon exited (or closed stdout and is
                // about to); timeout: it hangs. Either way, report.
                let status = match wait_child(&mut child, Duration::from_secs(5)) {
                    Some(s) => format!("exited: {s}"),
                    None => {
                        kill_group(&mut child);
                        format!("no URI line after {START_DEADLINE:?} ({e}); killed")
                    }
                };
                let _ = stdout_reader.join();
                let stderr = fs::read_to_string(&stderr_path).unwrap_or_default();
                return Err((status, stderr));
            }
        };

        // Every endpoint on one line, the first first.
        let endpoints: Vec<String> = uri.split(' ').map(String::from).collect();
        Ok(Ramd {
            child: Some(child),
            run_dir: run_dir.to_path_buf(),
            name,
            uri: endpoints[0].clone(),
            endpoints,
            stderr_path,
            extra_stdout,
            stdout_reader: Some(stdout_reader),
            _logs: logs,
            _own_run_dir: None,
        })
    }

    pub fn uri(&self) -> &str {
        &self.uri
    }

    /// Every endpoint `serve` printed on its ready line.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("daemon already stopped").id()
    }

    /// The Unix socket named by the URI's `socket=` parameter.
    pub fn socket_path(&self) -> PathBuf {
        let q = self
            .uri
            .split_once("socket=")
            .unwrap_or_else(|| panic!("URI {} has no socket= parameter", self.uri))
            .1;
        PathBuf::from(q.split('&').next().unwrap())
    }

    /// `RUN_DIR/NAME.ctl`.
    pub fn ctl_path(&self) -> PathBuf {
        self.run_dir.join(format!("{}.ctl", self.name))
    }

    /// The daemon's stderr so far.
    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Panics (with the daemon's stderr) unless the daemon is still running.
    pub fn assert_alive(&mut self) {
        let child = self.child.as_mut().expect("daemon already stopped");
        if let Some(status) = child.try_wait().expect("try_wait") {
            panic!(
                "ramd died ({status}); stderr:\n{}",
                fs::read_to_string(&self.stderr_path).unwrap_or_default()
            );
        }
    }

    /// This disk's entry in `ramd status --json`.
    /// This disk's `status --json` entry (see [`accounted_status`]).
    pub fn stats(&self) -> Value {
        accounted_status(&self.run_dir, &self.name)
    }

    /// VmRSS of the daemon, in bytes.
    pub fn rss(&self) -> u64 {
        vm_rss(self.pid())
    }

    /// Sends `sig` and waits for the exit; SIGKILL past [`STOP_DEADLINE`]
    /// fails the test. Also checks that stdout carried nothing but the URI.
    pub fn stop_with(&mut self, sig: i32) -> ExitStatus {
        self.end(Some(sig), STOP_DEADLINE)
    }

    /// Sends `sig` (if any) and waits up to `timeout` for the daemon to
    /// exit; past the deadline it is killed and the test fails. Then checks
    /// that stdout carried nothing but the URI.
    fn end(&mut self, sig: Option<i32>, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("daemon already stopped");
        if let Some(sig) = sig {
            signal(&child, sig);
        }
        let status = match wait_child(&mut child, timeout) {
            Some(s) => s,
            None => {
                kill_group(&mut child);
                let how = sig.map_or("by itself".to_string(), |s| format!("after signal {s}"));
                panic!(
                    "ramd did not exit {how} within {timeout:?}; stderr:\n{}",
                    self.stderr()
                );
            }
        };
        if let Some(h) = self.stdout_reader.take() {
            h.join().expect("stdout reader");
        }
        let extra = self.extra_stdout.lock().unwrap().clone();
        assert!(
            extra.is_empty(),
            "ramd printed more than the URI line on stdout: {extra:?}"
        );
        status
    }

    /// SIGTERM, then asserts exit code 0.
    pub fn stop(&mut self) {
        let status = self.stop_with(libc::SIGTERM);
        assert!(
            status.success(),
            "ramd exited with {status} after SIGTERM; stderr:\n{}",
            self.stderr()
        );
    }
}

impl Drop for Ramd {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let crashed = child.try_wait().ok().flatten();
        let status = match crashed {
            Some(s) => Some(s),
            None => {
                signal(&child, libc::SIGTERM);
                let s = wait_child(&mut child, STOP_DEADLINE);
                if s.is_none() {
                    kill_group(&mut child);
                }
                s
            }
        };
        if thread::panicking() {
            eprintln!("ramd stderr (test failed):\n{}", self.stderr());
            return;
        }
        match (crashed, status) {
            (Some(s), _) => panic!(
                "ramd exited on its own during the test ({s}); stderr:\n{}",
                self.stderr()
            ),
            (None, None) => panic!(
                "ramd ignored SIGTERM for {STOP_DEADLINE:?} and was killed; stderr:\n{}",
                self.stderr()
            ),
            (None, Some(s)) if !s.success() => panic!(
                "ramd exited with {s} after SIGTERM; stderr:\n{}",
                self.stderr()
            ),
            _ => {}
        }
    }
}

/// Runs `ramd --run-dir DIR ARGS…` and returns its output.
pub fn ramd_cmd(run_dir: &Path, args: &[&str]) -> Output {
    let mut c = Command::new(ramd_bin());
    c.arg("--run-dir").arg(run_dir).args(args);
    run(&mut c, CMD_TIMEOUT)
}

/// `ramd --run-dir DIR status --json`, parsed.
pub fn status_json(run_dir: &Path) -> Value {
    let out = ramd_cmd(run_dir, &["status", "--json"]).ok();
    serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("`ramd status --json` printed invalid JSON ({e}):\n{out}"))
}

/// Disk `name`'s `status --json` entry, read until its accounting
/// identities hold. Status reads each counter on its own, so a reading taken
/// while the scanner moves a page can straddle the move; a leak never
/// settles, and fails here at the deadline.
pub fn accounted_status(run_dir: &Path, name: &str) -> Value {
    let deadline = Instant::now() + STATS_DEADLINE;
    loop {
        let status = status_json(run_dir);
        let disk = disk_entry(&status, name)
            .unwrap_or_else(|| panic!("disk {name} missing from status: {status}"))
            .clone();
        match accounting_error(&disk) {
            None => return disk,
            Some(e) if Instant::now() >= deadline => {
                panic!("accounting did not add up within {STATS_DEADLINE:?}: {e} in {disk}")
            }
            Some(_) => std::thread::sleep(Duration::from_millis(2)),
        }
    }
}

/// The entry for disk `name` in a `status --json` document.
pub fn disk_entry<'a>(status: &'a Value, name: &str) -> Option<&'a Value> {
    status["disks"]
        .as_array()
        .unwrap_or_else(|| panic!("status has no \"disks\" array: {status}"))
        .iter()
        .find(|d| d["name"] == name)
}

/// A numeric field of a status entry; panics if missing or not a u64.
pub fn field(disk: &Value, key: &str) -> u64 {
    disk[key]
        .as_u64()
        .unwrap_or_else(|| panic!("status field {key:?} missing or not a number in {disk}"))
}

/// Asserts the accounting identities `ramd status` promises:
/// `memory_used = stored_bytes + slack_bytes + metadata_bytes`, data pages
/// split into hot, incompressible, compressed and framed pages, within
/// max_memory; and without compression, `stored_bytes = data_pages * 4096`.
pub fn assert_accounting(disk: &Value) {
    assert_accounting_identities(disk);
    if disk["compress"] == "none" && disk["recompress"] == "none" {
        let data = field(disk, "data_pages");
        assert_eq!(
            field(disk, "stored_bytes"),
            data * PAGE,
            "uncompressed disk in {disk}"
        );
        assert_eq!(field(disk, "slack_bytes"), 0, "uncompressed disk in {disk}");
    }
}

/// [`assert_accounting`] without its rule for uncompressed disks (which a
/// disk loaded from an image holding compressed pages does not keep).
pub fn assert_accounting_identities(disk: &Value) {
    if let Some(e) = accounting_error(disk) {
        panic!("{e} in {disk}");
    }
}

/// Which accounting identity of a status entry fails, if any.
fn accounting_error(disk: &Value) -> Option<String> {
    let used = field(disk, "memory_used");
    let parts = [
        "stored_bytes",
        "slack_bytes",
        "metadata_bytes",
        "kept_bytes",
    ];
    let sum: u64 = parts.iter().map(|k| field(disk, k)).sum();
    if used != sum {
        return Some(format!(
            "memory_used {used} != stored + slack + metadata + kept bytes {sum}"
        ));
    }
    let data = field(disk, "data_pages");
    let kinds = [
        "hot_pages",
        "incompressible_pages",
        "compressed_pages",
        "frame_pages",
    ];
    let pages: u64 = kinds.iter().map(|k| field(disk, k)).sum();
    if data != pages {
        return Some(format!(
            "data_pages {data} != hot + incompressible + compressed + frame pages {pages}"
        ));
    }
    if field(disk, "data_bytes") != data * PAGE {
        return Some(format!("data_bytes != data_pages {data} * {PAGE}"));
    }
    let limit = field(disk, "max_memory") + field(disk, "kept_bytes");
    (used > limit).then(|| format!("memory_used {used} above max_memory + kept bytes {limit}"))
}

/// VmRSS of a process, in bytes.
pub fn vm_rss(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/status: {e}"));
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"));
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("bad VmRSS line {line:?}"));
    kb * 1024
}

/// Runs fio with the nbd engine against `uri`; returns the parsed JSON of
/// its (only) job after checking that it reports no error.
pub fn fio(uri: &str, out_dir: &Path, name: &str, opts: &[&str]) -> Value {
    require_tool("fio");
    let out_file = out_dir.join(format!("{name}.json"));
    let mut c = cmd(
        "fio",
        [
            format!("--name={name}"),
            "--ioengine=nbd".into(),
            format!("--uri={uri}"),
            "--output-format=json".into(),
            format!("--output={}", out_file.display()),
            "--verify_fatal=1".into(),
        ],
    );
    // fio drops *-verify.state files in its working directory.
    c.args(opts).current_dir(out_dir);
    let out = run(&mut c, LONG_TIMEOUT);
    let json = std::fs::read_to_string(&out_file).unwrap_or_default();
    assert!(out.success(), "fio {name} failed: {out:?}\n{json}");
    let v: Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("fio JSON ({e}):\n{json}"));
    let job = v["jobs"][0].clone();
    assert_eq!(job["error"], 0, "fio {name} reported an error: {job}");
    job
}

pub fn io_bytes(job: &Value, dir: &str) -> u64 {
    job[dir]["io_bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no {dir}.io_bytes in {job}"))
}

/// A TCP port that was free a moment ago (bound to port 0, then released).
pub fn free_tcp_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().unwrap().port()
}

// ---------------------------------------------------------------------------
// Data

/// A tempdir for test data (not the run dir).
pub fn scratch() -> TempDir {
    tempfile::Builder::new()
        .prefix("ramd-test.")
        .tempdir()
        .expect("tempdir")
}

/// Writes `len` bytes from /dev/urandom to `path`.
pub fn random_file(path: &Path, len: u64) {
    let mut src = File::open("/dev/urandom").expect("open /dev/urandom");
    let mut dst = File::create(path).unwrap_or_else(|e| panic!("create {path:?}: {e}"));
    let copied = std::io::copy(&mut (&mut src).take(len), &mut dst).expect("copy urandom");
    assert_eq!(copied, len);
    dst.sync_all().unwrap();
}

/// A small deterministic generator (xorshift64*) for reproducible test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// `sha256sum PATH`, the hex digest.
pub fn sha256(path: &Path) -> String {
    require_tool("sha256sum");
    let out = run_ok(Command::new("sha256sum").arg(path));
    out.split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("sha256sum printed nothing for {path:?}"))
        .to_string()
}

/// Asserts two files are byte-identical, naming the first differing offset.
pub fn assert_same_file(a: &Path, b: &Path) {
    let (x, y) = (fs::read(a).unwrap(), fs::read(b).unwrap());
    assert_eq!(x.len(), y.len(), "{a:?} and {b:?} differ in length");
    if let Some(i) = x.iter().zip(&y).position(|(p, q)| p != q) {
        panic!("{a:?} and {b:?} differ first at byte {i}");
    }
}

/// Writes `data` to `path`.
pub fn write_file(path: &Path, data: &[u8]) {
    let mut f = File::create(path).unwrap_or_else(|e| panic!("create {path:?}: {e}"));
    f.write_all(data).unwrap();
}

// ---------------------------------------------------------------------------
// Mount, loop and FUSE guards (torn down in reverse order of creation when
// declared in order in a test: Rust drops locals last-declared-first).

/// `nbdfuse MOUNTPOINT URI` in the foreground; the disk is `MOUNTPOINT/nbd`.
/// Drop: `fusermount3 -u`, then reap nbdfuse (SIGKILL past a deadline).
pub struct Fuse {
    child: Option<Child>,
    mountpoint: PathBuf,
    log: PathBuf,
}

impl Fuse {
    pub fn start(mountpoint: &Path, uri: &str) -> Fuse {
        require_tool("nbdfuse");
        require_tool("fusermount3");
        fs::create_dir_all(mountpoint).unwrap();
        let log = mountpoint.with_extension("nbdfuse.log");
        let child = Command::new("nbdfuse")
            .arg(mountpoint)
            .arg(uri)
            .stdin(Stdio::null())
            .stdout(File::create(&log).unwrap())
            .stderr(File::create(&log).unwrap())
            .process_group(0)
            .spawn()
            .expect("spawn nbdfuse");
        let mut fuse = Fuse {
            child: Some(child),
            mountpoint: mountpoint.to_path_buf(),
            log,
        };
        let file = fuse.file();
        wait_until(
            Duration::from_secs(20),
            "nbdfuse to expose its file",
            || {
                if let Some(s) = fuse.child.as_mut().unwrap().try_wait().unwrap() {
                    panic!(
                        "nbdfuse exited early ({s}): {}",
                        fs::read_to_string(&fuse.log).unwrap_or_default()
                    );
                }
                file.exists()
            },
        );
        fuse
    }

    pub fn file(&self) -> PathBuf {
        self.mountpoint.join("nbd")
    }

    /// Unmounts now and checks nbdfuse exits cleanly.
    pub fn unmount(mut self) {
        let mut child = self.child.take().unwrap();
        fusermount_u(&self.mountpoint);
        match wait_child(&mut child, Duration::from_secs(30)) {
            Some(s) => assert!(
                s.success(),
                "nbdfuse exited with {s}: {}",
                fs::read_to_string(&self.log).unwrap_or_default()
            ),
            None => {
                kill_group(&mut child);
                panic!("nbdfuse did not exit after fusermount3 -u");
            }
        }
    }
}

fn fusermount_u(mountpoint: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = run(
            Command::new("fusermount3").arg("-u").arg(mountpoint),
            CMD_TIMEOUT,
        );
        if out.success() || Instant::now() >= deadline {
            if !out.success() {
                eprintln!("fusermount3 -u {mountpoint:?} failed: {}", out.stderr);
                let _ = run(
                    Command::new("fusermount3").arg("-uz").arg(mountpoint),
                    CMD_TIMEOUT,
                );
            }
            return;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for Fuse {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            fusermount_u(&self.mountpoint);
            if wait_child(&mut child, Duration::from_secs(20)).is_none() {
                kill_group(&mut child);
            }
        }
    }
}

/// A loop device over a file (`losetup -f --show`), detached on drop.
pub struct Loop {
    dev: Option<String>,
}

impl Loop {
    pub fn attach(file: &Path) -> Loop {
        require_tool("losetup");
        let out = run_ok(Command::new("losetup").args(["-f", "--show"]).arg(file));
        let dev = out.trim().to_string();
        assert!(dev.starts_with("/dev/loop"), "losetup printed {out:?}");
        Loop { dev: Some(dev) }
    }

    pub fn dev(&self) -> &str {
        self.dev.as_deref().unwrap()
    }

    /// Detaches now, asserting success.
    pub fn detach(mut self) {
        let dev = self.dev.take().unwrap();
        assert!(losetup_d(&dev), "losetup -d {dev} failed");
    }
}

/// Detaches, retrying while the device is briefly busy; true on success.
fn losetup_d(dev: &str) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = run(Command::new("losetup").args(["-d", dev]), CMD_TIMEOUT);
        if out.success() {
            return true;
        }
        if Instant::now() >= deadline {
            eprintln!("losetup -d {dev} failed: {}", out.stderr);
            return false;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        if let Some(dev) = self.dev.take() {
            losetup_d(&dev);
        }
    }
}

/// A mounted filesystem, unmounted on drop.
pub struct Mount {
    target: Option<PathBuf>,
    /// The environment `umount` runs with (what the mount ran with).
    env: Vec<(std::ffi::OsString, std::ffi::OsString)>,
}

impl Mount {
    pub fn on(dev: &str, target: &Path) -> Mount {
        require_tool("mount");
        fs::create_dir_all(target).unwrap();
        run_ok(Command::new("mount").arg(dev).arg(target));
        Mount {
            target: Some(target.to_path_buf()),
            env: Vec::new(),
        }
    }

    /// Runs `cmd` (a `mount ...` command line), which must succeed; `target`
    /// is unmounted on drop by `umount` with `cmd`'s environment.
    pub fn by(cmd: &mut Command, target: &Path) -> Mount {
        require_tool("mount");
        run_ok(cmd);
        Mount::adopt(cmd, target)
    }

    /// Takes charge of `target`, which `cmd` has mounted: unmounted on drop
    /// by `umount` with `cmd`'s environment.
    pub fn adopt(cmd: &Command, target: &Path) -> Mount {
        let env = cmd
            .get_envs()
            .filter_map(|(k, v)| Some((k.to_os_string(), v?.to_os_string())))
            .collect();
        Mount {
            target: Some(target.to_path_buf()),
            env,
        }
    }

    /// A kernel tmpfs of `size` (e.g. "64M") at `target`, with extra
    /// mount options such as "ro" in `opts`.
    pub fn tmpfs(target: &Path, size: &str, opts: &[&str]) -> Mount {
        require_tool("mount");
        fs::create_dir_all(target).unwrap();
        let mut o = format!("size={size}");
        for x in opts {
            o.push(',');
            o.push_str(x);
        }
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &o, "tmpfs"])
                .arg(target),
        );
        Mount {
            target: Some(target.to_path_buf()),
            env: Vec::new(),
        }
    }

    pub fn path(&self) -> &Path {
        self.target.as_deref().unwrap()
    }

    /// Unmounts now, asserting success.
    pub fn unmount(mut self) {
        let t = self.target.take().unwrap();
        assert!(umount(&t, &self.env), "umount {t:?} failed");
    }
}

fn umount(target: &Path, env: &[(std::ffi::OsString, std::ffi::OsString)]) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut c = Command::new("umount");
        c.arg(target).envs(env.iter().map(|(k, v)| (k, v)));
        let out = run(&mut c, CMD_TIMEOUT);
        if out.success() {
            return true;
        }
        if Instant::now() >= deadline {
            eprintln!("umount {target:?} failed: {}; detaching lazily", out.stderr);
            let _ = run(Command::new("umount").arg("-l").arg(target), CMD_TIMEOUT);
            return false;
        }
        thread::sleep(Duration::from_millis(100));
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(t) = self.target.take() {
            umount(&t, &self.env);
        }
    }
}

// ---------------------------------------------------------------------------
// Daemons with a chosen environment, and daemons that end by themselves
// (persistence tests: the crash hook, SIGKILL, failed saves at stop).

impl Ramd {
    /// Like [`Ramd::try_start_in`], with extra environment variables for the
    /// daemon (e.g. `RAMD_TEST_CRASH`) and, if given, the umask it starts
    /// with.
    pub fn try_start_in_with(
        run_dir: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        umask: Option<u32>,
    ) -> Result<Ramd, (String, String)> {
        Ramd::spawn(run_dir, args, false, env, umask)
    }

    /// Waits up to `timeout` for the daemon to exit by itself (no signal
    /// sent) and returns how it ended; past the deadline it is killed and
    /// the test fails. Also checks that stdout carried nothing but the URI.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        self.end(None, timeout)
    }
}

/// True once process `pid` has exited (a zombie not yet reaped counts) or
/// is gone altogether.
pub fn process_exited(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

// ---------------------------------------------------------------------------
// `ramd up`

/// A running `ramd --run-dir DIR up -c FILE`; stopped with SIGTERM on drop
/// (a non-zero exit then fails the test).
pub struct Up {
    child: Option<Child>,
    /// `NAME WHERE…` lines it printed once every disk served.
    pub ready: Vec<String>,
    stderr_path: PathBuf,
    _logs: tempfile::TempDir,
}

/// The `[disk.…]` tables of a config: the lines `ramd up` prints.
pub fn disk_count(config: &str) -> usize {
    config
        .lines()
        .filter(|l| l.trim_start().starts_with("[disk."))
        .count()
}

impl Up {
    pub fn start(run_dir: &Path, config: &Path) -> Up {
        Up::start_with(run_dir, config, &[])
    }

    /// Like [`Up::start`], with more arguments after `up -c FILE`.
    pub fn start_with(run_dir: &Path, config: &Path, extra: &[&str]) -> Up {
        Up::try_start(run_dir, config, extra).unwrap_or_else(|(status, stderr)| {
            panic!("ramd up did not become ready ({status}); stderr:\n{stderr}")
        })
    }

    pub fn try_start(
        run_dir: &Path,
        config: &Path,
        extra: &[&str],
    ) -> Result<Up, (String, String)> {
        let logs = tempfile::Builder::new()
            .prefix("ramd-log.")
            .tempdir()
            .unwrap();
        let stderr_path = logs.path().join("stderr");
        let mut child = Command::new(ramd_bin())
            .arg("--run-dir")
            .arg(run_dir)
            .arg("up")
            .arg("-c")
            .arg(config)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(fs::File::create(&stderr_path).unwrap())
            .spawn()
            .expect("spawn ramd up");
        let n = disk_count(&fs::read_to_string(config).unwrap());
        let (tx, rx) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut ready = Vec::new();
        while ready.len() < n {
            match rx.recv_timeout(START_DEADLINE) {
                Ok(l) => ready.push(l),
                Err(e) => {
                    let status = match wait_child(&mut child, STOP_DEADLINE) {
                        Some(s) => format!("exited: {s}"),
                        None => {
                            let _ = child.kill();
                            let _ = child.wait();
                            format!("not ready after {START_DEADLINE:?} ({e}); killed")
                        }
                    };
                    return Err((status, fs::read_to_string(&stderr_path).unwrap_or_default()));
                }
            }
        }
        Ok(Up {
            child: Some(child),
            ready,
            stderr_path,
            _logs: logs,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Where disk `name` is reached first, from the ready lines.
    pub fn uri(&self, name: &str) -> String {
        self.ready
            .iter()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no disk {name} in {:?}", self.ready))
            .split(' ')
            .next()
            .unwrap()
            .to_string()
    }

    pub fn stderr(&self) -> String {
        fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// Waits for the daemon to exit by itself (after `ramd down`).
    pub fn wait_exit(&mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        wait_child(&mut child, STOP_DEADLINE).unwrap_or_else(|| {
            let _ = child.kill();
            panic!("ramd up did not exit; stderr:\n{}", self.stderr())
        })
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let status = wait_child(&mut child, STOP_DEADLINE);
        if status.is_none() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if thread::panicking() {
            eprintln!("ramd up stderr (test failed):\n{}", self.stderr());
            return;
        }
        match status {
            Some(s) if s.success() => {}
            s => panic!(
                "ramd up ended with {s:?} after SIGTERM; stderr:\n{}",
                self.stderr()
            ),
        }
    }
}
