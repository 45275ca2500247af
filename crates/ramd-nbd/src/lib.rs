//! ramd's NBD server, written from the protocol document
//! (the NBD protocol specification): fixed newstyle negotiation,
//! STARTTLS (rustls), structured replies, `base:allocation` block status,
//! and many requests in flight per connection over Unix or TCP sockets.
//!
//! The server translates; the [`ramd_store::Store`] behind each [`Export`]
//! holds all storage logic.

pub mod client;
pub mod frontend;
#[cfg(any(test, feature = "fuzzing"))]
pub mod fuzz;
mod handshake;
pub mod proto;
pub mod settings;
mod tls;
mod transmission;

pub use tls::Tls;

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use ramd_store::Store;

/// One disk as clients see it.
pub struct Export {
    pub name: String,
    pub description: String,
    pub store: Arc<Store>,
    pub read_only: bool,
    /// Where each request's latency, size and outcome are counted.
    pub metrics: Option<Arc<ramd_store::metrics::IoMetrics>>,
}

/// The exports of one server. The empty name selects the first.
#[derive(Clone)]
pub struct Exports(Vec<Arc<Export>>);

impl Exports {
    pub fn new(exports: Vec<Export>) -> Exports {
        assert!(!exports.is_empty(), "a server needs at least one export");
        Exports(exports.into_iter().map(Arc::new).collect())
    }

    pub fn find(&self, name: &str) -> Option<Arc<Export>> {
        if name.is_empty() {
            return self.0.first().cloned();
        }
        self.0.iter().find(|e| e.name == name).cloned()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Export>> {
        self.0.iter()
    }
}

/// A connected client socket.
pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    pub fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    /// Ends the connection both ways; blocked readers and writers return.
    pub fn shutdown(&self) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.shutdown(Shutdown::Both),
            Stream::Tcp(s) => s.shutdown(Shutdown::Both),
        }
    }

    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Writes through a shared reference, as the std sockets allow (a TLS
/// session writes to the socket it holds under its own lock).
impl Write for &Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => (&*s).write(buf),
            Stream::Tcp(s) => (&*s).write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

use ramd_frontend::{bind_unix_socket, SocketFile};

/// Where the server listens.
pub enum Listener {
    Unix(UnixListener, SocketFile),
    Tcp(TcpListener),
}

impl Listener {
    /// Binds a Unix socket at `path`; see [`bind_unix_socket`].
    pub fn bind_unix(path: PathBuf) -> io::Result<Listener> {
        let (l, file) = bind_unix_socket(&path)?;
        Ok(Listener::Unix(l, file))
    }

    pub fn bind_tcp(addr: SocketAddr) -> io::Result<Listener> {
        let l = TcpListener::bind(addr)
            .map_err(|e| io::Error::new(e.kind(), format!("bind tcp:{addr}: {e}")))?;
        Ok(Listener::Tcp(l))
    }

    fn accept(&self) -> io::Result<(Stream, String)> {
        match self {
            Listener::Unix(l, file) => {
                let (s, _) = l.accept()?;
                Ok((Stream::Unix(s), format!("unix:{}", file.path().display())))
            }
            Listener::Tcp(l) => {
                let (s, addr) = l.accept()?;
                // Replies are whole messages written at once; don't delay them.
                s.set_nodelay(true)?;
                Ok((Stream::Tcp(s), format!("tcp:{addr}")))
            }
        }
    }

    fn raw_fd(&self) -> i32 {
        match self {
            Listener::Unix(l, _) => l.as_raw_fd(),
            Listener::Tcp(l) => l.as_raw_fd(),
        }
    }

    /// The address a TCP listener is bound to (with the port the kernel
    /// chose for port 0).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        match self {
            Listener::Unix(..) => None,
            Listener::Tcp(l) => l.local_addr().ok(),
        }
    }

    /// The NBD URI a client uses to reach `export` here: `nbds` when the
    /// server offers TLS. A wildcard bind (0.0.0.0, ::) is named by the
    /// host's name: `nbd://0.0.0.0:…` is no address a remote client can
    /// connect to (and no name a server certificate carries).
    pub fn uri(&self, export: &str, tls: bool) -> String {
        let scheme = if tls { "nbds" } else { "nbd" };
        match self {
            Listener::Unix(_, file) => {
                format!("{scheme}+unix:///{export}?socket={}", file.path().display())
            }
            Listener::Tcp(l) => match l.local_addr() {
                Ok(a) if a.ip().is_unspecified() => {
                    format!("{scheme}://{}:{}/{export}", host_name(), a.port())
                }
                Ok(SocketAddr::V6(a)) => {
                    format!("{scheme}://[{}]:{}/{export}", a.ip(), a.port())
                }
                Ok(a) => format!("{scheme}://{a}/{export}"),
                Err(_) => format!("{scheme}://?"),
            },
        }
    }
}

/// This host's name (gethostname(2)), for URIs of wildcard binds;
/// `localhost` if it has none a URI can carry.
pub fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname(2) writes at most `buf.len()` bytes into `buf`.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let len = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = std::str::from_utf8(&buf[..len]).unwrap_or_default();
    let usable = rc == 0
        && !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
    if usable {
        name.to_string()
    } else {
        "localhost".into()
    }
}

#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Worker threads per connection (requests served at once).
    pub threads: usize,
    /// Further clients are turned away while this many are connected.
    pub max_connections: usize,
    /// A client must finish negotiating (TLS handshake included) within
    /// this time.
    pub handshake_timeout: Duration,
    /// TLS offered (or required) through STARTTLS; `None`: NOTLS.
    pub tls: Option<Arc<Tls>>,
}

impl Default for ServerConfig {
    fn default() -> ServerConfig {
        ServerConfig {
            threads: 8,
            max_connections: 64,
            handshake_timeout: Duration::from_secs(60),
            tls: None,
        }
    }
}

pub struct Server {
    exports: Exports,
    cfg: ServerConfig,
    /// Live connections, so that shutdown can end them.
    conns: Mutex<HashMap<u64, Stream>>,
    next_id: AtomicU64,
    active: AtomicUsize,
    stopping: AtomicBool,
    /// The listening socket while `run` is accepting on it. Locked while
    /// `stop` uses it so that `run` cannot let it close meanwhile.
    listen_fd: Mutex<Option<i32>>,
}

impl Server {
    pub fn new(exports: Exports, cfg: ServerConfig) -> Arc<Server> {
        Arc::new(Server {
            exports,
            cfg,
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            active: AtomicUsize::new(0),
            stopping: AtomicBool::new(false),
            listen_fd: Mutex::new(None),
        })
    }

    /// Connected clients right now.
    pub fn connections(&self) -> usize {
        self.active.load(Ordering::Relaxed)
    }

    /// Accepts clients until [`Server::stop`]; returns once every
    /// connection has ended.
    pub fn run(self: &Arc<Self>, listener: &Listener) -> io::Result<()> {
        let mut handles = Vec::new();
        // Published before the flag is read: either `stop` sees the fd or
        // this loop sees the flag.
        *self.listen_fd.lock() = Some(listener.raw_fd());
        loop {
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            let accepted = listener.accept();
            if self.stopping.load(Ordering::SeqCst) {
                break;
            }
            let (stream, peer) = match accepted {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // EMFILE and friends: back off rather than spin.
                    log::warn!("accept failed: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            };
            if self.active.load(Ordering::Relaxed) >= self.cfg.max_connections {
                log::warn!(
                    "{peer}: refused, {} clients already connected",
                    self.cfg.max_connections
                );
                continue;
            }
            let id = self.next_id.fetch_add(1, Ordering::Relaxed);
            let peer = format!("{peer} client #{id}");
            let registered = stream.try_clone()?;
            {
                let mut conns = self.conns.lock();
                conns.insert(id, registered);
                // A stop that ran between accept and insert missed this one.
                if self.stopping.load(Ordering::SeqCst) {
                    let _ = stream.shutdown();
                }
            }
            self.active.fetch_add(1, Ordering::Relaxed);
            let server = self.clone();
            handles.retain(|h: &std::thread::JoinHandle<()>| !h.is_finished());
            handles.push(std::thread::spawn(move || {
                server.connection(stream, &peer);
                server.conns.lock().remove(&id);
                server.active.fetch_sub(1, Ordering::Relaxed);
            }));
        }
        *self.listen_fd.lock() = None;
        for h in handles {
            let _ = h.join();
        }
        Ok(())
    }

    /// Stops accepting and ends every connection; [`Server::run`] returns.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::SeqCst);
        let fd = self.listen_fd.lock();
        if let Some(fd) = *fd {
            // SAFETY: shutdown(2) on the listening socket `run` is blocked on
            // (it stays open until `run` returns); on Linux this makes the
            // blocked accept(2) return, which is all we want.
            unsafe { libc::shutdown(fd, libc::SHUT_RDWR) };
        }
        for s in self.conns.lock().values() {
            let _ = s.shutdown();
        }
    }

    fn connection(&self, stream: Stream, peer: &str) {
        log::info!("{peer}: connected");
        let negotiated = stream
            .set_read_timeout(Some(self.cfg.handshake_timeout))
            .and_then(|()| self.negotiate(&stream, peer))
            .and_then(|outcome| {
                stream.set_read_timeout(None)?;
                Ok(outcome)
            });
        match negotiated {
            Ok(Some((session, channel))) => {
                log::info!(
                    "{peer}: export {:?}, structured replies {}, block status {}{}",
                    session.export.name,
                    session.structured,
                    session.block_status,
                    match channel {
                        transmission::Channel::Plain => ", no TLS",
                        transmission::Channel::Tls(_) => ", TLS",
                    }
                );
                let threads = self.cfg.threads;
                if let Err(e) = transmission::run(&stream, channel, &session, threads, peer) {
                    log::warn!("{peer}: {e}");
                }
            }
            Ok(None) => {}
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                log::info!("{peer}: hung up during negotiation");
            }
            Err(e) => log::warn!("{peer}: negotiation failed: {e}"),
        }
        let _ = stream.shutdown();
        log::info!("{peer}: disconnected");
    }

    /// Option negotiation, through STARTTLS and the TLS handshake if the
    /// client asks for it; `None` if the client leaves or is turned away.
    fn negotiate(
        &self,
        stream: &Stream,
        peer: &str,
    ) -> io::Result<Option<(handshake::Session, transmission::Channel)>> {
        use handshake::{Outcome, TlsPolicy};
        let policy = match &self.cfg.tls {
            None => TlsPolicy::Off,
            Some(t) if t.require => TlsPolicy::Require,
            Some(_) => TlsPolicy::On,
        };
        let outcome = handshake::negotiate(&mut stream.try_clone()?, &self.exports, peer, policy)?;
        let no_zeroes = match outcome {
            Outcome::Transmit(s) => return Ok(Some((s, transmission::Channel::Plain))),
            Outcome::Closed => return Ok(None),
            Outcome::StartTls { no_zeroes } => no_zeroes,
        };
        let tls = self
            .cfg
            .tls
            .as_ref()
            .expect("STARTTLS is acknowledged only with TLS");
        let mut channel = tls::TlsChannel::accept(tls, stream).map_err(|e| match e.kind() {
            // Not a plain hang-up: GnuTLS clients that reject the server's
            // certificate (or want PSK) just close.
            io::ErrorKind::UnexpectedEof => io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "TLS handshake: the client hung up before finishing it",
            ),
            kind => io::Error::new(kind, format!("TLS handshake: {e}")),
        })?;
        log::info!("{peer}: TLS {}", channel.describe());
        match handshake::negotiate_secure(&mut channel, &self.exports, peer, no_zeroes)? {
            Outcome::Transmit(s) => Ok(Some((s, transmission::Channel::Tls(channel)))),
            Outcome::Closed => {
                channel.session.close();
                Ok(None)
            }
            Outcome::StartTls { .. } => unreachable!("a second STARTTLS is refused"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_of_a_wildcard_bind_names_the_host() {
        let l = Listener::bind_tcp("0.0.0.0:0".parse().unwrap()).unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(l.uri("d", false), format!("nbd://{}:{port}/d", host_name()));
        let l = Listener::bind_tcp("127.0.0.1:0".parse().unwrap()).unwrap();
        let port = l.local_addr().unwrap().port();
        assert_eq!(l.uri("d", true), format!("nbds://127.0.0.1:{port}/d"));
    }
}
