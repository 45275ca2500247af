//! The transmission phase of one connection.
//!
//! Like nbdkit, each connection runs a few worker threads that take turns
//! on the socket: a worker holds the read lock just long enough to read one
//! request (header and payload), works on the store without any connection
//! lock, then holds the write lock to send its whole reply in one write.
//! Requests are therefore served concurrently and answered out of order,
//! and nothing is handed between threads on the hot path.
//!
//! Requests are validated here, once; the store only asserts.

use std::io::{self, BufReader, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

use crate::handshake::Session;
use crate::proto::*;
use crate::Stream;

/// Most descriptors one BLOCK_STATUS reply carries (8 bytes each): the
/// client asks again for the rest.
const MAX_DESCRIPTORS: usize = 128 << 10;
/// Room kept in front of read data for the reply headers.
const READ_HEADROOM: usize = STRUCTURED_REPLY_LEN + 8;

struct Conn<'a> {
    reader: Mutex<BufReader<Stream>>,
    writer: Mutex<Stream>,
    stream: &'a Stream,
    session: &'a Session,
    peer: &'a str,
    /// Set once the client said DISC, hung up, or broke the framing.
    done: AtomicBool,
}

/// A request as read off the wire, payload (for WRITE) in the worker's buffer.
enum Next {
    Request(Request),
    /// A WRITE longer than MAX_PAYLOAD whose payload was skipped.
    Oversized(Request),
    Stop,
}

/// An error for the client: the NBD error value and a message for logs
/// and structured error chunks.
struct Failure(u32, String);

fn fail<T>(errno: u32, msg: impl Into<String>) -> Result<T, Failure> {
    Err(Failure(errno, msg.into()))
}

impl From<ramd_store::Error> for Failure {
    fn from(e: ramd_store::Error) -> Failure {
        let errno = match e.errno() {
            libc::EPERM => EPERM,
            libc::ENOMEM => ENOMEM,
            libc::EINVAL => EINVAL,
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ENOSPC,
            libc::EOVERFLOW => EOVERFLOW,
            libc::ENOTSUP => ENOTSUP,
            libc::ESHUTDOWN => ESHUTDOWN,
            _ => EIO,
        };
        Failure(errno, e.to_string())
    }
}

pub(crate) fn run(
    stream: &Stream,
    session: &Session,
    threads: usize,
    peer: &str,
) -> io::Result<()> {
    let conn = Conn {
        reader: Mutex::new(BufReader::with_capacity(128 << 10, stream.try_clone()?)),
        writer: Mutex::new(stream.try_clone()?),
        stream,
        session,
        peer,
        done: AtomicBool::new(false),
    };
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| conn.worker());
        }
    });
    Ok(())
}

impl Conn<'_> {
    fn worker(&self) {
        let mut buf = Vec::new();
        loop {
            let next = {
                let mut r = self.reader.lock();
                if self.done.load(Ordering::Acquire) {
                    return;
                }
                let next = self.read_request(&mut r, &mut buf);
                if !matches!(next, Ok(Next::Request(_) | Next::Oversized(_))) {
                    self.done.store(true, Ordering::Release);
                }
                next
            };
            let result = match next {
                Ok(Next::Request(req)) => self.handle(req, &mut buf),
                Ok(Next::Oversized(req)) => self.send_error(
                    &req,
                    &Failure(
                        EINVAL,
                        format!("write of {} bytes exceeds the 32 MiB maximum", req.length),
                    ),
                ),
                Ok(Next::Stop) => return,
                Err(e) => {
                    log::warn!("{}: {e}; disconnecting", self.peer);
                    let _ = self.stream.shutdown();
                    return;
                }
            };
            if let Err(e) = result {
                // The client is gone: reading will fail too; stop everyone.
                log::debug!("{}: reply not sent: {e}", self.peer);
                self.done.store(true, Ordering::Release);
                let _ = self.stream.shutdown();
                return;
            }
        }
    }

    fn read_request(&self, r: &mut BufReader<Stream>, buf: &mut Vec<u8>) -> io::Result<Next> {
        let mut hdr = [0u8; REQUEST_LEN];
        // A hang-up between requests is a normal end; inside one it is not.
        if r.read(&mut hdr[..1])? == 0 {
            return Ok(Next::Stop);
        }
        r.read_exact(&mut hdr[1..])?;
        let Some(req) = Request::parse(&hdr) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "request with bad magic",
            ));
        };
        match req.cmd {
            Cmd::Disc => Ok(Next::Stop),
            Cmd::Write if req.length > MAX_PAYLOAD => {
                discard(r, req.length as u64)?;
                Ok(Next::Oversized(req))
            }
            Cmd::Write => {
                let n = req.length as usize;
                if buf.len() < n {
                    buf.resize(n, 0);
                }
                r.read_exact(&mut buf[..n])?;
                Ok(Next::Request(req))
            }
            _ => Ok(Next::Request(req)),
        }
    }

    fn handle(&self, req: Request, buf: &mut Vec<u8>) -> io::Result<()> {
        if let Err(f) = self.validate(&req) {
            return self.send_error(&req, &f);
        }
        let store = &self.session.export.store;
        let (off, len) = (req.offset, req.length as u64);
        let fua = req.flags & CMD_FLAG_FUA != 0;
        let result: Result<(), Failure> = match req.cmd {
            Cmd::Read => return self.read(&req, buf),
            Cmd::BlockStatus => return self.block_status(&req),
            Cmd::Write => store.write(off, &buf[..len as usize]).map_err(Into::into),
            Cmd::Trim => store.trim(off, len).map_err(Into::into),
            Cmd::WriteZeroes => store
                .zero(off, len, req.flags & CMD_FLAG_NO_HOLE == 0)
                .map_err(Into::into),
            Cmd::Flush => store.flush().map_err(Into::into),
            // Memory is the cache: there is nothing to prefetch.
            Cmd::Cache => Ok(()),
            Cmd::Disc | Cmd::Other(_) => unreachable!("rejected by validate"),
        };
        let result = result.and_then(|()| {
            if fua {
                store.flush()?;
            }
            Ok(())
        });
        match result {
            Ok(()) => self.send_ok(&req),
            Err(f) => self.send_error(&req, &f),
        }
    }

    /// The protocol's rules for a request, checked before the store sees it.
    fn validate(&self, req: &Request) -> Result<(), Failure> {
        let s = self.session;
        let allowed = match req.cmd {
            Cmd::Read if s.structured => CMD_FLAG_DF,
            Cmd::Read | Cmd::Flush | Cmd::Cache => 0,
            Cmd::Write | Cmd::Trim => CMD_FLAG_FUA,
            Cmd::WriteZeroes => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            Cmd::BlockStatus => CMD_FLAG_REQ_ONE,
            Cmd::Disc | Cmd::Other(_) => {
                return fail(EINVAL, format!("unknown command {:?}", req.cmd));
            }
        };
        if req.flags & !allowed != 0 {
            return fail(
                EINVAL,
                format!("flags {:#x} not valid for {:?}", req.flags, req.cmd),
            );
        }
        let writes = matches!(req.cmd, Cmd::Write | Cmd::Trim | Cmd::WriteZeroes);
        if writes && s.export.read_only {
            return fail(EPERM, "export is read-only");
        }
        if req.cmd == Cmd::Flush {
            return Ok(());
        }
        let size = s.export.store.size();
        let in_range = req
            .offset
            .checked_add(req.length as u64)
            .is_some_and(|end| end <= size);
        if !in_range {
            // The protocol asks ENOSPC for writes past the end, EINVAL otherwise.
            let errno = if matches!(req.cmd, Cmd::Write | Cmd::WriteZeroes) {
                ENOSPC
            } else {
                EINVAL
            };
            return fail(
                errno,
                format!(
                    "offset {} length {} is beyond the export size {size}",
                    req.offset, req.length
                ),
            );
        }
        match req.cmd {
            Cmd::Read if req.length > MAX_PAYLOAD => fail(
                EINVAL,
                format!("read of {} bytes exceeds the 32 MiB maximum", req.length),
            ),
            Cmd::BlockStatus if !s.block_status => {
                fail(EINVAL, "base:allocation was not negotiated")
            }
            Cmd::BlockStatus if req.length == 0 => fail(EINVAL, "block status of length 0"),
            _ => Ok(()),
        }
    }

    fn read(&self, req: &Request, buf: &mut Vec<u8>) -> io::Result<()> {
        let len = req.length as usize;
        let need = READ_HEADROOM + len;
        if buf.len() < need {
            buf.resize(need, 0);
        }
        if let Err(e) = self
            .session
            .export
            .store
            .read(req.offset, &mut buf[READ_HEADROOM..need])
        {
            return self.send_error(req, &e.into());
        }
        // Headers go right before the data so the reply is one write.
        let start = if self.session.structured {
            let start = READ_HEADROOM - STRUCTURED_REPLY_LEN - 8;
            let (flags, kind) = (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA);
            structured_reply_header(&mut buf[start..], flags, kind, req.cookie, 8 + len as u32);
            buf[start + STRUCTURED_REPLY_LEN..READ_HEADROOM]
                .copy_from_slice(&req.offset.to_be_bytes());
            start
        } else {
            let start = READ_HEADROOM - SIMPLE_REPLY_LEN;
            simple_reply_header(&mut buf[start..], 0, req.cookie);
            start
        };
        self.send(&buf[start..need])
    }

    fn block_status(&self, req: &Request) -> io::Result<()> {
        let max = if req.flags & CMD_FLAG_REQ_ONE != 0 {
            1
        } else {
            MAX_DESCRIPTORS
        };
        let extents = match self
            .session
            .export
            .store
            .extents(req.offset, req.length as u64, max)
        {
            Ok(e) => e,
            Err(e) => return self.send_error(req, &e.into()),
        };
        let len = 4 + 8 * extents.len();
        let mut out = vec![0; STRUCTURED_REPLY_LEN];
        structured_reply_header(
            &mut out,
            REPLY_FLAG_DONE,
            REPLY_TYPE_BLOCK_STATUS,
            req.cookie,
            len as u32,
        );
        out.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
        for e in extents {
            let flags = match e.kind {
                ramd_store::ExtentKind::Hole => STATE_HOLE | STATE_ZERO,
                ramd_store::ExtentKind::Zero => STATE_ZERO,
                ramd_store::ExtentKind::Data => 0,
            };
            // Extents never exceed the request, whose length is a u32.
            out.extend_from_slice(&(e.length as u32).to_be_bytes());
            out.extend_from_slice(&flags.to_be_bytes());
        }
        self.send(&out)
    }

    fn send_ok(&self, req: &Request) -> io::Result<()> {
        let mut b = [0; SIMPLE_REPLY_LEN];
        simple_reply_header(&mut b, 0, req.cookie);
        self.send(&b)
    }

    fn send_error(&self, req: &Request, f: &Failure) -> io::Result<()> {
        log::debug!(
            "{}: {:?} offset {} length {}: error {}: {}",
            self.peer,
            req.cmd,
            req.offset,
            req.length,
            f.0,
            f.1
        );
        if self.session.structured {
            self.send(&structured_error(req.cookie, f.0, &f.1))
        } else {
            let mut b = [0; SIMPLE_REPLY_LEN];
            simple_reply_header(&mut b, f.0, req.cookie);
            self.send(&b)
        }
    }

    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        let mut w = self.writer.lock();
        w.write_all(bytes)?;
        w.flush()
    }
}
