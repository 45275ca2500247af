//! `ramd image salvage`: a damaged image read as far as it can be
//! (`persist::SalvageChain`, which skips what fails its checksum), loaded
//! into memory as the daemon loads an image, then written as a new, whole
//! image and/or exported, with a report of what could not be recovered:
//! byte ranges of a block disk, file paths and byte ranges of a
//! filesystem. The source image is only read.

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use serde::Serialize;

use ramd_store::persist::{
    self, Damaged, DiskKind, ImageDir, Persister, Record, SalvageChain, SaveReport,
};
use ramd_store::{human, ExtentKind, Store};

use crate::image_fs;

mod losses;
mod rebuild;

use losses::{block_losses, fs_losses, LostRange};
use rebuild::{extents, rebuild_fs, Collect, Tree};

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
    // (save, its tree, the save whose whole tree it was built from).
    let mut metas: Vec<(u64, Vec<u8>, u64)> = Vec::new();
    let mut tree: Option<ramd_fs::fs::TreeRecords> = None;
    let read = chain.read(|seq, rec| {
        // A record that verifies but does not decode is damage too: it
        // must not reach the store as data.
        persist::decode_record(&rec, |_, _| Ok(()))?;
        match rec {
            Record::Page(page, p) => store.restore_page(page, p),
            Record::Frame { key, mask, data } => store.restore_frame(key, mask, data),
            Record::Gone(key) => store.restore_gone(key),
            // Each save's tree, whole: a change applies to the tree before
            // it; with none (its save lost), the trees wait for a whole one.
            Record::Meta(m) => {
                tree = ramd_fs::fs::TreeRecords::from_whole(m).ok();
                if tree.is_some() {
                    metas.push((seq, m.to_vec(), seq));
                }
                Ok(())
            }
            Record::MetaDelta(d) => {
                if let (Some(t), Some(&(_, _, base))) = (&mut tree, metas.last()) {
                    match t.apply_delta(d) {
                        Ok(_) => metas.push((seq, t.whole(), base)),
                        Err(e) => {
                            log::warn!("the tree of save {seq}: {e}: passed over");
                            tree = None;
                        }
                    }
                }
                Ok(())
            }
        }
    })?;
    store.end_restore();
    // A tree built from changes is wrong if a save between its whole tree
    // and it lost its own (every save of an fs disk writes one): the
    // changes after that save assume it.
    let read_trees: std::collections::HashSet<u64> = metas.iter().map(|m| m.0).collect();
    let metas: Vec<(u64, Vec<u8>)> = metas
        .into_iter()
        .filter(|&(seq, _, base)| {
            chain
                .chain
                .iter()
                .filter(|s| s.seq > base && s.seq <= seq)
                .all(|s| read_trees.contains(&s.seq))
        })
        .map(|(seq, tree, _)| (seq, tree))
        .collect();
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
                    Some(Box::new(move |full| f.save_tree(full))),
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
        p.set_meta(f);
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
