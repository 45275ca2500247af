//! `ramd status --watch`: on a terminal (a tmux pane) the table is redrawn
//! in place and follows the disk; on a pipe each refresh is printed after
//! the last; Ctrl-C / SIGINT ends it with exit 0.

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;

/// A tmux server of the test's own (its own socket and no user config),
/// killed on drop.
struct Tmux {
    tmux: PathBuf,
    socket: PathBuf,
    session: &'static str,
}

impl Tmux {
    /// A detached `width`×`height` session running `command` (a shell
    /// line); the pane stays after the command exits, to read its screen.
    fn start(dir: &Path, command: &str, width: u16, height: u16) -> Tmux {
        let conf = dir.join("tmux.conf");
        std::fs::write(&conf, "set -g remain-on-exit on\n").unwrap();
        let t = Tmux {
            tmux: require_tool("tmux"),
            socket: dir.join("tmux.sock"),
            session: "watch",
        };
        let mut c = Command::new(&t.tmux);
        c.arg("-S").arg(&t.socket).arg("-f").arg(&conf).args([
            "new-session",
            "-d",
            "-s",
            t.session,
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            command,
        ]);
        c.env_remove("TMUX").env("TERM", "xterm-256color");
        run_ok(&mut c);
        t
    }

    fn tmux(&self, args: &[&str]) -> String {
        let mut c = Command::new(&self.tmux);
        c.arg("-S").arg(&self.socket).args(args);
        run_ok(&mut c)
    }

    /// What the pane shows now.
    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-t", self.session])
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new(&self.tmux)
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .stderr(Stdio::null())
            .status();
    }
}

/// Column `col` of disk `name`'s row in a status table, if the table is there.
fn cell(table: &str, name: &str, col: &str) -> Option<String> {
    let head: Vec<&str> = table
        .lines()
        .find(|l| l.starts_with("NAME "))?
        .split_whitespace()
        .collect();
    let i = head.iter().position(|h| *h == col)?;
    let row = table.lines().find(|l| l.starts_with(&format!("{name} ")))?;
    row.split_whitespace().nth(i).map(String::from)
}

fn quote(p: &Path) -> String {
    format!("'{}'", p.display())
}

#[test]
fn watch_in_a_terminal_redraws_the_table_in_place_until_ctrl_c() {
    let tmp = scratch();
    let rd = tmp.path().join("run");
    let ramd = Ramd::start_in(&rd, &["--size", "64M", "--name", "watched"]);
    // The shell writes how the watch ended: tmux 3.3 sometimes leaves a
    // pane's exited process unreaped, its status unknown. `trap : INT`
    // makes the shell wait out Ctrl-C (its child gets the default action).
    let ended = tmp.path().join("ended");
    let line = format!(
        "trap : INT; {} --run-dir {} status --watch --interval 200ms; echo \"exit $?\" > {}",
        quote(Path::new(ramd_bin())),
        quote(&rd),
        quote(&ended)
    );
    let tmux = Tmux::start(tmp.path(), &line, 250, 40);

    let mut screen = String::new();
    wait_until(START_DEADLINE, "the table in the pane", || {
        screen = tmux.screen();
        cell(&screen, "watched", "USED").as_deref() == Some("0B")
    });
    assert!(
        screen.contains("Every 200ms: ramd status"),
        "no watch header:\n{screen}"
    );

    qemu_io(ramd.uri(), &["write -P 0x5a 0 4M".into()]);
    wait_until(STATS_DEADLINE, "USED to show the 4M write", || {
        screen = tmux.screen();
        cell(&screen, "watched", "USED").as_deref() == Some("4M")
    });
    // Redrawn in place: one table on the screen, not one per refresh.
    let heads = screen.lines().filter(|l| l.starts_with("NAME ")).count();
    assert_eq!(
        heads, 1,
        "the table scrolled instead of being redrawn:\n{screen}"
    );
    assert!(!ended.exists(), "the watch ended by itself:\n{screen}");

    tmux.tmux(&["send-keys", "-t", tmux.session, "C-c"]);
    wait_until(STOP_DEADLINE, "the watch to end after Ctrl-C", || {
        std::fs::read_to_string(&ended).is_ok_and(|s| s.ends_with('\n'))
    });
    let how = std::fs::read_to_string(&ended).unwrap();
    assert_eq!(how.trim(), "exit 0", "after Ctrl-C:\n{}", tmux.screen());
}

/// Lines a `ramd status --watch …` prints on a pipe until it has printed
/// `n` lines starting with `until`; then SIGINT, and it must exit 0.
fn watch_on_a_pipe(rd: &Path, extra: &[&str], until: &str, n: usize) -> Vec<String> {
    let mut child = Command::new(ramd_bin())
        .arg("--run-dir")
        .arg(rd)
        .args(["status", "--watch", "--interval", "100ms"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn ramd status --watch");
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let mut lines: Vec<String> = Vec::new();
    while lines.iter().filter(|l| l.starts_with(until)).count() < n {
        match rx.recv_timeout(START_DEADLINE) {
            Ok(l) => lines.push(l),
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("ramd status --watch: {e} after {lines:#?}");
            }
        }
    }
    // SAFETY: kill(2) on our own child, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = wait_child(&mut child, STOP_DEADLINE).unwrap_or_else(|| {
        let _ = child.kill();
        panic!("ramd status --watch ignored SIGINT")
    });
    assert!(status.success(), "after SIGINT: {status}");
    lines
}

#[test]
fn watch_on_a_pipe_prints_one_plain_table_per_refresh() {
    let rd = scratch();
    let _ramd = Ramd::start_in(rd.path(), &["--size", "64M", "--name", "piped"]);
    let lines = watch_on_a_pipe(rd.path(), &[], "NAME ", 3);
    assert!(
        lines.iter().all(|l| !l.contains('\x1b')),
        "escape codes on a pipe: {lines:?}"
    );
    // NAME…, piped…, a blank line, NAME…: tables one after another.
    let tables: Vec<&[String]> = lines.split(|l| l.is_empty()).collect();
    assert!(tables.len() >= 3, "{lines:#?}");
    // (The last one may be cut where the test stopped reading.)
    assert!(tables[2][0].starts_with("NAME "), "{lines:#?}");
    for t in &tables[..2] {
        assert!(
            t[0].starts_with("NAME ") && t[1].starts_with("piped "),
            "{lines:#?}"
        );
    }

    // --json: one JSON document a line.
    let lines = watch_on_a_pipe(rd.path(), &["--json"], "{", 2);
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["disks"][0]["name"], "piped", "{l}");
    }
}

#[test]
fn interval_needs_watch_and_a_sane_duration() {
    let rd = scratch();
    let e = ramd_cmd(rd.path(), &["status", "--interval", "1s"])
        .failed()
        .stderr;
    assert!(e.contains("--watch"), "{e}");
    let e = ramd_cmd(rd.path(), &["status", "--watch", "--interval", "10ms"])
        .failed()
        .stderr;
    assert!(e.contains("100ms"), "{e}");
}
