//! The image format's constants, record kinds and headers (FORMAT.md), and
//! `decode_record`, which checks a record's contents fully.

use aligned_vec::{AVec, ConstAlign};

use crate::codec::{self, Codec};
use crate::error::{Error, Result};
use crate::store::PageRef;
use crate::sys::PAGE_SIZE;

pub const MANIFEST: &str = "MANIFEST";
/// An image in object storage: the object naming the one writer allowed
/// to commit (FORMAT.md, *Object storage*).
pub const LEASE: &str = "LEASE";
/// The MANIFEST's first line: version 2 adds the disk's `id` line.
pub(super) const MANIFEST_MAGIC: &str = "ramd image 2";
/// A MANIFEST without an `id` (written before version 2), still read.
pub(super) const MANIFEST_MAGIC_V1: &str = "ramd image 1";
pub(super) const SEG_MAGIC: &[u8; 8] = b"RAMDSEG\0";
pub(super) const SEG_VERSION: u16 = 1;
pub const SEG_HEADER: usize = 64;
pub const REC_HEADER: usize = 32;
/// Buffered bytes a writer sends to the file at once.
pub(super) const WRITE_BATCH: usize = 1 << 20;
/// Largest record payload: a frame object or a filesystem's tree.
pub(super) const MAX_PAYLOAD: usize = 1 << 30;
/// Segments are written and read with O_DIRECT, which wants buffers, file
/// offsets and lengths aligned to the device's logical block: 4 KiB covers
/// the usual ones.
pub(super) const DIO_ALIGN: usize = 4096;

/// A buffer O_DIRECT accepts.
pub(super) type Buf = AVec<u8, ConstAlign<DIO_ALIGN>>;

pub(super) fn new_buf() -> Buf {
    Buf::with_capacity(DIO_ALIGN, WRITE_BATCH + (128 << 10))
}

// Record types.
pub(super) const R_RAW: u8 = 1;
pub(super) const R_PACKED: u8 = 2;
pub(super) const R_FILL: u8 = 3;
pub(super) const R_HOLE: u8 = 4;
pub(super) const R_FRAME: u8 = 5;
pub(super) const R_GONE: u8 = 6;
pub(super) const R_META: u8 = 7;
pub(super) const R_END: u8 = 0xff;

/// What kind of disk an image holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskKind {
    Block,
    Fs,
}

impl DiskKind {
    pub fn name(self) -> &'static str {
        match self {
            DiskKind::Block => "block",
            DiskKind::Fs => "fs",
        }
    }

    pub(super) fn id(self) -> u8 {
        match self {
            DiskKind::Block => 1,
            DiskKind::Fs => 2,
        }
    }
}

/// One record of a segment, as read.
#[derive(Debug)]
pub enum Record<'a> {
    Page(u64, PageRef<'a>),
    Frame {
        key: u64,
        mask: u64,
        data: &'a [u8],
    },
    Gone(u64),
    /// A filesystem's whole tree (META variant 0): replaces the tree.
    Meta(&'a [u8]),
    /// A change to the tree of the saves before it (META variant 1): the
    /// filesystem applies it (see [`TreeChain`]).
    MetaDelta(&'a [u8]),
}

/// A filesystem's tree as a chain's META records hold it: the last whole
/// tree and the deltas after it, in order, for the filesystem to apply
/// (this crate does not know the tree's format).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeChain {
    pub whole: Vec<u8>,
    pub deltas: Vec<Vec<u8>>,
}

impl TreeChain {
    /// Takes `rec` if it is a META record: a whole tree starts the chain
    /// again, a delta joins it. A delta with no whole tree before it is
    /// damage (the caller names where it is).
    pub fn add(chain: &mut Option<TreeChain>, rec: &Record<'_>) -> Result<()> {
        match *rec {
            Record::Meta(m) => {
                *chain = Some(TreeChain {
                    whole: m.to_vec(),
                    deltas: Vec::new(),
                })
            }
            Record::MetaDelta(d) => {
                match chain {
                    Some(c) => c.deltas.push(d.to_vec()),
                    None => return Err(Error::Corrupt(
                        "a change to the filesystem's tree (META variant 1) with no whole tree \
                         before it in the chain"
                            .into(),
                    )),
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Decompresses what a record holds, to check it fully (`ramd image verify`)
/// or to write it out raw (`export`): `out` gets `(page, bytes)` pairs.
pub fn decode_record(
    rec: &Record<'_>,
    mut out: impl FnMut(u64, &[u8]) -> Result<()>,
) -> Result<()> {
    let mut page = [0u8; PAGE_SIZE];
    match *rec {
        Record::Page(p, PageRef::Hole) => out(p, &[0u8; PAGE_SIZE]),
        Record::Page(p, PageRef::Fill(pat)) => {
            for c in page.chunks_exact_mut(8) {
                c.copy_from_slice(&pat.to_ne_bytes());
            }
            out(p, &page)
        }
        Record::Page(p, PageRef::Raw { data, .. }) => out(p, data),
        Record::Page(p, PageRef::Packed { zstd, data }) => {
            let c = if zstd { Codec::Zstd(0) } else { Codec::Lz4 };
            codec::decompress(c, data, &mut page)?;
            out(p, &page)
        }
        Record::Page(_, PageRef::Frame { .. }) => unreachable!("frames are Record::Frame"),
        Record::Frame { key, mask, data } => {
            if data.len() < 8 {
                return Err(Error::Corrupt("frame shorter than its header".into()));
            }
            let (start, n) = (data[0] as usize, data[1] as usize);
            let c = match data[2] {
                1 => Codec::Lz4,
                2 => Codec::Zstd(0),
                id => return Err(Error::Corrupt(format!("frame codec id {id}"))),
            };
            let mut plain = vec![0u8; n * PAGE_SIZE];
            codec::decompress(c, &data[8..], &mut plain)?;
            for i in (0..64).filter(|&i| mask & 1 << i != 0) {
                if i < start || i >= start + n {
                    return Err(Error::Corrupt(format!(
                        "frame member {i} outside {start}..{}",
                        start + n
                    )));
                }
                out(
                    key.saturating_mul(64).saturating_add(i as u64),
                    &plain[(i - start) * PAGE_SIZE..][..PAGE_SIZE],
                )?;
            }
            Ok(())
        }
        Record::Gone(key) => {
            for i in 0..64 {
                out(key.saturating_mul(64).saturating_add(i), &[0u8; PAGE_SIZE])?;
            }
            Ok(())
        }
        Record::Meta(_) | Record::MetaDelta(_) => Ok(()),
    }
}
