//! INQUIRY: standard data and the vital product data pages.

use super::sense::invalid_cdb;
use super::{be16, Lun, Outcome, Reply};
use super::{
    MAX_COMPARE_AND_WRITE, MAX_TRANSFER_BYTES, MAX_UNMAP_BLOCKS, MAX_UNMAP_DESCRIPTORS,
    MAX_WRITE_SAME_BYTES, PAGE,
};

pub const VENDOR: &str = "RAMD";

/// The pages INQUIRY with EVPD answers, ascending (page 00h lists them).
const PAGES: [u8; 6] = [0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2];

/// Version descriptors: SAM-5, iSCSI, SPC-4, SBC-3.
const VERSIONS: [u16; 4] = [0x00A0, 0x0960, 0x0460, 0x04C0];

/// `s` as a fixed-width SCSI ASCII field: printable characters only,
/// space padded, cut to `width`.
fn ascii(s: &str, width: usize) -> Vec<u8> {
    let mut out: Vec<u8> = s
        .bytes()
        .map(|b| if (0x20..0x7F).contains(&b) { b } else { b' ' })
        .take(width)
        .collect();
    out.resize(width, b' ');
    out
}

impl Lun {
    pub(super) fn inquiry(&self, c: &[u8], port: u16) -> Outcome {
        let alloc = usize::from(be16(&c[3..]));
        if c[1] & 0xFE != 0 {
            // CMDDT (obsolete) and reserved bits.
            return Err(invalid_cdb(1, None));
        }
        let data = if c[1] & 0x01 == 0 {
            if c[2] != 0 {
                return Err(invalid_cdb(2, None));
            }
            self.standard_inquiry()
        } else {
            self.vpd(c[2], port)?
        };
        Ok(Reply::good(data, alloc))
    }

    fn standard_inquiry(&self) -> Vec<u8> {
        let mut d = vec![0u8; 96];
        d[0] = 0x00; // connected, direct access block device
        d[2] = 0x06; // SPC-4
        d[3] = 0x10 | 0x02; // HISUP, response data format 2
        d[4] = (d.len() - 5) as u8;
        d[7] = 0x02; // CMDQUE
        d[8..16].copy_from_slice(&ascii(VENDOR, 8));
        d[16..32].copy_from_slice(&ascii(&self.cfg.product, 16));
        let mut version = env!("CARGO_PKG_VERSION").split('.');
        let rev = format!(
            "{}.{}",
            version.next().unwrap_or("0"),
            version.next().unwrap_or("0")
        );
        d[32..36].copy_from_slice(&ascii(&rev, 4));
        for (i, v) in VERSIONS.iter().enumerate() {
            d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
        }
        d
    }

    fn vpd(&self, page: u8, port: u16) -> Result<Vec<u8>, super::sense::Sense> {
        let mut d = vec![0x00, page, 0, 0];
        match page {
            0x00 => d.extend_from_slice(&PAGES),
            0x80 => d.extend_from_slice(&ascii(&self.cfg.serial, self.cfg.serial.len().min(250))),
            0x83 => self.device_id(&mut d, port),
            0xB0 => self.block_limits(&mut d),
            0xB1 => {
                // Block device characteristics: non-rotating medium.
                d.resize(64, 0);
                d[4..6].copy_from_slice(&1u16.to_be_bytes());
            }
            0xB2 => {
                // Logical block provisioning: LBPU, LBPWS, LBPWS10, LBPRZ;
                // thin provisioned.
                d.extend_from_slice(&[0, 0x80 | 0x40 | 0x20 | 0x04, 0x02, 0]);
            }
            _ => return Err(invalid_cdb(2, None)),
        }
        let len = (d.len() - 4) as u16;
        d[2..4].copy_from_slice(&len.to_be_bytes());
        Ok(d)
    }

    /// Page 83h: NAA locally assigned (from the disk's id), a T10 vendor
    /// id, and the relative target port.
    fn device_id(&self, d: &mut Vec<u8>, port: u16) {
        let naa = (0x3u64 << 60) | (self.cfg.id & 0x0FFF_FFFF_FFFF_FFFF);
        // Binary code set, association LU, type NAA.
        d.extend_from_slice(&[0x01, 0x03, 0, 8]);
        d.extend_from_slice(&naa.to_be_bytes());
        // ASCII, association LU, type T10 vendor id.
        let t10 = [
            ascii(VENDOR, 8),
            format!("{:016x}", self.cfg.id).into_bytes(),
        ]
        .concat();
        d.extend_from_slice(&[0x02, 0x01, 0, t10.len() as u8]);
        d.extend_from_slice(&t10);
        // iSCSI, PIV, association target port, relative target port.
        d.extend_from_slice(&[0x51, 0x94, 0, 4, 0, 0]);
        d.extend_from_slice(&port.to_be_bytes());
    }

    /// Page B0h: the limits in logical blocks.
    fn block_limits(&self, d: &mut Vec<u8>) {
        let blocks = |bytes: u64| (bytes >> self.shift).min(u64::from(u32::MAX)) as u32;
        d.resize(64, 0);
        d[5] = MAX_COMPARE_AND_WRITE;
        let gran = (PAGE >> self.shift) as u16;
        d[6..8].copy_from_slice(&gran.to_be_bytes());
        d[8..12].copy_from_slice(&blocks(MAX_TRANSFER_BYTES).to_be_bytes());
        d[12..16].copy_from_slice(&blocks(MAX_TRANSFER_BYTES).to_be_bytes());
        d[20..24].copy_from_slice(&MAX_UNMAP_BLOCKS.to_be_bytes());
        d[24..28].copy_from_slice(&MAX_UNMAP_DESCRIPTORS.to_be_bytes());
        d[28..32].copy_from_slice(&u32::from(gran).to_be_bytes());
        d[32..36].copy_from_slice(&0x8000_0000u32.to_be_bytes()); // UGAVALID, alignment 0
        d[36..44].copy_from_slice(&u64::from(blocks(MAX_WRITE_SAME_BYTES)).to_be_bytes());
    }
}
