//! One process serving disks: `ramd serve` (one disk from flags; the
//! process ends with it) and `ramd up` (every disk of a config file, with a
//! shared budget and background threads, `ramd down`, `ramd reload`).
//!
//! One thread runs the loop in [`Daemon::run`]; everything that changes the
//! set of disks arrives there as an [`Event`] (signals, control requests,
//! frontends that ended), so disks are added, stopped and removed in one
//! place. A disk's final save runs on a thread of its own ("finisher"), so
//! that a second signal or a `status` request is served meanwhile.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Weak};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use ramd_store::Budget;

use crate::args::DiskArgs;
use crate::config::{DaemonSettings, Plan};
use crate::control::{self, ControlServer, Request};
use crate::disk::{self, Disk, LoadProgress, Shared};
pub use crate::event::Event;
use crate::frontend::{Claim, Registry};
use crate::metrics::MetricsServer;
use crate::notify;
use crate::status::{DaemonStatus, DiskStatus};

struct Running {
    disk: Arc<Disk>,
    finishing: bool,
    /// Requests to answer once the disk is gone.
    waiting: Vec<Request>,
}

enum Mode {
    /// `ramd serve`: the process ends with its disk.
    Serve,
    /// `ramd up`: runs until a stop signal or `ramd down`.
    Up {
        config: PathBuf,
        settings: DaemonSettings,
        /// `--all-or-nothing`: one disk that cannot start stops them all.
        all_or_nothing: bool,
    },
}

/// What SIGHUP does to a daemon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hangup {
    /// `ramd up`: re-read the config file.
    Reload,
    /// `ramd serve` in a terminal: the terminal is gone; save and stop.
    Stop,
    /// A daemon detached from any terminal (the mount helper's): no
    /// terminal can hang up, so the signal is someone's mistake.
    Ignore,
}

pub struct Daemon {
    shared: Shared,
    mode: Mode,
    tx: Sender<Event>,
    rx: Receiver<Event>,
    disks: BTreeMap<String, Running>,
    /// Stop every disk, then return.
    ending: bool,
    /// `ramd down` requests, answered once every disk is gone.
    down_all: Vec<Request>,
    errors: Vec<String>,
    /// What `status` and `/metrics` read, beside the loop.
    published: Arc<Published>,
    _control: Option<ControlServer>,
    _metrics: Option<MetricsServer>,
}

/// How a daemon is set up beyond its disks.
pub struct Setup {
    pub run_dir: PathBuf,
    pub registry: Registry,
    /// Called once every disk serves, where systemd is told READY=1 (the
    /// mount helper's daemon tells the helper waiting for it this way).
    pub on_ready: Option<Box<dyn FnOnce() + Send>>,
    /// Serve `/metrics` here (`--metrics`, `[daemon] metrics`).
    pub metrics: Option<SocketAddr>,
    /// What SIGHUP does to `ramd serve` (`ramd up` always reloads).
    pub hangup: Hangup,
    /// `ramd up --all-or-nothing`.
    pub all_or_nothing: bool,
    /// Shows each image load's progress (the engine only reports it).
    pub load_progress: LoadProgress,
}

/// The daemon's disks and settings as the metrics thread reads them: the
/// loop adds a disk once it serves and removes it once it is gone. Weak, so
/// that a scrape never keeps a stopped disk's sockets or memory alive.
struct Published {
    disks: parking_lot::Mutex<BTreeMap<String, Weak<Disk>>>,
    /// Disks of the config file that could not start, and why: the loop's
    /// one record of them (`reload` tries them again).
    failed: parking_lot::Mutex<BTreeMap<String, String>>,
    config: parking_lot::Mutex<Option<String>>,
    max_memory: Option<u64>,
    host_reserve: u64,
    compress_threads: u16,
    metrics: Option<String>,
}

impl Published {
    /// The daemon's status, given what its disks use together.
    fn daemon(&self, memory_used: u64) -> DaemonStatus {
        DaemonStatus {
            pid: std::process::id(),
            config: self.config.lock().clone(),
            disks: self.disks.lock().keys().cloned().collect(),
            max_memory: self.max_memory,
            memory_used,
            host_reserve: self.host_reserve,
            compress_threads: self.compress_threads,
            process: ramd_store::ProcessMemory::now(),
            metrics: self.metrics.clone(),
            failed: self.failed.lock().clone(),
        }
    }

    /// One scrape: every disk's status, and the daemon's from them.
    fn scrape(&self) -> (DaemonStatus, Vec<DiskStatus>) {
        let disks: Vec<Arc<Disk>> = self
            .disks
            .lock()
            .values()
            .filter_map(Weak::upgrade)
            .collect();
        let disks: Vec<DiskStatus> = disks.iter().map(|d| d.status()).collect();
        let used = disks.iter().map(|d| d.store.memory_used).sum();
        (self.daemon(used), disks)
    }
}

impl Daemon {
    /// `ramd serve`: serves one disk until a stop signal, `ramd down NAME`,
    /// or (fs disks) `umount`. Prints the disk's URI (or mount point) alone
    /// on stdout once clients may connect.
    pub fn serve(args: DiskArgs, mut setup: Setup) -> Result<()> {
        let threads = args.compress_threads;
        let on_ready = setup.on_ready.take();
        let mut d = Daemon::new(setup, Mode::Serve, None, None, threads)?;
        d.open(vec![args])?;
        let disk = d.disks.values().next().expect("opened above");
        // One line on stdout, once clients may connect: every endpoint
        // (NBD sockets, the iSCSI portal, the mount point), the first one
        // first, so that scripts can wait for the line and take its first
        // word.
        println!("{}", disk.disk.endpoints().join(" "));
        notify::ready(&d.summary());
        if let Some(f) = on_ready {
            f();
        }
        d.run()
    }

    /// `ramd up`: serves every disk of `plan` until a stop signal or `ramd
    /// down`. Nothing is half-started: if one disk fails to start, the
    /// others are stopped again and the error is returned. Prints `NAME
    /// WHERE` for each disk on stdout once all of them serve.
    pub fn up(plan: Plan, mut setup: Setup) -> Result<()> {
        let on_ready = setup.on_ready.take();
        let s = &plan.daemon;
        let budget = s.max_memory.map(Budget::new);
        let all_or_nothing = setup.all_or_nothing;
        let mut d = Daemon::new(
            setup,
            Mode::Up {
                config: plan.path.clone(),
                settings: s.clone(),
                all_or_nothing,
            },
            budget,
            s.host_reserve,
            s.compress_threads.unwrap_or(1),
        )?;
        let disks: Vec<DiskArgs> = plan.disks.into_iter().map(|(a, _)| a).collect();
        let total = disks.len();
        d.check_claims(&disks, &plan.path, all_or_nothing)?;
        if all_or_nothing {
            d.open(disks)?;
        } else {
            d.open_each(disks);
            if total > 0 && d.disks.is_empty() {
                bail!(
                    "no disk of {} could start: {}",
                    plan.path.display(),
                    d.failed_text()
                );
            }
        }
        for r in d.disks.values() {
            println!("{} {}", r.disk.name(), r.disk.endpoints().join(" "));
        }
        for (name, why) in d.published.failed.lock().iter() {
            println!("{name} FAILED: {why}");
        }
        notify::ready(&d.summary());
        if let Some(f) = on_ready {
            f();
        }
        d.run()
    }

    fn new(
        setup: Setup,
        mode: Mode,
        budget: Option<Arc<Budget>>,
        host_reserve: Option<u64>,
        compress_threads: u16,
    ) -> Result<Daemon> {
        let (tx, rx) = channel();
        // First, so that a busy address fails before anything else exists.
        let metrics = setup.metrics.map(MetricsServer::bind).transpose()?;
        let metrics_url = metrics.as_ref().map(|(_, a)| crate::metrics::url(*a));
        let shared = Shared {
            scanners: ramd_store::ScannerPool::new(compress_threads as usize)
                .context("starting the background compression threads")?,
            run_dir: setup.run_dir,
            registry: setup.registry,
            host_reserve: host_reserve.unwrap_or_else(ramd_store::default_host_reserve),
            compress_threads,
            budget: budget.clone(),
            metrics_url: metrics_url.clone(),
            load_progress: setup.load_progress,
        };
        disk::make_run_dir(&shared.run_dir)?;
        let control = match mode {
            Mode::Serve => None,
            Mode::Up { .. } => {
                let tx = std::sync::Mutex::new(tx.clone());
                let path = control::daemon_socket(&shared.run_dir);
                let server = ControlServer::start(
                    path.clone(),
                    Arc::new(move |req| {
                        let _ = tx.lock().expect("not poisoned").send(Event::Daemon(req));
                    }),
                )
                .with_context(|| {
                    format!(
                        "another `ramd up` serves run directory {} (use `ramd reload` or \
                         `ramd down`, or another --run-dir)",
                        shared.run_dir.display()
                    )
                })?;
                Some(server)
            }
        };
        let hangup = match mode {
            Mode::Up { .. } => Hangup::Reload,
            Mode::Serve => setup.hangup,
        };
        on_signals(tx.clone(), hangup)?;
        let published = Arc::new(Published {
            disks: Default::default(),
            failed: Default::default(),
            config: parking_lot::Mutex::new(match &mode {
                Mode::Up { config, .. } => Some(config.display().to_string()),
                Mode::Serve => None,
            }),
            max_memory: budget.as_ref().map(|b| b.limit()),
            host_reserve: shared.host_reserve,
            compress_threads,
            metrics: metrics_url,
        });
        let metrics = match metrics {
            None => None,
            Some((listener, _)) => {
                let p = published.clone();
                Some(MetricsServer::start(
                    listener,
                    Arc::new(move || p.scrape()),
                )?)
            }
        };
        Ok(Daemon {
            shared,
            mode,
            tx,
            rx,
            disks: BTreeMap::new(),
            ending: false,
            down_all: Vec::new(),
            errors: Vec::new(),
            published,
            _control: control,
            _metrics: metrics,
        })
    }

    /// Opens and starts `disks`; if one fails, the ones this call opened
    /// are stopped again (saving nothing they did not load) and the error
    /// is returned.
    fn open(&mut self, disks: Vec<DiskArgs>) -> Result<Vec<String>> {
        let mut opened: Vec<Arc<Disk>> = Vec::new();
        let mut failure = None;
        for args in disks {
            let name = args.name.clone();
            match Disk::open(args, &self.shared, self.tx.clone())
                .and_then(|d| d.start(&self.tx).map(|()| d))
            {
                Ok(d) => opened.push(d),
                Err(e) => {
                    failure = Some(e.context(format!("disk {name:?}")));
                    break;
                }
            }
        }
        if let Some(e) = failure {
            for d in &opened {
                d.stop(false);
            }
            for d in opened {
                // No client has seen it: nothing of it can be lost, so a
                // save that fails must not hold the start up.
                d.force();
                if let Err(e) = d.finish(&|why| log::error!("{why}")) {
                    log::error!("{e:#}");
                }
            }
            return Err(e);
        }
        let names = opened.iter().map(|d| d.name().to_string()).collect();
        for d in opened {
            let weak = Arc::downgrade(&d);
            self.published
                .disks
                .lock()
                .insert(d.name().to_string(), weak);
            self.disks.insert(
                d.name().to_string(),
                Running {
                    disk: d,
                    finishing: false,
                    waiting: Vec::new(),
                },
            );
        }
        Ok(names)
    }

    /// Opens and starts each of `disks` on its own: one that fails is
    /// listed in `failed` (status shows it, `reload` tries it again) and
    /// the others serve. Returns the names that started.
    fn open_each(&mut self, disks: Vec<DiskArgs>) -> Vec<String> {
        let mut names = Vec::new();
        for args in disks {
            let name = args.name.clone();
            match self.open(vec![args]) {
                Ok(n) => {
                    self.published.failed.lock().remove(&name);
                    names.extend(n);
                }
                Err(e) => {
                    let why = format!("{:#}", e);
                    log::error!("{why} (the other disks start; `ramd reload` tries it again)");
                    // The context already names the disk.
                    let why = why
                        .strip_prefix(&format!("disk {name:?}: "))
                        .unwrap_or(&why)
                        .to_string();
                    self.published.failed.lock().insert(name, why);
                }
            }
        }
        names
    }

    fn failed_text(&self) -> String {
        self.published
            .failed
            .lock()
            .iter()
            .map(|(n, why)| format!("disk {n:?}: {why}"))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Two disks may not share a socket or a mount point, with each other
    /// or with a disk already running. A disk whose own claims fail (a
    /// missing mount point) fails alone when it opens, unless
    /// `all_or_nothing`.
    fn check_claims(
        &self,
        disks: &[DiskArgs],
        file: &std::path::Path,
        all_or_nothing: bool,
    ) -> Result<()> {
        let mut taken: BTreeMap<Claim, String> = BTreeMap::new();
        for r in self.disks.values() {
            for c in r.disk.claims() {
                taken.insert(c.clone(), r.disk.name().to_string());
            }
        }
        for a in disks {
            let claims = match disk::claims(a, &self.shared) {
                Ok(c) => c,
                Err(_) if !all_or_nothing => continue,
                Err(e) => return Err(e.context(format!("{}: disk {:?}", file.display(), a.name))),
            };
            for c in claims {
                if let Some(other) = taken.insert(c.clone(), a.name.clone()) {
                    bail!(
                        "{}: disks {other:?} and {:?} both want {}",
                        file.display(),
                        a.name,
                        c.0
                    );
                }
            }
        }
        Ok(())
    }

    /// The loop: until every disk is gone (`serve`) or a stop was asked
    /// for and every disk is gone (`up`). Errors: disks that failed or
    /// could not save at stop.
    fn run(mut self) -> Result<()> {
        loop {
            if self.disks.is_empty() && (self.ending || matches!(self.mode, Mode::Serve)) {
                break;
            }
            let Ok(event) = self.rx.recv() else { break };
            match event {
                Event::Signal(sig) => {
                    self.end();
                    // Again while disks stop: their clients are cut off
                    // now, but a disk with an image still saves (only `ramd
                    // down --force` gives data up).
                    let again: Vec<&Running> =
                        self.disks.values().filter(|r| r.finishing).collect();
                    if again.is_empty() {
                        log::info!("signal {sig}: stopping (saving first if there is an image)");
                    } else {
                        log::warn!(
                            "signal {sig} again: cutting clients off; a save still completes \
                             (only `ramd down --force NAME` stops without it)"
                        );
                    }
                    for r in again {
                        r.disk.stop(true);
                        r.disk.wake();
                    }
                    self.finish_all();
                }
                Event::Hangup => match self.reload(None) {
                    Ok(v) => log::info!("reloaded: {v}"),
                    Err(e) => log::error!("reload: {e}"),
                },
                Event::FrontendEnded { disk } => self.finish(&disk, None, Stop::Ended),
                Event::StopDisk { disk, req, force } => self.finish(
                    &disk,
                    Some(req),
                    if force { Stop::Force } else { Stop::Ask },
                ),
                Event::StopRefused { disk, error } => self.refused(&disk, error),
                Event::StillHeld { disk, error } => self.held(&disk, error),
                Event::WaitDisk { disk, mut req } => match self.disks.get_mut(&disk) {
                    Some(r) => {
                        // Registered before the client is told: whatever
                        // it does next (umount) ends the disk after this.
                        req.progress(json!({ "waiting": disk }));
                        r.waiting.push(req)
                    }
                    None => req.answer(Err(format!("no running disk named {disk:?}"))),
                },
                Event::Finished { disk, result } => self.finished(&disk, result),
                Event::Daemon(req) => self.daemon_request(req),
            }
        }
        let summary = if self.errors.is_empty() {
            Ok(json!({ "down": true }))
        } else {
            Err(self.errors.join("; "))
        };
        for req in self.down_all.drain(..) {
            req.answer(summary.clone());
        }
        if self.errors.is_empty() {
            log::info!("stopped");
            Ok(())
        } else {
            bail!("{}", self.errors.join("\n"))
        }
    }

    /// Starts stopping a disk: its finisher saves while it still serves
    /// (unless its frontends ended already, or `Stop::Force`), stops its
    /// frontends, waits for them and saves again. `req` is answered once
    /// it is gone, or once its save failed and it serves on.
    fn finish(&mut self, name: &str, req: Option<Request>, how: Stop) {
        if matches!(self.mode, Mode::Serve) {
            // `serve` ends with its disk.
            self.end();
        }
        let Some(r) = self.disks.get_mut(name) else {
            if let Some(req) = req {
                req.answer(Err(format!("no running disk named {name:?}")));
            }
            return;
        };
        r.waiting.extend(req);
        if how == Stop::Force {
            r.disk.force();
            r.disk.stop(true);
        }
        if r.finishing {
            // A finisher holding unsaved data tries again now.
            r.disk.wake();
            return;
        }
        r.finishing = true;
        r.disk.set_leaving(true);
        let (disk, tx, name) = (r.disk.clone(), self.tx.clone(), name.to_string());
        let spawned = std::thread::Builder::new()
            .name(format!("finish-{name}"))
            .spawn({
                let name = name.clone();
                move || {
                    if how == Stop::Ask {
                        // Cut off meanwhile (a second signal), it cannot
                        // serve on: the save at stop holds its data instead.
                        if let (Err(e), false) = (disk.save_before_stop(), disk.stopped()) {
                            let error = format!("{e:#}");
                            drop(disk);
                            let _ = tx.send(Event::StopRefused { disk: name, error });
                            return;
                        }
                    }
                    let held = {
                        let (tx, name) = (tx.clone(), name.clone());
                        move |why: &str| {
                            let _ = tx.send(Event::StillHeld {
                                disk: name.clone(),
                                error: why.to_string(),
                            });
                        }
                    };
                    let result = disk.finish(&held);
                    // Its sockets go with the last handle, before the
                    // daemon hears it is gone (and may exit).
                    drop(disk);
                    let _ = tx.send(Event::Finished { disk: name, result });
                }
            });
        if let Err(e) = spawned {
            let result = Err(anyhow::anyhow!("starting its finisher: {e}"));
            self.finished(&name, result);
        }
    }

    /// A disk's save before its stop failed: it serves on, and whoever
    /// asked is told why. `serve` no longer ends (until it stops).
    fn refused(&mut self, name: &str, error: String) {
        let Some(r) = self.disks.get_mut(name) else {
            return;
        };
        r.finishing = false;
        r.disk.set_leaving(false);
        for req in r.waiting.drain(..) {
            req.answer(Err(error.clone()));
        }
        if self.ending {
            // The process serves on (what stopped cleanly is gone) and
            // waits to be asked again.
            self.ending = false;
            ramd_store::persist::stop_loading(false);
            for req in self.down_all.drain(..) {
                req.answer(Err(error.clone()));
            }
            notify::ready(&self.summary());
        } else {
            notify::status(&self.summary());
        }
    }

    /// A disk's save at stop failed (again): whoever waits for it is told
    /// now; the disk holds its data and retries.
    fn held(&mut self, name: &str, error: String) {
        let Some(r) = self.disks.get_mut(name) else {
            return;
        };
        for req in r.waiting.drain(..) {
            req.answer(Err(error.clone()));
        }
        for req in self.down_all.drain(..) {
            req.answer(Err(error.clone()));
        }
        notify::status(&self.summary());
    }

    /// From now on the daemon stops: every disk, then the process.
    fn end(&mut self) {
        if !self.ending {
            notify::stopping();
        }
        self.ending = true;
    }

    /// `STATUS=` for systemd: what serves, and what needs a person.
    fn summary(&self) -> String {
        let names: Vec<&str> = self.disks.keys().map(String::as_str).collect();
        let mut s = format!("serving {} disk(s): {}", names.len(), names.join(" "));
        for (n, why) in self.published.failed.lock().iter() {
            s.push_str(&format!("; disk {n} FAILED: {why}"));
        }
        for r in self.disks.values() {
            if let Some(why) = r.disk.blocked() {
                s.push_str(&format!("; disk {}: {why}", r.disk.name()));
            }
        }
        s
    }

    fn finish_all(&mut self) {
        self.finish_all_as(Stop::Ask)
    }

    fn finish_all_as(&mut self, how: Stop) {
        let names: Vec<String> = self.disks.keys().cloned().collect();
        for n in names {
            self.finish(&n, None, how);
        }
    }

    fn finished(&mut self, name: &str, result: Result<()>) {
        let Some(r) = self.disks.remove(name) else {
            return;
        };
        self.published.disks.lock().remove(name);
        // The last handle: sockets and memory go now, before anyone is told.
        let saved = r.disk.args().image.is_some();
        // `--replicate`: what reached the replica, or what did not.
        let replicated = match r.disk.replicated() {
            Some(Ok(text)) => json!(text),
            Some(Err(text)) => json!({ "error": text }),
            None => Value::Null,
        };
        drop(r.disk);
        let answer = match &result {
            Ok(()) => {
                log::info!("disk {name:?} stopped");
                let mut v = json!({ "stopped": name, "saved": saved });
                if !replicated.is_null() {
                    v["replicated"] = replicated;
                }
                Ok(v)
            }
            Err(e) => {
                log::error!("{e:#}");
                self.errors.push(format!("{e:#}"));
                Err(format!("{e:#}"))
            }
        };
        for req in r.waiting {
            req.answer(answer.clone());
        }
    }
}

/// How a disk is asked to stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// Asked (a signal, `ramd down`, a reload): saves first while serving,
    /// and serves on if that save fails.
    Ask,
    /// Its frontends ended (`umount`): saves, holding the data until a save
    /// succeeds.
    Ended,
    /// `ramd down --force`: stops now; if the save fails, says what is
    /// lost.
    Force,
}

mod requests;
mod signals;

use signals::on_signals;
