//! The target's portals: listening sockets, each accepting connections
//! and serving every one on a thread of its own ([`crate::conn::serve`]).

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;

use crate::target::Target;

/// A listening socket of the target.
pub struct Portal {
    listener: TcpListener,
    addr: SocketAddr,
    stopping: Arc<AtomicBool>,
}

impl Portal {
    pub fn bind(addr: SocketAddr) -> io::Result<Portal> {
        let listener = TcpListener::bind(addr)?;
        let addr = listener.local_addr()?;
        Ok(Portal {
            listener,
            addr,
            stopping: Arc::new(AtomicBool::new(false)),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Accepts connections until [`Portal::stop`], each served on a thread
    /// of its own.
    pub fn serve(&self, target: &Arc<Target>) -> io::Result<()> {
        let active = Arc::new(AtomicU64::new(0));
        let mut threads: Vec<thread::JoinHandle<()>> = Vec::new();
        for conn in self.listener.incoming() {
            if self.stopping.load(Ordering::Acquire) {
                break;
            }
            threads.retain(|t| !t.is_finished());
            let stream = match conn {
                Ok(s) => s,
                Err(e) => {
                    log::warn!("iSCSI accept on {}: {e}", self.addr);
                    continue;
                }
            };
            if active.load(Ordering::Acquire) as usize >= target.cfg.max_connections {
                log::warn!(
                    "iSCSI: turning away {:?}: {} connections already",
                    stream.peer_addr(),
                    target.cfg.max_connections
                );
                continue;
            }
            let t = target.clone();
            let a = active.clone();
            a.fetch_add(1, Ordering::AcqRel);
            let portal = self.addr;
            let spawned = thread::Builder::new()
                .name("iscsi-conn".into())
                .spawn(move || {
                    crate::conn::serve(&t, stream, portal);
                    a.fetch_sub(1, Ordering::AcqRel);
                });
            match spawned {
                Ok(h) => threads.push(h),
                Err(e) => {
                    active.fetch_sub(1, Ordering::AcqRel);
                    log::warn!("iSCSI: cannot start a connection thread: {e}");
                }
            }
        }
        // With the target stopped, its connections are ending: wait for
        // them, so that no command runs after the disks' final saves. A
        // portal closed while the target serves on (another disk's portal)
        // leaves its connections be.
        if target.is_stopping() {
            for t in threads {
                let _ = t.join();
            }
        }
        Ok(())
    }

    /// Makes `serve` return.
    pub fn stop(&self) {
        self.stopping.store(true, Ordering::Release);
        // Wake the blocked accept with a connection of our own.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(match wake {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        let _ = TcpStream::connect_timeout(&wake, std::time::Duration::from_secs(1));
    }
}
