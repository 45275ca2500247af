//! The seam between a ramd disk and the protocols that serve it: what one
//! serving instance is ([`Frontend`]), what it reports ([`FrontendStatus`]),
//! what it takes for itself ([`Claim`]), and the unix sockets that the
//! protocols and the daemon's control sockets bind ([`bind_unix_socket`]).
//! The protocol crates and the daemon both depend on it; it depends on no
//! protocol.

mod socket;

pub use socket::{bind_unix_socket, SocketFile};

use serde::{Deserialize, Serialize};

/// What a frontend reports for `ramd status`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct FrontendStatus {
    /// The protocol: `nbd`, `fuse`...
    pub protocol: String,
    /// Where clients reach it: an NBD URI, a mount point...
    pub endpoint: String,
    /// Clients connected now, where the protocol has connections.
    pub connections: Option<u64>,
    /// How requests travel, where the protocol has a choice: FUSE's
    /// `io-uring` or `dev` (/dev/fuse).
    #[serde(default)]
    pub transport: Option<String>,
}

/// One serving instance: a listening socket, a mount.
pub trait Frontend: Send + Sync {
    /// Serves until [`Frontend::stop`] or until it ends by itself (a FUSE
    /// mount unmounted by the user); returns once its clients are gone.
    fn serve(&self) -> anyhow::Result<()>;

    /// Asks `serve` to return; `force` (a second stop signal) may fail the
    /// I/O of clients still there rather than wait for them.
    fn stop(&self, force: bool);

    fn status(&self) -> FrontendStatus;
}

/// Something a disk's frontends take for themselves; two disks of one daemon
/// claiming the same thing is refused before either starts.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Claim(pub String);
