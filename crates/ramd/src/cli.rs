//! Command-line interface: every option parsed and checked here, at the edge.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::units::parse_size;

#[derive(Parser, Debug)]
#[command(
    name = "ramd",
    version,
    about = "A RAM disk you can trust: memory-speed block disks served over NBD",
    long_about = "ramd keeps disks in RAM: sparse (untouched, zeroed and trimmed pages cost \
                  nothing), capped by a memory budget (a full disk answers ENOSPC, never an \
                  OOM), and served over NBD to qemu, libnbd tools, fio and nbdfuse.",
    after_help = "Examples:\n  \
        ramd serve --size 1G                       # disk ram0 on /run/ramd/ram0.sock\n  \
        nbdinfo 'nbd+unix:///ram0?socket=/run/ramd/ram0.sock'\n  \
        ramd serve --size 4G --listen tcp:10809    # TCP on 127.0.0.1:10809\n  \
        ramd status"
)]
pub struct Cli {
    /// Directory for control sockets and default NBD sockets.
    #[arg(long, global = true, env = "RAMD_RUN_DIR", value_name = "DIR")]
    pub run_dir: Option<PathBuf>,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Run one block disk in the foreground until SIGINT or SIGTERM.
    #[command(
        after_help = "On start ramd prints the disk's NBD URI alone on stdout; logs go to \
                            stderr (level set by RAMD_LOG, e.g. RAMD_LOG=debug)."
    )]
    Serve(ServeArgs),
    /// Show every running disk: size, use, memory, pages.
    Status(StatusArgs),
}

#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Logical capacity, e.g. 512M, 1G, 1.5T (powers of 1024).
    #[arg(long, value_parser = parse_disk_size, value_name = "SIZE")]
    pub size: u64,

    /// Disk name: the NBD export name and the status row.
    #[arg(long, default_value = "ram0", value_parser = parse_name, value_name = "NAME")]
    pub name: String,

    /// Where clients connect: unix:PATH, or tcp:[HOST:]PORT (HOST defaults
    /// to 127.0.0.1; give 0.0.0.0 or an address to listen beyond loopback).
    /// Default: unix:RUN_DIR/NAME.sock.
    #[arg(long, value_parser = parse_listen, value_name = "ADDR")]
    pub listen: Option<Listen>,

    /// Cap on RAM used for pages and page tables; writes beyond it get
    /// ENOSPC. Default: enough for every page of SIZE.
    #[arg(long, value_parser = parse_size, value_name = "SIZE")]
    pub max_memory: Option<u64>,

    /// Refuse writes, trims and zeroing (EPERM).
    #[arg(long)]
    pub read_only: bool,

    /// Requests served at once per client connection.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,

    /// Clients connected at once; more are turned away.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_connections: u16,

    /// Freed page memory kept resident for reuse instead of being returned
    /// to the kernel at once (first-touch memory is slow to fault in).
    #[arg(long, default_value = "64M", value_parser = parse_size, value_name = "SIZE")]
    pub warm_pool: u64,
}

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// Print JSON for scripts instead of a table.
    #[arg(long)]
    pub json: bool,

    /// Only this disk.
    pub name: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

fn parse_disk_size(s: &str) -> Result<u64, String> {
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
    Ok(n)
}

fn parse_name(s: &str) -> Result<String, String> {
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
        assert!(parse_disk_size("9E").is_err());
    }

    #[test]
    fn clap_definition_is_valid() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
