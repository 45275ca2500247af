//! ramd's iSCSI target. Two layers with one seam between them:
//! - [`scsi`]: the SCSI logical unit (SPC-4/SBC-3 commands, sense data,
//!   reservations) over a [`ramd_store::Store`]; it knows nothing of iSCSI.
//! - the iSCSI layer (PDUs, login, sessions, R2T, task management) which
//!   collects a command's CDB and Data-Out, hands them to a [`scsi::Lun`],
//!   and sends back its [`scsi::Reply`]: [`pdu`] (the wire format),
//!   [`params`] (negotiation), [`target`] (target, sessions), [`portal`]
//!   (listening sockets) and `conn` (one connection's login and full
//!   feature phase).

mod conn;
pub mod frontend;
pub mod fuzz;
pub mod params;
pub mod pdu;
pub mod portal;
pub mod scsi;
pub mod settings;
pub mod target;

pub use conn::decode_lun;
pub use portal::Portal;
pub use target::{Chap, Target, TargetConfig};
