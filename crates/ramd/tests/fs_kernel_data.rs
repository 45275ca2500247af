//! `--data-path kernel`: file data in a private kernel tmpfs, reads and
//! writes passed through by the kernel (FUSE passthrough). Checked with
//! real tools against the real daemon: data I/O never reaches ramd (its
//! own request counters), ENOSPC at write(2) as on kernel tmpfs, writes
//! through mmap show in stat, truncate/fallocate/SEEK_HOLE as on tmpfs,
//! files past 1 TiB without an image, and what status and df count. POSIX corners: fs_pjdfstest.rs; random
//! I/O: fs_fsx.rs.

mod common;
mod fs_common;

use common::*;
use fs_common::*;
use serde_json::Value;
use std::process::Command;

fn kernel_disk(size: &str) -> FsDisk {
    FsDisk::mount(&["--size", size, "--data-path", "kernel"])
}

/// How many requests of `op` (read, write) ramd's FUSE frontend served.
fn fuse_ops(status: &Value, op: &str) -> u64 {
    status["io"]
        .as_array()
        .expect("io in status")
        .iter()
        .find(|f| f["frontend"] == "fuse")
        .and_then(|f| f["ops"].as_array())
        .and_then(|ops| ops.iter().find(|o| o["op"] == op))
        .and_then(|o| o["count"].as_u64())
        .unwrap_or_else(|| panic!("no fuse {op} counter in status: {status}"))
}

#[test]
fn data_io_bypasses_ramd() {
    bypasses_ramd("io-uring");
}

/// Passthrough does not depend on how requests travel.
#[test]
fn data_io_bypasses_ramd_over_dev_fuse() {
    bypasses_ramd("dev");
}

fn bypasses_ramd(transport: &str) {
    require_tool("dd");
    let fio = require_tool("fio");
    let mut disk = FsDisk::mount(&[
        "--size",
        "256M",
        "--data-path",
        "kernel",
        "--fuse-transport",
        transport,
    ]);
    let f = disk.join("data.bin");
    run(
        Command::new("dd")
            .args(["if=/dev/urandom", "bs=1M", "count=32", "conv=fsync"])
            .arg(format!("of={}", s(&f))),
        LONG_TIMEOUT,
    )
    .ok();
    run(
        Command::new("dd")
            .arg(format!("if={}", s(&f)))
            .args(["of=/dev/null", "bs=64k"]),
        LONG_TIMEOUT,
    )
    .ok();
    // Random 4 KiB reads and writes at depth, through libaio.
    run(
        Command::new(fio)
            .args([
                "--name=pt",
                "--rw=randrw",
                "--bs=4k",
                "--size=16M",
                "--ioengine=libaio",
                "--iodepth=8",
                "--io_size=32M",
            ])
            .arg(format!("--directory={}", s(disk.path()))),
        LONG_TIMEOUT,
    )
    .ok();
    let st = disk.status();
    assert_eq!(
        (fuse_ops(&st, "read"), fuse_ops(&st, "write")),
        (0, 0),
        "data reads and writes reached ramd: {st}"
    );
    // The data is there all the same.
    let back = std::fs::read(&f).unwrap();
    assert_eq!(back.len(), 32 << 20);
    // What the host holds for it, in status and df alike.
    let used = st["used_bytes"].as_u64().unwrap();
    assert!(
        used >= (32 + 16) << 20,
        "status used_bytes {used} < the 48 MiB written: {st}"
    );
    let d = df(disk.path());
    assert_eq!(d.used, used, "df used vs status used_bytes");
    assert_eq!(d.size, 256 << 20);
    disk.assert_alive();
    disk.stop();
}

/// Writes `pattern` blocks of 64 KiB to `path` until the disk is full;
/// prints the bytes acknowledged, the errno that stopped it, the file's
/// size, and whether every acknowledged byte reads back.
const FILL: &str = r#"
import errno, os, sys
p = sys.argv[1]
block = bytes(range(256)) * 256
fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
done = 0
err = None
while True:
    try:
        n = os.write(fd, block)
    except OSError as e:
        err = errno.errorcode[e.errno]
        break
    done += n
    if n < len(block):
        continue
os.close(fd)
size = os.stat(p).st_size
with open(p, 'rb') as f:
    data = f.read()
whole = data == (block * (done // len(block) + 1))[:done]
print(done, err, size, whole)
"#;

#[test]
fn enospc_at_write_as_on_kernel_tmpfs() {
    let tmpfs = KernelTmpfs::mount("size=16M");
    let want = py_ok(FILL, &[s(&tmpfs.path().join("fill"))]);
    let mut disk = kernel_disk("16M");
    let got = py_ok(FILL, &[s(&disk.join("fill"))]);
    let f: Vec<&str> = got.split_whitespace().collect();
    assert_eq!(f[1], "ENOSPC", "what stopped the writer: {got}");
    assert_eq!(f[0], f[2], "file size = bytes acknowledged: {got}");
    assert_eq!(f[3], "True", "every acknowledged byte reads back: {got}");
    assert_eq!(
        got, want,
        "ramd --data-path kernel vs kernel tmpfs of the same size"
    );
    disk.assert_alive();
    disk.stop();
}

/// Maps a 1 MiB sparse file, writes three pages through the mapping,
/// closes it, then prints size and blocks from stat and the bytes read
/// back.
const MMAP: &str = r#"
import mmap, os, sys
p = sys.argv[1]
fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 1 << 20)
m = mmap.mmap(fd, 1 << 20)
for off in (0, 300 << 10, 1020 << 10):
    m[off:off + 5] = b'mmap!'
m.flush()
m.close()
os.close(fd)
st = os.stat(p)
with open(p, 'rb') as f:
    data = f.read()
print(st.st_size, st.st_blocks, [data[o:o + 5] for o in (0, 300 << 10, 1020 << 10)],
      data.count(0))
"#;

#[test]
fn mmap_writes_show_in_stat_and_read_back() {
    let tmpfs = KernelTmpfs::mount("size=16M");
    let want = py_ok(MMAP, &[s(&tmpfs.path().join("m"))]);
    let mut disk = kernel_disk("16M");
    let got = py_ok(MMAP, &[s(&disk.join("m"))]);
    assert_eq!(got, want, "ramd --data-path kernel vs kernel tmpfs");
    assert!(got.starts_with("1048576 24 "), "size and blocks: {got}");
    disk.assert_alive();
    disk.stop();
}

/// A closed file's attributes stay in the kernel's cache; a file opened
/// again and written through a mapping (no request reaches ramd) must not
/// show the blocks cached before, while mapped or after.
const MMAP_CACHED: &str = r#"
import mmap, os, sys
p = sys.argv[1]
fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
os.ftruncate(fd, 1 << 20)
os.close(fd)
out = []
for _ in range(2):
    out.append(os.stat(p).st_blocks)  # cached while closed
fd = os.open(p, os.O_RDWR)
m = mmap.mmap(fd, 1 << 20)
os.close(fd)
for i, off in enumerate((0, 512 << 10)):
    m[off:off + 4] = b'map!'
    out.append(os.stat(p).st_blocks)  # while mapped, no fd open
m.close()
out.append(os.stat(p).st_blocks)
out.append(os.stat(p).st_blocks)
print(out)
"#;

#[test]
fn stat_after_mmap_writes_is_not_stale() {
    let tmpfs = KernelTmpfs::mount("size=16M");
    let want = py_ok(MMAP_CACHED, &[s(&tmpfs.path().join("m"))]);
    let mut disk = kernel_disk("16M");
    let got = py_ok(MMAP_CACHED, &[s(&disk.join("m"))]);
    assert_eq!(got, want, "ramd --data-path kernel vs kernel tmpfs");
    assert_eq!(got.trim(), "[0, 0, 8, 16, 16, 16]", "blocks: {got}");
    disk.assert_alive();
    disk.stop();
}

/// A writer holds the file open O_WRONLY, so the kernel may keep its
/// attributes (no mapping of that open can write); a second opener maps it
/// O_RDWR and writes a new page through the mapping: stat must see it,
/// while both are open and after the mapper closes.
const MMAP_BESIDE_WRITER: &str = r#"
import mmap, os, sys, time
p = sys.argv[1]
w = os.open(p, os.O_CREAT | os.O_WRONLY, 0o644)
os.ftruncate(w, 64 << 10)
os.write(w, b'a' * 4096)
st = [os.stat(p)]
# Until the kernel's coarse clock has surely moved on (a few ticks).
while time.clock_gettime_ns(5) < st[0].st_mtime_ns + 50_000_000:  # CLOCK_REALTIME_COARSE
    pass
rw = os.open(p, os.O_RDWR)
m = mmap.mmap(rw, 64 << 10)
st.append(os.stat(p))  # mapped, not yet written through the mapping
m[40960:40964] = b'map!'
st.append(os.stat(p))
m.close()
os.close(rw)
st.append(os.stat(p))
os.close(w)
st.append(os.stat(p))
print([x.st_blocks for x in st], [x.st_mtime_ns > st[0].st_mtime_ns for x in st[1:]])
"#;

#[test]
fn mmap_writes_beside_a_write_only_open_show_in_stat() {
    let tmpfs = KernelTmpfs::mount("size=16M");
    let want = py_ok(MMAP_BESIDE_WRITER, &[s(&tmpfs.path().join("m"))]);
    let mut disk = kernel_disk("16M");
    let got = py_ok(MMAP_BESIDE_WRITER, &[s(&disk.join("m"))]);
    assert_eq!(got, want, "ramd --data-path kernel vs kernel tmpfs");
    assert!(got.starts_with("[8, 8, 16, 16, 16]"), "blocks: {got}");
    disk.assert_alive();
    disk.stop();
}

/// A file made without an open (mknod) gets its backing file at its first
/// open, a read: that must not move its ctime, as nothing changed it.
const MKNOD_THEN_READ: &str = r#"
import os, stat, sys, time
p = os.path.join(sys.argv[1], 'f')
os.mknod(p, 0o644 | stat.S_IFREG)
before = os.stat(p).st_ctime_ns
# Until the kernel's coarse clock has surely moved on (a few ticks).
while time.clock_gettime_ns(5) < before + 50_000_000:  # CLOCK_REALTIME_COARSE
    pass
with open(p, 'rb') as f:
    f.read()
after = os.stat(p).st_ctime_ns
with open(p, 'ab') as f:
    f.write(b'x')
written = os.stat(p).st_ctime_ns
print(after == before, written > after)
"#;

#[test]
fn reading_a_file_never_opened_keeps_its_ctime() {
    let tmpfs = KernelTmpfs::mount("size=16M");
    let want = py_ok(MKNOD_THEN_READ, &[s(tmpfs.path())]);
    let mut disk = kernel_disk("16M");
    let got = py_ok(MKNOD_THEN_READ, &[s(disk.path())]);
    assert_eq!(got, want, "ramd --data-path kernel vs kernel tmpfs");
    assert_eq!(got.trim(), "True True", "{got}");
    disk.assert_alive();
    disk.stop();
}

/// truncate, fallocate (allocate, keep size, punch), SEEK_DATA and
/// SEEK_HOLE, copy_file_range: one line of results per step.
const SPARSE: &str = r#"
import os, sys
d = sys.argv[1]
p = os.path.join(d, 's')
out = []
def st(tag):
    s = os.stat(p)
    out.append(f"{tag}: size {s.st_size} blocks {s.st_blocks}")
def seek(fd, tag):
    r = []
    for w in (os.SEEK_DATA, os.SEEK_HOLE):
        for off in (0, 4096, 65536, 1 << 20):
            try:
                r.append(os.lseek(fd, off, w))
            except OSError as e:
                r.append(e.strerror)
    out.append(f"{tag}: {r}")
fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
os.truncate(p, 1 << 20); st("truncate up")
os.pwrite(fd, b'x' * 8192, 65536); st("write"); seek(fd, "seek after write")
os.posix_fallocate(fd, 512 << 10, 128 << 10); st("fallocate")
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE = 1, 2
r = libc.fallocate(fd, FALLOC_FL_KEEP_SIZE, ctypes.c_long(2 << 20), ctypes.c_long(64 << 10))
out.append(f"keep size: {r} {ctypes.get_errno() if r else 0}"); st("after keep size")
r = libc.fallocate(fd, FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, ctypes.c_long(65536), ctypes.c_long(4096))
out.append(f"punch: {r}"); st("after punch"); seek(fd, "seek after punch")
r = libc.fallocate(fd, 0x10, ctypes.c_long(0), ctypes.c_long(4096))
out.append(f"zero range: {r} {ctypes.get_errno() if r else 0}")
q = os.path.join(d, 'c')
fq = os.open(q, os.O_RDWR | os.O_CREAT, 0o644)
n = os.copy_file_range(fd, fq, 1 << 20, 0, 0)
out.append(f"copied {n}"); s = os.stat(q); out.append(f"copy: size {s.st_size}")
out.append(f"copy same: {os.pread(fq, 8192, 65536 + 4096) == os.pread(fd, 8192, 65536 + 4096)}")
os.ftruncate(fd, 70000); st("truncate down"); seek(fd, "seek after truncate")
os.ftruncate(fd, 0); st("truncate to 0")
os.close(fd); os.close(fq)
print("\n".join(out))
"#;

#[test]
fn truncate_fallocate_and_seek_hole_agree_with_tmpfs() {
    let tmpfs = KernelTmpfs::mount("size=64M");
    let want = py_ok(SPARSE, &[s(tmpfs.path())]);
    let mut disk = kernel_disk("64M");
    let got = py_ok(SPARSE, &[s(disk.path())]);
    assert_eq!(got, want, "ramd --data-path kernel vs kernel tmpfs");
    disk.assert_alive();
    disk.stop();
}

/// Unlinking a file frees its data in the kernel's tmpfs (once closed),
/// and status and df say so.
#[test]
fn unlink_frees_the_hot_tier() {
    let mut disk = kernel_disk("64M");
    let f = disk.join("big");
    std::fs::write(&f, vec![7u8; 8 << 20]).unwrap();
    let used = disk.status()["used_bytes"].as_u64().unwrap();
    assert!(used >= 8 << 20, "used_bytes {used} after an 8 MiB file");
    std::fs::remove_file(&f).unwrap();
    wait_until(START_DEADLINE, "the data freed", || {
        disk.status()["used_bytes"].as_u64().unwrap() < 1 << 20
    });
    assert!(df(disk.path()).used < 1 << 20);
    disk.assert_alive();
    disk.stop();
}

fn refused(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    match FsDisk::mount_at(dir.path(), args) {
        Ok(mut d) => {
            d.assert_alive();
            panic!("ramd serve {args:?} started")
        }
        Err(f) => f.stderr,
    }
}

#[test]
fn refuses_what_this_phase_cannot_keep() {
    let e = refused(&[
        "--size",
        "16M",
        "--data-path",
        "kernel",
        "--compress",
        "lz4",
        "--recompress",
        "zstd",
    ]);
    assert!(e.contains("--data-path kernel cannot re-pack"), "{e}");
    let e = refused(&[
        "--size",
        "16M",
        "--data-path",
        "kernel",
        "--compress-after",
        "1s",
    ]);
    assert!(e.contains("--compress-after needs --compress"), "{e}");
    let e = refused(&[
        "--size",
        "16M",
        "--data-path",
        "kernel",
        "--writeback-cache",
    ]);
    assert!(e.contains("write-back cache"), "{e}");
}

/// `--data-path auto` (the default) takes the kernel path on this host
/// (root, Linux 6.18 with passthrough), and the store path when a setting
/// asks for it, saying why in the log.
#[test]
fn auto_takes_the_kernel_path_unless_a_setting_asks_for_the_store() {
    let disk = FsDisk::mount(&["--size", "16M"]);
    assert_eq!(disk.status()["data_path"], "kernel", "{}", disk.status());
    disk.stop();
    for (flag, value) in [("--compress", "lz4"), ("--recompress", "zstd")] {
        let mut disk = FsDisk::mount(&["--size", "16M", flag, value]);
        assert_eq!(
            disk.status()["data_path"],
            "store",
            "{flag}: {}",
            disk.status()
        );
        disk.assert_alive();
        let log = disk.stderr();
        assert!(
            log.contains("data path store (--data-path auto)") && log.contains(flag),
            "{flag}: the log does not say why: {log}"
        );
        disk.stop();
    }
    let disk = FsDisk::mount(&["--size", "16M", "--writeback-cache"]);
    assert_eq!(disk.status()["data_path"], "store", "{}", disk.status());
    disk.stop();
}

/// Files past the store's 1 TiB: a 2 TiB truncate, a byte written at
/// 1.5 TiB (passed through) and read back, and the size a stat shows,
/// as on kernel tmpfs. With an image the 1 TiB of the image format stays
/// (EFBIG), as README says.
const HUGE_PY: &str = r#"
import os, sys
p = os.path.join(sys.argv[1], "huge")
with open(p, "wb") as f:
    try:
        f.truncate(2 << 40)
    except OSError as e:
        print("truncate", e.errno)
        sys.exit(0)
    f.seek(3 << 39)
    f.write(b"x")
with open(p, "rb") as f:
    f.seek(3 << 39)
    print("size", os.stat(p).st_size, "byte", f.read(1))
os.unlink(p)
"#;

#[test]
fn files_past_one_tib_without_an_image_as_on_tmpfs() {
    let tmpfs = KernelTmpfs::mount("size=64M");
    let want = py_ok(HUGE_PY, &[s(tmpfs.path())]);
    assert_eq!(want, "size 2199023255552 byte b'x'\n");
    let disk = kernel_disk("64M");
    assert_eq!(py_ok(HUGE_PY, &[s(disk.path())]), want);
    disk.stop();
    let tmp = tempfile::TempDir::new().unwrap();
    let img = tmp.path().join("img");
    let disk = FsDisk::mount(&["--size", "64M", "--data-path", "kernel", "--image", s(&img)]);
    let efbig = format!("truncate {}\n", libc::EFBIG);
    assert_eq!(py_ok(HUGE_PY, &[s(disk.path())]), efbig);
    disk.stop();
}
