//! Istio's `ValidateMeshConfig` for the parts of the mesh config that change generated config:
//! locality and zone-aware load balancing, `defaultTrafficPolicy` and the default inbound retry
//! policy, with istiod's messages.

use super::common::Errors;
use super::destination_rule::{check_connection_pool, check_outlier_detection};
use super::http_policy::check_http_retry;
use super::load_balancer::{check_locality_lb, check_zone_aware_lb};
use crate::MeshConfig;

/// Every problem, as `field: reason`; empty when the mesh config is valid.
pub fn mesh_config_errors(mesh: &MeshConfig) -> Vec<String> {
    let mut errs = Errors::default();
    if let Some(l) = &mesh.locality_lb_setting {
        check_locality_lb(&mut errs, "localityLbSetting", l);
    }
    // At the mesh level both may be set: zone-aware wins (Istio's `GetEffectiveLbSetting`).
    if let Some(z) = &mesh.zone_aware_lb_setting {
        check_zone_aware_lb(&mut errs, "zoneAwareLbSetting", z);
    }
    if let Some(p) = &mesh.default_traffic_policy {
        check_connection_pool(
            &mut errs,
            "defaultTrafficPolicy.connectionPool",
            p.connection_pool.as_ref(),
        );
        check_outlier_detection(
            &mut errs,
            "defaultTrafficPolicy.outlierDetection",
            p.outlier_detection.as_ref(),
        );
    }
    if let Some(r) = &mesh.default_http_retry_policy {
        check_http_retry(&mut errs, "defaultHttpRetryPolicy", r);
    }
    // `validateMeshConfigDefaultInboundHTTPRetryPolicy`
    if let Some(r) = &mesh.default_inbound_http_retry_policy {
        const PATH: &str = "defaultInboundHttpRetryPolicy";
        let mut retry = Errors::default();
        check_http_retry(&mut retry, PATH, r);
        for e in retry.into_vec() {
            let reason = e.split_once(": ").map_or(e.as_str(), |(_, r)| r);
            errs.add(PATH, format!("invalid default inbound http retry policy: {reason}"));
        }
        if r.attempts == 0 && r.backoff.is_some() {
            errs.add(
                PATH,
                "invalid default inbound http retry policy: backoff configured when attempts are set to 0 (disabled)",
            );
        }
    }
    errs.into_vec()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use crate::MeshConfig;
    use crate::mesh::MeshConfigError;

    fn error(v: serde_json::Value) -> String {
        match MeshConfig::from_value(v) {
            Err(MeshConfigError::Validation(errors)) => errors.join("; "),
            other => panic!("not invalid: {other:?}"),
        }
    }

    #[test]
    fn mesh_config_is_validated_as_istiods() {
        assert!(
            MeshConfig::from_value(json!({
                "localityLbSetting": {"enabled": true},
                "zoneAwareLbSetting": {"minClusterSize": 2},
                "defaultTrafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 10}}},
                "defaultInboundHttpRetryPolicy": {"attempts": 2, "retryOn": "reset-before-request"}
            }))
            .is_ok()
        );
        assert!(
            error(json!({"localityLbSetting": {"failover": [{"from": "a", "to": "a"}]}})).contains("different regions")
        );
        assert!(
            error(json!({"zoneAwareLbSetting": {"failover": [{"from": "a/b", "to": "c"}]}}))
                .contains("only specifies region")
        );
        assert!(error(json!({"defaultTrafficPolicy": {"connectionPool": {}}})).contains("at least one field"));
        assert!(error(json!({"defaultHttpRetryPolicy": {"attempts": -1}})).contains("attempts cannot be negative"));
        assert_eq!(
            error(json!({"defaultInboundHttpRetryPolicy": {"attempts": 0, "backoff": "1s"}})),
            "defaultInboundHttpRetryPolicy: invalid default inbound http retry policy: backoff configured when attempts are set to 0 (disabled)"
        );
        assert!(
            error(json!({"defaultInboundHttpRetryPolicy": {"attempts": 1, "retryOn": "sometimes"}}))
                .contains("invalid default inbound http retry policy: \"sometimes\" is not a valid retryOn policy")
        );
    }
}
