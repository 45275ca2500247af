//! NBD wire format: constants from the protocol document
//! (the NBD protocol specification) and the encoders/decoders for
//! the messages ramd exchanges, as a server ([`crate::handshake`],
//! [`crate::transmission`]) and as a client ([`crate::client`], and the
//! integration tests' raw client). All integers are big-endian.

use std::io::{self, Read, Write};

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943; // "NBDMAGIC"
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
pub const REP_ERR_POLICY: u32 = REP_ERR | 2;
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;
pub const REP_ERR_TOO_BIG: u32 = REP_ERR | 9;

// Information types of NBD_REP_INFO.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Transmission flags.
pub const TF_HAS_FLAGS: u16 = 1 << 0;
pub const TF_READ_ONLY: u16 = 1 << 1;
pub const TF_SEND_FLUSH: u16 = 1 << 2;
pub const TF_SEND_FUA: u16 = 1 << 3;
pub const TF_SEND_TRIM: u16 = 1 << 5;
pub const TF_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const TF_SEND_DF: u16 = 1 << 7;
pub const TF_CAN_MULTI_CONN: u16 = 1 << 8;
pub const TF_SEND_CACHE: u16 = 1 << 10;
pub const TF_SEND_FAST_ZERO: u16 = 1 << 11;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Structured reply chunk types and flags.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;

// base:allocation status bits.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

// Error values (the protocol's, which happen to equal Linux errnos).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Longest string (export name, description, context name) we accept.
pub const MAX_STRING: usize = 4096;
/// The maximum payload ramd advertises in `NBD_INFO_BLOCK_SIZE`: the
/// protocol's portable default, 32 MiB.
pub const MAX_PAYLOAD: u32 = 1 << 25;
/// The largest READ/WRITE ramd serves. A client that negotiated no block
/// size may go past the advertised 32 MiB; nbdkit serves up to 64 MiB
/// (`MAX_REQUEST_SIZE`, `server/internal.h`), so ramd does too. Beyond it
/// a request gets EINVAL (a WRITE's payload is skipped first).
pub const MAX_REQUEST: u32 = 64 << 20;
/// The one metadata context ramd offers, and the id it gets.
pub const BASE_ALLOCATION: &str = "base:allocation";
pub const BASE_ALLOCATION_ID: u32 = 1;

/// Size of a transmission request header.
pub const REQUEST_LEN: usize = 28;
/// Size of a simple reply header.
pub const SIMPLE_REPLY_LEN: usize = 16;
/// Size of a structured reply chunk header.
pub const STRUCTURED_REPLY_LEN: usize = 20;

// Option codes (NBD_OPT_*).
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Command codes (NBD_CMD_*).
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Handshake options ramd knows.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Opt {
    ExportName,
    Abort,
    List,
    StartTls,
    Info,
    Go,
    StructuredReply,
    ListMetaContext,
    SetMetaContext,
    Other(u32),
}

impl From<u32> for Opt {
    fn from(v: u32) -> Opt {
        match v {
            OPT_EXPORT_NAME => Opt::ExportName,
            OPT_ABORT => Opt::Abort,
            OPT_LIST => Opt::List,
            OPT_STARTTLS => Opt::StartTls,
            OPT_INFO => Opt::Info,
            OPT_GO => Opt::Go,
            OPT_STRUCTURED_REPLY => Opt::StructuredReply,
            OPT_LIST_META_CONTEXT => Opt::ListMetaContext,
            OPT_SET_META_CONTEXT => Opt::SetMetaContext,
            n => Opt::Other(n),
        }
    }
}

/// Transmission commands.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Cmd {
    Read,
    Write,
    Disc,
    Flush,
    Trim,
    Cache,
    WriteZeroes,
    BlockStatus,
    Other(u16),
}

impl From<u16> for Cmd {
    fn from(v: u16) -> Cmd {
        match v {
            CMD_READ => Cmd::Read,
            CMD_WRITE => Cmd::Write,
            CMD_DISC => Cmd::Disc,
            CMD_FLUSH => Cmd::Flush,
            CMD_TRIM => Cmd::Trim,
            CMD_CACHE => Cmd::Cache,
            CMD_WRITE_ZEROES => Cmd::WriteZeroes,
            CMD_BLOCK_STATUS => Cmd::BlockStatus,
            n => Cmd::Other(n),
        }
    }
}

impl From<Cmd> for u16 {
    fn from(c: Cmd) -> u16 {
        match c {
            Cmd::Read => CMD_READ,
            Cmd::Write => CMD_WRITE,
            Cmd::Disc => CMD_DISC,
            Cmd::Flush => CMD_FLUSH,
            Cmd::Trim => CMD_TRIM,
            Cmd::Cache => CMD_CACHE,
            Cmd::WriteZeroes => CMD_WRITE_ZEROES,
            Cmd::BlockStatus => CMD_BLOCK_STATUS,
            Cmd::Other(n) => n,
        }
    }
}

/// One transmission request header.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Request {
    pub flags: u16,
    pub cmd: Cmd,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl Request {
    /// Decodes a header; `None` if the magic is wrong (the stream is lost).
    pub fn parse(b: &[u8; REQUEST_LEN]) -> Option<Request> {
        if be32(&b[0..4]) != REQUEST_MAGIC {
            return None;
        }
        Some(Request {
            flags: be16(&b[4..6]),
            cmd: Cmd::from(be16(&b[6..8])),
            cookie: be64(&b[8..16]),
            offset: be64(&b[16..24]),
            length: be32(&b[24..28]),
        })
    }

    /// The header as a client sends it (a WRITE's payload follows it).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&u16::from(self.cmd).to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }
}

/// A simple reply's header, as a client reads it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SimpleReply {
    pub error: u32,
    pub cookie: u64,
}

impl SimpleReply {
    /// Decodes a header; `None` if the magic is not the simple reply's.
    pub fn parse(b: &[u8; SIMPLE_REPLY_LEN]) -> Option<SimpleReply> {
        if be32(&b[0..4]) != SIMPLE_REPLY_MAGIC {
            return None;
        }
        Some(SimpleReply {
            error: be32(&b[4..8]),
            cookie: be64(&b[8..16]),
        })
    }
}

/// Size of an option reply header.
pub const OPTION_REPLY_LEN: usize = 20;

/// An option reply's header (its `len` bytes of data follow), as a client
/// reads it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct OptionReply {
    pub opt: u32,
    pub kind: u32,
    pub len: u32,
}

impl OptionReply {
    /// Decodes a header; `None` if the magic is wrong.
    pub fn parse(b: &[u8; OPTION_REPLY_LEN]) -> Option<OptionReply> {
        if be64(&b[0..8]) != OPTION_REPLY_MAGIC {
            return None;
        }
        Some(OptionReply {
            opt: be32(&b[8..12]),
            kind: be32(&b[12..16]),
            len: be32(&b[16..20]),
        })
    }
}

/// An option request, as a client sends it: IHAVEOPT, the option, the
/// length of its data, the data.
pub fn option_request(opt: u32, data: &[u8]) -> Vec<u8> {
    let mut m = Vec::with_capacity(16 + data.len());
    m.extend_from_slice(&IHAVEOPT.to_be_bytes());
    m.extend_from_slice(&opt.to_be_bytes());
    m.extend_from_slice(&(data.len() as u32).to_be_bytes());
    m.extend_from_slice(data);
    m
}

/// NBD_OPT_GO's data: the export name and no information requests (the
/// server sends NBD_INFO_EXPORT regardless).
pub fn go_data(name: &str) -> Vec<u8> {
    let mut d = Vec::with_capacity(6 + name.len());
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&0u16.to_be_bytes());
    d
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b.try_into().expect("2 bytes"))
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b.try_into().expect("4 bytes"))
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().expect("8 bytes"))
}

/// Writes a simple reply header into `out[..16]`.
pub fn simple_reply_header(out: &mut [u8], error: u32, cookie: u64) {
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
}

/// Writes a structured reply chunk header into `out[..20]`.
pub fn structured_reply_header(out: &mut [u8], flags: u16, kind: u16, cookie: u64, len: u32) {
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&flags.to_be_bytes());
    out[6..8].copy_from_slice(&kind.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.to_be_bytes());
    out[16..20].copy_from_slice(&len.to_be_bytes());
}

/// A whole structured error chunk (type ERROR, flag DONE) with a message.
pub fn structured_error(cookie: u64, error: u32, msg: &str) -> Vec<u8> {
    let msg = truncate_utf8(msg, MAX_STRING);
    let mut out = vec![0; STRUCTURED_REPLY_LEN];
    let len = 6 + msg.len() as u32;
    structured_reply_header(&mut out, REPLY_FLAG_DONE, REPLY_TYPE_ERROR, cookie, len);
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg.as_bytes());
    out
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// An option reply: header plus payload.
pub fn option_reply(opt: u32, reply: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&opt.to_be_bytes());
    out.extend_from_slice(&reply.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// Reads a big-endian integer of N bytes.
pub fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

pub fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

/// Reads and drops `n` bytes (a payload we refuse but must step over).
pub fn discard(r: &mut impl Read, n: u64) -> io::Result<()> {
    let copied = io::copy(&mut r.take(n), &mut io::sink())?;
    if copied < n {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

/// The server's first 18 bytes.
pub fn write_greeting(w: &mut impl Write) -> io::Result<()> {
    let mut b = [0; 18];
    b[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    w.write_all(&b)
}

/// A cursor over option data that refuses to read past its end.
pub struct OptData<'a>(pub &'a [u8]);

impl<'a> OptData<'a> {
    pub fn u16(&mut self) -> Option<u16> {
        self.take(2).map(be16)
    }
    pub fn u32(&mut self) -> Option<u32> {
        self.take(4).map(be32)
    }
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    /// A u32-length-prefixed UTF-8 string of at most MAX_STRING bytes.
    pub fn string(&mut self) -> Option<&'a str> {
        let n = self.u32()? as usize;
        if n > MAX_STRING {
            return None;
        }
        std::str::from_utf8(self.take(n)?).ok()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greeting_bytes() {
        let mut v = Vec::new();
        write_greeting(&mut v).unwrap();
        assert_eq!(
            v,
            [
                b'N', b'B', b'D', b'M', b'A', b'G', b'I', b'C', // NBDMAGIC
                b'I', b'H', b'A', b'V', b'E', b'O', b'P', b'T', // IHAVEOPT
                0x00, 0x03, // FIXED_NEWSTYLE | NO_ZEROES
            ]
        );
    }

    #[test]
    fn parse_write_request() {
        let b: [u8; REQUEST_LEN] = [
            0x25, 0x60, 0x95, 0x13, // request magic
            0x00, 0x01, // flags: FUA
            0x00, 0x01, // type: WRITE
            0, 0, 0, 0, 0, 0, 0x12, 0x34, // cookie
            0, 0, 0, 0, 0, 0x10, 0, 0, // offset 1 MiB
            0, 0, 0x10, 0, // length 4096
        ];
        assert_eq!(
            Request::parse(&b),
            Some(Request {
                flags: CMD_FLAG_FUA,
                cmd: Cmd::Write,
                cookie: 0x1234,
                offset: 1 << 20,
                length: 4096
            })
        );
        let mut bad = b;
        bad[0] = 0x26;
        assert_eq!(Request::parse(&bad), None);
        let mut unknown = b;
        unknown[7] = 0x42;
        assert_eq!(Request::parse(&unknown).unwrap().cmd, Cmd::Other(0x42));
    }

    #[test]
    fn simple_and_structured_headers() {
        let mut b = [0; SIMPLE_REPLY_LEN];
        simple_reply_header(&mut b, EINVAL, 7);
        assert_eq!(
            b,
            [
                0x67, 0x44, 0x66, 0x98, // simple reply magic
                0, 0, 0, 22, // EINVAL
                0, 0, 0, 0, 0, 0, 0, 7, // cookie
            ]
        );
        let mut s = [0; STRUCTURED_REPLY_LEN];
        structured_reply_header(&mut s, REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, 9, 8 + 512);
        assert_eq!(
            s,
            [
                0x66, 0x8e, 0x33, 0xef, // structured reply magic
                0x00, 0x01, // DONE
                0x00, 0x01, // OFFSET_DATA
                0, 0, 0, 0, 0, 0, 0, 9, // cookie
                0, 0, 0x02, 0x08, // length: 8-byte offset + 512 data
            ]
        );
    }

    #[test]
    fn error_chunk_carries_message() {
        let e = structured_error(3, ENOSPC, "full");
        assert_eq!(
            e,
            [
                0x66, 0x8e, 0x33, 0xef, // magic
                0x00, 0x01, // DONE
                0x80, 0x01, // ERROR
                0, 0, 0, 0, 0, 0, 0, 3, // cookie
                0, 0, 0, 10, // length: 4 + 2 + 4
                0, 0, 0, 28, // ENOSPC
                0, 4, b'f', b'u', b'l', b'l', // message
            ]
        );
    }

    #[test]
    fn option_reply_bytes() {
        assert_eq!(
            option_reply(7, REP_ACK, &[]),
            [
                0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9, // reply magic
                0, 0, 0, 7, // option GO
                0, 0, 0, 1, // ACK
                0, 0, 0, 0, // no data
            ]
        );
        assert_eq!(option_reply(3, REP_ERR_UNSUP, &[])[12..16], [0x80, 0, 0, 1]);
    }

    #[test]
    fn client_side_bytes() {
        let r = Request {
            flags: CMD_FLAG_FUA,
            cmd: Cmd::Write,
            cookie: 0x0102_0304_0506_0708,
            offset: 0x1000,
            length: 512,
        };
        let b = r.encode();
        assert_eq!(
            b,
            [
                0x25, 0x60, 0x95, 0x13, // REQUEST_MAGIC
                0x00, 0x01, // FUA
                0x00, 0x01, // WRITE
                1, 2, 3, 4, 5, 6, 7, 8, // cookie
                0, 0, 0, 0, 0, 0, 0x10, 0, // offset
                0, 0, 2, 0, // length
            ]
        );
        assert_eq!(Request::parse(&b), Some(r));
        // A code ramd does not know goes out as it is.
        let odd = Request {
            cmd: Cmd::from(0x42),
            ..r
        };
        assert_eq!(odd.encode()[6..8], [0, 0x42]);
        let mut h = [0u8; SIMPLE_REPLY_LEN];
        simple_reply_header(&mut h, EINVAL, 9);
        assert_eq!(
            SimpleReply::parse(&h),
            Some(SimpleReply {
                error: EINVAL,
                cookie: 9
            })
        );
        h[0] ^= 1;
        assert_eq!(SimpleReply::parse(&h), None);
        let o = option_request(OPT_GO, &go_data("ab"));
        assert_eq!(
            o,
            [
                b'I', b'H', b'A', b'V', b'E', b'O', b'P', b'T', // IHAVEOPT
                0, 0, 0, 7, // NBD_OPT_GO
                0, 0, 0, 8, // data length
                0, 0, 0, 2, b'a', b'b', // name
                0, 0, // no information requests
            ]
        );
        let rep = option_reply(OPT_GO, REP_ERR_UNKNOWN, b"xyz");
        let head: [u8; OPTION_REPLY_LEN] = rep[..20].try_into().unwrap();
        assert_eq!(
            OptionReply::parse(&head),
            Some(OptionReply {
                opt: OPT_GO,
                kind: REP_ERR_UNKNOWN,
                len: 3
            })
        );
    }

    #[test]
    fn opt_data_refuses_overruns() {
        let mut d = OptData(&[0, 0, 0, 3, b'a', b'b']);
        assert_eq!(d.string(), None);
        let mut d = OptData(&[0, 0, 0, 2, b'a', b'b', 0, 1]);
        assert_eq!(d.string(), Some("ab"));
        assert_eq!(d.u16(), Some(1));
        assert!(d.is_empty());
        assert_eq!(d.u16(), None);
        let mut d = OptData(&[0, 0, 0, 2, 0xff, 0xfe]);
        assert_eq!(d.string(), None, "not UTF-8");
    }
}
