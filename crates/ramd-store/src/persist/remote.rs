//! Images in S3-compatible object storage (`--image s3://bucket/prefix`):
//! the same segments and MANIFEST as an image directory, as objects
//! `prefix/seg-NNNNNNNN` and `prefix/MANIFEST` (FORMAT.md, *Object
//! storage*).
//!
//! The seam is small: `ImageDir` holds a `Remote` instead of a directory,
//! and where a directory save writes a file, fsyncs and renames, this
//! module uploads (multipart) or puts conditionally. A segment is uploaded
//! under its final key (an object appears whole or not at all, so no
//! `.tmp`); the MANIFEST put is the commit point, conditional on the
//! version this process last read or wrote (`If-Match`), or on there being
//! none (`If-None-Match: *`): a commit by another writer since is refused,
//! never overwritten. A refusal whose MANIFEST is byte for byte one this
//! process put (an answer lost on the way back) is this process's commit.
//!
//! Apache Arrow's `object_store` does the HTTP, signing, retries and
//! multipart requests (ramd sends the parts itself, to know each upload's
//! id: the library cannot list incomplete uploads), and takes credentials
//! and endpoint from the standard `AWS_*` environment variables. Its calls are async: they run on one small
//! runtime shared by the process, entered from ramd's own threads.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc, OnceLock};
use std::time::Duration;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::multipart::MultipartStore;
use object_store::path::Path as Key;
use object_store::{
    ClientConfigKey, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, RetryConfig,
    UpdateVersion,
};

use crate::error::{Error, Result};

use super::format::{Buf, MANIFEST};
use super::manifest::Manifest;

/// The URL scheme of an image in object storage.
pub const S3_SCHEME: &str = "s3://";

/// Whether `--image` names an object-storage image rather than a directory.
pub fn is_url(image: &Path) -> bool {
    image.to_str().is_some_and(|s| s.starts_with(S3_SCHEME))
}

/// The suffix of the object that records a segment's multipart upload
/// while it is in progress (`Remote::upload_recorded`).
pub(super) const UPLOAD_SUFFIX: &str = ".upload";

/// The name of the record of object `name`'s upload.
pub(super) fn upload_marker(name: &str) -> String {
    format!("{name}{UPLOAD_SUFFIX}")
}

/// Size of each part of a segment's multipart upload (S3 wants 5 MiB or
/// more but for the last), and how many are in flight at once.
const PART: usize = 8 << 20;
const PARTS_IN_FLIGHT: usize = 4;

/// The process's runtime for object-storage calls: two workers, made at
/// first use (a disk without such an image never starts one).
pub(super) fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("ramd-s3")
            .enable_all()
            .build()
            .expect("starting the object-storage runtime")
    })
}

/// Runs an object-storage call from one of ramd's threads.
pub(super) fn block_on<F: std::future::Future>(f: F) -> F::Output {
    runtime().block_on(f)
}

/// An image's place in object storage.
pub(super) struct Remote {
    /// `s3://bucket/prefix`, as given less trailing slashes: what errors
    /// and status name (it never holds credentials: those come from the
    /// environment).
    url: String,
    bucket: String,
    store: Arc<dyn ObjectStore>,
    /// The same store's multipart calls (the upload ids ramd records).
    multipart: Arc<dyn MultipartStore>,
    prefix: Key,
    /// The MANIFEST's version as this process last read or wrote it: the
    /// precondition of the next commit (`None`: there is none yet).
    version: Option<UpdateVersion>,
    /// The text of the last MANIFEST put that got no answer (a reset
    /// connection, a timeout): the server may have applied it all the same.
    unsure: Option<String>,
}

impl Remote {
    /// Connects to `s3://bucket/prefix` with the `AWS_*` environment's
    /// credentials, region and endpoint. Nothing is sent yet.
    pub(super) fn connect(url: &Path) -> Result<Remote> {
        let text = url.to_string_lossy();
        let rest = text.strip_prefix(S3_SCHEME).unwrap_or(&text);
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        let prefix = prefix.trim_matches('/');
        if bucket.is_empty() {
            return Err(Error::Unusable(format!(
                "image {text}: no bucket: give s3://BUCKET/PREFIX"
            )));
        }
        let url = match prefix {
            "" => format!("{S3_SCHEME}{bucket}"),
            p => format!("{S3_SCHEME}{bucket}/{p}"),
        };
        // Short of the defaults (ten retries over up to three minutes) so
        // that a save to a server that went away fails in a minute and
        // says so; RAMD_S3_TIMEOUT (seconds, per request) shortens it
        // further for tests.
        let timeout: u64 = std::env::var("RAMD_S3_TIMEOUT")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(30);
        let retry = RetryConfig {
            max_retries: 3,
            retry_timeout: Duration::from_secs(2 * timeout),
            ..RetryConfig::default()
        };
        let store = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
                format!("{timeout}s"),
            )
            .with_config(
                AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                format!("{}s", timeout.min(5)),
            )
            .with_retry(retry)
            .build()
            .map_err(|e| Error::Unusable(format!("image {url}: {}", redact(&e.to_string()))))?;
        let prefix = Key::from(prefix);
        let store = Arc::new(store);
        Ok(Remote {
            url,
            bucket: bucket.to_string(),
            store: store.clone(),
            multipart: store,
            prefix,
            version: None,
            unsure: None,
        })
    }

    pub(super) fn url(&self) -> &str {
        &self.url
    }

    pub(super) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    pub(super) fn key(&self, name: &str) -> Key {
        self.prefix.clone().join(name)
    }

    /// `url/name` (the URL itself for ""), for messages.
    pub(super) fn named(&self, name: &str) -> PathBuf {
        match name {
            "" => PathBuf::from(&self.url),
            name => PathBuf::from(format!("{}/{name}", self.url)),
        }
    }

    /// An object-storage error on object `name` as a ramd error that names
    /// the URL and says what to do.
    pub(super) fn error(&self, name: &str, e: object_store::Error) -> Error {
        Error::file(self.named(name), io::Error::other(self.explain(&e)))
    }

    /// What went wrong and what to do: the S3 error code (the XML body
    /// it came in is left out) or the client's own first line, then a hint.
    pub(super) fn explain(&self, e: &object_store::Error) -> String {
        let text = redact(&e.to_string());
        let code = text
            .split_once("<Code>")
            .and_then(|(_, rest)| rest.split_once("</Code>"))
            .map(|(code, _)| code.to_string());
        let has = |w: &[&str]| w.iter().any(|w| text.contains(w));
        let hint = if has(&["NoSuchBucket"]) {
            format!(
                "bucket {} does not exist: create it, or give another s3://BUCKET/PREFIX",
                self.bucket
            )
        } else if has(&["169.254.169.254", "latest/api/token"]) {
            // No keys in the environment: object_store asked the instance
            // metadata service, which is not there.
            "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (none are in \
             the environment, and no instance metadata service gave any)"
                .into()
        } else if has(&[
            "QuotaExceeded",
            "StorageFull",
            "InsufficientStorage",
            "Insufficient Storage",
        ]) {
            format!(
                "bucket {} has no room: it is over its quota or its server is full; make room \
                 or raise the quota (the image keeps its last save; the next save tries again)",
                self.bucket
            )
        } else if has(&[
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "AccessDenied",
            "Forbidden",
        ]) {
            // Some servers refuse writes to a bucket over its quota, or made
            // read-only, the same way (SeaweedFS: AccessDenied).
            format!(
                "the server refused these credentials: check AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY, and that they may use bucket {} (a write refused so \
                 may also be a bucket made read-only, or over its quota)",
                self.bucket
            )
        } else if has(&["InternalError", "ServiceUnavailable", "SlowDown"]) {
            // SeaweedFS answers a multipart upload to a bucket over its
            // quota with InternalError.
            format!(
                "the server failed the request: it may be overloaded, failing, or out of room \
                 (a full disk, a bucket over its quota); check the server and bucket {}",
                self.bucket
            )
        } else if has(&[
            "error sending request",
            "connect",
            "Connection refused",
            "timed out",
            "Timeout",
        ]) {
            format!(
                "the object store did not answer: is it up, and is the endpoint right ({})?",
                endpoint()
            )
        } else if has(&["credential", "Credential"]) {
            "no usable credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY".into()
        } else {
            String::new()
        };
        let what = match code {
            Some(code) => format!("the server answered {code}"),
            None => text.lines().next().unwrap_or_default().to_string(),
        };
        match hint.as_str() {
            "" => what,
            h => format!("{h} ({what})"),
        }
    }

    /// Names of the objects directly under the prefix, with sizes; fails
    /// if the bucket does not exist.
    pub(super) fn list(&self) -> Result<Vec<(String, u64)>> {
        let listed = block_on(self.store.list_with_delimiter(Some(&self.prefix)));
        let listed = match listed {
            Ok(l) => l,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(Error::Unusable(format!(
                    "image {}: bucket {} does not exist: create it, or give another \
                     s3://BUCKET/PREFIX",
                    self.url, self.bucket
                )))
            }
            Err(e) => return Err(self.error("", e)),
        };
        let mut names: Vec<(String, u64)> = listed
            .objects
            .iter()
            .filter_map(|o| Some((o.location.filename()?.to_string(), o.size)))
            .collect();
        // "Directories" below the prefix are someone else's objects.
        names.extend(
            listed
                .common_prefixes
                .iter()
                .filter_map(|p| Some((format!("{}/", p.filename()?), 0))),
        );
        Ok(names)
    }

    pub(super) fn delete(&self, name: &str) -> Result<()> {
        block_on(self.store.delete(&self.key(name))).map_err(|e| self.error(name, e))
    }

    /// The MANIFEST, or `None` if there is none; remembers its version
    /// for the next commit.
    pub(super) fn read_manifest(&mut self) -> Result<Option<Manifest>> {
        let got = block_on(async {
            let r = self.store.get(&self.key(MANIFEST)).await?;
            let meta = r.meta.clone();
            Ok::<_, object_store::Error>((meta, r.bytes().await?))
        });
        match got {
            Ok((meta, bytes)) => {
                let m = Manifest::decode(&self.named(MANIFEST), &bytes)?;
                self.version = Some(UpdateVersion {
                    e_tag: meta.e_tag,
                    version: meta.version,
                });
                Ok(Some(m))
            }
            Err(object_store::Error::NotFound { .. }) => {
                self.version = None;
                Ok(None)
            }
            Err(e) => Err(self.error(MANIFEST, e)),
        }
    }

    /// The commit point: puts the MANIFEST only if it is still the one
    /// this process read or wrote last (or, for the first, if there is
    /// none). `still_ours` checks the lease before a refused put is taken
    /// for one of this process's own (`own_commit`).
    pub(super) fn commit_manifest(
        &mut self,
        text: String,
        still_ours: &dyn Fn() -> Result<()>,
    ) -> Result<()> {
        let key = self.key(MANIFEST);
        // At most once again: after adopting an earlier put of ours that
        // got no answer, this one's condition is that put's version.
        for again in [false, true] {
            let mode = match &self.version {
                Some(v) => PutMode::Update(v.clone()),
                None => PutMode::Create,
            };
            let put = block_on(self.store.put_opts(
                &key,
                PutPayload::from(text.clone().into_bytes()),
                PutOptions::from(mode),
            ));
            match put {
                Ok(r) => {
                    self.unsure = None;
                    self.version = Some(UpdateVersion {
                        e_tag: r.e_tag,
                        version: r.version,
                    });
                    if self.version.as_ref().is_some_and(|v| v.e_tag.is_none()) {
                        // The next commit needs the e-tag to be conditional.
                        let meta =
                            block_on(self.store.head(&key)).map_err(|e| self.error(MANIFEST, e))?;
                        self.version = Some(UpdateVersion {
                            e_tag: meta.e_tag,
                            version: meta.version,
                        });
                    }
                    return Ok(());
                }
                Err(
                    object_store::Error::Precondition { .. }
                    | object_store::Error::AlreadyExists { .. },
                ) => match self.own_commit(&text, still_ours)? {
                    Own::This => return Ok(()),
                    Own::Earlier if !again => continue,
                    _ => {
                        return Err(Error::Unusable(format!(
                            "{}: another writer committed a save to image {} since this ramd \
                             read it: this save was not committed (nothing was overwritten); \
                             only one ramd may save to an image: stop the other one, then \
                             serve the image again",
                            self.named(MANIFEST).display(),
                            self.url
                        )))
                    }
                },
                Err(e) => {
                    // Perhaps applied: the next refused put finds out.
                    self.unsure = Some(text);
                    return Err(self.error(MANIFEST, e));
                }
            }
        }
        unreachable!("the second put returns")
    }

    /// After a commit's put was refused (its condition failed): whether
    /// the MANIFEST the server holds is this process's own, put by an
    /// earlier request whose answer was lost: this very text (the client
    /// library sent the put again after a reset connection, and the first
    /// had been applied) or the text of an earlier commit that failed
    /// without an answer. Only byte-for-byte equality counts (every
    /// MANIFEST names its saves by sequence number and switch time to the
    /// nanosecond), and only while `still_ours` (the lease) holds; then
    /// its version is adopted. Anything else is another writer's commit.
    fn own_commit(&mut self, text: &str, still_ours: &dyn Fn() -> Result<()>) -> Result<Own> {
        let Some((bytes, version)) = self.get(MANIFEST)? else {
            return Ok(Own::No);
        };
        let own = if bytes == text.as_bytes() {
            Own::This
        } else if self
            .unsure
            .as_deref()
            .is_some_and(|u| bytes == u.as_bytes())
        {
            Own::Earlier
        } else {
            return Ok(Own::No);
        };
        still_ours()?;
        log::info!(
            "{}: the server had applied {} MANIFEST put of this ramd whose answer was lost; \
             taking it as committed",
            self.named(MANIFEST).display(),
            match own {
                Own::This => "this",
                _ => "an earlier (failed)",
            }
        );
        self.unsure = None;
        self.version = Some(version);
        Ok(own)
    }

    /// Starts uploading object `name` on a thread: it takes buffers from
    /// the channel (sending them back once copied) until the channel
    /// closes, then completes the upload, or aborts it if `abort` is set.
    pub(super) fn upload(
        &self,
        name: &str,
        rx: mpsc::Receiver<Buf>,
        back: mpsc::Sender<Buf>,
        abort: Arc<AtomicBool>,
    ) -> io::Result<std::thread::JoinHandle<io::Result<Option<File>>>> {
        let me = self.clone_handle();
        let name = name.to_string();
        std::thread::Builder::new()
            .name("ramd-seg-upload".into())
            .spawn(move || me.upload_recorded(&name, rx, back, &abort).map(|()| None))
    }

    /// A multipart upload whose id is kept in the object `NAME.upload`
    /// while it is in progress: the id is the only handle on an upload the
    /// server holds (the client library cannot list them), so a ramd
    /// killed mid-upload leaves it for the next writer of the prefix to
    /// abort (`abort_recorded`). An upload that fails is aborted here.
    fn upload_recorded(
        &self,
        name: &str,
        rx: mpsc::Receiver<Buf>,
        back: mpsc::Sender<Buf>,
        abort: &AtomicBool,
    ) -> io::Result<()> {
        let fail = |e: object_store::Error| io::Error::other(self.explain(&e));
        let key = self.key(name);
        let id = block_on(self.multipart.create_multipart(&key)).map_err(fail)?;
        let marker = upload_marker(name);
        let recorded = block_on(self.store.put(
            &self.key(&marker),
            PutPayload::from(id.clone().into_bytes()),
        ));
        if let Err(e) = recorded {
            let _ = block_on(self.multipart.abort_multipart(&key, &id));
            return Err(fail(e));
        }
        let sent = self.send_parts(&key, &id, rx, back, abort);
        if sent.is_err() {
            let _ = block_on(self.multipart.abort_multipart(&key, &id));
        }
        // Done or aborted: the record goes (if this fails, the next
        // writer's abort finds the upload gone and removes the record).
        if let Err(e) = block_on(self.store.delete(&self.key(&marker))) {
            log::warn!("{}: {}", self.named(&marker).display(), self.explain(&e));
        }
        sent
    }

    /// The parts of upload `id`: PART bytes each (the last may be
    /// shorter), PARTS_IN_FLIGHT at a time, then the completion.
    fn send_parts(
        &self,
        key: &Key,
        id: &str,
        rx: mpsc::Receiver<Buf>,
        back: mpsc::Sender<Buf>,
        abort: &AtomicBool,
    ) -> io::Result<()> {
        let fail = |e: object_store::Error| io::Error::other(self.explain(&e));
        let mut flying = std::collections::VecDeque::new();
        let mut done: Vec<object_store::multipart::PartId> = Vec::new();
        let mut part: Vec<u8> = Vec::with_capacity(PART);
        let mut idx = 0;
        let send = |data: Vec<u8>, idx: usize| {
            let (mp, key, id) = (self.multipart.clone(), key.clone(), id.to_string());
            runtime()
                .spawn(async move { mp.put_part(&key, &id, idx, PutPayload::from(data)).await })
        };
        // Waits for the oldest part in flight; on the first failure waits
        // for the others too, so that none lands after the abort.
        let mut wait_oldest = |flying: &mut std::collections::VecDeque<
            tokio::task::JoinHandle<object_store::Result<object_store::multipart::PartId>>,
        >|
         -> io::Result<()> {
            let Some(h) = flying.pop_front() else {
                return Ok(());
            };
            match block_on(h)
                .map_err(io::Error::other)
                .and_then(|r| r.map_err(fail))
            {
                Ok(p) => {
                    done.push(p);
                    Ok(())
                }
                Err(e) => {
                    for h in flying.drain(..) {
                        let _ = block_on(h);
                    }
                    Err(e)
                }
            }
        };
        for mut b in rx {
            let mut at = 0;
            while at < b.len() {
                let n = (PART - part.len()).min(b.len() - at);
                part.extend_from_slice(&b[at..at + n]);
                at += n;
                if part.len() == PART {
                    if flying.len() >= PARTS_IN_FLIGHT {
                        wait_oldest(&mut flying)?;
                    }
                    let full = std::mem::replace(&mut part, Vec::with_capacity(PART));
                    flying.push_back(send(full, idx));
                    idx += 1;
                }
            }
            // Copied into the part being filled: the buffer goes back
            // empty for the encoder to reuse.
            b.clear();
            let _ = back.send(b);
        }
        if !part.is_empty() && !abort.load(std::sync::atomic::Ordering::SeqCst) {
            flying.push_back(send(part, idx));
        }
        while !flying.is_empty() {
            wait_oldest(&mut flying)?;
        }
        if abort.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(io::Error::other("the save was abandoned"));
        }
        block_on(
            self.multipart
                .complete_multipart(key, &id.to_string(), done),
        )
        .map_err(fail)?;
        Ok(())
    }

    /// Aborts the multipart upload that the record `marker` (`NAME.upload`)
    /// names and removes the record: the debris of a writer killed while
    /// uploading. Only a writer holding the lease calls this, so the
    /// upload is no live writer's. An upload the server no longer has
    /// (completed, or aborted already) just loses its record.
    pub(super) fn abort_recorded(&self, marker: &str) -> Result<()> {
        let name = marker.strip_suffix(UPLOAD_SUFFIX).unwrap_or(marker);
        let got = block_on(async { self.store.get(&self.key(marker)).await?.bytes().await });
        let id = match got {
            Ok(b) => String::from_utf8_lossy(&b).trim().to_string(),
            Err(object_store::Error::NotFound { .. }) => return Ok(()),
            Err(e) => return Err(self.error(marker, e)),
        };
        match block_on(self.multipart.abort_multipart(&self.key(name), &id)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(self.error(name, e)),
        }
        log::info!(
            "{}: aborted the incomplete multipart upload {id} of a save that never finished",
            self.named(name).display()
        );
        self.delete(marker)
    }

    /// The same place, for another thread (without the MANIFEST version).
    pub(super) fn clone_handle(&self) -> Remote {
        Remote {
            url: self.url.clone(),
            bucket: self.bucket.clone(),
            store: self.store.clone(),
            multipart: self.multipart.clone(),
            prefix: self.prefix.clone(),
            version: None,
            unsure: None,
        }
    }
}

/// Whose MANIFEST the server holds after a refused commit (`own_commit`).
enum Own {
    /// The text being committed: the commit is done.
    This,
    /// An earlier commit's, which failed without an answer: the commit
    /// may replace it.
    Earlier,
    /// Another writer's.
    No,
}

/// The endpoint the environment names, for hints (not a secret).
fn endpoint() -> String {
    ["AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3"]
        .iter()
        .find_map(|v| std::env::var(v).ok())
        .map_or_else(
            || "AWS's, as no AWS_ENDPOINT_URL is set".into(),
            |e| format!("AWS_ENDPOINT_URL={e}"),
        )
}

/// `text` with the environment's credentials blanked out: some servers
/// echo the access key in their error bodies, and errors reach logs and
/// status.
fn redact(text: &str) -> String {
    let mut out = text.to_string();
    for var in [
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    ] {
        if let Ok(v) = std::env::var(var) {
            if v.len() >= 4 {
                out = out.replace(&v, "[redacted]");
            }
        }
    }
    out
}
