//! The DNS proxy's metrics, as Istio's agent names them (`pkg/dns/client/monitoring.go`), plus a
//! count of the packets dropped as malformed and of the queries refused past the forward limit.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug)]
pub struct DnsMetrics {
    pub requests: Counter,
    pub upstream_requests: Counter,
    pub upstream_failures: Counter,
    pub upstream_duration: Histogram,
    pub malformed: Counter,
    /// Queries answered SERVFAIL because `MAX_FORWARDS_IN_FLIGHT` were forwarded already.
    pub forward_limit: Counter,
}

impl Default for DnsMetrics {
    fn default() -> DnsMetrics {
        DnsMetrics {
            requests: Counter::default(),
            upstream_requests: Counter::default(),
            upstream_failures: Counter::default(),
            upstream_duration: Histogram::new([0.001, 0.005, 0.01, 0.1, 1.0, 5.0]),
            malformed: Counter::default(),
            forward_limit: Counter::default(),
        }
    }
}

impl DnsMetrics {
    /// Registers Istio's names; they end in `_total` already, and the merged scrape strips the
    /// second `_total` OpenMetrics adds (see `status::stats`).
    pub fn register(registry: &mut Registry) -> DnsMetrics {
        let m = DnsMetrics::default();
        registry.register(
            "istio_agent_dns_requests_total",
            "Total number of DNS requests.",
            m.requests.clone(),
        );
        registry.register(
            "istio_agent_dns_upstream_requests_total",
            "Total number of DNS requests forwarded to upstream.",
            m.upstream_requests.clone(),
        );
        registry.register(
            "istio_agent_dns_upstream_failures_total",
            "Total number of DNS failures.",
            m.upstream_failures.clone(),
        );
        registry.register(
            "istio_agent_dns_upstream_request_duration_seconds",
            "Total time in seconds Istio takes to get DNS response from upstream.",
            m.upstream_duration.clone(),
        );
        registry.register(
            "istio_agent_dns_malformed_requests_total",
            "DNS packets dropped because they did not parse.",
            m.malformed.clone(),
        );
        registry.register(
            "istio_agent_dns_forward_limit_total",
            "DNS queries answered SERVFAIL because too many queries were forwarded already.",
            m.forward_limit.clone(),
        );
        m
    }
}
