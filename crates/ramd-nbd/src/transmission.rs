//! The transmission phase of one connection.
//!
//! The connection's own thread reads requests. Small ones (at most
//! `INLINE_MAX` bytes of effect: the 4 KiB I/O that dominates random
//! workloads) it serves itself, appending each reply to an output buffer
//! that goes out in one `write` when no further complete request is already
//! buffered. One read and one write syscall thus serve a whole burst of
//! requests, with no thread hand-off: on our 2-core VMs a hand-off per
//! request (nbdkit's model, and ramd's first one) cost as much CPU as the
//! client itself. Larger requests go to a few worker threads per
//! connection, which reply on their own, out of order, so a 32 MiB read
//! never holds up the small requests behind it.
//!
//! Over TLS the same loop runs on the session's plaintext: the reader
//! decrypts, and every reply is encrypted and sent whole under the
//! session's lock (see `tls.rs`).
//!
//! Requests are validated here, once; the store only asserts.

use std::io::{self, BufReader, Read, Write};
use std::sync::{mpsc, Arc};
use std::time::Instant;

use parking_lot::Mutex;
use ramd_store::metrics::Op;
use ramd_store::Errno;

use crate::handshake::Session;
use crate::proto::*;
use crate::tls::{TlsChannel, TlsSession};
use crate::Stream;

/// Most descriptors one BLOCK_STATUS reply carries (8 bytes each): the
/// client asks again for the rest.
const MAX_DESCRIPTORS: usize = 128 << 10;
/// Header of a structured READ reply (chunk header and 8-byte offset): the
/// most room a reply header takes in front of its data.
const READ_HEADROOM: usize = STRUCTURED_REPLY_LEN + 8;
/// Requests with a larger effect go to the worker threads.
const INLINE_MAX: u32 = 64 << 10;
/// Batched replies are sent once they reach this size.
const FLUSH_AT: usize = 256 << 10;

/// Where replies go: the socket, or the TLS session in front of it.
enum Writer {
    Plain(Mutex<Stream>),
    Tls(Arc<TlsSession>),
}

/// How a negotiated connection's bytes travel.
pub(crate) enum Channel {
    Plain,
    Tls(TlsChannel),
}

struct Conn<'a> {
    writer: Writer,
    stream: &'a Stream,
    session: &'a Session,
    peer: &'a str,
    /// Payload buffers handed back by workers, for the next large write.
    spare: Mutex<Vec<Vec<u8>>>,
}

/// A large request for a worker, with its payload if it is a WRITE.
struct Job {
    req: Request,
    payload: Vec<u8>,
}

/// An error for the client: its errno (the store's vocabulary, turned
/// into an NBD error value only on the wire, by [`nbd_error`]) and a
/// message for logs and structured error chunks.
struct Failure(Errno, String);

fn fail<T>(errno: Errno, msg: impl Into<String>) -> Result<T, Failure> {
    Err(Failure(errno, msg.into()))
}

impl From<ramd_store::Error> for Failure {
    fn from(e: ramd_store::Error) -> Failure {
        Failure(e.errno(), e.to_string())
    }
}

/// The NBD error value for an errno, the one mapping from ramd's errors
/// to NBD's: the protocol has a few; the rest are EIO.
fn nbd_error(e: Errno) -> u32 {
    match e {
        Errno::EPERM => EPERM,
        Errno::ENOMEM => ENOMEM,
        Errno::EINVAL => EINVAL,
        Errno::ENOSPC | Errno::EDQUOT | Errno::EFBIG => ENOSPC,
        Errno::EOVERFLOW => EOVERFLOW,
        Errno::ENOTSUP => ENOTSUP,
        Errno::ESHUTDOWN => ESHUTDOWN,
        _ => EIO,
    }
}

pub(crate) fn run(
    stream: &Stream,
    channel: Channel,
    session: &Session,
    threads: usize,
    peer: &str,
) -> io::Result<()> {
    match channel {
        Channel::Plain => {
            let writer = Writer::Plain(Mutex::new(stream.try_clone()?));
            let reader = BufReader::with_capacity(256 << 10, stream.try_clone()?);
            serve_connection(stream, writer, reader, session, threads, peer);
        }
        Channel::Tls(TlsChannel {
            session: tls,
            reader,
        }) => {
            let writer = Writer::Tls(tls.clone());
            let reader = BufReader::with_capacity(256 << 10, reader);
            serve_connection(stream, writer, reader, session, threads, peer);
            tls.close();
        }
    }
    Ok(())
}

fn serve_connection<R: Read + Send>(
    stream: &Stream,
    writer: Writer,
    mut reader: BufReader<R>,
    session: &Session,
    threads: usize,
    peer: &str,
) {
    let conn = Conn {
        writer,
        stream,
        session,
        peer,
        spare: Mutex::new(Vec::new()),
    };
    let (tx, rx) = mpsc::sync_channel::<Job>(threads.max(1));
    let rx = Mutex::new(rx);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| conn.worker(&rx));
        }
        if let Err(e) = conn.serve(&mut reader, tx) {
            log::warn!("{peer}: {e}; disconnecting");
            // Workers still running fail to reply and stop.
            let _ = stream.shutdown();
        }
        // `tx` is gone: workers finish what they took, then return; DISC
        // is answered only after every request before it.
    });
}

impl Conn<'_> {
    /// The connection thread: reads requests until DISC, EOF or a broken
    /// framing; serves the small ones inline with batched replies.
    fn serve<R: Read>(&self, r: &mut BufReader<R>, tx: mpsc::SyncSender<Job>) -> io::Result<()> {
        let mut out = Vec::with_capacity(FLUSH_AT + READ_HEADROOM + INLINE_MAX as usize);
        let mut payload = vec![0; INLINE_MAX as usize];
        loop {
            // About to wait for the client: send what is ready first.
            if !out.is_empty() && !complete_request_buffered(r.buffer()) {
                self.send(&out)?;
                out.clear();
            }
            let Some(req) = read_header(r)? else {
                break;
            };
            let len = req.length as usize;
            match req.cmd {
                Cmd::Disc => break,
                Cmd::Write if req.length > MAX_REQUEST => {
                    discard(r, req.length as u64)?;
                    let msg = format!("write of {len} bytes exceeds the 64 MiB maximum");
                    self.error_reply(&req, &Failure(Errno::EINVAL, msg), &mut out);
                }
                Cmd::Read | Cmd::Write | Cmd::Trim | Cmd::WriteZeroes | Cmd::BlockStatus
                    if req.length > INLINE_MAX =>
                {
                    let mut payload = Vec::new();
                    if req.cmd == Cmd::Write {
                        // A buffer a worker gave back: no fresh pages to fault in.
                        payload = self.spare.lock().pop().unwrap_or_default();
                        payload.resize(len, 0);
                        r.read_exact(&mut payload)?;
                    }
                    if tx.send(Job { req, payload }).is_err() {
                        break;
                    }
                }
                _ => {
                    if req.cmd == Cmd::Write {
                        r.read_exact(&mut payload[..len])?;
                    }
                    self.respond(req, &payload, &mut out);
                }
            }
            if out.len() >= FLUSH_AT {
                self.send(&out)?;
                out.clear();
            }
        }
        if !out.is_empty() {
            self.send(&out)?;
        }
        Ok(())
    }

    /// A worker: serves large requests until the connection thread is done.
    fn worker(&self, rx: &Mutex<mpsc::Receiver<Job>>) {
        let mut out = Vec::new();
        loop {
            let job = rx.lock().recv();
            let Ok(Job { req, payload }) = job else {
                return;
            };
            out.clear();
            self.respond(req, &payload, &mut out);
            let sent = self.send(&out);
            if req.cmd == Cmd::Write {
                self.spare.lock().push(payload);
            }
            if let Err(e) = sent {
                // The client is gone: the connection thread sees it too.
                log::debug!("{}: reply not sent: {e}", self.peer);
                let _ = self.stream.shutdown();
            }
        }
    }

    /// Serves one request and appends its whole reply to `out`, timing
    /// it from here to its reply being ready (not its queueing or sending).
    fn respond(&self, req: Request, payload: &[u8], out: &mut Vec<u8>) {
        let started = Instant::now();
        let ok = self.serve_request(req, payload, out);
        if let Some(m) = &self.session.export.metrics {
            let op = match req.cmd {
                Cmd::Read => Op::Read,
                Cmd::Write => Op::Write,
                Cmd::Trim => Op::Trim,
                Cmd::WriteZeroes => Op::Zero,
                Cmd::Flush => Op::Flush,
                _ => Op::Other,
            };
            m.record(op, req.length as u64, started, ok);
        }
    }

    /// `respond`'s work; false if the reply is an error.
    fn serve_request(&self, req: Request, payload: &[u8], out: &mut Vec<u8>) -> bool {
        if let Err(f) = self.validate(&req) {
            self.error_reply(&req, &f, out);
            return false;
        }
        let store = &self.session.export.store;
        let (off, len) = (req.offset, req.length as u64);
        let fua = req.flags & CMD_FLAG_FUA != 0;
        // A change is all in or all out of a save (see `Change`); each
        // arm's `Change` is let go at its end, before a FUA flush, which
        // waits for a save.
        let result: Result<(), Failure> = match req.cmd {
            Cmd::Read => return self.read(&req, out),
            Cmd::BlockStatus => return self.block_status(&req, out),
            Cmd::Write => store
                .change()
                .write(off, &payload[..len as usize])
                .map_err(Into::into),
            Cmd::Trim => store.change().trim(off, len).map_err(Into::into),
            Cmd::WriteZeroes => store
                .change()
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
            Ok(()) => {
                let at = out.len();
                out.resize(at + SIMPLE_REPLY_LEN, 0);
                simple_reply_header(&mut out[at..], 0, req.cookie);
                true
            }
            Err(f) => {
                self.error_reply(&req, &f, out);
                false
            }
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
                return fail(Errno::EINVAL, format!("unknown command {:?}", req.cmd));
            }
        };
        if req.flags & !allowed != 0 {
            return fail(
                Errno::EINVAL,
                format!("flags {:#x} not valid for {:?}", req.flags, req.cmd),
            );
        }
        let writes = matches!(req.cmd, Cmd::Write | Cmd::Trim | Cmd::WriteZeroes);
        if writes && (s.export.read_only || s.export.store.standby()) {
            return fail(Errno::EPERM, "export is read-only");
        }
        if req.cmd == Cmd::Flush {
            // "length and offset are reserved, and MUST be set to all-zero"
            // (the NBD specification, NBD_CMD_FLUSH); nbdkit refuses them the same way.
            if req.offset != 0 || req.length != 0 {
                return fail(
                    Errno::EINVAL,
                    format!(
                        "flush with offset {} length {}: both must be 0",
                        req.offset, req.length
                    ),
                );
            }
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
                Errno::ENOSPC
            } else {
                Errno::EINVAL
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
            Cmd::Read if req.length > MAX_REQUEST => fail(
                Errno::EINVAL,
                format!("read of {} bytes exceeds the 64 MiB maximum", req.length),
            ),
            Cmd::BlockStatus if !s.block_status => {
                fail(Errno::EINVAL, "base:allocation was not negotiated")
            }
            Cmd::BlockStatus if req.length == 0 => fail(Errno::EINVAL, "block status of length 0"),
            _ => Ok(()),
        }
    }

    /// False if the reply is an error.
    fn read(&self, req: &Request, out: &mut Vec<u8>) -> bool {
        let len = req.length as usize;
        let at = out.len();
        if len == 0 && self.session.structured {
            // An OFFSET_DATA chunk must carry at least one byte (its length
            // is at least 9); a lone NONE chunk with DONE is "valid as a
            // reply to any request" and means success (the NBD specification,
            // "Structured reply chunk message types").
            out.resize(at + STRUCTURED_REPLY_LEN, 0);
            let (flags, kind) = (REPLY_FLAG_DONE, REPLY_TYPE_NONE);
            structured_reply_header(&mut out[at..], flags, kind, req.cookie, 0);
            return true;
        }
        let hdr = if self.session.structured {
            READ_HEADROOM
        } else {
            SIMPLE_REPLY_LEN
        };
        // Header and data go into the output buffer in place: no copy.
        out.resize(at + hdr + len, 0);
        if let Err(e) = self
            .session
            .export
            .store
            .read(req.offset, &mut out[at + hdr..])
        {
            out.truncate(at);
            self.error_reply(req, &e.into(), out);
            return false;
        }
        if self.session.structured {
            let (flags, kind) = (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA);
            structured_reply_header(&mut out[at..], flags, kind, req.cookie, 8 + len as u32);
            out[at + STRUCTURED_REPLY_LEN..at + hdr].copy_from_slice(&req.offset.to_be_bytes());
        } else {
            simple_reply_header(&mut out[at..], 0, req.cookie);
        }
        true
    }

    /// False if the reply is an error.
    fn block_status(&self, req: &Request, out: &mut Vec<u8>) -> bool {
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
            Err(e) => {
                self.error_reply(req, &e.into(), out);
                return false;
            }
        };
        let len = 4 + 8 * extents.len();
        let at = out.len();
        out.resize(at + STRUCTURED_REPLY_LEN, 0);
        structured_reply_header(
            &mut out[at..],
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
        true
    }

    fn error_reply(&self, req: &Request, f: &Failure, out: &mut Vec<u8>) {
        let error = nbd_error(f.0);
        log::debug!(
            "{}: {:?} offset {} length {}: error {}: {}",
            self.peer,
            req.cmd,
            req.offset,
            req.length,
            error,
            f.1
        );
        if self.session.structured {
            out.extend_from_slice(&structured_error(req.cookie, error, &f.1));
        } else {
            let at = out.len();
            out.resize(at + SIMPLE_REPLY_LEN, 0);
            simple_reply_header(&mut out[at..], error, req.cookie);
        }
    }

    fn send(&self, bytes: &[u8]) -> io::Result<()> {
        match &self.writer {
            Writer::Plain(w) => {
                let mut w = w.lock();
                w.write_all(bytes)?;
                w.flush()
            }
            Writer::Tls(t) => t.send(bytes),
        }
    }
}

/// Whether `buf` starts with a whole request (header, and payload for a
/// WRITE), so that serving it will not wait for the client.
fn complete_request_buffered(buf: &[u8]) -> bool {
    let Some(hdr) = buf.get(..REQUEST_LEN) else {
        return false;
    };
    let hdr: &[u8; REQUEST_LEN] = hdr.try_into().expect("REQUEST_LEN bytes");
    match Request::parse(hdr) {
        Some(r) if r.cmd == Cmd::Write => buf.len() - REQUEST_LEN >= r.length as usize,
        // Bad magic: let the read fail now rather than wait.
        _ => true,
    }
}

/// Reads one request header; `None` when the client hung up between
/// requests (a hang-up inside one is an error).
fn read_header<R: Read>(r: &mut BufReader<R>) -> io::Result<Option<Request>> {
    let mut hdr = [0u8; REQUEST_LEN];
    if r.read(&mut hdr[..1])? == 0 {
        return Ok(None);
    }
    r.read_exact(&mut hdr[1..])?;
    match Request::parse(&hdr) {
        Some(req) => Ok(Some(req)),
        None => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "request with bad magic",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errnos_map_to_the_protocols_values() {
        // The values NBD defines are Linux's errnos.
        for e in [
            Errno::EPERM,
            Errno::EIO,
            Errno::ENOMEM,
            Errno::EINVAL,
            Errno::ENOSPC,
            Errno::EOVERFLOW,
            Errno::ENOTSUP,
            Errno::ESHUTDOWN,
        ] {
            assert_eq!(nbd_error(e), e.get() as u32, "{e:?}");
        }
        // Other ways of being out of room are ENOSPC; the rest EIO.
        assert_eq!(nbd_error(Errno::EDQUOT), ENOSPC);
        assert_eq!(nbd_error(Errno::EFBIG), ENOSPC);
        assert_eq!(nbd_error(Errno::ENOENT), EIO);
        // A store error keeps its errno until the wire.
        let f = Failure::from(ramd_store::Error::ReadOnly);
        assert_eq!(nbd_error(f.0), EPERM);
    }
}
