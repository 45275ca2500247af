//! The HTTP side of `/metrics`: a small HTTP/1.1 responder. One request
//! per connection (`Connection: close`), a thread per connection up to
//! [`MAX_CLIENTS`], a deadline on reading the request and on writing the
//! answer, and no shared lock with the disks, so a slow or garbage client
//! costs one thread for a few seconds and never delays a scrape or the
//! daemon. `GET /metrics` answers with [`super::openmetrics::render`].

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use super::openmetrics::{render, CONTENT_TYPE};
use crate::status::{DaemonStatus, DiskStatus};

/// Connections served at once; more are answered 503 and closed.
pub const MAX_CLIENTS: usize = 16;
/// A client has this long to send its request, and to take the answer.
const CLIENT_DEADLINE: Duration = Duration::from_secs(5);
/// Longest request head (request line and headers) read.
const MAX_HEAD: usize = 8 << 10;

/// `--metrics` / `[daemon] metrics`: `PORT` is `127.0.0.1:PORT`; any other
/// interface must be written out (`0.0.0.0:9100`, `[::]:9100`), so the
/// metrics never leave the host by default.
pub fn parse_addr(s: &str) -> std::result::Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    s.parse::<SocketAddr>().map_err(|_| {
        format!("invalid metrics address {s:?}: use PORT (on 127.0.0.1), IP:PORT or [IPV6]:PORT")
    })
}

/// Where `/metrics` gets the figures of each scrape.
pub type Source = Arc<dyn Fn() -> (DaemonStatus, Vec<DiskStatus>) + Send + Sync>;

/// The listening endpoint; stops accepting when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Binds `addr` (an error names it: in use, not an address of this
    /// host); serves nothing until [`MetricsServer::start`].
    pub fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr)> {
        let l = TcpListener::bind(addr)
            .with_context(|| format!("metrics address {addr} (--metrics, [daemon] metrics)"))?;
        let bound = l.local_addr().context("metrics socket")?;
        if !bound.ip().is_loopback() {
            log::warn!(
                "metrics on {bound}: not loopback, so anyone who can reach this host may read them"
            );
        }
        Ok((l, bound))
    }

    pub fn start(listener: TcpListener, source: Source) -> Result<MetricsServer> {
        let addr = listener.local_addr().context("metrics socket")?;
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn({
                let stop = stop.clone();
                move || accept_loop(listener, source, &stop)
            })
            .context("starting the metrics thread")?;
        log::info!("metrics on {}", url(addr));
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub fn url(&self) -> String {
        url(self.addr)
    }
}

/// `http://ADDR/metrics`.
pub fn url(addr: SocketAddr) -> String {
    format!("http://{addr}/metrics")
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        if TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok() {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}

fn accept_loop(listener: TcpListener, source: Source, stop: &AtomicBool) {
    let clients = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            return;
        }
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                // Out of descriptors and the like: the next accept may work.
                log::warn!("metrics: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let _ = conn.set_write_timeout(Some(CLIENT_DEADLINE));
        if clients.fetch_add(1, Ordering::SeqCst) >= MAX_CLIENTS {
            clients.fetch_sub(1, Ordering::SeqCst);
            let _ = answer(
                &mut conn,
                "503 Service Unavailable",
                "text/plain",
                b"busy\n",
                true,
            );
            continue;
        }
        let (source, guard) = (source.clone(), ClientSlot(clients.clone()));
        let spawned = std::thread::Builder::new()
            .name("metrics-client".into())
            .spawn(move || {
                let _guard = guard;
                if let Err(e) = serve_client(&mut conn, &source) {
                    log::debug!("metrics client {:?}: {e}", conn.peer_addr().ok());
                }
            });
        if let Err(e) = spawned {
            log::warn!("metrics: no thread for a client: {e}");
        }
    }
}

/// One of the [`MAX_CLIENTS`] slots, given back on drop.
struct ClientSlot(Arc<AtomicUsize>);

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Reads one request head and answers it.
fn serve_client(conn: &mut TcpStream, source: &Source) -> std::io::Result<()> {
    let deadline = Instant::now() + CLIENT_DEADLINE;
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return answer(
                conn,
                "408 Request Timeout",
                "text/plain",
                b"too slow\n",
                true,
            );
        }
        conn.set_read_timeout(Some(left))?;
        let n = match conn.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return answer(
                    conn,
                    "408 Request Timeout",
                    "text/plain",
                    b"too slow\n",
                    true,
                )
            }
            Err(e) => return Err(e),
        };
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_HEAD {
            let body = b"request head too large\n";
            return answer(
                conn,
                "431 Request Header Fields Too Large",
                "text/plain",
                body,
                true,
            );
        }
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.trim_end().split(' ');
    let (method, target, version) = (parts.next(), parts.next(), parts.next());
    let (Some(method), Some(target), Some(version), None) = (method, target, version, parts.next())
    else {
        return answer(
            conn,
            "400 Bad Request",
            "text/plain",
            b"bad request line\n",
            true,
        );
    };
    if !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return answer(
            conn,
            "400 Bad Request",
            "text/plain",
            b"bad request line\n",
            true,
        );
    }
    let with_body = match method {
        "GET" => true,
        "HEAD" => false,
        _ => {
            let body = b"only GET and HEAD\n";
            return answer_with(
                conn,
                "405 Method Not Allowed",
                "text/plain",
                body,
                true,
                "Allow: GET, HEAD\r\n",
            );
        }
    };
    let path = target.split('?').next().unwrap_or(target);
    match path {
        "/metrics" => {
            let (daemon, disks) = source();
            let body = render(&daemon, &disks);
            answer(conn, "200 OK", CONTENT_TYPE, body.as_bytes(), with_body)
        }
        "/" => answer(
            conn,
            "200 OK",
            "text/html; charset=utf-8",
            INDEX.as_bytes(),
            with_body,
        ),
        _ => answer(
            conn,
            "404 Not Found",
            "text/plain",
            b"not found: try /metrics\n",
            with_body,
        ),
    }
}

const INDEX: &str = "<!DOCTYPE html>\n<html><head><title>ramd</title></head><body>\n\
<h1>ramd</h1>\n<p><a href=\"/metrics\">/metrics</a>: every disk's figures for Prometheus.</p>\n\
</body></html>\n";

fn answer(
    conn: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
    with_body: bool,
) -> std::io::Result<()> {
    answer_with(conn, status, content_type, body, with_body, "")
}

fn answer_with(
    conn: &mut TcpStream,
    status: &str,
    content_type: &str,
    body: &[u8],
    with_body: bool,
    extra: &str,
) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n{extra}\r\n",
        body.len()
    );
    let mut out = head.into_bytes();
    if with_body {
        out.extend_from_slice(body);
    }
    conn.write_all(&out)?;
    conn.flush()?;
    let _ = conn.shutdown(std::net::Shutdown::Write);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(parse_addr("9100"), Ok("127.0.0.1:9100".parse().unwrap()));
        assert_eq!(
            parse_addr("0.0.0.0:9100"),
            Ok("0.0.0.0:9100".parse().unwrap())
        );
        assert_eq!(parse_addr("[::1]:0"), Ok("[::1]:0".parse().unwrap()));
        for bad in [
            "",
            "localhost:9100",
            "9100000",
            "1.2.3.4",
            "tcp:9100",
            ":9100",
        ] {
            let e = parse_addr(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{e}");
        }
    }
}
