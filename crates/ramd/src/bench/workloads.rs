//! The measurements RAM-disk users publish (dd, sysbench fileio,
//! pg_test_fsync, IOMeter, RedHawk's seek+8 MiB loop, untar), each over a
//! [`Target`]'s regions so that one implementation serves files, raw disks and NBD.
//!
//! Data written is pseudo-random, not zeros: a RAM disk that stores zero
//! pages for free (ramd does) would otherwise measure nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::ValueEnum;

use super::target::{Io, Regions, Target};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// The measurements, in the order they run and are reported.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Workload {
    /// dd bs=1M: sequential write ending with fdatasync, then read back.
    Dd,
    /// sysbench fileio --file-test-mode=seqwr: 16 KiB blocks over 16 files.
    Seqwr,
    /// sysbench fileio seqrd: 16 KiB sequential reads over 16 files.
    Seqrd,
    /// sysbench fileio rndrw: 16 KiB random reads and writes (1.5:1),
    /// fdatasync every 100 writes to a file.
    Rndrw,
    /// pg_test_fsync: one 8 kB write then fdatasync, again and again.
    PgFsync,
    /// IOMeter: 4 KiB, 80% random, 80% read, --qd requests at once.
    Iometer,
    /// RedHawk: seek to 0 + 8 MiB write, seek to 0 + 8 MiB read, O_DIRECT.
    Redhawk,
    /// Untar a tree of small files, stat each, remove it (directories only).
    Metadata,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::Dd => "dd",
            Workload::Seqwr => "seqwr",
            Workload::Seqrd => "seqrd",
            Workload::Rndrw => "rndrw",
            Workload::PgFsync => "pg-fsync",
            Workload::Iometer => "iometer",
            Workload::Redhawk => "redhawk",
            Workload::Metadata => "metadata",
        }
    }

    pub fn all() -> Vec<Workload> {
        Workload::value_variants().to_vec()
    }
}

/// How much each workload does, from `--size` and `--qd`.
#[derive(Clone, Debug)]
pub struct Plan {
    pub size: u64,
    pub qd: usize,
}

pub const SB_FILES: usize = 16;
pub const SB_BLOCK: u64 = 16 * KIB;
/// PostgreSQL's "8 kB" block, BLCKSZ.
pub const PG_BLOCK: u64 = 8 * KIB;
pub const IO_BLOCK: u64 = 4 * KIB;
pub const RH_BLOCK: u64 = 8 * MIB;

impl Plan {
    pub fn dd_bytes(&self) -> u64 {
        self.size / MIB * MIB
    }
    pub fn sb_file(&self) -> u64 {
        self.size / SB_FILES as u64 / SB_BLOCK * SB_BLOCK
    }
    /// rndrw requests: as many as the data set has blocks.
    pub fn rndrw_ops(&self) -> u64 {
        (self.sb_file() * SB_FILES as u64 / SB_BLOCK).max(100)
    }
    /// Enough that even tmpfs (~1 µs each) takes tens of milliseconds.
    pub fn pg_ops(&self) -> u64 {
        (self.size / (4 * KIB)).max(64)
    }
    pub fn io_span(&self) -> u64 {
        self.size / IO_BLOCK * IO_BLOCK
    }
    /// IOMeter requests: as many as the span has blocks.
    pub fn io_ops(&self) -> u64 {
        (self.io_span() / IO_BLOCK).max(self.qd as u64)
    }
    pub fn rh_loops(&self) -> u64 {
        (2 * self.size / RH_BLOCK).max(4)
    }
    pub fn meta_files(&self) -> u64 {
        (self.size / (32 * KIB)).max(64)
    }
    /// The most any one workload writes to a raw disk or export (they run
    /// one at a time from offset 0).
    pub fn need_raw(&self, w: &[Workload]) -> u64 {
        w.iter()
            .map(|w| match w {
                Workload::Dd => self.dd_bytes(),
                Workload::Seqwr | Workload::Seqrd | Workload::Rndrw => {
                    self.sb_file() * SB_FILES as u64
                }
                Workload::PgFsync => PG_BLOCK,
                Workload::Iometer => self.io_span(),
                Workload::Redhawk => RH_BLOCK,
                Workload::Metadata => 0,
            })
            .max()
            .unwrap_or(0)
    }
    /// Free space a directory needs: the largest workload, with room for
    /// the metadata tree's blocks and directories.
    pub fn need_dir(&self, w: &[Workload]) -> u64 {
        let meta = if w.contains(&Workload::Metadata) {
            self.meta_files() * 16 * KIB
        } else {
            0
        };
        self.need_raw(w).max(meta) + MIB
    }
    /// The sizes, for errors that say why a target is too small.
    pub fn describe(&self) -> String {
        use super::target::human;
        format!(
            "--size {}: dd {}, sysbench {}x{}, IOMeter span {}, RedHawk {}",
            human(self.size),
            human(self.dd_bytes()),
            SB_FILES,
            human(self.sb_file()),
            human(self.io_span()),
            human(RH_BLOCK)
        )
    }
}

/// One figure of one run.
#[derive(Clone, Debug)]
pub struct Metric {
    /// Stable JSON key, unit included (`write_mib_s`, `p99_lat_us`).
    pub key: &'static str,
    pub label: &'static str,
    pub unit: &'static str,
    pub higher_is_better: bool,
    pub value: f64,
}

fn m(key: &'static str, label: &'static str, unit: &'static str, value: f64) -> Metric {
    let higher_is_better = !(unit == "µs" || unit == "ms" || unit == "s");
    Metric {
        key,
        label,
        unit,
        higher_is_better,
        value,
    }
}

pub enum Outcome {
    Done {
        metrics: Vec<Metric>,
        note: Option<String>,
    },
    Skipped(String),
}

/// Deterministic data and offsets from a seed (fastrand's wyrand): the
/// same run twice writes the same bytes to the same places.
pub struct Rng(fastrand::Rng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }
    pub fn next(&mut self) -> u64 {
        self.0.u64(..)
    }
    /// Uniform in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0.u64(..n.max(1))
    }
    /// True with probability `pct`%.
    pub fn percent(&mut self, pct: u64) -> bool {
        self.below(100) < pct
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        self.0.fill(buf);
    }
}

/// A buffer aligned to 4 KiB, as O_DIRECT needs.
pub struct Aligned {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    pub fn new(len: usize, rng: &mut Rng) -> Aligned {
        let mut raw = vec![0u8; len + 4096];
        let off = raw.as_ptr().align_offset(4096);
        rng.fill(&mut raw[off..off + len]);
        Aligned { raw, off, len }
    }
    pub fn get(&self) -> &[u8] {
        &self.raw[self.off..self.off + self.len]
    }
    pub fn get_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.off..self.off + self.len]
    }
}

fn per_s(n: f64, d: Duration) -> f64 {
    n / d.as_secs_f64().max(1e-9)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// Runs one workload once on one target.
pub fn run(w: Workload, t: &mut Target, plan: &Plan, seed: u64) -> Result<Outcome> {
    let mut rng = Rng::new(seed);
    let spec = t.spec.clone();
    let r = match w {
        Workload::Dd => dd(t, plan, &mut rng),
        Workload::Seqwr => seqwr(t, plan, &mut rng),
        Workload::Seqrd => seqrd(t, plan, &mut rng),
        Workload::Rndrw => rndrw(t, plan, &mut rng),
        Workload::PgFsync => pg_fsync(t, plan, &mut rng),
        Workload::Iometer => iometer(t, plan, &mut rng),
        Workload::Redhawk => redhawk(t, plan, &mut rng),
        Workload::Metadata => metadata(t, plan, &mut rng),
    };
    r.with_context(|| format!("{spec}: {}", w.name()))
}

fn done(metrics: Vec<Metric>) -> Result<Outcome> {
    Ok(Outcome::Done {
        metrics,
        note: None,
    })
}

/// `dd if=... bs=1M conv=fdatasync` then reading it back with bs=1M.
fn dd(t: &mut Target, plan: &Plan, rng: &mut Rng) -> Result<Outcome> {
    let n = plan.dd_bytes() / MIB;
    let r = t.regions("dd", 1, n * MIB)?;
    let io = &r.io[0];
    let buf = Aligned::new(MIB as usize, rng);
    let start = Instant::now();
    for i in 0..n {
        io.write_at(buf.get(), i * MIB)?;
    }
    io.sync()?;
    let write = start.elapsed();
    io.drop_cache();
    let mut back = vec![0u8; MIB as usize];
    let start = Instant::now();
    for i in 0..n {
        io.read_at(&mut back, i * MIB)?;
        if back != buf.get() {
            bail!("read back different data at {} MiB", i);
        }
    }
    let read = start.elapsed();
    done(vec![
        m("write_mib_s", "write", "MiB/s", per_s(n as f64, write)),
        m("read_mib_s", "read", "MiB/s", per_s(n as f64, read)),
    ])
}

/// sysbench's `prepare`: every file written in full, synced.
fn sb_prepare(t: &mut Target, plan: &Plan, rng: &mut Rng) -> Result<(Regions, Vec<u8>)> {
    let r = t.regions("sb", SB_FILES, plan.sb_file())?;
    let mut buf = vec![0u8; SB_BLOCK as usize];
    rng.fill(&mut buf);
    Ok((r, buf))
}

fn sb_fill(r: &Regions, buf: &[u8], fsync_every: u64) -> Result<u64> {
    let blocks = r.len / SB_BLOCK;
    let mut ops: u64 = 0;
    for io in &r.io {
        for b in 0..blocks {
            io.write_at(buf, b * SB_BLOCK)?;
            ops += 1;
            if fsync_every > 0 && ops.is_multiple_of(fsync_every) {
                io.sync()?;
            }
        }
    }
    // sysbench's --file-fsync-end.
    for io in &r.io {
        io.sync()?;
    }
    Ok(ops)
}

fn sb_metrics(ops: u64, d: Duration) -> Vec<Metric> {
    vec![
        m("ops_s", "requests", "ops/s", per_s(ops as f64, d)),
        m(
            "mib_s",
            "throughput",
            "MiB/s",
            per_s(mib(ops * SB_BLOCK), d),
        ),
    ]
}

fn seqwr(t: &mut Target, plan: &Plan, rng: &mut Rng) -> Result<Outcome> {
    let (r, buf) = sb_prepare(t, plan, rng)?;
    let start = Instant::now();
    // sysbench's default --file-fsync-freq=100.
    let ops = sb_fill(&r, &buf, 100)?;
    done(sb_metrics(ops, start.elapsed()))
}

/// The sysbench files written in full (no fsync) and dropped from the
/// page cache where the target allows it: what seqrd and rndrw read.
fn sb_written(t: &mut Target, plan: &Plan, rng: &mut Rng) -> Result<(Regions, Vec<u8>)> {
    let (r, buf) = sb_prepare(t, plan, rng)?;
    sb_fill(&r, &buf, 0)?;
    for io in &r.io {
        io.drop_cache();
    }
    Ok((r, buf))
}

fn seqrd(t: &mut Target, plan: &Plan, rng: &mut Rng) -> Result<Outcome> {
    let (r, buf) = sb_written(t, plan, rng)?;
    let blocks = r.len / SB_BLOCK;
    let mut back = vec![0u8; SB_BLOCK as usize];
    let start = Instant::now();
    let mut ops = 0;
    for io in &r.io {
        for b in 0..blocks {
            io.read_at(&mut back, b * SB_BLOCK)?;
            ops += 1;
        }
    }
    let d = start.elapsed();
    if back != buf {
        bail!("read back different data");
    }
    done(sb_metrics(ops, d))
}

fn rndrw(t: &mut Target, plan: &Plan, rng: &mut Rng) -> Result<Outcome> {
    let (r, buf) = sb_written(t, plan, rng)?;
    let blocks = r.len / SB_BLOCK;
    let mut back = vec![0u8; SB_BLOCK as usize];
    let mut writes = [0u64; SB_FILES];
    let ops = plan.rndrw_ops();
    let start = Instant::now();
    for _ in 0..ops {
        let f = rng.below(SB_FILES as u64) as usize;
        let off = rng.below(blocks) * SB_BLOCK;
        // sysbench's --file-rw-ratio=1.5: 3 reads for every 2 writes.
        if rng.below(5) < 3 {
            r.io[f].read_at(&mut back, off)?;
        } else {
            r.io[f].write_at(&buf, off)?;
            writes[f] += 1;
            if writes[f].is_multiple_of(100) {
                r.io[f].sync()?;
            }
        }
    }
    for io in &r.io {
        io.sync()?;
    }
    done(sb_metrics(ops, start.elapsed()))
}

/// pg_test_fsync's "one 8kB write" with fdatasync: write at offset 0,
/// fdatasync, over and over.
fn pg_fsync(t: &mut Target, plan: &Plan, rng: &mut Rng) -> Result<Outcome> {
    let r = t.regions("pg", 1, PG_BLOCK)?;
    let io = &r.io[0];
    let mut buf = vec![0u8; PG_BLOCK as usize];
    rng.fill(&mut buf);
    io.write_at(&buf, 0)?;
    io.sync()?;
    let ops = plan.pg_ops();
    let start = Instant::now();
    for _ in 0..ops {
        io.write_at(&buf, 0)?;
        io.sync()?;
    }
    let d = start.elapsed();
    done(vec![
        m("ops_s", "write+fdatasync", "ops/s", per_s(ops as f64, d)),
        m("op_us", "per op", "µs", d.as_secs_f64() * 1e6 / ops as f64),
    ])
}

/// Latencies in ns -> (mean µs, p99 µs).
fn latency(mut ns: Vec<u64>) -> (f64, f64) {
    if ns.is_empty() {
        return (0.0, 0.0);
    }
    ns.sort_unstable();
    let mean = ns.iter().sum::<u64>() as f64 / ns.len() as f64;
    let p99 = ns[((ns.len() * 99).div_ceil(100)).saturating_sub(1)];
    (mean / 1e3, p99 as f64 / 1e3)
}

/// The next IOMeter offset: 80% random 4 KiB-aligned, 20% following the
/// previous one.
fn io_next(rng: &mut Rng, last: u64, blocks: u64) -> u64 {
    if rng.percent(80) {
        rng.below(blocks)
    } else {
        (last + 1) % blocks
    }
}

/// The IOMeter access specification RAM-disk reviews use: 4 KiB transfers,
/// 80% random, 80% read, `--qd` outstanding I/Os.
fn iometer(t: &mut Target, plan: &Plan, rng: &mut Rng) -> Result<Outcome> {
    let span = plan.io_span();
    let r = t.regions("iometer", 1, span)?;
    let io = r.io[0].clone();
    // IOMeter prepares its test file in full before it measures.
    let mut chunk = vec![0u8; MIB as usize];
    rng.fill(&mut chunk);
    let mut off = 0;
    while off < span {
        let n = (span - off).min(MIB) as usize;
        io.write_at(&chunk[..n], off)?;
        off += n as u64;
    }
    io.sync()?;
    io.drop_cache();
    let blocks = span / IO_BLOCK;
    let ops = plan.io_ops();
    let qd = plan.qd;
    let (elapsed, lat) = match t.nbd() {
        Some(client) => {
            let mut c = client.lock();
            iometer_nbd(&mut c, rng, blocks, ops, qd)?
        }
        None => iometer_threads(io, rng.next(), blocks, ops, qd)?,
    };
    let (mean, p99) = latency(lat);
    done(vec![
        m("iops", "IOPS", "ops/s", per_s(ops as f64, elapsed)),
        m(
            "mib_s",
            "throughput",
            "MiB/s",
            per_s(mib(ops * IO_BLOCK), elapsed),
        ),
        m("mean_lat_us", "mean latency", "µs", mean),
        m("p99_lat_us", "p99 latency", "µs", p99),
    ])
}

fn iometer_threads(
    io: Arc<dyn Io>,
    seed: u64,
    blocks: u64,
    ops: u64,
    qd: usize,
) -> Result<(Duration, Vec<u64>)> {
    let start = Instant::now();
    let results: Vec<std::io::Result<Vec<u64>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..qd)
            .map(|i| {
                let io = io.clone();
                // Spread the requests; the first threads take the remainder.
                let mine = ops / qd as u64 + u64::from((i as u64) < ops % qd as u64);
                s.spawn(move || -> std::io::Result<Vec<u64>> {
                    let mut rng = Rng::new(seed ^ (i as u64 + 1));
                    let mut buf = vec![0u8; IO_BLOCK as usize];
                    rng.fill(&mut buf);
                    let mut lat = Vec::with_capacity(mine as usize);
                    let mut last = rng.below(blocks);
                    for _ in 0..mine {
                        last = io_next(&mut rng, last, blocks);
                        let t0 = Instant::now();
                        if rng.percent(80) {
                            io.read_at(&mut buf, last * IO_BLOCK)?;
                        } else {
                            io.write_at(&buf, last * IO_BLOCK)?;
                        }
                        lat.push(t0.elapsed().as_nanos() as u64);
                    }
                    Ok(lat)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(std::io::Error::other("thread panicked")))
            })
            .collect()
    });
    let elapsed = start.elapsed();
    let mut all = Vec::with_capacity(ops as usize);
    for r in results {
        all.extend(r?);
    }
    Ok((elapsed, all))
}

/// The same over one NBD connection with `qd` requests in flight.
fn iometer_nbd(
    c: &mut ramd_nbd::client::Client,
    rng: &mut Rng,
    blocks: u64,
    ops: u64,
    qd: usize,
) -> Result<(Duration, Vec<u64>)> {
    let mut buf = vec![0u8; IO_BLOCK as usize];
    rng.fill(&mut buf);
    let mut sent_at = std::collections::HashMap::with_capacity(qd);
    let mut lat = Vec::with_capacity(ops as usize);
    let mut data = Vec::new();
    let mut last = rng.below(blocks);
    let mut sent = 0;
    let start = Instant::now();
    while lat.len() < ops as usize {
        while sent < ops && c.in_flight() < qd {
            last = io_next(rng, last, blocks);
            let off = last * IO_BLOCK;
            let cookie = if rng.percent(80) {
                c.submit_read(off, IO_BLOCK as u32)?
            } else {
                c.submit_write(off, &buf)?
            };
            sent_at.insert(cookie, Instant::now());
            sent += 1;
        }
        let reply = c.next_reply(&mut data)?;
        if reply.error != 0 {
            return Err(ramd_nbd::client::nbd_error(reply.error, "request").into());
        }
        let t0 = sent_at
            .remove(&reply.cookie)
            .context("reply to a request not sent")?;
        lat.push(t0.elapsed().as_nanos() as u64);
    }
    Ok((start.elapsed(), lat))
}

/// RedHawk's NUMA test program: lseek(0) and write(8 MiB), then
/// lseek(0) and read(8 MiB), each call timed with CLOCK_MONOTONIC (std's
/// Instant); pwrite/pread at offset 0 is the same pair in one call.
fn redhawk(t: &mut Target, plan: &Plan, rng: &mut Rng) -> Result<Outcome> {
    let (r, note) = t.direct_region("redhawk", RH_BLOCK)?;
    let io = &r.io[0];
    let mut buf = Aligned::new(RH_BLOCK as usize, rng);
    io.write_at(buf.get(), 0)?;
    io.sync()?;
    let loops = plan.rh_loops();
    let mut w = Duration::ZERO;
    for _ in 0..loops {
        let t0 = Instant::now();
        io.write_at(buf.get(), 0)?;
        w += t0.elapsed();
    }
    let mut rd = Duration::ZERO;
    for _ in 0..loops {
        let t0 = Instant::now();
        io.read_at(buf.get_mut(), 0)?;
        rd += t0.elapsed();
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3 / loops as f64;
    Ok(Outcome::Done {
        metrics: vec![
            m("write_ms", "8 MiB write", "ms", ms(w)),
            m("read_ms", "8 MiB read", "ms", ms(rd)),
        ],
        note,
    })
}

/// Like untar: directories, then files of varied sizes written and
/// closed with their mtime set; then stat every file; then remove the tree.
/// A file's size by lstat(2), as find(1), ls(1) and tar ask for it. Not
/// `fs::symlink_metadata`: Rust's std asks statx(2) for every field,
/// birth time included, which FUSE filesystems answer with an extra round
/// trip per inode, a cost the tools this phase stands for never pay.
fn lstat_size(p: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(p.as_os_str().as_bytes())?;
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: a NUL-terminated path and a stat buffer lstat fills on success.
    if unsafe { libc::lstat(c.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: lstat succeeded, so it filled the buffer.
    Ok(unsafe { st.assume_init() }.st_size as u64)
}

fn metadata(t: &mut Target, plan: &Plan, rng: &mut Rng) -> Result<Outcome> {
    let Some(work) = t.work_dir() else {
        return Ok(Outcome::Skipped("not a directory".into()));
    };
    use std::fs;
    use std::io::Write;
    let root = work.join("tree");
    let files = plan.meta_files();
    let per_dir = 32;
    let mut data = vec![0u8; 64 * KIB as usize];
    rng.fill(&mut data);
    // Sizes as in a source tarball: mostly a few KiB, some empty, a few
    // tens of KiB.
    let sizes: Vec<usize> = (0..files)
        .map(|_| match rng.below(100) {
            0..=4 => 0,
            5..=84 => rng.below(8 * KIB) as usize,
            _ => rng.below(64 * KIB) as usize,
        })
        .collect();
    let mtime = std::time::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    let mut paths = Vec::with_capacity(files as usize);
    let start = Instant::now();
    fs::create_dir(&root)?;
    for (i, &len) in sizes.iter().enumerate() {
        let i = i as u64;
        if i.is_multiple_of(per_dir) {
            let d = root.join(format!("d{:03}", i / per_dir / per_dir));
            if i.is_multiple_of(per_dir * per_dir) {
                fs::create_dir(&d)?;
            }
            fs::create_dir(d.join(format!("s{:03}", i / per_dir % per_dir)))?;
        }
        let p = root
            .join(format!("d{:03}", i / per_dir / per_dir))
            .join(format!("s{:03}", i / per_dir % per_dir))
            .join(format!("f{i:06}.c"));
        let mut f = fs::File::create(&p)?;
        f.write_all(&data[..len])?;
        f.set_modified(mtime)?;
        paths.push(p);
    }
    let create = start.elapsed();
    let start = Instant::now();
    let mut bytes = 0;
    for p in &paths {
        bytes += lstat_size(p)?;
    }
    let stat = start.elapsed();
    let expect: u64 = sizes.iter().map(|&s| s as u64).sum();
    if bytes != expect {
        bail!("stat saw {bytes} bytes in the tree, {expect} were written");
    }
    let start = Instant::now();
    fs::remove_dir_all(&root)?;
    let remove = start.elapsed();
    let n = files as f64;
    done(vec![
        m("create_files_s", "untar", "files/s", per_s(n, create)),
        m("stat_files_s", "stat", "files/s", per_s(n, stat)),
        m("remove_files_s", "remove", "files/s", per_s(n, remove)),
        m(
            "total_s",
            "untar+stat+remove",
            "s",
            (create + stat + remove).as_secs_f64(),
        ),
    ])
}
