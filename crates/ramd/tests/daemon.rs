//! One process, many disks: `ramd up` with a config file, `ramd down`,
//! `ramd reload`, a memory budget shared by a daemon's disks, and one disk
//! served on several sockets at once.

mod common;

use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn write_config(dir: &Path, text: &str) -> PathBuf {
    let p = dir.join("ramd.toml");
    fs::write(&p, text).unwrap();
    p
}

fn names(status: &serde_json::Value) -> Vec<String> {
    let mut v: Vec<String> = status["disks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect();
    v.sort();
    v
}

fn run_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("ramd-run.")
        .tempdir()
        .unwrap()
}

/// Runs `ramd ARGS` expecting failure; returns its stderr.
fn ramd_fails(run_dir: &Path, args: &[&str]) -> String {
    ramd_cmd(run_dir, args).failed().stderr
}

#[test]
fn four_disks_come_up_in_one_process_and_go_down_saved() {
    let tmp = scratch();
    let rd = run_dir();
    let (m1, m2, img) = (
        tmp.path().join("files"),
        tmp.path().join("kept"),
        tmp.path().join("kept.img"),
    );
    fs::create_dir(&m1).unwrap();
    fs::create_dir(&m2).unwrap();
    let config = write_config(
        tmp.path(),
        &format!(
            "[daemon]\ncompress_threads = 1\n\n\
             [disk.blk]\nsize = \"64M\"\n\n\
             [disk.zblk]\nsize = \"64M\"\ncompress = \"lz4\"\n\n\
             [disk.files]\nkind = \"fs\"\nsize = \"64M\"\nmount = \"{}\"\n\n\
             [disk.kept]\nkind = \"fs\"\nsize = \"64M\"\nmount = \"{}\"\nimage = \"{}\"\n",
            m1.display(),
            m2.display(),
            img.display()
        ),
    );
    let mut up = Up::start(rd.path(), &config);
    let status = status_json(rd.path());
    assert_eq!(names(&status), ["blk", "files", "kept", "zblk"], "{status}");
    for d in status["disks"].as_array().unwrap() {
        assert_eq!(field(d, "pid"), up.pid() as u64, "one process: {d}");
    }
    let daemons = status["daemons"].as_array().expect("daemons");
    assert_eq!(daemons.len(), 1, "{status}");
    assert_eq!(daemons[0]["disks"].as_array().unwrap().len(), 4);
    let zblk = disk_entry(&status, "zblk").unwrap();
    assert_eq!(zblk["compress"], "lz4", "{zblk}");

    // Each disk takes data through its own frontend.
    qemu_io(&up.uri("blk"), &["write -P 0x11 0 4M".into()]);
    qemu_io(&up.uri("zblk"), &["write -P 0x22 0 4M".into()]);
    fs::write(m1.join("a"), b"files").unwrap();
    fs::write(m2.join("b"), b"kept across a restart").unwrap();
    qemu_io(&up.uri("blk"), &["read -P 0x11 0 4M".into()]);
    qemu_io(&up.uri("zblk"), &["read -P 0x22 0 4M".into()]);
    let s = status_json(rd.path());
    assert_eq!(field(disk_entry(&s, "blk").unwrap(), "used_bytes"), 4 * MIB);
    // The table shows every disk and the daemon's line.
    let table = ramd_cmd(rd.path(), &["status"]).ok();
    for n in ["blk", "zblk", "files", "kept"] {
        assert!(table.contains(n), "{table}");
    }
    assert!(table.contains(&format!("daemon {}", up.pid())), "{table}");

    let out = ramd_cmd(rd.path(), &["down"]).ok();
    assert!(out.contains("daemon stopped"), "{out}");
    let st = up.wait_exit();
    assert!(st.success(), "{st}; stderr:\n{}", up.stderr());
    assert!(!ramd_fs_mounted(&m1) && !ramd_fs_mounted(&m2));
    assert!(control_sockets(rd.path()).is_empty());

    // The disk with an image comes back with its file.
    let _up = Up::start(rd.path(), &config);
    assert_eq!(
        fs::read_to_string(m2.join("b")).unwrap(),
        "kept across a restart"
    );
    assert!(
        !m1.join("a").exists(),
        "a RAM disk without image is volatile"
    );
}

fn ramd_fs_mounted(dir: &Path) -> bool {
    let canon = dir.canonicalize().unwrap();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(canon.to_str().unwrap()))
}

fn control_sockets(run_dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(run_dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "ctl" || x == "daemon"))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn down_one_disk_and_reload_leave_the_others_serving_under_fio_verify() {
    require_tool("fio");
    let tmp = scratch();
    let rd = run_dir();
    let config = write_config(
        tmp.path(),
        "[disk.a]\nsize = \"256M\"\n\n[disk.b]\nsize = \"64M\"\n\n[disk.gone]\nsize = \"64M\"\n",
    );
    let up = Up::start(rd.path(), &config);
    // fio writes and verifies on `a` for the whole test.
    let out = tmp.path().join("fio.json");
    let mut fio = Background::spawn(
        Command::new("fio")
            .args([
                "--name=verify",
                "--ioengine=nbd",
                &format!("--uri={}", up.uri("a")),
                "--rw=randwrite",
                "--bs=4k",
                "--iodepth=16",
                "--size=128M",
                "--verify=crc32c",
                "--verify_backlog=512",
                "--verify_fatal=1",
                "--time_based",
                "--runtime=8",
                "--output-format=json",
                &format!("--output={}", out.display()),
            ])
            .current_dir(tmp.path()),
    );

    // `down NAME` stops that disk only.
    let err = ramd_fails(rd.path(), &["down", "nosuch"]);
    assert!(
        err.contains("\"nosuch\"") && err.contains("a, b, gone"),
        "{err}"
    );
    let said = ramd_cmd(rd.path(), &["down", "gone"]).ok();
    assert!(said.contains("gone: stopped"), "{said}");
    assert_eq!(names(&status_json(rd.path())), ["a", "b"]);

    // A file that does not parse changes nothing.
    fs::write(&config, "[disk.a]\nsize = \"256M\"\n[disk.c\n").unwrap();
    let err = ramd_fails(rd.path(), &["reload"]);
    assert!(err.contains("ramd.toml:3"), "{err}");
    assert!(err.contains("nothing was changed"), "{err}");
    assert_eq!(names(&status_json(rd.path())), ["a", "b"]);

    // Reload: b goes, c comes, a is not touched.
    fs::write(
        &config,
        "[disk.a]\nsize = \"256M\"\n\n[disk.c]\nsize = \"32M\"\n",
    )
    .unwrap();
    let said = ramd_cmd(rd.path(), &["reload"]).ok();
    assert!(said.contains("added: c"), "{said}");
    assert!(said.contains("removed: b"), "{said}");
    assert!(said.contains("unchanged: a"), "{said}");
    wait_until(STOP_DEADLINE, "disk b to be gone", || {
        names(&status_json(rd.path())) == ["a", "c"]
    });
    let c = status_json(rd.path());
    let c_uri = disk_entry(&c, "c").unwrap()["uri"]
        .as_str()
        .unwrap()
        .to_string();
    qemu_io(
        &c_uri,
        &["write -P 0x5a 0 1M".into(), "read -P 0x5a 0 1M".into()],
    );
    // SIGHUP reloads too (nothing to do now).
    // SAFETY: kill(2) on our own child's pid.
    unsafe { libc::kill(up.pid() as i32, libc::SIGHUP) };

    fio.assert_running();
    fio.finish_ok();
    let json: serde_json::Value = serde_json::from_str(&fs::read_to_string(&out).unwrap()).unwrap();
    let job = &json["jobs"][0];
    assert_eq!(job["error"], 0, "{job}");
    assert!(
        job["read"]["io_bytes"].as_u64().unwrap() > 0,
        "fio verified nothing: {job}"
    );
    assert_eq!(names(&status_json(rd.path())), ["a", "c"]);
}

#[test]
fn the_shared_budget_gives_enospc_to_the_disk_that_crosses_it() {
    let tmp = scratch();
    let rd = run_dir();
    let config = write_config(
        tmp.path(),
        "[daemon]\nmax_memory = \"48M\"\n\n[disk.a]\nsize = \"64M\"\n\n[disk.b]\nsize = \"64M\"\n",
    );
    let up = Up::start(rd.path(), &config);
    let (a, b) = (up.uri("a"), up.uri("b"));
    nbd_script("io.py", &[&a, "write-random", "0", "40M", "a"]);
    // b fits until the daemon's budget is used up, then gets ENOSPC.
    let out = nbd_script("io.py", &[&b, "fill-until-enospc", "0", "64M", "b"]);
    let written = written(&out);
    assert!(
        (4 * MIB..=8 * MIB).contains(&written),
        "b wrote {written} bytes beside a's 40 MiB under a 48 MiB budget"
    );
    // Nothing was lost on either disk, and both keep serving.
    nbd_script("io.py", &[&a, "verify-random", "0", "40M", "a"]);
    let w = written.to_string();
    nbd_script("io.py", &[&b, "verify-random", "0", &w, "b"]);
    let s = status_json(rd.path());
    let daemon = &s["daemons"][0];
    assert_eq!(field(daemon, "max_memory"), 48 * MIB, "{daemon}");
    assert!(field(daemon, "memory_used") <= 48 * MIB, "{daemon}");
    // Room made on one disk is room for the other.
    nbd_script("io.py", &[&a, "trim", "0", "40M"]);
    nbd_script(
        "io.py",
        &[
            &b,
            "write-random",
            &w,
            "16M",
            "c",
            ",",
            "verify-random",
            &w,
            "16M",
            "c",
        ],
    );
    nbd_script("io.py", &[&b, "verify-random", "0", &w, "b"]);
}

#[test]
fn one_disk_on_a_unix_socket_and_tcp_at_once() {
    let port = free_tcp_port();
    let rd = run_dir();
    let tmp = scratch();
    let img = tmp.path().join("img");
    let sock = rd.path().join("both.sock");
    let mut d = Ramd::start_in(
        rd.path(),
        &[
            "--size",
            "64M",
            "--image",
            img.to_str().unwrap(),
            "--name",
            "both",
            "--listen",
            &format!("unix:{}", sock.display()),
            "--listen",
            &format!("tcp:{port}"),
        ],
    );
    let unix = d.uri().to_string();
    assert!(unix.contains("socket="), "{unix}");
    let tcp = format!("nbd://127.0.0.1:{port}/both");
    // The ready line names both.
    assert_eq!(d.endpoints(), [unix.clone(), tcp.clone()]);
    qemu_io(&unix, &["write -P 0xab 0 2M".into()]);
    qemu_io(
        &tcp,
        &["read -P 0xab 0 2M".into(), "write -P 0xcd 2M 2M".into()],
    );
    qemu_io(
        &unix,
        &["read -P 0xcd 2M 2M".into(), "read -P 0xab 0 2M".into()],
    );
    let s = d.stats();
    let ends: Vec<&str> = s["frontends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["endpoint"].as_str().unwrap())
        .collect();
    assert_eq!(ends, [unix.as_str(), tcp.as_str()], "{s}");
    assert_eq!(field(&s, "used_bytes"), 4 * MIB);

    // `ramd down NAME` ends a `serve` daemon too, saving first.
    let said = ramd_cmd(rd.path(), &["down", "both"]).ok();
    assert!(said.contains("both: stopped, saved"), "{said}");
    assert!(d.wait_exit(STOP_DEADLINE).success(), "{}", d.stderr());
    assert!(!sock.exists());
    let info = ramd_cmd(rd.path(), &["image", "info", img.to_str().unwrap()]).ok();
    assert!(info.contains("full"), "{info}");
}

#[test]
fn bad_configs_are_refused_before_anything_starts() {
    let tmp = scratch();
    let rd = run_dir();
    let mnt = tmp.path().join("m");
    fs::create_dir(&mnt).unwrap();
    let refused = |text: &str| -> String {
        let config = write_config(tmp.path(), text);
        let err = ramd_fails(rd.path(), &["up", "-c", config.to_str().unwrap()]);
        assert!(
            control_sockets(rd.path()).is_empty(),
            "something started: {err}"
        );
        err
    };
    let err = refused("[disk.a]\nsize = \"1G\"\n\n[disk.a]\nsize = \"2G\"\n");
    assert!(
        err.contains("ramd.toml:4") && err.contains("duplicate"),
        "{err}"
    );
    let m = mnt.display();
    let err = refused(&format!(
        "[disk.a]\nkind = \"fs\"\nsize = \"8M\"\nmount = \"{m}\"\n\n\
         [disk.b]\nkind = \"fs\"\nsize = \"8M\"\nmount = \"{m}/\"\n"
    ));
    assert!(
        err.contains("\"a\" and \"b\" both want mount point"),
        "{err}"
    );
    assert!(!ramd_fs_mounted(&mnt));
    let err = refused(
        "[disk.a]\nsize = \"8M\"\nlisten = \"unix:/tmp/ramd-same.sock\"\n\n\
         [disk.b]\nsize = \"8M\"\nlisten = [\"tcp:0\", \"unix:/tmp/ramd-same.sock\"]\n",
    );
    assert!(
        err.contains("both want socket /tmp/ramd-same.sock"),
        "{err}"
    );
    let err = refused(
        "[daemon]\nmax_memory = \"64M\"\n\n[disk.a]\nsize = \"1G\"\nmax_memory = \"40M\"\n\n\
         [disk.b]\nsize = \"1G\"\nmax_memory = \"40M\"\n",
    );
    assert!(
        err.contains("ramd.toml:2: daemon.max_memory") && err.contains("a 40M + b 40M"),
        "{err}"
    );
    let err = refused("[daemon]\nmemory = \"1G\"\n\n[disk.a]\nsize = \"8M\"\n");
    assert!(
        err.contains("ramd.toml:2: daemon.memory: unknown key"),
        "{err}"
    );
    let err = refused("[disk.a]\nsize = \"8M\"\nautosave = \"5m\"\n");
    assert!(err.contains("ramd.toml:1: [disk.a]"), "{err}");
    assert!(err.contains("image"), "{err}");

    // With --all-or-nothing, a disk that fails while starting stops the
    // ones started before it (without it, they serve: tests/trust.rs).
    let not_a_dir = tmp.path().join("file");
    fs::write(&not_a_dir, "x").unwrap();
    let config = write_config(
        tmp.path(),
        &format!(
            "[disk.a]\nsize = \"8M\"\n\n[disk.b]\nsize = \"8M\"\nimage = \"{}\"\n",
            not_a_dir.display()
        ),
    );
    let err = ramd_fails(
        rd.path(),
        &["up", "-c", config.to_str().unwrap(), "--all-or-nothing"],
    );
    assert!(control_sockets(rd.path()).is_empty(), "{err}");
    assert!(err.contains("disk \"b\""), "{err}");
    assert!(!rd.path().join("a.sock").exists(), "{err}");
}

/// A file with several mistakes: one run of `ramd up` (and of `ramd serve
/// --config`) names every unknown key, in the order of the file, each with
/// its file and line, then the valid keys once.
#[test]
fn every_unknown_key_of_a_file_is_reported_at_once_in_file_order() {
    let tmp = scratch();
    let rd = run_dir();
    let config = write_config(
        tmp.path(),
        "colour = \"red\"\n\n\
         [disk.zeta]\nsize = \"8M\"\nsise = \"16M\"\n\n\
         [daemon]\nmemory = \"1G\"\n\n\
         [disk.alpha]\nsize = \"8M\"\nwarm = \"1M\"\ncompress = \"lzo\"\nbogus = true\n",
    );
    let c = config.to_str().unwrap();
    let err = ramd_fails(rd.path(), &["up", "-c", c]);
    assert!(
        control_sockets(rd.path()).is_empty(),
        "something started: {err}"
    );
    let at = |line: &str| {
        err.find(&format!("{c}:{line}"))
            .unwrap_or_else(|| panic!("nothing about {c}:{line} in:\n{err}"))
    };
    let order = [
        at("1: colour: unknown key"),
        at("5: disk.zeta.sise: unknown key (did you mean size?)"),
        at("8: daemon.memory: unknown key"),
        at("12: disk.alpha.warm: unknown key"),
        at("13: disk.alpha.compress: unknown codec"),
        at("14: disk.alpha.bogus: unknown key"),
    ];
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "not in file order:\n{err}"
    );
    assert!(err.contains("valid keys of [disk.NAME]: "), "{err}");
    assert!(err.contains("max_memory, metrics, run_dir"), "{err}");
    // Each list of valid keys once, not once per mistake.
    assert_eq!(err.matches("warm_pool").count(), 1, "{err}");

    // `serve --config` checks the one table it reads, and the top level.
    let err = ramd_fails(rd.path(), &["serve", "--config", c, "--disk", "alpha"]);
    let order = [
        at_in(&err, &format!("{c}:1: colour: unknown key")),
        at_in(&err, &format!("{c}:12: disk.alpha.warm: unknown key")),
        at_in(&err, &format!("{c}:14: disk.alpha.bogus: unknown key")),
    ];
    assert!(
        order.windows(2).all(|w| w[0] < w[1]),
        "not in file order:\n{err}"
    );
    assert!(!err.contains("sise"), "serve read another table:\n{err}");
    assert!(control_sockets(rd.path()).is_empty(), "{err}");
}

fn at_in(text: &str, what: &str) -> usize {
    text.find(what)
        .unwrap_or_else(|| panic!("no {what:?} in:\n{text}"))
}

/// A `ramd up` (disks a and c, one a filesystem) and a `ramd serve` (b)
/// in one run directory: `ramd status` has one process line for each
/// process, and each process's memory is split into parts that add up to
/// its VmRSS, none negative.
#[test]
fn status_shows_each_process_once_and_its_memory_adds_up() {
    let tmp = scratch();
    let rd = run_dir();
    let mnt = tmp.path().join("c");
    fs::create_dir(&mnt).unwrap();
    let config = write_config(
        tmp.path(),
        &format!(
            "[disk.a]\nsize = \"16M\"\n\n[disk.c]\nkind = \"fs\"\nsize = \"64M\"\nmount = \"{}\"\n",
            mnt.display()
        ),
    );
    let up = Up::start(rd.path(), &config);
    let serve = Ramd::start_in(rd.path(), &["--size", "16M", "--name", "b"]);
    random_file(&mnt.join("f"), 8 * MIB);
    let table = ramd_cmd(rd.path(), &["status"]).ok();
    let procs: Vec<&str> = table
        .lines()
        .filter(|l| l.starts_with("process "))
        .collect();
    assert_eq!(procs.len(), 2, "one line per process:\n{table}");
    for pid in [up.pid(), serve.pid()] {
        let n = procs
            .iter()
            .filter(|l| l.starts_with(&format!("process {pid}:")))
            .count();
        assert_eq!(n, 1, "process {pid}:\n{table}");
    }
    for l in &procs {
        assert!(!l.contains(" -"), "a negative part: {l}");
    }
    let status = status_json(rd.path());
    for d in status["disks"].as_array().unwrap() {
        let p = &d["process"];
        let parts: i64 = [
            "pages_bytes",
            "warm_bytes",
            "heap_bytes",
            "heap_free_bytes",
            "program_bytes",
            "other_bytes",
        ]
        .iter()
        .map(|k| {
            let v = p[k].as_i64().unwrap_or_else(|| panic!("no {k}: {p}"));
            assert!(v >= 0, "{k} is negative: {p}");
            v
        })
        .sum();
        assert_eq!(parts, p["resident_bytes"].as_i64().unwrap(), "{d}");
        // The figure the host has, read a moment apart.
        let host = vm_rss(field(d, "pid") as u32);
        assert!(
            field(p, "resident_bytes").abs_diff(host) <= 4 * MIB,
            "status says {p}, /proc says {host}"
        );
        assert!(field(p, "heap_bytes") < field(p, "resident_bytes"), "{p}");
    }
}

#[test]
fn a_second_daemon_in_one_run_dir_is_refused() {
    let tmp = scratch();
    let rd = run_dir();
    let config = write_config(tmp.path(), "[disk.one]\nsize = \"8M\"\n");
    let _up = Up::start(rd.path(), &config);
    let other = tmp.path().join("other.toml");
    fs::write(&other, "[disk.two]\nsize = \"8M\"\n").unwrap();
    let err = ramd_fails(rd.path(), &["up", "-c", other.to_str().unwrap()]);
    assert!(err.contains("another `ramd up`"), "{err}");
    assert_eq!(names(&status_json(rd.path())), ["one"]);
    // A reload of a file naming a socket another disk has is refused whole.
    fs::write(
        &config,
        format!(
            "[disk.one]\nsize = \"8M\"\n\n[disk.three]\nsize = \"8M\"\nlisten = \"unix:{}\"\n",
            rd.path().join("one.sock").display()
        ),
    )
    .unwrap();
    let err = ramd_fails(rd.path(), &["reload"]);
    assert!(err.contains("both want socket"), "{err}");
    assert_eq!(names(&status_json(rd.path())), ["one"]);
}

/// MemAvailable of the host, in bytes.
fn mem_available() -> u64 {
    let text = fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemAvailable in /proc/meminfo");
    kib * 1024
}

#[test]
fn near_the_host_reserve_new_pages_get_enospc_and_data_stays() {
    let tmp = scratch();
    let rd = run_dir();
    // A disk twice the host's RAM starts (thin, as tmpfs's size= may be),
    // with a reserve that leaves the daemon about 256 MiB of the host.
    let total = fs::read_to_string("/proc/meminfo").unwrap();
    let ram_kib: u64 = total
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    let size = (ram_kib * 1024 * 2).next_multiple_of(MIB);
    let reserve = mem_available() - 256 * MIB;
    let config = write_config(
        tmp.path(),
        &format!("[daemon]\nhost_reserve = \"{reserve}\"\n\n[disk.big]\nsize = \"{size}\"\n"),
    );
    let up = Up::start(rd.path(), &config);
    assert!(
        up.stderr().contains("is thin") && up.stderr().contains("RAM"),
        "no warning with the figures:\n{}",
        up.stderr()
    );
    let uri = up.uri("big");
    nbd_script("io.py", &[&uri, "write-random", "0", "16M", "kept"]);
    let out = nbd_script("io.py", &[&uri, "fill-until-enospc", "16M", "1G", "more"]);
    let written = written(&out);
    assert!(
        written < 1024 * MIB - 16 * MIB,
        "{written} bytes of 1 GiB went in with the host 256 MiB above its reserve"
    );
    // What was written stays readable; the daemon is alive and serving.
    nbd_script("io.py", &[&uri, "verify-random", "0", "16M", "kept"]);
    let w = written.to_string();
    nbd_script("io.py", &[&uri, "verify-random", "16M", &w, "more"]);
    let s = status_json(rd.path());
    let disk = disk_entry(&s, "big").unwrap();
    assert_eq!(disk["memory_limit_by"], "host", "{disk}");
    assert!(
        field(disk, "memory_limit") < field(disk, "max_memory"),
        "{disk}"
    );
    let table = ramd_cmd(rd.path(), &["status"]).ok();
    assert!(table.contains("(host)"), "no host-bound limit in:\n{table}");
    // Room made on the disk is room again.
    nbd_script(
        "io.py",
        &[
            &uri,
            "trim",
            "16M",
            &w,
            ",",
            "write-random",
            "16M",
            "8M",
            "again",
            ",",
            "verify-random",
            "16M",
            "8M",
            "again",
        ],
    );
}
