//! The load generator: a synthetic mesh written as config files, N simulated sidecars that are
//! real ADS clients, scenarios that time how pilot-discovery serves them, the raw limit of the
//! same delivery without generation, a ramp to the memory or latency limit, and the report.
#![forbid(unsafe_code)]

pub mod churn;
pub mod kube;
pub mod mesh;
pub mod proxy;
pub mod ramp;
pub mod raw;
pub mod report;
pub mod scenario;
mod tally;
pub mod upstream;

pub use churn::ChurnOptions;
pub use mesh::MeshSpec;
pub use ramp::{RampOptions, RampStep};
pub use report::Report;
pub use scenario::{LoadOptions, Scenario, run};
