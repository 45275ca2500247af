//! `mount -t fuse.ramd` and fstab lines, through util-linux's mount(8) and
//! umount(8) and the helpers `ramd install-mount-helper` makes: mount,
//! writes, umount with a save, the data back on the next mount; remount
//! (size, ro/rw, atime); the VFS flags checked with ordinary tools;
//! /proc/mounts; and bad input that must leave nothing started.
//!
//! Needs root (mount(2), unshare(2)). mount(8) runs `/sbin/mount.TYPE`, a
//! fixed path, and the host's may be a real install of ramd's: so each
//! test runs in a mount namespace of its own ([`isolated`]) where a
//! directory holding this build's helpers is bind-mounted over /sbin, and
//! libmount's utab is a file of the test's (`LIBMOUNT_UTAB`). The host's
//! /sbin and /run/mount are never written; every test checks the host's
//! helpers are as they were.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;

const HELPERS: [&str; 2] = ["/sbin/mount.fuse.ramd", "/sbin/umount.fuse.ramd"];

/// What is at each helper's path under `root` ("" for this thread's
/// view): nothing, a symlink and its target, or another file.
fn helpers_under(root: &str) -> Vec<String> {
    HELPERS
        .iter()
        .map(|h| {
            let at = format!("{root}{h}");
            match fs::symlink_metadata(&at) {
                Err(e) => format!("{h}: {}", e.kind()),
                Ok(m) if m.file_type().is_symlink() => {
                    format!("{h} -> {:?}", fs::read_link(&at).unwrap())
                }
                Ok(m) => format!(
                    "{h}: a file of {} bytes, mode {:o}",
                    m.len(),
                    m.permissions().mode()
                ),
            }
        })
        .collect()
}

/// Runs a test's body in a mount namespace of its own (on a thread of its
/// own: namespaces are per thread, and every process the body starts
/// inherits the thread's), with this build's helpers at /sbin there. The
/// host's /sbin must be exactly as it was, whether the body passed or not.
fn isolated(body: impl FnOnce(&Setup) + Send) {
    let before = helpers_under("");
    let result = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                let s = Setup::new();
                // The host's view, through /proc/self/root: the root of
                // the process's first thread, which stays in the host's
                // namespace. Untouched while the helpers are in place.
                assert_eq!(
                    helpers_under("/proc/self/root"),
                    before,
                    "the helpers this test installed are visible on the host"
                );
                body(&s)
            })
            .join()
    });
    assert_eq!(
        helpers_under(""),
        before,
        "a mount test changed the host's /sbin"
    );
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// One test's place, in its own mount namespace: the helpers at /sbin, a
/// run dir, a scratch dir, libmount's utab.
struct Setup {
    tmp: tempfile::TempDir,
    run: PathBuf,
    utab: PathBuf,
}

impl Setup {
    /// Moves this thread into a new mount namespace, private (nothing
    /// mounted here reaches the host), and mounts a directory holding
    /// this build's helpers, made by `ramd install-mount-helper`, over
    /// /sbin.
    fn new() -> Setup {
        require_tool("mount");
        require_tool("umount");
        // umount.fuse.ramd reads the mount's run directory with it.
        require_tool("findmnt");
        let tmp = scratch();
        let run = tmp.path().join("run");
        let utab = tmp.path().join("utab");
        // SAFETY: unshare(2) of this thread's mount namespace (and its
        // filesystem attributes, which CLONE_NEWNS implies) only.
        if unsafe { libc::unshare(libc::CLONE_NEWNS) } != 0 {
            panic!(
                "unshare(CLONE_NEWNS): {} (the mount tests need root)",
                std::io::Error::last_os_error()
            );
        }
        let s = Setup { tmp, run, utab };
        run_ok(&mut s.cmd("mount", &["--make-rprivate", "/"]));
        let sbin = s.dir("sbin");
        run_ok(&mut cmd(
            ramd_bin(),
            [
                "install-mount-helper",
                "--dir",
                p(&sbin),
                "--bin",
                ramd_bin(),
            ],
        ));
        run_ok(&mut s.cmd("mount", &["--bind", p(&sbin), "/sbin"]));
        for h in HELPERS {
            let target = fs::read_link(h).unwrap_or_else(|e| panic!("{h} here: {e}"));
            assert_eq!(
                target.canonicalize().unwrap(),
                Path::new(ramd_bin()).canonicalize().unwrap(),
                "{h}"
            );
        }
        s
    }

    /// A new empty directory in the scratch dir.
    fn dir(&self, name: &str) -> PathBuf {
        let d = self.tmp.path().join(name);
        fs::create_dir_all(&d).unwrap();
        d
    }

    /// `PROGRAM ARGS` with RAMD_RUN_DIR set to this test's run dir (the
    /// helpers find the daemons' control sockets there) and libmount's
    /// utab in the test's directory (mount and umount, and the helpers'
    /// own `mount --fake`, read and write it there).
    fn cmd(&self, program: &str, args: &[&str]) -> Command {
        let mut c = cmd(program, args);
        c.env("RAMD_RUN_DIR", &self.run)
            .env("LIBMOUNT_UTAB", &self.utab);
        c
    }

    /// `mount -t fuse.ramd SOURCE DIR -o OPTIONS`, unmounted on drop.
    fn mount(&self, source: &str, dir: &Path, options: &str) -> Mount {
        let mut c = self.cmd("mount", &["-t", "fuse.ramd", source, p(dir), "-o", options]);
        Mount::by(&mut c, dir)
    }

    /// Runs `mount ARGS`, which must fail; its stderr.
    fn mount_fails(&self, args: &[&str]) -> String {
        let out = run(&mut self.cmd("mount", args), CMD_TIMEOUT).failed();
        assert_eq!(out.status.code(), Some(32), "mount's failure code: {out:?}");
        out.stderr
    }

    /// The control sockets of daemons that answer in the run dir.
    fn live_disks(&self) -> Vec<String> {
        live_disks(&self.run)
    }
}

/// The control sockets of daemons that answer in `run_dir`.
fn live_disks(run_dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(run_dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "ctl"))
        .filter(|p| std::os::unix::net::UnixStream::connect(p).is_ok())
        .map(|p| p.display().to_string())
        .collect()
}

/// /proc/mounts of this thread's namespace (/proc/mounts is the first
/// thread's: the host's).
const MOUNTS: &str = "/proc/thread-self/mounts";

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The mounts line of the topmost mount at `dir`: (source, type,
/// options).
fn mounts_entry(dir: &Path) -> Option<(String, String, String)> {
    let want = dir.canonicalize().ok()?;
    fs::read_to_string(MOUNTS)
        .unwrap()
        .lines()
        .rev()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.len() >= 4 && Path::new(f[1]) == want)
                .then(|| (f[0].to_string(), f[2].to_string(), f[3].to_string()))
        })
        .next()
}

/// Whether libmount's utab holds a `helper=fuse.ramd` marker for `dir`.
fn utab_has_helper(s: &Setup, dir: &Path) -> bool {
    let target = format!("TARGET={}", p(&dir.canonicalize().unwrap()));
    fs::read_to_string(&s.utab)
        .unwrap_or_default()
        .lines()
        .any(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            f.contains(&target.as_str()) && l.contains("helper=fuse.ramd")
        })
}

fn has_option(dir: &Path, opt: &str) -> bool {
    let (_, _, opts) = mounts_entry(dir).expect("mounted");
    opts.split(',').any(|o| o == opt)
}

/// `sh -c SCRIPT`'s result.
fn sh(script: &str) -> Output {
    run(&mut cmd("sh", ["-c", script]), CMD_TIMEOUT)
}

fn df_size(dir: &Path) -> u64 {
    let out = run_ok(&mut cmd("df", ["-B1", "--output=size", p(dir)]));
    out.lines().nth(1).unwrap().trim().parse().unwrap()
}

#[test]
fn mount_t_and_an_fstab_line_keep_data_across_umount() {
    isolated(|s| {
        let dir = s.dir("x");
        let img = s.tmp.path().join("img");
        let opts = format!(
            "size=64M,compress=zstd,image={},mode=1777,_netdev,x-ramd.test",
            p(&img)
        );
        let m = s.mount("ramd-test-a", &dir, &opts);
        let (source, fstype, _) = mounts_entry(&dir).expect("in /proc/mounts");
        assert_eq!(
            (source.as_str(), fstype.as_str()),
            ("ramd-test-a", "fuse.ramd")
        );
        let mode = fs::metadata(&dir).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o1777, "mode=1777 on the root");
        let data = dir.join("data");
        random_file(&data, 3 * MIB);
        let sum = sha256(&data);
        fs::write(dir.join("note"), "kept").unwrap();
        // umount(8) runs umount.fuse.ramd only for mounts with a helper=
        // marker in libmount's utab: the mount helper left one.
        assert!(utab_has_helper(s, &dir), "no helper= marker in utab");
        // A busy mount point: umount fails as for any filesystem, the disk
        // goes on serving.
        let open = fs::File::open(dir.join("note")).unwrap();
        let out = run(&mut s.cmd("umount", &[p(&dir)]), CMD_TIMEOUT).failed();
        assert!(out.stderr.contains("busy"), "{out:?}");
        assert_eq!(fs::read_to_string(dir.join("note")).unwrap(), "kept");
        drop(open);
        // umount returns once the daemon has saved and stopped.
        m.unmount();
        assert!(!utab_has_helper(s, &dir), "umount left the utab marker");
        assert!(mounts_entry(&dir).is_none(), "still mounted");
        assert!(
            s.live_disks().is_empty(),
            "a daemon is left: {:?}",
            s.live_disks()
        );
        let info = run_ok(&mut cmd(ramd_bin(), ["image", "info", p(&img)]));
        assert!(info.contains("fs"), "image info after umount:\n{info}");

        // The matching fstab line, in a file of its own (-T), and `mount DIR`.
        let fstab = s.tmp.path().join("fstab");
        fs::write(
            &fstab,
            format!(
                "# ramd\nramd-test-a {} fuse.ramd {opts},nofail 0 0\n",
                p(&dir)
            ),
        )
        .unwrap();
        let mut c = s.cmd("mount", &["-T", p(&fstab), p(&dir)]);
        let m = Mount::by(&mut c, &dir);
        assert_eq!(sha256(&data), sum, "the data after a mount from fstab");
        // The source matches the fstab line, so `mount -a` sees it mounted.
        run_ok(&mut s.cmd("mount", &["-a", "-T", p(&fstab)]));
        let lines = fs::read_to_string(MOUNTS).unwrap();
        let n = lines
            .lines()
            .filter(|l| l.starts_with("ramd-test-a "))
            .count();
        assert_eq!(n, 1, "mount -a mounted it again:\n{lines}");
        // A remount of an fstab line gets the line's options again (image,
        // compress): unchanged, they are fine.
        run_ok(&mut s.cmd(
            "mount",
            &["-T", p(&fstab), "-o", "remount,size=128M", p(&dir)],
        ));
        assert_eq!(df_size(&dir), 128 * MIB);
        assert_eq!(fs::read_to_string(dir.join("note")).unwrap(), "kept");
        let (source, fstype, _) = mounts_entry(&dir).unwrap();
        assert_eq!(
            (source.as_str(), fstype.as_str()),
            ("ramd-test-a", "fuse.ramd")
        );
        fs::write(dir.join("second"), "after fstab").unwrap();
        m.unmount();
        assert!(s.live_disks().is_empty());
        // And once more with --fstab and the source, as `mount SOURCE` finds it.
        let mut c = s.cmd("mount", &["--fstab", p(&fstab), "ramd-test-a"]);
        let m = Mount::by(&mut c, &dir);
        assert_eq!(
            fs::read_to_string(dir.join("second")).unwrap(),
            "after fstab"
        );
        assert_eq!(sha256(&data), sum);
        m.unmount();
    });
}

/// A mount made with `run_dir=`, which is not where umount (or remount)
/// would look by default: remount finds it, and umount waits for its save
/// as for any other, so a mount right after has the data and finds no
/// daemon still running under the name.
#[test]
fn umount_of_a_mount_with_its_own_run_dir_waits_for_the_save() {
    isolated(|s| {
        let dir = s.dir("x");
        let img = s.tmp.path().join("img");
        let own = s.tmp.path().join("own-run");
        let opts = format!("size=64M,image={},run_dir={}", p(&img), p(&own));
        let m = s.mount("ramd-rd", &dir, &opts);
        let data = dir.join("data");
        random_file(&data, 16 * MIB);
        let sum = sha256(&data);
        // Nothing names the run directory but the mount's own record.
        run_ok(&mut s.cmd("mount", &["-o", "remount,size=96M", p(&dir)]));
        assert_eq!(df_size(&dir), 96 * MIB);
        m.unmount();
        assert!(
            live_disks(&own).is_empty(),
            "umount returned before the daemon stopped: {:?}",
            live_disks(&own)
        );
        let m = s.mount("ramd-rd", &dir, &opts);
        assert_eq!(sha256(&data), sum, "the data after umount and mount");
        m.unmount();
        assert!(live_disks(&own).is_empty(), "{:?}", live_disks(&own));
    });
}

#[test]
fn two_mounts_are_told_apart_by_their_sources() {
    isolated(|s| {
        let (a, b) = (s.dir("a"), s.dir("b"));
        let ma = s.mount("ramd-src-one", &a, "size=16M");
        let mb = s.mount("ramd-src-two", &b, "size=16M");
        assert_eq!(mounts_entry(&a).unwrap().0, "ramd-src-one");
        assert_eq!(mounts_entry(&b).unwrap().0, "ramd-src-two");
        // Each mount is its own disk, named after its mount point.
        let status = run_ok(&mut s.cmd(ramd_bin(), &["status", "--json"]));
        let v: serde_json::Value = serde_json::from_str(&status).unwrap();
        let mut names: Vec<&str> = v["disks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap())
            .collect();
        names.sort();
        assert_eq!(names.len(), 2, "{status}");
        assert!(
            names.iter().all(|n| n.ends_with("-a") || n.ends_with("-b")),
            "{names:?}"
        );
        // umount by source finds the right one.
        run_ok(&mut s.cmd("umount", &["ramd-src-two"]));
        assert!(mounts_entry(&b).is_none(), "umount ramd-src-two left {b:?}");
        assert!(mounts_entry(&a).is_some(), "umount ramd-src-two took {a:?}");
        // Unmounted by its source above: nothing is left for its guard.
        std::mem::forget(mb);
        ma.unmount();
    });
}

/// `data_path=kernel` as a mount option: the file data's private tmpfs
/// follows a remount's size, and refuses a shrink below what it holds.
#[test]
fn remount_resizes_the_kernel_data_path() {
    isolated(|s| {
        let dir = s.dir("k");
        let _m = s.mount("ramd-test-k", &dir, "size=32M,data_path=kernel");
        assert_eq!(df_size(&dir), 32 * MIB);
        run_ok(&mut s.cmd("mount", &["-o", "remount,size=96M", p(&dir)]));
        assert_eq!(df_size(&dir), 96 * MIB, "remount,size= grows");
        random_file(&dir.join("big"), 48 * MIB);
        let err = s.mount_fails(&["-o", "remount,size=32M", p(&dir)]);
        assert!(err.contains("tmpfs"), "a shrink below the data: {err}");
        assert_eq!(df_size(&dir), 96 * MIB, "a refused shrink changes nothing");
        run_ok(&mut s.cmd("mount", &["-o", "remount,size=64M", p(&dir)]));
        assert_eq!(df_size(&dir), 64 * MIB, "a shrink that fits");
    });
}

#[test]
fn remount_resizes_and_switches_ro_and_rw() {
    isolated(|s| {
        let dir = s.dir("x");
        let m = s.mount("ramd-test-r", &dir, "size=32M,compress=lz4");
        assert_eq!(df_size(&dir), 32 * MIB);
        let max_memory = || {
            let out = run_ok(&mut s.cmd(ramd_bin(), &["status", "--json"]));
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            v["disks"][0]["max_memory"].as_u64().unwrap()
        };
        let budget = max_memory();
        run_ok(&mut s.cmd("mount", &["-o", "remount,size=96M", p(&dir)]));
        assert_eq!(df_size(&dir), 96 * MIB, "remount,size= grows");
        // The default budget follows size (its pages, and their page tables).
        let grown = max_memory();
        assert!(grown >= budget + 64 * MIB, "{budget} -> {grown}");
        // An atime-only remount leaves size and budget alone.
        run_ok(&mut s.cmd("mount", &["-o", "remount,noatime", p(&dir)]));
        assert_eq!((df_size(&dir), max_memory()), (96 * MIB, grown));
        run_ok(&mut s.cmd("mount", &["-o", "remount,relatime", p(&dir)]));
        // 48 MiB now fit; they would not have before.
        random_file(&dir.join("big"), 48 * MIB);
        let err = s.mount_fails(&["-o", "remount,size=32M", p(&dir)]);
        assert!(
            err.contains("32M") && err.contains("delete files first"),
            "a shrink below the data: {err}"
        );
        assert_eq!(df_size(&dir), 96 * MIB, "a refused shrink changes nothing");
        run_ok(&mut s.cmd("mount", &["-o", "remount,size=64M", p(&dir)]));
        assert_eq!(df_size(&dir), 64 * MIB, "a shrink that fits");
        // Settings that cannot change while mounted: refused unless unchanged
        // (a remount of an fstab line passes them all again).
        run_ok(&mut s.cmd("mount", &["-o", "remount,compress=lz4", p(&dir)]));
        let err = s.mount_fails(&["-o", "remount,compress=zstd", p(&dir)]);
        assert!(err.contains("compress") && err.contains("umount"), "{err}");

        let read_only = || {
            let out = run_ok(&mut s.cmd(ramd_bin(), &["status", "--json"]));
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            v["disks"][0]["read_only"].as_bool().unwrap()
        };
        assert!(!read_only());
        run_ok(&mut s.cmd("mount", &["-o", "remount,ro", p(&dir)]));
        assert!(has_option(&dir, "ro"), "{:?}", mounts_entry(&dir));
        assert!(read_only(), "ramd status after remount,ro");
        let e = fs::write(dir.join("new"), "x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "write on ro: {e}");
        let out = sh(&format!("touch {}/other", p(&dir))).failed();
        assert!(out.stderr.contains("Read-only file system"), "{out:?}");
        run_ok(&mut s.cmd("mount", &["-o", "remount,rw", p(&dir)]));
        assert!(has_option(&dir, "rw") && !read_only());
        fs::write(dir.join("new"), "x").unwrap();
        // A plain flag remount through the same path.
        run_ok(&mut s.cmd("mount", &["-o", "remount,nosuid,nodev,sync", p(&dir)]));
        assert!(
            has_option(&dir, "nosuid") && has_option(&dir, "nodev") && has_option(&dir, "sync")
        );
        m.unmount();
    });
}

/// Under the default write-back cache, a remount to a smaller size brings
/// the disk within its write reserve: a file opened then is uncached, so
/// running out of space is reported by write(2) itself (short, then
/// ENOSPC), what it accepted reads back from ramd, and an uncached file
/// can still be mapped shared.
#[test]
fn after_a_shrinking_remount_write_still_reports_enospc() {
    isolated(|s| {
        let dir = s.dir("x");
        let m = s.mount("ramd-test-shrink", &dir, "size=256M");
        random_file(&dir.join("big"), 100 * MIB);
        run_ok(&mut s.cmd("mount", &["-o", "remount,size=112M", p(&dir)]));
        assert_eq!(df_size(&dir), 112 * MIB);
        let py = r#"
import errno, mmap, os, sys
fd = os.open(sys.argv[1], os.O_CREAT | os.O_WRONLY, 0o644)
block = bytes(range(256)) * 4096
written, errs = 0, []
try:
    while written < 32 << 20:
        written += os.write(fd, block)
except OSError as e:
    errs.append("write " + errno.errorcode[e.errno])
for call, fn in (("fsync", os.fsync), ("close", os.close)):
    try:
        fn(fd)
    except OSError as e:
        errs.append(call + " " + errno.errorcode[e.errno])
with open("/proc/sys/vm/drop_caches", "w") as f:
    f.write("3")
with open(sys.argv[1], "rb") as f:
    back = f.read()
# An uncached file can still be mapped shared.
fd = os.open(sys.argv[2], os.O_RDWR)
m = mmap.mmap(fd, 1 << 20)
mapped = m[:] == os.pread(fd, 1 << 20, 0)
m.close()
os.close(fd)
print(written, back == (block * 32)[:written], mapped, *errs)
"#;
        let python = require_tool("python3");
        let (new, big) = (dir.join("new"), dir.join("big"));
        let out = run_ok(&mut cmd(p(&python), ["-c", py, p(&new), p(&big)]));
        let (written, rest) = out.trim().split_once(' ').unwrap();
        let written: u64 = written.parse().unwrap();
        assert_eq!(
            rest, "True True write ENOSPC",
            "written, read back intact, mmap of an uncached file, errors"
        );
        assert!(
            written > 8 * MIB && written <= 12 * MIB,
            "12 MiB were free: {out}"
        );
        m.unmount();
    });
}

#[test]
fn nosuid_nodev_noexec_and_ro_take_effect() {
    isolated(|s| {
        require_tool("setpriv");
        require_tool("mknod");
        // nobody must reach the mount points to run the setuid binary.
        fs::set_permissions(s.tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let (plain, locked, noexec) = (s.dir("plain"), s.dir("locked"), s.dir("noexec"));
        let _a = s.mount("ramd-flags-a", &plain, "size=32M");
        let _b = s.mount("ramd-flags-b", &locked, "size=32M,nosuid,nodev");
        let _e = s.mount("ramd-flags-e", &noexec, "size=32M,noexec");
        assert!(has_option(&locked, "nosuid") && has_option(&locked, "nodev"));
        assert!(has_option(&noexec, "noexec") && !has_option(&plain, "nosuid"));
        for d in [&plain, &locked, &noexec] {
            // A setuid-root copy of id, a device node, a script.
            fs::copy("/usr/bin/id", d.join("id")).unwrap();
            fs::set_permissions(d.join("id"), fs::Permissions::from_mode(0o4755)).unwrap();
            run_ok(&mut cmd("mknod", [p(&d.join("null")), "c", "1", "3"]));
            fs::write(d.join("hi.sh"), "#!/bin/sh\necho hi\n").unwrap();
            fs::set_permissions(d.join("hi.sh"), fs::Permissions::from_mode(0o755)).unwrap();
        }
        let euid = |d: &Path| {
            run_ok(&mut cmd(
                "setpriv",
                [
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    p(&d.join("id")),
                    "-u",
                ],
            ))
            .trim()
            .to_string()
        };
        assert_eq!(
            euid(&plain),
            "0",
            "setuid works where allowed (the control)"
        );
        assert_eq!(euid(&locked), "65534", "nosuid: the setuid bit gave root");
        sh(&format!("echo x > {}/null", p(&plain))).ok();
        let out = sh(&format!("echo x > {}/null", p(&locked))).failed();
        assert!(out.stderr.contains("Permission denied"), "nodev: {out:?}");
        assert_eq!(
            run_ok(&mut cmd(p(&plain.join("hi.sh")), [] as [&str; 0])).trim(),
            "hi"
        );
        let out = sh(p(&noexec.join("hi.sh"))).failed();
        assert!(out.stderr.contains("Permission denied"), "noexec: {out:?}");
        let out = sh(p(&noexec.join("id"))).failed();
        assert!(out.stderr.contains("Permission denied"), "noexec: {out:?}");

        // ro at mount time.
        let ro = s.dir("ro");
        let _c = s.mount("ramd-flags-c", &ro, "size=32M,ro");
        assert!(has_option(&ro, "ro"));
        let e = fs::write(ro.join("f"), "x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{e}");
    });
}

/// atime as seconds since the epoch, and mtime.
fn times(path: &Path) -> (i64, i64) {
    let out = run_ok(&mut cmd("stat", ["-c", "%X %Y", p(path)]));
    let mut it = out.split_whitespace().map(|n| n.parse::<i64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

fn set_atime(path: &Path, when: &str) {
    run_ok(&mut cmd("touch", ["-a", "-d", when, p(path)]));
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn read(path: &Path) {
    fs::read(path).unwrap();
}

#[test]
fn atime_options_follow_the_kernels_rules() {
    isolated(|s| {
        require_tool("stat");
        let dir = s.dir("x");
        let _m = s.mount("ramd-atime", &dir, "size=16M");
        assert!(has_option(&dir, "relatime"));
        let f = dir.join("f");
        fs::write(&f, "data").unwrap();
        let sub = dir.join("d");
        fs::create_dir(&sub).unwrap();
        let remount =
            |o: &str| run_ok(&mut s.cmd("mount", &["-o", &format!("remount,{o}"), p(&dir)]));

        // relatime: an atime older than the last change moves; one newer and
        // less than a day old stays.
        set_atime(&f, "-2 days");
        read(&f);
        assert!(
            times(&f).0 >= unix_now() - 60,
            "relatime: a stale atime moves on read"
        );
        set_atime(&f, "+1 hour");
        let future = times(&f).0;
        read(&f);
        assert_eq!(times(&f).0, future, "relatime: a fresh atime stays");

        // strictatime: every access moves it.
        remount("strictatime");
        assert!(!has_option(&dir, "relatime") && !has_option(&dir, "noatime"));
        read(&f);
        assert!(times(&f).0 < future, "strictatime: the read moved atime");
        // A remount that names no atime rule keeps it (mountinfo shows none
        // for strictatime, so mount(8) passes none back).
        remount("size=32M");
        assert!(!has_option(&dir, "relatime") && !has_option(&dir, "noatime"));
        set_atime(&f, "+1 hour");
        let future = times(&f).0;
        read(&f);
        assert!(times(&f).0 < future, "strictatime kept by remount,size=");

        // noatime: nothing moves it.
        remount("noatime");
        assert!(has_option(&dir, "noatime"));
        set_atime(&f, "-2 days");
        let old = times(&f).0;
        read(&f);
        assert_eq!(times(&f).0, old, "noatime: the read moved atime");

        // nodiratime: listing a directory leaves its atime, files still move.
        remount("relatime,nodiratime");
        assert!(has_option(&dir, "nodiratime"));
        set_atime(&sub, "-2 days");
        set_atime(&f, "-2 days");
        let (dir_old, file_old) = (times(&sub).0, times(&f).0);
        fs::read_dir(&sub).unwrap().for_each(drop);
        read(&f);
        assert_eq!(
            times(&sub).0,
            dir_old,
            "nodiratime: listing moved the dir's atime"
        );
        assert!(
            times(&f).0 > file_old,
            "nodiratime: files' atime still moves"
        );
        // Without it, the directory's moves too.
        remount("relatime,diratime");
        fs::read_dir(&sub).unwrap().for_each(drop);
        assert!(
            times(&sub).0 > dir_old,
            "diratime: listing moves the dir's atime"
        );
    });
}

#[test]
fn bad_input_is_refused_and_nothing_is_left_started() {
    isolated(|s| {
        let dir = s.dir("x");
        let t = ["-t", "fuse.ramd", "ramd-bad"];
        let with = |opts: &str, at: &Path| {
            let mut a: Vec<String> = t.iter().map(|x| x.to_string()).collect();
            a.extend([p(at).to_string(), "-o".into(), opts.into()]);
            a
        };
        let fails = |args: Vec<String>| {
            let v: Vec<&str> = args.iter().map(String::as_str).collect();
            s.mount_fails(&v)
        };
        let err = fails(with("size=16M,colour=red", &dir));
        assert!(err.contains("unknown option \"colour\""), "{err}");
        let err = fails(with("size=16Q", &dir));
        assert!(err.contains("option size=16Q"), "{err}");
        let err = fails(with("size=16M,compress=lzo", &dir));
        assert!(
            err.contains("compress=lzo") && err.contains("codec"),
            "{err}"
        );
        let err = fails(with("size=16M,autosave=5m", &dir));
        assert!(err.contains("autosave") && err.contains("image"), "{err}");
        // The daemon's own refusals, in the words of mount options, each
        // said once.
        let err = fails(with("compress=lz4,name=nosize", &dir));
        assert!(
            err.contains("disk \"nosize\": a new disk needs a size: give -o size=SIZE"),
            "{err}"
        );
        assert_eq!(err.matches("\"nosize\"").count(), 1, "{err}");
        let err = fails(with("size=16M,flush=persist", &dir));
        assert!(err.contains("-o flush=persist needs -o image=DIR"), "{err}");
        assert!(!err.contains("--"), "a flag in a mount error: {err}");
        let err = fails(with("size=16M", &s.tmp.path().join("missing")));
        assert!(
            err.contains("missing") && err.contains("No such file"),
            "{err}"
        );
        // A mount the daemon itself refuses: its error comes back, and the
        // mount point is left as it was.
        let junk = s.tmp.path().join("junk-image");
        fs::create_dir(&junk).unwrap();
        fs::write(junk.join("MANIFEST"), "not an image").unwrap();
        let err = fails(with(&format!("size=16M,image={}", p(&junk)), &dir));
        assert!(
            err.contains("MANIFEST") || err.contains("junk-image"),
            "{err}"
        );
        assert!(err.contains("nothing was mounted"), "{err}");
        assert!(mounts_entry(&dir).is_none(), "{:?}", mounts_entry(&dir));
        assert!(s.live_disks().is_empty(), "{:?}", s.live_disks());

        // Already mounted: by ramd, and by anything else.
        let m = s.mount("ramd-first", &dir, "size=16M");
        let err = fails(with("size=16M", &dir));
        assert!(
            err.contains("busy") && err.contains("already mounted"),
            "{err}"
        );
        assert_eq!(mounts_entry(&dir).unwrap().0, "ramd-first");
        assert_eq!(s.live_disks().len(), 1);
        m.unmount();
        let tmpfs = s.dir("tmpfs");
        let _t = Mount::by(
            &mut cmd("mount", ["-t", "tmpfs", "tmpfs", p(&tmpfs)]),
            &tmpfs,
        );
        let err = fails(with("size=16M", &tmpfs));
        assert!(err.contains("busy"), "{err}");
        assert!(s.live_disks().is_empty());
    });
}

#[test]
fn the_daemon_leaves_the_callers_directory() {
    isolated(|s| {
        // mount run from inside a tmpfs, with an image path relative to it.
        let cwd = s.dir("cwd");
        let t = Mount::by(&mut cmd("mount", ["-t", "tmpfs", "tmpfs", p(&cwd)]), &cwd);
        let dir = s.dir("x");
        let mut c = s.cmd(
            "mount",
            &[
                "-t",
                "fuse.ramd",
                "ramd-cwd",
                p(&dir),
                "-o",
                "size=16M,image=../img",
            ],
        );
        c.current_dir(&cwd);
        let m = Mount::by(&mut c, &dir);
        fs::write(dir.join("f"), "saved").unwrap();
        // The daemon does not hold the tmpfs it was started from.
        t.unmount();
        m.unmount();
        let img = s.tmp.path().join("img");
        let info = run_ok(&mut cmd(ramd_bin(), ["image", "info", p(&img)]));
        assert!(!info.is_empty(), "no image at {img:?}");
    });
}

#[test]
fn the_daemon_logs_to_a_file_or_to_the_journal_stream() {
    isolated(|s| {
        use std::os::unix::fs::MetadataExt;
        let (a, b) = (s.dir("a"), s.dir("b"));
        // Anywhere but systemd: RUN_DIR/NAME.log (stderr may be a terminal).
        let m = s.mount("ramd-log-a", &a, "size=16M,name=loga");
        let log = fs::read_to_string(s.run.join("loga.log")).unwrap();
        assert!(log.contains("serving") && log.contains("loga"), "{log}");
        m.unmount();
        // stderr is what JOURNAL_STREAM names (systemd's journal): kept.
        let stream = s.tmp.path().join("journal-stream");
        let f = fs::File::create(&stream).unwrap();
        let meta = f.metadata().unwrap();
        let mut c = s.cmd(
            "mount",
            &[
                "-t",
                "fuse.ramd",
                "ramd-log-b",
                p(&b),
                "-o",
                "size=16M,name=logb",
            ],
        );
        c.env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(f);
        let mut child = c.spawn().unwrap();
        let status = wait_child(&mut child, CMD_TIMEOUT).expect("mount finishes");
        assert!(status.success(), "{status}");
        let m = Mount::adopt(&c, &b);
        m.unmount();
        // Logged before umount's wait is answered.
        let journal = fs::read_to_string(&stream).unwrap();
        assert!(journal.contains("disk \"logb\" stopped"), "{journal}");
        assert!(!s.run.join("logb.log").exists());
    });
}

/// `fuse_transport=` picks how FUSE requests travel, and `ramd status`
/// (table and JSON) shows the one serving; a bad value names the choices.
#[test]
fn fuse_transport_is_an_option_that_status_reports() {
    isolated(|s| {
        let dir = s.dir("tr");
        let err = s.mount_fails(&[
            "-t",
            "fuse.ramd",
            "ramd-tr",
            p(&dir),
            "-o",
            "size=16M,fuse_transport=pigeon",
        ]);
        assert!(
            err.contains("fuse_transport=pigeon") && err.contains("auto, io-uring or dev"),
            "{err}"
        );
        assert!(s.live_disks().is_empty(), "{:?}", s.live_disks());
        for (opt, want, shown) in [
            ("fuse_transport=dev", "dev", "(/dev/fuse)"),
            ("fuse_transport=io-uring", "io-uring", "(io-uring)"),
        ] {
            let m = s.mount("ramd-tr", &dir, &format!("size=16M,{opt}"));
            fs::write(dir.join("f"), b"through the chosen transport").unwrap();
            let transport = || -> Option<String> {
                let st = status_json(&s.run);
                let fe = st["disks"].as_array()?.first()?["frontends"]
                    .as_array()?
                    .first()?
                    .clone();
                fe["transport"].as_str().map(String::from)
            };
            wait_until(START_DEADLINE, &format!("status transport {want}"), || {
                transport().as_deref() == Some(want)
            });
            let table = ramd_cmd(&s.run, &["status"]).ok();
            assert!(table.contains(shown), "{opt}: {table}");
            assert_eq!(
                fs::read(dir.join("f")).unwrap(),
                b"through the chosen transport"
            );
            m.unmount();
        }
    });
}

/// `lazytime` (MS_LAZYTIME), as tmpfs takes it: at mount, dropped by
/// `remount,nolazytime`, back with `remount,lazytime`, kept by a remount
/// that does not name it (mount(8) passes the mount's options back); a
/// file's new mtime is seen at once either way.
#[test]
fn lazytime_is_taken_as_tmpfs_takes_it() {
    let s = Setup::new();
    struct Tmpfs(PathBuf);
    impl Drop for Tmpfs {
        fn drop(&mut self) {
            let _ = run(&mut cmd("umount", [p(&self.0)]), CMD_TIMEOUT);
        }
    }
    let steps = |dir: &Path, remount: &dyn Fn(&str)| {
        let mut seen = vec![has_option(dir, "lazytime")];
        for opts in ["nolazytime", "lazytime", "size=48M"] {
            remount(opts);
            seen.push(has_option(dir, "lazytime"));
        }
        fs::write(dir.join("f"), "x").unwrap();
        run_ok(&mut cmd(
            "touch",
            ["-m", "-d", "2001-01-01", p(&dir.join("f"))],
        ));
        let mtime = fs::metadata(dir.join("f")).unwrap();
        use std::os::unix::fs::MetadataExt;
        (seen, mtime.mtime())
    };
    let tdir = s.dir("tmpfs");
    run_ok(&mut cmd(
        "mount",
        ["-t", "tmpfs", "-o", "size=32M,lazytime", "tmpfs", p(&tdir)],
    ));
    let _t = Tmpfs(tdir.clone());
    let want = steps(&tdir, &|o| {
        run_ok(&mut cmd("mount", ["-o", &format!("remount,{o}"), p(&tdir)]));
    });
    assert_eq!(want, (vec![true, false, true, true], 978307200));
    // Both data paths: the store's, and the kernel's (passthrough).
    for (name, opts) in [
        ("x", "size=32M,lazytime"),
        ("k", "size=32M,lazytime,data_path=kernel"),
    ] {
        let dir = s.dir(name);
        let m = s.mount(&format!("ramd-test-lazy-{name}"), &dir, opts);
        let got = steps(&dir, &|o| {
            run_ok(&mut s.cmd("mount", &["-o", &format!("remount,{o}"), p(&dir)]));
        });
        assert_eq!(got, want, "{opts}");
        m.unmount();
    }
}
