//! The one error type of the engine, with the errno each failure becomes for a
//! client (NBD error field today, FUSE reply later).

use std::io;

/// Every way an engine operation can fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The disk's memory budget (`max_memory`) would be exceeded.
    #[error("no space left: {needed} more bytes would exceed max_memory of {limit} bytes")]
    NoSpace { needed: u64, limit: u64 },

    /// Every page the disk's size allows is in use (filesystem disks).
    #[error("no space left: all {limit} bytes of the disk are in use")]
    DiskFull { limit: u64 },

    /// The host itself is short of memory: refusing beats an OOM kill.
    #[error("no space left: host MemAvailable {available} bytes is below the reserve of {reserve} bytes")]
    HostMemoryLow { available: u64, reserve: u64 },

    /// A request reaches past the end of the disk.
    #[error("range offset {offset} length {length} is beyond the disk size {size}")]
    OutOfRange { offset: u64, length: u64, size: u64 },

    /// A write-type request on a read-only disk.
    #[error("disk is read-only")]
    ReadOnly,

    /// An argument the caller should have validated (configuration mistakes).
    #[error("invalid argument: {0}")]
    Invalid(String),

    /// Stored data failed to decode: a bug or memory corruption, never
    /// something to hand a client as data.
    #[error("stored data is corrupt: {0}")]
    Corrupt(String),

    /// The operating system refused a resource (mmap, madvise...).
    #[error("{what}: {source}")]
    Os {
        what: &'static str,
        #[source]
        source: io::Error,
    },
}

impl Error {
    /// The Linux errno this error means for a client.
    pub fn errno(&self) -> i32 {
        match self {
            Error::NoSpace { .. } | Error::DiskFull { .. } | Error::HostMemoryLow { .. } => {
                libc::ENOSPC
            }
            Error::OutOfRange { .. } | Error::Invalid(_) => libc::EINVAL,
            Error::ReadOnly => libc::EPERM,
            Error::Corrupt(_) => libc::EIO,
            Error::Os { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
        }
    }

    pub(crate) fn os(what: &'static str) -> Error {
        Error::Os {
            what,
            source: io::Error::last_os_error(),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        assert_eq!(
            Error::NoSpace {
                needed: 1,
                limit: 2
            }
            .errno(),
            libc::ENOSPC
        );
        assert_eq!(
            Error::OutOfRange {
                offset: 1,
                length: 1,
                size: 1
            }
            .errno(),
            libc::EINVAL
        );
        assert_eq!(Error::ReadOnly.errno(), libc::EPERM);
    }
}
