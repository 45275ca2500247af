//! Past chains kept for point-in-time restores (`--keep-saves`,
//! FORMAT.md *Kept saves*), and `ImageDir::restore_from`: a new image
//! holding any kept save.
//!
//! A full save replaces the chain; with a retention set, the MANIFEST it
//! replaces is first kept as `MANIFEST-N` (N: that chain's full save), and
//! debris removal spares every segment a kept MANIFEST names. Kept chains
//! whose newest save is older than the retention go, MANIFEST-N first (a
//! crash after leaves only debris).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};

use super::format::{new_buf, Buf, MANIFEST};
use super::image_dir::{object_name, seg_name, seq_digits, sync_dir, ImageDir};
use super::manifest::{Manifest, SegEntry};
use super::reader::parse_segment;

/// What a kept MANIFEST's name starts with.
const KEPT_PREFIX: &str = "MANIFEST-";

/// The name a chain whose full save is `full_seq` is kept under.
pub(super) fn kept_name(full_seq: u64) -> String {
    format!("{KEPT_PREFIX}{full_seq:08}")
}

/// Whether `name` is a kept MANIFEST's.
pub(super) fn kept_file(name: &str) -> bool {
    name.strip_prefix(KEPT_PREFIX).is_some_and(seq_digits)
}

/// A save an image can be restored to (`ramd image ls`, `restore`).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Restorable {
    #[serde(flatten)]
    pub save: SegEntry,
    /// The MANIFEST that names it: `MANIFEST` (the image's chain) or a
    /// kept `MANIFEST-N`.
    pub manifest: String,
}

impl ImageDir {
    /// Keeps the chains full saves replace for `keep` (`None` or zero:
    /// none, and none expire: kept ones stay until pruned).
    pub fn set_keep_saves(&mut self, keep: Option<Duration>) {
        self.keep = keep.filter(|k| !k.is_zero());
    }

    /// Object or file `name` of the image, or `None` if there is none.
    fn read_named(&self, name: &str) -> Result<Option<Vec<u8>>> {
        if let Some(remote) = &self.remote {
            return Ok(remote.get(name)?.map(|(b, _)| b.to_vec()));
        }
        let path = self.path.join(name);
        match fs::read(&path) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::file(path, e)),
        }
    }

    /// The names of the image's files or objects (not directories).
    fn names(&self) -> Result<Vec<String>> {
        if let Some(remote) = &self.remote {
            return Ok(remote.list()?.into_iter().map(|(n, _)| n).collect());
        }
        let mut names = Vec::new();
        for e in fs::read_dir(&self.path).map_err(|e| Error::file(&self.path, e))? {
            let e = e.map_err(|e| Error::file(&self.path, e))?;
            names.push(e.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    /// The kept MANIFESTs, by name, oldest first; each is checked as a
    /// MANIFEST is.
    pub fn kept(&self) -> Result<Vec<(String, Manifest)>> {
        let mut names: Vec<String> = self.names()?.into_iter().filter(|n| kept_file(n)).collect();
        names.sort();
        let mut kept = Vec::new();
        for name in names {
            // Gone since the listing: expired by the image's writer.
            let Some(text) = self.read_named(&name)? else {
                continue;
            };
            let m = Manifest::decode(&self.path.join(&name), &text)?;
            kept.push((name, m));
        }
        Ok(kept)
    }

    /// Keeps `old`, the MANIFEST a full save is about to replace, as
    /// `MANIFEST-N`: written whole before the commit (a file by rename, an
    /// object by one put), so that no moment has its segments named by
    /// nothing.
    pub(super) fn keep_chain(&mut self, old: &Manifest) -> Result<()> {
        let Some(first) = old.chain.first() else {
            return Ok(());
        };
        let name = kept_name(first.seq);
        let text = old.encode();
        if let Some(remote) = &self.remote {
            self.check_lease()?;
            return remote.put_plain(&name, text);
        }
        super::image_dir::write_replacing(&self.path, &name, text.as_bytes(), || {}, || {})
    }

    /// Which segments the kept chains name (object or file names), after
    /// removing the kept MANIFESTs whose newest save is older than the
    /// retention (with one set). Removed MANIFESTs are added to `removed`.
    pub(super) fn kept_segments(&self, removed: &mut Vec<(String, u64)>) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for (name, m) in self.kept()? {
            if expired(self.keep, &m) {
                let size = m.encode().len() as u64;
                match &self.remote {
                    Some(r) => r.delete(&name)?,
                    None => {
                        let path = self.path.join(&name);
                        fs::remove_file(&path).map_err(|e| Error::file(&path, e))?;
                    }
                }
                removed.push((name, size));
                continue;
            }
            names.extend(m.chain.iter().map(|s| self.segment_name(s)));
        }
        Ok(names)
    }

    /// A segment's file or object name.
    pub(super) fn segment_name(&self, s: &SegEntry) -> String {
        match self.remote {
            Some(_) => object_name(s.seq, s.time_ns),
            None => seg_name(s.seq),
        }
    }

    /// Every save the image can be restored to, by sequence number: the
    /// chain's and the kept chains'.
    pub fn restorable(&self) -> Result<Vec<Restorable>> {
        let mut all: Vec<Restorable> = Vec::new();
        let mut add = |m: &Manifest, manifest: &str| {
            for s in &m.chain {
                if !all.iter().any(|r| r.save.seq == s.seq) {
                    all.push(Restorable {
                        save: s.clone(),
                        manifest: manifest.to_string(),
                    });
                }
            }
        };
        if let Some(m) = &self.manifest {
            add(m, MANIFEST);
        }
        for (name, m) in self.kept()? {
            add(&m, &name);
        }
        all.sort_by_key(|r| r.save.seq);
        Ok(all)
    }

    /// The image as of kept save `seq`: the chain that holds it, up to it.
    pub fn as_of(&self, seq: u64) -> Result<Manifest> {
        let mut chains: Vec<Manifest> = self.manifest.iter().cloned().collect();
        chains.extend(self.kept()?.into_iter().map(|(_, m)| m));
        for mut m in chains {
            if let Some(i) = m.chain.iter().position(|s| s.seq == seq) {
                m.chain.truncate(i + 1);
                return Ok(m);
            }
        }
        Err(Error::Invalid(format!(
            "image {}: no kept save {seq}",
            self.path.display()
        )))
    }

    /// Makes this image (new, opened for saving) `m`, a chain of `src`:
    /// each segment is copied byte for byte, every record checked on the
    /// way as a load checks it, then the MANIFEST is committed with this
    /// image's id.
    pub fn restore_from(&mut self, src: &ImageDir, mut m: Manifest) -> Result<()> {
        self.check_lease()?;
        for s in &m.chain {
            self.copy_segment(src, &m, s)?;
        }
        m.id = Some(self.id);
        self.last_seq = self.last_seq.max(m.chain.last().map_or(0, |s| s.seq));
        self.put_manifest(&m, false)?;
        self.manifest = Some(m);
        Ok(())
    }

    /// Copies segment `s` of `src`'s chain `m` here, checking it.
    fn copy_segment(&self, src: &ImageDir, m: &Manifest, s: &SegEntry) -> Result<()> {
        let name = self.segment_name(s);
        let mut sink = match &self.remote {
            Some(remote) => {
                let (tx, rx) = std::sync::mpsc::sync_channel::<Buf>(2);
                let (back, empties) = std::sync::mpsc::channel();
                let abort = Arc::new(AtomicBool::new(false));
                let upload = remote
                    .upload(&name, rx, back, abort.clone())
                    .map_err(|e| Error::file(remote.named(&name), e))?;
                Sink::Upload {
                    tx: Some(tx),
                    empties,
                    upload: Some(upload),
                    abort,
                }
            }
            None => {
                let tmp = self.path.join(format!("{name}.tmp"));
                let f = OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)
                    .map_err(|e| Error::file(&tmp, e))?;
                Sink::File(f, tmp)
            }
        };
        let read = (|| -> Result<()> {
            let src_name = src.segment_name(s);
            let what = src.path.join(&src_name);
            let tee = |r: &mut dyn Read, len: u64, sink: &mut Sink| {
                let mut tee = Tee { r, sink };
                parse_segment(&what, &mut tee, len, m, s, &mut |_| Ok(()), &mut |_| {})
            };
            match &src.remote {
                Some(remote) => {
                    let (mut r, len) = remote.reader(&src_name, s.bytes)?;
                    tee(&mut r, len, &mut sink)
                }
                None => {
                    let mut f = File::open(&what).map_err(|e| Error::file(&what, e))?;
                    let len = f.metadata().map_err(|e| Error::file(&what, e))?.len();
                    tee(&mut f, len, &mut sink)
                }
            }
        })();
        let dest = self.path.join(&name);
        sink.finish(read.is_ok())
            .map_err(|e| Error::file(&dest, e))
            .and(read)?;
        if let Sink::File(_, tmp) = &sink {
            fs::rename(tmp, &dest).map_err(|e| Error::file(&dest, e))?;
            sync_dir(&self.path)?;
        }
        Ok(())
    }
}

/// Whether kept chain `m` is past the retention `keep`: its newest save
/// is older (`None`: none expire).
pub(super) fn expired(keep: Option<Duration>, m: &Manifest) -> bool {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let newest = m.chain.last().map_or(0, |s| s.time_ns);
    keep.is_some_and(|k| newest.saturating_add(k.as_nanos() as u64) < now)
}

/// The chains image directory `dir` keeps (`MANIFEST-N`), oldest first,
/// each checked as a MANIFEST is: what its replica is to keep too.
pub(super) fn kept_in_dir(dir: &Path) -> Result<Vec<(String, Manifest)>> {
    let mut names = Vec::new();
    for e in fs::read_dir(dir).map_err(|e| Error::file(dir, e))? {
        let e = e.map_err(|e| Error::file(dir, e))?;
        let name = e.file_name().to_string_lossy().into_owned();
        if kept_file(&name) {
            names.push(name);
        }
    }
    names.sort();
    let mut kept = Vec::new();
    for name in names {
        let path = dir.join(&name);
        let text = match fs::read(&path) {
            Ok(t) => t,
            // Expired since the listing.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(Error::file(path, e)),
        };
        kept.push((name, Manifest::decode(&path, &text)?));
    }
    Ok(kept)
}

/// Where a copied segment's bytes go: a `.tmp` file (renamed once whole
/// and synced) or an object's upload.
enum Sink {
    File(File, PathBuf),
    Upload {
        tx: Option<std::sync::mpsc::SyncSender<Buf>>,
        empties: std::sync::mpsc::Receiver<Buf>,
        upload: Option<std::thread::JoinHandle<io::Result<Option<File>>>>,
        abort: Arc<AtomicBool>,
    },
}

impl Sink {
    fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            Sink::File(f, _) => f.write_all(data),
            Sink::Upload { tx, empties, .. } => {
                let mut b = empties.try_recv().unwrap_or_else(|_| new_buf());
                b.extend_from_slice(data);
                match tx.as_ref().map(|tx| tx.send(b)) {
                    Some(Ok(())) => Ok(()),
                    // The upload failed: its error comes from `finish`.
                    _ => Err(io::Error::other("the upload stopped")),
                }
            }
        }
    }

    /// Syncs the file, or completes the upload; with `ok` false, removes
    /// the file or aborts the upload instead.
    fn finish(&mut self, ok: bool) -> io::Result<()> {
        match self {
            Sink::File(f, tmp) => {
                if !ok {
                    let _ = fs::remove_file(tmp);
                    return Ok(());
                }
                f.sync_all()
            }
            Sink::Upload {
                tx, upload, abort, ..
            } => {
                if !ok {
                    abort.store(true, std::sync::atomic::Ordering::SeqCst);
                }
                drop(tx.take());
                match upload.take().map(|u| u.join()) {
                    Some(Ok(r)) if ok => r.map(|_| ()),
                    Some(Err(_)) => Err(io::Error::other("the upload thread panicked")),
                    _ => Ok(()),
                }
            }
        }
    }
}

/// A reader that hands what it reads to a sink.
struct Tee<'a> {
    r: &'a mut dyn Read,
    sink: &'a mut Sink,
}

impl Read for Tee<'_> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let n = self.r.read(out)?;
        self.sink.write(&out[..n])?;
        Ok(n)
    }
}
