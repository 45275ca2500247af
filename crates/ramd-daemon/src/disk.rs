//! A disk's one lifecycle, whatever its kind and frontends:
//!
//! 1. [`Disk::open`]: check the settings and every frontend's claims, open
//!    and check the image, size the budget, build the store (and the
//!    filesystem of an `fs` disk), load the image, start saving and
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

use ramd_fs::{Fs, FsConfig};
use ramd_store::metrics::DiskMetrics;
use ramd_store::numa::Placement;
use ramd_store::persist::{DiskKind, ImageDir};
use ramd_store::DiskId;
use ramd_store::{Codec, ScanHandle, Store, StoreConfig, PAGE_SIZE};

use crate::args::{DataPath, DiskArgs, DiskSize};
use crate::control::{ControlServer, Request};
use crate::daemon::Event;
use crate::frontend::{Claim, DiskContext, Frontend, Registry};
use crate::status::DiskStatus;
use ramd_store::human;
use ramd_store::persist::FlushMode;
use ramd_store::persist::{self, PersistStatus, Persister, SaveReport};

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
pub type LoadProgress = fn() -> Box<dyn FnMut(persist::Progress)>;

pub type Events = std::sync::mpsc::Sender<Event>;

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
    fs: Option<Arc<Fs>>,
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
        let store = Arc::new(
            // The daemon's context names the disk.
            Store::new(store_config(&args, kind, size, loading, shared, &placement))?,
        );
        let (fs, image, loaded_tree) = match kind {
            DiskKind::Block => {
                if let Some((image, _)) = image.as_ref().filter(|_| loading) {
                    persist::load(image, &store, &mut (shared.load_progress)())?;
                }
                if args.standby {
                    store.set_standby(true);
                }
                (None, image.map(|(i, _)| i), None)
            }
            DiskKind::Fs => {
                let (fs, image, tree) = open_fs(&args, &store, size, image, shared.load_progress)?;
                if args.standby {
                    store.set_standby(true);
                }
                let fs = Arc::new(fs);
                start_cold_tier(&args, &fs, size, shared, &placement)?;
                (Some(fs), image, tree)
            }
        };
        let saving = match image {
            Some(image) => Some(start_saving(
                &args,
                &store,
                image,
                kind,
                size,
                &fs,
                loaded_tree,
            )?),
            None => None,
        };
        warn_if_overcommitted(&store, shared.host_reserve);
        let mut scanner: Vec<ScanHandle> =
            start_scanner(&store, &args, shared).into_iter().collect();
        if let Some(cold) = fs.as_ref().and_then(|f| f.cold_store()) {
            scanner.push(shared.scanners.add(cold.clone()));
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
            args: &args,
            kind,
            id,
            store: &store,
            fs: fs.as_ref(),
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
            fs,
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
                self.fs.as_ref().map_or(0, |f| f.config().nr_inodes),
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
        // With the kernel data path, file data is in its tmpfs, not the store.
        let hot = self.fs.as_ref().and_then(|f| f.hot_tier());
        let used = human(self.store.stats().used_bytes + hot.map_or(0, |h| h.used_bytes()));
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
        match &self.fs {
            Some(fs) => fs.size(),
            None => self.size,
        }
    }

    /// `mount -o remount,...` of a filesystem disk (the `remount OPTIONS`
    /// control request; the mount helper has already applied the VFS
    /// flags): a new size (growing always; shrinking when what is stored
    /// fits), max_memory, and the atime rule. Other settings may be given
    /// (an fstab line's) but must equal the running ones. Nothing changes
    /// unless everything can.
    pub fn remount(&self, options: &str) -> Result<serde_json::Value> {
        let (Some(fs), Some(dir)) = (&self.fs, &self.args.mount) else {
            bail!(
                "disk {:?} is not a filesystem disk: nothing to remount",
                self.args.name
            );
        };
        let source = self.args.mount_flags().source;
        let req = crate::mount_opts::parse(&source, dir, options)?;
        let new = &req.disk;
        if self.store.standby() && !new.read_only {
            bail!(
                "disk {:?} is a standby: its mount stays read-only (give `ro`) until `ramd \
                 promote {}` makes it the writer",
                self.args.name,
                self.args.name
            );
        }
        let mut size = fs.size();
        let mut max_memory = self.args.max_memory;
        for key in &req.given {
            match key.as_str() {
                "size" => {
                    size = match new.size {
                        Some(DiskSize::Bytes(n)) => Some(n),
                        _ => None,
                    }
                }
                "max_memory" => max_memory = new.max_memory,
                k => {
                    let (now, asked) = (self.args.setting(k), new.setting(k));
                    if now != asked {
                        bail!(
                            "option {k}: cannot change on a mounted disk (it is {}, asked for {}): \
                             umount it and mount it again",
                            now.unwrap_or_default(),
                            asked.unwrap_or_default()
                        );
                    }
                }
            }
        }
        let resize = req.given.iter().any(|k| k == "size" || k == "max_memory");
        let budget = match max_memory {
            Some(m) => m,
            // The default for the new size, plus whatever the disk was
            // given beyond the default for its old one (an image's slack).
            None => {
                let before = fs_max_memory(&self.args, fs.size(), false);
                let extra = self.store.max_memory().saturating_sub(before);
                fs_max_memory(&self.args, size, false).saturating_add(extra)
            }
        };
        if resize {
            self.store
                .set_limits(size.map(|n| n.div_ceil(PAGE_SIZE as u64)), budget)
                .with_context(|| match size {
                    Some(n) => format!("resizing to {}", human(n)),
                    None => "resizing to unlimited".to_string(),
                })?;
            fs.set_size(size)
                .context("resizing the file data's tmpfs")?;
            // The cold tier's store has the same budget of its own.
            if let Some(cold) = fs.cold_store() {
                cold.set_limits(None, budget)
                    .context("the cold tier's memory budget")?;
            }
            // The kernel's dirty cap and the write reserve follow the size.
            if let (true, Some(dev)) = (self.args.writeback_cache(), ramd_fs::mount_device(dir)) {
                fs.set_write_reserve(crate::frontends::bdi::limit_dirty(dev, size));
            }
            if let Some(s) = &self.saving {
                s.persister.set_size(size.unwrap_or(0));
            }
        }
        // Without an atime word the rule stays (`MountRequest::atime_given`).
        let atime = if req.atime_given {
            new.atime()
        } else {
            fs.atime()
        };
        fs.set_atime(atime);
        let budget = self.store.max_memory();
        log::info!(
            "disk {:?} remounted: size {}, max memory {}, atime {:?}",
            self.args.name,
            size.map_or("unlimited".into(), human),
            human(budget),
            atime
        );
        Ok(serde_json::json!({
            "remounted": self.args.name,
            "size": size.unwrap_or(0),
            "max_memory": budget,
        }))
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
        if let (Some(_), Some(dir), false) = (&self.fs, &self.args.mount, self.args.read_only) {
            ramd_fs::remount_read_write(dir).with_context(|| {
                format!(
                    "promoted: disk {:?} is the writer of its image, but its mount {} stays \
                     read-only; make it read-write with `mount -o remount,rw {}`",
                    self.args.name,
                    dir.display(),
                    dir.display()
                )
            })?;
        }
        log::info!("{}", self.describe());
        Ok(r)
    }

    /// The image directory saves go to now.
    fn image_path(&self) -> Option<String> {
        self.saving
            .as_ref()
            .and_then(|s| s.persister.status().image)
    }

    pub fn status(&self) -> DiskStatus {
        let mut store = self.store.stats();
        let (pages_per_node, pages_per_node_sample) = self.store.pages_per_node();
        let (memory_limit, by) = self.store.effective_limit();
        let frontends: Vec<_> = self.frontends.iter().map(|f| f.status()).collect();
        let connections = frontends
            .iter()
            .filter_map(|f| f.connections)
            .reduce(|a, b| a + b);
        let mut page_limit = None;
        if self.kind == DiskKind::Fs {
            // A filesystem's size is its capacity, not the store's address space.
            // With --data-path kernel, what its tmpfs holds.
            let (used, limit) = self
                .fs
                .as_ref()
                .map_or(self.store.pages_used(), |f| f.pages_used());
            store.size = self.current_size().unwrap_or(0);
            store.used_bytes = used * PAGE_SIZE as u64;
            page_limit = Some(limit);
            // With a cold tier, its codec is the disk's (this store holds
            // no file data).
            if let Some(cold) = self.fs.as_ref().and_then(|f| f.cold_store()) {
                store.compress = cold.stats().compress;
            }
        }
        DiskStatus {
            name: self.args.name.clone(),
            kind: self.kind.name().into(),
            id: self.id.to_string(),
            pid: std::process::id(),
            uri: frontends
                .first()
                .map_or(String::new(), |f| f.endpoint.clone()),
            connections,
            // A filesystem disk's may change with `mount -o remount,ro`.
            read_only: match (&self.fs, &self.args.mount) {
                (Some(_), Some(dir)) => {
                    ramd_fs::mount_read_only(dir).unwrap_or(self.args.read_only)
                }
                _ => self.args.read_only || self.store.standby(),
            },
            mount: self.args.mount.as_ref().and(
                frontends
                    .iter()
                    .find(|f| f.protocol == "fuse")
                    .map(|f| f.endpoint.clone()),
            ),
            data_path: self.fs.as_ref().map(|f| {
                if f.hot_tier().is_some() {
                    "kernel"
                } else {
                    "store"
                }
                .to_string()
            }),
            unlimited: self.kind == DiskKind::Fs && self.current_size().is_none(),
            page_limit,
            metrics: self.metrics_url.clone(),
            frontends,
            store,
            fs: self.fs.as_ref().map(|f| f.stats()),
            io: self.io.snapshot(),
            persist: self
                .saving
                .as_ref()
                .map_or_else(PersistStatus::none, |s| s.persister.status()),
            pages_per_node,
            pages_per_node_sample,
            memory_limit,
            memory_limit_by: by.into(),
            numa_policy: self.placement.as_ref().map(|p| p.policy.to_string()),
            numa_nodes: self
                .placement
                .as_ref()
                .map(|p| ramd_store::numa::list_text(&p.nodes)),
            process: ramd_store::ProcessMemory::now(),
            blocked: self.blocked(),
            stopping: self.leaving.load(Ordering::SeqCst) || self.stopped(),
        }
    }
}

/// The control socket's answers for one disk.
fn disk_handler(target: Arc<OnceLock<Weak<Disk>>>, events: Events) -> crate::control::Handler {
    let events = Mutex::new(events);
    Arc::new(move |req: Request| {
        let disk = target.get().and_then(Weak::upgrade);
        let Some(disk) = disk else {
            return req.answer(Err("the disk is starting or stopping".into()));
        };
        match req.line() {
            "status" => {
                let status = disk.status();
                req.answer(Ok(serde_json::json!({ "disks": [status] })))
            }
            line if line == "snapshot" || line.starts_with("snapshot ") => {
                // `snapshot [full] [to DIR]`
                let line = line.to_string();
                let rest = line["snapshot".len()..].trim_start();
                let (full, rest) = match rest.strip_prefix("full") {
                    Some(r) => (true, r.trim_start()),
                    None => (false, rest),
                };
                let to = rest.strip_prefix("to ").map(Path::new);
                if to.is_none() && !rest.is_empty() {
                    return req.answer(Err(format!("unknown control request {line:?}")));
                }
                let r = disk
                    .snapshot(full, to)
                    .map(|r| {
                        let mut v = serde_json::to_value(r).expect("report serializes");
                        v["path"] = disk.image_path().into();
                        v
                    })
                    .map(|v| serde_json::json!({ "snapshot": v }))
                    .map_err(|e| format!("{e:#}"));
                req.answer(r)
            }
            // `promote [force] [wait SECS]`
            line if line == "promote" || line.starts_with("promote ") => {
                let line = line.to_string();
                let words: Vec<&str> = line.split_whitespace().skip(1).collect();
                let (mut force, mut wait) = (false, Duration::ZERO);
                let mut it = words.iter();
                while let Some(w) = it.next() {
                    match (*w, it.clone().next()) {
                        ("force", _) => force = true,
                        ("wait", Some(v)) => match v.parse::<f64>() {
                            Ok(secs) if secs >= 0.0 && secs.is_finite() => {
                                wait = Duration::from_secs_f64(secs);
                                it.next();
                            }
                            _ => return req.answer(Err(format!("promote: bad wait {v:?}"))),
                        },
                        _ => return req.answer(Err(format!("unknown control request {line:?}"))),
                    }
                }
                let r = disk
                    .promote(force, wait)
                    .map(|r| {
                        let mut v = serde_json::to_value(r).expect("report serializes");
                        v["path"] = disk.image_path().into();
                        v["id"] = disk.id.to_string().into();
                        serde_json::json!({ "promoted": v })
                    })
                    .map_err(|e| format!("{e:#}"));
                req.answer(r)
            }
            // Answered once the disk is gone (the umount helper waits for
            // the save at stop this way); nothing is stopped.
            "wait" => {
                let disk = disk.args.name.clone();
                let _ = events.lock().send(Event::WaitDisk { disk, req });
            }
            line if line.starts_with("remount ") => {
                let r = disk
                    .remount(&line["remount ".len()..])
                    .map_err(|e| format!("{e:#}"));
                req.answer(r)
            }
            // Stopping is the daemon's business: it owns the disk.
            "stop" | "stop force" => {
                let force = req.line() == "stop force";
                // Unsent (the daemon is gone), the request answers itself.
                let disk = disk.args.name.clone();
                let _ = events.lock().send(Event::StopDisk { disk, req, force });
            }
            other => {
                let msg = format!("unknown control request {other:?}");
                req.answer(Err(msg))
            }
        }
    })
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

/// Settings that are wrong together, caught before anything is built.
fn check_args(args: &DiskArgs) -> Result<()> {
    if args.autosave.is_some_and(|d| d.is_zero()) {
        bail!("--autosave must be longer than 0s");
    }
    if args.image.is_none() && args.flush == FlushMode::Persist {
        bail!("--flush persist needs --image DIR: a flush has nowhere to persist to");
    }
    if args.standby {
        if args.standby_poll.is_zero() {
            bail!("--standby-poll must be longer than 0s");
        }
        match &args.image {
            Some(i) if persist::is_url(i) => {}
            Some(i) => bail!(
                "--standby --image {}: a standby follows an image in object storage \
                 (s3://BUCKET/PREFIX), whose lease it can take over at promotion; a directory \
                 has no lease (a second ramd on one directory is refused while the first \
                 holds it)",
                i.display()
            ),
            None => bail!("--standby needs --image s3://BUCKET/PREFIX: the image to follow"),
        }
        if args.mount.is_some() && args.data_path == DataPath::Kernel {
            bail!(
                "--standby with --data-path kernel: a standby serves file data from the store, \
                 where each applied save puts it (the kernel path keeps it in backing files the \
                 kernel reads directly); leave --data-path out or give store"
            );
        }
        if let Some(url) = &args.replicate {
            bail!(
                "--standby with --replicate {url}: a standby saves nothing until promoted, \
                 and its image is in object storage already"
            );
        }
        if args.read_only {
            bail!(
                "--standby with --read-only: a standby is read-only until promoted, and \
                 writable after; leave --read-only out"
            );
        }
    }
    if let (Some(url), Some(image)) = (&args.replicate, &args.image) {
        if !persist::is_url(Path::new(url)) {
            bail!(
                "--replicate {url}: not an object-storage URL: give s3://BUCKET/PREFIX (a \
                 second directory is no replica: it dies with the host)"
            );
        }
        if image.as_os_str() == url.as_str() {
            bail!("--replicate {url} is the disk's --image itself: give another prefix");
        }
        if persist::is_url(image) {
            bail!(
                "--replicate {url} needs --image DIR, a local directory: image {} is in object \
                 storage already",
                image.display()
            );
        }
    }
    Ok(())
}

/// The store's settings for this disk.
fn store_config(
    args: &DiskArgs,
    kind: DiskKind,
    size: Option<u64>,
    loading: bool,
    shared: &Shared,
    placement: &Option<Placement>,
) -> StoreConfig {
    let base = StoreConfig {
        warm_pool: args.warm_pool,
        host_reserve: shared.host_reserve,
        track_changes: args.image.is_some(),
        shared_budget: shared.budget.clone(),
        compress: args.compress,
        compress_after: args.compress_after.unwrap_or_default(),
        recompress: args.recompress,
        idle_after: args.idle_after,
        memory: ramd_store::MemoryPolicy {
            mlock: args.mlock,
            numa: placement.clone(),
            huge_pages: args.huge_pages,
        },
        ..StoreConfig::new(size.unwrap_or(ramd_store::MAX_SIZE))
    };
    match kind {
        DiskKind::Block => {
            let size = size.expect("a block disk has a size");
            StoreConfig {
                max_memory: args
                    .max_memory
                    .or(loading.then(|| ramd_store::default_max_memory(size, true))),
                ..base
            }
        }
        DiskKind::Fs => {
            let max_memory = args
                .max_memory
                .unwrap_or_else(|| fs_max_memory(args, size, loading));
            let base = match crate::frontends::fuse::data_path(args).0 {
                // File data is in the tmpfs, or compressed in the cold
                // tier's own store: this one holds none.
                DataPath::Kernel => StoreConfig {
                    compress: Codec::None,
                    compress_after: Duration::ZERO,
                    ..base
                },
                DataPath::Store | DataPath::Auto => base,
            };
            StoreConfig {
                max_memory: Some(max_memory),
                page_limit: size.map(|n| n.div_ceil(PAGE_SIZE as u64)),
                size: ramd_store::MAX_SIZE,
                ..base
            }
        }
    }
}

/// How long a closed file of `--data-path kernel --compress` stays
/// untouched before it moves to the cold tier, if --compress-after does
/// not say.
pub const COLD_AFTER: Duration = Duration::from_secs(60);

/// `--data-path kernel --compress`: the cold tier, a store of its own
/// (compressed as pages are written, never saved: a save reads cold files
/// from it as file data), under the disk's memory budget and the daemon's.
fn start_cold_tier(
    args: &DiskArgs,
    fs: &Arc<Fs>,
    size: Option<u64>,
    shared: &Shared,
    placement: &Option<Placement>,
) -> Result<()> {
    if crate::frontends::fuse::data_path(args).0 != DataPath::Kernel || args.compress.is_none() {
        return Ok(());
    }
    let cfg = StoreConfig {
        warm_pool: args.warm_pool,
        host_reserve: shared.host_reserve,
        shared_budget: shared.budget.clone(),
        compress: args.compress,
        max_memory: Some(
            args.max_memory
                .unwrap_or_else(|| fs_max_memory(args, size, false)),
        ),
        memory: ramd_store::MemoryPolicy {
            mlock: args.mlock,
            numa: placement.clone(),
            huge_pages: args.huge_pages,
        },
        ..StoreConfig::new(ramd_store::MAX_SIZE)
    };
    let after = args.compress_after.unwrap_or(COLD_AFTER);
    let store = Arc::new(Store::new(cfg)?);
    fs.set_cold_tier(store, after)
        .map_err(|e| anyhow::anyhow!("--data-path kernel: the cold tier: errno {}", e.get()))?;
    log::info!(
        "disk {:?}: closed files untouched {after:?} move to the cold tier, compressed with {}",
        args.name,
        args.compress
    );
    Ok(())
}

/// A filesystem disk's default budget: every page of `size`, plus room for
/// the page tables of many small files and for inodes and names (1/8 of
/// size, ≥ 64 MiB). ramfs mode: the host's memory, still guarded by the
/// host reserve. `loaded`: it may hold compressed pages from an image.
fn fs_max_memory(args: &DiskArgs, size: Option<u64>, loaded: bool) -> u64 {
    let compressed = args.compresses() || loaded;
    match size {
        Some(n) => {
            ramd_store::default_max_memory(n, compressed).saturating_add((n / 8).max(64 << 20))
        }
        None => mem_total(),
    }
}

/// The disk's NUMA placement, if --numa-nodes or --numa-policy asks for
/// one: checked against the host's nodes and probed with a real `mbind`,
/// so every mistake fails here, at start.
fn placement(args: &DiskArgs) -> Result<Option<Placement>> {
    if args.numa_nodes.is_none() && args.numa_policy.is_none() {
        return Ok(None);
    }
    let topo = ramd_store::numa::Topology::host()?;
    let p = Placement::new(
        args.numa_policy.unwrap_or_default(),
        args.numa_nodes.as_ref(),
        &topo,
    )?;
    p.probe()?;
    log::info!(
        "disk {:?}: page memory {} on NUMA node(s) {}, serving threads on CPU(s) {}",
        args.name,
        p.policy,
        ramd_store::numa::list_text(&p.nodes),
        match p.cpus.is_empty() {
            true => "anywhere (the nodes have none)".to_string(),
            false => ramd_store::numa::list_text(&p.cpus),
        }
    );
    Ok(Some(p))
}

fn mem_total() -> u64 {
    ramd_store::mem_total().unwrap_or(1 << 30)
}

/// The filesystem of an `fs` disk: loaded from its image, or new.
fn open_fs(
    args: &DiskArgs,
    store: &Arc<Store>,
    size: Option<u64>,
    image: Option<(ImageDir, u64)>,
    load_progress: LoadProgress,
) -> Result<(Fs, Option<ImageDir>, Option<Vec<u8>>)> {
    let cfg = FsConfig {
        size,
        nr_inodes: args.nr_inodes.unwrap_or(mem_total() / PAGE_SIZE as u64 / 2),
        mode: args.mode,
        uid: args.uid,
        gid: args.gid,
        atime: args.atime(),
    };
    // `--data-path kernel`: file data in a private kernel tmpfs, made
    // before a load, which writes into it.
    let tier = match crate::frontends::fuse::data_path(args).0 {
        DataPath::Kernel => Some(
            ramd_fs::hot::HotTier::new(&crate::frontends::fuse::hot_config(args, &cfg))
                .context("--data-path kernel: making the private tmpfs for file data")?,
        ),
        DataPath::Store | DataPath::Auto => None,
    };
    match (image, tier) {
        (Some((image, _)), Some(tier)) if image.manifest().is_some() => {
            let (fs, tree) = Fs::load_kernel(store.clone(), cfg, tier, &image)?;
            Ok((fs, Some(image), Some(tree)))
        }
        (Some((image, _)), None) if image.manifest().is_some() => {
            let tree =
                persist::load(&image, store, &mut load_progress())?.expect("fs images have a tree");
            let fs = Fs::load(store.clone(), cfg, &tree).map_err(|e| {
                anyhow::anyhow!("loading image {}: the tree: {e}", image.path().display())
            })?;
            Ok((fs, Some(image), Some(tree)))
        }
        (image, tier) => {
            let fs = Fs::new(store.clone(), cfg)
                .map_err(|e| anyhow::anyhow!("creating the filesystem: errno {}", e.get()))?;
            if let Some(tier) = tier {
                fs.set_hot_tier(tier).map_err(|e| {
                    anyhow::anyhow!("--data-path kernel: setting the tier up: errno {}", e.get())
                })?;
            }
            Ok((fs, image.map(|(i, _)| i), None))
        }
    }
}

/// Sets up saving: the persister, the store's flush hook with --flush
/// persist, and the save thread.
fn start_saving(
    args: &DiskArgs,
    store: &Arc<Store>,
    image: ImageDir,
    kind: DiskKind,
    size: Option<u64>,
    fs: &Option<Arc<Fs>>,
    loaded_tree: Option<Vec<u8>>,
) -> Result<Saving> {
    let persist = args.flush == FlushMode::Persist;
    // Before any save: a replica that is refused (another writer holds
    // it, it holds another disk) stops the start.
    let replica = match &args.replicate {
        Some(url) => Some(persist::Replica::start(Path::new(url), &image)?),
        None => None,
    };
    let mut p = Persister::new(
        store.clone(),
        image,
        kind,
        size.unwrap_or(0),
        args.autosave,
        persist,
    );
    if let Some(r) = replica {
        p.set_replica(r);
    }
    if args.standby {
        p.set_standby(args.standby_poll);
    }
    if let Some(fs) = fs {
        if let Some(outer) = fs.outer_pages() {
            p.set_outer(outer);
        }
        if args.standby {
            p.set_follow_tree(Box::new(ramd_fs::fs::StandbyTree(fs.clone())));
        }
        let fs = fs.clone();
        p.set_meta(Box::new(move || fs.save_meta()), loaded_tree.as_deref());
    }
    let p = Arc::new(p);
    if persist {
        // Weak: the store must not keep its own persister alive.
        let weak = Arc::downgrade(&p);
        store.set_flush_hook(Box::new(move || match weak.upgrade() {
            Some(p) => p.flush(),
            None => Ok(()),
        }));
    }
    let thread = p.start().context("starting the save thread")?;
    Ok(Saving {
        persister: p,
        thread: Mutex::new(thread),
    })
}

/// Background compression and compaction, if the disk compresses, and the
/// warm pool's decay, on the daemon's shared threads; they run until the
/// returned handle is dropped.
fn start_scanner(store: &Arc<Store>, args: &DiskArgs, shared: &Shared) -> Option<ScanHandle> {
    if args.compresses() && crate::frontends::fuse::data_path(args).0 == DataPath::Store {
        log::info!(
            "disk {:?}: compression {} ({}), pages idle {:?} {}, {} background thread(s)",
            args.name,
            args.compress,
            match args.compress_after.unwrap_or_default() {
                d if d.is_zero() => "as pages are written".to_string(),
                d => format!("once untouched {d:?}"),
            },
            args.idle_after,
            if args.recompress.is_none() {
                "are kept as they are".to_string()
            } else {
                format!("are re-packed with {}", args.recompress)
            },
            shared.compress_threads
        );
    }
    Some(shared.scanners.add(store.clone()))
}

/// A sparse disk may promise more than the host has (as tmpfs may); say so.
fn warn_if_overcommitted(store: &Store, reserve: u64) {
    if let Some(avail) = ramd_store::mem_available() {
        if store.max_memory() > avail {
            let total = ramd_store::mem_total().unwrap_or(0);
            log::warn!(
                "max memory {} exceeds the host's available memory {} (of {} RAM): the disk \
                 is thin, as tmpfs's size= is; writes will get ENOSPC once the host is down \
                 to its reserve of {}",
                human(store.max_memory()),
                human(avail),
                human(total),
                human(reserve)
            );
        }
    }
}

pub fn make_run_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("creating run directory {}", dir.display()))
}

#[cfg(test)]
mod tests {
    //! The lifecycle through the public interface a new frontend uses:
    //! one factory, one registration, no lifecycle code of its own.

    use super::*;
    use crate::frontend::{Frontend, FrontendFactory, FrontendStatus};
    use clap::{Args, FromArgMatches};
    use parking_lot::Condvar;

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
        fn claims(&self, _: &DiskArgs, _: &Path) -> Result<Vec<Claim>> {
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
