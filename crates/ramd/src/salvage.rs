//! `ramd image salvage`: a damaged image read as far as it can be
//! (`persist::SalvageChain`, which skips what fails its checksum), loaded
//! into memory as the daemon loads an image, then written as a new, whole
//! image and/or exported, with a report of what could not be recovered:
//! byte ranges of a block disk, file paths and byte ranges of a
//! filesystem. The source image is only read.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use ramd_fs::fs::{Caller, ROOT_INO};
use ramd_fs::{Fs, Ino};
use ramd_store::persist::{
    self, Damaged, DiskKind, ImageDir, Persister, Record, SalvageChain, SaveReport,
};
use ramd_store::{human, ExtentKind, Store, PAGE_SIZE};

use crate::image_fs::{self, errno_text, shown, Item, Node, Sink};

/// Exit status when something could not be recovered (documented in
/// `ramd image salvage --help`).
pub const EXIT_LOST: i32 = 3;

pub struct Args {
    pub dir: PathBuf,
    pub to: Option<PathBuf>,
    pub export: Option<PathBuf>,
    pub tar: bool,
    pub force: bool,
    pub json: bool,
}

/// One stretch that does not hold its newest contents.
#[derive(Debug, Serialize)]
struct LostRange {
    /// The file's paths (a filesystem image; several for hard links).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    paths: Vec<String>,
    /// Byte offset in the file, or in the block disk.
    offset: u64,
    length: u64,
    /// The save whose copy of it could not be read.
    save: u64,
    /// `zeros`: no readable copy, reads as zeros; `older`: holds an earlier
    /// save's copy; `unknown-zeros` / `unknown-older`: damage somewhere
    /// around it, so the save may or may not have changed it.
    state: &'static str,
}

#[derive(Debug, Serialize)]
struct Tree {
    /// The save whose tree was used; `None`: none could be read.
    save: Option<u64>,
    /// When that save was made (ns since the epoch).
    time_ns: Option<u64>,
    newest: bool,
    /// What became of file data no file of that tree owns.
    lost_found: Vec<String>,
    /// Those files by the slot their data came from.
    #[serde(skip)]
    adopted: Vec<Adopted>,
}

/// A file of lost+found made from the data of one slot of the image.
#[derive(Debug)]
struct Adopted {
    slot: u64,
    path: String,
    ino: Ino,
}

#[derive(Debug, Serialize)]
struct Report {
    image: PathBuf,
    kind: &'static str,
    size: u64,
    saves: Vec<u64>,
    manifest_error: Option<String>,
    damaged: Vec<Damaged>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tree: Option<Tree>,
    lost: Vec<LostRange>,
    /// Bytes of lost ranges outside every file (filesystem images).
    lost_outside_files: u64,
    new_image: Option<SaveReport>,
    new_image_dir: Option<PathBuf>,
    export: Option<PathBuf>,
    export_notes: Vec<String>,
    complete: bool,
}

pub fn run(args: Args) -> Result<()> {
    let code = salvage(&args)?;
    if code != 0 {
        std::io::stdout().flush().ok();
        std::process::exit(code);
    }
    Ok(())
}

fn salvage(args: &Args) -> Result<i32> {
    // The new image's emptiness is checked as a directory's: a prefix in
    // object storage holding an image would be replaced by it.
    if let Some(to) = args.to.as_ref().filter(|p| ramd_store::persist::is_url(p)) {
        bail!(
            "--to {}: salvage writes its new image to a directory only; `ramd image import` \
             can take it to object storage from an export",
            to.display()
        );
    }
    let chain = SalvageChain::open(&args.dir)?;
    // Refuse bad destinations before the long part.
    if let Some(to) = &args.to {
        image_fs::check_destination(to, true, false)?;
        let same =
            std::fs::canonicalize(to).ok() == std::fs::canonicalize(&args.dir).ok() && to.exists();
        if same {
            bail!("--to {} is the damaged image itself", to.display());
        }
    }
    if let Some(out) = &args.export {
        let as_dir = chain.kind == DiskKind::Fs && !(args.tar || is_tar(out));
        image_fs::check_destination(out, as_dir, args.force)?;
    }
    let store = image_fs::offline_store(chain.kind, chain.size, args.to.is_some())?;
    let mut metas: Vec<(u64, Vec<u8>)> = Vec::new();
    let read = chain.read(|seq, rec| {
        // A record that verifies but does not decode is damage too: it
        // must not reach the store as data.
        persist::decode_record(&rec, |_, _| Ok(()))?;
        match rec {
            Record::Page(page, p) => store.restore_page(page, p),
            Record::Frame { key, mask, data } => store.restore_frame(key, mask, data),
            Record::Gone(key) => store.restore_gone(key),
            Record::Meta(m) => {
                metas.push((seq, m.to_vec()));
                Ok(())
            }
        }
    })?;
    store.end_restore();
    let last = chain.chain.last().map_or(0, |s| s.seq);
    let mut report = Report {
        image: args.dir.clone(),
        kind: chain.kind.name(),
        size: chain.size,
        saves: chain.chain.iter().map(|s| s.seq).collect(),
        manifest_error: chain.manifest_error.clone(),
        damaged: read.damaged,
        tree: None,
        lost: Vec::new(),
        lost_outside_files: 0,
        new_image: None,
        new_image_dir: None,
        export: None,
        export_notes: Vec::new(),
        complete: false,
    };
    match chain.kind {
        DiskKind::Block => {
            report.lost = block_losses(&store, chain.size, &read.lost)?;
            if let Some(to) = &args.to {
                report.new_image = Some(save_new(
                    &store,
                    to,
                    DiskKind::Block,
                    chain.size,
                    chain.id,
                    None,
                )?);
                report.new_image_dir = Some(to.clone());
            }
            if let Some(out) = &args.export {
                export_raw(&store, chain.size, out, args.force)?;
                report.export = Some(out.clone());
            }
        }
        DiskKind::Fs => {
            let (fs, tree) = rebuild_fs(store, &chain, &metas, last, args.to.is_some())?;
            let files = image_fs::walk(&fs, &mut Collect)?;
            let (lost, outside) = fs_losses(&fs, &files, &tree.adopted, &read.lost)?;
            report.lost = lost;
            report.lost_outside_files = outside;
            report.tree = Some(tree);
            if let Some(to) = &args.to {
                let f = fs.clone();
                report.new_image = Some(save_new(
                    fs.store(),
                    to,
                    DiskKind::Fs,
                    chain.size,
                    chain.id,
                    Some(Box::new(move || f.save_meta())),
                )?);
                report.new_image_dir = Some(to.clone());
            }
            if let Some(out) = &args.export {
                let tar = args.tar || is_tar(out);
                let (notes, _) = image_fs::export_fs(&fs, out, tar, args.force)?;
                report.export_notes = notes;
                report.export = Some(out.clone());
            }
        }
    }
    let tree_whole = report.tree.as_ref().is_none_or(|t| t.newest);
    report.complete = report.lost.is_empty() && tree_whole && report.manifest_error.is_none();
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_report(&report, &mut std::io::stdout().lock());
    }
    Ok(if report.complete { 0 } else { EXIT_LOST })
}

fn is_tar(p: &Path) -> bool {
    p.extension() == Some(OsStr::new("tar"))
}

/// A full save of `store` into the new image `to`.
fn save_new(
    store: &Arc<Store>,
    to: &Path,
    kind: DiskKind,
    size: u64,
    id: Option<ramd_store::DiskId>,
    meta: Option<persist::MetaFn>,
) -> Result<SaveReport> {
    let mut image = ImageDir::open(to)?;
    // What was recovered is the same disk: the same identity, if the
    // damaged image's MANIFEST still said which.
    if let Some(id) = id {
        image.set_id(id);
    }
    let mut p = Persister::new(store.clone(), image, kind, size, None, false);
    if let Some(f) = meta {
        p.set_meta(f, None);
    }
    p.save(true)
        .with_context(|| format!("writing the new image {}", to.display()))
}

/// A block disk's store written out as a sparse raw file.
fn export_raw(store: &Store, size: u64, out: &Path, force: bool) -> Result<()> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    image_fs::check_destination(out, false, force)?;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(out)
        .with_context(|| format!("creating {}", out.display()))?;
    f.set_len(size)
        .with_context(|| format!("sizing {}", out.display()))?;
    let mut buf = vec![0u8; 1 << 20];
    for (off, len, kind) in extents(store, 0, size)? {
        if kind != ExtentKind::Data {
            continue;
        }
        let mut at = off;
        while at < off + len {
            let n = ((off + len - at) as usize).min(buf.len());
            store.read(at, &mut buf[..n])?;
            f.write_all_at(&buf[..n], at)
                .with_context(|| format!("writing {} at offset {at}", out.display()))?;
            at += n as u64;
        }
    }
    f.sync_all()
        .with_context(|| format!("syncing {}", out.display()))?;
    Ok(())
}

/// `[offset, offset + length)` of the store as (offset, length, kind) runs.
fn extents(store: &Store, offset: u64, length: u64) -> Result<Vec<(u64, u64, ExtentKind)>> {
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
fn block_losses(store: &Store, size: u64, lost: &[persist::LostPages]) -> Result<Vec<LostRange>> {
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

/// Walks the tree only to learn every file's paths.
struct Collect;

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

/// Lost pages of a filesystem as file paths and byte ranges in them; and
/// the lost bytes that fall in no file (data of deleted files, or past a
/// file's end: a load drops those anyway). Lost pages are in the image's
/// store offsets: a file of lost+found is found by the slot its data came
/// from, every other file by its own slot (a loaded tree keeps them).
fn fs_losses(
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

/// The filesystem from the newest tree that loads, with the data of files
/// it does not know (an older tree's) put in lost+found; with no tree at
/// all, a new filesystem holding every file's data in lost+found.
fn rebuild_fs(
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

fn print_report(r: &Report, out: &mut dyn Write) {
    let w = out;
    let _ = writeln!(
        w,
        "{}: {} disk of {}, saves {:?}",
        r.image.display(),
        r.kind,
        if r.size == 0 {
            "unlimited size".to_string()
        } else {
            human(r.size)
        },
        r.saves
    );
    if let Some(e) = &r.manifest_error {
        let _ = writeln!(
            w,
            "MANIFEST unusable ({e}): chain rebuilt from the segment files; a save it \
             named may be missing"
        );
    }
    for d in &r.damaged {
        let what = match &d.lost {
            persist::Lost::Pages { first, end } => format!("pages {first}..{end}"),
            persist::Lost::Gone { first, end } => {
                format!("the emptying of pages {first}..{end}")
            }
            persist::Lost::Among {
                first,
                end: Some(end),
            } => {
                format!("unknown records among pages {first}..{end}")
            }
            persist::Lost::Among { first, end: None } => {
                format!("unknown records among pages {first}.. (to the end)")
            }
            persist::Lost::Meta => "the filesystem's tree".into(),
            persist::Lost::Header => "the segment header only".into(),
            persist::Lost::Segment => "the whole save".into(),
        };
        let _ = writeln!(
            w,
            "damaged: save {} {} offset {} ({} bytes): {}; lost: {what}",
            d.seq,
            d.file.display(),
            d.offset,
            d.length,
            d.reason
        );
    }
    if let Some(t) = &r.tree {
        match (t.save, t.newest) {
            (Some(s), true) => {
                let _ = writeln!(w, "tree: save {s}'s (the newest), whole");
            }
            (Some(s), false) => {
                let _ = writeln!(
                    w,
                    "tree: the newest save's tree is damaged; using save {s}'s (made {}): \
                     names, sizes and attributes changed after it are lost",
                    t.time_ns
                        .map_or("at an unknown time".into(), ramd_store::persist::time_text)
                );
            }
            (None, _) => {
                let _ = writeln!(
                    w,
                    "tree: none readable; the data is salvaged as raw store data, one file \
                     per original file (names, attributes and sizes are lost)"
                );
            }
        }
        for p in &t.lost_found {
            let _ = writeln!(w, "lost+found: {p}: data of a file the tree does not name");
        }
    }
    for l in &r.lost {
        let what = match l.state {
            "zeros" => format!(
                "save {}'s copy is damaged and no earlier one exists: reads as zeros",
                l.save
            ),
            "older" => format!(
                "save {}'s copy is damaged: holds an earlier save's copy (older data)",
                l.save
            ),
            "unknown-zeros" => format!(
                "among damaged records of save {}: may have been written by it; reads as zeros",
                l.save
            ),
            _ => format!(
                "among damaged records of save {}: may have been written by it; holds an \
                 earlier save's copy",
                l.save
            ),
        };
        let place = if l.paths.is_empty() {
            "disk".to_string()
        } else {
            l.paths.join(" = ")
        };
        let _ = writeln!(
            w,
            "lost: {place} bytes {}..{} ({} bytes): {what}",
            l.offset,
            l.offset + l.length,
            l.length
        );
    }
    if r.lost_outside_files > 0 {
        let _ = writeln!(
            w,
            "note: {} of damaged pages lie in no file (deleted files' data; a load drops it)",
            human(r.lost_outside_files)
        );
    }
    if let (Some(s), Some(dir)) = (&r.new_image, &r.new_image_dir) {
        let _ = writeln!(
            w,
            "new image: {} (full save {}, {} pages, {}): serve it with `ramd serve --image {}`",
            dir.display(),
            s.seq,
            s.pages,
            human(s.bytes),
            dir.display()
        );
    }
    if let Some(e) = &r.export {
        let _ = writeln!(w, "exported: {}", e.display());
    }
    for n in &r.export_notes {
        let _ = writeln!(w, "not set: {n}");
    }
    let _ = writeln!(
        w,
        "{}",
        if r.complete {
            "result: everything was recovered".to_string()
        } else {
            format!("result: data was lost or is uncertain (exit {EXIT_LOST})")
        }
    );
}
