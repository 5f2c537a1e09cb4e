//! End-to-end tests with real Envoy live in tests/*.rs
