//! `-o` options of `mount -t fuse.ramd SOURCE DIR -o OPTIONS` (and of an
//! fstab line): a disk's settings under their config keys (`size=2G`,
//! `compress=zstd`, `max_memory=1G` or `max-memory=1G`), checked by the
//! same code as config tables ([`crate::config::key_flags`]), plus the
//! words mount(8) itself passes or owns.
//!
//! mount(8) hands a helper `rw` or `ro`, the VFS flags (`nosuid`,
//! `noatime`...), the filesystem's own options and a few of its own
//! (`_netdev`, `nofail`, `user`); it keeps `x-*`, `noauto` and `defaults`
//! to itself, but an fstab line written for another tool may still carry
//! them, so they are accepted and ignored here too.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{bail, Result};
use clap::FromArgMatches;

use crate::args::DiskArgs;
use crate::config::{clap_whole, disk_command, key_flags, Given, KeyError};

/// What one `-o` string asks for.
#[derive(Debug)]
pub struct MountRequest {
    /// The disk's settings (`--mount DIR --source SOURCE` and the options).
    pub disk: DiskArgs,
    /// `remount`: change a mounted disk rather than start one.
    pub remount: bool,
    /// `run_dir=DIR` (ramd's global --run-dir).
    pub run_dir: Option<PathBuf>,
    /// The config keys given explicitly (a remount changes only these).
    pub given: Vec<String>,
    /// `sync` and `dirsync`: VFS flags only, nothing ramd does differently
    /// (it has no cache that could make a write late).
    pub sync: bool,
    pub dirsync: bool,
    /// `lazytime`: a VFS flag too (timestamps-only inode updates are
    /// written back late; sync, fsync and the unmount's syncfs write them).
    pub lazytime: bool,
    /// Whether any atime word was given (`noatime`, `relatime`,
    /// `strictatime`, `nodiratime` or their opposites). A remount without
    /// one keeps the mount's atime rule, as mount(2) does; with one, the
    /// words say it all (relatime unless told otherwise, nodiratime only if
    /// given), again as mount(2) does.
    pub atime_given: bool,
}

/// Keys that are not mount options: the mount point and source come from
/// mount(8)'s arguments, `ro` stands for read_only, and the atime and
/// exec/suid/dev words are mount(8)'s own spellings (below).
const NOT_OPTIONS: [&str; 11] = [
    "mount",
    "source",
    "listen",
    "help",
    "read_only",
    "noatime",
    "strictatime",
    "nodiratime",
    "nosuid",
    "nodev",
    "noexec",
];

/// mount(8)'s words that ramd has nothing to do with (fstab's business,
/// systemd's, mount(8)'s for user mounts, or libmount's `helper=` marker,
/// which it passes back on a remount).
const IGNORED: [&str; 12] = [
    "defaults", "auto", "noauto", "user", "nouser", "users", "owner", "group", "_netdev", "nofail",
    "helper", "uhelper",
];

/// FUSE's own options, which /proc/mounts shows and mount(8) therefore
/// hands back on a plain `mount -o remount,...`: the kernel's business.
const FUSE_SHOWN: [&str; 6] = [
    "user_id",
    "group_id",
    "default_permissions",
    "allow_other",
    "max_read",
    "blksize",
];

/// Parses `options` (mount(8)'s `-o` string) for a mount of `source` at
/// `dir`. Errors name the option, and the value when it is the value that
/// is wrong.
pub fn parse(source: &str, dir: &Path, options: &str) -> Result<MountRequest> {
    // The VFS words, as the state they leave: the last one wins, as in
    // mount(8) (`nosuid,suid` is suid).
    let mut read_only = false;
    let mut nosuid = false;
    let mut nodev = false;
    let mut noexec = false;
    let mut noatime = false;
    let mut strictatime = false;
    let mut nodiratime = false;
    let mut atime_given = false;
    let mut remount = false;
    let mut sync = false;
    let mut dirsync = false;
    let mut lazytime = false;
    let mut run_dir = None;
    // Each key once: a later value replaces an earlier one.
    let mut keyed: Vec<(String, Vec<OsString>)> = Vec::new();
    let disk = disk_command();
    for opt in options.split(',').filter(|o| !o.is_empty()) {
        let (key, value) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let word = |flag: &mut bool, on: bool| -> Result<()> {
            if value.is_some() {
                bail!("option {opt:?}: {key} takes no value");
            }
            *flag = on;
            Ok(())
        };
        match key {
            "rw" => word(&mut read_only, false)?,
            "ro" => word(&mut read_only, true)?,
            "suid" => word(&mut nosuid, false)?,
            "nosuid" => word(&mut nosuid, true)?,
            "dev" => word(&mut nodev, false)?,
            "nodev" => word(&mut nodev, true)?,
            "exec" => word(&mut noexec, false)?,
            "noexec" => word(&mut noexec, true)?,
            "diratime" | "nodiratime" => {
                word(&mut nodiratime, key == "nodiratime")?;
                atime_given = true;
            }
            "remount" => word(&mut remount, true)?,
            "sync" => word(&mut sync, true)?,
            "async" => word(&mut sync, false)?,
            "dirsync" => word(&mut dirsync, true)?,
            "lazytime" | "nolazytime" => word(&mut lazytime, key == "lazytime")?,
            "atime" | "relatime" | "norelatime" | "nostrictatime" | "noatime" => {
                word(&mut noatime, key == "noatime")?;
                strictatime = false;
                atime_given = true;
            }
            "strictatime" => {
                word(&mut strictatime, true)?;
                noatime = false;
                atime_given = true;
            }
            k if IGNORED.contains(&k) || FUSE_SHOWN.contains(&k) => {}
            k if k.starts_with("x-") || k == "comment" => {}
            "run_dir" | "run-dir" => match value {
                Some(v) if !v.is_empty() => run_dir = Some(PathBuf::from(v)),
                _ => bail!("option {opt:?}: run_dir needs a directory (run_dir=DIR)"),
            },
            k => {
                let k = k.replace('-', "_");
                let given = match value {
                    None => Given::Switch(true),
                    Some(v) => Given::Value(v.to_string()),
                };
                let flags = match key_flags(&disk, &k, given, &NOT_OPTIONS) {
                    Ok(f) => f,
                    Err(KeyError::Unknown(mut valid)) => {
                        valid.extend(
                            [
                                "ro",
                                "rw",
                                "nosuid",
                                "nodev",
                                "noexec",
                                "noatime",
                                "relatime",
                                "strictatime",
                                "nodiratime",
                                "lazytime",
                                "remount",
                                "run_dir",
                            ]
                            .map(String::from),
                        );
                        valid.sort();
                        bail!(
                            "unknown option {key:?} (ramd's options: {})",
                            valid.join(", ")
                        )
                    }
                    Err(KeyError::Value(msg)) => match value {
                        None => bail!("option {key:?} needs a value: {key}=VALUE"),
                        Some(v) if msg == "expected true or false" => {
                            bail!("option {key:?} takes no value (got {v:?}): write just {key}")
                        }
                        Some(v) => bail!("option {key}={v}: {msg}"),
                    },
                };
                keyed.retain(|(k2, _)| *k2 != k);
                keyed.push((k, flags));
            }
        }
    }
    let mut flags: Vec<OsString> = vec![
        "--mount".into(),
        dir.into(),
        "--source".into(),
        source.into(),
    ];
    for (on, flag) in [
        (read_only, "--read-only"),
        (nosuid, "--nosuid"),
        (nodev, "--nodev"),
        (noexec, "--noexec"),
        (noatime, "--noatime"),
        (strictatime, "--strictatime"),
        (nodiratime, "--nodiratime"),
    ] {
        if on {
            flags.push(flag.into());
        }
    }
    let given: Vec<String> = keyed.iter().map(|(k, _)| k.clone()).collect();
    for (_, f) in keyed {
        flags.extend(f);
    }
    let matches = disk.try_get_matches_from(&flags).map_err(|e| {
        // clap names flags; the user wrote options.
        anyhow::anyhow!("options {options:?}: {}", as_options(&clap_whole(&e)))
    })?;
    let mut args = DiskArgs::from_arg_matches(&matches)
        .map_err(|e| anyhow::anyhow!("options {options:?}: {e}"))?;
    if !given.iter().any(|k| k == "name") {
        args.name = name_for(dir);
    }
    Ok(MountRequest {
        disk: args,
        remount,
        run_dir,
        given,
        sync,
        dirsync,
        lazytime,
        atime_given,
    })
}

/// A disk name from a mount point, as systemd names mount units:
/// `/mnt/x` is `mnt-x`, `/` is `root`; bytes a name cannot hold become `_`.
pub fn name_for(dir: &Path) -> String {
    let s = dir.to_string_lossy();
    let trimmed = s.trim_matches('/');
    if trimmed.is_empty() {
        return "root".into();
    }
    let mut name: String = trimmed
        .chars()
        .map(|c| match c {
            '/' => '-',
            c if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') => c,
            _ => '_',
        })
        .collect();
    if name.starts_with('.') {
        name.replace_range(0..1, "_");
    }
    // parse_name allows 64 bytes: keep the end, which tells mounts apart.
    if name.len() > 64 {
        name = name[name.len() - 64..].to_string();
        if name.starts_with('.') {
            name.replace_range(0..1, "_");
        }
    }
    name
}

/// A message of the daemon's (or of any code shared with `ramd serve`) as
/// a mount user reads it: each flag of a disk setting becomes the mount
/// option that sets it, `--size SIZE` → `-o size=SIZE`, `--flush persist`
/// → `-o flush=persist`, `--mlock` → `-o mlock`, `--read-only` → `-o ro`.
/// A value is taken along when it is a placeholder (`SIZE`, `DIR`) or one
/// the flag accepts; text in backquotes is a command line, left alone.
pub fn as_mount_options(msg: &str) -> String {
    let disk = disk_command();
    let mut out = String::new();
    let mut quoted = false;
    let mut rest = msg;
    while let Some(c) = rest.chars().next() {
        let at_word = out.is_empty() || out.ends_with([' ', '(', '"', '\'', '\n']);
        if c == '`' {
            quoted = !quoted;
        } else if !quoted && at_word && rest.starts_with("--") {
            let tail = &rest[2..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(tail.len());
            let flag = &tail[..end];
            let arg = disk
                .get_arguments()
                .find(|a| a.get_long() == Some(flag))
                // Not options: mount(8)'s own arguments, and `listen`.
                .filter(|_| !matches!(flag, "mount" | "source" | "listen" | "help"));
            if let Some(arg) = arg {
                let key = match flag {
                    "read-only" => "ro".to_string(),
                    f => f.replace('-', "_"),
                };
                rest = &tail[end..];
                out.push_str("-o ");
                out.push_str(&key);
                if arg.get_action().takes_values() {
                    let word = rest.strip_prefix(' ').map(|r| {
                        let n = r
                            .find(|c: char| c.is_whitespace() || ",;:)".contains(c))
                            .unwrap_or(r.len());
                        &r[..n]
                    });
                    let placeholder = |w: &str| {
                        w.starts_with(|c: char| c.is_ascii_uppercase())
                            && w.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                    };
                    let accepted = |w: &str| {
                        clap::Command::new("v")
                            .no_binary_name(true)
                            .arg(
                                clap::Arg::new("v")
                                    .long("v")
                                    .value_parser(arg.get_value_parser().clone()),
                            )
                            .try_get_matches_from(["--v", w])
                            .is_ok()
                    };
                    if let Some(w) = word.filter(|w| !w.is_empty()) {
                        if placeholder(w) || accepted(w) {
                            out.push('=');
                            out.push_str(w);
                            rest = &rest[1 + w.len()..];
                        }
                    }
                }
                continue;
            }
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    out
}

/// `the argument '--max-memory <SIZE>'` → `the option 'max_memory'`.
fn as_options(msg: &str) -> String {
    let mut out = String::new();
    let mut rest = msg;
    while let Some(at) = rest.find("--") {
        out.push_str(&rest[..at]);
        let tail = &rest[at + 2..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .unwrap_or(tail.len());
        let flag = &tail[..end];
        out.push_str(&match flag {
            "read-only" => "ro".to_string(),
            "mount" => "mount point".to_string(),
            f => f.replace('-', "_"),
        });
        rest = &tail[end..];
        // Drop the value placeholder: ` <SIZE>`.
        if let Some(r) = rest.strip_prefix(" <") {
            if let Some(close) = r.find('>') {
                rest = &r[close + 1..];
            }
        }
    }
    out.push_str(rest);
    out.replace("argument", "option")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(opts: &str) -> MountRequest {
        parse("src", Path::new("/mnt/x"), opts).unwrap()
    }

    fn bad(opts: &str) -> String {
        format!("{:#}", parse("src", Path::new("/mnt/x"), opts).unwrap_err())
    }

    #[test]
    fn the_issues_line() {
        let r = ok("rw,nosuid,size=2G,compress=zstd,image=/var/lib/ramd/x,mode=1777,_netdev,x-a=b");
        assert_eq!(r.disk.size, Some(crate::args::DiskSize::Bytes(2 << 30)));
        assert_eq!(r.disk.compress.to_string(), "zstd:3");
        assert_eq!(r.disk.image.as_deref(), Some(Path::new("/var/lib/ramd/x")));
        assert_eq!(r.disk.fuse.mode, 0o1777);
        assert_eq!(r.disk.fuse.mount.as_deref(), Some(Path::new("/mnt/x")));
        assert_eq!(r.disk.fuse.source.as_deref(), Some("src"));
        assert_eq!(r.disk.name, "mnt-x");
        assert!(r.disk.fuse.nosuid && !r.disk.read_only && !r.remount);
        assert_eq!(r.given, ["size", "compress", "image", "mode"]);
    }

    /// `replicate=URL` is the --replicate flag, and needs image= as the
    /// flag needs --image.
    #[test]
    fn replicate_is_an_option() {
        let r = ok("size=1G,image=/var/lib/ramd/x,replicate=s3://disks/x");
        assert_eq!(r.disk.replicate.as_deref(), Some("s3://disks/x"));
        let e = bad("size=1G,replicate=s3://disks/x");
        assert!(e.contains("image") && !e.contains("--"), "{e}");
    }

    #[test]
    fn the_last_word_wins_and_both_spellings_work() {
        let r = ok("ro,rw,nosuid,suid,noatime,strictatime,max-memory=1G,name=db,size=1G,size=2G");
        assert!(
            !r.disk.read_only
                && !r.disk.fuse.nosuid
                && !r.disk.fuse.noatime
                && r.disk.fuse.strictatime
        );
        assert!(r.atime_given);
        assert_eq!(r.disk.max_memory, Some(1 << 30));
        assert_eq!(r.disk.size, Some(crate::args::DiskSize::Bytes(2 << 30)));
        assert_eq!(r.disk.name, "db");
        // What mount(8) passes on `mount -o remount,size=4G DIR`.
        let r = ok(
            "rw,relatime,remount,user_id=0,group_id=0,default_permissions,allow_other,\
                    helper=fuse.ramd,size=4G,writeback_cache,run_dir=/tmp/r",
        );
        assert!(r.remount && r.disk.fuse.writeback_cache && !r.sync);
        assert_eq!(r.run_dir.as_deref(), Some(Path::new("/tmp/r")));
        assert!(ok("sync,dirsync").sync && !ok("sync,async").sync && ok("dirsync").dirsync);
        assert!(ok("lazytime").lazytime && !ok("lazytime,nolazytime").lazytime);
        assert!(!ok("remount,size=1G").atime_given);
        let r = ok("remount,size=1G,nodiratime");
        assert!(r.atime_given && r.disk.fuse.nodiratime && !r.disk.fuse.noatime);
    }

    #[test]
    fn mistakes_name_the_option() {
        let e = bad("size=2G,colour=red");
        assert!(e.contains("unknown option \"colour\""), "{e}");
        assert!(e.contains("max_memory") && e.contains("nosuid"), "{e}");
        let e = bad("size=2X");
        assert!(e.starts_with("option size=2X: "), "{e}");
        let e = bad("compress=lzo");
        assert!(
            e.contains("option compress=lzo") && e.contains("valid codecs"),
            "{e}"
        );
        let e = bad("size");
        assert!(e.contains("option \"size\" needs a value"), "{e}");
        let e = bad("writeback_cache=yes");
        assert!(e.contains("takes no value"), "{e}");
        let e = bad("ro=1");
        assert!(e.contains("option \"ro=1\": ro takes no value"), "{e}");
        let e = bad("listen=tcp:1");
        assert!(e.contains("unknown option \"listen\""), "{e}");
        let e = bad("autosave=5m");
        assert!(e.contains("image") && !e.contains("--"), "{e}");
    }

    #[test]
    fn flags_in_messages_become_mount_options() {
        let t = as_mount_options;
        assert_eq!(
            t("disk \"x\": a new disk needs a size: give --size SIZE (or ...)"),
            "disk \"x\": a new disk needs a size: give -o size=SIZE (or ...)"
        );
        assert_eq!(
            t("--flush persist needs --image DIR: a flush"),
            "-o flush=persist needs -o image=DIR: a flush"
        );
        assert_eq!(
            t("--autosave must be longer than 0s; --mlock, --read-only"),
            "-o autosave must be longer than 0s; -o mlock, -o ro"
        );
        assert_eq!(
            t("invalid argument: --numa-nodes: node 5"),
            "invalid argument: -o numa_nodes: node 5"
        );
        // Commands, other flags and dashes inside words stay.
        assert_eq!(
            t("serve it (`ramd serve --image /x`), not --listen; /a--size"),
            "serve it (`ramd serve --image /x`), not --listen; /a--size"
        );
    }

    #[test]
    fn names_from_mount_points() {
        assert_eq!(name_for(Path::new("/mnt/x")), "mnt-x");
        assert_eq!(name_for(Path::new("/")), "root");
        assert_eq!(name_for(Path::new("/var/.cache/a b")), "var-.cache-a_b");
        assert_eq!(name_for(Path::new("/.x")), "_x");
        let long = format!("/{}", "a/".repeat(50));
        assert!(crate::args::parse_name(&name_for(Path::new(&long))).is_ok());
    }
}
