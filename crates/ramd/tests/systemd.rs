//! ramd under systemd: the unit `ramd install-systemd` writes passes
//! `systemd-analyze verify`, and the daemon speaks sd_notify (READY=1 only
//! once its disks serve, RELOADING=1 … READY=1 around a reload, STOPPING=1
//! on SIGTERM) to the socket named by NOTIFY_SOCKET.

mod common;

use common::*;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

#[test]
fn install_systemd_writes_a_unit_systemd_analyze_verify_accepts() {
    let analyze = require_tool("systemd-analyze");
    let tmp = scratch();
    let units = tmp.path().join("units");
    let config = tmp.path().join("ramd.toml");
    fs::write(&config, "[disk.scratch]\nsize = \"64M\"\n").unwrap();
    let mut c = Command::new(ramd_bin());
    c.args(["install-systemd", "--bin", ramd_bin(), "--config"])
        .arg(&config)
        .arg("--unit-dir")
        .arg(&units);
    let out = run_ok(&mut c);
    assert!(
        out.contains("systemctl daemon-reload && systemctl enable --now ramd"),
        "{out}"
    );
    let unit_path = units.join("ramd.service");
    let unit = fs::read_to_string(&unit_path).unwrap();
    for line in [
        "Type=notify".to_string(),
        format!("ExecStart={} up -c {}", ramd_bin(), config.display()),
        format!("ExecReload={} reload", ramd_bin()),
        format!("ExecStop={} down --pid $MAINPID", ramd_bin()),
        "LimitMEMLOCK=infinity".to_string(),
        "RuntimeDirectory=ramd".to_string(),
        "KillMode=mixed".to_string(),
    ] {
        assert!(unit.lines().any(|l| l == line), "no {line:?} in:\n{unit}");
    }
    assert!(!unit.contains('@'), "a placeholder is left:\n{unit}");
    // verify exits 0 on settings it ignores: any word on stderr is a failure.
    let v = run(
        Command::new(analyze)
            .args(["verify", "--man=no"])
            .arg(&unit_path),
        CMD_TIMEOUT,
    );
    assert!(
        v.success() && v.stderr.trim().is_empty() && v.stdout.trim().is_empty(),
        "systemd-analyze verify {}: {}\n{}{}\n--- unit ---\n{unit}",
        unit_path.display(),
        v.status,
        v.stdout,
        v.stderr
    );

    // Installing again replaces the unit (new paths), leaving nothing aside.
    let other = tmp.path().join("other.toml");
    let mut c = Command::new(ramd_bin());
    c.args(["install-systemd", "--bin", ramd_bin(), "--config"])
        .arg(&other)
        .arg("--unit-dir")
        .arg(&units);
    let out = run_ok(&mut c);
    assert!(out.contains("does not exist yet"), "{out}");
    let unit = fs::read_to_string(&unit_path).unwrap();
    assert!(
        unit.contains(&format!("up -c {}", other.display())),
        "{unit}"
    );
    assert_eq!(fs::read_dir(&units).unwrap().count(), 1);
}

#[test]
fn install_systemd_refuses_a_path_the_unit_cannot_hold() {
    let tmp = scratch();
    let mut c = Command::new(ramd_bin());
    c.args(["install-systemd", "--bin", ramd_bin(), "--config"])
        .arg(tmp.path().join("my disks.toml"))
        .arg("--unit-dir")
        .arg(tmp.path());
    let out = run(&mut c, CMD_TIMEOUT).failed();
    assert!(out.stderr.contains("quoting"), "{}", out.stderr);
    assert!(!tmp.path().join("ramd.service").exists());
}

/// The test's end of NOTIFY_SOCKET.
struct Notifications(UnixDatagram);

impl Notifications {
    /// The next datagram, within `timeout`.
    fn next(&self, timeout: Duration, what: &str) -> String {
        self.0.set_read_timeout(Some(timeout)).unwrap();
        let mut buf = [0u8; 4096];
        match self.0.recv(&mut buf) {
            Ok(n) => String::from_utf8(buf[..n].to_vec()).unwrap(),
            Err(e) => panic!("no notification ({what}) within {timeout:?}: {e}"),
        }
    }

    /// Panics if a datagram arrives within `quiet`.
    fn none_within(&self, quiet: Duration) {
        self.0.set_nonblocking(true).unwrap();
        let deadline = Instant::now() + quiet;
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            if let Ok(n) = self.0.recv(&mut buf) {
                panic!(
                    "unexpected notification {:?}",
                    String::from_utf8_lossy(&buf[..n])
                );
            }
            thread::sleep(Duration::from_millis(10));
        }
        self.0.set_nonblocking(false).unwrap();
    }
}

fn has_line(msg: &str, line: &str) -> bool {
    msg.lines().any(|l| l == line)
}

/// The NBD server at `sock` greets a new client ("NBDMAGIC").
fn nbd_greets(sock: &Path) -> bool {
    let Ok(mut s) = UnixStream::connect(sock) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut magic = [0u8; 8];
    s.read_exact(&mut magic).is_ok() && magic == common::wire::NBDMAGIC.to_be_bytes()
}

fn mounted(dir: &Path) -> bool {
    let canon = dir.canonicalize().unwrap();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(canon.to_str().unwrap()))
}

fn kill(child: &Child, sig: i32) {
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(child.id() as i32, sig) };
}

/// Kills the daemon if the test fails before it stopped it.
struct Daemon(Option<Child>, PathBuf);

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            kill(&c, libc::SIGKILL);
            let _ = c.wait();
            if thread::panicking() {
                eprintln!(
                    "ramd up stderr:\n{}",
                    fs::read_to_string(&self.1).unwrap_or_default()
                );
            }
        }
    }
}

/// `ramd --run-dir RD up -c CONFIG` telling `notify` (NOTIFY_SOCKET) how
/// it does; its stderr beside `notify`.
fn up_notifying(rd: &Path, config: &Path, notify: &Path, stdout: Stdio) -> Daemon {
    let stderr = notify.with_file_name("stderr");
    let child = Command::new(ramd_bin())
        .arg("--run-dir")
        .arg(rd)
        .args(["up", "-c"])
        .arg(config)
        .env("NOTIFY_SOCKET", notify)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(fs::File::create(&stderr).unwrap())
        .spawn()
        .expect("spawn ramd up");
    Daemon(Some(child), stderr)
}

#[test]
fn up_notifies_ready_once_disks_serve_reloading_and_stopping() {
    let tmp = scratch();
    let rd = tmp.path().join("run");
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let sock_path = tmp.path().join("notify");
    let notes = Notifications(UnixDatagram::bind(&sock_path).unwrap());
    let config = tmp.path().join("ramd.toml");
    fs::write(
        &config,
        format!(
            "[disk.blk]\nsize = \"64M\"\n\n\
             [disk.files]\nkind = \"fs\"\nsize = \"64M\"\nmount = \"{}\"\n",
            mnt.display()
        ),
    )
    .unwrap();
    let mut daemon = up_notifying(&rd, &config, &sock_path, Stdio::piped());
    let stdout = daemon.0.as_mut().unwrap().stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });

    // The first notification is READY=1, and by then every disk serves.
    let ready = notes.next(START_DEADLINE, "READY=1 after start");
    assert!(has_line(&ready, "READY=1"), "{ready:?}");
    assert!(ready.contains("STATUS=serving 2 disk(s)"), "{ready:?}");
    let blk_line = rx.recv_timeout(START_DEADLINE).expect("a line per disk");
    let blk_sock = PathBuf::from(
        blk_line
            .split_once("socket=")
            .unwrap_or_else(|| panic!("{blk_line}"))
            .1,
    );
    assert!(nbd_greets(&blk_sock), "READY=1 before {blk_line} answers");
    assert!(mounted(&mnt), "READY=1 before {} is mounted", mnt.display());
    fs::write(mnt.join("a"), b"served").unwrap();
    assert_eq!(status_json(&rd)["disks"].as_array().unwrap().len(), 2);

    // SIGHUP: RELOADING=1 (with its timestamp), then READY=1 again.
    kill(daemon.0.as_ref().unwrap(), libc::SIGHUP);
    let reloading = notes.next(START_DEADLINE, "RELOADING=1 on SIGHUP");
    assert!(has_line(&reloading, "RELOADING=1"), "{reloading:?}");
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading:?}");
    let again = notes.next(START_DEADLINE, "READY=1 after the reload");
    assert!(has_line(&again, "READY=1"), "{again:?}");
    // `ramd reload` (ExecReload) does the same.
    ramd_cmd(&rd, &["reload"]).ok();
    assert!(has_line(
        &notes.next(START_DEADLINE, "reload"),
        "RELOADING=1"
    ));
    assert!(has_line(&notes.next(START_DEADLINE, "reload"), "READY=1"));

    // SIGTERM: STOPPING=1, then a clean exit; nothing after STOPPING.
    kill(daemon.0.as_ref().unwrap(), libc::SIGTERM);
    let stopping = notes.next(STOP_DEADLINE, "STOPPING=1 on SIGTERM");
    assert!(has_line(&stopping, "STOPPING=1"), "{stopping:?}");
    let status = wait_child(daemon.0.as_mut().unwrap(), STOP_DEADLINE)
        .expect("ramd up exits within STOP_DEADLINE of SIGTERM");
    assert!(status.success(), "ramd up after SIGTERM: {status}");
    daemon.0 = None;
    notes.none_within(Duration::from_millis(200));
    assert!(!mounted(&mnt));
}

/// A disk that cannot start keeps none of the others down; systemd's
/// STATUS= names it, FAILED, with its reason.
#[test]
fn up_with_a_disk_that_cannot_start_says_so_in_status() {
    let tmp = scratch();
    let rd = tmp.path().join("run");
    let sock_path = tmp.path().join("notify");
    let notes = Notifications(UnixDatagram::bind(&sock_path).unwrap());
    let config = tmp.path().join("ramd.toml");
    fs::write(
        &config,
        format!(
            "[disk.blk]\nsize = \"64M\"\n\n\
             [disk.files]\nkind = \"fs\"\nsize = \"64M\"\nmount = \"{}\"\n",
            tmp.path().join("missing").display()
        ),
    )
    .unwrap();
    let mut daemon = up_notifying(&rd, &config, &sock_path, Stdio::null());
    let ready = notes.next(START_DEADLINE, "READY=1 after start");
    assert!(has_line(&ready, "READY=1"), "{ready:?}");
    assert!(
        ready.contains("STATUS=serving 1 disk(s): blk")
            && ready.contains("disk files FAILED: mount point")
            && ready.contains("missing"),
        "{ready:?}"
    );
    assert!(nbd_greets(&rd.join("blk.sock")));
    kill(daemon.0.as_ref().unwrap(), libc::SIGTERM);
    let status = wait_child(daemon.0.as_mut().unwrap(), STOP_DEADLINE).expect("exits");
    assert!(status.success(), "{status}");
    daemon.0 = None;
}

#[test]
fn serve_notifies_an_abstract_socket_ready_and_stopping() {
    let name = format!("ramd-test-notify-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let notes = Notifications(UnixDatagram::bind_addr(&addr).unwrap());
    let rd = scratch();
    let env = format!("@{name}");
    let mut ramd = Ramd::try_start_in_with(
        rd.path(),
        &["--size", "64M", "--name", "one"],
        &[("NOTIFY_SOCKET", &env)],
        None,
    )
    .unwrap_or_else(|(s, e)| panic!("ramd serve did not start ({s}): {e}"));
    let ready = notes.next(START_DEADLINE, "READY=1");
    assert!(has_line(&ready, "READY=1"), "{ready:?}");
    assert!(nbd_greets(&ramd.socket_path()));
    ramd.stop();
    let stopping = notes.next(STOP_DEADLINE, "STOPPING=1");
    assert!(has_line(&stopping, "STOPPING=1"), "{stopping:?}");
}
