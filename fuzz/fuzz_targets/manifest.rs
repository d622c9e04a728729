//! Fuzz target: see `xfer::fuzzing::manifest`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xfer::fuzzing::manifest(data));
