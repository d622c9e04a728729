//! Fuzz target: see `xfer::fuzzing::wire`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xfer::fuzzing::wire(data));
