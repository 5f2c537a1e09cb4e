#![no_main]
//! Target `dns_message`: see `fuzzing::dns_message` (crates/fuzzing) for what it drives.

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::dns_message(data));
