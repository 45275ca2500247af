//! The transport against the real kernel: a tiny filesystem (a root
//! directory holding one file) mounted with mount(2), INIT answered here on
//! /dev/fuse with FUSE_OVER_IO_URING, then served by [`start`], and read
//! with std::fs. Needs root, as every test of this project.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::time::Duration;

use super::*;

const LOOKUP: u32 = 1;
const FORGET: u32 = 2;
const GETATTR: u32 = 3;
const OPEN: u32 = 14;
const READ: u32 = 15;
const STATFS: u32 = 17;
const RELEASE: u32 = 18;
const FLUSH: u32 = 25;
const INIT: u32 = 26;
const INTERRUPT: u32 = 36;
const BATCH_FORGET: u32 = 42;

const FILE: &str = "greeting";
const FILE_INO: u64 = 2;
const CONTENT: &[u8] = b"served through the ring, one CPU at a time\n";
const MAX_WRITE: u32 = 128 << 10;

/// A second file, whose READ waits until the test opens the gate.
const SLOW: &str = "slow";
const SLOW_INO: u64 = 3;

/// The tiny filesystem; counts the READs it served.
#[derive(Default)]
struct Tiny {
    reads: AtomicUsize,
    /// (a READ of SLOW is waiting, the gate is open)
    gate: Mutex<(bool, bool)>,
    gate_moved: Condvar,
}

/// `struct fuse_attr` (88 bytes).
fn attr(out: &mut Vec<u8>, ino: u64) {
    let (size, mode, nlink) = if ino == 1 {
        (0, libc::S_IFDIR | 0o755, 2)
    } else {
        (CONTENT.len() as u64, libc::S_IFREG | 0o644, 1)
    };
    for v in [ino, size, size.div_ceil(512), 0, 0, 0] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
    for v in [0, 0, 0, mode, nlink, 0, 0, 0, 4096, 0u32] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
}

impl Tiny {
    fn reply(&self, req: &Request<'_>, buf: &mut [u8]) -> Result<usize, i32> {
        let h = req.header;
        let mut out = Vec::new();
        match h.opcode {
            LOOKUP if h.nodeid == 1 => {
                let ino = match req.rest.strip_suffix(b"\0") {
                    Some(n) if n == FILE.as_bytes() => FILE_INO,
                    Some(n) if n == SLOW.as_bytes() => SLOW_INO,
                    _ => return Err(libc::ENOENT),
                };
                // nodeid, generation, entry/attr valid (s, ns), attr
                for v in [ino, 0, 1, 1] {
                    out.extend_from_slice(&v.to_ne_bytes());
                }
                out.extend_from_slice(&[0; 8]);
                attr(&mut out, ino);
            }
            LOOKUP => return Err(libc::ENOENT),
            GETATTR if matches!(h.nodeid, 1 | FILE_INO | SLOW_INO) => {
                out.extend_from_slice(&1u64.to_ne_bytes());
                out.extend_from_slice(&[0; 8]);
                attr(&mut out, h.nodeid);
            }
            OPEN if matches!(h.nodeid, FILE_INO | SLOW_INO) => out.extend_from_slice(&[0; 16]),
            READ if h.nodeid == SLOW_INO => {
                let mut g = self.gate.lock().unwrap();
                g.0 = true;
                self.gate_moved.notify_all();
                while !g.1 {
                    g = self.gate_moved.wait(g).unwrap();
                }
                let off = u64::from_ne_bytes(req.arg0[8..16].try_into().unwrap()) as usize;
                let n = CONTENT.len().saturating_sub(off);
                buf[..n].copy_from_slice(&CONTENT[off.min(CONTENT.len())..]);
                return Ok(n);
            }
            READ if h.nodeid == FILE_INO => {
                let off = u64::from_ne_bytes(req.arg0[8..16].try_into().unwrap()) as usize;
                let size = u32::from_ne_bytes(req.arg0[16..20].try_into().unwrap()) as usize;
                let data = CONTENT.get(off.min(CONTENT.len())..).unwrap_or_default();
                let n = data.len().min(size);
                self.reads.fetch_add(1, Ordering::Relaxed);
                buf[..n].copy_from_slice(&data[..n]);
                return Ok(n);
            }
            RELEASE | FLUSH => {}
            STATFS => {
                for v in [1u64, 0, 0, 2, 0] {
                    out.extend_from_slice(&v.to_ne_bytes());
                }
                for v in [4096u32, 255, 4096, 0, 0, 0, 0, 0, 0, 0] {
                    out.extend_from_slice(&v.to_ne_bytes());
                }
            }
            _ => return Err(libc::ENOSYS),
        }
        buf[..out.len()].copy_from_slice(&out);
        Ok(out.len())
    }
}

impl Dispatch for Tiny {
    fn arg0_len(&self, opcode: u32) -> usize {
        match opcode {
            GETATTR => 16,
            OPEN => 8,
            READ => 40,
            RELEASE | FLUSH => 24,
            FORGET | BATCH_FORGET | INTERRUPT => 8,
            _ => 0,
        }
    }

    fn dispatch(&self, req: &Request<'_>, reply: &mut dyn Reply) {
        if matches!(req.header.opcode, FORGET | BATCH_FORGET | INTERRUPT) {
            return;
        }
        let outcome = self.reply(req, reply.buf());
        reply.send(outcome).expect("reply");
    }
}

/// The reply of the /dev/fuse side: 16 bytes of out header, then payload.
struct DevReply<'a> {
    dev: &'a std::fs::File,
    unique: u64,
    buf: Vec<u8>,
}

impl Reply for DevReply<'_> {
    fn buf(&mut self) -> &mut [u8] {
        &mut self.buf[OUT_HEADER_LEN..]
    }
    fn send(&mut self, outcome: Result<usize, i32>) -> io::Result<()> {
        let (error, n) = match outcome {
            Ok(n) => (0, n),
            Err(e) => (-e, 0),
        };
        let len = OUT_HEADER_LEN + n;
        self.buf[0..4].copy_from_slice(&(len as u32).to_ne_bytes());
        self.buf[4..8].copy_from_slice(&error.to_ne_bytes());
        self.buf[8..16].copy_from_slice(&self.unique.to_ne_bytes());
        match (&*self.dev).write(&self.buf[..len]) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            r => r.map(|_| ()),
        }
    }
}

/// Reads one request from /dev/fuse; `None` once unmounted.
fn read_request(dev: &std::fs::File, buf: &mut [u8]) -> Option<usize> {
    loop {
        match (&*dev).read(buf) {
            Ok(n) => return Some(n),
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EINTR | libc::EAGAIN | libc::ENOENT)
                ) => {}
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return None,
            Err(e) => panic!("reading /dev/fuse: {e}"),
        }
    }
}

/// Unmounts (lazily, if the test did not) and removes the mount point.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let c = CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string; failure (not mounted) is fine.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn mount(dev: &OwnedFd, dir: &Path) {
    let data = format!("fd={},rootmode=40000,user_id=0,group_id=0", dev.as_raw_fd());
    let (src, dir_c, ty, data) = (
        CString::new("ramd-uring-test").unwrap(),
        CString::new(dir.as_os_str().as_bytes()).unwrap(),
        CString::new("fuse").unwrap(),
        CString::new(data).unwrap(),
    );
    // SAFETY: valid C strings.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            dir_c.as_ptr(),
            ty.as_ptr(),
            0,
            data.as_ptr().cast(),
        )
    };
    assert_eq!(
        r,
        0,
        "mount(2) of a FUSE filesystem on {dir:?} (needs root): {}",
        io::Error::last_os_error()
    );
}

/// Answers INIT on `dev`, granting FUSE_OVER_IO_URING.
fn init(dev: &std::fs::File) {
    let mut buf = vec![0u8; 1 << 16];
    let n = read_request(dev, &mut buf).expect("INIT");
    let h = InHeader::parse(&buf[..n]).expect("in header");
    assert_eq!(h.opcode, INIT);
    let arg = &buf[IN_HEADER_LEN..n];
    let u32_at = |o: usize| u32::from_ne_bytes(arg[o..o + 4].try_into().unwrap());
    let (minor, readahead, flags2) = (u32_at(4), u32_at(8), u32_at(16));
    assert!(
        u64::from(flags2) << 32 & crate::ll::abi::init::OVER_IO_URING != 0,
        "the kernel did not offer FUSE_OVER_IO_URING at INIT although {ENABLE_PARAM} is Y"
    );
    const INIT_EXT: u32 = 1 << 30;
    const MAX_PAGES: u32 = 1 << 22;
    let mut out = Vec::new();
    for v in [7, minor.min(44), readahead, INIT_EXT | MAX_PAGES] {
        out.extend_from_slice(&v.to_ne_bytes());
    }
    out.extend_from_slice(&16u16.to_ne_bytes()); // max_background
    out.extend_from_slice(&12u16.to_ne_bytes()); // congestion_threshold
    out.extend_from_slice(&MAX_WRITE.to_ne_bytes());
    out.extend_from_slice(&1u32.to_ne_bytes()); // time_gran
    out.extend_from_slice(&((MAX_WRITE / 4096) as u16).to_ne_bytes()); // max_pages
    out.extend_from_slice(&0u16.to_ne_bytes());
    out.extend_from_slice(&((crate::ll::abi::init::OVER_IO_URING >> 32) as u32).to_ne_bytes());
    out.resize(64, 0);
    let mut reply = DevReply {
        dev,
        unique: h.unique,
        buf: vec![0; OUT_HEADER_LEN + 64],
    };
    reply.buf()[..64].copy_from_slice(&out);
    reply.send(Ok(64)).expect("INIT reply");
}

/// Waits for `f` on another thread, at most `secs`.
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what} did not end within {secs} s"))
}

/// The tiny filesystem mounted, INIT answered (io_uring granted), and a
/// thread serving what comes through /dev/fuse with the same dispatcher
/// (counting its READs).
struct Fixture {
    dir: PathBuf,
    dev_fd: Arc<OwnedFd>,
    tiny: Arc<Tiny>,
    dev_reads: Arc<AtomicUsize>,
    dev_thread: std::thread::JoinHandle<()>,
    _mounted: Mounted,
}

impl Fixture {
    fn new(tag: &str) -> Fixture {
        if let Err(e) = enable() {
            panic!("FUSE over io_uring cannot be tested here: {e}");
        }
        let dir = std::env::temp_dir().join(format!("ramd-uring-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mounted = Mounted(dir.clone());
        let dev = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/fuse")
            .expect("/dev/fuse");
        let dev_fd = Arc::new(OwnedFd::from(dev.try_clone().expect("dup /dev/fuse")));
        mount(&dev_fd, &dir);
        init(&dev);
        let (tiny, dev_reads) = (Arc::new(Tiny::default()), Arc::new(AtomicUsize::new(0)));
        let (t, r) = (tiny.clone(), dev_reads.clone());
        let dev_thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; MAX_WRITE as usize + 2 * 4096];
            while let Some(n) = read_request(&dev, &mut buf) {
                let h = InHeader::parse(&buf[..n]).expect("in header");
                let a = t.arg0_len(h.opcode).min(n - IN_HEADER_LEN);
                let (arg0, rest) = buf[IN_HEADER_LEN..n].split_at(a);
                if h.opcode == READ {
                    r.fetch_add(1, Ordering::Relaxed);
                }
                let mut reply = DevReply {
                    dev: &dev,
                    unique: h.unique,
                    buf: vec![0; 1 << 18],
                };
                t.dispatch(
                    &Request {
                        header: h,
                        arg0,
                        rest,
                    },
                    &mut reply,
                );
            }
        });
        Fixture {
            dir,
            dev_fd,
            tiny,
            dev_reads,
            dev_thread,
            _mounted: mounted,
        }
    }

    /// Reads the file (checking its content) and statfs; the READs served
    /// through the ring and through /dev/fuse.
    fn read(&self) -> (usize, usize) {
        let dir = self.dir.clone();
        // A mount whose requests wait for a ring that never comes hangs.
        let (data, bsize) = within(20, "reading the file", move || {
            (
                std::fs::read(dir.join(FILE)).expect("read the file"),
                statfs_bsize(&dir),
            )
        });
        assert_eq!(data, CONTENT);
        assert_eq!(bsize, 4096);
        let dev = self.dev_reads.load(Ordering::Relaxed);
        (self.tiny.reads.load(Ordering::Relaxed) - dev, dev)
    }

    /// Unmounts; the /dev/fuse thread must end.
    fn unmount(self) {
        let c = CString::new(self.dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: a valid C string.
        let r = unsafe { libc::umount2(c.as_ptr(), 0) };
        assert_eq!(r, 0, "umount: {}", io::Error::last_os_error());
        let t = self.dev_thread;
        within(20, "the /dev/fuse reader after umount", move || t.join()).expect("reader");
    }
}

#[test]
fn reads_a_file_through_the_ring() {
    let f = Fixture::new("ring");
    let cfg = UringConfig {
        queue_depth: 3,
        threads_per_queue: 2,
        payload_len: MAX_WRITE as usize + 4096,
    };
    let uring = start(f.dev_fd.clone(), f.tiny.clone(), &cfg).expect("start the ring");
    assert_eq!(uring.queues(), possible_cpus());
    assert_eq!(uring.threads(), 2 * possible_cpus());
    let (ring, dev) = f.read();
    assert!(
        ring >= 1,
        "no READ came through the ring ({dev} through /dev/fuse)"
    );
    f.unmount();
    within(20, "the ring's queues after umount", move || uring.join()).expect("queues' end");
}

/// Opens the slow file's gate when dropped.
struct OpenGate(Arc<Tiny>);

impl Drop for OpenGate {
    fn drop(&mut self) {
        let mut g = self.0.gate.lock().unwrap_or_else(|e| e.into_inner());
        g.1 = true;
        self.0.gate_moved.notify_all();
    }
}

/// A request that waits holds up no other request of its CPU: each entry
/// has its own thread (the default configuration).
#[test]
fn a_waiting_request_holds_up_no_other_on_its_cpu() {
    let f = Fixture::new("waiting");
    let uring = start(f.dev_fd.clone(), f.tiny.clone(), &UringConfig::default()).expect("start");
    // Whatever happens, the slow READ ends: a request held up behind it
    // would otherwise keep this process (its own FUSE server) from exiting.
    let open = OpenGate(f.tiny.clone());
    let slow = f.dir.join(SLOW);
    let reader = std::thread::spawn(move || {
        pin_to(0);
        std::fs::read(slow).expect("read the slow file")
    });
    let tiny = f.tiny.clone();
    within(20, "the slow READ to arrive", move || {
        let mut g = tiny.gate.lock().unwrap();
        while !g.0 {
            g = tiny.gate_moved.wait(g).unwrap();
        }
    });
    // The same CPU's queue, its first entry's thread busy.
    let dir = f.dir.clone();
    let data = within(20, "a read beside the waiting one", move || {
        pin_to(0);
        std::fs::read(dir.join(FILE)).expect("read the file")
    });
    assert_eq!(data, CONTENT);
    drop(open);
    assert_eq!(
        within(20, "the slow READ", move || reader.join()).unwrap(),
        CONTENT
    );
    f.unmount();
    within(20, "the ring's queues after umount", move || uring.join()).expect("queues' end");
}

#[test]
fn a_failed_start_falls_back_to_dev_fuse() {
    let f = Fixture::new("fallback");
    let cfg = UringConfig {
        queue_depth: 0,
        ..UringConfig::default()
    };
    let e = start(f.dev_fd.clone(), f.tiny.clone(), &cfg)
        .err()
        .expect("depth 0 refused");
    assert!(
        e.to_string().contains("requests go through /dev/fuse"),
        "{e}"
    );
    let (ring, dev) = f.read();
    assert!(
        dev >= 1 && ring == 0,
        "READs: {ring} through the ring, {dev} through /dev/fuse"
    );
    f.unmount();
}

/// The block size statfs(2) reports.
fn statfs_bsize(dir: &Path) -> u64 {
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string and a zeroed out-struct.
    unsafe {
        let mut s: libc::statfs = std::mem::zeroed();
        assert_eq!(
            libc::statfs(c.as_ptr(), &mut s),
            0,
            "statfs: {}",
            io::Error::last_os_error()
        );
        s.f_bsize as u64
    }
}

#[test]
fn cpu_lists_count_as_the_kernel_counts_possible_cpus() {
    assert_eq!(count_cpu_list("0"), Some(1));
    assert_eq!(count_cpu_list("0-1"), Some(2));
    assert_eq!(count_cpu_list("0-3,8-11"), Some(8));
    assert_eq!(count_cpu_list("0,2"), Some(2));
    assert_eq!(count_cpu_list(""), None);
    assert_eq!(count_cpu_list("3-1"), None);
    assert_eq!(count_cpu_list("x"), None);
}

#[test]
fn a_reply_longer_than_its_buffer_is_eio() {
    let mut buf = [0u8; 8];
    let mut r = RingReply {
        buf: &mut buf,
        outcome: None,
    };
    assert!(r.send(Ok(9)).is_err());
    assert_eq!(r.outcome, Some(Err(libc::EIO)));
    let mut r = RingReply {
        buf: &mut buf,
        outcome: None,
    };
    assert!(r.send(Err(-3)).is_err());
    assert_eq!(r.outcome, Some(Err(libc::EIO)));
    let mut r = RingReply {
        buf: &mut buf,
        outcome: None,
    };
    r.send(Ok(8)).unwrap();
    assert!(r.send(Ok(1)).is_err(), "a second answer is refused");
    assert_eq!(r.outcome, Some(Ok(8)));
}
