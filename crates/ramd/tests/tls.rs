//! NBD beyond loopback: refused unless the user says `--insecure`, and
//! then served on every address with a URI a remote client can use.
//! Driven with libnbd's nbdinfo.

mod common;

use common::*;

/// This host's name, as the daemon puts it in a wildcard bind's URI.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .expect("read /proc/sys/kernel/hostname")
        .trim()
        .to_string()
}

/// The port of `nbd://HOST:PORT/EXPORT` (or `nbds://`).
fn port_of(uri: &str) -> u16 {
    let rest = uri.split_once("://").expect("a URI").1;
    let hostport = rest.split('/').next().unwrap();
    hostport
        .rsplit_once(':')
        .and_then(|(_, p)| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {uri}"))
}

#[test]
fn listen_beyond_loopback_without_insecure_is_refused() {
    let run_dir = scratch();
    let out = ramd_cmd(
        run_dir.path(),
        &["serve", "--size", "16M", "--listen", "tcp:0.0.0.0:0"],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stdout.is_empty(), "printed a URI: {out:?}");
    assert!(out.stderr.contains("--listen tcp:0.0.0.0:0"), "{out:?}");
    assert!(out.stderr.contains("--insecure"), "{out:?}");
    // The same from a config file: `insecure` is its key.
    let dir = scratch();
    let config = dir.path().join("ramd.toml");
    let table = "[disk.net]\nsize = \"16M\"\nlisten = \"tcp:0.0.0.0:0\"\n";
    write_file(&config, table.as_bytes());
    let cfg = config.to_str().unwrap();
    let out = ramd_cmd(run_dir.path(), &["serve", "--config", cfg]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("tcp:0.0.0.0:0"), "{out:?}");
    write_file(&config, format!("{table}insecure = true\n").as_bytes());
    let d = Ramd::start(&["--config", cfg]);
    let port = port_of(d.uri());
    let out = run_ok(&mut cmd(
        "nbdinfo",
        ["--size".into(), format!("nbd://127.0.0.1:{port}/net")],
    ));
    assert_eq!(out.trim(), (16 * MIB).to_string());
}

#[test]
fn insecure_serves_every_address_under_the_hosts_name() {
    require_tool("nbdinfo");
    let d = Ramd::start(&["--size", "16M", "--listen", "tcp:0.0.0.0:0", "--insecure"]);
    let port = port_of(d.uri());
    assert_eq!(d.uri(), format!("nbd://{}:{port}/ram0", host_name()));
    let log = d.stderr();
    let warnings: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("--insecure"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning expected:\n{log}");
    assert!(
        warnings[0].contains(&format!("tcp:0.0.0.0:{port}")),
        "{log}"
    );
    assert!(
        log.contains(&format!("tcp:0.0.0.0:{port} (every address")),
        "the bound address is not logged:\n{log}"
    );
    let out = run_ok(&mut cmd(
        "nbdinfo",
        ["--size".into(), format!("nbd://127.0.0.1:{port}/ram0")],
    ));
    assert_eq!(out.trim(), (16 * MIB).to_string());
}
