//! xDS generators: pure functions from (proxy, push index, watched names) to Envoy resources,
//! one module per type URL. No I/O.
#![forbid(unsafe_code)]

pub mod cds;
pub mod eds;
pub mod generate;
pub mod lds;
pub mod names;
pub mod rds;
pub mod route;
#[cfg(test)]
mod testing;
pub mod traffic_policy;

pub use generate::{GenerateError, GeneratedResource, generate};
