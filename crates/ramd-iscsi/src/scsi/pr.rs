//! Reservations: SPC-4 persistent reservations (PERSISTENT RESERVE IN/OUT)
//! and SPC-2 RESERVE/RELEASE(6/10).
//!
//! Persistent reservations live in memory: they outlive sessions and LUN
//! resets, not the daemon. APTPL (persist through power loss) is therefore
//! not offered (PTPL_C=0) and a REGISTER asking for it is refused with
//! INVALID FIELD IN PARAMETER LIST, as SPC-4 says for a device without the
//! capability. SPEC_I_PT, ALL_TG_PT and REGISTER AND MOVE are not offered
//! either (the target has one port).

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use super::opcodes::Access;
use super::sense::{self, invalid_cdb, invalid_param};
use super::{be16, be64, Nexus, Outcome, Reply};

/// Reservation types (SPC-4 table 180).
const WRITE_EXCLUSIVE: u8 = 1;
const EXCLUSIVE_ACCESS: u8 = 3;
const WE_REGISTRANTS_ONLY: u8 = 5;
const EA_REGISTRANTS_ONLY: u8 = 6;
const WE_ALL_REGISTRANTS: u8 = 7;
const EA_ALL_REGISTRANTS: u8 = 8;

fn valid_type(t: u8) -> bool {
    matches!(t, 1 | 3 | 5..=8)
}

/// Every registrant holds an all-registrants reservation.
fn all_registrants(t: u8) -> bool {
    t == WE_ALL_REGISTRANTS || t == EA_ALL_REGISTRANTS
}

#[derive(Default)]
pub(super) struct Reservations {
    state: Mutex<State>,
    /// A reservation (persistent or RESERVE(6/10)) exists: only then does a
    /// command look at the state (so READ and WRITE take no lock for it).
    restricted: AtomicBool,
}

#[derive(Default)]
struct State {
    /// PRGENERATION: counts registration changes.
    generation: u32,
    /// One key per registered I_T nexus.
    registrants: Vec<(Nexus, u64)>,
    reservation: Option<Held>,
    /// The I_T nexus holding a RESERVE(6/10) reservation.
    legacy: Option<Nexus>,
}

struct Held {
    /// Who reserved; for all-registrants types every registrant holds it.
    holder: Nexus,
    kind: u8,
}

impl State {
    fn key(&self, n: &Nexus) -> Option<u64> {
        self.registrants
            .iter()
            .find(|(r, _)| r == n)
            .map(|&(_, k)| k)
    }

    fn is_holder(&self, n: &Nexus) -> bool {
        match &self.reservation {
            Some(r) if all_registrants(r.kind) => self.key(n).is_some(),
            Some(r) => r.holder == *n,
            None => false,
        }
    }

    /// SPC-4 5.13.1 (persistent) and SPC-2 5.5.1 (RESERVE/RELEASE).
    fn conflicts(&self, n: &Nexus, access: Access) -> bool {
        if self.legacy.as_ref().is_some_and(|l| l != n) {
            return !matches!(access, Access::Info | Access::Legacy);
        }
        let Some(r) = &self.reservation else {
            return false;
        };
        if self.is_holder(n) {
            return false;
        }
        let registered = self.key(n).is_some();
        match access {
            Access::Info | Access::Pr | Access::Meta | Access::Legacy => false,
            Access::Read => match r.kind {
                EXCLUSIVE_ACCESS => true,
                EA_REGISTRANTS_ONLY | EA_ALL_REGISTRANTS => !registered,
                _ => false,
            },
            Access::Write => match r.kind {
                WRITE_EXCLUSIVE | EXCLUSIVE_ACCESS => true,
                WE_REGISTRANTS_ONLY | WE_ALL_REGISTRANTS => !registered,
                _ => !registered,
            },
        }
    }

    /// Drops `n`'s registration, and the reservation it held.
    fn unregister(&mut self, n: &Nexus) {
        self.registrants.retain(|(r, _)| r != n);
        let gone = match &self.reservation {
            Some(r) if all_registrants(r.kind) => self.registrants.is_empty(),
            Some(r) => r.holder == *n,
            None => false,
        };
        if gone {
            self.reservation = None;
        }
    }

    /// Removes the registrations with `key`, but `keep`'s; how many went.
    fn remove_key(&mut self, key: u64, keep: &Nexus) -> usize {
        let before = self.registrants.len();
        self.registrants.retain(|(r, k)| *k != key || r == keep);
        before - self.registrants.len()
    }
}

impl Reservations {
    fn update(&self, st: &State) {
        let restricted = st.reservation.is_some() || st.legacy.is_some();
        self.restricted.store(restricted, Ordering::Release);
    }

    pub(super) fn conflicts(&self, n: &Nexus, access: Access) -> bool {
        if access == Access::Info || !self.restricted.load(Ordering::Acquire) {
            return false;
        }
        self.state.lock().conflicts(n, access)
    }

    pub(super) fn reset(&self) {
        let mut st = self.state.lock();
        st.legacy = None;
        self.update(&st);
    }

    pub(super) fn nexus_lost(&self, n: &Nexus) {
        let mut st = self.state.lock();
        if st.legacy.as_ref() == Some(n) {
            st.legacy = None;
        }
        self.update(&st);
    }

    /// RESERVE(6/10): the whole logical unit, for this nexus.
    pub(super) fn reserve_legacy(&self, n: &Nexus, c: &[u8]) -> Outcome {
        if c[1] != 0 {
            // Extents, third-party reservations: not supported.
            return Err(invalid_cdb(1, None));
        }
        let mut st = self.state.lock();
        let other = st.legacy.as_ref().is_some_and(|l| l != n);
        if other || st.reservation.is_some() || !st.registrants.is_empty() {
            return Ok(Reply::conflict());
        }
        st.legacy = Some(n.clone());
        self.update(&st);
        Ok(Reply::good(Vec::new(), 0))
    }

    /// RELEASE(6/10): releases this nexus's reservation; from another
    /// nexus it does nothing (GOOD), as SPC-2 says.
    pub(super) fn release_legacy(&self, n: &Nexus, c: &[u8]) -> Outcome {
        if c[1] != 0 {
            return Err(invalid_cdb(1, None));
        }
        let mut st = self.state.lock();
        if st.reservation.is_some() && !st.is_holder(n) {
            return Ok(Reply::conflict());
        }
        if st.legacy.as_ref() == Some(n) {
            st.legacy = None;
        }
        self.update(&st);
        Ok(Reply::good(Vec::new(), 0))
    }

    /// PERSISTENT RESERVE IN.
    pub(super) fn report(&self, c: &[u8]) -> Outcome {
        let alloc = usize::from(be16(&c[7..]));
        let st = self.state.lock();
        let mut d = Vec::new();
        d.extend_from_slice(&st.generation.to_be_bytes());
        d.extend_from_slice(&[0; 4]);
        match c[1] & 0x1F {
            // READ KEYS
            0x00 => {
                for (_, k) in &st.registrants {
                    d.extend_from_slice(&k.to_be_bytes());
                }
            }
            // READ RESERVATION
            0x01 => {
                if let Some(r) = &st.reservation {
                    let key = if all_registrants(r.kind) {
                        0
                    } else {
                        st.key(&r.holder).unwrap_or(0)
                    };
                    d.extend_from_slice(&key.to_be_bytes());
                    d.extend_from_slice(&[0, 0, 0, 0, 0, r.kind, 0, 0]);
                }
            }
            // REPORT CAPABILITIES
            0x02 => {
                d.clear();
                d.extend_from_slice(&[
                    0,
                    8,
                    0x10, // CRH: RESERVE/RELEASE conflict with persistent reservations
                    0x80, // TMV: the type mask is valid
                    0x80 | 0x40 | 0x20 | 0x08 | 0x02, // WR_EX_AR, EX_AC_RO, WR_EX_RO, EX_AC, WR_EX
                    0x01, // EX_AC_AR
                    0,
                    0,
                ]);
                return Ok(Reply::good(d, alloc));
            }
            // READ FULL STATUS
            0x03 => {
                for (r, k) in &st.registrants {
                    d.extend_from_slice(&k.to_be_bytes());
                    d.extend_from_slice(&[0; 4]);
                    let holder = st.is_holder(r);
                    d.push(u8::from(holder));
                    d.push(match (&st.reservation, holder) {
                        (Some(h), true) => h.kind,
                        _ => 0,
                    });
                    d.extend_from_slice(&[0; 4]);
                    d.extend_from_slice(&r.target_port_id.to_be_bytes());
                    let id = transport_id(&r.initiator_port);
                    d.extend_from_slice(&(id.len() as u32).to_be_bytes());
                    d.extend_from_slice(&id);
                }
            }
            _ => return Err(invalid_cdb(1, Some(4))),
        }
        let len = (d.len() - 8) as u32;
        d[4..8].copy_from_slice(&len.to_be_bytes());
        Ok(Reply::good(d, alloc))
    }

    /// PERSISTENT RESERVE OUT with its (already length-checked) parameters.
    pub(super) fn out(&self, n: &Nexus, c: &[u8], p: &[u8]) -> Outcome {
        let sa = c[1] & 0x1F;
        let (scope, kind) = (c[2] >> 4, c[2] & 0x0F);
        if sa > 6 {
            // REGISTER AND MOVE and beyond.
            return Err(invalid_cdb(1, Some(4)));
        }
        if p.len() != 24 {
            return Err(sense::PARAM_LIST_LENGTH);
        }
        let res_key = be64(p);
        let sa_key = be64(&p[8..]);
        let flags = p[20];
        let registering = sa == 0 || sa == 6;
        if flags & 0x08 != 0 || (registering && flags & 0x05 != 0) {
            // SPEC_I_PT, APTPL, ALL_TG_PT: not offered (see the module docs).
            return Err(invalid_param(20));
        }
        if matches!(sa, 1 | 2 | 4 | 5) {
            if scope != 0 {
                return Err(invalid_cdb(2, Some(7)));
            }
            if !valid_type(kind) {
                return Err(invalid_cdb(2, Some(3)));
            }
        }
        let mut st = self.state.lock();
        let r = Self::apply(&mut st, n, sa, kind, res_key, sa_key);
        self.update(&st);
        r
    }

    fn apply(st: &mut State, n: &Nexus, sa: u8, kind: u8, res_key: u64, sa_key: u64) -> Outcome {
        let good = || Ok(Reply::good(Vec::new(), 0));
        let mine = st.key(n);
        // Everything but REGISTER AND IGNORE EXISTING KEY needs the
        // nexus's own key (REGISTER from an unregistered nexus: zero).
        if sa != 6 && mine.unwrap_or(0) != res_key {
            return Ok(Reply::conflict());
        }
        if sa != 0 && sa != 6 && mine.is_none() {
            return Ok(Reply::conflict());
        }
        match sa {
            // REGISTER, REGISTER AND IGNORE EXISTING KEY
            0 | 6 => {
                if sa_key == 0 {
                    if mine.is_some() {
                        st.unregister(n);
                        st.generation = st.generation.wrapping_add(1);
                    }
                } else {
                    match st.registrants.iter_mut().find(|(r, _)| r == n) {
                        Some(entry) => entry.1 = sa_key,
                        None => st.registrants.push((n.clone(), sa_key)),
                    }
                    st.generation = st.generation.wrapping_add(1);
                }
                good()
            }
            // RESERVE
            1 => match &st.reservation {
                None => {
                    st.reservation = Some(Held {
                        holder: n.clone(),
                        kind,
                    });
                    good()
                }
                Some(r) if r.kind == kind && st.is_holder(n) => good(),
                Some(_) => Ok(Reply::conflict()),
            },
            // RELEASE
            2 => match &st.reservation {
                Some(r) if st.is_holder(n) => {
                    if r.kind != kind {
                        return Err(sense::INVALID_RELEASE);
                    }
                    st.reservation = None;
                    good()
                }
                _ => good(),
            },
            // CLEAR
            3 => {
                st.registrants.clear();
                st.reservation = None;
                st.generation = st.generation.wrapping_add(1);
                good()
            }
            // PREEMPT, PREEMPT AND ABORT
            _ => {
                let holder_key = st
                    .reservation
                    .as_ref()
                    .filter(|r| !all_registrants(r.kind))
                    .and_then(|r| st.key(&r.holder));
                let all = st
                    .reservation
                    .as_ref()
                    .is_some_and(|r| all_registrants(r.kind));
                if all && sa_key == 0 {
                    // Preempting an all-registrants reservation: everyone
                    // else goes, this nexus holds it with the new type.
                    st.registrants.retain(|(r, _)| r == n);
                    st.reservation = Some(Held {
                        holder: n.clone(),
                        kind,
                    });
                } else if holder_key.is_some() && holder_key == Some(sa_key) {
                    st.remove_key(sa_key, n);
                    st.reservation = Some(Held {
                        holder: n.clone(),
                        kind,
                    });
                } else {
                    if sa_key == 0 {
                        return Err(invalid_param(8));
                    }
                    if st.remove_key(sa_key, n) == 0 {
                        return Ok(Reply::conflict());
                    }
                }
                st.generation = st.generation.wrapping_add(1);
                good()
            }
        }
    }
}

/// An iSCSI TransportID (format 01b: name, ",i,0x", ISID), NUL terminated
/// and padded to a multiple of 4 bytes, at least 20.
fn transport_id(initiator_port: &str) -> Vec<u8> {
    let mut name = initiator_port.as_bytes().to_vec();
    name.push(0);
    let padded = name.len().div_ceil(4) * 4;
    name.resize(padded.max(20), 0);
    let mut id = vec![0x40 | 0x05, 0];
    id.extend_from_slice(&(name.len() as u16).to_be_bytes());
    id.extend_from_slice(&name);
    id
}
