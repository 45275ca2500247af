//! Page codecs: what `--compress` and `--recompress` name, and the calls that
//! run them. Contexts are per thread (a zstd context costs ~1 MiB and a
//! microsecond or two to set up, so one per call would dominate a 4 KiB page).

use std::cell::RefCell;
use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// zstd levels ramd accepts: the ones the `zstd` tool takes without `--ultra`.
pub const ZSTD_LEVELS: std::ops::RangeInclusive<i32> = 1..=19;
/// zstd's own default level.
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;

#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum Codec {
    /// Pages are stored as they are.
    #[default]
    None,
    /// LZ4 block format: fast, zram's usual choice.
    Lz4,
    /// zstd at a level in [`ZSTD_LEVELS`]: slower, denser.
    Zstd(i32),
}

impl Codec {
    pub fn is_none(self) -> bool {
        self == Codec::None
    }

    /// What `ramd status` shows in its ALGORITHM column.
    pub fn name(self) -> &'static str {
        match self {
            Codec::None => "none",
            Codec::Lz4 => "lz4",
            Codec::Zstd(_) => "zstd",
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Codec::Zstd(level) => write!(f, "zstd:{level}"),
            c => f.write_str(c.name()),
        }
    }
}

impl FromStr for Codec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Codec> {
        let (name, level) = match s.split_once(':') {
            Some((n, l)) => (n, Some(l)),
            None => (s, None),
        };
        let valid = "valid codecs: none, lz4, zstd, zstd:LEVEL with LEVEL 1..=19";
        match (name, level) {
            ("none", None) => Ok(Codec::None),
            ("lz4", None) => Ok(Codec::Lz4),
            ("zstd", None) => Ok(Codec::Zstd(ZSTD_DEFAULT_LEVEL)),
            ("zstd", Some(l)) => match l.parse::<i32>() {
                Ok(n) if ZSTD_LEVELS.contains(&n) => Ok(Codec::Zstd(n)),
                _ => Err(Error::Invalid(format!(
                    "zstd level {l:?} is not one of 1..=19 ({valid})"
                ))),
            },
            ("none" | "lz4", Some(_)) => Err(Error::Invalid(format!(
                "codec {name:?} takes no level ({valid})"
            ))),
            _ => Err(Error::Invalid(format!("unknown codec {s:?} ({valid})"))),
        }
    }
}

struct Contexts {
    zstd_c: Option<(i32, zstd::bulk::Compressor<'static>)>,
    zstd_d: Option<zstd::bulk::Decompressor<'static>>,
}

thread_local! {
    static CONTEXTS: RefCell<Contexts> = const {
        RefCell::new(Contexts { zstd_c: None, zstd_d: None })
    };
}

/// Compresses `src` into `dst`; `None` if the result would not fit in `dst`
/// (the caller sizes `dst` to the largest result worth keeping, so an
/// incompressible page is given up on early).
pub(crate) fn compress(codec: Codec, src: &[u8], dst: &mut [u8]) -> Option<usize> {
    match codec {
        Codec::None => None,
        // liblz4's default (acceleration 1, as the kernel's zram uses): it
        // stops as soon as the output would overflow `dst`.
        Codec::Lz4 => lz4::block::compress_to_buffer(src, None, false, dst).ok(),
        Codec::Zstd(level) => CONTEXTS.with_borrow_mut(|cx| {
            let ctx = match &mut cx.zstd_c {
                Some((l, c)) if *l == level => c,
                slot => {
                    let mut c = zstd::bulk::Compressor::new(level).ok()?;
                    // The page table knows sizes; the frame need not repeat them.
                    c.include_checksum(false).ok()?;
                    c.include_contentsize(false).ok()?;
                    c.include_dictid(false).ok()?;
                    &mut slot.insert((level, c)).1
                }
            };
            ctx.compress_to_buffer(src, dst).ok()
        }),
    }
}

/// Decompresses `src`, which must expand to exactly `dst.len()` bytes.
pub(crate) fn decompress(codec: Codec, src: &[u8], dst: &mut [u8]) -> Result<()> {
    let n = match codec {
        Codec::None => return Err(Error::Corrupt("page stored with codec none".into())),
        Codec::Lz4 => lz4::block::decompress_to_buffer(src, Some(dst.len() as i32), dst)
            .map_err(|e| Error::Corrupt(format!("lz4: {e}")))?,
        Codec::Zstd(_) => CONTEXTS.with_borrow_mut(|cx| {
            let d = match &mut cx.zstd_d {
                Some(d) => d,
                slot => slot.insert(
                    zstd::bulk::Decompressor::new()
                        .map_err(|e| Error::Corrupt(format!("zstd context: {e}")))?,
                ),
            };
            d.decompress_to_buffer(src, dst)
                .map_err(|e| Error::Corrupt(format!("zstd: {e}")))
        })?,
    };
    if n != dst.len() {
        return Err(Error::Corrupt(format!(
            "{} object expanded to {n} bytes, expected {}",
            codec.name(),
            dst.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_names_codecs() {
        assert_eq!("none".parse::<Codec>().unwrap(), Codec::None);
        assert_eq!("lz4".parse::<Codec>().unwrap(), Codec::Lz4);
        assert_eq!("zstd".parse::<Codec>().unwrap(), Codec::Zstd(3));
        assert_eq!("zstd:19".parse::<Codec>().unwrap(), Codec::Zstd(19));
        assert_eq!(Codec::Zstd(7).to_string(), "zstd:7");
        for bad in ["lzo", "zstd:0", "zstd:20", "zstd:x", "lz4:1", "", "ZSTD"] {
            let e = bad.parse::<Codec>().unwrap_err().to_string();
            assert!(e.contains("valid codecs"), "{bad:?}: {e}");
        }
    }

    #[test]
    fn round_trips_and_gives_up_on_noise() {
        let text: Vec<u8> = b"ramd keeps pages compressed. ".repeat(150)[..4096].to_vec();
        let mut rng = fastrand::Rng::with_seed(0x9E37_79B9_7F4A_7C15);
        let noise: Vec<u8> = std::iter::repeat_with(|| rng.u8(..)).take(4096).collect();
        for codec in [Codec::Lz4, Codec::Zstd(1), Codec::Zstd(19)] {
            let mut out = [0u8; 3584];
            let n = compress(codec, &text, &mut out).expect("text compresses");
            assert!(n < 512, "{codec}: {n}");
            let mut back = [0u8; 4096];
            decompress(codec, &out[..n], &mut back).unwrap();
            assert_eq!(&back[..], &text[..]);
            assert_eq!(compress(codec, &noise, &mut out), None, "{codec}");
            assert!(decompress(codec, &out[..n / 2], &mut back).is_err());
        }
    }
}
