//! Fuzzing entry points: raw client bytes through the real handshake and
//! the real request loop, against small in-memory stores. The libFuzzer
//! targets in `fuzz/` call these (feature `fuzzing`); the unit tests below
//! replay the kept corpus (`fuzz/corpus/`) and the regression cases.
//!
//! A harness must not panic, hang or leak on any input; the store's own
//! `debug_assert`s and range checks are part of the oracle.

use std::io::{self, Cursor, Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, OnceLock};

use ramd_store::{Store, StoreConfig};

use crate::handshake::{self, Outcome, Session, TlsPolicy};
use crate::{transmission, Export, Exports, Stream};

/// Size of the fuzzed disks: small, so that most ranges are in reach.
pub const DISK_SIZE: u64 = 1 << 20;

/// One writable and one read-only disk, shared by every input of a run
/// (a store is costly to build; what inputs leave in it only varies the
/// starting state, which is fine for a fuzzer).
fn exports() -> &'static Exports {
    static EXPORTS: OnceLock<Exports> = OnceLock::new();
    EXPORTS.get_or_init(|| {
        let disk = |name: &str, read_only| {
            let mut cfg = StoreConfig::new(DISK_SIZE);
            cfg.host_reserve = 0;
            Export {
                name: name.into(),
                description: format!("fuzz disk {name}"),
                store: Arc::new(Store::new(cfg).expect("a 1 MiB store")),
                read_only,
                // Recording is on the request path: fuzz it too.
                metrics: Some(ramd_store::metrics::DiskMetrics::default().frontend("nbd")),
            }
        };
        Exports::new(vec![disk("rw", false), disk("ro", true)])
    })
}

/// A scripted client: the client's bytes in, the server's bytes out (also
/// handshake's unit tests).
pub(crate) struct Script {
    pub(crate) input: Cursor<Vec<u8>>,
    pub(crate) output: Vec<u8>,
}

impl Read for Script {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        self.input.read(b)
    }
}

impl Write for Script {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.output.write(b)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Option negotiation from raw client bytes (client flags onwards).
/// Returns what the server sent.
pub fn handshake(data: &[u8]) -> Vec<u8> {
    let mut s = Script {
        input: Cursor::new(data.to_vec()),
        output: Vec::new(),
    };
    let outcome = handshake::negotiate(&mut s, exports(), "fuzz", TlsPolicy::Off);
    if let Ok(Outcome::Transmit(session)) = outcome {
        assert_ne!(session.flags & crate::proto::TF_HAS_FLAGS, 0);
        let ro = session.export.read_only;
        assert_eq!(session.flags & crate::proto::TF_READ_ONLY != 0, ro);
        assert!(!session.block_status || session.structured);
    }
    // The same bytes against a server that requires TLS: no export may be
    // reached without it (the handshake itself is rustls's to fuzz).
    let mut required = Script {
        input: Cursor::new(data.to_vec()),
        output: Vec::new(),
    };
    let outcome = handshake::negotiate(&mut required, exports(), "fuzz", TlsPolicy::Require);
    assert!(!matches!(outcome, Ok(Outcome::Transmit(_))));
    s.output
}

/// The request loop from raw client bytes. The first byte picks the
/// session: bit 0 structured replies, bit 1 base:allocation, bit 2 the
/// read-only disk, bit 3 two worker threads instead of one; the rest is the
/// request stream. Returns what the server sent.
pub fn transmission(data: &[u8]) -> Vec<u8> {
    let (&mode, requests) = data.split_first().unwrap_or((&0, &[]));
    let structured = mode & 1 != 0;
    let export = exports()
        .find(if mode & 4 != 0 { "ro" } else { "rw" })
        .expect("both disks exist");
    let session = Session {
        flags: handshake::transmission_flags(&export, structured),
        export,
        structured,
        block_status: structured && mode & 2 != 0,
    };
    let threads = if mode & 8 != 0 { 2 } else { 1 };
    let (client, server) = UnixStream::pair().expect("socketpair");
    let mut client_w = client.try_clone().expect("dup");
    // Inputs that fit in the socket's buffer are sent before the server
    // starts, which saves a thread per input (a third of the run time).
    let preload = requests.len() <= PRELOAD_MAX;
    if preload {
        client_w
            .write_all(requests)
            .expect("fits the socket buffer");
        client_w
            .shutdown(std::net::Shutdown::Write)
            .expect("shutdown");
    }
    std::thread::scope(|s| {
        if !preload {
            s.spawn(move || {
                // The server may stop reading (bad magic): a broken pipe is fine.
                let _ = client_w.write_all(requests);
                let _ = client_w.shutdown(std::net::Shutdown::Write);
            });
        }
        let replies = s.spawn(move || {
            let mut out = Vec::new();
            let mut client = client;
            match client.read_to_end(&mut out) {
                // Linux resets the peer of a Unix socket closed with unread
                // data: the server hung up before reading all requests.
                Err(e) if e.kind() != io::ErrorKind::ConnectionReset => {
                    panic!("reading replies: {e}")
                }
                _ => out,
            }
        });
        let server = Stream::Unix(server);
        // Errors are the client's fault here, and logged by `run`.
        let channel = transmission::Channel::Plain;
        let _ = transmission::run(&server, channel, &session, threads, "fuzz");
        // Closes the last server end: the reader above sees EOF.
        drop(server);
        replies.join().expect("reply reader")
    })
}

/// Bytes of requests sent ahead of the server (well under the default
/// 208 KiB buffer of a Unix socket pair).
const PRELOAD_MAX: usize = 64 << 10;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::*;
    use std::path::PathBuf;

    fn request(flags: u16, cmd: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
        let cmd = Cmd::from(cmd);
        Request {
            flags,
            cmd,
            cookie,
            offset,
            length,
        }
        .encode()
        .to_vec()
    }

    #[test]
    fn zero_length_read_with_structured_replies_is_one_none_chunk() {
        let out = transmission(&[&[1][..], &request(0, 0, 5, 4096, 0)].concat());
        assert_eq!(
            out,
            [
                0x66, 0x8e, 0x33, 0xef, // structured reply magic
                0x00, 0x01, // DONE
                0x00, 0x00, // NONE
                0, 0, 0, 0, 0, 0, 0, 5, // cookie
                0, 0, 0, 0, // no payload
            ]
        );
        // Simple replies: a header and no data.
        let out = transmission(&[&[0][..], &request(0, 0, 6, 4096, 0)].concat());
        assert_eq!(
            out,
            [0x67, 0x44, 0x66, 0x98, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6]
        );
    }

    #[test]
    fn flush_with_a_length_or_offset_is_einval() {
        for (off, len) in [(0, 1), (4096, 0), (0, 0)] {
            let out = transmission(&[&[0][..], &request(0, 3, 7, off, len)].concat());
            let want = if (off, len) == (0, 0) { 0 } else { EINVAL };
            assert_eq!(out[4..8], want.to_be_bytes(), "flush at {off} length {len}");
        }
    }

    /// Every input the fuzzers kept, and every regression case, replayed.
    fn replay(target: &str, f: fn(&[u8]) -> Vec<u8>) {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus");
        let dir = dir.join(target);
        let mut n = 0;
        for e in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = e.unwrap().path();
            let bytes = std::fs::read(&path).unwrap();
            f(&bytes);
            n += 1;
        }
        assert!(n > 0, "no corpus in {}", dir.display());
    }

    #[test]
    fn handshake_corpus_replays() {
        replay("handshake", handshake);
    }

    #[test]
    fn transmission_corpus_replays() {
        replay("transmission", transmission);
    }
}
