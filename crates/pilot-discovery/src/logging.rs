//! pilot-discovery's Istio log scopes.

use monitoring::logging::Scopes;

pub const SCOPES: Scopes = &[
    ("ads", &["xds_server"]),
    ("xds", &["xds_server"]),
    ("model", &["model", "push_index", "registry"]),
    ("config", &["config_sources"]),
    ("networking", &["generators"]),
];

pub fn init(levels: &str, json: bool) -> Result<(), String> {
    monitoring::logging::init(levels, json, SCOPES)
}
