//! What the tests know of the image layout (FORMAT.md), to find and damage
//! records: a 64-byte segment header with a CRC-32C over bytes 0..60;
//! records of a 32-byte header (CRC-32C at 0 over the rest, type at 4,
//! payload length at 8, `a` at 16, `b` at 24), the payload, zeros to a
//! multiple of 8; END (type 255) last. MANIFEST is text whose last line is
//! `crc32c HEX` over every byte before it.

use std::fs;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

pub const RAW: u8 = 1;
pub const PACKED: u8 = 2;
pub const FILL: u8 = 3;
pub const META: u8 = 7;
pub const END: u8 = 255;

/// CRC-32C (Castagnoli), bit by bit: slow and obviously right.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in data {
        crc ^= b as u32;
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A record of a segment file: its offset, type, payload length and `a`.
#[derive(Debug, Clone)]
pub struct Rec {
    pub off: u64,
    pub kind: u8,
    pub len: u64,
    pub a: u64,
}

/// The records of a segment file, checking the header and every record's
/// checksum on the way (so the test's idea of the layout is right).
pub fn records(seg: &Path) -> Vec<Rec> {
    walk(seg, true)
}

/// The records of a segment file that a test may have damaged already: no
/// checksum is checked.
pub fn records_unchecked(seg: &Path) -> Vec<Rec> {
    walk(seg, false)
}

fn walk(seg: &Path, check: bool) -> Vec<Rec> {
    let data = fs::read(seg).unwrap();
    assert_eq!(&data[..8], b"RAMDSEG\0", "{seg:?}: magic");
    let hcrc = u32::from_le_bytes(data[60..64].try_into().unwrap());
    if check {
        assert_eq!(
            crc32c(&data[..60]),
            hcrc,
            "{seg:?}: header CRC as FORMAT.md says"
        );
    }
    let mut out = Vec::new();
    let mut off = 64usize;
    loop {
        let h = &data[off..off + 32];
        let len = u32::from_le_bytes(h[8..12].try_into().unwrap()) as usize;
        let padded = len.div_ceil(8) * 8;
        let crc = u32::from_le_bytes(h[..4].try_into().unwrap());
        if check {
            assert_eq!(
                crc32c(&data[off + 4..off + 32 + padded]),
                crc,
                "{seg:?}: record at {off}: CRC as FORMAT.md says"
            );
        }
        let rec = Rec {
            off: off as u64,
            kind: h[4],
            len: len as u64,
            a: u64::from_le_bytes(h[16..24].try_into().unwrap()),
        };
        off += 32 + padded;
        let end = rec.kind == END;
        out.push(rec);
        if end {
            break;
        }
    }
    if check {
        assert_eq!(off, data.len(), "{seg:?}: bytes after END");
    }
    out
}

/// The committed segment files of an image directory, in order.
pub fn segments(img: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(img)
        .unwrap_or_else(|e| panic!("read_dir {img:?}: {e}"))
        .map(|e| e.unwrap().path())
        .filter(|f| {
            let n = f.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with("seg-") && !n.ends_with(".tmp")
        })
        .collect();
    v.sort();
    v
}

/// Flips bits of the byte at `at` of `f`.
pub fn flip_byte(f: &Path, at: u64) {
    let file = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(f)
        .unwrap();
    let mut b = [0u8];
    file.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0x5a;
    file.write_all_at(&b, at).unwrap();
}
