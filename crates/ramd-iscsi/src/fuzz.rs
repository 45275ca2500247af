//! Fuzzing entry point for the iSCSI layer: arbitrary bytes from an
//! initiator through one real connection (PDU reader, login state machine,
//! full feature phase) to a target with one 1 MiB LUN. The libFuzzer target
//! `fuzz/fuzz_targets/iscsi_pdu.rs` calls [`connection`]; the unit test
//! below replays the kept corpus (`fuzz/corpus/iscsi_pdu/`).
//!
//! The oracle: no panic, no hang (the connection must end when the input
//! does), and the target still has no session once it has.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread;

use ramd_store::{Store, StoreConfig};

use crate::scsi::{Lun, LunConfig};
use crate::target::{Chap, Target, TargetConfig};

pub const TARGET_NAME: &str = "iqn.2026-11.org.ramd:fuzz";

struct Env {
    target: Arc<Target>,
    listener: Mutex<TcpListener>,
    addr: SocketAddr,
}

/// Two targets, built once per run: without and with CHAP.
fn env(chap: bool) -> &'static Env {
    static ENVS: OnceLock<[Env; 2]> = OnceLock::new();
    let envs = ENVS.get_or_init(|| {
        let mut cfg = StoreConfig::new(1 << 20);
        cfg.host_reserve = 0;
        cfg.warm_pool = 0;
        let store = Arc::new(Store::new(cfg).expect("a 1 MiB store"));
        let make = |chap: bool| {
            let target = Target::new(TargetConfig {
                name: TARGET_NAME.into(),
                alias: "fuzz".into(),
                chap: chap.then(|| Chap {
                    user: "user".into(),
                    secret: "fuzz-secret-12".into(),
                }),
                mutual_chap: chap.then(|| Chap {
                    user: "target".into(),
                    secret: "fuzz-secret-34".into(),
                }),
                max_connections: 4,
            });
            let lun = Lun::new(
                store.clone(),
                LunConfig {
                    block_size: 512,
                    read_only: false,
                    id: 9,
                    serial: "fuzz".into(),
                    product: "fuzz disk".into(),
                    write_cache: false,
                },
            );
            target.add_lun(0, Arc::new(lun));
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
            let addr = listener.local_addr().expect("local address");
            Env {
                target,
                listener: Mutex::new(listener),
                addr,
            }
        };
        [make(false), make(true)]
    });
    &envs[usize::from(chap)]
}

/// A Login Request straight to the full feature phase, so that inputs
/// reach commands without having to find a valid login first.
pub fn canned_login() -> Vec<u8> {
    let text = format!(
        "InitiatorName=iqn.2026-11.org.ramd:fuzzer\0SessionType=Normal\0TargetName={TARGET_NAME}\0\
         InitialR2T=No\0ImmediateData=Yes\0MaxBurstLength=16384\0FirstBurstLength=4096\0\
         MaxRecvDataSegmentLength=4096\0MaxOutstandingR2T=2\0"
    );
    let mut b = [0u8; 48];
    b[0] = 0x43;
    b[1] = 0x87;
    b[8..14].copy_from_slice(&[0x80, 0, 0, 0, 0, 1]);
    let n = text.len() as u32;
    b[5..8].copy_from_slice(&n.to_be_bytes()[1..]);
    let mut v = b.to_vec();
    v.extend_from_slice(text.as_bytes());
    v.resize(v.len() + (4 - text.len() % 4) % 4, 0);
    v
}

/// Byte 0: bit 0 sends [`canned_login`] first, bit 1 talks to the CHAP
/// target. The rest is what the initiator sends, then it half-closes.
/// Returns how many bytes the target answered with.
pub fn connection(data: &[u8]) -> usize {
    exchange(data).len()
}

/// [`connection`], returning what the target answered.
pub fn exchange(data: &[u8]) -> Vec<u8> {
    let (&mode, rest) = data.split_first().unwrap_or((&0, &[]));
    let e = env(mode & 2 != 0);
    let mut input = if mode & 1 != 0 {
        canned_login()
    } else {
        Vec::new()
    };
    input.extend_from_slice(rest);
    // Held to the end: one exchange at a time per target, so that the
    // session count checked below is this exchange's alone (the unit tests
    // run exchanges from several threads).
    let listener = e.listener.lock().expect("listener lock");
    let mut client = TcpStream::connect(e.addr).expect("connect");
    let (server, _) = listener.accept().expect("accept");
    let target = e.target.clone();
    let addr = e.addr;
    let srv = thread::spawn(move || crate::conn::serve(&target, server, addr));
    let mut w = client.try_clone().expect("clone");
    let writer = thread::spawn(move || {
        // The target may hang up first: what it does with the rest does
        // not matter then.
        let _ = w.write_all(&input);
        let _ = w.shutdown(Shutdown::Write);
    });
    let mut out = Vec::new();
    let _ = client.read_to_end(&mut out);
    writer.join().expect("writer");
    srv.join().expect("connection thread panicked");
    assert_eq!(e.target.sessions(), 0, "a session outlived its connection");
    drop(listener);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The PDUs in `out` (no digests): (header, data).
    fn pdus(mut out: &[u8]) -> Vec<([u8; 48], Vec<u8>)> {
        let mut v = Vec::new();
        while out.len() >= 48 {
            let bhs: [u8; 48] = out[..48].try_into().unwrap();
            let n = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]) as usize;
            let end = 48 + bhs[4] as usize * 4 + n + (4 - n % 4) % 4;
            v.push((bhs, out[48..48 + n].to_vec()));
            out = &out[end..];
        }
        v
    }

    /// A write whose unsolicited burst ends (F) short of FirstBurstLength
    /// gets R2Ts for exactly the rest.
    #[test]
    fn short_unsolicited_burst_then_r2t() {
        let mut input = vec![1u8];
        let mut cmd = [0u8; 48];
        cmd[0] = 0x01;
        cmd[1] = 0x21; // W, not F: unsolicited Data-Out follows
        cmd[5..8].copy_from_slice(&[0, 2, 0]); // 512 bytes immediate
        cmd[16..20].copy_from_slice(&7u32.to_be_bytes());
        cmd[20..24].copy_from_slice(&4096u32.to_be_bytes());
        cmd[32] = 0x2a; // WRITE(10) of 8 blocks at LBA 0
        cmd[40] = 8;
        input.extend_from_slice(&cmd);
        input.extend_from_slice(&[0xaa; 512]);
        let mut d = [0u8; 48];
        d[0] = 0x05;
        d[1] = 0x80; // F: the unsolicited burst ends at 1024
        d[5..8].copy_from_slice(&[0, 2, 0]);
        d[16..20].copy_from_slice(&7u32.to_be_bytes());
        d[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
        d[40..44].copy_from_slice(&512u32.to_be_bytes());
        input.extend_from_slice(&d);
        input.extend_from_slice(&[0xbb; 512]);
        let got = pdus(&exchange(&input));
        assert_eq!(got[0].0[0], 0x23, "login response");
        assert_eq!(got[0].0[36..38], [0, 0], "login status");
        let r2t = &got[1].0;
        assert_eq!(r2t[0], 0x31, "R2T");
        let be = |at: usize| u32::from_be_bytes(r2t[at..at + 4].try_into().unwrap());
        // Offset 1024, 3072 bytes (under MaxBurstLength 16384).
        assert_eq!((be(16), be(40), be(44)), (7, 1024, 3072));
    }

    /// Replays the kept corpus (and checks that the canned login works).
    #[test]
    fn corpus_replays() {
        let mut login = vec![1u8];
        // A NOP-Out ping after the canned login gets a NOP-In back.
        let mut nop = [0u8; 48];
        nop[0] = 0x40;
        nop[1] = 0x80;
        nop[16..20].copy_from_slice(&5u32.to_be_bytes());
        nop[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
        login.extend_from_slice(&nop);
        let answered = connection(&login);
        // The login response (48 + text) and the NOP-In (48).
        assert!(answered > 96, "{answered}");
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/iscsi_pdu");
        let mut n = 0;
        for f in std::fs::read_dir(&dir).expect("fuzz/corpus/iscsi_pdu") {
            let data = std::fs::read(f.expect("entry").path()).expect("read");
            connection(&data);
            n += 1;
        }
        assert!(n > 0, "no corpus in {}", dir.display());
    }
}
