//! The load generator: a synthetic mesh written as config files, N simulated sidecars that are
//! real ADS clients, scenarios that time how pilot-discovery serves them, and the report.
#![forbid(unsafe_code)]

pub mod mesh;
pub mod proxy;
pub mod report;
pub mod scenario;

pub use mesh::MeshSpec;
pub use report::Report;
pub use scenario::{LoadOptions, Scenario, run};
