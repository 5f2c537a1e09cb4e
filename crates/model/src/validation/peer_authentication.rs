//! Istio's `ValidatePeerAuthentication` and the CRD's constraints.

use super::common::{Errors, check_selector};
use crate::security::PeerAuthentication;

pub(crate) fn check_peer_authentication(errs: &mut Errors, pa: &PeerAuthentication) {
    let labels = pa.selector.as_ref().map(|s| &s.match_labels);
    if let Some(ports) = &pa.port_level_mtls {
        if ports.is_empty() {
            errs.add(
                "spec.portLevelMtls",
                "spec.portLevelMtls in body should have at least 1 properties",
            );
        }
        if labels.is_none_or(|l| l.is_empty()) {
            errs.add("spec.portLevelMtls", "portLevelMtls requires selector");
        }
        for port in ports.keys() {
            if *port == 0 || *port > 65535 {
                errs.add(&format!("spec.portLevelMtls[{port}]"), "port must be between 1-65535");
            }
        }
    }
    if let Some(l) = labels {
        check_selector(errs, "spec.selector.matchLabels", l);
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::validation::errors_of;

    #[test]
    fn peer_authentication_as_istio() {
        assert!(errors_of("PeerAuthentication", json!({"mtls": {"mode": "STRICT"}})).is_empty());
        assert!(
            errors_of(
                "PeerAuthentication",
                json!({"portLevelMtls": {"80": {"mode": "STRICT"}}})
            )[0]
            .contains("portLevelMtls requires selector")
        );
        assert!(
            errors_of(
                "PeerAuthentication",
                json!({"selector": {"matchLabels": {"app": "a"}}, "portLevelMtls": {"0": {"mode": "STRICT"}}})
            )[0]
            .contains("port must be between 1-65535")
        );
    }
}
