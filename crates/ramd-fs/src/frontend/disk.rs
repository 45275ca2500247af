//! A filesystem disk's settings as the FUSE frontend reads them
//! ([`FsDisk`]: its own group, the store's, the common ones), and what
//! they decide: the mount's flags and write-back cache, the data path
//! (`--data-path auto` resolved), and the kernel tmpfs's configuration.

use ramd_frontend::{DiskSettings, StoreSettings};

use crate::settings::{DataPath, FuseArgs};

/// What the FUSE frontend reads of a filesystem disk's settings: its own
/// group, the store's, and the common ones.
pub struct FsDisk<'a> {
    pub fuse: &'a FuseArgs,
    pub store: StoreSettings,
    pub name: &'a str,
    pub read_only: bool,
    pub threads: u16,
}

impl FsDisk<'_> {
    /// A filesystem disk's (`--mount`); `None` for any other.
    pub fn of(disk: &dyn DiskSettings) -> Option<FsDisk<'_>> {
        let fuse = disk.get::<FuseArgs>().filter(|f| f.mount.is_some())?;
        Some(FsDisk {
            fuse,
            store: disk.store(),
            name: disk.name(),
            read_only: disk.read_only(),
            threads: disk.threads(),
        })
    }

    /// Whether the mount uses the kernel's write-back cache (see
    /// [`writeback_cache`]).
    pub fn writeback_cache(&self) -> bool {
        writeback_cache(self.fuse, self.store.standby)
    }

    pub fn mount_flags(&self) -> crate::MountFlags {
        mount_flags(self.fuse, self.name, self.read_only, self.store.standby)
    }
}

/// Whether a filesystem disk uses the kernel's write-back cache. Not a
/// standby's: with it the kernel keeps regular files' sizes and times as
/// its own, and would not take those of an applied save.
pub fn writeback_cache(fuse: &FuseArgs, standby: bool) -> bool {
    !fuse.no_writeback_cache && !standby
}

/// A filesystem disk's mount flags.
pub fn mount_flags(
    fuse: &FuseArgs,
    name: &str,
    read_only: bool,
    standby: bool,
) -> crate::MountFlags {
    crate::MountFlags {
        source: fuse.source.clone().unwrap_or_else(|| name.to_string()),
        // A standby's mount is read-only until its promotion.
        read_only: read_only || standby,
        nosuid: fuse.nosuid,
        nodev: fuse.nodev,
        noexec: fuse.noexec,
    }
}

/// The data path of a filesystem disk: `--data-path`, with auto resolved
/// (kernel unless a setting asks for the store or this host cannot give
/// passthrough), and, when auto chose the store, why.
pub fn data_path(args: &FsDisk) -> (DataPath, Option<String>) {
    match args.fuse.data_path {
        DataPath::Auto => {
            // Compression under auto keeps its meaning from before auto:
            // every page compressed. The kernel path's cold tier (hot
            // files in the tmpfs, idle closed ones compressed) is asked
            // for by name.
            let why = if args.store.compresses() {
                Some(
                    "--compress and --recompress ask for the store path, which compresses every \
                     page (for the kernel path's cold tier, which compresses idle closed files, \
                     give --data-path kernel --compress)"
                        .to_string(),
                )
            } else {
                kernel_data_path_refusal(args)
            };
            match why {
                None => (DataPath::Kernel, None),
                Some(why) => (DataPath::Store, Some(why)),
            }
        }
        path => (path, None),
    }
}

/// Why this disk cannot have `--data-path kernel`: a setting it does not
/// have, or what this host or process lacks. Asked for by name, that
/// refuses the disk before anything is allocated; under auto, the disk
/// takes the store path.
pub(super) fn kernel_data_path_refusal(args: &FsDisk) -> Option<String> {
    if args.store.standby {
        return Some(
            "a standby (--standby) serves file data from the store, where each applied save \
             puts it; --data-path kernel keeps it in backing files the kernel reads directly"
                .into(),
        );
    }
    if args.store.compress.is_none() && args.store.compress_after.is_some() {
        return Some(
            "--compress-after needs --compress to name a codec (lz4 or zstd): with --data-path \
             kernel it is how long a closed file stays untouched before it moves, compressed, \
             to the cold tier"
                .into(),
        );
    }
    if !args.store.recompress.is_none() {
        return Some(
            "--data-path kernel cannot re-pack pages (--recompress): its cold tier compresses \
             whole idle files with --compress; leave --recompress out, or use --data-path store"
                .into(),
        );
    }
    if args.fuse.writeback_cache {
        return Some(
            "--data-path kernel cannot use the write-back cache (--writeback-cache): the \
             kernel refuses FUSE passthrough with it; leave the flag out"
                .into(),
        );
    }
    if !has_cap_sys_admin() {
        return Some(
            "--data-path kernel needs CAP_SYS_ADMIN (to make its private tmpfs and to register \
             backing files with FUSE); run ramd as root or use --data-path store"
                .into(),
        );
    }
    if !kernel_has_passthrough() {
        return Some(
            "--data-path kernel needs FUSE passthrough, which this kernel lacks (Linux 6.9+ \
             built with CONFIG_FUSE_PASSTHROUGH: no fuse_passthrough_open in /proc/kallsyms); \
             use --data-path store"
                .into(),
        );
    }
    None
}

/// Whether this kernel has FUSE passthrough: its code is listed in
/// /proc/kallsyms (names are listed even where addresses are hidden).
/// Looked up once per process.
fn kernel_has_passthrough() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        use std::io::BufRead;
        // A fuse module not loaded yet is loaded by an open of /dev/fuse.
        drop(std::fs::File::open("/dev/fuse"));
        let Ok(f) = std::fs::File::open("/proc/kallsyms") else {
            return false;
        };
        std::io::BufReader::new(f)
            .lines()
            .map_while(Result::ok)
            .any(|l| l.split_whitespace().nth(2) == Some("fuse_passthrough_open"))
    })
}

/// Whether this process has CAP_SYS_ADMIN in effect (CapEff, bit 21).
fn has_cap_sys_admin() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << 21) != 0)
}

/// The private tmpfs of `--data-path kernel`, from the disk's settings:
/// its size, inode limit (one more for the tmpfs's own root), huge pages
/// and NUMA nodes and policy.
pub fn hot_config(args: &FsDisk, cfg: &crate::FsConfig) -> crate::hot::HotConfig {
    use ramd_store::numa::NumaPolicy;
    use ramd_store::HugePages;
    let huge = args.store.huge_pages.map(|h| match h {
        HugePages::Never => "never",
        HugePages::Madvise => "advise",
        HugePages::Always => "always",
    });
    let mpol = args.store.numa_nodes.as_ref().map(|nodes| {
        let list = nodes
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        match args.store.numa_policy.unwrap_or_default() {
            NumaPolicy::Bind => format!("bind:{list}"),
            // tmpfs prefers one node: the first.
            NumaPolicy::Preferred => format!("prefer:{}", nodes.first().copied().unwrap_or(0)),
            NumaPolicy::Interleave => format!("interleave:{list}"),
        }
    });
    crate::hot::HotConfig {
        size: cfg.size,
        nr_inodes: cfg.nr_inodes.saturating_add(1),
        huge,
        mpol,
        atime: cfg.atime.mode,
    }
}
