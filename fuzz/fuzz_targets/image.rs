//! Arbitrary MANIFEST and segment bytes through the image reader
//! (`ramd_fuzz::image`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    ramd_fuzz::image(data);
});
