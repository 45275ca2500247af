//! A disk's one lifecycle, whatever its kind and frontends:
//!
//! 1. [`Disk::open`]: check the settings and every frontend's claims, open
//!    and check the image, size the budget, build the store (and, through
//!    a factory's `prepare` hook, the content it serves: an `fs` disk's
//!    filesystem), load the image, start saving and
//!    background work, bind the control socket, build the frontends (bind
//!    sockets, mount). Everything that can fail happens here, before any
//!    client; a failure drops what was built, in reverse order.
//! 2. [`Disk::start`]: each frontend serves on a thread of its own.
//! 3. [`Disk::stop`]: the frontends stop (a second call may force them).
//! 4. [`Disk::finish`]: wait for them, stop background work, save at stop
//!    if the disk has an image, remove the control socket.
//!
//! A disk with an image is never let go unsaved by accident: a stop asked
//! for while it serves saves first ([`Disk::save_before_stop`]) and, if that
//! fails, it goes on serving; a save at stop that fails (after `umount`)
//! keeps the data and retries ([`Disk::finish`] holds it) until a save
//! succeeds, here or through `ramd snapshot --to DIR`, or `ramd down
//! --force` gives it up ([`Disk::force`]).
//!
//! Frontends never see any of this: they get a [`DiskContext`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use parking_lot::{Condvar, Mutex};

use ramd_store::metrics::DiskMetrics;
use ramd_store::numa::Placement;
use ramd_store::persist::{DiskKind, ImageDir};
use ramd_store::DiskId;
use ramd_store::{ScanHandle, Store};

use crate::args::{DiskArgs, DiskSize};
use crate::control::ControlServer;
use crate::event::Event;
pub use crate::event::Events;
use crate::frontend::{Claim, Content, DiskContext, Frontend, Prepare, Registry};
use ramd_store::human;
use ramd_store::persist::{self, Persister, SaveReport};

/// What the disks of one process share.
pub struct Shared {
    pub run_dir: PathBuf,
    pub registry: Registry,
    /// Page memory is refused while the host's MemAvailable is below this.
    pub host_reserve: u64,
    /// Background threads (compression, compaction) of all the disks.
    pub scanners: ramd_store::ScannerPool,
    /// How many threads a pass uses.
    pub compress_threads: u16,
    /// The daemon's memory budget, shared by its disks.
    pub budget: Option<Arc<ramd_store::Budget>>,
    /// The daemon's Prometheus endpoint, for `status`.
    pub metrics_url: Option<String>,
    /// A fresh reporter of an image load's progress, for each load.
    pub load_progress: LoadProgress,
}

/// Makes the reporter of one image load's progress.
pub use ramd_frontend::LoadProgress;

/// A disk's saving: its persister and the thread of --autosave and
/// --flush persist.
struct Saving {
    persister: Arc<Persister>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Saving {
    /// A disk that failed to open after saving started: its save thread
    /// must not go on saving a disk nobody serves. (After `finish` this
    /// finds the thread gone and the persister closed already.)
    fn drop(&mut self) {
        if let Some(t) = self.thread.get_mut().take() {
            self.persister.stop(Some(t));
        }
        self.persister.close();
    }
}

pub struct Disk {
    args: DiskArgs,
    kind: DiskKind,
    /// Its identity: its image's, or new at this start without one.
    id: DiskId,
    /// A filesystem's capacity (`None`: unlimited); a block disk's size.
    size: Option<u64>,
    store: Arc<Store>,
    /// What a protocol built over the store (a filesystem), if any.
    content: Option<Arc<dyn Content>>,
    saving: Option<Saving>,
    /// The store's, and with a cold tier its store's too.
    scanner: Mutex<Vec<ScanHandle>>,
    frontends: Vec<Arc<dyn Frontend>>,
    /// What the frontends record about their requests.
    io: DiskMetrics,
    metrics_url: Option<String>,
    control: Mutex<Option<ControlServer>>,
    serving: Mutex<Vec<JoinHandle<Result<()>>>>,
    stopping: AtomicBool,
    /// Why it is not stopping although asked to (a save failed), and the
    /// held finisher's wake-ups (`held`).
    blocked: Mutex<Blocked>,
    held: Condvar,
    /// `ramd down --force`: stop even if the save fails.
    forced: AtomicBool,
    /// Asked to stop (and not refused since): status calls it stopping.
    leaving: AtomicBool,
    /// What its frontends took (sockets, mount points), for `reload`.
    claims: Vec<Claim>,
    /// Its NUMA nodes and policy (--numa-nodes, --numa-policy).
    placement: Option<Placement>,
    /// `--replicate`: what the replica held at the stop (`Err`: not every
    /// save), for `ramd down`.
    replicated: Mutex<Option<std::result::Result<String, String>>>,
}

/// What a disk's frontends would claim, checked before anything is built.
pub fn claims(args: &DiskArgs, shared: &Shared) -> Result<Vec<Claim>> {
    let mut out = Vec::new();
    for f in shared.registry.iter() {
        out.extend(f.claims(args, &shared.run_dir)?);
    }
    Ok(out)
}

impl Disk {
    /// Builds the disk, ready to serve; see the module's step 1.
    pub fn open(args: DiskArgs, shared: &Shared, events: Events) -> Result<Arc<Disk>> {
        let kind = args.kind();
        check_args(&args)?;
        // A mount point that does not exist fails before any allocation.
        let claimed = claims(&args, shared)?;
        let given = match (args.size, kind) {
            (Some(DiskSize::Unlimited), DiskKind::Block) => bail!(
                "a block disk needs a size in bytes: `unlimited` is for filesystem disks (--mount)"
            ),
            (Some(DiskSize::Bytes(n)), _) => Some(n),
            // An image records an unlimited fs disk's size as 0.
            (Some(DiskSize::Unlimited), DiskKind::Fs) => Some(0),
            (None, _) => None,
        };
        let image = match &args.image {
            Some(url) if args.standby => {
                let image = ImageDir::open_standby(url)?;
                let m = image.manifest().expect("a standby's image holds a save");
                if m.kind != kind {
                    bail!(
                        "--standby --image {}: the image holds a {} disk; {}",
                        url.display(),
                        m.kind.name(),
                        match kind {
                            DiskKind::Block => "serve it with --mount DIR",
                            DiskKind::Fs => "leave --mount out",
                        }
                    );
                }
                if let Some(s) = given.filter(|&s| s != m.size) {
                    bail!(
                        "--size {s} differs from the size of the disk in image {}: {} bytes; \
                         leave --size out to use the image's",
                        url.display(),
                        m.size
                    );
                }
                let size = m.size;
                Some((image, size))
            }
            Some(dir) => {
                let (mut image, size) = persist::open_image(dir, kind, given)?;
                image.set_keep_saves(Some(args.keep_saves));
                Some((image, size))
            }
            None => None,
        };
        let id = image
            .as_ref()
            .map_or_else(DiskId::random, |(image, _)| image.id());
        let size = match (image.as_ref().map(|(_, n)| *n), given) {
            (Some(n), _) | (None, Some(n)) => n,
            (None, None) => bail!(
                "a new disk needs a size: give --size SIZE (or `size = \"SIZE\"` in its config table)"
            ),
        };
        let size = match kind {
            DiskKind::Fs if size == 0 => None,
            _ => Some(size),
        };
        make_run_dir(&shared.run_dir)?;
        // An image may hold compressed pages whatever --compress says now:
        // leave room for their allocator's slack, as a compressed disk does.
        let loading = image.as_ref().is_some_and(|(i, _)| i.manifest().is_some());
        let placement = placement(&args)?;
        if let Some(h) = args.huge_pages {
            h.check_host()?;
        }
        // A content that keeps its data elsewhere leaves this store none.
        let outside = shared.registry.iter().any(|f| f.data_outside_store(&args));
        let store = Arc::new(
            // The daemon's context names the disk.
            Store::new(store_config(
                &args, kind, size, loading, shared, &placement, outside,
            ))?,
        );
        // A protocol's content (a filesystem), built over the store and
        // loaded from the image; without one, the image's pages load into
        // the store as they are.
        let mut prepared = None;
        let prep = Prepare {
            settings: &args,
            store: &store,
            size,
            image: image.as_ref().filter(|_| loading).map(|(i, _)| i),
            host_reserve: shared.host_reserve,
            budget: shared.budget.clone(),
            placement: placement.as_ref(),
            load_progress: shared.load_progress,
        };
        for f in shared.registry.iter() {
            if let Some(p) = f.prepare(&prep)? {
                prepared = Some(p);
                break;
            }
        }
        let (content, loaded_meta) = match prepared {
            Some(p) => (Some(p.content), p.loaded_meta),
            None if kind == DiskKind::Fs => {
                bail!("no registered frontend serves a filesystem disk (--mount)")
            }
            None => {
                if let Some(image) = prep.image {
                    persist::load(image, &store, &mut (shared.load_progress)())?;
                }
                (None, None)
            }
        };
        if args.standby {
            store.set_standby(true);
        }
        let image = image.map(|(i, _)| i);
        let saving = match image {
            Some(image) => Some(start_saving(
                &args,
                &store,
                image,
                kind,
                size,
                content.as_deref(),
                loaded_meta,
            )?),
            None => None,
        };
        warn_if_overcommitted(&store, shared.host_reserve);
        let mut scanner: Vec<ScanHandle> = start_scanner(&store, &args, shared, outside)
            .into_iter()
            .collect();
        for s in content.iter().flat_map(|c| c.stores()) {
            scanner.push(shared.scanners.add(s));
        }

        // The control socket first: a name already in use fails before
        // anything is mounted or bound. It answers "starting" until the
        // disk exists.
        let target: Arc<OnceLock<Weak<Disk>>> = Arc::default();
        let control = ControlServer::start(
            shared.run_dir.join(format!("{}.ctl", args.name)),
            disk_handler(target.clone(), events),
        )?;
        let io = DiskMetrics::default();
        let ctx = DiskContext {
            settings: &args,
            kind,
            id,
            store: &store,
            content: content.as_ref().map(|c| c.as_any()),
            run_dir: &shared.run_dir,
            metrics: &io,
        };
        let mut frontends = Vec::new();
        for f in shared.registry.iter() {
            frontends.extend(f.build(&ctx)?);
        }
        let disk = Arc::new(Disk {
            args,
            kind,
            id,
            size,
            store,
            content,
            saving,
            scanner: Mutex::new(scanner),
            frontends,
            io,
            metrics_url: shared.metrics_url.clone(),
            control: Mutex::new(Some(control)),
            serving: Mutex::new(Vec::new()),
            stopping: AtomicBool::new(false),
            blocked: Mutex::new(Blocked::default()),
            held: Condvar::new(),
            forced: AtomicBool::new(false),
            leaving: AtomicBool::new(false),
            claims: claimed,
            placement,
            replicated: Mutex::new(None),
        });
        let _ = target.set(Arc::downgrade(&disk));
        log::info!("{}", disk.describe());
        Ok(disk)
    }

    pub fn name(&self) -> &str {
        &self.args.name
    }

    pub fn args(&self) -> &DiskArgs {
        &self.args
    }

    pub fn claims(&self) -> &[Claim] {
        &self.claims
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.store
    }

    /// Where clients reach the disk, one per frontend.
    pub fn endpoints(&self) -> Vec<String> {
        self.frontends.iter().map(|f| f.status().endpoint).collect()
    }

    fn describe(&self) -> String {
        let ends = self.endpoints().join(", ");
        let what = match self.kind {
            DiskKind::Block => format!(
                "block disk {:?}: size {} ({} bytes), max memory {}{}; {ends}",
                self.args.name,
                human(self.store.size()),
                self.store.size(),
                human(self.store.max_memory()),
                if self.args.read_only {
                    ", read-only"
                } else if self.store.standby() {
                    ", standby (read-only until `ramd promote`)"
                } else {
                    ""
                }
            ),
            DiskKind::Fs => format!(
                "filesystem disk {:?} at {ends}: size {}, max memory {}, {} inodes{}",
                self.args.name,
                self.current_size().map_or("unlimited".into(), human),
                human(self.store.max_memory()),
                self.content.as_ref().map_or(0, |c| c.max_objects()),
                if self.store.standby() {
                    ", standby (mounted read-only until `ramd promote`)"
                } else {
                    ""
                }
            ),
        };
        format!("{what}; id {}", self.id)
    }

    /// Step 2: every frontend serves on its own thread; each tells
    /// `events` when it returns.
    pub fn start(&self, events: &Events) -> Result<()> {
        let mut serving = self.serving.lock();
        for (i, f) in self.frontends.iter().enumerate() {
            let (f, events, name) = (f.clone(), events.clone(), self.args.name.clone());
            let placement = self.placement.clone();
            let t = std::thread::Builder::new()
                .name(format!("serve-{}-{i}", self.args.name))
                .spawn(move || {
                    // Every thread the frontend starts (connections, NBD
                    // workers, FUSE workers) inherits this CPU set.
                    if let Some(p) = &placement {
                        if let Err(e) = p.pin_current_thread() {
                            log::warn!(
                                "disk {name:?}: running its threads on its nodes' CPUs: {e}"
                            );
                        }
                    }
                    let r = f.serve();
                    if let Err(e) = &r {
                        log::error!("disk {name:?}: {e:#}");
                    }
                    let _ = events.send(Event::FrontendEnded { disk: name });
                    r
                })
                .context("starting a frontend thread")?;
            serving.push(t);
        }
        Ok(())
    }

    /// Step 3: the frontends stop serving. Called again with `force`, they
    /// may fail the I/O of clients still there.
    pub fn stop(&self, force: bool) {
        if self.stopping.swap(true, Ordering::SeqCst) && !force {
            return;
        }
        for f in &self.frontends {
            f.stop(force);
        }
    }

    /// Before a stop of a serving disk: a save while clients are still
    /// served. If it fails the disk is not stopped (the error says why and
    /// what to do), so that a full or missing image filesystem loses
    /// nothing; the save at stop then has little left to write.
    pub fn save_before_stop(&self) -> Result<()> {
        let Some(s) = &self.saving else {
            return Ok(());
        };
        if self.forced.load(Ordering::SeqCst) || s.persister.is_standby() {
            return Ok(());
        }
        match s.persister.save(false) {
            Ok(_) => {
                self.blocked.lock().why = None;
                Ok(())
            }
            Err(e) => {
                let why = format!(
                    "NOT STOPPED: saving before the stop failed: {e}. The disk keeps serving, \
                     nothing is lost. Fix what the error names at {} (free space, the object \
                     store) and stop it again, save it elsewhere \
                     (`ramd snapshot {name} --to DIR`), or give up its unsaved data (`ramd down \
                     --force {name}`)",
                    s.persister.status().image.unwrap_or_default(),
                    name = self.args.name
                );
                log::error!("disk {:?}: {why}", self.args.name);
                self.blocked.lock().why = Some(why.clone());
                bail!("disk {:?}: {why}", self.args.name)
            }
        }
    }

    /// `ramd down --force`: the disk stops even if its save fails (what is
    /// lost is said then). Wakes a finisher holding unsaved data.
    pub fn force(&self) {
        self.forced.store(true, Ordering::SeqCst);
        self.wake();
    }

    /// A finisher holding unsaved data tries again now.
    pub fn wake(&self) {
        self.blocked.lock().wakes += 1;
        self.held.notify_all();
    }

    /// The daemon has asked it to stop (`true`), or its stop was refused
    /// and it serves on (`false`).
    pub fn set_leaving(&self, on: bool) {
        self.leaving.store(on, Ordering::SeqCst);
    }

    /// Whether its frontends were told to stop.
    pub fn stopped(&self) -> bool {
        self.stopping.load(Ordering::SeqCst)
    }

    /// Step 4: waits for the frontends, then saves at stop if the disk has
    /// an image. If that save fails, the data is held (the control socket
    /// still answers `status` and `snapshot`) and the save retried every
    /// [`RETRY`], or at once on [`Disk::wake`], until one succeeds or the
    /// stop is forced; `held` hears each failed try. An error is a
    /// frontend that failed, or data given up by force.
    pub fn finish(&self, held: &dyn Fn(&str)) -> Result<()> {
        self.stop(false);
        let mut failed = None;
        for t in std::mem::take(&mut *self.serving.lock()) {
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => failed = Some(e),
                Err(_) => failed = Some(anyhow::anyhow!("a frontend thread panicked")),
            }
        }
        // No background work races the last save.
        self.scanner.lock().clear();
        let saved = match &self.saving {
            None => Ok(()),
            Some(s) => {
                s.persister.stop(s.thread.lock().take());
                // A standby has nothing of its own to save: its writer saves.
                let saved = match s.persister.is_standby() {
                    true => Ok(()),
                    false => self.save_at_stop(&s.persister, held),
                };
                if let Some(r) = s.persister.finish_replica(replica_wait()) {
                    match &r {
                        Ok(text) => log::info!("disk {:?}: {text}", self.args.name),
                        Err(text) => log::error!("disk {:?}: {text}", self.args.name),
                    }
                    *self.replicated.lock() = Some(r);
                }
                s.persister.close();
                saved
            }
        };
        self.control.lock().take();
        saved.with_context(|| format!("disk {:?}", self.args.name))?;
        match failed {
            Some(e) => Err(e.context(format!("disk {:?}", self.args.name))),
            None => Ok(()),
        }
    }

    /// The save at stop, held until it succeeds or is forced.
    fn save_at_stop(&self, p: &Persister, held: &dyn Fn(&str)) -> Result<()> {
        let mut tries = 0u64;
        loop {
            // A wake-up that comes during the save is not lost: the wait
            // below ends at once when `wakes` moved.
            let seen = self.blocked.lock().wakes;
            let e = match p.save(false) {
                Ok(_) => {
                    if tries > 0 {
                        log::warn!("disk {:?}: saved at last; stopping", self.args.name);
                    }
                    self.blocked.lock().why = None;
                    return Ok(());
                }
                Err(e) => e,
            };
            if self.forced.load(Ordering::SeqCst) {
                // The daemon logs it, and says it to whoever forced it.
                bail!(
                    "stopped WITHOUT saving (ramd down --force): lost {}; the save failed: {e}",
                    self.unsaved_text(p)
                );
            }
            let why = format!(
                "NOT SAVED: the save at stop failed: {e}. Its data is held in memory and the \
                 save is retried every {}s: fix what the error names at {image} (free space, \
                 the object store), or save it elsewhere \
                 (`ramd snapshot {name} --to DIR`); `ramd down --force {name}` gives up {lost}",
                RETRY.as_secs(),
                image = p.status().image.unwrap_or_default(),
                name = self.args.name,
                lost = self.unsaved_text(p),
            );
            if tries == 0 {
                log::error!("disk {:?}: {why}", self.args.name);
            }
            tries += 1;
            self.blocked.lock().why = Some(why.clone());
            held(&format!("disk {:?}: {why}", self.args.name));
            let mut blocked = self.blocked.lock();
            if blocked.wakes == seen && !self.forced.load(Ordering::SeqCst) {
                self.held.wait_for(&mut blocked, RETRY);
            }
        }
    }

    /// What a stop without a save loses, in words.
    fn unsaved_text(&self, p: &Persister) -> String {
        // Data the content holds outside the store (a kernel tmpfs) is lost too.
        let outside = self.content.as_ref().map_or(0, |c| c.outside_bytes());
        let used = human(self.store.stats().used_bytes + outside);
        match p.status().last_save {
            Some(r) => format!(
                "what changed since its save {} of {} (it holds {used})",
                r.seq,
                persist::time_text(r.unix_time * 1_000_000_000)
            ),
            None => format!("all of its data ({used}; the image holds no complete save)"),
        }
    }

    /// `--replicate`: what the replica held at the stop, once stopped.
    pub fn replicated(&self) -> Option<std::result::Result<String, String>> {
        self.replicated.lock().clone()
    }

    /// Why the disk is not stopping although asked to, if it is not.
    pub fn blocked(&self) -> Option<String> {
        self.blocked.lock().why.clone()
    }

    /// A filesystem's capacity now (a remount may have changed it); a
    /// block disk's size.
    fn current_size(&self) -> Option<u64> {
        match &self.content {
            Some(c) => c.size(),
            None => self.size,
        }
    }

    /// Saves now (`ramd snapshot`), to a new image directory with `to`
    /// (which then becomes the disk's image). A disk holding unsaved data
    /// stops once this succeeds.
    pub fn snapshot(&self, full: bool, to: Option<&Path>) -> Result<SaveReport> {
        let Some(s) = &self.saving else {
            bail!("this disk has no image: serve it with --image DIR")
        };
        let r = match to {
            Some(dir) => s.persister.save_to(dir),
            None => s.persister.save(full),
        };
        if r.is_ok() {
            // Whatever a failed save blocked is safe now.
            self.blocked.lock().why = None;
            self.wake();
        }
        Ok(r?)
    }

    /// `ramd promote NAME`: a standby becomes its image's writer (see
    /// `Persister::promote`); the disk keeps its identity.
    pub fn promote(&self, force: bool, wait: Duration) -> Result<SaveReport> {
        let Some(s) = self.saving.as_ref().filter(|_| self.args.standby) else {
            bail!(
                "disk {:?} is not a standby: only a disk served with --standby can be \
                 promoted",
                self.args.name
            )
        };
        let r = s.persister.promote(force, wait)?;
        if let (Some(c), false) = (&self.content, self.args.read_only) {
            c.promote(&self.args.name)?;
        }
        log::info!("{}", self.describe());
        Ok(r)
    }
}

/// Why a disk does not stop (`why`), and how often its held finisher was
/// asked to try again (`wakes`).
#[derive(Default)]
struct Blocked {
    why: Option<String>,
    wakes: u64,
}

/// How often a disk holding unsaved data tries its save again.
pub const RETRY: Duration = Duration::from_secs(10);

/// How long a clean stop waits for its last save to reach the replica
/// (`--replicate`) before it says what is not replicated and goes: a
/// minute, or RAMD_REPLICA_WAIT seconds (tests make it short).
fn replica_wait() -> Duration {
    let secs = std::env::var("RAMD_REPLICA_WAIT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    Duration::from_secs(secs)
}

mod build;
mod remount;
mod requests;
mod status;

pub use build::make_run_dir;
use build::{
    check_args, placement, start_saving, start_scanner, store_config, warn_if_overcommitted,
};
use requests::disk_handler;

#[cfg(test)]
mod tests {
    //! The lifecycle through the public interface a new frontend uses:
    //! one factory, one registration, no lifecycle code of its own.

    use super::*;
    use crate::frontend::{DiskSettings, Frontend, FrontendFactory, FrontendStatus};
    use clap::{Args, FromArgMatches};
    use parking_lot::Condvar;
    use ramd_store::PAGE_SIZE;

    #[derive(Default)]
    struct Log(Mutex<Vec<String>>, Condvar);

    impl Log {
        fn push(&self, s: &str) {
            self.0.lock().push(s.into());
            self.1.notify_all();
        }
    }

    struct Probe(Arc<Log>);

    struct ProbeFrontend {
        log: Arc<Log>,
        stopped: Mutex<bool>,
        wake: Condvar,
    }

    impl FrontendFactory for Probe {
        fn claims(&self, _: &dyn DiskSettings, _: &Path) -> Result<Vec<Claim>> {
            Ok(vec![Claim("probe".into())])
        }

        fn build(&self, disk: &DiskContext) -> Result<Vec<Arc<dyn Frontend>>> {
            self.0.push("build");
            // What a client would do through this frontend.
            let mut page = [0u8; PAGE_SIZE];
            disk.store.read(0, &mut page)?;
            if page[0] == 0 {
                disk.store.change().write(0, &[7u8; PAGE_SIZE])?;
            }
            Ok(vec![Arc::new(ProbeFrontend {
                log: self.0.clone(),
                stopped: Mutex::new(false),
                wake: Condvar::new(),
            })])
        }
    }

    impl Frontend for ProbeFrontend {
        fn serve(&self) -> Result<()> {
            self.log.push("serve");
            let mut stopped = self.stopped.lock();
            while !*stopped {
                self.wake.wait(&mut stopped);
            }
            self.log.push("served");
            Ok(())
        }

        fn stop(&self, _force: bool) {
            self.log.push("stop");
            *self.stopped.lock() = true;
            self.wake.notify_all();
        }

        fn status(&self) -> FrontendStatus {
            FrontendStatus {
                protocol: "probe".into(),
                endpoint: "probe://here".into(),
                connections: Some(0),
                transport: None,
            }
        }
    }

    fn args(flags: &[&str]) -> DiskArgs {
        let cmd = DiskArgs::augment_args(clap::Command::new("t").no_binary_name(true));
        DiskArgs::from_arg_matches(&cmd.get_matches_from(flags)).unwrap()
    }

    #[test]
    fn a_registered_frontend_gets_the_whole_lifecycle() {
        let run = tempfile::tempdir().unwrap();
        let img = run.path().join("img");
        let log = Arc::new(Log::default());
        let shared = Shared {
            run_dir: run.path().to_path_buf(),
            registry: Registry::new().with(Probe(log.clone())),
            host_reserve: 0,
            scanners: ramd_store::ScannerPool::new(1).unwrap(),
            compress_threads: 1,
            budget: None,
            metrics_url: None,
            load_progress: || -> Box<dyn FnMut(persist::Progress)> { Box::new(|_| {}) },
        };
        let a = args(&[
            "--name",
            "p",
            "--size",
            "1M",
            "--image",
            img.to_str().unwrap(),
        ]);
        for round in 0..2 {
            let (tx, rx) = std::sync::mpsc::channel();
            let disk = Disk::open(a.clone(), &shared, tx.clone()).unwrap();
            disk.start(&tx).unwrap();
            {
                let mut l = log.0.lock();
                while !l.iter().any(|s| s == "serve") {
                    log.1.wait(&mut l);
                }
            }
            let st = disk.status();
            assert_eq!(st.frontends[0].protocol, "probe");
            assert_eq!(st.uri, "probe://here");
            assert_eq!(st.store.used_bytes, PAGE_SIZE as u64);
            assert_eq!(disk.claims(), [Claim("probe".into())]);
            disk.stop(false);
            disk.finish(&|why| panic!("{why}")).unwrap();
            assert!(matches!(rx.try_recv(), Ok(Event::FrontendEnded { .. })));
            assert_eq!(
                std::mem::take(&mut *log.0.lock()),
                ["build", "serve", "stop", "served"],
                "round {round}"
            );
            assert!(!run.path().join("p.ctl").exists());
            // Saved at stop: the second round loads the page back (the
            // probe writes only into an empty disk).
            let mut page = [0u8; PAGE_SIZE];
            disk.store().read(0, &mut page).unwrap();
            assert_eq!(page, [7u8; PAGE_SIZE]);
        }
    }
}
