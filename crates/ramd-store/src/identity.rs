//! A disk's identity: a random (version 4) UUID made with the disk and
//! kept in its image's MANIFEST (FORMAT.md), or made anew at each start
//! for a disk without an image. The iSCSI LUN's NAA designator and unit
//! serial number and the NBD export's description come from it, so that
//! two hosts serving disks of one name never present one device.

use std::fmt;
use std::str::FromStr;

/// A disk's UUID.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DiskId([u8; 16]);

impl DiskId {
    /// A new identity from the kernel's random source.
    pub fn random() -> DiskId {
        let mut b = [0u8; 16];
        // getrandom fails only on a kernel without getrandom(2) and without
        // /dev/urandom: nothing ramd can serve on.
        getrandom::getrandom(&mut b).expect("getrandom: no random source");
        b[6] = (b[6] & 0x0f) | 0x40; // version 4
        b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
        DiskId(b)
    }

    pub fn bytes(&self) -> &[u8; 16] {
        &self.0
    }

    /// 64 bits for the NAA designator: the UUID's halves folded together,
    /// so that the version and variant bits (fixed) cost no randomness.
    pub fn folded(&self) -> u64 {
        let hi = u64::from_be_bytes(self.0[..8].try_into().expect("8 bytes"));
        let lo = u64::from_be_bytes(self.0[8..].try_into().expect("8 bytes"));
        hi ^ lo
    }
}

impl fmt::Display for DiskId {
    /// The usual form: 8-4-4-4-12 lower-case hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for DiskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DiskId({self})")
    }
}

impl FromStr for DiskId {
    type Err = String;

    /// Only the form `Display` writes: a MANIFEST holds nothing else.
    fn from_str(s: &str) -> Result<DiskId, String> {
        let bad = || format!("{s:?} is not a UUID (8-4-4-4-12 hex digits)");
        let groups: Vec<&str> = s.split('-').collect();
        let lens: Vec<usize> = groups.iter().map(|g| g.len()).collect();
        if lens != [8, 4, 4, 4, 12] {
            return Err(bad());
        }
        let hex: String = groups.concat();
        // Checked whole first: slicing below is then on ASCII only.
        if !hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad());
        }
        let mut b = [0u8; 16];
        for (i, out) in b.iter_mut().enumerate() {
            *out = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(DiskId(b))
    }
}

impl serde::Serialize for DiskId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_are_v4_differ_and_round_trip() {
        let a = DiskId::random();
        let b = DiskId::random();
        assert_ne!(a, b);
        let text = a.to_string();
        assert_eq!(text.len(), 36);
        assert_eq!(&text[14..15], "4", "{text}");
        assert!(matches!(&text[19..20], "8" | "9" | "a" | "b"), "{text}");
        assert_eq!(text.parse::<DiskId>().unwrap(), a);
        assert_ne!(a.folded(), b.folded());
    }

    #[test]
    fn only_the_canonical_form_parses() {
        let ok = "0f8c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f";
        assert_eq!(ok.parse::<DiskId>().unwrap().to_string(), ok);
        for bad in [
            "",
            "0f8c1d2e3a4b4c5d8e6f7a8b9c0d1e2f",
            "0F8C1D2E-3A4B-4C5D-8E6F-7A8B9C0D1E2F",
            "0f8c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2",
            "0f8c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2g",
            "+f8c1d2e-3a4b-4c5d-8e6f-7a8b9c0d1e2f",
            "0f8c1d2é-3a4b-4c5d-8e6f-7a8b9c0d1e2",
        ] {
            assert!(bad.parse::<DiskId>().is_err(), "{bad:?} parsed");
        }
    }
}
