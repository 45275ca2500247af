//! The one error type of the engine, with the errno each failure becomes for a
//! client (NBD error field today, FUSE reply later).

use std::io;

/// Every way an engine operation can fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The disk's memory budget (`max_memory`) would be exceeded.
    #[error("no space left: {needed} more bytes would exceed max_memory of {limit} bytes")]
    NoSpace { needed: u64, limit: u64 },

    /// The budget the disk shares with the other disks of its daemon
    /// (`[daemon] max_memory`) would be exceeded.
    #[error("no space left: {needed} more bytes would exceed the daemon's shared max_memory of {limit} bytes")]
    SharedNoSpace { needed: u64, limit: u64 },

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

    /// An image file is damaged, truncated or not an image: where and why.
    #[error("{}: offset {offset}: {reason}", file.display())]
    Image {
        file: std::path::PathBuf,
        offset: u64,
        reason: String,
    },

    /// Reading or writing a file failed.
    #[error("{}: {source}", path.display())]
    File {
        path: std::path::PathBuf,
        #[source]
        source: io::Error,
    },

    /// What was being done when `inner` happened (loading an image...),
    /// and a hint for the user (empty, or starting with `: `).
    #[error("{what}: {inner}{hint}")]
    Context {
        what: String,
        inner: Box<Error>,
        hint: &'static str,
    },

    /// An image that cannot serve as asked (another kind or size of disk,
    /// a new image without a size): the message says what to do instead.
    #[error("{0}")]
    Unusable(String),

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
            Error::NoSpace { .. }
            | Error::SharedNoSpace { .. }
            | Error::DiskFull { .. }
            | Error::HostMemoryLow { .. } => libc::ENOSPC,
            Error::OutOfRange { .. } | Error::Invalid(_) | Error::Unusable(_) => libc::EINVAL,
            Error::Context { inner, .. } => inner.errno(),
            Error::ReadOnly => libc::EPERM,
            Error::Corrupt(_) | Error::Image { .. } => libc::EIO,
            Error::Os { source, .. } | Error::File { source, .. } => {
                source.raw_os_error().unwrap_or(libc::EIO)
            }
        }
    }

    /// `source` happened on `path`.
    pub fn file(path: impl Into<std::path::PathBuf>, source: io::Error) -> Error {
        Error::File {
            path: path.into(),
            source,
        }
    }

    /// `inner` happened while doing `what`; `hint` (empty, or `: ...`) says
    /// what the user can do about it.
    pub fn context(what: String, inner: Error, hint: &'static str) -> Error {
        Error::Context {
            what,
            inner: Box::new(inner),
            hint,
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
