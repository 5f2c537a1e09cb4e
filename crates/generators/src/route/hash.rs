//! Consistent-hash load balancing on routes: the hash key a DestinationRule asks for
//! (`HashForHTTPDestination`) and the Envoy hash policy it becomes (`ConsistentHashToHashPolicy`).

use model::networking::{ConsistentHashLb, Destination, DestinationRule, PortTrafficPolicy};
use xds_api::envoy::config::route::v3::route_action::{HashPolicy, hash_policy};

use super::policy::parse_duration;

/// The consistent hash settings that apply to `destination`, most specific first: the subset's
/// port-level settings, the subset's, the rule's port-level settings, then the rule's.
pub(crate) fn consistent_hash_for_destination(
    rule: &DestinationRule,
    destination: &Destination,
) -> Option<ConsistentHashLb> {
    let policy = rule.traffic_policy.as_ref();
    let top = policy
        .and_then(|p| p.load_balancer.as_ref())
        .and_then(|lb| lb.consistent_hash.clone());
    let port_level = policy.and_then(|p| port_level_hash(destination, &p.port_level_settings));
    let subset = rule.subsets.iter().find(|s| s.name == destination.subset);
    let subset_policy = subset.and_then(|s| s.traffic_policy.as_ref());
    let subset_hash = subset_policy
        .and_then(|p| p.load_balancer.as_ref())
        .and_then(|lb| lb.consistent_hash.clone());
    let subset_port_level = subset_policy.and_then(|p| port_level_hash(destination, &p.port_level_settings));
    subset_port_level.or(subset_hash).or(port_level).or(top)
}

/// `portLevelSettingsConsistentHash`: only when the destination names a port.
fn port_level_hash(destination: &Destination, settings: &[PortTrafficPolicy]) -> Option<ConsistentHashLb> {
    let number = destination.port.as_ref()?.number;
    settings
        .iter()
        .find(|s| s.port.as_ref().map(|p| p.number) == Some(number))
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.consistent_hash.clone())
}

/// `ConsistentHashToHashPolicy`: header, cookie (with ttl, path and attributes), source IP or
/// query parameter; `None` when no hash key is set.
pub(crate) fn hash_policy(hash: &ConsistentHashLb) -> Option<HashPolicy> {
    use hash_policy::PolicySpecifier;
    let specifier = if let Some(header_name) = &hash.http_header_name {
        PolicySpecifier::Header(hash_policy::Header {
            header_name: header_name.clone(),
            regex_rewrite: None,
        })
    } else if let Some(cookie) = &hash.http_cookie {
        let attributes = cookie
            .attributes
            .iter()
            .filter_map(|a| {
                let name = a.get("name")?.as_str()?.to_owned();
                let value = a.get("value").and_then(|v| v.as_str()).unwrap_or_default().to_owned();
                Some(hash_policy::CookieAttribute { name, value })
            })
            .collect();
        PolicySpecifier::Cookie(hash_policy::Cookie {
            name: cookie.name.clone(),
            ttl: parse_duration(cookie.ttl.as_deref()),
            path: cookie.path.clone(),
            attributes,
        })
    } else if let Some(source_ip) = hash.use_source_ip {
        PolicySpecifier::ConnectionProperties(hash_policy::ConnectionProperties { source_ip })
    } else if let Some(name) = &hash.http_query_parameter_name {
        PolicySpecifier::QueryParameter(hash_policy::QueryParameter { name: name.clone() })
    } else {
        return None;
    };
    Some(HashPolicy {
        policy_specifier: Some(specifier),
        terminal: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::networking::{HttpCookie, LoadBalancerSettings, PortSelector, Subset, TrafficPolicy};

    fn lb(hash: ConsistentHashLb) -> Option<LoadBalancerSettings> {
        Some(LoadBalancerSettings {
            consistent_hash: Some(hash),
            ..Default::default()
        })
    }

    fn header(name: &str) -> ConsistentHashLb {
        ConsistentHashLb {
            http_header_name: Some(name.into()),
            ..Default::default()
        }
    }

    #[test]
    fn most_specific_hash_wins() {
        let rule = DestinationRule {
            host: "r".into(),
            traffic_policy: Some(TrafficPolicy {
                load_balancer: lb(header("top")),
                port_level_settings: vec![PortTrafficPolicy {
                    port: Some(PortSelector { number: 9080 }),
                    load_balancer: lb(header("port")),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            subsets: vec![Subset {
                name: "v1".into(),
                traffic_policy: Some(TrafficPolicy {
                    load_balancer: lb(header("subset")),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let dest = |subset: &str, port: Option<u32>| Destination {
            host: "r".into(),
            subset: subset.into(),
            port: port.map(|number| PortSelector { number }),
        };
        let name = |d: Destination| consistent_hash_for_destination(&rule, &d).and_then(|h| h.http_header_name);
        assert_eq!(name(dest("", None)).as_deref(), Some("top"));
        assert_eq!(name(dest("", Some(9080))).as_deref(), Some("port"));
        assert_eq!(name(dest("v1", Some(9080))).as_deref(), Some("subset"));
    }

    #[test]
    fn cookie_policy_with_ttl() {
        let h = ConsistentHashLb {
            http_cookie: Some(HttpCookie {
                name: "user".into(),
                path: "/".into(),
                ttl: Some("10s".into()),
                attributes: vec![serde_json::json!({"name": "SameSite", "value": "Strict"})],
            }),
            ..Default::default()
        };
        let Some(hash_policy::PolicySpecifier::Cookie(c)) = hash_policy(&h).unwrap().policy_specifier else {
            panic!("cookie policy expected");
        };
        assert_eq!(c.ttl.unwrap().seconds, 10);
        assert_eq!(c.attributes[0].name, "SameSite");
        assert_eq!(hash_policy(&ConsistentHashLb::default()), None);
    }
}
