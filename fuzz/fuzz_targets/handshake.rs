//! Raw client bytes through ramd's NBD handshake (`ramd_nbd::fuzz::handshake`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ramd_nbd::fuzz::handshake(data);
});
