//! Config files' tests: keys, values, every mistake of a file at once.

use super::*;

fn flags_of(text: &str, disk: Option<&str>) -> Result<Vec<String>> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ramd.toml");
    std::fs::write(&path, text).unwrap();
    disk_flags(&path, disk)
        .map(|v| v.into_iter().map(|s| s.into_string().unwrap()).collect())
        .map_err(|e| anyhow::anyhow!(e.to_string().replace(&*path.to_string_lossy(), "F")))
}

#[test]
fn a_disk_table_becomes_flags() {
    let f = flags_of(
        "[disk.scratch]\nkind = \"fs\"\nsize = \"2G\"\nmount = \"/mnt/s\"\n\
         compress = \"zstd\"\nnoatime = true\nthreads = 4\n",
        None,
    )
    .unwrap();
    assert_eq!(
        f,
        [
            "--name",
            "scratch",
            "--size",
            "2G",
            "--mount",
            "/mnt/s",
            "--compress",
            "zstd",
            "--noatime",
            "--threads",
            "4"
        ]
    );
}

#[test]
fn insecure_is_a_key() {
    let f = flags_of(
        "[disk.a]\nsize = \"1G\"\nlisten = \"tcp:0.0.0.0:10809\"\ninsecure = true\n",
        None,
    )
    .unwrap();
    assert_eq!(
        f,
        // In file order.
        [
            "--name",
            "a",
            "--size",
            "1G",
            "--listen",
            "tcp:0.0.0.0:10809",
            "--insecure"
        ]
    );
}

#[test]
fn tls_keys() {
    let f = flags_of(
        "[disk.a]\nsize = \"1G\"\ntls = \"require\"\ntls_certificates = \"/etc/ramd/tls\"\n\
         tls_verify_peer = true\n",
        None,
    )
    .unwrap();
    assert_eq!(
        f,
        [
            "--name",
            "a",
            "--size",
            "1G",
            "--tls",
            "require",
            "--tls-certificates",
            "/etc/ramd/tls",
            "--tls-verify-peer"
        ]
    );
    let e = flags_of("[disk.a]\ntls = \"yes\"\n", None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("F:2: disk.a.tls: invalid TLS mode"), "{e}");
}

#[test]
fn false_turns_off_what_is_on_by_default() {
    let f = |v: &str| {
        flags_of(
            &format!("[disk.a]\nmount = \"/mnt/a\"\nwriteback_cache = {v}\nnoatime = {v}\n"),
            None,
        )
        .unwrap()
    };
    assert_eq!(
        f("false"),
        ["--name", "a", "--mount", "/mnt/a", "--no-writeback-cache"]
    );
    assert_eq!(
        f("true"),
        [
            "--name",
            "a",
            "--mount",
            "/mnt/a",
            "--writeback-cache",
            "--noatime"
        ]
    );
}

#[test]
fn mistakes_name_file_line_and_key() {
    let e = flags_of("[disk.a]\nsize = \"1G\"\ncompress = \"lzo\"\n", None)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("F:3: disk.a.compress: "), "{e}");
    assert!(e.contains("valid codecs"), "{e}");
    let e = flags_of("[disk.a]\nsize = \"1G\"\n\ncolour = \"red\"\n", None)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("F:4: disk.a.colour: unknown key"), "{e}");
    assert!(e.contains("max_memory"), "{e}");
    let e = flags_of("[disk.a]\nsize = 1G\n", None)
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("F:2:"), "{e}");
    let e = flags_of("[disk.a]\nnoatime = \"yes\"\n", None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("disk.a.noatime: expected true or false"), "{e}");
    let e = flags_of("[disk.a]\n[disk.b]\n", None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--disk"), "{e}");
    let e = flags_of("[disk.a]\n", Some("c")).unwrap_err().to_string();
    assert!(e.contains("no [disk.c] table (disks: a)"), "{e}");
    let e = flags_of("[disk.a]\nkind = \"fs\"\nsize = \"1G\"\n", None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("F:2: disk.a.kind: a filesystem disk needs"),
        "{e}"
    );
    let e = flags_of("[disks.a]\n", None).unwrap_err().to_string();
    assert!(e.starts_with("F:1:"), "{e}");
}

#[test]
fn every_mistake_is_reported_in_file_order() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ramd.toml");
    std::fs::write(
        &path,
        "[disk.b]\nsise = \"1G\"\n[daemon]\nmemory = 1\nmax_memory = \"x\"\n\
         [disk.a]\nzz = 1\nsize = \"1G\"\n[extra]\n",
    )
    .unwrap();
    let e = load(&path).unwrap_err().to_string();
    let e = e.replace(&*path.to_string_lossy(), "F");
    let lines: Vec<&str> = e.lines().collect();
    assert_eq!(
        lines[..5],
        [
            "F:2: disk.b.sise: unknown key (did you mean size?)",
            "F:4: daemon.memory: unknown key",
            "F:5: daemon.max_memory: invalid size \"x\": expected a number with an optional \
             K, M, G, T, P suffix (powers of 1024), like 512M or 1G",
            "F:7: disk.a.zz: unknown key",
            "F:9: extra: unknown key",
        ],
        "{e}"
    );
    assert!(lines[5..].iter().all(|l| l.starts_with("valid ")), "{e}");
}

#[test]
fn flags_go_after_serve_so_the_command_line_wins() {
    let argv = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
    let out = splice(
        argv(&["ramd", "--run-dir", "serve", "serve", "--size", "1G"]),
        argv(&["--size", "2G"]),
    );
    assert_eq!(
        out,
        argv(&[
            "ramd",
            "--run-dir",
            "serve",
            "serve",
            "--size",
            "2G",
            "--size",
            "1G"
        ])
    );
}

#[test]
fn daemon_iscsi_target_names_the_disks_target() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ramd.toml");
    std::fs::write(
        &path,
        "[daemon]\niscsi_target = \"iqn.2026-11.org.example:lab\"\n\
         [disk.a]\nsize = \"1M\"\niscsi = \"3260\"\niscsi_lun = 3\n\
         [disk.b]\nsize = \"1M\"\n",
    )
    .unwrap();
    let plan = load(&path).unwrap();
    let a = &plan.disks.iter().find(|(d, _)| d.name == "a").unwrap().0;
    let b = &plan.disks.iter().find(|(d, _)| d.name == "b").unwrap().0;
    assert_eq!(
        a.iscsi.iscsi_target.as_deref(),
        Some("iqn.2026-11.org.example:lab")
    );
    assert_eq!(a.iscsi.iscsi_lun, Some(3));
    assert_eq!(a.iscsi.portal, Some("127.0.0.1:3260".parse().unwrap()));
    assert_eq!(b.iscsi.iscsi_target, None, "no iscsi, no target name");
    std::fs::write(
        &path,
        "[daemon]\niscsi_target = \"Bad Name\"\n[disk.a]\nsize = \"1M\"\n",
    )
    .unwrap();
    let e = load(&path).unwrap_err().to_string();
    assert!(e.contains("daemon.iscsi_target"), "{e}");
}

#[test]
fn standby_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ramd.toml");
    std::fs::write(
        &path,
        "[disk.a]\nimage = \"s3://b/p\"\nstandby = true\nstandby_poll = \"5s\"\n\
         [disk.b]\nimage = \"s3://b/q\"\nstandby = true\n",
    )
    .unwrap();
    let plan = load(&path).unwrap();
    let disk = |n: &str| &plan.disks.iter().find(|(d, _)| d.name == n).unwrap().0;
    assert!(disk("a").standby);
    assert_eq!(disk("a").standby_poll, std::time::Duration::from_secs(5));
    assert_eq!(
        disk("b").standby_poll,
        std::time::Duration::from_millis(500)
    );
    std::fs::write(&path, "[disk.a]\nsize = \"1M\"\nstandby = true\n").unwrap();
    let e = load(&path).unwrap_err().to_string();
    assert!(e.contains("--image"), "{e}");
}
