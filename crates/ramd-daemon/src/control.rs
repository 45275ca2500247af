//! Control sockets (mode 0600): `RUN_DIR/NAME.ctl` for each disk, and
//! `RUN_DIR/ramd.daemon` for a daemon started by `ramd up`.
//!
//! Protocol: the client sends one line, the server answers one line of
//! JSON (`{"error": "..."}` on failure) and closes. (`wait` is answered
//! twice: `{"waiting": NAME}` once registered, then when the disk is gone.) A disk answers
//! `status`, `snapshot`, `snapshot full`, `stop`, `wait`, `remount
//! OPTIONS` and `promote [force] [wait SECONDS]`; a daemon answers
//! `status`, `down`, `down NAME`, `reload` and `reload PATH`.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::{json, Value};

const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// One request, to be answered exactly once: by [`Request::answer`], or,
/// if whoever holds it drops it unanswered, with an error.
pub struct Request {
    line: String,
    conn: Option<UnixStream>,
}

impl Request {
    /// The request line, trimmed.
    pub fn line(&self) -> &str {
        &self.line
    }

    /// Sends a line before the answer (`wait` acknowledges that it is
    /// registered this way); the connection stays open for the answer.
    pub fn progress(&mut self, v: Value) {
        if let Some(conn) = self.conn.as_mut() {
            if let Err(e) = writeln!(conn, "{v}") {
                log::warn!("control request {:?}: answering: {e}", self.line);
            }
        }
    }

    /// Sends the answer: the value, or `{"error": MESSAGE}`.
    pub fn answer(mut self, r: std::result::Result<Value, String>) {
        let v = r.unwrap_or_else(|e| json!({ "error": e }));
        if let Some(mut conn) = self.conn.take() {
            if let Err(e) = writeln!(conn, "{v}") {
                log::warn!("control request {:?}: answering: {e}", self.line);
            }
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            let _ = writeln!(
                conn,
                "{}",
                json!({ "error": "ramd is stopping: the request was not served" })
            );
        }
    }
}

/// What a control socket does with each request (on the request's own
/// thread, so a long snapshot never holds up `status`).
pub type Handler = Arc<dyn Fn(Request) + Send + Sync>;

/// A listening control socket. Dropping it stops accepting and removes the
/// file (if it is still ours).
pub struct ControlServer {
    _file: ramd_frontend::SocketFile,
    stop: Arc<AtomicBool>,
    fd: i32,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    pub fn start(path: PathBuf, handler: Handler) -> Result<ControlServer> {
        let (listener, file) = ramd_frontend::bind_unix_socket(&path)
            .with_context(|| format!("control socket {}", path.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let fd = listener.as_raw_fd();
        let thread = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("control".into())
                .spawn(move || serve(listener, handler, &stop))?
        };
        Ok(ControlServer {
            _file: file,
            stop,
            fd,
            thread: Some(thread),
        })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // SAFETY: shutdown(2) on the listening socket the accept thread
        // owns and keeps open until it returns, which makes its accept(2)
        // return; nothing else is done with the fd.
        unsafe { libc::shutdown(self.fd, libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(listener: UnixListener, handler: Handler, stop: &AtomicBool) {
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(conn) = conn else { continue };
        let handler = handler.clone();
        let spawned = std::thread::Builder::new()
            .name("control-req".into())
            .spawn(move || match read_request(conn) {
                Ok(Some(req)) => handler(req),
                // A probe (is this name in use?) that connected and left.
                Ok(None) => {}
                Err(e) => log::warn!("control request: {e}"),
            });
        if let Err(e) = spawned {
            log::warn!("control request: {e}");
        }
    }
}

fn read_request(conn: UnixStream) -> std::io::Result<Option<Request>> {
    conn.set_read_timeout(Some(IO_TIMEOUT))?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut line = String::new();
    BufReader::new((&conn).take(4096)).read_line(&mut line)?;
    if line.is_empty() {
        return Ok(None);
    }
    Ok(Some(Request {
        line: line.trim().to_string(),
        conn: Some(conn),
    }))
}

/// Sends `line` to the control socket at `path` and returns its answer; an
/// `{"error": ...}` answer is an error. `timeout`: for the answer (`None`
/// for requests that take as long as a save).
pub fn request(path: &Path, line: &str, timeout: Option<Duration>) -> Result<Value> {
    let mut conn = UnixStream::connect(path)?;
    conn.set_read_timeout(timeout)?;
    conn.set_write_timeout(Some(IO_TIMEOUT))?;
    writeln!(conn, "{line}")?;
    let mut text = String::new();
    conn.read_to_string(&mut text)?;
    if text.is_empty() {
        anyhow::bail!(
            "{} closed the connection without answering: did ramd exit?",
            path.display()
        );
    }
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("bad reply from {}: {text:?}", path.display()))?;
    if let Some(e) = v.get("error").and_then(Value::as_str) {
        anyhow::bail!("{e}");
    }
    Ok(v)
}

/// The sockets of one kind (`ctl`, `daemon`) in the run directory, sorted.
pub fn sockets(run_dir: &Path, ext: &str) -> Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(run_dir) {
        Ok(e) => e.filter_map(|e| e.ok()).map(|e| e.path()).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", run_dir.display())),
    };
    let mut out: Vec<PathBuf> = entries
        .into_iter()
        .filter(|p: &PathBuf| p.extension().is_some_and(|x| x == ext))
        .collect();
    out.sort();
    Ok(out)
}

/// A disk's control socket.
pub fn disk_socket(run_dir: &Path, name: &str) -> PathBuf {
    run_dir.join(format!("{name}.ctl"))
}

/// The control socket of the `ramd up` daemon of a run directory.
pub fn daemon_socket(run_dir: &Path) -> PathBuf {
    run_dir.join("ramd.daemon")
}
