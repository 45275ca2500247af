//! What every phase of a connection shares: its socket, the buffered input
//! and output, StatSN, the negotiated parameters and the session once there
//! is one; and the PDUs any phase may send (rejects, responses carrying the
//! command window).

use std::io::{self, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use crate::params::Params;
use crate::pdu::{op, Limits, Pdu, PduError, NO_TAG};
use crate::scsi;
use crate::target::{Session, Target};

/// During login, before MaxRecvDataSegmentLength is negotiated.
const LOGIN_MAX_DATA: usize = 8192;
/// Text across continued login or text PDUs, at most.
pub(super) const MAX_TEXT: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub(super) enum ConnError {
    // transparent: the inner message once, not once more as a source.
    #[error(transparent)]
    Pdu(#[from] PduError),
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error("protocol error: {0}")]
    Protocol(String),
}

pub(super) type Result<T> = std::result::Result<T, ConnError>;

pub(super) fn proto<T>(msg: impl Into<String>) -> Result<T> {
    Err(ConnError::Protocol(msg.into()))
}

/// The LUN number in a LUN field; `u64::MAX` (no LUN) for addressing
/// methods the target does not use.
pub fn decode_lun(field: u64) -> u64 {
    scsi::decode_lun(field.to_be_bytes()).unwrap_or(u64::MAX)
}

pub(super) struct Link<'t> {
    pub target: &'t Arc<Target>,
    pub stream: TcpStream,
    pub reader: BufReader<TcpStream>,
    pub out: Vec<u8>,
    pub portal: SocketAddr,
    pub stat_sn: u32,
    pub params: Params,
    pub session: Option<Arc<Session>>,
    pub cid: u16,
}

impl<'t> Link<'t> {
    pub fn new(target: &'t Arc<Target>, stream: TcpStream, portal: SocketAddr) -> io::Result<Self> {
        let reader = BufReader::with_capacity(256 * 1024, stream.try_clone()?);
        Ok(Link {
            target,
            stream,
            reader,
            out: Vec::with_capacity(256 * 1024),
            portal,
            stat_sn: 0,
            params: Params::default(),
            session: None,
            cid: 0,
        })
    }

    pub fn flush(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            let r = self.stream.write_all(&self.out);
            self.out.clear();
            r?;
        }
        Ok(())
    }

    pub fn limits(&self) -> Limits {
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

    pub fn send(&mut self, p: &Pdu) {
        let (h, d) = if self.session.is_some() {
            (self.params.header_digest, self.params.data_digest)
        } else {
            (false, false)
        };
        p.encode_into(&mut self.out, h, d);
    }

    /// ExpCmdSN and MaxCmdSN into a response's bytes 28..36.
    pub fn set_window(&self, p: &mut Pdu) {
        if let Some(s) = &self.session {
            let w = s.window.lock();
            p.set_u32(28, w.exp);
            p.set_u32(32, w.max());
        }
    }

    /// StatSN into bytes 24..28, consuming it.
    pub fn set_stat(&mut self, p: &mut Pdu) {
        p.set_u32(24, self.stat_sn);
        self.stat_sn = self.stat_sn.wrapping_add(1);
    }

    /// Sends a Task Management or Logout Response: `response` in byte 2,
    /// final bit set, the task's ITT, StatSN and the command window.
    pub fn send_response(&mut self, opcode: u8, response: u8, itt: u32) {
        let mut r = Pdu::new(opcode);
        r.bhs[1] = 0x80;
        r.bhs[2] = response;
        r.set_u32(16, itt);
        self.set_stat(&mut r);
        self.set_window(&mut r);
        self.send(&r);
    }

    pub fn reject(&mut self, bad: &Pdu, reason: u8) {
        let mut r = Pdu::new(op::REJECT);
        r.bhs[1] = 0x80;
        r.bhs[2] = reason;
        r.set_u32(16, NO_TAG);
        self.set_stat(&mut r);
        self.set_window(&mut r);
        r.data = bad.bhs.to_vec();
        self.send(&r);
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
}
