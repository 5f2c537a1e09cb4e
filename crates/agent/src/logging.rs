//! pilot-agent's Istio log scopes.

use monitoring::logging::Scopes;

pub const SCOPES: Scopes = &[
    ("xds", &["agent::xds_proxy"]),
    ("xdsproxy", &["agent::xds_proxy"]),
    ("envoy", &["agent::envoy"]),
    ("healthcheck", &["agent::status"]),
    ("status", &["agent::status"]),
    ("bootstrap", &["agent::bootstrap", "agent::config"]),
];

pub fn init(levels: &str, json: bool) -> Result<(), String> {
    monitoring::logging::init(levels, json, SCOPES)
}
