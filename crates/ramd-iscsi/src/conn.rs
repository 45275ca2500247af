//! One iSCSI connection: login (security and operational negotiation, CHAP,
//! joining or making a session), then the full feature phase: SCSI commands
//! with their Data-Out (immediate, unsolicited, solicited by R2T), Data-In,
//! responses, task management, NOP, text and logout.
//!
//! A connection is one thread that reads PDUs through a buffer, runs each
//! command to completion on the store (memory-speed: a 4 KiB command takes
//! microseconds), and appends the answers to an output buffer that is sent
//! when no more input is buffered: at queue depth 32 one read and one write
//! system call carry many commands, which is where the time goes. Several
//! connections (sessions, or MC/S) run in parallel.

use std::collections::HashMap;
use std::io::{self, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use md5::{Digest, Md5};

use crate::params::{negotiate, Params, OUR_MRDSL};
use crate::pdu::{self, op, read_pdu, reject, Limits, Pdu, PduError, NO_TAG};
use crate::scsi::{self, Reply};
use crate::target::{Session, Target};

/// During login, before MaxRecvDataSegmentLength is negotiated.
const LOGIN_MAX_DATA: usize = 8192;
/// Text across continued login or text PDUs, at most.
const MAX_TEXT: usize = 64 * 1024;
/// The largest write command whose data is collected (its buffer is
/// allocated from the initiator's expected length).
const MAX_WRITE: u32 = 64 * 1024 * 1024;
/// Output is sent once this much is buffered, even with input pending.
const OUT_FLUSH: usize = 512 * 1024;

/// Login status (class, detail): §11.13.5.
mod login_status {
    pub const AUTH_FAILED: (u8, u8) = (2, 1);
    pub const NOT_FOUND: (u8, u8) = (2, 3);
    pub const UNSUPPORTED_VERSION: (u8, u8) = (2, 5);
    pub const TOO_MANY_CONNECTIONS: (u8, u8) = (2, 6);
    pub const MISSING_PARAMETER: (u8, u8) = (2, 7);
    pub const NO_SESSION: (u8, u8) = (2, 10);
    pub const INITIATOR_ERROR: (u8, u8) = (2, 0);
}

/// Serves one accepted connection until it ends.
pub fn serve(target: &Arc<Target>, stream: TcpStream, portal: SocketAddr) {
    let peer = stream
        .peer_addr()
        .map_or_else(|_| "?".to_string(), |a| a.to_string());
    let id = match target.register_conn(&stream) {
        Ok(id) => id,
        Err(e) => {
            log::warn!("iSCSI {peer}: {e}");
            return;
        }
    };
    if !target.is_stopping() {
        let _ = stream.set_nodelay(true);
        match Conn::new(target, stream, portal) {
            Ok(mut c) => {
                match c.run() {
                    Ok(()) => log::debug!("iSCSI {peer}: closed"),
                    Err(e) => log::info!("iSCSI {peer}: connection dropped: {e}"),
                }
                c.leave();
            }
            Err(e) => log::warn!("iSCSI {peer}: {e}"),
        }
    }
    target.unregister_conn(id);
}

#[derive(Debug, thiserror::Error)]
enum ConnError {
    // transparent: the inner message once, not once more as a source.
    #[error(transparent)]
    Pdu(#[from] PduError),
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("protocol error: {0}")]
    Protocol(String),
}

type Result<T> = std::result::Result<T, ConnError>;

fn proto<T>(msg: impl Into<String>) -> Result<T> {
    Err(ConnError::Protocol(msg.into()))
}

/// A write command waiting for its Data-Out.
struct Pending {
    lun: u64,
    cdb: Vec<u8>,
    edtl: u32,
    buf: Vec<u8>,
    received: u32,
    /// Unsolicited data still allowed (before the first R2T).
    unsolicited_open: bool,
    unsolicited_end: u32,
    /// The next offset to ask for with an R2T.
    next_r2t: u32,
    outstanding: u32,
    r2tsn: u32,
    /// The R2Ts in flight: target transfer tag, next DataSN expected.
    ttts: Vec<(u32, u32)>,
    /// The next DataSN of unsolicited Data-Out.
    unsolicited_sn: u32,
}

#[derive(Default)]
struct Login {
    started: bool,
    isid: [u8; 6],
    tsih: u16,
    cid: u16,
    initiator: Option<String>,
    target_ok: bool,
    discovery: bool,
    stage: u8,
    auth: Auth,
    declared_mrdsl: bool,
    sent_tpgt: bool,
    text: Vec<u8>,
}

#[derive(Default, PartialEq, Eq)]
enum Auth {
    /// AuthMethod not negotiated yet.
    #[default]
    Start,
    None,
    ChapOffered,
    Challenged {
        id: u8,
        challenge: [u8; 16],
    },
    Done,
}

struct Conn<'t> {
    target: &'t Arc<Target>,
    stream: TcpStream,
    reader: BufReader<TcpStream>,
    out: Vec<u8>,
    portal: SocketAddr,
    stat_sn: u32,
    params: Params,
    session: Option<Arc<Session>>,
    cid: u16,
    pending: HashMap<u32, Pending>,
    next_ttt: u32,
    /// A continued text request's pairs so far, by ITT.
    text: Option<(u32, Vec<u8>)>,
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 + b.len() * 2);
    s.push_str("0x");
    for x in b {
        s.push_str(&format!("{x:02x}"));
    }
    s
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    let h = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
    if h.is_empty() || h.len() > 2048 {
        return None;
    }
    // An odd count has an implied leading zero.
    let h = if h.len() % 2 == 1 {
        format!("0{h}")
    } else {
        h.to_string()
    };
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok())
        .collect()
}

fn chap_response(id: u8, secret: &str, challenge: &[u8]) -> Vec<u8> {
    let mut m = Md5::new();
    m.update([id]);
    m.update(secret.as_bytes());
    m.update(challenge);
    m.finalize().to_vec()
}

/// The LUN number in a LUN field; `u64::MAX` (no LUN) for addressing
/// methods the target does not use.
pub fn decode_lun(field: u64) -> u64 {
    scsi::decode_lun(field.to_be_bytes()).unwrap_or(u64::MAX)
}

impl<'t> Conn<'t> {
    fn new(target: &'t Arc<Target>, stream: TcpStream, portal: SocketAddr) -> io::Result<Self> {
        let reader = BufReader::with_capacity(256 * 1024, stream.try_clone()?);
        Ok(Conn {
            target,
            stream,
            reader,
            out: Vec::with_capacity(256 * 1024),
            portal,
            stat_sn: 0,
            params: Params::default(),
            session: None,
            cid: 0,
            pending: HashMap::new(),
            next_ttt: 1,
            text: None,
        })
    }

    fn leave(&mut self) {
        let _ = self.flush();
        if let Some(s) = self.session.take() {
            self.target.leave_session(&s, self.cid, &self.stream);
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            let r = self.stream.write_all(&self.out);
            self.out.clear();
            r?;
        }
        Ok(())
    }

    fn limits(&self) -> Limits {
        if self.session.is_none() {
            Limits {
                max_data: LOGIN_MAX_DATA,
                header_digest: false,
                data_digest: false,
                login_only: true,
            }
        } else {
            Limits {
                max_data: self.params.target_mrdsl as usize,
                header_digest: self.params.header_digest,
                data_digest: self.params.data_digest,
                login_only: false,
            }
        }
    }

    fn send(&mut self, p: &Pdu) {
        let (h, d) = if self.session.is_some() {
            (self.params.header_digest, self.params.data_digest)
        } else {
            (false, false)
        };
        p.encode_into(&mut self.out, h, d);
    }

    /// ExpCmdSN and MaxCmdSN into a response's bytes 28..36.
    fn set_window(&self, p: &mut Pdu) {
        if let Some(s) = &self.session {
            let w = s.window.lock();
            p.set_u32(28, w.exp);
            p.set_u32(32, w.max());
        }
    }

    /// StatSN into bytes 24..28, consuming it.
    fn set_stat(&mut self, p: &mut Pdu) {
        p.set_u32(24, self.stat_sn);
        self.stat_sn = self.stat_sn.wrapping_add(1);
    }

    /// Sends a Task Management or Logout Response: `response` in byte 2,
    /// final bit set, the task's ITT, StatSN and the command window.
    fn send_response(&mut self, opcode: u8, response: u8, itt: u32) {
        let mut r = Pdu::new(opcode);
        r.bhs[1] = 0x80;
        r.bhs[2] = response;
        r.set_u32(16, itt);
        self.set_stat(&mut r);
        self.set_window(&mut r);
        self.send(&r);
    }

    fn run(&mut self) -> Result<()> {
        if !self.login()? {
            return Ok(());
        }
        loop {
            if self.reader.buffer().is_empty() || self.out.len() >= OUT_FLUSH {
                self.flush()?;
            }
            let lim = self.limits();
            let p = match read_pdu(&mut self.reader, &lim) {
                Ok(Some(p)) => p,
                Ok(None) => return Ok(()),
                Err(PduError::DataDigest(p)) => {
                    // ERL 0: the command is lost; the initiator hears of it.
                    self.reject(&p, reject::DATA_DIGEST);
                    if p.opcode() == op::DATA_OUT {
                        self.pending.remove(&p.itt());
                    }
                    continue;
                }
                Err(e) => {
                    let _ = self.flush();
                    return Err(e.into());
                }
            };
            if !self.full_feature(p)? {
                self.flush()?;
                return Ok(());
            }
        }
    }

    fn reject(&mut self, bad: &Pdu, reason: u8) {
        let mut r = Pdu::new(op::REJECT);
        r.bhs[1] = 0x80;
        r.bhs[2] = reason;
        r.set_u32(16, NO_TAG);
        self.set_stat(&mut r);
        self.set_window(&mut r);
        r.data = bad.bhs.to_vec();
        self.send(&r);
    }

    // ---- login ----

    /// Runs the login phase; false if it ended without a session.
    fn login(&mut self) -> Result<bool> {
        let mut st = Login::default();
        loop {
            let lim = self.limits();
            let p = match read_pdu(&mut self.reader, &lim)? {
                Some(p) => p,
                None => return Ok(false),
            };
            if p.opcode() != op::LOGIN_REQ {
                // Nothing but a login before login (§6.1).
                return proto(format!("opcode {:#04x} before login", p.opcode()));
            }
            match self.login_step(&mut st, &p)? {
                Step::More => {}
                Step::Failed => {
                    self.flush()?;
                    return Ok(false);
                }
                Step::Done => {
                    self.flush()?;
                    return Ok(true);
                }
            }
            self.flush()?;
        }
    }

    fn login_fail(&mut self, req: &Pdu, st: &Login, (class, detail): (u8, u8)) -> Step {
        let mut r = Pdu::new(op::LOGIN_RESP);
        r.bhs[8..14].copy_from_slice(&st.isid);
        r.set_u32(16, req.itt());
        r.set_u32(24, self.stat_sn);
        let cmdsn = req.u32(24);
        r.set_u32(28, cmdsn);
        r.set_u32(32, cmdsn);
        r.bhs[36] = class;
        r.bhs[37] = detail;
        self.out.clear();
        r.encode_into(&mut self.out, false, false);
        Step::Failed
    }

    fn login_step(&mut self, st: &mut Login, p: &Pdu) -> Result<Step> {
        let flags = p.flags();
        let transit = flags & 0x80 != 0;
        let cont = flags & 0x40 != 0;
        let csg = (flags >> 2) & 3;
        let nsg = flags & 3;
        let isid: [u8; 6] = p.bhs[8..14].try_into().expect("6 bytes");
        let tsih = u16::from_be_bytes([p.bhs[14], p.bhs[15]]);
        if !st.started {
            st.started = true;
            st.isid = isid;
            st.tsih = tsih;
            st.cid = u16::from_be_bytes([p.bhs[20], p.bhs[21]]);
            st.stage = csg;
            // Version-min above ours (0).
            if p.bhs[3] > 0 {
                return Ok(self.login_fail(p, st, login_status::UNSUPPORTED_VERSION));
            }
        } else if isid != st.isid || tsih != st.tsih || csg != st.stage {
            return Ok(self.login_fail(p, st, login_status::INITIATOR_ERROR));
        }
        if csg == 2 || (transit && (nsg == 2 || nsg <= csg)) || (transit && cont) {
            return Ok(self.login_fail(p, st, login_status::INITIATOR_ERROR));
        }
        st.text.extend_from_slice(&p.data);
        if st.text.len() > MAX_TEXT {
            return Ok(self.login_fail(p, st, login_status::INITIATOR_ERROR));
        }
        let mut answers: Vec<(String, String)> = Vec::new();
        if cont {
            // More text follows: answer empty, stay.
            self.login_response(p, st, false, 0, &answers, None);
            return Ok(Step::More);
        }
        let pairs = pdu::parse_text(&std::mem::take(&mut st.text));
        let leading = tsih == 0;
        let mut chap_n = None;
        let mut chap_r = None;
        let mut chap_i = None;
        let mut chap_c = None;
        for (k, v) in &pairs {
            match k.as_str() {
                "" => return Ok(self.login_fail(p, st, login_status::INITIATOR_ERROR)),
                "InitiatorName" => st.initiator = Some(v.clone()),
                "InitiatorAlias" => {}
                "TargetName" => {
                    if *v != self.target.cfg.name {
                        return Ok(self.login_fail(p, st, login_status::NOT_FOUND));
                    }
                    st.target_ok = true;
                }
                "SessionType" => match v.as_str() {
                    "Discovery" => st.discovery = true,
                    "Normal" => st.discovery = false,
                    _ => answers.push((k.clone(), "Reject".into())),
                },
                "AuthMethod" => {
                    let want_chap = self.target.cfg.chap.is_some();
                    let pick = v.split(',').find(|m| {
                        if want_chap {
                            *m == "CHAP"
                        } else {
                            *m == "None"
                        }
                    });
                    match pick {
                        Some(m) => {
                            st.auth = if m == "CHAP" {
                                Auth::ChapOffered
                            } else {
                                Auth::None
                            };
                            answers.push((k.clone(), m.to_string()));
                        }
                        None => {
                            return Ok(self.login_fail(p, st, login_status::AUTH_FAILED));
                        }
                    }
                }
                "CHAP_A" => {
                    if st.auth != Auth::ChapOffered || !v.split(',').any(|a| a == "5") {
                        return Ok(self.login_fail(p, st, login_status::AUTH_FAILED));
                    }
                    let mut rnd = [0u8; 17];
                    getrandom::getrandom(&mut rnd)
                        .map_err(|e| io::Error::other(format!("getrandom: {e}")))?;
                    let challenge: [u8; 16] = rnd[1..].try_into().expect("16 bytes");
                    st.auth = Auth::Challenged {
                        id: rnd[0],
                        challenge,
                    };
                    answers.push(("CHAP_A".into(), "5".into()));
                    answers.push(("CHAP_I".into(), rnd[0].to_string()));
                    answers.push(("CHAP_C".into(), hex(&challenge)));
                }
                "CHAP_N" => chap_n = Some(v.clone()),
                "CHAP_R" => chap_r = Some(v.clone()),
                "CHAP_I" => chap_i = Some(v.clone()),
                "CHAP_C" => chap_c = Some(v.clone()),
                "TargetAlias" | "TargetAddress" | "TargetPortalGroupTag" => {
                    // Target-declared keys the initiator may not send.
                    answers.push((k.clone(), "Reject".into()));
                }
                _ => match negotiate(&mut self.params, k, v, leading) {
                    Some(a) => {
                        if k == "MaxRecvDataSegmentLength" {
                            st.declared_mrdsl = true;
                        }
                        answers.push((k.clone(), a));
                    }
                    None => answers.push((k.clone(), "NotUnderstood".into())),
                },
            }
        }
        if chap_n.is_some() || chap_r.is_some() {
            let Auth::Challenged { id, challenge } = st.auth else {
                return Ok(self.login_fail(p, st, login_status::AUTH_FAILED));
            };
            let Some(chap) = &self.target.cfg.chap else {
                return Ok(self.login_fail(p, st, login_status::AUTH_FAILED));
            };
            let want = chap_response(id, &chap.secret, &challenge);
            let ok = chap_n.as_deref() == Some(chap.user.as_str())
                && chap_r.as_deref().and_then(unhex).as_deref() == Some(&want[..]);
            if !ok {
                log::warn!(
                    "iSCSI: CHAP authentication failed for {:?}",
                    st.initiator.as_deref().unwrap_or("?")
                );
                return Ok(self.login_fail(p, st, login_status::AUTH_FAILED));
            }
            if let (Some(i), Some(c)) = (&chap_i, &chap_c) {
                // Mutual CHAP: ramd proves itself in turn.
                let (Some(m), Ok(i), Some(c)) =
                    (&self.target.cfg.mutual_chap, i.parse::<u8>(), unhex(c))
                else {
                    return Ok(self.login_fail(p, st, login_status::AUTH_FAILED));
                };
                // A challenge that reflects ours would let the initiator
                // replay our own answer.
                if c[..] == challenge[..] || c.len() < 8 {
                    return Ok(self.login_fail(p, st, login_status::AUTH_FAILED));
                }
                answers.push(("CHAP_N".into(), m.user.clone()));
                answers.push(("CHAP_R".into(), hex(&chap_response(i, &m.secret, &c))));
            }
            st.auth = Auth::Done;
        } else if chap_i.is_some() || chap_c.is_some() {
            return Ok(self.login_fail(p, st, login_status::AUTH_FAILED));
        }
        let Some(initiator) = st.initiator.clone() else {
            return Ok(self.login_fail(p, st, login_status::MISSING_PARAMETER));
        };
        if !st.discovery && !st.target_ok && (transit && nsg == 3 || !st.sent_tpgt) {
            // A normal session names its target in the first request.
            if pairs.iter().all(|(k, _)| k != "TargetName") && !st.target_ok {
                return Ok(self.login_fail(p, st, login_status::MISSING_PARAMETER));
            }
        }
        if !st.discovery && !st.sent_tpgt {
            answers.push(("TargetPortalGroupTag".into(), "1".into()));
            if !self.target.cfg.alias.is_empty() {
                answers.push(("TargetAlias".into(), self.target.cfg.alias.clone()));
            }
            st.sent_tpgt = true;
        }
        let chap_required = self.target.cfg.chap.is_some();
        let mut go = transit;
        if csg == 0 && transit {
            let authed = match st.auth {
                Auth::Done => true,
                Auth::None => !chap_required,
                // AuthMethod never offered: only fine without CHAP.
                Auth::Start => !chap_required,
                // Mid-exchange: stay in the security stage.
                Auth::ChapOffered | Auth::Challenged { .. } => {
                    go = false;
                    true
                }
            };
            if !authed {
                return Ok(self.login_fail(p, st, login_status::AUTH_FAILED));
            }
        }
        if csg == 1 && chap_required && st.auth != Auth::Done {
            // Skipping the security stage when CHAP is required.
            return Ok(self.login_fail(p, st, login_status::AUTH_FAILED));
        }
        if csg == 1 && !st.declared_mrdsl {
            // Declarative: ramd states what it receives, in the operational
            // stage (operational keys have no place in the security one).
            answers.push(("MaxRecvDataSegmentLength".into(), OUR_MRDSL.to_string()));
            st.declared_mrdsl = true;
        }
        if go && nsg == 3 {
            if !st.declared_mrdsl {
                answers.push(("MaxRecvDataSegmentLength".into(), OUR_MRDSL.to_string()));
            }
            // Full feature phase: make or join the session.
            let cmdsn = p.u32(24);
            if tsih == 0 {
                let mut params = self.params.clone();
                params.target_mrdsl = OUR_MRDSL;
                let s = self
                    .target
                    .new_session(isid, initiator, st.discovery, params, cmdsn);
                st.tsih = s.tsih;
                s.conns.lock().insert(st.cid, self.stream.try_clone()?);
                self.session = Some(s);
            } else {
                let s = match self.target.find_session(tsih) {
                    Some(s) if s.isid == isid && s.initiator == initiator && !s.discovery => s,
                    _ => return Ok(self.login_fail(p, st, login_status::NO_SESSION)),
                };
                {
                    let mut c = s.conns.lock();
                    if let Some(old) = c.remove(&st.cid) {
                        // Connection reinstatement.
                        let _ = old.shutdown(std::net::Shutdown::Both);
                    }
                    if c.len() as u32 >= s.params.max_connections {
                        return Ok(self.login_fail(p, st, login_status::TOO_MANY_CONNECTIONS));
                    }
                    c.insert(st.cid, self.stream.try_clone()?);
                }
                // Session-wide values are the leading connection's.
                let mut params = s.params.clone();
                params.header_digest = self.params.header_digest;
                params.data_digest = self.params.data_digest;
                params.initiator_mrdsl = self.params.initiator_mrdsl;
                self.session = Some(s);
                self.params = params;
            }
            self.params.target_mrdsl = OUR_MRDSL;
            self.cid = st.cid;
            // The response goes out without digests: they start after it.
            let window = self.session.as_ref().map(|s| {
                let w = s.window.lock();
                (w.exp, w.max())
            });
            self.login_response(p, st, true, 3, &answers, window);
            return Ok(Step::Done);
        }
        if go {
            st.stage = nsg;
        }
        self.login_response(p, st, go, nsg, &answers, None);
        Ok(Step::More)
    }

    fn login_response(
        &mut self,
        req: &Pdu,
        st: &Login,
        transit: bool,
        nsg: u8,
        answers: &[(String, String)],
        window: Option<(u32, u32)>,
    ) {
        let mut r = Pdu::new(op::LOGIN_RESP);
        let csg = (req.flags() >> 2) & 3;
        r.bhs[1] = (csg << 2) | if transit { 0x80 | nsg } else { 0 };
        r.bhs[8..14].copy_from_slice(&st.isid);
        r.bhs[14..16].copy_from_slice(&st.tsih.to_be_bytes());
        r.set_u32(16, req.itt());
        r.set_u32(24, self.stat_sn);
        self.stat_sn = self.stat_sn.wrapping_add(1);
        let cmdsn = req.u32(24);
        let (exp, max) =
            window.unwrap_or((cmdsn, cmdsn.wrapping_add(crate::target::CMD_WINDOW - 1)));
        r.set_u32(28, exp);
        r.set_u32(32, max);
        r.data = pdu::encode_text(answers);
        r.encode_into(&mut self.out, false, false);
    }

    // ---- full feature phase ----

    /// Handles one PDU; false when the connection is to close (logout).
    fn full_feature(&mut self, p: Pdu) -> Result<bool> {
        let sess = self.session.clone().expect("logged in");
        let opcode = p.opcode();
        // CmdSN of initiator requests other than Data-Out and SNACK.
        if matches!(
            opcode,
            op::NOP_OUT | op::SCSI_CMD | op::TMF_REQ | op::TEXT_REQ | op::LOGOUT_REQ
        ) && !p.immediate()
            && (opcode != op::NOP_OUT || p.itt() != NO_TAG)
            && !sess.window.lock().accept(p.u32(24))
        {
            log::debug!("iSCSI: dropping CmdSN {} outside the window", p.u32(24));
            return Ok(true);
        }
        if sess.discovery && !matches!(opcode, op::TEXT_REQ | op::LOGOUT_REQ | op::NOP_OUT) {
            self.reject(&p, reject::PROTOCOL_ERROR);
            return Ok(true);
        }
        match opcode {
            op::NOP_OUT => self.nop_out(p),
            op::SCSI_CMD => self.scsi_command(&sess, p)?,
            op::DATA_OUT => self.data_out(&sess, p)?,
            op::TMF_REQ => self.task_management(&sess, p),
            op::TEXT_REQ => self.text_request(&sess, p),
            op::LOGOUT_REQ => return Ok(self.logout(&sess, p)),
            op::LOGIN_REQ => {
                self.reject(&p, reject::PROTOCOL_ERROR);
            }
            op::SNACK => self.reject(&p, reject::PROTOCOL_ERROR),
            _ => self.reject(&p, reject::NOT_SUPPORTED),
        }
        Ok(true)
    }

    fn nop_out(&mut self, p: Pdu) {
        if p.itt() == NO_TAG {
            // A ping answering ours, or one that wants no answer.
            return;
        }
        let mut r = Pdu::new(op::NOP_IN);
        r.bhs[1] = 0x80;
        r.bhs[8..16].copy_from_slice(&p.bhs[8..16]);
        r.set_u32(16, p.itt());
        r.set_u32(20, NO_TAG);
        self.set_stat(&mut r);
        self.set_window(&mut r);
        // Ping data comes back (it fits: ours is no larger than theirs
        // would need to be, else cut to their limit).
        let mut d = p.data;
        d.truncate(self.params.initiator_mrdsl as usize);
        r.data = d;
        self.send(&r);
    }

    fn scsi_command(&mut self, sess: &Arc<Session>, p: Pdu) -> Result<()> {
        let flags = p.flags();
        let write = flags & 0x20 != 0;
        let edtl = p.u32(20);
        let itt = p.itt();
        let lun = decode_lun(p.lun_field());
        let mut cdb = p.bhs[32..48].to_vec();
        if let Some(ext) = p.extended_cdb() {
            cdb.extend_from_slice(ext);
        }
        if !p.data.is_empty() && (!write || !self.params.immediate_data) {
            self.reject(&p, reject::PROTOCOL_ERROR);
            return Ok(());
        }
        if p.data.len() as u64 > edtl as u64 || p.data.len() as u32 > self.params.first_burst {
            self.reject(&p, reject::PROTOCOL_ERROR);
            return Ok(());
        }
        if !write || edtl == 0 {
            self.execute(sess, itt, lun, &cdb, &[], edtl, p.u32(24));
            return Ok(());
        }
        if edtl > MAX_WRITE {
            // Refused before any data is collected; Data-Out for it is
            // dropped as being for no task.
            let reply = Reply::check(scsi::sense::invalid_cdb(0, None));
            self.respond(itt, reply, edtl, 0);
            return Ok(());
        }
        if self.pending.contains_key(&itt) {
            self.reject(&p, reject::PROTOCOL_ERROR);
            return Ok(());
        }
        let imm = p.data.len() as u32;
        let mut buf = p.data;
        buf.resize(edtl as usize, 0);
        // Unsolicited Data-Out follows when InitialR2T=No and F is clear,
        // up to FirstBurstLength.
        let unsolicited_open = !self.params.initial_r2t && flags & 0x80 == 0;
        let unsolicited_end = if unsolicited_open {
            self.params.first_burst.min(edtl)
        } else {
            imm
        };
        let pend = Pending {
            lun,
            cdb,
            edtl,
            buf,
            received: imm,
            unsolicited_open,
            unsolicited_end,
            next_r2t: unsolicited_end,
            outstanding: 0,
            r2tsn: 0,
            ttts: Vec::new(),
            unsolicited_sn: 0,
        };
        self.pending.insert(itt, pend);
        self.progress(sess, itt);
        Ok(())
    }

    /// After data arrived for `itt`: runs the command once all is in,
    /// else sends the R2Ts that may be outstanding.
    fn progress(&mut self, sess: &Arc<Session>, itt: u32) {
        let Some(pd) = self.pending.get_mut(&itt) else {
            return;
        };
        if pd.received >= pd.edtl {
            let pd = self.pending.remove(&itt).expect("present");
            let r2ts = pd.r2tsn;
            self.execute_write(sess, itt, pd, r2ts);
            return;
        }
        if pd.unsolicited_open {
            return;
        }
        let max_burst = self.params.max_burst;
        let max_out = self.params.max_outstanding_r2t;
        let mut r2ts = Vec::new();
        while pd.outstanding < max_out && pd.next_r2t < pd.edtl {
            let len = (pd.edtl - pd.next_r2t).min(max_burst);
            let ttt = self.next_ttt;
            self.next_ttt = self.next_ttt.wrapping_add(1);
            if self.next_ttt == NO_TAG {
                self.next_ttt = 1;
            }
            r2ts.push((ttt, pd.next_r2t, len, pd.r2tsn, pd.lun));
            pd.ttts.push((ttt, 0));
            pd.next_r2t += len;
            pd.r2tsn += 1;
            pd.outstanding += 1;
        }
        for (ttt, off, len, sn, _lun) in r2ts {
            let mut r = Pdu::new(op::R2T);
            r.bhs[1] = 0x80;
            r.bhs[8..16].copy_from_slice(&scsi::encode_lun(self.pending_lun(itt)));
            r.set_u32(16, itt);
            r.set_u32(20, ttt);
            r.set_u32(24, self.stat_sn);
            self.set_window(&mut r);
            r.set_u32(36, sn);
            r.set_u32(40, off);
            r.set_u32(44, len);
            self.send(&r);
        }
    }

    fn pending_lun(&self, itt: u32) -> u64 {
        self.pending.get(&itt).map_or(0, |p| p.lun)
    }

    fn data_out(&mut self, sess: &Arc<Session>, p: Pdu) -> Result<()> {
        let itt = p.itt();
        let ttt = p.u32(20);
        let off = p.u32(40);
        let Some(pd) = self.pending.get_mut(&itt) else {
            // For a task that is gone (aborted, refused): dropped.
            return Ok(());
        };
        let len = p.data.len() as u32;
        let end = off as u64 + len as u64;
        if end > pd.edtl as u64 {
            return proto(format!(
                "Data-Out at {off}+{len} past the expected length {}",
                pd.edtl
            ));
        }
        // DataSN counts a sequence's PDUs from 0 (§11.7.5): at ERL 0 a
        // gap or repeat is a lost PDU, which only a new connection fixes.
        let data_sn = p.u32(36);
        let want = if ttt == NO_TAG {
            if !pd.unsolicited_open || end > pd.unsolicited_end as u64 {
                return proto("unsolicited Data-Out beyond FirstBurstLength");
            }
            &mut pd.unsolicited_sn
        } else {
            match pd.ttts.iter_mut().find(|(t, _)| *t == ttt) {
                Some((_, sn)) => sn,
                None => return proto(format!("Data-Out for unknown transfer tag {ttt:#x}")),
            }
        };
        if data_sn != *want {
            return proto(format!("Data-Out DataSN {data_sn}, expected {want}"));
        }
        *want += 1;
        pd.buf[off as usize..end as usize].copy_from_slice(&p.data);
        pd.received += len;
        if p.final_bit() {
            if ttt == NO_TAG {
                pd.unsolicited_open = false;
                // R2Ts ask for whatever the unsolicited burst left: it may
                // end short of FirstBurstLength (Data-Out is in order).
                pd.next_r2t = pd.received;
            } else {
                pd.ttts.retain(|(t, _)| *t != ttt);
                pd.outstanding = pd.outstanding.saturating_sub(1);
            }
        } else if ttt == NO_TAG && pd.received >= pd.unsolicited_end {
            pd.unsolicited_open = false;
        }
        self.progress(sess, itt);
        Ok(())
    }

    fn execute_write(&mut self, sess: &Arc<Session>, itt: u32, pd: Pending, r2ts: u32) {
        let reply = self.run_cdb(sess, pd.lun, &pd.cdb, &pd.buf);
        self.respond(itt, reply, pd.edtl, r2ts);
    }

    fn run_cdb(&self, sess: &Arc<Session>, lun: u64, cdb: &[u8], data_out: &[u8]) -> Reply {
        // REPORT LUNS is the target's, on any LUN.
        if cdb[0] == 0xa0 {
            return scsi::report_luns(&self.target.lun_ids(), cdb);
        }
        match self.target.lun(lun) {
            Some(l) => l.execute(&sess.nexus, cdb, data_out),
            None => scsi::no_such_lun(cdb),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn execute(
        &mut self,
        sess: &Arc<Session>,
        itt: u32,
        lun: u64,
        cdb: &[u8],
        data_out: &[u8],
        edtl: u32,
        _cmdsn: u32,
    ) {
        let reply = self.run_cdb(sess, lun, cdb, data_out);
        self.respond(itt, reply, edtl, 0);
    }

    /// Sends a finished command's Data-In and status.
    fn respond(&mut self, itt: u32, reply: Reply, edtl: u32, r2ts: u32) {
        // Residual: what the command moved against what the initiator
        // expected.
        let actual = if reply.expected_out > 0 {
            reply.expected_out as u64
        } else {
            reply.data_in.len() as u64
        };
        let (flags, residual) = match actual.cmp(&(edtl as u64)) {
            std::cmp::Ordering::Greater => (0x04u8, (actual - edtl as u64).min(u32::MAX as u64)),
            std::cmp::Ordering::Less => (0x02u8, edtl as u64 - actual),
            std::cmp::Ordering::Equal => (0, 0),
        };
        let residual = residual as u32;
        let n = reply.data_in.len().min(edtl as usize);
        let data = &reply.data_in[..n];
        let status_in_data = reply.sense.is_empty() && n > 0;
        let seg = (self.params.initiator_mrdsl.min(self.params.max_burst) as usize).max(512);
        let burst = self.params.max_burst as usize;
        let mut data_sn = 0u32;
        let mut off = 0usize;
        while off < n {
            let len = seg.min(n - off).min(burst - off % burst);
            let last = off + len == n;
            let mut d = Pdu::new(op::DATA_IN);
            let mut f = 0u8;
            if last || (off + len).is_multiple_of(burst) {
                f |= 0x80;
            }
            if last && status_in_data {
                f |= 0x01 | flags;
                d.bhs[3] = reply.status;
                d.set_u32(24, self.stat_sn);
                self.stat_sn = self.stat_sn.wrapping_add(1);
                d.set_u32(44, residual);
            }
            d.bhs[1] = f;
            d.set_u32(16, itt);
            d.set_u32(20, NO_TAG);
            self.set_window(&mut d);
            d.set_u32(36, data_sn);
            d.set_u32(40, off as u32);
            let (h, dd) = (self.params.header_digest, self.params.data_digest);
            encode_data_in(&mut self.out, &d, &data[off..off + len], h, dd);
            data_sn += 1;
            off += len;
        }
        if status_in_data {
            return;
        }
        let mut r = Pdu::new(op::SCSI_RESP);
        r.bhs[1] = 0x80 | flags;
        r.bhs[2] = 0; // command completed at target
        r.bhs[3] = reply.status;
        r.set_u32(16, itt);
        self.set_stat(&mut r);
        self.set_window(&mut r);
        r.set_u32(36, data_sn + r2ts);
        r.set_u32(44, residual);
        if !reply.sense.is_empty() {
            let mut d = Vec::with_capacity(2 + reply.sense.len());
            d.extend_from_slice(&(reply.sense.len() as u16).to_be_bytes());
            d.extend_from_slice(&reply.sense);
            r.data = d;
        }
        self.send(&r);
    }

    fn task_management(&mut self, sess: &Arc<Session>, p: Pdu) {
        let function = p.flags() & 0x7f;
        let lun = decode_lun(p.lun_field());
        let rtt = p.u32(20);
        let response: u8 = match function {
            // ABORT TASK: only a task waiting for Data-Out still exists
            // here (the others ran to completion as they arrived).
            1 => {
                if self.pending.remove(&rtt).is_some() {
                    0
                } else if sess.window.lock().awaited(p.u32(32)) {
                    // Numbered but not arrived yet (another connection's):
                    // it counts as received and aborted (§11.5.1).
                    0
                } else {
                    // Done before the abort came: the initiator has or
                    // will have its status.
                    1
                }
            }
            // ABORT TASK SET, CLEAR TASK SET.
            2 | 4 => {
                self.pending.retain(|_, pd| pd.lun != lun);
                if self.target.lun(lun).is_some() {
                    0
                } else {
                    2
                }
            }
            // LOGICAL UNIT RESET.
            5 => match self.target.lun(lun) {
                Some(l) => {
                    self.pending.retain(|_, pd| pd.lun != lun);
                    l.reset();
                    0
                }
                None => 2,
            },
            // TARGET WARM RESET.
            6 => {
                self.pending.clear();
                self.target.for_each_lun(|l| l.reset());
                0
            }
            // TASK REASSIGN needs ERL 2.
            8 => 4,
            // CLEAR ACA, TARGET COLD RESET and the rest.
            _ => 5,
        };
        self.send_response(op::TMF_RESP, response, p.itt());
    }

    fn text_request(&mut self, sess: &Arc<Session>, p: Pdu) {
        let itt = p.itt();
        let cont = p.flags() & 0x40 != 0;
        let mut text = match self.text.take() {
            Some((t, buf)) if t == itt => buf,
            _ => Vec::new(),
        };
        text.extend_from_slice(&p.data);
        if text.len() > MAX_TEXT {
            self.reject(&p, reject::PROTOCOL_ERROR);
            return;
        }
        let mut answers = Vec::new();
        if cont {
            self.text = Some((itt, text));
        } else {
            for (k, v) in pdu::parse_text(&text) {
                match k.as_str() {
                    "SendTargets" => {
                        let all = v == "All" && sess.discovery;
                        let this = v.is_empty() && !sess.discovery;
                        if all || this || v == self.target.cfg.name {
                            answers.push(("TargetName".to_string(), self.target.cfg.name.clone()));
                            let mut addr = self.portal;
                            if addr.ip().is_unspecified() {
                                if let Ok(a) = self.stream.local_addr() {
                                    addr = a;
                                }
                            }
                            answers.push(("TargetAddress".into(), format!("{addr},1")));
                        }
                    }
                    "" => answers.push((v, "Reject".into())),
                    _ => {
                        // Renegotiation in the full feature phase: only
                        // what a connection may change.
                        if k == "MaxRecvDataSegmentLength" {
                            if let Some(a) = negotiate(&mut self.params, &k, &v, false) {
                                answers.push((k, a));
                            }
                        } else {
                            answers.push((k, "NotUnderstood".into()));
                        }
                    }
                }
            }
        }
        let mut r = Pdu::new(op::TEXT_RESP);
        if cont {
            r.bhs[1] = 0;
            r.set_u32(20, 1);
        } else {
            r.bhs[1] = 0x80;
            r.set_u32(20, NO_TAG);
        }
        r.bhs[8..16].copy_from_slice(&p.bhs[8..16]);
        r.set_u32(16, itt);
        self.set_stat(&mut r);
        self.set_window(&mut r);
        let mut data = pdu::encode_text(&answers);
        data.truncate(self.params.initiator_mrdsl as usize);
        r.data = data;
        self.send(&r);
    }

    fn logout(&mut self, sess: &Arc<Session>, p: Pdu) -> bool {
        let reason = p.flags() & 0x7f;
        let cid = u16::from_be_bytes([p.bhs[20], p.bhs[21]]);
        let response = match reason {
            0 => 0,
            1 if cid == self.cid => 0,
            1 => {
                // Another connection of the session.
                match sess.conns.lock().get(&cid) {
                    Some(s) => {
                        let _ = s.shutdown(std::net::Shutdown::Both);
                        0
                    }
                    None => 1,
                }
            }
            // Removing a connection for recovery needs ERL 2.
            _ => 2,
        };
        self.send_response(op::LOGOUT_RESP, response, p.itt());
        let _ = self.flush();
        if reason == 0 && response == 0 {
            self.target.end_session(sess);
            return false;
        }
        !(reason == 1 && cid == self.cid && response == 0)
    }
}

enum Step {
    More,
    Failed,
    Done,
}

/// A Data-In PDU whose data is a slice of the reply (no copy into a PDU
/// first).
fn encode_data_in(out: &mut Vec<u8>, d: &Pdu, data: &[u8], hd: bool, dd: bool) {
    let mut bhs = d.bhs;
    let dlen = data.len() as u32;
    bhs[5..8].copy_from_slice(&dlen.to_be_bytes()[1..]);
    out.extend_from_slice(&bhs);
    if hd {
        out.extend_from_slice(&crc32c::crc32c(&bhs).to_le_bytes());
    }
    let start = out.len();
    out.extend_from_slice(data);
    out.resize(out.len() + (4 - data.len() % 4) % 4, 0);
    if dd && !data.is_empty() {
        let crc = crc32c::crc32c(&out[start..]);
        out.extend_from_slice(&crc.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lun_addressing() {
        assert_eq!(decode_lun(0), 0);
        assert_eq!(decode_lun(0x0001_0000_0000_0000), 1);
        // Flat space addressing of LUN 300.
        assert_eq!(decode_lun(0x412c_0000_0000_0000), 300);
        // Two levels: not ours.
        assert_eq!(decode_lun(0x0001_0001_0000_0000), u64::MAX);
    }

    #[test]
    fn chap_md5() {
        // RFC 1994: MD5(id || secret || challenge).
        let r = chap_response(1, "secret", &[0u8; 16]);
        assert_eq!(r.len(), 16);
        assert_eq!(unhex(&hex(&r)).unwrap(), r);
        assert_eq!(unhex("0xabc").unwrap(), vec![0x0a, 0xbc]);
        assert!(unhex("abc").is_none());
        assert!(unhex("0xzz").is_none());
    }
}
