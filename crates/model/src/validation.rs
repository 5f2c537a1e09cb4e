//! Validation of Istio config as Istio's `pkg/config/validation`: one module per kind, each
//! returning every problem found as `field.path: reason` strings.

mod authorization;
mod common;
mod destination_rule;
mod gateway;
mod headers;
pub(crate) mod hosts;
mod http_policy;
mod http_route;
mod load_balancer;
mod mesh;
mod peer_authentication;
mod request_authentication;
mod service_entry;
mod sidecar;
mod virtual_service;
mod workload_entry;

pub use authorization::{MATCH_ANY_TEMPLATE, MATCH_ONE_TEMPLATE, contains_path_template, parse_cidr};
pub use common::validate_regex;
pub use mesh::mesh_config_errors;
pub use request_authentication::parse_jwks_uri;

use crate::config::{Config, ConfigSpec};
use common::Errors;

/// Annotations Istio reserves for resources it generates itself; users may not set them.
const RESERVED_ANNOTATIONS: [&str; 3] = [
    "internal.istio.io/webhook-always-reject",
    "internal.istio.io/parent-namespace",
    "internal.istio.io/parents",
];

/// Only AuthorizationPolicy supports dry-run.
const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";

/// Every problem with a config, empty when valid.
pub fn validate(config: &Config) -> Vec<String> {
    let mut errs = Errors::default();
    for a in RESERVED_ANNOTATIONS {
        if config.meta.annotations.contains_key(a) {
            errs.add(
                "metadata.annotations",
                format!("{a:?} annotation found, this may not be set by users"),
            );
        }
    }
    match &config.spec {
        ConfigSpec::VirtualService(vs) => virtual_service::check_virtual_service(&mut errs, config, vs),
        ConfigSpec::DestinationRule(dr) => destination_rule::check_destination_rule(&mut errs, config, dr),
        ConfigSpec::Gateway(gw) => gateway::check_gateway(&mut errs, config, gw),
        ConfigSpec::ServiceEntry(se) => service_entry::check_service_entry(&mut errs, config, se),
        ConfigSpec::WorkloadEntry(we) => workload_entry::check_workload_entry(&mut errs, "spec", we),
        ConfigSpec::Sidecar(sc) => sidecar::check_sidecar(&mut errs, sc),
        ConfigSpec::PeerAuthentication(pa) => peer_authentication::check_peer_authentication(&mut errs, pa),
        ConfigSpec::AuthorizationPolicy(ap) => authorization::check_authorization_policy(&mut errs, ap),
        ConfigSpec::RequestAuthentication(ra) => request_authentication::check_request_authentication(&mut errs, ra),
        ConfigSpec::Unsupported(_) | ConfigSpec::Kubernetes(_) => {}
    }
    if !matches!(
        config.spec,
        ConfigSpec::Unsupported(_) | ConfigSpec::Kubernetes(_) | ConfigSpec::AuthorizationPolicy(_)
    ) && config.meta.annotations.contains_key(DRY_RUN_ANNOTATION)
    {
        errs.add(
            "metadata.annotations",
            format!(
                "{} has unsupported annotation {DRY_RUN_ANNOTATION}, please remove the annotation",
                config.kind
            ),
        );
    }
    errs.into_vec()
}

/// RFC 1123 label: lowercase alphanumerics and '-', at most 63, starting and ending alphanumeric.
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: dot-separated labels, at most 253.
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

#[cfg(test)]
mod corpus_tests;
#[cfg(test)]
mod crd_schema_tests;

/// The problems `parse_config` finds in a `networking.istio.io/v1` resource named `test` in
/// namespace `ns`; panics when the spec does not decode.
#[cfg(test)]
pub(crate) fn errors_of(kind: &str, spec: serde_json::Value) -> Vec<String> {
    errors_with_meta(kind, serde_json::json!({"name": "test", "namespace": "ns"}), spec)
}

#[cfg(test)]
pub(crate) fn errors_with_meta(kind: &str, metadata: serde_json::Value, spec: serde_json::Value) -> Vec<String> {
    let group = match kind {
        "PeerAuthentication" | "AuthorizationPolicy" | "RequestAuthentication" => "security.istio.io",
        _ => "networking.istio.io",
    };
    let doc =
        serde_json::json!({"apiVersion": format!("{group}/v1"), "kind": kind, "metadata": metadata, "spec": spec});
    match crate::config::parse_config(doc, "default") {
        Ok(_) => Vec::new(),
        Err(crate::config::ConfigError::Invalid { errors, .. }) => errors,
        Err(e) => panic!("not a validation error: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reserved_annotations_are_rejected() {
        let spec = json!({"host": "reviews"});
        let meta = |k: &str| json!({"name": "r", "namespace": "ns", "annotations": {k: "x"}});
        assert!(errors_with_meta("DestinationRule", meta("example.com/ok"), spec.clone()).is_empty());
        let errs = errors_with_meta("DestinationRule", meta("internal.istio.io/parents"), spec.clone());
        assert!(
            errs[0].starts_with("metadata.annotations: \"internal.istio.io/parents\" annotation found"),
            "{errs:?}"
        );
        let errs = errors_with_meta("DestinationRule", meta("istio.io/dry-run"), spec);
        assert!(errs[0].contains("unsupported annotation istio.io/dry-run"), "{errs:?}");
    }
}
