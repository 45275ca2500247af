//! The `/dev/fuse` transport: the INIT handshake on the mount's fd, then
//! one worker thread per cloned fd (FUSE_DEV_IOC_CLONE), each reading whole
//! requests with read(2) and answering each with one write(2).

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;

use super::abi::{self, op, InitIn, InitOut, Wr};
use super::notify::Notifier;
use super::{out_header, Dispatch, InHeader, Reply, Request, IN_HEADER_LEN, OUT_HEADER_LEN};

const PAGE: usize = 4096;
/// The oldest protocol served: 7.31 has everything ramd asks for at INIT
/// (max_pages, HANDLE_KILLPRIV_V2's write flag aside, which is only asked).
const MIN_MINOR: u32 = 31;

/// What ramd asks for at INIT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitWant {
    /// INIT flags (`abi::init`); only those the kernel offers are granted.
    pub flags: u64,
    pub max_write: u32,
    pub max_readahead: u32,
    pub max_pages: u16,
    pub max_background: u16,
    pub congestion_threshold: u16,
    /// Timestamp granularity in nanoseconds.
    pub time_gran: u32,
    /// Filesystems stacked under this one; 0 unless asking for
    /// FUSE_PASSTHROUGH (which needs at least 1).
    pub max_stack_depth: u32,
}

/// What INIT settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// The protocol minor version in use (the lower of both sides').
    pub minor: u32,
    /// What the kernel offered.
    pub offered: u64,
    /// What was granted: asked for and offered.
    pub flags: u64,
    pub max_write: u32,
    pub max_readahead: u32,
    pub max_pages: u16,
    /// FUSE_OVER_IO_URING granted: another transport may register rings.
    pub io_uring: bool,
}

/// Everything another transport needs to serve alongside `/dev/fuse`.
pub struct TransportCtx {
    /// The mount's /dev/fuse fd (the one INIT came through).
    pub fd: Arc<OwnedFd>,
    pub dispatch: Arc<dyn Dispatch>,
    pub init: Negotiated,
}

/// Starts another transport once INIT is done; the session joins the
/// thread it returns when the filesystem is unmounted.
pub type StartTransport =
    Box<dyn FnOnce(TransportCtx) -> io::Result<JoinHandle<io::Result<()>>> + Send>;

/// A mounted filesystem whose INIT is answered, not yet serving:
/// [`Session::run`] serves until it is unmounted. Dropped without having
/// seen the unmount (not run, or aborted), it detaches the mount if it is
/// still there.
pub struct Session {
    fd: Arc<OwnedFd>,
    dir: PathBuf,
    /// The mount's device, to unmount only our own mount.
    device: Option<(u32, u32)>,
    dispatch: Arc<dyn Dispatch>,
    want: InitWant,
    threads: usize,
    extra: Option<StartTransport>,
    init: Negotiated,
    unmounted: bool,
}

impl Session {
    /// Answers the kernel's INIT on `fd`, just mounted at `dir`; the
    /// session will be served by `threads` workers. Until INIT is answered
    /// every access to the mount waits (stat included), so it is done here.
    pub fn new(
        fd: OwnedFd,
        dir: &Path,
        dispatch: Arc<dyn Dispatch>,
        want: InitWant,
        threads: usize,
    ) -> io::Result<Session> {
        let mut s = Session {
            fd: Arc::new(fd),
            dir: dir.to_path_buf(),
            device: None,
            dispatch,
            want,
            threads: threads.max(1),
            extra: None,
            init: Negotiated {
                minor: 0,
                offered: 0,
                flags: 0,
                max_write: 0,
                max_readahead: 0,
                max_pages: 0,
                io_uring: false,
            },
            unmounted: false,
        };
        // Read before INIT: mountinfo never asks the filesystem.
        s.device = crate::ll::mountinfo::mount_device(dir);
        s.init = s.handshake()?;
        Ok(s)
    }

    /// The mount's /dev/fuse fd: what backing files are registered on
    /// (FUSE_DEV_IOC_BACKING_OPEN).
    pub fn dev_fd(&self) -> Arc<OwnedFd> {
        self.fd.clone()
    }

    /// Sends notifications on this session's connection.
    pub fn notifier(&self) -> Notifier {
        Notifier::new(self.fd.clone())
    }

    /// What INIT settled.
    pub fn init(&self) -> &Negotiated {
        &self.init
    }

    /// The mount point.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Another transport (io_uring) to start in [`Session::run`], next to
    /// the `/dev/fuse` workers (FORGET and INTERRUPT always come through
    /// those).
    pub fn set_extra_transport(&mut self, start: StartTransport) {
        self.extra = Some(start);
    }

    /// Serves until the filesystem is unmounted (`Ok`) or the connection
    /// fails (an error, e.g. ECONNABORTED once aborted).
    pub fn run(mut self) -> io::Result<()> {
        let init = self.init;
        let buf_len = request_buf_len(init.max_write);
        let reply_len = OUT_HEADER_LEN
            + init.max_write.max(init.max_pages as u32 * PAGE as u32) as usize
            + PAGE;
        let mut handles = Vec::new();
        // The one place another transport starts: after INIT, before the
        // workers, with the fd, the dispatcher and what INIT settled.
        if let Some(start) = self.extra.take() {
            let ctx = TransportCtx {
                fd: self.fd.clone(),
                dispatch: self.dispatch.clone(),
                init,
            };
            match start(ctx) {
                Ok(h) => handles.push(h),
                Err(e) => log::warn!(
                    "{}: starting the second FUSE transport: {e}; serving through /dev/fuse only",
                    self.dir.display()
                ),
            }
        }
        for i in 0..self.threads {
            let fd = Arc::new(clone_fd(&self.fd)?);
            let dispatch = self.dispatch.clone();
            let h = std::thread::Builder::new()
                .name(format!("ramd-fuse-{i}"))
                .spawn(move || worker(&fd, &*dispatch, buf_len, reply_len))?;
            handles.push(h);
        }
        let mut result = Ok(());
        for h in handles {
            let r = h
                .join()
                .unwrap_or_else(|_| Err(io::Error::other("a FUSE worker thread panicked")));
            if let Err(e) = r {
                if result.is_ok() {
                    result = Err(e);
                }
            }
        }
        self.unmounted = result.is_ok();
        result
    }

    fn handshake(&self) -> io::Result<Negotiated> {
        let mut buf = vec![0u8; request_buf_len(self.want.max_write)];
        let fd = self.fd.as_raw_fd();
        loop {
            let n = match read_request(fd, &mut buf) {
                Ok(n) => n,
                Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {
                    return Err(io::Error::new(
                        io::ErrorKind::NotConnected,
                        "FUSE connection ended before INIT",
                    ))
                }
                Err(e) => return Err(e),
            };
            let req = &buf[..n];
            let Some(h) = InHeader::parse(req) else {
                return Err(invalid("a FUSE request shorter than its header"));
            };
            if h.opcode != op::INIT {
                let _ = send_raw(fd, h.unique, Err(libc::EIO), &[]);
                return Err(invalid(format!("FUSE opcode {} before INIT", h.opcode)));
            }
            let Some(init) = InitIn::parse(&req[IN_HEADER_LEN..]) else {
                let _ = send_raw(fd, h.unique, Err(libc::EINVAL), &[]);
                return Err(invalid("a short FUSE INIT"));
            };
            if init.major > abi::KERNEL_VERSION {
                // Newer kernel: answer with our major only; it sends
                // another INIT in ours.
                let mut out = [0u8; abi::INIT_OUT_LEN];
                InitOut {
                    major: abi::KERNEL_VERSION,
                    minor: abi::KERNEL_MINOR_VERSION,
                    ..Default::default()
                }
                .encode(&mut Wr::new(&mut out));
                send_raw(fd, h.unique, Ok(()), &out)?;
                continue;
            }
            if init.major < abi::KERNEL_VERSION || init.minor < MIN_MINOR {
                let _ = send_raw(fd, h.unique, Err(libc::EPROTO), &[]);
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "FUSE protocol {}.{} is older than 7.{MIN_MINOR}, the oldest ramd speaks",
                        init.major, init.minor
                    ),
                ));
            }
            let offered = init.flags;
            // INIT_EXT says flags2 is read; it is ours to set when any
            // high flag is.
            let mut flags = self.want.flags & offered;
            if flags >> 32 != 0 {
                flags |= abi::init::INIT_EXT;
            }
            let max_pages = if flags & abi::init::MAX_PAGES != 0 {
                self.want.max_pages
            } else {
                0
            };
            let out = InitOut {
                major: abi::KERNEL_VERSION,
                minor: abi::KERNEL_MINOR_VERSION,
                max_readahead: self.want.max_readahead.min(init.max_readahead),
                flags,
                max_background: self.want.max_background,
                congestion_threshold: self.want.congestion_threshold,
                max_write: self.want.max_write,
                time_gran: self.want.time_gran,
                max_pages,
                max_stack_depth: self.want.max_stack_depth,
            };
            let mut b = [0u8; abi::INIT_OUT_LEN];
            out.encode(&mut Wr::new(&mut b));
            log::debug!(
                "FUSE INIT: protocol 7.{}, offered {offered:#x}, granted {flags:#x}",
                init.minor
            );
            send_raw(fd, h.unique, Ok(()), &b)?;
            return Ok(Negotiated {
                minor: init.minor.min(abi::KERNEL_MINOR_VERSION),
                offered,
                flags,
                // Without MAX_PAGES the kernel sends at most 32 pages.
                max_write: if max_pages > 0 {
                    out.max_write
                } else {
                    out.max_write.min(32 * PAGE as u32)
                },
                max_readahead: out.max_readahead,
                max_pages: max_pages.max(32),
                io_uring: flags & abi::init::OVER_IO_URING != 0,
            });
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // Not run, or aborted: leave no mount behind, but never unmount
        // what someone mounted over it since.
        if !self.unmounted
            && self.device.is_some()
            && crate::ll::mountinfo::mount_device(&self.dir) == self.device
        {
            super::mount::unmount(&self.dir);
        }
    }
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// Room for the largest request: a write of `max_write` bytes with its
/// headers (the kernel refuses smaller read buffers).
fn request_buf_len(max_write: u32) -> usize {
    (max_write as usize + PAGE).max(8192) + IN_HEADER_LEN + abi::WRITE_IN_LEN
}

/// A new fd on the same connection, with its own requests in flight.
fn clone_fd(fd: &OwnedFd) -> io::Result<OwnedFd> {
    let dev = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")?;
    let new = OwnedFd::from(dev);
    let mut src = fd.as_raw_fd() as u32;
    // SAFETY: FUSE_DEV_IOC_CLONE reads a u32 fd number from the pointer.
    let r = unsafe { libc::ioctl(new.as_raw_fd(), abi::FUSE_DEV_IOC_CLONE, &mut src) };
    if r != 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("cloning the /dev/fuse fd: {e}"),
        ));
    }
    Ok(new)
}

/// One request, retrying what FUSE says to retry: EINTR, EAGAIN, and
/// ENOENT (a request interrupted while being read).
fn read_request(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: reads at most buf.len() bytes into buf.
        let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR | libc::EAGAIN | libc::ENOENT) => continue,
            _ => return Err(e),
        }
    }
}

/// Writes one answer (header and `payload`) in one write; for the handshake.
fn send_raw(fd: RawFd, unique: u64, r: Result<(), i32>, payload: &[u8]) -> io::Result<()> {
    let (error, payload) = match r {
        Ok(()) => (0, payload),
        Err(e) => (-e, &[][..]),
    };
    let mut all = out_header(payload.len(), error, unique).to_vec();
    all.extend_from_slice(payload);
    write_all_once(fd, &all)
}

/// One write(2) of a whole answer; ENOENT (the request was interrupted
/// and is gone) is not an error.
fn write_all_once(fd: RawFd, b: &[u8]) -> io::Result<()> {
    loop {
        // SAFETY: writes b.len() bytes from b.
        let n = unsafe { libc::write(fd, b.as_ptr().cast(), b.len()) };
        if n >= 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::ENOENT) => return Ok(()),
            _ => return Err(e),
        }
    }
}

/// The answer to one request read from `fd`: the payload is built after
/// 16 bytes of headroom, where the out header goes, so one write sends both.
struct DevReply<'a> {
    fd: &'a Arc<OwnedFd>,
    unique: u64,
    buf: &'a mut [u8],
    sent: bool,
}

impl Reply for DevReply<'_> {
    fn buf(&mut self) -> &mut [u8] {
        &mut self.buf[OUT_HEADER_LEN..]
    }

    fn send(&mut self, outcome: Result<usize, i32>) -> io::Result<()> {
        if self.sent {
            return Err(io::Error::other("a FUSE request answered twice"));
        }
        self.sent = true;
        let (error, len) = match outcome {
            Ok(n) => (0, n.min(self.buf.len() - OUT_HEADER_LEN)),
            Err(e) => (-e, 0),
        };
        self.buf[..OUT_HEADER_LEN].copy_from_slice(&out_header(len, error, self.unique));
        write_all_once(self.fd.as_raw_fd(), &self.buf[..OUT_HEADER_LEN + len])
    }

    /// The kernel takes the answer to a request on the fd it was read
    /// from, from any thread: that fd goes with it.
    fn detach(&mut self) -> Option<super::Later> {
        if self.sent {
            return None;
        }
        self.sent = true;
        let (fd, unique) = (self.fd.clone(), self.unique);
        Some(Box::new(move |outcome: Result<&[u8], i32>| {
            let (r, payload) = match outcome {
                Ok(p) => (Ok(()), p),
                Err(e) => (Err(e), &[][..]),
            };
            send_raw(fd.as_raw_fd(), unique, r, payload)
        }))
    }
}

/// Splits one request read from /dev/fuse into header, arg0 and the rest;
/// `Err` with the errno to answer if it is malformed.
pub fn split<'a>(
    buf: &'a [u8],
    dispatch: &dyn Dispatch,
) -> Result<Request<'a>, (Option<InHeader>, i32)> {
    let Some(header) = InHeader::parse(buf) else {
        return Err((None, libc::EIO));
    };
    if header.len as usize != buf.len() {
        return Err((Some(header), libc::EIO));
    }
    let body = &buf[IN_HEADER_LEN..];
    // Extensions (security context, groups) follow the arguments; none is
    // negotiated, so they are cut off and not read.
    let ext = header.total_extlen as usize * 8;
    if ext > body.len() {
        return Err((Some(header), libc::EIO));
    }
    let body = &body[..body.len() - ext];
    // A short arg0 is passed short: the opcode's decoder answers EINVAL
    // (INIT's is shorter before protocol 7.36).
    let a0 = dispatch.arg0_len(header.opcode).min(body.len());
    Ok(Request {
        header,
        arg0: &body[..a0],
        rest: &body[a0..],
    })
}

fn worker(
    fd: &Arc<OwnedFd>,
    dispatch: &dyn Dispatch,
    buf_len: usize,
    reply_len: usize,
) -> io::Result<()> {
    let raw = fd.as_raw_fd();
    let mut buf = vec![0u8; buf_len];
    let mut out = vec![0u8; reply_len];
    loop {
        let n = match read_request(raw, &mut buf) {
            Ok(n) => n,
            // Unmounted: the connection is gone.
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return Ok(()),
            Err(e) => return Err(e),
        };
        match split(&buf[..n], dispatch) {
            Ok(req) => {
                let mut reply = DevReply {
                    fd,
                    unique: req.header.unique,
                    buf: &mut out,
                    sent: false,
                };
                dispatch.dispatch(&req, &mut reply);
            }
            Err((h, errno)) => {
                log::warn!("malformed FUSE request ({n} bytes, header {h:?}): answered {errno}");
                if let Some(h) = h.filter(|h| h.unique != 0 && !no_reply(h.opcode)) {
                    let _ = send_raw(raw, h.unique, Err(errno), &[]);
                }
            }
        }
    }
}

/// Opcodes the kernel expects no answer to.
fn no_reply(opcode: u32) -> bool {
    matches!(opcode, op::FORGET | op::BATCH_FORGET | op::INTERRUPT)
}
