//! NBD beyond loopback: refused unless the user says `--insecure` or
//! requires TLS, and then served on every address with a URI a remote
//! client can use. NBD over TLS (STARTTLS): X.509 certificates made here
//! with openssl, clients libnbd's nbdinfo and nbdcopy (`nbds://`,
//! `nbds+unix://` with `tls-certificates=DIR`) and qemu-img/qemu-io
//! (`tls-creds-x509`).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use tempfile::TempDir;

/// A test CA and the credential directories made from it, as nbdkit's,
/// qemu's and libnbd's `tls-certificates` directories are laid out.
struct Pki {
    dir: TempDir,
}

impl Pki {
    /// A CA of its own (EC P-256: quick to make).
    fn new() -> Pki {
        require_tool("openssl");
        let dir = scratch();
        let p = |f: &str| dir.path().join(f).to_str().unwrap().to_string();
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=ramd test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &p("ca-key.pem"),
            "-out",
            &p("ca-cert.pem"),
        ]);
        Pki { dir }
    }

    fn path(&self, f: &str) -> PathBuf {
        self.dir.path().join(f)
    }

    /// A key for `cn` and its certificate, signed by the CA, with the
    /// extensions `ext` (openssl's extfile syntax).
    fn issue(&self, cn: &str, ext: &str, key: &Path, cert: &Path) {
        let csr = self.path(&format!("{cn}.csr"));
        let extfile = self.path(&format!("{cn}.ext"));
        write_file(&extfile, ext.as_bytes());
        openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            key.to_str().unwrap(),
            "-out",
            csr.to_str().unwrap(),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-days",
            "2",
            "-CAcreateserial",
            "-CAserial",
            self.path("ca.srl").to_str().unwrap(),
            "-in",
            csr.to_str().unwrap(),
            "-CA",
            self.path("ca-cert.pem").to_str().unwrap(),
            "-CAkey",
            self.path("ca-key.pem").to_str().unwrap(),
            "-extfile",
            extfile.to_str().unwrap(),
            "-out",
            cert.to_str().unwrap(),
        ]);
    }

    /// `ca-cert.pem`, `server-cert.pem` (for localhost, this host's name,
    /// 127.0.0.1 and ::1), `server-key.pem`.
    fn server_dir(&self) -> PathBuf {
        let d = self.path("server");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(self.path("ca-cert.pem"), d.join("ca-cert.pem")).unwrap();
        let ext = format!(
            "subjectAltName=DNS:localhost,DNS:{},IP:127.0.0.1,IP:::1\n\
             extendedKeyUsage=serverAuth\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\n",
            host_name()
        );
        self.issue(
            "localhost",
            &ext,
            &d.join("server-key.pem"),
            &d.join("server-cert.pem"),
        );
        d
    }

    /// A client's directory: `ca-cert.pem`, and with `cert` a client
    /// certificate (`client-cert.pem`, `client-key.pem`).
    fn client_dir(&self, name: &str, cert: bool) -> PathBuf {
        let d = self.path(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::copy(self.path("ca-cert.pem"), d.join("ca-cert.pem")).unwrap();
        if cert {
            let ext = "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n\
                       keyUsage=digitalSignature\n";
            self.issue(
                name,
                ext,
                &d.join("client-key.pem"),
                &d.join("client-cert.pem"),
            );
        }
        d
    }
}

fn openssl(args: &[&str]) {
    run_ok(&mut cmd("openssl", args));
}

/// `URI` with `tls-certificates=DIR` added to its query.
fn with_certs(uri: &str, dir: &Path) -> String {
    let sep = if uri.contains('?') { '&' } else { '?' };
    format!("{uri}{sep}tls-certificates={}", dir.display())
}

/// Requests the disk's NBD connections were served, all kinds together.
fn nbd_requests(d: &Ramd) -> u64 {
    let st = status_json(d.run_dir());
    let disk = disk_entry(&st, d.name()).expect("disk in status");
    disk["io"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["frontend"] == "nbd")
        .flat_map(|f| f["ops"].as_array().unwrap().iter())
        .map(|o| o["count"].as_u64().unwrap())
        .sum()
}

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

#[test]
fn tls_require_serves_tls_clients_and_turns_plaintext_away() {
    for tool in ["nbdinfo", "nbdcopy", "qemu-img"] {
        require_tool(tool);
    }
    let pki = Pki::new();
    let server = pki.server_dir();
    let client = pki.client_dir("client", false);
    let d = Ramd::start(&[
        "--size",
        "40M",
        "--listen",
        "tcp:127.0.0.1:0",
        "--tls",
        "require",
        "--tls-certificates",
        server.to_str().unwrap(),
    ]);
    let port = port_of(d.uri());
    assert_eq!(d.uri(), format!("nbds://127.0.0.1:{port}/ram0"));
    let tls_uri = with_certs(d.uri(), &client);

    // Writes of every size through TLS: 256 KiB requests go to the
    // workers, which share the session with the reader.
    let data = scratch();
    let src = data.path().join("src");
    let back = data.path().join("back");
    random_file(&src, 40 * MIB);
    run_ok(&mut cmd(
        "nbdcopy",
        ["--connections=2", src.to_str().unwrap(), &tls_uri],
    ));
    run_ok(&mut cmd("nbdcopy", [&tls_uri, back.to_str().unwrap()]));
    assert_same_file(&src, &back);

    // qemu over TLS reads the same bytes.
    let creds = format!(
        "tls-creds-x509,id=tls0,dir={},endpoint=client",
        client.display()
    );
    let opts = format!("driver=nbd,host=127.0.0.1,port={port},export=ram0,tls-creds=tls0");
    let qemu_back = data.path().join("qemu");
    run_ok(Command::new("qemu-img").args([
        "convert",
        "--object",
        &creds,
        "--image-opts",
        &opts,
        "-O",
        "raw",
        qemu_back.to_str().unwrap(),
    ]));
    assert_same_file(&src, &qemu_back);

    // Plaintext: refused at the first option, and no request is served.
    let served = nbd_requests(&d);
    let plain = format!("nbd://127.0.0.1:{port}/ram0");
    let out = run(&mut cmd("nbdinfo", [&plain]), CMD_TIMEOUT).failed();
    assert!(!out.stdout.contains("export-size"), "{out:?}");
    let out = run(&mut cmd("nbdinfo", ["--list", &plain]), CMD_TIMEOUT).failed();
    assert!(!out.stdout.contains("ram0"), "{out:?}");
    let stolen = data.path().join("stolen");
    let out = run(
        &mut cmd("nbdcopy", [&plain, stolen.to_str().unwrap()]),
        CMD_TIMEOUT,
    )
    .failed();
    let got = std::fs::metadata(&stolen).map(|m| m.len()).unwrap_or(0);
    assert_eq!(got, 0, "a plaintext client read {got} bytes: {out:?}");
    assert_eq!(nbd_requests(&d), served, "plaintext requests were served");
    assert!(d.stderr().contains("TLS is required"), "{}", d.stderr());
}

#[test]
fn tls_on_a_unix_socket_lets_the_client_choose() {
    require_tool("nbdinfo");
    let pki = Pki::new();
    let server = pki.server_dir();
    let client = pki.client_dir("client", false);
    // --tls-certificates alone means --tls on.
    let d = Ramd::start(&[
        "--size",
        "16M",
        "--tls-certificates",
        server.to_str().unwrap(),
    ]);
    assert!(
        d.uri().starts_with("nbds+unix:///ram0?socket="),
        "{}",
        d.uri()
    );
    let out = run_ok(&mut cmd("nbdinfo", [with_certs(d.uri(), &client)]));
    assert!(out.contains("with TLS"), "{out}");
    assert!(out.contains("export-size: 16777216"), "{out}");
    let plain = d.uri().replacen("nbds+unix", "nbd+unix", 1);
    let out = run_ok(&mut cmd("nbdinfo", [&plain]));
    assert!(out.contains("without TLS"), "{out}");
    // Writes through TLS, read back in plaintext: one disk.
    let data = scratch();
    let src = data.path().join("src");
    let back = data.path().join("back");
    random_file(&src, 16 * MIB);
    run_ok(&mut cmd(
        "nbdcopy",
        [src.to_str().unwrap(), &with_certs(d.uri(), &client)],
    ));
    run_ok(&mut cmd("nbdcopy", [&plain, back.to_str().unwrap()]));
    assert_same_file(&src, &back);
}

#[test]
fn tls_verify_peer_wants_a_client_certificate_from_the_ca() {
    require_tool("nbdinfo");
    let pki = Pki::new();
    let server = pki.server_dir();
    let with_cert = pki.client_dir("alice", true);
    let without_cert = pki.client_dir("bob", false);
    let other_ca = Pki::new();
    let stranger = other_ca.client_dir("mallory", true);
    let d = Ramd::start(&[
        "--size",
        "16M",
        "--tls",
        "require",
        "--tls-certificates",
        server.to_str().unwrap(),
        "--tls-verify-peer",
    ]);
    let size = |dir: &Path| {
        run(
            &mut cmd("nbdinfo", ["--size".into(), with_certs(d.uri(), dir)]),
            CMD_TIMEOUT,
        )
    };
    assert_eq!(size(&with_cert).ok().trim(), (16 * MIB).to_string());
    let out = size(&without_cert).failed();
    assert!(!out.stdout.contains("16777216"), "{out:?}");
    // A certificate from a CA of its own is refused.
    let out = size(&stranger).failed();
    assert!(!out.stdout.contains("16777216"), "{out:?}");
    let log = d.stderr();
    assert!(
        log.contains("TLS handshake: invalid peer certificate"),
        "{log}"
    );
    assert!(log.contains("client certificate verified"), "{log}");
    assert!(
        log.contains("TLS handshake: peer sent no certificates"),
        "{log}"
    );
}

#[test]
fn tls_from_a_wrong_ca_fails() {
    require_tool("nbdinfo");
    let pki = Pki::new();
    let server = pki.server_dir();
    let d = Ramd::start(&[
        "--size",
        "16M",
        "--listen",
        "tcp:127.0.0.1:0",
        "--tls",
        "require",
        "--tls-certificates",
        server.to_str().unwrap(),
    ]);
    let other_ca = Pki::new();
    let stranger = other_ca.client_dir("client", false);
    let out = run(
        &mut cmd("nbdinfo", [with_certs(d.uri(), &stranger)]),
        CMD_TIMEOUT,
    )
    .failed();
    assert!(out.stderr.contains("certificate"), "{out:?}");
    assert!(!out.stdout.contains("export-size"), "{out:?}");
    wait_until(CMD_TIMEOUT, "the failed handshake in the log", || {
        d.stderr().contains("TLS handshake")
    });
}

#[test]
fn tls_require_serves_beyond_loopback_without_insecure() {
    require_tool("nbdinfo");
    let pki = Pki::new();
    let server = pki.server_dir();
    let client = pki.client_dir("client", false);
    let d = Ramd::start(&[
        "--size",
        "16M",
        "--listen",
        "tcp:0.0.0.0:0",
        "--tls",
        "require",
        "--tls-certificates",
        server.to_str().unwrap(),
    ]);
    let port = port_of(d.uri());
    assert_eq!(d.uri(), format!("nbds://{}:{port}/ram0", host_name()));
    assert!(!d.stderr().contains("WARN"), "{}", d.stderr());
    let uri = with_certs(&format!("nbds://127.0.0.1:{port}/ram0"), &client);
    let out = run_ok(&mut cmd("nbdinfo", ["--size", &uri]));
    assert_eq!(out.trim(), (16 * MIB).to_string());
    // --tls on still lets plaintext through: beyond loopback it is refused.
    let run_dir = scratch();
    let out = ramd_cmd(
        run_dir.path(),
        &[
            "serve",
            "--size",
            "16M",
            "--listen",
            "tcp:0.0.0.0:0",
            "--tls",
            "on",
            "--tls-certificates",
            server.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(out.stderr.contains("--listen tcp:0.0.0.0:0"), "{out:?}");
    assert!(out.stderr.contains("--tls require"), "{out:?}");
    assert!(out.stderr.contains("--insecure"), "{out:?}");
}

#[test]
fn tls_settings_that_cannot_work_are_refused_naming_flag_and_file() {
    let pki = Pki::new();
    let server = pki.server_dir();
    let run_dir = scratch();
    let serve = |extra: &[&str]| {
        let mut args = vec!["serve", "--size", "16M"];
        args.extend_from_slice(extra);
        ramd_cmd(run_dir.path(), &args)
    };
    let out = serve(&["--tls", "require"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        out.stderr
            .contains("--tls require: needs --tls-certificates"),
        "{out:?}"
    );
    let out = serve(&["--tls", "sometimes"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stderr.contains("off, on or require"), "{out:?}");
    // A directory without the key, then without the CA that
    // --tls-verify-peer checks clients against.
    std::fs::remove_file(server.join("server-key.pem")).unwrap();
    let dir = server.to_str().unwrap();
    let out = serve(&["--tls-certificates", dir]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let key = server.join("server-key.pem");
    assert!(out.stderr.contains(&key.display().to_string()), "{out:?}");
    let server = pki.server_dir();
    std::fs::remove_file(server.join("ca-cert.pem")).unwrap();
    let out = serve(&["--tls-certificates", dir, "--tls-verify-peer"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let ca = server.join("ca-cert.pem");
    assert!(out.stderr.contains(&ca.display().to_string()), "{out:?}");
    let out = serve(&["--tls-verify-peer"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn a_psk_client_is_refused_and_others_go_on() {
    // rustls cannot serve TLS PSK (ARCHITECTURE.md, "NBD over TLS"): a
    // libnbd client with tls-psk-file must fail cleanly, not hang or
    // reach the disk, and certificate clients go on.
    require_tool("nbdinfo");
    let pki = Pki::new();
    let server = pki.server_dir();
    let client = pki.client_dir("client", false);
    let d = Ramd::start(&[
        "--size",
        "16M",
        "--tls",
        "require",
        "--tls-certificates",
        server.to_str().unwrap(),
    ]);
    let keys = pki.path("keys.psk");
    write_file(&keys, format!("alice:{}\n", "5a".repeat(32)).as_bytes());
    let psk_uri = d.uri().replacen("nbds+unix:///", "nbds+unix://alice@/", 1);
    let psk_uri = format!("{psk_uri}&tls-psk-file={}", keys.display());
    let out = run(&mut cmd("nbdinfo", [&psk_uri]), CMD_TIMEOUT).failed();
    assert!(!out.stdout.contains("export-size"), "{out:?}");
    let out = run_ok(&mut cmd(
        "nbdinfo",
        ["--size".into(), with_certs(d.uri(), &client)],
    ));
    assert_eq!(out.trim(), (16 * MIB).to_string());
    assert!(d.stderr().contains("TLS handshake"), "{}", d.stderr());
}
