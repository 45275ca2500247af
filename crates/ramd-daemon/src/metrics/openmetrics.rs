//! The OpenMetrics text of `/metrics`: the daemon's [`DaemonStatus`] and
//! each disk's [`DiskStatus`] — the same values `ramd status --json`
//! prints — through the Prometheus project's own `prometheus-client` crate
//! (names, units, `_total`, histogram buckets, `# EOF`). Nothing is counted
//! twice: a scrape reads the status structs.

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use ramd_store::metrics::{bucket_bound_ns, BUCKETS};

use crate::status::{DaemonStatus, DiskStatus};

/// What a scrape's answer declares itself to be.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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
