//! Fuzzing entry point for the logical unit: arbitrary CDBs and Data-Out
//! from a few nexuses, against small in-memory stores. The libFuzzer
//! target `fuzz/fuzz_targets/scsi_cdb.rs` calls [`commands`]; the unit test
//! below replays the kept corpus (`fuzz/corpus/scsi_cdb/`).
//!
//! A harness must not panic or hang on any input; the store's own
//! `debug_assert`s and range checks are part of the oracle, as are the
//! checks on each reply below.

use std::sync::{Arc, OnceLock};

use ramd_store::{Store, StoreConfig};

use super::{status, Lun, LunConfig, Nexus, MAX_TRANSFER_BYTES};

/// Size of the fuzzed disks: small, so that most LBAs are in reach.
pub const DISK_SIZE: u64 = 1 << 20;

/// A roomy disk and one whose memory budget runs out (ENOSPC paths),
/// shared by every input of a run (a store is costly to build; what inputs
/// leave in it only varies the starting state).
fn stores() -> &'static [Arc<Store>; 2] {
    static STORES: OnceLock<[Arc<Store>; 2]> = OnceLock::new();
    STORES.get_or_init(|| {
        let store = |max_memory| {
            let mut cfg = StoreConfig::new(DISK_SIZE);
            cfg.host_reserve = 0;
            cfg.warm_pool = 0;
            cfg.max_memory = max_memory;
            Arc::new(Store::new(cfg).expect("a 1 MiB store"))
        };
        [store(None), store(Some(256 << 10))]
    })
}

/// Runs a stream of commands on a fresh logical unit (fresh reservations).
/// Byte 0 picks the unit: bit 0 4096-byte blocks (else 512), bit 1
/// read-only, bit 2 the small-budget store, bit 3 a write cache. Then each
/// command is: a head byte (bits 4-0 the CDB length, bits 7-6 the nexus,
/// 0-2, or 3 for a LUN RESET and then nexus 0), the CDB, the Data-Out
/// length (two bytes, big-endian), the Data-Out. Every seventh command a
/// nexus's session ends. Returns how many commands ran.
pub fn commands(data: &[u8]) -> usize {
    let (&mode, mut rest) = data.split_first().unwrap_or((&0, &[]));
    let cfg = LunConfig {
        block_size: if mode & 1 != 0 { 4096 } else { 512 },
        read_only: mode & 2 != 0,
        id: 7,
        serial: "fuzz".into(),
        product: "fuzz disk".into(),
        write_cache: mode & 8 != 0,
    };
    let store = stores()[usize::from(mode & 4 != 0)].clone();
    let lun = Lun::new(store, cfg);
    let nexuses: Vec<Nexus> = (0..3)
        .map(|i| Nexus {
            initiator_port: format!("iqn.2026-11.fuzz:{i},i,0x00023d00000{i}"),
            target_port_id: 1,
        })
        .collect();
    let mut ran = 0;
    while let Some((&head, r)) = rest.split_first() {
        let cdb_len = usize::from(head & 0x1F).min(r.len());
        let (cdb, r) = r.split_at(cdb_len);
        let (out_len, r) = match r {
            [hi, lo, r @ ..] => (usize::from(u16::from_be_bytes([*hi, *lo])), r),
            _ => (0, &[][..]),
        };
        let (data_out, r) = r.split_at(out_len.min(r.len()));
        rest = r;
        let who = match head >> 6 {
            3 => {
                lun.reset();
                0
            }
            n => usize::from(n),
        };
        let reply = lun.execute(&nexuses[who], cdb, data_out);
        match reply.status {
            status::CHECK_CONDITION => {
                assert_eq!(reply.sense.len(), 18);
                assert_eq!(reply.sense[0] & 0x7F, 0x70);
                assert!(reply.data_in.is_empty());
            }
            status::GOOD | status::RESERVATION_CONFLICT => assert!(reply.sense.is_empty()),
            s => panic!("status {s:#x}"),
        }
        assert!(reply.data_in.len() as u64 <= MAX_TRANSFER_BYTES);
        // Never done with less Data-Out than the CDB called for, but by
        // WRITE and WRITE AND VERIFY (which write what came).
        let partial_ok = matches!(
            cdb.first(),
            Some(0x0A | 0x2A | 0xAA | 0x8A | 0x2E | 0xAE | 0x8E)
        );
        if reply.status == status::GOOD && !partial_ok {
            assert!(reply.expected_out <= data_out.len(), "{cdb:02x?}");
        }
        ran += 1;
        if ran % 7 == 0 {
            lun.nexus_lost(&nexuses[ran % 3]);
        }
    }
    ran
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kept corpus, replayed (a regression test for every input a
    /// fuzzing run found interesting).
    #[test]
    fn replay_corpus() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus/scsi_cdb");
        let mut n = 0;
        for e in std::fs::read_dir(dir).expect("the kept scsi_cdb corpus") {
            let data = std::fs::read(e.unwrap().path()).unwrap();
            commands(&data);
            n += 1;
        }
        assert!(n > 0, "empty corpus in {dir}");
    }

    #[test]
    fn a_write_then_a_read() {
        // 512-byte blocks; WRITE(10) LBA 1, one block, 512 bytes of 0xAB;
        // READ(10) of it from another nexus.
        let mut input = vec![0x00];
        input.extend_from_slice(&[10, 0x2A, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0x02, 0x00]);
        input.extend_from_slice(&[0xAB; 512]);
        input.extend_from_slice(&[0x40 | 10, 0x28, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0]);
        assert_eq!(commands(&input), 2);
        assert_eq!(commands(&[]), 0);
        assert_eq!(commands(&[0x0F, 0xFF]), 1);
    }
}
