//! The on-disk image of a disk: a directory holding one segment file per
//! save and a MANIFEST naming the chain of segments that make up the latest
//! complete save. FORMAT.md is the specification; this is its code.
//!
//! Crash safety rests on two facts of the filesystem below: `fsync` makes a
//! file's data durable, and `rename` replaces a name atomically (made
//! durable by fsync of the directory). A segment is written under a `.tmp`
//! name, fsynced and renamed; the MANIFEST likewise, and its rename is the
//! moment a save exists. Anything not named by the MANIFEST is debris.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use aligned_vec::{AVec, ConstAlign};

use crate::codec::{self, Codec};
use crate::error::{Error, Result};
use crate::store::PageRef;
use crate::PAGE_SIZE;

pub const MANIFEST: &str = "MANIFEST";
const MANIFEST_MAGIC: &str = "ramd image 1";
const SEG_MAGIC: &[u8; 8] = b"RAMDSEG\0";
const SEG_VERSION: u16 = 1;
pub const SEG_HEADER: usize = 64;
pub const REC_HEADER: usize = 32;
/// Buffered bytes a writer sends to the file at once.
const WRITE_BATCH: usize = 1 << 20;
/// Largest record payload: a frame object or a filesystem's tree.
const MAX_PAYLOAD: usize = 1 << 30;
/// Segments are written and read with O_DIRECT, which wants buffers, file
/// offsets and lengths aligned to the device's logical block: 4 KiB covers
/// the usual ones.
const DIO_ALIGN: usize = 4096;

/// A buffer O_DIRECT accepts.
type Buf = AVec<u8, ConstAlign<DIO_ALIGN>>;

fn new_buf() -> Buf {
    Buf::with_capacity(DIO_ALIGN, WRITE_BATCH + (128 << 10))
}

// Record types.
const R_RAW: u8 = 1;
const R_PACKED: u8 = 2;
const R_FILL: u8 = 3;
const R_HOLE: u8 = 4;
const R_FRAME: u8 = 5;
const R_GONE: u8 = 6;
const R_META: u8 = 7;
const R_END: u8 = 0xff;

/// What kind of disk an image holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskKind {
    Block,
    Fs,
}

impl DiskKind {
    pub fn name(self) -> &'static str {
        match self {
            DiskKind::Block => "block",
            DiskKind::Fs => "fs",
        }
    }

    fn id(self) -> u8 {
        match self {
            DiskKind::Block => 1,
            DiskKind::Fs => 2,
        }
    }
}

/// One save in the chain, as the MANIFEST lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SegEntry {
    pub seq: u64,
    pub full: bool,
    /// Page records (frame members counted one by one).
    pub pages: u64,
    /// Records, END excluded.
    pub records: u64,
    /// Length of the segment file.
    pub bytes: u64,
    /// When the save's switch happened (ns since the epoch).
    pub time_ns: u64,
}

/// The chain of saves that make up an image's latest complete save.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Manifest {
    #[serde(serialize_with = "kind_name")]
    pub kind: DiskKind,
    /// The disk's size in bytes (an fs disk's capacity; 0: unlimited).
    pub size: u64,
    /// The full save first, then the incremental saves in order.
    pub chain: Vec<SegEntry>,
}

fn kind_name<S: serde::Serializer>(k: &DiskKind, s: S) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(k.name())
}

impl Manifest {
    /// Bytes of all segments in the chain.
    pub fn bytes(&self) -> u64 {
        self.chain.iter().map(|s| s.bytes).sum()
    }

    fn encode(&self) -> String {
        let mut t = format!(
            "{MANIFEST_MAGIC}\nkind {}\nsize {}\n",
            self.kind.name(),
            self.size
        );
        for s in &self.chain {
            t += &format!(
                "seg {} {} pages={} records={} bytes={} time={}\n",
                s.seq,
                if s.full { "full" } else { "incr" },
                s.pages,
                s.records,
                s.bytes,
                s.time_ns
            );
        }
        let crc = crc32c::crc32c(t.as_bytes());
        t + &format!("crc32c {crc:08x}\n")
    }

    fn decode(path: &Path, text: &[u8]) -> Result<Manifest> {
        let bad = |offset: usize, reason: &str| Error::Image {
            file: path.to_path_buf(),
            offset: offset as u64,
            reason: reason.to_string(),
        };
        let text = std::str::from_utf8(text).map_err(|e| bad(e.valid_up_to(), "not text"))?;
        let Some(at) = text.rfind("crc32c ") else {
            return Err(bad(0, "not a ramd image MANIFEST (no checksum line)"));
        };
        let want = text[at..]
            .strip_prefix("crc32c ")
            .and_then(|v| v.strip_suffix('\n'))
            .and_then(|v| u32::from_str_radix(v, 16).ok())
            .ok_or_else(|| bad(at, "bad checksum line"))?;
        if crc32c::crc32c(&text.as_bytes()[..at]) != want {
            return Err(bad(at, "checksum mismatch"));
        }
        let mut kind = None;
        let mut size = None;
        let mut chain = Vec::new();
        let mut offset = 0;
        for (n, line) in text[..at].lines().enumerate() {
            let here = offset;
            offset += line.len() + 1;
            let words: Vec<&str> = line.split(' ').collect();
            match (n, words.as_slice()) {
                (0, _) if line == MANIFEST_MAGIC => {}
                (0, _) => return Err(bad(0, "not a ramd image MANIFEST, or a newer version")),
                (_, ["kind", "block"]) => kind = Some(DiskKind::Block),
                (_, ["kind", "fs"]) => kind = Some(DiskKind::Fs),
                (_, ["size", v]) => size = v.parse().ok(),
                (_, ["seg", seq, full, rest @ ..]) if rest.len() == 4 => {
                    let field = |i: usize, name: &str| -> Option<u64> {
                        rest[i].strip_prefix(name)?.strip_prefix('=')?.parse().ok()
                    };
                    let entry = (|| {
                        Some(SegEntry {
                            seq: seq.parse().ok()?,
                            full: match *full {
                                "full" => true,
                                "incr" => false,
                                _ => return None,
                            },
                            pages: field(0, "pages")?,
                            records: field(1, "records")?,
                            bytes: field(2, "bytes")?,
                            time_ns: field(3, "time")?,
                        })
                    })()
                    .ok_or_else(|| bad(here, "bad seg line"))?;
                    chain.push(entry);
                }
                _ => return Err(bad(here, &format!("unknown line {line:?}"))),
            }
        }
        let kind = kind.ok_or_else(|| bad(0, "no kind line"))?;
        let size = size.ok_or_else(|| bad(0, "no size line"))?;
        let ok = chain.first().is_some_and(|s| s.full)
            && chain.iter().skip(1).all(|s| !s.full)
            && chain.windows(2).all(|w| w[0].seq < w[1].seq);
        if !ok {
            return Err(bad(
                0,
                "the chain must be one full save then incremental ones in order",
            ));
        }
        Ok(Manifest { kind, size, chain })
    }
}

/// One record of a segment, as read.
#[derive(Debug)]
pub enum Record<'a> {
    Page(u64, PageRef<'a>),
    Frame { key: u64, mask: u64, data: &'a [u8] },
    Gone(u64),
    Meta(&'a [u8]),
}

/// Where a save stops itself with SIGKILL (`RAMD_TEST_CRASH`, tests only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Crash {
    Pages(u64),
    SegmentSynced,
    SegmentRenamed,
    ManifestWritten,
    ManifestRenamed,
}

fn crash_point() -> Option<Crash> {
    let v = std::env::var("RAMD_TEST_CRASH").ok()?;
    Some(match v.as_str() {
        "segment-synced" => Crash::SegmentSynced,
        "segment-renamed" => Crash::SegmentRenamed,
        "manifest-written" => Crash::ManifestWritten,
        "manifest-renamed" => Crash::ManifestRenamed,
        _ => Crash::Pages(v.strip_prefix("pages:")?.parse().ok()?),
    })
}

fn crash_if(at: Crash) {
    if crash_point() == Some(at) {
        log::warn!("RAMD_TEST_CRASH={at:?}: killing myself");
        // SAFETY: plain syscalls.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
}

/// An image directory.
pub struct ImageDir {
    path: PathBuf,
    manifest: Option<Manifest>,
    /// Highest sequence number a segment was begun with: never reused, even
    /// when a commit failed after its MANIFEST was already renamed.
    last_seq: u64,
}

impl ImageDir {
    /// Opens the image at `path`, creating the directory (0700) if
    /// missing; removes debris of interrupted saves. A MANIFEST that is
    /// present must be valid.
    pub fn open(path: &Path) -> Result<ImageDir> {
        if !path.exists() {
            fs::DirBuilder::new()
                .mode(0o700)
                .recursive(true)
                .create(path)
                .map_err(|e| Error::file(path, e))?;
        }
        let manifest = read_manifest(path)?;
        let last_seq = manifest
            .as_ref()
            .and_then(|m| m.chain.last())
            .map_or(0, |s| s.seq);
        let dir = ImageDir {
            path: path.to_path_buf(),
            manifest,
            last_seq,
        };
        dir.remove_debris();
        Ok(dir)
    }

    /// Opens an existing image for reading only (`ramd image ...`).
    pub fn open_existing(path: &Path) -> Result<ImageDir> {
        match read_manifest(path)? {
            Some(m) => Ok(ImageDir {
                path: path.to_path_buf(),
                last_seq: m.chain.last().map_or(0, |s| s.seq),
                manifest: Some(m),
            }),
            None => Err(Error::file(
                path.join(MANIFEST),
                io::Error::new(io::ErrorKind::NotFound, "no image here (no MANIFEST)"),
            )),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn manifest(&self) -> Option<&Manifest> {
        self.manifest.as_ref()
    }

    /// The sequence number for the next save.
    pub fn next_seq(&self) -> u64 {
        self.last_seq + 1
    }

    pub fn seg_path(&self, seq: u64) -> PathBuf {
        self.path.join(format!("seg-{seq:08}"))
    }

    /// Files not named by the MANIFEST: `.tmp` files and segments of
    /// chains that a later full save replaced.
    fn remove_debris(&self) {
        let keep: Vec<PathBuf> = self
            .manifest
            .iter()
            .flat_map(|m| &m.chain)
            .map(|s| self.seg_path(s.seq))
            .collect();
        let Ok(entries) = fs::read_dir(&self.path) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let name = name.to_string_lossy();
            let ours = name.ends_with(".tmp") || name.starts_with("seg-");
            if ours && !keep.contains(&e.path()) {
                if let Err(err) = fs::remove_file(e.path()) {
                    log::warn!("removing {}: {err}", e.path().display());
                }
            }
        }
    }

    /// Reads every segment of the chain in order, checking every checksum,
    /// and hands each record to `apply` (with the file and offset it came
    /// from, for errors); `progress` gets bytes read so far and in all.
    pub fn read_chain(
        &self,
        mut apply: impl FnMut(Record<'_>) -> Result<()>,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<()> {
        let m = self.manifest.as_ref().expect("read_chain needs an image");
        let total = m.bytes();
        let mut before = 0;
        for seg in &m.chain {
            let path = self.seg_path(seg.seq);
            read_segment(&path, m, seg, &mut apply, &mut |n| {
                progress(before + n, total)
            })?;
            before += seg.bytes;
        }
        Ok(())
    }

    /// Starts the segment of save `seq`.
    pub fn begin_segment(
        &mut self,
        seq: u64,
        full: bool,
        kind: DiskKind,
        size: u64,
    ) -> Result<SegWriter> {
        assert!(
            seq > self.last_seq,
            "segment {seq} reuses a sequence number"
        );
        self.last_seq = seq;
        let path = self.seg_path(seq);
        let tmp = path.with_extension("tmp");
        // O_DIRECT: the data goes from our buffers to the device, sparing a
        // copy into the page cache (on these VMs the copy alone took half a
        // core during autosaves under load) and the cache itself, which a
        // save would otherwise fill with gigabytes nobody reads back.
        let (file, direct) = open_direct(
            &tmp,
            OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600),
        )
        .map_err(|e| Error::file(&tmp, e))?;
        let time_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let base = if full {
            seq
        } else {
            self.manifest
                .as_ref()
                .and_then(|m| m.chain.first())
                .map_or(seq, |s| s.seq)
        };
        let mut h = [0u8; SEG_HEADER];
        h[..8].copy_from_slice(SEG_MAGIC);
        h[8..10].copy_from_slice(&SEG_VERSION.to_le_bytes());
        h[10..12].copy_from_slice(&(SEG_HEADER as u16).to_le_bytes());
        h[12] = kind.id();
        h[13] = full as u8;
        h[16..24].copy_from_slice(&seq.to_le_bytes());
        h[24..32].copy_from_slice(&base.to_le_bytes());
        h[32..40].copy_from_slice(&size.to_le_bytes());
        h[40..48].copy_from_slice(&time_ns.to_le_bytes());
        h[48..52].copy_from_slice(&(PAGE_SIZE as u32).to_le_bytes());
        let crc = crc32c::crc32c(&h[..60]);
        h[60..64].copy_from_slice(&crc.to_le_bytes());
        let mut buf = new_buf();
        buf.extend_from_slice(&h);
        // Encoding (copies and checksums, under store locks) and writing
        // overlap on two threads.
        let (to_disk, rx) = std::sync::mpsc::sync_channel::<Buf>(2);
        let (back, empties) = std::sync::mpsc::channel();
        let writer = std::thread::Builder::new()
            .name("ramd-seg-write".into())
            .spawn(move || {
                let mut direct = direct;
                let mut at = 0u64;
                for mut b in rx {
                    write_block(&file, &mut direct, &b, at)?;
                    if !direct && !b.is_empty() {
                        // Start writeback now, so the disk works while we
                        // encode and the closing fsync has little left.
                        // SAFETY: a hint on our own descriptor.
                        unsafe {
                            libc::sync_file_range(
                                std::os::fd::AsRawFd::as_raw_fd(&file),
                                at as i64,
                                b.len() as i64,
                                libc::SYNC_FILE_RANGE_WRITE,
                            )
                        };
                    }
                    at += b.len() as u64;
                    b.clear();
                    let _ = back.send(b);
                }
                Ok(file)
            })
            .map_err(|e| Error::file(&tmp, e))?;
        Ok(SegWriter {
            to_disk: Some(to_disk),
            empties,
            writer: Some(writer),
            tmp,
            path,
            dir: self.path.clone(),
            buf,
            written: 0,
            entry: SegEntry {
                seq,
                full,
                pages: 0,
                records: 0,
                bytes: 0,
                time_ns,
            },
            crash: crash_point(),
        })
    }

    /// Makes a finished segment part of the image: the new MANIFEST is
    /// written, fsynced and renamed over the old one; a full save then
    /// removes the chain it replaces.
    pub fn commit(&mut self, kind: DiskKind, size: u64, seg: SegEntry) -> Result<()> {
        let mut m = match &self.manifest {
            Some(m) if !seg.full => m.clone(),
            _ => Manifest {
                kind,
                size,
                chain: Vec::new(),
            },
        };
        m.kind = kind;
        m.size = size;
        m.chain.push(seg);
        let path = self.path.join(MANIFEST);
        let tmp = self.path.join("MANIFEST.tmp");
        let write = || -> io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(m.encode().as_bytes())?;
            f.sync_all()
        };
        write().map_err(|e| Error::file(&tmp, e))?;
        crash_if(Crash::ManifestWritten);
        fs::rename(&tmp, &path).map_err(|e| Error::file(&path, e))?;
        crash_if(Crash::ManifestRenamed);
        sync_dir(&self.path)?;
        self.manifest = Some(m);
        self.remove_debris();
        Ok(())
    }
}

fn read_manifest(dir: &Path) -> Result<Option<Manifest>> {
    let path = dir.join(MANIFEST);
    match fs::read(&path) {
        Ok(text) => Manifest::decode(&path, &text).map(Some),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(Error::file(path, e)),
    }
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::file(dir, e))
}

/// Writes one segment; records are buffered and sent in large batches by
/// [`SegWriter::write_out`], never while the caller holds a store lock.
pub struct SegWriter {
    /// Full buffers go to the writer thread; it sends them back empty.
    to_disk: Option<std::sync::mpsc::SyncSender<Buf>>,
    empties: std::sync::mpsc::Receiver<Buf>,
    /// Writes buffers in order; returns the file for the fsync, or the
    /// first error.
    writer: Option<std::thread::JoinHandle<io::Result<File>>>,
    tmp: PathBuf,
    path: PathBuf,
    dir: PathBuf,
    /// Records not sent yet; they start at file offset `written`, which is
    /// a multiple of `DIO_ALIGN`.
    buf: Buf,
    written: u64,
    entry: SegEntry,
    crash: Option<Crash>,
}

impl SegWriter {
    fn record(&mut self, ty: u8, sub: u8, a: u64, b: u64, payload: &[u8]) {
        let start = self.buf.len();
        let padded = payload.len().next_multiple_of(8);
        self.buf.resize(start + REC_HEADER, 0);
        let h = &mut self.buf[start..];
        h[4] = ty;
        h[5] = sub;
        h[8..12].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        h[16..24].copy_from_slice(&a.to_le_bytes());
        h[24..32].copy_from_slice(&b.to_le_bytes());
        self.buf.extend_from_slice(payload);
        self.buf.resize(start + REC_HEADER + padded, 0);
        let crc = crc32c::crc32c(&self.buf[start + 4..]);
        self.buf[start..start + 4].copy_from_slice(&crc.to_le_bytes());
        if ty != R_END {
            self.entry.records += 1;
        }
    }

    /// Adds a page, or a frame (`page` is then its chunk's first page).
    pub fn page(&mut self, page: u64, p: PageRef<'_>) {
        match p {
            PageRef::Hole => self.record(R_HOLE, 0, page, 0, &[]),
            PageRef::Fill(pat) => self.record(R_FILL, 0, page, pat, &[]),
            PageRef::Raw { data, hot } => self.record(R_RAW, !hot as u8, page, 0, data),
            PageRef::Packed { zstd, data } => self.record(R_PACKED, 1 + zstd as u8, page, 0, data),
            PageRef::Frame { mask, data } => {
                let key = page / crate::store::CHUNK_PAGES as u64;
                self.record(R_FRAME, 0, key, mask, data);
                self.entry.pages += mask.count_ones() as u64 - 1;
            }
        }
        self.entry.pages += 1;
    }

    /// All 64 pages of chunk `key` are holes (applied before the pages).
    pub fn gone(&mut self, key: u64) {
        self.record(R_GONE, 0, key, 0, &[]);
    }

    /// A filesystem's tree; refused if larger than a record may be (a
    /// reader would refuse it, so the save must fail and keep the old image).
    pub fn meta(&mut self, bytes: &[u8]) -> Result<()> {
        if bytes.len() > MAX_PAYLOAD {
            return Err(Error::Invalid(format!(
                "the filesystem's tree takes {} bytes; an image record holds at most {MAX_PAYLOAD}",
                bytes.len()
            )));
        }
        self.record(R_META, 0, 0, 0, bytes);
        Ok(())
    }

    /// Sends the buffer to the file once it holds a batch.
    pub fn write_out(&mut self) -> Result<()> {
        if self.buf.len() >= WRITE_BATCH {
            self.send(false)?;
        }
        if let Some(Crash::Pages(n)) = self.crash {
            if self.entry.pages >= n && self.writer.is_some() {
                self.send(false)?;
                self.drain()?;
                crash_if(Crash::Pages(n));
            }
        }
        Ok(())
    }

    /// Hands the buffer to the writer thread (waiting if two are queued):
    /// its whole blocks, the partial one moving to the next buffer; or with
    /// `last`, everything, zero-padded to a whole block (`finish` cuts the
    /// file back to its length).
    fn send(&mut self, last: bool) -> Result<()> {
        let len = self.buf.len();
        let cut = if last {
            len
        } else {
            len / DIO_ALIGN * DIO_ALIGN
        };
        let mut next = self.empties.try_recv().unwrap_or_else(|_| new_buf());
        next.extend_from_slice(&self.buf[cut..]);
        let mut full = std::mem::replace(&mut self.buf, next);
        full.truncate(cut);
        self.written += cut as u64;
        full.resize(cut.next_multiple_of(DIO_ALIGN), 0);
        let sent = self.to_disk.as_ref().expect("writer running").send(full);
        if sent.is_err() {
            // The writer stopped on an error: collect it.
            return self.drain().map(|_| ());
        }
        Ok(())
    }

    /// Waits until everything sent is written; returns the file.
    fn drain(&mut self) -> Result<File> {
        drop(self.to_disk.take());
        let result = self.writer.take().expect("drained once").join();
        match result {
            Ok(Ok(file)) => Ok(file),
            Ok(Err(e)) => Err(Error::file(&self.tmp, e)),
            Err(_) => Err(Error::file(
                &self.tmp,
                io::Error::other("writer thread panicked"),
            )),
        }
    }

    /// Ends the segment: END record, fsync, rename to its final name.
    /// Returns its MANIFEST entry, for [`ImageDir::commit`].
    pub fn finish(mut self) -> Result<SegEntry> {
        let (records, pages) = (self.entry.records, self.entry.pages);
        self.record(R_END, 0, records, pages, &[]);
        let sent = self.send(true).and_then(|()| self.drain());
        let file = match sent {
            Ok(f) => f,
            Err(e) => {
                let _ = fs::remove_file(&self.tmp);
                return Err(e);
            }
        };
        if let Err(e) = file.set_len(self.written).and_then(|()| file.sync_all()) {
            let _ = fs::remove_file(&self.tmp);
            return Err(Error::file(&self.tmp, e));
        }
        crash_if(Crash::SegmentSynced);
        fs::rename(&self.tmp, &self.path).map_err(|e| Error::file(&self.path, e))?;
        sync_dir(&self.dir)?;
        crash_if(Crash::SegmentRenamed);
        self.entry.bytes = self.written;
        Ok(self.entry.clone())
    }

    /// Gives up: the partial file goes.
    pub fn discard(mut self) {
        if self.writer.is_some() {
            let _ = self.drain();
        }
        let _ = fs::remove_file(&self.tmp);
    }
}

/// Writes a whole buffer at offset `at`. A filesystem may take O_DIRECT at
/// open and still refuse our alignment (EINVAL), also after a short write:
/// the buffer is then written again, at the same offset, through the page
/// cache, as is the rest of the segment.
fn write_block(file: &File, direct: &mut bool, b: &[u8], at: u64) -> io::Result<()> {
    use std::os::unix::fs::FileExt;
    match file.write_all_at(b, at) {
        Err(e) if *direct && e.raw_os_error() == Some(libc::EINVAL) => {
            clear_direct(file, direct)?;
            file.write_all_at(b, at)
        }
        r => r,
    }
}

/// Opens with O_DIRECT, or without it on a filesystem that refuses it
/// (EINVAL); says which.
fn open_direct(path: &Path, o: &mut OpenOptions) -> io::Result<(File, bool)> {
    match o.clone().custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((o.open(path)?, false)),
        Err(e) => Err(e),
    }
}

/// Turns O_DIRECT off for the rest of a file's use.
fn clear_direct(file: &File, direct: &mut bool) -> io::Result<()> {
    let fd = std::os::fd::AsRawFd::as_raw_fd(file);
    // SAFETY: flag changes on our own descriptor.
    let cleared = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_DIRECT) == 0
    };
    if !cleared {
        return Err(io::Error::last_os_error());
    }
    *direct = false;
    Ok(())
}

/// Reads a file from start to end on its own thread, a few blocks ahead of
/// the caller, with O_DIRECT where the filesystem allows it: a load then
/// neither copies through the page cache nor fills it with an image that
/// now lives in the store. Without O_DIRECT, what was read is dropped from
/// the cache.
struct AheadReader {
    blocks: Option<std::sync::mpsc::Receiver<io::Result<Buf>>>,
    empties: std::sync::mpsc::Sender<Buf>,
    reader: Option<std::thread::JoinHandle<()>>,
    cur: Buf,
    pos: usize,
}

/// What one read of [`AheadReader`] asks for.
const READ_BLOCK: usize = 4 << 20;

impl AheadReader {
    /// Reads the file's `len` bytes.
    fn start(file: File, direct: bool, len: u64) -> io::Result<Self> {
        let (to_parser, blocks) = std::sync::mpsc::sync_channel(2);
        let (empties, back) = std::sync::mpsc::channel::<Buf>();
        let reader = std::thread::Builder::new()
            .name("ramd-seg-read".into())
            .spawn(move || {
                let mut direct = direct;
                let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
                if !direct {
                    advise(fd, 0, 0, libc::POSIX_FADV_SEQUENTIAL);
                }
                let mut at = 0u64;
                while at < len {
                    let mut b = back
                        .try_recv()
                        .unwrap_or_else(|_| Buf::with_capacity(DIO_ALIGN, READ_BLOCK));
                    let want = (len - at).min(READ_BLOCK as u64) as usize;
                    // Direct reads ask for whole blocks; the end of the file
                    // cuts the last one short.
                    b.resize(want.next_multiple_of(DIO_ALIGN), 0);
                    let n = match read_block(&file, &mut direct, &mut b, want, at) {
                        Ok(n) => n,
                        Err(e) => {
                            let _ = to_parser.send(Err(e));
                            return;
                        }
                    };
                    if !direct {
                        // The data now lives in the store.
                        advise(fd, at, n as u64, libc::POSIX_FADV_DONTNEED);
                    }
                    b.truncate(n);
                    at += n as u64;
                    if to_parser.send(Ok(b)).is_err() {
                        return; // the parser stopped
                    }
                    if n < want {
                        return; // the file shrank: the parser says where
                    }
                }
            })?;
        Ok(AheadReader {
            blocks: Some(blocks),
            empties,
            reader: Some(reader),
            cur: Buf::new(DIO_ALIGN),
            pos: 0,
        })
    }
}

/// Reads `want` bytes at offset `at` into `b` (which may be longer, for
/// O_DIRECT's whole blocks); fewer only if the file ends sooner.
fn read_block(
    file: &File,
    direct: &mut bool,
    b: &mut [u8],
    want: usize,
    at: u64,
) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    let mut n = 0;
    while n < want {
        // Direct reads start and end on whole blocks.
        let end = if *direct { b.len() } else { want };
        match file.read_at(&mut b[n..end], at + n as u64) {
            Ok(0) => break,
            Ok(k) => {
                n += k;
                // A short read that leaves us mid-block (some network
                // filesystems): the rest goes through the page cache.
                if *direct && n < want && n % DIO_ALIGN != 0 {
                    clear_direct(file, direct)?;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if *direct && e.raw_os_error() == Some(libc::EINVAL) => {
                clear_direct(file, direct)?
            }
            Err(e) => return Err(e),
        }
    }
    Ok(n.min(want))
}

impl Read for AheadReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if self.pos == self.cur.len() {
            let Some(next) = self.blocks.as_ref().and_then(|b| b.recv().ok()) else {
                return Ok(0); // end of file
            };
            let old = std::mem::replace(&mut self.cur, next?);
            if old.capacity() > 0 {
                let _ = self.empties.send(old);
            }
            self.pos = 0;
        }
        let n = out.len().min(self.cur.len() - self.pos);
        out[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Drop for AheadReader {
    fn drop(&mut self) {
        // Unblocks the reader if it waits to hand over a block.
        drop(self.blocks.take());
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// Reads and checks one segment, handing its records to `apply`.
fn read_segment(
    path: &Path,
    m: &Manifest,
    seg: &SegEntry,
    apply: &mut impl FnMut(Record<'_>) -> Result<()>,
    progress: &mut impl FnMut(u64),
) -> Result<()> {
    let bad = |offset: u64, reason: String| Error::Image {
        file: path.to_path_buf(),
        offset,
        reason,
    };
    let (file, direct) =
        open_direct(path, OpenOptions::new().read(true)).map_err(|e| Error::file(path, e))?;
    let len = file.metadata().map_err(|e| Error::file(path, e))?.len();
    if len != seg.bytes {
        return Err(bad(
            len.min(seg.bytes),
            format!(
                "file is {len} bytes, the MANIFEST says {} (truncated or appended to)",
                seg.bytes
            ),
        ));
    }
    let mut r = AheadReader::start(file, direct, len).map_err(|e| Error::file(path, e))?;
    // Running out of bytes is damage; any other read error is the disk's.
    let short = |e: io::Error, damage: Error| match e.kind() {
        io::ErrorKind::UnexpectedEof => damage,
        _ => Error::file(path, e),
    };
    let mut h = [0u8; SEG_HEADER];
    r.read_exact(&mut h)
        .map_err(|e| short(e, bad(0, "too short for a segment header".into())))?;
    if &h[..8] != SEG_MAGIC {
        return Err(bad(0, "not a ramd image segment (bad magic)".into()));
    }
    if crc32c::crc32c(&h[..60]) != u32::from_le_bytes(h[60..64].try_into().unwrap()) {
        return Err(bad(60, "segment header checksum mismatch".into()));
    }
    let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
    let version = u16::from_le_bytes([h[8], h[9]]);
    if version != SEG_VERSION {
        return Err(bad(
            8,
            format!("segment version {version}; this ramd reads {SEG_VERSION}"),
        ));
    }
    let checks = [
        (
            12,
            h[12] == m.kind.id(),
            "disk kind differs from the MANIFEST's",
        ),
        (
            13,
            (h[13] != 0) == seg.full,
            "full/incremental differs from the MANIFEST's",
        ),
        (
            16,
            u64_at(16) == seg.seq,
            "sequence number differs from the MANIFEST's",
        ),
        (24, u64_at(24) == m.chain[0].seq, "belongs to another chain"),
        (
            32,
            u64_at(32) == m.size,
            "disk size differs from the MANIFEST's",
        ),
        // Tells apart same-numbered segments of two images.
        (
            40,
            u64_at(40) == seg.time_ns,
            "save time differs from the MANIFEST's (a segment of another image?)",
        ),
        (
            48,
            u32::from_le_bytes(h[48..52].try_into().unwrap()) == PAGE_SIZE as u32,
            "page size is not 4096",
        ),
    ];
    if let Some(&(at, _, why)) = checks.iter().find(|c| !c.1) {
        return Err(bad(at, why.into()));
    }
    let mut offset = SEG_HEADER as u64;
    let mut payload = Vec::new();
    let (mut records, mut pages) = (0u64, 0u64);
    loop {
        let at = offset;
        let mut rh = [0u8; REC_HEADER];
        r.read_exact(&mut rh)
            .map_err(|e| short(e, bad(at, "segment ends without its END record".into())))?;
        let ty = rh[4];
        let sub = rh[5];
        let plen = u32::from_le_bytes(rh[8..12].try_into().unwrap()) as usize;
        let a = u64::from_le_bytes(rh[16..24].try_into().unwrap());
        let b = u64::from_le_bytes(rh[24..32].try_into().unwrap());
        let what = || match ty {
            R_RAW | R_PACKED | R_FILL | R_HOLE => format!("page {a}"),
            R_FRAME | R_GONE => format!(
                "pages {}..{}",
                a.saturating_mul(64),
                a.saturating_mul(64).saturating_add(64)
            ),
            _ => format!("record type {ty}"),
        };
        if plen > MAX_PAYLOAD || at + (REC_HEADER + plen) as u64 > len {
            return Err(bad(
                at,
                format!("{}: record length {plen} runs past the end", what()),
            ));
        }
        payload.resize(plen.next_multiple_of(8), 0);
        r.read_exact(&mut payload)
            .map_err(|e| short(e, bad(at, format!("{}: record runs past the end", what()))))?;
        let mut crc = crc32c::crc32c(&rh[4..]);
        crc = crc32c::crc32c_append(crc, &payload);
        if crc != u32::from_le_bytes(rh[..4].try_into().unwrap()) {
            return Err(bad(at, format!("{}: checksum mismatch", what())));
        }
        offset += (REC_HEADER + payload.len()) as u64;
        let data = &payload[..plen];
        let rec = match (ty, sub) {
            (R_END, _) => {
                if a != records || b != pages {
                    return Err(bad(at, format!(
                        "END record counts {a} records and {b} pages, the segment holds {records} and {pages}"
                    )));
                }
                if offset != len {
                    return Err(bad(offset, "data after the END record".into()));
                }
                if records != seg.records || pages != seg.pages {
                    return Err(bad(
                        at,
                        "record or page count differs from the MANIFEST's".into(),
                    ));
                }
                progress(offset);
                return Ok(());
            }
            (R_RAW, 0 | 1) if plen == PAGE_SIZE => Record::Page(
                a,
                PageRef::Raw {
                    data,
                    hot: sub == 0,
                },
            ),
            (R_PACKED, 1 | 2) if plen > 0 && plen <= crate::store::MAX_PACKED => Record::Page(
                a,
                PageRef::Packed {
                    zstd: sub == 2,
                    data,
                },
            ),
            (R_FILL, 0) if plen == 0 => Record::Page(a, PageRef::Fill(b)),
            (R_HOLE, 0) if plen == 0 => Record::Page(a, PageRef::Hole),
            (R_FRAME, 0) if b != 0 => Record::Frame {
                key: a,
                mask: b,
                data,
            },
            (R_GONE, 0) if plen == 0 => Record::Gone(a),
            (R_META, 0) => Record::Meta(data),
            _ => {
                return Err(bad(
                    at,
                    format!(
                        "{}: unknown record (type {ty}, variant {sub}, {plen} bytes)",
                        what()
                    ),
                ))
            }
        };
        records += 1;
        pages += match rec {
            Record::Page(..) => 1,
            Record::Frame { mask, .. } => mask.count_ones() as u64,
            _ => 0,
        };
        apply(rec).map_err(|e| match e {
            // Not damage: the disk's settings leave no room for the image.
            e @ (Error::NoSpace { .. }
            | Error::SharedNoSpace { .. }
            | Error::DiskFull { .. }
            | Error::HostMemoryLow { .. }) => e,
            e => bad(at, format!("{}: {e}", what())),
        })?;
        if records % 4096 == 0 {
            progress(offset);
        }
    }
}

fn advise(fd: i32, offset: u64, len: u64, advice: i32) {
    // SAFETY: advice only; errors cost speed, not correctness.
    unsafe { libc::posix_fadvise(fd, offset as i64, len as i64, advice) };
}

/// Decompresses what a record holds, to check it fully (`ramd image verify`)
/// or to write it out raw (`export`): `out` gets `(page, bytes)` pairs.
pub fn decode_record(
    rec: &Record<'_>,
    mut out: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    let mut page = [0u8; PAGE_SIZE];
    match *rec {
        Record::Page(p, PageRef::Hole) => out(p, &[0u8; PAGE_SIZE]),
        Record::Page(p, PageRef::Fill(pat)) => {
            for c in page.chunks_exact_mut(8) {
                c.copy_from_slice(&pat.to_ne_bytes());
            }
            out(p, &page)
        }
        Record::Page(p, PageRef::Raw { data, .. }) => out(p, data),
        Record::Page(p, PageRef::Packed { zstd, data }) => {
            let c = if zstd { Codec::Zstd(0) } else { Codec::Lz4 };
            codec::decompress(c, data, &mut page)?;
            out(p, &page)
        }
        Record::Page(_, PageRef::Frame { .. }) => unreachable!("frames are Record::Frame"),
        Record::Frame { key, mask, data } => {
            if data.len() < 8 {
                return Err(Error::Corrupt("frame shorter than its header".into()));
            }
            let (start, n) = (data[0] as usize, data[1] as usize);
            let c = match data[2] {
                1 => Codec::Lz4,
                2 => Codec::Zstd(0),
                id => return Err(Error::Corrupt(format!("frame codec id {id}"))),
            };
            let mut plain = vec![0u8; n * PAGE_SIZE];
            codec::decompress(c, &data[8..], &mut plain)?;
            for i in (0..64).filter(|&i| mask & 1 << i != 0) {
                if i < start || i >= start + n {
                    return Err(Error::Corrupt(format!(
                        "frame member {i} outside {start}..{}",
                        start + n
                    )));
                }
                out(
                    key.saturating_mul(64).saturating_add(i as u64),
                    &plain[(i - start) * PAGE_SIZE..][..PAGE_SIZE],
                )?;
            }
            Ok(())
        }
        Record::Gone(key) => {
            for i in 0..64 {
                out(key.saturating_mul(64).saturating_add(i), &[0u8; PAGE_SIZE])?;
            }
            Ok(())
        }
        Record::Meta(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes O_DIRECT refuses (a few bytes from unaligned memory at an
    /// unaligned offset) go through the page cache instead, and land.
    #[test]
    fn refused_direct_writes_go_through_the_page_cache() {
        let path = std::env::temp_dir().join(format!("ramd-dio-test-{}", std::process::id()));
        let open = |direct: bool| {
            let mut o = OpenOptions::new();
            o.write(true).create(true).truncate(true);
            if direct {
                o.custom_flags(libc::O_DIRECT);
            }
            o.open(&path)
        };
        let (f, mut direct) = match open(true) {
            Ok(f) => (f, true),
            Err(_) => (open(false).unwrap(), false),
        };
        let mut block = Buf::with_capacity(DIO_ALIGN, DIO_ALIGN);
        block.resize(DIO_ALIGN, 7);
        write_block(&f, &mut direct, &block, 0).unwrap();
        write_block(&f, &mut direct, b"abc", DIO_ALIGN as u64).unwrap();
        write_block(&f, &mut direct, b"de", DIO_ALIGN as u64 + 3).unwrap();
        if on_ext4(&path) {
            assert!(!direct, "ext4 took an unaligned O_DIRECT write");
        }
        drop(f);
        let got = fs::read(&path).unwrap();
        fs::remove_file(&path).unwrap();
        assert_eq!(got.len(), DIO_ALIGN + 5);
        assert!(got[..DIO_ALIGN].iter().all(|&b| b == 7));
        assert_eq!(&got[DIO_ALIGN..], b"abcde");
    }

    /// The reader hands over a file exactly, across block boundaries and
    /// with a length that is not a multiple of a block, and stops cleanly
    /// when dropped part way.
    #[test]
    fn ahead_reader_reads_files_exactly() {
        let path = std::env::temp_dir().join(format!("ramd-ahead-test-{}", std::process::id()));
        let data: Vec<u8> = (0..READ_BLOCK * 2 + 12345)
            .map(|i| (i * 7 + i / 4096) as u8)
            .collect();
        fs::write(&path, &data).unwrap();
        let reader = || {
            let (f, direct) = open_direct(&path, OpenOptions::new().read(true)).unwrap();
            AheadReader::start(f, direct, data.len() as u64).unwrap()
        };
        let mut got = Vec::new();
        let mut r = reader();
        let mut piece = vec![0u8; 100_003];
        loop {
            let n = r.read(&mut piece).unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&piece[..n]);
        }
        assert!(
            got == data,
            "read {} bytes, not the file's {}",
            got.len(),
            data.len()
        );
        let mut r = reader();
        r.read_exact(&mut piece).unwrap();
        assert!(piece[..] == data[..piece.len()]);
        drop(r);
        fs::remove_file(&path).unwrap();
    }

    /// Whether `path` is on ext4, which refuses unaligned O_DIRECT writes.
    fn on_ext4(path: &Path) -> bool {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: statfs into a zeroed struct we own.
        unsafe {
            let mut st: libc::statfs = std::mem::zeroed();
            libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type == 0xEF53
        }
    }

    /// Segments of records of every size, with batches sent at random
    /// points (so partial blocks carry over at every offset), read back
    /// exactly; the MANIFEST's length is the records', without padding.
    #[test]
    fn segments_round_trip_whatever_their_record_sizes() {
        for seed in 0u64..40 {
            let dir =
                std::env::temp_dir().join(format!("ramd-seg-test-{}-{seed}", std::process::id()));
            let _ = fs::remove_dir_all(&dir);
            let mut img = ImageDir::open(&dir).unwrap();
            let mut w = img
                .begin_segment(1, true, DiskKind::Block, 1 << 30)
                .unwrap();
            let mut x = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let mut rnd = move || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            let mut want: Vec<Vec<u8>> = Vec::new();
            let mut bytes = SEG_HEADER as u64;
            for i in 0..50 + rnd() % 400 {
                let len = match rnd() % 4 {
                    0 => 0,
                    1 => rnd() % 20,
                    2 => rnd() % 9000,
                    _ => rnd() % 300_000,
                } as usize;
                let data: Vec<u8> = (0..len).map(|j| (j as u64 ^ i ^ seed) as u8 | 1).collect();
                w.meta(&data).unwrap();
                bytes += (REC_HEADER + len.next_multiple_of(8)) as u64;
                want.push(data);
                match rnd() % 5 {
                    0 => w.send(false).unwrap(),
                    1 => w.write_out().unwrap(),
                    _ => {}
                }
            }
            let entry = w.finish().unwrap();
            assert_eq!(entry.bytes, bytes + REC_HEADER as u64, "seed {seed}");
            img.commit(DiskKind::Block, 1 << 30, entry).unwrap();
            let mut got = Vec::new();
            img.read_chain(
                |r| {
                    if let Record::Meta(m) = r {
                        got.push(m.to_vec());
                    }
                    Ok(())
                },
                |_, _| {},
            )
            .unwrap();
            assert!(got == want, "seed {seed}: records differ");
            fs::remove_dir_all(&dir).unwrap();
        }
    }
}
