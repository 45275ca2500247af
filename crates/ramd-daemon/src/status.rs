//! What `ramd status` shows, as types: one [`DiskStatus`] per disk and one
//! [`DaemonStatus`] per `ramd up` daemon. The control socket sends them as
//! JSON (serde), `ramd status --json` prints them, and [`table`] renders the
//! same values: every view reads the same fields.

use serde::{Deserialize, Serialize};

use ramd_fs::FsStats;
use ramd_store::{ProcessMemory, StoreStats};

use crate::frontend::FrontendStatus;
use ramd_store::human;
use ramd_store::metrics::FrontendIo;
use ramd_store::persist::PersistStatus;

/// One disk.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DiskStatus {
    pub name: String,
    /// `block` or `fs`.
    pub kind: String,
    /// The disk's identity (a UUID, kept in its image; a disk without one
    /// gets a new one at each start): its iSCSI NAA and serial, its NBD
    /// description. Empty from a daemon older than identities.
    #[serde(default)]
    pub id: String,
    /// The process serving it.
    pub pid: u32,
    /// Where clients reach it first: an NBD URI, a mount point.
    pub uri: String,
    /// Every frontend serving it, with where it is reached.
    pub frontends: Vec<FrontendStatus>,
    /// Clients connected, over every frontend that has connections.
    pub connections: Option<u64>,
    pub read_only: bool,
    /// Filesystem disks: the mount point.
    pub mount: Option<String>,
    /// Filesystem disks: where file data lives, `kernel` (a private
    /// kernel tmpfs, FUSE passthrough) or `store` (`--data-path`, auto
    /// resolved).
    #[serde(default)]
    pub data_path: Option<String>,
    /// Filesystem disks: `size = "unlimited"` (ramfs mode).
    pub unlimited: bool,
    /// Filesystem disks: the most pages the disk may hold.
    pub page_limit: Option<u64>,
    /// Its daemon's Prometheus endpoint (`--metrics`), if it has one.
    #[serde(default)]
    pub metrics: Option<String>,
    /// Capacity and memory (for a filesystem, `size` is its capacity and
    /// `used_bytes` what its files' pages take).
    #[serde(flatten)]
    pub store: StoreStats,
    #[serde(flatten)]
    pub fs: Option<FsStats>,
    #[serde(flatten)]
    pub persist: PersistStatus,
    /// Requests served, per frontend (protocol) and operation, with their
    /// latency histograms.
    #[serde(default)]
    pub io: Vec<FrontendIo>,
    /// The serving process's resident memory and where it goes (shared by
    /// every disk of a `ramd up` daemon: this disk's own part is
    /// `memory_used` + `pool.warm_bytes`).
    #[serde(default)]
    pub process: ProcessMemory,
    /// Its resident page memory (pages in use and warm) per NUMA node, in
    /// 4 KiB pages, as the kernel answers `move_pages`: not bookkeeping.
    #[serde(default)]
    pub pages_per_node: std::collections::BTreeMap<u32, u64>,
    /// 1: every page of the disk was asked about; n: every n-th (large
    /// disks), and the counts are scaled by n.
    #[serde(default)]
    pub pages_per_node_sample: u64,
    /// The most memory the disk could hold now (`max_memory`, or less when
    /// the daemon's budget or the host's reserve leaves less room), and
    /// which of them binds: `max_memory`, `daemon` or `host`.
    #[serde(default)]
    pub memory_limit: u64,
    #[serde(default)]
    pub memory_limit_by: String,
    /// --numa-nodes and --numa-policy, if given.
    #[serde(default)]
    pub numa_nodes: Option<String>,
    #[serde(default)]
    pub numa_policy: Option<String>,
    /// Why the disk is not stopping although asked to: its save failed
    /// (it serves on, or holds its data until a save succeeds).
    #[serde(default)]
    pub blocked: Option<String>,
    /// It was asked to stop (and was not refused): it is saving and going
    /// away; the table leaves it out unless `blocked`.
    #[serde(default)]
    pub stopping: bool,
}

/// A daemon started by `ramd up`: what its disks share.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DaemonStatus {
    pub pid: u32,
    /// The config file it was started (or last reloaded) from.
    pub config: Option<String>,
    pub disks: Vec<String>,
    /// The budget all its disks draw from (`[daemon] max_memory`), and
    /// what they use of it now.
    pub max_memory: Option<u64>,
    pub memory_used: u64,
    /// Memory the host keeps: new pages get ENOSPC below it.
    pub host_reserve: u64,
    /// Background threads shared by its disks.
    pub compress_threads: u16,
    /// Where its Prometheus endpoint is (`--metrics`), if it has one.
    #[serde(default)]
    pub metrics: Option<String>,
    /// Its resident memory and where it goes.
    #[serde(default)]
    pub process: ProcessMemory,
    /// Disks of its config file that could not start, and why (`ramd
    /// reload` tries them again).
    #[serde(default)]
    pub failed: std::collections::BTreeMap<String, String>,
}

/// What needs a person: disks that failed to start, disks whose save
/// failed. One line each, after the table; empty when all is well.
pub fn trouble_lines(disks: &[DiskStatus], daemons: &[DaemonStatus]) -> String {
    let mut out = String::new();
    for d in disks {
        if let Some(why) = &d.blocked {
            out.push_str(&format!("disk {}: {why}\n", d.name));
        }
    }
    for d in daemons {
        for (name, why) in &d.failed {
            out.push_str(&format!(
                "disk {name}: FAILED to start: {why} (fix it, then `ramd reload`)\n"
            ));
        }
    }
    out
}

/// The table's columns; numbers are right-aligned, the rest left.
const HEAD: [&str; 18] = [
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

/// Columns a narrow terminal goes without, least telling first: what a
/// glance at a disk needs (NAME, SIZE, USED, TOTAL, WHERE) stays last.
const DROP_ORDER: [&str; 13] = [
    "NODES",
    "SAME",
    "IDLE",
    "WARM",
    "INODES",
    "CONNS",
    "COMPR",
    "ALGORITHM",
    "DATA",
    "MAX-MEM",
    "RATIO",
    "KIND",
    "SAVED",
];

/// A zramctl-like table: DATA is what the disk's data pages hold, COMPR
/// what they take stored (compressed or raw), TOTAL the memory used with
/// slack and metadata, RATIO = DATA / TOTAL; then one line per process
/// serving them. Every column, whatever its width: for scripts and pipes.
pub fn table(disks: &[DiskStatus]) -> String {
    fitted(disks, &[], None)
}

/// The table and the lines of `daemons`, in at most `width` columns if
/// given (a terminal's): the least telling columns are left out until the
/// rows fit, then WHERE is cut short (`…`); no row is ever wrapped. The
/// process and daemon lines break between their parts instead.
pub fn fitted(disks: &[DiskStatus], daemons: &[DaemonStatus], width: Option<usize>) -> String {
    let mut rows = vec![HEAD.map(String::from).to_vec()];
    rows.extend(disks.iter().map(row));
    let chars = |s: &String| s.chars().count();
    let mut keep = [true; HEAD.len()];
    let col_widths = |rows: &[Vec<String>]| -> Vec<usize> {
        (0..HEAD.len())
            .map(|c| rows.iter().map(|r| chars(&r[c])).max().unwrap_or(0))
            .collect()
    };
    let mut widths = col_widths(&rows);
    let line_width = |keep: &[bool], widths: &[usize]| -> usize {
        let shown: Vec<usize> = (0..HEAD.len())
            .filter(|&c| keep[c])
            .map(|c| widths[c])
            .collect();
        shown.iter().sum::<usize>() + 2 * shown.len().saturating_sub(1)
    };
    if let Some(width) = width {
        for name in DROP_ORDER {
            if line_width(&keep, &widths) <= width {
                break;
            }
            keep[HEAD.iter().position(|h| *h == name).expect("a column")] = false;
        }
        let last = HEAD.len() - 1;
        let over = line_width(&keep, &widths).saturating_sub(width);
        if over > 0 {
            let room = widths[last].saturating_sub(over).max(1);
            for r in rows.iter_mut() {
                r[last] = cut(&r[last], room);
            }
            widths[last] = room;
        }
    }
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = (0..HEAD.len())
            .filter(|&c| keep[c])
            .map(|c| {
                let (v, w) = (&r[c], widths[c]);
                // Names and text left-aligned, numbers right-aligned.
                if c < 2 || c == 6 || c == HEAD.len() - 1 {
                    format!("{v:<w$}")
                } else {
                    format!("{v:>w$}")
                }
            })
            .collect();
        let line = line.join("  ");
        let line = line.trim_end();
        // Narrower than even the columns kept: cut, never wrapped.
        out.push_str(&width.map_or(line.to_string(), |w| cut(line, w)));
        out.push('\n');
    }
    let mut lines = String::new();
    // One line per process: disks of one daemon need not be next to each
    // other (a `serve` and an `up` in one run directory).
    let mut pids: Vec<u32> = Vec::new();
    for d in disks {
        if !pids.contains(&d.pid) {
            pids.push(d.pid);
            lines.push_str(&process_line(d.pid, &d.process));
        }
    }
    for d in disks {
        lines.push_str(&replica_line(d));
    }
    lines.push_str(&daemon_lines(daemons));
    for l in lines.lines() {
        match width {
            Some(w) => out.push_str(&wrap(l, w)),
            None => out.push_str(l),
        }
        out.push('\n');
    }
    out
}

/// One disk's cells, in `HEAD`'s order.
fn row(d: &DiskStatus) -> Vec<String> {
    let s = &d.store;
    let size = if d.unlimited {
        "unlimited".to_string()
    } else {
        human(s.size)
    };
    let algorithm = match s.recompress.as_str() {
        "none" => s.compress.clone(),
        r => format!("{}/{r}", s.compress),
    };
    let ratio = if s.data_bytes == 0 {
        "-".to_string()
    } else {
        format!("{:.2}", s.ratio)
    };
    // A field this kind of disk does not have shows as "-".
    let opt = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
    // A FUSE mount says how its requests travel.
    let endpoints: Vec<String> = d
        .frontends
        .iter()
        .map(|f| match f.transport.as_deref() {
            Some("dev") => format!("{} (/dev/fuse)", f.endpoint),
            Some(t) => format!("{} ({t})", f.endpoint),
            None => f.endpoint.clone(),
        })
        .collect();
    vec![
        d.name.clone(),
        d.kind.clone(),
        size,
        human(s.used_bytes),
        human(s.data_bytes),
        human(s.stored_bytes),
        algorithm,
        human(s.memory_used),
        human(s.pool.warm_bytes),
        ratio,
        match d.memory_limit_by.as_str() {
            "" | "max_memory" => human(s.max_memory),
            by => format!("{}({by})", human(d.memory_limit)),
        },
        (s.zero_pages + s.fill_pages).to_string(),
        s.idle_pages.to_string(),
        opt(d.fs.map(|f| f.inodes)),
        opt(d.connections),
        nodes(d),
        saved(&d.persist),
        if endpoints.is_empty() {
            d.uri.clone()
        } else {
            endpoints.join(" ")
        },
    ]
}

/// `s` in at most `width` characters, its end replaced by `…` if cut.
fn cut(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let mut t: String = s.chars().take(width.saturating_sub(1)).collect();
    t.push('…');
    t
}

/// `line` in lines of at most `width` characters, the later ones indented
/// by two, broken after its parts' separators (` = `, ` + `, `, `, `: `);
/// a part longer than a line is cut.
fn wrap(line: &str, width: usize) -> String {
    let mut parts: Vec<&str> = Vec::new();
    let mut rest = line;
    while let Some(at) = [" = ", " + ", ", ", ": "]
        .iter()
        .filter_map(|sep| rest.find(sep).map(|i| i + sep.len() - 1))
        .min()
    {
        parts.push(&rest[..at]);
        rest = &rest[at + 1..];
    }
    parts.push(rest);
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for part in parts {
        if cur.is_empty() {
            cur.push_str(part);
        } else if cur.chars().count() + 1 + part.chars().count() <= width {
            cur.push(' ');
            cur.push_str(part);
        } else {
            lines.push(std::mem::replace(&mut cur, format!("  {part}")));
        }
    }
    lines.push(cur);
    lines
        .iter()
        .map(|l| cut(l, width))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Where a process's resident memory goes, as one line.
pub fn process_line(pid: u32, m: &ProcessMemory) -> String {
    let signed = |v: i64| match v {
        v if v < 0 => format!("-{}", human(v.unsigned_abs())),
        v => human(v as u64),
    };
    format!(
        "process {pid}: resident {} = pages {} + warm {} + heap {} + heap free {} + program {} + other {}{}\n",
        human(m.resident_bytes),
        human(m.pages_bytes),
        human(m.warm_bytes),
        human(m.heap_bytes),
        human(m.heap_free_bytes),
        human(m.program_bytes),
        signed(m.other_bytes),
        match m.locked_bytes {
            0 => String::new(),
            n => format!("; locked {}", human(n)),
        }
    )
}

/// A disk's replica (`--replicate`) as one line: where, which save it
/// holds, how far behind, what was uploaded, and why it fails if it does;
/// empty without one.
pub fn replica_line(d: &DiskStatus) -> String {
    let Some(r) = &d.persist.replica else {
        return String::new();
    };
    let held = match (r.replicated_seq, r.replicated_at) {
        (Some(seq), Some(at)) => format!("save {seq}, replicated {}", ago(at)),
        (Some(seq), None) => format!("save {seq}"),
        _ => "no save yet".into(),
    };
    let failing = r
        .last_error
        .as_deref()
        .map_or(String::new(), |e| format!(", FAILING: {e}"));
    format!(
        "replica of {}: {}: {held}, {} save(s) behind, {} uploaded{failing}\n",
        d.name,
        r.url,
        r.saves_behind,
        human(r.bytes_uploaded)
    )
}

/// How long ago `unix` (seconds since the epoch) was, in short.
fn ago(unix: u64) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    match now.saturating_sub(unix) {
        age @ 0..=99 => format!("{age}s ago"),
        age @ 100..=5999 => format!("{}m ago", age / 60),
        age => format!("{}h ago", age / 3600),
    }
}

/// One line per daemon of `ramd up`: its shared budget.
pub fn daemon_lines(daemons: &[DaemonStatus]) -> String {
    let mut out = String::new();
    for d in daemons {
        out.push_str(&format!(
            "daemon {}{}: {} disk(s), memory {} of {}, host reserve {}, {} background thread(s){}\n",
            d.pid,
            d.config
                .as_deref()
                .map_or(String::new(), |c| format!(" ({c})")),
            d.disks.len(),
            human(d.memory_used),
            d.max_memory.map_or("no daemon budget".into(), human),
            human(d.host_reserve),
            d.compress_threads,
            d.metrics
                .as_deref()
                .map_or(String::new(), |m| format!(", metrics {m}"))
        ));
    }
    out
}

/// Pages per NUMA node, `0:8192,1:40` (`~` before a sampled count), or
/// "-" with none resident.
fn nodes(d: &DiskStatus) -> String {
    if d.pages_per_node.is_empty() {
        return "-".into();
    }
    let approx = if d.pages_per_node_sample > 1 { "~" } else { "" };
    d.pages_per_node
        .iter()
        .map(|(n, p)| format!("{n}:{approx}{p}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Age of the last good save ("-": none), "FAILED" if the latest failed.
fn saved(p: &PersistStatus) -> String {
    if p.last_save_error.is_some() {
        return "FAILED".into();
    }
    match &p.last_save {
        None => "-".into(),
        Some(s) => ago(s.unix_time),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A status as a daemon sends it, parsed back: the JSON names are the
    /// contract scripts rely on.
    fn sample() -> DiskStatus {
        let v = r#"{
            "name":"ram0","kind":"block","pid":1,"uri":"nbd+unix:///ram0?socket=/x",
            "frontends":[{"protocol":"nbd","endpoint":"nbd+unix:///ram0?socket=/x","connections":2}],
            "connections":2,"read_only":false,"mount":null,"unlimited":false,"page_limit":null,
            "size":1073741824,"max_memory":1073741824,"used_bytes":8192,"memory_used":12288,
            "data_pages":2,"data_bytes":8192,"stored_bytes":4096,"slack_bytes":0,
            "metadata_bytes":8192,"kept_bytes":0,"fill_pages":0,"zero_pages":0,"hot_pages":0,
            "incompressible_pages":0,"compressed_pages":2,"frame_pages":0,"frames":0,
            "idle_pages":1,"ratio":0.6667,"compress":"lz4","recompress":"zstd:9",
            "compress_time_ns":0,"decompress_time_ns":0,"background_cpu_ns":0,
            "compacted_objects":0,"zspages":1,"chunks":1,
            "pool":{"mapped_bytes":0,"warm_bytes":0,"cold_bytes":0,"released_bytes":0},
            "image":null,"flush":"ignore","autosave_secs":null,"saves":0,"last_save":null,
            "last_save_error":null
        }"#;
        serde_json::from_str(v).expect("a daemon's status parses")
    }

    #[test]
    fn json_round_trips_with_every_field() {
        let d = sample();
        assert!(d.fs.is_none());
        let back: serde_json::Value = serde_json::to_value(&d).unwrap();
        assert_eq!(back["memory_used"], 12288);
        assert_eq!(back["frontends"][0]["protocol"], "nbd");
        assert_eq!(back["last_save"], serde_json::Value::Null);
        let again: DiskStatus = serde_json::from_value(back).unwrap();
        assert_eq!(again.store.data_pages, 2);
    }

    #[test]
    fn a_narrow_table_drops_columns_and_never_wraps() {
        let full = table(&[sample()]);
        let head = |t: &str| -> Vec<String> {
            t.lines()
                .next()
                .unwrap()
                .split_whitespace()
                .map(String::from)
                .collect()
        };
        assert_eq!(head(&full), HEAD, "no width: every column");
        assert_eq!(fitted(&[sample()], &[], Some(10_000)), full);
        for width in [120, 80, 60, 40, 24, 8] {
            let t = fitted(&[sample()], &[], Some(width));
            for l in t.lines() {
                assert!(l.chars().count() <= width, "{width}: {l:?} in\n{t}");
            }
            let row = t.lines().nth(1).unwrap();
            assert!(row.starts_with("ram0 "), "{width}: one line per disk:\n{t}");
            if width < 40 {
                continue;
            }
            let h = head(&t);
            // Dropped in DROP_ORDER: whatever is missing went first.
            let mut dropped: Vec<&str> = HEAD
                .iter()
                .filter(|c| !h.iter().any(|x| x == *c))
                .copied()
                .collect();
            let mut first = DROP_ORDER[..dropped.len()].to_vec();
            dropped.sort();
            first.sort();
            assert_eq!(dropped, first, "{width}:\n{t}");
            for c in ["NAME", "SIZE", "USED", "TOTAL", "WHERE"] {
                assert!(h.iter().any(|x| x == c), "{width}: no {c}:\n{t}");
            }
            assert!(row.contains("nbd+unix:///"), "{width}:\n{t}");
        }
        // The process line breaks between its parts instead.
        let t = fitted(&[sample()], &[], Some(40));
        let lines: Vec<&str> = t.lines().skip(2).collect();
        assert_eq!(
            lines,
            [
                "process 1: resident 0B = pages 0B +",
                "  warm 0B + heap 0B + heap free 0B +",
                "  program 0B + other 0B"
            ],
            "{t}"
        );
    }

    #[test]
    fn one_process_line_per_process() {
        // A `ramd up` (pid 7) with disks a and c, and a `ramd serve` (pid
        // 9) with b, listed in name order.
        let disks: Vec<DiskStatus> = [("a", 7), ("b", 9), ("c", 7)]
            .map(|(name, pid)| DiskStatus {
                name: name.into(),
                pid,
                ..sample()
            })
            .to_vec();
        let t = table(&disks);
        let procs: Vec<&str> = t.lines().filter(|l| l.starts_with("process ")).collect();
        assert_eq!(procs.len(), 2, "{t}");
        assert!(procs[0].starts_with("process 7:") && procs[1].starts_with("process 9:"));
    }

    #[test]
    fn table_lines_up() {
        let t = table(&[sample()]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        // The serving process's resident memory, once per process.
        assert!(lines[2].starts_with("process 1: resident 0B = pages 0B + warm 0B"));
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
