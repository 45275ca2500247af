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
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};
use crate::identity::DiskId;

use super::damage::{covered, read_tolerant, Damaged, Expect, Header, Lost};
use super::format::{DiskKind, Record, MANIFEST, SEG_HEADER};
use super::image_dir::read_manifest;
use super::manifest::SegEntry;
use super::remote::is_url;

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
