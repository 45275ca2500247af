//! A raw NBD client for tests that must send what no real client would
//! (bad magic, truncated requests, huge lengths). Well-formed messages are
//! built and read with ramd-nbd's own codec (`ramd_nbd::proto`); the
//! malformed ones are the tests' bytes around the protocol's constants.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use ramd_nbd::proto::{
    option_request, OptionReply, Request, SimpleReply, INFO_EXPORT, OPTION_REPLY_LEN,
    SIMPLE_REPLY_LEN,
};
// The protocol's numbers, as ramd-nbd defines them, for tests to build
// messages and check replies with (unused in the test binaries that do not
// speak raw NBD, as `dead_code` is for the rest of `common`).
#[allow(unused_imports)]
pub use ramd_nbd::proto::{
    go_data, CMD_BLOCK_STATUS, CMD_DISC, CMD_FLUSH, CMD_READ, CMD_WRITE, EINVAL, ENOSPC, EOVERFLOW,
    FLAG_C_FIXED_NEWSTYLE, FLAG_C_NO_ZEROES, FLAG_FIXED_NEWSTYLE, IHAVEOPT, NBDMAGIC,
    OPT_EXPORT_NAME, OPT_GO, OPT_STRUCTURED_REPLY, REP_ACK, REP_ERR, REP_ERR_INVALID,
    REP_ERR_UNKNOWN, REP_ERR_UNSUP, REP_INFO, REQUEST_MAGIC,
};

use super::Ramd;

/// How long the server may take to answer or hang up.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

pub struct Raw {
    pub s: UnixStream,
}

impl Raw {
    /// Connects and checks the server's greeting.
    pub fn connect(d: &Ramd) -> Raw {
        let s = UnixStream::connect(d.socket_path()).expect("connect to ramd");
        s.set_read_timeout(Some(REPLY_TIMEOUT)).unwrap();
        s.set_write_timeout(Some(REPLY_TIMEOUT)).unwrap();
        let mut r = Raw { s };
        let mut g = [0u8; 18];
        r.read_exact(&mut g);
        assert_eq!(u64::from_be_bytes(g[0..8].try_into().unwrap()), NBDMAGIC);
        assert_eq!(u64::from_be_bytes(g[8..16].try_into().unwrap()), IHAVEOPT);
        let flags = u16::from_be_bytes(g[16..18].try_into().unwrap());
        assert_eq!(
            flags & FLAG_FIXED_NEWSTYLE,
            FLAG_FIXED_NEWSTYLE,
            "server does not offer fixed newstyle: {flags:#x}"
        );
        r
    }

    /// Connects and sends the client flags (fixed newstyle, no zeroes).
    pub fn negotiating(d: &Ramd) -> Raw {
        let mut r = Raw::connect(d);
        r.send(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
        r
    }

    /// Negotiates `NBD_OPT_GO` for `name` (simple replies); returns the
    /// connection in transmission phase and the export size.
    pub fn transmission(d: &Ramd, name: &str) -> (Raw, u64) {
        let mut r = Raw::negotiating(d);
        r.send_opt(OPT_GO, &go_data(name));
        let mut size = None;
        loop {
            let (opt, ty, data) = r.opt_reply();
            assert_eq!(opt, OPT_GO);
            match ty {
                REP_INFO => {
                    let info = u16::from_be_bytes(data[0..2].try_into().unwrap());
                    if info == INFO_EXPORT {
                        size = Some(u64::from_be_bytes(data[2..10].try_into().unwrap()));
                    }
                }
                REP_ACK => break,
                _ => panic!("NBD_OPT_GO {name:?}: reply type {ty:#x} {data:?}"),
            }
        }
        (r, size.expect("no NBD_INFO_EXPORT before ACK"))
    }

    pub fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).expect("send to ramd");
    }

    /// Sends, ignoring errors (the server may already have hung up).
    pub fn send_lossy(&mut self, b: &[u8]) {
        let _ = self.s.write_all(b);
    }

    pub fn read_exact(&mut self, buf: &mut [u8]) {
        if let Err(e) = self.s.read_exact(buf) {
            panic!("reading {} bytes from ramd: {e}", buf.len());
        }
    }

    pub fn send_opt(&mut self, opt: u32, data: &[u8]) {
        self.send(&option_request(opt, data));
    }

    pub fn opt_reply(&mut self) -> (u32, u32, Vec<u8>) {
        let mut h = [0u8; OPTION_REPLY_LEN];
        self.read_exact(&mut h);
        let Some(OptionReply { opt, kind, len }) = OptionReply::parse(&h) else {
            panic!("bad option reply magic: {h:?}");
        };
        assert!(len <= 1 << 20, "option reply of {len} bytes");
        let mut data = vec![0u8; len as usize];
        self.read_exact(&mut data);
        (opt, kind, data)
    }

    /// Sends a request header; `ty` may be a command ramd does not know.
    pub fn request(&mut self, flags: u16, ty: u16, cookie: u64, offset: u64, len: u32) {
        let req = Request {
            flags,
            cmd: ty.into(),
            cookie,
            offset,
            length: len,
        };
        self.send(&req.encode());
    }

    /// Reads a simple reply; `data_len` bytes follow it when it succeeds.
    pub fn simple_reply(&mut self, data_len: usize) -> (u32, u64, Vec<u8>) {
        let mut h = [0u8; SIMPLE_REPLY_LEN];
        self.read_exact(&mut h);
        let (error, cookie) = reply_header(&h);
        let mut data = Vec::new();
        if error == 0 && data_len > 0 {
            data.resize(data_len, 0);
            self.read_exact(&mut data);
        }
        (error, cookie, data)
    }

    /// Reads until the server hangs up; returns whatever it sent first.
    /// Fails if the connection is still open after [`REPLY_TIMEOUT`].
    pub fn expect_hangup(&mut self, what: &str) -> Vec<u8> {
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            match self.s.read(&mut buf) {
                Ok(0) => return got,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    assert!(got.len() < 1 << 20, "{what}: server keeps sending data");
                }
                Err(e) if e.kind() == ErrorKind::ConnectionReset => return got,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                    panic!("{what}: server did not hang up within {REPLY_TIMEOUT:?}")
                }
                Err(e) => panic!("{what}: reading: {e}"),
            }
        }
    }
}

/// A simple reply's header: (error, cookie). Fails the test on a bad magic.
pub fn reply_header(h: &[u8]) -> (u32, u64) {
    let Some(SimpleReply { error, cookie }) = h.try_into().ok().and_then(SimpleReply::parse) else {
        panic!("bad simple reply header: {h:?}");
    };
    (error, cookie)
}
