//! The load generator: a synthetic mesh written as config files, N simulated sidecars that are
//! real ADS clients, scenarios that time how pilot-discovery serves them, the raw limit of the
//! same delivery without generation, a ramp to the memory or latency limit, and the report.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

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

/// Turns transparent huge pages off for the load generator (and what it starts), as
/// pilot-discovery does for itself: mimalloc asks the kernel for huge pages, and zeroing them
/// took 44 % of pilot-discovery's CPU in a push before it turned them off (docs/perf.md).
pub fn disable_transparent_huge_pages() {
    if let Err(e) = nix::sys::prctl::set_thp_disable(true) {
        eprintln!("cannot turn transparent huge pages off (prctl PR_SET_THP_DISABLE): {e}");
    }
}
