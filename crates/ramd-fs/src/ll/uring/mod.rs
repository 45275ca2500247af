//! FUSE over io_uring (Linux 6.14+): the kernel hands requests to
//! per-CPU queues of ring entries, and a request is served on the CPU that
//! issued it, with no read/write system call pair per request.
//!
//! The protocol (`include/uapi/linux/fuse.h`, `fs/fuse/dev_uring.c`):
//! - The mount's INIT reply grants `FUSE_OVER_IO_URING` (offered only while
//!   the module parameter `enable_uring` is Y, see [`enable`]). Until every
//!   queue has registered entries, requests still come through `/dev/fuse`;
//!   FORGET, INTERRUPT and notifications always do.
//! - One queue per possible CPU (`qid` = CPU number). Each entry is two
//!   buffers, registered with an `IORING_OP_URING_CMD` SQE128 whose command
//!   is `FUSE_IO_URING_CMD_REGISTER`, `addr` an iovec pair [headers,
//!   payload] and `len` 2. The headers are `struct fuse_uring_req_header`:
//!   `in_out` (the in header, then the out header), `op_in` (the opcode's
//!   first argument, arg0) and `ring_ent_in_out` (`commit_id`,
//!   `payload_sz`). Everything after arg0 is in the payload buffer.
//! - The CQE of an entry's command means a request is in its buffers. The
//!   answer is the out header in `in_out`, its payload in the payload buffer
//!   and its length in `payload_sz`, sent with `COMMIT_AND_FETCH` and the
//!   request's `commit_id`, which also gives the entry back for the next.
//! - At unmount or abort the kernel ends each entry's command with ENOTCONN
//!   (ECONNABORTED or ECANCELED on some paths).

mod avail;
#[cfg(test)]
mod tests;

pub use avail::{availability, enable, Enabled, Unavailable, ENABLE_PARAM};

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::dev::{Negotiated, StartTransport, TransportCtx};
use super::{out_header, Dispatch, InHeader, Reply, Request, IN_HEADER_LEN, OUT_HEADER_LEN};

const PAGE: usize = 4096;
/// `struct fuse_uring_req_header`: in_out[128], op_in[128], then
/// `struct fuse_uring_ent_in_out` {flags, commit_id, payload_sz, padding,
/// reserved}.
const OP_IN: usize = 128;
const OP_IN_LEN: usize = 128;
const COMMIT_ID: usize = 256 + 8;
const PAYLOAD_SZ: usize = 256 + 16;
const REQ_HEADER_LEN: usize = 288;
/// The kernel's smallest payload buffer (FUSE_MIN_READ_BUFFER).
const MIN_PAYLOAD: usize = 8192;

const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;

/// The largest errno the kernel takes back in an out header.
const MAX_ERRNO: i32 = 511;

/// Sizes of the ring's entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringConfig {
    /// Entries per queue (per CPU): requests in flight on one CPU.
    pub queue_depth: u16,
    /// Threads serving each queue, each with its own ring and a share of
    /// its entries. The kernel hands a request to any free entry of the
    /// CPU's queue, so a thread waiting on one request (an fsync waiting
    /// for a save with `--flush persist`) holds up the requests in its
    /// other entries: with one entry per thread it holds up none.
    pub threads_per_queue: u16,
    /// Bytes of each entry's payload buffer. The kernel wants at least the
    /// session's largest request: max(8 KiB, max_write, max_pages pages).
    pub payload_len: usize,
}

impl Default for UringConfig {
    /// 4 entries per CPU, each with its own thread (more entries per
    /// thread measured no faster: BENCHMARKS.md), and room for a 1 MiB
    /// write or read plus a page.
    fn default() -> Self {
        UringConfig {
            queue_depth: 4,
            threads_per_queue: 4,
            payload_len: (1 << 20) + PAGE,
        }
    }
}

impl UringConfig {
    /// The default, with payload buffers large enough for what `init`
    /// settled (the largest request or reply plus a page).
    pub fn for_session(init: &Negotiated) -> UringConfig {
        let largest = (init.max_write as usize).max(usize::from(init.max_pages) * PAGE);
        let d = UringConfig::default();
        UringConfig {
            payload_len: d.payload_len.max(largest + PAGE),
            ..d
        }
    }
}

/// The session's second transport ([`super::dev::Session::set_extra_transport`]):
/// serves through io_uring once the session's INIT granted it, with
/// [`UringConfig::for_session`]. `serving` turns true once every queue has
/// registered (what `ramd status` reports); if the start fails, the
/// session goes on through `/dev/fuse` alone.
pub fn session_transport(serving: Arc<AtomicBool>) -> StartTransport {
    Box::new(move |ctx: TransportCtx| {
        let cfg = UringConfig::for_session(&ctx.init);
        let uring = start(ctx.fd, ctx.dispatch, &cfg)?;
        serving.store(true, Ordering::SeqCst);
        log::info!(
            "serving FUSE through io_uring: {} queue(s) of {} entries, {} thread(s) each",
            uring.queues(),
            cfg.queue_depth,
            cfg.threads_per_queue
        );
        thread::Builder::new()
            .name("ramd-uring".into())
            .spawn(move || uring.join())
    })
}

/// The running transport: a queue per possible CPU, served by
/// `threads_per_queue` threads pinned to that CPU, each with its own
/// io_uring. The threads end when the filesystem is unmounted or its
/// connection aborted.
pub struct Uring {
    queues: usize,
    /// (qid, thread)
    threads: Vec<(usize, JoinHandle<io::Result<()>>)>,
}

impl Uring {
    /// Queues serving (one per possible CPU).
    pub fn queues(&self) -> usize {
        self.queues
    }

    /// Threads serving them.
    pub fn threads(&self) -> usize {
        self.threads.len()
    }

    /// Waits for every queue to end (unmount or abort). The first error a
    /// queue met (other than the end of the connection) is returned.
    pub fn join(self) -> io::Result<()> {
        let mut first = Ok(());
        for (qid, t) in self.threads {
            let r = t.join().unwrap_or_else(|_| {
                Err(io::Error::other(format!(
                    "FUSE io_uring queue {qid} panicked"
                )))
            });
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

/// Starts serving the mount behind `dev` (its `/dev/fuse` fd, INIT answered
/// with [`FUSE_OVER_IO_URING`] granted) through io_uring. Returns once
/// every queue has registered its entries, from then on the kernel sends
/// requests through the rings.
///
/// Once INIT granted io_uring the kernel holds every request until the
/// ring is ready, so on failure this turns io_uring off for the connection
/// (a REGISTER the kernel refuses does that) and the requests flow through
/// `/dev/fuse`; the error says which queue failed and why. Queues that did
/// register stay idle until the unmount.
pub fn start(
    dev: Arc<OwnedFd>,
    dispatch: Arc<dyn Dispatch>,
    cfg: &UringConfig,
) -> io::Result<Uring> {
    start_queues(&dev, dispatch, cfg).map_err(|e| match release_to_dev(&dev) {
        Ok(()) => io::Error::new(e.kind(), format!("{e}; requests go through /dev/fuse")),
        Err(r) => io::Error::new(
            e.kind(),
            format!(
                "{e}; and io_uring could not be turned off for this mount ({r}): \
                 its requests wait until the connection is aborted"
            ),
        ),
    })
}

fn start_queues(
    dev: &Arc<OwnedFd>,
    dispatch: Arc<dyn Dispatch>,
    cfg: &UringConfig,
) -> io::Result<Uring> {
    let cfg = *cfg;
    if cfg.threads_per_queue == 0
        || cfg.queue_depth < cfg.threads_per_queue
        || cfg.payload_len < MIN_PAYLOAD
        || u32::try_from(cfg.payload_len).is_err()
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "FUSE io_uring: queue depth {}, {} thread(s) per queue and payload {} bytes \
                 (need a thread or more, an entry per thread and {MIN_PAYLOAD} bytes to 4 GiB)",
                cfg.queue_depth, cfg.threads_per_queue, cfg.payload_len
            ),
        ));
    }
    let nr_queues = possible_cpus();
    let per_queue = usize::from(cfg.threads_per_queue);
    let (ready_tx, ready_rx) = mpsc::channel();
    let mut threads = Vec::with_capacity(nr_queues * per_queue);
    for qid in 0..nr_queues {
        for t in 0..per_queue {
            // The queue's entries, shared out: the first threads take one
            // more when they do not divide evenly.
            let entries = (usize::from(cfg.queue_depth) + per_queue - 1 - t) / per_queue;
            let (dev, dispatch, ready) = (dev.clone(), dispatch.clone(), ready_tx.clone());
            let h = thread::Builder::new()
                .name(format!("ramd-uring-{qid}.{t}"))
                .spawn(move || Queue::run(qid, entries, &dev, &*dispatch, cfg, ready))?;
            threads.push((qid, h));
        }
    }
    drop(ready_tx);
    for _ in 0..threads.len() {
        match ready_rx.recv() {
            Ok((_, Ok(()))) => {}
            Ok((qid, Err(e))) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("FUSE io_uring queue {qid}: {e}"),
                ))
            }
            Err(_) => return Err(io::Error::other("a FUSE io_uring queue ended at start")),
        }
    }
    Ok(Uring {
        queues: nr_queues,
        threads,
    })
}

/// Makes the kernel drop io_uring for `dev`'s connection: a REGISTER it
/// refuses (an empty header buffer) clears it and wakes the requests
/// waiting for the ring, which then go through `/dev/fuse`.
fn release_to_dev(dev: &OwnedFd) -> io::Result<()> {
    let mut ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(1)?;
    let iov = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 2];
    // Queue 0, which every kernel has.
    let mut sqe = opcode::UringCmd80::new(types::Fd(dev.as_raw_fd()), CMD_REGISTER)
        .addr(Some(iov.as_ptr() as u64))
        .build();
    set_iovec_count(&mut sqe);
    // SAFETY: `iov` outlives the wait below; it points to no memory.
    unsafe { ring.submission().push(&sqe) }.map_err(|_| io::Error::other("queue full"))?;
    submit(&ring, 1)?;
    let res = ring.completion().next().map(|c| c.result());
    match res {
        Some(r) if r < 0 => Ok(()),
        r => Err(io::Error::other(format!(
            "the kernel took an empty ring entry ({r:?})"
        ))),
    }
}

/// Sets the SQE's `len` (the iovec count, 2, which REGISTER requires);
/// the io-uring crate does not set it for URING_CMD.
fn set_iovec_count(sqe: &mut squeue::Entry128) {
    // SAFETY: Entry128 is repr(C) and starts with the kernel's struct
    // io_uring_sqe, whose u32 `len` is at offset 24.
    unsafe {
        (sqe as *mut squeue::Entry128)
            .cast::<u8>()
            .add(24)
            .cast::<u32>()
            .write_unaligned(2)
    };
}

/// The kernel's number of queues: one per possible CPU
/// (num_possible_cpus), queue `qid` for CPU `qid`.
fn possible_cpus() -> usize {
    let from_sysfs = std::fs::read_to_string("/sys/devices/system/cpu/possible")
        .ok()
        .and_then(|s| count_cpu_list(s.trim()));
    // SAFETY: sysconf has no preconditions.
    from_sysfs
        .unwrap_or_else(|| unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }.max(1) as usize)
}

/// The number of CPUs in a kernel CPU list (`0-3,8`); `None` if malformed.
fn count_cpu_list(list: &str) -> Option<usize> {
    list.split(',')
        .map(|r| match r.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<usize>().ok()?, b.parse::<usize>().ok()?);
                b.checked_sub(a).map(|n| n + 1)
            }
            None => r.parse::<usize>().ok().map(|_| 1),
        })
        .sum::<Option<usize>>()
        .filter(|&n| n > 0)
}

/// Runs the calling thread on `cpu` only, so the requests of that CPU's
/// queue are served where they were issued. A CPU that is possible but not
/// online cannot be pinned to; it issues no requests either.
fn pin_to(cpu: usize) {
    // SAFETY: cpu_set_t is plain bits; CPU_SET stays inside it for any
    // cpu below CPU_SETSIZE, checked first.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if cpu >= libc::CPU_SETSIZE as usize {
            return;
        }
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) != 0 {
            log::debug!(
                "FUSE io_uring queue {cpu}: not pinned: {}",
                io::Error::last_os_error()
            );
        }
    }
}

/// One entry's memory, [headers page | payload], shared with the kernel.
/// The kernel writes it between the submission of the entry's command and
/// its CQE; the queue thread touches it only between a CQE and the next
/// submission. Mapped, not allocated: pages cost memory only once a request
/// or reply has used them (a heap allocation this aligned would be zeroed,
/// every page touched, at start).
struct EntryBuf {
    ptr: NonNull<u8>,
    len: usize,
}

impl EntryBuf {
    fn new(payload_len: usize) -> io::Result<EntryBuf> {
        let len = PAGE + payload_len;
        let ptr = ramd_store::map_anonymous(len, 0)?;
        Ok(EntryBuf { ptr, len })
    }
    fn headers(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
    fn payload(&self) -> *mut u8 {
        // SAFETY: the mapping is PAGE + payload_len bytes.
        unsafe { self.ptr.as_ptr().add(PAGE) }
    }
}

impl Drop for EntryBuf {
    fn drop(&mut self) {
        // SAFETY: mapped in `new` with this length; the kernel no longer
        // holds the entry (see `Queue::run`).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// An entry's last CQE: its connection ended (unmount or abort).
fn is_connection_end(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED | libc::ENODEV
    )
}

struct Queue {
    qid: usize,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    // Declared after the ring: dropped after it (and leaked when the
    // kernel may still hold them, see `run`).
    bufs: Vec<EntryBuf>,
    /// The iovec pairs the REGISTER commands point to.
    iovecs: Vec<[libc::iovec; 2]>,
    payload_len: usize,
    /// Reply room for requests whose payload buffer still holds their
    /// arguments (names, write data); copied into it after dispatch.
    scratch: Vec<u8>,
    /// Requests that arrived while registering.
    early: Vec<(usize, i32)>,
}

type Ready = mpsc::Sender<(usize, io::Result<()>)>;

impl Queue {
    fn run(
        qid: usize,
        entries: usize,
        dev: &OwnedFd,
        dispatch: &dyn Dispatch,
        cfg: UringConfig,
        ready: Ready,
    ) -> io::Result<()> {
        pin_to(qid);
        // The buffers are allocated (and first touched) after pinning, so
        // they sit on this CPU's memory node.
        let mut q = match Queue::new(qid, entries, dev, cfg) {
            Ok(q) => q,
            Err(e) => {
                let msg = e.to_string();
                let _ = ready.send((qid, Err(e)));
                return Err(io::Error::other(format!(
                    "FUSE io_uring queue {qid}: {msg}"
                )));
            }
        };
        let live = match q.register() {
            Ok(live) => {
                let _ = ready.send((qid, Ok(())));
                live
            }
            Err(e) => {
                let msg = e.to_string();
                let _ = ready.send((qid, Err(e)));
                // Entries may be registered: the kernel may still write
                // into their buffers until the connection ends.
                std::mem::forget(q.bufs);
                return Err(io::Error::other(format!(
                    "FUSE io_uring queue {qid}: {msg}"
                )));
            }
        };
        drop(ready);
        match q.serve(dispatch, live) {
            Ok(r) => r,
            Err(e) => {
                // The ring itself failed: entries may still be the
                // kernel's, so their memory is never given back.
                std::mem::forget(q.bufs);
                Err(io::Error::other(format!("FUSE io_uring queue {qid}: {e}")))
            }
        }
    }

    fn new(qid: usize, entries: usize, dev: &OwnedFd, cfg: UringConfig) -> io::Result<Queue> {
        let depth = entries as u32;
        // One thread owns each ring, and the kernel's work for a request
        // (copying it into the entry) runs when that thread waits:
        // DEFER_TASKRUN. A QD1 4 KiB read loop on a busy 2-core VM showed
        // no difference between setup flags beyond its noise (about 30%).
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            // A failing commit must not hold back the others in its batch.
            .setup_submit_all()
            .setup_cqsize(depth * 2)
            .build(depth)?;
        ring.submitter().register_files(&[dev.as_raw_fd()])?;
        let bufs = (0..entries)
            .map(|_| EntryBuf::new(cfg.payload_len))
            .collect::<io::Result<Vec<_>>>()?;
        let iovecs = bufs
            .iter()
            .map(|b| {
                [
                    libc::iovec {
                        iov_base: b.headers().cast(),
                        iov_len: REQ_HEADER_LEN,
                    },
                    libc::iovec {
                        iov_base: b.payload().cast(),
                        iov_len: cfg.payload_len,
                    },
                ]
            })
            .collect();
        Ok(Queue {
            qid,
            ring,
            bufs,
            iovecs,
            payload_len: cfg.payload_len,
            scratch: vec![0; cfg.payload_len],
            early: Vec::new(),
        })
    }

    /// `struct fuse_uring_cmd_req` in the SQE's 80-byte command area.
    fn cmd(&self, op: u32, commit_id: u64) -> opcode::UringCmd80 {
        let mut cmd = [0u8; 80];
        cmd[8..16].copy_from_slice(&commit_id.to_ne_bytes());
        cmd[16..18].copy_from_slice(&(self.qid as u16).to_ne_bytes());
        opcode::UringCmd80::new(types::Fixed(0), op).cmd(cmd)
    }

    /// Registers every entry; a failure shows at once as a CQE (a success
    /// only once a request arrives). Returns the entries registered.
    fn register(&mut self) -> io::Result<usize> {
        for (i, iov) in self.iovecs.iter().enumerate() {
            let mut sqe = self
                .cmd(CMD_REGISTER, 0)
                .addr(Some(iov.as_ptr() as u64))
                .build()
                .user_data(i as u64);
            set_iovec_count(&mut sqe);
            // SAFETY: the iovecs and the buffers they describe live as long
            // as the kernel may use them (never freed while registered).
            unsafe { self.ring.submission().push(&sqe) }
                .map_err(|_| io::Error::other("submission queue full"))?;
        }
        submit(&self.ring, 0)?;
        let mut registered = self.bufs.len();
        for cqe in self.ring.completion() {
            if cqe.result() < 0 {
                registered -= 1;
                if registered == 0 || !is_connection_end(-cqe.result()) {
                    return Err(register_error(-cqe.result(), self.payload_len));
                }
            } else {
                // A request arrived already (this queue made the ring
                // ready): `serve` answers it first.
                self.early.push((cqe.user_data() as usize, cqe.result()));
            }
        }
        Ok(registered)
    }

    /// Serves requests until every entry has ended. `Ok(Err(e))`: the
    /// queue ended, with the first unexpected entry error; `Err`: the ring
    /// itself failed.
    fn serve(&mut self, dispatch: &dyn Dispatch, mut live: usize) -> io::Result<io::Result<()>> {
        let mut first_err = Ok(());
        let mut done = std::mem::take(&mut self.early);
        done.reserve(self.bufs.len());
        while live > 0 {
            if done.is_empty() {
                submit(&self.ring, 1)?;
                done.extend(
                    self.ring
                        .completion()
                        .map(|c| (c.user_data() as usize, c.result())),
                );
            }
            for &(i, res) in &done {
                if i >= self.bufs.len() {
                    unreachable_cqe(self.qid);
                    continue;
                }
                if res < 0 {
                    live -= 1;
                    let errno = -res;
                    if !is_connection_end(errno) {
                        let e = io::Error::from_raw_os_error(errno);
                        log::error!("FUSE io_uring queue {}: entry {i}: {e}", self.qid);
                        if first_err.is_ok() {
                            first_err = Err(e);
                        }
                    }
                    continue;
                }
                let commit_id = self.answer(i, dispatch);
                let sqe = self
                    .cmd(CMD_COMMIT_AND_FETCH, commit_id)
                    .build()
                    .user_data(i as u64);
                // SAFETY: as in `register`; at most one command per entry
                // is in flight and the ring has room for all of them.
                unsafe { self.ring.submission().push(&sqe) }
                    .map_err(|_| io::Error::other("submission queue full"))?;
            }
            done.clear();
        }
        Ok(first_err)
    }

    /// Serves the request in entry `i` and writes its answer there. Returns
    /// the commit id to send it with.
    fn answer(&mut self, i: usize, dispatch: &dyn Dispatch) -> u64 {
        let buf = &self.bufs[i];
        let mut hdr = [0u8; REQ_HEADER_LEN];
        // SAFETY: the CQE gave the entry to this thread until the next
        // submission; nothing else refers to its memory now.
        unsafe { std::ptr::copy_nonoverlapping(buf.headers(), hdr.as_mut_ptr(), REQ_HEADER_LEN) };
        let u64_at = |o: usize| u64::from_ne_bytes(hdr[o..o + 8].try_into().unwrap());
        let commit_id = u64_at(COMMIT_ID);
        let payload_sz =
            u32::from_ne_bytes(hdr[PAYLOAD_SZ..PAYLOAD_SZ + 4].try_into().unwrap()) as usize;
        let header = InHeader::parse(&hdr[..IN_HEADER_LEN])
            .expect("the header array is longer than an in header");
        let arg0_len = dispatch.arg0_len(header.opcode);
        let outcome = if arg0_len > OP_IN_LEN || payload_sz > self.payload_len {
            log::warn!(
                "FUSE io_uring queue {}: request {} (opcode {}): arg0 {arg0_len} bytes, payload {payload_sz} bytes do not fit its entry; answered EIO",
                self.qid, header.unique, header.opcode
            );
            Err(libc::EIO)
        } else {
            let arg0 = &hdr[OP_IN..OP_IN + arg0_len];
            if payload_sz == 0 {
                // Nothing to read in the payload buffer: the reply is built
                // there directly (READ, READDIR: no copy).
                // SAFETY: as above; the only reference to the payload.
                let out =
                    unsafe { std::slice::from_raw_parts_mut(buf.payload(), self.payload_len) };
                let req = Request {
                    header,
                    arg0,
                    rest: &[],
                };
                serve_one(dispatch, &req, out)
            } else {
                // The arguments stay where the kernel put them; the reply
                // is built aside and moved in once they are no longer read.
                // SAFETY: as above; shared only, for the dispatch.
                let rest = unsafe { std::slice::from_raw_parts(buf.payload(), payload_sz) };
                let req = Request { header, arg0, rest };
                let outcome = serve_one(dispatch, &req, &mut self.scratch);
                if let Ok(n) = outcome {
                    // SAFETY: `rest` is no longer used; n ≤ payload_len
                    // (checked in `serve_one`).
                    unsafe {
                        std::ptr::copy_nonoverlapping(self.scratch.as_ptr(), buf.payload(), n)
                    };
                }
                outcome
            }
        };
        let (error, n) = match outcome {
            Ok(n) => (0i32, n),
            Err(errno) => (-errno, 0),
        };
        let out = out_header(n, error, header.unique);
        // SAFETY: still this thread's; in_out and payload_sz lie inside the
        // headers page. n ≤ payload_len < 4 GiB.
        unsafe {
            std::ptr::copy_nonoverlapping(out.as_ptr(), buf.headers(), OUT_HEADER_LEN);
            buf.headers()
                .add(PAYLOAD_SZ)
                .cast::<u32>()
                .write_unaligned(n as u32);
        }
        commit_id
    }
}

/// Dispatches one request with `out` as its reply buffer; the outcome it
/// sent, checked, or EIO if it sent none.
fn serve_one(dispatch: &dyn Dispatch, req: &Request<'_>, out: &mut [u8]) -> Result<usize, i32> {
    let mut reply = RingReply {
        buf: out,
        outcome: None,
    };
    dispatch.dispatch(req, &mut reply);
    match reply.outcome {
        Some(o) => o,
        None => {
            log::warn!(
                "FUSE request {} (opcode {}) was not answered; answered EIO",
                req.header.unique,
                req.header.opcode
            );
            Err(libc::EIO)
        }
    }
}

/// A reply into a ring entry: recorded here, written into the entry once
/// the dispatcher has returned (its request may still be read until then).
struct RingReply<'a> {
    buf: &'a mut [u8],
    outcome: Option<Result<usize, i32>>,
}

impl Reply for RingReply<'_> {
    fn buf(&mut self) -> &mut [u8] {
        self.buf
    }

    fn send(&mut self, outcome: Result<usize, i32>) -> io::Result<()> {
        if self.outcome.is_some() {
            return Err(io::Error::other("FUSE reply sent twice"));
        }
        let checked = match outcome {
            Ok(n) if n > self.buf.len() => {
                self.outcome = Some(Err(libc::EIO));
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "FUSE reply of {n} bytes is longer than its buffer ({}); answered EIO",
                        self.buf.len()
                    ),
                ));
            }
            Err(errno) if !(1..=MAX_ERRNO).contains(&errno) => {
                self.outcome = Some(Err(libc::EIO));
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("FUSE reply with errno {errno}; answered EIO"),
                ));
            }
            o => o,
        };
        self.outcome = Some(checked);
        Ok(())
    }
}

fn submit(ring: &IoUring<squeue::Entry128, cqueue::Entry>, want: usize) -> io::Result<()> {
    loop {
        match ring.submit_and_wait(want) {
            Ok(_) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

fn register_error(errno: i32, payload_len: usize) -> io::Error {
    let why = match errno {
        libc::EINVAL => format!(
            "the kernel refused the ring entries (EINVAL): is the payload buffer ({payload_len} bytes) smaller than the session's max_write or max_pages?"
        ),
        libc::EOPNOTSUPP => format!("FUSE over io_uring is off ({ENABLE_PARAM} is N)"),
        libc::EAGAIN => "the mount has not answered INIT yet".into(),
        e => format!("registering ring entries: {}", io::Error::from_raw_os_error(e)),
    };
    io::Error::new(io::Error::from_raw_os_error(errno).kind(), why)
}

fn unreachable_cqe(qid: usize) {
    log::error!("FUSE io_uring queue {qid}: a completion for no entry of this queue; ignored");
}
