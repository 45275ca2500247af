//! Every command the logical unit supports, with its CDB usage data
//! (REPORT SUPPORTED OPERATION CODES) and how reservations treat it.

/// How a command fares when another I_T nexus holds a reservation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Never conflicts (INQUIRY, REQUEST SENSE, REPORT LUNS, RSOC).
    Info,
    /// PERSISTENT RESERVE IN/OUT: their own rules under persistent
    /// reservations; conflicts with another nexus's RESERVE(6/10).
    Pr,
    /// Allowed under persistent reservations (TEST UNIT READY, READ
    /// CAPACITY), conflicts with another nexus's RESERVE(6/10).
    Meta,
    /// Reads the medium.
    Read,
    /// Changes the medium (or its cache).
    Write,
    /// RESERVE/RELEASE(6/10): decided by the command itself.
    Legacy,
}

/// One supported command.
pub struct Op {
    pub opcode: u8,
    /// The service action, for opcodes that have them.
    pub sa: Option<u16>,
    /// CDB USAGE DATA: byte 0 is the opcode, the rest the bits the device
    /// server looks at (so its length is the CDB's).
    pub usage: &'static [u8],
    pub access: Access,
}

const fn op(opcode: u8, usage: &'static [u8], access: Access) -> Op {
    Op {
        opcode,
        sa: None,
        usage,
        access,
    }
}

const fn sa(opcode: u8, sa: u16, usage: &'static [u8], access: Access) -> Op {
    Op {
        opcode,
        sa: Some(sa),
        usage,
        access,
    }
}

use Access::*;

/// Sorted by opcode, then service action.
#[rustfmt::skip]
pub static OPS: &[Op] = &[
    op(0x00, &[0x00, 0, 0, 0, 0, 0], Meta), // TEST UNIT READY
    op(0x03, &[0x03, 0, 0, 0, 0xFF, 0], Info), // REQUEST SENSE
    op(0x08, &[0x08, 0x1F, 0xFF, 0xFF, 0xFF, 0], Read), // READ(6)
    op(0x0A, &[0x0A, 0x1F, 0xFF, 0xFF, 0xFF, 0], Write), // WRITE(6)
    op(0x12, &[0x12, 0x01, 0xFF, 0xFF, 0xFF, 0], Info), // INQUIRY
    op(0x16, &[0x16, 0, 0, 0, 0, 0], Legacy), // RESERVE(6)
    op(0x17, &[0x17, 0, 0, 0, 0, 0], Legacy), // RELEASE(6)
    op(0x1A, &[0x1A, 0x08, 0xFF, 0xFF, 0xFF, 0], Read), // MODE SENSE(6)
    op(0x1B, &[0x1B, 0x01, 0, 0x0F, 0xF7, 0], Write), // START STOP UNIT
    op(0x25, &[0x25, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0x01, 0], Meta), // READ CAPACITY(10)
    op(0x28, &[0x28, 0x1E, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0], Read), // READ(10)
    op(0x2A, &[0x2A, 0x1A, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0], Write), // WRITE(10)
    op(0x2E, &[0x2E, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0], Write), // WRITE AND VERIFY(10)
    op(0x2F, &[0x2F, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0], Read), // VERIFY(10)
    op(0x34, &[0x34, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0], Read), // PRE-FETCH(10)
    op(0x35, &[0x35, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0], Write), // SYNCHRONIZE CACHE(10)
    op(0x41, &[0x41, 0x08, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0xFF, 0xFF, 0], Write), // WRITE SAME(10)
    op(0x42, &[0x42, 0, 0, 0, 0, 0, 0x1F, 0xFF, 0xFF, 0], Write), // UNMAP
    op(0x56, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, 0], Legacy), // RESERVE(10)
    op(0x57, &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0], Legacy), // RELEASE(10)
    op(0x5A, &[0x5A, 0x18, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0], Read), // MODE SENSE(10)
    sa(0x5E, 0x00, &[0x5E, 0x1F, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0], Pr), // PR IN: READ KEYS
    sa(0x5E, 0x01, &[0x5E, 0x1F, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0], Pr), // READ RESERVATION
    sa(0x5E, 0x02, &[0x5E, 0x1F, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0], Pr), // REPORT CAPABILITIES
    sa(0x5E, 0x03, &[0x5E, 0x1F, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0], Pr), // READ FULL STATUS
    sa(0x5F, 0x00, &[0x5F, 0x1F, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0], Pr), // PR OUT: REGISTER
    sa(0x5F, 0x01, &[0x5F, 0x1F, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0], Pr), // RESERVE
    sa(0x5F, 0x02, &[0x5F, 0x1F, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0], Pr), // RELEASE
    sa(0x5F, 0x03, &[0x5F, 0x1F, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0], Pr), // CLEAR
    sa(0x5F, 0x04, &[0x5F, 0x1F, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0], Pr), // PREEMPT
    sa(0x5F, 0x05, &[0x5F, 0x1F, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0], Pr), // PREEMPT AND ABORT
    sa(0x5F, 0x06, &[0x5F, 0x1F, 0xFF, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0], Pr), // REGISTER AND IGNORE EXISTING KEY
    op(0x88, &[0x88, 0x1E, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0], Read), // READ(16)
    op(0x89, &[0x89, 0x18, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0xFF, 0x1F, 0], Write), // COMPARE AND WRITE
    op(0x8A, &[0x8A, 0x1A, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0], Write), // WRITE(16)
    op(0x8E, &[0x8E, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0], Write), // WRITE AND VERIFY(16)
    op(0x8F, &[0x8F, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0], Read), // VERIFY(16)
    op(0x90, &[0x90, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0], Read), // PRE-FETCH(16)
    op(0x91, &[0x91, 0x02, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0], Write), // SYNCHRONIZE CACHE(16)
    op(0x93, &[0x93, 0x09, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0], Write), // WRITE SAME(16)
    sa(0x9E, 0x10, &[0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0], Meta), // READ CAPACITY(16)
    sa(0x9E, 0x12, &[0x9E, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0], Read), // GET LBA STATUS
    op(0xA0, &[0xA0, 0, 0xFF, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0], Info), // REPORT LUNS (the target's)
    sa(0xA3, 0x0C, &[0xA3, 0x0C, 0x87, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0, 0], Info), // REPORT SUPPORTED OPERATION CODES
    op(0xA8, &[0xA8, 0x1E, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0], Read), // READ(12)
    op(0xAA, &[0xAA, 0x1A, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0], Write), // WRITE(12)
    op(0xAE, &[0xAE, 0x12, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0], Write), // WRITE AND VERIFY(12)
    op(0xAF, &[0xAF, 0x16, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x1F, 0], Read), // VERIFY(12)
];

/// Whether `opcode` has service actions (and where the CDB keeps it).
pub fn has_service_action(opcode: u8) -> bool {
    OPS.iter().any(|o| o.opcode == opcode && o.sa.is_some())
}

/// The entry for a CDB: its opcode and, where the opcode has them, its
/// service action (byte 1, bits 4-0).
pub fn lookup(cdb: &[u8]) -> Option<&'static Op> {
    let opcode = *cdb.first()?;
    let sa = cdb.get(1).map(|b| u16::from(b & 0x1F));
    // Every command passes here: a binary search, not a scan.
    let first = OPS.partition_point(|o| o.opcode < opcode);
    OPS[first..]
        .iter()
        .take_while(|o| o.opcode == opcode)
        .find(|o| o.sa.is_none() || o.sa == sa)
}

/// The length of a CDB with this opcode, from its group code.
pub fn cdb_len(opcode: u8) -> usize {
    match opcode >> 5 {
        0 => 6,
        1 | 2 => 10,
        4 => 16,
        5 => 12,
        _ => 16,
    }
}

/// REPORT SUPPORTED OPERATION CODES (MAINTENANCE IN, service action 0Ch).
pub fn report(cdb: &[u8]) -> Result<Vec<u8>, super::sense::Sense> {
    use super::sense::invalid_cdb;
    let rctd = cdb[2] & 0x80 != 0;
    let options = cdb[2] & 0x07;
    let req_op = cdb[3];
    let req_sa = u16::from_be_bytes([cdb[4], cdb[5]]);
    // Nominal and recommended timeouts (seconds) when RCTD asks for them.
    let timeout = |out: &mut Vec<u8>| {
        out.extend_from_slice(&[0x00, 0x0A, 0, 0]);
        out.extend_from_slice(&30u32.to_be_bytes());
        out.extend_from_slice(&60u32.to_be_bytes());
    };
    let mut out = Vec::new();
    match options {
        0 => {
            out.extend_from_slice(&[0; 4]);
            for o in OPS {
                out.push(o.opcode);
                out.push(0);
                out.extend_from_slice(&o.sa.unwrap_or(0).to_be_bytes());
                out.push(0);
                out.push(u8::from(o.sa.is_some()) | if rctd { 0x02 } else { 0 });
                out.extend_from_slice(&(o.usage.len() as u16).to_be_bytes());
                if rctd {
                    timeout(&mut out);
                }
            }
            let len = (out.len() - 4) as u32;
            out[..4].copy_from_slice(&len.to_be_bytes());
        }
        1..=3 => {
            let with_sa = has_service_action(req_op);
            // 1: by opcode alone, which must not have service actions;
            // 2: by opcode and service action, which it must have.
            if (options == 1 && with_sa) || (options == 2 && !with_sa && known_opcode(req_op)) {
                return Err(invalid_cdb(2, Some(2)));
            }
            let found = OPS
                .iter()
                .find(|o| o.opcode == req_op && (!with_sa || o.sa == Some(req_sa)));
            match found {
                Some(o) => {
                    out.push(0);
                    out.push(0x03 | if rctd { 0x80 } else { 0 }); // supported, as the standard says
                    out.extend_from_slice(&(o.usage.len() as u16).to_be_bytes());
                    out.extend_from_slice(o.usage);
                    if rctd {
                        timeout(&mut out);
                    }
                }
                None => out.extend_from_slice(&[0, 0x01, 0, 0]), // not supported
            }
        }
        _ => return Err(invalid_cdb(2, Some(2))),
    }
    Ok(out)
}

fn known_opcode(opcode: u8) -> bool {
    OPS.iter().any(|o| o.opcode == opcode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_sorted_and_usage_matches_cdb_length() {
        for w in OPS.windows(2) {
            assert!((w[0].opcode, w[0].sa) < (w[1].opcode, w[1].sa));
        }
        for o in OPS {
            assert_eq!(o.usage[0], o.opcode);
            assert_eq!(o.usage.len(), cdb_len(o.opcode), "{:#x}", o.opcode);
            if let Some(sa) = o.sa {
                if o.opcode != 0x5E && o.opcode != 0x5F {
                    assert_eq!(u16::from(o.usage[1]), sa);
                }
            }
        }
    }
}
