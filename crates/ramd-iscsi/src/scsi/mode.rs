//! MODE SENSE(6/10): the caching, control and informational exceptions
//! pages. Nothing is changeable (there is no MODE SELECT) and nothing is
//! saved.

use super::sense::{self, invalid_cdb};
use super::{be16, Lun, Outcome, Reply};

/// The pages, ascending (page 3Fh returns them in this order).
const PAGES: [u8; 3] = [0x08, 0x0A, 0x1C];

/// Page control: current, changeable, default, saved.
const CHANGEABLE: u8 = 1;
const SAVED: u8 = 3;

impl Lun {
    pub(super) fn mode_sense(&self, c: &[u8]) -> Outcome {
        let ten = c[0] == 0x5A;
        let dbd = c[1] & 0x08 != 0;
        let llbaa = ten && c[1] & 0x10 != 0;
        let pc = c[2] >> 6;
        let page = c[2] & 0x3F;
        let subpage = c[3];
        let alloc = if ten {
            usize::from(be16(&c[7..]))
        } else {
            usize::from(c[4])
        };
        if pc == SAVED {
            return Err(sense::SAVING_NOT_SUPPORTED);
        }
        let mut pages = Vec::new();
        match (page, subpage) {
            // All pages; with subpage FFh all subpages too (there are none).
            (0x3F, 0x00 | 0xFF) => {
                for p in PAGES {
                    self.mode_page(p, pc, &mut pages);
                }
            }
            (p, 0x00) if PAGES.contains(&p) => self.mode_page(p, pc, &mut pages),
            (p, _) if p == 0x3F || PAGES.contains(&p) => return Err(invalid_cdb(3, None)),
            _ => return Err(invalid_cdb(2, Some(5))),
        }
        let mut desc = Vec::new();
        if !dbd {
            let bs = self.block_size() as u32;
            if llbaa {
                desc.extend_from_slice(&self.blocks.to_be_bytes());
                desc.extend_from_slice(&[0; 4]);
                desc.extend_from_slice(&bs.to_be_bytes());
            } else {
                let n = self.blocks.min(0xFFFF_FFFF) as u32;
                desc.extend_from_slice(&n.to_be_bytes());
                desc.extend_from_slice(&bs.to_be_bytes()); // byte 4 (density) is 0
            }
        }
        // WP for a read-only disk; DPOFUA: DPO and FUA are accepted.
        let device_specific = if self.cfg.read_only || self.store.standby() {
            0x80
        } else {
            0
        } | 0x10;
        let mut d = Vec::with_capacity(8 + desc.len() + pages.len());
        if ten {
            let len = (6 + desc.len() + pages.len()) as u16;
            d.extend_from_slice(&len.to_be_bytes());
            d.extend_from_slice(&[0, device_specific, u8::from(llbaa), 0]);
            d.extend_from_slice(&(desc.len() as u16).to_be_bytes());
        } else {
            let len = (3 + desc.len() + pages.len()).min(255) as u8;
            d.extend_from_slice(&[len, 0, device_specific, desc.len() as u8]);
        }
        d.extend_from_slice(&desc);
        d.extend_from_slice(&pages);
        Ok(Reply::good(d, alloc))
    }

    fn mode_page(&self, page: u8, pc: u8, out: &mut Vec<u8>) {
        let len: usize = match page {
            0x08 => 0x12,
            _ => 0x0A,
        };
        let start = out.len();
        out.resize(start + 2 + len, 0);
        let p = &mut out[start..];
        p[0] = page;
        p[1] = len as u8;
        if pc == CHANGEABLE {
            return;
        }
        match page {
            // Caching: WCE when writes are durable only after a flush.
            0x08 if self.cfg.write_cache => p[2] = 0x04,
            // Control: unrestricted reordering (QUEUE ALGORITHM MODIFIER 1);
            // fixed-format sense (D_SENSE 0).
            0x0A => p[3] = 0x10,
            // Informational exceptions: none to report (DEXCPT).
            0x1C => p[2] = 0x08,
            _ => {}
        }
    }
}
