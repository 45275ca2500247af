//! No data lost by accident, tried the way a careless user makes the
//! accident: every signal a terminal or an init system sends, a second
//! Ctrl-C during the save, an image on a filesystem that is full, a mount
//! that another mount namespace (`unshare -m`) still holds at `umount` and
//! at `ramd down`, a restart after `kill -9`, a config file with a disk that
//! cannot start, and `ramd down` (and the systemd unit's ExecStop line) in a
//! run directory shared with disks it does not own.

mod common;
mod fs_common;

use common::*;
use fs_common::{is_mounted, FsDisk};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn p(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// A file of `len` random bytes at `path`; its sha256.
fn put(path: &Path, len: u64) -> String {
    random_file(path, len);
    sha256(path)
}

/// `unshare -m --propagation private sleep 600`: a process in a mount
/// namespace of its own, holding a copy of every mount there was, as a
/// container or a `PrivateTmp=` service does. Returns once its copy of
/// `mnt` is in place.
fn namespace_holding(mnt: &Path) -> Background {
    require_tool("unshare");
    let mut holder = Background::spawn(Command::new("unshare").args([
        "-m",
        "--propagation",
        "private",
        "sleep",
        "600",
    ]));
    let pid = holder.pid();
    wait_until(START_DEADLINE, "the namespace to hold the mount", || {
        holder.assert_running();
        // `unshare` execs sleep: the pid is the namespace's process.
        fs::read_to_string(format!("/proc/{pid}/mountinfo"))
            .is_ok_and(|i| i.lines().any(|l| l.split(' ').nth(4) == Some(p(mnt))))
            && fs::read_link(format!("/proc/{pid}/ns/mnt")).ok()
                != fs::read_link("/proc/self/ns/mnt").ok()
    });
    holder
}

/// What `path`, seen from inside the namespace of `pid`, answers to stat.
fn errno_in_namespace(pid: u32, path: &Path) -> Option<i32> {
    let inside = PathBuf::from(format!("/proc/{pid}/root")).join(path.strip_prefix("/").unwrap());
    fs::metadata(inside).err().and_then(|e| e.raw_os_error())
}

// ---------------------------------------------------------------------------
// Signals

/// HUP (a closed terminal, a lost ssh session), INT, TERM and QUIT each
/// save and stop `ramd serve` cleanly: exit 0, the mount gone, the data in
/// the image.
#[test]
fn every_signal_a_terminal_or_init_sends_saves_and_stops() {
    let tmp = scratch();
    for (sig, name) in [
        (libc::SIGHUP, "HUP"),
        (libc::SIGINT, "INT"),
        (libc::SIGTERM, "TERM"),
        (libc::SIGQUIT, "QUIT"),
    ] {
        let img = tmp.path().join(format!("img-{name}"));
        let mut d = FsDisk::mount(&["--size", "64M", "--image", p(&img)]);
        let sum = put(&d.join("data"), 10 * MIB);
        let status = d.stop_with(sig);
        assert!(
            status.success(),
            "SIGHUP {name}: exit {status}; stderr:\n{}",
            d.stderr()
        );
        assert!(
            img.join("MANIFEST").exists(),
            "SIG{name} stopped ramd without saving; stderr:\n{}",
            d.stderr()
        );
        let d = FsDisk::mount(&["--image", p(&img)]);
        assert_eq!(sha256(&d.join("data")), sum, "after SIG{name}");
        d.stop();
    }
}

/// The mount helper's daemon has no terminal: SIGHUP is ignored (said in
/// its log), the disk serves on; `umount` still stops and saves it. The
/// helper runs through a symlink named as mount(8) would call it, in a
/// temporary directory: /sbin is not touched.
#[test]
fn the_mount_helpers_detached_daemon_ignores_sighup() {
    let tmp = scratch();
    let rd = tmp.path().join("run");
    let img = tmp.path().join("img");
    let mnt = tmp.path().join("mnt");
    fs::create_dir(&mnt).unwrap();
    let helper = tmp.path().join("mount.fuse.ramd");
    std::os::unix::fs::symlink(ramd_bin(), &helper).unwrap();
    let opts = format!("size=64M,image={},run_dir={}", p(&img), p(&rd));
    run_ok(Command::new(&helper).args(["ramd", p(&mnt), "-o", &opts]));
    let sum = put(&mnt.join("f"), MIB);
    let s = status_json(&rd);
    let pid = s["disks"][0]["pid"].as_u64().expect("pid") as i32;
    // SAFETY: kill(2) of the daemon this test started.
    unsafe { libc::kill(pid, libc::SIGHUP) };
    let log = fs::read_dir(&rd)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "log"))
        .expect("the daemon's log in its run dir");
    wait_until(
        STOP_DEADLINE,
        "the daemon to log the ignored SIGHUP",
        || {
            fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("SIGHUP) ignored")
        },
    );
    assert!(
        !process_exited(pid as u32),
        "SIGHUP ended the detached daemon"
    );
    assert_eq!(sha256(&mnt.join("f")), sum);
    run_ok(Command::new("umount").arg(&mnt));
    wait_until(STOP_DEADLINE, "the daemon to stop after umount", || {
        process_exited(pid as u32)
    });
    assert!(img.join("MANIFEST").exists());
}

/// A second Ctrl-C while the first one's save runs cuts clients off but
/// does not skip the save: the image has every byte.
#[test]
fn a_second_ctrl_c_during_the_save_still_saves() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let src = tmp.path().join("src");
    random_file(&src, 192 * MIB);
    let mut d = Ramd::start(&["--size", "256M", "--image", p(&img)]);
    nbdcopy_ok(&[p(&src), d.uri()]);
    let pid = d.pid() as i32;
    // SAFETY: kill(2) to our own child.
    unsafe { libc::kill(pid, libc::SIGINT) };
    wait_until(STOP_DEADLINE, "the first signal to be taken", || {
        d.stderr().contains("stopping (saving first")
    });
    // SAFETY: as above.
    unsafe { libc::kill(pid, libc::SIGINT) };
    let status = d.wait_exit(LONG_TIMEOUT);
    assert!(status.success(), "{status}; stderr:\n{}", d.stderr());
    let err = d.stderr();
    if !err.contains("again: cutting clients off") {
        println!("the second SIGINT came after the save (fast disk):\n{err}");
    }
    let d = Ramd::start(&["--image", p(&img)]);
    let back = tmp.path().join("back");
    nbdcopy_ok(&[d.uri(), p(&back)]);
    let want = tmp.path().join("want");
    fs::copy(&src, &want).unwrap();
    run_ok(cmd("truncate", ["-s", "256M"]).arg(&want));
    assert_same_file(&want, &back);
}

fn nbdcopy_ok(args: &[&str]) {
    require_tool("nbdcopy");
    run_ok(&mut cmd("nbdcopy", args));
}

// ---------------------------------------------------------------------------
// A failed save

/// An image on a 20 MiB filesystem, 40 MiB written, Ctrl-C: the save
/// fails, so the disk is not stopped; status and the log say why and what
/// to do, and never claim a save that does not exist. `ramd snapshot --to`
/// saves it elsewhere; then Ctrl-C stops it, and the new image has the data.
#[test]
fn a_failed_save_at_stop_keeps_the_disk_serving_until_saved_elsewhere() {
    let tmp = scratch();
    let small = Mount::tmpfs(&tmp.path().join("small"), "20M", &[]);
    let img = small.path().join("img");
    let mut d = FsDisk::mount(&["--size", "128M", "--image", p(&img)]);
    let sum = put(&d.join("big"), 40 * MIB);
    // SAFETY: kill(2) to our own child.
    unsafe { libc::kill(d.pid() as i32, libc::SIGINT) };
    wait_until(STOP_DEADLINE, "status to say the stop is blocked", || {
        d.status()["blocked"]
            .as_str()
            .is_some_and(|b| b.contains("NOT STOPPED"))
    });
    d.assert_alive();
    let blocked = d.status()["blocked"].as_str().unwrap().to_string();
    assert!(
        blocked.contains("No space left") && blocked.contains("snapshot"),
        "{blocked}"
    );
    let table = ramd_cmd(d.run_dir(), &["status"]).ok();
    assert!(table.contains("NOT STOPPED"), "{table}");
    let err = d.stderr();
    assert!(
        err.contains("holds no complete save") && !err.contains("intact"),
        "a message claims a save that does not exist:\n{err}"
    );
    // Still served, still whole.
    assert!(is_mounted(d.path()));
    assert_eq!(sha256(&d.join("big")), sum);

    let other = tmp.path().join("elsewhere");
    let out = ramd_cmd(d.run_dir(), &["snapshot", d.name(), "--to", p(&other)]).ok();
    assert!(out.contains(p(&other)), "{out}");
    assert_eq!(d.status()["blocked"], serde_json::Value::Null);
    let status = d.stop_with(libc::SIGINT);
    assert!(status.success(), "{status}; stderr:\n{}", d.stderr());

    let d = FsDisk::mount(&["--image", p(&other)]);
    assert_eq!(sha256(&d.join("big")), sum);
    d.stop();
    drop(small);
}

/// After `umount` nothing can serve the disk any more: a failed save then
/// holds the data (status says so, `ramd down` says why and does not
/// stop it) and retries; once space is freed the next try saves and the
/// daemon ends by itself.
#[test]
fn a_failed_save_after_umount_holds_the_data_until_space_is_freed() {
    let tmp = scratch();
    let small = Mount::tmpfs(&tmp.path().join("small"), "24M", &[]);
    let img = small.path().join("img");
    let filler = small.path().join("filler");
    random_file(&filler, 16 * MIB);
    let mut d = FsDisk::mount(&["--size", "128M", "--image", p(&img)]);
    let sum = put(&d.join("big"), 12 * MIB);
    run_ok(Command::new("umount").arg(d.path()));
    wait_until(STOP_DEADLINE, "status to say the data is held", || {
        ramd_cmd(d.run_dir(), &["status", "--json"])
            .ok()
            .contains("NOT SAVED")
    });
    d.assert_alive();
    let out = ramd_cmd(d.run_dir(), &["down", d.name()]).failed();
    assert!(
        out.stderr.contains("NOT SAVED") && out.stderr.contains("--force"),
        "{out:?}"
    );
    d.assert_alive();
    fs::remove_file(&filler).unwrap();
    // Asked again, it tries again at once.
    let out = ramd_cmd(d.run_dir(), &["down", d.name()]).ok();
    assert!(out.contains("stopped, saved"), "{out}");
    let status = d.wait_exit();
    assert!(status.success(), "{status}; stderr:\n{}", d.stderr());
    let d = FsDisk::mount(&["--image", p(&img)]);
    assert_eq!(sha256(&d.join("big")), sum);
    d.stop();
}

/// `ramd down --force` stops a disk whose save fails, and says what is
/// lost; the process exits non-zero saying it too.
#[test]
fn down_force_stops_without_the_save_and_says_what_is_lost() {
    let tmp = scratch();
    let small = Mount::tmpfs(&tmp.path().join("small"), "8M", &[]);
    let img = small.path().join("img");
    let mut d = FsDisk::mount(&["--size", "64M", "--image", p(&img)]);
    put(&d.join("big"), 16 * MIB);
    let out = ramd_cmd(d.run_dir(), &["down", d.name()]).failed();
    assert!(out.stderr.contains("NOT STOPPED"), "{out:?}");
    d.assert_alive();
    let out = ramd_cmd(d.run_dir(), &["down", "--force", d.name()]).failed();
    assert!(
        out.stderr.contains("WITHOUT saving") && out.stderr.contains("lost all of its data"),
        "{out:?}"
    );
    let status = d.wait_exit();
    assert_eq!(status.code(), Some(1), "stderr:\n{}", d.stderr());
    assert!(d.stderr().contains("lost all of its data"));
    assert!(!is_mounted(d.path()), "a forced stop left a dead mount");
}

// ---------------------------------------------------------------------------
// Other mount namespaces

/// `umount` here while another namespace holds a copy: the disk still
/// stops and saves, and the copy answers ENOTCONN.
#[test]
fn umount_while_another_namespace_holds_the_mount_stops_and_saves() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let mut d = FsDisk::mount(&["--size", "64M", "--image", p(&img)]);
    let sum = put(&d.join("f"), 3 * MIB);
    let holder = namespace_holding(d.path());
    let status = d.umount_externally();
    assert!(status.success(), "{status}; stderr:\n{}", d.stderr());
    let err = d.stderr();
    assert!(
        err.contains("another mount namespace") && err.contains("sleep"),
        "ramd does not say what it did:\n{err}"
    );
    assert_eq!(
        errno_in_namespace(holder.pid(), d.path()),
        Some(libc::ENOTCONN)
    );
    drop(holder);
    let d = FsDisk::mount(&["--image", p(&img)]);
    assert_eq!(sha256(&d.join("f")), sum);
    d.stop();
}

/// `ramd down NAME` while another namespace holds a copy returns (it
/// blocked for as long as the namespace lived), saved.
#[test]
fn down_while_another_namespace_holds_the_mount_returns() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let mut d = FsDisk::mount(&["--size", "64M", "--image", p(&img)]);
    let sum = put(&d.join("f"), 3 * MIB);
    let holder = namespace_holding(d.path());
    let out = ramd_cmd(d.run_dir(), &["down", d.name()]).ok();
    assert!(out.contains("stopped, saved"), "{out}");
    let status = d.wait_exit();
    assert!(status.success(), "{status}; stderr:\n{}", d.stderr());
    assert_eq!(
        errno_in_namespace(holder.pid(), d.path()),
        Some(libc::ENOTCONN)
    );
    // The name is free again at once.
    let d = FsDisk::mount(&["--image", p(&img)]);
    assert_eq!(sha256(&d.join("f")), sum);
    d.stop();
}

// ---------------------------------------------------------------------------
// Crashes

/// After `kill -9` the mount point holds a dead mount ("Transport endpoint
/// is not connected"); starting the disk again clears it, says so, and
/// loads the image.
#[test]
fn a_restart_after_kill_9_clears_the_dead_mount_and_loads_the_image() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let mut d = FsDisk::mount(&["--size", "64M", "--image", p(&img)]);
    let sum = put(&d.join("f"), 2 * MIB);
    ramd_cmd(d.run_dir(), &["snapshot", d.name()]).ok();
    let dir = d.path().to_path_buf();
    d.kill_leaving_mount();
    // ENOTCONN; over io_uring the first requests may be ECONNABORTED or
    // ECANCELED.
    let dead = fs::metadata(&dir).unwrap_err();
    assert!(
        matches!(
            dead.raw_os_error(),
            Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
        ),
        "{dead}"
    );
    let d = FsDisk::mount_at(&dir, &["--image", p(&img)])
        .unwrap_or_else(|f| panic!("restart after kill -9: {}\n{}", f.status, f.stderr));
    assert!(
        d.stderr().contains("cleared a dead fuse.ramd mount"),
        "{}",
        d.stderr()
    );
    assert_eq!(sha256(&d.join("f")), sum);
    d.stop();
}

// ---------------------------------------------------------------------------
// `ramd up` and `ramd down`

fn config(tmp: &Path, missing_mount: &Path) -> PathBuf {
    let config = tmp.join("ramd.toml");
    fs::write(
        &config,
        format!(
            "[disk.good]\nsize = \"64M\"\n\n\
             [disk.bad]\nkind = \"fs\"\nsize = \"64M\"\nmount = \"{}\"\n",
            missing_mount.display()
        ),
    )
    .unwrap();
    config
}

/// One disk that cannot start no longer keeps the others down: it shows as
/// FAILED with its reason, and `ramd reload` starts it once fixed.
/// `--all-or-nothing` keeps the old way.
#[test]
fn up_starts_the_disks_that_can_and_reload_retries_the_failed_one() {
    let tmp = scratch();
    let rd = tmp.path().join("run");
    let mnt = tmp.path().join("later");
    let config = config(tmp.path(), &mnt);

    let (status, err) = Up::try_start(&rd, &config, &["--all-or-nothing"])
        .err()
        .expect("--all-or-nothing starts nothing when a disk fails");
    assert!(
        status.contains("exited") && err.contains("later"),
        "{status}\n{err}"
    );

    let up = Up::start(&rd, &config);
    assert!(
        up.ready.iter().any(|l| l.starts_with("bad FAILED: ")),
        "{:?}",
        up.ready
    );
    qemu_io(&up.uri("good"), &["write -P 0x5a 0 1M".into()]);
    let s = status_json(&rd);
    let failed = &s["daemons"][0]["failed"];
    assert!(
        failed["bad"].as_str().is_some_and(|w| w.contains("later")),
        "{s}"
    );
    let table = ramd_cmd(&rd, &["status"]).ok();
    assert!(
        table.contains("disk bad: FAILED to start") && table.contains("ramd reload"),
        "{table}"
    );

    fs::create_dir(&mnt).unwrap();
    ramd_cmd(&rd, &["reload"]).ok();
    let s = status_json(&rd);
    assert!(disk_entry(&s, "bad").is_some(), "{s}");
    assert!(
        s["daemons"][0]["failed"]
            .as_object()
            .is_none_or(|f| f.is_empty()),
        "{s}"
    );
    assert!(is_mounted(&mnt));
    drop(up);
    assert!(!is_mounted(&mnt));
}

/// The systemd unit's ExecStop line, as installed, stops its own daemon
/// and nothing else: a separate `ramd serve` in the same run directory
/// keeps serving. A bare `ramd down` with no `ramd up` there says what runs
/// and stops nothing; `--all` stops everything.
#[test]
fn the_units_execstop_stops_only_its_own_daemon() {
    let tmp = scratch();
    let rd = tmp.path().join("run");
    let units = tmp.path().join("units");
    fs::create_dir(&units).unwrap();
    let config = tmp.path().join("ramd.toml");
    fs::write(&config, "[disk.unitdisk]\nsize = \"64M\"\n").unwrap();
    let mut c = Command::new(ramd_bin());
    c.args([
        "install-systemd",
        "--config",
        p(&config),
        "--unit-dir",
        p(&units),
    ]);
    run_ok(&mut c);
    let unit = fs::read_to_string(units.join("ramd.service")).unwrap();
    let exec_stop = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStop="))
        .expect("an ExecStop line");

    let mut up = Up::start(&rd, &config);
    let mut other = Ramd::start_in(&rd, &["--size", "64M", "--name", "mine"]);
    // What systemd runs: $MAINPID is the unit's main process.
    let words: Vec<String> = exec_stop
        .replace("$MAINPID", &up.pid().to_string())
        .split(' ')
        .map(String::from)
        .collect();
    run_ok(
        Command::new(&words[0])
            .args(&words[1..])
            .env("RAMD_RUN_DIR", &rd),
    );
    let st = up.wait_exit();
    assert!(st.success(), "{st}; stderr:\n{}", up.stderr());
    other.assert_alive();
    qemu_io(
        other.uri(),
        &["write -P 0x11 0 1M".into(), "read -P 0x11 0 1M".into()],
    );

    let out = ramd_cmd(&rd, &["down"]).failed();
    assert!(
        out.stderr.contains("mine") && out.stderr.contains("--all"),
        "{out:?}"
    );
    other.assert_alive();
    ramd_cmd(&rd, &["down", "--all"]).ok();
    let st = other.wait_exit(STOP_DEADLINE);
    assert!(st.success(), "{st}");
}

/// Ctrl-C while a large image loads stops the load (it does not wait for
/// it, then save a half-loaded disk over the image): the image is exactly
/// as it was, and loads whole afterwards.
#[test]
fn ctrl_c_during_a_load_stops_it_and_leaves_the_image_alone() {
    let tmp = scratch();
    let img = tmp.path().join("img");
    let src = tmp.path().join("src");
    random_file(&src, 512 * MIB);
    let mut d = Ramd::start(&["--size", "512M", "--image", p(&img)]);
    nbdcopy_ok(&[p(&src), d.uri()]);
    d.stop();
    let listing = |dir: &Path| -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    sha256(&e.path()),
                )
            })
            .collect();
        v.sort();
        v
    };
    let before = listing(&img);

    let rd = scratch();
    let log = tmp.path().join("stderr");
    let mut child = Command::new(ramd_bin())
        .arg("--run-dir")
        .arg(rd.path())
        .args(["serve", "--image", p(&img)])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_until(START_DEADLINE, "the load to begin", || {
        fs::read_to_string(&log).unwrap().contains("loading image")
    });
    // SAFETY: kill(2) to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = wait_child(&mut child, STOP_DEADLINE).expect("ramd exits after SIGINT");
    let err = fs::read_to_string(&log).unwrap();
    if err.contains("loaded image") {
        // The load won the race (a fast host): then it stopped as usual.
        assert!(status.success(), "{status}\n{err}");
    } else {
        assert!(err.contains("stopped by a signal"), "{err}");
        assert!(!err.contains("saved"), "{err}");
        assert_eq!(status.code(), Some(1), "{err}");
    }
    assert_eq!(listing(&img), before, "the image changed:\n{err}");
    let d = Ramd::start(&["--image", p(&img)]);
    let back = tmp.path().join("back");
    nbdcopy_ok(&[d.uri(), p(&back)]);
    assert_same_file(&src, &back);
}

/// A disk that a reload removes leaves `ramd status`'s table at once, even
/// while it still saves; `--json` shows it as stopping until it is gone.
#[test]
fn a_disk_removed_by_reload_leaves_the_table_at_once() {
    let tmp = scratch();
    let rd = tmp.path().join("run");
    let img = tmp.path().join("img");
    let config = tmp.path().join("ramd.toml");
    let both = format!(
        "[disk.kept]\nsize = \"64M\"\n\n[disk.gone]\nsize = \"256M\"\nimage = \"{}\"\n",
        img.display()
    );
    fs::write(&config, &both).unwrap();
    let up = Up::start(&rd, &config);
    let src = tmp.path().join("src");
    random_file(&src, 192 * MIB);
    nbdcopy_ok(&[p(&src), &up.uri("gone")]);
    fs::write(&config, "[disk.kept]\nsize = \"64M\"\n").unwrap();
    ramd_cmd(&rd, &["reload"]).ok();
    let table = ramd_cmd(&rd, &["status"]).ok();
    assert!(
        table.contains("kept") && !table.contains("gone"),
        "a removed disk is still listed:\n{table}"
    );
    wait_until(
        STOP_DEADLINE,
        "the removed disk to be saved and gone",
        || disk_entry(&status_json(&rd), "gone").is_none(),
    );
    assert!(img.join("MANIFEST").exists());
    drop(up);
}
