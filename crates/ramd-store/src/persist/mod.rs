//! Persistence, in one place: the image format (`format.rs`, FORMAT.md is
//! its specification), the MANIFEST (`manifest.rs`) and the image
//! directory (`image_dir.rs`), writing and reading segments (`writer.rs`,
//! `reader.rs`), the store's side of a save is `crate::store`'s `save.rs`
//! (changed pages, the switch, kept copies, restore), when to save (`policy.rs`:
//! `Persister`; a standby's in `promote.rs`) and how to load (`load.rs`:
//! `load`, `open_image`); object storage (`remote.rs`, `ranged.rs`,
//! `lease.rs`) and a local image's replica there (`replica.rs`).
//!
//! The on-disk image of a disk: a directory holding one segment file per
//! save and a MANIFEST naming the chain of segments that make up the latest
//! complete save. FORMAT.md is the specification; this is its code.
//!
//! Crash safety rests on two facts of the filesystem below: `fsync` makes a
//! file's data durable, and `rename` replaces a name atomically (made
//! durable by fsync of the directory). A segment is written under a `.tmp`
//! name, fsynced and renamed; the MANIFEST likewise, and its rename is the
//! moment a save exists. Anything not named by the MANIFEST is debris.

mod damage;
mod format;
mod history;
mod image_dir;
mod lease;
mod load;
mod manifest;
mod outer;
mod policy;
mod promote;
mod ranged;
mod reader;
mod remote;
mod replica;
mod salvage;
mod standby;
mod status;
#[cfg(test)]
mod tests;
mod tree;
mod writer;

pub use crate::store::{PageRef, SavePlan, SaveSession};
pub use damage::{Damaged, Lost};
pub use format::{decode_record, DiskKind, Record, TreeChain, MANIFEST, REC_HEADER, SEG_HEADER};
pub use history::Restorable;
pub use image_dir::ImageDir;
pub use lease::{LeaseHolder, LeaseWatch};
pub use load::{load, loading_stopped, open_image, stop_loading, Progress};
pub use manifest::{Manifest, SegEntry};
pub use outer::{OuterPages, OuterSave};
pub use policy::Persister;
pub use remote::{is_url, S3_SCHEME};
pub use replica::{Replica, ReplicaStatus};
pub use salvage::{LostPages, SalvageChain, Salvaged};
pub use standby::{FollowTree, StandbyStatus};
pub use status::{FlushMode, PersistStatus, SaveReport};
pub use tree::{MetaFn, TreeFn, TreeSave};
pub use writer::SegWriter;

/// A save's time (nanoseconds since the epoch) as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn time_text(ns: u64) -> String {
    let secs = (ns / 1_000_000_000) as i64;
    let (days, rem) = (secs.div_euclid(86400), secs.rem_euclid(86400));
    // The civil date from days since 1970-01-01 (eras of 400 years).
    let z = days + 719468;
    let era = z.div_euclid(146097);
    let doe = z.rem_euclid(146097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + (m <= 2) as i64;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
