//! Reading an image back: `ImageDir::read_chain`, the checked segment
//! parser, `AheadReader` (O_DIRECT read-ahead on its own thread), and
//! `InPlace`, which hands the parser its bytes where they lie.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::path::Path;

use crate::error::{Error, Result};
use crate::store::PageRef;
use crate::sys::PAGE_SIZE;

use super::format::{
    Buf, Record, DIO_ALIGN, MAX_PAYLOAD, REC_HEADER, R_END, R_FILL, R_FRAME, R_GONE, R_HOLE,
    R_META, R_PACKED, R_RAW, SEG_HEADER, SEG_MAGIC, SEG_VERSION,
};
use super::image_dir::{object_name, ImageDir};
use super::manifest::{Manifest, SegEntry};
use super::writer::{clear_direct, open_direct};

impl ImageDir {
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
            let mut progress = |n| progress(before + n, total);
            match &self.remote {
                Some(remote) => {
                    let name = object_name(seg.seq, seg.time_ns);
                    let (r, len) = remote.reader(&name, seg.bytes)?;
                    let path = remote.named(&name);
                    let mut src = InPlace::new(r);
                    parse_source(&path, &mut src, len, m, seg, &mut apply, &mut progress)?
                }
                None => {
                    let path = self.seg_path(seg.seq);
                    read_segment(&path, m, seg, &mut apply, &mut progress)?
                }
            }
            before += seg.bytes;
        }
        Ok(())
    }
}

/// Reads a file from start to end on its own thread, a few blocks ahead of
/// the caller, with O_DIRECT where the filesystem allows it: a load then
/// neither copies through the page cache nor fills it with an image that
/// now lives in the store. Without O_DIRECT, what was read is dropped from
/// the cache.
pub(super) struct AheadReader {
    blocks: Option<std::sync::mpsc::Receiver<io::Result<Buf>>>,
    empties: std::sync::mpsc::Sender<Buf>,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// What one read of [`AheadReader`] asks for.
pub(super) const READ_BLOCK: usize = 4 << 20;

impl AheadReader {
    /// Reads the file's `len` bytes.
    pub(super) fn start(file: File, direct: bool, len: u64) -> io::Result<Self> {
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
        })
    }
}

/// Reads `want` bytes at offset `at` into `b` (which may be longer, for
/// O_DIRECT's whole blocks); fewer only if the file ends sooner.
pub(super) fn read_block(
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

impl Pieces for AheadReader {
    type Piece = Buf;

    fn next_piece(&mut self) -> io::Result<Option<Buf>> {
        match self.blocks.as_ref().and_then(|b| b.recv().ok()) {
            Some(block) => block.map(Some),
            None => Ok(None), // end of file
        }
    }

    fn done_with(&mut self, block: Buf) {
        let _ = self.empties.send(block);
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
pub(super) fn read_segment(
    path: &Path,
    m: &Manifest,
    seg: &SegEntry,
    apply: &mut impl FnMut(Record<'_>) -> Result<()>,
    progress: &mut impl FnMut(u64),
) -> Result<()> {
    let (file, direct) =
        open_direct(path, OpenOptions::new().read(true)).map_err(|e| Error::file(path, e))?;
    let len = file.metadata().map_err(|e| Error::file(path, e))?.len();
    let r = AheadReader::start(file, direct, len).map_err(|e| Error::file(path, e))?;
    parse_source(path, &mut InPlace::new(r), len, m, seg, apply, progress)
}

/// Where the parser takes a segment's bytes from: `take(n)` hands over
/// the next `n` bytes as one slice.
pub(super) trait Source {
    /// The next `n` bytes; an `UnexpectedEof` error if they end first.
    fn take(&mut self, n: usize) -> io::Result<&[u8]>;
}

/// Bytes that arrive in pieces (a GET's body chunks, read-ahead blocks),
/// for [`InPlace`].
pub(super) trait Pieces {
    type Piece: AsRef<[u8]>;
    /// The next piece; `None` at the end.
    fn next_piece(&mut self) -> io::Result<Option<Self::Piece>>;
    /// A piece the parser has used up (a block to fill again).
    fn done_with(&mut self, _piece: Self::Piece) {}
}

/// A [`Source`] over [`Pieces`] that lends the parser each record where it
/// lies in its piece, and copies only a record that spans two or more: a
/// load then copies each page once, from the received bytes into the
/// store, rather than through a record buffer first.
pub(super) struct InPlace<P: Pieces> {
    src: P,
    cur: Option<P::Piece>,
    /// Where the unread bytes of `cur` start.
    pos: usize,
    /// A record that spans pieces, gathered.
    spill: Vec<u8>,
}

impl<P: Pieces> InPlace<P> {
    pub(super) fn new(src: P) -> Self {
        InPlace {
            src,
            cur: None,
            pos: 0,
            spill: Vec::new(),
        }
    }

    fn unread(&self) -> usize {
        self.cur.as_ref().map_or(0, |c| c.as_ref().len() - self.pos)
    }
}

impl<P: Pieces> Source for InPlace<P> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        if n == 0 {
            return Ok(&[]);
        }
        // A used-up piece goes back; empty pieces are skipped.
        while self.unread() == 0 {
            if let Some(done) = self.cur.take() {
                self.src.done_with(done);
            }
            self.pos = 0;
            match self.src.next_piece()? {
                Some(p) => self.cur = Some(p),
                None => return Err(io::ErrorKind::UnexpectedEof.into()),
            }
        }
        if self.unread() >= n {
            let at = self.pos;
            self.pos += n;
            let cur = self.cur.as_ref().expect("unread bytes are in a piece");
            return Ok(&cur.as_ref()[at..at + n]);
        }
        // The bytes span pieces: gathered into `spill`.
        self.spill.clear();
        let cur = self.cur.take().expect("unread bytes are in a piece");
        self.spill.extend_from_slice(&cur.as_ref()[self.pos..]);
        self.src.done_with(cur);
        self.pos = 0;
        while self.spill.len() < n {
            let Some(p) = self.src.next_piece()? else {
                return Err(io::ErrorKind::UnexpectedEof.into());
            };
            let want = n - self.spill.len();
            let b = p.as_ref();
            if b.len() > want {
                self.spill.extend_from_slice(&b[..want]);
                self.pos = want;
                self.cur = Some(p);
            } else {
                self.spill.extend_from_slice(b);
                self.src.done_with(p);
            }
        }
        Ok(&self.spill)
    }
}

/// A [`Source`] over any reader, through a record buffer.
struct Copying<R> {
    r: R,
    buf: Vec<u8>,
}

impl<R: Read> Source for Copying<R> {
    fn take(&mut self, n: usize) -> io::Result<&[u8]> {
        self.buf.resize(n, 0);
        self.r.read_exact(&mut self.buf)?;
        Ok(&self.buf)
    }
}

/// Checks one segment of `len` bytes read from `r`, handing its records
/// to `apply` ([`parse_source`] through a record buffer).
pub(super) fn parse_segment<R: Read>(
    path: &Path,
    r: R,
    len: u64,
    m: &Manifest,
    seg: &SegEntry,
    apply: &mut impl FnMut(Record<'_>) -> Result<()>,
    progress: &mut impl FnMut(u64),
) -> Result<()> {
    let mut src = Copying { r, buf: Vec::new() };
    parse_source(path, &mut src, len, m, seg, apply, progress)
}

/// Checks one segment of `len` bytes taken from `r`, handing its records
/// to `apply`: each record's checksum is checked before `apply` sees it.
/// Generic rather than `dyn Source`: a load's inner loop stays inlined.
pub(super) fn parse_source<S: Source>(
    path: &Path,
    r: &mut S,
    len: u64,
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
    if len != seg.bytes {
        return Err(bad(
            len.min(seg.bytes),
            format!(
                "file is {len} bytes, the MANIFEST says {} (truncated or appended to)",
                seg.bytes
            ),
        ));
    }
    // Running out of bytes is damage; any other read error is the disk's.
    let short = |e: io::Error, damage: Error| match e.kind() {
        io::ErrorKind::UnexpectedEof => damage,
        _ => Error::file(path, e),
    };
    let h: [u8; SEG_HEADER] = r
        .take(SEG_HEADER)
        .map_err(|e| short(e, bad(0, "too short for a segment header".into())))?
        .try_into()
        .expect("took a header's bytes");
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
    let (mut records, mut pages) = (0u64, 0u64);
    loop {
        let at = offset;
        let rh: [u8; REC_HEADER] = r
            .take(REC_HEADER)
            .map_err(|e| short(e, bad(at, "segment ends without its END record".into())))?
            .try_into()
            .expect("took a record header's bytes");
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
        let payload = r
            .take(plen.next_multiple_of(8))
            .map_err(|e| short(e, bad(at, format!("{}: record runs past the end", what()))))?;
        let mut crc = crc32c::crc32c(&rh[4..]);
        crc = crc32c::crc32c_append(crc, payload);
        if crc != u32::from_le_bytes(rh[..4].try_into().unwrap()) {
            return Err(bad(at, format!("{}: checksum mismatch", what())));
        }
        offset += (REC_HEADER + payload.len()) as u64;
        let data = &payload[..plen];
        if ty == R_END {
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
        let Some(rec) = record_of(ty, sub, a, b, data) else {
            return Err(bad(
                at,
                format!(
                    "{}: unknown record (type {ty}, variant {sub}, {plen} bytes)",
                    what()
                ),
            ));
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

/// The record a checked header and payload make, or `None` for a type,
/// variant or length this version does not know (END is the caller's).
pub(super) fn record_of(ty: u8, sub: u8, a: u64, b: u64, data: &[u8]) -> Option<Record<'_>> {
    let plen = data.len();
    Some(match (ty, sub) {
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
        (R_META, 1) => Record::MetaDelta(data),
        _ => return None,
    })
}

pub(super) fn advise(fd: i32, offset: u64, len: u64, advice: i32) {
    // SAFETY: advice only; errors cost speed, not correctness.
    unsafe { libc::posix_fadvise(fd, offset as i64, len as i64, advice) };
}
