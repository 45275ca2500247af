//! Running a command and answering it: the CDB goes to its LUN (REPORT
//! LUNS and unknown LUNs to the target), and the [`Reply`] goes back as
//! Data-In PDUs and a status, with the residual the initiator is owed.

use std::sync::Arc;

use super::link::Link;
use crate::pdu::{op, Pdu, NO_TAG};
use crate::scsi::{self, Reply};
use crate::target::Session;

impl Link<'_> {
    pub(super) fn run_cdb(
        &self,
        sess: &Arc<Session>,
        lun: u64,
        cdb: &[u8],
        data_out: &[u8],
    ) -> Reply {
        // REPORT LUNS is the target's, on any LUN.
        if cdb[0] == 0xa0 {
            return scsi::report_luns(&self.target.lun_ids(), cdb);
        }
        match self.target.lun(lun) {
            Some(l) => l.execute(&sess.nexus, cdb, data_out),
            None => scsi::no_such_lun(cdb),
        }
    }

    /// Sends a finished command's Data-In and status.
    pub(super) fn respond(&mut self, itt: u32, reply: Reply, edtl: u32, r2ts: u32) {
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
