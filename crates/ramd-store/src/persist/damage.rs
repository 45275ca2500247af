//! Reading one damaged segment for salvage (`salvage.rs`): each record is
//! checked on its own, a bad one is stepped over (by its length when the
//! next record verifies, else by scanning for the next record that does),
//! and each unreadable stretch is reported as `Damaged`, with the pages it
//! may have held (`Lost`) placed by its good neighbours' page order.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::sys::PAGE_SIZE;

use super::format::{
    DiskKind, Record, MAX_PAYLOAD, REC_HEADER, R_END, R_FILL, R_FRAME, R_GONE, R_HOLE, R_META,
    R_PACKED, R_RAW, SEG_HEADER, SEG_MAGIC, SEG_VERSION,
};
use super::manifest::SegEntry;
use super::reader::record_of;

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
    pub(super) fn pages(&self) -> Option<(u64, u64)> {
        match *self {
            Lost::Pages { first, end } | Lost::Gone { first, end } => Some((first, end)),
            Lost::Among { first, end } => Some((first, end.unwrap_or(u64::MAX))),
            Lost::Segment => Some((0, u64::MAX)),
            Lost::Meta | Lost::Header => None,
        }
    }
}

/// A segment header's fields, when its checksum verifies.
#[derive(Debug, Clone, Copy)]
pub(super) struct Header {
    pub(super) kind: u8,
    pub(super) full: bool,
    pub(super) seq: u64,
    pub(super) base: u64,
    pub(super) size: u64,
    pub(super) time_ns: u64,
}

impl Header {
    pub(super) fn parse(h: &[u8]) -> Option<Header> {
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
pub(super) struct Expect<'a> {
    pub(super) kind: DiskKind,
    pub(super) size: u64,
    pub(super) base: u64,
    pub(super) seg: &'a SegEntry,
}

/// A read-only mapping of a whole file.
pub(super) struct Mapped {
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
pub(super) struct Found<'a> {
    ty: u8,
    a: u64,
    rec: Option<Record<'a>>,
    /// Offset of the record after it.
    next: usize,
}

/// The record at `at` if its header is one this version writes and fits
/// in `data`; with `check`, only if its checksum verifies too.
pub(super) fn record_at(data: &[u8], at: usize, check: bool) -> Option<Found<'_>> {
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
pub(super) fn read_tolerant(
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
                        (Some(Record::Meta(_) | Record::MetaDelta(_)), _) => Lost::Meta,
                        (_, Some(Pos::Gone { first, end })) => Lost::Gone { first, end },
                        (_, Some(Pos::Page { first, end })) => Lost::Pages { first, end },
                        _ => Lost::Among {
                            first: 0,
                            end: None,
                        },
                    };
                    damage(at, hint.next - at, reason, lost);
                    if matches!(hint.rec, Some(Record::Meta(_) | Record::MetaDelta(_))) {
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
                    Record::Meta(_)
                        | Record::MetaDelta(_)
                        | Record::Page(..)
                        | Record::Frame { .. }
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

/// The pages a record sets.
pub(super) fn covered(rec: &Record<'_>) -> Option<(u64, u64)> {
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
        Record::Meta(_) | Record::MetaDelta(_) => None,
    }
}
