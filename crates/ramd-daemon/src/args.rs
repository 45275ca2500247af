//! A disk's settings: the flags of `ramd serve`, which are also the keys of a
//! `[disk.NAME]` config table. One definition serves both, so a setting is
//! parsed and checked the same way wherever it comes from (the edge: nothing
//! past this module re-validates it).

use std::path::PathBuf;
use std::time::Duration;

use ramd_store::persist::FlushMode;
use ramd_store::Codec;

pub use ramd_fs::settings::{DataPath, FuseArgs, FuseTransport};
pub use ramd_iscsi::settings::IscsiArgs;
pub use ramd_nbd::settings::{Listen, NbdArgs, TlsMode};

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

    /// NBD's settings (block disks).
    #[command(flatten)]
    pub nbd: ramd_nbd::settings::NbdArgs,

    /// iSCSI's settings (block disks).
    #[command(flatten)]
    pub iscsi: ramd_iscsi::settings::IscsiArgs,

    /// FUSE's settings: a filesystem disk's mount.
    #[command(flatten)]
    pub fuse: ramd_fs::settings::FuseArgs,

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

    /// Refuse writes, trims and zeroing (EPERM); a filesystem disk is
    /// mounted read-only (EROFS).
    #[arg(long)]
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
    /// long; compressed pages read whole turn raw again. 0 (the default):
    /// compress as pages are written, like zram. With --data-path kernel:
    /// how long a closed file stays untouched before its data moves out of
    /// the tmpfs, compressed (default 60s). Durations like 500ms, 30s, 5m.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub compress_after: Option<Duration>,

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
    /// --autosave. Created 0700, its files 0600; a directory of other files
    /// is refused (give a new or empty one). Or in S3-compatible object
    /// storage: s3://BUCKET/PREFIX, with credentials and endpoint from the
    /// AWS_* environment variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// AWS_REGION, AWS_ENDPOINT_URL, AWS_ALLOW_HTTP). See FORMAT.md.
    #[arg(long, value_name = "DIR|URL")]
    pub image: Option<PathBuf>,

    /// Ship each save committed to --image DIR, in the background, to
    /// S3-compatible object storage: s3://BUCKET/PREFIX, credentials and
    /// endpoint from the AWS_* environment as for --image s3://. Saves go
    /// on at local speed; a host that lost DIR serves the disk with
    /// --image s3://BUCKET/PREFIX. Needs --image DIR (a directory).
    #[arg(long, value_name = "URL", requires = "image")]
    pub replicate: Option<String>,

    /// Serve --image s3://BUCKET/PREFIX read-only as a standby of the ramd
    /// that writes it: no lease is taken, the image's MANIFEST is read
    /// every --standby-poll, and each new save is applied to the disk (a
    /// read sees one whole save, never part of one). `ramd promote NAME`
    /// makes it the writer. With --mount the filesystem is mounted
    /// read-only (--data-path store) and becomes read-write at the
    /// promotion. Not with --replicate or --read-only.
    #[arg(long, requires = "image")]
    pub standby: bool,

    /// How often a --standby reads the image's MANIFEST for new saves (two
    /// small GETs, the MANIFEST and the LEASE, per poll).
    #[arg(long, default_value = "500ms", value_parser = parse_duration, value_name = "DURATION")]
    pub standby_poll: Duration,

    /// Save the pages changed since the last save every DURATION (e.g. 30s,
    /// 5m) in the background while I/O goes on. Needs --image.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION", requires = "image")]
    pub autosave: Option<Duration>,

    /// Keep the saves of this long ago restorable (`ramd image restore`):
    /// the chains that full saves (compactions) replace stay in the image,
    /// as MANIFEST-N and their segments, until their newest save is older
    /// than DURATION (e.g. 1h, 7d). 0: only the current chain (chains kept
    /// earlier stay until `ramd image prune --keep-saves`). Needs --image.
    #[arg(long, default_value = "0", value_parser = parse_duration, value_name = "DURATION", requires = "image")]
    pub keep_saves: Duration,

    /// What a flush means. `ignore`: NBD FLUSH/FUA and fsync return at once
    /// (a crash loses what changed since the last save). `persist`: they
    /// return once a save holding the data is durable in the image. Needs
    /// --image for persist.
    #[arg(long, default_value = "ignore", value_parser = parse_flush, value_name = "MODE")]
    pub flush: FlushMode,

    /// The settings groups of protocols registered beyond the built-in
    /// ones (`ramd_frontend::groups`): their flags follow these.
    #[command(flatten)]
    pub more: ramd_frontend::Groups,
}

impl DiskArgs {
    /// `fs` with --mount, else `block`.
    pub fn kind(&self) -> ramd_store::persist::DiskKind {
        match self.fuse.mount {
            Some(_) => ramd_store::persist::DiskKind::Fs,
            None => ramd_store::persist::DiskKind::Block,
        }
    }

    /// Whether a filesystem disk uses the kernel's write-back cache
    /// (`ramd_fs::frontend::writeback_cache`).
    pub fn writeback_cache(&self) -> bool {
        ramd_fs::frontend::writeback_cache(&self.fuse, self.standby)
    }

    /// A filesystem disk's mount flags.
    pub fn mount_flags(&self) -> ramd_fs::MountFlags {
        ramd_fs::frontend::mount_flags(&self.fuse, &self.name, self.read_only, self.standby)
    }

    /// Whether the disk has background work (compression, re-packing).
    pub fn compresses(&self) -> bool {
        !self.compress.is_none() || !self.recompress.is_none()
    }

    /// One setting by its config key, as text to compare (a remount
    /// checks that what it cannot change is unchanged); `None`: no such key.
    pub fn setting(&self, key: &str) -> Option<String> {
        let v = match key {
            "size" => format!("{:?}", self.size),
            "name" => format!("{:?}", self.name),
            "writeback_cache" => self.writeback_cache().to_string(),
            "no_writeback_cache" => (!self.writeback_cache()).to_string(),
            "max_memory" => format!("{:?}", self.max_memory),
            "read_only" => self.read_only.to_string(),
            "threads" => self.threads.to_string(),
            "max_connections" => self.max_connections.to_string(),
            "compress" => self.compress.to_string(),
            "compress_after" => format!("{:?}", self.compress_after),
            "recompress" => self.recompress.to_string(),
            "idle_after" => format!("{:?}", self.idle_after),
            "compress_threads" => self.compress_threads.to_string(),
            "warm_pool" => self.warm_pool.to_string(),
            "image" => format!("{:?}", self.image),
            "replicate" => format!("{:?}", self.replicate),
            "autosave" => format!("{:?}", self.autosave),
            "keep_saves" => format!("{:?}", self.keep_saves),
            "standby" => self.standby.to_string(),
            "standby_poll" => format!("{:?}", self.standby_poll),
            "flush" => format!("{:?}", self.flush),
            "mlock" => self.mlock.to_string(),
            "numa_nodes" => format!("{:?}", self.numa_nodes),
            "numa_policy" => format!("{:?}", self.numa_policy),
            "huge_pages" => format!("{:?}", self.huge_pages),
            _ => {
                return self
                    .nbd
                    .setting(key)
                    .or_else(|| self.iscsi.setting(key))
                    .or_else(|| self.fuse.setting(key))
                    .or_else(|| self.more.setting(key))
            }
        };
        Some(v)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_is_a_setting() {
        use clap::Args;
        let cmd = DiskArgs::augment_args(clap::Command::new("t"));
        let cmd = cmd.no_binary_name(true);
        let a = {
            use clap::FromArgMatches;
            DiskArgs::from_arg_matches(&cmd.clone().get_matches_from(["--size", "1G"])).unwrap()
        };
        for arg in cmd.get_arguments().filter(|a| a.get_long().is_some()) {
            let id = arg.get_id().as_str();
            assert!(id == "help" || a.setting(id).is_some(), "no setting {id}");
        }
    }

    #[test]
    fn names_and_sizes() {
        assert!(parse_name("ram0").is_ok());
        assert!(parse_name("../x").is_err());
        assert!(parse_name("").is_err());
        assert!(parse_disk_size("0").unwrap_err().contains("\"0\""));
        assert_eq!(parse_disk_size("unlimited"), Ok(DiskSize::Unlimited));
        assert!(parse_disk_size("9E").is_err());
    }
}
