//! A disk's persistence: loading its image at start, saving it (on demand,
//! every --autosave, at a clean stop, and for flushes with --flush persist),
//! and what `ramd status` says of it.
//!
//! One save runs at a time (`image` lock). Flushes share saves: a flush
//! waits for the first save that *starts* after it was asked for (its data
//! is then in the switch), and many flushes ride on one save.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::store::SaveSession;
use crate::store::Store;
use crate::units::human;

use super::format::DiskKind;
use super::image_dir::ImageDir;
use super::lease::LeaseWatch;
use super::manifest::SegEntry;
use super::outer::OuterPages;
use super::replica::Replica;
use super::standby::{Follow, FollowTree};
use super::status::{report_of, FlushMode, PersistStatus, SaveReport};
use super::tree::MetaFn;

/// An incremental chain is replaced by a full save once it has this many
/// saves, or once its incremental saves add up to the full save's size:
/// loading then reads at most about twice the disk's data.
const MAX_CHAIN: usize = 16;

#[derive(Default)]
pub(super) struct State {
    /// Saves started and finished (tickets), and the last that succeeded.
    pub(super) started: u64,
    pub(super) finished: u64,
    pub(super) last_ok_ticket: u64,
    /// Highest ticket a flush waits for.
    pub(super) wanted: u64,
    pub(super) saves: u64,
    /// Saves that failed, for monitoring (`last_error` keeps only the latest).
    pub(super) failures: u64,
    pub(super) last: Option<SaveReport>,
    pub(super) last_error: Option<String>,
    /// A save failed after its switch: what it skipped is no longer marked
    /// changed, so only a full save is complete again.
    pub(super) need_full: bool,
    /// The save thread is to end (saves on demand still run).
    pub(super) stop: bool,
    /// No save will come any more: flushes fail at once.
    pub(super) closed: bool,
}

pub struct Persister {
    pub(super) store: Arc<Store>,
    pub(super) kind: DiskKind,
    /// Changes when a mounted filesystem disk is resized ([`Persister::set_size`]).
    pub(super) size: AtomicU64,
    pub(super) meta: Option<MetaFn>,
    /// Pages kept outside the store (`--data-path kernel`), saved beside
    /// its own.
    pub(super) outer: Option<Box<dyn OuterPages>>,
    /// The image directory (also inside `image`, which a save holds);
    /// `save_to` changes it.
    pub(super) path: Mutex<PathBuf>,
    /// The image's lease (object storage), read by status without waiting
    /// for a save to let go of `image`; `save_to` changes it.
    pub(super) lease: Mutex<Option<LeaseWatch>>,
    pub(super) image: Mutex<ImageDir>,
    pub(super) state: Mutex<State>,
    pub(super) changed: Condvar,
    pub(super) autosave: Option<Duration>,
    pub(super) flush_persist: bool,
    /// `--replicate`: told of each save committed to the local image.
    pub(super) replica: Option<Replica>,
    /// `--standby`: how it follows its image; `following` until promoted.
    pub(super) follow: Option<Mutex<Follow>>,
    pub(super) following: std::sync::atomic::AtomicBool,
    /// A filesystem standby's tree, replaced with each save's.
    pub(super) tree: Option<Box<dyn FollowTree>>,
}

impl Persister {
    pub fn new(
        store: Arc<Store>,
        image: ImageDir,
        kind: DiskKind,
        size: u64,
        autosave: Option<Duration>,
        flush_persist: bool,
    ) -> Persister {
        // Status shows the image's last save until this process saves.
        let last = image.manifest().and_then(|m| m.chain.last());
        let state = State {
            last: last.map(report_of),
            ..State::default()
        };
        Persister {
            store,
            kind,
            size: AtomicU64::new(size),
            meta: None,
            outer: None,
            path: Mutex::new(image.path().to_path_buf()),
            lease: Mutex::new(image.lease_watch()),
            image: Mutex::new(image),
            state: Mutex::new(state),
            changed: Condvar::new(),
            autosave,
            flush_persist,
            replica: None,
            follow: None,
            following: std::sync::atomic::AtomicBool::new(false),
            tree: None,
        }
    }

    /// Ships each committed save to `replica` too, starting with the
    /// image's current one.
    pub fn set_replica(&mut self, replica: Replica) {
        self.replica = Some(replica);
    }

    /// A clean stop's last step with `--replicate`: waits up to `wait` for
    /// the last save to reach the replica; says what it holds (`Err`: it
    /// lacks saves). `None` without a replica.
    pub fn finish_replica(&self, wait: Duration) -> Option<std::result::Result<String, String>> {
        self.replica.as_ref().map(|r| r.finish(wait))
    }

    /// `f` serializes the tree (and knows what tree the image holds).
    pub fn set_meta(&mut self, f: MetaFn) {
        self.meta = Some(f);
    }

    /// Saves `outer`'s pages too, from the next save on.
    pub fn set_outer(&mut self, outer: Box<dyn OuterPages>) {
        self.outer = Some(outer);
    }

    /// The disk's new size (an fs disk resized while mounted): the next
    /// save is a full one, since every save of a chain has one size.
    pub fn set_size(&self, size: u64) {
        self.size.store(size, Ordering::Relaxed);
    }

    /// Saves now: only what changed since the last save unless `full` (or
    /// the chain is long, or no complete save exists).
    pub fn save(&self, full: bool) -> Result<SaveReport> {
        let mut image = self.image.lock();
        if self.is_standby() {
            return Err(standby_refusal());
        }
        self.save_locked_reporting(&mut image, full, "")
    }

    /// One save with `image` held: counted, logged and shown by status.
    /// A compaction (a full save only because the chain grew long) is two:
    /// the changes first, as an incremental save, then the full save.
    /// The changes so reach the image, and a standby (which would
    /// otherwise fetch the whole disk to see them), at an incremental
    /// save's speed; the full save holds nothing new that its failure
    /// could lose. An unchanged disk is not compacted: a stop's second
    /// save, after the one made while serving, must not rewrite it all.
    fn save_locked_reporting(
        &self,
        image: &mut ImageDir,
        full: bool,
        why: &'static str,
    ) -> Result<SaveReport> {
        let (full, reason, compacting) = match image.manifest() {
            _ if full && !why.is_empty() => (true, why, false),
            _ if full => (true, "asked for", false),
            None => (true, "first save", false),
            Some(_) if self.state.lock().need_full => (true, "the last save failed", false),
            Some(m) if m.size != self.size.load(Ordering::Relaxed) => (true, "size changed", false),
            Some(m) if m.chain.len() >= MAX_CHAIN => (true, "chain is long", true),
            Some(m) if m.bytes() >= 2 * m.chain[0].bytes => (true, "chain is large", true),
            Some(_) => (false, "changes", false),
        };
        if compacting {
            let changes = self.counted_save(image, false, "changes")?;
            if changes.pages == 0 && changes.bytes == 0 {
                return Ok(changes);
            }
        }
        self.counted_save(image, full, reason)
    }

    /// One save, counted (a ticket for flushes), logged, shown by status
    /// and handed to the replica.
    fn counted_save(
        &self,
        image: &mut ImageDir,
        full: bool,
        reason: &'static str,
    ) -> Result<SaveReport> {
        let ticket = {
            let mut st = self.state.lock();
            st.started += 1;
            st.started
        };
        let result = self.save_locked(image, full);
        let mut st = self.state.lock();
        st.finished = ticket;
        match &result {
            Ok(r) => {
                st.last_ok_ticket = ticket;
                st.saves += 1;
                st.last = Some(r.clone());
                st.last_error = None;
                st.need_full = false;
                if !r.full && r.pages == 0 && r.bytes == 0 {
                    log::info!("nothing changed since save {}: nothing to write", r.seq);
                } else {
                    log::info!(
                        "saved {} save {} ({}): {} pages, {} written in {:.2} s",
                        if r.full { "full" } else { "incremental" },
                        r.seq,
                        reason,
                        r.pages,
                        human(r.bytes),
                        r.seconds
                    );
                }
            }
            Err(e) => {
                st.last_error = Some(e.to_string());
                st.failures += 1;
                st.need_full = true;
                log::error!(
                    "save to {} failed ({}): {e}",
                    image.path().display(),
                    kept_text(image)
                );
            }
        }
        self.changed.notify_all();
        drop(st);
        // The hook after a commit: the replica ships it in the background.
        if let (Ok(_), Some(rep), Some(m)) = (&result, &self.replica, image.manifest()) {
            if !image.is_remote() {
                rep.committed(image.path(), m);
            }
        }
        result
    }

    fn save_locked(&self, image: &mut ImageDir, full: bool) -> Result<SaveReport> {
        let t0 = Instant::now();
        let seq = image.next_seq();
        let (session, (meta, mut outer)) = self.store.begin_save(full, || {
            (
                self.meta.as_ref().map(|f| f(full)),
                self.outer.as_ref().map(|o| o.switch(full)),
            )
        });
        let meta = meta.map(|m| m());
        let plan = session.plan();
        let tree_same = meta.as_ref().is_none_or(|m| !m.changed);
        let outer_gone = outer.as_ref().map_or(&[][..], |o| o.gone());
        let outer_changed = outer.as_ref().is_some_and(|o| o.changed());
        let unchanged = !full
            && plan.pages == 0
            && plan.gone.is_empty()
            && outer_gone.is_empty()
            && !outer_changed
            && tree_same;
        let last = image.manifest().and_then(|m| m.chain.last()).cloned();
        let nothing = |session: SaveSession<'_>, last: &SegEntry| {
            // Nothing to write: an empty save would only lengthen the chain.
            // Dropped unfinished (an abort), not finished: no page was
            // marked for it, so nothing is forgotten.
            drop(session);
            SaveReport {
                seq: last.seq,
                full: false,
                pages: 0,
                bytes: 0,
                seconds: t0.elapsed().as_secs_f64(),
                unix_time: now_secs(),
            }
        };
        if let (true, Some(last)) = (unchanged, &last) {
            return Ok(nothing(session, last));
        }
        // An error returned from here on drops the session: the save aborts.
        let size = self.size.load(Ordering::Relaxed);
        let mut w = image.begin_segment(seq, full, self.kind, size)?;
        for &key in plan.gone.iter().chain(outer_gone) {
            w.gone(key);
        }
        let gone = plan.gone.len() + outer_gone.len();
        let mut failed = meta.as_ref().and_then(|m| w.meta(&m.bytes, m.delta).err());
        if failed.is_none() {
            failed = w.write_out().err();
        }
        for &(key, mask) in &plan.chunks {
            if failed.is_some() {
                break;
            }
            session.save_chunk(key, mask, |page, p| w.page(page, p));
            failed = w.write_out().err();
            if failed.is_none() && session.broken() {
                failed = Some(Error::Invalid(
                    "clients changed more during the save than memory allows keeping for it \
                     (max_memory, or the host's reserve); the next save is a full one"
                        .into(),
                ));
            }
        }
        // The outside pages come after the store's: a disk keeps a page in
        // one or the other, and a kernel-path fs keeps none in the store.
        let mut outer_pages = 0;
        if let (None, Some(o)) = (&failed, outer.as_mut()) {
            match o.write(&mut |page, p| {
                w.page(page, p);
                w.write_out()
            }) {
                Ok(n) => outer_pages = n,
                Err(e) => failed = Some(e),
            }
        }
        if let Some(e) = failed {
            drop(session);
            w.discard();
            return Err(e);
        }
        if let (false, 0, 0, true, Some(last)) =
            (full, plan.pages + outer_pages, gone, tree_same, &last)
        {
            // Files open for writing were read again and found unchanged:
            // the image already holds what was read.
            w.discard();
            if let Some(o) = outer {
                o.committed();
            }
            return Ok(nothing(session, last));
        }
        session.finish();
        let entry = w.finish()?;
        let report = SaveReport {
            seq,
            full,
            pages: entry.pages,
            bytes: entry.bytes,
            seconds: 0.0,
            unix_time: entry.time_ns / 1_000_000_000,
        };
        image.commit(self.kind, size, entry)?;
        if let Some(m) = meta {
            (m.committed)();
        }
        if let Some(o) = outer {
            o.committed();
        }
        Ok(SaveReport {
            seconds: t0.elapsed().as_secs_f64(),
            ..report
        })
    }

    /// `ramd snapshot NAME --to DIR`: a full save into `dir` (new or
    /// empty), which then becomes the disk's image: the way out when the
    /// image's own filesystem is full or gone. The old image is left as it
    /// was.
    pub fn save_to(&self, dir: &Path) -> Result<SaveReport> {
        // A replica ships a local image's segment files: an image in object
        // storage would leave it behind, silently (and --replicate with
        // --image URL is refused at the start for the same reason).
        if let (Some(rep), true) = (&self.replica, super::is_url(dir)) {
            return Err(Error::Unusable(format!(
                "the disk's image {} is replicated to {} (--replicate), which needs a local \
                 image directory: `snapshot --to {}` would leave the replica behind; give \
                 `--to DIR` (the replica follows the new directory), or stop the disk and \
                 serve --image {} without --replicate",
                self.path.lock().display(),
                rep.status().url,
                dir.display(),
                dir.display()
            )));
        }
        let empty = match std::fs::read_dir(dir) {
            Ok(mut entries) => entries.next().is_none(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
            Err(e) => return Err(Error::file(dir, e)),
        };
        // A URL is no directory to list (read_dir finds nothing): an
        // image there would be replaced by this full save.
        let empty = empty && !(super::is_url(dir) && ImageDir::open_existing(dir).is_ok());
        if !empty {
            return Err(Error::Unusable(format!(
                "{} is not empty: `snapshot --to` writes a new image into a new or empty \
                 directory",
                dir.display()
            )));
        }
        if self.is_standby() {
            return Err(standby_refusal());
        }
        let mut new = ImageDir::open(dir)?;
        let mut image = self.image.lock();
        if self.is_standby() {
            return Err(standby_refusal());
        }
        if new.path() == image.path() {
            return Err(Error::Unusable(format!(
                "{} is already this disk's image",
                dir.display()
            )));
        }
        // The same disk in a new place: the same identity, and saves kept
        // as long.
        new.set_id(image.id());
        new.set_keep_saves(image.keep);
        *self.path.lock() = dir.to_path_buf();
        *self.lease.lock() = new.lease_watch();
        std::mem::swap(&mut *image, &mut new);
        // `new` now holds the old image; a full save goes to the new one.
        let r = self.save_locked_reporting(&mut image, true, "to a new image");
        if r.is_err() {
            std::mem::swap(&mut *image, &mut new);
            *self.path.lock() = image.path().to_path_buf();
            *self.lease.lock() = image.lease_watch();
        } else {
            log::warn!(
                "the disk's image is now {} (was {})",
                dir.display(),
                new.path().display()
            );
        }
        r
    }

    /// `--flush persist`: returns once a save that began after this call
    /// is durable.
    pub fn flush(&self) -> Result<()> {
        if self.is_standby() {
            // Clients cannot change a standby: nothing to persist.
            return Ok(());
        }
        let mut st = self.state.lock();
        let target = st.started + 1;
        st.wanted = st.wanted.max(target);
        self.changed.notify_all();
        while st.finished < target && !st.closed {
            self.changed.wait(&mut st);
        }
        if st.last_ok_ticket >= target {
            Ok(())
        } else {
            let why = st
                .last_error
                .clone()
                .unwrap_or_else(|| "ramd is stopping".into());
            Err(Error::file(&*self.path.lock(), std::io::Error::other(why)))
        }
    }

    /// Starts the thread that saves every --autosave and for flushes.
    pub fn start(self: &Arc<Self>) -> Result<Option<JoinHandle<()>>> {
        if self.autosave.is_none() && !self.flush_persist && self.follow.is_none() {
            return Ok(None);
        }
        let me = self.clone();
        let t = std::thread::Builder::new()
            .name("ramd-save".into())
            .spawn(move || me.run())
            .map_err(|err| Error::Os {
                what: "starting the save thread",
                err,
            })?;
        Ok(Some(t))
    }

    fn run(&self) {
        // A panicking save thread must not leave flushes waiting forever.
        struct CloseOnPanic<'a>(&'a Persister);
        impl Drop for CloseOnPanic<'_> {
            fn drop(&mut self) {
                if std::thread::panicking() {
                    self.0.close();
                }
            }
        }
        let _guard = CloseOnPanic(self);
        // A standby follows its image until promoted, then saves.
        if self.follow_loop() {
            return;
        }
        let mut next = self.autosave.map(|d| Instant::now() + d);
        loop {
            {
                let mut st = self.state.lock();
                loop {
                    if st.stop {
                        return;
                    }
                    if st.wanted > st.finished || next.is_some_and(|t| Instant::now() >= t) {
                        break;
                    }
                    match next {
                        Some(t) => {
                            self.changed.wait_until(&mut st, t);
                        }
                        None => self.changed.wait(&mut st),
                    }
                }
            }
            // Errors are logged and shown by status; the disk keeps serving.
            let started = Instant::now();
            let _ = self.save(false);
            // The interval runs from this save's start (its switch), not its
            // end: how old the image's newest data gets (and how far a
            // standby runs behind) is the interval, not the interval plus
            // the save's own time. A save longer than the interval is
            // followed by the next at once.
            next = self.autosave.map(|d| started + d);
        }
    }

    /// Stops the save thread; flushes still waiting are answered by the
    /// next save (the one at stop).
    pub fn stop(&self, thread: Option<JoinHandle<()>>) {
        self.state.lock().stop = true;
        self.changed.notify_all();
        if let Some(t) = thread {
            let _ = t.join();
        }
    }

    /// No more saves: flushes waiting or to come fail; an image in object
    /// storage has its lease released.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.changed.notify_all();
        self.image.lock().release_lease();
    }

    /// The status fields of this disk's persistence.
    pub fn status(&self) -> PersistStatus {
        let st = self.state.lock();
        PersistStatus {
            image: Some(self.path.lock().display().to_string()),
            flush: if self.flush_persist {
                FlushMode::Persist
            } else {
                FlushMode::Ignore
            },
            autosave_secs: self.autosave.map(|d| d.as_secs_f64()),
            saves: st.saves,
            save_failures: st.failures,
            last_save: st.last.clone(),
            // A lost lease is said before any save tries and fails.
            last_save_error: st.last_error.clone().or_else(|| {
                let lease = self.lease.lock();
                lease.as_ref().and_then(LeaseWatch::trouble)
            }),
            replica: self.replica.as_ref().map(Replica::status),
            standby: match (&self.follow, self.is_standby()) {
                (Some(f), true) => {
                    let last = st.last.as_ref().map(|r| SegEntry {
                        seq: r.seq,
                        full: r.full,
                        pages: r.pages,
                        records: 0,
                        bytes: r.bytes,
                        time_ns: r.unix_time * 1_000_000_000,
                    });
                    Some(f.lock().status(last.as_ref()))
                }
                _ => None,
            },
        }
    }
}

/// Why a standby does not save.
fn standby_refusal() -> Error {
    Error::Unusable(
        "the disk is a standby: its image's writer saves it; promote it first (`ramd promote NAME`)"
            .into(),
    )
}

/// What the image still holds when a save fails: never claim a save that
/// does not exist.
fn kept_text(image: &ImageDir) -> String {
    match image.manifest().and_then(|m| m.chain.last()) {
        Some(last) => format!(
            "the image keeps its save {} of {}",
            last.seq,
            crate::persist::time_text(last.time_ns)
        ),
        None => "the image holds no complete save: nothing of this disk is saved yet".into(),
    }
}

pub(super) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
