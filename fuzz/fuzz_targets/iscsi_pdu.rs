//! Arbitrary initiator bytes through one iSCSI connection: PDU reader,
//! login state machine (CHAP included), full feature phase
//! (`ramd_iscsi::fuzz::connection`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ramd_iscsi::fuzz::connection(data);
});
