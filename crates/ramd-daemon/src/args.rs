//! A disk's settings: the flags of `ramd serve`, which are also the keys of a
//! `[disk.NAME]` config table. One definition serves both, so a setting is
//! parsed and checked the same way wherever it comes from (the edge: nothing
//! past this module re-validates it).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ramd_store::persist::FlushMode;
use ramd_store::Codec;

use crate::units::{parse_duration, parse_size};

#[derive(clap::Args, Debug, Clone)]
pub struct DiskArgs {
    /// Logical capacity, e.g. 512M, 1G, 1.5T (powers of 1024). A filesystem
    /// disk also takes `unlimited` (ramfs mode: bounded by --max-memory and
    /// the host's available memory only). Required, here or in the config,
    /// unless --image holds a disk.
    #[arg(long, value_parser = parse_disk_size, value_name = "SIZE")]
    pub size: Option<DiskSize>,

    /// Disk name: the NBD export name, the control socket and the status row.
    #[arg(long, default_value = "ram0", value_parser = parse_name, value_name = "NAME")]
    pub name: String,

    /// Where NBD clients connect: unix:PATH, or tcp:[HOST:]PORT (HOST
    /// defaults to 127.0.0.1; give 0.0.0.0 or an address to listen beyond
    /// loopback). Repeat it to serve the disk on several sockets at once.
    /// Default: unix:RUN_DIR/NAME.sock.
    #[arg(long, value_parser = parse_listen, value_name = "ADDR", conflicts_with = "mount")]
    pub listen: Vec<Listen>,

    /// Mount a filesystem disk at DIR (an existing directory that is not
    /// already a mount point) instead of serving a block disk.
    #[arg(long, value_name = "DIR")]
    pub mount: Option<PathBuf>,

    /// Filesystem disk: most inodes (files, directories, links...).
    /// Default: like tmpfs, half the host's RAM pages.
    #[arg(long, value_name = "N", requires = "mount", value_parser = clap::value_parser!(u64).range(2..))]
    pub nr_inodes: Option<u64>,

    /// Filesystem disk: root directory permissions, in octal.
    #[arg(long, value_name = "OCTAL", requires = "mount", default_value = "1777", value_parser = parse_mode)]
    pub mode: u16,

    /// Filesystem disk: owner of the root directory.
    #[arg(long, value_name = "UID", requires = "mount", default_value_t = 0)]
    pub uid: u32,

    /// Filesystem disk: group of the root directory.
    #[arg(long, value_name = "GID", requires = "mount", default_value_t = 0)]
    pub gid: u32,

    /// Filesystem disk: never update access times.
    #[arg(long, requires = "mount")]
    pub noatime: bool,

    /// Filesystem disk: let the kernel cache writes and send them in large
    /// batches (faster small writes; fsync still reaches ramd).
    #[arg(long, requires = "mount")]
    pub writeback_cache: bool,

    /// Cap on RAM used for pages, compressed objects and page tables;
    /// writes beyond it get ENOSPC. Default: enough for every page of SIZE
    /// uncompressed (with compression, plus allocator slack).
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub max_memory: Option<u64>,

    /// Lock the disk's page memory (never swapped, as ramfs pages are
    /// not). RLIMIT_MEMLOCK must allow max memory: `ulimit -l`, or systemd's
    /// LimitMEMLOCK=.
    #[arg(long)]
    pub mlock: bool,

    /// NUMA nodes for the disk's page memory, in numactl's syntax (`0-1,3`);
    /// its serving threads run on those nodes' CPUs. Default: every node
    /// with memory, under the kernel's default policy unless --numa-policy.
    #[arg(long, value_parser = parse_numa_nodes, value_name = "LIST")]
    pub numa_nodes: Option<std::collections::BTreeSet<u32>>,

    /// How pages go to --numa-nodes: bind (only there), preferred (one node
    /// first, elsewhere once it is full), interleave (round-robin).
    /// Default with --numa-nodes: bind.
    #[arg(long, value_parser = parse_numa_policy, value_name = "POLICY")]
    pub numa_policy: Option<ramd_store::numa::NumaPolicy>,

    /// Transparent huge pages for the page memory: never, madvise (a 2 MiB
    /// page at first touch), always (each 2 MiB arena faulted in whole when
    /// it is mapped). Default: no advice, the system's setting.
    #[arg(long, value_parser = parse_huge_pages, value_name = "MODE")]
    pub huge_pages: Option<ramd_store::HugePages>,

    /// Refuse writes, trims and zeroing (EPERM).
    #[arg(long, conflicts_with = "mount")]
    pub read_only: bool,

    /// Requests served at once per NBD connection, or FUSE worker threads.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,

    /// Clients connected at once (per listening socket); more are turned away.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_connections: u16,

    /// Page compression: none, lz4, or zstd[:LEVEL] (LEVEL 1..=19, default
    /// 3). Pages that do not shrink below 15/16 of a page stay raw; same-filled
    /// pages cost nothing either way.
    #[arg(long, default_value = "none", value_parser = parse_codec, value_name = "CODEC")]
    pub compress: Codec,

    /// Hot/cold tiering: written pages stay raw (memory-speed reads and
    /// writes) and are compressed in the background once untouched for this
    /// long; compressed pages read whole turn raw again. 0: compress as pages
    /// are written, like zram. Durations like 500ms, 30s, 5m.
    #[arg(long, default_value = "0", value_parser = parse_duration, value_name = "DURATION")]
    pub compress_after: Duration,

    /// Re-pack idle pages (see --idle-after) with this codec, up to 16
    /// neighbouring pages per frame: denser than page by page. none: off.
    #[arg(long, default_value = "none", value_parser = parse_codec, value_name = "CODEC")]
    pub recompress: Codec,

    /// How long a page goes untouched before it counts as idle (status's
    /// IDLE column, and --recompress).
    #[arg(long, default_value = "5m", value_parser = parse_duration, value_name = "DURATION")]
    pub idle_after: Duration,

    /// Threads for background compression and compaction, at the lowest CPU
    /// priority: background work never uses more than this many cores.
    /// (`ramd up`: the daemon's `[daemon] compress_threads`, shared by all
    /// its disks.)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub compress_threads: u16,

    /// Freed page memory kept resident for reuse instead of being returned
    /// to the kernel at once (first-touch memory is slow to fault in); what
    /// the disk stops reusing decays back to the kernel within seconds.
    #[arg(long, default_value = "64M", value_parser = parse_size, value_name = "SIZE")]
    pub warm_pool: u64,

    /// Keep the disk in this image directory: loaded at start if it holds
    /// an image (then --size may be left out), saved at a clean stop
    /// (SIGINT, SIGTERM, umount, `ramd down`), on `ramd snapshot`, and with
    /// --autosave. Created 0700, its files 0600. See FORMAT.md.
    #[arg(long, value_name = "DIR")]
    pub image: Option<PathBuf>,

    /// Save the pages changed since the last save every DURATION (e.g. 30s,
    /// 5m) in the background while I/O goes on. Needs --image.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION", requires = "image")]
    pub autosave: Option<Duration>,

    /// What a flush means. `ignore`: NBD FLUSH/FUA and fsync return at once
    /// (a crash loses what changed since the last save). `persist`: they
    /// return once a save holding the data is durable in the image. Needs
    /// --image for persist.
    #[arg(long, default_value = "ignore", value_parser = parse_flush, value_name = "MODE")]
    pub flush: FlushMode,
}

impl DiskArgs {
    /// `fs` with --mount, else `block`.
    pub fn kind(&self) -> ramd_store::persist::DiskKind {
        match self.mount {
            Some(_) => ramd_store::persist::DiskKind::Fs,
            None => ramd_store::persist::DiskKind::Block,
        }
    }

    /// Whether the disk has background work (compression, re-packing).
    pub fn compresses(&self) -> bool {
        !self.compress.is_none() || !self.recompress.is_none()
    }

    /// The settings that decide what the disk *is*, for `ramd reload` to
    /// tell a changed disk from an unchanged one.
    pub fn fingerprint(&self) -> String {
        format!("{self:?}")
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DiskSize {
    Bytes(u64),
    Unlimited,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

pub fn parse_disk_size(s: &str) -> Result<DiskSize, String> {
    if s == "unlimited" {
        return Ok(DiskSize::Unlimited);
    }
    let n = parse_size(s)?;
    if n == 0 {
        return Err(format!("size {s:?} must be more than 0 bytes"));
    }
    if n > ramd_store::MAX_SIZE {
        return Err(format!(
            "size {s:?} exceeds the largest disk, {} bytes",
            ramd_store::MAX_SIZE
        ));
    }
    Ok(DiskSize::Bytes(n))
}

fn parse_flush(s: &str) -> Result<FlushMode, String> {
    match s {
        "ignore" => Ok(FlushMode::Ignore),
        "persist" => Ok(FlushMode::Persist),
        _ => Err(format!("invalid flush mode {s:?}: use ignore or persist")),
    }
}

pub fn parse_numa_nodes(s: &str) -> Result<std::collections::BTreeSet<u32>, String> {
    ramd_store::numa::parse_list(s)
}

pub fn parse_numa_policy(s: &str) -> Result<ramd_store::numa::NumaPolicy, String> {
    ramd_store::numa::NumaPolicy::parse(s)
}

pub fn parse_huge_pages(s: &str) -> Result<ramd_store::HugePages, String> {
    ramd_store::HugePages::parse(s)
}

pub fn parse_codec(s: &str) -> Result<Codec, String> {
    s.parse::<Codec>().map_err(|e| match e {
        ramd_store::Error::Invalid(m) => m,
        e => e.to_string(),
    })
}

fn parse_mode(s: &str) -> Result<u16, String> {
    u16::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("invalid mode {s:?}: use octal permissions like 1777 or 755"))
}

pub fn parse_name(s: &str) -> Result<String, String> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && !s.starts_with('.');
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "invalid disk name {s:?}: use 1 to 64 of A-Z a-z 0-9 - _ . (not starting with .)"
        ))
    }
}

fn parse_listen(s: &str) -> Result<Listen, String> {
    if let Some(path) = s.strip_prefix("unix:") {
        if path.is_empty() {
            return Err("unix: needs a socket path, like unix:/run/ramd/disk.sock".into());
        }
        return Ok(Listen::Unix(PathBuf::from(path)));
    }
    if let Some(rest) = s.strip_prefix("tcp:") {
        if let Ok(port) = rest.parse::<u16>() {
            return Ok(Listen::Tcp(SocketAddr::new(
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                port,
            )));
        }
        return rest.parse::<SocketAddr>().map(Listen::Tcp).map_err(|_| {
            format!("invalid TCP address {rest:?}: use PORT, HOST:PORT or [IPV6]:PORT")
        });
    }
    Err(format!(
        "invalid listen address {s:?}: use unix:PATH or tcp:[HOST:]PORT"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen("tcp:10809"),
            Ok(Listen::Tcp("127.0.0.1:10809".parse().unwrap()))
        );
        assert_eq!(
            parse_listen("tcp:0.0.0.0:1"),
            Ok(Listen::Tcp("0.0.0.0:1".parse().unwrap()))
        );
        assert_eq!(
            parse_listen("tcp:[::1]:5"),
            Ok(Listen::Tcp("[::1]:5".parse().unwrap()))
        );
        assert_eq!(
            parse_listen("unix:/x.sock"),
            Ok(Listen::Unix("/x.sock".into()))
        );
        assert!(parse_listen("tcp:host").is_err());
        assert!(parse_listen("unix:").is_err());
        assert!(parse_listen("/x.sock").is_err());
    }

    #[test]
    fn names_and_sizes() {
        assert!(parse_name("ram0").is_ok());
        assert!(parse_name("../x").is_err());
        assert!(parse_name("").is_err());
        assert!(parse_disk_size("0").unwrap_err().contains("\"0\""));
        assert_eq!(parse_disk_size("unlimited"), Ok(DiskSize::Unlimited));
        assert_eq!(parse_mode("1777"), Ok(0o1777));
        assert!(parse_mode("8").is_err());
        assert!(parse_mode("17777").is_err());
        assert!(parse_disk_size("9E").is_err());
    }
}
