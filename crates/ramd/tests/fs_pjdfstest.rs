//! POSIX conformance of filesystem disks: pjdfstest (the Rust rewrite) on a
//! ramd mount, with a kernel tmpfs run beside it as the reference.
//!
//! Two passes per file system: everything (EROFS cases skipped), then the
//! EROFS cases alone with remounts allowed. Only ramd's results are asserted;
//! tmpfs's summary is printed so a difference is easy to judge. Nothing is
//! excluded: the config enables every feature tmpfs has (see
//! tests/pjdfstest.toml), and ramd may skip only what tmpfs skips too.

mod common;
mod fs_common;

use common::*;
use fs_common::*;
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One pjdfstest run, parsed.
#[derive(Debug)]
struct PjdRun {
    summary: String,
    passed: BTreeSet<String>,
    skipped: Vec<(String, String)>,
    failed: Vec<(String, String)>,
    success: bool,
    output: String,
}

impl PjdRun {
    fn skipped_names(&self) -> BTreeSet<String> {
        self.skipped.iter().map(|(n, _)| n.clone()).collect()
    }

    fn failures(&self) -> String {
        self.failed
            .iter()
            .map(|(n, why)| format!("  {n}: {}", why.trim()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ params… final byte in @..~
            for d in chars.by_ref() {
                if ('@'..='~').contains(&d) && d != '[' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Parses pjdfstest's report: `NAME  ok|skipped|FAILED|failed as expected`,
/// reasons and panic messages on the tab-indented lines after, and the
/// closing `Summary: …` line.
fn parse(output: &str, success: bool) -> PjdRun {
    let text = strip_ansi(output);
    let mut run = PjdRun {
        summary: String::new(),
        passed: BTreeSet::new(),
        skipped: Vec::new(),
        failed: Vec::new(),
        success,
        output: text.clone(),
    };
    // Which list the indented lines belong to.
    enum Last {
        None,
        Skip,
        Fail,
    }
    let mut last = Last::None;
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix('\t') {
            match last {
                Last::Skip => {
                    let e = run.skipped.last_mut().unwrap();
                    e.1.push_str(rest);
                    e.1.push(' ');
                }
                Last::Fail => {
                    let e = run.failed.last_mut().unwrap();
                    e.1.push_str(rest);
                    e.1.push('\n');
                }
                Last::None => {}
            }
            continue;
        }
        if line.starts_with("Summary:") {
            run.summary = line.to_string();
            last = Last::None;
            continue;
        }
        let t = line.trim_end();
        let name = t.split_whitespace().next().unwrap_or("").to_string();
        if t.ends_with(" ok") {
            run.passed.insert(name);
            last = Last::None;
        } else if t.ends_with(" skipped") {
            run.skipped.push((name, String::new()));
            last = Last::Skip;
        } else if t.ends_with(" FAILED") || t.ends_with(" PASSED UNEXPECTEDLY") {
            run.failed.push((name, String::new()));
            last = Last::Fail;
        } else if !line.starts_with(' ') && !line.is_empty() {
            // Backtraces and other noise end the indented block.
            last = Last::None;
        }
    }
    run
}

/// A directory holding a `mount` that runs the real one with `-i`.
///
/// pjdfstest remounts with `mount -o remount,ro DIR`. For a FUSE mount,
/// mount(8) hands that to the mount.fuse3 helper, which tries to start the
/// filesystem's daemon again (named by the mount source) instead of
/// remounting; `-i` makes mount(8) do the mount(2) call itself. For tmpfs,
/// which has no helper, `-i` changes nothing.
fn mount_wrapper(dir: &Path) -> PathBuf {
    let real = require_tool("mount");
    let bin = dir.join("mount-wrapper");
    fs::create_dir_all(&bin).unwrap();
    let script = bin.join("mount");
    fs::write(
        &script,
        format!("#!/bin/sh\nexec {} -i \"$@\"\n", real.display()),
    )
    .unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

/// `pjdfstest -c CONFIG -p PATH -s SECONDARY PATTERNS…`.
fn pjdfstest(
    config: &str,
    path: &Path,
    secondary: &Path,
    patterns: &[&str],
    path_prefix: Option<&Path>,
) -> PjdRun {
    let bin = cargo_tool("pjdfstest");
    let config = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(config);
    let mut c = Command::new(bin);
    c.arg("-c")
        .arg(&config)
        .arg("-p")
        .arg(path)
        .arg("-s")
        .arg(secondary)
        .args(patterns)
        .env("NO_COLOR", "1")
        .env("RUST_BACKTRACE", "0");
    if let Some(prefix) = path_prefix {
        let old = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![prefix.to_path_buf()];
        dirs.extend(std::env::split_paths(&old));
        c.env("PATH", std::env::join_paths(dirs).unwrap());
    }
    let out = run(&mut c, LONG_TIMEOUT);
    let text = format!("{}{}", out.stdout, out.stderr);
    let parsed = parse(&text, out.success());
    assert!(
        !parsed.summary.is_empty(),
        "pjdfstest printed no summary ({}): {}\n{text}",
        out.status,
        out.what
    );
    parsed
}

/// Both passes on one file system: (main, erofs).
fn both_passes(path: &Path, secondary: &Path, wrapper: &Path) -> (PjdRun, PjdRun) {
    let main = pjdfstest("pjdfstest.toml", path, secondary, &[], None);
    let erofs = pjdfstest(
        "pjdfstest-erofs.toml",
        path,
        secondary,
        &["erofs"],
        Some(wrapper),
    );
    // A failed EROFS case must not leave the file system read-only.
    assert!(
        mountinfo_line(path).is_some_and(|l| l.split(' ').nth(5).unwrap_or("").starts_with("rw")),
        "{path:?} is not mounted read-write after the EROFS pass: {:?}",
        mountinfo_line(path)
    );
    (main, erofs)
}

fn report(label: &str, main: &PjdRun, erofs: &PjdRun) {
    eprintln!("pjdfstest on {label}:");
    eprintln!("  all but EROFS: {}", main.summary);
    eprintln!("  EROFS pass:    {}", erofs.summary);
    // EROFS cases skipped in the main pass ran in the second one.
    for (n, why) in main.skipped.iter().chain(&erofs.skipped) {
        if !erofs.passed.contains(n) {
            eprintln!("  skipped {n}: {}", why.trim());
        }
    }
    if !main.failed.is_empty() || !erofs.failed.is_empty() {
        eprintln!("  failed:\n{}\n{}", main.failures(), erofs.failures());
    }
}

/// Runs both passes on kernel tmpfs (reference, printed) and on a ramd disk
/// mounted with `ramd_args`, and asserts ramd's results.
fn compare_with_tmpfs(label: &str, ramd_args: &[&str]) {
    require_tool("mount");
    require_tool("umount");
    let tmp = scratch();
    let wrapper = mount_wrapper(tmp.path());
    // EXDEV cases need a second file system: a tmpfs distinct from both.
    let secondary = KernelTmpfs::mount("size=64M,mode=0755");

    // Reference first: if pjdfstest itself is broken here, tmpfs shows it.
    let (t_main, t_erofs) = {
        let tmpfs = KernelTmpfs::mount("size=512M,mode=1777");
        both_passes(tmpfs.path(), secondary.path(), &wrapper)
    };
    report("kernel tmpfs (reference)", &t_main, &t_erofs);

    let disk = FsDisk::mount(ramd_args);
    let (r_main, r_erofs) = both_passes(disk.path(), secondary.path(), &wrapper);
    report(label, &r_main, &r_erofs);

    assert!(
        r_main.failed.is_empty() && r_erofs.failed.is_empty(),
        "pjdfstest failures on {label} ({} / {}):\n{}\n{}\n(kernel tmpfs: {} / {})",
        r_main.summary,
        r_erofs.summary,
        r_main.failures(),
        r_erofs.failures(),
        t_main.summary,
        t_erofs.summary
    );
    assert!(
        r_main.success && r_erofs.success,
        "pjdfstest exited non-zero on {label} without a FAILED line:\n{}\n{}",
        r_main.output,
        r_erofs.output
    );
    // The EROFS pass really ran (remounts worked) rather than skipping.
    assert!(
        r_erofs.skipped.is_empty() && !r_erofs.passed.is_empty(),
        "EROFS pass on {label} skipped cases: {:?}",
        r_erofs.skipped
    );
    // Every case skipped in the main pass is an EROFS case (run in the
    // second pass) or one kernel tmpfs skips too: nothing is quietly lost.
    let tmpfs_skips = t_main.skipped_names();
    let extra: Vec<_> = r_main
        .skipped
        .iter()
        .filter(|(n, _)| !r_erofs.passed.contains(n) && !tmpfs_skips.contains(n))
        .collect();
    assert!(
        extra.is_empty(),
        "{label} skips cases that kernel tmpfs runs: {extra:?}"
    );
    // And every case that passes on tmpfs ran and passed on ramd.
    let ramd_passed: BTreeSet<&String> = r_main.passed.iter().chain(&r_erofs.passed).collect();
    let missing: Vec<&String> = t_main
        .passed
        .iter()
        .chain(&t_erofs.passed)
        .filter(|n| !ramd_passed.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "cases passed on kernel tmpfs but not on {label}: {missing:?}"
    );

    disk.stop();
}

/// The store path (file data in ramd's store, the write-back cache).
#[test]
fn pjdfstest_passes_on_ramd_as_on_kernel_tmpfs() {
    compare_with_tmpfs(
        "ramd over io_uring",
        &[
            "--size",
            "512M",
            "--fuse-transport",
            "io-uring",
            "--data-path",
            "store",
        ],
    );
}

/// The same requests over the other transport (read and write on
/// /dev/fuse), which the kernel keeps using for FORGET and INTERRUPT and
/// where io_uring cannot be had.
#[test]
fn pjdfstest_passes_on_ramd_over_dev_fuse() {
    compare_with_tmpfs(
        "ramd over /dev/fuse",
        &[
            "--size",
            "512M",
            "--fuse-transport",
            "dev",
            "--data-path",
            "store",
        ],
    );
}

/// The tests above run with the store path's write-back cache (timestamps
/// and sizes of cached writes are the kernel's to keep); this one with
/// every write sent through, the other mode a user may choose there.
#[test]
fn pjdfstest_passes_on_ramd_without_writeback_cache() {
    compare_with_tmpfs(
        "ramd --no-writeback-cache",
        &[
            "--size",
            "512M",
            "--no-writeback-cache",
            "--data-path",
            "store",
        ],
    );
}

/// The default: file data in the kernel's tmpfs, reads and writes passed
/// through (`--data-path auto` gives kernel here): the namespace is still
/// ramd's, and sizes, blocks and times come from the backing files.
#[test]
fn pjdfstest_passes_on_ramd_with_kernel_data_path() {
    compare_with_tmpfs(
        "ramd --data-path kernel",
        &["--size", "512M", "--data-path", "kernel"],
    );
}

/// The kernel path over /dev/fuse.
#[test]
fn pjdfstest_passes_on_ramd_with_kernel_data_path_over_dev_fuse() {
    compare_with_tmpfs(
        "ramd --data-path kernel over /dev/fuse",
        &[
            "--size",
            "512M",
            "--data-path",
            "kernel",
            "--fuse-transport",
            "dev",
        ],
    );
}
