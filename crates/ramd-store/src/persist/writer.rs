//! Writing a segment: `ImageDir::begin_segment` and `SegWriter`, which
//! sends 1 MiB batches to the file with O_DIRECT from a writer thread (or,
//! for an image in object storage, to a multipart upload: `remote.rs`).

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::{Error, Result};
use crate::store::PageRef;
use crate::sys::PAGE_SIZE;

use super::format::{
    new_buf, Buf, DiskKind, DIO_ALIGN, MAX_PAYLOAD, REC_HEADER, R_END, R_FILL, R_FRAME, R_GONE,
    R_HOLE, R_META, R_PACKED, R_RAW, SEG_HEADER, SEG_MAGIC, SEG_VERSION, WRITE_BATCH,
};
use super::image_dir::{crash_if, crash_point, object_name, sync_dir, Crash, ImageDir};
use super::manifest::SegEntry;

impl ImageDir {
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
        let time_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let header = self.seg_header(seq, full, kind, size, time_ns);
        let mut buf = new_buf();
        buf.extend_from_slice(&header);
        let entry = SegEntry {
            seq,
            full,
            pages: 0,
            records: 0,
            bytes: 0,
            time_ns,
        };
        if let Some(remote) = &self.remote {
            self.check_lease()?;
            // Uploaded under its final name: an object appears whole or
            // not at all, and is debris until a MANIFEST names it.
            let name = object_name(seq, time_ns);
            let path = remote.named(&name);
            let (to_disk, rx) = std::sync::mpsc::sync_channel::<Buf>(2);
            let (back, empties) = std::sync::mpsc::channel();
            let abort = Arc::new(AtomicBool::new(false));
            let writer = remote
                .upload(&name, rx, back, abort.clone())
                .map_err(|e| Error::file(&path, e))?;
            return Ok(SegWriter {
                to_disk: Some(to_disk),
                empties,
                writer: Some(writer),
                tmp: path.clone(),
                path,
                dir: self.path.clone(),
                buf,
                written: 0,
                entry,
                crash: crash_point(),
                upload: Some(abort),
            });
        }
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
                Ok(Some(file))
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
            entry,
            crash: crash_point(),
            upload: None,
        })
    }

    /// The 64-byte segment header (FORMAT.md).
    fn seg_header(
        &self,
        seq: u64,
        full: bool,
        kind: DiskKind,
        size: u64,
        time_ns: u64,
    ) -> [u8; SEG_HEADER] {
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
        h
    }
}

/// Writes one segment; records are buffered and sent in large batches by
/// [`SegWriter::write_out`], never while the caller holds a store lock.
pub struct SegWriter {
    /// Full buffers go to the writer thread; it sends them back empty.
    to_disk: Option<std::sync::mpsc::SyncSender<Buf>>,
    empties: std::sync::mpsc::Receiver<Buf>,
    /// Writes buffers in order; returns the file for the fsync (`None`
    /// for an upload, complete when it returns), or the first error.
    writer: Option<std::thread::JoinHandle<io::Result<Option<File>>>>,
    tmp: PathBuf,
    path: PathBuf,
    dir: PathBuf,
    /// Records not sent yet; they start at file offset `written`, which is
    /// a multiple of `DIO_ALIGN`.
    buf: Buf,
    written: u64,
    entry: SegEntry,
    crash: Option<Crash>,
    /// An upload to object storage: set to abandon it (`discard`).
    upload: Option<Arc<AtomicBool>>,
}

impl SegWriter {
    pub(super) fn record(&mut self, ty: u8, sub: u8, a: u64, b: u64, payload: &[u8]) {
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

    /// A filesystem's tree, whole or (`delta`) a change to the chain's
    /// (META variant 1); refused if larger than a record may be (a reader
    /// would refuse it, so the save must fail and keep the old image).
    pub fn meta(&mut self, bytes: &[u8], delta: bool) -> Result<()> {
        if bytes.len() > MAX_PAYLOAD {
            return Err(Error::Invalid(format!(
                "the filesystem's tree takes {} bytes; an image record holds at most {MAX_PAYLOAD}",
                bytes.len()
            )));
        }
        self.record(R_META, delta as u8, 0, 0, bytes);
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
    pub(super) fn send(&mut self, last: bool) -> Result<()> {
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
        if self.upload.is_none() {
            full.resize(cut.next_multiple_of(DIO_ALIGN), 0);
        }
        let sent = self.to_disk.as_ref().expect("writer running").send(full);
        if sent.is_err() {
            // The writer stopped on an error: collect it.
            return self.drain().map(|_| ());
        }
        Ok(())
    }

    /// Waits until everything sent is written; returns the file (`None`:
    /// the upload is complete).
    pub(super) fn drain(&mut self) -> Result<Option<File>> {
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
            Ok(Some(f)) => f,
            Ok(None) => {
                // Uploaded: the object is whole, under its final name.
                crash_if(Crash::SegmentSynced);
                crash_if(Crash::SegmentRenamed);
                self.entry.bytes = self.written;
                return Ok(self.entry.clone());
            }
            Err(e) => {
                if self.upload.is_none() {
                    let _ = fs::remove_file(&self.tmp);
                }
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
        if let Some(abort) = &self.upload {
            abort.store(true, std::sync::atomic::Ordering::SeqCst);
        }
        if self.writer.is_some() {
            let _ = self.drain();
        }
        if self.upload.is_none() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Writes a whole buffer at offset `at`. A filesystem may take O_DIRECT at
/// open and still refuse our alignment (EINVAL), also after a short write:
/// the buffer is then written again, at the same offset, through the page
/// cache, as is the rest of the segment.
pub(super) fn write_block(file: &File, direct: &mut bool, b: &[u8], at: u64) -> io::Result<()> {
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
pub(super) fn open_direct(path: &Path, o: &mut OpenOptions) -> io::Result<(File, bool)> {
    match o.clone().custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => Ok((o.open(path)?, false)),
        Err(e) => Err(e),
    }
}

/// Turns O_DIRECT off for the rest of a file's use.
pub(super) fn clear_direct(file: &File, direct: &mut bool) -> io::Result<()> {
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
