//! `ramd image info|ls|verify|export|import|prune|restore`: images offline,
//! without a running disk, in a directory or in object storage alike
//! (`ImageDir` hides which).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{bail, Context, Result};

use ramd_store::persist::{self, DiskKind, ImageDir};
use ramd_store::{Codec, PageRef, PAGE_SIZE};

use crate::cli::ImageCommand;
use ramd_store::human;

pub fn run(cmd: ImageCommand) -> Result<()> {
    match cmd {
        ImageCommand::Info { dir, json } => info(&dir, json),
        ImageCommand::Verify { dir } => verify(&dir),
        ImageCommand::Ls { dir, json } => ls(&dir, json),
        ImageCommand::Prune {
            dir,
            keep_saves,
            json,
        } => prune(&dir, keep_saves, json),
        ImageCommand::Restore {
            src,
            at,
            to,
            same_id,
            json,
        } => restore(&src, &at, &to, same_id, json),
        ImageCommand::Export {
            dir,
            raw,
            to,
            tar,
            force,
        } => export(&dir, &to.or(raw).expect("clap requires a PATH"), tar, force),
        ImageCommand::Salvage {
            dir,
            to,
            export,
            tar,
            force,
            json,
        } => crate::salvage::run(crate::salvage::Args {
            dir,
            to,
            export,
            tar,
            force,
            json,
        }),
        ImageCommand::Import { raw, dir, compress } => import(&raw, &dir, compress),
    }
}

fn info(dir: &Path, as_json: bool) -> Result<()> {
    let image = ImageDir::open_existing(dir)?;
    let m = image.manifest().expect("open_existing has a manifest");
    if as_json {
        println!("{}", serde_json::to_string(m)?);
        return Ok(());
    }
    println!("image:  {}", dir.display());
    println!("kind:   {}", m.kind.name());
    match m.id {
        Some(id) => println!("id:     {id}"),
        // A version 1 MANIFEST: `ramd serve` gives it one when it opens it.
        None => println!("id:     none yet (given at the next `ramd serve` of the image)"),
    }
    match (m.kind, m.size) {
        (DiskKind::Fs, 0) => println!("size:   unlimited"),
        (_, n) => println!("size:   {} ({n} bytes)", human(n)),
    }
    println!("saves:  {} ({} in all)", m.chain.len(), human(m.bytes()));
    print_chain(m);
    Ok(())
}

fn print_chain(m: &persist::Manifest) {
    println!(
        "{:>8}  {:<11}  {:>10}  {:>10}  TIME",
        "SEQ", "TYPE", "PAGES", "BYTES"
    );
    for s in &m.chain {
        println!(
            "{:>8}  {:<11}  {:>10}  {:>10}  {}",
            s.seq,
            if s.full { "full" } else { "incremental" },
            s.pages,
            human(s.bytes),
            time_text(s.time_ns)
        );
    }
}

fn ls(dir: &Path, as_json: bool) -> Result<()> {
    let image = ImageDir::open_existing(dir)?;
    let saves = image.restorable()?;
    if as_json {
        println!("{}", serde_json::to_string(&saves)?);
        return Ok(());
    }
    println!(
        "{:>8}  {:<11}  {:>10}  {:>10}  {:<23}  MANIFEST",
        "SEQ", "TYPE", "PAGES", "BYTES", "TIME"
    );
    for r in &saves {
        let s = &r.save;
        println!(
            "{:>8}  {:<11}  {:>10}  {:>10}  {:<23}  {}",
            s.seq,
            if s.full { "full" } else { "incremental" },
            s.pages,
            human(s.bytes),
            time_text(s.time_ns),
            r.manifest
        );
    }
    Ok(())
}

fn prune(dir: &Path, keep: Option<std::time::Duration>, as_json: bool) -> Result<()> {
    let removed = ImageDir::prune(dir, keep)?;
    let bytes: u64 = removed.iter().map(|(_, n)| n).sum();
    if as_json {
        let names: Vec<serde_json::Value> = removed
            .iter()
            .map(|(name, size)| serde_json::json!({"name": name, "bytes": size}))
            .collect();
        println!(
            "{}",
            serde_json::json!({"image": dir.display().to_string(), "removed": names, "bytes": bytes})
        );
        return Ok(());
    }
    for (name, size) in &removed {
        println!("removed {name} ({})", human(*size));
    }
    match removed.len() {
        0 => println!("{}: no debris", dir.display()),
        n => println!("{}: removed {n} ({})", dir.display(), human(bytes)),
    }
    Ok(())
}

use ramd_store::persist::time_text;

/// Which save `--at` names among `saves` (by sequence number): a sequence
/// number, an RFC 3339 time, or a duration ago (`10m`, `2 hours ago`);
/// for a time, the newest save at or before it. `now_ns`: the present.
fn pick_save<'a>(
    src: &Path,
    at: &str,
    saves: &'a [persist::Restorable],
    now_ns: u64,
) -> Result<&'a persist::Restorable> {
    let t = at.trim();
    let kept = || match (saves.first(), saves.last()) {
        (Some(a), Some(b)) => format!(
            "the kept saves are {} ({}) to {} ({})",
            a.save.seq,
            time_text(a.save.time_ns),
            b.save.seq,
            time_text(b.save.time_ns)
        ),
        _ => "it keeps no save".into(),
    };
    if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()) {
        let seq: u64 = t.parse().with_context(|| format!("--at {at}: too large"))?;
        return saves.iter().find(|r| r.save.seq == seq).with_context(|| {
            format!(
                "{}: no kept save {seq}: {} (`ramd image ls {}`)",
                src.display(),
                kept(),
                src.display()
            )
        });
    }
    let when_ns = match humantime::parse_rfc3339_weak(t) {
        Ok(when) => when
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
        Err(_) => {
            let ago = t.strip_suffix("ago").unwrap_or(t).trim();
            let d = humantime::parse_duration(ago).map_err(|_| {
                anyhow::anyhow!(
                    "--at {at:?}: not a save's sequence number, a time (RFC 3339, e.g. \
                     2026-11-26T14:30:00Z) or a duration ago (e.g. 10m, \"2 hours ago\")"
                )
            })?;
            now_ns.saturating_sub(d.as_nanos() as u64)
        }
    };
    saves
        .iter()
        .rev()
        .find(|r| r.save.time_ns <= when_ns)
        .with_context(|| {
            format!(
                "{}: no kept save at or before {}: {}",
                src.display(),
                time_text(when_ns),
                kept()
            )
        })
}

fn restore(src: &Path, at: &str, to: &Path, same_id: bool, as_json: bool) -> Result<()> {
    let source = ImageDir::open_existing(src)?;
    let saves = source.restorable()?;
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let pick = pick_save(src, at, &saves, now_ns)?;
    let m = source.as_of(pick.save.seq)?;
    // DEST is new: an image there is never replaced, nor files mixed with.
    if persist::is_url(to) {
        if ImageDir::open_existing(to).is_ok() {
            bail!(
                "{} holds an image already: restore makes a new image (give another prefix, \
                 or remove that one first)",
                to.display()
            );
        }
    } else if let Ok(mut d) = std::fs::read_dir(to) {
        if d.next().is_some() {
            let what = if to.join(persist::MANIFEST).exists() {
                "holds an image already"
            } else {
                "is not empty"
            };
            bail!(
                "{} {what}: restore makes a new image in a new or empty directory (give \
                 another one)",
                to.display()
            );
        }
    }
    let mut dest = ImageDir::open(to)?;
    if same_id {
        if let Some(id) = m.id {
            dest.set_id(id);
        }
    }
    dest.restore_from(&source, m)?;
    dest.release_lease();
    let s = &pick.save;
    if as_json {
        println!(
            "{}",
            serde_json::json!({
                "image": to.display().to_string(),
                "from": src.display().to_string(),
                "seq": s.seq,
                "time_ns": s.time_ns,
                "saves": dest.manifest().map_or(0, |m| m.chain.len()),
                "id": dest.id().to_string(),
            })
        );
        return Ok(());
    }
    println!(
        "{}: restored save {} ({}, {}) of {} as {} (id {}); serve it with `ramd serve --image {}`",
        to.display(),
        s.seq,
        if s.full { "full" } else { "incremental" },
        time_text(s.time_ns),
        src.display(),
        if same_id {
            "the same disk"
        } else {
            "a new disk"
        },
        dest.id(),
        to.display()
    );
    Ok(())
}

fn verify(dir: &Path) -> Result<()> {
    let image = ImageDir::open_existing(dir)?;
    let m = image.manifest().expect("open_existing has a manifest");
    let (mut pages, mut records) = (0u64, 0u64);
    let mut tree = None;
    // An fs disk's files live across the store's whole address space.
    let limit = match m.kind {
        DiskKind::Block => m.size,
        DiskKind::Fs => ramd_store::MAX_SIZE,
    };
    image.read_chain(
        |rec| {
            records += 1;
            // A change to the tree needs a whole tree before it.
            persist::TreeChain::add(&mut tree, &rec)?;
            // Every compressed page must decompress, not just match its sum,
            // and name a page of the disk.
            persist::decode_record(&rec, |page, _| {
                in_disk(page, limit)?;
                pages += 1;
                Ok(())
            })
        },
        |_, _| {},
    )?;
    if m.kind == DiskKind::Fs {
        let Some(tree) = tree else {
            bail!(
                "{}: an fs image without its tree (no META record)",
                dir.display()
            );
        };
        // The changes to the tree apply to the tree before them.
        ramd_fs::fs::TreeRecords::merge(&tree)
            .map_err(|e| anyhow::anyhow!("{}: the tree: {e}", dir.display()))?;
    }
    println!(
        "{}: ok: {} {} disk, {} save(s), {records} records, {} of pages checked",
        dir.display(),
        m.kind.name(),
        human(m.size),
        m.chain.len(),
        human(pages * PAGE_SIZE as u64)
    );
    Ok(())
}

fn export(dir: &Path, to: &Path, tar: bool, force: bool) -> Result<()> {
    let image = ImageDir::open_existing(dir)?;
    let m = image.manifest().expect("open_existing has a manifest");
    if m.kind == DiskKind::Fs {
        let tar = tar || to.extension() == Some(std::ffi::OsStr::new("tar"));
        // Checked before the load, which may take a while.
        crate::image_fs::check_destination(to, !tar, force)?;
        let fs = crate::image_fs::load_fs(dir)?;
        let (notes, files) = crate::image_fs::export_fs(&fs, to, tar, force)?;
        crate::image_fs::print_notes(&notes, &mut std::io::stderr().lock());
        println!(
            "{}: wrote {} files ({} of data) to {}{}",
            dir.display(),
            files.len(),
            human(fs.stats().file_bytes),
            to.display(),
            if notes.is_empty() {
                String::new()
            } else {
                format!("; {} attribute(s) not set (listed above)", notes.len())
            }
        );
        return Ok(());
    }
    if tar {
        bail!(
            "{} is a block image: its export is a raw file, not a tar",
            dir.display()
        );
    }
    let raw = to;
    crate::image_fs::check_destination(raw, false, force)?;
    let out = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(raw)
        .with_context(|| format!("creating {}", raw.display()))?;
    out.set_len(m.size)
        .with_context(|| format!("sizing {}", raw.display()))?;
    let zero = [0u8; PAGE_SIZE];
    let size = m.size;
    let result = image.read_chain(
        |rec| {
            persist::decode_record(&rec, |page, data| {
                let at = in_disk(page, size)?;
                let data = &data[..(size.saturating_sub(at) as usize).min(PAGE_SIZE)];
                // Zeros over what an earlier save wrote; a fresh file is
                // already zero (and stays sparse).
                let r = if data == &zero[..data.len()] {
                    punch(&out, at, data.len() as u64)
                } else {
                    out.write_all_at(data, at)
                };
                r.map_err(|e| ramd_store::Error::file(raw, e))
            })
        },
        |_, _| {},
    );
    if let Err(e) = result.map_err(anyhow::Error::from).and_then(|()| {
        out.sync_all()
            .with_context(|| format!("syncing {}", raw.display()))
    }) {
        let _ = std::fs::remove_file(raw);
        return Err(e);
    }
    println!(
        "{}: wrote {} to {}",
        dir.display(),
        human(size),
        raw.display()
    );
    Ok(())
}

/// The byte offset of `page`, if the disk has that page.
fn in_disk(page: u64, size: u64) -> ramd_store::Result<u64> {
    page.checked_mul(PAGE_SIZE as u64)
        .filter(|&at| at < size.max(1))
        .ok_or_else(|| {
            ramd_store::Error::Invalid(format!("page {page} is outside the disk of {size} bytes"))
        })
}

fn punch(f: &File, at: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on our own descriptor.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            at as i64,
            len as i64,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn import(raw: &Path, dir: &Path, compress: Codec) -> Result<()> {
    let mut input = File::open(raw).with_context(|| format!("opening {}", raw.display()))?;
    let len = input
        .metadata()
        .with_context(|| format!("{}", raw.display()))?
        .len();
    if len == 0 {
        bail!("{} is empty: a disk needs at least one byte", raw.display());
    }
    let size = len.next_multiple_of(PAGE_SIZE as u64);
    let busy = std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some());
    if busy {
        bail!(
            "{} is not empty: import makes a new image (remove it, or pick another directory)",
            dir.display()
        );
    }
    // A prefix in object storage is not a directory to list: one holding
    // an image is refused here, one holding other objects by `open`.
    if persist::is_url(dir) && ImageDir::open_existing(dir).is_ok() {
        bail!(
            "{} holds an image already: import makes a new image (give another prefix)",
            dir.display()
        );
    }
    let mut image = ImageDir::open(dir)?;
    let mut w = image.begin_segment(1, true, DiskKind::Block, size)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut packed = [0u8; PAGE_SIZE];
    let mut page = 0u64;
    let mut at = 0u64;
    while at < len {
        let want = ((len - at) as usize).min(buf.len());
        let got = &mut buf[..want.next_multiple_of(PAGE_SIZE)];
        got.fill(0);
        input
            .read_exact(&mut got[..want])
            .with_context(|| format!("reading {} at offset {at}", raw.display()))?;
        for data in got.chunks_exact(PAGE_SIZE) {
            let first = u64::from_ne_bytes(data[..8].try_into().expect("8 bytes"));
            let same = data.chunks_exact(8).all(|c| c == &data[..8]);
            match () {
                // Holes cost nothing: not even a record.
                _ if same && first == 0 => {}
                _ if same => w.page(page, PageRef::Fill(first)),
                _ => match ramd_store::compress_page(compress, data, &mut packed) {
                    Some((zstd, n)) => w.page(
                        page,
                        PageRef::Packed {
                            zstd,
                            data: &packed[..n],
                        },
                    ),
                    None => w.page(
                        page,
                        PageRef::Raw {
                            data,
                            hot: compress.is_none(),
                        },
                    ),
                },
            }
            page += 1;
        }
        w.write_out()?;
        at += want as u64;
    }
    let entry = w.finish()?;
    let pages = entry.pages;
    image.commit(DiskKind::Block, size, entry)?;
    println!(
        "{}: imported {} ({} data pages) from {}; serve it with `ramd serve --image {}`",
        dir.display(),
        human(size),
        pages,
        raw.display(),
        dir.display()
    );
    Ok(())
}
