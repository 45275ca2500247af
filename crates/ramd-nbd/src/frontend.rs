//! The NBD frontend: one [`crate::Server`] per listening socket of a block disk
//! (`--listen` may be given several times: a unix socket and TCP at once).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use ramd_frontend::{Claim, DiskContext, DiskSettings, Frontend, FrontendFactory, FrontendStatus};
use ramd_store::persist::DiskKind;

use crate::settings::{Listen, NbdArgs, TlsMode};
use crate::{Export, Exports, Listener, Server, ServerConfig, Tls};

pub struct Nbd;

/// The disk's sockets: `--listen`, or `RUN_DIR/NAME.sock` by default.
fn listens(nbd: &NbdArgs, name: &str, run_dir: &Path) -> Vec<Listen> {
    if nbd.listen.is_empty() {
        vec![Listen::Unix(run_dir.join(format!("{name}.sock")))]
    } else {
        nbd.listen.clone()
    }
}

/// A unix socket path as a claim: the directory canonicalized (the socket
/// itself may not exist yet).
fn unix_claim(p: &Path) -> PathBuf {
    let dir = p.parent().filter(|d| !d.as_os_str().is_empty());
    match (dir.and_then(|d| d.canonicalize().ok()), p.file_name()) {
        (Some(d), Some(f)) => d.join(f),
        _ => p.to_path_buf(),
    }
}

impl FrontendFactory for Nbd {
    fn claims(&self, disk: &dyn DiskSettings, run_dir: &Path) -> anyhow::Result<Vec<Claim>> {
        let (DiskKind::Block, Some(args)) = (disk.kind(), disk.get::<NbdArgs>()) else {
            return Ok(Vec::new());
        };
        let tls = args.tls_mode();
        if tls != TlsMode::Off && args.tls_certificates.is_none() {
            bail!("--tls {tls}: needs --tls-certificates DIR (server-cert.pem, server-key.pem)");
        }
        let listens = listens(args, disk.name(), run_dir);
        if let Some(l) = listens.iter().find(|l| l.beyond_loopback()) {
            if tls != TlsMode::Require && !args.insecure {
                bail!(
                    "--listen {l}: would serve NBD beyond loopback to clients without TLS \
                     (--tls {tls}): give --tls require with --tls-certificates DIR, or \
                     --insecure to allow it"
                );
            }
        }
        // Port 0 asks the kernel for a free port: it never collides.
        Ok(listens
            .iter()
            .filter_map(|l| match l {
                Listen::Unix(p) => Some(Claim(format!("socket {}", unix_claim(p).display()))),
                Listen::Tcp(a) if a.port() == 0 => None,
                Listen::Tcp(a) => Some(Claim(format!("tcp port {}", a.port()))),
            })
            .collect())
    }

    fn build(&self, disk: &DiskContext) -> anyhow::Result<Vec<Arc<dyn Frontend>>> {
        let s = disk.settings;
        let (DiskKind::Block, Some(args)) = (disk.kind, s.get::<NbdArgs>()) else {
            return Ok(Vec::new());
        };
        let name = s.name();
        // One set of counters for all of the disk's NBD sockets.
        let metrics = disk.metrics.frontend("nbd");
        let mode = args.tls_mode();
        let tls = match (mode, &args.tls_certificates) {
            (TlsMode::Off, _) | (_, None) => None,
            (_, Some(dir)) => Some(Arc::new(
                Tls::load(dir, mode == TlsMode::Require, args.tls_verify_peer)
                    .map_err(|e| anyhow::anyhow!("--tls-certificates {}: {e}", dir.display()))?,
            )),
        };
        let mut out: Vec<Arc<dyn Frontend>> = Vec::new();
        for l in listens(args, name, disk.run_dir) {
            let listener = match &l {
                Listen::Unix(p) => Listener::bind_unix(p.clone()),
                Listen::Tcp(a) => Listener::bind_tcp(*a),
            }
            .context("NBD listen socket")?;
            let uri = listener.uri(name, tls.is_some());
            if let Some(bound) = listener.local_addr() {
                if bound.ip().is_unspecified() {
                    // The URI names the host; the log says what was bound.
                    log::info!(
                        "disk {}: NBD on tcp:{bound} (every address of this host): {uri}",
                        name
                    );
                }
                let plaintext = match mode {
                    TlsMode::Off => "without TLS",
                    TlsMode::On => "with TLS optional (--tls on)",
                    TlsMode::Require => "",
                };
                if l.beyond_loopback() && !plaintext.is_empty() {
                    log::warn!(
                        "disk {}: NBD on tcp:{bound} beyond loopback {plaintext} (--insecure): \
                         a client without TLS can read and write the disk",
                        name
                    );
                }
            }
            let server = Server::new(
                Exports::new(vec![Export {
                    name: name.to_string(),
                    description: format!("ramd block disk {name} id {}", disk.id),
                    store: disk.store.clone(),
                    read_only: s.read_only(),
                    metrics: Some(metrics.clone()),
                }]),
                ServerConfig {
                    threads: s.threads() as usize,
                    max_connections: s.max_connections() as usize,
                    tls: tls.clone(),
                    ..ServerConfig::default()
                },
            );
            out.push(Arc::new(NbdFrontend {
                uri,
                listener,
                server,
            }));
        }
        Ok(out)
    }
}

struct NbdFrontend {
    server: Arc<Server>,
    listener: Listener,
    uri: String,
}

impl Frontend for NbdFrontend {
    fn serve(&self) -> anyhow::Result<()> {
        self.server.run(&self.listener).context("serving NBD")
    }

    fn stop(&self, _force: bool) {
        self.server.stop();
    }

    fn status(&self) -> FrontendStatus {
        FrontendStatus {
            protocol: "nbd".into(),
            endpoint: self.uri.clone(),
            connections: Some(self.server.connections() as u64),
            transport: None,
        }
    }
}
