//! Saving and loading the tree (file data is the store's to save):
//! [`Fs::save_meta`] and [`Fs::load`]; a save's tree, whole or a delta
//! against the last committed save's ([`Fs::save_tree`], META variant 1,
//! FORMAT.md), and the tree a chain of them builds ([`TreeRecords`]).
//!
//! The format is postcard over the mirror structs below, the version first.
//! They mirror rather than reuse the live structs so that the format changes
//! only on purpose: never reorder their fields or variants; bump
//! [`META_VERSION`] instead.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use ramd_store::persist::{TreeChain, TreeFn, TreeSave};
use ramd_store::{ExtentKind, Store, CHUNK_BYTES, PAGE_SIZE};
use serde::{Deserialize, Serialize};

use super::{
    base, check_name, check_xattr_name, name_cost, round_up, xattr_cost, Data, Entries, Fs,
    FsConfig, Ino, Inode, Kind, State, FILE_SHIFT, FL_SUPPORTED, INODE_COST, MAX_FILE_SIZE,
    MAX_SLOTS, ROOT_INO, XATTR_SIZE_MAX,
};

/// 2: [`SavedMeta`] is followed by [`SavedFlags`]; 1 (still read): not.
pub(crate) const META_VERSION: u32 = 2;

/// The chattr flags of the inodes that have any, by inode number: saved
/// after [`SavedMeta`] so that version 1 reads as a tree without flags.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(crate) struct SavedFlags {
    pub flags: Vec<(u64, u32)>,
}

/// The version of [`SavedDelta`]'s payload (META variant 1), first in it.
pub(crate) const DELTA_VERSION: u32 = 1;

/// A change to the tree of the saves before (META variant 1): the inodes
/// new or changed since, whole, and those gone. A directory's record holds
/// its entries, so a changed entry sends its directory's record.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SavedDelta<'a> {
    pub version: u32,
    pub next_ino: u64,
    pub next_slot: u64,
    /// Inodes of the tree before that are not in this one.
    pub gone: Vec<u64>,
    /// New or changed inodes with their chattr flags (0: none).
    pub inodes: Vec<(SavedInode<'a>, u32)>,
}

/// What the image's last committed save holds of the tree, as a save's
/// delta is made against it (see [`Fs::save_tree`]).
#[derive(Debug, Default)]
pub(crate) struct TreeSaved {
    /// Whether the rest is known (after a load or a save of this tree);
    /// else a save writes the whole tree.
    pub known: bool,
    /// The next inode and file slot numbers.
    pub next: (u64, u64),
    /// Per linked inode, the hash of its record and flags ([`record_hash`]).
    pub hashes: HashMap<u64, u128>,
}

/// A tree as saved records, the way a chain's META records build it: a
/// whole tree ([`TreeRecords::from_whole`]), then each save's change
/// ([`TreeRecords::apply_delta`]); [`TreeRecords::whole`] gives the
/// result as one whole tree, for [`Fs::load`]. Checks only that each
/// record decodes: the tree as a whole is checked when it is loaded.
#[derive(Debug, Clone, Default)]
pub struct TreeRecords {
    next_ino: u64,
    next_slot: u64,
    /// Per linked inode: its encoded [`SavedInode`] and its chattr flags.
    inodes: BTreeMap<u64, (Vec<u8>, u32)>,
}

fn encode<T: Serialize + ?Sized>(v: &T) -> Vec<u8> {
    postcard::to_stdvec(v).expect("serializing to a Vec cannot fail")
}

/// What tells a saved inode's record and flags from any other (128 bits:
/// a collision would leave a change unsaved).
fn record_hash(rec: &[u8], flags: u32) -> u128 {
    xxhash_rust::xxh3::xxh3_128_with_seed(rec, u64::from(flags))
}

/// A [`SavedDelta`]'s bytes from records already encoded.
fn delta_bytes<'a>(
    next: (u64, u64),
    gone: &[u64],
    changed: impl Iterator<Item = (&'a [u8], u32)>,
) -> Vec<u8> {
    let changed: Vec<_> = changed.collect();
    let mut out = encode(&(DELTA_VERSION, next.0, next.1, gone, changed.len()));
    for (rec, flags) in changed {
        out.extend_from_slice(rec);
        out.extend(encode(&flags));
    }
    out
}

/// A whole tree's bytes ([`SavedMeta`] then [`SavedFlags`]) from `n`
/// records already encoded, in inode number order, with their flags.
fn whole_bytes<'a>(
    next: (u64, u64),
    n: usize,
    records: impl Iterator<Item = (u64, &'a [u8], u32)>,
) -> Vec<u8> {
    let mut out = encode(&(META_VERSION, next.0, next.1, n));
    let mut flags = SavedFlags::default();
    for (ino, rec, f) in records {
        out.extend_from_slice(rec);
        if f != 0 {
            flags.flags.push((ino, f));
        }
    }
    out.extend(encode(&flags));
    out
}

/// The tree as a save's switch encodes it: every linked inode's record,
/// in inode number order, in one buffer. The switch holds every change
/// off, so it only encodes; hashing and comparing come after it.
struct Encoded {
    next_ino: u64,
    next_slot: u64,
    buf: Vec<u8>,
    /// Per inode: its number, where its record ends in `buf`, its flags.
    index: Vec<(u64, usize, u32)>,
}

impl Encoded {
    fn records(&self) -> impl Iterator<Item = (u64, &[u8], u32)> + '_ {
        let mut start = 0;
        self.index.iter().map(move |&(ino, end, f)| {
            let rec = &self.buf[start..end];
            start = end;
            (ino, rec, f)
        })
    }

    fn whole(&self) -> Vec<u8> {
        whole_bytes(
            (self.next_ino, self.next_slot),
            self.index.len(),
            self.records(),
        )
    }
}

impl TreeRecords {
    /// The records of a whole tree (META variant 0).
    pub fn from_whole(meta: &[u8]) -> std::result::Result<TreeRecords, String> {
        let (saved, flags) = decode_whole(meta)?;
        let mut inodes = BTreeMap::new();
        for s in &saved.inodes {
            if inodes.insert(s.ino, (encode(s), 0)).is_some() {
                return bad(format!("inode {}: saved twice", s.ino));
            }
        }
        for (ino, f) in flags.flags {
            match inodes.get_mut(&ino) {
                Some(r) => r.1 = f,
                None => return bad(format!("flags for inode {ino}, which was not saved")),
            }
        }
        Ok(TreeRecords {
            next_ino: saved.next_ino,
            next_slot: saved.next_slot,
            inodes,
        })
    }

    /// Applies a change (META variant 1), all or nothing; returns whether
    /// it changed anything.
    pub fn apply_delta(&mut self, delta: &[u8]) -> std::result::Result<bool, String> {
        let fail = |msg: String| bad(format!("a change to the tree: {msg}"));
        match postcard::take_from_bytes::<u32>(delta) {
            Ok((DELTA_VERSION, _)) => {}
            Ok((v, _)) => {
                return fail(format!(
                    "format version {v}, this ramd reads {DELTA_VERSION}"
                ))
            }
            Err(e) => return fail(format!("no format version: {e}")),
        }
        let (d, rest) = match postcard::take_from_bytes::<SavedDelta>(delta) {
            Ok(d) => d,
            Err(e) => return fail(format!("cannot decode: {e}")),
        };
        if !rest.is_empty() {
            return fail(format!("{} bytes after the end", rest.len()));
        }
        let mut seen = HashSet::new();
        for &ino in &d.gone {
            if !self.inodes.contains_key(&ino) {
                return fail(format!(
                    "removes inode {ino}, which the tree before it lacks"
                ));
            }
            if !seen.insert(ino) {
                return fail(format!("inode {ino} named twice"));
            }
        }
        for (s, _) in &d.inodes {
            if !seen.insert(s.ino) {
                return fail(format!("inode {} named twice", s.ino));
            }
        }
        let changed = !d.gone.is_empty()
            || !d.inodes.is_empty()
            || (d.next_ino, d.next_slot) != (self.next_ino, self.next_slot);
        for ino in d.gone {
            self.inodes.remove(&ino);
        }
        for (s, f) in d.inodes {
            self.inodes.insert(s.ino, (encode(&s), f));
        }
        self.next_ino = d.next_ino;
        self.next_slot = d.next_slot;
        Ok(changed)
    }

    /// The tree as one whole tree (META variant 0, [`META_VERSION`]).
    pub fn whole(&self) -> Vec<u8> {
        whole_bytes(
            (self.next_ino, self.next_slot),
            self.inodes.len(),
            self.inodes
                .iter()
                .map(|(&ino, (rec, f))| (ino, &rec[..], *f)),
        )
    }

    /// The whole tree a chain's META records build (`ramd_store`'s
    /// `TreeChain`: a whole tree and the changes after it).
    pub fn merge(chain: &TreeChain) -> std::result::Result<Vec<u8>, String> {
        if chain.deltas.is_empty() {
            return Ok(chain.whole.clone());
        }
        let mut t = TreeRecords::from_whole(&chain.whole)?;
        for (n, d) in chain.deltas.iter().enumerate() {
            t.apply_delta(d)
                .map_err(|e| format!("change {} after the whole tree: {e}", n + 1))?;
        }
        Ok(t.whole())
    }

    /// What a save's delta would be made against, were this the image's.
    fn saved(&self) -> TreeSaved {
        TreeSaved {
            known: true,
            next: (self.next_ino, self.next_slot),
            hashes: self
                .inodes
                .iter()
                .map(|(&ino, (rec, f))| (ino, record_hash(rec, *f)))
                .collect(),
        }
    }
}

/// A name, value or target: borrowed when saving, owned when loaded.
pub(crate) type Bytes<'a> = Cow<'a, [u8]>;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SavedMeta<'a> {
    pub version: u32,
    pub next_ino: u64,
    pub next_slot: u64,
    /// Linked inodes only (`nlink > 0`), by inode number.
    pub inodes: Vec<SavedInode<'a>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct SavedInode<'a> {
    pub ino: u64,
    pub kind: SavedKind,
    pub perm: u16,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u32,
    pub size: u64,
    /// atime, mtime, ctime, btime.
    pub times: [SavedTime; 4],
    pub xattrs: Vec<(Bytes<'a>, Bytes<'a>)>,
    pub data: SavedData<'a>,
}

/// Seconds and nanoseconds since the epoch; `nanos` always counts forward,
/// so 1969-12-31 23:59:59.5 is `(-1, 500_000_000)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SavedTime {
    pub secs: i64,
    pub nanos: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum SavedKind {
    File,
    Dir,
    Symlink,
    Fifo,
    Socket,
    CharDev,
    BlockDev,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) enum SavedData<'a> {
    File {
        slot: u64,
        pages: u64,
        alloc_end: u64,
    },
    Dir {
        parent: u64,
        entries: Vec<(Bytes<'a>, u64)>,
    },
    Symlink(Bytes<'a>),
    Special,
}

impl From<Kind> for SavedKind {
    fn from(k: Kind) -> SavedKind {
        match k {
            Kind::File => SavedKind::File,
            Kind::Dir => SavedKind::Dir,
            Kind::Symlink => SavedKind::Symlink,
            Kind::Fifo => SavedKind::Fifo,
            Kind::Socket => SavedKind::Socket,
            Kind::CharDev => SavedKind::CharDev,
            Kind::BlockDev => SavedKind::BlockDev,
        }
    }
}

impl From<SavedKind> for Kind {
    fn from(k: SavedKind) -> Kind {
        match k {
            SavedKind::File => Kind::File,
            SavedKind::Dir => Kind::Dir,
            SavedKind::Symlink => Kind::Symlink,
            SavedKind::Fifo => Kind::Fifo,
            SavedKind::Socket => Kind::Socket,
            SavedKind::CharDev => Kind::CharDev,
            SavedKind::BlockDev => Kind::BlockDev,
        }
    }
}

pub(crate) fn save_time(t: SystemTime) -> SavedTime {
    let (secs, nanos) = super::split_time(t);
    SavedTime { secs, nanos }
}

pub(crate) fn load_time(t: SavedTime) -> Option<SystemTime> {
    super::join_time(t.secs, t.nanos)
}

fn bytes(s: &OsStr) -> Cow<'_, [u8]> {
    Cow::Borrowed(s.as_bytes())
}

fn os(b: &[u8]) -> OsString {
    OsStr::from_bytes(b).to_owned()
}

/// An error about the saved tree, as load returns it.
fn bad<T>(msg: impl std::fmt::Display) -> std::result::Result<T, String> {
    Err(format!("filesystem metadata: {msg}"))
}

impl Fs {
    /// The saved record of linked inode `ino` of `st`.
    fn saved_inode<'a>(&self, st: &'a State, ino: Ino) -> SavedInode<'a> {
        let i = &st.inodes[&ino];
        // With a hot tier the kernel keeps a file's size and times.
        let a = self.hot_attr(i, ino);
        SavedInode {
            ino: ino.0,
            kind: i.kind.into(),
            perm: i.perm,
            nlink: i.nlink,
            uid: i.uid,
            gid: i.gid,
            rdev: i.rdev,
            size: a.size,
            times: [a.atime, a.mtime, a.ctime, a.btime].map(save_time),
            xattrs: i
                .xattrs
                .iter()
                .map(|(k, v)| (bytes(k), Cow::Borrowed(&v[..])))
                .collect(),
            data: match &i.data {
                &Data::File {
                    slot,
                    pages,
                    alloc_end,
                } => SavedData::File {
                    slot,
                    pages,
                    alloc_end,
                },
                Data::Dir { entries, parent } => SavedData::Dir {
                    parent: parent.0,
                    entries: entries.iter().map(|(k, &v)| (bytes(k), v.0)).collect(),
                },
                Data::Symlink(t) => SavedData::Symlink(bytes(t)),
                Data::Special => SavedData::Special,
            },
        }
    }

    /// The tree as it is now, encoded (see [`Encoded`]).
    fn encode_tree(&self) -> Encoded {
        let st = self.state.read();
        let mut inos: Vec<Ino> = st
            .inodes
            .iter()
            .filter(|(_, i)| i.nlink > 0)
            .map(|(&ino, _)| ino)
            .collect();
        inos.sort_unstable();
        let mut buf = Vec::new();
        let mut index = Vec::with_capacity(inos.len());
        for ino in inos {
            buf = postcard::to_extend(&self.saved_inode(&st, ino), buf)
                .expect("serializing to a Vec cannot fail");
            index.push((ino.0, buf.len(), st.inodes[&ino].flags));
        }
        Encoded {
            next_ino: st.next_ino,
            next_slot: st.next_slot,
            buf,
            index,
        }
    }

    /// The whole tree (every linked inode; never lookups, opens or handles)
    /// for [`Fs::load`]. The caller holds the store's gate exclusively, so
    /// no change is half done.
    pub fn save_meta(&self) -> Vec<u8> {
        self.encode_tree().whole()
    }

    /// The tree for a save (`Persister::set_meta`), in two steps: at the
    /// switch (the store's gate held), the tree is encoded; the function
    /// returned then makes the save's META from it: the whole tree for a
    /// full save (or when the tree the image holds is not known), else a
    /// delta against the tree of the last committed save, of the inodes
    /// whose record or flags differ from that save's, by hash, and those
    /// gone. What the image holds moves on only when the save commits.
    pub fn save_tree(self: &Arc<Self>, full: bool) -> TreeFn {
        let now = self.encode_tree();
        let fs = self.clone();
        Box::new(move || fs.tree_save(&now, full))
    }

    fn tree_save(self: Arc<Self>, now: &Encoded, full: bool) -> TreeSave {
        let hashes: HashMap<u64, u128> = now
            .records()
            .map(|(ino, rec, flags)| (ino, record_hash(rec, flags)))
            .collect();
        let next = (now.next_ino, now.next_slot);
        let saved = self.tree_saved.lock();
        let known = saved.known;
        let changed = !known
            || saved.next != next
            || saved.hashes.len() != hashes.len()
            || hashes.iter().any(|(i, h)| saved.hashes.get(i) != Some(h));
        let (bytes, delta) = if full || !known {
            (now.whole(), false)
        } else {
            let mut gone: Vec<u64> = saved
                .hashes
                .keys()
                .filter(|i| !hashes.contains_key(i))
                .copied()
                .collect();
            gone.sort_unstable();
            let changed_inodes = now
                .records()
                .filter(|(i, _, _)| saved.hashes.get(i) != hashes.get(i))
                .map(|(_, rec, f)| (rec, f));
            (delta_bytes(next, &gone, changed_inodes), true)
        };
        drop(saved);
        let committed = TreeSaved {
            known: true,
            next,
            hashes,
        };
        TreeSave {
            bytes,
            delta,
            changed,
            committed: Box::new(move || *self.tree_saved.lock() = committed),
        }
    }

    /// Takes `meta`, a whole tree, as the one the image holds (a load).
    fn tree_loaded(&self, meta: &[u8]) {
        if let Ok(t) = TreeRecords::from_whole(meta) {
            *self.tree_saved.lock() = t.saved();
        }
    }

    /// Rebuilds a filesystem from [`Fs::save_meta`]'s bytes on `store`,
    /// which already holds the file data. Checks everything first and
    /// changes nothing when it refuses. Then charges the tree's memory as
    /// creating it did, and trims data no file owns: files that were
    /// unlinked but open at the save, and anything past a file's end.
    /// Limits (`nr_inodes`, size) are not enforced on what was saved.
    pub fn load(store: Arc<Store>, cfg: FsConfig, meta: &[u8]) -> std::result::Result<Fs, String> {
        Self::decode(store, cfg, meta, true)
    }

    /// [`Fs::load`] of the tree a chain's META records build (`persist::load`
    /// returns them); also returns that tree, whole.
    pub fn load_chain(
        store: Arc<Store>,
        cfg: FsConfig,
        chain: &TreeChain,
    ) -> std::result::Result<(Fs, Vec<u8>), String> {
        let tree = TreeRecords::merge(chain)?;
        let fs = Self::load(store, cfg, &tree)?;
        Ok((fs, tree))
    }

    /// [`Fs::load`] of a tree whose file data is not in the store (a
    /// load into the hot tier, `--data-path kernel`).
    pub(super) fn load_tree(
        store: Arc<Store>,
        cfg: FsConfig,
        meta: &[u8],
    ) -> std::result::Result<Fs, String> {
        Self::decode(store, cfg, meta, false)
    }

    fn decode(
        store: Arc<Store>,
        cfg: FsConfig,
        meta: &[u8],
        data_in_store: bool,
    ) -> std::result::Result<Fs, String> {
        let (mut st, cost) = parse(meta)?;
        if let Err(e) = store.charge(cost) {
            return bad(format!(
                "the tree needs {cost} bytes of memory, more than the disk's max_memory leaves: {e}"
            ));
        }
        if data_in_store {
            if let Err(e) = settle_data(&store, &mut st) {
                store.uncharge(cost);
                return Err(e);
            }
        }
        let inodes = st.inodes.len() as u64;
        if inodes > cfg.nr_inodes {
            log::warn!(
                "the loaded filesystem has {inodes} inodes, more than nr_inodes ({}): \
                 creating more gives ENOSPC",
                cfg.nr_inodes
            );
        }
        let (used, limit) = store.pages_used();
        if data_in_store && used > limit {
            log::warn!(
                "the loaded filesystem holds {used} pages, more than its size allows ({limit}): \
                 writes that need pages give ENOSPC"
            );
        }
        let fs = Fs::with_state(store, cfg, st);
        fs.tree_cost.store(cost, Relaxed);
        fs.tree_loaded(meta);
        Ok(fs)
    }
}

/// A whole tree's records and flags, decoded (not checked).
fn decode_whole(meta: &[u8]) -> std::result::Result<(SavedMeta<'_>, SavedFlags), String> {
    // The version alone first, so that a newer format is named as such.
    let version = match postcard::take_from_bytes::<u32>(meta) {
        Ok((v @ (1 | META_VERSION), _)) => v,
        Ok((v, _)) => {
            return bad(format!(
                "format version {v}, this ramd reads {META_VERSION}"
            ))
        }
        Err(e) => return bad(format!("no format version: {e}")),
    };
    let (saved, rest) = match postcard::take_from_bytes::<SavedMeta>(meta) {
        Ok(m) => m,
        Err(e) => return bad(format!("cannot decode: {e}")),
    };
    let (flags, rest) = match version {
        1 => (SavedFlags::default(), rest),
        _ => match postcard::take_from_bytes::<SavedFlags>(rest) {
            Ok(f) => f,
            Err(e) => return bad(format!("cannot decode the inode flags: {e}")),
        },
    };
    if !rest.is_empty() {
        return bad(format!("{} bytes after the end", rest.len()));
    }
    Ok((saved, flags))
}

/// The live state [`Fs::save_meta`]'s bytes describe and the memory it
/// costs, checked whole; nothing is charged.
pub(super) fn parse(meta: &[u8]) -> std::result::Result<(State, u64), String> {
    let (saved, flags) = decode_whole(meta)?;
    let (mut st, cost) = rebuild(saved)?;
    for (ino, f) in flags.flags {
        let Some(inode) = st.inodes.get_mut(&Ino(ino)) else {
            return bad(format!("flags for inode {ino}, which was not saved"));
        };
        if f & !FL_SUPPORTED != 0 {
            return bad(format!(
                "inode {ino}: flags {f:#x} beyond chattr's {FL_SUPPORTED:#x}"
            ));
        }
        inode.flags = f;
    }
    Ok((st, cost))
}

/// The live state a saved tree describes, and the memory it costs, or why
/// the tree is not one that `Fs` could have built.
fn rebuild(saved: SavedMeta) -> std::result::Result<(State, u64), String> {
    if saved.next_ino <= ROOT_INO.0 {
        return bad(format!("next inode number {} is too low", saved.next_ino));
    }
    if saved.next_slot > MAX_SLOTS {
        return bad(format!("next file slot {} is too high", saved.next_slot));
    }
    let mut inodes: HashMap<Ino, Inode> = HashMap::with_capacity(saved.inodes.len());
    let mut slots = HashSet::new();
    let mut cost = 0u64;
    for s in saved.inodes {
        let ino = Ino(s.ino);
        let fail = |msg: String| format!("filesystem metadata: inode {ino}: {msg}");
        if s.ino == 0 || s.ino >= saved.next_ino {
            return Err(fail(format!("number not below next ({})", saved.next_ino)));
        }
        if inodes.contains_key(&ino) {
            return Err(fail("saved twice".into()));
        }
        let kind = Kind::from(s.kind);
        if s.perm & !0o7777 != 0 {
            return Err(fail(format!("mode bits {:o} beyond 07777", s.perm)));
        }
        if s.nlink == 0 {
            return Err(fail("no links".into()));
        }
        let mut times = [UNIX_EPOCH; 4];
        for (t, st) in times.iter_mut().zip(s.times) {
            *t = load_time(st).ok_or_else(|| fail(format!("bad time {st:?}")))?;
        }
        let mut xattrs = BTreeMap::new();
        for (name, value) in s.xattrs {
            let name = os(&name);
            if check_xattr_name(&name).is_err() || value.len() > XATTR_SIZE_MAX {
                return Err(fail(format!("bad xattr {name:?} ({} bytes)", value.len())));
            }
            cost += xattr_cost(&name, &value);
            if xattrs.insert(name.clone(), value.into_owned()).is_some() {
                return Err(fail(format!("xattr {name:?} twice")));
            }
        }
        let size_ok = match (&s.data, kind) {
            (SavedData::File { .. }, Kind::File) => s.size <= MAX_FILE_SIZE + 1,
            (SavedData::Dir { .. }, Kind::Dir) => s.size == 0,
            (SavedData::Symlink(t), Kind::Symlink) => s.size == t.len() as u64,
            (SavedData::Special, Kind::Fifo | Kind::Socket | Kind::CharDev | Kind::BlockDev) => {
                s.size == 0
            }
            _ => return Err(fail(format!("kind {kind:?} with data of another kind"))),
        };
        if !size_ok {
            return Err(fail(format!("size {} impossible for a {kind:?}", s.size)));
        }
        let data = match s.data {
            SavedData::File {
                slot,
                pages,
                alloc_end,
            } => {
                if slot >= saved.next_slot {
                    return Err(fail(format!(
                        "slot {slot} not below next ({})",
                        saved.next_slot
                    )));
                }
                if !slots.insert(slot) {
                    return Err(fail(format!("slot {slot} owned by another file too")));
                }
                if alloc_end > MAX_FILE_SIZE + 1 {
                    return Err(fail(format!(
                        "allocated up to {alloc_end}, past the largest file"
                    )));
                }
                Data::File {
                    slot,
                    pages,
                    alloc_end,
                }
            }
            SavedData::Dir { parent, entries } => {
                let mut map = Entries::new();
                for (name, child) in entries {
                    let name = os(&name);
                    if check_name(&name).is_err() {
                        return Err(fail(format!("bad entry name {name:?}")));
                    }
                    cost += name_cost(&name);
                    if map.insert(name.clone(), Ino(child)).is_some() {
                        return Err(fail(format!("entry {name:?} twice")));
                    }
                }
                Data::Dir {
                    entries: map,
                    parent: Ino(parent),
                }
            }
            SavedData::Symlink(t) => {
                if t.len() >= libc::PATH_MAX as usize {
                    return Err(fail(format!("symlink target of {} bytes", t.len())));
                }
                cost += t.len() as u64;
                Data::Symlink(os(&t))
            }
            SavedData::Special => Data::Special,
        };
        cost += INODE_COST;
        let [atime, mtime, ctime, btime] = times;
        inodes.insert(
            ino,
            Inode {
                kind,
                perm: s.perm,
                nlink: s.nlink,
                uid: s.uid,
                gid: s.gid,
                rdev: s.rdev,
                size: s.size,
                atime,
                mtime,
                ctime,
                btime,
                xattrs,
                // The kernel holds the root without a lookup (as `Fs::new`);
                // it knows nothing else of a new mount.
                lookups: u64::from(ino == ROOT_INO),
                flags: 0,
                opens: 0,
                cache: Default::default(),
                data,
                cold: Default::default(),
            },
        );
    }
    check_tree(&inodes)?;
    // Slots past the highest in use are free anyway: no need to list them.
    let next_slot = slots.iter().max().map_or(0, |s| s + 1);
    let free_slots = (0..next_slot)
        .rev()
        .filter(|s| !slots.contains(s))
        .collect();
    let st = State {
        inodes,
        next_ino: saved.next_ino,
        free_slots,
        next_slot,
        linkable: Default::default(),
    };
    Ok((st, cost))
}

/// That the inodes form one tree under the root with the link counts `Fs`
/// keeps: every entry names an inode, a directory is listed once (in its
/// parent) and has 2 + subdirectories links, anything else one link per
/// entry, and everything is reachable from the root.
fn check_tree(inodes: &HashMap<Ino, Inode>) -> std::result::Result<(), String> {
    match inodes.get(&ROOT_INO).map(|r| &r.data) {
        None => return bad("no root directory"),
        Some(Data::Dir { parent, .. }) if *parent == ROOT_INO => {}
        Some(Data::Dir { parent, .. }) => return bad(format!("the root's parent is {parent}")),
        Some(_) => return bad("the root is not a directory"),
    }
    let mut refs: HashMap<Ino, u64> = HashMap::new();
    for (&ino, inode) in inodes {
        let Data::Dir { entries, .. } = &inode.data else {
            continue;
        };
        let mut subdirs = 0u64;
        for (name, &child) in entries {
            let Some(c) = inodes.get(&child) else {
                return bad(format!(
                    "directory {ino}: entry {name:?} names inode {child}, which was not saved"
                ));
            };
            if child == ROOT_INO {
                return bad(format!("directory {ino}: entry {name:?} names the root"));
            }
            *refs.entry(child).or_default() += 1;
            if let Data::Dir { parent, .. } = c.data {
                if parent != ino {
                    return bad(format!(
                        "directory {child} is listed in {ino} as {name:?} but its parent is {parent}"
                    ));
                }
                subdirs += 1;
            }
        }
        if u64::from(inode.nlink) != 2 + subdirs {
            return bad(format!(
                "directory {ino} has {} links for {subdirs} subdirectories",
                inode.nlink
            ));
        }
    }
    for (&ino, inode) in inodes {
        let n = refs.get(&ino).copied().unwrap_or(0);
        match inode.kind {
            Kind::Dir if ino == ROOT_INO => {}
            Kind::Dir if n != 1 => return bad(format!("directory {ino} is listed {n} times")),
            Kind::Dir => {}
            _ if u64::from(inode.nlink) != n => {
                return bad(format!(
                    "inode {ino} has {} links but {n} entries",
                    inode.nlink
                ))
            }
            _ => {}
        }
    }
    // Each directory has one parent, so only a cycle can be cut off.
    let mut seen = HashSet::from([ROOT_INO]);
    let mut todo = VecDeque::from([ROOT_INO]);
    while let Some(ino) = todo.pop_front() {
        if let Data::Dir { entries, .. } = &inodes[&ino].data {
            for &child in entries.values() {
                if seen.insert(child) {
                    todo.push_back(child);
                }
            }
        }
    }
    if seen.len() != inodes.len() {
        let mut lost: Vec<_> = inodes.keys().filter(|i| !seen.contains(i)).collect();
        lost.sort_unstable();
        return bad(format!(
            "directories cut off from the root (a cycle): {:?}",
            &lost[..lost.len().min(8)]
        ));
    }
    Ok(())
}

/// Trims store data that no loaded file owns, and recounts each file's
/// pages from what is left (the store's data is the truth for st_blocks).
fn settle_data(store: &Store, st: &mut State) -> std::result::Result<(), String> {
    // Per slot: where the file's data may end (relative), and its pages.
    let mut files: HashMap<u64, (u64, u64)> = HashMap::new();
    for inode in st.inodes.values() {
        if let Data::File {
            slot, alloc_end, ..
        } = inode.data
        {
            files.insert(slot, (round_up(alloc_end).max(round_up(inode.size)), 0));
        }
    }
    let per_chunk = (CHUNK_BYTES / PAGE_SIZE as u64) as usize;
    let trim_failed = |at, len, e| bad(format!("trimming {len} bytes at {at}: {e}"));
    for off in store.data_chunks() {
        let end = off + CHUNK_BYTES.min(store.size().saturating_sub(off));
        let slot = off >> FILE_SHIFT;
        // Data below `keep` is the file's; the rest of the chunk goes.
        let keep = match files.get_mut(&slot) {
            None => off,
            Some((file_end, pages)) => {
                let keep = (base(slot) + *file_end).clamp(off, end);
                if keep > off {
                    let extents = store
                        .extents(off, keep - off, per_chunk)
                        .or_else(|e| bad(format!("mapping {off}: {e}")))?;
                    *pages += extents
                        .iter()
                        .filter(|e| e.kind != ExtentKind::Hole)
                        .map(|e| e.length / PAGE_SIZE as u64)
                        .sum::<u64>();
                }
                keep
            }
        };
        if keep < end {
            // Before any client: the gate is free, and the trim is tracked
            // like any change (the image still holds those pages).
            store
                .change()
                .trim(keep, end - keep)
                .or_else(|e| trim_failed(keep, end - keep, e))?;
        }
    }
    let mut differ = 0;
    for inode in st.inodes.values_mut() {
        if let Data::File {
            slot,
            ref mut pages,
            ..
        } = inode.data
        {
            let counted = files[&slot].1;
            if *pages != counted {
                differ += 1;
                *pages = counted;
            }
        }
    }
    if differ > 0 {
        log::warn!("{differ} loaded files had a block count other than their data's: recounted");
    }
    Ok(())
}
