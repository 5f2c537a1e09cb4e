#![no_main]
//! Target `config`: see `fuzzing::config` (crates/fuzzing) for what it drives and the input's shape.

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::config(data));
