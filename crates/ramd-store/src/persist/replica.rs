//! `--image DIR --replicate s3://bucket/prefix`: saves go to the local
//! directory as ever, and each committed save is then shipped, on a
//! thread of its own, to object storage, where it is an image like any
//! other (`--image s3://...` loads it).
//!
//! Shipping a save is a remote image's own save, with segments that exist
//! already: each segment of the local chain that the remote MANIFEST does
//! not name is uploaded under its object name (`Remote::upload`, the
//! multipart path with its upload record), then the local MANIFEST's
//! bytes are put conditionally (the commit point, under the prefix's
//! lease), then the remote debris goes. Saves never wait for it: the
//! thread ships the newest committed chain when it gets to it, skipping
//! saves that came and went meanwhile.
//!
//! Chains the local image keeps (`--keep-saves`, `MANIFEST-N`) are kept
//! in the replica too: before each commit, every kept MANIFEST of the
//! local image that the prefix lacks (and that has not expired) goes up
//! after the segments it names, so that `ramd image restore URL --at`
//! reaches the same saves; the replica expires them by the same
//! retention.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::{Condvar, Mutex};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::identity::DiskId;

use super::format::{new_buf, Buf};
use super::history::{expired, kept_in_dir};
use super::image_dir::{object_name, seg_name, ImageDir, Open};
use super::manifest::{Manifest, SegEntry};
use super::remote::Remote;
use super::time_text;

/// How long the first retry of a failed shipment waits; it doubles up to
/// `RETRY_MAX`.
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(16);
/// Bytes read from a local segment at a time for its upload.
const CHUNK: usize = 1 << 20;

/// The replica as `ramd status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplicaStatus {
    /// `s3://bucket/prefix` (never credentials: those come from the
    /// environment).
    pub url: String,
    /// The newest save the replica holds: its sequence number and the time
    /// of its switch (seconds since the epoch).
    pub replicated_seq: Option<u64>,
    pub replicated_save_time: Option<u64>,
    /// When this process last committed a save to the replica.
    pub replicated_at: Option<u64>,
    /// Saves committed locally that the replica does not hold yet.
    pub saves_behind: u64,
    /// Bytes this process uploaded (segments and MANIFESTs).
    pub bytes_uploaded: u64,
    /// Why the last shipment failed, until one succeeds.
    pub last_error: Option<String>,
}

#[derive(Default)]
struct State {
    /// The newest committed local save: its directory and MANIFEST.
    wanted: Option<(PathBuf, Manifest)>,
    /// Sequence numbers of local commits the replica may not hold yet.
    behind: VecDeque<u64>,
    /// The last entry of the replica's chain.
    shipped: Option<SegEntry>,
    shipped_at: Option<u64>,
    bytes: u64,
    error: Option<String>,
    /// Ship what is pending, then end (a clean stop).
    closing: bool,
    /// End now, abandoning any upload (the stop's wait ran out, or the
    /// disk went without a stop).
    abandon: bool,
    /// The thread has ended.
    done: bool,
}

struct Shared {
    url: String,
    /// The local image, for messages (a save to another directory,
    /// `snapshot --to`, hands over its own with its MANIFEST).
    dir: PathBuf,
    /// The local image's retention of kept chains: the replica's too.
    keep: Option<Duration>,
    st: Mutex<State>,
    cv: Condvar,
}

/// A local image's replica in object storage and the thread that ships
/// saves to it.
pub struct Replica {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Replica {
    /// Takes the replica's lease (refused while another ramd holds it) and
    /// checks that it is this disk's, then starts shipping `local`'s
    /// committed saves; `local` is an image directory opened for saving.
    /// A refusal (the lease held, another disk, no such bucket) stops the
    /// start; a server that does not answer or refuses the credentials
    /// does not: the disk serves and saves locally, and the replica is
    /// tried again in the background (status says why it lags).
    pub fn start(url: &Path, local: &ImageDir) -> Result<Replica> {
        let mut st = State::default();
        if let Some(m) = local.manifest() {
            st.behind.extend(m.chain.last().map(|s| s.seq));
            st.wanted = Some((local.path().to_path_buf(), m.clone()));
        }
        let shared = Arc::new(Shared {
            // As `Remote::connect` writes it, for status before it answers.
            url: url.display().to_string().trim_end_matches('/').to_string(),
            dir: local.path().to_path_buf(),
            keep: local.keep,
            st: Mutex::new(st),
            cv: Condvar::new(),
        });
        let id = local.id();
        let remote = match open(&shared, id) {
            Ok(r) => Some(r),
            Err(e @ Error::Unusable(_)) => {
                return Err(Error::context(format!("--replicate {}", shared.url), e, ""))
            }
            Err(e) => {
                log::error!(
                    "replicating image {} to {}: {e}; trying again in the background (the \
                     disk serves and saves locally meanwhile)",
                    local.path().display(),
                    shared.url
                );
                shared.st.lock().error = Some(e.to_string());
                None
            }
        };
        let thread = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("ramd-replicate".into())
                .spawn(move || {
                    if let Some(remote) = remote.or_else(|| reopen(&shared, id)) {
                        run(&shared, remote);
                    }
                    shared.st.lock().done = true;
                    shared.cv.notify_all();
                })
                .map_err(|err| Error::Os {
                    what: "starting the replication thread",
                    err,
                })?
        };
        Ok(Replica {
            shared,
            thread: Mutex::new(Some(thread)),
        })
    }

    /// A save was committed to the local image `dir`, whose MANIFEST is
    /// now `m`: the thread ships it (or a newer one) when it can.
    pub fn committed(&self, dir: &Path, m: &Manifest) {
        let mut st = self.shared.st.lock();
        if let Some(last) = m.chain.last() {
            let shipped = st.shipped.as_ref().map_or(0, |s| s.seq);
            if last.seq > shipped && st.behind.back() != Some(&last.seq) {
                st.behind.push_back(last.seq);
            }
        }
        st.wanted = Some((dir.to_path_buf(), m.clone()));
        self.shared.cv.notify_all();
    }

    pub fn status(&self) -> ReplicaStatus {
        let st = self.shared.st.lock();
        ReplicaStatus {
            url: self.shared.url.clone(),
            replicated_seq: st.shipped.as_ref().map(|s| s.seq),
            replicated_save_time: st.shipped.as_ref().map(|s| s.time_ns / 1_000_000_000),
            replicated_at: st.shipped_at,
            saves_behind: st.behind.len() as u64,
            bytes_uploaded: st.bytes,
            last_error: st.error.clone(),
        }
    }

    /// A clean stop: waits up to `wait` for the last committed save to be
    /// shipped, then ends the thread (releasing the replica's lease).
    /// Returns what the replica holds, in words; an error if it lacks
    /// saves the local image has.
    pub fn finish(&self, wait: Duration) -> std::result::Result<String, String> {
        let deadline = std::time::Instant::now() + wait;
        let mut st = self.shared.st.lock();
        st.closing = true;
        self.shared.cv.notify_all();
        while !st.done && std::time::Instant::now() < deadline {
            self.shared.cv.wait_until(&mut st, deadline);
        }
        if !st.done {
            st.abandon = true;
            self.shared.cv.notify_all();
            // An upload under way ends at its next chunk; a request to a
            // server that does not answer, at its timeout: not waited for.
            let grace = std::time::Instant::now() + Duration::from_secs(5);
            while !st.done && std::time::Instant::now() < grace {
                self.shared.cv.wait_until(&mut st, grace);
            }
        }
        let done = st.done;
        let url = self.shared.url.clone();
        let held = match &st.shipped {
            Some(s) => format!("save {} of {}", s.seq, time_text(s.time_ns)),
            None => "no save".into(),
        };
        let result = if st.behind.is_empty() {
            Ok(format!("replicated to {url} ({held})"))
        } else {
            Err(format!(
                "NOT replicated: {} save(s) of the local image are not in {url}, which holds \
                 {held} (waited {} s{}); the next start with --replicate ships them",
                st.behind.len(),
                wait.as_secs(),
                st.error
                    .as_deref()
                    .map_or(String::new(), |e| format!("; last error: {e}"))
            ))
        };
        drop(st);
        if done {
            if let Some(t) = self.thread.lock().take() {
                let _ = t.join();
            }
        }
        result
    }
}

impl Drop for Replica {
    /// Without a clean stop (a disk that failed to open): the thread ends
    /// at its next step, unwaited for.
    fn drop(&mut self) {
        self.shared.st.lock().abandon = true;
        self.shared.cv.notify_all();
    }
}

/// Opens the replica (lease first), checks it is this disk's (`id`, the
/// newest local MANIFEST), removes its debris.
fn open(sh: &Shared, id: DiskId) -> Result<ImageDir> {
    let mut remote = ImageDir::open_remote(Path::new(&sh.url), Open::Replica)?;
    remote.set_keep_saves(sh.keep);
    let wanted = sh.st.lock().wanted.clone();
    let (dir, local) = match &wanted {
        Some((dir, m)) => (dir.display().to_string(), Some(m)),
        None => (sh.dir.display().to_string(), None),
    };
    check_same_disk(&sh.url, &remote, &dir, id, local)?;
    // Left by a shipment that never committed, or by the replica's
    // earlier writer: nothing the replica's MANIFEST names.
    remote.remove_debris();
    let mut st = sh.st.lock();
    st.shipped = remote.manifest().and_then(|m| m.chain.last().cloned());
    let shipped = st.shipped.as_ref().map_or(0, |s| s.seq);
    st.behind.retain(|&s| s > shipped);
    log::info!(
        "replicating image {dir} to {}: {}",
        sh.url,
        match &st.shipped {
            Some(s) => format!("the replica holds save {}", s.seq),
            None => "a new replica".into(),
        }
    );
    Ok(remote)
}

/// When a failure is worth a log line: the first of a spell of failures,
/// and then one whose text differs, at most every `RELOG` (a stalled
/// server fails one request, then another, then the lease: one cause).
#[derive(Default)]
struct FailLog {
    last: Option<(String, std::time::Instant)>,
}

const RELOG: Duration = Duration::from_secs(60);

impl FailLog {
    /// Whether to log failure `text`.
    fn failed(&mut self, text: &str) -> bool {
        let due = match &self.last {
            None => true,
            Some((t, at)) => t != text && at.elapsed() >= RELOG,
        };
        if due {
            self.last = Some((text.to_string(), std::time::Instant::now()));
        }
        due
    }

    /// Whether a success ends a spell of failures (worth saying).
    fn recovered(&mut self) -> bool {
        self.last.take().is_some()
    }
}

/// `open` again and again, with backoff, until it works or the stop gives
/// up; a failure is logged when it changes.
fn reopen(sh: &Shared, id: DiskId) -> Option<ImageDir> {
    let mut retry = RETRY_MIN;
    // `start` logged the first failure.
    let mut failing = FailLog::default();
    if let Some(e) = sh.st.lock().error.clone() {
        failing.failed(&e);
    }
    loop {
        if !wait_retry(sh, retry) {
            return None;
        }
        match open(sh, id) {
            Ok(r) => {
                log::warn!("replication to {} works again", sh.url);
                sh.st.lock().error = None;
                return Some(r);
            }
            Err(e) => {
                let text = e.to_string();
                if failing.failed(&text) {
                    log::error!("replicating to {} failed: {text}; retrying", sh.url);
                }
                sh.st.lock().error = Some(text);
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
}

/// Waits `retry` unless the stop gives up first (then `false`).
fn wait_retry(sh: &Shared, retry: Duration) -> bool {
    let mut st = sh.st.lock();
    let until = std::time::Instant::now() + retry;
    while !st.abandon && std::time::Instant::now() < until {
        sh.cv.wait_until(&mut st, until);
    }
    !st.abandon
}

/// Refuses a replica that holds another disk, or saves of this disk that
/// the local image `dir` lacks (another ramd saved to the prefix):
/// replicating would replace them.
fn check_same_disk(
    url: &str,
    remote: &ImageDir,
    dir: &str,
    id: DiskId,
    local: Option<&Manifest>,
) -> Result<()> {
    let Some(rm) = remote.manifest() else {
        return Ok(());
    };
    if rm.id != Some(id) {
        return Err(Error::Unusable(format!(
            "--replicate {url} holds another disk's image (id {}), not a replica of image {dir} \
             (id {id}): replicating would replace it; give another prefix, or, to serve the \
             disk it holds, serve it with `--image {url}`",
            rm.id.map_or_else(|| "none".into(), |i| i.to_string()),
        )));
    }
    let r = rm.chain.last().expect("a MANIFEST has a chain");
    let newer = match local.and_then(|m| m.chain.last()) {
        None => true,
        Some(l) => r.seq > l.seq || (r.seq == l.seq && r.time_ns != l.time_ns),
    };
    if newer {
        return Err(Error::Unusable(format!(
            "--replicate {url} holds save {} of {}, which image {dir} does not have (another \
             ramd saved to {url} since it was replicated): replicating would replace it; serve \
             the disk from there (`--image {url}`), or give another prefix",
            r.seq,
            time_text(r.time_ns)
        )));
    }
    Ok(())
}

/// The thread: ships the newest committed save whenever the replica lacks
/// it; a spell of failures is logged once (`FailLog`) and retried with
/// backoff.
fn run(sh: &Shared, mut remote: ImageDir) {
    let mut retry = RETRY_MIN;
    let mut failing = FailLog::default();
    loop {
        let job = {
            let mut st = sh.st.lock();
            loop {
                if st.abandon {
                    return;
                }
                let pending = st
                    .wanted
                    .as_ref()
                    .filter(|(_, m)| remote.manifest() != Some(m))
                    .cloned();
                match pending {
                    Some(j) => break j,
                    None if st.closing => return,
                    None => sh.cv.wait(&mut st),
                }
            }
        };
        let (dir, m) = job;
        let t0 = std::time::Instant::now();
        match ship(sh, &mut remote, &dir, &m) {
            Ok(Shipped::Done { segments, bytes }) => {
                let last = m.chain.last().cloned();
                let mut st = sh.st.lock();
                let seq = last.as_ref().map_or(0, |s| s.seq);
                st.behind.retain(|&s| s > seq);
                st.shipped = last;
                st.shipped_at = Some(now_secs());
                st.error = None;
                drop(st);
                if failing.recovered() {
                    log::warn!("replication to {} works again", sh.url);
                }
                log::info!(
                    "replicated save {seq} to {}: {segments} segment(s), {} uploaded in {:.2} s",
                    sh.url,
                    crate::units::human(bytes),
                    t0.elapsed().as_secs_f64()
                );
                retry = RETRY_MIN;
            }
            // A newer local commit replaced the chain meanwhile: on to it.
            Ok(Shipped::Superseded) => {}
            Err(e) => {
                let text = e.to_string();
                if failing.failed(&text) {
                    log::error!(
                        "replicating image {} to {} failed: {text}; retrying every {} s at most \
                         (the disk serves and saves locally meanwhile)",
                        dir.display(),
                        sh.url,
                        RETRY_MAX.as_secs()
                    );
                }
                sh.st.lock().error = Some(text);
                wait_retry(sh, retry);
                retry = (retry * 2).min(RETRY_MAX);
            }
        }
    }
}

enum Shipped {
    Done {
        segments: usize,
        bytes: u64,
    },
    /// A segment file was gone: a newer save replaced the chain.
    Superseded,
}

/// One shipment: the segments the replica lacks, then the MANIFEST.
fn ship(sh: &Shared, remote: &mut ImageDir, dir: &Path, m: &Manifest) -> Result<Shipped> {
    remote.check_lease()?;
    let store = remote.remote.as_ref().expect("a replica is remote");
    let have: Vec<String> = remote
        .manifest()
        .iter()
        .flat_map(|m| &m.chain)
        .map(|s| object_name(s.seq, s.time_ns))
        .collect();
    // Uploaded by an earlier try whose commit failed: an object appears
    // whole or not at all, and its name is this save's alone.
    let listed = store.list()?;
    // Every file opened before any upload: a full save replaces the chain
    // and deletes its files, but not what is open.
    let mut todo = Vec::new();
    for s in &m.chain {
        let name = object_name(s.seq, s.time_ns);
        if have.contains(&name) || listed.iter().any(|(n, b)| *n == name && *b == s.bytes) {
            continue;
        }
        let path = dir.join(seg_name(s.seq));
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound && superseded(sh, m) => {
                return Ok(Shipped::Superseded)
            }
            Err(e) => return Err(Error::file(&path, e)),
        };
        let len = f.metadata().map_err(|e| Error::file(&path, e))?.len();
        if len != s.bytes {
            return Err(Error::file(
                &path,
                io::Error::other(format!(
                    "{len} bytes, not the {} its MANIFEST says: not replicated",
                    s.bytes
                )),
            ));
        }
        todo.push((name, path, f, len));
    }
    let mut bytes = 0;
    let mut segments = todo.len();
    for (name, path, f, len) in todo {
        upload_file(sh, store, &name, &path, f, len)?;
        bytes += len;
        sh.st.lock().bytes += len;
    }
    let (n, b) = ship_kept(sh, remote, dir, m, &listed)?;
    segments += n;
    bytes += b;
    remote.check_lease()?;
    if let Err(e) = remote.replace_manifest(m.clone()) {
        // Its answer lost, the put may have been done; or it was not, and
        // the version held is no longer the server's. Either way the next
        // try starts from what is there (only the lease holder writes it).
        if let Err(again) = remote.reread_manifest() {
            log::debug!("reading the replica's MANIFEST again: {again}");
        }
        return Err(e);
    }
    let text = m.encode().len() as u64;
    sh.st.lock().bytes += text;
    Ok(Shipped::Done {
        segments,
        bytes: bytes + text,
    })
}

/// Puts every chain the local image `dir` keeps (`MANIFEST-N`, not
/// expired, not the chain `m` being shipped) that the replica lacks
/// (`listed`: its objects), each after the segments of it that the
/// replica lacks: a kept MANIFEST in the prefix names only whole objects.
/// A kept chain whose files went meanwhile (the local image expired it)
/// is skipped. Returns the segments uploaded and the bytes.
fn ship_kept(
    sh: &Shared,
    remote: &ImageDir,
    dir: &Path,
    m: &Manifest,
    listed: &[(String, u64)],
) -> Result<(usize, u64)> {
    let store = remote.remote.as_ref().expect("a replica is remote");
    let has = |name: &str, size: Option<u64>| {
        listed
            .iter()
            .any(|(n, b)| n == name && size.is_none_or(|s| s == *b))
    };
    let (mut segments, mut bytes) = (0, 0);
    'chains: for (kept, km) in kept_in_dir(dir)? {
        if has(&kept, None)
            || expired(sh.keep, &km)
            || km.chain.first().map(|s| s.seq) == m.chain.first().map(|s| s.seq)
        {
            continue;
        }
        // Every file opened first: the local image may expire the chain
        // meanwhile, and an open file survives that.
        let mut todo = Vec::new();
        for s in &km.chain {
            let name = object_name(s.seq, s.time_ns);
            if has(&name, Some(s.bytes)) {
                continue;
            }
            let path = dir.join(seg_name(s.seq));
            let f = match File::open(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    log::info!(
                        "not replicating kept chain {kept} of image {}: {} is gone (expired)",
                        dir.display(),
                        path.display()
                    );
                    continue 'chains;
                }
                Err(e) => return Err(Error::file(&path, e)),
            };
            todo.push((name, path, f, s.bytes));
        }
        for (name, path, f, len) in todo {
            upload_file(sh, store, &name, &path, f, len)?;
            segments += 1;
            bytes += len;
            sh.st.lock().bytes += len;
        }
        remote.check_lease()?;
        let text = km.encode();
        let len = text.len() as u64;
        store.put_plain(&kept, text)?;
        bytes += len;
        sh.st.lock().bytes += len;
    }
    Ok((segments, bytes))
}

/// Whether a newer local commit than `m` is waiting. A full save removes
/// the old chain's files before the hook hands over its MANIFEST, so a
/// file found gone is given a moment for that.
fn superseded(sh: &Shared, m: &Manifest) -> bool {
    let mut st = sh.st.lock();
    let until = std::time::Instant::now() + Duration::from_secs(2);
    loop {
        if st.wanted.as_ref().is_some_and(|(_, w)| w != m) {
            return true;
        }
        if std::time::Instant::now() >= until || sh.cv.wait_until(&mut st, until).timed_out() {
            return st.wanted.as_ref().is_some_and(|(_, w)| w != m);
        }
    }
}

/// Uploads local segment file `f` as object `name` (multipart, recorded).
fn upload_file(
    sh: &Shared,
    store: &Remote,
    name: &str,
    path: &Path,
    mut f: File,
    len: u64,
) -> Result<()> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Buf>(2);
    let (back, empties) = std::sync::mpsc::channel();
    let abort = Arc::new(AtomicBool::new(false));
    let upload = store
        .upload(name, rx, back, abort.clone())
        .map_err(|e| Error::file(store.named(name), e))?;
    let mut chunk = vec![0u8; CHUNK];
    let mut sent = 0u64;
    let mut failed = None;
    while sent < len {
        if sh.st.lock().abandon {
            failed = Some(Error::Unusable(format!(
                "{}: the upload was abandoned at the stop",
                store.named(name).display()
            )));
            break;
        }
        let n = match f.read(&mut chunk) {
            Ok(0) => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "shorter than when it was opened",
            )),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => Err(e),
        };
        let n = match n {
            Ok(n) => n,
            Err(e) => {
                failed = Some(Error::file(path, e));
                break;
            }
        };
        let mut b = empties.try_recv().unwrap_or_else(|_| new_buf());
        b.extend_from_slice(&chunk[..n]);
        if tx.send(b).is_err() {
            break; // the upload failed: its error comes from the join
        }
        sent += n as u64;
    }
    if failed.is_some() {
        abort.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    drop(tx);
    let joined = upload
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the upload thread panicked")));
    match (failed, joined) {
        (Some(e), _) => Err(e),
        (None, Err(e)) => Err(Error::file(store.named(name), e)),
        (None, Ok(_)) => Ok(()),
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
