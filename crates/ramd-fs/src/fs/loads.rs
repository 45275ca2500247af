//! Loads of `--data-path kernel`: an image's pages go straight into the
//! hot tier's files, never through the store, and the page hashes the
//! next save compares against are taken as they are written (see
//! `saves.rs` for the image layout both share).

use std::collections::HashSet;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;

use ramd_store::persist::{decode_record, ImageDir, Record, TreeChain};
use ramd_store::{Error, Store};

use super::marks::{data_chunks, CHUNK_PAGES, SLOT_PAGE_SHIFT};
use super::saves::{hash_file, is_zero, BLOCK, PAGE};
use super::{Data, Fs, FsConfig};
use crate::hot::HotTier;

/// Writes an image's pages into per-slot files of the hot tier (named
/// `s<slot>`) as a load reads them; later records win, as in the store.
struct SlotFiles<'a> {
    hot: &'a HotTier,
    /// The file being written (records come in page order within a save).
    cur: Option<(u64, File)>,
    /// Slots with a file.
    made: HashSet<u64>,
    /// Consecutive data pages not written yet: slot, byte offset, bytes.
    pending: Option<(u64, u64)>,
    buf: Vec<u8>,
}

impl SlotFiles<'_> {
    fn file(&mut self, slot: u64, create: bool) -> io::Result<Option<&File>> {
        if self.cur.as_ref().is_none_or(|(s, _)| *s != slot) {
            self.cur = None;
            if !create && !self.made.contains(&slot) {
                return Ok(None);
            }
            let f = self
                .hot
                .open_named(&slot_name(slot), true)?
                .expect("created");
            self.made.insert(slot);
            self.cur = Some((slot, f));
        }
        Ok(self.cur.as_ref().map(|(_, f)| f))
    }

    fn flush(&mut self) -> io::Result<()> {
        if let Some((slot, off)) = self.pending.take() {
            let buf = std::mem::take(&mut self.buf);
            let r = match self.file(slot, true)? {
                Some(f) => f.write_all_at(&buf, off),
                None => Ok(()),
            };
            self.buf = buf;
            self.buf.clear();
            r?;
        }
        Ok(())
    }

    fn page(&mut self, page: u64, bytes: &[u8]) -> io::Result<()> {
        let slot = page >> SLOT_PAGE_SHIFT;
        let off = (page & ((1 << SLOT_PAGE_SHIFT) - 1)) * PAGE;
        if is_zero(bytes) {
            self.flush()?;
            return self.punch(slot, off, PAGE);
        }
        match self.pending {
            Some((s, o))
                if s == slot && o + self.buf.len() as u64 == off && self.buf.len() < BLOCK => {}
            _ => {
                self.flush()?;
                self.pending = Some((slot, off));
            }
        }
        self.buf.extend_from_slice(bytes);
        Ok(())
    }

    /// Makes `len` bytes at `off` of the slot's file a hole, if it has one.
    fn punch(&mut self, slot: u64, off: u64, len: u64) -> io::Result<()> {
        let Some(f) = self.file(slot, false)? else {
            return Ok(());
        };
        let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
        super::kernel::fallocate(f, mode, off, len)
    }
}

fn slot_name(slot: u64) -> String {
    format!("s{slot}")
}

impl Fs {
    /// Loads `image` (an fs image) with its files' data in `tier`
    /// (`--data-path kernel`): the pages go straight from the image into
    /// the tier's files, never through the store. Returns the filesystem
    /// and its tree as the image holds it.
    pub fn load_kernel(
        store: Arc<Store>,
        cfg: FsConfig,
        tier: HotTier,
        image: &ImageDir,
    ) -> ramd_store::Result<(Fs, Vec<u8>)> {
        let t0 = std::time::Instant::now();
        let path = image.path().display().to_string();
        let mut files = SlotFiles {
            hot: &tier,
            cur: None,
            made: HashSet::new(),
            pending: None,
            buf: Vec::with_capacity(BLOCK),
        };
        let mut meta = None;
        let mut logged = 0;
        let io = |e: io::Error| {
            let hint = if e.raw_os_error() == Some(libc::ENOSPC) {
                ": the image holds more than the disk's size allows: give a larger --size SIZE"
            } else {
                ""
            };
            Error::Context {
                what: format!("loading image {path} into the kernel's tmpfs"),
                inner: Box::new(Error::File {
                    path: PathBuf::from("the private tmpfs"),
                    err: e,
                }),
                hint,
            }
        };
        image.read_chain(
            |rec| {
                if ramd_store::persist::loading_stopped() {
                    return Err(Error::Unusable(
                        "stopped by a signal (the image is untouched)".into(),
                    ));
                }
                match rec {
                    rec @ (Record::Meta(_) | Record::MetaDelta(_)) => {
                        TreeChain::add(&mut meta, &rec)
                    }
                    Record::Gone(key) => {
                        let page = key.saturating_mul(CHUNK_PAGES);
                        let slot = page >> SLOT_PAGE_SHIFT;
                        let off = (page & ((1 << SLOT_PAGE_SHIFT) - 1)) * PAGE;
                        files.flush().map_err(io)?;
                        files.punch(slot, off, CHUNK_PAGES * PAGE).map_err(io)
                    }
                    rec => decode_record(&rec, |page, bytes| files.page(page, bytes).map_err(io)),
                }
            },
            |done, total| {
                let quarter = done * 4 / total.max(1);
                if quarter > logged && quarter < 4 {
                    logged = quarter;
                    log::info!("loading: {}%", quarter * 25);
                }
            },
        )?;
        files.flush().map_err(io)?;
        files.cur = None;
        let meta = meta.ok_or_else(|| {
            Error::Unusable(format!(
                "image {path}: an fs image without its tree (no META record)"
            ))
        })?;
        let tree_err = |e| Error::Unusable(format!("loading image {path}: the tree: {e}"));
        let meta = super::TreeRecords::merge(&meta).map_err(tree_err)?;
        let fs = Fs::load_tree(store, cfg, &meta).map_err(tree_err)?;
        let made = std::mem::take(&mut files.made);
        fs.adopt_slot_files(&tier, made).map_err(io)?;
        fs.hot
            .set(tier)
            .unwrap_or_else(|_| unreachable!("a new filesystem has no tier"));
        log::info!(
            "loaded image {path} into the kernel's tmpfs: {} in {:.2} s",
            ramd_store::human(fs.hot.get().expect("set").used_bytes()),
            t0.elapsed().as_secs_f64()
        );
        Ok((fs, meta))
    }

    /// Gives each file of the loaded tree its slot's file (renamed to its
    /// inode's name, cut to its size, with its times), records the hashes
    /// of what the image holds, and marks the chunks of slots no file owns
    /// as dead (their files go).
    fn adopt_slot_files(&self, tier: &HotTier, mut made: HashSet<u64>) -> io::Result<()> {
        let st = self.state.read();
        let mut inner = self.saves.inner.lock();
        let mut buf = vec![0u8; BLOCK];
        for (&ino, inode) in &st.inodes {
            let Data::File { slot, .. } = inode.data else {
                continue;
            };
            let f = if made.remove(&slot) {
                let f = tier.open_named(&slot_name(slot), false)?.expect("made");
                // What the image holds, before the cut: pages past the end
                // stay in the image until a save writes them as holes.
                let hashes = hash_file(&format!("inode {ino}"), &f, &mut buf)?;
                if !hashes.is_empty() {
                    inner.saved.insert(slot, hashes);
                }
                tier.rename_named(&slot_name(slot), &ino.0.to_string())?;
                f
            } else if inode.size > 0 {
                tier.open(ino, true)?.expect("created")
            } else {
                // Made at its first open, as for a new file.
                continue;
            };
            f.set_len(inode.size)?;
            super::kernel::init_backing(&f, inode.atime, inode.mtime, inode.flags)
                .map_err(|e| io::Error::from_raw_os_error(e.get()))?;
        }
        for slot in made {
            if let Some(f) = tier.open_named(&slot_name(slot), false)? {
                let hashes = hash_file(&format!("file slot {slot}"), &f, &mut buf)?;
                let chunks: Vec<u64> = data_chunks(slot, &hashes).collect();
                inner.dead.extend(chunks);
            }
            tier.remove_named(&slot_name(slot));
        }
        Ok(())
    }
}
