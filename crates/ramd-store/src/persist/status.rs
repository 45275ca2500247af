//! What `ramd status` and `ramd snapshot` say of a disk's persistence:
//! `SaveReport` (one save), `PersistStatus` (the disk's), `FlushMode`.

use serde::{Deserialize, Serialize};

use super::manifest::SegEntry;
use super::replica::ReplicaStatus;
use super::standby::StandbyStatus;

/// What a save did, for `ramd snapshot` and status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SaveReport {
    pub seq: u64,
    pub full: bool,
    pub pages: u64,
    /// Bytes written to the image (the segment file).
    pub bytes: u64,
    pub seconds: f64,
    pub unix_time: u64,
}

/// What a flush does: `ignore` (memory is the medium) or `persist` (wait
/// for a save).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FlushMode {
    Ignore,
    Persist,
}

/// A disk's persistence as `ramd status` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PersistStatus {
    /// The image directory; `None` for a disk without one.
    pub image: Option<String>,
    pub flush: FlushMode,
    pub autosave_secs: Option<f64>,
    /// Saves this process made.
    pub saves: u64,
    /// Saves this process tried that failed.
    #[serde(default)]
    pub save_failures: u64,
    /// The last save that succeeded (the image's last, until this process
    /// saves).
    pub last_save: Option<SaveReport>,
    /// Why the last save failed, until one succeeds.
    pub last_save_error: Option<String>,
    /// `--replicate`: the replica in object storage.
    #[serde(default)]
    pub replica: Option<ReplicaStatus>,
    /// `--standby` (until promoted): how it follows its image.
    #[serde(default)]
    pub standby: Option<StandbyStatus>,
}

impl PersistStatus {
    /// The status of a disk without an image.
    pub fn none() -> PersistStatus {
        PersistStatus {
            image: None,
            flush: FlushMode::Ignore,
            autosave_secs: None,
            saves: 0,
            save_failures: 0,
            last_save: None,
            last_save_error: None,
            replica: None,
            standby: None,
        }
    }
}

/// A save of the image as status shows it.
pub(super) fn report_of(s: &SegEntry) -> SaveReport {
    SaveReport {
        seq: s.seq,
        full: s.full,
        pages: s.pages,
        bytes: s.bytes,
        seconds: 0.0,
        unix_time: s.time_ns / 1_000_000_000,
    }
}
