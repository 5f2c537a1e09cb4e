#![no_main]
//! Target `xds_request`: see `fuzzing::xds_request` (crates/fuzzing) for what it drives and the input's shape.

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::xds_request(data));
