//! Config files: TOML with one `[disk.NAME]` table per disk, whose keys are
//! `ramd serve`'s flags spelt with underscores (`max_memory = "2G"`,
//! `compress = "zstd"`, `noatime = true`, `listen = ["unix:/x", "tcp:10809"]`),
//! plus `kind = "block" | "fs"`; and for `ramd up` a `[daemon]` table.
//!
//! `ramd serve --config FILE [--disk NAME]` turns one table into flags that
//! go before the command line's own, so a flag given on the command line
//! wins; `ramd up` reads every table ([`load`]). Every key and value is
//! checked here, with clap's own parsers, so that a mistake names the file,
//! line and key rather than a flag the user never typed.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::Path;

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, FromArgMatches};
use serde::Deserialize;
use toml::Spanned;

use crate::args::DiskArgs;
use crate::units::{human, parse_size};

type Table = BTreeMap<String, Spanned<toml::Value>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    daemon: Option<Spanned<Table>>,
    #[serde(default)]
    disk: BTreeMap<String, Spanned<Table>>,
}

/// Flags that make no sense in a file.
const NOT_KEYS: [&str; 2] = ["name", "help"];

/// The clap definition of a disk's flags.
pub(crate) fn disk_command() -> clap::Command {
    DiskArgs::augment_args(clap::Command::new("disk").no_binary_name(true))
}

/// `[daemon]`: what the disks of `ramd up` share.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DaemonSettings {
    /// Sockets' directory (the command line's --run-dir wins).
    pub run_dir: Option<PathBuf>,
    /// One memory budget for all the disks.
    pub max_memory: Option<u64>,
    /// Memory the host keeps: new pages get ENOSPC below it.
    pub host_reserve: Option<u64>,
    /// Background threads shared by all the disks.
    pub compress_threads: Option<u16>,
    /// Serve Prometheus `/metrics` here (a bare port is on 127.0.0.1).
    pub metrics: Option<std::net::SocketAddr>,
    /// The iSCSI target's name for the disks with `iscsi` that do not give
    /// their own `iscsi_target`.
    pub iscsi_target: Option<String>,
}

/// A whole config file, checked.
#[derive(Debug)]
pub struct Plan {
    pub path: PathBuf,
    pub daemon: DaemonSettings,
    /// Each disk's settings, and the line of its table.
    pub disks: Vec<(DiskArgs, usize)>,
}

/// Reads and checks a whole config file for `ramd up`: every disk's keys
/// and values, the `[daemon]` table, and that the disks' own budgets fit in
/// the daemon's.
pub fn load(path: &Path) -> Result<Plan> {
    let (text, file) = read(path)?;
    let daemon = match &file.daemon {
        None => DaemonSettings::default(),
        Some(t) => daemon_settings(path, &text, t.get_ref())?,
    };
    let mut disks = Vec::new();
    for (name, table) in &file.disk {
        let line = line_of(&text, table.span().start);
        if let Some(v) = table.get_ref().get("compress_threads") {
            log::warn!(
                "{}:{}: disk.{name}.compress_threads: ignored by `ramd up`, whose disks share \
                 the daemon's background threads: set [daemon] compress_threads",
                path.display(),
                line_of(&text, v.span().start)
            );
        }
        let flags = table_flags(path, &text, name, table.get_ref())?;
        let matches = disk_command().try_get_matches_from(&flags).map_err(|e| {
            anyhow::anyhow!(
                "{}:{line}: [disk.{name}]: {}",
                path.display(),
                clap_whole(&e)
            )
        })?;
        let args = DiskArgs::from_arg_matches(&matches)
            .map_err(|e| anyhow::anyhow!("{}:{line}: [disk.{name}]: {e}", path.display()))?;
        disks.push((args, line));
    }
    if disks.is_empty() {
        bail!("{}: no [disk.NAME] table: nothing to serve", path.display());
    }
    if let Some(iqn) = &daemon.iscsi_target {
        for (a, _) in disks.iter_mut() {
            if a.iscsi.is_some() && a.iscsi_target.is_none() {
                a.iscsi_target = Some(iqn.clone());
            }
        }
    }
    if let (Some(limit), Some(t)) = (daemon.max_memory, &file.daemon) {
        let own: Vec<(&str, u64)> = disks
            .iter()
            .filter_map(|(a, _)| a.max_memory.map(|m| (a.name.as_str(), m)))
            .collect();
        let sum: u64 = own.iter().map(|(_, m)| m).sum();
        if sum > limit {
            let key = t.get_ref().get("max_memory").expect("parsed from it");
            bail!(
                "{}:{}: daemon.max_memory: {} is less than the disks' own budgets add up to: {} = {}",
                path.display(),
                line_of(&text, key.span().start),
                human(limit),
                own.iter()
                    .map(|(n, m)| format!("{n} {}", human(*m)))
                    .collect::<Vec<_>>()
                    .join(" + "),
                human(sum)
            );
        }
    }
    Ok(Plan {
        path: path.to_path_buf(),
        daemon,
        disks,
    })
}

fn read(path: &Path) -> Result<(String, ConfigFile)> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading config file {}", path.display()))?;
    let file: ConfigFile = toml::from_str(&text).map_err(|e| {
        let at = e
            .span()
            .map_or(String::new(), |s| format!(":{}", line_of(&text, s.start)));
        anyhow::anyhow!("{}{at}: {}", path.display(), e.message())
    })?;
    Ok((text, file))
}

fn daemon_settings(path: &Path, text: &str, t: &Table) -> Result<DaemonSettings> {
    let mut d = DaemonSettings::default();
    for (key, value) in t {
        let at = at(path, text, value, format!("daemon.{key}"));
        let v = value.get_ref();
        let size = || match v {
            toml::Value::String(s) => parse_size(s),
            toml::Value::Integer(n) if *n > 0 => Ok(*n as u64),
            _ => Err("expected a size like \"8G\"".into()),
        };
        match key.as_str() {
            "run_dir" => match v.as_str() {
                Some(s) if !s.is_empty() => d.run_dir = Some(s.into()),
                _ => return Err(at("expected a directory path".into())),
            },
            "max_memory" => d.max_memory = Some(size().map_err(at)?),
            "host_reserve" => d.host_reserve = Some(size().map_err(at)?),
            "compress_threads" => match v.as_integer() {
                Some(n @ 1..=64) => d.compress_threads = Some(n as u16),
                _ => return Err(at("expected a number of threads from 1 to 64".into())),
            },
            "metrics" => {
                let addr = match v {
                    toml::Value::String(s) => crate::metrics::parse_addr(s),
                    toml::Value::Integer(n) => u16::try_from(*n)
                        .map(|p| crate::metrics::parse_addr(&p.to_string()))
                        .unwrap_or_else(|_| Err(format!("invalid metrics port {n}"))),
                    _ => Err("expected an address like \"9100\" or \"0.0.0.0:9100\"".into()),
                };
                d.metrics = Some(addr.map_err(at)?);
            }
            "iscsi_target" => match v.as_str() {
                Some(s) => d.iscsi_target = Some(crate::args::parse_iqn(s).map_err(at)?),
                None => {
                    return Err(at(
                        "expected an iSCSI name like \"iqn.2026-11.org.example:disks\"".into(),
                    ))
                }
            },
            _ => {
                return Err(at(
                    "unknown key (valid keys: compress_threads, host_reserve, \
                     iscsi_target, max_memory, metrics, run_dir)"
                        .into(),
                ))
            }
        }
    }
    Ok(d)
}

/// The flags `[disk.NAME]` of `path` stands for. `disk` may be omitted when
/// the file has exactly one disk.
pub fn disk_flags(path: &Path, disk: Option<&str>) -> Result<Vec<OsString>> {
    let (text, file) = read(path)?;
    let names: Vec<&str> = file.disk.keys().map(String::as_str).collect();
    let name = match (disk, names.as_slice()) {
        (Some(d), _) => d,
        (None, [only]) => only,
        (None, []) => bail!("{}: no [disk.NAME] table", path.display()),
        (None, _) => bail!(
            "{}: several disks ({}): choose one with --disk NAME",
            path.display(),
            names.join(", ")
        ),
    };
    let Some(table) = file.disk.get(name) else {
        bail!(
            "{}: no [disk.{name}] table (disks: {})",
            path.display(),
            names.join(", ")
        );
    };
    table_flags(path, &text, name, table.get_ref())
}

/// One disk table as flags, each key and value checked with its flag's own
/// parser.
fn table_flags(path: &Path, text: &str, name: &str, table: &Table) -> Result<Vec<OsString>> {
    crate::args::parse_name(name)
        .map_err(|e| anyhow::anyhow!("{}: [disk.{name}]: {e}", path.display()))?;
    let disk = disk_command();
    let mut flags: Vec<OsString> = vec!["--name".into(), name.into()];
    let mut kind = None;
    for (key, value) in table {
        let at = at(path, text, value, format!("disk.{name}.{key}"));
        if key == "kind" {
            match value.get_ref().as_str() {
                Some(k @ ("block" | "fs")) => kind = Some((k, line_of(text, value.span().start))),
                _ => return Err(at("expected \"block\" or \"fs\"".into())),
            }
            continue;
        }
        let v = value.get_ref();
        let given = match v {
            toml::Value::Boolean(b) => Given::Switch(*b),
            toml::Value::String(s) => Given::Value(s.clone()),
            toml::Value::Integer(n) => Given::Value(n.to_string()),
            toml::Value::Array(a) => Given::List(
                a.iter()
                    .map(|item| match item {
                        toml::Value::String(s) => Some(s.clone()),
                        toml::Value::Integer(n) => Some(n.to_string()),
                        _ => None,
                    })
                    .collect(),
            ),
            _ => Given::Other,
        };
        match key_flags(&disk, key, given, &NOT_KEYS) {
            Ok(f) => flags.extend(f),
            Err(KeyError::Unknown(mut valid)) => {
                valid.push("kind".into());
                valid.sort();
                return Err(at(format!(
                    "unknown key (valid keys: {})",
                    valid.join(", ")
                )));
            }
            Err(KeyError::Value(msg)) => return Err(at(msg)),
        }
    }
    let problem = match kind {
        Some(("fs", _)) if !table.contains_key("mount") => {
            "a filesystem disk needs `mount = \"DIR\"`"
        }
        Some(("block", _)) if table.contains_key("mount") => {
            "a block disk has no mount point: use kind = \"fs\""
        }
        _ => "",
    };
    if let (Some((_, line)), false) = (kind, problem.is_empty()) {
        bail!("{}:{line}: disk.{name}.kind: {problem}", path.display());
    }
    Ok(flags)
}

/// A setting's value as given in a config table or a mount option.
pub(crate) enum Given {
    /// true/false, or a mount option without `=`.
    Switch(bool),
    /// A string or a number.
    Value(String),
    /// An array, for a flag that may be repeated (`None`: an item is not a
    /// string or a number).
    List(Option<Vec<String>>),
    /// Anything else (a TOML table, a float...).
    Other,
}

/// Why a setting was refused.
pub(crate) enum KeyError {
    /// No such setting: the valid names.
    Unknown(Vec<String>),
    /// A value its flag refuses: the flag's parser's message.
    Value(String),
}

/// One setting, named by its key (a flag's name with underscores), as the
/// flags it stands for, each value checked with its flag's own parser.
/// `excluded` keys are unknown here. Config tables and mount options
/// (`mount_opts.rs`) both come through this one function.
pub(crate) fn key_flags(
    disk: &clap::Command,
    key: &str,
    given: Given,
    excluded: &[&str],
) -> std::result::Result<Vec<OsString>, KeyError> {
    let arg = disk
        .get_arguments()
        .find(|a| a.get_id() == key && !excluded.contains(&key))
        .filter(|a| a.get_long().is_some());
    let Some(arg) = arg else {
        return Err(KeyError::Unknown(
            disk.get_arguments()
                .filter(|a| a.get_long().is_some())
                .map(|a| a.get_id().to_string())
                .filter(|id| !excluded.contains(&id.as_str()))
                .collect(),
        ));
    };
    let long = format!("--{}", arg.get_long().expect("filtered on long"));
    let is_switch = !arg.get_action().takes_values();
    // A flag that may be repeated (`listen`) also takes an array.
    let repeatable = matches!(arg.get_action(), clap::ArgAction::Append);
    let values = match given {
        Given::Switch(true) if is_switch => return Ok(vec![long.into()]),
        // `key = false` for a setting that is on by default: its --no- flag.
        Given::Switch(false) if is_switch => {
            let off = format!("no_{key}");
            return Ok(
                match disk.get_arguments().find(|a| a.get_id() == off.as_str()) {
                    Some(a) => vec![format!("--{}", a.get_long().expect("a flag")).into()],
                    None => Vec::new(),
                },
            );
        }
        _ if is_switch => return Err(KeyError::Value("expected true or false".into())),
        Given::Value(v) => vec![v],
        Given::List(Some(v)) if repeatable => v,
        _ if repeatable => {
            return Err(KeyError::Value(
                "expected a string, a number, or an array of them".into(),
            ))
        }
        _ => return Err(KeyError::Value("expected a string or a number".into())),
    };
    let mut flags = Vec::new();
    for value in values {
        // The flag's own parser, alone: its ties to other flags (requires,
        // conflicts) are checked once all flags are parsed together.
        clap::Command::new("config")
            .no_binary_name(true)
            .arg(
                clap::Arg::new("v")
                    .long("v")
                    .value_parser(arg.get_value_parser().clone()),
            )
            .try_get_matches_from([OsStr::new("--v"), OsStr::new(&value)])
            .map_err(|e| KeyError::Value(clap_message(&e)))?;
        flags.push(long.clone().into());
        flags.push(value.into());
    }
    Ok(flags)
}

/// Inserts `flags` right after the `serve` subcommand in `argv`, so that
/// the command line's own flags come later and win.
pub fn splice(argv: Vec<OsString>, flags: Vec<OsString>) -> Vec<OsString> {
    // The subcommand is the first argument that is not an option or the
    // value of the global --run-dir.
    let mut at = 1;
    while at < argv.len() {
        let a = argv[at].to_string_lossy();
        if a == "serve" {
            break;
        }
        at += if a == "--run-dir" { 2 } else { 1 };
    }
    let mut out = argv;
    let tail = out.split_off((at + 1).min(out.len()));
    out.extend(flags);
    out.extend(tail);
    out
}

/// A clap error about flags together (`--autosave` needs `--image`) on one
/// line, without its usage and help tail.
pub(crate) fn clap_whole(e: &clap::Error) -> String {
    let s = e.to_string();
    let body = s.split("\n\nUsage").next().unwrap_or(&s);
    let body = body.split("\n\nFor more").next().unwrap_or(body);
    body.trim_start_matches("error: ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// Makes errors about `value`, the value of `key` in the file: `FILE:LINE:
/// KEY: message`.
fn at<'a>(
    path: &'a Path,
    text: &'a str,
    value: &Spanned<toml::Value>,
    key: String,
) -> impl Fn(String) -> anyhow::Error + 'a {
    let line = line_of(text, value.span().start);
    move |msg| anyhow::anyhow!("{}:{line}: {key}: {msg}", path.display())
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// The parser's own message if it has one, else clap's first line without
/// its "error: " prefix (clap's would name the internal flag).
fn clap_message(e: &clap::Error) -> String {
    if let Some(src) = std::error::Error::source(e) {
        return src.to_string();
    }
    let s = e.to_string();
    let first = s.lines().next().unwrap_or_default();
    first.trim_start_matches("error: ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags_of(text: &str, disk: Option<&str>) -> Result<Vec<String>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ramd.toml");
        std::fs::write(&path, text).unwrap();
        disk_flags(&path, disk)
            .map(|v| v.into_iter().map(|s| s.into_string().unwrap()).collect())
            .map_err(|e| anyhow::anyhow!(e.to_string().replace(&*path.to_string_lossy(), "F")))
    }

    #[test]
    fn a_disk_table_becomes_flags() {
        let f = flags_of(
            "[disk.scratch]\nkind = \"fs\"\nsize = \"2G\"\nmount = \"/mnt/s\"\n\
             compress = \"zstd\"\nnoatime = true\nthreads = 4\n",
            None,
        )
        .unwrap();
        assert_eq!(
            f,
            [
                "--name",
                "scratch",
                "--compress",
                "zstd",
                "--mount",
                "/mnt/s",
                "--noatime",
                "--size",
                "2G",
                "--threads",
                "4"
            ]
        );
    }

    #[test]
    fn insecure_is_a_key() {
        let f = flags_of(
            "[disk.a]\nsize = \"1G\"\nlisten = \"tcp:0.0.0.0:10809\"\ninsecure = true\n",
            None,
        )
        .unwrap();
        assert_eq!(
            f,
            [
                "--name",
                "a",
                "--insecure",
                "--listen",
                "tcp:0.0.0.0:10809",
                "--size",
                "1G"
            ]
        );
    }

    #[test]
    fn tls_keys() {
        let f = flags_of(
            "[disk.a]\nsize = \"1G\"\ntls = \"require\"\ntls_certificates = \"/etc/ramd/tls\"\n\
             tls_verify_peer = true\n",
            None,
        )
        .unwrap();
        assert_eq!(
            f,
            [
                "--name",
                "a",
                "--size",
                "1G",
                "--tls",
                "require",
                "--tls-certificates",
                "/etc/ramd/tls",
                "--tls-verify-peer"
            ]
        );
        let e = flags_of("[disk.a]\ntls = \"yes\"\n", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("F:2: disk.a.tls: invalid TLS mode"), "{e}");
    }

    #[test]
    fn false_turns_off_what_is_on_by_default() {
        let f = |v: &str| {
            flags_of(
                &format!("[disk.a]\nmount = \"/mnt/a\"\nwriteback_cache = {v}\nnoatime = {v}\n"),
                None,
            )
            .unwrap()
        };
        assert_eq!(
            f("false"),
            ["--name", "a", "--mount", "/mnt/a", "--no-writeback-cache"]
        );
        assert_eq!(
            f("true"),
            [
                "--name",
                "a",
                "--mount",
                "/mnt/a",
                "--noatime",
                "--writeback-cache"
            ]
        );
    }

    #[test]
    fn mistakes_name_file_line_and_key() {
        let e = flags_of("[disk.a]\nsize = \"1G\"\ncompress = \"lzo\"\n", None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("F:3: disk.a.compress: "), "{e}");
        assert!(e.contains("valid codecs"), "{e}");
        let e = flags_of("[disk.a]\nsize = \"1G\"\n\ncolour = \"red\"\n", None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("F:4: disk.a.colour: unknown key"), "{e}");
        assert!(e.contains("max_memory"), "{e}");
        let e = flags_of("[disk.a]\nsize = 1G\n", None)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("F:2:"), "{e}");
        let e = flags_of("[disk.a]\nnoatime = \"yes\"\n", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("disk.a.noatime: expected true or false"), "{e}");
        let e = flags_of("[disk.a]\n[disk.b]\n", None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("--disk"), "{e}");
        let e = flags_of("[disk.a]\n", Some("c")).unwrap_err().to_string();
        assert!(e.contains("no [disk.c] table (disks: a)"), "{e}");
        let e = flags_of("[disk.a]\nkind = \"fs\"\nsize = \"1G\"\n", None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("F:2: disk.a.kind: a filesystem disk needs"),
            "{e}"
        );
        let e = flags_of("[disks.a]\n", None).unwrap_err().to_string();
        assert!(e.starts_with("F:1:"), "{e}");
    }

    #[test]
    fn flags_go_after_serve_so_the_command_line_wins() {
        let argv = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        let out = splice(
            argv(&["ramd", "--run-dir", "serve", "serve", "--size", "1G"]),
            argv(&["--size", "2G"]),
        );
        assert_eq!(
            out,
            argv(&[
                "ramd",
                "--run-dir",
                "serve",
                "serve",
                "--size",
                "2G",
                "--size",
                "1G"
            ])
        );
    }

    #[test]
    fn daemon_iscsi_target_names_the_disks_target() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ramd.toml");
        std::fs::write(
            &path,
            "[daemon]\niscsi_target = \"iqn.2026-11.org.example:lab\"\n\
             [disk.a]\nsize = \"1M\"\niscsi = \"3260\"\niscsi_lun = 3\n\
             [disk.b]\nsize = \"1M\"\n",
        )
        .unwrap();
        let plan = load(&path).unwrap();
        let a = &plan.disks.iter().find(|(d, _)| d.name == "a").unwrap().0;
        let b = &plan.disks.iter().find(|(d, _)| d.name == "b").unwrap().0;
        assert_eq!(
            a.iscsi_target.as_deref(),
            Some("iqn.2026-11.org.example:lab")
        );
        assert_eq!(a.iscsi_lun, Some(3));
        assert_eq!(a.iscsi, Some("127.0.0.1:3260".parse().unwrap()));
        assert_eq!(b.iscsi_target, None, "no iscsi, no target name");
        std::fs::write(
            &path,
            "[daemon]\niscsi_target = \"Bad Name\"\n[disk.a]\nsize = \"1M\"\n",
        )
        .unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(e.contains("daemon.iscsi_target"), "{e}");
    }
}
