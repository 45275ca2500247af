//! How many FUSE requests the kernel sends per file for an untar and an
//! `rm -r`, on both data paths, counted by the kernel itself (the
//! `fuse:fuse_request_send` tracepoint, read with perf). Counts, not
//! timings: they do not depend on how busy the host is, so a test can hold
//! them. Each limit is today's count plus a little: a change that makes the
//! kernel send more requests per file fails here, and one that makes it
//! send fewer should lower the limit. BENCHMARKS.md says where each request
//! comes from (`bench/fuse-requests.sh` prints the same counts by opcode).

mod common;
mod fs_common;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{require_tool, run};
use fs_common::{s, FsDisk};
use tempfile::TempDir;

const DIRS: usize = 100;
const FILES_PER_DIR: usize = 20;
const FILES: usize = DIRS * FILES_PER_DIR;
const PERF_TIMEOUT: Duration = Duration::from_secs(120);

/// A source-like tree (DIRS directories of small files) as a tar file.
fn tree_tar(tmp: &Path) -> std::path::PathBuf {
    let root = tmp.join("tree");
    for d in 0..DIRS {
        let dir = root.join(format!("d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..FILES_PER_DIR {
            fs::write(dir.join(format!("f{f}.c")), vec![b'x'; 100 + 37 * f]).unwrap();
        }
    }
    let tar = tmp.join("tree.tar");
    run(
        Command::new("tar")
            .arg("-C")
            .arg(tmp)
            .arg("-cf")
            .arg(&tar)
            .arg("tree"),
        PERF_TIMEOUT,
    )
    .ok();
    tar
}

/// Runs `cmd` under the tracepoint and returns the requests the kernel
/// sent to the FUSE connection of `mount`, by opcode name.
fn requests(tmp: &Path, mount: &Path, cmd: &[&str]) -> BTreeMap<String, usize> {
    let perf = require_tool("perf");
    // The tracepoint names the connection by the mount's device number.
    let dev = fs::metadata(mount).unwrap().dev();
    let data = tmp.join("perf.data");
    let out = run(
        Command::new(&perf)
            .args([
                "record",
                "-q",
                "-m",
                "16M",
                "-e",
                "fuse:fuse_request_send",
                "-a",
                "-o",
            ])
            .arg(&data)
            .arg("--")
            .args(cmd),
        PERF_TIMEOUT,
    );
    assert!(out.success(), "perf record -- {cmd:?}: {out:?}");
    // A lost event would lower the counts, and so hide a regression.
    assert!(
        !out.stderr.to_lowercase().contains("lost"),
        "perf lost events: {}",
        out.stderr
    );
    let script = run(
        Command::new(&perf).arg("script").arg("-i").arg(&data),
        PERF_TIMEOUT,
    )
    .ok();
    let conn = format!("connection {dev} ");
    let mut by_op = BTreeMap::new();
    for line in script.lines().filter(|l| l.contains(&conn)) {
        let op = line
            .split_once("(FUSE_")
            .and_then(|(_, r)| r.split_once(')'))
            .map(|(op, _)| op.to_string())
            .unwrap_or_else(|| panic!("no opcode in perf's line {line:?}"));
        *by_op.entry(op).or_insert(0) += 1;
    }
    by_op
}

fn per_file(by_op: &BTreeMap<String, usize>) -> f64 {
    by_op.values().sum::<usize>() as f64 / FILES as f64
}

/// Untars, then removes, DIRS × FILES_PER_DIR files; the requests per
/// file of each must stay within the limits.
fn check(args: &[&str], untar_limit: f64, remove_limit: f64) {
    require_tool("tar");
    let tmp = TempDir::new().unwrap();
    let tar = tree_tar(tmp.path());
    let disk = FsDisk::mount(args);
    let mnt = disk.path();
    let untar = requests(tmp.path(), mnt, &["tar", "-C", s(mnt), "-xf", s(&tar)]);
    assert_eq!(
        fs::read_dir(disk.join("tree/d7")).unwrap().count(),
        FILES_PER_DIR,
        "the untar made every file"
    );
    let tree = disk.join("tree");
    let remove = requests(tmp.path(), mnt, &["rm", "-r", s(&tree)]);
    assert!(!tree.exists(), "rm -r left the tree");
    let (u, r) = (per_file(&untar), per_file(&remove));
    eprintln!("{args:?}: untar {u:.2} requests per file {untar:?}; rm -r {r:.2} {remove:?}");
    assert!(
        u <= untar_limit,
        "{args:?}: untar sends {u:.2} FUSE requests per file, more than {untar_limit}: {untar:?}"
    );
    assert!(
        r <= remove_limit,
        "{args:?}: rm -r sends {r:.2} FUSE requests per file, more than {remove_limit}: {remove:?}"
    );
    disk.stop();
}

/// The store path (write-back cache): per untarred file a negative
/// LOOKUP, CREATE, WRITE, two GETXATTR `security.capability` (the
/// write's and chown's), tar's three SETATTRs, RELEASE, the parent's
/// GETATTR; per removed file UNLINK, the parent's GETATTR and the
/// write-back cache's SETATTR of ctime, plus each directory's share
/// (three READDIRPLUS and an RMDIR, over 20 files; no OPENDIR or
/// RELEASEDIR, which the kernel stops sending once the first OPENDIR is
/// answered ENOSYS). Measured: 10.26 and 3.25.
#[test]
fn requests_per_file_on_the_store_path() {
    check(&["--size", "256M", "--data-path", "store"], 10.3, 3.3);
}

/// The kernel path (passthrough, no write-back cache): as the store path
/// without the WRITE; an O_WRONLY open keeps its attributes cached, so
/// the open's own permission check needs no GETATTR; removing as on the
/// store path without the SETATTR. Measured: 9.25 and 2.25.
#[test]
fn requests_per_file_on_the_kernel_path() {
    check(&["--size", "256M", "--data-path", "kernel"], 9.3, 2.3);
}
