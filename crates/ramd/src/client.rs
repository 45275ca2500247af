//! The commands that talk to running daemons through their control
//! sockets (see `ramd_daemon::control`): status (once or `--watch`),
//! snapshot, down, reload.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use ramd_daemon::control::{self, daemon_socket, disk_socket};
use ramd_daemon::status::{self, DaemonStatus, DiskStatus};
use ramd_store::human;

const ANSWER: Option<Duration> = Some(Duration::from_secs(5));

/// Every disk answering in `run_dir` (a socket nobody answers on is left
/// over from a killed daemon, and skipped).
fn disks(run_dir: &Path) -> Result<Vec<DiskStatus>> {
    let mut out = Vec::new();
    for sock in control::sockets(run_dir, "ctl")? {
        match control::request(&sock, "status", ANSWER) {
            Ok(v) => {
                let d: Vec<DiskStatus> = serde_json::from_value(v["disks"].clone())
                    .with_context(|| format!("bad status from {}", sock.display()))?;
                out.extend(d);
            }
            Err(e) => log::debug!("{}: {e:#}", sock.display()),
        }
    }
    Ok(out)
}

fn daemons(run_dir: &Path) -> Result<Vec<DaemonStatus>> {
    Ok(daemons_with(run_dir)?.into_iter().map(|(_, d)| d).collect())
}

/// `ramd status`: every disk of every daemon in `run_dir`.
pub fn status(run_dir: &Path, name: Option<&str>, as_json: bool) -> Result<()> {
    print!("{}", status_text(run_dir, name, as_json, terminal_width())?);
    Ok(())
}

/// The width of the terminal stdout is, if it is one: `COLUMNS` if set (as
/// for ls and ps), else the terminal's own. `None` on a pipe or a file,
/// which get the whole table: scripts read it.
fn terminal_width() -> Option<usize> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() {
        return None;
    }
    if let Some(n) = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        return Some(n);
    }
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ on stdout's fd fills the winsize we pass.
    let ok = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_col > 0).then_some(ws.ws_col as usize)
}

/// What `ramd status` prints: the table and the daemons' lines (in `width`
/// columns, if given), or one line of JSON.
fn status_text(
    run_dir: &Path,
    name: Option<&str>,
    as_json: bool,
    width: Option<usize>,
) -> Result<String> {
    let mut disks = disks(run_dir)?;
    let daemons = daemons(run_dir)?;
    if let Some(name) = name {
        disks.retain(|d| d.name == name);
        if disks.is_empty() {
            bail!("no running disk named {name:?} in {}", run_dir.display());
        }
    }
    if as_json {
        // `daemons` only where `ramd up` runs: plain `serve` output is unchanged.
        let v = match daemons.is_empty() {
            true => json!({ "disks": disks }),
            false => json!({ "disks": disks, "daemons": daemons }),
        };
        Ok(format!("{v}\n"))
    } else {
        // A disk on its way out (`ramd down`, a reload that removed it) is
        // gone for the table, unless its save failed: then it needs a
        // person. `--json` keeps it, with `stopping`.
        disks.retain(|d| !d.stopping || d.blocked.is_some());
        Ok(status::fitted(&disks, &daemons, width) + &status::trouble_lines(&disks, &daemons))
    }
}

/// `ramd status --watch`: the status again every `interval` until SIGINT
/// or SIGTERM (then exit 0). On a terminal the table is redrawn in place,
/// like `watch`; otherwise (a pipe, a file) each refresh is printed after
/// the last one: tables separated by a blank line, or one JSON line each.
/// A disk that goes away mid-watch shows as an error line, not an exit.
pub fn watch(run_dir: &Path, name: Option<&str>, as_json: bool, interval: Duration) -> Result<()> {
    use std::io::{IsTerminal, Write};
    use std::sync::atomic::{AtomicBool, Ordering};

    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("installing signal handlers")?;
    }
    let mut out = std::io::stdout().lock();
    let terminal = out.is_terminal() && !as_json;
    let mut first = true;
    while !stop.load(Ordering::Relaxed) {
        // Read again each time: the terminal may be resized. One column
        // spare: a line that fills the last column leaves the cursor on
        // it, where the erase that follows would take its last character.
        let width = if terminal {
            terminal_width().map(|w| w.saturating_sub(1).max(1))
        } else {
            None
        };
        let body =
            status_text(run_dir, name, as_json, width).unwrap_or_else(|e| format!("ramd: {e:#}\n"));
        let frame = if terminal {
            // Home, each line erased to its end, the rest of the screen
            // erased: no flicker, no leftovers from a longer table.
            let head = format!(
                "Every {}: ramd status{}    {}\n\n",
                humantime(interval),
                name.map(|n| format!(" {n}")).unwrap_or_default(),
                clock()
            );
            let lines: String = (head + &body)
                .lines()
                .map(|l| {
                    // The header too: never wrapped.
                    let l: String = l.chars().take(width.unwrap_or(usize::MAX)).collect();
                    format!("{l}\x1b[K\n")
                })
                .collect();
            format!("{}\x1b[H{lines}\x1b[J", if first { "\x1b[2J" } else { "" })
        } else if as_json || first {
            body
        } else {
            format!("\n{body}")
        };
        first = false;
        // A closed pipe (`| head`) ends the watch quietly.
        if out
            .write_all(frame.as_bytes())
            .and_then(|()| out.flush())
            .is_err()
        {
            return Ok(());
        }
        // The pause, cut short by a signal.
        let deadline = Instant::now() + interval;
        while !stop.load(Ordering::Relaxed) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            std::thread::sleep(left.min(Duration::from_millis(50)));
        }
    }
    Ok(())
}

/// `2s`, `500ms`, `1.5s`.
fn humantime(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{:.1}s", d.as_secs_f64())
    }
}

/// The local time of day, `HH:MM:SS`.
fn clock() -> String {
    // SAFETY: time(NULL) has no preconditions; localtime_r writes only the
    // `tm` we pass, which is valid and writable.
    unsafe {
        let now = libc::time(std::ptr::null_mut());
        let mut tm: libc::tm = std::mem::zeroed();
        if libc::localtime_r(&now, &mut tm).is_null() {
            return String::new();
        }
        format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
    }
}

/// `ramd snapshot NAME [--full | --to DIR]`: saves the disk through its
/// socket.
pub fn snapshot(
    run_dir: &Path,
    name: &str,
    full: bool,
    to: Option<&Path>,
    as_json: bool,
) -> Result<()> {
    let path = disk_socket(run_dir, name);
    let line = match to {
        // An image in object storage goes as given (made "absolute", it
        // would be a directory named `s3:` in our working directory).
        Some(url) if ramd_store::persist::is_url(url) => format!("snapshot to {}", url.display()),
        // The daemon's working directory is not ours.
        Some(dir) => format!(
            "snapshot to {}",
            std::path::absolute(dir)
                .with_context(|| format!("--to {}", dir.display()))?
                .display()
        ),
        None if full => "snapshot full".into(),
        None => "snapshot".into(),
    };
    // No answer timeout: a full save of a large disk takes what it takes.
    let v = disk_request(name, &path, &line)?;
    let mut r = v["snapshot"].clone();
    if as_json {
        r["name"] = name.into();
        println!("{r}");
    } else {
        println!(
            "{name}: saved {} save {} to {}: {} pages, {} written in {:.2} s",
            if r["full"] == true {
                "full"
            } else {
                "incremental"
            },
            r["seq"],
            r["path"].as_str().unwrap_or("?"),
            r["pages"],
            human(r["bytes"].as_u64().unwrap_or(0)),
            r["seconds"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}

/// One request to disk `name`'s control socket at `path`, without an
/// answer timeout; a socket nobody answers is "no running disk".
fn disk_request(name: &str, path: &Path, line: &str) -> Result<serde_json::Value> {
    control::request(path, line, None).map_err(|e| match e.downcast_ref::<std::io::Error>() {
        Some(_) => e.context(format!(
            "no running disk named {name:?} ({} does not answer)",
            path.display()
        )),
        None => anyhow::anyhow!("disk {name:?}: {e:#}"),
    })
}

/// `ramd promote NAME [--force] [--wait DURATION]`: makes a standby its
/// image's writer, through its socket.
pub fn promote(run_dir: &Path, a: &crate::cli::PromoteArgs) -> Result<()> {
    let name = &a.name;
    let path = disk_socket(run_dir, name);
    let mut line = String::from("promote");
    if a.force {
        line += " force";
    }
    line += &format!(" wait {}", a.wait.as_secs_f64());
    if !a.force && !a.wait.is_zero() && !a.json {
        eprintln!(
            "{name}: promoting; waiting up to {:?} for its image's lease to be free (its \
             writer stopped or died)",
            a.wait
        );
    }
    // No answer timeout: the wait, then a save, take what they take.
    let v = disk_request(name, &path, &line)?;
    let mut r = v["promoted"].clone();
    if a.json {
        r["name"] = name.as_str().into();
        println!("{r}");
    } else {
        println!(
            "{name}: promoted: the writer of {} from save {} on; it takes writes (id {})",
            r["path"].as_str().unwrap_or("?"),
            r["seq"],
            r["id"].as_str().unwrap_or("?")
        );
    }
    Ok(())
}

/// `ramd down`: stops one disk (NAME), the run directory's `ramd up`
/// daemon (no name), what one process serves (`--pid`), or everything
/// (`--all`), and waits until they are gone (saved, if they have images).
/// A disk whose save fails is not stopped (unless `--force`): the error
/// says why and what to do.
pub fn down(run_dir: &Path, a: &crate::cli::DownArgs) -> Result<()> {
    let force = if a.force { " force" } else { "" };
    let daemon_down = if a.force { "down --force" } else { "down" };
    let mut stopped = Vec::new();
    let mut ask = |sock: &Path, line: &str| -> Result<()> {
        stopped.push(control::request(sock, line, None)?);
        Ok(())
    };
    if let Some(name) = a.name.as_deref() {
        let path = disk_socket(run_dir, name);
        if path.exists() {
            // Its answers name the disk.
            ask(&path, &format!("stop{force}"))?;
        } else if let Some(sock) = daemons_with(run_dir)?
            .into_iter()
            .find(|(_, d)| d.failed.contains_key(name))
            .map(|(s, _)| s)
        {
            // A disk of `ramd up` that failed to start: it is forgotten.
            ask(&sock, &format!("down {name}")).with_context(|| format!("{}", sock.display()))?;
        } else {
            let names: Vec<String> = disks(run_dir)?.into_iter().map(|d| d.name).collect();
            bail!(
                "no running disk named {name:?} in {} (running: {})",
                run_dir.display(),
                if names.is_empty() {
                    "none".into()
                } else {
                    names.join(", ")
                }
            );
        }
    } else if a.all {
        // Daemons of `ramd up` first: they stop all their disks at once;
        // then the disks of `ramd serve` processes and mounts.
        for (ext, line) in [
            ("daemon", daemon_down.to_string()),
            ("ctl", format!("stop{force}")),
        ] {
            for sock in control::sockets(run_dir, ext)? {
                match control::request(&sock, &line, None) {
                    Ok(v) => stopped.push(v),
                    // Gone meanwhile, or left over from a killed daemon.
                    Err(e) if e.downcast_ref::<std::io::Error>().is_some() => {
                        log::debug!("{}: {e:#}", sock.display())
                    }
                    Err(e) => return Err(e.context(format!("{}", sock.display()))),
                }
            }
        }
    } else if let Some(pid) = a.pid {
        let daemon = daemons_with(run_dir)?
            .into_iter()
            .find(|(_, d)| d.pid == pid);
        if let Some((sock, _)) = daemon {
            ask(&sock, daemon_down).with_context(|| format!("{}", sock.display()))?;
        } else {
            let mine: Vec<String> = disks(run_dir)?
                .into_iter()
                .filter(|d| d.pid == pid)
                .map(|d| d.name)
                .collect();
            if mine.is_empty() {
                // Already gone: what a stop wants.
                eprintln!(
                    "ramd: no disk of process {pid} runs in {}",
                    run_dir.display()
                );
            }
            for name in mine {
                // Its answers name the disk.
                ask(&disk_socket(run_dir, &name), &format!("stop{force}"))?;
            }
        }
    } else {
        match daemons_with(run_dir)?.into_iter().next() {
            Some((sock, _)) => {
                ask(&sock, daemon_down).with_context(|| format!("{}", sock.display()))?
            }
            None => {
                let others = disks(run_dir)?;
                if others.is_empty() {
                    eprintln!("ramd: nothing runs in {}", run_dir.display());
                } else {
                    let list: Vec<String> = others
                        .iter()
                        .map(|d| match &d.mount {
                            Some(m) => format!("{} (mounted at {m}, pid {})", d.name, d.pid),
                            None => format!("{} (ramd serve, pid {})", d.name, d.pid),
                        })
                        .collect();
                    bail!(
                        "no `ramd up` daemon runs in {}, and `ramd down` without a name stops \
                         only that; running: {}. Stop one with `ramd down NAME`, or every one \
                         with `ramd down --all`",
                        run_dir.display(),
                        list.join(", ")
                    );
                }
            }
        }
    }
    if a.json {
        println!("{}", Value::Array(stopped));
    } else {
        for v in stopped {
            if let Some(n) = v["stopped"].as_str() {
                let saved = if v["saved"] == true { ", saved" } else { "" };
                // `--replicate`: whether the last save reached the replica.
                let replicated = match &v["replicated"] {
                    Value::String(t) => format!(", {t}"),
                    r => r["error"]
                        .as_str()
                        .map_or(String::new(), |e| format!("; {e}")),
                };
                println!("{n}: stopped{saved}{replicated}");
            } else if v["down"] == true {
                println!("daemon stopped");
            }
        }
    }
    Ok(())
}

/// The `ramd up` daemons answering in `run_dir`, with their sockets.
fn daemons_with(run_dir: &Path) -> Result<Vec<(std::path::PathBuf, DaemonStatus)>> {
    let mut out = Vec::new();
    for sock in control::sockets(run_dir, "daemon")? {
        match control::request(&sock, "status", ANSWER) {
            Ok(v) => out.push((
                sock.clone(),
                serde_json::from_value(v["daemon"].clone())
                    .with_context(|| format!("bad status from {}", sock.display()))?,
            )),
            Err(e) => log::debug!("{}: {e:#}", sock.display()),
        }
    }
    Ok(out)
}

/// `ramd reload [-c FILE]`: the `ramd up` daemon of the run directory
/// re-reads its config file.
pub fn reload(run_dir: &Path, config: Option<&Path>, as_json: bool) -> Result<()> {
    let sock = daemon_socket(run_dir);
    let line = match config {
        // The daemon may run elsewhere: give it an absolute path.
        Some(p) => format!(
            "reload {}",
            std::path::absolute(p)
                .with_context(|| format!("config file {}", p.display()))?
                .display()
        ),
        None => "reload".into(),
    };
    let v = control::request(&sock, &line, None).map_err(|e| {
        match e.downcast_ref::<std::io::Error>() {
            Some(_) => e.context(format!(
                "no `ramd up` daemon answers in {} ({} )",
                run_dir.display(),
                sock.display()
            )),
            None => e,
        }
    })?;
    if as_json {
        println!("{v}");
        return Ok(());
    }
    let list = |k: &str| -> String {
        let names: Vec<&str> = v[k]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        if names.is_empty() {
            "-".into()
        } else {
            names.join(" ")
        }
    };
    println!(
        "added: {}\nremoved: {}\nunchanged: {}",
        list("added"),
        list("removed"),
        list("unchanged")
    );
    for n in v["notes"].as_array().into_iter().flatten() {
        println!("note: {}", n.as_str().unwrap_or_default());
    }
    Ok(())
}
