#![no_main]
//! Target `admission_review`: see `fuzzing::admission_review` (crates/fuzzing) for what it drives.

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::admission_review(data));
