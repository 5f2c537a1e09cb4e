//! xDS generators: pure functions from (proxy, push index, watched names) to Envoy resources,
//! one module per type URL. No I/O.
//!
//! The crate exports its entry point only: [`generate`] answers one type URL for one proxy from a
//! `PushContext` and the [`PushCache`] of that push. The builders behind it stay private.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod authn;
mod authz;
mod cds;
#[cfg(test)]
mod deterministic_tests;
mod eds;
mod generate;
mod lds;
mod mtls;
mod names;
mod nds;
mod proxy_headers;
mod rds;
mod route;
mod sds;
#[cfg(test)]
mod testing;
mod tracing_config;
mod traffic_policy;
mod vhds;

pub use generate::{PushCache, generate, generate_with_vhds};
pub use sds::SdsMetrics;
