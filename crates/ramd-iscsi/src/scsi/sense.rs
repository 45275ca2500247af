//! Fixed-format sense data (SPC-4 4.5.3) and the conditions ramd reports.

use ramd_store::Error;

/// Sense keys.
pub mod key {
    pub const NO_SENSE: u8 = 0x00;
    pub const NOT_READY: u8 = 0x02;
    pub const MEDIUM_ERROR: u8 = 0x03;
    pub const HARDWARE_ERROR: u8 = 0x04;
    pub const ILLEGAL_REQUEST: u8 = 0x05;
    pub const UNIT_ATTENTION: u8 = 0x06;
    pub const DATA_PROTECT: u8 = 0x07;
    pub const MISCOMPARE: u8 = 0x0E;
}

/// Where an invalid field is: the sense-key-specific field pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Field {
    /// In the CDB (else in the parameter list).
    pub in_cdb: bool,
    pub byte: u16,
    /// The bit, when the fault is one bit or a field ending at it.
    pub bit: Option<u8>,
}

/// A CHECK CONDITION's sense data, before encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
    /// The INFORMATION field (VALID set when present).
    pub info: Option<u32>,
    pub field: Option<Field>,
}

/// Length of fixed-format sense data with no additional bytes.
pub const SENSE_LEN: usize = 18;

impl Sense {
    pub const fn new(key: u8, asc: u8, ascq: u8) -> Sense {
        Sense {
            key,
            asc,
            ascq,
            info: None,
            field: None,
        }
    }

    /// The 18 bytes of fixed-format sense data (response code 70h).
    pub fn encode(&self) -> Vec<u8> {
        let mut s = vec![0u8; SENSE_LEN];
        s[0] = 0x70;
        s[2] = self.key & 0x0F;
        if let Some(info) = self.info {
            s[0] |= 0x80;
            s[3..7].copy_from_slice(&info.to_be_bytes());
        }
        s[7] = (SENSE_LEN - 8) as u8;
        s[12] = self.asc;
        s[13] = self.ascq;
        if let Some(f) = self.field {
            s[15] = 0x80 | if f.in_cdb { 0x40 } else { 0 };
            if let Some(bit) = f.bit {
                s[15] |= 0x08 | (bit & 7);
            }
            s[16..18].copy_from_slice(&f.byte.to_be_bytes());
        }
        s
    }
}

/// INVALID FIELD IN CDB at `byte` (and `bit`).
pub fn invalid_cdb(byte: u16, bit: Option<u8>) -> Sense {
    Sense {
        field: Some(Field {
            in_cdb: true,
            byte,
            bit,
        }),
        ..Sense::new(key::ILLEGAL_REQUEST, 0x24, 0x00)
    }
}

/// INVALID FIELD IN PARAMETER LIST at `byte`.
pub fn invalid_param(byte: u16) -> Sense {
    Sense {
        field: Some(Field {
            in_cdb: false,
            byte,
            bit: None,
        }),
        ..Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x00)
    }
}

pub const INVALID_OPCODE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x20, 0x00);
pub const LBA_OUT_OF_RANGE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x21, 0x00);
pub const PARAM_LIST_LENGTH: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x1A, 0x00);
pub const LUN_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x25, 0x00);
/// The initiator sent a different amount of Data-Out than the CDB asks
/// for, where a partial transfer cannot be carried out.
pub const INVALID_FIELD_IN_IU: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x0E, 0x03);
pub const SAVING_NOT_SUPPORTED: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x39, 0x00);
pub const INVALID_RELEASE: Sense = Sense::new(key::ILLEGAL_REQUEST, 0x26, 0x04);
pub const WRITE_PROTECTED: Sense = Sense::new(key::DATA_PROTECT, 0x27, 0x00);
/// SPACE ALLOCATION FAILED WRITE PROTECT: a thin disk that is full.
pub const SPACE_EXHAUSTED: Sense = Sense::new(key::DATA_PROTECT, 0x27, 0x07);
pub const UNRECOVERED_READ: Sense = Sense::new(key::MEDIUM_ERROR, 0x11, 0x00);
pub const WRITE_ERROR: Sense = Sense::new(key::MEDIUM_ERROR, 0x0C, 0x00);
pub const INTERNAL_FAILURE: Sense = Sense::new(key::HARDWARE_ERROR, 0x44, 0x00);

/// MISCOMPARE DURING VERIFY OPERATION, `offset` bytes into the Data-Out.
pub fn miscompare(offset: usize) -> Sense {
    Sense {
        info: Some(offset as u32),
        ..Sense::new(key::MISCOMPARE, 0x1D, 0x00)
    }
}

/// What a store error means to the initiator. `writing`: the command
/// changes the disk (a failed flush or write is a write error, a failed
/// read an unrecovered read error).
pub fn from_store(e: &Error, writing: bool) -> Sense {
    match e {
        Error::NoSpace { .. }
        | Error::SharedNoSpace { .. }
        | Error::DiskFull { .. }
        | Error::HostMemoryLow { .. } => SPACE_EXHAUSTED,
        Error::OutOfRange { .. } => LBA_OUT_OF_RANGE,
        Error::ReadOnly => WRITE_PROTECTED,
        Error::Context { inner, .. } => from_store(inner, writing),
        Error::Corrupt(_) if !writing => UNRECOVERED_READ,
        Error::Corrupt(_) | Error::Image { .. } | Error::File { .. } | Error::Os { .. } => {
            if writing {
                WRITE_ERROR
            } else {
                UNRECOVERED_READ
            }
        }
        Error::Invalid(_) | Error::Unusable(_) => INTERNAL_FAILURE,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_field_in_cdb_has_the_field_pointer() {
        let s = invalid_cdb(2, Some(5)).encode();
        assert_eq!(
            s,
            [
                0x70,
                0,
                0x05,
                0,
                0,
                0,
                0,
                10, // response code, key, no INFORMATION, additional length
                0,
                0,
                0,
                0, // command-specific information
                0x24,
                0x00,
                0, // ASC/ASCQ, FRU
                0x80 | 0x40 | 0x08 | 5,
                0,
                2, // SKSV, C/D, BPV, bit 5 of byte 2
            ]
        );
    }

    #[test]
    fn miscompare_carries_the_offset() {
        let s = miscompare(0x1234).encode();
        assert_eq!(s[0], 0xF0); // VALID
        assert_eq!(s[2], 0x0E);
        assert_eq!(&s[3..7], &[0, 0, 0x12, 0x34]);
        assert_eq!((s[12], s[13]), (0x1D, 0x00));
    }

    #[test]
    fn store_errors_map_to_data_protect() {
        let full = Error::NoSpace {
            needed: 1,
            limit: 2,
        };
        assert_eq!(from_store(&full, true), SPACE_EXHAUSTED);
        assert_eq!(from_store(&Error::ReadOnly, true), WRITE_PROTECTED);
    }
}
