//! The control socket: `RUN_DIR/NAME.ctl` (mode 0600), one per running disk.
//!
//! Protocol: the client sends one line (`status`, `snapshot` or `snapshot
//! full`), the daemon answers one line of JSON and closes. `ramd status`
//! asks every socket in the run dir; `ramd snapshot NAME` asks NAME's.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{json, Value};

use crate::units::human;

const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Produces the daemon's status as JSON: a list of disks.
pub type StatusFn = Arc<dyn Fn() -> Vec<Value> + Send + Sync>;

/// Saves the disk now (`true`: a full save); `None` if it has no image.
pub type SnapshotFn = Arc<dyn Fn(bool) -> std::result::Result<Value, String> + Send + Sync>;

/// What a control socket answers.
#[derive(Clone)]
pub struct Handlers {
    pub status: StatusFn,
    pub snapshot: Option<SnapshotFn>,
}

/// A listening control socket; the file is removed when this is dropped
/// (if it is still ours).
pub struct ControlServer {
    _file: ramd_nbd::SocketFile,
}

impl ControlServer {
    pub fn start(path: PathBuf, handlers: Handlers) -> Result<ControlServer> {
        let (listener, file) = ramd_nbd::bind_unix_socket(&path)
            .with_context(|| format!("control socket {}", path.display()))?;
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || serve(listener, handlers))?;
        Ok(ControlServer { _file: file })
    }
}

fn serve(listener: UnixListener, handlers: Handlers) {
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        // A snapshot takes as long as the save: answer on its own thread
        // so that status keeps answering meanwhile.
        let handlers = handlers.clone();
        let spawned = std::thread::Builder::new()
            .name("control-req".into())
            .spawn(move || {
                if let Err(e) = answer(&mut conn, &handlers) {
                    log::warn!("control request failed: {e}");
                }
            });
        if let Err(e) = spawned {
            log::warn!("control request: {e}");
        }
    }
}

fn answer(conn: &mut UnixStream, handlers: &Handlers) -> std::io::Result<()> {
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&*conn).take(4096)).read_line(&mut line)?;
    if line.is_empty() {
        // A probe (is this name in use?) that connected and left.
        return Ok(());
    }
    let snapshot = |full: bool| match &handlers.snapshot {
        None => json!({ "error": "this disk has no image: serve it with --image DIR" }),
        Some(f) => match f(full) {
            Ok(v) => json!({ "snapshot": v }),
            Err(e) => json!({ "error": e }),
        },
    };
    let reply = match line.trim() {
        "status" => json!({ "disks": (handlers.status)() }),
        "snapshot" => snapshot(false),
        "snapshot full" => snapshot(true),
        other => json!({ "error": format!("unknown control request {other:?}") }),
    };
    writeln!(conn, "{reply}")
}

/// Asks one daemon for its status.
fn query(path: &Path) -> Result<Vec<Value>> {
    let mut conn = UnixStream::connect(path)?;
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    conn.write_all(b"status\n")?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("bad reply from {}", path.display()))?;
    match v.get("disks").and_then(Value::as_array) {
        Some(d) => Ok(d.clone()),
        None => anyhow::bail!("bad reply from {}: {text}", path.display()),
    }
}

/// `ramd snapshot NAME [--full]`: saves the disk through its socket.
pub fn snapshot(run_dir: &Path, name: &str, full: bool, as_json: bool) -> Result<()> {
    let path = run_dir.join(format!("{name}.ctl"));
    let mut conn = UnixStream::connect(&path).with_context(|| {
        format!(
            "no running disk named {name:?} ({} does not answer)",
            path.display()
        )
    })?;
    // No read timeout: a full save of a large disk takes what it takes.
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    conn.write_all(if full {
        b"snapshot full\n"
    } else {
        b"snapshot\n"
    })?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    if text.is_empty() {
        anyhow::bail!("disk {name:?} closed the connection without answering: did ramd exit?");
    }
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("bad reply from {}: {text:?}", path.display()))?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        anyhow::bail!("disk {name:?}: {e}");
    }
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

/// `ramd status`: every disk of every daemon in `run_dir`.
pub fn status(run_dir: &Path, name: Option<&str>, as_json: bool) -> Result<()> {
    let mut disks = Vec::new();
    let entries = match std::fs::read_dir(run_dir) {
        Ok(e) => e.filter_map(|e| e.ok()).map(|e| e.path()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", run_dir.display())),
    };
    let mut sockets: Vec<PathBuf> = entries
        .into_iter()
        .filter(|p| p.extension().is_some_and(|x| x == "ctl"))
        .collect();
    sockets.sort();
    for sock in sockets {
        match query(&sock) {
            Ok(d) => disks.extend(d),
            // A socket nobody answers on is left over from a killed daemon.
            Err(e) => log::debug!("{}: {e:#}", sock.display()),
        }
    }
    if let Some(name) = name {
        disks.retain(|d| d["name"] == name);
        if disks.is_empty() {
            anyhow::bail!("no running disk named {name:?} in {}", run_dir.display());
        }
    }
    if as_json {
        println!("{}", json!({ "disks": disks }));
    } else {
        print!("{}", table(&disks));
    }
    Ok(())
}

/// A zramctl-like table: DATA is what the disk's data pages hold, COMPR
/// what they take stored (compressed or raw), TOTAL the memory used with
/// slack and metadata, RATIO = DATA / TOTAL.
fn table(disks: &[Value]) -> String {
    let head = [
        "NAME",
        "KIND",
        "SIZE",
        "USED",
        "DATA",
        "COMPR",
        "ALGORITHM",
        "TOTAL",
        "RATIO",
        "MAX-MEM",
        "SAME",
        "IDLE",
        "INODES",
        "CONNS",
        "SAVED",
        "WHERE",
    ];
    let mut rows = vec![head.map(String::from).to_vec()];
    let n = |d: &Value, k: &str| d[k].as_u64().unwrap_or(0);
    // A field this kind of disk does not have shows as "-".
    let opt = |d: &Value, k: &str| d[k].as_u64().map_or("-".to_string(), |v| v.to_string());
    for d in disks {
        let size = if d["unlimited"] == true {
            "unlimited".to_string()
        } else {
            human(n(d, "size"))
        };
        let text = |k: &str| d[k].as_str().unwrap_or("?").to_string();
        let algorithm = match d["recompress"].as_str() {
            Some("none") | None => text("compress"),
            Some(r) => format!("{}/{r}", text("compress")),
        };
        let ratio = if n(d, "data_bytes") == 0 {
            "-".to_string()
        } else {
            format!("{:.2}", d["ratio"].as_f64().unwrap_or(0.0))
        };
        rows.push(vec![
            text("name"),
            text("kind"),
            size,
            human(n(d, "used_bytes")),
            human(n(d, "data_bytes")),
            human(n(d, "stored_bytes")),
            algorithm,
            human(n(d, "memory_used")),
            ratio,
            human(n(d, "max_memory")),
            (n(d, "zero_pages") + n(d, "fill_pages")).to_string(),
            n(d, "idle_pages").to_string(),
            opt(d, "inodes"),
            opt(d, "connections"),
            saved(d),
            d["uri"].as_str().unwrap_or("").to_string(),
        ]);
    }
    let widths: Vec<usize> = (0..head.len())
        .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(c, (v, w))| {
                // Names and text left-aligned, numbers right-aligned.
                if c < 2 || c == 6 || c == head.len() - 1 {
                    format!("{v:<w$}")
                } else {
                    format!("{v:>w$}")
                }
            })
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Age of the last good save ("-": none), "FAILED" if the latest failed.
fn saved(d: &Value) -> String {
    if d["last_save_error"].is_string() {
        return "FAILED".into();
    }
    match d["last_save"]["unix_time"].as_u64() {
        None => "-".into(),
        Some(t) => {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            let age = now.saturating_sub(t);
            match age {
                0..=99 => format!("{age}s ago"),
                100..=5999 => format!("{}m ago", age / 60),
                _ => format!("{}h ago", age / 3600),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lines_up() {
        let d = json!({"name":"ram0","kind":"block","size":1u64<<30,"used_bytes":8192,
            "memory_used":12288,"max_memory":1u64<<30,"data_pages":2,"data_bytes":8192,
            "stored_bytes":4096,"zero_pages":0,"fill_pages":0,"ratio":0.6667,
            "compress":"lz4","recompress":"zstd:9","idle_pages":1,
            "connections":2,"uri":"nbd+unix:///ram0?socket=/x"});
        let t = table(&[d]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("NAME  KIND"));
        assert!(lines[1].contains("1G"));
        assert!(lines[1].contains("lz4/zstd:9"));
        assert!(lines[1].contains("0.67"));
        assert!(lines[1].ends_with("nbd+unix:///ram0?socket=/x"));
        // Numbers are right-aligned under their heading.
        let size_end = lines[0].find("SIZE").unwrap() + 4;
        assert_eq!(&lines[1][size_end - 2..size_end], "1G");
    }
}
