//! `pilot_consul_errors{type}`: what went wrong reading the Consul catalog. Istio had no metric
//! for its Consul registry; the name follows its `pilot_k8s_watch_errors`. `type` is one of
//! `unreachable`, `timeout`, `status` (an HTTP status other than 200), `too_large`, `body`,
//! `malformed` (not the JSON the API documents, or a bad `X-Consul-Index`), and, for what the
//! catalog holds but cannot be served, `invalid_instance` and `invalid_service` (counted once
//! when first seen).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub(crate) struct ErrorLabels {
    pub(crate) r#type: String,
}

/// The registry's metrics; clones share the counters.
#[derive(Clone, Debug, Default)]
pub struct ConsulMetrics {
    errors: Family<ErrorLabels, Counter>,
}

impl ConsulMetrics {
    pub fn register(registry: &mut Registry) -> ConsulMetrics {
        let m = ConsulMetrics::default();
        registry.register(
            "pilot_consul_errors",
            "Reads of the Consul catalog that failed, and catalog entries that cannot be served, by type.",
            m.errors.clone(),
        );
        m
    }

    pub(crate) fn error(&self, kind: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                r#type: kind.to_owned(),
            })
            .inc();
    }

    /// The count of one type (for tests and the debug pages).
    pub fn errors(&self, kind: &str) -> u64 {
        self.errors
            .get_or_create(&ErrorLabels {
                r#type: kind.to_owned(),
            })
            .get()
    }
}
