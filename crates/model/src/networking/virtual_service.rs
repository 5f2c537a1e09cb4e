//! `VirtualService`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{DurationString, Percent, PortSelector, StringMatch};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct VirtualService {
    pub hosts: Vec<String>,
    pub gateways: Vec<String>,
    pub http: Vec<HttpRoute>,
    pub tls: Vec<TlsRoute>,
    pub tcp: Vec<TcpRoute>,
    pub export_to: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpRoute {
    pub name: String,
    #[serde(rename = "match")]
    pub match_: Vec<HttpMatchRequest>,
    pub route: Vec<HttpRouteDestination>,
    pub redirect: Option<HttpRedirect>,
    pub direct_response: Option<HttpDirectResponse>,
    pub delegate: Option<Delegate>,
    pub rewrite: Option<HttpRewrite>,
    pub timeout: Option<DurationString>,
    pub retries: Option<HttpRetry>,
    pub fault: Option<HttpFaultInjection>,
    pub mirror: Option<Destination>,
    pub mirrors: Vec<HttpMirrorPolicy>,
    pub mirror_percentage: Option<Percent>,
    /// Deprecated integer percent of `mirrorPercentage` (Istio's CRD also names it `mirror_percent`).
    #[serde(alias = "mirror_percent")]
    pub mirror_percent: Option<u32>,
    pub cors_policy: Option<CorsPolicy>,
    pub headers: Option<Headers>,
    /// Removed from the API (WebSocket upgrades are always allowed); accepted and ignored, as the
    /// Kubernetes API server prunes it.
    pub websocket_upgrade: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpMatchRequest {
    pub name: String,
    pub uri: Option<StringMatch>,
    pub scheme: Option<StringMatch>,
    pub method: Option<StringMatch>,
    pub authority: Option<StringMatch>,
    pub headers: BTreeMap<String, StringMatch>,
    pub port: u32,
    pub source_labels: BTreeMap<String, String>,
    pub gateways: Vec<String>,
    pub query_params: BTreeMap<String, StringMatch>,
    pub ignore_uri_case: bool,
    pub without_headers: BTreeMap<String, StringMatch>,
    pub source_namespace: String,
    pub stat_prefix: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Destination {
    pub host: String,
    pub subset: String,
    pub port: Option<PortSelector>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpRouteDestination {
    pub destination: Destination,
    /// Relative weight; 0 with a single destination means 100.
    pub weight: i32,
    pub headers: Option<Headers>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RouteDestination {
    pub destination: Destination,
    pub weight: i32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Headers {
    pub request: Option<HeaderOperations>,
    pub response: Option<HeaderOperations>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HeaderOperations {
    pub set: BTreeMap<String, String>,
    pub add: BTreeMap<String, String>,
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpRedirect {
    pub uri: String,
    /// Replaces the matched prefix of the path (instead of `uri`, the whole path).
    pub prefix_rewrite: String,
    pub authority: String,
    /// Either a port number or `derivePort` (FROM_PROTOCOL_DEFAULT / FROM_REQUEST_PORT).
    pub port: Option<u32>,
    pub derive_port: Option<String>,
    pub scheme: String,
    /// HTTP status; 0 means 301.
    pub redirect_code: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpDirectResponse {
    pub status: u32,
    pub body: Option<HttpBody>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum HttpBody {
    String(String),
    /// Base64 in JSON.
    Bytes(String),
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Delegate {
    pub name: String,
    pub namespace: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpRewrite {
    pub uri: String,
    pub authority: String,
    pub uri_regex_rewrite: Option<RegexRewrite>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RegexRewrite {
    #[serde(rename = "match")]
    pub match_: String,
    pub rewrite: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpRetry {
    pub attempts: i32,
    pub per_try_timeout: Option<DurationString>,
    /// Envoy `retry_on` policies, comma separated; may include HTTP status codes.
    pub retry_on: String,
    pub retry_remote_localities: Option<bool>,
    /// Whether retries go to other hosts than the ones tried (Istio 1.26+); unset: yes, unless
    /// the destination hashes consistently.
    pub retry_ignore_previous_hosts: Option<bool>,
    /// The base interval of Envoy's exponential retry back-off (Istio 1.26+).
    pub backoff: Option<DurationString>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpFaultInjection {
    pub delay: Option<FaultDelay>,
    pub abort: Option<FaultAbort>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FaultDelay {
    pub fixed_delay: Option<DurationString>,
    pub exponential_delay: Option<DurationString>,
    pub percentage: Option<Percent>,
    /// Deprecated integer percent.
    pub percent: Option<i32>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct FaultAbort {
    pub http_status: Option<i32>,
    pub grpc_status: Option<String>,
    pub http2_error: Option<String>,
    pub percentage: Option<Percent>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct HttpMirrorPolicy {
    pub destination: Destination,
    pub percentage: Option<Percent>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct CorsPolicy {
    pub allow_origins: Vec<StringMatch>,
    /// Deprecated exact-match origins.
    pub allow_origin: Vec<String>,
    pub allow_methods: Vec<String>,
    pub allow_headers: Vec<String>,
    pub expose_headers: Vec<String>,
    pub max_age: Option<DurationString>,
    pub allow_credentials: Option<bool>,
    pub unmatched_preflights: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TlsRoute {
    #[serde(rename = "match")]
    pub match_: Vec<TlsMatchAttributes>,
    pub route: Vec<RouteDestination>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TlsMatchAttributes {
    pub sni_hosts: Vec<String>,
    pub destination_subnets: Vec<String>,
    pub port: u32,
    pub source_labels: BTreeMap<String, String>,
    pub gateways: Vec<String>,
    pub source_namespace: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct TcpRoute {
    #[serde(rename = "match")]
    pub match_: Vec<L4MatchAttributes>,
    pub route: Vec<RouteDestination>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct L4MatchAttributes {
    pub destination_subnets: Vec<String>,
    pub port: u32,
    pub source_subnet: String,
    pub source_labels: BTreeMap<String, String>,
    pub gateways: Vec<String>,
    pub source_namespace: String,
}

/// gRPC status names, indexed by code, as Istio's `grpc.SupportedGRPCStatus` (abort faults).
pub(crate) const GRPC_STATUS_NAMES: [&str; 17] = [
    "OK",
    "CANCELLED",
    "UNKNOWN",
    "INVALID_ARGUMENT",
    "DEADLINE_EXCEEDED",
    "NOT_FOUND",
    "ALREADY_EXISTS",
    "PERMISSION_DENIED",
    "RESOURCE_EXHAUSTED",
    "FAILED_PRECONDITION",
    "ABORTED",
    "OUT_OF_RANGE",
    "UNIMPLEMENTED",
    "INTERNAL",
    "UNAVAILABLE",
    "DATA_LOSS",
    "UNAUTHENTICATED",
];

/// The code of a gRPC status name (`UNAVAILABLE` -> 14).
pub fn grpc_status_code(name: &str) -> Option<u32> {
    GRPC_STATUS_NAMES.iter().position(|c| *c == name).map(|i| i as u32)
}
