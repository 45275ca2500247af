//! A raw NBD client, byte by byte, for tests that must send what no real
//! client would (bad magic, truncated requests, huge lengths).

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use super::Ramd;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
pub const FLAG_NO_ZEROES: u16 = 2;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_GO: u32 = 7;
pub const REP_ACK: u32 = 1;
pub const REP_INFO: u32 = 3;
pub const REP_ERR: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR | 1;
pub const REP_ERR_INVALID: u32 = REP_ERR | 3;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR | 6;

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_BLOCK_STATUS: u16 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;

pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;

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
        r.send(&u32::from(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
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
                    if info == 0 {
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
        let mut m = Vec::new();
        m.extend_from_slice(&IHAVEOPT.to_be_bytes());
        m.extend_from_slice(&opt.to_be_bytes());
        m.extend_from_slice(&(data.len() as u32).to_be_bytes());
        m.extend_from_slice(data);
        self.send(&m);
    }

    pub fn opt_reply(&mut self) -> (u32, u32, Vec<u8>) {
        let mut h = [0u8; 20];
        self.read_exact(&mut h);
        assert_eq!(
            u64::from_be_bytes(h[0..8].try_into().unwrap()),
            OPT_REPLY_MAGIC,
            "bad option reply magic: {h:?}"
        );
        let opt = u32::from_be_bytes(h[8..12].try_into().unwrap());
        let ty = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        assert!(len <= 1 << 20, "option reply of {len} bytes");
        let mut data = vec![0u8; len as usize];
        self.read_exact(&mut data);
        (opt, ty, data)
    }

    pub fn request(&mut self, flags: u16, ty: u16, cookie: u64, offset: u64, len: u32) {
        let mut m = Vec::with_capacity(28);
        m.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        m.extend_from_slice(&flags.to_be_bytes());
        m.extend_from_slice(&ty.to_be_bytes());
        m.extend_from_slice(&cookie.to_be_bytes());
        m.extend_from_slice(&offset.to_be_bytes());
        m.extend_from_slice(&len.to_be_bytes());
        self.send(&m);
    }

    /// Reads a simple reply; `data_len` bytes follow it when it succeeds.
    pub fn simple_reply(&mut self, data_len: usize) -> (u32, u64, Vec<u8>) {
        let mut h = [0u8; 16];
        self.read_exact(&mut h);
        assert_eq!(
            u32::from_be_bytes(h[0..4].try_into().unwrap()),
            SIMPLE_REPLY_MAGIC,
            "bad simple reply magic: {h:?}"
        );
        let err = u32::from_be_bytes(h[4..8].try_into().unwrap());
        let cookie = u64::from_be_bytes(h[8..16].try_into().unwrap());
        let mut data = Vec::new();
        if err == 0 && data_len > 0 {
            data.resize(data_len, 0);
            self.read_exact(&mut data);
        }
        (err, cookie, data)
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

pub fn go_data(name: &str) -> Vec<u8> {
    let mut d = Vec::new();
    d.extend_from_slice(&(name.len() as u32).to_be_bytes());
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&0u16.to_be_bytes());
    d
}
