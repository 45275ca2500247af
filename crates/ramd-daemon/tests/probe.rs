//! A protocol that exists only in this test, plugged in the way any new
//! protocol is: a factory, a settings group of its own (one flag, so one
//! config key), and one registration line. Nothing in ramd-daemon names
//! it, yet its flag is parsed and checked from the command line and from a
//! config table, and a real disk starts it and a real TCP client reaches it.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use clap::{Args, FromArgMatches};
use ramd_daemon::args::DiskArgs;
use ramd_daemon::disk::{Disk, Shared};
use ramd_frontend::{
    Claim, DiskContext, DiskSettings, Frontend, FrontendFactory, FrontendStatus, Group, GroupDef,
    Registry,
};

/// The probe's settings: where it answers.
#[derive(clap::Args, Debug, Clone)]
struct ProbeArgs {
    /// Answer each client with the disk's size, on this loopback TCP
    /// address.
    #[arg(long, value_name = "ADDR", value_parser = parse_probe)]
    probe: Option<SocketAddr>,
}

fn parse_probe(s: &str) -> Result<SocketAddr, String> {
    let a: SocketAddr = s
        .parse()
        .map_err(|_| format!("invalid probe address {s:?}: use HOST:PORT"))?;
    if !a.ip().is_loopback() {
        return Err(format!("probe address {s:?} is beyond loopback"));
    }
    Ok(a)
}

impl Group for ProbeArgs {
    fn setting(&self, key: &str) -> Option<String> {
        (key == "probe").then(|| format!("{:?}", self.probe))
    }
}

struct Probe;

impl FrontendFactory for Probe {
    fn claims(&self, disk: &dyn DiskSettings, _: &Path) -> Result<Vec<Claim>> {
        let addr = disk.get::<ProbeArgs>().and_then(|p| p.probe);
        Ok(addr
            .filter(|a| a.port() != 0)
            .map(|a| Claim(format!("probe port {}", a.port())))
            .into_iter()
            .collect())
    }

    fn build(&self, disk: &DiskContext) -> Result<Vec<Arc<dyn Frontend>>> {
        let Some(addr) = disk.settings.get::<ProbeArgs>().and_then(|p| p.probe) else {
            return Ok(Vec::new());
        };
        let listener = TcpListener::bind(addr)?;
        Ok(vec![Arc::new(ProbeFrontend {
            addr: listener.local_addr()?,
            listener,
            size: disk.store.size(),
            stopped: AtomicBool::new(false),
        })])
    }

    fn settings(&self) -> Option<GroupDef> {
        Some(GroupDef::of::<ProbeArgs>())
    }
}

struct ProbeFrontend {
    listener: TcpListener,
    addr: SocketAddr,
    size: u64,
    stopped: AtomicBool,
}

impl Frontend for ProbeFrontend {
    fn serve(&self) -> Result<()> {
        for conn in self.listener.incoming() {
            if self.stopped.load(Ordering::SeqCst) {
                break;
            }
            use std::io::Write;
            writeln!(conn?, "{}", self.size)?;
        }
        Ok(())
    }

    fn stop(&self, _force: bool) {
        self.stopped.store(true, Ordering::SeqCst);
        // Wakes the accept.
        let _ = TcpStream::connect(self.addr);
    }

    fn status(&self) -> FrontendStatus {
        FrontendStatus {
            protocol: "probe".into(),
            endpoint: format!("tcp:{}", self.addr),
            connections: None,
            transport: None,
        }
    }
}

fn parse(flags: &[&str]) -> std::result::Result<DiskArgs, clap::Error> {
    let cmd = DiskArgs::augment_args(clap::Command::new("ramd").no_binary_name(true));
    DiskArgs::from_arg_matches(&cmd.try_get_matches_from(flags)?)
}

#[test]
fn a_protocol_plugs_in_with_one_registration() {
    // The one line.
    let registry: Registry = ramd_daemon::frontends::builtin().with(Probe);

    // Its flag, parsed and checked with the disk's own.
    let args = parse(&["--name", "p", "--size", "1M", "--probe", "127.0.0.1:0"]).unwrap();
    let own: &dyn DiskSettings = &args;
    assert_eq!(
        own.get::<ProbeArgs>().unwrap().probe,
        Some("127.0.0.1:0".parse().unwrap())
    );
    assert_eq!(args.setting("probe").unwrap(), "Some(127.0.0.1:0)");
    let e = parse(&["--size", "1M", "--probe", "192.0.2.1:7"]).unwrap_err();
    assert!(e.to_string().contains("beyond loopback"), "{e}");

    // Its config key, the same way: checked with its parser, the mistake
    // naming file, line and key.
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.toml");
    std::fs::write(&good, "[disk.p]\nsize = \"1M\"\nprobe = \"127.0.0.1:0\"\n").unwrap();
    let plan = ramd_daemon::config::load(&good).unwrap();
    let (from_file, _) = &plan.disks[0];
    assert_eq!(from_file.setting("probe").unwrap(), "Some(127.0.0.1:0)");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[disk.p]\nsize = \"1M\"\nprobe = \"10.0.0.1:5\"\n").unwrap();
    let e = ramd_daemon::config::load(&bad).unwrap_err().to_string();
    assert!(
        e.contains(":3: disk.p.probe: ") && e.contains("beyond loopback"),
        "{e}"
    );

    // A real disk starts it; a real client reaches it.
    let run = tempfile::tempdir().unwrap();
    let shared = Shared {
        run_dir: run.path().to_path_buf(),
        registry,
        host_reserve: 0,
        scanners: ramd_store::ScannerPool::new(1).unwrap(),
        compress_threads: 1,
        budget: None,
        metrics_url: None,
        load_progress: || -> Box<dyn FnMut(ramd_store::persist::Progress)> { Box::new(|_| {}) },
    };
    let (tx, _rx) = std::sync::mpsc::channel();
    let disk = Disk::open(args, &shared, tx.clone()).unwrap();
    disk.start(&tx).unwrap();
    let endpoint = disk
        .endpoints()
        .into_iter()
        .find_map(|e| e.strip_prefix("tcp:").map(str::to_string))
        .expect("the probe's endpoint among the disk's");
    let conn = TcpStream::connect(&endpoint).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut line = String::new();
    BufReader::new(conn).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "1048576");
    disk.stop(false);
    disk.finish(&|_| {}).unwrap();
}
