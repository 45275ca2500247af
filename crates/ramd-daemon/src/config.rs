//! Config files: TOML with one `[disk.NAME]` table per disk, whose keys are
//! `ramd serve`'s flags spelt with underscores (`max_memory = "2G"`,
//! `compress = "zstd"`, `noatime = true`, `listen = ["unix:/x", "tcp:10809"]`),
//! plus `kind = "block" | "fs"`; and for `ramd up` a `[daemon]` table.
//!
//! `ramd serve --config FILE [--disk NAME]` turns one table into flags that
//! go before the command line's own, so a flag given on the command line
//! wins; `ramd up` reads every table ([`load`]). Every key and value is
//! checked here, with clap's own parsers, so that a mistake names the file,
//! line and key rather than a flag the user never typed; every mistake of a
//! file is reported at once, in file order, so that one run finds them all.

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

/// The tables ramd reads; any other top-level key is a mistake, which
/// [`unknown_top_level`] reports with the others (serde's
/// `deny_unknown_fields` would stop at the first).
#[derive(Deserialize)]
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
    let mut found = Mistakes::new(path, &text);
    unknown_top_level(&mut found)?;
    let daemon = match &file.daemon {
        None => DaemonSettings::default(),
        Some(t) => daemon_settings(&mut found, t.get_ref()),
    };
    let mut disks = Vec::new();
    for (name, table) in in_file_order(&file.disk) {
        let line = line_of(&text, table.span().start);
        if let Some(v) = table.get_ref().get("compress_threads") {
            log::warn!(
                "{}:{}: disk.{name}.compress_threads: ignored by `ramd up`, whose disks share \
                 the daemon's background threads: set [daemon] compress_threads",
                path.display(),
                line_of(&text, v.span().start)
            );
        }
        let Some(flags) = table_flags(&mut found, name, table) else {
            continue;
        };
        // The flags together (`autosave` needs `image`...), once each key
        // is right on its own.
        let args = disk_command()
            .try_get_matches_from(&flags)
            .map_err(|e| clap_whole(&e))
            .and_then(|m| DiskArgs::from_arg_matches(&m).map_err(|e| e.to_string()));
        match args {
            Ok(args) => disks.push((args, line)),
            Err(e) => found.add(table.span().start, format!("[disk.{name}]"), e),
        }
    }
    found.into_result()?;
    if disks.is_empty() {
        bail!("{}: no [disk.NAME] table: nothing to serve", path.display());
    }
    if let Some(iqn) = &daemon.iscsi_target {
        for (a, _) in disks.iter_mut() {
            if a.iscsi.portal.is_some() && a.iscsi.iscsi_target.is_none() {
                a.iscsi.iscsi_target = Some(iqn.clone());
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

/// Top-level keys other than `[daemon]` and `[disk.NAME]`, each a mistake.
fn unknown_top_level(found: &mut Mistakes) -> Result<()> {
    let keys: BTreeMap<Spanned<String>, serde::de::IgnoredAny> = toml::from_str(found.text)
        .map_err(|e| anyhow::anyhow!("{}: {}", found.path.display(), e.message()))?;
    for key in keys.keys() {
        if !matches!(key.get_ref().as_str(), "daemon" | "disk") {
            found.unknown(
                key.span().start,
                key.get_ref().clone(),
                &["daemon", "disk"],
                "valid at the top level: the tables [daemon] and [disk.NAME]",
            );
        }
    }
    Ok(())
}

const DAEMON_KEYS: [&str; 6] = [
    "compress_threads",
    "host_reserve",
    "iscsi_target",
    "max_memory",
    "metrics",
    "run_dir",
];

/// `[daemon]`'s settings; its mistakes go to `found`.
fn daemon_settings(found: &mut Mistakes, t: &Table) -> DaemonSettings {
    let mut d = DaemonSettings::default();
    for (key, value) in in_file_order(t) {
        let v = value.get_ref();
        let size = || match v {
            toml::Value::String(s) => parse_size(s),
            toml::Value::Integer(n) if *n > 0 => Ok(*n as u64),
            _ => Err("expected a size like \"8G\"".into()),
        };
        let checked: std::result::Result<(), String> = match key.as_str() {
            "run_dir" => match v.as_str() {
                Some(s) if !s.is_empty() => {
                    d.run_dir = Some(s.into());
                    Ok(())
                }
                _ => Err("expected a directory path".into()),
            },
            "max_memory" => size().map(|n| d.max_memory = Some(n)),
            "host_reserve" => size().map(|n| d.host_reserve = Some(n)),
            "compress_threads" => match v.as_integer() {
                Some(n @ 1..=64) => {
                    d.compress_threads = Some(n as u16);
                    Ok(())
                }
                _ => Err("expected a number of threads from 1 to 64".into()),
            },
            "metrics" => match v {
                toml::Value::String(s) => crate::metrics::parse_addr(s),
                toml::Value::Integer(n) => u16::try_from(*n)
                    .map(|p| crate::metrics::parse_addr(&p.to_string()))
                    .unwrap_or_else(|_| Err(format!("invalid metrics port {n}"))),
                _ => Err("expected an address like \"9100\" or \"0.0.0.0:9100\"".into()),
            }
            .map(|a| d.metrics = Some(a)),
            "iscsi_target" => match v.as_str() {
                Some(s) => ramd_iscsi::settings::parse_iqn(s).map(|n| d.iscsi_target = Some(n)),
                None => Err("expected an iSCSI name like \"iqn.2026-11.org.example:disks\"".into()),
            },
            _ => {
                found.unknown(
                    value.span().start,
                    format!("daemon.{key}"),
                    &DAEMON_KEYS,
                    &format!("valid keys of [daemon]: {}", DAEMON_KEYS.join(", ")),
                );
                Ok(())
            }
        };
        if let Err(msg) = checked {
            found.add(value.span().start, format!("daemon.{key}"), msg);
        }
    }
    d
}

/// The flags `[disk.NAME]` of `path` stands for. `disk` may be omitted when
/// the file has exactly one disk.
pub fn disk_flags(path: &Path, disk: Option<&str>) -> Result<Vec<OsString>> {
    let (text, file) = read(path)?;
    let mut found = Mistakes::new(path, &text);
    unknown_top_level(&mut found)?;
    let names: Vec<&str> = file.disk.keys().map(String::as_str).collect();
    let chosen = match (disk, names.as_slice()) {
        (Some(d), _) => Ok(d),
        (None, [only]) => Ok(*only),
        (None, []) => Err(format!("{}: no [disk.NAME] table", path.display())),
        (None, _) => Err(format!(
            "{}: several disks ({}): choose one with --disk NAME",
            path.display(),
            names.join(", ")
        )),
    };
    let table = chosen.and_then(|name| {
        let t = file.disk.get(name).ok_or_else(|| {
            format!(
                "{}: no [disk.{name}] table (disks: {})",
                path.display(),
                names.join(", ")
            )
        })?;
        Ok((name, t))
    });
    let (name, table) = match table {
        Ok(t) => t,
        // A misspelt table name explains a missing table best.
        Err(e) => {
            found.into_result()?;
            bail!("{e}")
        }
    };
    let flags = table_flags(&mut found, name, table);
    found.into_result()?;
    Ok(flags.expect("no mistakes, so flags"))
}

/// One disk table as flags, each key and value checked with its flag's own
/// parser; `None` if it has mistakes, which go to `found`.
fn table_flags(found: &mut Mistakes, name: &str, table: &Spanned<Table>) -> Option<Vec<OsString>> {
    let before = found.list.len();
    if let Err(e) = crate::args::parse_name(name) {
        found.add(table.span().start, format!("[disk.{name}]"), e);
    }
    let disk = disk_command();
    let mut flags: Vec<OsString> = vec!["--name".into(), name.into()];
    let mut kind = None;
    for (key, value) in in_file_order(table.get_ref()) {
        let at = value.span().start;
        let what = format!("disk.{name}.{key}");
        if key == "kind" {
            match value.get_ref().as_str() {
                Some(k @ ("block" | "fs")) => kind = Some((k, at)),
                _ => found.add(at, what, "expected \"block\" or \"fs\"".into()),
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
                let valid: Vec<&str> = valid.iter().map(String::as_str).collect();
                let line = format!("valid keys of [disk.NAME]: {}", valid.join(", "));
                found.unknown(at, what, &valid, &line);
            }
            Err(KeyError::Value(msg)) => found.add(at, what, msg),
        }
    }
    let table = table.get_ref();
    let problem = match kind {
        Some(("fs", _)) if !table.contains_key("mount") => {
            "a filesystem disk needs `mount = \"DIR\"`"
        }
        Some(("block", _)) if table.contains_key("mount") => {
            "a block disk has no mount point: use kind = \"fs\""
        }
        _ => "",
    };
    if let (Some((_, at)), false) = (kind, problem.is_empty()) {
        found.add(at, format!("disk.{name}.kind"), problem.into());
    }
    (found.list.len() == before).then_some(flags)
}

/// A table's entries in the order the file gives them (a map's own order
/// is alphabetical).
fn in_file_order<V>(table: &BTreeMap<String, Spanned<V>>) -> Vec<(&String, &Spanned<V>)> {
    let mut v: Vec<_> = table.iter().collect();
    v.sort_by_key(|(_, value)| value.span().start);
    v
}

/// Every mistake of one file, so that one run reports them all.
struct Mistakes<'a> {
    path: &'a Path,
    text: &'a str,
    /// (byte offset, `FILE:LINE: KEY: message`).
    list: Vec<(usize, String)>,
    /// The valid keys of each kind of table that had an unknown one, as a
    /// line: listed once after the mistakes rather than on every line.
    valid: Vec<String>,
}

impl<'a> Mistakes<'a> {
    fn new(path: &'a Path, text: &'a str) -> Mistakes<'a> {
        Mistakes {
            path,
            text,
            list: Vec::new(),
            valid: Vec::new(),
        }
    }

    /// `key`, at byte `offset` of the file, is wrong: `msg`.
    fn add(&mut self, offset: usize, key: String, msg: String) {
        let line = line_of(self.text, offset);
        let text = format!("{}:{line}: {key}: {msg}", self.path.display());
        self.list.push((offset, text));
    }

    /// `key` is not one of `valid`, which `valid_line` lists for the user.
    fn unknown(&mut self, offset: usize, key: String, valid: &[&str], valid_line: &str) {
        let last = key.rsplit('.').next().unwrap_or(&key);
        let msg = match valid.iter().find(|v| near(last, v)) {
            Some(v) => format!("unknown key (did you mean {v}?)"),
            None => "unknown key".into(),
        };
        self.add(offset, key, msg);
        if !self.valid.iter().any(|l| l == valid_line) {
            self.valid.push(valid_line.to_string());
        }
    }

    /// Every mistake in file order, one a line, then the valid keys.
    fn into_result(mut self) -> Result<()> {
        if self.list.is_empty() {
            return Ok(());
        }
        self.list.sort_by_key(|(offset, _)| *offset);
        let mut lines: Vec<String> = self.list.into_iter().map(|(_, l)| l).collect();
        lines.extend(self.valid);
        bail!("{}", lines.join("\n"))
    }
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

/// Whether `a` is `b` misspelt: at most two letters added, dropped or
/// changed (Levenshtein distance), and not a short word for another.
fn near(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    if a.len().min(b.len()) < 4 {
        return false;
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut row = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let change = prev[j] + usize::from(ca != cb);
            row.push(change.min(prev[j + 1] + 1).min(row[j] + 1));
        }
        prev = row;
    }
    prev[b.len()] <= 2
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
mod tests;
