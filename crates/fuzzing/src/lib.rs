//! The bodies of the fuzz targets in `fuzz/` (cargo-fuzz), here so that the workspace's tests can
//! replay every input of their corpora (`fuzz/corpus/<target>`) and every crash found
//! (`fuzz/regressions/<target>`) on a stable toolchain, as regression tests.
//!
//! Each target takes arbitrary bytes and panics only on a bug: a panic anywhere (any thread), a
//! stream that does not end when its client goes away, or an answer that breaks the protocol.
#![warn(unreachable_pub)]

mod admission;
mod agent_proxy;
mod config;
mod dns;
mod inject;
mod input;
mod kube_object;
mod mesh;
mod sds;
pub mod seeds;
mod xds;

pub use admission::admission_review;
pub use agent_proxy::agent_xds_proxy;
pub use config::config;
pub use dns::dns_message;
pub use inject::inject_review;
pub use kube_object::kube_object;
pub use sds::sds_request;
pub use xds::xds_request;

/// A target's body: any bytes in, a panic only on a bug.
pub type Target = fn(&[u8]);

/// The targets, by the names `fuzz/fuzz_targets/*.rs` and the corpus directories use.
pub const TARGETS: &[(&str, Target)] = &[
    ("config", config),
    ("xds_request", xds_request),
    ("agent_xds_proxy", agent_xds_proxy),
    ("admission_review", admission_review),
    ("inject_review", inject_review),
    ("dns_message", dns_message),
    ("sds_request", sds_request),
    ("kube_object", kube_object),
];

/// Makes a panic on any thread (a spawned stream task included) abort the process, as libFuzzer
/// needs to see it; the tests replaying corpora use it too.
pub(crate) fn abort_on_panic() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            default(info);
            std::process::abort();
        }));
    });
}

/// The runtime a harness keeps for its whole life: one worker, so that its server tasks go on
/// between inputs; panics abort (see [`abort_on_panic`]).
pub(crate) fn harness_runtime() -> tokio::runtime::Runtime {
    abort_on_panic();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap_or_else(|e| panic!("tokio runtime: {e}"))
}
