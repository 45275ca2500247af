//! The login phase of a connection (§6): security negotiation with CHAP
//! (one-way or mutual), operational negotiation, and making a session or
//! joining one (a new connection of a session, or a reinstated one).

use std::io;

use md5::{Digest, Md5};

use super::link::{proto, Link, Result, MAX_TEXT};
use crate::params::{negotiate, OUR_MRDSL};
use crate::pdu::{self, op, read_pdu, Pdu};
use crate::target::CMD_WINDOW;

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

impl Link<'_> {
    /// Runs the login phase; false if it ended without a session.
    pub(super) fn login(&mut self) -> Result<bool> {
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
        let (exp, max) = window.unwrap_or((cmdsn, cmdsn.wrapping_add(CMD_WINDOW - 1)));
        r.set_u32(28, exp);
        r.set_u32(32, max);
        r.data = pdu::encode_text(answers);
        r.encode_into(&mut self.out, false, false);
    }
}

enum Step {
    More,
    Failed,
    Done,
}

#[cfg(test)]
mod tests {
    use super::*;

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
