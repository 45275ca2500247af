//! A standby's persister (`--standby`): following its image as the
//! writer saves it, and the promotion that makes it the writer.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::error::{Error, Result};

use super::policy::{now_secs, Persister};
use super::standby::{Follow, FollowTree};
use super::status::{report_of, SaveReport};

impl Persister {
    /// Makes this the persister of a standby (`--standby`): it follows its
    /// image, reading the MANIFEST every `poll`, and saves nothing until
    /// [`Persister::promote`]. The store must hold the image's save and be
    /// a standby's (`Store::set_standby`).
    pub fn set_standby(&mut self, poll: Duration) {
        self.follow = Some(Mutex::new(Follow::new(poll)));
        *self.following.get_mut() = true;
    }

    /// A filesystem standby: each save's tree goes to `tree` (see
    /// `FollowTree`), and the promotion's save holds it.
    pub fn set_follow_tree(&mut self, tree: Box<dyn FollowTree>) {
        self.tree = Some(tree);
    }

    /// Whether it is a standby not yet promoted.
    pub fn is_standby(&self) -> bool {
        self.following.load(Ordering::SeqCst)
    }

    /// One poll of a standby: what its writer saved since is applied.
    fn follow_once(&self) {
        let Some(follow) = &self.follow else { return };
        let mut image = self.image.lock();
        if !self.is_standby() {
            return;
        }
        let r = image.follow(&self.store, follow, self.tree.as_deref());
        let last = image.manifest().and_then(|m| m.chain.last()).cloned();
        drop(image);
        let mut f = follow.lock();
        match r {
            Ok(()) => {
                if f.error.take().is_some() {
                    log::info!(
                        "standby: following image {} again",
                        self.path.lock().display()
                    );
                }
            }
            Err(e) => {
                let text = e.to_string();
                if f.error.as_deref() != Some(&text) {
                    log::error!("standby: {text} (trying again every poll)");
                }
                f.error = Some(text);
            }
        }
        drop(f);
        if let Some(s) = last {
            self.state.lock().last = Some(report_of(&s));
        }
    }

    /// A standby's loop: polls every `--standby-poll` until promoted or
    /// stopped. Returns whether it was stopped.
    pub(super) fn follow_loop(&self) -> bool {
        let poll = match &self.follow {
            Some(f) => f.lock().poll,
            None => return false,
        };
        loop {
            // At once at the start: what was saved since the load.
            self.follow_once();
            let deadline = Instant::now() + poll;
            let mut st = self.state.lock();
            while !st.stop && self.is_standby() && Instant::now() < deadline {
                self.changed.wait_until(&mut st, deadline);
            }
            if st.stop {
                return true;
            }
            if !self.is_standby() {
                return false;
            }
        }
    }

    /// `ramd promote NAME`: makes a standby its image's writer. Takes the
    /// image's lease, waiting up to `wait` for its holder's to run out
    /// (`force`: takes it over at once), applies what the old writer
    /// committed since the last poll, and commits an empty save that
    /// fences the old writer off (`standby.rs`); then the store takes
    /// writes and saves go to the image. A failure leaves it a standby.
    pub fn promote(&self, force: bool, wait: Duration) -> Result<SaveReport> {
        let Some(follow) = &self.follow else {
            return Err(Error::Unusable(
                "the disk is not a standby (serve it with --standby to promote it later)".into(),
            ));
        };
        let deadline = Instant::now() + wait;
        let mut image = loop {
            let mut image = self.image.lock();
            if !self.is_standby() {
                return Err(Error::Unusable(
                    "the disk is not a standby any more: it was promoted already".into(),
                ));
            }
            let h = match image.take_lease(force)? {
                Ok(()) => break image,
                Err(h) => h,
            };
            let now = now_secs();
            let left = h.expires.saturating_sub(now);
            if Instant::now() >= deadline {
                return Err(Error::Unusable(format!(
                    "image {}: its lease is held by {} until {} (in {left} s): its writer may \
                    be alive. Promote once it has stopped (a clean stop releases the lease) \
                    or its lease has run out (`--wait DURATION` waits for that), or take the \
                    lease over with --force (the old writer's next save then fails)",
                    image.path().display(),
                    h.holder,
                    super::time_text(h.expires * 1_000_000_000),
                )));
            }
            drop(image);
            log::info!(
                "promoting: waiting for the lease held by {} to run out at {} (in {left} s)",
                h.holder,
                super::time_text(h.expires * 1_000_000_000)
            );
            // Again at its expiry (to the millisecond: a failover waits
            // for it), and every second before: a clean stop releases it.
            let expiry = (UNIX_EPOCH + Duration::from_secs(h.expires))
                .duration_since(SystemTime::now())
                .unwrap_or_default();
            let until = deadline
                .min(Instant::now() + expiry + Duration::from_millis(1))
                .min(Instant::now() + Duration::from_secs(1));
            let mut st = self.state.lock();
            while !st.stop && Instant::now() < until {
                self.changed.wait_until(&mut st, until);
            }
            if st.stop {
                return Err(Error::Unusable("ramd is stopping: not promoted".into()));
            }
        };
        let fenced = image.fence(&self.store, follow, self.tree.as_deref());
        let entry = match fenced {
            Ok(e) => e,
            Err(e) => {
                image.drop_lease();
                return Err(Error::context(
                    "promoting: the disk stays a standby".into(),
                    e,
                    "",
                ));
            }
        };
        *self.lease.lock() = image.lease_watch();
        self.following.store(false, Ordering::SeqCst);
        self.store.set_standby(false);
        drop(image);
        let report = report_of(&entry);
        {
            let mut st = self.state.lock();
            st.last = Some(report.clone());
            st.saves += 1;
        }
        follow.lock().error = None;
        self.changed.notify_all();
        log::warn!(
            "promoted: this disk is now the writer of image {} (save {}); it takes writes",
            self.path.lock().display(),
            entry.seq
        );
        Ok(report)
    }
}
