//! Fuzz target: see `xfer::fuzzing::hub_tree`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| xfer::fuzzing::hub_tree(data));
