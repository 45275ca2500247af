//! A standby (`--standby`): a block disk that follows an image in object
//! storage another ramd writes, read-only, and can be promoted to be its
//! writer (`ramd promote NAME`).
//!
//! Following: the MANIFEST is read every poll; the saves it names that the
//! store does not hold yet are fetched whole into memory, checked (every
//! checksum, by the loader's own parser, before anything is applied) and
//! then applied with the store's gate held exclusively
//! (`Store::apply_exclusive`): a standby's reads hold the gate shared, so
//! each read sees a save all applied or not at all. New saves of the chain
//! the store holds are applied one by one; a new chain (a full save
//! replaced it) empties the disk and applies its full save in the same
//! hold, then its incremental saves one by one. `ImageDir::manifest` is
//! what the store holds: it changes only once a save is applied.
//!
//! A filesystem disk (`FollowTree`): the store holds its file data, and
//! each save's META is its whole tree, or a change to the tree of the save
//! before (variant 1), which the filesystem applies to the tree it
//! installed last. The new tree is decoded and checked
//! before anything is applied; in the same exclusive hold as the save's
//! pages, the filesystem swaps it in; after the hold, it tells the kernel
//! what changed (which may wait on requests that wait for the gate).
//!
//! Promotion: the lease is taken (waiting for the old writer's to run out,
//! or taken over with `force`); the MANIFEST is read again and whatever the
//! old writer committed meanwhile is applied; then the standby commits an
//! empty incremental save of its own, conditional on that MANIFEST. That
//! commit fences the old writer off: its next commit, conditional on the
//! MANIFEST it wrote last, is refused, even before its lease renewal finds
//! the lease gone (which `force` cannot wait for). A commit of the old
//! writer that lands first makes the standby's fail: it reads and applies
//! that save too and commits again.

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::store::Store;
use crate::sys::PAGE_SIZE;

use super::format::Record;
use super::image_dir::{object_name, ImageDir, Open};
use super::lease::{Lease, LeaseHolder};
use super::manifest::{Manifest, SegEntry};
use super::reader::parse_segment;
use super::remote::is_url;
use super::tree::TreeSave;

/// A standby's following, as `ramd status` shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StandbyStatus {
    /// How often the MANIFEST is read (`--standby-poll`).
    pub poll_secs: f64,
    /// Who holds the image's lease (its writer), at the last poll; `None`:
    /// nobody (released, or expired).
    pub lease_holder: Option<String>,
    /// When that lease runs out unless renewed (seconds since the epoch).
    pub lease_expires: Option<u64>,
    /// The newest save applied to the disk.
    pub applied_seq: u64,
    /// Its switch time (seconds since the epoch).
    pub applied_unix_time: u64,
    /// Saves the MANIFEST named at the last poll that are not applied yet.
    pub saves_behind: u64,
    /// Seconds since the newest applied save's switch: how far behind its
    /// writer the disk may be (the writer's changes since are not saved
    /// yet, or not polled yet).
    pub lag_secs: f64,
    /// Bytes of segments fetched since the start (whole segments; a
    /// segment that failed to apply is fetched again).
    pub bytes_downloaded: u64,
    /// Saves applied since the start (the loaded image not counted).
    pub saves_applied: u64,
    /// When the MANIFEST was last read (seconds since the epoch).
    pub last_poll_unix: Option<u64>,
    /// Why the last poll failed, until one succeeds.
    pub error: Option<String>,
}

/// A filesystem disk's tree, which a standby replaces with each save's
/// (see the module); implemented by the filesystem.
pub trait FollowTree: Send + Sync {
    /// Decodes and checks the tree of a save (its META: whole, or with
    /// `delta` a change to the tree installed last): what `install` takes.
    /// Called before any of the save is applied.
    fn prepare(&self, meta: &[u8], delta: bool) -> Result<Box<dyn std::any::Any + Send>>;
    /// Swaps in a prepared tree (`None`: the save had no META, the tree
    /// stays), with the store's gate held exclusively, after the save's
    /// pages. `chunks`: the store chunks whose data the save set (`None`:
    /// all of them, a new chain).
    fn install(
        &self,
        tree: Option<Box<dyn std::any::Any + Send>>,
        chunks: Option<&std::collections::HashSet<u64>>,
    ) -> Result<()>;
    /// After the hold: tells whoever caches the tree (the kernel) what the
    /// installs since the last call changed.
    fn announce(&self);
    /// The whole tree as it is now, for the META of a promotion's save
    /// (its `committed` runs once that save is committed).
    fn save(&self) -> TreeSave;
}

/// A standby's state between polls.
pub(super) struct Follow {
    pub(super) poll: Duration,
    pub(super) holder: Option<LeaseHolder>,
    /// Saves in the MANIFEST of the last poll not applied.
    pub(super) behind: u64,
    pub(super) bytes: u64,
    pub(super) applied: u64,
    pub(super) last_poll: Option<u64>,
    pub(super) error: Option<String>,
}

impl Follow {
    pub(super) fn new(poll: Duration) -> Follow {
        Follow {
            poll,
            holder: None,
            behind: 0,
            bytes: 0,
            applied: 0,
            last_poll: None,
            error: None,
        }
    }

    pub(super) fn status(&self, applied: Option<&SegEntry>) -> StandbyStatus {
        let now = now_ns();
        let time_ns = applied.map_or(0, |s| s.time_ns);
        StandbyStatus {
            poll_secs: self.poll.as_secs_f64(),
            lease_holder: self.holder.as_ref().map(|h| h.holder.clone()),
            lease_expires: self.holder.as_ref().map(|h| h.expires),
            applied_seq: applied.map_or(0, |s| s.seq),
            applied_unix_time: time_ns / 1_000_000_000,
            saves_behind: self.behind,
            lag_secs: now.saturating_sub(time_ns) as f64 / 1e9,
            bytes_downloaded: self.bytes,
            saves_applied: self.applied,
            last_poll_unix: self.last_poll,
            error: self.error.clone(),
        }
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

impl ImageDir {
    /// Opens an image in object storage to follow it (`--standby`): no
    /// lease is taken, nothing is removed, and it must hold a save.
    pub fn open_standby(url: &Path) -> Result<ImageDir> {
        if !is_url(url) {
            return Err(Error::Unusable(format!(
                "--standby --image {}: a standby follows an image in object storage \
                 (s3://BUCKET/PREFIX), whose lease it can take over; a directory has none",
                url.display()
            )));
        }
        ImageDir::open_remote(url, Open::Read).map_err(|e| match e {
            Error::File { ref err, .. } if err.kind() == io::ErrorKind::NotFound => {
                Error::Unusable(format!(
                    "--standby --image {}: the image holds no save yet (no MANIFEST): a \
                     standby follows an image its writer has saved at least once",
                    url.display()
                ))
            }
            e => e,
        })
    }

    /// Polls: reads the MANIFEST and the lease, then applies to `store`
    /// every save it names that the store does not hold (see the module).
    /// `follow` counts what was fetched and applied as it goes.
    pub(super) fn follow(
        &mut self,
        store: &Store,
        follow: &parking_lot::Mutex<Follow>,
        tree: Option<&dyn FollowTree>,
    ) -> Result<()> {
        let remote = self.remote.as_mut().expect("a standby's image is remote");
        let holder = Lease::holder(remote)?;
        let new = remote.read_manifest()?.ok_or_else(|| {
            Error::Unusable(format!(
                "image {}: its MANIFEST is gone: the image was removed",
                self.path.display()
            ))
        })?;
        {
            let mut f = follow.lock();
            f.holder = holder;
            f.last_poll = Some(now_ns() / 1_000_000_000);
        }
        let r = self.catch_up(store, &new, follow, tree);
        // What was applied is announced even if a later save failed.
        if let Some(t) = tree {
            t.announce();
        }
        r
    }

    /// Applies to `store`, which holds `self.manifest`, the saves of `new`
    /// it lacks, each all at once.
    fn catch_up(
        &mut self,
        store: &Store,
        new: &Manifest,
        follow: &parking_lot::Mutex<Follow>,
        tree: Option<&dyn FollowTree>,
    ) -> Result<()> {
        let old = self.manifest.clone().expect("a standby holds a save");
        let url = self.path.display().to_string();
        if new.kind != old.kind || new.size != old.size {
            return Err(Error::Unusable(format!(
                "image {url} now holds a {} disk of {} bytes; this standby serves a {} disk of \
                 {} bytes: stop it and start it again",
                new.kind.name(),
                new.size,
                old.kind.name(),
                old.size
            )));
        }
        if new.id != old.id {
            return Err(Error::Unusable(format!(
                "image {url} now holds another disk (id {}), not this standby's ({}): stop it \
                 and start it again",
                new.id.map_or("none".into(), |i| i.to_string()),
                old.id.map_or("none".into(), |i| i.to_string()),
            )));
        }
        let n = old.chain.len();
        let same_chain = new.chain.len() >= n && new.chain[..n] == old.chain[..];
        let (mut held, from) = match same_chain {
            true => (old.chain.clone(), n),
            false => (Vec::new(), 0),
        };
        follow.lock().behind = (new.chain.len() - from) as u64;
        for seg in &new.chain[from..] {
            let t0 = std::time::Instant::now();
            let (path, data) = self.fetch(seg)?;
            let fetched = t0.elapsed().as_secs_f64();
            follow.lock().bytes += data.len() as u64;
            let len = data.len() as u64;
            // Every checksum first, and the tree decoded and checked: a
            // damaged segment changes nothing.
            let mut meta = None;
            parse_segment(
                &path,
                &data[..],
                len,
                new,
                seg,
                &mut |r| {
                    match r {
                        Record::Meta(m) => meta = Some((m.to_vec(), false)),
                        Record::MetaDelta(m) => meta = Some((m.to_vec(), true)),
                        _ => {}
                    }
                    Ok(())
                },
                &mut |_| {},
            )?;
            let prepared = match (tree, meta) {
                (Some(t), Some((m, delta))) => Some(t.prepare(&m, delta).map_err(|e| {
                    Error::context(format!("save {} of image {url}: its tree", seg.seq), e, "")
                })?),
                _ => None,
            };
            let t1 = std::time::Instant::now();
            let mut chunks = std::collections::HashSet::new();
            store
                .apply_exclusive(seg.full, || {
                    parse_segment(
                        &path,
                        &data[..],
                        len,
                        new,
                        seg,
                        &mut |r| {
                            match &r {
                                Record::Page(page, _) => {
                                    chunks.insert(page * PAGE_SIZE as u64 / crate::CHUNK_BYTES)
                                }
                                Record::Frame { key, .. } | Record::Gone(key) => {
                                    chunks.insert(*key)
                                }
                                Record::Meta(_) | Record::MetaDelta(_) => false,
                            };
                            apply(store, r)
                        },
                        &mut |_| {},
                    )?;
                    match tree {
                        Some(t) => t.install(prepared, (!seg.full).then_some(&chunks)),
                        None => Ok(()),
                    }
                })
                .map_err(|e| {
                    Error::context(
                        format!(
                            "applying save {} of image {url} (the disk holds part of it until \
                             it is applied whole)",
                            seg.seq
                        ),
                        e,
                        "",
                    )
                })?;
            held.push(seg.clone());
            self.last_seq = self.last_seq.max(seg.seq);
            self.manifest = Some(Manifest {
                chain: held.clone(),
                ..new.clone()
            });
            let mut f = follow.lock();
            f.applied += 1;
            f.behind -= 1;
            log::info!(
                "standby: applied {} save {} of image {url} ({} pages, {}): fetched in {fetched:.2} \
                 s, applied in {:.3} s (reads waited that long)",
                if seg.full { "full" } else { "incremental" },
                seg.seq,
                seg.pages,
                crate::units::human(seg.bytes),
                t1.elapsed().as_secs_f64()
            );
        }
        Ok(())
    }

    /// Segment `seg`, whole, and its name for messages.
    fn fetch(&self, seg: &SegEntry) -> Result<(PathBuf, Vec<u8>)> {
        let remote = self.remote.as_ref().expect("a standby's image is remote");
        let name = object_name(seg.seq, seg.time_ns);
        let path = remote.named(&name);
        let (mut r, len) = remote.reader(&name, seg.bytes)?;
        let mut data = Vec::with_capacity(len as usize);
        r.read_to_end(&mut data)
            .map_err(|e| Error::file(&path, e))?;
        Ok((path, data))
    }

    /// A promotion's first step: takes the image's lease (`force`: even
    /// from a live holder); `Ok(Err(holder))` while another holds it.
    pub(super) fn take_lease(
        &mut self,
        force: bool,
    ) -> Result<std::result::Result<(), LeaseHolder>> {
        let remote = self.remote.as_ref().expect("a standby's image is remote");
        Ok(Lease::try_take(remote, force)?.map(|l| self.lease = Some(l)))
    }

    /// Gives up a lease a promotion took and failed with: a standby again.
    pub(super) fn drop_lease(&mut self) {
        if let Some(mut l) = self.lease.take() {
            l.release();
        }
    }

    /// A promotion's second step, with the lease held: applies what the
    /// old writer committed since the last poll, then commits an empty
    /// incremental save that fences it off (see the module). Returns that
    /// save.
    pub(super) fn fence(
        &mut self,
        store: &Store,
        follow: &parking_lot::Mutex<Follow>,
        tree: Option<&dyn FollowTree>,
    ) -> Result<SegEntry> {
        let mut tries = 0;
        loop {
            self.follow(store, follow, tree)?;
            let m = self.manifest.clone().expect("a standby holds a save");
            let mut w = self.begin_segment(self.next_seq(), false, m.kind, m.size)?;
            // Every save of an fs disk holds its tree (FORMAT.md): the
            // one just applied, unchanged.
            let saved = tree.map(|t| t.save());
            if let Some(t) = &saved {
                if let Err(e) = w.meta(&t.bytes, t.delta).and_then(|()| w.write_out()) {
                    w.discard();
                    return Err(e);
                }
            }
            let entry = w.finish()?;
            match self.commit(m.kind, m.size, entry.clone()) {
                Ok(()) => {
                    // Later saves' trees are changes to this one.
                    if let Some(t) = saved {
                        (t.committed)();
                    }
                    return Ok(entry);
                }
                // The old writer committed first: that save too, then again.
                Err(e) if tries < 3 => {
                    tries += 1;
                    log::warn!("promoting: {e}; applying what was committed and trying again");
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// One record of a save, applied as a load applies it (a filesystem's
/// tree, `Meta`, is the `FollowTree`'s).
fn apply(store: &Store, rec: Record<'_>) -> Result<()> {
    match rec {
        Record::Page(page, p) => store.restore_page(page, p),
        Record::Frame { key, mask, data } => store.restore_frame(key, mask, data),
        Record::Gone(key) => store.restore_gone(key),
        Record::Meta(_) | Record::MetaDelta(_) => Ok(()),
    }
}
