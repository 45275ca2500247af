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

/// [`canned_login`] with `extra` (`key=value\0` pairs) added to its text.
#[cfg(test)]
fn login_with(extra: &str) -> Vec<u8> {
    let mut v = canned_login();
    let n = u32::from_be_bytes([0, v[5], v[6], v[7]]) as usize;
    v.truncate(48 + n);
    v.extend_from_slice(extra.as_bytes());
    let n = (n + extra.len()) as u32;
    v[5..8].copy_from_slice(&n.to_be_bytes()[1..]);
    v.resize(v.len() + (4 - n as usize % 4) % 4, 0);
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

    /// A SCSI Command PDU for ITT `itt` with CmdSN `cmdsn` (EDTL `edtl`).
    fn command(flags: u8, itt: u32, cmdsn: u32, edtl: u32, cdb: &[u8]) -> [u8; 48] {
        let mut c = [0u8; 48];
        c[0] = 0x01;
        c[1] = flags;
        c[16..20].copy_from_slice(&itt.to_be_bytes());
        c[20..24].copy_from_slice(&edtl.to_be_bytes());
        c[24..28].copy_from_slice(&cmdsn.to_be_bytes());
        c[32..32 + cdb.len()].copy_from_slice(cdb);
        c
    }

    /// Unsolicited Data-Out for ITT `itt`: `data` at `offset`.
    fn data_out(fin: bool, itt: u32, data_sn: u32, offset: u32, data: &[u8]) -> Vec<u8> {
        let mut d = [0u8; 48];
        d[0] = 0x05;
        d[1] = if fin { 0x80 } else { 0 };
        d[5..8].copy_from_slice(&(data.len() as u32).to_be_bytes()[1..]);
        d[16..20].copy_from_slice(&itt.to_be_bytes());
        d[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
        d[36..40].copy_from_slice(&data_sn.to_be_bytes());
        d[40..44].copy_from_slice(&offset.to_be_bytes());
        let mut v = d.to_vec();
        v.extend_from_slice(data);
        v
    }

    /// Data-Out lands in its command at its offset: what a READ gives
    /// back is what was sent where.
    #[test]
    fn data_out_lands_at_its_offset() {
        // WRITE(10) of 8 blocks at LBA 1000, all of it unsolicited.
        let write = [0x2a, 0, 0, 0, 0x03, 0xe8, 0, 0, 8, 0];
        let read = [0x28, 0, 0, 0, 0x03, 0xe8, 0, 0, 8, 0];
        let mut input = vec![1u8];
        input.extend_from_slice(&command(0x21, 7, 0, 4096, &write));
        input.extend(data_out(false, 7, 0, 0, &[0xab; 2048]));
        input.extend(data_out(true, 7, 1, 2048, &[0xcd; 2048]));
        input.extend_from_slice(&command(0xc1, 8, 1, 4096, &read));
        let got = pdus(&exchange(&input));
        assert_eq!(got[0].0[36..38], [0, 0], "login status");
        // SCSI Response GOOD for the write.
        assert_eq!((got[1].0[0], got[1].0[3]), (0x21, 0), "{:02x?}", got[1].0);
        let data: Vec<u8> = got[2..]
            .iter()
            .filter(|(h, _)| h[0] == 0x25)
            .flat_map(|(_, d)| d.clone())
            .collect();
        assert_eq!(data.len(), 4096);
        assert!(data[..2048].iter().all(|b| *b == 0xab));
        assert!(data[2048..].iter().all(|b| *b == 0xcd));
    }

    /// Data-Out that does not fit its command (past the expected length, a
    /// DataSN out of order, or, DataPDUInOrder being Yes, an offset out of
    /// order: a gap, or an overlay that would leave a gap elsewhere) ends
    /// the connection, writing nothing: the command never runs and the
    /// NOP-Out after it gets no answer.
    #[test]
    fn misfit_data_out_ends_the_connection() {
        let write = [0x2a, 0, 0, 0, 0x03, 0xf0, 0, 0, 8, 0];
        let mut nop = [0u8; 48];
        nop[0] = 0x40;
        nop[1] = 0x80;
        nop[16..20].copy_from_slice(&9u32.to_be_bytes());
        nop[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
        let first = || data_out(false, 7, 0, 0, &[0xdd; 2048]);
        for bad in [
            data_out(true, 7, 0, 4000, &[0xee; 512]),
            data_out(true, 7, 0, u32::MAX - 3, &[0xee; 512]),
            data_out(true, 7, 1, 0, &[0xee; 512]),
            data_out(true, 7, 0, 2048, &[0xee; 2048]),
            [first(), data_out(true, 7, 1, 0, &[0xee; 2048])].concat(),
            [first(), data_out(true, 7, 1, 1024, &[0xee; 2048])].concat(),
        ] {
            let mut input = vec![1u8];
            input.extend_from_slice(&command(0x21, 7, 0, 4096, &write));
            input.extend(bad);
            input.extend_from_slice(&nop);
            let got = pdus(&exchange(&input));
            assert_eq!(got.len(), 1, "only the login response: {got:02x?}");
            assert_eq!(got[0].0[0], 0x23);
        }
    }

    /// With DataDigest=CRC32C: Data-Out whose digest is wrong is rejected
    /// (reason 02h) and its command is lost (later Data-Out for it is
    /// dropped), while the connection goes on; with the right digest the
    /// data lands where it was sent.
    #[test]
    fn data_out_digests() {
        // The data digest covers the data and its padding, little-endian.
        let with_digest = |mut pdu: Vec<u8>, wrong: bool| {
            let crc = crc32c::crc32c(&pdu[48..]) ^ u32::from(wrong);
            pdu.extend_from_slice(&crc.to_le_bytes());
            pdu
        };
        let write = [0x2a, 0, 0, 0, 0x03, 0xf2, 0, 0, 1, 0];
        let read = [0x28, 0, 0, 0, 0x03, 0xf2, 0, 0, 1, 0];
        let mut input = vec![0u8];
        input.extend(login_with("DataDigest=CRC32C\0"));
        input.extend_from_slice(&command(0x21, 7, 0, 512, &write));
        input.extend(with_digest(data_out(true, 7, 0, 0, &[0x11; 512]), true));
        let mut nop = [0u8; 48];
        nop[0] = 0x00;
        nop[1] = 0x80;
        nop[16..20].copy_from_slice(&9u32.to_be_bytes());
        nop[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
        nop[24..28].copy_from_slice(&1u32.to_be_bytes());
        input.extend_from_slice(&nop);
        // Sound this time, but for a command that is gone: dropped.
        input.extend(with_digest(data_out(true, 7, 0, 0, &[0x11; 512]), false));
        input.extend_from_slice(&command(0x21, 10, 2, 512, &write));
        input.extend(with_digest(data_out(true, 10, 0, 0, &[0x22; 512]), false));
        input.extend_from_slice(&command(0xc1, 11, 3, 512, &read));
        let out = exchange(&input);
        // The login response has no digest; every data segment after it has.
        let n = u32::from_be_bytes([0, out[5], out[6], out[7]]) as usize;
        let (login, mut rest) = out.split_at(48 + n + (4 - n % 4) % 4);
        let mut got = pdus(login);
        while rest.len() >= 48 {
            let bhs: [u8; 48] = rest[..48].try_into().unwrap();
            let n = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]) as usize;
            let digest = if n > 0 { 4 } else { 0 };
            got.push((bhs, rest[48..48 + n].to_vec()));
            rest = &rest[48 + n + (4 - n % 4) % 4 + digest..];
        }
        assert_eq!(got[0].0[0], 0x23, "login response");
        assert_eq!(got[0].0[36..38], [0, 0], "login status");
        let ops: Vec<u8> = got[1..].iter().map(|(h, _)| h[0]).collect();
        // Reject, NOP-In, the second write's response, the read's Data-In.
        assert_eq!(ops, [0x3f, 0x20, 0x21, 0x25], "{got:02x?}");
        assert_eq!(got[1].0[2], 0x02, "reject reason: data digest error");
        // A Reject carries the header it refuses.
        assert_eq!(got[1].1, data_out(true, 7, 0, 0, &[0x11; 512])[..48]);
        assert_eq!(got[3].0[3], 0, "second write GOOD");
        assert_eq!(got[4].1, vec![0x22; 512]);
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
