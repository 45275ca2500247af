//! Telling systemd how the daemon is doing (`sd_notify`, for units with
//! `Type=notify`): `READY=1` once every disk serves, `RELOADING=1` …
//! `READY=1` around a reload, `STOPPING=1` when stopping.
//!
//! The protocol is one unix datagram of `KEY=VALUE` lines sent to the
//! socket named by `$NOTIFY_SOCKET`: a path, or an abstract-namespace name
//! written with a leading `@`. Without `NOTIFY_SOCKET` (not started by
//! systemd) every call does nothing. A failure to notify is logged, never
//! fatal: the disks serve either way, and systemd's own timeouts report a
//! daemon that never said it was ready.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::Path;

/// Every disk serves. `status` is shown by `systemctl status`.
pub fn ready(status: &str) {
    send_logged(&format!("READY=1\nSTATUS={status}"));
}

/// A reload begins; [`ready`] ends it. `MONOTONIC_USEC` lets systemd ≥ 253
/// tell this reload from an older one (`Type=notify-reload` requires it).
pub fn reloading() {
    send_logged(&format!(
        "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading",
        monotonic_usec()
    ));
}

/// The daemon is stopping (saving its disks); it exits when done.
pub fn stopping() {
    send_logged("STOPPING=1\nSTATUS=stopping: saving and unmounting disks");
}

/// What the daemon is doing, for `systemctl status` (a disk that failed,
/// a save that failed), without changing its state.
pub fn status(status: &str) {
    send_logged(&format!("STATUS={status}"));
}

fn send_logged(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    match send_to(&target, state) {
        Ok(()) => log::debug!("notified systemd: {}", state.replace('\n', " ")),
        Err(e) => log::warn!(
            "cannot notify systemd at NOTIFY_SOCKET={}: {e}",
            target.to_string_lossy()
        ),
    }
}

/// Sends `state` as one datagram to `target`, a socket path or `@name`
/// (abstract namespace).
pub fn send_to(target: &std::ffi::OsStr, state: &str) -> io::Result<()> {
    let bytes = target.as_bytes();
    let addr = match bytes.split_first() {
        Some((b'@', name)) => SocketAddr::from_abstract_name(name)?,
        Some((b'/', _)) => SocketAddr::from_pathname(Path::new(target))?,
        _ => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "neither an absolute path nor an @abstract name",
            ))
        }
    };
    let sock = UnixDatagram::unbound()?;
    let sent = sock.send_to_addr(state.as_bytes(), &addr)?;
    if sent != state.len() {
        return Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("sent {sent} of {} bytes", state.len()),
        ));
    }
    Ok(())
}

fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC always
    // exists on Linux, so the call cannot fail.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsStr;
    use std::time::Duration;

    fn receive(sock: &UnixDatagram) -> String {
        sock.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut buf = [0u8; 4096];
        let n = sock.recv(&mut buf).expect("a datagram within 5 s");
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn sends_one_datagram_to_a_socket_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let rx = UnixDatagram::bind(&path).unwrap();
        send_to(path.as_os_str(), "READY=1\nSTATUS=2 disks").unwrap();
        assert_eq!(receive(&rx), "READY=1\nSTATUS=2 disks");
    }

    #[test]
    fn sends_to_an_abstract_name() {
        let name = format!("ramd-notify-test-{}", std::process::id());
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let rx = UnixDatagram::bind_addr(&addr).unwrap();
        send_to(OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        assert_eq!(receive(&rx), "STOPPING=1");
    }

    #[test]
    fn refuses_relative_and_empty_targets() {
        for t in ["", "notify.sock"] {
            let e = send_to(OsStr::new(t), "READY=1").unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{t:?}");
        }
    }

    #[test]
    fn a_missing_receiver_is_an_error_not_a_hang() {
        let dir = tempfile::tempdir().unwrap();
        let e = send_to(dir.path().join("nobody").as_os_str(), "READY=1").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
    }

    #[test]
    fn reloading_carries_a_monotonic_timestamp() {
        let a = monotonic_usec();
        let b = monotonic_usec();
        assert!(a > 0 && b >= a);
    }
}
