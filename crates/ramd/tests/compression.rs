//! Per-disk compression seen from outside: `--compress`, `--compress-after`,
//! `--recompress`, `--idle-after`, driven by real clients (nbdcopy, qemu-io,
//! fio, cp/diff on a filesystem disk) and checked against reference data and
//! `ramd status`.
//!
//! Data is the machine's own files (/usr/bin, /usr/share/doc, /usr/lib: ELF
//! and text that compress, gzip files that do not), generated text, zeros
//! and /dev/urandom. Waits for the background scanner are polls with
//! deadlines on `ramd status`; nothing here depends on how fast it runs.

mod common;
mod fs_common;

use common::*;
use serde_json::Value;
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How long the background scanner may take to compress, re-pack or cool
/// down what a test wrote (its passes are 50ms..1s apart; a loaded machine
/// with debug builds is slow).
const SCANNER_DEADLINE: Duration = Duration::from_secs(90);

fn nbdcopy(args: &[&str]) {
    require_tool("nbdcopy");
    run(&mut cmd("nbdcopy", args), LONG_TIMEOUT).ok();
}

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// Pages in `bytes`.
fn pages(bytes: u64) -> u64 {
    bytes / PAGE
}

/// Regular files under `root`, depth first in name order (symlinks and
/// special files left out), so the same machine always yields the same list.
fn files_under(root: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = fs::read_dir(root) else { return };
    let mut entries: Vec<_> = rd.filter_map(Result::ok).map(|e| e.path()).collect();
    entries.sort();
    for e in entries {
        let Ok(meta) = fs::symlink_metadata(&e) else {
            continue;
        };
        if meta.is_dir() {
            files_under(&e, out);
        } else if meta.is_file() {
            out.push(e);
        }
    }
}

/// `len` bytes of the machine's own files: a quarter from /usr/share/doc
/// (copyright texts, changelogs, gzip files), the rest from /usr/bin then
/// /usr/lib (executables and libraries), files concatenated whole in name
/// order, like the first `len` bytes of a tar of those directories.
fn usr_mix(len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let doc_share = len / 4;
    for (root, until) in [
        ("/usr/share/doc", doc_share),
        ("/usr/bin", len),
        ("/usr/lib", len),
    ] {
        let mut files = Vec::new();
        files_under(Path::new(root), &mut files);
        for f in files {
            if out.len() >= until {
                break;
            }
            if let Ok(file) = fs::File::open(&f) {
                let want = (until - out.len()) as u64;
                // An unreadable file just adds nothing.
                let _ = file.take(want).read_to_end(&mut out);
            }
        }
    }
    assert_eq!(
        out.len(),
        len,
        "/usr/share/doc, /usr/bin and /usr/lib hold less than {len} bytes"
    );
    out
}

/// `len` bytes of deterministic English-like text (random words from a small
/// vocabulary): compresses about 2:1 page by page with lz4.
fn text(len: usize, seed: u64) -> Vec<u8> {
    const WORDS: &str = "the quick brown fox jumps over lazy dog ramd keeps pages \
        compressed in memory while serving blocks over a network block device and \
        mounts filesystems through fuse with zstd lz4 frames idle hot cold scanner status";
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(len + 128);
    while out.len() < len {
        let n = 4 + rng.below(11);
        for i in 0..n {
            if i > 0 {
                out.push(b' ');
            }
            out.extend_from_slice(words[rng.below(words.len() as u64) as usize].as_bytes());
        }
        out.extend_from_slice(b".\n");
    }
    out.truncate(len);
    out
}

fn urandom(len: usize) -> Vec<u8> {
    let tmp = scratch();
    let f = tmp.path().join("r");
    random_file(&f, len as u64);
    fs::read(&f).unwrap()
}

fn text_field<'a>(disk: &'a Value, key: &str) -> &'a str {
    disk[key]
        .as_str()
        .unwrap_or_else(|| panic!("status field {key:?} missing or not a string in {disk}"))
}

fn ratio(disk: &Value) -> f64 {
    disk["ratio"]
        .as_f64()
        .unwrap_or_else(|| panic!("status field \"ratio\" missing or not a number in {disk}"))
}

/// CPU time the process `pid` has used so far (all threads, user and
/// system), from /proc/PID/stat.
fn process_cpu_ns(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat"))
        .unwrap_or_else(|e| panic!("reading /proc/{pid}/stat: {e}"));
    // Fields after "(comm)": state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')').expect("comm in /proc/PID/stat") + 2..];
    let f: Vec<u64> = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|x| x.parse().expect("utime/stime"))
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    (f[0] + f[1]) * 1_000_000_000 / hz
}

/// `background_cpu_ns` is CPU time of the scanner threads, so it cannot
/// exceed what the whole process used (plus clock-tick rounding). The codec
/// counters are elapsed time in the codec: with more threads than cores
/// they may exceed CPU time, so they are only checked to be counting.
fn assert_cpu_counters_within_process_cpu(d: &Ramd, s: &Value) {
    let cpu = process_cpu_ns(d.pid());
    let limit = cpu + cpu / 20 + 100_000_000;
    let v = field(s, "background_cpu_ns");
    assert!(
        v <= limit,
        "background_cpu_ns is {v} ns but the whole ramd process used {cpu} ns of CPU: {s}"
    );
    if field(s, "compressed_pages") > 0 {
        assert!(field(s, "compress_time_ns") > 0, "{s}");
    }
}

/// Polls `ramd status` until `cond` holds for the disk; returns that entry.
fn wait_for_stats(d: &Ramd, what: &str, cond: impl Fn(&Value) -> bool) -> Value {
    wait_for_stats_within(SCANNER_DEADLINE, d, what, cond)
}

fn wait_for_stats_within(
    timeout: Duration,
    d: &Ramd,
    what: &str,
    cond: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(5);
    loop {
        let s = d.stats();
        if cond(&s) {
            return s;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}; last status: {s}");
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// The background scanner has been over every page since the last write:
/// nothing hot, every data page idle, some pages in frames.
fn settled_in_frames(s: &Value) -> bool {
    field(s, "hot_pages") == 0
        && field(s, "frame_pages") > 0
        && field(s, "idle_pages") == field(s, "data_pages")
}

/// Columns of this disk's row in the `ramd status` table, by header name.
fn table_row(table: &str, name: &str) -> Vec<(String, String)> {
    let mut lines = table.lines();
    let head: Vec<String> = lines
        .next()
        .unwrap_or_else(|| panic!("`ramd status` printed nothing"))
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let row = lines
        .find(|l| l.split_whitespace().next() == Some(name))
        .unwrap_or_else(|| panic!("no row for {name} in `ramd status`:\n{table}"));
    let cells: Vec<String> = row.split_whitespace().map(str::to_string).collect();
    assert_eq!(
        cells.len(),
        head.len(),
        "row and header differ in columns:\n{table}"
    );
    head.into_iter().zip(cells).collect()
}

fn cell<'a>(row: &'a [(String, String)], col: &str) -> &'a str {
    row.iter()
        .find(|(h, _)| h == col)
        .map(|(_, v)| v.as_str())
        .unwrap_or_else(|| panic!("no {col} column in {row:?}"))
}

/// The table row for `d` together with a JSON entry taken around it that
/// did not change meanwhile (the scanner's compaction may move objects).
fn stable_table_and_json(d: &Ramd) -> (Vec<(String, String)>, Value) {
    let mut got = None;
    wait_until(SCANNER_DEADLINE, "a stable status", || {
        let before = d.stats();
        let table = ramd_cmd(d.run_dir(), &["status"]).ok();
        let after = d.stats();
        let same = ["memory_used", "data_bytes", "stored_bytes"]
            .iter()
            .all(|k| field(&before, k) == field(&after, k));
        if same {
            got = Some((table_row(&table, d.name()), after));
        }
        same
    });
    got.unwrap()
}

// ---------------------------------------------------------------------------
// 1. Round trips per codec

/// An image of `usr` MiB of /usr files, `zero` MiB of zeros, `random` MiB
/// from /dev/urandom and `txt` MiB of text, in that order, copied in and
/// out with nbdcopy; then each part is trimmed in turn and what it took is
/// read off the status deltas.
fn round_trip(codec: &str, usr: u64, zero: u64, random: u64, txt: u64) {
    let tmp = scratch();
    let img = tmp.path().join("src.img");
    let back = tmp.path().join("back.img");
    let mut data = usr_mix((usr * MIB) as usize);
    data.resize(((usr + zero) * MIB) as usize, 0);
    data.extend_from_slice(&urandom((random * MIB) as usize));
    data.extend_from_slice(&text((txt * MIB) as usize, 1));
    write_file(&img, &data);
    drop(data);
    let total = usr + zero + random + txt;
    let size = format!("{total}M");

    let d = Ramd::start(&["--size", &size, "--compress", codec]);
    nbdcopy(&[p(&img), d.uri()]);
    nbdcopy(&[d.uri(), p(&back)]);
    assert_eq!(sha256(&img), sha256(&back), "{codec}: data changed");

    let s = d.stats();
    assert_accounting(&s);
    assert_eq!(text_field(&s, "compress"), codec, "{s}");
    assert_eq!(text_field(&s, "recompress"), "none", "{s}");
    assert!(
        field(&s, "compressed_pages") > 0,
        "{codec}: nothing compressed: {s}"
    );
    assert_eq!(
        field(&s, "hot_pages"),
        0,
        "{codec} with --compress-after 0 left raw pages waiting: {s}"
    );
    assert!(
        field(&s, "incompressible_pages") >= pages(random * MIB),
        "{codec}: {random} MiB of /dev/urandom should be incompressible pages: {s}"
    );
    assert!(
        field(&s, "data_pages") <= pages((usr + random + txt) * MIB),
        "{codec}: zeros took data pages: {s}"
    );
    assert!(
        field(&s, "stored_bytes") < field(&s, "data_bytes"),
        "{codec}: the image's data takes more than its size: {s}"
    );
    // Counting allocator slack and metadata too (`ratio`) once there is
    // enough data to outweigh one partly used zspage per size class.
    if usr + txt >= 16 {
        assert!(
            ratio(&s) > 1.0,
            "{codec}: ratio {} for the whole image: {s}",
            ratio(&s)
        );
    }
    assert!(field(&s, "compress_time_ns") > 0, "{s}");
    assert!(
        field(&s, "decompress_time_ns") > 0,
        "nbdcopy out decompressed nothing? {s}"
    );

    let discard = |off: u64, len: u64| {
        qemu_io(d.uri(), &[format!("discard {} {}", off * MIB, len * MIB)]);
        let s = d.stats();
        assert_accounting(&s);
        s
    };
    let delta = |a: &Value, b: &Value, k: &str| {
        field(a, k)
            .checked_sub(field(b, k))
            .unwrap_or_else(|| panic!("{codec}: {k} grew on a trim\n{a}\n{b}"))
    };

    // Each trimmed part must give back exactly what it held.
    let expect = |part: &str, before: &Value, s: &Value, want: &[(&str, u64)]| {
        for &(k, n) in want {
            assert_eq!(
                delta(before, s, k),
                n,
                "{codec}: {part}: {k}\n{before}\n{s}"
            );
        }
    };

    // The random part: raw pages, one page of memory each.
    let before = s;
    let s = discard(usr + zero, random);
    let n = pages(random * MIB);
    let want = [
        ("data_pages", n),
        ("incompressible_pages", n),
        ("stored_bytes", n * PAGE),
    ];
    expect("random part", &before, &s, &want);

    // The text part: every page compressed, to well under a page.
    let before = s;
    let s = discard(usr + zero + random, txt);
    let n = pages(txt * MIB);
    expect(
        "text part",
        &before,
        &s,
        &[("data_pages", n), ("compressed_pages", n)],
    );
    let stored = delta(&before, &s, "stored_bytes");
    assert!(
        stored * 3 / 2 < n * PAGE,
        "{codec}: {txt} MiB of text stored in {stored} bytes\n{before}\n{s}"
    );

    // The /usr part: what is left. It compresses too, if less.
    let before = s;
    let s = discard(0, usr);
    let n = delta(&before, &s, "data_pages");
    let stored = delta(&before, &s, "stored_bytes");
    assert!(
        n > pages(usr * MIB) / 2,
        "{codec}: /usr part\n{before}\n{s}"
    );
    assert!(
        stored < n * PAGE,
        "{codec}: {n} pages of /usr files stored in {stored} bytes (ratio <= 1)\n{before}\n{s}"
    );

    // Everything trimmed: no memory left behind (objects, zspages, chunks).
    let s = discard(0, total);
    for key in [
        "data_pages",
        "stored_bytes",
        "zspages",
        "chunks",
        "memory_used",
    ] {
        assert_eq!(
            field(&s, key),
            0,
            "{codec}: {key} after trimming everything: {s}"
        );
    }
    assert_cpu_counters_within_process_cpu(&d, &s);
}

#[test]
fn lz4_round_trip_of_usr_zero_random_and_text() {
    round_trip("lz4", 24, 4, 4, 8);
}

#[test]
fn zstd1_round_trip_of_usr_zero_random_and_text() {
    round_trip("zstd:1", 24, 4, 4, 8);
}

#[test]
fn zstd19_round_trip_of_usr_zero_random_and_text() {
    // Level 19 is slow: a smaller image.
    round_trip("zstd:19", 3, 1, 2, 2);
}

// ---------------------------------------------------------------------------
// 2. Partial-page writes into compressed pages and frames

const PARTIAL_DISK: u64 = 20 * MIB;

/// (offset, length) of the unaligned writes: edge cases first (page, frame
/// and chunk boundaries, the disk's last byte, the unwritten tail), then
/// random ones from a byte to a few frames long.
fn partial_writes() -> Vec<(u64, u64)> {
    let mut w = vec![
        (0, 1),
        (4095, 2),
        (3 * PAGE + 100, PAGE),
        (64 * KIB - 10, 20),
        (256 * KIB - 5000, 10000),
        (MIB + 1, 200_000),
        (5 * MIB, PAGE),
        (6 * MIB + 7 * PAGE, 16 * PAGE),
        (16 * MIB - 100, 200),
        (17 * MIB + 5, 3000),
        (PARTIAL_DISK - 1, 1),
    ];
    let mut rng = Rng::new(42);
    while w.len() < 250 {
        let len = match rng.below(10) {
            0..=3 => 1 + rng.below(64),
            4..=6 => 65 + rng.below(PAGE - 65),
            _ => PAGE + rng.below(3 * 64 * KIB),
        };
        let off = rng.below(PARTIAL_DISK - len);
        w.push((off, len));
    }
    w
}

/// 16 MiB of compressible data (text, then /usr files) on a 20 MiB disk;
/// with `tiered`, a wait until the scanner has put it into frames; then
/// one qemu-io run of ~250 unaligned writes (random bytes, text, /usr
/// bytes; zeros and a same-filled page written in halves), unaligned
/// WRITE_ZEROES and page trims, mirrored into a reference; the whole disk
/// read back with nbdcopy must equal it. With `tiered`, once more after the
/// scanner has re-packed the rewritten pages.
fn partial_writes_match_reference(args: &[&str], tiered: bool) {
    let tmp = scratch();
    let mut reference = vec![0u8; PARTIAL_DISK as usize];
    reference[..(8 * MIB) as usize].copy_from_slice(&text((8 * MIB) as usize, 2));
    reference[(8 * MIB) as usize..(16 * MIB) as usize]
        .copy_from_slice(&usr_mix((8 * MIB) as usize));
    let img = tmp.path().join("base.img");
    write_file(&img, &reference[..(16 * MIB) as usize]);

    let d = Ramd::start(args);
    nbdcopy(&[p(&img), d.uri()]);
    let s = if tiered {
        wait_for_stats(
            &d,
            "written pages compressed and re-packed into frames",
            settled_in_frames,
        )
    } else {
        d.stats()
    };
    assert_accounting(&s);
    assert!(
        field(&s, "compressed_pages") + field(&s, "frame_pages") > pages(8 * MIB),
        "the text was not compressed: {s}"
    );

    // The writes: each one's bytes in a file for `qemu-io write -s`.
    let mut rng = Rng::new(7);
    let mut cmds = Vec::new();
    let put = |off: u64, buf: Vec<u8>, reference: &mut Vec<u8>, cmds: &mut Vec<String>| {
        let f = tmp.path().join(format!("w{}", cmds.len()));
        write_file(&f, &buf);
        cmds.push(format!("write -s {} {off} {}", p(&f), buf.len()));
        reference[off as usize..off as usize + buf.len()].copy_from_slice(&buf);
    };
    for (i, (off, len)) in partial_writes().into_iter().enumerate() {
        let mut buf = vec![0u8; len as usize];
        match i % 3 {
            0 => rng.fill(&mut buf),
            1 => buf.copy_from_slice(&text(len as usize, 100 + i as u64)),
            _ => {
                // Bytes of the /usr part, shifted: compressible, not the same.
                let src = (8 * MIB + rng.below(8 * MIB - len)) as usize;
                buf.copy_from_slice(&reference[src..src + len as usize]);
            }
        }
        put(off, buf, &mut reference, &mut cmds);
    }
    // A compressed page turned all-zero, and one same-filled, in two halves.
    for (page, byte) in [(2 * MIB, 0u8), (3 * MIB + 5 * PAGE, 0xab)] {
        put(page, vec![byte; 2048], &mut reference, &mut cmds);
        put(page + 2048, vec![byte; 2048], &mut reference, &mut cmds);
    }
    // WRITE_ZEROES at unaligned offsets.
    for (off, len) in [(4 * MIB + 3, 10u64), (4 * MIB + PAGE - 7, 3 * PAGE + 9)] {
        cmds.push(format!("write -z {off} {len}"));
        reference[off as usize..(off + len) as usize].fill(0);
    }
    // Trims: pages inside a frame, most of one frame (the scanner then
    // splits what is left of it), a page of the raw tail. They read as zeros.
    for (off, len) in [
        (1536 * KIB + 3 * PAGE, 2 * PAGE),
        (7 * MIB + 64 * KIB + 2 * PAGE, 12 * PAGE),
        (18 * MIB, PAGE),
    ] {
        cmds.push(format!("discard {off} {len}"));
        reference[off as usize..(off + len) as usize].fill(0);
    }
    qemu_io(d.uri(), &cmds);

    let s = d.stats();
    assert_accounting(&s);
    let expect = tmp.path().join("expect.img");
    write_file(&expect, &reference);
    let back = tmp.path().join("back.img");
    nbdcopy(&[d.uri(), p(&back)]);
    assert_same_file(&expect, &back);

    if tiered {
        // Read whole, every page turned hot; the scanner compresses and
        // re-packs them again, and they must still read the same.
        let s = wait_for_stats(
            &d,
            "rewritten pages re-packed into frames",
            settled_in_frames,
        );
        assert_accounting(&s);
        nbdcopy(&[d.uri(), p(&back)]);
        assert_same_file(&expect, &back);
    }
}

#[test]
fn partial_writes_into_lz4_pages_match_a_reference() {
    partial_writes_match_reference(&["--size", "20M", "--compress", "lz4"], false);
}

#[test]
fn partial_writes_into_zstd_frames_match_a_reference() {
    let args = [
        "--size",
        "20M",
        "--compress",
        "zstd",
        "--compress-after",
        "100ms",
        "--recompress",
        "zstd:5",
        "--idle-after",
        "200ms",
    ];
    partial_writes_match_reference(&args, true);
}

// ---------------------------------------------------------------------------
// 3. Concurrent writers and readers on the same pages

/// fio's nbd engine, one connection per job: `writers` jobs each own one
/// `1/writers` slice of every 4 KiB page (strided zones), so they all
/// read-modify-write the same compressed pages; `readers` jobs read whole
/// pages of the same region (turning them hot) meanwhile. Writers verify
/// their slices with crc32c. Returns fio's JSON jobs.
fn fio_shared_pages(
    uri: &str,
    out_dir: &Path,
    tag: &str,
    region: u64,
    writers: u64,
    readers: u64,
    verify_only: bool,
) -> Vec<Value> {
    require_tool("fio");
    let out_file = out_dir.join(format!("{tag}.json"));
    let slice = PAGE / writers;
    let mut c = cmd(
        "fio",
        [
            "--ioengine=nbd".to_string(),
            format!("--uri={uri}"),
            "--output-format=json".into(),
            format!("--output={}", out_file.display()),
            "--iodepth=16".into(),
            // Compressible payloads, so the pages are compressed at all.
            "--buffer_compress_percentage=60".into(),
            "--refill_buffers".into(),
        ],
    );
    for w in 0..writers {
        c.args([
            format!("--name=w{w}"),
            "--rw=write".into(),
            format!("--bs={slice}"),
            format!("--offset={}", w * slice),
            format!("--size={}", region - w * slice),
            // Each writer's slices add up to this; its zones span `region`.
            format!("--io_size={}", region / writers),
            "--zonemode=strided".into(),
            format!("--zonesize={slice}"),
            format!("--zoneskip={}", PAGE - slice),
            "--verify=crc32c".into(),
            "--verify_fatal=1".into(),
        ]);
        if verify_only {
            c.arg("--verify_only");
        }
    }
    if !verify_only {
        for r in 0..readers {
            c.args([
                format!("--name=r{r}"),
                "--rw=randread".into(),
                "--bs=4k".into(),
                "--offset=0".into(),
                format!("--size={region}"),
                "--loops=4".into(),
            ]);
        }
    }
    // fio drops *-verify.state files in its working directory.
    c.current_dir(out_dir);
    let out = run(&mut c, LONG_TIMEOUT);
    let json = fs::read_to_string(&out_file).unwrap_or_default();
    assert!(out.success(), "fio {tag} failed: {out:?}\n{json}");
    let v: Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("fio JSON ({e}):\n{json}"));
    let jobs = v["jobs"].as_array().cloned().unwrap_or_default();
    let want = writers + if verify_only { 0 } else { readers };
    assert_eq!(jobs.len() as u64, want, "fio {tag} ran other jobs: {json}");
    for job in &jobs {
        assert_eq!(job["error"], 0, "fio {tag} job reported an error: {job}");
    }
    jobs
}

#[test]
fn concurrent_subpage_writers_and_readers_with_the_scanner_verify() {
    let tmp = scratch();
    let d = Ramd::start(&[
        "--size",
        "64M",
        "--compress",
        "lz4",
        "--compress-after",
        "50ms",
        "--recompress",
        "zstd",
        "--idle-after",
        "100ms",
        "--compress-threads",
        "2",
    ]);
    let region = 32 * MIB;
    let (writers, readers) = (4, 2);
    let jobs = fio_shared_pages(d.uri(), tmp.path(), "mix", region, writers, readers, false);
    for job in &jobs[..writers as usize] {
        let name = job["jobname"].as_str().unwrap_or("?");
        let written = job["write"]["io_bytes"].as_u64().unwrap_or(0);
        let read = job["read"]["io_bytes"].as_u64().unwrap_or(0);
        assert_eq!(
            written,
            region / writers,
            "writer {name} wrote {written}: {job}"
        );
        assert!(
            read >= written,
            "writer {name} did not verify what it wrote: {job}"
        );
    }
    let s = d.stats();
    assert_accounting(&s);
    assert_eq!(field(&s, "data_pages"), pages(region), "{s}");

    // Once the scanner has compressed and re-packed everything, a new fio
    // process verifies every slice again, out of frames.
    let s = wait_for_stats(&d, "the pages re-packed into frames", settled_in_frames);
    assert_accounting(&s);
    assert!(field(&s, "background_cpu_ns") > 0, "{s}");
    fio_shared_pages(d.uri(), tmp.path(), "mix", region, writers, 0, true);
    assert_accounting(&d.stats());
}

// ---------------------------------------------------------------------------
// 4. ENOSPC at --max-memory

#[test]
fn compressed_disk_holds_more_than_max_memory_then_gives_enospc() {
    let tmp = scratch();
    let mut d = Ramd::start(&["--size", "256M", "--max-memory", "16M", "--compress", "lz4"]);
    let budget = 16 * MIB;

    // 24 MiB of text fits in 16 MiB of memory.
    let txt = tmp.path().join("text.img");
    write_file(&txt, &text((24 * MIB) as usize, 3));
    nbdcopy(&[p(&txt), d.uri()]);
    let s = d.stats();
    assert_accounting(&s);
    assert_eq!(field(&s, "max_memory"), budget, "{s}");
    assert_eq!(field(&s, "data_bytes"), 24 * MIB, "{s}");
    assert!(field(&s, "data_bytes") > budget, "{s}");
    assert!(field(&s, "memory_used") <= budget, "{s}");

    // Random data after it cannot fit: qemu-io fails with ENOSPC.
    let rnd = tmp.path().join("random.img");
    random_file(&rnd, 32 * MIB);
    require_tool("qemu-io");
    let out = run(
        &mut cmd(
            "qemu-io",
            [
                "-f",
                "raw",
                "-c",
                &format!("write -s {} {} {}", p(&rnd), 24 * MIB, 32 * MIB),
                d.uri(),
            ],
        ),
        LONG_TIMEOUT,
    );
    let said = format!("{}{}", out.stdout, out.stderr);
    let out = out.failed();
    assert!(
        said.contains("No space left on device"),
        "qemu-io failed without ENOSPC: {out:?}"
    );
    d.assert_alive();
    let s = d.stats();
    assert_accounting(&s);
    assert!(field(&s, "memory_used") <= budget, "{s}");

    // The text is intact.
    let back = tmp.path().join("back.img");
    nbdcopy(&[d.uri(), p(&back)]);
    fs::OpenOptions::new()
        .write(true)
        .open(&back)
        .unwrap()
        .set_len(24 * MIB)
        .unwrap();
    assert_eq!(sha256(&txt), sha256(&back), "text changed after ENOSPC");

    // Still serving: trimming the random part makes room for new writes.
    qemu_io(
        d.uri(),
        &[
            format!("discard {} {}", 24 * MIB, 232 * MIB),
            format!("write -P 0x5a {} {}", 100 * MIB + 3, MIB),
            format!("read -P 0x5a {} {}", 100 * MIB + 3, MIB),
        ],
    );
    d.assert_alive();
    let s = d.stats();
    assert_accounting(&s);
    assert!(field(&s, "memory_used") <= budget, "{s}");
}

/// With `--compress-after`, pages are written raw and compressed later; a
/// disk whose budget fills with such hot pages must still compress them
/// (under pressure, regardless of age) so that data that fits compressed
/// does fit. 20 MiB of text (about 2:1 with lz4) into a 16 MiB budget:
/// first in one fast nbdcopy, which may run into ENOSPC while the pages are
/// raw; then, once the scanner has compressed them, 1 MiB at a time, where
/// a write that gets ENOSPC must fit after the scanner has caught up.
#[test]
fn tiered_disk_at_max_memory_compresses_hot_pages_to_make_room() {
    require_tool("qemu-io");
    require_tool("nbdcopy");
    let tmp = scratch();
    let budget = 16 * MIB;
    let d = Ramd::start(&[
        "--size",
        "256M",
        "--max-memory",
        "16M",
        "--compress",
        "lz4",
        "--compress-after",
        "1s",
    ]);
    let len = 20 * MIB;
    let data = text(len as usize, 5);
    let src = tmp.path().join("text.img");
    write_file(&src, &data);
    let fast = run(&mut cmd("nbdcopy", [p(&src), d.uri()]), LONG_TIMEOUT);
    if !fast.success() {
        assert!(
            fast.stderr.contains("No space left on device"),
            "nbdcopy failed, not with ENOSPC: {fast:?}"
        );
    }
    // 20s is some 80 passes of the scanner (every 250ms here).
    let s = wait_for_stats_within(
        Duration::from_secs(20),
        &d,
        &format!(
            "the scanner to compress the hot pages (nbdcopy {})",
            if fast.success() {
                "succeeded"
            } else {
                "got ENOSPC"
            }
        ),
        |s| field(s, "hot_pages") == 0,
    );
    assert_accounting(&s);
    assert!(field(&s, "memory_used") <= budget, "{s}");

    let mut enospc = 0;
    for i in 0..len / MIB {
        let piece = tmp.path().join(format!("p{i}"));
        write_file(&piece, &data[(i * MIB) as usize..((i + 1) * MIB) as usize]);
        let write = format!("write -s {} {} {}", p(&piece), i * MIB, MIB);
        let out = run(
            &mut cmd("qemu-io", ["-f", "raw", "-c", &write, d.uri()]),
            LONG_TIMEOUT,
        );
        let said = format!("{}{}", out.stdout, out.stderr);
        if out.success() && !said.contains("failed") {
            continue;
        }
        assert!(
            said.contains("No space left on device"),
            "write of MiB {i} failed, not with ENOSPC: {out:?}"
        );
        enospc += 1;
        // 20s is some 80 passes of the scanner (every 250ms here).
        let s = wait_for_stats_within(
            Duration::from_secs(20),
            &d,
            &format!("the scanner to compress the hot pages after ENOSPC at MiB {i}"),
            |s| field(s, "hot_pages") == 0,
        );
        assert_accounting(&s);
        qemu_io(d.uri(), &[write]);
    }
    let s = d.stats();
    assert_accounting(&s);
    assert_eq!(field(&s, "data_bytes"), len, "{s}");
    assert!(field(&s, "memory_used") <= budget, "{s}");
    let back = tmp.path().join("back.img");
    nbdcopy(&[d.uri(), p(&back)]);
    fs::OpenOptions::new()
        .write(true)
        .open(&back)
        .unwrap()
        .set_len(len)
        .unwrap();
    assert_eq!(
        sha256(&src),
        sha256(&back),
        "data changed ({enospc} ENOSPC retries)"
    );
}

// ---------------------------------------------------------------------------
// 5. Status agrees with itself and with the process

#[test]
fn status_adds_up_and_matches_rss_and_the_table() {
    let tmp = scratch();
    let img = tmp.path().join("usr.img");
    let len = 256 * MIB;
    write_file(&img, &usr_mix(len as usize));
    let d = Ramd::start(&["--size", "512M", "--compress", "zstd"]);
    let rss_start = d.rss();
    nbdcopy(&[p(&img), d.uri()]);
    let s = d.stats();
    assert_accounting(&s);
    assert_eq!(text_field(&s, "compress"), "zstd:3", "{s}");
    let used = field(&s, "memory_used");
    let warm = field(&s["pool"], "warm_bytes");
    assert!(field(&s, "data_bytes") <= len, "{s}");
    assert!(field(&s, "data_bytes") > len / 2, "{s}");
    assert!(
        (ratio(&s) - field(&s, "data_bytes") as f64 / used as f64).abs() < 1e-9,
        "ratio is not data_bytes / memory_used: {s}"
    );
    assert!(ratio(&s) > 1.0, "{s}");

    // RSS grew by about memory_used: at most that plus the warm pool plus
    // 16 MiB and 5% (allocator, stacks, codec contexts), at least that
    // minus 16 MiB.
    let grown = d.rss().saturating_sub(rss_start);
    let slack = 16 * MIB + used / 20;
    assert!(
        grown <= used + warm + slack,
        "RSS grew by {grown} bytes, memory_used is {used}, warm pool {warm}: {s}"
    );
    assert!(
        grown + 16 * MIB >= used,
        "RSS grew by only {grown} bytes but memory_used is {used}: {s}"
    );

    // The table says the same.
    let (row, s) = stable_table_and_json(&d);
    assert_eq!(cell(&row, "ALGORITHM"), "zstd:3", "{row:?}");
    assert_eq!(
        cell(&row, "RATIO"),
        format!("{:.2}", ratio(&s)),
        "{row:?}\n{s}"
    );
    assert_eq!(cell(&row, "IDLE"), "0", "{row:?}");
    assert_cpu_counters_within_process_cpu(&d, &s);
}

#[test]
fn table_names_both_codecs_of_a_tiered_disk() {
    let tmp = scratch();
    let img = tmp.path().join("t.img");
    write_file(&img, &text((4 * MIB) as usize, 9));
    let d = Ramd::start(&[
        "--size",
        "8M",
        "--compress",
        "lz4",
        "--recompress",
        "zstd:9",
        "--idle-after",
        "200ms",
    ]);
    let (row, s) = stable_table_and_json(&d);
    assert_eq!(cell(&row, "ALGORITHM"), "lz4/zstd:9", "{row:?}");
    assert_eq!(
        cell(&row, "RATIO"),
        "-",
        "an empty disk has no ratio: {row:?}"
    );
    assert_eq!(text_field(&s, "recompress"), "zstd:9", "{s}");
    nbdcopy(&[p(&img), d.uri()]);
    let s = wait_for_stats(&d, "the text re-packed into frames", settled_in_frames);
    assert_accounting(&s);
    assert!(field(&s, "frames") > 0, "{s}");
    assert!(
        field(&s, "frame_pages") >= field(&s, "frames"),
        "fewer frame pages than frames: {s}"
    );
    let (row, s) = stable_table_and_json(&d);
    assert_eq!(cell(&row, "ALGORITHM"), "lz4/zstd:9", "{row:?}");
    assert_eq!(
        cell(&row, "RATIO"),
        format!("{:.2}", ratio(&s)),
        "{row:?}\n{s}"
    );
    assert_eq!(
        cell(&row, "IDLE"),
        field(&s, "idle_pages").to_string(),
        "{row:?}\n{s}"
    );
    assert!(ratio(&s) > 2.0, "text in zstd:9 frames: {s}");
}

// ---------------------------------------------------------------------------
// 6. Hot and cold pages

#[test]
fn pages_cool_down_and_whole_page_reads_warm_them_up() {
    let tmp = scratch();
    let img = tmp.path().join("t.img");
    write_file(&img, &text((8 * MIB) as usize, 4));
    // 1s rather than less: "hot right after writing" must hold even if the
    // status call is slow on a loaded machine.
    let d = Ramd::start(&[
        "--size",
        "16M",
        "--compress",
        "zstd",
        "--compress-after",
        "1s",
    ]);
    nbdcopy(&[p(&img), d.uri()]);
    let s = d.stats();
    assert_accounting(&s);
    assert!(
        field(&s, "hot_pages") > 0,
        "nothing hot right after writing: {s}"
    );

    let s = wait_for_stats(&d, "every page compressed", |s| {
        field(s, "hot_pages") == 0 && field(s, "compressed_pages") > 0
    });
    assert_accounting(&s);
    assert_eq!(field(&s, "compressed_pages"), pages(8 * MIB), "{s}");

    // Reads of parts of pages leave them compressed.
    let partial: Vec<String> = (0..64)
        .map(|i| format!("read {} {}", i * 3 * PAGE + 100, PAGE - 200))
        .collect();
    qemu_io(d.uri(), &partial);
    let s = d.stats();
    assert_eq!(
        field(&s, "hot_pages"),
        0,
        "partial reads promoted pages: {s}"
    );

    // One whole read of 1 MiB leaves it compressed too (a backup or a
    // scrub must not blow the disk up)...
    let once = format!("read {} {}", 2 * MIB, MIB);
    qemu_io(d.uri(), std::slice::from_ref(&once));
    let s = d.stats();
    assert_eq!(field(&s, "hot_pages"), 0, "one read promoted pages: {s}");
    // ...reading it again before the scanner's next pass turns it raw. (A
    // pass landing between the two reads resets the count: try again.)
    wait_for_stats(&d, "a second whole read promotes pages", |_| {
        qemu_io(d.uri(), &[once.clone(), once.clone()]);
        field(&d.stats(), "hot_pages") > 0
    });
    let s2 = d.stats();
    assert_accounting(&s2);
    assert!(
        field(&s2, "compressed_pages") < field(&s, "compressed_pages"),
        "{s}\n{s2}"
    );
    assert_eq!(field(&s2, "data_pages"), field(&s, "data_pages"), "{s2}");

    // They cool down again, and the data never changed.
    wait_for_stats(&d, "promoted pages compressed again", |s| {
        field(s, "hot_pages") == 0
    });
    let back = tmp.path().join("back.img");
    nbdcopy(&[d.uri(), p(&back)]);
    fs::OpenOptions::new()
        .write(true)
        .open(&back)
        .unwrap()
        .set_len(8 * MIB)
        .unwrap();
    assert_eq!(sha256(&img), sha256(&back));
}

// ---------------------------------------------------------------------------
// 7. A filesystem disk with compression

/// sha256 of every regular file under `dir`, read with O_DIRECT so a ramd
/// mount answers from the daemon, not from the page cache: "HASH  RELPATH"
/// lines, sorted.
fn tree_hashes(dir: &Path, direct: bool) -> String {
    let py = r#"
import hashlib, mmap, os, sys
root, direct = sys.argv[1], sys.argv[2] == "1"
buf = mmap.mmap(-1, 1 << 20)
out = []
for d, dirs, files in os.walk(root):
    dirs.sort()
    for f in sorted(files):
        path = os.path.join(d, f)
        if os.path.islink(path) or not os.path.isfile(path):
            continue
        h = hashlib.sha256()
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
        size = os.fstat(fd).st_size
        pos = 0
        while pos < size:
            n = os.preadv(fd, [buf], pos)
            if n <= 0:
                raise SystemExit("short read of %s at %d of %d" % (path, pos, size))
            h.update(buf[:min(n, size - pos)])
            pos += n
        os.close(fd)
        out.append("%s  %s" % (h.hexdigest(), os.path.relpath(path, root)))
print("\n".join(out))
"#;
    fs_common::py_ok(py, &[p(dir), if direct { "1" } else { "0" }])
}

#[test]
fn filesystem_disk_with_lz4_and_zstd_frames_keeps_a_copied_tree() {
    use fs_common::FsDisk;
    for t in ["cp", "diff"] {
        require_tool(t);
    }
    // Package directories of /usr/share/doc, in name order, up to ~24 MiB.
    let doc = Path::new("/usr/share/doc");
    let mut dirs: Vec<PathBuf> = fs::read_dir(doc)
        .expect("read /usr/share/doc")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| fs::symlink_metadata(p).is_ok_and(|m| m.is_dir()))
        .collect();
    dirs.sort();
    let mut picked = Vec::new();
    let mut bytes = 0u64;
    for dir in dirs {
        if bytes >= 24 * MIB {
            break;
        }
        let mut files = Vec::new();
        files_under(&dir, &mut files);
        bytes += files
            .iter()
            .filter_map(|f| fs::metadata(f).ok())
            .map(|m| m.len())
            .sum::<u64>();
        picked.push(dir);
    }
    assert!(bytes >= 8 * MIB, "/usr/share/doc holds only {bytes} bytes");

    let disk = FsDisk::mount(&[
        "--size",
        "256M",
        "--compress",
        "lz4",
        "--recompress",
        "zstd",
        "--idle-after",
        "200ms",
    ]);
    let dst = disk.join("doc");
    fs::create_dir(&dst).unwrap();
    let mut c = cmd("cp", ["-a"]);
    c.args(&picked).arg(&dst);
    run(&mut c, LONG_TIMEOUT).ok();
    let want = {
        // The same subset, from the source, as relative paths under "doc".
        let mut lines: Vec<String> = Vec::new();
        for dir in &picked {
            let name = dir.file_name().unwrap().to_str().unwrap();
            for line in tree_hashes(dir, false).lines().filter(|l| !l.is_empty()) {
                let (h, rel) = line.split_once("  ").unwrap();
                lines.push(format!("{h}  {name}/{rel}"));
            }
        }
        lines
    };

    let mut s = Value::Null;
    wait_until(SCANNER_DEADLINE, "file pages re-packed into frames", || {
        s = disk.status();
        settled_in_frames(&s)
    });
    assert_accounting(&s);
    assert_eq!(text_field(&s, "compress"), "lz4", "{s}");
    assert_eq!(text_field(&s, "recompress"), "zstd:3", "{s}");
    assert!(ratio(&s) > 1.0, "ratio of a copy of /usr/share/doc: {s}");

    // Read back from the daemon (O_DIRECT) and through the page cache.
    let mut got: Vec<String> = tree_hashes(&dst, true)
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    let mut want = want;
    got.sort();
    want.sort();
    if got != want {
        let first = got
            .iter()
            .zip(&want)
            .find(|(g, w)| g != w)
            .map(|(g, w)| format!("ramd:   {g}\nsource: {w}"))
            .unwrap_or_else(|| {
                format!("{} files on ramd, {} in the source", got.len(), want.len())
            });
        panic!("the copied tree reads back differently (O_DIRECT):\n{first}");
    }
    for dir in &picked {
        let mut c = cmd("diff", ["-r", "--no-dereference"]);
        c.arg(dir).arg(dst.join(dir.file_name().unwrap()));
        run(&mut c, LONG_TIMEOUT).ok();
    }
    assert_accounting(&disk.status());
    disk.stop();
}

/// fsx (every operation: unaligned writes, mmap, truncate, punch hole,
/// copy_file_range...) checks every byte it reads on a filesystem disk whose
/// pages turn hot, compressed and framed under it.
#[test]
fn fsx_on_a_tiered_compressed_filesystem_disk_keeps_every_byte() {
    use fs_common::{cargo_tool, FsDisk};
    let bin = cargo_tool("fsx");
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fsx/fsx.toml");
    let mut disk = FsDisk::mount(&[
        "--size",
        "64M",
        "--compress",
        "lz4",
        "--compress-after",
        "50ms",
        "--recompress",
        "zstd",
        "--idle-after",
        "100ms",
    ]);
    let artifacts = scratch();
    let mut c = std::process::Command::new(bin);
    c.arg("-f")
        .arg(&config)
        .args(["-N", "8000", "-S", "31337"])
        .arg("-P")
        .arg(artifacts.path())
        .arg(disk.join("fsx.bin"));
    let out = run(&mut c, LONG_TIMEOUT);
    let said = format!("{}{}", out.stdout, out.stderr);
    if !out.success() || !said.contains("All operations completed A-OK!") {
        let log = fs::read_dir(artifacts.path())
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().ends_with(".fsxlog"))
            .map(|e| fs::read_to_string(e.path()).unwrap_or_default())
            .unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        panic!(
            "fsx failed ({}): {}\n--- output ---\n{said}\n--- last operations ---\n{}",
            out.status,
            out.what,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let s = disk.status();
    assert_accounting(&s);
    assert!(
        field(&s, "background_cpu_ns") > 0,
        "the scanner never ran: {s}"
    );
    disk.assert_alive();
    disk.stop();
}

// ---------------------------------------------------------------------------
// 8. Bad input

#[test]
fn bad_codecs_and_durations_are_rejected() {
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["--compress", "lzo"],
            &["lzo", "valid codecs", "lz4", "zstd"],
        ),
        (
            &["--compress", "zstd:0"],
            &["zstd:0", "1..=19", "valid codecs"],
        ),
        (
            &["--compress", "zstd:20"],
            &["zstd:20", "1..=19", "valid codecs"],
        ),
        (
            &["--compress", "lz4:1"],
            &["lz4:1", "no level", "valid codecs"],
        ),
        (&["--recompress", "gzip"], &["gzip", "valid codecs"]),
        (&["--compress-after", "5s"], &["compress", "codec"]),
        (
            &["--compress", "lz4", "--idle-after", "5x"],
            &["5x", "duration"],
        ),
        (
            &["--compress", "lz4", "--compress-after", "soon"],
            &["soon", "duration"],
        ),
    ];
    for (extra, needles) in cases {
        let run_dir = scratch();
        let mut args = vec!["--size", "16M"];
        args.extend_from_slice(extra);
        let (status, stderr) = match Ramd::try_start_in(run_dir.path(), &args) {
            Ok(mut d) => {
                d.stop();
                panic!("ramd serve {args:?} started; it should have refused");
            }
            Err(e) => e,
        };
        assert!(status.starts_with("exited"), "{args:?}: {status}\n{stderr}");
        assert!(
            !status.contains("exit status: 0"),
            "{args:?}: {status}\n{stderr}"
        );
        for n in *needles {
            assert!(
                stderr.contains(n),
                "error for {args:?} does not mention {n:?}:\n{stderr}"
            );
        }
        // Nothing left running or listening.
        let st = status_json(run_dir.path());
        assert_eq!(
            st["disks"].as_array().map(Vec::len),
            Some(0),
            "{args:?} left a disk behind: {st}"
        );
        let left: Vec<_> = fs::read_dir(run_dir.path())
            .unwrap()
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert!(left.is_empty(), "{args:?} left {left:?} in the run dir");
    }
}
