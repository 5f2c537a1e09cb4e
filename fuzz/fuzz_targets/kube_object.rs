#![no_main]
//! Target `kube_object`: see `fuzzing::kube_object` (crates/fuzzing) for what it drives.

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::kube_object(data));
