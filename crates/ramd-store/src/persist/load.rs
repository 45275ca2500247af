//! Loading an image at start: `open_image` checks it against the disk's
//! settings, `load` reads its chain into a store and reports `Progress` to
//! the caller, and a stop signal ends loads under way (`stop_loading`).

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::error::{Error, Result};
use crate::store::Store;
use crate::units::human;

use super::format::{DiskKind, Record, TreeChain};
use super::image_dir::ImageDir;

/// Set by a stop signal: loads under way end at their next record, so that
/// Ctrl-C during a long load stops at once (and nothing half-loaded is
/// ever saved: the disk that was loading never serves).
static STOP_LOADING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Stops every load of this process (`on` = true), or allows loads again.
pub fn stop_loading(on: bool) {
    STOP_LOADING.store(on, Ordering::SeqCst);
}

/// Whether a signal stopped loads ([`stop_loading`]): a loader of its own
/// (`--data-path kernel`) checks it as `load` does.
pub fn loading_stopped() -> bool {
    STOP_LOADING.load(Ordering::Relaxed)
}

/// How far a load has come, for whoever shows it (the binary: a bar on a
/// terminal, else log lines). The engine only reports: how to show it is
/// the caller's business.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// `done` of the image's `total` bytes are read.
    Read { done: u64, total: u64 },
    /// Every record is in the store.
    Done,
}

/// Loads the image into `store`; returns the filesystem tree if it is an
/// fs image (its last whole tree and the changes after it). Progress goes
/// to `progress`: `Read` as records are read, `Done` once the load
/// succeeded (not after an error).
pub fn load(
    image: &ImageDir,
    store: &Store,
    progress: &mut dyn FnMut(Progress),
) -> Result<Option<TreeChain>> {
    let m = image.manifest().expect("load needs an image");
    let t0 = Instant::now();
    log::info!(
        "loading image {}: {} disk of {}, {} save(s), {}",
        image.path().display(),
        m.kind.name(),
        human(m.size),
        m.chain.len(),
        human(m.bytes())
    );
    let mut meta = None;
    let _populating = store.populating();
    image
        .read_chain(
            |rec| match rec {
                _ if STOP_LOADING.load(Ordering::Relaxed) => Err(Error::Unusable(
                    "stopped by a signal (the image is untouched)".into(),
                )),
                Record::Page(page, p) => store.restore_page(page, p),
                Record::Frame { key, mask, data } => store.restore_frame(key, mask, data),
                Record::Gone(key) => store.restore_gone(key),
                rec @ (Record::Meta(_) | Record::MetaDelta(_)) => TreeChain::add(&mut meta, &rec),
            },
            |done, total| progress(Progress::Read { done, total }),
        )
        .map_err(|e| {
            let hint = match e {
                Error::NoSpace { .. } => {
                    ": the image holds more than the disk's memory cap allows: give a larger \
                     --max-memory SIZE"
                }
                Error::DiskFull { .. } => {
                    ": the image holds more than the disk's size allows: give a larger --size SIZE"
                }
                _ => "",
            };
            Error::context(format!("loading image {}", image.path().display()), e, hint)
        })?;
    progress(Progress::Done);
    store.end_restore();
    let secs = t0.elapsed().as_secs_f64();
    let st = store.stats();
    log::info!(
        "loaded image {}: {} pages ({} of data in {} of memory) in {secs:.2} s ({}/s)",
        image.path().display(),
        st.data_pages + st.zero_pages + st.fill_pages,
        human(st.data_bytes),
        human(st.memory_used),
        human((m.bytes() as f64 / secs.max(1e-9)) as u64)
    );
    if m.kind == DiskKind::Fs && meta.is_none() {
        return Err(Error::Unusable(format!(
            "image {}: an fs image without its tree (no META record)",
            image.path().display()
        )));
    }
    Ok(meta)
}

/// Opens `--image DIR` and checks it against the disk's settings: the
/// size to use (the image's when `size` is None) and the image, loaded or
/// new.
pub fn open_image(dir: &Path, kind: DiskKind, size: Option<u64>) -> Result<(ImageDir, u64)> {
    let image = ImageDir::open(dir).map_err(|e| match e {
        // Says which directory (or URL: every error of one names it) itself.
        e @ Error::Unusable(_) => e,
        e if super::is_url(dir) => e,
        e => Error::context(format!("image {}", dir.display()), e, ""),
    })?;
    let Some(m) = image.manifest() else {
        let size = size.ok_or_else(|| {
            Error::Unusable(format!(
                "image {} is empty (a new image): give --size SIZE for the new disk",
                dir.display()
            ))
        })?;
        return Ok((image, size));
    };
    if m.kind != kind {
        // Commands in backquotes: the mount helper, which rewrites flags
        // as mount options, leaves those alone.
        let d = dir.display();
        return Err(Error::Unusable(match kind {
            DiskKind::Fs => format!(
                "image {d} holds a block disk, not a filesystem: serve it as a block disk \
                 (`ramd serve --image {d}`)"
            ),
            DiskKind::Block => format!(
                "image {d} holds a filesystem, not a block disk: mount it \
                 (`ramd serve --image {d} --mount DIR`, or `mount -t fuse.ramd -o image={d} \
                 NAME DIR`)"
            ),
        }));
    }
    // A filesystem disk may be mounted with another size (tmpfs's way: the
    // mount's size= rules); loading then checks that the data fits.
    if kind == DiskKind::Fs {
        let size = size.unwrap_or(m.size);
        return Ok((image, size));
    }
    if let Some(s) = size.filter(|&s| s != m.size) {
        return Err(Error::Unusable(format!(
            "--size {s} differs from the size of the disk in image {}: {} bytes; leave --size \
             out to use the image's",
            dir.display(),
            m.size
        )));
    }
    let size = m.size;
    Ok((image, size))
}
