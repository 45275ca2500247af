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
    /// defaults to 127.0.0.1; an address beyond loopback, such as 0.0.0.0,
    /// needs --tls require or --insecure). Repeat it to serve the disk on
    /// several sockets at once. Default: unix:RUN_DIR/NAME.sock.
    #[arg(long, value_parser = parse_listen, value_name = "ADDR", conflicts_with = "mount")]
    pub listen: Vec<Listen>,

    /// Let --listen tcp: on an address beyond loopback serve NBD to
    /// clients without TLS: anyone who can reach it can read and write the
    /// disk.
    #[arg(long, conflicts_with = "mount")]
    pub insecure: bool,

    /// NBD over TLS (the protocol's STARTTLS, as nbdkit and qemu speak it):
    /// off; on (offered, a client may decline it and go on in plaintext);
    /// require (every option but STARTTLS is refused before TLS: the disk
    /// is never served in plaintext). Default: on with --tls-certificates,
    /// else off. The printed URI is nbds:// (nbds+unix://) when TLS is on.
    #[arg(long, value_parser = parse_tls, value_name = "MODE", conflicts_with = "mount")]
    pub tls: Option<TlsMode>,

    /// NBD TLS credentials: a directory holding server-cert.pem and
    /// server-key.pem (PEM), ca-cert.pem for --tls-verify-peer, and
    /// optionally ca-crl.pem: the layout nbdkit and qemu use.
    #[arg(long, value_name = "DIR", conflicts_with = "mount")]
    pub tls_certificates: Option<PathBuf>,

    /// NBD TLS: a client must present a certificate signed by the CA of
    /// ca-cert.pem in --tls-certificates (and not revoked in ca-crl.pem).
    #[arg(long, requires = "tls_certificates")]
    pub tls_verify_peer: bool,

    /// Serve the block disk as a LUN of the daemon's iSCSI target on this
    /// portal: [HOST:]PORT (HOST defaults to 127.0.0.1; an address beyond
    /// loopback needs --iscsi-chap or --iscsi-no-auth). Disks giving the
    /// same portal share it.
    #[arg(long, value_parser = parse_portal, value_name = "[HOST:]PORT", conflicts_with = "mount")]
    pub iscsi: Option<SocketAddr>,

    /// The disk's LUN number on the iSCSI target (0..=16383). Default: the
    /// lowest free one, in config order.
    #[arg(long, value_name = "N", requires = "iscsi", value_parser = clap::value_parser!(u16).range(0..16384))]
    pub iscsi_lun: Option<u16>,

    /// The iSCSI target's name, shared by all the daemon's disks.
    /// Default: iqn.2026-11.org.ramd:HOSTNAME.
    #[arg(long, value_name = "IQN", requires = "iscsi", value_parser = parse_iqn)]
    pub iscsi_target: Option<String>,

    /// CHAP that iSCSI initiators must pass: USER:SECRET (secret 12 to 255
    /// characters).
    #[arg(long, value_name = "USER:SECRET", requires = "iscsi", value_parser = parse_chap)]
    pub iscsi_chap: Option<(String, String)>,

    /// Mutual CHAP: the name and secret ramd answers an initiator's
    /// challenge with, USER:SECRET. Needs --iscsi-chap.
    #[arg(long, value_name = "USER:SECRET", requires = "iscsi_chap", value_parser = parse_chap)]
    pub iscsi_mutual_chap: Option<(String, String)>,

    /// Let an iSCSI portal beyond loopback serve without CHAP.
    #[arg(long, requires = "iscsi")]
    pub iscsi_no_auth: bool,

    /// Logical block size that SCSI initiators see: 512 or 4096.
    #[arg(long, default_value_t = 512, value_parser = parse_block_size, value_name = "BYTES", conflicts_with = "mount")]
    pub block_size: u32,

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

    /// Filesystem disk: the mount's source, the first field of
    /// /proc/mounts (what `umount SOURCE` and `findmnt SOURCE` match).
    /// Default: the disk's name.
    #[arg(long, value_name = "SOURCE", requires = "mount", value_parser = parse_source)]
    pub source: Option<String>,

    /// Filesystem disk: never update access times.
    #[arg(long, requires = "mount", conflicts_with = "strictatime")]
    pub noatime: bool,

    /// Filesystem disk: update access times on every access (default:
    /// relatime, only when older than the last change or a day old).
    #[arg(long, requires = "mount")]
    pub strictatime: bool,

    /// Filesystem disk: never update directories' access times.
    #[arg(long, requires = "mount")]
    pub nodiratime: bool,

    /// Filesystem disk: setuid and setgid bits do not take effect.
    #[arg(long, requires = "mount")]
    pub nosuid: bool,

    /// Filesystem disk: device nodes cannot be opened.
    #[arg(long, requires = "mount")]
    pub nodev: bool,

    /// Filesystem disk: programs cannot be executed from it.
    #[arg(long, requires = "mount")]
    pub noexec: bool,

    /// Filesystem disk: the kernel caches writes and sends them in large
    /// batches. The default; kept so that older configs still parse.
    #[arg(long, requires = "mount", overrides_with = "no_writeback_cache")]
    pub writeback_cache: bool,

    /// Filesystem disk: send every write(2) to ramd as it happens, not
    /// through the kernel's write-back cache (config: `writeback_cache =
    /// false`). Slower small writes; a full disk is always reported by the
    /// write itself.
    #[arg(long, requires = "mount", overrides_with = "writeback_cache")]
    pub no_writeback_cache: bool,

    /// Filesystem disk: how FUSE requests travel. io-uring: per-CPU
    /// io_uring queues (Linux 6.14+; as root ramd turns the fuse module's
    /// enable_uring on, and says so); dev: read and write on /dev/fuse;
    /// auto: io-uring where it can be had, else dev (saying why).
    #[arg(long, requires = "mount", default_value = "auto", value_parser = parse_fuse_transport, value_name = "TRANSPORT")]
    pub fuse_transport: FuseTransport,

    /// Filesystem disk: where regular files' data lives. kernel: a
    /// private kernel tmpfs (size, inodes, huge pages and NUMA policy from
    /// this disk's settings) whose files the kernel reads and writes
    /// directly (FUSE passthrough, Linux 6.9+, as root); ramd keeps names,
    /// modes, owners, times and xattrs; a save is not one point in time
    /// for files written while it runs (see README); with --compress,
    /// closed files idle for --compress-after move out of the tmpfs into
    /// ramd's store, compressed, and back when opened; not with
    /// --recompress or --writeback-cache. store: ramd's page store, every
    /// read and write a FUSE request. auto (the default): kernel where it
    /// can be had and no setting asks for the store (--compress,
    /// --recompress, --writeback-cache), else store (saying why).
    #[arg(long, requires = "mount", default_value = "auto", value_parser = parse_data_path, value_name = "PATH")]
    pub data_path: DataPath,

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

    /// How often a --standby reads the image's MANIFEST for new saves.
    #[arg(long, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
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
}

impl DiskArgs {
    /// `fs` with --mount, else `block`.
    pub fn kind(&self) -> ramd_store::persist::DiskKind {
        match self.mount {
            Some(_) => ramd_store::persist::DiskKind::Fs,
            None => ramd_store::persist::DiskKind::Block,
        }
    }

    /// A filesystem disk's atime rule.
    pub fn atime(&self) -> ramd_fs::Atime {
        use ramd_fs::AtimeMode;
        ramd_fs::Atime {
            mode: match (self.noatime, self.strictatime) {
                (true, _) => AtimeMode::Never,
                (false, true) => AtimeMode::Strict,
                (false, false) => AtimeMode::Relatime,
            },
            nodiratime: self.nodiratime,
        }
    }

    /// `--tls`, or its default: on with certificates, else off.
    pub fn tls_mode(&self) -> TlsMode {
        self.tls.unwrap_or(match self.tls_certificates {
            Some(_) => TlsMode::On,
            None => TlsMode::Off,
        })
    }

    /// Whether a filesystem disk uses the kernel's write-back cache. Not
    /// a standby's: with it the kernel keeps regular files' sizes and
    /// times as its own, and would not take those of an applied save.
    pub fn writeback_cache(&self) -> bool {
        !self.no_writeback_cache && !self.standby
    }

    /// A filesystem disk's mount flags.
    pub fn mount_flags(&self) -> ramd_fs::MountFlags {
        ramd_fs::MountFlags {
            source: self.source.clone().unwrap_or_else(|| self.name.clone()),
            // A standby's mount is read-only until its promotion.
            read_only: self.read_only || self.standby,
            nosuid: self.nosuid,
            nodev: self.nodev,
            noexec: self.noexec,
        }
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
            "listen" => format!("{:?}", self.listen),
            "insecure" => self.insecure.to_string(),
            "tls" => format!("{:?}", self.tls),
            "tls_certificates" => format!("{:?}", self.tls_certificates),
            "tls_verify_peer" => self.tls_verify_peer.to_string(),
            "mount" => format!("{:?}", self.mount),
            "nr_inodes" => format!("{:?}", self.nr_inodes),
            "mode" => format!("{:o}", self.mode),
            "uid" => self.uid.to_string(),
            "gid" => self.gid.to_string(),
            "source" => format!("{:?}", self.source),
            "noatime" => self.noatime.to_string(),
            "strictatime" => self.strictatime.to_string(),
            "nodiratime" => self.nodiratime.to_string(),
            "nosuid" => self.nosuid.to_string(),
            "nodev" => self.nodev.to_string(),
            "noexec" => self.noexec.to_string(),
            "writeback_cache" => self.writeback_cache().to_string(),
            "no_writeback_cache" => (!self.writeback_cache()).to_string(),
            "fuse_transport" => self.fuse_transport.to_string(),
            "data_path" => self.data_path.to_string(),
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
            "iscsi" => format!("{:?}", self.iscsi),
            "iscsi_lun" => format!("{:?}", self.iscsi_lun),
            "iscsi_target" => format!("{:?}", self.iscsi_target),
            "iscsi_chap" => format!("{:?}", self.iscsi_chap),
            "iscsi_mutual_chap" => format!("{:?}", self.iscsi_mutual_chap),
            "iscsi_no_auth" => self.iscsi_no_auth.to_string(),
            "block_size" => self.block_size.to_string(),
            "mlock" => self.mlock.to_string(),
            "numa_nodes" => format!("{:?}", self.numa_nodes),
            "numa_policy" => format!("{:?}", self.numa_policy),
            "huge_pages" => format!("{:?}", self.huge_pages),
            _ => return None,
        };
        Some(v)
    }

    /// The settings that decide what the disk *is*, for `ramd reload` to
    /// tell a changed disk from an unchanged one.
    pub fn fingerprint(&self) -> String {
        format!("{self:?}")
    }
}

/// `--tls`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsMode {
    Off,
    On,
    Require,
}

impl std::fmt::Display for TlsMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TlsMode::Off => "off",
            TlsMode::On => "on",
            TlsMode::Require => "require",
        })
    }
}

fn parse_tls(s: &str) -> Result<TlsMode, String> {
    match s {
        "off" => Ok(TlsMode::Off),
        "on" => Ok(TlsMode::On),
        "require" => Ok(TlsMode::Require),
        _ => Err(format!("invalid TLS mode {s:?}: use off, on or require")),
    }
}

/// `--fuse-transport`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FuseTransport {
    Auto,
    IoUring,
    Dev,
}

impl std::fmt::Display for FuseTransport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            FuseTransport::Auto => "auto",
            FuseTransport::IoUring => "io-uring",
            FuseTransport::Dev => "dev",
        })
    }
}

fn parse_fuse_transport(s: &str) -> Result<FuseTransport, String> {
    match s {
        "auto" => Ok(FuseTransport::Auto),
        "io-uring" | "io_uring" => Ok(FuseTransport::IoUring),
        "dev" => Ok(FuseTransport::Dev),
        _ => Err(format!(
            "invalid FUSE transport {s:?}: use auto, io-uring or dev"
        )),
    }
}

/// `--data-path`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataPath {
    /// Kernel where it can be had, else store: see
    /// `frontends::fuse::data_path`, which resolves it.
    Auto,
    Store,
    Kernel,
}

impl std::fmt::Display for DataPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DataPath::Auto => "auto",
            DataPath::Store => "store",
            DataPath::Kernel => "kernel",
        })
    }
}

fn parse_data_path(s: &str) -> Result<DataPath, String> {
    match s {
        "auto" => Ok(DataPath::Auto),
        "store" => Ok(DataPath::Store),
        "kernel" => Ok(DataPath::Kernel),
        _ => Err(format!(
            "invalid data path {s:?}: use auto, kernel or store"
        )),
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

impl Listen {
    /// A TCP address other than loopback (127.0.0.0/8, ::1, and
    /// ::ffff:127.x.x.x): other hosts may reach it.
    pub fn beyond_loopback(&self) -> bool {
        match self {
            Listen::Unix(_) => false,
            Listen::Tcp(a) => !a.ip().to_canonical().is_loopback(),
        }
    }
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
            Listen::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
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

/// A mount's source: anything mount(8) and /proc/mounts carry as one
/// field, and fusermount as one option.
fn parse_source(s: &str) -> Result<String, String> {
    if s.is_empty() || s.len() > 255 || s.contains([',', ' ', '\t', '\n', '\\']) {
        return Err(format!(
            "invalid source {s:?}: use 1 to 255 characters without spaces, commas or backslashes"
        ));
    }
    Ok(s.to_string())
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

/// An iSCSI portal: PORT (on 127.0.0.1) or HOST:PORT.
fn parse_portal(s: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    s.parse::<SocketAddr>()
        .map_err(|_| format!("invalid iSCSI portal {s:?}: use PORT, HOST:PORT or [IPV6]:PORT"))
}

pub(crate) fn parse_iqn(s: &str) -> Result<String, String> {
    let ok = (s.starts_with("iqn.") || s.starts_with("eui.") || s.starts_with("naa."))
        && s.len() <= 223
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.' | ':'));
    if ok {
        Ok(s.to_string())
    } else {
        Err(format!(
            "invalid iSCSI name {s:?}: use iqn.YYYY-MM.reversed.domain[:name], lower case, \
             at most 223 characters of a-z 0-9 - . :"
        ))
    }
}

fn parse_chap(s: &str) -> Result<(String, String), String> {
    match s.split_once(':') {
        Some((u, p)) if !u.is_empty() && (12..=255).contains(&p.len()) => {
            Ok((u.to_string(), p.to_string()))
        }
        _ => Err(
            "invalid CHAP setting: use USER:SECRET, the secret 12 to 255 characters \
             (what Windows' initiator requires)"
                .into(),
        ),
    }
}

fn parse_block_size(s: &str) -> Result<u32, String> {
    match s {
        "512" => Ok(512),
        "4096" => Ok(4096),
        _ => Err(format!("invalid block size {s:?}: use 512 or 4096")),
    }
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
        let beyond = |s: &str| parse_listen(s).unwrap().beyond_loopback();
        assert!(beyond("tcp:0.0.0.0:1"));
        assert!(beyond("tcp:[::]:1"));
        assert!(beyond("tcp:192.0.2.7:1"));
        assert!(!beyond("tcp:1"));
        assert!(!beyond("tcp:127.3.4.5:1"));
        assert!(!beyond("tcp:[::1]:1"));
        assert!(!beyond("tcp:[::ffff:127.0.0.1]:1"));
        assert!(!beyond("unix:/x.sock"));
        assert!(parse_listen("tcp:host").is_err());
        assert!(parse_listen("unix:").is_err());
        assert!(parse_listen("/x.sock").is_err());
    }

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
    fn iscsi_settings() {
        assert_eq!(parse_portal("3260"), Ok("127.0.0.1:3260".parse().unwrap()));
        assert_eq!(parse_portal("0.0.0.0:1"), Ok("0.0.0.0:1".parse().unwrap()));
        assert!(parse_portal("tcp:3260").is_err());
        assert!(parse_iqn("iqn.2026-11.org.ramd:box").is_ok());
        assert!(parse_iqn("IQN.X").is_err());
        assert!(parse_iqn("target").is_err());
        assert_eq!(
            parse_chap("u:123456789012"),
            Ok(("u".into(), "123456789012".into()))
        );
        assert!(parse_chap("u:short").is_err());
        assert!(parse_chap(":123456789012").is_err());
        assert_eq!(parse_block_size("4096"), Ok(4096));
        assert!(parse_block_size("1024").is_err());
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
