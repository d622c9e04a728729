//! Fuzz target: see `xfer::fuzzing::cluster`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xfer::fuzzing::cluster(data));
