//! Cluster-local hosts, as Istio's `ClusterLocalProvider` (pilot/pkg/model/cluster_local.go): the
//! services whose callers reach only the endpoints of their own cluster. Istio's defaults
//! (`*.kube-system.svc.<domain>`, `kubernetes.default.svc.<domain>`), less those meshConfig
//! `serviceSettings` say are not cluster-local, plus those it says are.

use model::MeshConfig;

/// See the module doc.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ClusterLocalHosts {
    /// Exact names and `*.suffix` wildcards, with whether they are cluster-local; the most
    /// specific match decides.
    specific: std::collections::BTreeMap<String, bool>,
    wildcard: Vec<(String, bool)>,
}

impl ClusterLocalHosts {
    pub(crate) fn new(mesh: &MeshConfig, domain: &str) -> ClusterLocalHosts {
        let mut defaults = vec![
            format!("*.kube-system.svc.{domain}"),
            format!("kubernetes.default.svc.{domain}"),
        ];
        let mut hosts = ClusterLocalHosts::default();
        for s in &mesh.service_settings {
            for h in &s.hosts {
                if !s.settings.cluster_local {
                    // An explicit `clusterLocal: false` removes a default it names or covers.
                    defaults.retain(|d| !(h == d || d.strip_prefix('*').is_some_and(|sfx| h.ends_with(sfx))));
                }
                hosts.insert(h, s.settings.cluster_local);
            }
        }
        for d in &defaults {
            if !hosts.contains(d) {
                hosts.insert(d, true);
            }
        }
        // longest suffix first: the most specific wildcard decides
        hosts.wildcard.sort_by_key(|w| std::cmp::Reverse(w.0.len()));
        hosts
    }

    fn contains(&self, host: &str) -> bool {
        self.specific.contains_key(host) || self.wildcard.iter().any(|(w, _)| format!("*{w}") == host)
    }

    fn insert(&mut self, host: &str, local: bool) {
        match host.strip_prefix('*') {
            Some(suffix) => self.wildcard.push((suffix.to_owned(), local)),
            None => {
                self.specific.insert(host.to_owned(), local);
            }
        }
    }

    /// Whether callers of `host` reach only the endpoints of their own cluster.
    pub(crate) fn is_cluster_local(&self, host: &str) -> bool {
        if let Some(local) = self.specific.get(host) {
            return *local;
        }
        self.wildcard
            .iter()
            .find(|(suffix, _)| host.ends_with(suffix.as_str()))
            .is_some_and(|(_, local)| *local)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mesh(settings: serde_json::Value) -> MeshConfig {
        serde_json::from_value(serde_json::json!({ "serviceSettings": settings })).unwrap()
    }

    #[test]
    fn istios_defaults_and_service_settings() {
        let h = ClusterLocalHosts::new(&MeshConfig::default(), "cluster.local");
        assert!(h.is_cluster_local("kube-dns.kube-system.svc.cluster.local"));
        assert!(h.is_cluster_local("kubernetes.default.svc.cluster.local"));
        assert!(!h.is_cluster_local("reviews.default.svc.cluster.local"));

        let h = ClusterLocalHosts::new(
            &mesh(serde_json::json!([
                {"settings": {"clusterLocal": true}, "hosts": ["*.payments.svc.cluster.local"]},
                {"settings": {"clusterLocal": false}, "hosts": ["ledger.payments.svc.cluster.local", "*.kube-system.svc.cluster.local"]},
            ])),
            "cluster.local",
        );
        assert!(h.is_cluster_local("cards.payments.svc.cluster.local"));
        // the exact name wins over the wildcard
        assert!(!h.is_cluster_local("ledger.payments.svc.cluster.local"));
        // the default removed by an explicit `clusterLocal: false`
        assert!(!h.is_cluster_local("kube-dns.kube-system.svc.cluster.local"));
        assert!(h.is_cluster_local("kubernetes.default.svc.cluster.local"));
    }
}
