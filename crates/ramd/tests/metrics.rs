//! The Prometheus endpoint: scraped with curl, parsed with the Prometheus
//! project's Python client (Debian's python3-prometheus-client), compared
//! with `ramd status --json`, its histograms growing with I/O done through
//! NBD (qemu-io) and FUSE (dd, fallocate); and its bad inputs: an address
//! in use, a malformed one, the loopback default, hostile HTTP clients.

mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// A python3 that can `import prometheus_client` (the distribution's,
/// which scripts/install-test-tools installs, before one from PATH).
fn python_prometheus() -> &'static Path {
    static PY: OnceLock<PathBuf> = OnceLock::new();
    PY.get_or_init(|| {
        for cand in ["/usr/bin/python3", "python3"] {
            let ok = Command::new(cand)
                .args(["-c", "import prometheus_client"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return PathBuf::from(cand);
            }
        }
        panic!(
            "no python3 can `import prometheus_client`; install python3-prometheus-client \
             (scripts/install-test-tools)"
        );
    })
}

/// Parses a scrape with both of the Python client's parsers: the
/// OpenMetrics one (strict; the format `/metrics` declares) gives the
/// families, and the classic text-format one must accept it too.
const PARSE: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families as om
from prometheus_client.parser import text_string_to_metric_families as classic
text = open(sys.argv[1]).read()
classic_names = [f.name for f in classic(text)]
out = {}
for f in om(text):
    out[f.name] = {"type": f.type, "unit": f.unit,
                   "samples": [[s.name, s.labels, s.value] for s in f.samples]}
print(json.dumps({"families": out, "classic": classic_names}))
"#;

/// One scrape, parsed: family name -> (type, samples).
struct Scrape {
    families: BTreeMap<String, Value>,
}

impl Scrape {
    fn take(url: &str) -> Scrape {
        let dir = scratch();
        let file = dir.path().join("scrape");
        let (code, ctype) = curl_to(url, &file);
        assert_eq!(code, "200", "GET {url}");
        assert!(
            ctype.starts_with("application/openmetrics-text"),
            "content type {ctype:?}"
        );
        let out = run_ok(
            Command::new(python_prometheus())
                .args(["-c", PARSE])
                .arg(&file),
        );
        let v: Value = serde_json::from_str(&out).expect("the parser's JSON");
        let classic = v["classic"].as_array().unwrap();
        assert!(
            classic.iter().any(|n| n == "ramd_disk_size_bytes"),
            "the text-format parser read {classic:?}"
        );
        let families = v["families"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        Scrape { families }
    }

    fn family(&self, name: &str) -> &Value {
        self.families.get(name).unwrap_or_else(|| {
            panic!(
                "no family {name} in the scrape; families: {:?}",
                self.families.keys().collect::<Vec<_>>()
            )
        })
    }

    /// The value of the sample `sample` of family `family` whose labels
    /// include all of `labels`; panics unless exactly one matches.
    fn value(&self, family: &str, sample: &str, labels: &[(&str, &str)]) -> f64 {
        let hits: Vec<f64> = self.family(family)["samples"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|s| s[0] == sample && labels.iter().all(|(k, v)| s[1][*k] == *v))
            .map(|s| s[2].as_f64().unwrap())
            .collect();
        assert_eq!(
            hits.len(),
            1,
            "{sample}{labels:?}: {} samples in {}",
            hits.len(),
            self.family(family)
        );
        hits[0]
    }

    fn disk(&self, family: &str, disk: &str) -> f64 {
        self.value(family, family, &[("disk", disk)])
    }

    /// `ramd_io_operations_total` etc. of one frontend and op.
    fn io(&self, family: &str, sample: &str, disk: &str, frontend: &str, op: &str) -> f64 {
        let l = [("disk", disk), ("frontend", frontend), ("op", op)];
        self.value(family, sample, &l)
    }

    fn requests(&self, disk: &str, frontend: &str, op: &str) -> f64 {
        let h = "ramd_request_duration_seconds";
        let count = self.io(h, &format!("{h}_count"), disk, frontend, op);
        let ops = "ramd_io_operations";
        assert_eq!(
            count,
            self.io(ops, &format!("{ops}_total"), disk, frontend, op),
            "histogram count and operations of {disk}/{frontend}/{op}"
        );
        // Buckets are cumulative and end with +Inf = count.
        let inf = [
            ("disk", disk),
            ("frontend", frontend),
            ("op", op),
            ("le", "+Inf"),
        ];
        assert_eq!(self.value(h, &format!("{h}_bucket"), &inf), count);
        count
    }

    fn bytes(&self, disk: &str, frontend: &str, op: &str) -> f64 {
        self.io("ramd_io_bytes", "ramd_io_bytes_total", disk, frontend, op)
    }
}

/// `curl URL -o FILE`: the status code and content type.
fn curl_to(url: &str, file: &Path) -> (String, String) {
    let out = run_ok(
        Command::new(require_tool("curl"))
            .args(["-sS", "--max-time", "60", "-o"])
            .arg(file)
            .args(["-w", "%{http_code} %{content_type}", url]),
    );
    let (code, ctype) = out.split_once(' ').unwrap_or((&out, ""));
    (code.to_string(), ctype.to_string())
}

/// `curl -X METHOD URL`: the status code.
fn curl_code(method: &str, url: &str) -> String {
    let dir = scratch();
    // HEAD as curl means it (-I): with -X HEAD it would wait for a body.
    let verb = if method == "HEAD" {
        vec!["-I"]
    } else {
        vec!["-X", method]
    };
    let out = run_ok(
        Command::new(require_tool("curl"))
            .args(["-sS", "--max-time", "60"])
            .args(verb)
            .arg("-o")
            .arg(dir.path().join("body"))
            .args(["-w", "%{http_code}", url]),
    );
    out.trim().to_string()
}

/// The metrics URL a daemon reports in `ramd status --json`.
fn metrics_url(status: &Value) -> String {
    let url = status["disks"][0]["metrics"]
        .as_str()
        .unwrap_or_else(|| panic!("no metrics URL in status: {status}"))
        .to_string();
    if let Some(daemons) = status["daemons"].as_array() {
        assert_eq!(daemons[0]["metrics"], url.as_str());
    }
    url
}

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("ramd.toml");
    fs::write(&p, text).unwrap();
    p
}

/// `dd` through the FUSE mount, bypassing the page cache so that every
/// block reaches ramd.
fn dd(args: &[&str]) {
    run_ok(&mut cmd("dd", args.iter().chain(&["status=none"])));
}

#[test]
fn scrape_matches_status_and_counts_nbd_and_fuse_requests() {
    require_tool("curl");
    require_tool("qemu-io");
    let rd = tempfile::Builder::new()
        .prefix("ramd-run.")
        .tempdir()
        .unwrap();
    let data = scratch();
    let mnt = data.path().join("mnt");
    let image = data.path().join("image");
    fs::create_dir(&mnt).unwrap();
    // The fs disk on the store path: its reads and writes are requests
    // (on the kernel path they never reach ramd).
    let config = write_config(
        data.path(),
        &format!(
            "[daemon]\nmetrics = \"127.0.0.1:0\"\nmax_memory = \"256M\"\n\n\
             [disk.blk]\nsize = \"64M\"\nimage = \"{}\"\n\n\
             [disk.files]\nkind = \"fs\"\nsize = \"64M\"\nmount = \"{}\"\n\
             data_path = \"store\"\n",
            image.display(),
            mnt.display()
        ),
    );
    let up = Up::start(rd.path(), &config);
    let url = metrics_url(&status_json(rd.path()));
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    let before = Scrape::take(&url);
    assert_eq!(before.value("ramd_disks", "ramd_disks", &[]), 2.0);
    assert_eq!(
        before.value(
            "ramd_daemon_max_memory_bytes",
            "ramd_daemon_max_memory_bytes",
            &[]
        ),
        (256 * MIB) as f64
    );
    assert!(
        before.value(
            "process_resident_memory_bytes",
            "process_resident_memory_bytes",
            &[]
        ) > 0.0
    );
    for (family, ty, unit) in [
        ("ramd_disk_size_bytes", "gauge", "bytes"),
        ("ramd_disk_memory_used_bytes", "gauge", "bytes"),
        ("ramd_disk_compression_ratio", "gauge", ""),
        ("ramd_disk_pages", "gauge", ""),
        ("ramd_disk_background_cpu_seconds", "counter", "seconds"),
        ("ramd_disk_connections", "gauge", ""),
        ("ramd_io_operations", "counter", ""),
        ("ramd_io_bytes", "counter", "bytes"),
        ("ramd_request_duration_seconds", "histogram", "seconds"),
    ] {
        let f = before.family(family);
        assert_eq!(
            (f["type"].as_str(), f["unit"].as_str()),
            (Some(ty), Some(unit)),
            "{family}"
        );
    }

    // NBD: 1 MiB written, read, trimmed, zeroed, flushed.
    let blk = up.uri("blk");
    qemu_io(
        &blk,
        &[
            "write -P 0xab 0 1M".into(),
            "read -P 0xab 0 1M".into(),
            "discard 0 256k".into(),
            "write -z 1M 256k".into(),
            "flush".into(),
        ],
    );
    // FUSE: 1 MiB written and read back around the page cache, a hole punched.
    let file = mnt.join("f");
    let of = format!("of={}", file.display());
    let iff = format!("if={}", file.display());
    dd(&["if=/dev/urandom", &of, "bs=64k", "count=16", "oflag=direct"]);
    dd(&[&iff, "of=/dev/null", "bs=64k", "iflag=direct"]);
    run_ok(cmd("fallocate", ["-p", "-o", "0", "-l", "64k"]).arg(&file));

    // Snapshot: the save figures appear.
    ramd_cmd(rd.path(), &["snapshot", "blk"]).ok();

    let after = Scrape::take(&url);
    let status = status_json(rd.path());
    for (op, bytes) in [
        ("write", MIB),
        ("read", MIB),
        ("trim", 256 * KIB),
        ("zero", 256 * KIB),
        ("flush", 0),
    ] {
        let grew = after.requests("blk", "nbd", op) - before.requests("blk", "nbd", op);
        assert!(grew >= 1.0, "nbd {op}: {grew} more requests");
        let more = after.bytes("blk", "nbd", op) - before.bytes("blk", "nbd", op);
        assert!(
            more >= bytes as f64,
            "nbd {op}: {more} more bytes, wanted {bytes}"
        );
    }
    for (op, bytes) in [("write", MIB), ("read", MIB), ("trim", 64 * KIB)] {
        let grew = after.requests("files", "fuse", op) - before.requests("files", "fuse", op);
        assert!(grew >= 1.0, "fuse {op}: {grew} more requests");
        let more = after.bytes("files", "fuse", op) - before.bytes("files", "fuse", op);
        assert!(
            more >= bytes as f64,
            "fuse {op}: {more} more bytes, wanted {bytes}"
        );
    }

    // The same figures as `ramd status --json`: nothing changes the disks
    // between the two readings (no compression, so no background work).
    for name in ["blk", "files"] {
        let d = disk_entry(&status, name).unwrap();
        for (family, key) in [
            ("ramd_disk_size_bytes", "size"),
            ("ramd_disk_used_bytes", "used_bytes"),
            ("ramd_disk_data_bytes", "data_bytes"),
            ("ramd_disk_memory_used_bytes", "memory_used"),
            ("ramd_disk_max_memory_bytes", "max_memory"),
        ] {
            assert_eq!(
                after.disk(family, name),
                field(d, key) as f64,
                "{name} {family}"
            );
        }
        let ratio = d["ratio"].as_f64().unwrap();
        assert!((after.disk("ramd_disk_compression_ratio", name) - ratio).abs() < 1e-9);
        let zero = after.value(
            "ramd_disk_pages",
            "ramd_disk_pages",
            &[("disk", name), ("state", "zero")],
        );
        assert_eq!(zero, field(d, "zero_pages") as f64, "{name} zero pages");
        let hot = after.value(
            "ramd_disk_pages",
            "ramd_disk_pages",
            &[("disk", name), ("state", "hot")],
        );
        assert_eq!(hot, field(d, "hot_pages") as f64, "{name} hot pages");
        // Per NUMA node: a series for every node status names (the counts
        // are the kernel's, read at each request, so only presence is fixed).
        for node in d["pages_per_node"].as_object().unwrap().keys() {
            let l = [("disk", name), ("node", node.as_str())];
            assert!(after.value("ramd_disk_node_pages", "ramd_disk_node_pages", &l) >= 0.0);
        }
        for io in d["io"].as_array().unwrap() {
            let frontend = io["frontend"].as_str().unwrap();
            for o in io["ops"].as_array().unwrap() {
                let op = o["op"].as_str().unwrap();
                assert_eq!(after.requests(name, frontend, op), field(o, "count") as f64);
                assert_eq!(after.bytes(name, frontend, op), field(o, "bytes") as f64);
            }
        }
    }
    // The pattern written fills pages with one byte: same-filled pages.
    let fill = field(disk_entry(&status, "blk").unwrap(), "fill_pages");
    assert_eq!(fill, (MIB - 256 * KIB) / PAGE);
    let l = [("disk", "blk"), ("state", "fill")];
    assert_eq!(
        after.value("ramd_disk_pages", "ramd_disk_pages", &l),
        fill as f64
    );
    // Saves: one, none failed, its age and length there.
    let saves = after.value(
        "ramd_disk_saves",
        "ramd_disk_saves_total",
        &[("disk", "blk")],
    );
    assert_eq!(saves, 1.0);
    let failures = after.value(
        "ramd_disk_save_failures",
        "ramd_disk_save_failures_total",
        &[("disk", "blk")],
    );
    assert_eq!(failures, 0.0);
    assert!(after.disk("ramd_disk_last_save_age_seconds", "blk") >= 0.0);
    assert!(after.disk("ramd_disk_last_save_duration_seconds", "blk") >= 0.0);
    // A disk without an image has no save figures.
    assert!(!after.family("ramd_disk_saves")["samples"]
        .as_array()
        .unwrap()
        .iter()
        .any(|s| s[1]["disk"] == "files"));
    drop(up);
}

/// A bare port listens on loopback only; another interface is used only
/// when written out. A busy or malformed address stops the daemon before
/// any disk exists.
#[test]
fn metrics_addresses_default_to_loopback_and_bad_ones_start_nothing() {
    require_tool("curl");
    // `--metrics 0`: a free port on 127.0.0.1.
    let d = Ramd::start(&["--size", "16M", "--metrics", "0"]);
    let url = metrics_url(&status_json(d.run_dir()));
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert_eq!(curl_code("GET", &url), "200");
    drop(d);
    // Written out, another interface is used (and a warning logged).
    let d = Ramd::start(&["--size", "16M", "--metrics", "0.0.0.0:0"]);
    let url = metrics_url(&status_json(d.run_dir()));
    let port = url
        .strip_prefix("http://0.0.0.0:")
        .unwrap_or_else(|| panic!("{url}"));
    assert_eq!(curl_code("GET", &format!("http://127.0.0.1:{port}")), "200");
    assert!(d.stderr().contains("not loopback"), "{}", d.stderr());
    drop(d);

    // In use: refused, naming the address; no disk started (its mount
    // point stays unmounted, its run dir holds no socket).
    let busy = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let data = scratch();
    let mnt = data.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let rd = tempfile::Builder::new()
        .prefix("ramd-run.")
        .tempdir()
        .unwrap();
    let args = [
        "--size",
        "16M",
        "--mount",
        mnt.to_str().unwrap(),
        "--metrics",
        &addr,
    ];
    let Err((status, stderr)) = Ramd::try_start_in(rd.path(), &args) else {
        panic!("ramd served with its metrics address in use");
    };
    assert!(status.contains("exited"), "{status}");
    assert!(
        stderr.contains(&format!("metrics address {addr}")),
        "{stderr}"
    );
    assert!(stderr.contains("in use"), "{stderr}");
    assert_nothing_started(rd.path(), &mnt);

    // The same through `ramd up` and `[daemon] metrics`.
    let config = write_config(
        data.path(),
        &format!(
            "[daemon]\nmetrics = \"{addr}\"\n\n[disk.files]\nkind = \"fs\"\nsize = \"16M\"\n\
             mount = \"{}\"\n",
            mnt.display()
        ),
    );
    let Err((_, stderr)) = Up::try_start(rd.path(), &config, &[]) else {
        panic!("ramd up served with its metrics address in use");
    };
    assert!(
        stderr.contains(&format!("metrics address {addr}")),
        "{stderr}"
    );
    assert_nothing_started(rd.path(), &mnt);
    // `--metrics` wins over the file.
    let up = Up::start_with(rd.path(), &config, &["--metrics", "0"]);
    assert!(metrics_url(&status_json(rd.path())).starts_with("http://127.0.0.1:"));
    drop(up);
    drop(busy);

    // Malformed: the flag's error and the file's (file, line, key).
    let out = ramd_cmd(
        rd.path(),
        &["serve", "--size", "16M", "--metrics", "localhost:9100"],
    )
    .failed();
    assert!(
        out.stderr
            .contains("invalid metrics address \"localhost:9100\""),
        "{}",
        out.stderr
    );
    let bad = write_config(
        data.path(),
        "[daemon]\nmetrics = \"9100000\"\n\n[disk.a]\nsize = \"16M\"\n",
    );
    let out = ramd_cmd(rd.path(), &["up", "-c", bad.to_str().unwrap()]).failed();
    assert!(
        out.stderr.contains(&format!(
            "{}:2: daemon.metrics: invalid metrics address",
            bad.display()
        )),
        "{}",
        out.stderr
    );
    assert_nothing_started(rd.path(), &mnt);
}

fn assert_nothing_started(run_dir: &Path, mnt: &Path) {
    let left: Vec<_> = fs::read_dir(run_dir)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "the run dir holds {left:?}");
    let mounts = fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(mnt.to_str().unwrap()),
        "{} is mounted",
        mnt.display()
    );
}

/// Sends `bytes` on a fresh connection and returns the answer's status line.
fn raw_request(addr: &str, bytes: &[u8]) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(CMD_TIMEOUT)).unwrap();
    s.write_all(bytes).unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.lines().next().unwrap_or_default().to_string()
}

/// Garbage, a client that never finishes its request, wrong methods and
/// paths: each gets its answer (or nothing), and scrapes go on.
#[test]
fn hostile_http_clients_do_not_hurt_the_next_scrape() {
    require_tool("curl");
    let d = Ramd::start(&["--size", "16M", "--metrics", "0"]);
    let url = metrics_url(&status_json(d.run_dir()));
    let addr = url
        .strip_prefix("http://")
        .and_then(|u| u.strip_suffix("/metrics"))
        .unwrap()
        .to_string();
    let base = format!("http://{addr}");

    // A client that sends half a request line and waits: scrapes are
    // served meanwhile (it has a thread of its own, and a deadline).
    let mut slow = TcpStream::connect(&addr).unwrap();
    slow.write_all(b"GET /met").unwrap();
    Scrape::take(&url);

    let garbage: &[&[u8]] = &[
        b"\x00\xff\xfe garbage\r\n\r\n",
        b"GET\r\n\r\n",
        b"GET /metrics\r\n\r\n",
        b"GET metrics HTTP/1.1\r\n\r\n",
        b"GET /metrics SPDY/9\r\n\r\n",
    ];
    for g in garbage {
        let line = raw_request(&addr, g);
        assert!(line.starts_with("HTTP/1.1 400"), "{g:?}: {line:?}");
    }
    // A head without end, larger than any request: refused.
    let mut huge = b"GET /metrics HTTP/1.1\r\nX-A: ".to_vec();
    huge.resize(64 << 10, b'a');
    let line = raw_request(&addr, &huge);
    assert!(line.starts_with("HTTP/1.1 431"), "{line:?}");
    // A client that connects and hangs up at once.
    drop(TcpStream::connect(&addr).unwrap());

    assert_eq!(curl_code("POST", &url), "405");
    assert_eq!(curl_code("DELETE", &base), "405");
    assert_eq!(curl_code("GET", &format!("{base}/nope")), "404");
    assert_eq!(curl_code("GET", &format!("{base}/metrics?x=1")), "200");
    assert_eq!(curl_code("HEAD", &url), "200");
    let dir = scratch();
    let (code, ctype) = curl_to(&format!("{base}/"), &dir.path().join("index"));
    assert_eq!(
        (code.as_str(), ctype.as_str()),
        ("200", "text/html; charset=utf-8")
    );
    let index = fs::read_to_string(dir.path().join("index")).unwrap();
    assert!(index.contains("href=\"/metrics\""), "{index}");

    // The slow client is still there, and a scrape still works.
    let s = Scrape::take(&url);
    assert_eq!(s.disk("ramd_disk_size_bytes", "ram0"), (16 * MIB) as f64);
    drop(slow);

    // A flood of idle clients: once 16 are held, a request gets 503 at
    // once (never a hang), and scrapes work again when they are gone.
    // (Earlier clients may hold a slot a moment after their answer, so the
    // flood grows until a probe is refused, rather than counting to 16.)
    let mut flood = Vec::new();
    let refused = (0..64).any(|_| {
        flood.push(TcpStream::connect(&addr).unwrap());
        raw_request(&addr, b"GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 503")
    });
    assert!(refused, "64 idle clients and no 503");
    drop(flood);
    wait_until(STOP_DEADLINE, "a scrape after the flood", || {
        curl_code("GET", &url) == "200"
    });
}
