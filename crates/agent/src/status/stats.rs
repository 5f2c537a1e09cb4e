//! `/stats/prometheus` (and `/metrics`): Istio's merged scrape. The agent's own metrics, then
//! Envoy's `/stats/prometheus`, in the Prometheus text format (0.0.4). A failed Envoy scrape is
//! logged and counted, and the agent's metrics are still served.
//!
//! prometheus-client writes OpenMetrics; [`monitoring::istio_text`] turns that into the text format with
//! Istio's names (counters without the `_total` suffix OpenMetrics adds, no `# EOF`).

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use tokio::sync::OwnedSemaphorePermit;

use super::admin::{AdminError, EnvoyAdmin};

/// Prometheus' text exposition format, as Istio's `expfmt.FmtText`.
pub use monitoring::TEXT_CONTENT_TYPE;
/// Prometheus tells targets its scrape timeout in this header; Istio bounds the Envoy scrape by it.
const SCRAPE_TIMEOUT_HEADER: &str = "x-prometheus-scrape-timeout-seconds";
/// The Envoy scrape's bound when Prometheus sends no timeout.
const DEFAULT_SCRAPE_TIMEOUT: Duration = Duration::from_secs(10);

/// Istio's scrape metrics (`istio_agent_scrapes_total`, `istio_agent_scrape_failures_total{type}`
/// under the agent's `istio_agent` prefix). Unregistered counters (the default) still count.
#[derive(Clone, Debug, Default)]
pub struct ScrapeMetrics {
    scrapes: Counter,
    failures: Family<Vec<(&'static str, &'static str)>, Counter>,
}

impl ScrapeMetrics {
    /// Registers Istio's `istio_agent_scrapes_total` and `istio_agent_scrape_failures_total`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        // Istio's names end in `_total` already; OpenMetrics adds another, which
        // `monitoring::istio_text` strips again.
        registry.register(
            "istio_agent_scrapes_total",
            "The total number of scrapes",
            metrics.scrapes.clone(),
        );
        registry.register(
            "istio_agent_scrape_failures_total",
            "The total number of failed scrapes",
            metrics.failures.clone(),
        );
        metrics
    }

    pub(crate) fn scraped(&self) {
        self.scrapes.inc();
    }

    pub(crate) fn failed(&self, kind: &'static str) {
        self.failures.get_or_create(&vec![("type", kind)]).inc();
    }
}

/// How many scrapes stream at once; past it a scrape is answered 503 at once (and counted as
/// `istio_agent_scrape_failures_total{type="limit"}`). Prometheus scrapes a target once per interval.
pub const MAX_CONCURRENT_SCRAPES: usize = 4;

/// Serves one scrape: the agent's metrics, then Envoy's, streamed as Envoy sends them (Istio's
/// `io.Copy`): the agent holds a chunk at a time, never the whole body. `permit` (a scrape slot)
/// is held until the body is done or dropped.
pub(crate) async fn merged_scrape(
    admin: &EnvoyAdmin,
    registry: &Registry,
    metrics: &ScrapeMetrics,
    request_headers: &HeaderMap,
    permit: OwnedSemaphorePermit,
) -> Body {
    let (headers, timeout) = scrape_request(request_headers);
    let envoy = match admin.get_streaming("/stats/prometheus", timeout, headers).await {
        Ok(response) if response.status().is_success() => Some(response),
        Ok(response) => {
            tracing::error!(status = %response.status(), "failed scraping envoy metrics");
            metrics.failed("envoy");
            None
        }
        Err(err) => {
            tracing::error!(error = %err, "failed scraping envoy metrics");
            metrics.failed("envoy");
            None
        }
    };
    let mut openmetrics = String::new();
    if let Err(err) = prometheus_client::encoding::text::encode(&mut openmetrics, registry) {
        tracing::error!(error = %err, "failed scraping and writing agent metrics");
        metrics.failed("agent");
    }
    let agent = Bytes::from(monitoring::istio_text(&openmetrics));
    let Some(envoy) = envoy else {
        return Body::from(agent);
    };
    let state = Streaming {
        agent: Some(agent),
        envoy: Some(envoy),
        last: b'\n',
        metrics: metrics.clone(),
        permit: Some(permit),
    };
    Body::from_stream(futures::stream::unfold(state, Streaming::next))
}

/// The merged body being streamed: the agent's text, Envoy's chunks, a final newline if Envoy's
/// text lacks one.
struct Streaming {
    agent: Option<Bytes>,
    envoy: Option<reqwest::Response>,
    last: u8,
    metrics: ScrapeMetrics,
    /// The scrape slot, given back as soon as Envoy's body ends or fails.
    permit: Option<OwnedSemaphorePermit>,
}

impl Streaming {
    async fn next(mut self) -> Option<(Result<Bytes, AdminError>, Self)> {
        if let Some(agent) = self.agent.take() {
            if let Some(&last) = agent.last() {
                self.last = last;
            }
            return Some((Ok(agent), self));
        }
        let envoy = self.envoy.as_mut()?;
        loop {
            match EnvoyAdmin::chunk(envoy).await {
                Ok(Some(chunk)) if chunk.is_empty() => continue,
                Ok(Some(chunk)) => {
                    self.last = chunk[chunk.len() - 1];
                    return Some((Ok(chunk), self));
                }
                Ok(None) => {
                    self.envoy = None;
                    self.permit = None;
                    if self.last == b'\n' {
                        return None;
                    }
                    self.last = b'\n';
                    return Some((Ok(Bytes::from_static(b"\n")), self));
                }
                Err(err) => {
                    // Envoy stopped or the scrape timed out (a caller reading too slowly): the
                    // body is cut off, which the caller sees as a failed scrape.
                    tracing::error!(error = %err, "failed to scraping and writing envoy metrics");
                    self.metrics.failed("envoy");
                    self.envoy = None;
                    self.permit = None;
                    return Some((Err(err), self));
                }
            }
        }
    }
}

/// Istio passes Prometheus' `Accept`, `User-Agent` and scrape-timeout headers to Envoy, and bounds
/// the scrape by that timeout.
fn scrape_request(incoming: &HeaderMap) -> (HeaderMap, Duration) {
    let mut headers = HeaderMap::new();
    for name in ["accept", "user-agent", SCRAPE_TIMEOUT_HEADER] {
        if let Some(value) = incoming.get(name) {
            headers.insert(name, value.clone());
        }
    }
    let timeout = incoming
        .get(SCRAPE_TIMEOUT_HEADER)
        .and_then(|v: &HeaderValue| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .and_then(|secs| Duration::try_from_secs_f64(secs).ok())
        .filter(|d| !d.is_zero())
        .unwrap_or(DEFAULT_SCRAPE_TIMEOUT);
    (headers, timeout)
}

#[cfg(test)]
mod tests {
    use prometheus_client::metrics::gauge::Gauge;

    use super::*;

    #[test]
    fn openmetrics_becomes_istio_text() {
        let mut registry = Registry::default();
        let metrics = ScrapeMetrics::register(&mut registry);
        let connected: Gauge = Gauge::default();
        registry.register(
            "istio_agent_num_outgoing_requests",
            "Outgoing requests",
            connected.clone(),
        );
        metrics.scrapes.inc();
        metrics.failed("envoy");
        connected.set(3);
        let mut openmetrics = String::new();
        prometheus_client::encoding::text::encode(&mut openmetrics, &registry).unwrap();
        assert!(
            openmetrics.contains("istio_agent_scrapes_total_total 1"),
            "{openmetrics}"
        );

        let text = monitoring::istio_text(&openmetrics);
        assert!(text.contains("# TYPE istio_agent_scrapes_total counter\n"), "{text}");
        assert!(text.contains("\nistio_agent_scrapes_total 1\n"), "{text}");
        assert!(
            text.contains("\nistio_agent_scrape_failures_total{type=\"envoy\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("\nistio_agent_num_outgoing_requests 3\n"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
        assert!(!text.contains("_total_total"), "{text}");
    }

    #[test]
    fn scrape_timeout_header_bounds_the_envoy_scrape() {
        let mut incoming = HeaderMap::new();
        incoming.insert("accept", HeaderValue::from_static("text/plain"));
        incoming.insert("cookie", HeaderValue::from_static("x"));
        incoming.insert(SCRAPE_TIMEOUT_HEADER, HeaderValue::from_static("2.5"));
        let (headers, timeout) = scrape_request(&incoming);
        assert_eq!(timeout, Duration::from_millis(2500));
        assert_eq!(headers.get("accept").unwrap(), "text/plain");
        assert!(headers.get("cookie").is_none());

        incoming.insert(SCRAPE_TIMEOUT_HEADER, HeaderValue::from_static("soon"));
        assert_eq!(scrape_request(&incoming).1, DEFAULT_SCRAPE_TIMEOUT);
    }
}
