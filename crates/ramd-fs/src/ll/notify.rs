//! Notifications: messages the filesystem sends the kernel unasked, to drop
//! what it cached. Each is one write(2) to the /dev/fuse fd of an out
//! header with unique 0 and the notification's code as its error.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use super::abi::{notify_code, Wr, NOTIFY_DELETE_LEN, NOTIFY_INVAL_ENTRY_LEN};
use super::out_header;

/// Sends notifications on one connection.
#[derive(Debug, Clone)]
pub struct Notifier {
    fd: Arc<OwnedFd>,
}

impl Notifier {
    pub fn new(fd: Arc<OwnedFd>) -> Notifier {
        Notifier { fd }
    }

    /// Drops the kernel's cached attributes of `ino` and, unless `off` is
    /// negative, its cached pages from `off` for `len` bytes (0: to the end).
    pub fn inval_inode(&self, ino: u64, off: i64, len: i64) -> io::Result<()> {
        let mut b = [0u8; 24];
        let mut w = Wr::new(&mut b);
        w.u64(ino).i64(off).i64(len);
        self.send(notify_code::INVAL_INODE, &b)
    }

    /// Drops the kernel's cached name `name` in directory `parent`.
    pub fn inval_entry(&self, parent: u64, name: &[u8]) -> io::Result<()> {
        let mut b = Vec::with_capacity(NOTIFY_INVAL_ENTRY_LEN + name.len() + 1);
        b.extend_from_slice(&parent.to_ne_bytes());
        b.extend_from_slice(&(name_len(name)?).to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes()); // flags
        b.extend_from_slice(name);
        b.push(0);
        self.send(notify_code::INVAL_ENTRY, &b)
    }

    /// Tells the kernel that `name` in `parent`, which was `child`, is gone.
    pub fn delete(&self, parent: u64, child: u64, name: &[u8]) -> io::Result<()> {
        let mut b = Vec::with_capacity(NOTIFY_DELETE_LEN + name.len() + 1);
        b.extend_from_slice(&parent.to_ne_bytes());
        b.extend_from_slice(&child.to_ne_bytes());
        b.extend_from_slice(&(name_len(name)?).to_ne_bytes());
        b.extend_from_slice(&0u32.to_ne_bytes()); // padding
        b.extend_from_slice(name);
        b.push(0);
        self.send(notify_code::DELETE, &b)
    }

    fn send(&self, code: i32, payload: &[u8]) -> io::Result<()> {
        let head = out_header(payload.len(), code, 0);
        let iov = [
            libc::iovec {
                iov_base: head.as_ptr() as *mut _,
                iov_len: head.len(),
            },
            libc::iovec {
                iov_base: payload.as_ptr() as *mut _,
                iov_len: payload.len(),
            },
        ];
        // SAFETY: both iovecs point at live buffers of the given lengths.
        let r = unsafe { libc::writev(self.fd.as_raw_fd(), iov.as_ptr(), 2) };
        if r < 0 {
            let e = io::Error::last_os_error();
            // ENOENT: the kernel no longer knows the inode or name, so
            // there is nothing to drop.
            if e.raw_os_error() == Some(libc::ENOENT) {
                return Ok(());
            }
            return Err(e);
        }
        Ok(())
    }
}

fn name_len(name: &[u8]) -> io::Result<u32> {
    if name.len() > crate::fs::NAME_MAX || name.contains(&0) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    Ok(name.len() as u32)
}
