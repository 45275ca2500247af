//! FUSE's settings: one group of a disk's flags (and so of its config
//! table's keys and its mount options): the mount point, the root's mode
//! and owner, the mount's flags, and how requests and data travel.

use std::path::PathBuf;

use crate::{Atime, AtimeMode};

#[derive(clap::Args, Debug, Clone)]
pub struct FuseArgs {
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
}

impl FuseArgs {
    /// One setting by its config key, as text to compare (a remount
    /// checks that what it cannot change is unchanged); `None`: not a key
    /// of this group.
    pub fn setting(&self, key: &str) -> Option<String> {
        let v = match key {
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
            "fuse_transport" => self.fuse_transport.to_string(),
            "data_path" => self.data_path.to_string(),
            _ => return None,
        };
        Some(v)
    }

    /// A filesystem disk's atime rule.
    pub fn atime(&self) -> Atime {
        Atime {
            mode: match (self.noatime, self.strictatime) {
                (true, _) => AtimeMode::Never,
                (false, true) => AtimeMode::Strict,
                (false, false) => AtimeMode::Relatime,
            },
            nodiratime: self.nodiratime,
        }
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

fn parse_mode(s: &str) -> Result<u16, String> {
    u16::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("invalid mode {s:?}: use octal permissions like 1777 or 755"))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(parse_mode("1777"), Ok(0o1777));
        assert!(parse_mode("8").is_err());
        assert!(parse_mode("17777").is_err());
    }
}
