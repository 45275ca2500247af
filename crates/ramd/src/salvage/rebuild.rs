//! Rebuilding a filesystem from a damaged image: the newest tree that
//! loads, the data of files no tree owns put in lost+found, and the
//! store's extents that both the rebuild and the loss report read.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::sync::Arc;

use anyhow::Result;
use serde::Serialize;

use ramd_fs::fs::{Caller, ROOT_INO};
use ramd_fs::{Fs, Ino};
use ramd_store::persist::{DiskKind, SalvageChain};
use ramd_store::{ExtentKind, Store};

use crate::image_fs::{self, errno_text, Item, Node, Sink};

#[derive(Debug, Serialize)]
pub(super) struct Tree {
    /// The save whose tree was used; `None`: none could be read.
    pub(super) save: Option<u64>,
    /// When that save was made (ns since the epoch).
    pub(super) time_ns: Option<u64>,
    pub(super) newest: bool,
    /// What became of file data no file of that tree owns.
    pub(super) lost_found: Vec<String>,
    /// Those files by the slot their data came from.
    #[serde(skip)]
    pub(super) adopted: Vec<Adopted>,
}

/// A file of lost+found made from the data of one slot of the image.
#[derive(Debug)]
pub(super) struct Adopted {
    pub(super) slot: u64,
    pub(super) path: String,
    pub(super) ino: Ino,
}

/// `[offset, offset + length)` of the store as (offset, length, kind) runs.
pub(super) fn extents(
    store: &Store,
    offset: u64,
    length: u64,
) -> Result<Vec<(u64, u64, ExtentKind)>> {
    let mut out = Vec::new();
    let mut at = offset;
    let end = offset + length;
    while at < end {
        let ext = store.extents(at, (end - at).min(1 << 36), 4096)?;
        for e in ext {
            let len = e.length.min(end - at);
            if len == 0 {
                break;
            }
            out.push((at, len, e.kind));
            at += len;
        }
    }
    Ok(out)
}

/// The filesystem from the newest tree that loads, with the data of files
/// it does not know (an older tree's) put in lost+found; with no tree at
/// all, a new filesystem holding every file's data in lost+found.
pub(super) fn rebuild_fs(
    store: Arc<Store>,
    chain: &SalvageChain,
    metas: &[(u64, Vec<u8>)],
    last: u64,
    track: bool,
) -> Result<(Arc<Fs>, Tree)> {
    let cfg = image_fs::offline_fs_config(chain.size);
    // Newest first; a tree that verifies but does not load is passed over.
    for (seq, meta) in metas.iter().rev() {
        let probe = image_fs::offline_store(DiskKind::Fs, chain.size, false)?;
        let Ok(shape) = Fs::load(probe, cfg.clone(), meta) else {
            log::warn!("the tree of save {seq} does not load: passed over");
            continue;
        };
        if *seq == last {
            let fs = Fs::load(store, cfg, meta)
                .map_err(|e| anyhow::anyhow!("the tree of save {seq}: {e}"))?;
            let tree = Tree {
                save: Some(*seq),
                time_ns: time_of(chain, *seq),
                newest: true,
                lost_found: Vec::new(),
                adopted: Vec::new(),
            };
            return Ok((Arc::new(fs), tree));
        }
        // An older tree: loading it would drop the data of files created
        // since, so that data moves aside first and comes back in
        // lost+found.
        let owned = owned_slots(&shape)?;
        let aside = image_fs::offline_store(DiskKind::Fs, chain.size, false)?;
        move_slots(&store, &aside, |slot| !owned.contains(&slot))?;
        let fs = Fs::load(store, cfg, meta)
            .map_err(|e| anyhow::anyhow!("the tree of save {seq}: {e}"))?;
        let adopted = adopt(&aside, &fs)?;
        let tree = Tree {
            save: Some(*seq),
            time_ns: time_of(chain, *seq),
            newest: false,
            lost_found: adopted.iter().map(|a| a.path.clone()).collect(),
            adopted,
        };
        return Ok((Arc::new(fs), tree));
    }
    // No tree: every file's data, as raw store data, in a new filesystem.
    let fresh = image_fs::offline_store(DiskKind::Fs, chain.size, track)?;
    let fs = Fs::new(fresh, cfg)
        .map_err(|e| anyhow::anyhow!("creating a filesystem: {}", errno_text(e)))?;
    let adopted = adopt(&store, &fs)?;
    let tree = Tree {
        save: None,
        time_ns: None,
        newest: false,
        lost_found: adopted.iter().map(|a| a.path.clone()).collect(),
        adopted,
    };
    Ok((Arc::new(fs), tree))
}

fn time_of(chain: &SalvageChain, seq: u64) -> Option<u64> {
    chain.chain.iter().find(|s| s.seq == seq).map(|s| s.time_ns)
}

fn owned_slots(fs: &Fs) -> Result<BTreeSet<u64>> {
    let files = image_fs::walk(fs, &mut Collect)?;
    let mut out = BTreeSet::new();
    for ino in files.keys() {
        let base = fs
            .data_offset(*ino)
            .map_err(|e| anyhow::anyhow!("inode {ino}: {}", errno_text(e)))?;
        out.insert(base >> ramd_fs::fs::FILE_SHIFT);
    }
    Ok(out)
}

/// Moves the data of the slots `which` picks from `from` to `to`, at the
/// same offsets, a chunk at a time (memory never holds it twice).
fn move_slots(from: &Store, to: &Store, which: impl Fn(u64) -> bool) -> Result<()> {
    let mut chunks = from.data_chunks();
    chunks.sort_unstable();
    let mut buf = vec![0u8; ramd_store::CHUNK_BYTES as usize];
    for off in chunks {
        if !which(off >> ramd_fs::fs::FILE_SHIFT) {
            continue;
        }
        let len = ramd_store::CHUNK_BYTES;
        for (at, n, kind) in extents(from, off, len)? {
            if kind == ExtentKind::Hole {
                continue;
            }
            let piece = &mut buf[..n as usize];
            from.read(at, piece)?;
            to.change().write(at, piece)?;
        }
        from.change().trim(off, len)?;
    }
    Ok(())
}

/// Every slot of `src` with data becomes a file `lost+found/slot-N` of `fs`
/// (its data up to its last page; holes stay holes). Returns their paths.
fn adopt(src: &Store, fs: &Fs) -> Result<Vec<Adopted>> {
    let mut slots: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for off in src.data_chunks() {
        slots
            .entry(off >> ramd_fs::fs::FILE_SHIFT)
            .or_default()
            .push(off);
    }
    if slots.is_empty() {
        return Ok(Vec::new());
    }
    let who = Caller {
        uid: 0,
        gid: 0,
        pid: 0,
        umask: 0o077,
    };
    let mut name = String::from("lost+found");
    let mut n = 1;
    while fs.lookup(ROOT_INO, OsStr::new(&name)).is_ok() {
        name = format!("lost+found.{n}");
        n += 1;
    }
    let dir = fs
        .mkdir(who, ROOT_INO, OsStr::new(&name), 0o700)
        .map_err(|e| anyhow::anyhow!("creating /{name}: {}", errno_text(e)))?;
    let mut out = Vec::new();
    let mut buf = vec![0u8; ramd_store::CHUNK_BYTES as usize];
    for (slot, mut chunks) in slots {
        chunks.sort_unstable();
        let file = format!("slot-{slot}");
        let path = format!("/{name}/{file}");
        let attr = fs
            .create(who, dir.ino, OsStr::new(&file), 0o600)
            .map_err(|e| anyhow::anyhow!("creating {path}: {}", errno_text(e)))?;
        let base = slot << ramd_fs::fs::FILE_SHIFT;
        let mut result = Ok(());
        'chunks: for off in chunks {
            for (at, len, kind) in extents(src, off, ramd_store::CHUNK_BYTES)? {
                if kind == ExtentKind::Hole {
                    continue;
                }
                let piece = &mut buf[..len as usize];
                src.read(at, piece)?;
                let c = fs.change();
                if let Err(e) = fs.write(&c, attr.ino, at - base, piece, false, who, false) {
                    result = Err(anyhow::anyhow!(
                        "writing {path} at offset {}: {}",
                        at - base,
                        errno_text(e)
                    ));
                    break 'chunks;
                }
            }
            src.change().trim(off, ramd_store::CHUNK_BYTES)?;
        }
        fs.release(attr.ino);
        result?;
        out.push(Adopted {
            slot,
            path,
            ino: attr.ino,
        });
    }
    Ok(out)
}

/// Walks the tree only to learn every file's paths.
pub(super) struct Collect;

impl Sink for Collect {
    fn put(
        &mut self,
        _: &Fs,
        _: &Node<'_>,
        _: Item<'_>,
        _: &[(std::ffi::OsString, Vec<u8>)],
    ) -> Result<()> {
        Ok(())
    }

    fn leave_dir(&mut self, _: &Node<'_>, _: &[(std::ffi::OsString, Vec<u8>)]) -> Result<()> {
        Ok(())
    }
}
