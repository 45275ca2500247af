//! TLS for NBD's `NBD_OPT_STARTTLS`, through rustls: X.509 credentials
//! from a directory laid out as nbdkit's and qemu's (`ca-cert.pem`,
//! `server-cert.pem`, `server-key.pem`, optional `ca-crl.pem`), and the
//! connection's TLS session once the handshake is done.
//!
//! A plaintext connection's reader and workers each hold their own clone of
//! the socket. A TLS session is one state machine (sequence numbers, keys)
//! that cannot be cloned, so a connection shares one [`TlsSession`]: a
//! writer encrypts a whole reply and writes it to the socket under its
//! lock (replies stay whole and in record order); the reader waits for
//! ciphertext on its own clone of the socket *without* the lock, and takes
//! it only to decrypt. The plaintext path does not change.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConnection};

use crate::Stream;

/// A server's TLS: whether plaintext clients are turned away, and the
/// rustls configuration every connection's handshake uses.
#[derive(Debug)]
pub struct Tls {
    /// `--tls require`: every option but STARTTLS (and ABORT) before TLS
    /// gets `NBD_REP_ERR_TLS_REQD`; otherwise TLS is offered, not forced.
    pub require: bool,
    config: Arc<rustls::ServerConfig>,
}

/// The files of a certificates directory.
pub const CA_CERT: &str = "ca-cert.pem";
pub const CA_CRL: &str = "ca-crl.pem";
pub const SERVER_CERT: &str = "server-cert.pem";
pub const SERVER_KEY: &str = "server-key.pem";

impl Tls {
    /// Loads the credentials in `dir`; with `verify_peer`, clients must
    /// present a certificate that `ca-cert.pem` vouches for. Errors name
    /// the file at fault.
    pub fn load(dir: &Path, require: bool, verify_peer: bool) -> Result<Tls, String> {
        let file = |name: &str| -> PathBuf { dir.join(name) };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let certs = load_certs(&file(SERVER_CERT))?;
        let key_path = file(SERVER_KEY);
        let key = PrivateKeyDer::from_pem_file(&key_path)
            .map_err(|e| format!("{}: no private key: {e}", key_path.display()))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS protocol versions: {e}"))?;
        let builder = if verify_peer {
            let ca_path = file(CA_CERT);
            let mut roots = RootCertStore::empty();
            for c in load_certs(&ca_path)? {
                roots
                    .add(c)
                    .map_err(|e| format!("{}: {e}", ca_path.display()))?;
            }
            let crl_path = file(CA_CRL);
            let crls: Vec<CertificateRevocationListDer<'static>> = if crl_path.exists() {
                CertificateRevocationListDer::pem_file_iter(&crl_path)
                    .and_then(|it| it.collect::<Result<_, _>>())
                    .map_err(|e| format!("{}: {e}", crl_path.display()))?
            } else {
                Vec::new()
            };
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .with_crls(crls)
                .build()
                .map_err(|e| format!("{}: {e}", ca_path.display()))?;
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder.with_single_cert(certs, key).map_err(|e| {
            format!(
                "{} and {}: {e}",
                file(SERVER_CERT).display(),
                key_path.display()
            )
        })?;
        Ok(Tls {
            require,
            config: Arc::new(config),
        })
    }
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<_, _>>())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate in it", path.display()));
    }
    Ok(certs)
}

/// One connection's TLS session, shared by its reader and its writers.
pub(crate) struct TlsSession {
    conn: Mutex<ServerConnection>,
    /// The socket, for writes (a clone of the reader's).
    sock: Stream,
}

impl TlsSession {
    /// Encrypts `bytes` and writes them out before returning: one reply
    /// (or option reply) whole, no other writer in between.
    pub(crate) fn send(&self, bytes: &[u8]) -> io::Result<()> {
        let mut c = self.conn.lock();
        let mut rest = bytes;
        while !rest.is_empty() {
            // rustls takes up to its buffer limit at a time.
            let n = c.writer().write(rest)?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            rest = &rest[n..];
            Self::flush(&mut c, &self.sock)?;
        }
        Ok(())
    }

    /// Writes out whatever rustls has ready (records, alerts).
    fn flush(c: &mut ServerConnection, mut sock: &Stream) -> io::Result<()> {
        while c.wants_write() {
            c.write_tls(&mut sock)?;
        }
        Ok(())
    }

    /// Sends close_notify: the client sees a clean end, not a truncation.
    pub(crate) fn close(&self) {
        let mut c = self.conn.lock();
        c.send_close_notify();
        let _ = Self::flush(&mut c, &self.sock);
    }
}

/// A connection after a successful TLS handshake: `Read` gives the
/// client's plaintext, `Write` sends through the shared session.
pub(crate) struct TlsChannel {
    pub(crate) session: Arc<TlsSession>,
    pub(crate) reader: TlsReader,
}

impl TlsChannel {
    /// Runs the TLS handshake on `stream` (the STARTTLS ACK is sent).
    /// The stream's read timeout bounds it.
    pub(crate) fn accept(tls: &Tls, stream: &Stream) -> io::Result<TlsChannel> {
        let mut conn = ServerConnection::new(tls.config.clone()).map_err(io::Error::other)?;
        let mut sock = stream.try_clone()?;
        while conn.is_handshaking() {
            conn.complete_io(&mut sock)?;
        }
        let session = Arc::new(TlsSession {
            conn: Mutex::new(conn),
            sock: stream.try_clone()?,
        });
        Ok(TlsChannel {
            reader: TlsReader {
                session: session.clone(),
                sock,
                buf: vec![0; READ_BUF].into_boxed_slice(),
                start: 0,
                end: 0,
            },
            session,
        })
    }

    /// What was agreed: protocol version and cipher suite, for the log.
    pub(crate) fn describe(&self) -> String {
        let c = self.session.conn.lock();
        let version = c
            .protocol_version()
            .map_or("?".into(), |v| format!("{v:?}"));
        let suite = c
            .negotiated_cipher_suite()
            .map_or("?".into(), |s| format!("{:?}", s.suite()));
        let peer = if c.peer_certificates().is_some_and(|p| !p.is_empty()) {
            ", client certificate verified"
        } else {
            ""
        };
        format!("{version} {suite}{peer}")
    }
}

impl Read for TlsChannel {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.reader.read(buf)
    }
}

impl Write for TlsChannel {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.session.send(buf)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Ciphertext read at once: a few full TLS records.
const READ_BUF: usize = 64 << 10;

/// The reading half: the client's plaintext, decrypted under the session's
/// lock from ciphertext read without it.
pub(crate) struct TlsReader {
    session: Arc<TlsSession>,
    sock: Stream,
    buf: Box<[u8]>,
    /// `buf[start..end]` is ciphertext rustls has not taken yet.
    start: usize,
    end: usize,
}

impl Read for TlsReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            {
                let mut c = self.session.conn.lock();
                match c.reader().read(out) {
                    // Ok(0): the client's close_notify.
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if self.start < self.end {
                    // Plaintext was drained above, so rustls has room.
                    let n = c.read_tls(&mut &self.buf[self.start..self.end])?;
                    self.start += n;
                    let processed = c.process_new_packets();
                    // Alerts, key updates: what rustls answers goes out now.
                    let flushed = TlsSession::flush(&mut c, &self.session.sock);
                    processed.map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    flushed?;
                    continue;
                }
            }
            // Wait for the client with the lock free: writers go on.
            let n = self.sock.read(&mut self.buf)?;
            if n == 0 {
                // The plaintext is drained and every byte was fed: between
                // messages this is a hang-up (close_notify or not); inside
                // one, the caller's read_exact reports the truncation.
                return Ok(0);
            }
            (self.start, self.end) = (0, n);
        }
    }
}
