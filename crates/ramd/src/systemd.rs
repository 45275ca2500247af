//! `ramd install-systemd`: writes `contrib/ramd.service` (the one copy of
//! the unit's text) with this machine's paths filled in.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The unit, with `@BIN@` and `@CONFIG@` to fill in.
pub const UNIT_TEMPLATE: &str = include_str!("../../../contrib/ramd.service");

/// The unit text for `bin` and `config` (absolute paths).
pub fn unit(bin: &Path, config: &Path) -> Result<String> {
    Ok(UNIT_TEMPLATE
        .replace("@BIN@", unit_word(bin, "--bin")?)
        .replace("@CONFIG@", unit_word(config, "--config")?))
}

/// A path as one word of an `Exec*=` line: absolute, and free of what
/// systemd would split, quote or expand.
fn unit_word<'a>(p: &'a Path, flag: &str) -> Result<&'a str> {
    let s = p
        .to_str()
        .with_context(|| format!("{flag} {}: not UTF-8", p.display()))?;
    if !p.is_absolute() {
        bail!("{flag} {s}: not an absolute path");
    }
    if let Some(c) = s
        .chars()
        .find(|c| c.is_whitespace() || c.is_control() || "\"'\\$%;".contains(*c))
    {
        bail!("{flag} {s:?}: {c:?} would need quoting in a unit file; use a plainer path");
    }
    Ok(s)
}

/// Writes `unit_dir/ramd.service` and says what to run next.
pub fn install(config: &Path, bin: Option<&Path>, unit_dir: &Path) -> Result<()> {
    let bin = match bin {
        Some(b) => std::path::absolute(b)?,
        None => std::env::current_exe().context("finding this ramd binary (use --bin)")?,
    };
    if !bin.is_file() {
        bail!("--bin {}: no such file", bin.display());
    }
    let config = std::path::absolute(config)?;
    let text = unit(&bin, &config)?;
    std::fs::create_dir_all(unit_dir)
        .with_context(|| format!("creating {}", unit_dir.display()))?;
    let path = unit_dir.join("ramd.service");
    // Written aside, then renamed: systemd never reads half a unit.
    let tmp: PathBuf = unit_dir.join(".ramd.service.tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, &path).with_context(|| format!("writing {}", path.display()))?;
    println!("wrote {}", path.display());
    if !config.exists() {
        println!(
            "note: {} does not exist yet: write its [disk.NAME] tables first",
            config.display()
        );
    }
    println!("next: systemctl daemon-reload && systemctl enable --now ramd");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_in_every_placeholder() {
        let u = unit(Path::new("/opt/bin/ramd"), Path::new("/etc/ramd/a.toml")).unwrap();
        assert!(!u.contains('@'), "{u}");
        assert!(u.contains("ExecStart=/opt/bin/ramd up -c /etc/ramd/a.toml"));
        assert!(u.contains("ExecStop=/opt/bin/ramd down"));
        assert!(u.contains("Type=notify"));
    }

    #[test]
    fn refuses_paths_a_unit_cannot_hold_as_one_word() {
        for bad in ["relative/ramd", "/opt/my ramd", "/opt/100%", "/opt/$HOME"] {
            assert!(
                unit(Path::new(bad), Path::new("/etc/ramd/ramd.toml")).is_err(),
                "{bad}"
            );
        }
    }
}
