//! The lease of an image in object storage: `PREFIX/LEASE` names the one
//! ramd that may commit saves to the prefix, until when. A conditional
//! MANIFEST put alone refuses a second writer's *commit*, but not what it
//! does before (a new writer removes the debris of the image it opens,
//! which may be the first writer's segment in flight): so a writer holds
//! the lease from before it touches anything until it stops.
//!
//! Taken with a create-only put (or, once expired, a conditional update of
//! the stale one), renewed every third of its term by a conditional update
//! from a timer thread, released at a clean stop by a conditional update
//! to an expired lease. A writer commits only while its lease has a
//! quarter of its term left by its own clock; one whose renewal finds
//! another holder has lost it for good: its saves fail and say why.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use object_store::{ObjectStoreExt, PutMode, PutOptions, PutPayload, UpdateVersion};
use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};

use super::format::LEASE;
use super::remote::{block_on, Remote};

const LEASE_MAGIC: &str = "ramd lease 1";

/// The lease's term: RAMD_LEASE_SECS (tests make it short), else a minute.
fn term() -> Duration {
    let secs = std::env::var("RAMD_LEASE_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&s: &u64| s > 0)
        .unwrap_or(60);
    Duration::from_secs(secs)
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// This process as a lease holder: host, pid, and when it started.
fn holder_id() -> String {
    static ID: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    ID.get_or_init(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "unknown-host".into());
        format!(
            "{host} pid {} since {}",
            std::process::id(),
            super::time_text(now_ns())
        )
    })
    .clone()
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A LEASE object's contents.
struct Held {
    holder: String,
    /// Seconds since the epoch; 0: released.
    expires: u64,
}

impl Held {
    fn encode(&self) -> String {
        format!(
            "{LEASE_MAGIC}\nholder {}\nexpires {}\n",
            self.holder, self.expires
        )
    }

    fn decode(text: &[u8]) -> Option<Held> {
        let text = std::str::from_utf8(text).ok()?;
        let mut lines = text.lines();
        if lines.next()? != LEASE_MAGIC {
            return None;
        }
        let holder = lines.next()?.strip_prefix("holder ")?.to_string();
        let expires = lines.next()?.strip_prefix("expires ")?.parse().ok()?;
        Some(Held { holder, expires })
    }
}

/// Another ramd's live lease.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LeaseHolder {
    /// Host, pid and start time of the ramd that holds it.
    pub holder: String,
    /// When it runs out unless renewed (seconds since the epoch).
    pub expires: u64,
}

/// What the renewal thread and the saves share.
struct State {
    version: UpdateVersion,
    /// When the lease last renewed runs out (seconds since the epoch).
    expires: u64,
    /// Why this process may no longer commit, for good (another holder).
    lost: Option<String>,
    /// The last renewal's error, while renewals fail.
    failing: Option<String>,
    released: bool,
}

/// A view of a lease for status: why saves cannot commit, if they cannot.
#[derive(Clone)]
pub struct LeaseWatch(Arc<(Mutex<State>, Condvar)>);

impl LeaseWatch {
    /// The lease lost to another holder, or failing to renew.
    pub fn trouble(&self) -> Option<String> {
        let st = self.0 .0.lock();
        if let Some(why) = &st.lost {
            return Some(why.clone());
        }
        st.failing
            .as_ref()
            .map(|e| format!("the image's lease could not be renewed: {e}"))
    }
}

/// A lease this process holds on a prefix.
pub(super) struct Lease {
    shared: Arc<(Mutex<State>, Condvar)>,
    renewer: Option<std::thread::JoinHandle<()>>,
    remote: Remote,
    term: Duration,
}

impl Lease {
    /// Takes the prefix's lease, or refuses naming its live holder.
    pub(super) fn take(remote: &Remote) -> Result<Lease> {
        let url = remote.url().to_string();
        Lease::try_take(remote, false)?.map_err(|h| {
            let left = h.expires.saturating_sub(now_secs());
            Error::Unusable(format!(
                "image {url} is in use: its lease is held by {} until {} (in {left} s); only \
                 one ramd may save to an image: stop that one (its lease is released at its \
                 stop), or, if it died, start this one again once the lease has expired",
                h.holder,
                super::time_text(h.expires * 1_000_000_000),
            ))
        })
    }

    /// Takes the prefix's lease; `Ok(Err(holder))` while another holds it
    /// and it has not expired. `force` (a standby's `promote --force`)
    /// takes it over all the same: the holder's next renewal finds it
    /// gone, and its next commit is refused (see `standby.rs`).
    pub(super) fn try_take(
        remote: &Remote,
        force: bool,
    ) -> Result<std::result::Result<Lease, LeaseHolder>> {
        let term = term();
        let me = Held {
            holder: holder_id(),
            expires: now_secs() + term.as_secs(),
        };
        let url = remote.url().to_string();
        let mode = match remote.get(LEASE)? {
            None => PutMode::Create,
            Some((bytes, version)) => match Held::decode(&bytes) {
                Some(h) if h.expires > now_secs() && !force => {
                    return Ok(Err(LeaseHolder {
                        holder: h.holder,
                        expires: h.expires,
                    }))
                }
                Some(h) if h.expires > now_secs() => {
                    log::warn!(
                        "taking over the lease of image {url} from {} (it ran until {}): \
                         forced",
                        h.holder,
                        super::time_text(h.expires * 1_000_000_000)
                    );
                    PutMode::Update(version)
                }
                // Expired, released, or unreadable: taken over, but only if
                // it is still that one.
                _ => PutMode::Update(version),
            },
        };
        let version = match remote.put(LEASE, me.encode(), mode)? {
            Ok(v) => v,
            Err(()) => {
                // Another ramd took it between our read and our put.
                let now = remote.get(LEASE)?;
                return match now.and_then(|(b, _)| Held::decode(&b)) {
                    Some(h) => Ok(Err(LeaseHolder {
                        holder: h.holder,
                        expires: h.expires,
                    })),
                    None => Err(Error::Unusable(format!(
                        "image {url}: another ramd took its lease at the same moment"
                    ))),
                };
            }
        };
        log::info!(
            "took the lease of image {url} until {} (renewed every {} s)",
            super::time_text(me.expires * 1_000_000_000),
            (term.as_secs() / 3).max(1)
        );
        let shared = Arc::new((
            Mutex::new(State {
                version,
                expires: me.expires,
                lost: None,
                failing: None,
                released: false,
            }),
            Condvar::new(),
        ));
        let renewer = {
            let shared = shared.clone();
            let remote = remote.clone_handle();
            std::thread::Builder::new()
                .name("ramd-lease".into())
                .spawn(move || renew(&remote, &shared, term))
                .map_err(|err| Error::Os {
                    what: "starting the lease thread",
                    err,
                })?
        };
        Ok(Ok(Lease {
            shared,
            renewer: Some(renewer),
            remote: remote.clone_handle(),
            term,
        }))
    }

    /// Who holds the prefix's lease now, if anyone does (a released or
    /// expired lease is nobody's): for a standby's status.
    pub(super) fn holder(remote: &Remote) -> Result<Option<LeaseHolder>> {
        Ok(remote
            .get(LEASE)?
            .and_then(|(b, _)| Held::decode(&b))
            .filter(|h| h.expires > now_secs())
            .map(|h| LeaseHolder {
                holder: h.holder,
                expires: h.expires,
            }))
    }

    pub(super) fn watch(&self) -> LeaseWatch {
        LeaseWatch(self.shared.clone())
    }

    /// Whether a commit may go ahead now: the lease is ours and has a
    /// quarter of its term left, so that it cannot expire and be taken
    /// over while the commit is under way.
    pub(super) fn check(&self) -> Result<()> {
        let st = self.shared.0.lock();
        if let Some(why) = &st.lost {
            return Err(Error::Unusable(why.clone()));
        }
        let margin = self.term.as_secs() / 4;
        if now_secs() + margin >= st.expires {
            return Err(Error::Unusable(format!(
                "the lease of image {} is about to run out: it could not be renewed ({}); \
                 not saving until it is",
                self.remote.url(),
                st.failing.as_deref().unwrap_or("no renewal yet")
            )));
        }
        Ok(())
    }

    /// Gives the lease up (a clean stop): the next ramd need not wait.
    pub(super) fn release(&mut self) {
        {
            let mut st = self.shared.0.lock();
            if st.released {
                return;
            }
            st.released = true;
            self.shared.1.notify_all();
        }
        if let Some(t) = self.renewer.take() {
            let _ = t.join();
        }
        let st = self.shared.0.lock();
        if st.lost.is_some() {
            return; // not ours any more
        }
        let gone = Held {
            holder: holder_id(),
            expires: 0,
        };
        match self
            .remote
            .put(LEASE, gone.encode(), PutMode::Update(st.version.clone()))
        {
            Ok(Ok(_)) => log::info!("released the lease of image {}", self.remote.url()),
            Ok(Err(())) => {}
            Err(e) => log::warn!(
                "releasing the lease of image {}: {e} (it expires by itself)",
                self.remote.url()
            ),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.release();
    }
}

/// The renewal thread: a conditional update every third of the term, until
/// released; a failed update is retried at the next tick, a refused one
/// (another holder) ends the lease.
fn renew(remote: &Remote, shared: &(Mutex<State>, Condvar), term: Duration) {
    let every = (term / 3).max(Duration::from_millis(300));
    loop {
        let version = {
            let mut st = shared.0.lock();
            shared.1.wait_for(&mut st, every);
            if st.released {
                return;
            }
            st.version.clone()
        };
        let me = Held {
            holder: holder_id(),
            expires: now_secs() + term.as_secs(),
        };
        let put = remote.put(LEASE, me.encode(), PutMode::Update(version));
        let mut st = shared.0.lock();
        match put {
            Ok(Ok(v)) => {
                st.version = v;
                st.expires = me.expires;
                if st.failing.take().is_some() {
                    log::info!("renewed the lease of image {} again", remote.url());
                }
            }
            Ok(Err(())) => {
                let now = remote.get(LEASE).ok().flatten();
                let held = now
                    .as_ref()
                    .and_then(|(b, v)| Some((Held::decode(b)?, v.clone())));
                if let Some((h, v)) = held.as_ref().filter(|(h, _)| h.holder == holder_id()) {
                    // Our own renewal whose answer was lost (it timed out
                    // while the server stalled) and that was done after
                    // all: the lease is still ours, at its new version.
                    st.version = v.clone();
                    st.expires = h.expires;
                    st.failing = None;
                    continue;
                }
                let holder = held.map_or_else(|| "another ramd".into(), |(h, _)| h.holder);
                let why = format!(
                    "lost the lease of image {} to {holder}: this ramd no longer saves to it \
                     (its data stays in memory: save it elsewhere with `ramd snapshot NAME \
                     --to DIR`)",
                    remote.url()
                );
                log::error!("{why}");
                st.lost = Some(why);
                return;
            }
            Err(e) => {
                log::warn!("renewing the lease of image {}: {e}", remote.url());
                st.failing = Some(e.to_string());
            }
        }
    }
}

impl Remote {
    /// Object `name` and its version, or `None` if there is none.
    pub(super) fn get(&self, name: &str) -> Result<Option<(bytes::Bytes, UpdateVersion)>> {
        let got = block_on(async {
            let r = self.store().get(&self.key(name)).await?;
            let v = UpdateVersion {
                e_tag: r.meta.e_tag.clone(),
                version: r.meta.version.clone(),
            };
            Ok::<_, object_store::Error>((r.bytes().await?, v))
        });
        match got {
            Ok(x) => Ok(Some(x)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error(name, e)),
        }
    }

    /// An unconditional put of object `name` (only the lease holder writes
    /// the objects it puts this way).
    pub(super) fn put_plain(&self, name: &str, text: String) -> Result<()> {
        block_on(
            self.store()
                .put(&self.key(name), PutPayload::from(text.into_bytes())),
        )
        .map(|_| ())
        .map_err(|e| self.error(name, e))
    }

    /// A conditional put: `Ok(Err(()))` if its condition failed.
    pub(super) fn put(
        &self,
        name: &str,
        text: String,
        mode: PutMode,
    ) -> Result<std::result::Result<UpdateVersion, ()>> {
        let put = block_on(self.store().put_opts(
            &self.key(name),
            PutPayload::from(text.into_bytes()),
            PutOptions::from(mode),
        ));
        match put {
            Ok(r) => Ok(Ok(UpdateVersion {
                e_tag: r.e_tag,
                version: r.version,
            })),
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. },
            ) => Ok(Err(())),
            Err(e) => Err(self.error(name, e)),
        }
    }
}
