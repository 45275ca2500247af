//! What a salvage could not recover, as the report gives it: byte ranges
//! of a block disk, and file paths and byte ranges of a filesystem, each
//! with the save whose copy was lost and what reads there now.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Result;
use serde::Serialize;

use ramd_fs::{Fs, Ino};
use ramd_store::persist;
use ramd_store::{ExtentKind, Store, PAGE_SIZE};

use super::rebuild::{extents, Adopted};
use crate::image_fs::{errno_text, shown};

/// One stretch that does not hold its newest contents.
#[derive(Debug, Serialize)]
pub(super) struct LostRange {
    /// The file's paths (a filesystem image; several for hard links).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(super) paths: Vec<String>,
    /// Byte offset in the file, or in the block disk.
    pub(super) offset: u64,
    pub(super) length: u64,
    /// The save whose copy of it could not be read.
    pub(super) save: u64,
    /// `zeros`: no readable copy, reads as zeros; `older`: holds an earlier
    /// save's copy; `unknown-zeros` / `unknown-older`: damage somewhere
    /// around it, so the save may or may not have changed it.
    pub(super) state: &'static str,
}

fn state(exact: bool, hole: bool) -> &'static str {
    match (exact, hole) {
        (true, true) => "zeros",
        (true, false) => "older",
        (false, true) => "unknown-zeros",
        (false, false) => "unknown-older",
    }
}

/// Lost pages as byte ranges of a block disk, split where they read as
/// zeros (no earlier copy) and where an earlier save's copy stands.
pub(super) fn block_losses(
    store: &Store,
    size: u64,
    lost: &[persist::LostPages],
) -> Result<Vec<LostRange>> {
    let mut out = Vec::new();
    for l in lost {
        let start = l.first.saturating_mul(PAGE_SIZE as u64).min(size);
        let end = l.end.saturating_mul(PAGE_SIZE as u64).min(size);
        if start >= end {
            continue;
        }
        for (off, len, kind) in extents(store, start, end - start)? {
            push_range(
                &mut out,
                Vec::new(),
                off,
                len,
                l.seq,
                state(l.exact, kind == ExtentKind::Hole),
            );
        }
    }
    Ok(out)
}

fn push_range(
    out: &mut Vec<LostRange>,
    paths: Vec<String>,
    offset: u64,
    length: u64,
    save: u64,
    state: &'static str,
) {
    if let Some(prev) = out.last_mut() {
        if prev.paths == paths
            && prev.offset + prev.length == offset
            && prev.save == save
            && prev.state == state
        {
            prev.length += length;
            return;
        }
    }
    out.push(LostRange {
        paths,
        offset,
        length,
        save,
        state,
    });
}

/// Lost pages of a filesystem as file paths and byte ranges in them; and
/// the lost bytes that fall in no file (data of deleted files, or past a
/// file's end: a load drops those anyway). Lost pages are in the image's
/// store offsets: a file of lost+found is found by the slot its data came
/// from, every other file by its own slot (a loaded tree keeps them).
pub(super) fn fs_losses(
    fs: &Fs,
    files: &std::collections::HashMap<Ino, Vec<PathBuf>>,
    adopted: &[Adopted],
    lost: &[persist::LostPages],
) -> Result<(Vec<LostRange>, u64)> {
    let slot_bytes = 1u64 << ramd_fs::fs::FILE_SHIFT;
    // Files by where their data started in the image: (ino, size, paths,
    // where it is now).
    let mut by_base: BTreeMap<u64, (u64, Vec<String>, u64)> = BTreeMap::new();
    let stat = |ino: Ino| {
        fs.getattr(ino)
            .map(|a| a.size)
            .map_err(|e| anyhow::anyhow!("inode {ino}: {}", errno_text(e)))
    };
    let now = |ino: Ino| {
        fs.data_offset(ino)
            .map_err(|e| anyhow::anyhow!("inode {ino}: {}", errno_text(e)))
    };
    for a in adopted {
        by_base.insert(
            a.slot * slot_bytes,
            (stat(a.ino)?, vec![a.path.clone()], now(a.ino)?),
        );
    }
    for (&ino, paths) in files {
        if adopted.iter().any(|a| a.ino == ino) {
            continue;
        }
        let base = now(ino)?;
        let mut paths: Vec<String> = paths.iter().map(|p| shown(p)).collect();
        paths.sort();
        by_base.entry(base).or_insert((stat(ino)?, paths, base));
    }
    let mut out = Vec::new();
    let mut outside = 0u64;
    for l in lost {
        let start = l.first.saturating_mul(PAGE_SIZE as u64);
        let end = l.end.saturating_mul(PAGE_SIZE as u64);
        let mut inside = 0u64;
        let first_base = start - start % slot_bytes;
        for (&base, (size, paths, now)) in by_base.range(first_base..end) {
            let (a, b) = (start.max(base), end.min(base + size));
            if a >= b {
                continue;
            }
            inside += b - a;
            for (off, len, kind) in extents(fs.store(), now + (a - base), b - a)? {
                push_range(
                    &mut out,
                    paths.clone(),
                    off - now,
                    len,
                    l.seq,
                    state(l.exact, kind == ExtentKind::Hole),
                );
            }
        }
        // Ranges that reach the end of the store are not counted as a size.
        if l.end != u64::MAX {
            outside += (end - start).saturating_sub(inside);
        }
    }
    out.sort_by(|a, b| (&a.paths, a.offset).cmp(&(&b.paths, b.offset)));
    Ok((out, outside))
}
