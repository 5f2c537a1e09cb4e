#![no_main]
//! Target `sds_request`: see `fuzzing::sds_request` (crates/fuzzing) for what it drives.

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::sds_request(data));
