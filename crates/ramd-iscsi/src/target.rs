//! The target: its name, its LUNs and its sessions. The portals (listening
//! sockets) initiators reach it on are [`crate::portal`]'s. One connection
//! is one thread ([`crate::conn`]); sessions join connections by ISID and
//! TSIH.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::params::Params;
use crate::scsi::{Lun, Nexus};

/// A CHAP name and secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chap {
    pub user: String,
    pub secret: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetConfig {
    /// The target's IQN.
    pub name: String,
    pub alias: String,
    /// One-way CHAP: initiators must prove they know this secret.
    pub chap: Option<Chap>,
    /// Mutual CHAP: what ramd answers an initiator's challenge with.
    pub mutual_chap: Option<Chap>,
    /// Connections served at once per portal.
    pub max_connections: usize,
}

/// CmdSN window size: commands queued per session at most.
pub const CMD_WINDOW: u32 = 128;

/// The session's command numbering (§4.2.2.1), shared by its connections.
#[derive(Debug)]
pub(crate) struct CmdWindow {
    pub exp: u32,
    /// CmdSNs received past a gap (another connection's command not yet in).
    ahead: BTreeSet<u32>,
}

impl CmdWindow {
    pub fn new(first: u32) -> CmdWindow {
        CmdWindow {
            exp: first,
            ahead: BTreeSet::new(),
        }
    }

    pub fn max(&self) -> u32 {
        self.exp.wrapping_add(CMD_WINDOW - 1)
    }

    /// Whether `sn` is in the window but has not arrived.
    pub fn awaited(&self, sn: u32) -> bool {
        sn.wrapping_sub(self.exp) < CMD_WINDOW && !self.ahead.contains(&sn)
    }

    /// Takes a non-immediate command's CmdSN: false if it is outside the
    /// window (a duplicate or too far ahead), which §4.2.2.1 says to drop.
    pub fn accept(&mut self, sn: u32) -> bool {
        let d = sn.wrapping_sub(self.exp);
        if d >= CMD_WINDOW {
            return false;
        }
        if d == 0 {
            self.exp = self.exp.wrapping_add(1);
            while self.ahead.remove(&self.exp) {
                self.exp = self.exp.wrapping_add(1);
            }
            true
        } else {
            self.ahead.insert(sn)
        }
    }
}

pub(crate) struct Session {
    pub tsih: u16,
    pub isid: [u8; 6],
    pub initiator: String,
    pub discovery: bool,
    pub nexus: Nexus,
    /// The session-wide values the leading connection negotiated.
    pub params: Params,
    pub window: Mutex<CmdWindow>,
    /// Its connections by CID: a stream clone to shut them down.
    pub conns: Mutex<HashMap<u16, TcpStream>>,
}

impl Session {
    pub fn close(&self) {
        for s in self.conns.lock().values() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

#[derive(Default)]
struct Sessions {
    by_tsih: HashMap<u16, Arc<Session>>,
    next_tsih: u16,
}

pub struct Target {
    pub(crate) cfg: TargetConfig,
    luns: RwLock<BTreeMap<u64, Arc<Lun>>>,
    sessions: Mutex<Sessions>,
    /// Every live connection, logged in or not, for `stop`.
    conns: Mutex<HashMap<u64, TcpStream>>,
    next_conn: AtomicU64,
    stopping: AtomicBool,
}

impl Target {
    pub fn new(cfg: TargetConfig) -> Arc<Target> {
        Arc::new(Target {
            cfg,
            luns: RwLock::new(BTreeMap::new()),
            sessions: Mutex::new(Sessions::default()),
            conns: Mutex::new(HashMap::new()),
            next_conn: AtomicU64::new(1),
            stopping: AtomicBool::new(false),
        })
    }

    pub fn config(&self) -> &TargetConfig {
        &self.cfg
    }

    /// Adds a LUN; false if the number is taken.
    pub fn add_lun(&self, id: u64, lun: Arc<Lun>) -> bool {
        let mut l = self.luns.write();
        if l.contains_key(&id) {
            return false;
        }
        l.insert(id, lun);
        true
    }

    /// Removes a LUN; returns how many remain.
    pub fn remove_lun(&self, id: u64) -> usize {
        let mut l = self.luns.write();
        l.remove(&id);
        l.len()
    }

    pub fn lun(&self, id: u64) -> Option<Arc<Lun>> {
        self.luns.read().get(&id).cloned()
    }

    pub fn lun_ids(&self) -> Vec<u64> {
        self.luns.read().keys().copied().collect()
    }

    pub(crate) fn for_each_lun(&self, f: impl Fn(&Lun)) {
        for l in self.luns.read().values() {
            f(l);
        }
    }

    /// Normal (non-discovery) sessions now logged in.
    pub fn sessions(&self) -> usize {
        self.sessions
            .lock()
            .by_tsih
            .values()
            .filter(|s| !s.discovery)
            .count()
    }

    pub fn is_stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    /// Ends every connection; `serve` loops return.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        for s in self.conns.lock().values() {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    pub(crate) fn register_conn(&self, s: &TcpStream) -> io::Result<u64> {
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        self.conns.lock().insert(id, s.try_clone()?);
        Ok(id)
    }

    pub(crate) fn unregister_conn(&self, id: u64) {
        self.conns.lock().remove(&id);
    }

    pub(crate) fn find_session(&self, tsih: u16) -> Option<Arc<Session>> {
        self.sessions.lock().by_tsih.get(&tsih).cloned()
    }

    /// A new session; an older one of the same initiator port (name and
    /// ISID) is reinstated, i.e. closed (§6.3.5 at ERL 0).
    pub(crate) fn new_session(
        &self,
        isid: [u8; 6],
        initiator: String,
        discovery: bool,
        params: Params,
        first_cmdsn: u32,
    ) -> Arc<Session> {
        let mut ss = self.sessions.lock();
        let old: Vec<u16> = ss
            .by_tsih
            .values()
            .filter(|s| s.isid == isid && s.initiator == initiator && s.discovery == discovery)
            .map(|s| s.tsih)
            .collect();
        for t in old {
            if let Some(s) = ss.by_tsih.remove(&t) {
                s.close();
                if !s.discovery {
                    self.for_each_lun(|l| l.nexus_lost(&s.nexus));
                }
            }
        }
        let tsih = loop {
            ss.next_tsih = ss.next_tsih.wrapping_add(1);
            if ss.next_tsih != 0 && !ss.by_tsih.contains_key(&ss.next_tsih) {
                break ss.next_tsih;
            }
        };
        let isid_hex: String = isid.iter().map(|b| format!("{b:02x}")).collect();
        let s = Arc::new(Session {
            tsih,
            isid,
            nexus: Nexus {
                initiator_port: format!("{initiator},i,0x{isid_hex}"),
                target_port_id: 1,
            },
            initiator,
            discovery,
            params,
            window: Mutex::new(CmdWindow::new(first_cmdsn)),
            conns: Mutex::new(HashMap::new()),
        });
        ss.by_tsih.insert(tsih, s.clone());
        s
    }

    /// A connection left `s`; the session ends with its last one.
    pub(crate) fn leave_session(&self, s: &Arc<Session>, cid: u16, stream: &TcpStream) {
        let empty = {
            let mut c = s.conns.lock();
            // Only if the CID is still this connection's (a reinstated
            // connection may have taken it).
            let mine = c.get(&cid).is_some_and(|st| {
                st.local_addr().ok() == stream.local_addr().ok()
                    && st.peer_addr().ok() == stream.peer_addr().ok()
            });
            if mine {
                c.remove(&cid);
            }
            c.is_empty()
        };
        if empty {
            self.forget(s);
        }
    }

    /// Ends a session: closes its connections and forgets it.
    pub(crate) fn end_session(&self, s: &Arc<Session>) {
        s.close();
        self.forget(s);
    }

    /// Removes `s` from the session table if it is still there (not
    /// replaced by a reinstatement), and tells the LUNs its nexus is gone.
    fn forget(&self, s: &Arc<Session>) {
        let mut ss = self.sessions.lock();
        if ss.by_tsih.get(&s.tsih).is_some_and(|x| Arc::ptr_eq(x, s)) {
            ss.by_tsih.remove(&s.tsih);
            drop(ss);
            if !s.discovery {
                self.for_each_lun(|l| l.nexus_lost(&s.nexus));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cmdsn_window() {
        let mut w = CmdWindow::new(u32::MAX - 1);
        assert!(w.accept(u32::MAX - 1));
        // A gap: 0 arrives before u32::MAX (another connection's).
        assert!(w.accept(0));
        assert_eq!(w.exp, u32::MAX);
        assert!(w.accept(u32::MAX));
        assert_eq!(w.exp, 1);
        // Duplicates and numbers past MaxCmdSN are dropped.
        assert!(!w.accept(0));
        assert!(!w.accept(w.max().wrapping_add(1)));
        assert!(w.awaited(w.max()));
        assert!(w.accept(w.max()));
        assert!(!w.awaited(0));
    }
}
