//! The FUSE kernel protocol, spoken by ramd itself: request decoding, reply
//! encoding, mounting, and the transports that carry requests between the
//! kernel and the filesystem. Two transports share one [`Dispatch`]:
//! `/dev/fuse` (read and write system calls, one thread per cloned fd) and
//! FUSE over io_uring (per-CPU queues, kernel 6.14+), so every operation is
//! decoded and answered by the same code whichever carried it.
//!
//! The two layouts differ only in where a request's parts sit. Every request
//! is a header ([`InHeader`]), the opcode's fixed-size first argument
//! ("arg0": `fuse_write_in`, `fuse_open_in`, ...; empty for some opcodes)
//! and the rest (names, write data). `/dev/fuse` delivers the three back to
//! back, so that transport splits them with [`Dispatch::arg0_len`]; io_uring
//! delivers them in separate buffers. A reply is a 16-byte out header and a
//! payload, built in the buffer the transport lends ([`Reply::buf`]), so a
//! READ can be served straight into it.

use std::io;

pub mod abi;
pub mod dev;
pub mod mount;
pub mod mountinfo;
pub mod notify;
pub mod uring;

/// `struct fuse_in_header`.
pub const IN_HEADER_LEN: usize = 40;
/// `struct fuse_out_header`.
pub const OUT_HEADER_LEN: usize = 16;

/// `struct fuse_out_header` for an answer of `payload_len` bytes: `error`
/// is 0 or a negative errno (or, with `unique` 0, a notification's code).
pub fn out_header(payload_len: usize, error: i32, unique: u64) -> [u8; OUT_HEADER_LEN] {
    let mut h = [0u8; OUT_HEADER_LEN];
    h[0..4].copy_from_slice(&((OUT_HEADER_LEN + payload_len) as u32).to_ne_bytes());
    h[4..8].copy_from_slice(&error.to_ne_bytes());
    h[8..16].copy_from_slice(&unique.to_ne_bytes());
    h
}

/// `struct fuse_in_header`, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHeader {
    /// Length of the whole request, header included (`/dev/fuse` layout).
    pub len: u32,
    pub opcode: u32,
    /// The request's id; its reply carries it back. 0 only for notifications.
    pub unique: u64,
    pub nodeid: u64,
    pub uid: u32,
    pub gid: u32,
    pub pid: u32,
    /// Length of the extensions after the arguments, in units of 8 bytes.
    pub total_extlen: u16,
}

impl InHeader {
    /// Decodes the first [`IN_HEADER_LEN`] bytes of `b` (native endian, as
    /// the kernel writes them); `None` if `b` is shorter.
    pub fn parse(b: &[u8]) -> Option<InHeader> {
        let b = b.get(..IN_HEADER_LEN)?;
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        Some(InHeader {
            len: u32_at(0),
            opcode: u32_at(4),
            unique: u64_at(8),
            nodeid: u64_at(16),
            uid: u32_at(24),
            gid: u32_at(28),
            pid: u32_at(32),
            total_extlen: u16::from_ne_bytes(b[36..38].try_into().unwrap()),
        })
    }
}

/// One request as a transport received it.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub header: InHeader,
    /// The opcode's fixed first argument (may be empty).
    pub arg0: &'a [u8],
    /// Everything after it: names, link targets, xattr values, write data.
    pub rest: &'a [u8],
}

/// Where the answer to one request goes. The transport made it for that
/// request (it knows the `unique` to answer).
pub trait Reply {
    /// The buffer to build the reply's payload in, at least as long as the
    /// largest reply the session allows (`max_write`/`max_read` plus a page).
    fn buf(&mut self) -> &mut [u8];
    /// Sends the answer: `Ok(len)`, the first `len` bytes of [`Reply::buf`]
    /// as the payload, or `Err(errno)` (positive) and no payload. Called at
    /// most once per request. An error from the kernel that the request is
    /// gone (ENOENT: it was interrupted) is not an error here.
    fn send(&mut self, outcome: Result<usize, i32>) -> io::Result<()>;
    /// Takes the answer away, to be sent later from another thread while
    /// this transport's thread goes on serving: for an answer that must
    /// wait until other requests were served. `None` where the transport
    /// cannot (the caller then answers in place, through [`Reply::send`]);
    /// after `Some`, `send` is not called.
    fn detach(&mut self) -> Option<Later> {
        None
    }
}

/// An answer sent later ([`Reply::detach`]), from any thread: the payload
/// or an errno (positive). An error from the kernel that the request is
/// gone (interrupted) is not an error here.
pub type Later = Box<dyn FnOnce(Result<&[u8], i32>) -> io::Result<()> + Send>;

/// Serves requests, from any transport and any thread.
pub trait Dispatch: Send + Sync + 'static {
    /// Length of `opcode`'s fixed first argument, as negotiated at INIT
    /// (the `/dev/fuse` transport splits a request there). 0 for an
    /// opcode that has none or that is unknown.
    fn arg0_len(&self, opcode: u32) -> usize;
    /// Serves one request and answers it through `reply`, exactly once
    /// unless the opcode has no answer (FORGET, BATCH_FORGET, INTERRUPT).
    fn dispatch(&self, req: &Request<'_>, reply: &mut dyn Reply);
}
