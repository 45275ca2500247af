//! ramd's daemon layer, between the engine crates and the command line:
//!
//! - [`disk::Disk`]: a disk's one lifecycle (image, store, filesystem,
//!   saves, background work, control socket, frontends, final save);
//! - [`frontend`]: how a protocol plugs in (the `ramd_frontend` seam,
//!   re-exported, and a disk's settings as its `DiskSettings`), and in
//!   [`frontends`] the built-in registry: NBD (`ramd_nbd::frontend`) and
//!   the FUSE frontend, which stays here while the disk builds its `Fs`
//!   (iSCSI, [`Iscsi`], the binary registers);
//! - [`daemon::Daemon`]: one process for one disk (`ramd serve`) or many
//!   (`ramd up`, `down`, `reload`);
//! - [`status`]: typed status, [`metrics`]: the same as Prometheus
//!   `/metrics`, [`control`]: the control sockets,
//!   [`notify`]: readiness for systemd (`sd_notify`);
//! - [`args`] and [`config`]: a disk's settings as flags and as a config
//!   table, checked at this edge; [`mount_opts`]: the same settings as
//!   mount(8)'s `-o` options.
//!
//! Errors here are an operator's (a busy mount point, a bad config line),
//! reported with context; what clients see stays `ramd_store::Error`.

pub mod args;
pub mod config;
pub mod control;
pub mod daemon;
pub mod disk;
pub mod event;
pub mod frontend;
pub mod frontends;
pub mod metrics;
pub mod mount_opts;
/// The iSCSI target, registered by the binary (one factory per daemon: it
/// holds the target its disks share).
pub use ramd_iscsi::frontend::Iscsi;
pub mod notify;
pub mod status;
pub mod units;
