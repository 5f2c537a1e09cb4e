//! The DestinationRule traffic policy that applies to one cluster (service port, optional subset),
//! as Istio's `GetPortLevelTrafficPolicy` and `MergeSubsetTrafficPolicy`.
//!
//! - A `portLevelSettings` entry for the port replaces the destination-level policy wholesale: a
//!   field it omits falls back to the default, it is not inherited (Istio's documented behaviour).
//! - A subset inherits the (port-resolved) destination policy; each field the subset's own policy
//!   sets overrides it. When the subset's policy has a `portLevelSettings` entry for the port,
//!   that entry replaces all four fields (connectionPool, outlierDetection, loadBalancer, tls).

use model::mesh::DefaultTrafficPolicy;
use model::networking::{
    ClientTlsSettings, ConnectionPoolSettings, DestinationRule, LoadBalancerSettings, OutlierDetection, TrafficPolicy,
};

/// The parts of a traffic policy that shape one cluster.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ClusterPolicy {
    pub(crate) load_balancer: Option<LoadBalancerSettings>,
    pub(crate) connection_pool: Option<ConnectionPoolSettings>,
    pub(crate) outlier_detection: Option<OutlierDetection>,
    pub(crate) tls: Option<ClientTlsSettings>,
    /// `proxyProtocol` (`{version: V1|V2}`): the PROXY header upstream connections start with. A
    /// port-level policy has none (Istio's `shadowCopyPortTrafficPolicy` keeps only the four above).
    pub(crate) proxy_protocol: Option<serde_json::Value>,
}

impl ClusterPolicy {
    fn of(p: &TrafficPolicy) -> ClusterPolicy {
        ClusterPolicy {
            load_balancer: p.load_balancer.clone(),
            connection_pool: p.connection_pool.clone(),
            outlier_detection: p.outlier_detection.clone(),
            tls: p.tls.clone(),
            proxy_protocol: p.proxy_protocol.clone(),
        }
    }
}

/// Istio's `GetPortLevelTrafficPolicy`: the policy for `port`, and whether a port-level entry
/// matched.
pub(crate) fn port_level_policy(policy: Option<&TrafficPolicy>, port: u16) -> (Option<ClusterPolicy>, bool) {
    let Some(policy) = policy else {
        return (None, false);
    };
    let port_level = policy
        .port_level_settings
        .iter()
        .find(|p| p.port.as_ref().is_some_and(|s| s.number == u32::from(port)));
    match port_level {
        Some(p) => (
            Some(ClusterPolicy {
                load_balancer: p.load_balancer.clone(),
                connection_pool: p.connection_pool.clone(),
                outlier_detection: p.outlier_detection.clone(),
                tls: p.tls.clone(),
                proxy_protocol: None,
            }),
            true,
        ),
        None => (Some(ClusterPolicy::of(policy)), false),
    }
}

/// The policy of the cluster for `port` and `subset` (empty for the service's default cluster):
/// the rule's policy for the port over the mesh's `defaultTrafficPolicy` (Istio's
/// `applyDefaultTrafficPolicy`: its connection pool and outlier detection where the rule sets
/// none, with or without a rule), then the subset's on top.
pub(crate) fn cluster_policy(
    rule: Option<&DestinationRule>,
    port: u16,
    subset: &str,
    mesh_default: Option<&DefaultTrafficPolicy>,
) -> Option<ClusterPolicy> {
    let (destination, _) = port_level_policy(rule.and_then(|r| r.traffic_policy.as_ref()), port);
    let destination = with_mesh_default(destination, mesh_default);
    let Some(rule) = rule else {
        return destination;
    };
    if subset.is_empty() {
        return destination;
    }
    let subset_policy = rule
        .subsets
        .iter()
        .find(|s| s.name == subset)
        .and_then(|s| s.traffic_policy.as_ref());
    let Some(subset_policy) = subset_policy else {
        return destination;
    };
    let (subset_policy, has_port_level) = port_level_policy(Some(subset_policy), port);
    let subset_policy = subset_policy?;
    let Some(mut merged) = destination else {
        return Some(subset_policy);
    };
    if has_port_level || subset_policy.connection_pool.is_some() {
        merged.connection_pool = subset_policy.connection_pool;
    }
    if has_port_level || subset_policy.outlier_detection.is_some() {
        merged.outlier_detection = subset_policy.outlier_detection;
    }
    if has_port_level || subset_policy.load_balancer.is_some() {
        merged.load_balancer = subset_policy.load_balancer;
    }
    if has_port_level || subset_policy.tls.is_some() {
        merged.tls = subset_policy.tls;
    }
    if subset_policy.proxy_protocol.is_some() {
        merged.proxy_protocol = subset_policy.proxy_protocol;
    }
    Some(merged)
}

/// Istio's `applyDefaultTrafficPolicy`.
pub(crate) fn with_mesh_default(
    policy: Option<ClusterPolicy>,
    mesh_default: Option<&DefaultTrafficPolicy>,
) -> Option<ClusterPolicy> {
    let Some(d) = mesh_default.filter(|d| d.connection_pool.is_some() || d.outlier_detection.is_some()) else {
        return policy;
    };
    let mut p = policy.unwrap_or_default();
    if p.connection_pool.is_none() {
        p.connection_pool = d.connection_pool.clone();
    }
    if p.outlier_detection.is_none() {
        p.outlier_detection = d.outlier_detection.clone();
    }
    Some(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::networking::{PortSelector, PortTrafficPolicy, Subset};

    fn lb(simple: &str) -> Option<LoadBalancerSettings> {
        Some(LoadBalancerSettings {
            simple: Some(simple.into()),
            ..Default::default()
        })
    }

    fn outlier(n: u32) -> Option<OutlierDetection> {
        Some(OutlierDetection {
            consecutive_5xx_errors: Some(n),
            ..Default::default()
        })
    }

    fn rule() -> DestinationRule {
        DestinationRule {
            host: "reviews.default.svc.cluster.local".into(),
            traffic_policy: Some(TrafficPolicy {
                load_balancer: lb("RANDOM"),
                outlier_detection: outlier(5),
                port_level_settings: vec![PortTrafficPolicy {
                    port: Some(PortSelector { number: 9443 }),
                    load_balancer: lb("LEAST_REQUEST"),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            subsets: vec![
                Subset {
                    name: "v1".into(),
                    traffic_policy: Some(TrafficPolicy {
                        load_balancer: lb("ROUND_ROBIN"),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                Subset {
                    name: "v2".into(),
                    traffic_policy: Some(TrafficPolicy {
                        port_level_settings: vec![PortTrafficPolicy {
                            port: Some(PortSelector { number: 9080 }),
                            outlier_detection: outlier(9),
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
            ..Default::default()
        }
    }

    impl ClusterPolicy {
        /// The simple load balancer (`ROUND_ROBIN`, ...), if set.
        fn simple_lb(&self) -> Option<&str> {
            self.load_balancer.as_ref().and_then(|lb| lb.simple.as_deref())
        }
    }

    #[test]
    fn port_level_settings_replace_the_destination_policy() {
        let r = rule();
        let p = cluster_policy(Some(&r), 9443, "", None).unwrap();
        assert_eq!(p.simple_lb(), Some("LEAST_REQUEST"));
        assert_eq!(p.outlier_detection, None, "not inherited from the destination level");
        let p = cluster_policy(Some(&r), 9080, "", None).unwrap();
        assert_eq!(p.simple_lb(), Some("RANDOM"));
        assert_eq!(p.outlier_detection, outlier(5));
    }

    #[test]
    fn subsets_inherit_and_override_field_by_field() {
        let r = rule();
        let p = cluster_policy(Some(&r), 9080, "v1", None).unwrap();
        assert_eq!(p.simple_lb(), Some("ROUND_ROBIN"));
        assert_eq!(p.outlier_detection, outlier(5), "inherited");
        // v2's port-level entry for 9080 replaces every field.
        let p = cluster_policy(Some(&r), 9080, "v2", None).unwrap();
        assert_eq!(p.outlier_detection, outlier(9));
        assert_eq!(p.load_balancer, None);
        // unknown subset: the destination policy
        assert_eq!(
            cluster_policy(Some(&r), 9080, "v9", None).unwrap().simple_lb(),
            Some("RANDOM")
        );
        assert_eq!(cluster_policy(None, 9080, "", None), None);
    }
}
