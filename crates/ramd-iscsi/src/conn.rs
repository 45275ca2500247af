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
//!
//! This file holds the connection's loop and the full feature phase's
//! dispatch; the parts, bottom up: [`link`] (socket, buffers, StatSN,
//! parameters, rejects), [`command`] (running a CDB, Data-In and status),
//! [`pending`] (writes waiting for Data-Out, R2T), [`task`] (task
//! management), [`text`] (text requests) and [`login`].

mod command;
mod link;
mod login;
mod pending;
mod task;
mod text;

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

pub use link::decode_lun;
use link::{Link, Result};
use pending::Pendings;

use crate::pdu::{op, read_header, reject, Pdu, PduError, NO_TAG};
use crate::scsi::{self, Reply};
use crate::target::{Session, Target};

/// The largest write command whose data is collected (its buffer is
/// allocated from the initiator's expected length).
const MAX_WRITE: u32 = 64 * 1024 * 1024;
/// Output is sent once this much is buffered, even with input pending.
const OUT_FLUSH: usize = 512 * 1024;

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
        match Link::new(target, stream, portal) {
            Ok(link) => {
                let mut c = Conn {
                    link,
                    pending: Pendings::new(),
                    text: None,
                };
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

struct Conn<'t> {
    link: Link<'t>,
    pending: Pendings,
    /// A continued text request's pairs so far, by ITT.
    text: Option<(u32, Vec<u8>)>,
}

impl Conn<'_> {
    fn leave(&mut self) {
        let l = &mut self.link;
        let _ = l.flush();
        if let Some(s) = l.session.take() {
            l.target.leave_session(&s, l.cid, &l.stream);
        }
    }

    fn run(&mut self) -> Result<()> {
        if !self.link.login()? {
            return Ok(());
        }
        loop {
            if self.link.reader.buffer().is_empty() || self.link.out.len() >= OUT_FLUSH {
                self.link.flush()?;
            }
            let lim = self.link.limits();
            let h = match read_header(&mut self.link.reader, &lim) {
                Ok(Some(h)) => h,
                Ok(None) => return Ok(()),
                Err(e) => {
                    let _ = self.link.flush();
                    return Err(e.into());
                }
            };
            // Data-Out for a waiting write goes straight into its buffer.
            let h = match self.pending.data_out_direct(&mut self.link, h) {
                Ok(Some(h)) => h,
                Ok(None) => continue,
                Err(e) => {
                    let _ = self.link.flush();
                    return Err(e);
                }
            };
            let p = match h.read_data(&mut self.link.reader, &lim) {
                Ok(p) => p,
                Err(PduError::DataDigest(p)) => {
                    // ERL 0: the command is lost; the initiator hears of it.
                    self.link.reject(&p, reject::DATA_DIGEST);
                    if p.opcode() == op::DATA_OUT {
                        self.pending.abort(p.itt());
                    }
                    continue;
                }
                Err(e) => {
                    let _ = self.link.flush();
                    return Err(e.into());
                }
            };
            if !self.full_feature(p)? {
                self.link.flush()?;
                return Ok(());
            }
        }
    }
}

// The full feature phase.
impl Conn<'_> {
    /// Handles one PDU; false when the connection is to close (logout).
    fn full_feature(&mut self, p: Pdu) -> Result<bool> {
        let sess = self.link.session.clone().expect("logged in");
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
            self.link.reject(&p, reject::PROTOCOL_ERROR);
            return Ok(true);
        }
        match opcode {
            op::NOP_OUT => self.nop_out(p),
            op::SCSI_CMD => self.scsi_command(&sess, p),
            op::DATA_OUT => self.pending.data_out(&mut self.link, &sess, p)?,
            op::TMF_REQ => self.link.task_management(&mut self.pending, &sess, p),
            op::TEXT_REQ => self.link.text_request(&mut self.text, &sess, p),
            op::LOGOUT_REQ => return Ok(self.logout(&sess, p)),
            op::LOGIN_REQ => {
                self.link.reject(&p, reject::PROTOCOL_ERROR);
            }
            op::SNACK => self.link.reject(&p, reject::PROTOCOL_ERROR),
            _ => self.link.reject(&p, reject::NOT_SUPPORTED),
        }
        Ok(true)
    }

    fn nop_out(&mut self, p: Pdu) {
        if p.itt() == NO_TAG {
            // A ping answering ours, or one that wants no answer.
            return;
        }
        let l = &mut self.link;
        let mut r = Pdu::new(op::NOP_IN);
        r.bhs[1] = 0x80;
        r.bhs[8..16].copy_from_slice(&p.bhs[8..16]);
        r.set_u32(16, p.itt());
        r.set_u32(20, NO_TAG);
        l.set_stat(&mut r);
        l.set_window(&mut r);
        // Ping data comes back (it fits: ours is no larger than theirs
        // would need to be, else cut to their limit).
        let mut d = p.data;
        d.truncate(l.params.initiator_mrdsl as usize);
        r.data = d;
        l.send(&r);
    }

    fn scsi_command(&mut self, sess: &Arc<Session>, p: Pdu) {
        let l = &mut self.link;
        let flags = p.flags();
        let write = flags & 0x20 != 0;
        let edtl = p.u32(20);
        let itt = p.itt();
        let lun = decode_lun(p.lun_field());
        let mut cdb = p.bhs[32..48].to_vec();
        if let Some(ext) = p.extended_cdb() {
            cdb.extend_from_slice(ext);
        }
        if !p.data.is_empty() && (!write || !l.params.immediate_data) {
            l.reject(&p, reject::PROTOCOL_ERROR);
            return;
        }
        if p.data.len() as u64 > edtl as u64 || p.data.len() as u32 > l.params.first_burst {
            l.reject(&p, reject::PROTOCOL_ERROR);
            return;
        }
        if !write || edtl == 0 {
            let reply = l.run_cdb(sess, lun, &cdb, &[]);
            l.respond(itt, reply, edtl, 0);
            return;
        }
        if edtl > MAX_WRITE {
            // Refused before any data is collected; Data-Out for it is
            // dropped as being for no task.
            let reply = Reply::check(scsi::sense::invalid_cdb(0, None));
            l.respond(itt, reply, edtl, 0);
            return;
        }
        if self.pending.contains(itt) {
            l.reject(&p, reject::PROTOCOL_ERROR);
            return;
        }
        let final_bit = flags & 0x80 != 0;
        self.pending
            .start(l, sess, itt, lun, cdb, edtl, p.data, final_bit);
    }

    fn logout(&mut self, sess: &Arc<Session>, p: Pdu) -> bool {
        let l = &mut self.link;
        let reason = p.flags() & 0x7f;
        let cid = u16::from_be_bytes([p.bhs[20], p.bhs[21]]);
        let response = match reason {
            0 => 0,
            1 if cid == l.cid => 0,
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
        l.send_response(op::LOGOUT_RESP, response, p.itt());
        let _ = l.flush();
        if reason == 0 && response == 0 {
            l.target.end_session(sess);
            return false;
        }
        !(reason == 1 && cid == l.cid && response == 0)
    }
}
