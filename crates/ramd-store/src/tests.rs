//! Engine tests: every operation checked against a plain `Vec<u8>` model.

use crate::*;

const MIB: u64 = 1 << 20;

fn store(size: u64) -> Store {
    Store::new(StoreConfig {
        host_reserve: 0,
        ..StoreConfig::new(size)
    })
    .unwrap()
}

/// Deterministic test data: a seeded fastrand, so that a failure
/// reproduces with the same seed.
struct Rng(fastrand::Rng);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(fastrand::Rng::with_seed(seed))
    }
    fn next(&mut self) -> u64 {
        self.0.u64(..)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.0.u64(..n)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        std::iter::repeat_with(|| self.0.u8(..)).take(n).collect()
    }
}

/// The identity `StoreStats` documents: memory used is what pages take
/// stored, allocator slack, metadata and pages kept for a save.
fn memory_adds_up(st: &StoreStats) -> bool {
    st.memory_used == st.stored_bytes + st.slack_bytes + st.metadata_bytes + st.kept_bytes
}

fn read_all(s: &Store) -> Vec<u8> {
    let mut buf = vec![0xEE; s.size() as usize];
    s.read(0, &mut buf).unwrap();
    buf
}

#[test]
fn fresh_disk_reads_zero_and_costs_nothing() {
    let s = store(4 * MIB + 123);
    assert!(read_all(&s).iter().all(|&b| b == 0));
    let st = s.stats();
    assert_eq!((st.memory_used, st.chunks, st.used_bytes), (0, 0, 0));
    assert_eq!(
        s.extents(0, s.size(), 16).unwrap(),
        vec![Extent {
            length: s.size(),
            kind: ExtentKind::Hole
        }]
    );
}

#[test]
fn unaligned_write_across_chunks_round_trips() {
    let s = store(8 * MIB);
    let mut rng = Rng::new(7);
    let data = rng.bytes(3 * MIB as usize + 777);
    let off = 2 * MIB - 1001; // straddles the first chunk boundary
    s.write(off, &data).unwrap();
    let mut back = vec![0; data.len()];
    s.read(off, &mut back).unwrap();
    assert_eq!(back, data);
    let all = read_all(&s);
    assert!(all[..off as usize].iter().all(|&b| b == 0));
    assert!(all[off as usize + data.len()..].iter().all(|&b| b == 0));
}

#[test]
fn same_filled_and_zero_pages_cost_no_page_memory() {
    let s = store(4 * MIB);
    let pattern: Vec<u8> = (0..PAGE_SIZE)
        .map(|i| [1, 2, 3, 4, 5, 6, 7, 8][i % 8])
        .collect();
    for p in 0..64u64 {
        s.write(p * PAGE_SIZE as u64, &pattern).unwrap();
    }
    s.write(MIB, &vec![0; MIB as usize]).unwrap();
    let st = s.stats();
    assert_eq!(st.data_pages, 0);
    assert_eq!(st.fill_pages, 64);
    assert_eq!(st.zero_pages, 256);
    assert_eq!(st.memory_used, st.chunks * CHUNK_META_BYTES);
    let mut back = vec![0; PAGE_SIZE * 64];
    s.read(0, &mut back).unwrap();
    assert_eq!(back, pattern.repeat(64));
    // A partial write that agrees with the pattern allocates nothing...
    s.write(3, &pattern[3..20]).unwrap();
    assert_eq!(s.stats().data_pages, 0);
    // ...one that does not splits the page, and reads stay right.
    s.write(5, &[0xFF; 3]).unwrap();
    assert_eq!(s.stats().data_pages, 1);
    let mut page = vec![0; PAGE_SIZE];
    s.read(0, &mut page).unwrap();
    let mut expect = pattern.clone();
    expect[5..8].fill(0xFF);
    assert_eq!(page, expect);
    // Writing the pattern back makes it a fill page again.
    s.write(5, &pattern[5..8]).unwrap();
    assert_eq!(s.stats().data_pages, 0);
}

#[test]
fn trim_and_zero_free_page_memory() {
    let s = store(16 * MIB);
    let mut rng = Rng::new(3);
    s.write(0, &rng.bytes(16 * MIB as usize)).unwrap();
    let full = s.stats();
    assert_eq!(full.data_pages, 4096);
    assert_eq!(
        full.memory_used,
        16 * MIB + 16 * MIB / CHUNK_BYTES * CHUNK_META_BYTES
    );
    s.trim(0, 8 * MIB).unwrap();
    s.zero(8 * MIB, 8 * MIB, false).unwrap();
    let st = s.stats();
    assert_eq!(st.data_pages, 0);
    assert_eq!(st.zero_pages, 2048);
    assert_eq!(st.memory_used, 8 * MIB / CHUNK_BYTES * CHUNK_META_BYTES);
    assert!(read_all(&s).iter().all(|&b| b == 0));
    assert_eq!(
        s.extents(0, 16 * MIB, 16).unwrap(),
        vec![
            Extent {
                length: 8 * MIB,
                kind: ExtentKind::Hole
            },
            Extent {
                length: 8 * MIB,
                kind: ExtentKind::Zero
            }
        ]
    );
    s.trim(0, 16 * MIB).unwrap();
    assert_eq!(s.stats().memory_used, 0);
    // Freed frames went to the pool: part kept warm, the rest released.
    let pool = s.stats().pool;
    assert_eq!(pool.warm_bytes + pool.cold_bytes, 16 * MIB);
}

#[test]
fn max_memory_gives_enospc_and_keeps_data() {
    let limit = MIB + MIB / CHUNK_BYTES * CHUNK_META_BYTES;
    let s = Store::new(StoreConfig {
        max_memory: Some(limit),
        host_reserve: 0,
        ..StoreConfig::new(64 * MIB)
    })
    .unwrap();
    let mut rng = Rng::new(11);
    let first = rng.bytes(MIB as usize);
    s.write(0, &first).unwrap();
    let err = s.write(MIB, &rng.bytes(PAGE_SIZE)).unwrap_err();
    assert_eq!(err.errno(), crate::Errno::ENOSPC, "{err}");
    let err = s.write(0, &rng.bytes(10)).map(|_| ());
    assert!(err.is_ok(), "overwriting an existing page needs no memory");
    let mut back = vec![0; MIB as usize];
    s.read(10, &mut back[10..]).unwrap();
    assert_eq!(back[10..], first[10..]);
    assert!(s.stats().memory_used <= limit);
    // Same-filled data still fits on a full disk: it costs no page memory.
    s.write(0, &vec![0; PAGE_SIZE]).unwrap();
    // And trimming makes room again.
    s.trim(0, MIB).unwrap();
    s.write(MIB, &rng.bytes(PAGE_SIZE)).unwrap();
}

#[test]
fn out_of_range_is_einval_and_changes_nothing() {
    let s = store(MIB);
    let e = s.write(MIB - 1, &[1, 2]).unwrap_err();
    assert_eq!(e.errno(), crate::Errno::EINVAL);
    assert!(s.read(u64::MAX, &mut [0; 2]).is_err());
    assert!(s.trim(1, u64::MAX).is_err());
    assert!(s.extents(MIB, 1, 1).is_err());
    assert_eq!(s.stats().memory_used, 0);
    s.read(MIB, &mut []).unwrap();
}

#[test]
fn edge_of_range_disk() {
    let s = store(MAX_SIZE);
    let end = MAX_SIZE - 5000;
    s.write(end, &[9; 5000]).unwrap();
    let mut back = [0; 5000];
    s.read(end, &mut back).unwrap();
    assert_eq!(back, [9; 5000]);
    let ext = s.extents(MAX_SIZE - (1 << 32), 1 << 32, 8).unwrap();
    assert_eq!(ext.last().unwrap().kind, ExtentKind::Data);
    assert_eq!(ext.iter().map(|e| e.length).sum::<u64>(), 1 << 32);
    assert!(Store::new(StoreConfig::new(MAX_SIZE + 1)).is_err());
}

#[test]
fn extents_respect_max_and_merge() {
    let s = store(MIB);
    for p in (0..256u64).step_by(2) {
        s.write(p * PAGE_SIZE as u64, &[1; PAGE_SIZE]).unwrap();
    }
    let ext = s.extents(0, MIB, 10).unwrap();
    assert_eq!(ext.len(), 10);
    assert_eq!(ext[0].kind, ExtentKind::Data);
    assert_eq!(ext[1].kind, ExtentKind::Hole);
    let ext = s.extents(100, 8192, 100).unwrap();
    assert_eq!(ext.iter().map(|e| e.length).sum::<u64>(), 8192);
}

#[test]
fn random_operations_match_model() {
    let size = 6 * MIB + 333;
    let s = store(size);
    let mut model = vec![0u8; size as usize];
    let mut rng = Rng::new(0xC0FFEE);
    for _ in 0..3000 {
        let off = rng.below(size);
        let len = rng.below((size - off).min(3 * PAGE_SIZE as u64 + 100)) + 1;
        let (o, l) = (off as usize, len as usize);
        match rng.below(6) {
            0 | 1 => {
                let d = rng.bytes(l);
                model[o..o + l].copy_from_slice(&d);
                s.write(off, &d).unwrap();
            }
            2 => {
                let b = rng.next() as u8;
                model[o..o + l].fill(b);
                s.write(off, &vec![b; l]).unwrap();
            }
            3 => {
                model[o..o + l].fill(0);
                s.zero(off, len, rng.below(2) == 0).unwrap();
            }
            4 => {
                model[o..o + l].fill(0);
                s.trim(off, len).unwrap();
            }
            _ => {
                let mut b = vec![0; l];
                s.read(off, &mut b).unwrap();
                assert_eq!(b, model[o..o + l], "read at {off} len {len}");
            }
        }
    }
    assert_eq!(read_all(&s), model);
    // Extents agree with the model: holes and zeros read as zero.
    let mut pos = 0usize;
    for e in s.extents(0, size, usize::MAX).unwrap() {
        if e.kind != ExtentKind::Data {
            assert!(model[pos..pos + e.length as usize].iter().all(|&b| b == 0));
        }
        pos += e.length as usize;
    }
    assert_eq!(pos as u64, size);
    let st = s.stats();
    assert_eq!(
        st.memory_used,
        st.data_pages * PAGE_SIZE as u64 + st.chunks * CHUNK_META_BYTES
    );
}

#[test]
fn concurrent_writers_and_readers() {
    let s = std::sync::Arc::new(store(32 * MIB));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut rng = Rng::new(t + 1);
                // Each thread owns every 4th page, so results are checkable.
                for _ in 0..4000 {
                    let page = rng.below(2048) * 4 + t;
                    let fill = (page as u8) ^ (t as u8 + 1);
                    let off = page * PAGE_SIZE as u64;
                    s.write(off, &[fill; PAGE_SIZE]).unwrap();
                    s.write(off + 100, &rng.bytes(50)).unwrap();
                    s.write(off + 100, &[fill; 50]).unwrap();
                    let mut b = [0; PAGE_SIZE];
                    s.read(off, &mut b).unwrap();
                    assert!(b.iter().all(|&x| x == fill));
                    if rng.below(4) == 0 {
                        s.trim(off, PAGE_SIZE as u64).unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let st = s.stats();
    assert_eq!(
        st.memory_used,
        st.data_pages * PAGE_SIZE as u64 + st.chunks * CHUNK_META_BYTES
    );
}

#[test]
fn page_limit_caps_non_hole_pages() {
    let s = Store::new(StoreConfig {
        page_limit: Some(4),
        host_reserve: 0,
        ..StoreConfig::new(MIB)
    })
    .unwrap();
    let mut rng = Rng::new(5);
    s.write(0, &rng.bytes(2 * PAGE_SIZE)).unwrap();
    s.write(2 * PAGE_SIZE as u64, &[0; PAGE_SIZE]).unwrap(); // zero page counts
    s.zero(3 * PAGE_SIZE as u64, PAGE_SIZE as u64, false)
        .unwrap();
    assert_eq!(s.pages_used(), (4, 4));
    let e = s.write(8 * PAGE_SIZE as u64, &rng.bytes(10)).unwrap_err();
    assert_eq!(e.errno(), crate::Errno::ENOSPC, "{e}");
    assert!(s
        .zero(9 * PAGE_SIZE as u64, PAGE_SIZE as u64, false)
        .is_err());
    // Rewriting pages in use is fine; so is a partial write of zeros to a hole.
    s.write(10, &rng.bytes(100)).unwrap();
    s.write(20 * PAGE_SIZE as u64, &[0; 10]).unwrap();
    s.trim(0, PAGE_SIZE as u64).unwrap();
    assert_eq!(s.pages_used(), (3, 4));
    s.write(8 * PAGE_SIZE as u64, &rng.bytes(10)).unwrap();
}

#[test]
fn set_limits_grows_and_shrinks_only_to_what_fits() {
    let s = Store::new(StoreConfig {
        page_limit: Some(4),
        max_memory: Some(MIB),
        host_reserve: 0,
        ..StoreConfig::new(MIB)
    })
    .unwrap();
    let mut rng = Rng::new(7);
    s.write(0, &rng.bytes(4 * PAGE_SIZE)).unwrap();
    assert!(s.write(4 * PAGE_SIZE as u64, &rng.bytes(10)).is_err());
    s.set_limits(Some(8), 2 * MIB).unwrap();
    assert_eq!((s.pages_used(), s.max_memory()), ((4, 8), 2 * MIB));
    s.write(4 * PAGE_SIZE as u64, &rng.bytes(2 * PAGE_SIZE))
        .unwrap();
    // Below the 6 pages in use, or the memory they take: refused, unchanged.
    let e = s.set_limits(Some(5), 2 * MIB).unwrap_err().to_string();
    assert!(e.contains("6 pages"), "{e}");
    let e = s
        .set_limits(Some(8), 4 * PAGE_SIZE as u64)
        .unwrap_err()
        .to_string();
    assert!(e.contains("max_memory"), "{e}");
    assert_eq!((s.pages_used(), s.max_memory()), ((6, 8), 2 * MIB));
    s.set_limits(Some(6), MIB).unwrap();
    assert!(s.write(6 * PAGE_SIZE as u64, &rng.bytes(10)).is_err());
    s.set_limits(None, MIB).unwrap();
    s.write(6 * PAGE_SIZE as u64, &rng.bytes(10)).unwrap();
}

#[test]
fn charges_count_against_max_memory() {
    let s = Store::new(StoreConfig {
        max_memory: Some(2 * PAGE_SIZE as u64 + CHUNK_META_BYTES),
        host_reserve: 0,
        ..StoreConfig::new(MIB)
    })
    .unwrap();
    s.charge(PAGE_SIZE as u64).unwrap();
    s.write(0, &[1; 10]).unwrap();
    assert!(s.charge(1).is_err());
    assert!(s.write(PAGE_SIZE as u64, &[1; 10]).is_err());
    s.uncharge(PAGE_SIZE as u64);
    s.write(PAGE_SIZE as u64, &[1; 10]).unwrap();
    assert_eq!(s.stats().metadata_bytes, CHUNK_META_BYTES);
}

#[test]
fn counted_ops_report_page_deltas_and_allocate_keeps_data() {
    let s = store(4 * MIB);
    let mut pages = 0i64;
    s.write_prefix(100, &[7; 3 * PAGE_SIZE], &mut pages)
        .1
        .unwrap();
    assert_eq!(pages, 4);
    s.allocate(0, 8 * PAGE_SIZE as u64, &mut pages).unwrap();
    assert_eq!(pages, 8);
    let mut b = [0; PAGE_SIZE];
    s.read(100, &mut b).unwrap();
    assert_eq!(b, [7; PAGE_SIZE], "allocate must not clobber data");
    s.zero_counted(0, 2 * MIB, true, &mut pages).unwrap();
    assert_eq!(pages, 0);
    assert_eq!(s.stats().chunks, 0);
}

#[test]
fn failed_allocate_gives_back_what_it_took() {
    let s = Store::new(StoreConfig {
        page_limit: Some(10),
        host_reserve: 0,
        ..StoreConfig::new(MIB)
    })
    .unwrap();
    let p = PAGE_SIZE as u64;
    s.write(3 * p, &[5; PAGE_SIZE]).unwrap();
    let mut pages = 0;
    let e = s.allocate(0, 20 * p, &mut pages).unwrap_err();
    assert_eq!(e.errno(), crate::Errno::ENOSPC);
    assert_eq!(pages, 0);
    assert_eq!(s.pages_used(), (1, 10));
    let mut b = [0; PAGE_SIZE];
    s.read(3 * p, &mut b).unwrap();
    assert_eq!(b, [5; PAGE_SIZE]);
    s.allocate(0, 10 * p, &mut pages).unwrap();
    assert_eq!(s.pages_used(), (10, 10));
}

#[test]
fn write_prefix_says_what_was_stored() {
    let s = Store::new(StoreConfig {
        page_limit: Some(2),
        host_reserve: 0,
        ..StoreConfig::new(MIB)
    })
    .unwrap();
    let mut pages = 0;
    let data: Vec<u8> = (0..4 * PAGE_SIZE).map(|i| (i % 241) as u8).collect();
    let (done, r) = s.write_prefix(100, &data, &mut pages);
    assert!(r.is_err());
    // Page 0 from byte 100, then page 1 whole: page 2 fails.
    assert_eq!(done, 2 * PAGE_SIZE - 100);
    assert_eq!(pages, 2);
    let mut back = vec![0; done];
    s.read(100, &mut back).unwrap();
    assert_eq!(back, data[..done]);
}

/// Compression: every codec and mode checked against the same model.
mod compressed {
    use super::*;
    use std::time::Duration;

    /// One millisecond: every background pass ages pages past it.
    const SOON: Duration = Duration::from_millis(1);

    fn cfg(size: u64, compress: &str) -> StoreConfig {
        StoreConfig {
            host_reserve: 0,
            compress: compress.parse().unwrap(),
            ..StoreConfig::new(size)
        }
    }

    /// The modes worth telling apart: inline per-page compression with each
    /// codec, hot/cold tiering, and idle pages re-packed into frames.
    fn configs(size: u64) -> Vec<(&'static str, StoreConfig)> {
        vec![
            ("lz4", cfg(size, "lz4")),
            ("zstd:1", cfg(size, "zstd:1")),
            ("zstd:19", cfg(size, "zstd:19")),
            (
                "lz4 tiered",
                StoreConfig {
                    compress_after: SOON,
                    ..cfg(size, "lz4")
                },
            ),
            (
                "lz4 + zstd frames",
                StoreConfig {
                    recompress: Codec::Zstd(3),
                    idle_after: SOON,
                    ..cfg(size, "lz4")
                },
            ),
            (
                "tiered zstd + frames",
                StoreConfig {
                    compress_after: SOON,
                    recompress: Codec::Zstd(5),
                    idle_after: SOON,
                    ..cfg(size, "zstd:1")
                },
            ),
            (
                "none + frames",
                StoreConfig {
                    recompress: Codec::Lz4,
                    idle_after: SOON,
                    ..cfg(size, "none")
                },
            ),
        ]
    }

    /// Text-like bytes: words from a small vocabulary, as logs and sources are.
    fn text(rng: &mut Rng, n: usize) -> Vec<u8> {
        const WORDS: [&str; 12] = [
            "page ", "disk ", "ramd ", "zstd ", "the ", "of ", "memory ", "block\n", "{ ", "} ",
            "fn ", "0x1f ",
        ];
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(WORDS[rng.below(12) as usize].as_bytes());
        }
        v.truncate(n);
        v
    }

    /// Machine code and tables: this test binary's own bytes.
    fn binary(rng: &mut Rng, n: usize) -> Vec<u8> {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let at = rng.below((exe.len() - n) as u64) as usize;
        exe[at..at + n].to_vec()
    }

    fn assert_adds_up(s: &Store) {
        let st = s.stats();
        assert!(memory_adds_up(&st), "{st:?}");
        assert_eq!(
            st.data_pages,
            st.hot_pages + st.incompressible_pages + st.compressed_pages + st.frame_pages,
            "{st:?}"
        );
        assert!(st.memory_used <= st.max_memory, "{st:?}");
    }

    #[test]
    fn every_codec_round_trips_every_kind_of_page() {
        for (name, cfg) in configs(4 * MIB) {
            let s = Store::new(cfg).unwrap();
            let mut rng = Rng::new(42);
            let pattern: Vec<u8> = (0..PAGE_SIZE).map(|i| (i % 8) as u8 + 1).collect();
            let pages: Vec<Vec<u8>> = vec![
                rng.bytes(PAGE_SIZE),
                vec![0; PAGE_SIZE],
                pattern,
                text(&mut rng, PAGE_SIZE),
                binary(&mut rng, PAGE_SIZE),
                text(&mut rng, PAGE_SIZE),
            ];
            for (k, p) in pages.iter().enumerate() {
                s.write((k * PAGE_SIZE) as u64, p).unwrap();
            }
            for _ in 0..3 {
                s.background_pass_all();
            }
            // Twice: the first read of a tiered disk promotes pages to raw.
            for _ in 0..2 {
                for (k, p) in pages.iter().enumerate() {
                    let mut b = vec![0; PAGE_SIZE];
                    s.read((k * PAGE_SIZE) as u64, &mut b).unwrap();
                    assert!(&b == p, "{name}: page {k}");
                }
            }
            let st = s.stats();
            assert_eq!((st.zero_pages, st.fill_pages), (1, 1), "{name}: {st:?}");
            assert_eq!(st.data_pages, 4, "{name}: {st:?}");
            assert_adds_up(&s);
        }
    }

    #[test]
    fn inline_compression_stores_less_and_keeps_noise_raw() {
        let s = Store::new(cfg(8 * MIB, "lz4")).unwrap();
        let mut rng = Rng::new(9);
        s.write(0, &text(&mut rng, 4 * MIB as usize)).unwrap();
        s.write(4 * MIB, &rng.bytes(MIB as usize)).unwrap();
        let st = s.stats();
        assert_eq!(st.compressed_pages, 1024, "{st:?}");
        assert_eq!(st.incompressible_pages, 256, "{st:?}");
        assert!(st.stored_bytes < 3 * MIB + MIB / 2, "{st:?}");
        assert!(st.ratio > 1.4, "{st:?}");
        assert!(st.compress_time_ns > 0);
        assert_adds_up(&s);
    }

    #[test]
    fn random_operations_match_model_in_every_mode() {
        for (name, cfg) in configs(3 * MIB + 333) {
            let size = cfg.size;
            let s = Store::new(cfg).unwrap();
            let mut model = vec![0u8; size as usize];
            let mut rng = Rng::new(0xFEED);
            for step in 0..2500 {
                let off = rng.below(size);
                let len = rng.below((size - off).min(3 * PAGE_SIZE as u64 + 100)) + 1;
                let (o, l) = (off as usize, len as usize);
                match rng.below(8) {
                    0 => {
                        let d = rng.bytes(l);
                        model[o..o + l].copy_from_slice(&d);
                        s.write(off, &d).unwrap();
                    }
                    1 | 2 => {
                        let d = text(&mut rng, l);
                        model[o..o + l].copy_from_slice(&d);
                        s.write(off, &d).unwrap();
                    }
                    3 => {
                        let b = rng.next() as u8;
                        model[o..o + l].fill(b);
                        s.write(off, &vec![b; l]).unwrap();
                    }
                    4 => {
                        model[o..o + l].fill(0);
                        s.zero(off, len, rng.below(2) == 0).unwrap();
                    }
                    5 => {
                        model[o..o + l].fill(0);
                        s.trim(off, len).unwrap();
                    }
                    _ => {
                        let mut b = vec![0; l];
                        s.read(off, &mut b).unwrap();
                        assert!(b == model[o..o + l], "{name}: read at {off} len {len}");
                    }
                }
                if step % 97 == 0 {
                    s.background_pass_all();
                    assert_adds_up(&s);
                }
            }
            assert!(read_all(&s) == model, "{name}");
            for _ in 0..3 {
                s.background_pass_all();
            }
            assert!(read_all(&s) == model, "{name} after passes");
            assert_adds_up(&s);
        }
    }

    #[test]
    fn concurrent_writers_readers_and_scanner() {
        for (name, cfg) in configs(16 * MIB) {
            let s = std::sync::Arc::new(Store::new(cfg).unwrap());
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let scanner = {
                let (s, stop) = (s.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        s.background_pass_all();
                    }
                })
            };
            let threads: Vec<_> = (0..3u64)
                .map(|t| {
                    let s = s.clone();
                    std::thread::spawn(move || {
                        let mut rng = Rng::new(t + 100);
                        // Each thread owns every 3rd page; pages share chunks,
                        // zspages and frames with the other threads' pages.
                        let mut mine = std::collections::HashMap::new();
                        for _ in 0..1500 {
                            let page = rng.below(1024) * 3 + t;
                            let off = page * PAGE_SIZE as u64;
                            let mut d = text(&mut rng, PAGE_SIZE);
                            s.write(off, &d).unwrap();
                            let at = rng.below(4000) as usize;
                            let patch = text(&mut rng, 90);
                            d[at..at + 90].copy_from_slice(&patch);
                            s.write(off + at as u64, &patch).unwrap();
                            mine.insert(page, d);
                            let probe = *mine
                                .keys()
                                .nth(rng.below(mine.len() as u64) as usize)
                                .unwrap();
                            let mut b = vec![0; PAGE_SIZE];
                            s.read(probe * PAGE_SIZE as u64, &mut b).unwrap();
                            assert!(b == mine[&probe], "page {probe}");
                            if rng.below(8) == 0 {
                                s.trim(off, PAGE_SIZE as u64).unwrap();
                                mine.insert(page, vec![0; PAGE_SIZE]);
                            }
                        }
                        mine
                    })
                })
                .collect();
            let mut all = Vec::new();
            for t in threads {
                all.push(t.join().unwrap());
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            scanner.join().unwrap();
            for mine in all {
                for (page, d) in mine {
                    let mut b = vec![0; PAGE_SIZE];
                    s.read(page * PAGE_SIZE as u64, &mut b).unwrap();
                    assert!(b == d, "{name}: page {page}");
                }
            }
            assert_adds_up(&s);
        }
    }

    #[test]
    fn enospc_at_max_memory_after_compression() {
        let limit = 2 * MIB;
        let s = Store::new(StoreConfig {
            max_memory: Some(limit),
            ..cfg(64 * MIB, "lz4")
        })
        .unwrap();
        let mut rng = Rng::new(77);
        let mut written = 0u64;
        let err = loop {
            let d = text(&mut rng, MIB as usize);
            match s.write(written, &d) {
                Ok(()) => written += MIB,
                Err(e) => break e,
            }
        };
        assert_eq!(err.errno(), crate::Errno::ENOSPC, "{err}");
        assert!(
            written >= 3 * MIB,
            "only {written} bytes of text fit in {limit}"
        );
        // What was written before the failure is intact; memory is in bounds.
        let mut rng = Rng::new(77);
        for k in 0..written / MIB {
            let mut b = vec![0; MIB as usize];
            s.read(k * MIB, &mut b).unwrap();
            assert!(b == text(&mut rng, MIB as usize), "MiB {k}");
        }
        assert_adds_up(&s);
        // Incompressible data hits the limit too, and keeps the old page.
        let e = s.write(0, &rng.bytes(PAGE_SIZE * 64)).unwrap_err();
        assert_eq!(e.errno(), crate::Errno::ENOSPC);
        assert_adds_up(&s);
    }

    #[test]
    fn a_tiered_disk_full_of_hot_pages_compresses_them_to_make_room() {
        for recompress in [Codec::None, Codec::Zstd(3)] {
            let s = Store::new(StoreConfig {
                max_memory: Some(4 * MIB),
                compress_after: Duration::from_secs(3600),
                recompress,
                ..cfg(64 * MIB, "lz4")
            })
            .unwrap();
            let mut rng = Rng::new(21);
            let mut written = 0;
            while s.write(written, &text(&mut rng, PAGE_SIZE)).is_ok() {
                written += PAGE_SIZE as u64;
            }
            let full = s.stats();
            assert!(full.hot_pages > 0, "{full:?}");
            // Memory pressure makes pages due regardless of age; the
            // background headroom lets the first compressed copies exist.
            let r = s.background_pass_all();
            assert!(!r.starved, "{r:?}");
            let st = s.stats();
            assert_eq!(st.hot_pages, 0, "{st:?}");
            assert!(st.memory_used < full.memory_used * 2 / 3, "{st:?}");
            s.write(written, &text(&mut rng, PAGE_SIZE)).unwrap();
            assert_adds_up(&s);
        }
    }

    #[test]
    fn a_full_disk_still_takes_overwrites_of_its_raw_pages() {
        let s = Store::new(StoreConfig {
            max_memory: Some(2 * MIB),
            ..cfg(64 * MIB, "lz4")
        })
        .unwrap();
        let mut rng = Rng::new(3);
        let mut pages = 0u64;
        while s
            .write(pages * PAGE_SIZE as u64, &rng.bytes(PAGE_SIZE))
            .is_ok()
        {
            pages += 1;
        }
        // Compressible data over incompressible pages: a zspage may not
        // fit any more, but the page's own frame does.
        let mut expect = Vec::new();
        for p in 0..pages {
            let d = text(&mut rng, PAGE_SIZE);
            s.write(p * PAGE_SIZE as u64, &d).unwrap();
            expect.extend_from_slice(&d);
        }
        let mut back = vec![0; expect.len()];
        s.read(0, &mut back).unwrap();
        assert!(back == expect);
        assert_adds_up(&s);
    }

    #[test]
    fn idle_pages_are_repacked_into_frames_and_split_when_rewritten() {
        let s = Store::new(StoreConfig {
            recompress: Codec::Zstd(3),
            idle_after: SOON,
            ..cfg(8 * MIB, "lz4")
        })
        .unwrap();
        let mut rng = Rng::new(5);
        let data = text(&mut rng, 4 * MIB as usize);
        s.write(0, &data).unwrap();
        let before = s.stats();
        s.background_pass_all();
        let r = s.background_pass_all();
        assert!(r.repacked >= 1000, "{r:?}");
        let after = s.stats();
        assert_eq!(after.frame_pages, 1024, "{after:?}");
        assert_eq!(after.frames, 64, "{after:?}");
        assert_eq!(after.idle_pages, 1024, "{after:?}");
        assert!(
            after.memory_used < before.memory_used,
            "{before:?} {after:?}"
        );
        assert_eq!(read_all(&s)[..data.len()], data[..]);
        // Rewrite 12 pages of the first frame: it is split on the next pass.
        let new = text(&mut rng, 12 * PAGE_SIZE);
        s.write(0, &new).unwrap();
        let r = s.background_pass_all();
        assert_eq!(r.split, 1, "{r:?}");
        let mut b = vec![0; 16 * PAGE_SIZE];
        s.read(0, &mut b).unwrap();
        assert!(b[..new.len()] == new[..]);
        assert!(b[new.len()..] == data[new.len()..16 * PAGE_SIZE]);
        assert_eq!(s.stats().frames, 63);
        assert_adds_up(&s);
    }

    #[test]
    fn compaction_moves_objects_and_returns_zspages() {
        let s = Store::new(cfg(32 * MIB, "lz4")).unwrap();
        let mut rng = Rng::new(1);
        let data = text(&mut rng, 16 * MIB as usize);
        s.write(0, &data).unwrap();
        let full = s.stats();
        // Free three pages of every four: zspages stay, mostly empty.
        for p in 0..4096u64 {
            if p % 4 != 0 {
                s.trim(p * PAGE_SIZE as u64, PAGE_SIZE as u64).unwrap();
            }
        }
        let sparse = s.stats();
        assert!(sparse.slack_bytes > sparse.stored_bytes, "{sparse:?}");
        let r = s.background_pass_all();
        assert!(r.moved > 0, "{r:?}");
        let packed = s.stats();
        assert!(packed.zspages * 2 < sparse.zspages, "{sparse:?} {packed:?}");
        assert!(packed.slack_bytes < packed.stored_bytes / 3, "{packed:?}");
        assert!(packed.memory_used < full.memory_used / 3);
        for p in (0..4096u64).step_by(4) {
            let mut b = vec![0; PAGE_SIZE];
            s.read(p * PAGE_SIZE as u64, &mut b).unwrap();
            let at = (p * PAGE_SIZE as u64) as usize;
            assert!(b == data[at..at + PAGE_SIZE], "page {p}");
        }
        assert_adds_up(&s);
    }

    #[test]
    fn tiering_keeps_hot_pages_raw_and_promotes_what_is_read() {
        let s = Store::new(StoreConfig {
            compress_after: SOON,
            ..cfg(8 * MIB, "zstd")
        })
        .unwrap();
        let mut rng = Rng::new(8);
        let data = text(&mut rng, 2 * MIB as usize);
        s.write(0, &data).unwrap();
        assert_eq!(s.stats().hot_pages, 512);
        // First pass ages, second compresses (compress_after is one pass).
        s.background_pass_all();
        s.background_pass_all();
        let st = s.stats();
        assert_eq!((st.hot_pages, st.compressed_pages), (0, 512), "{st:?}");
        // One read leaves pages compressed (a backup or scrub must not
        // blow the disk back up); a second one before the next pass
        // promotes them.
        let mut b = vec![0; 256 * 1024];
        s.read(0, &mut b).unwrap();
        assert!(b == data[..b.len()]);
        assert_eq!(s.stats().hot_pages, 0);
        s.read(0, &mut b).unwrap();
        assert!(b == data[..b.len()]);
        assert_eq!(s.stats().hot_pages, 64);
        assert_adds_up(&s);
    }

    #[test]
    fn bad_codecs_name_the_valid_ones() {
        for bad in ["gzip", "zstd:99", "lz4:2"] {
            let e = bad.parse::<Codec>().unwrap_err().to_string();
            assert!(e.contains("lz4") && e.contains("zstd"), "{e}");
        }
        let e = Store::new(StoreConfig {
            compress_after: SOON,
            ..cfg(MIB, "none")
        });
        assert!(e.is_err());
    }
}

/// Review: stress tests of the page table, allocator and background pass
/// racing with clients, each checked against a per-page model.
mod review {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed as R};
    use std::sync::{Arc, Mutex, MutexGuard};
    use std::time::Duration;

    const SOON: Duration = Duration::from_millis(1);
    const P: usize = PAGE_SIZE;

    /// Requests per client thread: `REVIEW_SCALE` times `n` (1 by default).
    fn ops(n: usize) -> usize {
        n * std::env::var("REVIEW_SCALE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1)
    }

    fn text(rng: &mut Rng, n: usize) -> Vec<u8> {
        const WORDS: [&str; 12] = [
            "page ", "disk ", "ramd ", "zstd ", "the ", "of ", "memory ", "block\n", "{ ", "} ",
            "fn ", "0x1f ",
        ];
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(WORDS[rng.below(12) as usize].as_bytes());
        }
        v.truncate(n);
        v
    }

    /// A page of one of several kinds: text, noise, half and half (so
    /// objects land in many size classes), byte fills, zeros, 8-byte patterns.
    fn page_data(rng: &mut Rng) -> Vec<u8> {
        match rng.below(8) {
            0 | 1 => text(rng, P),
            2 => rng.bytes(P),
            3 | 4 => {
                let mut v = text(rng, P);
                let k = rng.below(P as u64) as usize;
                let noise = rng.bytes(P - k);
                v[k..].copy_from_slice(&noise);
                v
            }
            5 => vec![rng.next() as u8; P],
            6 => vec![0; P],
            _ => rng.next().to_ne_bytes().repeat(P / 8),
        }
    }

    fn data(rng: &mut Rng, n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + P);
        while v.len() < n {
            v.extend_from_slice(&page_data(rng));
        }
        let at = rng.below(P as u64) as usize;
        v.extend_from_slice(&page_data(rng));
        v[at..at + n].to_vec()
    }

    fn cfg(size: u64, compress: &str) -> StoreConfig {
        StoreConfig {
            host_reserve: 0,
            compress: compress.parse().unwrap(),
            ..StoreConfig::new(size)
        }
    }

    fn modes(size: u64, max_memory: Option<u64>) -> Vec<(&'static str, StoreConfig)> {
        let c = |s: &str| StoreConfig {
            max_memory,
            ..cfg(size, s)
        };
        vec![
            ("lz4", c("lz4")),
            ("zstd:1", c("zstd:1")),
            (
                "lz4 tiered",
                StoreConfig {
                    compress_after: SOON,
                    ..c("lz4")
                },
            ),
            (
                "lz4 + zstd frames",
                StoreConfig {
                    recompress: Codec::Zstd(1),
                    idle_after: SOON,
                    ..c("lz4")
                },
            ),
            (
                "tiered lz4 + zstd frames",
                StoreConfig {
                    compress_after: SOON,
                    recompress: Codec::Zstd(1),
                    idle_after: SOON,
                    ..c("lz4")
                },
            ),
            (
                "none + lz4 frames",
                StoreConfig {
                    recompress: Codec::Lz4,
                    idle_after: SOON,
                    ..c("none")
                },
            ),
        ]
    }

    fn adds_up(s: &Store, name: &str) {
        let st = s.stats();
        assert!(memory_adds_up(&st), "{name}: {st:?}");
        assert_eq!(
            st.data_pages,
            st.hot_pages + st.incompressible_pages + st.compressed_pages + st.frame_pages,
            "{name}: {st:?}"
        );
        assert!(st.memory_used <= st.max_memory, "{name}: {st:?}");
    }

    /// The expected contents of every page, each behind its own lock: a
    /// client thread locks the pages of its request (in order), so requests
    /// from several threads may share chunks, zspages and frames while the
    /// model stays exact.
    struct Model(Vec<Mutex<Vec<u8>>>);

    impl Model {
        fn new(size: u64) -> Model {
            Model(
                (0..size as usize / P)
                    .map(|_| Mutex::new(vec![0; P]))
                    .collect(),
            )
        }
        fn lock(&self, off: u64, len: u64) -> Vec<MutexGuard<'_, Vec<u8>>> {
            let (a, b) = (off as usize / P, (off + len - 1) as usize / P);
            (a..=b).map(|p| self.0[p].lock().unwrap()).collect()
        }
        fn flat(g: &[MutexGuard<'_, Vec<u8>>]) -> Vec<u8> {
            g.iter().flat_map(|p| p.iter().copied()).collect()
        }
        fn set(g: &mut [MutexGuard<'_, Vec<u8>>], flat: &[u8]) {
            for (k, p) in g.iter_mut().enumerate() {
                p.copy_from_slice(&flat[k * P..(k + 1) * P]);
            }
        }
    }

    /// One client's random request on `s`, checked against `m`.
    fn client_op(s: &Store, m: &Model, rng: &mut Rng, name: &str) {
        let size = s.size();
        let off = rng.below(size);
        let len = match rng.below(4) {
            0 => rng.below(64) + 1,
            1 => P as u64,
            _ => rng.below(5 * P as u64) + 1,
        }
        .min(size - off);
        let off = if rng.below(3) == 0 {
            off & !(P as u64 - 1)
        } else {
            off
        };
        let len = len.min(size - off);
        let mut g = m.lock(off, len);
        let base = off as usize & !(P - 1);
        let (o, l) = (off as usize - base, len as usize);
        let mut flat = Model::flat(&g);
        match rng.below(10) {
            0..=3 => {
                let d = data(rng, l);
                let (done, r) = s.write_prefix(off, &d, &mut 0);
                if let Err(e) = r {
                    assert_eq!(e.errno(), crate::Errno::ENOSPC, "{name}: {e}");
                }
                // Pages before the failing one hold the new data, the rest
                // the old: `done` ends at a page boundary (or is 0).
                flat[o..o + done].copy_from_slice(&d[..done]);
            }
            4..=5 => {
                let punch = rng.below(2) == 0;
                let r = if rng.below(2) == 0 {
                    s.zero(off, len, punch)
                } else {
                    s.trim(off, len)
                };
                let mut zeroed = flat.clone();
                zeroed[o..o + l].fill(0);
                match r {
                    Ok(()) => flat = zeroed,
                    Err(e) => {
                        assert_eq!(e.errno(), crate::Errno::ENOSPC, "{name}: {e}");
                        // Each page is either as it was or zeroed.
                        let mut back = vec![0; g.len() * P];
                        s.read(base as u64, &mut back).unwrap();
                        for k in 0..g.len() {
                            let r = k * P..(k + 1) * P;
                            assert!(
                                back[r.clone()] == flat[r.clone()]
                                    || back[r.clone()] == zeroed[r.clone()],
                                "{name}: page {} after a failed zero",
                                base / P + k
                            );
                        }
                        flat = back;
                    }
                }
            }
            6 => {
                let r = s.allocate(off, len, &mut 0);
                if let Err(e) = r {
                    assert_eq!(e.errno(), crate::Errno::ENOSPC, "{name}: {e}");
                }
            }
            _ => {
                let mut b = vec![0; l];
                s.read(off, &mut b).unwrap();
                if b != flat[o..o + l] {
                    let bad = (0..l).find(|&k| b[k] != flat[o + k]).unwrap();
                    panic!(
                        "{name}: read at {off} len {len}: first wrong byte at disk offset {}",
                        off as usize + bad
                    );
                }
                // A second read promotes on a tiered disk.
                if rng.below(2) == 0 {
                    s.read(off, &mut b).unwrap();
                    assert!(
                        b == flat[o..o + l],
                        "{name}: second read at {off} len {len}"
                    );
                }
            }
        }
        Model::set(&mut g, &flat);
    }

    /// Clients and a scanner (one pass after another, some passes split
    /// over two threads) on one store; then the whole disk against the model.
    fn stress(name: &str, cfg: StoreConfig, clients: u64, ops: usize, seed: u64) {
        let size = cfg.size;
        let s = Arc::new(Store::new(cfg).unwrap());
        let m = Arc::new(Model::new(size));
        let stop = Arc::new(AtomicBool::new(false));
        let scanner = {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(R) {
                    if n % 3 == 2 {
                        let pass = s.begin_pass();
                        std::thread::scope(|sc| {
                            let h = sc.spawn(|| s.background_pass(1, 2));
                            s.background_pass(0, 2);
                            h.join().unwrap();
                        });
                        s.end_pass(pass);
                    } else {
                        s.background_pass_all();
                    }
                    n += 1;
                }
                n
            })
        };
        let threads: Vec<_> = (0..clients)
            .map(|t| {
                let (s, m) = (s.clone(), m.clone());
                let name = name.to_string();
                std::thread::spawn(move || {
                    let mut rng = Rng::new(seed * 1000 + t + 1);
                    for _ in 0..ops {
                        client_op(&s, &m, &mut rng, &name);
                        let st = s.stats();
                        assert!(st.memory_used <= st.max_memory, "{name}: {st:?}");
                    }
                })
            })
            .collect();
        settle(name, s, &m, &stop, threads, scanner);
    }

    /// Ends a stress run: joins the clients, stops the scanner, checks the
    /// disk against the model (again after more passes) and the accounting,
    /// and drops the store (whose Drop checks its counters in debug builds).
    fn settle(
        name: &str,
        s: Arc<Store>,
        m: &Model,
        stop: &AtomicBool,
        threads: Vec<std::thread::JoinHandle<()>>,
        scanner: std::thread::JoinHandle<u64>,
    ) -> StoreStats {
        for t in threads {
            t.join().unwrap();
        }
        stop.store(true, R);
        let passes = scanner.join().unwrap();
        let expect: Vec<u8> = m.0.iter().flat_map(|p| p.lock().unwrap().clone()).collect();
        let check = |when: &str| {
            let all = read_all(&s);
            if all != expect {
                let bad = (0..all.len()).find(|&k| all[k] != expect[k]).unwrap();
                panic!(
                    "{name}: {when}: first wrong byte at {bad} (page {})",
                    bad / P
                );
            }
        };
        check("after the run");
        adds_up(&s, name);
        for _ in 0..3 {
            s.background_pass_all();
        }
        check("after more passes");
        adds_up(&s, name);
        let st = s.stats();
        eprintln!("{name}: {passes} passes, {st:?}");
        drop(Arc::try_unwrap(s).ok().expect("last reference"));
        st
    }

    /// A page that compresses to about `k` bytes, `k` from a few sizes: the
    /// objects crowd into a few size classes, which trimming then fragments.
    fn sparse_page(rng: &mut Rng) -> Vec<u8> {
        let k = [300usize, 700, 1500][rng.below(3) as usize] + rng.below(16) as usize;
        let mut v = vec![0u8; P];
        let at = rng.below((P - k) as u64) as usize;
        let noise = rng.bytes(k);
        v[at..at + k].copy_from_slice(&noise);
        v
    }

    /// Fills the disk with `sparse_page`s, then clients trim, rewrite and
    /// read while the scanner compacts (and packs, splits, compresses).
    fn stress_fragment(
        name: &str,
        cfg: StoreConfig,
        clients: u64,
        ops: usize,
        seed: u64,
    ) -> StoreStats {
        let size = cfg.size;
        let pages = size / P as u64;
        let s = Arc::new(Store::new(cfg).unwrap());
        let m = Arc::new(Model::new(size));
        let mut rng = Rng::new(seed);
        for p in 0..pages {
            let d = sparse_page(&mut rng);
            let mut g = m.lock(p * P as u64, P as u64);
            if s.write(p * P as u64, &d).is_ok() {
                g[0].copy_from_slice(&d);
            }
        }
        s.background_pass_all();
        let stop = Arc::new(AtomicBool::new(false));
        let scanner = {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(R) {
                    s.background_pass_all();
                    n += 1;
                }
                n
            })
        };
        let threads: Vec<_> = (0..clients)
            .map(|t| {
                let (s, m) = (s.clone(), m.clone());
                let name = name.to_string();
                std::thread::spawn(move || {
                    let mut rng = Rng::new(seed * 1000 + t + 1);
                    for _ in 0..ops {
                        let p = rng.below(pages);
                        let off = p * P as u64;
                        match rng.below(10) {
                            0..=3 => {
                                let mut g = m.lock(off, P as u64);
                                s.trim(off, P as u64).unwrap();
                                g[0].fill(0);
                            }
                            4..=5 => {
                                let d = sparse_page(&mut rng);
                                let mut g = m.lock(off, P as u64);
                                match s.write(off, &d) {
                                    Ok(()) => g[0].copy_from_slice(&d),
                                    Err(e) => {
                                        assert_eq!(e.errno(), crate::Errno::ENOSPC, "{name}: {e}")
                                    }
                                }
                            }
                            6 => client_op(&s, &m, &mut rng, &name),
                            _ => {
                                let n = (rng.below(20) + 1).min(pages - p);
                                let g = m.lock(off, n * P as u64);
                                let mut b = vec![0; n as usize * P];
                                s.read(off, &mut b).unwrap();
                                let want = Model::flat(&g);
                                if b != want {
                                    let bad = (0..b.len()).find(|&k| b[k] != want[k]).unwrap();
                                    panic!("{name}: read of page {} wrong", p as usize + bad / P);
                                }
                            }
                        }
                    }
                })
            })
            .collect();
        settle(name, s, &m, &stop, threads, scanner)
    }

    #[test]
    fn review_stress_compaction() {
        let mut moved = 0;
        for (k, (name, cfg)) in modes(4 * MIB, None).into_iter().enumerate() {
            moved += stress_fragment(name, cfg, 2, ops(1000), 200 + k as u64).compacted_objects;
        }
        assert!(moved > 0, "compaction never ran");
    }

    #[test]
    fn review_stress_default_memory() {
        for (k, (name, cfg)) in modes(2 * MIB, None).into_iter().enumerate() {
            stress(name, cfg, 2, ops(1000), k as u64);
        }
    }

    #[test]
    fn review_stress_tight_memory() {
        // 2 MiB of disk in about 1.1 MiB of memory: ENOSPC paths everywhere.
        for (k, (name, cfg)) in modes(2 * MIB, Some(MIB + (100 << 10)))
            .into_iter()
            .enumerate()
        {
            stress(name, cfg, 2, ops(1000), 100 + k as u64);
        }
    }

    /// Noise fast enough for debug builds.
    fn noise(rng: &mut Rng, n: usize) -> Vec<u8> {
        let mut v: Vec<u8> = (0..n.div_ceil(8))
            .flat_map(|_| rng.next().to_ne_bytes())
            .collect();
        v.truncate(n);
        v
    }

    /// ARCHITECTURE.md: "a disk of `size` bytes always holds `size` bytes of
    /// incompressible data". Not once it held compressed pages: overwriting
    /// them frees objects one by one, and a zspage goes back only when its
    /// last object does, so raw pages and half-empty zspages together
    /// outgrow the default max_memory long before the disk is full.
    /// Compaction fixes it, but only at the next scanner pass (1 s apart
    /// on an inline disk); a client writing between two passes gets ENOSPC.
    #[test]
    fn review_overwriting_compressed_pages_with_noise_fits_the_default_budget() {
        let size = 64 * MIB;
        let s = Store::new(cfg(size, "lz4")).unwrap();
        let pages = size / P as u64;
        let mut rng = Rng::new(1);
        // Pages that compress a little (objects of ~3.6 KiB).
        let mut d = vec![0u8; P];
        for p in 0..pages {
            d[..3600].copy_from_slice(&noise(&mut rng, 3600));
            s.write(p * P as u64, &d).unwrap();
        }
        let mut order: Vec<u64> = (0..pages).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for (n, &p) in order.iter().enumerate() {
            if let Err(e) = s.write(p * P as u64, &noise(&mut rng, P)) {
                panic!(
                    "{e} after overwriting {n} of {pages} pages of a {size}-byte disk with \
                     default max_memory: {:?}",
                    s.stats()
                );
            }
        }
        adds_up(&s, "lz4");
    }

    /// Promotion takes client budget: a client that reads its data twice
    /// between two passes turns compressed pages raw until `max_memory` is
    /// reached, and from then on every other client's write of a new page
    /// fails with ENOSPC, although the same write succeeded before the reads
    /// and nothing was written meanwhile.
    #[test]
    fn review_reads_do_not_take_the_memory_writes_need() {
        let s = Store::new(StoreConfig {
            max_memory: Some(4 * MIB),
            compress_after: SOON,
            ..cfg(16 * MIB, "lz4")
        })
        .unwrap();
        let mut rng = Rng::new(2);
        // 4 MiB of text, written in two halves that each fit raw.
        let data = text(&mut rng, 4 * MIB as usize);
        for half in data.chunks(data.len() / 2) {
            let at = (half.as_ptr() as usize - data.as_ptr() as usize) as u64;
            s.write(at, half).unwrap();
            s.background_pass_all();
            s.background_pass_all();
        }
        let before = s.stats();
        assert_eq!(before.hot_pages, 0, "{before:?}");
        // Room for many more raw pages.
        assert!(
            before.memory_used + MIB < 4 * MIB - (256 << 10),
            "{before:?}"
        );
        let mut b = vec![0; data.len()];
        for _ in 0..2 {
            s.read(0, &mut b).unwrap();
            assert!(b == data);
        }
        let after = s.stats();
        let r = s.write(8 * MIB, &noise(&mut rng, P));
        assert!(
            r.is_ok(),
            "{:?}: a write after two reads; before the reads {before:?}, after {after:?}",
            r.unwrap_err()
        );
        adds_up(&s, "tiered");
    }
}

/// Saves: every save, taken while clients write and the scanner works,
/// must hold the disk exactly as it was at its switch; loading the chain
/// must give that disk back.
mod persist {
    use super::*;
    use crate::persist::{decode_record, Record};
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed as R};
    use std::sync::Arc;
    use std::time::Duration;

    const P: usize = PAGE_SIZE;

    fn page(rng: &mut Rng) -> Vec<u8> {
        match rng.below(5) {
            0 => rng.bytes(P),
            1 => vec![rng.next() as u8; P],
            // Compressible text of a few kinds.
            _ => format!("page {} of text {} ", rng.below(100), rng.below(7))
                .into_bytes()
                .repeat(P)[..P]
                .to_vec(),
        }
    }

    /// One client request, holding the gate as frontends do.
    fn mutate(s: &Store, rng: &mut Rng) {
        let size = s.size();
        let c = s.change();
        let at = rng.below(size / P as u64) * P as u64;
        match rng.below(10) {
            0 => {
                let n = (rng.below(32 * P as u64) + 1).min(size - at);
                c.trim(at, n).unwrap();
            }
            1 => {
                let n = (rng.below(8 * P as u64) + 1).min(size - at);
                let _ = c.zero(
                    at + rng.below(P as u64).min(size - at - 1),
                    n.min(size - at - P as u64).max(1),
                    false,
                );
            }
            2 => {
                // A partial page write.
                let off = at + rng.below(P as u64 - 100);
                let _ = c.write(off, &rng.bytes(100));
            }
            _ => {
                let n = rng.below(4) as usize + 1;
                let mut d = Vec::new();
                for _ in 0..n {
                    d.extend(page(rng));
                }
                let n = d.len().min((size - at) as usize);
                let _ = c.write(at, &d[..n]);
            }
        }
    }

    /// Applies a save's records to a raw model of the disk.
    fn apply(model: &mut [u8], rec: Record<'_>) {
        decode_record(&rec, |p, data| {
            let at = p as usize * P;
            model[at..at + P].copy_from_slice(data);
            Ok(())
        })
        .unwrap();
    }

    fn save(s: &Store, full: bool, image: &mut [u8], log: &mut Vec<Vec<u8>>) -> Vec<u8> {
        let (save, at_switch) = s.begin_save(full, || read_all(s));
        let plan = save.plan();
        if full {
            // A full save starts a new chain: nothing before it counts.
            image.fill(0);
        }

        for &key in &plan.gone {
            apply(image, Record::Gone(key));
        }
        for &(key, mask) in &plan.chunks {
            save.save_chunk(key, mask, |page, p| {
                let rec = match p {
                    PageRef::Frame { mask, data } => Record::Frame {
                        key: page / 64,
                        mask,
                        data,
                    },
                    p => Record::Page(page, p),
                };
                apply(image, rec);
            });
        }
        assert!(
            !save.broken(),
            "clients outran the save's memory for kept pages"
        );
        save.finish();
        log.push(at_switch.clone());
        at_switch
    }

    fn config(compress: &str, recompress: &str) -> StoreConfig {
        StoreConfig {
            host_reserve: 0,
            track_changes: true,
            compress: compress.parse().unwrap(),
            recompress: recompress.parse().unwrap(),
            idle_after: Duration::from_millis(1),
            ..StoreConfig::new(4 << 20)
        }
    }

    #[test]
    fn saves_are_point_in_time_while_clients_write() {
        for (k, (c, r)) in [("none", "none"), ("lz4", "none"), ("lz4", "zstd")]
            .into_iter()
            .enumerate()
        {
            let s = Arc::new(Store::new(config(c, r)).unwrap());
            let mut rng = Rng::new(42 + k as u64);
            for _ in 0..400 {
                mutate(&s, &mut rng);
            }
            s.background_pass_all();
            s.background_pass_all();
            let stop = Arc::new(AtomicBool::new(false));
            let workers: Vec<_> = (0..2)
                .map(|t| {
                    let (s, stop) = (s.clone(), stop.clone());
                    std::thread::spawn(move || {
                        let mut rng = Rng::new(1000 + t);
                        let mut n = 0;
                        while !stop.load(R) {
                            mutate(&s, &mut rng);
                            if t == 1 && n % 50 == 0 {
                                s.background_pass_all();
                            }
                            n += 1;
                        }
                    })
                })
                .collect();
            let mut image = vec![0u8; s.size() as usize];
            let mut log = Vec::new();
            for round in 0..12 {
                let want = save(&s, round == 0 || round == 7, &mut image, &mut log);
                assert!(
                    image == want,
                    "{c}/{r}: save {round} is not the disk at its switch"
                );
                if round == 4 {
                    // A failed save: the next one must be full to be right.
                    let (failed, ()) = s.begin_save(false, || ());
                    drop(failed);
                    let want = save(&s, true, &mut image, &mut log);
                    assert!(image == want, "{c}/{r}: full save after an aborted one");
                }
            }
            stop.store(true, R);
            for w in workers {
                w.join().unwrap();
            }
            // Quiet now: one more save equals the disk, and so does a
            // store loaded from a full save.
            let want = save(&s, false, &mut image, &mut log);
            assert!(image == want && want == read_all(&s));
            let fresh = Store::new(config(c, r)).unwrap();
            let (save, ()) = s.begin_save(true, || ());
            for &(key, mask) in &save.plan().chunks {
                save.save_chunk(key, mask, |page, p| match p {
                    PageRef::Frame { mask, data } => {
                        fresh.restore_frame(page / 64, mask, data).unwrap()
                    }
                    p => fresh.restore_page(page, p).unwrap(),
                });
            }
            save.finish();
            assert!(read_all(&fresh) == want, "{c}/{r}: loaded store differs");
            let (a, b) = (s.stats(), fresh.stats());
            assert_eq!(
                (a.data_pages, a.zero_pages, a.fill_pages, a.frames),
                (b.data_pages, b.zero_pages, b.fill_pages, b.frames),
                "{c}/{r}"
            );
            let st = s.stats();
            assert!(memory_adds_up(&st), "{c}/{r}: {st:?}");
        }
    }

    /// A load applies every save of the chain: a page a later save rewrote
    /// must not need room for both versions on a full disk.
    #[test]
    fn loading_a_chain_fits_a_full_disk() {
        let cfg = || StoreConfig {
            host_reserve: 0,
            track_changes: true,
            ..StoreConfig::new(1 << 20)
        };
        let s = Store::new(cfg()).unwrap();
        let mut rng = Rng::new(7);
        s.write(0, &rng.bytes(1 << 20)).unwrap();
        let mut saves: Vec<Vec<(u64, Vec<u8>)>> = Vec::new();
        for full in [true, false] {
            let (save, ()) = s.begin_save(full, || ());
            let mut recs = Vec::new();
            for &(key, mask) in &save.plan().chunks {
                save.save_chunk(key, mask, |page, p| match p {
                    PageRef::Raw { data, .. } => recs.push((page, data.to_vec())),
                    p => panic!("unexpected {p:?}"),
                });
            }
            save.finish();
            saves.push(recs);
            s.write(0, &rng.bytes(P)).unwrap();
        }
        assert_eq!(saves[1].len(), 1);
        let fresh = Store::new(cfg()).unwrap();
        for recs in &saves {
            for (page, data) in recs {
                fresh
                    .restore_page(*page, PageRef::Raw { data, hot: true })
                    .unwrap();
            }
        }
        let a = read_all(&fresh);
        // The second save was taken before the last write.
        s.write(0, &saves[1][0].1).unwrap();
        assert!(a == read_all(&s));
    }

    /// A load that empties a chunk and fills it again (a trim then a write
    /// in later saves) is no change to save: the next save must not drop
    /// the chunk's pages.
    #[test]
    fn a_load_leaves_nothing_to_save() {
        let cfg = StoreConfig {
            track_changes: true,
            ..config("none", "none")
        };
        let s = Store::new(cfg.clone()).unwrap();
        let page1 = vec![7u8; P];
        s.restore_page(
            0,
            PageRef::Raw {
                data: &page1,
                hot: true,
            },
        )
        .unwrap();
        s.restore_page(0, PageRef::Hole).unwrap();
        s.restore_page(
            1,
            PageRef::Raw {
                data: &page1,
                hot: true,
            },
        )
        .unwrap();
        s.restore_gone(5).unwrap();
        s.end_restore();
        let (save, ()) = s.begin_save(false, || ());
        let plan = save.plan().clone();
        save.finish();
        assert!(plan.gone.is_empty() && plan.pages == 0, "{plan:?}");
    }

    /// Sizes need not be page multiples; page numbers from an image must
    /// name pages of the disk, without overflow.
    #[test]
    fn restore_checks_page_numbers() {
        let s = Store::new(StoreConfig {
            track_changes: true,
            ..StoreConfig::new(10_000)
        })
        .unwrap();
        let page = vec![1u8; P];
        let raw = PageRef::Raw {
            data: &page,
            hot: true,
        };
        s.restore_page(2, raw).unwrap();
        assert!(s.restore_page(3, raw).is_err());
        assert!(s.restore_page(1 << 52, raw).is_err());
        assert!(s.restore_page(u64::MAX, raw).is_err());
        assert!(s.restore_gone(1 << 58).is_err());
        // A frame of two zero pages: header (first page 0, 2 pages, lz4,
        // length), then the compressed pages.
        let mut body = vec![0u8; 2 * P];
        let n = crate::codec::compress(Codec::Lz4, &[0u8; 2 * P], &mut body).unwrap();
        let mut frame = vec![0u8, 2, 1, 0];
        frame.extend_from_slice(&(n as u32).to_le_bytes());
        frame.extend_from_slice(&body[..n]);
        // Pages 0 and 1 exist; 2 (still in the disk) and 3 (past it) as members.
        assert!(s.restore_frame(0, 0b11, &frame).is_ok());
        assert!(s.restore_frame(u64::MAX, 0b11, &frame).is_err());
        assert!(s.restore_frame(0, 0, &frame).is_err());
        let mut far = frame.clone();
        far[0] = 2;
        assert!(s.restore_frame(0, 0b1100, &far).is_err());
    }

    /// Kept copies are bounded: a save whose pages are all rewritten before
    /// it writes them, on a disk whose budget is full, gives up instead of
    /// doubling memory without limit.
    #[test]
    fn a_save_that_cannot_keep_its_pages_is_abandoned() {
        let s = Store::new(StoreConfig {
            host_reserve: 0,
            track_changes: true,
            ..StoreConfig::new(1 << 20)
        })
        .unwrap();
        let mut rng = Rng::new(9);
        s.write(0, &rng.bytes(1 << 20)).unwrap();
        let (save, ()) = s.begin_save(true, || ());
        let pages = save.plan().pages;
        // Rewriting half the disk keeps the old half for the save, past
        // max_memory; status shows it.
        {
            s.change().write(0, &rng.bytes(1 << 19)).unwrap();
        }
        let st = s.stats();
        assert!(memory_adds_up(&st) && !save.broken(), "{st:?}");
        assert!(
            (1 << 19..(1 << 19) + 128 * 64).contains(&st.kept_bytes),
            "{st:?}"
        );
        assert!(st.memory_used > st.max_memory, "{st:?}");
        // Rewriting it all, twice, would keep more than max_memory.
        for _ in 0..2 {
            s.change().write(0, &rng.bytes(1 << 20)).unwrap();
            let st = s.stats();
            assert!(memory_adds_up(&st), "{st:?}");
        }
        assert!(save.broken());
        drop(save);
        let st = s.stats();
        assert!(memory_adds_up(&st) && st.kept_bytes == 0, "{st:?}");
        // The next save starts clean.
        let (save, ()) = s.begin_save(true, || ());
        assert!(!save.broken() && save.plan().pages == pages);
    }
}
