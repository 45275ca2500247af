//! SEEK_DATA and SEEK_HOLE where the kernel may hold written pages it has
//! not written back: answered after making it write them back, from a
//! thread of their own on `/dev/fuse`.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Mutex;
use std::time::Instant;

use super::reply::arg;
use super::{metric_op, FuseFs};
use crate::fs::{Errno, Ino, Whence};
use crate::ll::abi::{Rd, Wr};
use crate::ll::{Reply, Request};

/// A seek answered from the seeker thread ([`FuseFs::lseek_written_back`]).
pub(super) type SeekJob = Box<dyn FnOnce() + Send>;

/// The thread that answers seeks which wait for the kernel's write-back,
/// started at the first; it ends when the filesystem's sender goes.
#[derive(Default)]
pub(super) struct Seeker {
    tx: Mutex<Option<std::sync::mpsc::Sender<SeekJob>>>,
}

impl Seeker {
    /// Hands `job` to the thread; back if no thread could be started.
    fn send(&self, job: SeekJob) -> std::result::Result<(), std::sync::mpsc::SendError<SeekJob>> {
        let mut tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        if tx.is_none() {
            let (t, rx) = std::sync::mpsc::channel::<SeekJob>();
            let started = std::thread::Builder::new()
                .name("ramd-fuse-seek".into())
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                });
            match started {
                Ok(_) => *tx = Some(t),
                Err(e) => {
                    log::warn!("starting the seek thread: {e}; seeks answered in place");
                    return Err(std::sync::mpsc::SendError(job));
                }
            }
        }
        tx.as_ref().expect("started").send(job)
    }
}

/// LSEEK's offset and whence; ENXIO for a negative offset, EINVAL for a
/// whence other than SEEK_DATA and SEEK_HOLE (the kernel handles
/// SEEK_SET/CUR/END itself).
pub(super) fn lseek_in(req: &Request<'_>) -> std::result::Result<(i64, Whence), Errno> {
    let mut r = Rd(req.arg0);
    let (_fh, offset, whence) = (arg(r.u64())?, arg(r.u64())? as i64, arg(r.u32())?);
    let whence = match whence as i32 {
        libc::SEEK_DATA => Whence::Data,
        libc::SEEK_HOLE => Whence::Hole,
        _ => return Err(Errno::EINVAL),
    };
    if offset < 0 {
        return Err(Errno::ENXIO);
    }
    Ok((offset, whence))
}

impl FuseFs {
    /// Whether regular files' pages live in the kernel's page cache, where
    /// it may hold written pages it has not written back yet: under the
    /// write-back cache, and without it too for a shared writable mmap. Not
    /// with passthrough, whose pages are the backing file's.
    pub(super) fn kernel_holds_pages(&self) -> bool {
        !self.passthrough() || self.fs.hot_tier().is_none()
    }

    /// SEEK_DATA/SEEK_HOLE where the kernel may hold pages written but not
    /// yet written back ([`FuseFs::kernel_holds_pages`]), which ramd has not
    /// seen. `fuse_lseek` (fs/fuse/file.c) sends FUSE_LSEEK without writing them
    /// back first (unlike fallocate and copy_file_range), so a seek right
    /// after a write found no data where tmpfs finds it. The way a server
    /// has to get them: FUSE_NOTIFY_INVAL_INODE for the range from the
    /// offset on, whose page-cache invalidation (invalidate_inode_pages2_range)
    /// launders each dirty page, a WRITE here, and waits for it, before it
    /// drops the page (clean pages of the range go too: the price, paid
    /// only by seeks). Pages before the offset cannot change the answer
    /// (one that extends the file holds the offset). The WRITEs must be
    /// served while the notification waits, so on `/dev/fuse` the answer is
    /// sent from the seeker thread and the worker goes on serving (with
    /// `--threads 1` it is the only one); io_uring cannot hand an answer
    /// over, and keeps an entry of every queue free for them (below).
    pub(super) fn lseek_written_back(&self, req: &Request<'_>, reply: &mut dyn Reply) {
        let ino = Ino(req.header.nodeid);
        let (offset, whence) = match lseek_in(req) {
            Ok(a) => a,
            Err(e) => {
                if let Err(e) = reply.send(Err(e.get())) {
                    log::debug!("answering FUSE_LSEEK: {e}");
                }
                return;
            }
        };
        let (fs, notifier) = (self.fs.clone(), self.notifier.clone());
        let metrics = self.opts.metrics.clone().zip(metric_op(req));
        let answer = move |write_back: bool| {
            if let Some(n) = notifier.get().filter(|_| write_back) {
                if let Err(e) = n.inval_inode(ino.0, offset, 0) {
                    log::warn!("writing back inode {ino}'s cached pages before a seek: {e}");
                }
            }
            let started = Instant::now();
            let res = fs.seek(ino, offset as u64, whence);
            if let Some((m, op)) = &metrics {
                m.record(*op, 0, started, res.is_ok());
            }
            res
        };
        let Some(later) = reply.detach() else {
            // In place (io_uring): the request keeps its ring entry until
            // answered, and the write-back's WRITEs need a free entry in
            // the queue of the CPU the notification runs on. So at most a
            // queue's depth less one seeks wait at once, whichever queues
            // they are on: every queue keeps an entry for the WRITEs. A
            // seek past that is answered from what ramd has seen.
            let limit =
                usize::from(crate::ll::uring::UringConfig::default().queue_depth).saturating_sub(1);
            let waiting = &self.in_place_seeks;
            let write_back = waiting
                .fetch_update(Relaxed, Relaxed, |n| (n < limit).then_some(n + 1))
                .is_ok();
            if !write_back {
                log::debug!(
                    "seek in inode {ino} answered without write-back: {limit} already wait"
                );
            }
            let res = answer(write_back);
            if write_back {
                waiting.fetch_sub(1, Relaxed);
            }
            let res = res.and_then(|o| {
                let mut w = Wr::new(reply.buf());
                w.u64(o);
                w.written().ok_or(Errno::EIO)
            });
            if let Err(e) = reply.send(res.map_err(Errno::get)) {
                log::debug!("answering FUSE_LSEEK: {e}");
            }
            return;
        };
        let job: SeekJob = Box::new(move || {
            let bytes = answer(true).map(u64::to_ne_bytes);
            if let Err(e) = later(bytes.as_ref().map(|b| &b[..]).map_err(|e| e.get())) {
                log::debug!("answering FUSE_LSEEK: {e}");
            }
        });
        if let Err(job) = self.seeker.send(job) {
            // No thread to answer from (it could not be started): here,
            // at the risk the notification waits on this worker.
            (job.0)();
        }
    }
}
