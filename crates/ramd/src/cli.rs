//! Command-line interface: every option parsed and checked here, at the edge.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use ramd_daemon::args::{parse_codec, DiskArgs};
use ramd_store::Codec;

#[derive(Parser, Debug)]
#[command(
    name = "ramd",
    version,
    about = "A RAM disk you can trust: memory-speed disks served over NBD or mounted through FUSE",
    long_about = "ramd keeps disks in RAM: sparse (untouched, zeroed and trimmed pages cost \
                  nothing), capped by a memory budget (a full disk answers ENOSPC, never an \
                  OOM). A block disk is served over NBD to qemu, libnbd tools, fio and \
                  nbdfuse; a filesystem disk (--mount) is a tmpfs-like directory.",
    after_help = "Examples:\n  \
        ramd serve --size 1G                       # disk ram0 on /run/ramd/ram0.sock\n  \
        nbdinfo 'nbd+unix:///ram0?socket=/run/ramd/ram0.sock'\n  \
        ramd serve --size 4G --listen tcp:10809    # TCP on 127.0.0.1:10809\n  \
        ramd serve --size 4G --listen tcp:0.0.0.0:10809 --tls require --tls-certificates DIR\n  \
        ramd serve --size 4G --listen tcp:0.0.0.0:10809 --insecure   # every address, no TLS\n  \
        ramd serve --size 1G --mount /mnt/ram      # a tmpfs-like directory\n  \
        ramd serve --size 8G --max-memory 2G --compress lz4   # zram-like\n  \
        ramd serve --size 4G --image /var/lib/ramd/db --autosave 5m   # persistent\n  \
        ramd snapshot ram0\n  \
        ramd up -c /etc/ramd/ramd.toml             # every disk of a config file\n  \
        ramd status\n  \
        ramd status --watch --interval 1s          # like top, until Ctrl-C\n  \
        ramd down ram0                             # stop (and save) one disk"
)]
pub struct Cli {
    /// Directory for control sockets and default NBD sockets.
    #[arg(long, global = true, env = "RAMD_RUN_DIR", value_name = "DIR")]
    pub run_dir: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

// Parsed once per run: the size of the serve variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run one disk in the foreground until SIGINT or SIGTERM: a block disk
    /// over NBD, or with --mount a filesystem disk (`umount DIR` stops it too).
    #[command(
        after_help = "When ready ramd prints one line alone on stdout: the NBD URI of a \
                      block disk, or the mount point of a filesystem disk. Logs go to \
                      stderr (level set by RAMD_LOG, e.g. RAMD_LOG=debug)."
    )]
    #[command(args_override_self = true)]
    Serve(ServeArgs),
    /// Run every disk of a config file in one process, sharing one memory
    /// budget and one set of background threads, until SIGINT/SIGTERM or
    /// `ramd down`. SIGHUP (or `ramd reload`) re-reads the file.
    #[command(
        after_help = "When every disk serves, ramd prints `NAME WHERE` for each on stdout. \
                      Example file:\n\n  \
                      [daemon]\n  max_memory = \"8G\"          # all disks together\n\n  \
                      [disk.scratch]\n  kind = \"fs\"\n  size = \"2G\"\n  \
                      mount = \"/mnt/scratch\"\n\n  \
                      [disk.vm]\n  size = \"20G\"\n  compress = \"lz4\"\n  \
                      listen = [\"unix:/run/ramd/vm.sock\", \"tcp:10809\"]\n  \
                      image = \"/var/lib/ramd/vm\"\n  autosave = \"5m\""
    )]
    Up(UpArgs),
    /// Stop one disk, or every disk of the run directory; each is saved
    /// first if it has an image. Returns once they are gone.
    Down(DownArgs),
    /// Make a running `ramd up` match its config file: start the disks it
    /// adds, stop (and save) those it removes, leave the others alone. A
    /// file that does not parse changes nothing.
    Reload(ReloadArgs),
    /// Show every running disk: size, use, memory, pages, last save
    /// (`--watch`: refreshed until Ctrl-C). On a terminal the table fits
    /// its width (or COLUMNS); a pipe or a file gets every column.
    Status(StatusArgs),
    /// Save a running disk to its image now (needs `serve --image`).
    Snapshot(SnapshotArgs),
    /// Make a standby (`serve --standby`) the writer of its image: once
    /// the writer's lease has run out (it stopped, or died), or at once
    /// with --force. The disk then takes writes and saves to the image,
    /// with the same identity (NBD description, iSCSI NAA and serial).
    #[command(
        after_help = "A writer that stops cleanly releases its lease: the standby is \
                      promoted at once. One that died holds it until it runs out (a minute): \
                      promote waits up to --wait for that. --force takes a live lease over: the \
                      old writer's next save then fails (nothing it commits can overwrite the \
                      promoted disk's saves), and its clients' writes since its last save are \
                      lost to the image.\n\n\
                      Example:\n  ramd promote vm --wait 2m"
    )]
    Promote(PromoteArgs),
    /// Inspect, check and convert images offline.
    #[command(subcommand)]
    Image(ImageCommand),
    /// Write a systemd unit that runs `ramd up` at boot (Type=notify: ready
    /// once every disk serves; `ramd down` saves at stop). Runs no systemctl.
    #[command(
        after_help = "Then: systemctl daemon-reload && systemctl enable --now ramd\n\
                      `systemctl reload ramd` runs `ramd reload`; `systemctl stop ramd` runs \
                      `ramd down`, which saves every disk that has an image."
    )]
    InstallSystemd(InstallSystemdArgs),
    /// Measure directories, files, block devices or NBD exports side by
    /// side with the workloads RAM-disk reviews publish: dd, sysbench fileio,
    /// pg_test_fsync, IOMeter, RedHawk's seek+8 MiB loop, untar/stat/rm.
    #[command(
        after_help = "Each measurement runs on every target in turn (A B C, A B C, ...), \
                      --runs times; the table gives medians and ratios to the first target. \
                      A raw disk or export must read as zeros over its first MiB (or pass \
                      --destructive); the range used is zeroed again at the end. Ctrl-C stops \
                      between two measurements and cleans up the same way.\n\n\
                      Examples:\n  \
            ramd bench /dev/shm /mnt/ram                 # tmpfs vs a ramd filesystem disk\n  \
            ramd bench /tmp/x 'nbd+unix:///ram0?socket=/run/ramd/ram0.sock' --json\n  \
            ramd bench /mnt/ram --only dd,pg-fsync --size 1G --svg bench.svg"
    )]
    Bench(crate::bench::BenchArgs),
    /// Make `mount -t fuse.ramd` and fstab lines work: symlinks
    /// /sbin/mount.fuse.ramd and /sbin/umount.fuse.ramd to this binary,
    /// which mount(8) and umount(8) run for type fuse.ramd.
    #[command(after_help = "Then:\n  \
            mount -t fuse.ramd scratch /mnt/x -o size=2G,compress=zstd,image=/var/lib/ramd/x\n  \
            echo 'scratch /mnt/x fuse.ramd size=2G,mode=1777,nosuid,nodev 0 0' >> /etc/fstab\n\n\
            Options are the keys of a [disk.NAME] table (size, compress, image, autosave, \
            max_memory, mode, uid, gid, nr_inodes, ...; max-memory works too), plus \
            mount's own: ro, rw, nosuid, nodev, noexec, noatime, relatime, strictatime, \
            nodiratime, and name=NAME (default: from the mount point, /mnt/x is mnt-x) \
            and run_dir=DIR. `umount` saves and stops; `mount -o remount,size=4G` resizes.")]
    InstallMountHelper(InstallMountHelperArgs),
    /// Print a shell completion script.
    #[command(after_help = "Examples:\n  \
            ramd completions bash > /etc/bash_completion.d/ramd\n  \
            ramd completions zsh > \"${fpath[1]}/_ramd\"\n  \
            ramd completions fish > ~/.config/fish/completions/ramd.fish")]
    Completions {
        /// The shell to complete in.
        shell: clap_complete::Shell,
    },
    /// Print the manual page (roff) of ramd or of one of its commands.
    #[command(after_help = "Examples:\n  \
            ramd man | man -l -\n  \
            ramd man status | man -l -\n  \
            ramd man --out-dir /usr/local/share/man/man1   # every page, ramd*.1")]
    Man(ManArgs),
}

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// The command whose page to print (`status`, `image verify`; default:
    /// ramd's own page).
    #[arg(value_name = "COMMAND")]
    pub command: Vec<String>,

    /// Write every page (ramd.1, ramd-serve.1, ...) into this directory
    /// instead.
    #[arg(long, value_name = "DIR", conflicts_with = "command")]
    pub out_dir: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct InstallSystemdArgs {
    /// The config file the unit's `ramd up -c` reads.
    #[arg(long, value_name = "FILE", default_value = "/etc/ramd/ramd.toml")]
    pub config: PathBuf,

    /// The ramd binary the unit runs (default: this one).
    #[arg(long, value_name = "PATH")]
    pub bin: Option<PathBuf>,

    /// Where to write ramd.service.
    #[arg(long, value_name = "DIR", default_value = "/etc/systemd/system")]
    pub unit_dir: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct InstallMountHelperArgs {
    /// Where mount(8) looks for helpers.
    #[arg(long, value_name = "DIR", default_value = "/sbin")]
    pub dir: PathBuf,

    /// The ramd binary the links point to (default: this one).
    #[arg(long, value_name = "PATH")]
    pub bin: Option<PathBuf>,
}

#[derive(clap::Args, Debug)]
pub struct PromoteArgs {
    /// The disk (its --name), a standby.
    pub name: String,

    /// Take the image's lease over even while its writer holds it.
    #[arg(long)]
    pub force: bool,

    /// How long to wait for the writer's lease to run out (0: fail at once
    /// if it is held, naming its holder and when it runs out).
    #[arg(long, default_value = "2m", value_parser = ramd_daemon::units::parse_duration, value_name = "DURATION")]
    pub wait: std::time::Duration,

    /// Print JSON for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct SnapshotArgs {
    /// The disk (its --name).
    pub name: String,

    /// Write every page, starting a new chain, instead of only the pages
    /// changed since the last save.
    #[arg(long)]
    pub full: bool,

    /// Save the whole disk into this new (or empty) directory, or
    /// s3://BUCKET/PREFIX without an image, which becomes the disk's image
    /// from now on: the way out when its image's filesystem is full or
    /// gone. The old image is left as it was. A disk with --replicate
    /// takes only a directory (its replica follows it there).
    #[arg(long, value_name = "DIR|URL", conflicts_with = "full")]
    pub to: Option<PathBuf>,

    /// Print JSON for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand, Debug)]
pub enum ImageCommand {
    /// What an image holds: kind, size, identity, its chain of saves.
    Info {
        /// The image (serve's --image): a directory or s3://BUCKET/PREFIX.
        dir: PathBuf,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Read every save of an image and check every checksum and every
    /// compressed page; names the first bad place and exits 1.
    Verify {
        /// The image: a directory or s3://BUCKET/PREFIX.
        dir: PathBuf,
    },
    /// List the saves an image can be restored to (`ramd image restore`):
    /// its chain's, and those of the chains kept by --keep-saves; sequence
    /// number, full or incremental, pages, bytes, time of its switch, and
    /// the MANIFEST that names it.
    Ls {
        /// The image: a directory or s3://BUCKET/PREFIX.
        dir: PathBuf,
        /// Print JSON for scripts (an array of saves).
        #[arg(long)]
        json: bool,
    },
    /// Make a new image holding the disk as of one kept save: any save of
    /// the image's chain, or of a chain kept by `serve --keep-saves`
    /// (`ramd image ls` lists them).
    #[command(
        after_help = "--at takes a save's sequence number (as `ramd image ls` shows it), a time \
                      (RFC 3339: 2026-11-26T14:30:00Z, or 2026-11-26 14:30:00 in UTC), or how \
                      long ago (10m, 2h, \"1h 30m ago\"): for a time, the newest save at or \
                      before it is taken, and the command says which. The segments of that save's \
                      chain up to it are copied byte for byte, every record checked on the way, \
                      and a MANIFEST naming them is written to DEST, which must be a new or empty \
                      directory or a prefix without an image. DEST is a new disk, with a new \
                      identity (id), unless --same-id: serve it with `ramd serve --image DEST`. \
                      SRC is only read (no lock or lease is taken).\n\n\
                      Examples:\n  \
            ramd image restore /var/lib/ramd/vm --at 41 --to /var/lib/ramd/vm-41\n  \
            ramd image restore s3://backups/vm --at \"2 hours ago\" --to /var/lib/ramd/vm-before\n  \
            ramd image restore /var/lib/ramd/vm --at 2026-11-26T14:30:00Z --to s3://backups/vm-then"
    )]
    Restore {
        /// The image: a directory or s3://BUCKET/PREFIX.
        src: PathBuf,
        /// Which save: a sequence number, a time, or a duration ago.
        #[arg(long, value_name = "SEQ|TIME|DURATION")]
        at: String,
        /// The new image: a new or empty directory, or s3://BUCKET/PREFIX.
        #[arg(long, value_name = "DIR|URL")]
        to: PathBuf,
        /// Give the new image SRC's identity (the same disk moved back in
        /// time, e.g. to replace it), rather than a new one.
        #[arg(long)]
        same_id: bool,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Remove an image's debris: save files (in object storage, segment
    /// objects) that its MANIFEST does not name, left by interrupted saves
    /// or by chains a full save replaced; says what it removed.
    #[command(
        after_help = "Only names a save writes are candidates (seg-N, seg-N.tmp, MANIFEST.tmp; \
                      in object storage seg-N-T and seg-N-T.upload): other files and objects are \
                      left alone, and so are the chains kept by --keep-saves (MANIFEST-N) and \
                      their segments, unless --keep-saves is given here. The image must not be in use: prune takes the directory's lock \
                      or the prefix's lease as `ramd serve` does, and is refused while a ramd \
                      holds it. `ramd serve` removes the same debris when it opens the image. In \
                      object storage, the incomplete multipart upload of a ramd killed mid-save \
                      is aborted through its record (seg-N-T.upload, listed as removed); uploads \
                      without a record need a bucket lifecycle rule \
                      (AbortIncompleteMultipartUpload).\n\n\
                      Examples:\n  \
            ramd image prune /var/lib/ramd/vm\n  \
            ramd image prune s3://backups/vm --json"
    )]
    Prune {
        /// The image: a directory or s3://BUCKET/PREFIX.
        dir: PathBuf,
        /// Also remove the chains kept by `serve --keep-saves` (MANIFEST-N
        /// and the segments only it names) whose newest save is older than
        /// DURATION; 0 removes them all. Without it, kept chains stay.
        #[arg(long, value_parser = ramd_daemon::units::parse_duration, value_name = "DURATION")]
        keep_saves: Option<std::time::Duration>,
        /// Print JSON for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Write an image's data out: a block disk as a raw disk image
    /// (sparse), for qemu-img, dd, losetup; a filesystem disk as a
    /// directory tree, or as a tar archive.
    #[command(
        after_help = "A filesystem image is written with its files' data (holes kept \
                      sparse in a directory; written as zeros in a tar), directories, symlinks, \
                      hard links as links, fifos and device nodes, modes, owners, times and \
                      xattrs. What the target cannot take (an owner without root, a device node, \
                      an xattr the filesystem refuses) is listed as `not set: ...` on stderr, and \
                      the export goes on. A directory target must be new or empty; an existing \
                      file is replaced only with --force. The image must be whole: for a damaged \
                      one use `ramd image salvage DIR --export PATH`.\n\n\
                      Examples:\n  \
            ramd image export /var/lib/ramd/vm --to vm.raw\n  \
            ramd image export /var/lib/ramd/scratch --to /srv/scratch-copy\n  \
            ramd image export /var/lib/ramd/scratch --to scratch.tar"
    )]
    Export {
        /// The image: a directory or s3://BUCKET/PREFIX.
        dir: PathBuf,
        /// Where to write (as --to; kept for scripts that name it second).
        #[arg(value_name = "PATH", conflicts_with = "to")]
        raw: Option<PathBuf>,
        /// Where to write: a raw file (block image), a directory, or a tar
        /// archive if PATH ends in `.tar` or with --tar (filesystem image).
        #[arg(long, value_name = "PATH", required_unless_present = "raw")]
        to: Option<PathBuf>,
        /// Write a filesystem image as a tar archive whatever PATH's name.
        #[arg(long)]
        tar: bool,
        /// Replace an existing file at PATH (never a non-empty directory).
        #[arg(long)]
        force: bool,
    },
    /// Get what can be got out of a damaged image: load every page whose
    /// checksum verifies, say per file and offset what could not be, and
    /// write a new, whole image and/or the files.
    #[command(
        after_help = "Reads the whole chain of saves, skipping records that fail their \
                      checksum (and a truncated segment's missing tail) instead of stopping. A \
                      page whose newest copy is damaged keeps the copy of the save before, if \
                      there is one, and the report says so; if the filesystem's tree of the last \
                      save is damaged, the newest readable one is used (and files it does not \
                      know go to lost+found/slot-N); with none, every file's data goes to \
                      lost+found. With no MANIFEST, the chain is rebuilt from the segment \
                      files. The image itself is never changed.\n\n\
                      The report (stdout; --json for one JSON object) names each damaged \
                      place (segment file, offset) and what could not be recovered: byte ranges \
                      of a block disk, or file paths and byte ranges of a filesystem.\n\n\
                      Exit status: 0 everything was recovered; 3 something was lost or is \
                      uncertain (the report says what; the new image and export are still \
                      written); 1 nothing could be salvaged (no image found, or an error \
                      writing).\n\n\
                      Examples:\n  \
            ramd image salvage /var/lib/ramd/db                      # report only\n  \
            ramd image salvage /var/lib/ramd/db --to /var/lib/ramd/db-saved\n  \
            ramd image salvage /var/lib/ramd/scratch --export /srv/rescued --json"
    )]
    Salvage {
        /// The damaged image directory (only read).
        dir: PathBuf,
        /// Write what was recovered as a new image here (a full save; must
        /// be new or empty): `ramd serve --image NEWDIR` serves it.
        #[arg(long, value_name = "NEWDIR")]
        to: Option<PathBuf>,
        /// Also write the data out, as `image export --to PATH` does.
        #[arg(long, value_name = "PATH")]
        export: Option<PathBuf>,
        /// With --export of a filesystem image: a tar archive.
        #[arg(long, requires = "export")]
        tar: bool,
        /// Replace an existing file at the --export PATH.
        #[arg(long)]
        force: bool,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Make a block disk image from a raw disk image: `serve --image DIR`
    /// then serves its data.
    Import {
        /// The raw disk image to read.
        raw: PathBuf,
        /// The image to create: a directory (must not exist, or be empty)
        /// or s3://BUCKET/PREFIX (must hold no objects).
        dir: PathBuf,
        /// Store pages compressed with this codec (as `serve --compress`).
        #[arg(long, default_value = "none", value_parser = parse_codec, value_name = "CODEC")]
        compress: Codec,
    },
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Take this disk's settings from a TOML config file: a `[disk.NAME]`
    /// table whose keys are these flags with underscores (`max_memory =
    /// "2G"`, `compress = "zstd"`, `noatime = true`) and `kind = "block" |
    /// "fs"`. Flags on the command line override the file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// The disk of --config to serve (default: its only disk).
    #[arg(long = "disk", value_name = "NAME", requires = "config")]
    pub disk_name: Option<String>,

    /// Serve Prometheus metrics over HTTP at ADDR (`GET /metrics`): PORT
    /// listens on 127.0.0.1 only; any other interface must be written out
    /// (`0.0.0.0:9100`, `[::]:9100`). Port 0 picks a free port (see `ramd
    /// status --json`). Off by default.
    #[arg(long, value_name = "ADDR", value_parser = ramd_daemon::metrics::parse_addr)]
    pub metrics: Option<std::net::SocketAddr>,

    #[command(flatten)]
    pub disk: DiskArgs,
}

#[derive(clap::Args, Debug)]
pub struct UpArgs {
    /// The config file: a `[disk.NAME]` table per disk and an optional
    /// `[daemon]` table (run_dir, max_memory shared by all disks,
    /// host_reserve, compress_threads, metrics).
    #[arg(
        short,
        long,
        value_name = "FILE",
        default_value = "/etc/ramd/ramd.toml"
    )]
    pub config: PathBuf,

    /// Serve Prometheus metrics over HTTP at ADDR (`GET /metrics`): PORT
    /// listens on 127.0.0.1 only; any other interface must be written out
    /// (`0.0.0.0:9100`, `[::]:9100`). Port 0 picks a free port (see `ramd
    /// status --json`). Off by default; overrides `[daemon] metrics`.
    #[arg(long, value_name = "ADDR", value_parser = ramd_daemon::metrics::parse_addr)]
    pub metrics: Option<std::net::SocketAddr>,

    /// Stop every disk if one cannot start (the default: the others start,
    /// the failed one shows as FAILED in `ramd status`, and `ramd reload`
    /// tries it again).
    #[arg(long)]
    pub all_or_nothing: bool,
}

#[derive(clap::Args, Debug)]
pub struct DownArgs {
    /// The disk to stop. Without it, `ramd down` stops the run directory's
    /// `ramd up` daemon (never a separate `ramd serve` or a mount).
    #[arg(conflicts_with_all = ["all", "pid"])]
    pub name: Option<String>,

    /// Stop every disk of the run directory: every daemon, every `ramd
    /// serve`, every `mount -t fuse.ramd` disk.
    #[arg(long, conflicts_with = "pid")]
    pub all: bool,

    /// Stop what process PID serves (a `ramd up` daemon or a `ramd serve`):
    /// the systemd unit's `ExecStop` stops its own daemon this way.
    #[arg(long, value_name = "PID")]
    pub pid: Option<u32>,

    /// Stop even if the save fails, and say what is lost then. Without it,
    /// a disk whose save fails keeps serving (or holding its data) until a
    /// save succeeds.
    #[arg(long)]
    pub force: bool,

    /// Print JSON for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct ReloadArgs {
    /// Read this config file instead of the one `ramd up` was started with
    /// (it becomes the daemon's file).
    #[arg(short, long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Print JSON for scripts.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Print JSON for scripts instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Only this disk.
    pub name: Option<String>,

    /// Refresh until Ctrl-C, like `watch`: in place on a terminal; one
    /// table after another (blank-line separated, or a JSON line each with
    /// --json) when stdout is a pipe or a file.
    #[arg(short, long)]
    pub watch: bool,

    /// How often --watch refreshes (`500ms`, `2s`, `1m`).
    #[arg(
        short = 'n',
        long,
        value_name = "DURATION",
        default_value = "2s",
        value_parser = parse_interval,
        requires = "watch"
    )]
    pub interval: std::time::Duration,
}

/// A --watch interval: a duration of at least 100 ms.
fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    let d = ramd_daemon::units::parse_duration(s)?;
    if d < std::time::Duration::from_millis(100) {
        return Err(format!(
            "{s}: refreshing more often than every 100ms only costs CPU"
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clap_definition_is_valid() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
