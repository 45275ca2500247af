//! The image directory: its MANIFEST read and committed by rename, the
//! directory's lock, debris removal, and the `RAMD_TEST_CRASH` hook. An image in
//! object storage is the same `ImageDir` with a `Remote` (`remote.rs`):
//! each step that touches files asks it instead.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::identity::DiskId;

use super::format::{DiskKind, LEASE, MANIFEST};
use super::lease::{Lease, LeaseWatch};
use super::manifest::{Manifest, SegEntry};
use super::remote::{is_url, Remote, UPLOAD_SUFFIX};

/// Where a save stops itself with SIGKILL (`RAMD_TEST_CRASH`, tests only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Crash {
    Pages(u64),
    SegmentSynced,
    SegmentRenamed,
    ManifestWritten,
    ManifestRenamed,
}

pub(super) fn crash_point() -> Option<Crash> {
    let v = std::env::var("RAMD_TEST_CRASH").ok()?;
    Some(match v.as_str() {
        "segment-synced" => Crash::SegmentSynced,
        "segment-renamed" => Crash::SegmentRenamed,
        "manifest-written" => Crash::ManifestWritten,
        "manifest-renamed" => Crash::ManifestRenamed,
        _ => Crash::Pages(v.strip_prefix("pages:")?.parse().ok()?),
    })
}

pub(super) fn crash_if(at: Crash) {
    if crash_point() == Some(at) {
        log::warn!("RAMD_TEST_CRASH={at:?}: killing myself");
        // SAFETY: plain syscalls.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// What an image in object storage is opened for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Open {
    Read,
    Save,
    Prune,
    /// The replica of a local image (`--replicate`): taken like a writer's,
    /// but its MANIFEST is left as it is until the first shipped save.
    Replica,
}

/// An image directory, or its like in object storage.
pub struct ImageDir {
    /// The directory, or the `s3://bucket/prefix` URL (segment and MANIFEST
    /// names are joined to it for messages).
    pub(super) path: PathBuf,
    /// Set for an image in object storage: where saves go instead of files.
    pub(super) remote: Option<Remote>,
    /// An image in object storage opened for saving: its lease, held until
    /// released (`release_lease`, a clean stop) or dropped.
    pub(super) lease: Option<Lease>,
    /// An image directory opened for saving: the directory itself, open
    /// and flock()ed, so that no other ramd saves to it or removes its
    /// debris (a save in progress) meanwhile. Released with the lease.
    pub(super) lock: Option<File>,
    pub(super) manifest: Option<Manifest>,
    /// The disk's identity: the MANIFEST's, or made at open for an image
    /// that has none yet; every commit writes it.
    pub(super) id: DiskId,
    /// Highest sequence number a segment was begun with: never reused, even
    /// when a commit failed after its MANIFEST was already renamed.
    pub(super) last_seq: u64,
    /// How long the chains full saves replace are kept (`--keep-saves`,
    /// `history.rs`); `None`: not kept.
    pub(super) keep: Option<Duration>,
}

impl ImageDir {
    /// Opens the image at `path`, creating the directory (0700) if
    /// missing; removes debris of interrupted saves. A MANIFEST that is
    /// present must be valid; without one, the directory must hold nothing
    /// but such debris (a new image), never someone's files.
    pub fn open(path: &Path) -> Result<ImageDir> {
        if is_url(path) {
            return ImageDir::open_remote(path, Open::Save);
        }
        if !path.exists() {
            fs::DirBuilder::new()
                .mode(0o700)
                .recursive(true)
                .create(path)
                .map_err(|e| Error::file(path, e))?;
        }
        let lock = lock_dir(path)?;
        let manifest = read_manifest(path)?;
        if manifest.is_none() {
            refuse_foreign(path)?;
        }
        let last_seq = manifest
            .as_ref()
            .and_then(|m| m.chain.last())
            .map_or(0, |s| s.seq);
        let mut dir = ImageDir {
            path: path.to_path_buf(),
            remote: None,
            lease: None,
            lock: Some(lock),
            id: manifest
                .as_ref()
                .and_then(|m| m.id)
                .unwrap_or_else(DiskId::random),
            manifest,
            last_seq,
            keep: None,
        };
        dir.remove_debris();
        dir.stamp_id();
        Ok(dir)
    }

    /// Opens an existing image for reading only (`ramd image ...`).
    pub fn open_existing(path: &Path) -> Result<ImageDir> {
        if is_url(path) {
            return ImageDir::open_remote(path, Open::Read);
        }
        match read_manifest(path)? {
            Some(m) => Ok(ImageDir {
                path: path.to_path_buf(),
                remote: None,
                lease: None,
                lock: None,
                id: m.id.unwrap_or_else(DiskId::random),
                last_seq: m.chain.last().map_or(0, |s| s.seq),
                manifest: Some(m),
                keep: None,
            }),
            None => Err(Error::file(
                path.join(MANIFEST),
                io::Error::new(io::ErrorKind::NotFound, "no image here (no MANIFEST)"),
            )),
        }
    }

    /// `ramd image prune`: removes the debris of an existing image (save
    /// files or segment objects its MANIFEST does not name), holding the
    /// directory's lock or the prefix's lease meanwhile, so never while a
    /// ramd saves to it; changes nothing else (not even a version 1
    /// MANIFEST's missing id). Kept chains (`MANIFEST-N`) stay, unless
    /// `keep` is given: then those older than it go. Returns what it
    /// removed.
    pub fn prune(path: &Path, keep: Option<Duration>) -> Result<Vec<(String, u64)>> {
        let mut image = if is_url(path) {
            ImageDir::open_remote(path, Open::Prune)?
        } else {
            let lock = lock_dir(path)?;
            let mut image = ImageDir::open_existing(path)?;
            image.lock = Some(lock);
            image
        };
        image.keep = keep;
        let removed = image.remove_debris();
        image.release_lease();
        Ok(removed)
    }

    /// An image in object storage: `open` (for saving: a prefix without
    /// a MANIFEST must hold nothing but save debris, which goes),
    /// `open_existing` (reading: there must be a MANIFEST) or `prune`.
    pub(super) fn open_remote(url: &Path, how: Open) -> Result<ImageDir> {
        let for_saving = matches!(how, Open::Save | Open::Replica);
        let mut remote = Remote::connect(url)?;
        // Listing first: a missing bucket is told apart from a new image.
        let names = remote.list()?;
        if for_saving && !names.iter().any(|(n, _)| n == MANIFEST) {
            let foreign: Vec<String> = names
                .into_iter()
                .map(|(n, _)| n)
                .filter(|n| !save_object(n) && n != LEASE)
                .collect();
            refuse_foreign_names(remote.url(), foreign)?;
        }
        // The lease before anything is read or removed: debris may be the
        // segment another writer is uploading.
        let lease = match how {
            Open::Save | Open::Prune | Open::Replica => Some(Lease::take(&remote)?),
            Open::Read => None,
        };
        let manifest = remote.read_manifest()?;
        if manifest.is_none() && !for_saving {
            return Err(Error::file(
                remote.named(MANIFEST),
                io::Error::new(io::ErrorKind::NotFound, "no image here (no MANIFEST)"),
            ));
        }
        let mut dir = ImageDir {
            lease,
            lock: None,
            path: PathBuf::from(remote.url()),
            id: manifest
                .as_ref()
                .and_then(|m| m.id)
                .unwrap_or_else(DiskId::random),
            last_seq: manifest
                .as_ref()
                .and_then(|m| m.chain.last())
                .map_or(0, |s| s.seq),
            manifest,
            remote: Some(remote),
            keep: None,
        };
        if how == Open::Save {
            dir.remove_debris();
            dir.stamp_id();
        }
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the image is in object storage.
    pub fn is_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// Gives up the lease of an image in object storage (a clean stop:
    /// no more saves); nothing for a directory.
    pub fn release_lease(&mut self) {
        if let Some(l) = &mut self.lease {
            l.release();
        }
        self.lock = None;
    }

    /// The lease's state for status (an image in object storage opened for
    /// saving).
    pub fn lease_watch(&self) -> Option<LeaseWatch> {
        self.lease.as_ref().map(Lease::watch)
    }

    /// Refuses a save's upload or commit unless this process holds the
    /// lease (an image in object storage opened for saving).
    pub(super) fn check_lease(&self) -> Result<()> {
        match (&self.remote, &self.lease) {
            (Some(r), None) => Err(Error::Unusable(format!(
                "image {} was opened for reading only",
                r.url()
            ))),
            (_, Some(l)) => l.check(),
            (None, None) => Ok(()),
        }
    }

    pub fn manifest(&self) -> Option<&Manifest> {
        self.manifest.as_ref()
    }

    /// The disk's identity: the MANIFEST's, or (an image without one yet,
    /// or a new image) the one the next commit writes.
    pub fn id(&self) -> DiskId {
        self.id
    }

    /// Makes the next commit write `id`: a copy of a disk into a new image
    /// (`snapshot --to`, salvage) is the same disk.
    pub fn set_id(&mut self, id: DiskId) {
        self.id = id;
    }

    /// Gives a version 1 image (no id) opened for saving its id now, by
    /// writing its MANIFEST again with the same chain: the disk then
    /// presents one identity from this start on, even if it never saves.
    /// A failure leaves the image as it was (the next commit writes the
    /// id): a disk whose image cannot be written still serves.
    fn stamp_id(&mut self) {
        let Some(m) = self.manifest.as_ref().filter(|m| m.id.is_none()) else {
            return;
        };
        let m = Manifest {
            id: Some(self.id),
            ..m.clone()
        };
        match self.put_manifest(&m, false) {
            Ok(()) => {
                log::info!(
                    "image {}: gave the disk its identity {} (MANIFEST version 2)",
                    self.path.display(),
                    self.id
                );
                self.manifest = Some(m);
            }
            Err(e) => log::warn!(
                "image {}: could not write the disk's identity {} into its MANIFEST yet \
                 (the next save will): {e}",
                self.path.display(),
                self.id
            ),
        }
    }

    /// The sequence number for the next save.
    pub fn next_seq(&self) -> u64 {
        self.last_seq + 1
    }

    pub fn seg_path(&self, seq: u64) -> PathBuf {
        self.path.join(seg_name(seq))
    }

    /// Save files not named by the MANIFEST: `.tmp` files and segments of
    /// chains that a later full save replaced (nothing else: a file of
    /// another name is not ours to remove). Returns what it removed, with
    /// sizes; a failure to remove one is logged and the rest go on (the
    /// next save tries again).
    pub(super) fn remove_debris(&self) -> Vec<(String, u64)> {
        let mut removed = Vec::new();
        // The kept chains' segments stay; with any kept MANIFEST unreadable,
        // no segment is known to be debris.
        let kept = match self.kept_segments(&mut removed) {
            Ok(k) => k,
            Err(e) => {
                log::warn!("not removing debris: {e}");
                return removed;
            }
        };
        if let Some(remote) = &self.remote {
            let keep: Vec<String> = self
                .manifest
                .iter()
                .flat_map(|m| &m.chain)
                .map(|s| object_name(s.seq, s.time_ns))
                .chain(kept)
                .collect();
            let Ok(names) = remote.list() else {
                return removed;
            };
            for (name, size) in names {
                if name.ends_with(UPLOAD_SUFFIX) && save_object(&name) {
                    // Only with the lease held: no live writer's upload.
                    if self.lease.is_none() {
                        continue;
                    }
                    match remote.abort_recorded(&name) {
                        Ok(()) => removed.push((name, size)),
                        Err(err) => log::warn!("aborting an incomplete upload: {err}"),
                    }
                } else if save_object(&name) && !keep.contains(&name) {
                    match remote.delete(&name) {
                        Ok(()) => removed.push((name, size)),
                        Err(err) => log::warn!("removing debris: {err}"),
                    }
                }
            }
            return removed;
        }
        let keep: Vec<PathBuf> = self
            .manifest
            .iter()
            .flat_map(|m| &m.chain)
            .map(|s| self.seg_path(s.seq))
            .chain(kept.iter().map(|n| self.path.join(n)))
            .collect();
        let Ok(entries) = fs::read_dir(&self.path) else {
            return removed;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if save_file(&name) && !keep.contains(&e.path()) {
                let size = e.metadata().map_or(0, |m| m.len());
                match fs::remove_file(e.path()) {
                    Ok(()) => removed.push((name, size)),
                    Err(err) => log::warn!("removing {}: {err}", e.path().display()),
                }
            }
        }
        removed
    }

    /// Makes a finished segment part of the image: the new MANIFEST is
    /// written, fsynced and renamed over the old one; a full save then
    /// removes the chain it replaces.
    pub fn commit(&mut self, kind: DiskKind, size: u64, seg: SegEntry) -> Result<()> {
        let mut m = match &self.manifest {
            Some(m) if !seg.full => m.clone(),
            _ => Manifest {
                kind,
                size,
                id: None,
                chain: Vec::new(),
            },
        };
        m.kind = kind;
        m.size = size;
        m.id = Some(self.id);
        let replaced = match &self.manifest {
            Some(old) if seg.full && self.keep.is_some() => Some(old.clone()),
            _ => None,
        };
        m.chain.push(seg);
        if let Some(old) = replaced {
            self.keep_chain(&old)?;
        }
        self.put_manifest(&m, true)?;
        self.manifest = Some(m);
        self.remove_debris();
        Ok(())
    }

    /// Makes `m`, another image's MANIFEST whose segments are all here
    /// already, this image's (a replica's commit: the same bytes as the
    /// local image's MANIFEST), then removes what it no longer names.
    pub(super) fn replace_manifest(&mut self, m: Manifest) -> Result<()> {
        self.put_manifest(&m, false)?;
        if let Some(id) = m.id {
            self.id = id;
        }
        self.last_seq = self.last_seq.max(m.chain.last().map_or(0, |s| s.seq));
        self.manifest = Some(m);
        self.remove_debris();
        Ok(())
    }

    /// Reads an object-storage image's MANIFEST again, and its version for
    /// the next commit: after a commit whose answer was lost (a timeout),
    /// the put may have happened all the same.
    pub(super) fn reread_manifest(&mut self) -> Result<()> {
        if let Some(remote) = &mut self.remote {
            self.manifest = remote.read_manifest()?;
        }
        Ok(())
    }

    /// Replaces the MANIFEST with `m`: a conditional put in object storage
    /// (while the lease is held), else written, fsynced and renamed over
    /// the old one. `crash`: the `RAMD_TEST_CRASH` points of a save apply.
    pub(super) fn put_manifest(&mut self, m: &Manifest, crash: bool) -> Result<()> {
        let crash_if = |at| {
            if crash {
                crash_if(at)
            }
        };
        if let Some(remote) = &mut self.remote {
            if let Some(l) = &self.lease {
                l.check()?;
            }
            crash_if(Crash::ManifestWritten);
            let lease = &self.lease;
            let still_ours = || lease.as_ref().map_or(Ok(()), Lease::check);
            remote.commit_manifest(m.encode(), &still_ours)?;
            crash_if(Crash::ManifestRenamed);
            return Ok(());
        }
        write_replacing(
            &self.path,
            MANIFEST,
            m.encode().as_bytes(),
            || crash_if(Crash::ManifestWritten),
            || crash_if(Crash::ManifestRenamed),
        )
    }
}

/// Writes `name` in `dir` whole: to `MANIFEST.tmp` (debris if a crash
/// leaves it), fsynced, renamed over `name`, the directory fsynced.
/// `written` and `renamed` run after those two steps (a MANIFEST commit's
/// crash points).
pub(super) fn write_replacing(
    dir: &Path,
    name: &str,
    data: &[u8],
    written: impl Fn(),
    renamed: impl Fn(),
) -> Result<()> {
    let tmp = dir.join("MANIFEST.tmp");
    let path = dir.join(name);
    let write = || -> io::Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        f.write_all(data)?;
        f.sync_all()
    };
    write().map_err(|e| Error::file(&tmp, e))?;
    written();
    fs::rename(&tmp, &path).map_err(|e| Error::file(&path, e))?;
    renamed();
    sync_dir(dir)
}

/// The name of save `seq`'s segment file.
pub(super) fn seg_name(seq: u64) -> String {
    format!("seg-{seq:08}")
}

/// The name of a segment object in object storage: its sequence number
/// and its switch time (both in the MANIFEST), so that two writers never
/// upload to one name: a writer that lost its lease, or raced another
/// despite it, cannot replace a segment a MANIFEST names.
pub(super) fn object_name(seq: u64, time_ns: u64) -> String {
    format!("seg-{seq:08}-{time_ns:016x}")
}

/// Whether `name` is a file a save writes before its MANIFEST exists:
/// `seg-NNNNNNNN` (renamed, uncommitted), its `.tmp`, `MANIFEST.tmp`.
pub(super) fn save_file(name: &str) -> bool {
    let seg = name.strip_suffix(".tmp").unwrap_or(name);
    name == "MANIFEST.tmp" || seg.strip_prefix("seg-").is_some_and(seq_digits)
}

pub(super) fn seq_digits(n: &str) -> bool {
    n.len() >= 8 && n.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `name` is a segment object's (`object_name`) or the record of
/// its upload (`upload_marker`): in object storage the only objects a save
/// writes before a MANIFEST names them.
pub(super) fn save_object(name: &str) -> bool {
    let name = name.strip_suffix(UPLOAD_SUFFIX).unwrap_or(name);
    name.strip_prefix("seg-")
        .and_then(|n| n.split_once('-'))
        .is_some_and(|(seq, time)| {
            seq_digits(seq) && time.len() == 16 && time.bytes().all(|b| b.is_ascii_hexdigit())
        })
}

/// Takes the image directory's lock (flock on the directory itself, held
/// while the returned file is open): one ramd saves to a directory, as
/// one holds an object-storage image's lease. Refused while another
/// process holds it, naming that process where /proc/locks tells; on a
/// filesystem that cannot lock, the file comes back unlocked.
fn lock_dir(dir: &Path) -> Result<File> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::MetadataExt;
    let f = File::open(dir).map_err(|e| Error::file(dir, e))?;
    // SAFETY: flock on our own descriptor.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(f);
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
        // A filesystem without flock (some network and FUSE ones): the
        // image works as before locks, unguarded.
        log::warn!(
            "image directory {}: cannot lock it ({err}): nothing keeps a second ramd from \
             saving to it",
            dir.display()
        );
        return Ok(f);
    }
    let holder = f
        .metadata()
        .ok()
        .and_then(|m| lock_holder(m.dev(), m.ino()))
        .map_or_else(String::new, |pid| {
            let cmd = fs::read(format!("/proc/{pid}/cmdline"))
                .map(|c| {
                    let args: Vec<String> = c
                        .split(|&b| b == 0)
                        .filter(|a| !a.is_empty())
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                        .collect();
                    args.join(" ")
                })
                .unwrap_or_default();
            match cmd.as_str() {
                "" => format!(" (pid {pid})"),
                c => format!(" (pid {pid}: {c})"),
            }
        });
    Err(Error::Unusable(format!(
        "image directory {} is in use by another process{holder}: only one ramd may save \
         to an image (or prune it) at a time; stop the other one, or give another directory",
        dir.display()
    )))
}

/// The pid /proc/locks names for a flock on inode `ino` of device `dev`.
fn lock_holder(dev: u64, ino: u64) -> Option<u32> {
    let text = fs::read_to_string("/proc/locks").ok()?;
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    // "1: FLOCK  ADVISORY  WRITE 12345 08:01:1234567 0 EOF"
    text.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.get(1) == Some(&"FLOCK") && w.get(5) == Some(&want.as_str()) {
            w.get(4)?.parse().ok()
        } else {
            None
        }
    })
}

/// Refuses a directory with no MANIFEST that holds anything but an
/// interrupted first save's files: saves would be written among someone
/// else's files, and their debris removal could delete one of them.
/// `lost+found` is a fresh filesystem's own (an image on a dedicated
/// mount) and is left alone.
fn refuse_foreign(dir: &Path) -> Result<()> {
    let mut foreign: Vec<String> = Vec::new();
    for e in fs::read_dir(dir).map_err(|e| Error::file(dir, e))? {
        let e = e.map_err(|e| Error::file(dir, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        if save_file(&name) || (is_dir && name == "lost+found") {
            continue;
        }
        foreign.push(if is_dir { format!("{name}/") } else { name });
    }
    refuse_foreign_names(&dir.display().to_string(), foreign)
}

/// Refuses an image without a MANIFEST that holds `foreign` names.
fn refuse_foreign_names(dir: &str, mut foreign: Vec<String>) -> Result<()> {
    if foreign.is_empty() {
        return Ok(());
    }
    foreign.sort();
    let shown = foreign.len().min(3);
    let more = match foreign.len() - shown {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    Err(Error::Unusable(format!(
        "image directory {dir} is not empty and holds no ramd image (no MANIFEST): it has {}{more}; \
         ramd would write its saves among these: give a new or empty directory for the image, \
         or move what is in this one elsewhere",
        foreign[..shown].join(", "),
    )))
}

pub(super) fn read_manifest(dir: &Path) -> Result<Option<Manifest>> {
    let path = dir.join(MANIFEST);
    match fs::read(&path) {
        Ok(text) => Manifest::decode(&path, &text).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::file(path, e)),
    }
}

pub(super) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::file(dir, e))
}
