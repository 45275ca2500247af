//! `ramd image info|ls|verify|export|import|prune`: images offline,
//! without a running disk, in a directory or in object storage alike
//! (`ImageDir` hides which).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

use anyhow::{bail, Context, Result};

use ramd_store::persist::{self, DiskKind, ImageDir, Record};
use ramd_store::{Codec, PageRef, PAGE_SIZE};

use crate::cli::ImageCommand;
use ramd_store::human;

pub fn run(cmd: ImageCommand) -> Result<()> {
    match cmd {
        ImageCommand::Info { dir, json } => info(&dir, json),
        ImageCommand::Verify { dir } => verify(&dir),
        ImageCommand::Ls { dir, json } => ls(&dir, json),
        ImageCommand::Prune { dir, json } => prune(&dir, json),
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
    let m = image.manifest().expect("open_existing has a manifest");
    if as_json {
        println!("{}", serde_json::to_string(&m.chain)?);
    } else {
        print_chain(m);
    }
    Ok(())
}

fn prune(dir: &Path, as_json: bool) -> Result<()> {
    let removed = ImageDir::prune(dir)?;
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

pub(crate) use ramd_store::persist::time_text;

fn verify(dir: &Path) -> Result<()> {
    let image = ImageDir::open_existing(dir)?;
    let m = image.manifest().expect("open_existing has a manifest");
    let (mut pages, mut records) = (0u64, 0u64);
    let mut meta = false;
    // An fs disk's files live across the store's whole address space.
    let limit = match m.kind {
        DiskKind::Block => m.size,
        DiskKind::Fs => ramd_store::MAX_SIZE,
    };
    image.read_chain(
        |rec| {
            records += 1;
            meta |= matches!(rec, Record::Meta(_));
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
    if m.kind == DiskKind::Fs && !meta {
        bail!(
            "{}: an fs image without its tree (no META record)",
            dir.display()
        );
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
