//! Write commands waiting for their Data-Out (§10.7, §10.8): immediate data,
//! unsolicited Data-Out up to FirstBurstLength, then R2Ts for the rest,
//! MaxBurstLength each and MaxOutstandingR2T at a time. A command runs
//! once all of its data is in.
//!
//! Data-Out is checked against its command first (offset and length within
//! the expected length, transfer tag, DataSN), then read from the socket
//! straight into the command's buffer at its offset: no copy in between,
//! no allocation per PDU.

use std::collections::HashMap;
use std::sync::Arc;

use super::link::{proto, Link, Result};
use crate::pdu::{op, reject, Header, Pdu, NO_TAG};
use crate::scsi;
use crate::target::Session;

/// A write command waiting for its Data-Out.
struct Pending {
    lun: u64,
    cdb: Vec<u8>,
    edtl: u32,
    /// The command's data, `edtl` bytes.
    buf: Vec<u8>,
    received: u32,
    /// Unsolicited data still allowed (before the first R2T).
    unsolicited_open: bool,
    unsolicited_end: u32,
    /// The next offset to ask for with an R2T.
    next_r2t: u32,
    outstanding: u32,
    r2tsn: u32,
    /// The R2Ts in flight.
    ttts: Vec<Sequence>,
    /// Where unsolicited Data-Out is at (its `ttt` is NO_TAG).
    unsolicited: Sequence,
}

/// One sequence of Data-Out: the unsolicited burst, or the answer to one
/// R2T. ramd negotiates DataPDUInOrder=Yes (§13.19): a sequence's PDUs come
/// at increasing offsets with no gap and no overlay, so `received` counts
/// each byte of the command once, and a command runs with all of its data.
#[derive(Clone, Copy)]
struct Sequence {
    ttt: u32,
    /// The DataSN and offset the next PDU must have.
    data_sn: u32,
    next: u32,
    /// Where the sequence ends: the R2T's offset + length, or the end of
    /// unsolicited data.
    end: u32,
}

impl Pending {
    /// Whether Data-Out `p` with `len` bytes of data fits this command, as
    /// the error that ends the connection if it does not.
    fn accepts(&self, p: &Pdu, len: u32) -> Result<()> {
        let ttt = p.u32(20);
        let off = p.u32(40);
        let end = off as u64 + len as u64;
        if end > self.edtl as u64 {
            return proto(format!(
                "Data-Out at {off}+{len} past the expected length {}",
                self.edtl
            ));
        }
        // DataSN counts a sequence's PDUs from 0 (§11.7.5): at ERL 0 a
        // gap or repeat is a lost PDU, which only a new connection fixes.
        let data_sn = p.u32(36);
        let seq = if ttt == NO_TAG {
            if !self.unsolicited_open {
                return proto("unsolicited Data-Out beyond FirstBurstLength");
            }
            &self.unsolicited
        } else {
            match self.ttts.iter().find(|s| s.ttt == ttt) {
                Some(s) => s,
                None => return proto(format!("Data-Out for unknown transfer tag {ttt:#x}")),
            }
        };
        if data_sn != seq.data_sn {
            return proto(format!(
                "Data-Out DataSN {data_sn}, expected {}",
                seq.data_sn
            ));
        }
        if off != seq.next || end > seq.end as u64 {
            return proto(format!(
                "Data-Out at {off}+{len}: its sequence takes offset {} up to {} in order",
                seq.next, seq.end
            ));
        }
        // The last PDU of an R2T's sequence ends it (the unsolicited burst
        // may end short of FirstBurstLength; R2Ts then ask for the rest).
        if ttt != NO_TAG && p.final_bit() && end != seq.end as u64 {
            return proto(format!(
                "Data-Out at {off}+{len} ends its R2T's sequence short of {}",
                seq.end
            ));
        }
        Ok(())
    }

    /// Counts accepted Data-Out `p` of `len` bytes, now in `buf`.
    fn took(&mut self, p: &Pdu, len: u32) {
        let ttt = p.u32(20);
        let seq = if ttt == NO_TAG {
            Some(&mut self.unsolicited)
        } else {
            self.ttts.iter_mut().find(|s| s.ttt == ttt)
        };
        if let Some(seq) = seq {
            seq.data_sn += 1;
            seq.next += len;
        }
        self.received += len;
        if p.final_bit() {
            if ttt == NO_TAG {
                self.unsolicited_open = false;
                // R2Ts ask for whatever the unsolicited burst left: it may
                // end short of FirstBurstLength (Data-Out is in order).
                self.next_r2t = self.received;
            } else {
                self.ttts.retain(|s| s.ttt != ttt);
                self.outstanding = self.outstanding.saturating_sub(1);
            }
        } else if ttt == NO_TAG && self.received >= self.unsolicited_end {
            self.unsolicited_open = false;
        }
    }
}

/// A connection's write commands waiting for Data-Out, by ITT.
pub(super) struct Pendings {
    by_itt: HashMap<u32, Pending>,
    next_ttt: u32,
}

impl Pendings {
    pub fn new() -> Pendings {
        Pendings {
            by_itt: HashMap::new(),
            next_ttt: 1,
        }
    }

    pub fn contains(&self, itt: u32) -> bool {
        self.by_itt.contains_key(&itt)
    }

    /// Drops a waiting command; false if there was none.
    pub fn abort(&mut self, itt: u32) -> bool {
        self.by_itt.remove(&itt).is_some()
    }

    /// Drops the commands waiting on `lun`.
    pub fn abort_lun(&mut self, lun: u64) {
        self.by_itt.retain(|_, pd| pd.lun != lun);
    }

    pub fn clear(&mut self) {
        self.by_itt.clear();
    }

    /// A write command of `edtl` bytes with its immediate data `imm`;
    /// `final_bit` clear announces unsolicited Data-Out.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        &mut self,
        link: &mut Link,
        sess: &Arc<Session>,
        itt: u32,
        lun: u64,
        cdb: Vec<u8>,
        edtl: u32,
        imm: Vec<u8>,
        final_bit: bool,
    ) {
        let received = imm.len() as u32;
        let mut buf = imm;
        buf.resize(edtl as usize, 0);
        // Unsolicited Data-Out follows when InitialR2T=No and F is clear,
        // up to FirstBurstLength.
        let unsolicited_open = !link.params.initial_r2t && !final_bit;
        let unsolicited_end = if unsolicited_open {
            link.params.first_burst.min(edtl)
        } else {
            received
        };
        let pend = Pending {
            lun,
            cdb,
            edtl,
            buf,
            received,
            unsolicited_open,
            unsolicited_end,
            next_r2t: unsolicited_end,
            outstanding: 0,
            r2tsn: 0,
            ttts: Vec::new(),
            unsolicited: Sequence {
                ttt: NO_TAG,
                data_sn: 0,
                next: received,
                end: unsolicited_end,
            },
        };
        self.by_itt.insert(itt, pend);
        self.progress(link, sess, itt);
    }

    /// After data arrived for `itt`: runs the command once all is in,
    /// else sends the R2Ts that may be outstanding.
    fn progress(&mut self, link: &mut Link, sess: &Arc<Session>, itt: u32) {
        let Some(pd) = self.by_itt.get_mut(&itt) else {
            return;
        };
        if pd.received >= pd.edtl {
            let pd = self.by_itt.remove(&itt).expect("present");
            let reply = link.run_cdb(sess, pd.lun, &pd.cdb, &pd.buf);
            link.respond(itt, reply, pd.edtl, pd.r2tsn);
            return;
        }
        if pd.unsolicited_open {
            return;
        }
        let max_burst = link.params.max_burst;
        let max_out = link.params.max_outstanding_r2t;
        while pd.outstanding < max_out && pd.next_r2t < pd.edtl {
            let len = (pd.edtl - pd.next_r2t).min(max_burst);
            let ttt = self.next_ttt;
            self.next_ttt = self.next_ttt.wrapping_add(1);
            if self.next_ttt == NO_TAG {
                self.next_ttt = 1;
            }
            let mut r = Pdu::new(op::R2T);
            r.bhs[1] = 0x80;
            r.bhs[8..16].copy_from_slice(&scsi::encode_lun(pd.lun));
            r.set_u32(16, itt);
            r.set_u32(20, ttt);
            r.set_u32(24, link.stat_sn);
            link.set_window(&mut r);
            r.set_u32(36, pd.r2tsn);
            r.set_u32(40, pd.next_r2t);
            r.set_u32(44, len);
            link.send(&r);
            pd.ttts.push(Sequence {
                ttt,
                data_sn: 0,
                next: pd.next_r2t,
                end: pd.next_r2t + len,
            });
            pd.next_r2t += len;
            pd.r2tsn += 1;
            pd.outstanding += 1;
        }
    }

    /// Data-Out read whole (see [`Pendings::data_out_direct`] for when).
    pub fn data_out(&mut self, link: &mut Link, sess: &Arc<Session>, p: Pdu) -> Result<()> {
        let itt = p.itt();
        let Some(pd) = self.by_itt.get_mut(&itt) else {
            // For a task that is gone (aborted, refused): dropped.
            return Ok(());
        };
        let len = p.data.len() as u32;
        pd.accepts(&p, len)?;
        let off = p.u32(40) as usize;
        pd.buf[off..off + p.data.len()].copy_from_slice(&p.data);
        pd.took(&p, len);
        self.progress(link, sess, itt);
        Ok(())
    }

    /// Data-Out whose header `h` fits a command waiting for it: its data is
    /// read straight into the command's buffer, and `None` comes back. Any
    /// other PDU comes back unread, to be read whole and handled as ever
    /// (Data-Out for no task is dropped, a misfit one ends the connection,
    /// a damaged one is rejected first).
    pub fn data_out_direct(&mut self, link: &mut Link, h: Header) -> Result<Option<Header>> {
        let p = &h.pdu;
        if p.opcode() != op::DATA_OUT {
            return Ok(Some(h));
        }
        let Some(sess) = link.session.clone().filter(|s| !s.discovery) else {
            return Ok(Some(h));
        };
        let itt = p.itt();
        let Some(pd) = self.by_itt.get_mut(&itt) else {
            return Ok(Some(h));
        };
        // The header's length is at most MaxRecvDataSegmentLength (< 2^24).
        let len = h.dlen as u32;
        if pd.accepts(p, len).is_err() {
            return Ok(Some(h));
        }
        // In bounds: accepts() checked off + len <= edtl, the buffer's size.
        let off = p.u32(40) as usize;
        let lim = link.limits();
        let sound = h.read_data_into(&mut link.reader, &lim, &mut pd.buf[off..off + h.dlen])?;
        if !sound {
            // ERL 0: the command is lost; the initiator hears of it.
            link.reject(p, reject::DATA_DIGEST);
            self.by_itt.remove(&itt);
            return Ok(None);
        }
        pd.took(p, len);
        self.progress(link, &sess, itt);
        Ok(None)
    }
}
