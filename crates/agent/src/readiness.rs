//! What the xDS proxy knows about Envoy's config, shared with the status server's
//! `/healthz/ready`: published on a `tokio::sync::watch` channel by the xDS proxy.

/// Envoy's xDS state as seen by the agent's xDS proxy.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct XdsStatus {
    /// Envoy ACKed a CDS response from pilot-discovery.
    pub cds_acked: bool,
    /// Envoy ACKed an LDS response.
    pub lds_acked: bool,
    /// The last NACK Envoy sent (type URL short name and Envoy's message), cleared by a later ACK of that type.
    pub last_nack: Option<String>,
    /// The upstream (pilot-discovery) stream is connected.
    pub upstream_connected: bool,
}

impl XdsStatus {
    /// Istio's rule: ready once the first CDS and LDS were accepted.
    pub fn config_received(&self) -> bool {
        self.cds_acked && self.lds_acked
    }
}
