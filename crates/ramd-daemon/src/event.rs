//! What a daemon's loop acts on: one channel carries signals, control
//! requests and disks' news (a frontend that ended, a save that failed) to
//! [`crate::daemon::Daemon`]'s one thread. Disks send on it; the daemon
//! receives.

use anyhow::Result;

use crate::control::Request;

/// Where a disk sends its [`Event`]s.
pub type Events = std::sync::mpsc::Sender<Event>;

/// What the daemon's loop acts on.
pub enum Event {
    /// A stopping signal (SIGINT, SIGTERM, SIGQUIT, and SIGHUP where it
    /// stops), by number.
    Signal(i32),
    /// SIGHUP: `ramd up` reloads its config file.
    Hangup,
    /// A disk asked to stop could not save first: it serves on.
    StopRefused { disk: String, error: String },
    /// A frontend's `serve` returned.
    FrontendEnded { disk: String },
    /// A disk's save at stop failed: it holds its data and tries again.
    StillHeld { disk: String, error: String },
    /// A disk's finisher is done: the disk is gone.
    Finished { disk: String, result: Result<()> },
    /// `stop` (`stop force`: even if its save fails) on a disk's control
    /// socket.
    StopDisk {
        disk: String,
        req: Request,
        force: bool,
    },
    /// `wait` on a disk's control socket: answered once it is gone.
    WaitDisk { disk: String, req: Request },
    /// A request on the daemon's control socket.
    Daemon(Request),
}
