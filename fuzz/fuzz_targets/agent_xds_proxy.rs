#![no_main]
//! Target `agent_xds_proxy`: see `fuzzing::agent_xds_proxy` (crates/fuzzing) for what it drives and the input's shape.

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzzing::agent_xds_proxy(data));
