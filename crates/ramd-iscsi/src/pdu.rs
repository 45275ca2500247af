//! iSCSI PDUs on the wire (RFC 7143 §11): the 48-byte basic header segment,
//! additional header segments, the data segment padded to 4 bytes, and the
//! optional CRC32C header and data digests. Everything a peer sends is
//! checked here, once: past [`read_header`] (which [`read_pdu`] starts
//! with) a PDU's lengths are sound, and its data segment is read into a
//! buffer of its own or, for Data-Out, straight into the caller's.

use std::io::{self, Read};

pub const BHS_LEN: usize = 48;
/// No tag: an ITT or TTT that refers to nothing.
pub const NO_TAG: u32 = 0xffff_ffff;

/// Opcodes (the low 6 bits of byte 0).
pub mod op {
    pub const NOP_OUT: u8 = 0x00;
    pub const SCSI_CMD: u8 = 0x01;
    pub const TMF_REQ: u8 = 0x02;
    pub const LOGIN_REQ: u8 = 0x03;
    pub const TEXT_REQ: u8 = 0x04;
    pub const DATA_OUT: u8 = 0x05;
    pub const LOGOUT_REQ: u8 = 0x06;
    pub const SNACK: u8 = 0x10;
    pub const NOP_IN: u8 = 0x20;
    pub const SCSI_RESP: u8 = 0x21;
    pub const TMF_RESP: u8 = 0x22;
    pub const LOGIN_RESP: u8 = 0x23;
    pub const TEXT_RESP: u8 = 0x24;
    pub const DATA_IN: u8 = 0x25;
    pub const LOGOUT_RESP: u8 = 0x26;
    pub const R2T: u8 = 0x31;
    pub const REJECT: u8 = 0x3f;
}

/// Reject PDU reasons (§11.17.1).
pub mod reject {
    pub const DATA_DIGEST: u8 = 0x02;
    pub const PROTOCOL_ERROR: u8 = 0x04;
    pub const NOT_SUPPORTED: u8 = 0x05;
    pub const INVALID_FIELD: u8 = 0x09;
}

/// The extended CDB AHS type.
pub const AHS_EXTENDED_CDB: u8 = 1;

/// One PDU as received or to be sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pdu {
    pub bhs: [u8; BHS_LEN],
    pub ahs: Vec<u8>,
    pub data: Vec<u8>,
}

/// What the connection negotiated that reading needs.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Our MaxRecvDataSegmentLength: longer data segments are refused.
    pub max_data: usize,
    pub header_digest: bool,
    pub data_digest: bool,
    /// Before login: anything but a Login Request is refused on its
    /// header, without waiting for the rest.
    pub login_only: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PduError {
    // transparent: the io::Error's message once, not once more as a source.
    #[error(transparent)]
    Io(#[from] io::Error),
    /// The header cannot be trusted: the connection must go (§7.8 at ERL 0).
    #[error("header digest mismatch")]
    HeaderDigest,
    /// The data segment of a sound header is damaged: the PDU is rejected
    /// and the connection goes on.
    #[error("data digest mismatch")]
    DataDigest(Box<Pdu>),
    #[error("opcode {0:#04x} before login")]
    NotLogin(u8),
    #[error("data segment of {len} bytes exceeds MaxRecvDataSegmentLength {max}")]
    DataTooLong { len: usize, max: usize },
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn pad4(n: usize) -> usize {
    (4 - n % 4) % 4
}

impl Pdu {
    /// A PDU with `opcode` and everything else zero.
    pub fn new(opcode: u8) -> Pdu {
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = opcode;
        Pdu {
            bhs,
            ahs: Vec::new(),
            data: Vec::new(),
        }
    }

    pub fn opcode(&self) -> u8 {
        self.bhs[0] & 0x3f
    }

    /// The I bit: an immediate command (does not advance CmdSN).
    pub fn immediate(&self) -> bool {
        self.bhs[0] & 0x40 != 0
    }

    pub fn flags(&self) -> u8 {
        self.bhs[1]
    }

    /// The F (final) bit.
    pub fn final_bit(&self) -> bool {
        self.bhs[1] & 0x80 != 0
    }

    pub fn lun_field(&self) -> u64 {
        u64::from_be_bytes(self.bhs[8..16].try_into().expect("8 bytes"))
    }

    pub fn itt(&self) -> u32 {
        self.u32(16)
    }

    pub fn u32(&self, at: usize) -> u32 {
        be32(&self.bhs, at)
    }

    pub fn set_u32(&mut self, at: usize, v: u32) {
        self.bhs[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }

    pub fn set_lun_field(&mut self, v: u64) {
        self.bhs[8..16].copy_from_slice(&v.to_be_bytes());
    }

    /// The extended CDB carried in AHS (the bytes past the BHS's 16).
    pub fn extended_cdb(&self) -> Option<&[u8]> {
        let mut rest = &self.ahs[..];
        while rest.len() >= 4 {
            let len = u16::from_be_bytes([rest[0], rest[1]]) as usize;
            let total = 3 + len + pad4(3 + len);
            if total > rest.len() {
                return None;
            }
            // AHSLength counts the reserved byte that precedes the CDB.
            if rest[2] == AHS_EXTENDED_CDB && len >= 1 {
                return Some(&rest[4..3 + len]);
            }
            rest = &rest[total..];
        }
        None
    }

    /// Appends the PDU as sent on the wire to `out`.
    pub fn encode_into(&self, out: &mut Vec<u8>, header_digest: bool, data_digest: bool) {
        let start = out.len();
        let mut bhs = self.bhs;
        debug_assert!(self.ahs.len().is_multiple_of(4) && self.ahs.len() <= 255 * 4);
        bhs[4] = (self.ahs.len() / 4) as u8;
        let dlen = self.data.len() as u32;
        debug_assert!(dlen < 1 << 24);
        bhs[5..8].copy_from_slice(&dlen.to_be_bytes()[1..]);
        out.extend_from_slice(&bhs);
        out.extend_from_slice(&self.ahs);
        if header_digest {
            let crc = crc32c::crc32c(&out[start..]);
            out.extend_from_slice(&crc.to_le_bytes());
        }
        if !self.data.is_empty() {
            let d = out.len();
            out.extend_from_slice(&self.data);
            out.resize(out.len() + pad4(self.data.len()), 0);
            if data_digest {
                let crc = crc32c::crc32c(&out[d..]);
                out.extend_from_slice(&crc.to_le_bytes());
            }
        }
    }

    pub fn encode(&self, header_digest: bool, data_digest: bool) -> Vec<u8> {
        let mut v = Vec::with_capacity(BHS_LEN + self.data.len() + 12);
        self.encode_into(&mut v, header_digest, data_digest);
        v
    }
}

/// A PDU whose header (BHS, AHS, header digest) is read and checked and
/// whose data segment is still on the wire: the caller picks where the data
/// goes ([`Header::read_data_into`]) or takes it as a whole PDU
/// ([`Header::read_data`]).
#[derive(Debug)]
pub struct Header {
    /// The PDU with its data segment still empty.
    pub pdu: Pdu,
    /// The data segment's length (no padding, no digest), at most the
    /// reader's `max_data`.
    pub dlen: usize,
}

/// Reads one PDU. `Ok(None)` is a clean end of stream between PDUs.
pub fn read_pdu(r: &mut impl Read, lim: &Limits) -> Result<Option<Pdu>, PduError> {
    match read_header(r, lim)? {
        Some(h) => h.read_data(r, lim).map(Some),
        None => Ok(None),
    }
}

/// Reads a PDU's header, up to its data segment. `Ok(None)` is a clean end
/// of stream between PDUs.
pub fn read_header(r: &mut impl Read, lim: &Limits) -> Result<Option<Header>, PduError> {
    let mut bhs = [0u8; BHS_LEN];
    // A clean EOF only counts before the first byte of a header.
    let mut got = 0;
    while got < BHS_LEN {
        match r.read(&mut bhs[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::Error::from(io::ErrorKind::UnexpectedEof).into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    if lim.login_only && bhs[0] & 0x3f != op::LOGIN_REQ {
        return Err(PduError::NotLogin(bhs[0] & 0x3f));
    }
    // TotalAHSLength is one byte of 4-byte words: at most 1020 bytes, so
    // "huge AHS" is bounded by the field itself.
    let ahs_len = bhs[4] as usize * 4;
    let dlen = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]) as usize;
    // Checked before anything else is read: a huge length never makes
    // the reader wait for, or allocate, bytes it will not take.
    if dlen > lim.max_data {
        return Err(PduError::DataTooLong {
            len: dlen,
            max: lim.max_data,
        });
    }
    let mut ahs = vec![0u8; ahs_len];
    r.read_exact(&mut ahs)?;
    if lim.header_digest {
        let mut d = [0u8; 4];
        r.read_exact(&mut d)?;
        let mut h = crc32c::crc32c(&bhs);
        h = crc32c::crc32c_append(h, &ahs);
        if h != u32::from_le_bytes(d) {
            return Err(PduError::HeaderDigest);
        }
    }
    Ok(Some(Header {
        pdu: Pdu {
            bhs,
            ahs,
            data: Vec::new(),
        },
        dlen,
    }))
}

impl Header {
    /// Reads the data segment into a buffer of its own: the whole PDU, or
    /// [`PduError::DataDigest`] with it.
    pub fn read_data(self, r: &mut impl Read, lim: &Limits) -> Result<Pdu, PduError> {
        let Header { mut pdu, dlen } = self;
        let mut data = vec![0u8; dlen];
        let sound = read_segment(r, lim, &mut data)?;
        pdu.data = data;
        if !sound {
            return Err(PduError::DataDigest(Box::new(pdu)));
        }
        Ok(pdu)
    }

    /// Reads the data segment straight into `dst` (exactly
    /// [`Header::dlen`] bytes long): false if its data digest does not
    /// match, when `dst` holds the damaged bytes.
    pub fn read_data_into(
        &self,
        r: &mut impl Read,
        lim: &Limits,
        dst: &mut [u8],
    ) -> io::Result<bool> {
        assert_eq!(dst.len(), self.dlen, "data segment buffer");
        read_segment(r, lim, dst)
    }
}

/// The data segment of `dst.len()` bytes, its padding and its digest.
fn read_segment(r: &mut impl Read, lim: &Limits, dst: &mut [u8]) -> io::Result<bool> {
    r.read_exact(dst)?;
    let mut pad = [0u8; 3];
    let pad = &mut pad[..pad4(dst.len())];
    r.read_exact(pad)?;
    if lim.data_digest && !dst.is_empty() {
        let mut d = [0u8; 4];
        r.read_exact(&mut d)?;
        // The digest covers the padding too.
        let crc = crc32c::crc32c_append(crc32c::crc32c(dst), pad);
        return Ok(crc == u32::from_le_bytes(d));
    }
    Ok(true)
}

/// Text (login and text request) data: `key=value` pairs, each ended by a
/// NUL. Pairs without `=` come back with an empty key, so that the caller
/// can answer them as malformed.
pub fn parse_text(data: &[u8]) -> Vec<(String, String)> {
    data.split(|b| *b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| {
            let s = String::from_utf8_lossy(s);
            match s.split_once('=') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (String::new(), s.to_string()),
            }
        })
        .collect()
}

pub fn encode_text(pairs: &[(String, String)]) -> Vec<u8> {
    let mut v = Vec::new();
    for (k, val) in pairs {
        v.extend_from_slice(k.as_bytes());
        v.push(b'=');
        v.extend_from_slice(val.as_bytes());
        v.push(0);
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIM: Limits = Limits {
        max_data: 8192,
        header_digest: false,
        data_digest: false,
        login_only: false,
    };

    /// A SCSI Command PDU: READ(10) of one block at LBA 0x1234, as libiscsi
    /// sends it, written out field by field.
    fn read10() -> Vec<u8> {
        let mut v = vec![
            0x01, // opcode SCSI Command, not immediate
            0xc1, // F, R, ATTR=SIMPLE
            0x00, 0x00, // reserved
            0x00, // TotalAHSLength
            0x00, 0x00, 0x00, // DataSegmentLength
            0x00, 0x01, 0, 0, 0, 0, 0, 0, // LUN 1 (flat)
            0x00, 0x00, 0x00, 0x07, // ITT 7
            0x00, 0x00, 0x02, 0x00, // EDTL 512
            0x00, 0x00, 0x00, 0x05, // CmdSN 5
            0x00, 0x00, 0x00, 0x03, // ExpStatSN 3
        ];
        // CDB: READ(10), LBA 0x1234, 1 block.
        v.extend_from_slice(&[0x28, 0, 0, 0, 0x12, 0x34, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]);
        v
    }

    #[test]
    fn scsi_command_fields() {
        let bytes = read10();
        let p = read_pdu(&mut &bytes[..], &LIM).unwrap().unwrap();
        assert_eq!(p.opcode(), op::SCSI_CMD);
        assert!(!p.immediate());
        assert!(p.final_bit());
        assert_eq!(p.lun_field() >> 48, 1);
        assert_eq!(p.itt(), 7);
        assert_eq!(p.u32(20), 512);
        assert_eq!(p.u32(24), 5);
        assert_eq!(&p.bhs[32..34], &[0x28, 0]);
        assert!(p.data.is_empty());
        // Encoding gives the same bytes back.
        assert_eq!(p.encode(false, false), bytes);
    }

    #[test]
    fn padding_and_digests_round_trip() {
        let mut p = Pdu::new(op::NOP_OUT);
        p.data = b"hello".to_vec();
        let wire = p.encode(false, false);
        // 48 + 5 data + 3 padding.
        assert_eq!(wire.len(), 56);
        assert_eq!(&wire[5..8], &[0, 0, 5]);
        assert_eq!(&wire[53..], &[0, 0, 0]);
        let lim = Limits {
            header_digest: true,
            data_digest: true,
            ..LIM
        };
        let wire = p.encode(true, true);
        assert_eq!(wire.len(), 48 + 4 + 8 + 4);
        // The header digest is CRC32C of the header, little-endian on the
        // wire (§13.1: the CRC's bytes are sent in reverse).
        assert_eq!(wire[48..52], crc32c::crc32c(&wire[..48]).to_le_bytes());
        let back = read_pdu(&mut &wire[..], &lim).unwrap().unwrap();
        assert_eq!((back.opcode(), &back.data), (op::NOP_OUT, &p.data));
        // A flipped header bit fails the header digest.
        let mut bad = wire.clone();
        bad[20] ^= 1;
        assert!(matches!(
            read_pdu(&mut &bad[..], &lim),
            Err(PduError::HeaderDigest)
        ));
        // A flipped data bit fails the data digest but keeps the PDU.
        let mut bad = wire.clone();
        bad[53] ^= 1;
        match read_pdu(&mut &bad[..], &lim) {
            Err(PduError::DataDigest(p)) => assert_eq!(p.opcode(), op::NOP_OUT),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn data_read_into_a_buffer_of_the_callers() {
        let mut p = Pdu::new(op::DATA_OUT);
        p.data = b"hello".to_vec();
        let lim = Limits {
            header_digest: true,
            data_digest: true,
            ..LIM
        };
        let wire = p.encode(true, true);
        let mut r = &wire[..];
        let h = read_header(&mut r, &lim).unwrap().unwrap();
        assert_eq!((h.pdu.opcode(), h.dlen), (op::DATA_OUT, 5));
        let mut buf = [0u8; 7];
        assert!(h.read_data_into(&mut r, &lim, &mut buf[1..6]).unwrap());
        assert_eq!(&buf, b"\0hello\0");
        // Padding and digest consumed: nothing left.
        assert!(r.is_empty());
        // A flipped data bit: the digest says so.
        let mut bad = wire.clone();
        bad[53] ^= 1;
        let mut r = &bad[..];
        let h = read_header(&mut r, &lim).unwrap().unwrap();
        assert!(!h.read_data_into(&mut r, &lim, &mut buf[..5]).unwrap());
    }

    #[test]
    fn lengths_checked_before_reading() {
        let mut bytes = read10();
        // DataSegmentLength 0xffffff.
        bytes[5..8].copy_from_slice(&[0xff, 0xff, 0xff]);
        assert!(matches!(
            read_pdu(&mut &bytes[..], &LIM),
            Err(PduError::DataTooLong { len: 0xffffff, .. })
        ));
        // Before login only a Login Request gets past its header.
        let lim = Limits {
            login_only: true,
            ..LIM
        };
        assert!(matches!(
            read_pdu(&mut &read10()[..], &lim),
            Err(PduError::NotLogin(op::SCSI_CMD))
        ));
        // Truncated header and clean end of stream.
        assert!(read_pdu(&mut &bytes[..20], &LIM).is_err());
        assert!(read_pdu(&mut &[][..], &LIM).unwrap().is_none());
        // AHS longer than what follows.
        let mut bytes = read10();
        bytes[4] = 255;
        assert!(read_pdu(&mut &bytes[..], &LIM).is_err());
    }

    #[test]
    fn extended_cdb_ahs() {
        let mut bytes = read10();
        bytes[4] = 5; // 20 bytes of AHS
                      // AHSLength 17 (reserved byte + 16 CDB bytes), type 1, reserved.
        bytes.extend_from_slice(&[0, 17, AHS_EXTENDED_CDB, 0]);
        bytes.extend((0..16u8).map(|i| 0xa0 + i));
        let p = read_pdu(&mut &bytes[..], &LIM).unwrap().unwrap();
        let ext = p.extended_cdb().unwrap();
        assert_eq!(ext.len(), 16);
        assert_eq!(ext[0], 0xa0);
        // An AHS that claims more than it holds yields nothing.
        let mut p2 = p.clone();
        p2.ahs[1] = 200;
        assert!(p2.extended_cdb().is_none());
    }

    #[test]
    fn text_pairs() {
        let t = b"InitiatorName=iqn.x\0SessionType=Discovery\0junk\0";
        let v = parse_text(t);
        assert_eq!(v[0], ("InitiatorName".into(), "iqn.x".into()));
        assert_eq!(v[1].1, "Discovery");
        assert_eq!(v[2], (String::new(), "junk".into()));
        assert_eq!(encode_text(&[("A".into(), "1".into())]), b"A=1\0".to_vec());
    }
}
