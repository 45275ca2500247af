//! Sizes for people, in messages and logs; it imports nothing of the
//! crate, so any file of it may use it.

/// `bytes` for people: `4K`, `1.5M`, `1G` (powers of 1024).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "K", "M", "G", "T", "P", "E"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}B")
    } else if v.fract() == 0.0 || v >= 100.0 {
        format!("{v:.0}{}", UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}
