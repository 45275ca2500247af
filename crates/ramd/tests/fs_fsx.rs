//! Data integrity of filesystem disks under random I/O: fsx (the Rust
//! rewrite, crates.io `fsx`) with a fixed seed, every operation enabled
//! (pread/pwrite, mmap read/write, truncate, fallocate, punch hole,
//! copy_file_range, sendfile, fadvise, close/open, msync invalidate, fsync),
//! checking every byte it reads against its own model of the file.
//! Configuration: tests/fsx/fsx.toml.

mod common;
mod fs_common;

use common::*;
use fs_common::*;
use std::fs;
use std::path::Path;
use std::process::Command;

/// Operations per run: ~30 s each on an idle two-core machine, debug ramd.
const OPS: &str = "30000";

fn fsx(disk: &FsDisk, seed: &str) {
    let bin = cargo_tool("fsx");
    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fsx/fsx.toml");
    let artifacts = scratch();
    let file = disk.join("fsx.bin");
    let out = run(
        Command::new(bin)
            .arg("-f")
            .arg(&config)
            .args(["-N", OPS, "-S", seed])
            .arg("-P")
            .arg(artifacts.path())
            .arg(&file),
        LONG_TIMEOUT,
    );
    let text = format!("{}{}", out.stdout, out.stderr);
    if !out.success() || !text.contains("All operations completed A-OK!") {
        // fsx leaves its operation log and the expected contents behind.
        let mut listing = String::new();
        for e in fs::read_dir(artifacts.path()).unwrap().flatten() {
            listing.push_str(&format!("\n  {}", e.path().display()));
        }
        let log = fs::read_dir(artifacts.path())
            .unwrap()
            .flatten()
            .find(|e| e.file_name().to_string_lossy().ends_with(".fsxlog"))
            .map(|e| fs::read_to_string(e.path()).unwrap_or_default())
            .unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        panic!(
            "fsx failed ({}) on {:?} (seed {seed}, {OPS} ops): {}\n--- output ---\n{text}\n\
             --- artifacts ---{listing}\n--- last operations ---\n{}\n--- ramd stderr ---\n{}",
            out.status,
            file,
            out.what,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
            disk.stderr()
        );
    }
    eprintln!("fsx seed {seed}, {OPS} ops on {:?}: A-OK", disk.path());
}

/// The store path (the write-back cache is its default).
#[test]
fn fsx_random_io_keeps_every_byte() {
    let mut disk = FsDisk::mount(&[
        "--size",
        "64M",
        "--fuse-transport",
        "io-uring",
        "--data-path",
        "store",
    ]);
    fsx(&disk, "20240611");
    disk.assert_alive();
    disk.stop();
}

#[test]
fn fsx_random_io_keeps_every_byte_over_dev_fuse() {
    let mut disk = FsDisk::mount(&[
        "--size",
        "64M",
        "--fuse-transport",
        "dev",
        "--data-path",
        "store",
    ]);
    fsx(&disk, "4242");
    disk.assert_alive();
    disk.stop();
}

/// The write-back cache is the store path's default (the tests above);
/// this is the other mode a user may choose there, every write sent
/// through.
#[test]
fn fsx_random_io_keeps_every_byte_without_writeback_cache() {
    let mut disk = FsDisk::mount(&[
        "--size",
        "64M",
        "--no-writeback-cache",
        "--data-path",
        "store",
    ]);
    fsx(&disk, "777");
    disk.assert_alive();
    disk.stop();
}

/// File data in the kernel's tmpfs (`--data-path kernel`, the default
/// where passthrough can be had): reads, writes
/// and mmap passed through; truncate, fallocate, punch hole and
/// copy_file_range through ramd onto the backing file.
#[test]
fn fsx_random_io_keeps_every_byte_with_kernel_data_path() {
    let mut disk = FsDisk::mount(&["--size", "64M", "--data-path", "kernel"]);
    fsx(&disk, "31337");
    disk.assert_alive();
    disk.stop();
}
