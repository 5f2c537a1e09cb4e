//! The xDS proxy's Prometheus metrics, named as Istio's agent names them
//! (`pkg/istio-agent/metrics`), with the `istio_agent_` prefix its status server adds.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// How a stream ended: `cancelled` (an expected close) or `error`, Istio's `type` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TerminationLabel {
    pub r#type: &'static str,
}

/// Label value of an expected close (EOF, cancellation, deadline).
pub(super) const CANCELLED: &str = "cancelled";
/// Label value of an unexpected close.
pub(super) const ERROR: &str = "error";

/// Counters of the xDS proxy; cheap to clone (each counter is an `Arc`).
#[derive(Clone, Debug, Default)]
pub struct XdsProxyMetrics {
    /// Requests sent upstream (from Envoy, plus the agent's own ACKs and subscriptions).
    pub requests: Counter,
    /// Responses received from upstream.
    pub responses: Counter,
    /// Failed attempts to connect to pilot-discovery.
    pub istiod_connection_failures: Counter,
    /// Upstream streams that ended, by `type`.
    pub istiod_connection_terminations: Family<TerminationLabel, Counter>,
    /// Envoy streams that ended, by `type`.
    pub envoy_connection_terminations: Family<TerminationLabel, Counter>,
}

impl XdsProxyMetrics {
    /// Creates the counters and registers them into `registry`.
    pub fn register(registry: &mut Registry) -> XdsProxyMetrics {
        let m = XdsProxyMetrics::default();
        registry.register(
            "istio_agent_xds_proxy_requests",
            "The total number of Xds Proxy Requests",
            m.requests.clone(),
        );
        registry.register(
            "istio_agent_xds_proxy_responses",
            "The total number of Xds Proxy Responses",
            m.responses.clone(),
        );
        registry.register(
            "istio_agent_istiod_connection_failures",
            "The total number of connection failures to Istiod",
            m.istiod_connection_failures.clone(),
        );
        registry.register(
            "istio_agent_istiod_connection_terminations",
            "The total number of connection errors to Istiod",
            m.istiod_connection_terminations.clone(),
        );
        registry.register(
            "istio_agent_envoy_connection_terminations",
            "The total number of connection errors from envoy",
            m.envoy_connection_terminations.clone(),
        );
        m
    }

    pub(crate) fn istiod_terminated(&self, kind: &'static str) {
        self.istiod_connection_terminations
            .get_or_create(&TerminationLabel { r#type: kind })
            .inc();
    }

    pub(crate) fn envoy_terminated(&self, kind: &'static str) {
        self.envoy_connection_terminations
            .get_or_create(&TerminationLabel { r#type: kind })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::encoding::text::encode;

    #[test]
    fn registers_istio_agent_names() {
        let mut registry = Registry::default();
        let m = XdsProxyMetrics::register(&mut registry);
        m.requests.inc();
        m.responses.inc_by(2);
        m.istiod_connection_failures.inc();
        m.istiod_terminated(ERROR);
        m.envoy_terminated(CANCELLED);
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        assert!(text.contains("istio_agent_xds_proxy_requests_total 1\n"), "{text}");
        assert!(text.contains("istio_agent_xds_proxy_responses_total 2\n"), "{text}");
        assert!(
            text.contains("istio_agent_istiod_connection_failures_total 1\n"),
            "{text}"
        );
        assert!(
            text.contains("istio_agent_istiod_connection_terminations_total{type=\"error\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("istio_agent_envoy_connection_terminations_total{type=\"cancelled\"} 1\n"),
            "{text}"
        );
    }
}
