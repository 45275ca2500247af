//! A small NBD client, written from the protocol document like the server:
//! fixed newstyle negotiation with `NBD_OPT_GO` (falling back to
//! `NBD_OPT_EXPORT_NAME` on servers that do not know it), then READ, WRITE
//! and FLUSH with simple replies, several requests in flight at once.
//!
//! It never asks for structured replies: a READ's reply is then always the
//! header followed by exactly the bytes asked for, which keeps the reader a
//! few lines long. `ramd bench` uses it to drive NBD targets.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

use crate::proto::{
    self, go_data, option_request, Cmd, OptionReply, Request, SimpleReply, IHAVEOPT, NBDMAGIC,
    OPT_ABORT, OPT_EXPORT_NAME, OPT_GO,
};
use crate::Stream;

/// The default NBD TCP port (IANA).
pub const DEFAULT_PORT: u16 = 10809;

/// Where an export is: a parsed `nbd://` or `nbd+unix://` URI (the NBD URI
/// specification's two plain forms; TLS variants are not supported).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Address {
    pub endpoint: Endpoint,
    pub export: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

impl Address {
    /// Parses `nbd://HOST[:PORT][/EXPORT]` or
    /// `nbd+unix:///[EXPORT]?socket=PATH`. Percent-escapes in the export
    /// name and socket path are decoded.
    pub fn parse(uri: &str) -> Result<Address, String> {
        if let Some(rest) = uri.strip_prefix("nbd+unix://") {
            let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
            if !path.is_empty() && !path.starts_with('/') {
                return Err(format!(
                    "{uri}: an nbd+unix URI has no host (nbd+unix:///EXPORT?socket=PATH)"
                ));
            }
            let export = percent_decode(path.strip_prefix('/').unwrap_or(path))?;
            let mut socket = None;
            for kv in query.split('&').filter(|s| !s.is_empty()) {
                match kv.split_once('=') {
                    Some(("socket", v)) => socket = Some(PathBuf::from(percent_decode(v)?)),
                    _ => return Err(format!("{uri}: unknown query parameter {kv:?}")),
                }
            }
            let socket =
                socket.ok_or_else(|| format!("{uri}: an nbd+unix URI needs ?socket=PATH"))?;
            return Ok(Address {
                endpoint: Endpoint::Unix(socket),
                export,
            });
        }
        let rest = uri
            .strip_prefix("nbd://")
            .ok_or_else(|| format!("{uri}: not an nbd:// or nbd+unix:// URI"))?;
        if rest.contains('?') {
            return Err(format!("{uri}: nbd:// URIs take no query parameters here"));
        }
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (h, after) = v6
                .split_once(']')
                .ok_or_else(|| format!("{uri}: unclosed '[' in the host"))?;
            (h.to_string(), after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), Some(p)),
                None => (authority.to_string(), None),
            }
        };
        if host.is_empty() {
            return Err(format!("{uri}: no host"));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => p.parse().map_err(|_| format!("{uri}: bad port {p:?}"))?,
        };
        Ok(Address {
            endpoint: Endpoint::Tcp { host, port },
            export: percent_decode(path)?,
        })
    }
}

fn percent_decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent-escape in {s:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} is not UTF-8 once decoded"))
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.endpoint {
            Endpoint::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd://[{host}]:{port}/{}", self.export)
            }
            Endpoint::Tcp { host, port } => write!(f, "nbd://{host}:{port}/{}", self.export),
            Endpoint::Unix(p) => write!(f, "nbd+unix:///{}?socket={}", self.export, p.display()),
        }
    }
}

/// A command that can be in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read,
    Write,
    Flush,
}

/// The reply to one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reply {
    pub cookie: u64,
    pub command: Command,
    /// The server's error value (0: success; otherwise an errno-like NBD
    /// error such as `proto::EIO`).
    pub error: u32,
}

/// A connected client, in transmission phase.
pub struct Client {
    reader: Stream,
    writer: Stream,
    size: u64,
    flags: u16,
    next_cookie: u64,
    /// Requests sent and not yet answered: what each was and, for a READ,
    /// how many bytes follow its reply.
    in_flight: HashMap<u64, (Command, u32)>,
    /// Reused buffer for a request header and its payload.
    out: Vec<u8>,
    /// Reused buffer for `read_at`'s reply.
    scratch: Vec<u8>,
}

fn protocol_error(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

impl Client {
    /// Connects and negotiates the export named in `addr`.
    pub fn connect(addr: &Address) -> io::Result<Client> {
        let stream = match &addr.endpoint {
            Endpoint::Unix(p) => Stream::Unix(
                UnixStream::connect(p)
                    .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", p.display())))?,
            ),
            Endpoint::Tcp { host, port } => {
                let s = TcpStream::connect((host.as_str(), *port))
                    .map_err(|e| io::Error::new(e.kind(), format!("{host}:{port}: {e}")))?;
                // Requests are whole messages written at once.
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
        };
        let mut reader = stream.try_clone()?;
        let mut writer = stream;
        let (size, flags) = negotiate(&mut reader, &mut writer, &addr.export)?;
        Ok(Client {
            reader,
            writer,
            size,
            flags,
            next_cookie: 1,
            in_flight: HashMap::new(),
            out: Vec::new(),
            scratch: Vec::new(),
        })
    }

    /// The export's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The transmission flags the server sent.
    pub fn flags(&self) -> u16 {
        self.flags
    }

    pub fn read_only(&self) -> bool {
        self.flags & proto::TF_READ_ONLY != 0
    }

    /// Whether the server takes NBD_CMD_FLUSH (otherwise a flush is a
    /// no-op: the server promised nothing is cached).
    pub fn can_flush(&self) -> bool {
        self.flags & proto::TF_SEND_FLUSH != 0
    }

    /// Requests sent and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn send(&mut self, cmd: Command, offset: u64, len: u32, payload: &[u8]) -> io::Result<u64> {
        let end = offset.checked_add(u64::from(len));
        if cmd != Command::Flush && !matches!(end, Some(e) if e <= self.size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "request [{offset}, +{len}) is past the export's end ({} bytes)",
                    self.size
                ),
            ));
        }
        let cookie = self.next_cookie;
        self.next_cookie += 1;
        let req = Request {
            flags: 0,
            cmd: match cmd {
                Command::Read => Cmd::Read,
                Command::Write => Cmd::Write,
                Command::Flush => Cmd::Flush,
            },
            cookie,
            offset,
            length: len,
        };
        self.out.clear();
        self.out.extend_from_slice(&req.encode());
        self.out.extend_from_slice(payload);
        self.writer.write_all(&self.out)?;
        let follows = if cmd == Command::Read { len } else { 0 };
        self.in_flight.insert(cookie, (cmd, follows));
        Ok(cookie)
    }

    /// Sends a READ of `len` bytes at `offset`; returns its cookie.
    pub fn submit_read(&mut self, offset: u64, len: u32) -> io::Result<u64> {
        self.send(Command::Read, offset, len, &[])
    }

    /// Sends a WRITE of `data` at `offset`; returns its cookie.
    pub fn submit_write(&mut self, offset: u64, data: &[u8]) -> io::Result<u64> {
        let len = u32::try_from(data.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "write over 4 GiB"))?;
        self.send(Command::Write, offset, len, data)
    }

    /// Sends a FLUSH; returns its cookie.
    pub fn submit_flush(&mut self) -> io::Result<u64> {
        self.send(Command::Flush, 0, 0, &[])
    }

    /// Waits for the next reply (in whatever order the server answers).
    /// A READ's data is stored in `data` (resized to fit).
    pub fn next_reply(&mut self, data: &mut Vec<u8>) -> io::Result<Reply> {
        let mut h = [0u8; proto::SIMPLE_REPLY_LEN];
        self.reader.read_exact(&mut h)?;
        let Some(SimpleReply { error, cookie }) = SimpleReply::parse(&h) else {
            let magic = u32::from_be_bytes(h[0..4].try_into().expect("4 bytes"));
            return Err(protocol_error(format!(
                "reply magic {magic:#x} is not the simple reply's (structured replies were not asked for)"
            )));
        };
        let (command, follows) = self
            .in_flight
            .remove(&cookie)
            .ok_or_else(|| protocol_error(format!("reply for unknown cookie {cookie}")))?;
        // Data follows a READ's reply only when it succeeded.
        if command == Command::Read && error == 0 {
            // Resized only when the length changes: zeroing a buffer
            // that is overwritten at once would cost as much as the read.
            if data.len() != follows as usize {
                data.resize(follows as usize, 0);
            }
            self.reader.read_exact(data)?;
        }
        Ok(Reply {
            cookie,
            command,
            error,
        })
    }

    fn wait_one(&mut self, data: &mut Vec<u8>, what: &str) -> io::Result<()> {
        let r = self.next_reply(data)?;
        if r.error != 0 {
            return Err(nbd_error(r.error, what));
        }
        Ok(())
    }

    /// Reads `buf.len()` bytes at `offset`, one request at a time (call
    /// with nothing in flight).
    pub fn read_at(&mut self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut data = std::mem::take(&mut self.scratch);
        let r = self
            .submit_read(offset, buf.len() as u32)
            .and_then(|_| self.wait_one(&mut data, "read"));
        if r.is_ok() {
            buf.copy_from_slice(&data);
        }
        self.scratch = data;
        r
    }

    /// Writes `buf` at `offset` and waits for the reply.
    pub fn write_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.submit_write(offset, buf)?;
        self.wait_one(&mut Vec::new(), "write")
    }

    /// Flushes the server's cache, when it has one.
    pub fn flush(&mut self) -> io::Result<()> {
        if !self.can_flush() {
            return Ok(());
        }
        self.submit_flush()?;
        self.wait_one(&mut Vec::new(), "flush")
    }

    /// Sends NBD_CMD_DISC after draining what is in flight, and closes.
    pub fn disconnect(&mut self) -> io::Result<()> {
        let mut data = Vec::new();
        while !self.in_flight.is_empty() {
            self.next_reply(&mut data)?;
        }
        let req = Request {
            flags: 0,
            cmd: Cmd::Disc,
            cookie: 0,
            offset: 0,
            length: 0,
        };
        self.writer.write_all(&req.encode())?;
        self.writer.shutdown()
    }
}

/// An io::Error for an NBD error value in a reply.
pub fn nbd_error(error: u32, what: &str) -> io::Error {
    // NBD's error values are Linux errnos by definition.
    let os = io::Error::from_raw_os_error(error as i32);
    io::Error::new(os.kind(), format!("NBD {what} failed: {os}"))
}

fn read_u16(r: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    r.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

fn send_option(w: &mut impl Write, opt: u32, data: &[u8]) -> io::Result<()> {
    w.write_all(&option_request(opt, data))
}

/// Fixed newstyle negotiation; returns the export's size and flags.
fn negotiate(r: &mut impl Read, w: &mut impl Write, export: &str) -> io::Result<(u64, u16)> {
    if proto::read_u64(r)? != NBDMAGIC {
        return Err(protocol_error("not an NBD server (no NBDMAGIC)"));
    }
    if proto::read_u64(r)? != IHAVEOPT {
        return Err(protocol_error(
            "the server speaks oldstyle negotiation, which is not supported",
        ));
    }
    let server_flags = read_u16(r)?;
    if server_flags & proto::FLAG_FIXED_NEWSTYLE == 0 {
        return Err(protocol_error(
            "the server does not speak fixed newstyle negotiation",
        ));
    }
    let no_zeroes = server_flags & proto::FLAG_NO_ZEROES != 0;
    let mut client_flags = proto::FLAG_C_FIXED_NEWSTYLE;
    if no_zeroes {
        client_flags |= proto::FLAG_C_NO_ZEROES;
    }
    w.write_all(&client_flags.to_be_bytes())?;
    if export.len() > proto::MAX_STRING {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "export name too long",
        ));
    }

    send_option(w, OPT_GO, &go_data(export))?;
    let mut info: Option<(u64, u16)> = None;
    loop {
        let mut h = [0u8; proto::OPTION_REPLY_LEN];
        r.read_exact(&mut h)?;
        let Some(OptionReply { opt, kind, len }) = OptionReply::parse(&h) else {
            return Err(protocol_error("bad option reply magic"));
        };
        if opt != OPT_GO {
            return Err(protocol_error(format!(
                "option reply for option {opt}, expected NBD_OPT_GO"
            )));
        }
        if len > 1 << 20 {
            return Err(protocol_error(format!("option reply of {len} bytes")));
        }
        let mut body = vec![0u8; len as usize];
        r.read_exact(&mut body)?;
        match kind {
            proto::REP_ACK => break,
            proto::REP_INFO
                if body.len() >= 12
                    && u16::from_be_bytes([body[0], body[1]]) == proto::INFO_EXPORT =>
            {
                let size = u64::from_be_bytes(body[2..10].try_into().expect("8 bytes"));
                let flags = u16::from_be_bytes([body[10], body[11]]);
                info = Some((size, flags));
            }
            proto::REP_ERR_UNSUP => {
                // An old server: NBD_OPT_EXPORT_NAME has no error path (the
                // server just hangs up on an unknown export).
                return export_name(r, w, export, no_zeroes);
            }
            k if k & proto::REP_ERR != 0 => {
                let msg = String::from_utf8_lossy(&body);
                let what = match k {
                    proto::REP_ERR_UNKNOWN => "no such export".to_string(),
                    proto::REP_ERR_POLICY => "refused by the server's policy".to_string(),
                    proto::REP_ERR_INVALID => "invalid request".to_string(),
                    _ => format!("error {:#x}", k),
                };
                let _ = send_option(w, OPT_ABORT, &[]);
                return Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    if msg.is_empty() {
                        format!("export {export:?}: {what}")
                    } else {
                        format!("export {export:?}: {what}: {msg}")
                    },
                ));
            }
            // Other replies (NBD_REP_SERVER and the like) carry nothing we need.
            _ => {}
        }
    }
    info.ok_or_else(|| protocol_error("NBD_OPT_GO ended without NBD_INFO_EXPORT"))
}

fn export_name(
    r: &mut impl Read,
    w: &mut impl Write,
    export: &str,
    no_zeroes: bool,
) -> io::Result<(u64, u16)> {
    send_option(w, OPT_EXPORT_NAME, export.as_bytes())?;
    let size = proto::read_u64(r).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("export {export:?}: the server hung up (no such export?)"),
            )
        } else {
            e
        }
    })?;
    let flags = read_u16(r)?;
    if !no_zeroes {
        proto::discard(r, 124)?;
    }
    Ok((size, flags))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::option_reply;

    /// A server's side of a negotiation: its greeting, then `replies`.
    fn server_bytes(flags: u16, replies: &[u8]) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend_from_slice(b"NBDMAGIC");
        b.extend_from_slice(b"IHAVEOPT");
        b.extend_from_slice(&flags.to_be_bytes());
        b.extend_from_slice(replies);
        b
    }

    #[test]
    fn negotiates_with_opt_go() {
        // NBD_REP_INFO / NBD_INFO_EXPORT: size 1 MiB, flags HAS_FLAGS|SEND_FLUSH.
        let mut info = proto::INFO_EXPORT.to_be_bytes().to_vec();
        info.extend_from_slice(&(1u64 << 20).to_be_bytes());
        info.extend_from_slice(&(proto::TF_HAS_FLAGS | proto::TF_SEND_FLUSH).to_be_bytes());
        let mut replies = option_reply(OPT_GO, proto::REP_INFO, &info);
        replies.extend(option_reply(OPT_GO, proto::REP_ACK, &[]));
        let input = server_bytes(proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES, &replies);
        let mut sent = Vec::new();
        let got = negotiate(&mut &input[..], &mut sent, "disk").unwrap();
        assert_eq!(got, (1 << 20, proto::TF_HAS_FLAGS | proto::TF_SEND_FLUSH));
        // Client flags FIXED_NEWSTYLE|NO_ZEROES, then IHAVEOPT, NBD_OPT_GO
        // (7), length 10: name length 4, "disk", no information requests.
        let mut want = 3u32.to_be_bytes().to_vec();
        want.extend_from_slice(b"IHAVEOPT");
        want.extend_from_slice(&7u32.to_be_bytes());
        want.extend_from_slice(&10u32.to_be_bytes());
        want.extend_from_slice(&4u32.to_be_bytes());
        want.extend_from_slice(b"disk");
        want.extend_from_slice(&0u16.to_be_bytes());
        assert_eq!(sent, want);
    }

    #[test]
    fn falls_back_to_export_name_when_go_is_unknown() {
        // NBD_REP_ERR_UNSUP to OPT_GO; then EXPORT_NAME's reply: size,
        // flags and (no NO_ZEROES) 124 zero bytes.
        let mut replies = option_reply(OPT_GO, proto::REP_ERR_UNSUP, &[]);
        replies.extend_from_slice(&4096u64.to_be_bytes());
        replies.extend_from_slice(&proto::TF_HAS_FLAGS.to_be_bytes());
        replies.extend_from_slice(&[0u8; 124]);
        let input = server_bytes(proto::FLAG_FIXED_NEWSTYLE, &replies);
        let mut sent = Vec::new();
        let got = negotiate(&mut &input[..], &mut sent, "x").unwrap();
        assert_eq!(got, (4096, proto::TF_HAS_FLAGS));
        // The last message: IHAVEOPT, NBD_OPT_EXPORT_NAME (1), length 1, "x".
        let mut tail = b"IHAVEOPT".to_vec();
        tail.extend_from_slice(&1u32.to_be_bytes());
        tail.extend_from_slice(&1u32.to_be_bytes());
        tail.extend_from_slice(b"x");
        assert!(sent.ends_with(&tail), "{sent:?}");
        // Client flags: FIXED_NEWSTYLE only, since the server lacks NO_ZEROES.
        assert_eq!(&sent[..4], &1u32.to_be_bytes());
    }

    #[test]
    fn refuses_servers_it_cannot_speak_to() {
        let mut sent = Vec::new();
        let oldstyle = [
            b"NBDMAGIC".as_slice(),
            &0x0000_4202_8186_1253_u64.to_be_bytes(),
        ]
        .concat();
        let e = negotiate(&mut &oldstyle[..], &mut sent, "").unwrap_err();
        assert!(e.to_string().contains("oldstyle"), "{e}");
        let unfixed = server_bytes(0, &[]);
        let e = negotiate(&mut &unfixed[..], &mut sent, "").unwrap_err();
        assert!(e.to_string().contains("fixed newstyle"), "{e}");
        // NBD_REP_ERR_UNKNOWN with a message: no such export, named.
        let replies = option_reply(OPT_GO, proto::REP_ERR_UNKNOWN, b"not here");
        let input = server_bytes(proto::FLAG_FIXED_NEWSTYLE, &replies);
        let e = negotiate(&mut &input[..], &mut Vec::new(), "nope").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("\"nope\"") && msg.contains("no such export") && msg.contains("not here"),
            "{msg}"
        );
    }

    #[test]
    fn parses_uris() {
        let a = Address::parse("nbd+unix:///ram0?socket=/run/ramd/ram0.sock").unwrap();
        assert_eq!(a.export, "ram0");
        assert_eq!(a.endpoint, Endpoint::Unix("/run/ramd/ram0.sock".into()));
        let a = Address::parse("nbd://localhost:10810/disk%20a").unwrap();
        assert_eq!(a.export, "disk a");
        assert_eq!(
            a.endpoint,
            Endpoint::Tcp {
                host: "localhost".into(),
                port: 10810
            }
        );
        let a = Address::parse("nbd://[::1]/x").unwrap();
        assert_eq!(
            a.endpoint,
            Endpoint::Tcp {
                host: "::1".into(),
                port: DEFAULT_PORT
            }
        );
        assert_eq!(Address::parse("nbd://h").unwrap().export, "");
        for bad in [
            "nbd+unix:///x",
            "nbd+unix://host/x?socket=/s",
            "nbd://h:port/x",
            "nbd://:1/x",
            "nbds://h/x",
            "nbd+unix:///x?socket=/s&tls=on",
            "nbd://h/%zz",
        ] {
            assert!(Address::parse(bad).is_err(), "{bad} parsed");
        }
    }
}
