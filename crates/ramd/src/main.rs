//! `ramd`: the daemon and its commands. Storage lives in `ramd-store`, the
//! protocol in `ramd-nbd`; this binary parses the command line, sets up
//! resources before the first client, and reports status.

mod cli;
mod control;
mod units;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use serde_json::json;

use cli::{Cli, Command, Listen, ServeArgs};
use ramd_nbd::{Export, Exports, Listener, Server, ServerConfig};
use ramd_store::{Store, StoreConfig};
use units::human;

fn main() {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("RAMD_LOG", "info"))
        .format_target(false)
        .init();
    let cli = Cli::parse();
    let run_dir = cli.run_dir.clone().unwrap_or_else(default_run_dir);
    let result = match cli.command {
        Command::Serve(args) => serve(args, &run_dir),
        Command::Status(args) => control::status(&run_dir, args.name.as_deref(), args.json),
    };
    if let Err(e) = result {
        eprintln!("ramd: error: {e:#}");
        std::process::exit(1);
    }
}

/// /run/ramd for root; otherwise the user's runtime dir.
fn default_run_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        return PathBuf::from("/run/ramd");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) => PathBuf::from(d).join("ramd"),
        None => PathBuf::from(format!("/tmp/ramd-{uid}")),
    }
}

fn make_run_dir(dir: &std::path::Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating run directory {}", dir.display()))
}

fn serve(args: ServeArgs, run_dir: &std::path::Path) -> Result<()> {
    // Everything that can fail is set up before the first client is accepted.
    make_run_dir(run_dir)?;
    let store = Arc::new(
        Store::new(StoreConfig {
            max_memory: args.max_memory,
            warm_pool: args.warm_pool,
            ..StoreConfig::new(args.size)
        })
        .with_context(|| format!("disk {:?}", args.name))?,
    );
    warn_if_overcommitted(&store);

    let listener = match &args.listen {
        None => Listener::bind_unix(run_dir.join(format!("{}.sock", args.name))),
        Some(Listen::Unix(p)) => Listener::bind_unix(p.clone()),
        Some(Listen::Tcp(a)) => Listener::bind_tcp(*a),
    }
    .context("NBD listen socket")?;
    let uri = listener.uri(&args.name);

    let server = Server::new(
        Exports::new(vec![Export {
            name: args.name.clone(),
            description: format!("ramd block disk {}", args.name),
            store: store.clone(),
            read_only: args.read_only,
        }]),
        ServerConfig {
            threads: args.threads as usize,
            max_connections: args.max_connections as usize,
            ..ServerConfig::default()
        },
    );

    let status_fn: control::StatusFn = {
        let (server, store, name, uri) = (
            server.clone(),
            store.clone(),
            args.name.clone(),
            uri.clone(),
        );
        let read_only = args.read_only;
        Arc::new(move || {
            let mut v = serde_json::to_value(store.stats()).expect("stats serialize");
            let extra = json!({
                "name": name, "kind": "block", "uri": uri, "read_only": read_only,
                "connections": server.connections(), "pid": std::process::id(),
            });
            v.as_object_mut()
                .expect("stats are an object")
                .extend(extra.as_object().expect("object").clone());
            vec![v]
        })
    };
    let control_path = run_dir.join(format!("{}.ctl", args.name));
    let _control = control::ControlServer::start(control_path, status_fn)?;

    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("installing signal handlers")?;
    {
        let server = server.clone();
        std::thread::Builder::new()
            .name("signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    log::info!("signal {sig}: stopping");
                    server.stop();
                }
            })?;
    }

    log::info!(
        "block disk {:?}: size {} ({} bytes), max memory {}{}",
        args.name,
        human(store.size()),
        store.size(),
        human(store.max_memory()),
        if args.read_only { ", read-only" } else { "" }
    );
    // The URI alone on stdout: scripts wait for this line, then connect.
    println!("{uri}");

    server.run(&listener).context("serving NBD")?;
    log::info!("stopped");
    Ok(())
}

/// A sparse disk may promise more than the host has (as tmpfs may); say so.
fn warn_if_overcommitted(store: &Store) {
    if let Some(avail) = ramd_store::mem_available() {
        if store.max_memory() > avail {
            log::warn!(
                "max memory {} exceeds the host's available memory {}: writes will get \
                 ENOSPC once the host is down to its reserve of {}",
                human(store.max_memory()),
                human(avail),
                human(ramd_store::default_host_reserve())
            );
        }
    }
}
