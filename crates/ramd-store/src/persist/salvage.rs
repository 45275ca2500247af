//! Reading a damaged image for `ramd image salvage`: every record whose
//! checksum verifies is used, the rest is skipped and accounted for.
//!
//! A normal load (`reader.rs`) stops at the first fault. Here a bad record
//! is stepped over: by its own length when its header still looks sound
//! and the record after it verifies (the damage is then pinned to the
//! pages that header names), else by scanning forward, 8 bytes at a time
//! (records are 8-aligned), for the next record that verifies whole; what
//! lay between is only known to sit between the pages of its good
//! neighbours, because a save writes its records in page order (GONE
//! records first, then META, then pages and frames by page number).
//!
//! Records are applied in chain order as a load applies them, so a page
//! whose newest copy is unreadable keeps the copy an earlier save gave it.
//! What stays uncertain at the end is [`Salvaged::lost`]: page ranges, each
//! with the newest save whose copy of them could not be read; a later save
//! that writes a page again heals it.
//!
//! Nothing here writes to the image: segments are mapped read-only.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::identity::DiskId;
use crate::sys::PAGE_SIZE;

use super::format::{
    DiskKind, Record, MANIFEST, MAX_PAYLOAD, REC_HEADER, R_END, R_FILL, R_FRAME, R_GONE, R_HOLE,
    R_META, R_PACKED, R_RAW, SEG_HEADER, SEG_MAGIC, SEG_VERSION,
};
use super::image_dir::read_manifest;
use super::manifest::SegEntry;
use super::reader::record_of;
use super::remote::is_url;

/// Where an unreadable part of a segment is, and what it held.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Damaged {
    /// The save (segment sequence number).
    pub seq: u64,
    pub file: PathBuf,
    /// Byte offset and length of the damage in `file`.
    pub offset: u64,
    pub length: u64,
    pub reason: String,
    pub lost: Lost,
}

/// What a damaged part of a segment held, as far as can be told.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "what", rename_all = "snake_case")]
pub enum Lost {
    /// Records of these pages (a header that still names them).
    Pages { first: u64, end: u64 },
    /// A chunk's "all holes" record: its pages may show an earlier save's
    /// data that had been deleted.
    Gone { first: u64, end: u64 },
    /// Records of unknown pages, somewhere in `first..end` (`None`: up to
    /// the end of the disk).
    Among { first: u64, end: Option<u64> },
    /// The filesystem's tree (META record).
    Meta,
    /// Only the segment's header: its records were read.
    Header,
    /// The whole segment: missing, unreadable, or another image's.
    Segment,
}

impl Lost {
    /// The pages whose newest contents this may have taken away.
    fn pages(&self) -> Option<(u64, u64)> {
        match *self {
            Lost::Pages { first, end } | Lost::Gone { first, end } => Some((first, end)),
            Lost::Among { first, end } => Some((first, end.unwrap_or(u64::MAX))),
            Lost::Segment => Some((0, u64::MAX)),
            Lost::Meta | Lost::Header => None,
        }
    }
}

/// Pages not known to hold their newest contents after a salvage.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LostPages {
    pub first: u64,
    /// Exclusive; `u64::MAX` stands for the end of the disk.
    pub end: u64,
    /// The newest save whose copy of these pages could not be read.
    pub seq: u64,
    /// True: those pages' records were damaged (named by their headers).
    /// False: only known to lie in this range, if they existed at all.
    pub exact: bool,
}

/// A chain to salvage, as found: from the MANIFEST, or rebuilt from the
/// segment files' headers when the MANIFEST is missing or damaged.
#[derive(Debug, Clone)]
pub struct SalvageChain {
    pub dir: PathBuf,
    pub kind: DiskKind,
    pub size: u64,
    /// The disk's identity, from a MANIFEST that could be read (version 2).
    pub id: Option<DiskId>,
    /// The saves to read, in chain order.
    pub chain: Vec<SegEntry>,
    /// Why the MANIFEST could not be used.
    pub manifest_error: Option<String>,
}

/// What [`SalvageChain::read`] could not read.
#[derive(Debug, Default)]
pub struct Salvaged {
    pub damaged: Vec<Damaged>,
    /// Pages whose newest copy is missing, after later saves healed what
    /// they rewrote; sorted, not overlapping.
    pub lost: Vec<LostPages>,
}

impl SalvageChain {
    /// Finds the chain of the image in `dir`; fails only when there is
    /// none to be found. Reads nothing else and writes nothing.
    pub fn open(dir: &Path) -> Result<SalvageChain> {
        if is_url(dir) {
            // It maps segment files; objects would first have to be copied.
            return Err(Error::Unusable(format!(
                "{}: salvage reads image directories only, not yet images in object storage \
                 (`ramd image verify` checks one)",
                dir.display()
            )));
        }
        let mut id = None;
        let (kind, size, chain, manifest_error) = match read_manifest(dir) {
            Ok(Some(m)) => {
                id = m.id;
                (m.kind, m.size, m.chain, None)
            }
            Ok(None) => {
                let (k, s, c) = chain_from_headers(dir)?;
                let why = format!("{}: missing", dir.join(MANIFEST).display());
                (k, s, c, Some(why))
            }
            Err(e) => {
                let (k, s, c) = chain_from_headers(dir)?;
                (k, s, c, Some(e.to_string()))
            }
        };
        Ok(SalvageChain {
            dir: dir.to_path_buf(),
            kind,
            size,
            id,
            chain,
            manifest_error,
        })
    }

    /// Reads every save as far as it can be read, handing each record that
    /// verifies to `apply` with the save it comes from, in chain order.
    /// `apply`'s errors count as damage of that record, except running out
    /// of memory, which stops the salvage.
    pub fn read(&self, mut apply: impl FnMut(u64, Record<'_>) -> Result<()>) -> Result<Salvaged> {
        let base = self.chain.first().map_or(0, |s| s.seq);
        let mut out = Salvaged::default();
        let mut lost = LostMap::default();
        for seg in &self.chain {
            let path = self.dir.join(format!("seg-{:08}", seg.seq));
            let expect = Expect {
                kind: self.kind,
                size: self.size,
                base,
                seg,
            };
            let mut damaged = Vec::new();
            read_tolerant(&path, &expect, &mut damaged, &mut |rec| {
                // A page the save wrote whole is at its newest again.
                match rec {
                    Record::Frame { key, mask, .. } => {
                        for i in (0..64).filter(|i| mask & 1 << i != 0) {
                            let p = key.saturating_mul(64).saturating_add(i);
                            lost.remove(p, p.saturating_add(1));
                        }
                    }
                    _ => {
                        if let Some((first, end)) = covered(&rec) {
                            lost.remove(first, end);
                        }
                    }
                }
                apply(seg.seq, rec)
            })?;
            for d in &damaged {
                if let Some((first, end)) = d.lost.pages() {
                    let exact = matches!(d.lost, Lost::Pages { .. } | Lost::Gone { .. });
                    lost.set(first, end, (seg.seq, exact));
                }
            }
            out.damaged.extend(damaged);
        }
        out.lost = lost.into_vec();
        Ok(out)
    }
}

/// The pages a record sets.
fn covered(rec: &Record<'_>) -> Option<(u64, u64)> {
    match *rec {
        Record::Page(p, _) => Some((p, p.saturating_add(1))),
        Record::Frame { key, mask, .. } => {
            let first = key.saturating_mul(64);
            Some((
                first.saturating_add(mask.trailing_zeros() as u64),
                first.saturating_add(64 - mask.leading_zeros() as u64),
            ))
        }
        Record::Gone(key) => Some((
            key.saturating_mul(64),
            key.saturating_add(1).saturating_mul(64),
        )),
        Record::Meta(_) => None,
    }
}

/// Without a MANIFEST: the newest full save whose header verifies, and the
/// incremental saves built on it, in order.
fn chain_from_headers(dir: &Path) -> Result<(DiskKind, u64, Vec<SegEntry>)> {
    let entries = fs::read_dir(dir).map_err(|e| Error::file(dir, e))?;
    let mut segs = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(seq) = name
            .to_str()
            .and_then(|n| n.strip_prefix("seg-"))
            .filter(|n| n.len() == 8)
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        let mut h = [0u8; SEG_HEADER];
        let read = File::open(e.path()).and_then(|mut f| f.read_exact(&mut h));
        let Ok(hdr) = read
            .map_err(|_| ())
            .and_then(|()| Header::parse(&h).ok_or(()))
        else {
            continue;
        };
        if hdr.seq != seq {
            continue;
        }
        let bytes = e.metadata().map_or(0, |m| m.len());
        segs.push((hdr, bytes));
    }
    let Some((full, _)) = segs
        .iter()
        .filter(|(h, _)| h.full)
        .max_by_key(|(h, _)| h.seq)
        .cloned()
    else {
        return Err(Error::Image {
            file: dir.join(MANIFEST),
            offset: 0,
            reason: "no usable MANIFEST, and no full save among the segment files".into(),
        });
    };
    let mut chain: Vec<SegEntry> = segs
        .iter()
        .filter(|(h, _)| {
            h.base == full.seq && h.seq >= full.seq && h.kind == full.kind && h.size == full.size
        })
        .map(|(h, bytes)| SegEntry {
            seq: h.seq,
            full: h.full,
            // Unknown without a MANIFEST; the END record tells.
            pages: 0,
            records: 0,
            bytes: *bytes,
            time_ns: h.time_ns,
        })
        .collect();
    chain.sort_by_key(|s| s.seq);
    let kind = match full.kind {
        1 => DiskKind::Block,
        _ => DiskKind::Fs,
    };
    Ok((kind, full.size, chain))
}

/// A segment header's fields, when its checksum verifies.
#[derive(Debug, Clone, Copy)]
struct Header {
    kind: u8,
    full: bool,
    seq: u64,
    base: u64,
    size: u64,
    time_ns: u64,
}

impl Header {
    fn parse(h: &[u8]) -> Option<Header> {
        let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().unwrap());
        let ok = h.len() >= SEG_HEADER
            && &h[..8] == SEG_MAGIC
            && crc32c::crc32c(&h[..60]) == u32::from_le_bytes(h[60..64].try_into().unwrap())
            && u16::from_le_bytes([h[8], h[9]]) == SEG_VERSION
            && matches!(h[12], 1 | 2)
            && u32::from_le_bytes(h[48..52].try_into().unwrap()) == PAGE_SIZE as u32;
        ok.then(|| Header {
            kind: h[12],
            full: h[13] != 0,
            seq: u64_at(16),
            base: u64_at(24),
            size: u64_at(32),
            time_ns: u64_at(40),
        })
    }
}

/// What a segment of the chain must be.
struct Expect<'a> {
    kind: DiskKind,
    size: u64,
    base: u64,
    seg: &'a SegEntry,
}

/// A read-only mapping of a whole file.
struct Mapped {
    ptr: *mut libc::c_void,
    len: usize,
}

impl Mapped {
    fn open(path: &Path) -> io::Result<Mapped> {
        let f = File::open(path)?;
        let len = f.metadata()?.len() as usize;
        if len == 0 {
            return Ok(Mapped {
                ptr: std::ptr::null_mut(),
                len: 0,
            });
        }
        // SAFETY: a private read-only mapping of a file we opened; it is
        // only read through `bytes`, and unmapped on drop.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapped { ptr, len })
    }

    fn bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: the mapping is `len` bytes, readable, alive as long as self.
        unsafe { std::slice::from_raw_parts(self.ptr as *const u8, self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: our own mapping.
            unsafe { libc::munmap(self.ptr, self.len) };
        }
    }
}

/// A record as found in a segment's bytes.
struct Found<'a> {
    ty: u8,
    a: u64,
    rec: Option<Record<'a>>,
    /// Offset of the record after it.
    next: usize,
}

/// The record at `at` if its header is one this version writes and fits
/// in `data`; with `check`, only if its checksum verifies too.
fn record_at(data: &[u8], at: usize, check: bool) -> Option<Found<'_>> {
    let rh = data.get(at..at.checked_add(REC_HEADER)?)?;
    let ty = rh[4];
    let sub = rh[5];
    let plen = u32::from_le_bytes(rh[8..12].try_into().unwrap()) as usize;
    let a = u64::from_le_bytes(rh[16..24].try_into().unwrap());
    let b = u64::from_le_bytes(rh[24..32].try_into().unwrap());
    if plen > MAX_PAYLOAD {
        return None;
    }
    let next = at + REC_HEADER + plen.next_multiple_of(8);
    let body = data.get(at + REC_HEADER..next)?;
    let rec = match ty {
        R_END if sub == 0 && plen == 0 => None,
        _ => Some(record_of(ty, sub, a, b, &body[..plen])?),
    };
    if check {
        let crc = crc32c::crc32c_append(crc32c::crc32c(&rh[4..]), body);
        if crc != u32::from_le_bytes(rh[..4].try_into().unwrap()) {
            return None;
        }
    }
    Some(Found { ty, a, rec, next })
}

/// Where a record sits in a save's page order: GONE chunks first, then
/// pages and frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pos {
    Gone { first: u64, end: u64 },
    Page { first: u64, end: u64 },
}

fn pos_of(rec: &Record<'_>) -> Option<Pos> {
    let (first, end) = covered(rec)?;
    Some(match rec {
        Record::Gone(_) => Pos::Gone { first, end },
        _ => Pos::Page { first, end },
    })
}

/// A stretch of unreadable bytes not yet placed among the pages.
struct Region {
    start: usize,
    end: usize,
    reason: String,
    /// The good record before it, in page order.
    after: Option<Pos>,
    /// Whether GONE records could be in it (no META or page seen before).
    may_gone: bool,
}

/// Reads one segment, skipping what does not verify (see the module).
fn read_tolerant(
    path: &Path,
    expect: &Expect<'_>,
    damaged: &mut Vec<Damaged>,
    apply: &mut dyn FnMut(Record<'_>) -> Result<()>,
) -> Result<()> {
    let seq = expect.seg.seq;
    let mut damage = |offset: usize, length: usize, reason: String, lost: Lost| {
        damaged.push(Damaged {
            seq,
            file: path.to_path_buf(),
            offset: offset as u64,
            length: length as u64,
            reason,
            lost,
        })
    };
    let map = match Mapped::open(path) {
        Ok(m) => m,
        Err(e) => {
            damage(0, 0, format!("cannot read: {e}"), Lost::Segment);
            return Ok(());
        }
    };
    let data = map.bytes();
    // A short file: the records past its end are placed as the tail.
    let short = (data.len() as u64) < expect.seg.bytes;
    match data.get(..SEG_HEADER).and_then(Header::parse) {
        Some(h) => {
            let mine = h.kind == expect.kind.id()
                && h.full == expect.seg.full
                && h.seq == seq
                && h.base == expect.base
                && h.size == expect.size
                && h.time_ns == expect.seg.time_ns;
            if !mine {
                // A sound header that disagrees: not this image's save.
                damage(
                    0,
                    data.len(),
                    "the segment header verifies but does not match the MANIFEST's save \
                     (a segment of another image?)"
                        .into(),
                    Lost::Segment,
                );
                return Ok(());
            }
        }
        None => damage(
            0,
            SEG_HEADER.min(data.len()),
            "segment header damaged (its records are read all the same)".into(),
            Lost::Header,
        ),
    }
    let mut at = SEG_HEADER;
    let mut last: Option<Pos> = None;
    let mut seen_meta_or_page = false;
    let mut region: Option<Region> = None;
    let mut ended = false;
    while at < data.len() {
        // While scanning a damaged stretch, a record out of page order is
        // no record of this save (a page may hold an image of its own).
        let found = record_at(data, at, true)
            .filter(|f| region.is_none() || in_order(last, f.rec.as_ref().and_then(pos_of)));
        let Some(found) = found else {
            // The header may still be sound and only the payload damaged:
            // then the record after it verifies, and the damage is exactly
            // this record's.
            if let Some(hint) = record_at(data, at, false) {
                let next_ok = record_at(data, hint.next, true);
                let hint_pos = hint.rec.as_ref().and_then(pos_of);
                let next_pos = next_ok
                    .as_ref()
                    .and_then(|n| n.rec.as_ref())
                    .and_then(pos_of);
                let ordered = in_order(last, hint_pos) && in_order(hint_pos, next_pos);
                if next_ok.is_some() && ordered && region.is_none() {
                    let reason = format!("{}: checksum mismatch", describe(hint.ty, hint.a));
                    let lost = match (&hint.rec, hint_pos) {
                        (Some(Record::Meta(_)), _) => Lost::Meta,
                        (_, Some(Pos::Gone { first, end })) => Lost::Gone { first, end },
                        (_, Some(Pos::Page { first, end })) => Lost::Pages { first, end },
                        _ => Lost::Among {
                            first: 0,
                            end: None,
                        },
                    };
                    damage(at, hint.next - at, reason, lost);
                    if matches!(hint.rec, Some(Record::Meta(_))) {
                        seen_meta_or_page = true;
                    }
                    if let Some(p) = hint_pos {
                        last = Some(p);
                    }
                    at = hint.next;
                    continue;
                }
            }
            let r = region.get_or_insert_with(|| Region {
                start: at,
                end: at,
                reason: bad_record(data, at, short, expect.seg.bytes),
                after: last,
                may_gone: !seen_meta_or_page && !expect.seg.full,
            });
            at += 8;
            r.end = at.min(data.len());
            continue;
        };
        if let Some(r) = region.take() {
            let next = found.rec.as_ref().and_then(pos_of);
            place_region(&r, next, &mut damage);
        }
        match found.rec {
            None => {
                // END: what follows it is no record of this save.
                ended = true;
                if found.next != data.len() {
                    log::warn!(
                        "{}: {} bytes after the END record ignored",
                        path.display(),
                        data.len() - found.next
                    );
                }
                break;
            }
            Some(rec) => {
                let pos = pos_of(&rec);
                if matches!(
                    rec,
                    Record::Meta(_) | Record::Page(..) | Record::Frame { .. }
                ) {
                    seen_meta_or_page = true;
                }
                let (ty, a) = (found.ty, found.a);
                match apply(rec) {
                    Ok(()) => {}
                    Err(
                        e @ (Error::NoSpace { .. }
                        | Error::SharedNoSpace { .. }
                        | Error::DiskFull { .. }
                        | Error::HostMemoryLow { .. }),
                    ) => return Err(e),
                    Err(e) => {
                        let lost = match pos {
                            Some(Pos::Gone { first, end }) => Lost::Gone { first, end },
                            Some(Pos::Page { first, end }) => Lost::Pages { first, end },
                            None => Lost::Meta,
                        };
                        damage(
                            at,
                            found.next - at,
                            format!("{}: {e}", describe(ty, a)),
                            lost,
                        );
                    }
                }
                if pos.is_some() {
                    last = pos;
                }
            }
        }
        at = found.next;
    }
    if let Some(mut r) = region.take() {
        r.end = data.len();
        place_region(&r, None, &mut damage);
    } else if !ended {
        // Cut off right after a whole record: what followed is unknown.
        let r = Region {
            start: at.min(data.len()),
            end: data.len(),
            reason: if short {
                format!(
                    "the file is {} bytes, the MANIFEST says {} (truncated): the records \
                     after offset {at} are missing",
                    data.len(),
                    expect.seg.bytes
                )
            } else {
                "the segment ends without its END record (truncated)".into()
            },
            after: last,
            may_gone: !seen_meta_or_page && !expect.seg.full,
        };
        place_region(&r, None, &mut damage);
    }
    Ok(())
}

/// Why the record at `at` is not one (for the report).
fn bad_record(data: &[u8], at: usize, short: bool, want: u64) -> String {
    let mut why = match record_at(data, at, false) {
        Some(h) => format!("{}: checksum mismatch", describe(h.ty, h.a)),
        None if at + REC_HEADER > data.len() => "a record cut short".to_string(),
        None => {
            let rh = &data[at..at + REC_HEADER];
            let plen = u32::from_le_bytes(rh[8..12].try_into().unwrap()) as u64;
            let a = u64::from_le_bytes(rh[16..24].try_into().unwrap());
            if at as u64 + (REC_HEADER as u64) + plen > data.len() as u64 {
                format!("{}: runs past the end of the file", describe(rh[4], a))
            } else {
                "not a record (damaged header)".to_string()
            }
        }
    };
    if short {
        why += &format!(
            "; the file is {} bytes, the MANIFEST says {want} (truncated)",
            data.len()
        );
    }
    why
}

/// Says which pages an unreadable stretch may have held, from its good
/// neighbours in page order (`next`: the first good record after it that
/// names pages; `None`: none before the end).
fn place_region(
    r: &Region,
    next: Option<Pos>,
    damage: &mut impl FnMut(usize, usize, String, Lost),
) {
    let len = r.end - r.start;
    // GONE records come before pages, so a stretch after a GONE record may
    // hold pages from the first one up: only a page before it bounds below.
    let first = match r.after {
        Some(Pos::Page { end, .. }) => end,
        Some(Pos::Gone { end, .. }) if matches!(next, Some(Pos::Gone { .. })) => end,
        _ => 0,
    };
    let end = match next {
        Some(Pos::Page { first, .. }) | Some(Pos::Gone { first, .. }) => Some(first),
        None => None,
    };
    damage(r.start, len, r.reason.clone(), Lost::Among { first, end });
    if r.may_gone && matches!(next, Some(Pos::Page { .. })) {
        // Lost GONE records may name chunks past the first good page.
        let from = match r.after {
            Some(Pos::Gone { end, .. }) => end,
            _ => 0,
        };
        damage(
            r.start,
            len,
            format!(
                "{} (it may have held chunks emptied by this save)",
                r.reason
            ),
            Lost::Among {
                first: from,
                end: None,
            },
        );
    }
}

/// Whether `b` may follow `a` in a save's record order.
fn in_order(a: Option<Pos>, b: Option<Pos>) -> bool {
    match (a, b) {
        (Some(Pos::Page { end, .. }), Some(Pos::Page { first, .. })) => first >= end,
        (Some(Pos::Gone { end, .. }), Some(Pos::Gone { first, .. })) => first >= end,
        (Some(Pos::Page { .. }), Some(Pos::Gone { .. })) => false,
        _ => true,
    }
}

fn describe(ty: u8, a: u64) -> String {
    match ty {
        R_RAW | R_PACKED | R_FILL | R_HOLE => format!("page {a}"),
        R_FRAME | R_GONE => format!(
            "pages {}..{}",
            a.saturating_mul(64),
            a.saturating_add(1).saturating_mul(64)
        ),
        R_META => "the filesystem's tree (META)".into(),
        _ => format!("record type {ty}"),
    }
}

/// The save whose copy is missing, and whether its pages are known exactly.
type Tag = (u64, bool);

/// Page ranges by first page: (end, tag); a later `set` overrides.
#[derive(Default)]
struct LostMap(BTreeMap<u64, (u64, Tag)>);

impl LostMap {
    /// Takes `first..end` out, cutting ranges that stick out of it.
    fn remove(&mut self, first: u64, end: u64) {
        if first >= end {
            return;
        }
        let hit: Vec<(u64, (u64, Tag))> = self
            .0
            .range(..end)
            .rev()
            .take_while(|(_, &(e, _))| e > first)
            .map(|(&s, &v)| (s, v))
            .collect();
        for (s, (e, tag)) in hit {
            self.0.remove(&s);
            if s < first {
                self.0.insert(s, (first, tag));
            }
            if e > end {
                self.0.insert(end, (e, tag));
            }
        }
    }

    fn set(&mut self, first: u64, end: u64, tag: Tag) {
        if first >= end {
            return;
        }
        self.remove(first, end);
        self.0.insert(first, (end, tag));
    }

    fn into_vec(self) -> Vec<LostPages> {
        let mut out: Vec<LostPages> = Vec::new();
        for (first, (end, (seq, exact))) in self.0 {
            match out.last_mut() {
                Some(l) if l.end == first && l.seq == seq && l.exact == exact => l.end = end,
                _ => out.push(LostPages {
                    first,
                    end,
                    seq,
                    exact,
                }),
            }
        }
        out
    }
}
