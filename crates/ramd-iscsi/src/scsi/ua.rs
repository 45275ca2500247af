//! Unit attention conditions: a logical unit reset (LUN RESET, TARGET WARM
//! RESET) is reported once to every I_T nexus the unit knows, as SAM-5
//! asks, so that initiators learn their reservations and queued commands
//! are gone.
//!
//! The unit learns of a nexus from the commands initiators send when they
//! attach a LUN (INQUIRY, TEST UNIT READY, READ CAPACITY, REQUEST SENSE,
//! REPORT SUPPORTED OPERATION CODES): READ and WRITE never take this lock,
//! only an atomic count of pending conditions is read on their path.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

use super::sense::{key, Sense};
use super::Nexus;

/// BUS DEVICE RESET FUNCTION OCCURRED.
pub const RESET_OCCURRED: Sense = Sense::new(key::UNIT_ATTENTION, 0x29, 0x03);

#[derive(Default)]
pub(super) struct UnitAttention {
    /// Known nexuses, each with its pending condition.
    nexuses: Mutex<HashMap<Nexus, Option<Sense>>>,
    /// How many of them have one pending.
    pending: AtomicUsize,
}

impl UnitAttention {
    pub(super) fn know(&self, n: &Nexus) {
        let mut st = self.nexuses.lock();
        if !st.contains_key(n) {
            st.insert(n.clone(), None);
        }
    }

    /// Establishes `s` for every known nexus.
    pub(super) fn raise_all(&self, s: Sense) {
        let mut st = self.nexuses.lock();
        for ua in st.values_mut() {
            if ua.replace(s).is_none() {
                self.pending.fetch_add(1, Ordering::AcqRel);
            }
        }
    }

    /// The nexus's pending condition, cleared (it is reported once).
    pub(super) fn take(&self, n: &Nexus) -> Option<Sense> {
        if self.pending.load(Ordering::Acquire) == 0 {
            return None;
        }
        let s = self.nexuses.lock().get_mut(n)?.take()?;
        self.pending.fetch_sub(1, Ordering::AcqRel);
        Some(s)
    }

    pub(super) fn forget(&self, n: &Nexus) {
        if let Some(Some(_)) = self.nexuses.lock().remove(n) {
            self.pending.fetch_sub(1, Ordering::AcqRel);
        }
    }
}
