//! The image reader's fuzz harness: arbitrary bytes become a MANIFEST and a
//! segment file in a scratch directory, which `ramd_store::persist` then
//! reads and decodes as `ramd image verify` does.
//!
//! Checksums guard every part of an image, so raw bytes would almost never
//! get past them. The harness therefore writes the checksums (and, in
//! segment mode, the header fields the MANIFEST must agree with) itself,
//! following FORMAT.md, and leaves everything else to the fuzzer. Input:
//!
//! - byte 0, bit 0 clear (MANIFEST mode): bytes 1..3 are a little-endian
//!   length `m`; the next `m` bytes are the MANIFEST's text, to which the
//!   harness appends its `crc32c` line; the rest is `seg-00000001`, as is.
//! - byte 0, bit 0 set (segment mode): the rest is segment 1. The harness
//!   sets the magic, version, header length, "full", chain and page size
//!   fields and the header's CRC; walks the records to fix each one's CRC
//!   (and, unless bit 1 is set, the END record's counts); and writes the
//!   MANIFEST that agrees with it all.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

// The one place that names the reader (it may move to `persist::reader`).
use ramd_store::persist as reader;

const SEG_HEADER: usize = 64;
const REC_HEADER: usize = 32;
const R_FRAME: u8 = 5;
const R_END: u8 = 0xff;

fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = Path::new("/dev/shm");
        let base = if base.is_dir() {
            base.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        let dir = base.join(format!("ramd-fuzz-image-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    })
}

fn with_crc_line(text: &[u8]) -> Vec<u8> {
    let crc = crc32c::crc32c(text);
    let mut v = text.to_vec();
    v.extend_from_slice(format!("crc32c {crc:08x}\n").as_bytes());
    v
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// Makes `seg` pass every checksum and returns the MANIFEST text for it.
fn fix_segment(seg: &mut Vec<u8>, fix_end: bool) -> Vec<u8> {
    if seg.len() < SEG_HEADER {
        seg.resize(SEG_HEADER, 0);
    }
    seg[..8].copy_from_slice(b"RAMDSEG\0");
    seg[8..10].copy_from_slice(&1u16.to_le_bytes());
    seg[10..12].copy_from_slice(&(SEG_HEADER as u16).to_le_bytes());
    seg[13] = 1; // full
    let seq = le64(seg, 16);
    seg.copy_within(16..24, 24); // its own chain
    seg[48..52].copy_from_slice(&4096u32.to_le_bytes());
    let crc = crc32c::crc32c(&seg[..60]);
    seg[60..64].copy_from_slice(&crc.to_le_bytes());
    let (mut records, mut pages) = (0u64, 0u64);
    let mut at = SEG_HEADER;
    while at + REC_HEADER <= seg.len() {
        let ty = seg[at + 4];
        let plen = u32::from_le_bytes(seg[at + 8..at + 12].try_into().unwrap()) as usize;
        let end = at + REC_HEADER + plen.next_multiple_of(8);
        if end > seg.len() {
            break;
        }
        if ty == R_END && fix_end {
            seg[at + 16..at + 24].copy_from_slice(&records.to_le_bytes());
            seg[at + 24..at + 32].copy_from_slice(&pages.to_le_bytes());
        }
        let crc = crc32c::crc32c_append(crc32c::crc32c(&seg[at + 4..at + 32]), &seg[at + 32..end]);
        seg[at..at + 4].copy_from_slice(&crc.to_le_bytes());
        if ty == R_END {
            break;
        }
        records += 1;
        pages += match ty {
            1..=4 => 1,
            R_FRAME => le64(seg, at + 24).count_ones() as u64,
            _ => 0,
        };
        at = end;
    }
    let kind = if seg[12] == 2 { "fs" } else { "block" };
    format!(
        "ramd image 1\nkind {kind}\nsize {}\nseg {seq} full pages={pages} records={records} bytes={} time={}\n",
        le64(seg, 32),
        seg.len(),
        le64(seg, 40),
    )
    .into_bytes()
}

/// One input: build the image, read it back, decode every record.
pub fn image(data: &[u8]) {
    let (&mode, rest) = data.split_first().unwrap_or((&0, &[]));
    let (manifest, seg) = if mode & 1 == 0 {
        let m = rest
            .get(..2)
            .map_or(0, |b| u16::from_le_bytes([b[0], b[1]]) as usize);
        let rest = rest.get(2..).unwrap_or(&[]);
        let m = m.min(rest.len());
        (with_crc_line(&rest[..m]), rest[m..].to_vec())
    } else {
        let mut seg = rest.to_vec();
        let text = fix_segment(&mut seg, mode & 2 == 0);
        (with_crc_line(&text), seg)
    };
    let dir = scratch();
    std::fs::write(dir.join(reader::MANIFEST), &manifest).expect("write MANIFEST");
    std::fs::write(dir.join("seg-00000001"), &seg).expect("write segment");
    let Ok(image) = reader::ImageDir::open_existing(dir) else {
        return;
    };
    let _ = image.read_chain(
        |rec| {
            reader::decode_record(&rec, |_, page| {
                assert_eq!(page.len(), 4096, "a decoded page is a page");
                Ok(())
            })
        },
        |done, total| assert!(done <= total, "progress {done} of {total}"),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kept input and regression case, replayed.
    #[test]
    fn image_corpus_replays() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus/image");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap() {
            image(&std::fs::read(e.unwrap().path()).unwrap());
            n += 1;
        }
        assert!(n > 0, "no corpus in {}", dir.display());
    }
}
