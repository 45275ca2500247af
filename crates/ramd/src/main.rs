//! `ramd`: the command line. Disks and their lifecycle live in
//! `ramd-daemon`, storage in `ramd-store`, the protocols in `ramd-nbd` and
//! `ramd-fs`; this binary parses the command line, picks the frontends
//! (the registry below), and talks to running daemons.

mod bench;
mod cli;
mod client;
mod help;
mod image_cmd;
mod image_fs;
mod mount_helper;
mod progress;
mod salvage;
mod systemd;

use std::path::PathBuf;

use clap::Parser;

use cli::{Cli, Command, ServeArgs};
use ramd_daemon::config;
use ramd_daemon::daemon::{Daemon, Hangup, Setup};
use ramd_daemon::frontend::Registry;

fn main() {
    // Before any disk's settings are parsed: registering a protocol adds
    // its settings group, if it has one, to a disk's flags.
    let registry = registry();
    // Run as /sbin/mount.fuse.ramd or umount.fuse.ramd by mount(8).
    if let Some(code) = mount_helper::run_if_helper() {
        std::process::exit(code);
    }
    init_logging();
    let mut cli = Cli::parse();
    if let Command::Serve(ServeArgs {
        config: Some(path),
        disk_name,
        ..
    }) = &cli.command
    {
        // The file's flags go before the command line's, which then win.
        match config::disk_flags(path, disk_name.as_deref()) {
            Ok(flags) => {
                cli = Cli::parse_from(config::splice(std::env::args_os().collect(), flags))
            }
            Err(e) => {
                eprintln!("ramd: error: {e:#}");
                std::process::exit(2);
            }
        }
    }
    let run_dir = cli.run_dir.clone();
    let setup = |from_file: Option<PathBuf>, metrics, all_or_nothing| Setup {
        run_dir: run_dir
            .clone()
            .or(from_file)
            .unwrap_or_else(default_run_dir),
        registry: registry.clone(),
        on_ready: None,
        metrics,
        // A closed terminal or a lost ssh session: save and stop.
        hangup: Hangup::Stop,
        all_or_nothing,
        load_progress: progress::load_progress,
    };
    let dir = || run_dir.clone().unwrap_or_else(default_run_dir);
    let result = match cli.command {
        Command::Serve(args) => Daemon::serve(args.disk, setup(None, args.metrics, false)),
        Command::Up(args) => config::load(&args.config).and_then(|plan| {
            let from_file = plan.daemon.run_dir.clone();
            let metrics = args.metrics.or(plan.daemon.metrics);
            Daemon::up(plan, setup(from_file, metrics, args.all_or_nothing))
        }),
        Command::Down(a) => client::down(&dir(), &a),
        Command::Reload(a) => client::reload(&dir(), a.config.as_deref(), a.json),
        Command::Status(a) if a.watch => {
            client::watch(&dir(), a.name.as_deref(), a.json, a.interval)
        }
        Command::Status(a) => client::status(&dir(), a.name.as_deref(), a.json),
        Command::Snapshot(a) => client::snapshot(&dir(), &a.name, a.full, a.to.as_deref(), a.json),
        Command::Promote(a) => client::promote(&dir(), &a),
        Command::Image(cmd) => image_cmd::run(cmd),
        Command::Bench(a) => bench::run(a),
        Command::Completions { shell } => help::completions(shell),
        Command::Man(a) => help::man(&a.command, a.out_dir.as_deref()),
        Command::InstallSystemd(a) => systemd::install(&a.config, a.bin.as_deref(), &a.unit_dir),
        Command::InstallMountHelper(a) => mount_helper::install(&a.dir, a.bin.as_deref()),
    };
    if let Err(e) = result {
        eprintln!("ramd: error: {e:#}");
        std::process::exit(1);
    }
}

/// Logs to stderr, at the level RAMD_LOG sets.
fn init_logging() {
    env_logger::Builder::from_env(env_logger::Env::new().filter_or("RAMD_LOG", "info"))
        .format_target(false)
        .init();
}

/// The frontends this build knows. A new protocol is one more `.with(...)`.
fn registry() -> Registry {
    ramd_daemon::frontends::builtin().with(ramd_daemon::Iscsi::new())
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
