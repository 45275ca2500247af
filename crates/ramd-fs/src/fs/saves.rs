//! Saves and loads of `--data-path kernel`. File data lives in the hot
//! tier, where ramd never sees a write, so a save finds what changed by
//! itself, in two steps:
//! - **which files**: every file opened for writing, truncated, fallocated
//!   or copied into through ramd since the last save is marked changed, and
//!   stays marked while anyone holds it open (a writable mapping holds its
//!   file open);
//! - **which pages**: the save reads each marked file and compares every
//!   page's hash (XXH3, 128 bits) with the hash of the image's copy, kept
//!   in memory (16 bytes a page); only pages that differ are written.
//!
//! The image format is the store's, unchanged: file slot *n*'s page *i* is
//! image page `(n << 28) + i`. A zero page counts as a hole (both read as
//! zeros). Pages the image holds where a file now has none (shrunk,
//! punched) are written as holes; the chunks of a slot whose file is gone
//! are written as GONE records, so a slot reused by a new file starts
//! empty in the image as in memory.
//!
//! What a save holds: the tree (names, sizes, modes, times) as at the
//! switch, and each file's pages as they were when the save read them. A
//! file nobody writes during the save is saved exactly as at the switch; a
//! file written during the save may be saved with some pages older than
//! others (each 4 KiB page whole or from a moment a write was under way in
//! it), and stays marked, so the next save writes it again.
//!
//! A file in the cold tier (`cold.rs`) is read from the cold store, where
//! its pages are at its slot's keys: the same pages, so the same hashes,
//! and an unchanged cold file is not even read. While a save reads cold
//! files, their store copies stay until it ends, even if a file moves back
//! or goes meanwhile (`HotSaves::hold_cold`).

use std::collections::BTreeSet;
use std::fs::File;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use ramd_store::persist::{OuterPages, OuterSave, PageRef};
use ramd_store::{Error, PAGE_SIZE};

use super::cold::ColdFile;
use super::kernel::{next_data, no_atime, read_full};
use super::marks::{data_chunks, Hash, Inner, SLOT_PAGE_SHIFT};
use super::{Data, Fs, Ino, Kind, FILE_SHIFT};

/// What a save or load reads or writes at once.
pub(super) const BLOCK: usize = 1 << 20;
pub(super) const PAGE: u64 = PAGE_SIZE as u64;

pub(super) fn page_hash(p: &[u8]) -> Hash {
    if is_zero(p) {
        return 0;
    }
    xxhash_rust::xxh3::xxh3_128(p).max(1)
}

pub(super) fn is_zero(p: &[u8]) -> bool {
    p.chunks_exact(8).all(|w| w == [0u8; 8])
}

/// The 8 bytes that repeat through the page, if they do.
pub(super) fn fill_of(p: &[u8]) -> Option<u64> {
    let first: [u8; 8] = p[..8].try_into().expect("a page has 8 bytes");
    p.chunks_exact(8)
        .all(|w| w == first)
        .then(|| u64::from_ne_bytes(first))
}

pub(super) fn file_err(what: impl std::fmt::Display, err: io::Error) -> Error {
    Error::File {
        path: PathBuf::from(what.to_string()),
        err,
    }
}

/// A save ended: it reads no cold copy any more; frees those no longer
/// wanted. Takes `inner`'s lock guard and drops it first.
fn end_save(fs: &Fs, mut inner: parking_lot::MutexGuard<'_, Inner>) {
    inner.saving = false;
    inner.freed_in_save.clear();
    inner.cold_read.clear();
    let deferred = std::mem::take(&mut inner.deferred);
    drop(inner);
    for (slot, size) in deferred {
        fs.cold_punch(slot, size);
    }
}

/// A file's pages as a save reads them: a backing file, or a cold file's
/// pages in the cold store.
pub(super) trait Pages {
    fn size(&self) -> io::Result<u64>;
    /// The next data extent at or after `from`: (its start, its end).
    fn next_data(&self, from: u64) -> io::Result<Option<(u64, u64)>>;
    /// Reads until `buf` is full or the file ends; returns how much.
    fn read_full(&self, buf: &mut [u8], at: u64) -> io::Result<usize>;
}

impl Pages for File {
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn next_data(&self, from: u64) -> io::Result<Option<(u64, u64)>> {
        next_data(self, from)
    }

    fn read_full(&self, buf: &mut [u8], at: u64) -> io::Result<usize> {
        read_full(self, buf, at)
    }
}

impl Pages for ColdFile<'_> {
    fn size(&self) -> io::Result<u64> {
        Ok(self.size)
    }

    fn next_data(&self, from: u64) -> io::Result<Option<(u64, u64)>> {
        ColdFile::next_data(self, from)
    }

    fn read_full(&self, buf: &mut [u8], at: u64) -> io::Result<usize> {
        self.read(buf, at)
    }
}

/// One file a save reads.
struct Pick {
    slot: u64,
    ino: Ino,
    data: PickData,
    /// The image's copy; `None`: nothing (a full save, or a new file).
    old: Option<Arc<[Hash]>>,
}

/// Where a save reads a file's pages.
enum PickData {
    /// No backing file (never written): all holes.
    None,
    Hot(File),
    /// In the cold tier, `size` bytes long.
    Cold {
        size: u64,
    },
}

/// The [`OuterPages`] of a kernel-path filesystem.
struct Saver(Arc<Fs>);

impl Fs {
    /// What the persister saves beside the store (`Persister::set_outer`):
    /// with `--data-path kernel`, the files' data in the hot tier.
    pub fn outer_pages(self: &Arc<Self>) -> Option<Box<dyn OuterPages>> {
        self.hot.get()?;
        self.saves.imaged.store(true, Relaxed);
        Some(Box::new(Saver(self.clone())))
    }
}

impl OuterPages for Saver {
    fn switch(&self, full: bool) -> Box<dyn OuterSave> {
        let fs = &self.0;
        let hot = fs.hot.get().expect("a saver only for a hot tier");
        let st = fs.state.read();
        let mut inner = fs.saves.inner.lock();
        let mut picks = Vec::new();
        let mut cleared = Vec::new();
        let mut error = None;
        // Whether anything changed since the last save: a full switch
        // picks every file, changed or not.
        let dirty = !inner.changed.is_empty() || !inner.dead.is_empty();
        let candidates: Vec<Ino> = if full {
            st.inodes
                .iter()
                .filter(|(_, i)| i.kind == Kind::File)
                .map(|(&ino, _)| ino)
                .collect()
        } else {
            inner.changed.iter().copied().collect()
        };
        for ino in candidates {
            let Some(inode) = st.inodes.get(&ino) else {
                continue;
            };
            let Data::File { slot, .. } = inode.data else {
                continue;
            };
            if inode.opens == 0 && inner.changed.contains(&ino) {
                cleared.push(ino);
            }
            // The tree names linked files only: an unlinked one's data
            // would load as nobody's.
            if inode.nlink == 0 {
                continue;
            }
            let data = if inode.cold.is_cold() {
                inner.cold_read.insert(slot);
                PickData::Cold { size: inode.size }
            } else {
                match hot.open(ino, false) {
                    Ok(Some(f)) => {
                        no_atime(&f);
                        PickData::Hot(f)
                    }
                    Ok(None) => PickData::None,
                    Err(e) => {
                        error.get_or_insert(file_err(format!("the data of inode {ino}"), e));
                        PickData::None
                    }
                }
            };
            let old = if full {
                None
            } else {
                inner.saved.get(&slot).cloned()
            };
            picks.push(Pick {
                slot,
                ino,
                data,
                old,
            });
        }
        for ino in &cleared {
            inner.changed.remove(ino);
        }
        picks.sort_unstable_by_key(|p| p.slot);
        let taken = std::mem::take(&mut inner.dead);
        // A full save starts from an empty image: nothing to clear.
        let gone = if full {
            Vec::new()
        } else {
            taken.iter().copied().collect()
        };
        inner.saving = true;
        inner.freed_in_save.clear();
        Box::new(Save {
            fs: fs.clone(),
            full,
            dirty,
            picks,
            gone,
            taken,
            cleared,
            written: Vec::new(),
            error,
            committed: false,
        })
    }
}

/// One save's share: see [`OuterSave`].
struct Save {
    fs: Arc<Fs>,
    full: bool,
    /// Files were marked or slots freed at the switch.
    dirty: bool,
    picks: Vec<Pick>,
    gone: Vec<u64>,
    /// The dead chunks taken at the switch (given back if the save fails).
    taken: BTreeSet<u64>,
    /// Files unmarked at the switch (marked again if the save fails).
    cleared: Vec<Ino>,
    /// Per slot read: the hashes of what was written, for the commit.
    written: Vec<(u64, Arc<[Hash]>)>,
    /// A backing file that could not be opened at the switch.
    error: Option<Error>,
    committed: bool,
}

impl OuterSave for Save {
    fn gone(&self) -> &[u64] {
        &self.gone
    }

    fn changed(&self) -> bool {
        // A full save picks every file: only the marks say whether any
        // changed (a compaction of an unchanged disk writes nothing).
        let picked = if self.full {
            self.dirty
        } else {
            !self.picks.is_empty() || !self.gone.is_empty()
        };
        picked || self.error.is_some()
    }

    fn write(
        &mut self,
        out: &mut dyn FnMut(u64, PageRef<'_>) -> ramd_store::Result<()>,
    ) -> ramd_store::Result<u64> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let mut buf = vec![0u8; BLOCK];
        let mut pages = 0;
        for p in &self.picks {
            let what = format!("inode {}", p.ino);
            let base = p.slot << SLOT_PAGE_SHIFT;
            let old = p.old.as_deref().unwrap_or(&[]);
            let cold;
            let src: Option<&dyn Pages> = match &p.data {
                PickData::None => None,
                PickData::Hot(f) => Some(f),
                PickData::Cold { size } => {
                    let store = self.fs.cold_store().expect("a cold file has a cold tier");
                    cold = ColdFile {
                        store,
                        base: p.slot << FILE_SHIFT,
                        size: *size,
                    };
                    Some(&cold)
                }
            };
            let hashes = save_pages(&what, base, src, old, &mut buf, out, &mut pages)?;
            self.written.push((p.slot, hashes));
        }
        Ok(pages)
    }

    fn committed(mut self: Box<Self>) {
        self.committed = true;
        let mut inner = self.fs.saves.inner.lock();
        if self.full {
            inner.saved.clear();
        }
        for (slot, hashes) in std::mem::take(&mut self.written) {
            if inner.freed_in_save.contains(&slot) {
                // Its file went during the save: what it wrote goes next.
                let chunks: Vec<u64> = data_chunks(slot, &hashes).collect();
                inner.dead.extend(chunks);
            } else if hashes.is_empty() {
                inner.saved.remove(&slot);
            } else {
                inner.saved.insert(slot, hashes);
            }
        }
        end_save(&self.fs, inner);
    }
}

impl Drop for Save {
    fn drop(&mut self) {
        if self.committed {
            return;
        }
        // The save failed: as if it had not begun.
        let mut inner = self.fs.saves.inner.lock();
        let taken = std::mem::take(&mut self.taken);
        inner.dead.extend(taken);
        inner.changed.extend(self.cleared.drain(..));
        end_save(&self.fs, inner);
    }
}

/// Hands `out` the pages of file `what` (`None`: no data) that differ from
/// `old`, the hashes of the image's copy, as image pages from `base`, in
/// page order; returns the hashes of the file's pages as read.
fn save_pages(
    what: &str,
    base: u64,
    file: Option<&dyn Pages>,
    old: &[Hash],
    buf: &mut [u8],
    out: &mut dyn FnMut(u64, PageRef<'_>) -> ramd_store::Result<()>,
    pages: &mut u64,
) -> ramd_store::Result<Arc<[Hash]>> {
    let data_of = || format!("the data of {what}");
    let mut new: Vec<Hash> = Vec::new();
    let mut done = 0u64; // pages looked at so far
    if let Some(f) = file {
        let size = f.size().map_err(|e| file_err(data_of(), e))?;
        let end_page = size.div_ceil(PAGE);
        if end_page > 1 << SLOT_PAGE_SHIFT {
            // Its pages would land on the next slot's in the image.
            return Err(Error::Unusable(format!(
                "{what} is {size} bytes long; an image holds files of at most {} bytes \
                 (shrink it, or serve the disk without --image)",
                super::MAX_FILE_SIZE
            )));
        }
        new.resize(end_page as usize, 0);
        while done < end_page {
            let Some((data, hole)) = f
                .next_data(done * PAGE)
                .map_err(|e| file_err(data_of(), e))?
            else {
                break;
            };
            let (first, last) = (data / PAGE, hole.div_ceil(PAGE).min(end_page));
            holes(base, old, done..first, out, pages)?;
            let mut at = first;
            while at < last {
                let n = ((last - at) as usize).min(buf.len() / PAGE_SIZE);
                let want = &mut buf[..n * PAGE_SIZE];
                let got = f
                    .read_full(want, at * PAGE)
                    .map_err(|e| file_err(data_of(), e))?;
                want[got..].fill(0);
                for (k, page) in want.chunks_exact(PAGE_SIZE).enumerate() {
                    let i = at + k as u64;
                    let h = page_hash(page);
                    new[i as usize] = h;
                    if h == old.get(i as usize).copied().unwrap_or(0) {
                        continue;
                    }
                    let r = match (h, fill_of(page)) {
                        (0, _) => PageRef::Hole,
                        (_, Some(pat)) => PageRef::Fill(pat),
                        _ => PageRef::Raw {
                            data: page,
                            hot: true,
                        },
                    };
                    out(base + i, r)?;
                    *pages += 1;
                }
                at += n as u64;
            }
            done = last.max(first + 1);
        }
    }
    holes(base, old, done..u64::MAX, out, pages)?;
    while new.last() == Some(&0) {
        new.pop();
    }
    Ok(new.into())
}

/// Pages `range` of a file are holes now: the image's copies of them go.
fn holes(
    base: u64,
    old: &[Hash],
    range: std::ops::Range<u64>,
    out: &mut dyn FnMut(u64, PageRef<'_>) -> ramd_store::Result<()>,
    pages: &mut u64,
) -> ramd_store::Result<()> {
    for i in range.start..range.end.min(old.len() as u64) {
        if old[i as usize] != 0 {
            out(base + i, PageRef::Hole)?;
            *pages += 1;
        }
    }
    Ok(())
}

/// Hashes of a whole file's pages as it is (trailing holes left out): what
/// a save of it into an empty image records.
pub(super) fn hash_file(what: &str, f: &File, buf: &mut [u8]) -> io::Result<Arc<[Hash]>> {
    save_pages(what, 0, Some(f), &[], buf, &mut |_, _| Ok(()), &mut 0).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    //! The save state machine against a real private tmpfs (needs root, as
    //! the kernel data path does): what a save hands the image, page by page.

    use super::*;
    use crate::fs::{Caller, ROOT_INO};
    use crate::hot::{HotConfig, HotTier};
    use crate::tests::fs_with;
    use ramd_store::Store;
    use std::ffi::OsStr;

    const ME: Caller = Caller {
        uid: 0,
        gid: 0,
        pid: 0,
        umask: 0,
    };

    /// What one save wrote: GONE chunks, then (page, data page or hole).
    #[derive(Debug, Default, PartialEq)]
    struct Wrote {
        gone: Vec<u64>,
        pages: Vec<(u64, Option<u8>)>,
    }

    fn kernel_fs() -> Arc<Fs> {
        let fs = fs_with(64 << 20, 1000);
        fs.set_hot_tier(HotTier::new(&HotConfig::default()).expect("a private tmpfs (root)"))
            .unwrap();
        Arc::new(fs)
    }

    /// Runs one save (committed unless `fail`): each data page is named by
    /// its first byte.
    fn save(fs: &Arc<Fs>, full: bool, fail: bool) -> Wrote {
        let outer = fs.outer_pages().expect("a hot tier");
        let mut s = outer.switch(full);
        let mut w = Wrote {
            gone: s.gone().to_vec(),
            ..Wrote::default()
        };
        s.write(&mut |page, p| {
            w.pages.push((
                page,
                match p {
                    PageRef::Hole => None,
                    PageRef::Raw { data, .. } => Some(data[0]),
                    PageRef::Fill(pat) => Some(pat as u8),
                    other => panic!("a kernel-path save wrote {other:?}"),
                },
            ));
            Ok(())
        })
        .unwrap();
        if !fail {
            s.committed();
        }
        w
    }

    fn write(fs: &Fs, ino: Ino, page: u64, byte: u8) {
        let data = [byte; PAGE_SIZE];
        fs.write(&fs.change(), ino, page * PAGE, &data, true, ME, false)
            .unwrap();
    }

    fn create(fs: &Fs, name: &str) -> crate::fs::Attr {
        let mode = libc::S_IFREG | 0o644;
        fs.create(ME, ROOT_INO, OsStr::new(name), mode).unwrap()
    }

    fn slot_page(slot: u64, i: u64) -> u64 {
        (slot << SLOT_PAGE_SHIFT) + i
    }

    #[test]
    fn only_changed_pages_of_marked_files_are_saved() {
        let fs = kernel_fs();
        let a = create(&fs, "a");
        for i in 0..4 {
            write(&fs, a.ino, i, b'a' + i as u8);
        }
        fs.release(a.ino);
        let slot = 0;
        let first = save(&fs, true, false);
        assert_eq!(first.pages.len(), 4, "{first:?}");
        // Nothing marked: nothing read, nothing written.
        assert_eq!(save(&fs, false, false), Wrote::default());
        // One page rewritten, one the same, through an open for writing.
        fs.open(a.ino, libc::O_RDWR).unwrap();
        write(&fs, a.ino, 2, b'z');
        write(&fs, a.ino, 1, b'b');
        fs.release(a.ino);
        let w = save(&fs, false, false);
        assert_eq!(w.pages, vec![(slot_page(slot, 2), Some(b'z'))]);
        // Shrunk to one page: the image's pages past it become holes.
        fs.open(a.ino, libc::O_RDWR).unwrap();
        fs.setattr(
            ME,
            a.ino,
            crate::fs::SetAttr {
                size: Some(PAGE),
                ..Default::default()
            },
        )
        .unwrap();
        fs.release(a.ino);
        let w = save(&fs, false, false);
        assert_eq!(
            w.pages,
            (1..4)
                .map(|i| (slot_page(slot, i), None))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_failed_save_leaves_the_marks_and_the_image_hashes() {
        let fs = kernel_fs();
        let a = create(&fs, "a");
        write(&fs, a.ino, 0, b'x');
        fs.release(a.ino);
        save(&fs, true, false);
        fs.open(a.ino, libc::O_WRONLY).unwrap();
        write(&fs, a.ino, 0, b'y');
        fs.release(a.ino);
        let failed = save(&fs, false, true);
        assert_eq!(failed.pages, vec![(0, Some(b'y'))]);
        // The failed save neither unmarked the file nor adopted its hashes.
        let again = save(&fs, false, false);
        assert_eq!(again.pages, vec![(0, Some(b'y'))]);
    }

    /// Gives `fs` a cold tier (zstd) that moves files idle for 10 ms.
    fn with_cold(fs: &Arc<Fs>) {
        let store = Store::new(ramd_store::StoreConfig {
            compress: "zstd".parse().unwrap(),
            host_reserve: 0,
            ..ramd_store::StoreConfig::new(ramd_store::MAX_SIZE)
        })
        .unwrap();
        fs.set_cold_tier(Arc::new(store), std::time::Duration::from_millis(10))
            .unwrap();
    }

    /// Waits (up to 10 s) until `n` files are cold.
    fn wait_cold(fs: &Fs, n: u64) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while fs.cold_stats().unwrap().files != n {
            assert!(
                std::time::Instant::now() < deadline,
                "{n} file(s) never went cold: {:?}",
                fs.cold_stats()
            );
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    #[test]
    fn a_closed_idle_file_moves_to_the_cold_tier_and_back_on_open() {
        let fs = kernel_fs();
        let a = create(&fs, "a");
        for i in [0, 1, 5] {
            write(&fs, a.ino, i, b'a' + i as u8);
        }
        // A partial last page: the size is not a page multiple.
        fs.write(&fs.change(), a.ino, 6 * PAGE, b"tail", true, ME, false)
            .unwrap();
        fs.release(a.ino);
        let hot = fs.hot_tier().unwrap();
        let before = fs.getattr(a.ino).unwrap();
        assert_eq!(hot.used_bytes(), 4 * PAGE);
        with_cold(&fs);
        wait_cold(&fs, 1);
        // Its tmpfs pages are freed; a stat says what it did when hot.
        assert_eq!(hot.used_bytes(), 0);
        assert_eq!(fs.getattr(a.ino).unwrap(), before);
        let (used, _) = fs.pages_used();
        assert_eq!(used, 4, "cold files count as used");
        // An open moves it back, whole.
        fs.open(a.ino, libc::O_RDONLY).unwrap();
        assert_eq!(fs.cold_stats().unwrap().files, 0);
        assert_eq!(hot.used_bytes(), 4 * PAGE);
        let mut buf = vec![0u8; 7 * PAGE_SIZE];
        let n = fs.read(a.ino, 0, &mut buf).unwrap();
        assert_eq!(n as u64, 6 * PAGE + 4);
        for (i, page) in buf.chunks(PAGE_SIZE).take(6).enumerate() {
            let want = if [0, 1, 5].contains(&i) {
                b'a' + i as u8
            } else {
                0
            };
            assert!(page.iter().all(|&b| b == want), "page {i}");
        }
        assert_eq!(&buf[6 * PAGE_SIZE..n], b"tail");
        assert_eq!(fs.getattr(a.ino).unwrap().size, before.size);
        // Its store copy is freed once it is back.
        assert_eq!(fs.cold_stats().unwrap().data_bytes, 0);
        // Closed again, it goes again.
        fs.release(a.ino);
        wait_cold(&fs, 1);
    }

    #[test]
    fn a_save_reads_a_cold_file_as_it_read_it_hot() {
        let fs = kernel_fs();
        let a = create(&fs, "a");
        for i in [0, 1, 70] {
            write(&fs, a.ino, i, b'a' + i as u8);
        }
        fs.release(a.ino);
        let hot_save = save(&fs, true, false);
        with_cold(&fs);
        wait_cold(&fs, 1);
        // Nothing changed: nothing read, nothing written.
        assert_eq!(save(&fs, false, false), Wrote::default());
        // A full save reads it from the cold tier: the same pages.
        assert_eq!(save(&fs, true, false), hot_save);
        // Changed, then cold: the save reads the changed page there.
        fs.open(a.ino, libc::O_RDWR).unwrap();
        write(&fs, a.ino, 1, b'z');
        fs.release(a.ino);
        wait_cold(&fs, 1);
        let w = save(&fs, false, false);
        assert_eq!(w.pages, vec![(slot_page(0, 1), Some(b'z'))]);
    }

    #[test]
    fn a_cold_copy_a_save_reads_stays_until_the_save_ends() {
        let fs = kernel_fs();
        let a = create(&fs, "a");
        write(&fs, a.ino, 0, b'a');
        fs.release(a.ino);
        with_cold(&fs);
        wait_cold(&fs, 1);
        let outer = fs.outer_pages().unwrap();
        let mut s = outer.switch(true);
        // Moved back and changed after the switch: the save still reads
        // the copy of the switch's moment.
        fs.open(a.ino, libc::O_RDWR).unwrap();
        write(&fs, a.ino, 0, b'b');
        let mut pages = Vec::new();
        s.write(&mut |page, p| {
            if matches!(p, PageRef::Raw { .. } | PageRef::Fill(..)) {
                pages.push((page, data_first(&p)));
            }
            Ok(())
        })
        .unwrap();
        s.committed();
        assert_eq!(pages, vec![(0, b'a')]);
        // The save over, the copy is freed.
        assert_eq!(fs.cold_stats().unwrap().data_bytes, 0);
        fs.release(a.ino);
    }

    fn data_first(p: &PageRef<'_>) -> u8 {
        match p {
            PageRef::Raw { data, .. } => data[0],
            PageRef::Fill(pat) => *pat as u8,
            _ => 0,
        }
    }

    #[test]
    fn a_deleted_files_slot_is_gone_before_a_new_file_reuses_it() {
        let fs = kernel_fs();
        let a = create(&fs, "a");
        for i in [0, 70] {
            write(&fs, a.ino, i, b'a');
        }
        fs.release(a.ino);
        save(&fs, true, false);
        fs.unlink(ROOT_INO, OsStr::new("a")).unwrap();
        // The kernel forgets it: the inode and its slot go.
        fs.forget(a.ino, 1);
        let b = create(&fs, "b");
        write(&fs, b.ino, 1, b'b');
        fs.release(b.ino);
        let w = save(&fs, false, false);
        // Chunks 0 and 1 of slot 0 held a's pages; b (slot 0 again) is
        // written whole after them.
        assert_eq!(w.gone, vec![0, 1], "{w:?}");
        assert_eq!(w.pages, vec![(slot_page(0, 1), Some(b'b'))]);
    }
}
