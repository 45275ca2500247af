//! The Prometheus endpoint (`[daemon] metrics = "ADDR"`, `--metrics ADDR`):
//! `GET /metrics` renders the daemon's [`DaemonStatus`] and each disk's
//! [`DiskStatus`] — the same values `ramd status --json` prints — in the
//! OpenMetrics text format, through the Prometheus project's own
//! `prometheus-client` crate (names, units, `_total`, histogram buckets,
//! `# EOF`). Nothing is counted twice: a scrape reads the status structs.
//!
//! The HTTP side is a small HTTP/1.1 responder: one request per connection
//! (`Connection: close`), a thread per connection up to [`MAX_CLIENTS`],
//! a deadline on reading the request and on writing the answer, and no
//! shared lock with the disks, so a slow or garbage client costs one thread
//! for a few seconds and never delays a scrape or the daemon.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use ramd_store::metrics::{bucket_bound_ns, BUCKETS};

use crate::status::{DaemonStatus, DiskStatus};

/// Connections served at once; more are answered 503 and closed.
pub const MAX_CLIENTS: usize = 16;
/// A client has this long to send its request, and to take the answer.
const CLIENT_DEADLINE: Duration = Duration::from_secs(5);
/// Longest request head (request line and headers) read.
const MAX_HEAD: usize = 8 << 10;
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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

/// The OpenMetrics text of one scrape.
pub fn render(daemon: &DaemonStatus, disks: &[DiskStatus]) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Scrape {
        daemon: daemon.clone(),
        disks: disks.to_vec(),
    }));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)
        .expect("writing to a String does not fail");
    out
}

#[derive(Debug)]
struct Scrape {
    daemon: DaemonStatus,
    disks: Vec<DiskStatus>,
}

/// A sample's labels. (Disk names are `[A-Za-z0-9._-]`, checked by
/// `args::parse_name`: nothing in a label value needs escaping.)
type Labels = Vec<(&'static str, String)>;

fn disk_labels(d: &DiskStatus) -> Labels {
    vec![("disk", d.name.clone()), ("kind", d.kind.clone())]
}

fn with(mut l: Labels, key: &'static str, value: &str) -> Labels {
    l.push((key, value.to_string()));
    l
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

type Fmt = std::fmt::Result;
/// A figure read from a disk's status.
type Field = fn(&DiskStatus) -> u64;

fn gauge<V: EncodeGaugeValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    rows: Vec<(Labels, V)>,
) -> Fmt {
    if rows.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), MetricType::Gauge)?;
    for (labels, v) in &rows {
        if labels.is_empty() {
            m.encode_gauge(v)?;
        } else {
            m.encode_family(labels)?.encode_gauge(v)?;
        }
    }
    Ok(())
}

/// A counter (`_total` is added to `name`).
fn counter<V: EncodeCounterValue>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<Unit>,
    rows: Vec<(Labels, V)>,
) -> Fmt {
    if rows.is_empty() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, unit.as_ref(), MetricType::Counter)?;
    for (labels, v) in &rows {
        m.encode_family(labels)?
            .encode_counter::<NoLabelSet, V, f64>(v, None)?;
    }
    Ok(())
}

impl prometheus_client::collector::Collector for Scrape {
    fn encode(&self, mut enc: DescriptorEncoder) -> Fmt {
        let d = &self.daemon;
        let e = &mut enc;
        gauge(
            e,
            "ramd_disks",
            "Disks the daemon serves.",
            None,
            vec![(vec![], d.disks.len() as u64)],
        )?;
        gauge(
            e,
            "process_resident_memory",
            "Resident memory of the ramd process (VmRSS).",
            Some(Unit::Bytes),
            vec![(vec![], d.process.resident_bytes)],
        )?;
        gauge(
            e,
            "ramd_daemon_memory_used",
            "Memory its disks use together (pages, slack, metadata).",
            Some(Unit::Bytes),
            vec![(vec![], d.memory_used)],
        )?;
        gauge(
            e,
            "ramd_daemon_max_memory",
            "The budget every disk draws from ([daemon] max_memory), if set.",
            Some(Unit::Bytes),
            d.max_memory.map(|m| (vec![], m)).into_iter().collect(),
        )?;
        gauge(
            e,
            "ramd_daemon_host_reserve",
            "Host memory ramd leaves free: new pages get ENOSPC below it.",
            Some(Unit::Bytes),
            vec![(vec![], d.host_reserve)],
        )?;

        let disks = &self.disks;
        let per_disk = |f: &dyn Fn(&DiskStatus) -> u64| -> Vec<(Labels, u64)> {
            disks.iter().map(|s| (disk_labels(s), f(s))).collect()
        };
        let bytes: [(&str, &str, Field); 9] = [
            (
                "ramd_disk_size",
                "Capacity (a filesystem's size; 0 if unlimited).",
                |s| s.store.size,
            ),
            (
                "ramd_disk_max_memory",
                "Most memory the disk may use.",
                |s| s.store.max_memory,
            ),
            (
                "ramd_disk_used",
                "Bytes of the disk that are not holes.",
                |s| s.store.used_bytes,
            ),
            (
                "ramd_disk_data",
                "What the data pages hold, before compression.",
                |s| s.store.data_bytes,
            ),
            (
                "ramd_disk_stored",
                "What the data pages take stored (raw or compressed).",
                |s| s.store.stored_bytes,
            ),
            (
                "ramd_disk_memory_used",
                "Memory used: pages, allocator slack, metadata.",
                |s| s.store.memory_used,
            ),
            (
                "ramd_disk_slack",
                "Compressed-allocator memory not holding data.",
                |s| s.store.slack_bytes,
            ),
            (
                "ramd_disk_metadata",
                "Page tables and frontends' metadata.",
                |s| s.store.metadata_bytes,
            ),
            (
                "ramd_disk_kept",
                "Old page copies a save under way still needs.",
                |s| s.store.kept_bytes,
            ),
        ];
        for (name, help, f) in bytes {
            gauge(e, name, help, Some(Unit::Bytes), per_disk(&f))?;
        }
        gauge(
            e,
            "ramd_disk_compression_ratio",
            "data / memory_used (1 when nothing is stored).",
            None,
            disks
                .iter()
                .map(|s| (disk_labels(s), s.store.ratio))
                .collect(),
        )?;
        let kinds: [(&str, Field); 6] = [
            ("zero", |s| s.store.zero_pages),
            ("fill", |s| s.store.fill_pages),
            ("hot", |s| s.store.hot_pages),
            ("incompressible", |s| s.store.incompressible_pages),
            ("compressed", |s| s.store.compressed_pages),
            ("frame", |s| s.store.frame_pages),
        ];
        gauge(
            e,
            "ramd_disk_pages",
            "Pages by how they are stored: zero and fill take no page memory, hot and \
             incompressible are raw, compressed one by one, or packed in frames.",
            None,
            disks
                .iter()
                .flat_map(|s| {
                    kinds
                        .iter()
                        .map(|(k, f)| (with(disk_labels(s), "state", k), f(s)))
                })
                .collect(),
        )?;
        gauge(
            e,
            "ramd_disk_node_pages",
            "Resident page memory (pages in use and warm) per NUMA node, in 4 KiB \
             pages, as the kernel's move_pages answers (sampled on large disks).",
            None,
            disks
                .iter()
                .flat_map(|s| {
                    s.pages_per_node
                        .iter()
                        .map(|(n, p)| (with(disk_labels(s), "node", &n.to_string()), *p))
                })
                .collect(),
        )?;
        gauge(
            e,
            "ramd_disk_idle_pages",
            "Pages untouched for idle_after, as of the last background pass.",
            None,
            per_disk(&|s| s.store.idle_pages),
        )?;
        counter(
            e,
            "ramd_disk_background_cpu",
            "CPU time of the background threads (scanning, compressing, compacting) for this disk.",
            Some(Unit::Seconds),
            disks
                .iter()
                .map(|s| (disk_labels(s), secs(s.store.background_cpu_ns)))
                .collect(),
        )?;
        counter(
            e,
            "ramd_disk_compress",
            "Time spent in the codec compressing, over all threads.",
            Some(Unit::Seconds),
            disks
                .iter()
                .map(|s| (disk_labels(s), secs(s.store.compress_time_ns)))
                .collect(),
        )?;
        counter(
            e,
            "ramd_disk_decompress",
            "Time spent in the codec decompressing, over all threads.",
            Some(Unit::Seconds),
            disks
                .iter()
                .map(|s| (disk_labels(s), secs(s.store.decompress_time_ns)))
                .collect(),
        )?;
        gauge(
            e,
            "ramd_disk_inodes",
            "Filesystem disks: inodes in use.",
            None,
            disks
                .iter()
                .filter_map(|s| Some((disk_labels(s), s.fs?.inodes)))
                .collect(),
        )?;
        gauge(
            e,
            "ramd_disk_cold_files",
            "Filesystem disks with --data-path kernel --compress: files in the cold tier.",
            None,
            disks
                .iter()
                .filter_map(|s| Some((disk_labels(s), s.fs?.cold?.files)))
                .collect(),
        )?;
        gauge(
            e,
            "ramd_disk_cold_data",
            "Filesystem disks with --data-path kernel --compress: bytes of the cold tier's \
             files' pages, uncompressed.",
            Some(Unit::Bytes),
            disks
                .iter()
                .filter_map(|s| Some((disk_labels(s), s.fs?.cold?.data_bytes)))
                .collect(),
        )?;
        gauge(
            e,
            "ramd_disk_cold_memory",
            "Filesystem disks with --data-path kernel --compress: memory the cold tier takes \
             (compressed pages, allocator slack, page tables).",
            Some(Unit::Bytes),
            disks
                .iter()
                .filter_map(|s| Some((disk_labels(s), s.fs?.cold?.memory_bytes)))
                .collect(),
        )?;
        gauge(
            e,
            "ramd_disk_max_inodes",
            "Filesystem disks: most inodes (nr_inodes).",
            None,
            disks
                .iter()
                .filter_map(|s| Some((disk_labels(s), s.fs?.max_inodes)))
                .collect(),
        )?;

        // Connections per protocol (an NBD disk on a socket and TCP: both in `nbd`).
        let mut conns: Vec<(Labels, u64)> = Vec::new();
        for s in disks {
            for f in &s.frontends {
                let Some(n) = f.connections else { continue };
                let labels = with(disk_labels(s), "frontend", &f.protocol);
                match conns.iter_mut().find(|(l, _)| *l == labels) {
                    Some((_, v)) => *v += n,
                    None => conns.push((labels, n)),
                }
            }
        }
        gauge(
            e,
            "ramd_disk_connections",
            "Clients connected, per frontend.",
            None,
            conns,
        )?;

        // Saves: disks with an image only.
        let imaged: Vec<&DiskStatus> = disks.iter().filter(|s| s.persist.image.is_some()).collect();
        counter(
            e,
            "ramd_disk_saves",
            "Saves to the image that succeeded (this process).",
            None,
            imaged
                .iter()
                .map(|s| (disk_labels(s), s.persist.saves))
                .collect(),
        )?;
        counter(
            e,
            "ramd_disk_save_failures",
            "Saves to the image that failed (this process).",
            None,
            imaged
                .iter()
                .map(|s| (disk_labels(s), s.persist.save_failures))
                .collect(),
        )?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let last: Vec<(&DiskStatus, &ramd_store::persist::SaveReport)> = imaged
            .iter()
            .filter_map(|s| Some((*s, s.persist.last_save.as_ref()?)))
            .collect();
        gauge(
            e,
            "ramd_disk_last_save_timestamp",
            "When the last good save finished (Unix time).",
            Some(Unit::Seconds),
            last.iter()
                .map(|(s, r)| (disk_labels(s), r.unix_time))
                .collect(),
        )?;
        gauge(
            e,
            "ramd_disk_last_save_age",
            "Time since the last good save.",
            Some(Unit::Seconds),
            last.iter()
                .map(|(s, r)| (disk_labels(s), now.saturating_sub(r.unix_time)))
                .collect(),
        )?;
        gauge(
            e,
            "ramd_disk_last_save_duration",
            "How long the last good save took.",
            Some(Unit::Seconds),
            last.iter()
                .map(|(s, r)| (disk_labels(s), r.seconds))
                .collect(),
        )?;
        gauge(
            e,
            "ramd_disk_last_save_written",
            "Bytes the last good save wrote to the image.",
            Some(Unit::Bytes),
            last.iter()
                .map(|(s, r)| (disk_labels(s), r.bytes))
                .collect(),
        )?;
        // `--replicate`: how far the replica lags, what went up. Its URL
        // is left out of the labels: status names it.
        let replicas: Vec<(&DiskStatus, &ramd_store::persist::ReplicaStatus)> = imaged
            .iter()
            .filter_map(|s| Some((*s, s.persist.replica.as_ref()?)))
            .collect();
        gauge(
            e,
            "ramd_disk_replica_saves_behind",
            "Saves committed to the local image that its replica lacks.",
            None,
            replicas
                .iter()
                .map(|(s, r)| (disk_labels(s), r.saves_behind))
                .collect(),
        )?;
        counter(
            e,
            "ramd_disk_replica_uploaded",
            "Bytes uploaded to the replica (this process).",
            Some(Unit::Bytes),
            replicas
                .iter()
                .map(|(s, r)| (disk_labels(s), r.bytes_uploaded))
                .collect(),
        )?;
        gauge(
            e,
            "ramd_disk_replica_failing",
            "1 while shipping saves to the replica fails.",
            None,
            replicas
                .iter()
                .map(|(s, r)| (disk_labels(s), r.last_error.is_some() as u64))
                .collect(),
        )?;

        // Requests, per frontend and operation.
        let mut ops = Vec::new();
        for s in disks {
            for f in &s.io {
                for o in &f.ops {
                    let l = with(with(disk_labels(s), "frontend", &f.frontend), "op", &o.op);
                    ops.push((l, o));
                }
            }
        }
        counter(
            e,
            "ramd_io_operations",
            "Requests served, per frontend and operation (errors included).",
            None,
            ops.iter().map(|(l, o)| (l.clone(), o.count)).collect(),
        )?;
        counter(
            e,
            "ramd_io",
            "Bytes of the requests that succeeded (their length; 0 for flushes).",
            Some(Unit::Bytes),
            ops.iter().map(|(l, o)| (l.clone(), o.bytes)).collect(),
        )?;
        counter(
            e,
            "ramd_io_errors",
            "Requests answered with an error.",
            None,
            ops.iter().map(|(l, o)| (l.clone(), o.errors)).collect(),
        )?;
        if !ops.is_empty() {
            let mut m = e.encode_descriptor(
                "ramd_request_duration",
                "Time to serve a request, from the frontend having it to its reply being ready.",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for (labels, o) in &ops {
                let buckets: Vec<(f64, u64)> = (0..BUCKETS)
                    .map(|i| {
                        let hi = bucket_bound_ns(i).map_or(f64::MAX, secs);
                        (hi, o.latency_buckets.get(i).copied().unwrap_or(0))
                    })
                    .collect();
                let count = buckets.iter().map(|(_, n)| n).sum();
                m.encode_family(labels)?.encode_histogram::<NoLabelSet>(
                    secs(o.latency_sum_ns),
                    count,
                    &buckets,
                    None,
                )?;
            }
        }
        Ok(())
    }
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
