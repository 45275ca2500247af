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

/// xorshift64*: deterministic data without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
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
    let mut rng = Rng(7);
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
    let mut rng = Rng(3);
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
    let mut rng = Rng(11);
    let first = rng.bytes(MIB as usize);
    s.write(0, &first).unwrap();
    let err = s.write(MIB, &rng.bytes(PAGE_SIZE)).unwrap_err();
    assert_eq!(err.errno(), libc::ENOSPC, "{err}");
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
    assert_eq!(e.errno(), libc::EINVAL);
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
    let mut rng = Rng(0xC0FFEE);
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
                let mut rng = Rng(t + 1);
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
    let mut rng = Rng(5);
    s.write(0, &rng.bytes(2 * PAGE_SIZE)).unwrap();
    s.write(2 * PAGE_SIZE as u64, &[0; PAGE_SIZE]).unwrap(); // zero page counts
    s.zero(3 * PAGE_SIZE as u64, PAGE_SIZE as u64, false)
        .unwrap();
    assert_eq!(s.pages_used(), (4, 4));
    let e = s.write(8 * PAGE_SIZE as u64, &rng.bytes(10)).unwrap_err();
    assert_eq!(e.errno(), libc::ENOSPC, "{e}");
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
    assert_eq!(e.errno(), libc::ENOSPC);
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
        assert_eq!(
            st.memory_used,
            st.stored_bytes + st.slack_bytes + st.metadata_bytes,
            "{st:?}"
        );
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
            let mut rng = Rng(42);
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
        let mut rng = Rng(9);
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
            let mut rng = Rng(0xFEED);
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
                        let mut rng = Rng(t + 100);
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
        let mut rng = Rng(77);
        let mut written = 0u64;
        let err = loop {
            let d = text(&mut rng, MIB as usize);
            match s.write(written, &d) {
                Ok(()) => written += MIB,
                Err(e) => break e,
            }
        };
        assert_eq!(err.errno(), libc::ENOSPC, "{err}");
        assert!(
            written >= 3 * MIB,
            "only {written} bytes of text fit in {limit}"
        );
        // What was written before the failure is intact; memory is in bounds.
        let mut rng = Rng(77);
        for k in 0..written / MIB {
            let mut b = vec![0; MIB as usize];
            s.read(k * MIB, &mut b).unwrap();
            assert!(b == text(&mut rng, MIB as usize), "MiB {k}");
        }
        assert_adds_up(&s);
        // Incompressible data hits the limit too, and keeps the old page.
        let e = s.write(0, &rng.bytes(PAGE_SIZE * 64)).unwrap_err();
        assert_eq!(e.errno(), libc::ENOSPC);
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
            let mut rng = Rng(21);
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
        let mut rng = Rng(3);
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
        let mut rng = Rng(5);
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
        let mut rng = Rng(1);
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
        let mut rng = Rng(8);
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
