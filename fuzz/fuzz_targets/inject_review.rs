#![no_main]
//! Target `inject_review`: see `fuzzing::inject_review` (crates/fuzzing) for what it drives.

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::inject_review(data));
