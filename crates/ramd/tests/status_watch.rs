//! `ramd status` on a terminal (a tmux pane): the table fits the pane's
//! width (or `COLUMNS`), a pipe gets every column; `--watch` redraws it in
//! place and follows the disk; on a pipe each refresh is printed after the
//! last; Ctrl-C / SIGINT ends it with exit 0.

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
        // The pane's own size, not the caller's terminal's.
        c.env_remove("TMUX")
            .env_remove("COLUMNS")
            .env_remove("LINES")
            .env("TERM", "xterm-256color");
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

    /// What the pane shows now, a line the terminal wrapped joined again.
    fn screen_joined(&self) -> String {
        self.tmux(&["capture-pane", "-p", "-J", "-t", self.session])
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

const EVERY_COLUMN: [&str; 18] = [
    "NAME",
    "KIND",
    "SIZE",
    "USED",
    "DATA",
    "COMPR",
    "ALGORITHM",
    "TOTAL",
    "WARM",
    "RATIO",
    "MAX-MEM",
    "SAME",
    "IDLE",
    "INODES",
    "CONNS",
    "NODES",
    "SAVED",
    "WHERE",
];

/// `ramd status` in panes of 80 and 40 columns, and with COLUMNS=60 in a
/// wide one: every line fits (no row wrapped by the terminal), the disk
/// is one row with its name, size, use and where to reach it. Its output
/// to a file in the same pane has every column, for scripts.
#[test]
fn status_fits_the_terminal_and_a_file_gets_every_column() {
    let tmp = scratch();
    let rd = tmp.path().join("run");
    let _ramd = Ramd::start_in(&rd, &["--size", "64M", "--name", "narrow"]);
    for (pane, columns) in [(80, None), (40, None), (200, Some(60))] {
        let dir = tmp.path().join(format!("pane-{pane}"));
        std::fs::create_dir(&dir).unwrap();
        let (file, done) = (dir.join("file"), dir.join("done"));
        let env = columns.map_or(String::new(), |c| format!("COLUMNS={c} "));
        let status = format!(
            "{env}{} --run-dir {} status",
            quote(Path::new(ramd_bin())),
            quote(&rd)
        );
        // The pane's command stays (cat reads the terminal) until the
        // server is killed: tmux 3.3 loses the top line of a dead pane.
        let line = format!(
            "{status}; {status} > {}; echo done > {}; exec cat",
            quote(&file),
            quote(&done)
        );
        let tmux = Tmux::start(&dir, &line, pane, 40);
        wait_until(START_DEADLINE, "ramd status in the pane", || {
            std::fs::read_to_string(&done).is_ok_and(|s| s.ends_with('\n'))
        });
        let width = columns.unwrap_or(pane as usize);
        let screen = tmux.screen_joined();
        for l in screen.lines() {
            assert!(
                l.chars().count() <= width,
                "{pane} columns, COLUMNS {columns:?}: a line of {} characters, {l:?}:\n{screen}",
                l.chars().count()
            );
        }
        for col in ["NAME", "SIZE", "USED", "TOTAL", "WHERE"] {
            assert!(
                cell(&screen, "narrow", col).is_some(),
                "{pane}/{columns:?}: no {col} for the disk:\n{screen}"
            );
        }
        assert_eq!(cell(&screen, "narrow", "USED").as_deref(), Some("0B"));
        let row = screen.lines().find(|l| l.starts_with("narrow ")).unwrap();
        assert!(row.contains("nbd+unix:///"), "{row}");
        assert!(
            screen.lines().any(|l| l.starts_with("process ")),
            "{screen}"
        );
        let head: Vec<String> = std::fs::read_to_string(&file)
            .unwrap()
            .lines()
            .next()
            .unwrap()
            .split_whitespace()
            .map(String::from)
            .collect();
        assert_eq!(head, EVERY_COLUMN, "ramd status to a file");
    }
}

/// `--watch` in a pane of 50 columns: each refresh fits it too.
#[test]
fn watch_in_a_narrow_terminal_fits_it() {
    let tmp = scratch();
    let rd = tmp.path().join("run");
    let ramd = Ramd::start_in(&rd, &["--size", "64M", "--name", "slim"]);
    let line = format!(
        "{} --run-dir {} status --watch --interval 200ms",
        quote(Path::new(ramd_bin())),
        quote(&rd)
    );
    let tmux = Tmux::start(tmp.path(), &line, 50, 30);
    qemu_io(ramd.uri(), &["write -P 0x5a 0 4M".into()]);
    let mut screen = String::new();
    wait_until(STATS_DEADLINE, "the table to show the 4M write", || {
        screen = tmux.screen_joined();
        cell(&screen, "slim", "USED").as_deref() == Some("4M")
    });
    for l in screen.lines() {
        assert!(l.chars().count() < 50, "{l:?}:\n{screen}");
    }
    assert!(screen.contains("Every 200ms"), "{screen}");
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
