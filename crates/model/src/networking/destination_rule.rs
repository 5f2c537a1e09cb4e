//! `DestinationRule`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{DurationString, PortSelector, WorkloadSelector};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct DestinationRule {
    pub host: String,
    pub traffic_policy: Option<TrafficPolicy>,
    pub subsets: Vec<Subset>,
    pub export_to: Vec<String>,
    pub workload_selector: Option<WorkloadSelector>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TrafficPolicy {
    pub load_balancer: Option<LoadBalancerSettings>,
    pub connection_pool: Option<ConnectionPoolSettings>,
    pub outlier_detection: Option<OutlierDetection>,
    pub tls: Option<ClientTlsSettings>,
    pub port_level_settings: Vec<PortTrafficPolicy>,
    pub tunnel: Option<serde_json::Value>,
    pub proxy_protocol: Option<serde_json::Value>,
    pub retry_budget: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PortTrafficPolicy {
    pub port: Option<PortSelector>,
    pub load_balancer: Option<LoadBalancerSettings>,
    pub connection_pool: Option<ConnectionPoolSettings>,
    pub outlier_detection: Option<OutlierDetection>,
    pub tls: Option<ClientTlsSettings>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Subset {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub traffic_policy: Option<TrafficPolicy>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LoadBalancerSettings {
    /// UNSPECIFIED, RANDOM, PASSTHROUGH, ROUND_ROBIN, LEAST_REQUEST, LEAST_CONN.
    pub simple: Option<String>,
    pub consistent_hash: Option<ConsistentHashLb>,
    pub locality_lb_setting: Option<LocalityLbSetting>,
    pub warmup_duration_secs: Option<DurationString>,
    pub warmup: Option<WarmupConfiguration>,
    /// Envoy's zone-aware routing within the proxy's region (Istio 1.29+).
    pub zone_aware_lb_setting: Option<ZoneAwareLbSetting>,
    /// Client-side weighted round robin from backend utilization reports: accepted and, as by
    /// istiod, not acted on.
    pub backend_utilization: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WarmupConfiguration {
    pub duration: Option<DurationString>,
    pub minimum_percent: Option<f64>,
    pub aggression: Option<f64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConsistentHashLb {
    pub http_header_name: Option<String>,
    pub http_cookie: Option<HttpCookie>,
    pub use_source_ip: Option<bool>,
    pub http_query_parameter_name: Option<String>,
    pub ring_hash: Option<RingHash>,
    pub maglev: Option<MagLev>,
    /// Deprecated: ring hash minimum ring size.
    pub minimum_ring_size: Option<u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpCookie {
    pub name: String,
    pub path: String,
    pub ttl: Option<DurationString>,
    pub attributes: Vec<serde_json::Value>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RingHash {
    pub minimum_ring_size: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MagLev {
    pub table_size: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LocalityLbSetting {
    pub distribute: Vec<LocalityDistribute>,
    pub failover: Vec<LocalityFailover>,
    pub failover_priority: Vec<String>,
    pub enabled: Option<bool>,
}

/// Istio's `ZoneAwareLoadBalancerSetting`: endpoints of the proxy's region first (Envoy balances
/// zones within it), then the `failover` region, then the rest; `enabled: false` turns Envoy's
/// zone-aware routing off.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ZoneAwareLbSetting {
    pub enabled: Option<bool>,
    pub failover: Vec<LocalityFailover>,
    pub failover_priority: Vec<String>,
    pub min_cluster_size: Option<u32>,
}

impl ZoneAwareLbSetting {
    /// Istio's `routingEnabled`: on unless `enabled: false`.
    pub fn routing_enabled(&self) -> bool {
        self.enabled != Some(false)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LocalityDistribute {
    pub from: String,
    pub to: BTreeMap<String, u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LocalityFailover {
    pub from: String,
    pub to: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ConnectionPoolSettings {
    pub tcp: Option<TcpSettings>,
    pub http: Option<HttpSettings>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TcpSettings {
    pub max_connections: Option<i32>,
    pub connect_timeout: Option<DurationString>,
    pub tcp_keepalive: Option<TcpKeepalive>,
    pub max_connection_duration: Option<DurationString>,
    pub idle_timeout: Option<DurationString>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TcpKeepalive {
    pub probes: Option<u32>,
    pub time: Option<DurationString>,
    pub interval: Option<DurationString>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpSettings {
    pub http1_max_pending_requests: Option<i32>,
    pub http2_max_requests: Option<i32>,
    pub max_requests_per_connection: Option<i32>,
    pub max_retries: Option<i32>,
    pub idle_timeout: Option<DurationString>,
    /// DEFAULT, DO_NOT_UPGRADE, UPGRADE.
    pub h2_upgrade_policy: Option<String>,
    pub use_client_protocol: Option<bool>,
    pub max_concurrent_streams: Option<i32>,
    pub http2_keep_alive: Option<Http2KeepAlive>,
}

/// HTTP/2 PING keepalive of upstream connections.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Http2KeepAlive {
    pub interval: Option<DurationString>,
    pub timeout: Option<DurationString>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OutlierDetection {
    pub split_external_local_origin_errors: Option<bool>,
    pub consecutive_local_origin_failures: Option<u32>,
    pub consecutive_gateway_errors: Option<u32>,
    pub consecutive_5xx_errors: Option<u32>,
    /// Deprecated alias of consecutive5xxErrors.
    pub consecutive_errors: Option<i32>,
    pub interval: Option<DurationString>,
    pub base_ejection_time: Option<DurationString>,
    pub max_ejection_percent: Option<i32>,
    pub min_health_percent: Option<i32>,
    /// HTTP status codes outlier detection counts as errors (instead of 5xx).
    pub outlier_detection_http_error_codes: Vec<u32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ClientTlsSettings {
    /// DISABLE, SIMPLE, MUTUAL, ISTIO_MUTUAL.
    pub mode: Option<String>,
    pub client_certificate: Option<String>,
    pub private_key: Option<String>,
    pub ca_certificates: Option<String>,
    pub credential_name: Option<String>,
    pub subject_alt_names: Vec<String>,
    pub sni: Option<String>,
    pub insecure_skip_verify: Option<bool>,
    pub ca_crl: Option<String>,
}
