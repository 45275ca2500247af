//! The MANIFEST: the chain of saves that make up an image's latest
//! complete save (`Manifest`, one `SegEntry` a save), and its text, both
//! versions (FORMAT.md, *MANIFEST*).

use std::path::Path;

use crate::error::{Error, Result};
use crate::identity::DiskId;

use super::format::{DiskKind, MANIFEST_MAGIC, MANIFEST_MAGIC_V1};

/// One save in the chain, as the MANIFEST lists it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SegEntry {
    pub seq: u64,
    pub full: bool,
    /// Page records (frame members counted one by one).
    pub pages: u64,
    /// Records, END excluded.
    pub records: u64,
    /// Length of the segment file.
    pub bytes: u64,
    /// When the save's switch happened (ns since the epoch).
    pub time_ns: u64,
}

/// The chain of saves that make up an image's latest complete save.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Manifest {
    #[serde(serialize_with = "kind_name")]
    pub kind: DiskKind,
    /// The disk's size in bytes (an fs disk's capacity; 0: unlimited).
    pub size: u64,
    /// The disk's identity (`None` in a version 1 MANIFEST, written before
    /// there were identities).
    pub id: Option<DiskId>,
    /// The full save first, then the incremental saves in order.
    pub chain: Vec<SegEntry>,
}

pub(super) fn kind_name<S: serde::Serializer>(
    k: &DiskKind,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_str(k.name())
}

impl Manifest {
    /// Bytes of all segments in the chain.
    pub fn bytes(&self) -> u64 {
        self.chain.iter().map(|s| s.bytes).sum()
    }

    pub(super) fn encode(&self) -> String {
        let mut t = match self.id {
            Some(id) => format!(
                "{MANIFEST_MAGIC}\nkind {}\nsize {}\nid {id}\n",
                self.kind.name(),
                self.size
            ),
            None => format!(
                "{MANIFEST_MAGIC_V1}\nkind {}\nsize {}\n",
                self.kind.name(),
                self.size
            ),
        };
        for s in &self.chain {
            t += &format!(
                "seg {} {} pages={} records={} bytes={} time={}\n",
                s.seq,
                if s.full { "full" } else { "incr" },
                s.pages,
                s.records,
                s.bytes,
                s.time_ns
            );
        }
        let crc = crc32c::crc32c(t.as_bytes());
        t + &format!("crc32c {crc:08x}\n")
    }

    pub(super) fn decode(path: &Path, text: &[u8]) -> Result<Manifest> {
        let bad = |offset: usize, reason: &str| Error::Image {
            file: path.to_path_buf(),
            offset: offset as u64,
            reason: reason.to_string(),
        };
        let text = std::str::from_utf8(text).map_err(|e| bad(e.valid_up_to(), "not text"))?;
        let Some(at) = text.rfind("crc32c ") else {
            return Err(bad(0, "not a ramd image MANIFEST (no checksum line)"));
        };
        let want = text[at..]
            .strip_prefix("crc32c ")
            .and_then(|v| v.strip_suffix('\n'))
            .and_then(|v| u32::from_str_radix(v, 16).ok())
            .ok_or_else(|| bad(at, "bad checksum line"))?;
        if crc32c::crc32c(&text.as_bytes()[..at]) != want {
            return Err(bad(at, "checksum mismatch"));
        }
        let mut kind = None;
        let mut size = None;
        let mut id = None;
        let mut v1 = false;
        let mut chain = Vec::new();
        let mut offset = 0;
        for (n, line) in text[..at].lines().enumerate() {
            let here = offset;
            offset += line.len() + 1;
            let words: Vec<&str> = line.split(' ').collect();
            match (n, words.as_slice()) {
                (0, _) if line == MANIFEST_MAGIC => {}
                (0, _) if line == MANIFEST_MAGIC_V1 => v1 = true,
                (0, _) => return Err(bad(0, "not a ramd image MANIFEST, or a newer version")),
                (_, ["kind", "block"]) => kind = Some(DiskKind::Block),
                (_, ["kind", "fs"]) => kind = Some(DiskKind::Fs),
                (_, ["size", v]) => size = v.parse().ok(),
                (_, ["id", v]) if !v1 && id.is_none() => {
                    id = Some(
                        v.parse::<DiskId>()
                            .map_err(|e| bad(here, &format!("bad id: {e}")))?,
                    )
                }
                (_, ["seg", seq, full, rest @ ..]) if rest.len() == 4 => {
                    let field = |i: usize, name: &str| -> Option<u64> {
                        rest[i].strip_prefix(name)?.strip_prefix('=')?.parse().ok()
                    };
                    let entry = (|| {
                        Some(SegEntry {
                            seq: seq.parse().ok()?,
                            full: match *full {
                                "full" => true,
                                "incr" => false,
                                _ => return None,
                            },
                            pages: field(0, "pages")?,
                            records: field(1, "records")?,
                            bytes: field(2, "bytes")?,
                            time_ns: field(3, "time")?,
                        })
                    })()
                    .ok_or_else(|| bad(here, "bad seg line"))?;
                    chain.push(entry);
                }
                _ => return Err(bad(here, &format!("unknown line {line:?}"))),
            }
        }
        let kind = kind.ok_or_else(|| bad(0, "no kind line"))?;
        let size = size.ok_or_else(|| bad(0, "no size line"))?;
        if !v1 && id.is_none() {
            return Err(bad(0, "no id line"));
        }
        let ok = chain.first().is_some_and(|s| s.full)
            && chain.iter().skip(1).all(|s| !s.full)
            && chain.windows(2).all(|w| w[0].seq < w[1].seq);
        if !ok {
            return Err(bad(
                0,
                "the chain must be one full save then incremental ones in order",
            ));
        }
        Ok(Manifest {
            kind,
            size,
            id,
            chain,
        })
    }
}
