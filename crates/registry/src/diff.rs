//! What changed between two registry snapshots, as Istio's `serviceEntryHandler` and
//! `workloadEntryHandler` decide between a full push and an EDS-only push.

use std::collections::BTreeSet;
use std::sync::Arc;

use model::Service;

use crate::conversion::is_dns;
use crate::{RegistrySnapshot, ServiceKey};

/// The services whose change needs a full push, and those whose endpoints changed; from a
/// registry of workloads (Kubernetes), also the workloads that changed, for the other registries
/// and for the proxies that run them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RegistryDiff {
    /// Added, removed or changed in shape (ports, addresses, resolution, exportTo, labels, ...), and
    /// DNS-resolved services whose endpoints changed: their endpoints live in CDS (STRICT_DNS /
    /// LOGICAL_DNS clusters), so Istio full-pushes them.
    pub services_changed: BTreeSet<ServiceKey>,
    /// Services whose endpoint list differs (a missing list counts as empty), whatever the reason.
    pub endpoints_changed: BTreeSet<ServiceKey>,
    /// Namespaces where workloads (Pods) may have been added, changed or removed, as Istio's
    /// `WorkloadInstance` handlers hear of them: a ServiceEntry there selecting workloads asks the
    /// registries for them again (see `ServiceEntryRegistry::with_workloads`).
    pub workload_namespaces: BTreeSet<String>,
    /// IPs of workloads that appeared, whose labels changed, or that a changed Service selects:
    /// the proxies there are initialised again from the registry and pushed, as Istio's
    /// `ProxyUpdate`.
    pub proxies: BTreeSet<String>,
}

impl RegistryDiff {
    /// Nothing changed at all.
    pub fn is_empty(&self) -> bool {
        !self.changes_services() && self.workload_namespaces.is_empty() && self.proxies.is_empty()
    }

    /// Services or endpoints changed: the registry's snapshot is a new one.
    pub fn changes_services(&self) -> bool {
        !self.services_changed.is_empty() || !self.endpoints_changed.is_empty()
    }

    /// Adds `other`'s changes.
    pub fn merge(&mut self, other: RegistryDiff) {
        self.services_changed.extend(other.services_changed);
        self.endpoints_changed.extend(other.endpoints_changed);
        self.workload_namespaces.extend(other.workload_namespaces);
        self.proxies.extend(other.proxies);
    }

    /// Whether a full push is needed; otherwise an EDS push of `endpoints_changed` is enough.
    pub fn needs_full_push(&self) -> bool {
        !self.services_changed.is_empty()
    }
}

/// Compares two snapshots service by service.
pub fn diff(old: &RegistrySnapshot, new: &RegistrySnapshot) -> RegistryDiff {
    let mut out = RegistryDiff::default();
    let keys: BTreeSet<ServiceKey> = old
        .services
        .iter()
        .chain(new.services.iter())
        .map(|s| ServiceKey::of(s))
        .chain(old.endpoints.keys().cloned())
        .chain(new.endpoints.keys().cloned())
        .collect();
    for key in keys {
        let old_svc = old.service(&key.hostname, &key.namespace);
        let new_svc = new.service(&key.hostname, &key.namespace);
        if !same_service(old_svc, new_svc) {
            out.services_changed.insert(key.clone());
        }
        let endpoints_same = match (old.endpoints.get(&key), new.endpoints.get(&key)) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
            (a, b) => a.is_none_or(|e| e.is_empty()) && b.is_none_or(|e| e.is_empty()),
        };
        if !endpoints_same {
            // DNS services' endpoints are in CDS, headless ones' in the name table (NDS)
            if old_svc
                .into_iter()
                .chain(new_svc)
                .any(|s| is_dns(s.resolution) || model::service::is_headless(s))
            {
                out.services_changed.insert(key.clone());
            }
            out.endpoints_changed.insert(key);
        }
    }
    out
}

fn same_service(a: Option<&Arc<Service>>, b: Option<&Arc<Service>>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
        (None, None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use model::Config;
    use serde_json::{Value, json};

    use super::diff;
    use crate::tests::{ep, eps, key, se, snapshot, we};

    /// A STATIC ServiceEntry on host `host`: with inline `endpoints` if any, else selecting `app: <selector>`
    /// (validation allows only one of the two).
    fn static_se(name: &str, host: &str, port: u32, selector: &str, endpoints: Value) -> Arc<Config> {
        let mut spec = json!({"hosts": [host], "ports": [{"number": port, "name": "http"}], "resolution": "STATIC"});
        if endpoints.as_array().is_some_and(|a| a.is_empty()) {
            spec["workloadSelector"] = json!({"labels": {"app": selector}});
        } else {
            spec["endpoints"] = endpoints;
        }
        se("a", name, spec)
    }

    #[test]
    fn diff_endpoint_only_change_is_eds_only() {
        let old = snapshot(&[static_se(
            "s",
            "s.example.com",
            80,
            "s",
            json!([{"address": "10.0.0.1"}]),
        )]);
        let new = snapshot(&[static_se(
            "s",
            "s.example.com",
            80,
            "s",
            json!([{"address": "10.0.0.2"}]),
        )]);
        let d = diff(&old, &new);
        assert!(!d.needs_full_push());
        assert_eq!(
            d.endpoints_changed.into_iter().collect::<Vec<_>>(),
            vec![key("s.example.com", "a")]
        );
        assert!(diff(&new, &new).is_empty());
    }

    #[test]
    fn diff_port_change_needs_full_push() {
        let old = snapshot(&[static_se("s", "s.example.com", 80, "s", json!([]))]);
        let new = snapshot(&[static_se("s", "s.example.com", 81, "s", json!([]))]);
        let d = diff(&old, &new);
        assert!(d.needs_full_push());
        assert_eq!(
            d.services_changed.into_iter().collect::<Vec<_>>(),
            vec![key("s.example.com", "a")]
        );
        assert!(d.endpoints_changed.is_empty());
    }

    #[test]
    fn diff_added_and_removed_services() {
        let old = snapshot(&[static_se(
            "s",
            "old.example.com",
            80,
            "s",
            json!([{"address": "10.0.0.1"}]),
        )]);
        let new = snapshot(&[static_se("s", "new.example.com", 80, "s", json!([]))]);
        let d = diff(&old, &new);
        let changed: Vec<_> = d.services_changed.into_iter().collect();
        assert_eq!(changed, vec![key("new.example.com", "a"), key("old.example.com", "a")]);
        assert_eq!(
            d.endpoints_changed.into_iter().collect::<Vec<_>>(),
            vec![key("old.example.com", "a")]
        );
    }

    #[test]
    fn diff_workload_entry_label_change_moves_endpoint_between_entries() {
        let entries = || {
            vec![
                static_se("blue", "blue.example.com", 80, "blue", json!([])),
                static_se("green", "green.example.com", 80, "green", json!([])),
            ]
        };
        let mut before = entries();
        before.push(we(
            "a",
            "vm",
            json!({}),
            json!({"address": "10.0.0.5", "labels": {"app": "blue"}}),
        ));
        let mut after = entries();
        after.push(we(
            "a",
            "vm",
            json!({}),
            json!({"address": "10.0.0.5", "labels": {"app": "green"}}),
        ));
        let (old, new) = (snapshot(&before), snapshot(&after));
        assert_eq!(eps(&old, "blue.example.com", "a"), vec![ep("10.0.0.5", 80, "http")]);
        assert_eq!(eps(&new, "green.example.com", "a"), vec![ep("10.0.0.5", 80, "http")]);
        let d = diff(&old, &new);
        assert!(!d.needs_full_push());
        let changed: Vec<_> = d.endpoints_changed.into_iter().collect();
        assert_eq!(
            changed,
            vec![key("blue.example.com", "a"), key("green.example.com", "a")]
        );
    }

    #[test]
    fn diff_dns_endpoint_change_needs_full_push() {
        let dns = |addr: &str| {
            se(
                "a",
                "d",
                json!({"hosts": ["d.example.com"], "resolution": "DNS", "ports": [{"number": 80, "name": "http"}],
                "endpoints": [{"address": addr}]}),
            )
        };
        let d = diff(&snapshot(&[dns("one.internal")]), &snapshot(&[dns("two.internal")]));
        assert_eq!(
            d.services_changed.iter().collect::<Vec<_>>(),
            vec![&key("d.example.com", "a")]
        );
        assert_eq!(
            d.endpoints_changed.iter().collect::<Vec<_>>(),
            vec![&key("d.example.com", "a")]
        );
    }
}
