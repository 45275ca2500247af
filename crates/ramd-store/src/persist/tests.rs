use std::cell::Cell;
use std::fs::{self, OpenOptions};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use crate::sys::PAGE_SIZE;

use super::format::{Buf, DiskKind, Record, DIO_ALIGN, MANIFEST, REC_HEADER, SEG_HEADER};
use super::image_dir::{object_name, save_file, save_object, ImageDir};
use super::load::{load, Progress};
use super::manifest::Manifest;
use super::policy::Persister;
use super::reader::*;
use super::remote::upload_marker;
use super::writer::{open_direct, write_block};

/// Writes O_DIRECT refuses (a few bytes from unaligned memory at an
/// unaligned offset) go through the page cache instead, and land.
#[test]
fn refused_direct_writes_go_through_the_page_cache() {
    let path = std::env::temp_dir().join(format!("ramd-dio-test-{}", std::process::id()));
    let open = |direct: bool| {
        let mut o = OpenOptions::new();
        o.write(true).create(true).truncate(true);
        if direct {
            o.custom_flags(libc::O_DIRECT);
        }
        o.open(&path)
    };
    let (f, mut direct) = match open(true) {
        Ok(f) => (f, true),
        Err(_) => (open(false).unwrap(), false),
    };
    let mut block = Buf::with_capacity(DIO_ALIGN, DIO_ALIGN);
    block.resize(DIO_ALIGN, 7);
    write_block(&f, &mut direct, &block, 0).unwrap();
    write_block(&f, &mut direct, b"abc", DIO_ALIGN as u64).unwrap();
    write_block(&f, &mut direct, b"de", DIO_ALIGN as u64 + 3).unwrap();
    if on_ext4(&path) {
        assert!(!direct, "ext4 took an unaligned O_DIRECT write");
    }
    drop(f);
    let got = fs::read(&path).unwrap();
    fs::remove_file(&path).unwrap();
    assert_eq!(got.len(), DIO_ALIGN + 5);
    assert!(got[..DIO_ALIGN].iter().all(|&b| b == 7));
    assert_eq!(&got[DIO_ALIGN..], b"abcde");
}

/// The reader hands over a file exactly, across block boundaries and
/// with a length that is not a multiple of a block, and stops cleanly
/// when dropped part way.
#[test]
fn ahead_reader_reads_files_exactly() {
    let path = std::env::temp_dir().join(format!("ramd-ahead-test-{}", std::process::id()));
    let data: Vec<u8> = (0..READ_BLOCK * 2 + 12345)
        .map(|i| (i * 7 + i / 4096) as u8)
        .collect();
    fs::write(&path, &data).unwrap();
    let reader = || {
        let (f, direct) = open_direct(&path, OpenOptions::new().read(true)).unwrap();
        AheadReader::start(f, direct, data.len() as u64).unwrap()
    };
    // Taken in runs that straddle its blocks, as the parser takes records.
    let piece = 100_003;
    let mut got = Vec::new();
    let mut r = InPlace::new(reader());
    while got.len() < data.len() {
        let n = piece.min(data.len() - got.len());
        got.extend_from_slice(r.take(n).unwrap());
    }
    assert!(
        got == data,
        "read {} bytes, not the file's {}",
        got.len(),
        data.len()
    );
    let end = r.take(1).map(|b| b.len());
    assert_eq!(
        end.map_err(|e| e.kind()),
        Err(std::io::ErrorKind::UnexpectedEof),
        "bytes past the file's end"
    );
    let mut r = InPlace::new(reader());
    assert!(*r.take(piece).unwrap() == data[..piece]);
    drop(r);
    fs::remove_file(&path).unwrap();
}

/// Whether `path` is on ext4, which refuses unaligned O_DIRECT writes.
fn on_ext4(path: &Path) -> bool {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: statfs into a zeroed struct we own.
    unsafe {
        let mut st: libc::statfs = std::mem::zeroed();
        libc::statfs(c.as_ptr(), &mut st) == 0 && st.f_type == 0xEF53
    }
}

/// Segments of records of every size, with batches sent at random
/// points (so partial blocks carry over at every offset), read back
/// exactly; the MANIFEST's length is the records', without padding.
#[test]
fn segments_round_trip_whatever_their_record_sizes() {
    for seed in 0u64..40 {
        let dir = std::env::temp_dir().join(format!("ramd-seg-test-{}-{seed}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut img = ImageDir::open(&dir).unwrap();
        let mut w = img
            .begin_segment(1, true, DiskKind::Block, 1 << 30)
            .unwrap();
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut rnd = move || rng.u64(..);
        let mut want: Vec<Vec<u8>> = Vec::new();
        let mut bytes = SEG_HEADER as u64;
        for i in 0..50 + rnd() % 400 {
            let len = match rnd() % 4 {
                0 => 0,
                1 => rnd() % 20,
                2 => rnd() % 9000,
                _ => rnd() % 300_000,
            } as usize;
            let data: Vec<u8> = (0..len).map(|j| (j as u64 ^ i ^ seed) as u8 | 1).collect();
            w.meta(&data, false).unwrap();
            bytes += (REC_HEADER + len.next_multiple_of(8)) as u64;
            want.push(data);
            match rnd() % 5 {
                0 => w.send(false).unwrap(),
                1 => w.write_out().unwrap(),
                _ => {}
            }
        }
        let entry = w.finish().unwrap();
        assert_eq!(entry.bytes, bytes + REC_HEADER as u64, "seed {seed}");
        img.commit(DiskKind::Block, 1 << 30, entry).unwrap();
        let mut got = Vec::new();
        img.read_chain(
            |r| {
                if let Record::Meta(m) = r {
                    got.push(m.to_vec());
                }
                Ok(())
            },
            |_, _| {},
        )
        .unwrap();
        assert!(got == want, "seed {seed}: records differ");
        fs::remove_dir_all(&dir).unwrap();
    }
}

/// A fresh directory for test `name`'s image (gone if it was there).
fn fresh_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("ramd-{name}-test-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    dir
}

/// A store of `size` bytes that tracks changes, as a saved disk's does.
fn tracked_store(size: u64) -> crate::Store {
    crate::Store::new(crate::StoreConfig {
        host_reserve: 0,
        track_changes: true,
        ..crate::StoreConfig::new(size)
    })
    .unwrap()
}

/// A save that the chain's length would make full, with nothing changed,
/// writes nothing and leaves no page marked for a save: the next save
/// starts clean (its switch asserts that none is) and the image loads as
/// the disk is.
#[test]
fn a_compaction_with_nothing_changed_leaves_no_page_marked() {
    let dir = fresh_dir("compact");
    let size = 1 << 20;
    let store = Arc::new(tracked_store(size));
    let p = Persister::new(
        store.clone(),
        ImageDir::open(&dir).unwrap(),
        DiskKind::Block,
        size,
        None,
        false,
    );
    let page = |b: u8| vec![b; PAGE_SIZE];
    // The incremental save is as large as the full one: the chain is
    // "large", so the next save would be a full one.
    store.write(0, &page(1)).unwrap();
    assert!(p.save(false).unwrap().full);
    store.write(0, &page(2)).unwrap();
    assert!(!p.save(false).unwrap().full);
    let nothing = p.save(false).unwrap();
    assert_eq!((nothing.pages, nothing.bytes), (0, 0), "{nothing:?}");
    store.write(PAGE_SIZE as u64, &page(3)).unwrap();
    p.save(false).unwrap();
    p.close();

    let loaded = tracked_store(size);
    let image = ImageDir::open_existing(&dir).unwrap();
    let total = image.manifest().unwrap().bytes();
    let mut seen = Vec::new();
    load(&image, &loaded, &mut |p| seen.push(p)).unwrap();
    // The load reports its bytes as they are read, up to the whole image,
    // then once that it is done.
    assert_eq!(seen.last(), Some(&Progress::Done), "{seen:?}");
    let read: Vec<(u64, u64)> = seen[..seen.len() - 1]
        .iter()
        .map(|p| match *p {
            Progress::Read { done, total } => (done, total),
            Progress::Done => panic!("Done before the end: {seen:?}"),
        })
        .collect();
    assert!(read.windows(2).all(|w| w[0].0 <= w[1].0), "{seen:?}");
    assert!(read.iter().all(|&(_, t)| t == total), "{seen:?}");
    assert_eq!(read.last().map(|r| r.0), Some(total), "{seen:?}");
    let mut got = vec![0u8; 2 * PAGE_SIZE];
    loaded.read(0, &mut got).unwrap();
    assert_eq!(got[..PAGE_SIZE], page(2)[..]);
    assert_eq!(got[PAGE_SIZE..], page(3)[..]);
    fs::remove_dir_all(&dir).unwrap();
}

/// A compaction commits the changes as an incremental save first, then
/// the full save: the chain it replaces ends with those changes (a standby
/// sees them before the full save is written), and both are restorable.
#[test]
fn a_compaction_commits_the_changes_before_the_full_save() {
    let dir = fresh_dir("compact2");
    let size = 1 << 20;
    let store = Arc::new(tracked_store(size));
    let mut image = ImageDir::open(&dir).unwrap();
    image.set_keep_saves(Some(std::time::Duration::from_secs(3600)));
    let p = Persister::new(store.clone(), image, DiskKind::Block, size, None, false);
    let page = |b: u8| vec![b; PAGE_SIZE];
    store.write(0, &page(1)).unwrap();
    assert!(p.save(false).unwrap().full);
    // As large as the full save: the chain is "large".
    store.write(0, &page(2)).unwrap();
    assert!(!p.save(false).unwrap().full);
    store.write(PAGE_SIZE as u64, &page(3)).unwrap();
    let compaction = p.save(false).unwrap();
    assert!(compaction.full, "{compaction:?}");
    assert_eq!(compaction.seq, 4, "save 3 is the changes: {compaction:?}");
    assert_eq!(p.status().saves, 3 + 1, "{:?}", p.status());
    p.close();

    let image = ImageDir::open_existing(&dir).unwrap();
    let m = image.manifest().unwrap();
    assert_eq!(m.chain.iter().map(|s| s.seq).collect::<Vec<_>>(), [4]);
    let old = image.as_of(3).unwrap();
    let seqs: Vec<(u64, bool)> = old.chain.iter().map(|s| (s.seq, s.full)).collect();
    assert_eq!(seqs, [(1, true), (2, false), (3, false)]);
    // Save 3 alone holds the change (one page), not the whole disk.
    assert_eq!(old.chain[2].pages, 1, "{old:?}");
    fs::remove_dir_all(&dir).unwrap();
}

/// Debris is recognised by name: a directory's save files, an object
/// store's segment objects, and nothing else in either.
#[test]
fn debris_names_are_exactly_the_saves_own() {
    for name in [
        "seg-00000001",
        "seg-00000012.tmp",
        "MANIFEST.tmp",
        "seg-123456789",
    ] {
        assert!(save_file(name), "{name}");
        assert!(!save_object(name), "{name}");
    }
    let object = object_name(3, 0x18eb_9d31_b88e_5c1b);
    assert_eq!(object, "seg-00000003-18eb9d31b88e5c1b");
    assert!(save_object(&object) && !save_file(&object));
    let marker = upload_marker(&object);
    assert_eq!(marker, "seg-00000003-18eb9d31b88e5c1b.upload");
    assert!(save_object(&marker) && !save_file(&marker));
    for name in [
        "seg-00000003.upload",
        "seg-00000003-18eb9d31b88e5c1b.upload.upload",
        "MANIFEST",
        "LEASE",
        "seg-1",
        "seg-0000001x",
        "seg-00000003-18eb9d31b88e5c1",
        "seg-00000003-18eb9d31b88e5c1g",
        "notes.txt",
    ] {
        assert!(!save_file(name) && !save_object(name), "{name}");
    }
}

/// A MANIFEST `text` (without its checksum line) with the checksum added.
fn with_crc(text: &str) -> String {
    format!("{text}crc32c {:08x}\n", crc32c::crc32c(text.as_bytes()))
}

/// Version 1 (no id) and version 2 (an id) both read; an id line where
/// its version says none, none where it says one, or a malformed one is
/// refused.
#[test]
fn manifest_versions_and_the_id_line() {
    let p = Path::new("MANIFEST");
    let seg = "seg 1 full pages=1 records=1 bytes=128 time=5\n";
    let id = "0f8c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f";
    let v1 = with_crc(&format!("ramd image 1\nkind block\nsize 4096\n{seg}"));
    let m = Manifest::decode(p, v1.as_bytes()).unwrap();
    assert_eq!(m.id, None);
    // Written again as it was read: still version 1, byte for byte.
    assert_eq!(m.encode(), v1);
    let v2 = with_crc(&format!(
        "ramd image 2\nkind block\nsize 4096\nid {id}\n{seg}"
    ));
    let m = Manifest::decode(p, v2.as_bytes()).unwrap();
    assert_eq!(m.id.unwrap().to_string(), id);
    assert_eq!(m.encode(), v2);
    for (bad, why) in [
        (
            format!("ramd image 1\nkind block\nsize 4096\nid {id}\n{seg}"),
            "unknown line",
        ),
        (
            format!("ramd image 2\nkind block\nsize 4096\n{seg}"),
            "no id line",
        ),
        (
            format!("ramd image 2\nkind block\nsize 4096\nid x\n{seg}"),
            "bad id",
        ),
        (
            format!("ramd image 2\nid {id}\nkind block\nsize 4096\nid {id}\n{seg}"),
            "unknown line",
        ),
        (
            format!("ramd image 3\nkind block\nsize 4096\nid {id}\n{seg}"),
            "newer version",
        ),
    ] {
        let err = Manifest::decode(p, with_crc(&bad).as_bytes())
            .expect_err(&bad)
            .to_string();
        assert!(err.contains(why), "{bad:?}: {err}");
    }
}

/// A version 1 image opened for saving gets an id written at once (the
/// same chain), which every later open and save keeps, a full save too;
/// opening it for reading changes nothing.
#[test]
fn an_image_keeps_its_id_and_an_old_one_gets_one() {
    let dir = std::env::temp_dir().join(format!("ramd-id-test-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let save = |img: &mut ImageDir, full: bool| {
        let seq = img.next_seq();
        let mut w = img
            .begin_segment(seq, full, DiskKind::Block, 1 << 20)
            .unwrap();
        w.meta(b"x", false).unwrap();
        let e = w.finish().unwrap();
        img.commit(DiskKind::Block, 1 << 20, e).unwrap();
    };
    let mut img = ImageDir::open(&dir).unwrap();
    save(&mut img, true);
    let id = img.id();
    assert_eq!(img.manifest().unwrap().id, Some(id));
    drop(img);
    // Made version 1 again, as an older ramd wrote it.
    let path = dir.join(MANIFEST);
    let mut m = Manifest::decode(&path, &fs::read(&path).unwrap()).unwrap();
    m.id = None;
    fs::write(&path, m.encode()).unwrap();
    let before = fs::read(&path).unwrap();
    let ro = ImageDir::open_existing(&dir).unwrap();
    assert_eq!(ro.manifest().unwrap().id, None);
    drop(ro);
    assert_eq!(
        fs::read(&path).unwrap(),
        before,
        "a reader changed the MANIFEST"
    );

    let img = ImageDir::open(&dir).unwrap();
    let given = img.id();
    assert_ne!(given, id);
    assert_eq!(img.manifest().unwrap().id, Some(given));
    let text = fs::read_to_string(&path).unwrap();
    assert!(text.starts_with("ramd image 2\n"), "{text}");
    assert!(text.contains(&format!("\nid {given}\n")), "{text}");
    assert_eq!(
        text.lines().filter(|l| l.starts_with("seg ")).count(),
        1,
        "{text}"
    );
    drop(img);
    let mut img = ImageDir::open(&dir).unwrap();
    assert_eq!(img.id(), given);
    save(&mut img, false);
    save(&mut img, true);
    assert_eq!(img.manifest().unwrap().chain.len(), 1);
    drop(img);
    assert_eq!(
        ImageDir::open_existing(&dir)
            .unwrap()
            .manifest()
            .unwrap()
            .id,
        Some(given)
    );
    fs::remove_dir_all(&dir).unwrap();
}

/// A byte string handed over in pieces cut at given lengths (a GET's
/// body chunks), for `InPlace`; `left` counts the pieces not yet handed
/// out, `back` those handed back.
struct Cut {
    pieces: std::collections::VecDeque<Vec<u8>>,
    left: Rc<Cell<usize>>,
    back: Rc<Cell<usize>>,
}

impl Cut {
    fn new(bytes: &[u8], mut len: impl FnMut() -> usize) -> Cut {
        let mut pieces = std::collections::VecDeque::new();
        let mut at = 0;
        while at < bytes.len() {
            let n = len().min(bytes.len() - at);
            pieces.push_back(bytes[at..at + n].to_vec());
            at += n;
        }
        let left = Rc::new(Cell::new(pieces.len()));
        Cut {
            pieces,
            left,
            back: Rc::default(),
        }
    }
}

impl Pieces for Cut {
    type Piece = Vec<u8>;

    fn next_piece(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        let p = self.pieces.pop_front();
        self.left.set(self.pieces.len());
        Ok(p)
    }

    fn done_with(&mut self, _piece: Vec<u8>) {
        self.back.set(self.back.get() + 1);
    }
}

/// A segment of every record kind (raw and compressed pages, fills,
/// holes, frames' neighbours GONE, trees of odd lengths), its bytes, the
/// image's MANIFEST and the segment's entry; the image directory is
/// removed.
fn mixed_segment(name: &str) -> (Vec<u8>, Manifest, super::manifest::SegEntry) {
    let dir = std::env::temp_dir().join(format!("ramd-{name}-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    let mut img = ImageDir::open(&dir).unwrap();
    let size = 64 << 20;
    let mut w = img.begin_segment(1, true, DiskKind::Block, size).unwrap();
    let mut rng = fastrand::Rng::with_seed(23);
    for page in 0..600u64 {
        let data: Vec<u8> = (0..PAGE_SIZE).map(|_| rng.u8(..)).collect();
        match page % 7 {
            0 => w.page(page, crate::store::PageRef::Fill(page * 0x0101)),
            1 => w.page(page, crate::store::PageRef::Hole),
            2 => w.page(
                page,
                crate::store::PageRef::Packed {
                    zstd: true,
                    data: &data[..1 + rng.usize(..3000)],
                },
            ),
            3 => w.gone(page),
            // Whole trees and tree deltas (META variants 0 and 1).
            4 => w
                .meta(&data[..rng.usize(..PAGE_SIZE)], page % 2 == 1)
                .unwrap(),
            _ => w.page(
                page,
                crate::store::PageRef::Raw {
                    data: &data,
                    hot: page % 2 == 0,
                },
            ),
        }
    }
    let entry = w.finish().unwrap();
    img.commit(DiskKind::Block, size, entry.clone()).unwrap();
    let bytes = fs::read(img.seg_path(entry.seq)).unwrap();
    let m = img.manifest().unwrap().clone();
    fs::remove_dir_all(&dir).unwrap();
    (bytes, m, entry)
}

/// Each record as `parse_source` hands it over, in order.
fn records_of(
    src: &mut impl Source,
    len: u64,
    m: &Manifest,
    seg: &super::manifest::SegEntry,
) -> crate::error::Result<Vec<String>> {
    let mut got = Vec::new();
    parse_source(
        Path::new("seg"),
        src,
        len,
        m,
        seg,
        &mut |r| {
            got.push(format!("{r:?}"));
            Ok(())
        },
        &mut |_| {},
    )?;
    Ok(got)
}

/// The offset of each record of a segment, and the END record's.
fn record_offsets(bytes: &[u8]) -> Vec<usize> {
    let mut at = SEG_HEADER;
    let mut offsets = Vec::new();
    while at < bytes.len() {
        offsets.push(at);
        let plen = u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()) as usize;
        at += REC_HEADER + plen.next_multiple_of(8);
    }
    offsets
}

/// Records parsed in place from pieces cut anywhere (inside headers and
/// payloads, one byte long, empty, exactly a record long, larger than
/// many records) are the records parsed from the whole segment at once,
/// and every piece is handed back.
#[test]
fn records_parse_the_same_however_the_bytes_are_cut() {
    let (bytes, m, seg) = mixed_segment("inplace-test");
    let len = bytes.len() as u64;
    let whole = records_of(
        &mut InPlace::new(Cut::new(&bytes, || bytes.len())),
        len,
        &m,
        &seg,
    )
    .unwrap();
    let through_a_buffer = {
        let mut got = Vec::new();
        parse_segment(
            Path::new("seg"),
            &bytes[..],
            len,
            &m,
            &seg,
            &mut |r| {
                got.push(format!("{r:?}"));
                Ok(())
            },
            &mut |_| {},
        )
        .unwrap();
        got
    };
    assert_eq!(whole.len(), 600);
    assert!(
        whole == through_a_buffer,
        "in place and through a buffer differ"
    );
    let fixed = [0, 1, 7, 31, 32, 33, 4095, 4096, 4128, 4129, 65536];
    for seed in 0..60u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut len_of = move || match seed {
            0..11 => fixed[seed as usize].max(1),
            _ => match rng.u8(..4) {
                0 => 0,
                1 => rng.usize(1..40),
                2 => rng.usize(4000..4200),
                _ => rng.usize(..100_000),
            },
        };
        let cut = Cut::new(&bytes, &mut len_of);
        let (pieces, left, back) = (cut.pieces.len(), cut.left.clone(), cut.back.clone());
        let got = records_of(&mut InPlace::new(cut), len, &m, &seg).unwrap();
        assert!(got == whole, "seed {seed}: records differ");
        assert_eq!(left.get(), 0, "seed {seed}: pieces left");
        // The piece the parser read last may still be its own.
        assert!(
            pieces - back.get() <= 1,
            "seed {seed}: {} of {pieces} pieces handed back",
            back.get()
        );
    }
}

/// A record damaged where a piece ends, or cut short there, fails the
/// parse naming that record's offset, whichever piece the damage is in.
#[test]
fn damage_where_a_piece_ends_names_the_record() {
    let (bytes, m, seg) = mixed_segment("inplace-damage-test");
    let len = bytes.len() as u64;
    let offsets = record_offsets(&bytes);
    let mut tried = 0;
    for (k, &at) in offsets.iter().enumerate().skip(1).step_by(5) {
        let next = offsets.get(k + 1).copied().unwrap_or(bytes.len());
        if next - at == REC_HEADER {
            continue; // no payload
        }
        tried += 1;
        for flip in [at + 2, at + REC_HEADER, next - 1] {
            let mut bad = bytes.clone();
            bad[flip] ^= 0x40;
            // Pieces end at the damaged byte, before it and after it.
            for cut in [flip, flip + 1, flip - 1] {
                let mut first = true;
                let cuts = Cut::new(&bad, || match std::mem::take(&mut first) {
                    true => cut,
                    false => 4099,
                });
                let err = records_of(&mut InPlace::new(cuts), len, &m, &seg).unwrap_err();
                match err {
                    crate::error::Error::Image { offset, reason, .. } => {
                        assert_eq!(offset, at as u64, "byte {flip}, cut at {cut}: {reason}");
                        assert!(reason.contains("checksum mismatch"), "{reason}");
                    }
                    e => panic!("byte {flip}, cut at {cut}: {e}"),
                }
            }
        }
        // Cut short inside the record: the pieces end there.
        for end in [at + 1, at + REC_HEADER, next - 1] {
            let short = &bytes[..end];
            let mut first = true;
            let cuts = Cut::new(short, || match std::mem::take(&mut first) {
                true => at,
                false => 5000,
            });
            let err = records_of(&mut InPlace::new(cuts), len, &m, &seg).unwrap_err();
            match err {
                crate::error::Error::Image { offset, reason, .. } => {
                    assert_eq!(offset, at as u64, "cut short at {end}: {reason}");
                    assert!(
                        reason.contains("runs past the end") || reason.contains("without its END"),
                        "{reason}"
                    );
                }
                e => panic!("cut short at {end}: {e}"),
            }
        }
    }
    assert!(tried > 20, "{tried} records tried");
}
