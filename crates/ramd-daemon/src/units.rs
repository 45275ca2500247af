//! Sizes as people write them (`512M`, `1G`, `1.5GiB`, `4096`), parsed at the
//! command-line edge, and printed back the way `zramctl` does.

/// Parses a byte count: a number (decimals allowed with a suffix) and an
/// optional K, M, G, T, P or E suffix in powers of 1024, optionally followed
/// by `iB` or `B`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let err = || {
        format!(
            "invalid size {s:?}: expected a number with an optional K, M, G, T, P suffix \
             (powers of 1024), like 512M or 1G"
        )
    };
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                'P' => 50,
                'E' => 60,
                _ => return Err(err()),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    if num.is_empty() || !num.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(err());
    }
    if let Ok(n) = num.parse::<u64>() {
        return n
            .checked_mul(1u64 << shift)
            .ok_or_else(|| format!("size {s:?} is too large"));
    }
    // A fraction only makes sense with a unit ("1.5G"); round down to bytes.
    let f: f64 = num.parse().map_err(|_| err())?;
    if shift == 0 || !f.is_finite() {
        return Err(err());
    }
    let bytes = f * (1u64 << shift) as f64;
    if bytes >= u64::MAX as f64 {
        return Err(format!("size {s:?} is too large"));
    }
    Ok(bytes as u64)
}

/// Parses a duration: a whole number with a unit, `ms`, `s`, `m`, `h` or
/// `d` (`500ms`, `30s`, `5m`), or `0`.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let err = || {
        format!(
            "invalid duration {s:?}: expected a number and a unit (ms, s, m, h, d), like 30s or 5m"
        )
    };
    let t = s.trim();
    if t == "0" {
        return Ok(std::time::Duration::ZERO);
    }
    let split = t.find(|c: char| !c.is_ascii_digit()).ok_or_else(err)?;
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| err())?;
    let ms = match unit {
        "ms" => 1,
        "s" => 1000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return Err(err()),
    };
    n.checked_mul(ms)
        .map(std::time::Duration::from_millis)
        .ok_or_else(|| format!("duration {s:?} is too long"))
}

/// A byte count for people: `0`, `4K`, `1.5M`, `1G` (the library's, which
/// logs with it too).
pub use ramd_store::human;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2GB"), Ok(2 << 30));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert_eq!(parse_size("8E"), Ok(1 << 63));
        assert!(parse_size("16E").unwrap_err().contains("too large"));
        for bad in ["", "abc", "1X", "-1G", "1.5", "G", "1 G B"] {
            assert!(
                parse_size(bad).unwrap_err().contains(&format!("{bad:?}")),
                "{bad}"
            );
        }
    }

    #[test]
    fn human_sizes() {
        assert_eq!(human(0), "0B");
        assert_eq!(human(4096), "4K");
        assert_eq!(human(3 << 19), "1.5M");
        assert_eq!(human(1 << 30), "1G");
        assert_eq!(human(150 << 20), "150M");
    }
}
