//! Raw client bytes through ramd's NBD transmission (`ramd_nbd::fuzz::transmission`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ramd_nbd::fuzz::transmission(data);
});
