//! Arbitrary CDBs and Data-Out through ramd's SCSI logical unit
//! (`ramd_iscsi::scsi::fuzz::commands`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ramd_iscsi::scsi::fuzz::commands(data);
});
