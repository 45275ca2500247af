//! The one error type of the engine, with the errno each failure becomes for a
//! client (NBD error field today, FUSE reply later).

use std::io;
use std::num::NonZeroI32;

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
    ///
    /// The io::Error is part of the message and deliberately not the
    /// error's `source()`: a chain printer (anyhow's `{:#}`) prints each
    /// source after the message, which said it twice ("...: No space left
    /// on device (os error 28): No space left on device (os error 28)").
    #[error("{}: {err}", path.display())]
    File {
        path: std::path::PathBuf,
        err: io::Error,
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

    /// The operating system refused a resource (mmap, madvise...); `err`
    /// is in the message, not a `source()`, as for `File`.
    #[error("{what}: {err}")]
    Os { what: &'static str, err: io::Error },
}

impl Error {
    /// The errno this error means for a client.
    pub fn errno(&self) -> Errno {
        match self {
            Error::NoSpace { .. }
            | Error::SharedNoSpace { .. }
            | Error::DiskFull { .. }
            | Error::HostMemoryLow { .. } => Errno::ENOSPC,
            Error::OutOfRange { .. } | Error::Invalid(_) | Error::Unusable(_) => Errno::EINVAL,
            Error::Context { inner, .. } => inner.errno(),
            Error::ReadOnly => Errno::EPERM,
            Error::Corrupt(_) | Error::Image { .. } => Errno::EIO,
            Error::Os { err, .. } | Error::File { err, .. } => {
                err.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
            }
        }
    }

    /// `source` happened on `path`.
    pub fn file(path: impl Into<std::path::PathBuf>, err: io::Error) -> Error {
        Error::File {
            path: path.into(),
            err,
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
            err: io::Error::last_os_error(),
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// An errno a client sees: the one vocabulary of failures for every
/// frontend (FUSE replies, NBD error codes). Never 0, so never a success
/// by mistake.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Errno(NonZeroI32);

impl Errno {
    pub const E2BIG: Errno = Errno::known(libc::E2BIG);
    pub const EACCES: Errno = Errno::known(libc::EACCES);
    pub const EBADF: Errno = Errno::known(libc::EBADF);
    pub const EDQUOT: Errno = Errno::known(libc::EDQUOT);
    pub const EEXIST: Errno = Errno::known(libc::EEXIST);
    pub const EFBIG: Errno = Errno::known(libc::EFBIG);
    pub const EINVAL: Errno = Errno::known(libc::EINVAL);
    pub const EIO: Errno = Errno::known(libc::EIO);
    pub const EISDIR: Errno = Errno::known(libc::EISDIR);
    pub const EMLINK: Errno = Errno::known(libc::EMLINK);
    pub const ENAMETOOLONG: Errno = Errno::known(libc::ENAMETOOLONG);
    pub const ENODATA: Errno = Errno::known(libc::ENODATA);
    pub const ENOENT: Errno = Errno::known(libc::ENOENT);
    pub const ENOMEM: Errno = Errno::known(libc::ENOMEM);
    pub const ENOSPC: Errno = Errno::known(libc::ENOSPC);
    pub const ENOSYS: Errno = Errno::known(libc::ENOSYS);
    pub const ENOTDIR: Errno = Errno::known(libc::ENOTDIR);
    pub const ENOTEMPTY: Errno = Errno::known(libc::ENOTEMPTY);
    pub const ENOTSUP: Errno = Errno::known(libc::ENOTSUP);
    pub const ENOTTY: Errno = Errno::known(libc::ENOTTY);
    pub const ENXIO: Errno = Errno::known(libc::ENXIO);
    pub const EOPNOTSUPP: Errno = Errno::known(libc::EOPNOTSUPP);
    pub const EOVERFLOW: Errno = Errno::known(libc::EOVERFLOW);
    pub const EPERM: Errno = Errno::known(libc::EPERM);
    pub const EROFS: Errno = Errno::known(libc::EROFS);
    pub const ERANGE: Errno = Errno::known(libc::ERANGE);
    pub const ESHUTDOWN: Errno = Errno::known(libc::ESHUTDOWN);
    pub const EXDEV: Errno = Errno::known(libc::EXDEV);

    const fn known(e: i32) -> Errno {
        match NonZeroI32::new(e) {
            Some(n) => Errno(n),
            None => panic!("errno 0"),
        }
    }

    /// `e` as an errno; 0 or a negative value (no errno at all) is EIO.
    pub fn from_raw(e: i32) -> Errno {
        match NonZeroI32::new(e) {
            Some(n) if e > 0 => Errno(n),
            _ => Errno::EIO,
        }
    }

    /// The raw value, as Linux numbers it.
    pub fn get(self) -> i32 {
        self.0.get()
    }
}

impl From<Error> for Errno {
    fn from(e: Error) -> Errno {
        e.errno()
    }
}

impl std::fmt::Debug for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Errno({}: {})",
            self.get(),
            io::Error::from_raw_os_error(self.get())
        )
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        io::Error::from_raw_os_error(self.get()).fmt(f)
    }
}

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
            Errno::ENOSPC
        );
        assert_eq!(
            Error::OutOfRange {
                offset: 1,
                length: 1,
                size: 1
            }
            .errno(),
            Errno::EINVAL
        );
        assert_eq!(Error::ReadOnly.errno(), Errno::EPERM);
        assert_eq!(Errno::from_raw(0), Errno::EIO);
        assert_eq!(Errno::from_raw(-5), Errno::EIO);
        assert_eq!(Errno::from_raw(libc::ENOENT).get(), libc::ENOENT);
    }

    /// What a chain printer (anyhow's `{:#}`, `ramd: error: ...`) shows:
    /// the message, then every `source()`'s.
    fn chain(e: &dyn std::error::Error) -> String {
        let mut out = e.to_string();
        let mut next = e.source();
        while let Some(s) = next {
            out += &format!(": {s}");
            next = s.source();
        }
        out
    }

    #[test]
    fn an_os_error_is_said_once_in_a_chain() {
        let full = || io::Error::from_raw_os_error(libc::ENOSPC);
        let e = Error::file("/img/seg-00000002.tmp", full());
        assert_eq!(
            chain(&e),
            "/img/seg-00000002.tmp: No space left on device (os error 28)"
        );
        assert_eq!(e.errno(), Errno::ENOSPC);
        let e = Error::context("saving".into(), e, ": the image keeps its last save");
        assert_eq!(chain(&e).matches("os error 28").count(), 1, "{e}");
        let e = Error::Os {
            what: "mmap",
            err: full(),
        };
        assert_eq!(chain(&e), "mmap: No space left on device (os error 28)");
    }
}
