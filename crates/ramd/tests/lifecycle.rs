//! The daemon's life: `ramd status`, the control socket, listeners, signals.

mod common;

use common::*;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

const NUMERIC_FIELDS: [&str; 10] = [
    "size",
    "max_memory",
    "used_bytes",
    "memory_used",
    "data_pages",
    "zero_pages",
    "fill_pages",
    "chunks",
    "metadata_bytes",
    "connections",
];

fn is_socket(p: &Path) -> bool {
    std::fs::symlink_metadata(p)
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false)
}

#[test]
fn status_json_describes_a_running_disk() {
    let d = Ramd::start(&["--size", "128M", "--name", "st", "--max-memory", "64M"]);
    let status = status_json(d.run_dir());
    let disks = status["disks"].as_array().expect("disks");
    assert_eq!(disks.len(), 1, "{status}");
    let s = &disks[0];
    assert_eq!(s["name"], "st", "{s}");
    assert_eq!(s["kind"], "block", "{s}");
    assert_eq!(s["uri"], d.uri(), "{s}");
    for key in NUMERIC_FIELDS {
        field(s, key);
    }
    for key in ["warm_bytes", "cold_bytes", "mapped_bytes", "released_bytes"] {
        field(&s["pool"], key);
    }
    assert_eq!(field(s, "size"), 128 * MIB);
    assert_eq!(field(s, "max_memory"), 64 * MIB);
    assert_eq!(field(s, "connections"), 0);

    nbd_script("io.py", &[d.uri(), "write-random", "1M", "4M", "s"]);
    let s = d.stats();
    assert_eq!(field(&s, "used_bytes"), 4 * MIB, "{s}");
    assert_eq!(field(&s, "data_pages"), 1024, "{s}");
    assert!(field(&s, "chunks") >= 2, "{s}");
    assert_accounting(&s);
}

#[test]
fn default_max_memory_covers_the_whole_disk() {
    let d = Ramd::start(&["--size", "64M"]);
    let s = d.stats();
    assert!(field(&s, "max_memory") >= 64 * MIB, "{s}");
    // And the disk can in fact be filled completely.
    nbd_script(
        "io.py",
        &[
            d.uri(),
            "write-random",
            "0",
            "64M",
            "f",
            ",",
            "verify-random",
            "0",
            "64M",
            "f",
        ],
    );
    let s = d.stats();
    assert_eq!(field(&s, "data_pages"), 64 * MIB / PAGE, "{s}");
    assert_accounting(&s);
}

#[test]
fn status_lists_every_daemon_of_the_run_dir() {
    let dir = scratch();
    let a = Ramd::start_in(dir.path(), &["--size", "64M", "--name", "alpha"]);
    let mut b = Ramd::start_in(dir.path(), &["--size", "32M", "--name", "beta"]);
    let status = status_json(dir.path());
    let da = disk_entry(&status, "alpha").unwrap_or_else(|| panic!("{status}"));
    let db = disk_entry(&status, "beta").unwrap_or_else(|| panic!("{status}"));
    assert_eq!(da["uri"], a.uri());
    assert_eq!(db["uri"], b.uri());
    assert_eq!(field(db, "size"), 32 * MIB);

    let table = ramd_cmd(dir.path(), &["status"]).ok();
    assert!(table.contains("alpha") && table.contains("beta"), "{table}");

    b.stop();
    let status = status_json(dir.path());
    assert_eq!(status["disks"].as_array().unwrap().len(), 1, "{status}");
    assert!(disk_entry(&status, "alpha").is_some(), "{status}");
}

#[test]
fn status_with_nothing_running() {
    let dir = scratch();
    let status = status_json(dir.path());
    assert_eq!(status, serde_json::json!({"disks": []}));
    ramd_cmd(dir.path(), &["status"]).ok();
    // A run dir that does not exist holds no running disk either.
    let status = status_json(&dir.path().join("not-there"));
    assert_eq!(status, serde_json::json!({"disks": []}));
}

#[test]
fn control_socket_is_private() {
    let d = Ramd::start(&["--size", "16M"]);
    let ctl = d.ctl_path();
    assert!(is_socket(&ctl), "{ctl:?} is not a socket");
    let mode = std::fs::metadata(&ctl).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "control socket mode {mode:o}");
    // The default NBD socket lives in the run dir too.
    assert_eq!(d.socket_path(), d.run_dir().join("ram0.sock"));
    assert!(is_socket(&d.socket_path()));
}

#[test]
fn sigterm_stops_cleanly_and_removes_sockets() {
    let mut d = Ramd::start(&["--size", "16M"]);
    let (sock, ctl) = (d.socket_path(), d.ctl_path());
    assert!(is_socket(&sock) && is_socket(&ctl));
    d.stop();
    assert!(!sock.exists(), "{sock:?} left behind");
    assert!(!ctl.exists(), "{ctl:?} left behind");
}

#[test]
fn sigint_stops_cleanly_and_removes_sockets() {
    let mut d = Ramd::start(&["--size", "16M"]);
    let (sock, ctl) = (d.socket_path(), d.ctl_path());
    let status = d.stop_with(libc::SIGINT);
    assert!(
        status.success(),
        "exit after SIGINT: {status}; {}",
        d.stderr()
    );
    assert!(!sock.exists() && !ctl.exists(), "sockets left behind");
}

#[test]
fn sigterm_with_clients_connected_still_exits_zero() {
    let mut d = Ramd::start(&["--size", "16M"]);
    let script = "import nbd, sys\n\
                  hs = [nbd.NBD() for _ in range(3)]\n\
                  [h.connect_uri(sys.argv[1]) for h in hs]\n\
                  sys.stdin.read()\n";
    let mut holder =
        Background::spawn(std::process::Command::new(python_nbd()).args(["-c", script, d.uri()]));
    wait_until(Duration::from_secs(20), "3 connections", || {
        holder.assert_running();
        field(&d.stats(), "connections") == 3
    });
    let (sock, ctl) = (d.socket_path(), d.ctl_path());
    d.stop();
    assert!(!sock.exists() && !ctl.exists(), "sockets left behind");
    drop(holder);
}

#[test]
fn after_sigkill_status_still_works_and_the_name_can_be_reused() {
    let dir = scratch();
    let mut d = Ramd::start_in(dir.path(), &["--size", "16M", "--name", "crashy"]);
    d.stop_with(libc::SIGKILL);
    // Whatever a killed daemon left behind, status reports no running disk.
    let status = status_json(dir.path());
    assert!(disk_entry(&status, "crashy").is_none(), "{status}");
    // And a new daemon of the same name starts and serves.
    let d = Ramd::start_in(dir.path(), &["--size", "16M", "--name", "crashy"]);
    nbd_script(
        "io.py",
        &[
            d.uri(),
            "write-random",
            "0",
            "1M",
            "x",
            ",",
            "verify-random",
            "0",
            "1M",
            "x",
        ],
    );
    assert!(disk_entry(&status_json(dir.path()), "crashy").is_some());
}

#[test]
fn a_second_daemon_with_the_same_name_does_not_hijack_the_first() {
    let dir = scratch();
    let mut first = Ramd::start_in(dir.path(), &["--size", "16M", "--name", "dup"]);
    nbd_script("io.py", &[first.uri(), "write-random", "0", "1M", "first"]);
    match Ramd::try_start_in(dir.path(), &["--size", "16M", "--name", "dup"]) {
        Ok(mut second) => {
            second.stop();
            panic!("a second daemon named dup started in the same run dir");
        }
        Err((status, stderr)) => {
            assert!(status.starts_with("exited"), "{status}");
            assert!(
                stderr.contains("dup"),
                "error does not name the disk: {stderr}"
            );
        }
    }
    first.assert_alive();
    nbd_script("io.py", &[first.uri(), "verify-random", "0", "1M", "first"]);
    assert!(first.ctl_path().exists() && first.socket_path().exists());
}

/// True if /proc/net/tcp has a listener on 127.0.0.1:`port`.
fn listening_on_loopback(port: u16) -> bool {
    let tcp = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let want = format!("0100007F:{port:04X}");
    tcp.lines().skip(1).any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 3 && f[1] == want && f[3] == "0A"
    })
}

#[test]
fn tcp_listener_on_loopback() {
    let port = free_tcp_port();
    let mut d = Ramd::start(&[
        "--size",
        "32M",
        "--listen",
        &format!("tcp:127.0.0.1:{port}"),
    ]);
    assert_eq!(d.uri(), format!("nbd://127.0.0.1:{port}/ram0"));
    assert!(listening_on_loopback(port));
    let out = run_ok(&mut cmd("nbdinfo", ["--size", d.uri()]));
    assert_eq!(out.trim(), (32 * MIB).to_string());
    assert_eq!(
        disk_entry(&status_json(d.run_dir()), "ram0").unwrap()["uri"],
        d.uri()
    );
    d.stop();
    // The port is free again.
    std::net::TcpListener::bind(("127.0.0.1", port)).expect("port still taken after stop");
}

#[test]
fn tcp_listener_without_host_binds_loopback() {
    let port = free_tcp_port();
    let d = Ramd::start(&["--size", "32M", "--listen", &format!("tcp:{port}")]);
    assert!(
        listening_on_loopback(port),
        "tcp:{port} does not listen on 127.0.0.1 (uri {})",
        d.uri()
    );
    assert!(d.uri().starts_with("nbd://"), "{}", d.uri());
    assert!(d.uri().contains(&format!(":{port}/")), "{}", d.uri());
    let out = run_ok(&mut cmd("nbdinfo", ["--size", d.uri()]));
    assert_eq!(out.trim(), (32 * MIB).to_string());
}

#[test]
fn unix_listener_at_a_chosen_path() {
    let dir = scratch();
    let sock = dir.path().join("custom.sock");
    let mut d = Ramd::start(&[
        "--size",
        "32M",
        "--listen",
        &format!("unix:{}", sock.display()),
    ]);
    assert_eq!(
        d.uri(),
        format!("nbd+unix:///ram0?socket={}", sock.display())
    );
    assert!(is_socket(&sock));
    let out = run_ok(&mut cmd("nbdinfo", ["--size", d.uri()]));
    assert_eq!(out.trim(), (32 * MIB).to_string());
    d.stop();
    assert!(!sock.exists(), "custom socket left behind");
}

#[test]
fn run_dir_from_the_environment() {
    let dir = scratch();
    let d = Ramd::start_with_env_run_dir(dir.path(), &["--size", "16M", "--name", "envy"]);
    assert!(is_socket(&dir.path().join("envy.ctl")));
    let mut c = cmd(ramd_bin(), ["status", "--json"]);
    c.env("RAMD_RUN_DIR", dir.path());
    let out = run_ok(&mut c);
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(disk_entry(&status, "envy").unwrap()["uri"], d.uri());
}

#[test]
fn status_of_one_named_disk() {
    let dir = scratch();
    let _a = Ramd::start_in(dir.path(), &["--size", "16M", "--name", "alpha"]);
    let _b = Ramd::start_in(dir.path(), &["--size", "16M", "--name", "beta"]);
    let out = ramd_cmd(dir.path(), &["status", "--json", "beta"]).ok();
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    let disks = status["disks"].as_array().expect("disks");
    assert_eq!(disks.len(), 1, "{status}");
    assert_eq!(disks[0]["name"], "beta", "{status}");
}

#[test]
fn max_connections_turns_extra_clients_away() {
    let mut d = Ramd::start(&["--size", "16M", "--max-connections", "2"]);
    let script = "import nbd, sys\n\
                  hs = [nbd.NBD() for _ in range(2)]\n\
                  [h.connect_uri(sys.argv[1]) for h in hs]\n\
                  sys.stdin.read()\n\
                  [h.pread(512, 0) for h in hs]\n";
    let mut holder =
        Background::spawn(std::process::Command::new(python_nbd()).args(["-c", script, d.uri()]));
    wait_until(Duration::from_secs(20), "2 connections", || {
        holder.assert_running();
        field(&d.stats(), "connections") == 2
    });
    let out = run(&mut cmd("nbdinfo", ["--size", d.uri()]), CMD_TIMEOUT).failed();
    d.assert_alive();
    // The two admitted clients still work, and once they leave, others get in.
    holder.finish_ok();
    wait_until(Duration::from_secs(10), "0 connections", || {
        field(&d.stats(), "connections") == 0
    });
    let size = run_ok(&mut cmd("nbdinfo", ["--size", d.uri()]));
    assert_eq!(size.trim(), (16 * MIB).to_string(), "after {out:?}");
}

#[test]
fn sigterm_during_heavy_io_exits_zero() {
    let mut d = Ramd::start(&["--size", "512M"]);
    let mut writer = Background::spawn(&mut nbd_script_cmd(
        "io.py",
        &[d.uri(), "write-random", "0", "512M", "heavy"],
    ));
    wait_until(Duration::from_secs(60), "the writer to get going", || {
        writer.assert_running();
        field(&d.stats(), "data_pages") >= 2048
    });
    let (sock, ctl) = (d.socket_path(), d.ctl_path());
    d.stop();
    assert!(!sock.exists() && !ctl.exists(), "sockets left behind");
    drop(writer);
}
