//! PeerAuthentication in effect, as Istio's `AuthenticationPolicies`
//! (`GetPeerAuthenticationsForWorkload`, `ComposePeerAuthentication`,
//! `GetNamespaceMutualTLSMode`): the oldest mesh-wide policy (root namespace, no selector), the
//! oldest namespace-wide one, the oldest of the workload's namespace whose selector matches it;
//! each one's mode overrides its parent's unless UNSET; port-level modes come from the workload
//! policy only (UNSET there is the workload's mode). PERMISSIVE when nothing says otherwise.

use std::collections::BTreeMap;
use std::sync::Arc;

use model::security::{MtlsMode, PeerAuthentication};
use model::{Config, ConfigSpec};

/// The mTLS a workload accepts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MergedPeerAuthentication {
    /// Never `Unset`.
    pub mode: MtlsMode,
    /// Per workload (container) port.
    pub per_port: BTreeMap<u32, MtlsMode>,
}

impl MergedPeerAuthentication {
    pub fn for_port(&self, port: u32) -> MtlsMode {
        self.per_port.get(&port).copied().unwrap_or(self.mode)
    }
}

/// Every PeerAuthentication of a push, oldest first.
#[derive(Debug, Default)]
pub(crate) struct PeerAuthnIndex {
    policies: Vec<Arc<Config>>,
    root_namespace: String,
}

fn spec(c: &Config) -> Option<&PeerAuthentication> {
    match &c.spec {
        ConfigSpec::PeerAuthentication(pa) => Some(pa),
        _ => None,
    }
}

fn is_set(mtls: Option<&model::security::PeerMtls>) -> Option<MtlsMode> {
    mtls.map(|m| m.mode).filter(|m| *m != MtlsMode::Unset)
}

fn has_selector(pa: &PeerAuthentication) -> bool {
    pa.selector.as_ref().is_some_and(|s| !s.match_labels.is_empty())
}

impl PeerAuthnIndex {
    pub(crate) fn new(configs: &[Arc<Config>], root_namespace: &str) -> PeerAuthnIndex {
        let mut policies: Vec<Arc<Config>> = configs.iter().filter(|c| spec(c).is_some()).cloned().collect();
        policies.sort_by(|a, b| crate::creation_order(a, b));
        PeerAuthnIndex {
            policies,
            root_namespace: root_namespace.to_owned(),
        }
    }

    /// The oldest policy without selector in `namespace`.
    fn namespace_wide(&self, namespace: &str) -> Option<&PeerAuthentication> {
        self.policies
            .iter()
            .filter(|c| c.meta.namespace == namespace)
            .filter_map(|c| spec(c))
            .find(|pa| !has_selector(pa))
    }

    /// Istio's `ComposePeerAuthentication` for a workload of `namespace` with `labels`.
    pub(crate) fn effective(&self, namespace: &str, labels: &BTreeMap<String, String>) -> MergedPeerAuthentication {
        let mut out = MergedPeerAuthentication {
            mode: MtlsMode::Permissive,
            per_port: BTreeMap::new(),
        };
        if self.policies.is_empty() {
            return out;
        }
        if let Some(m) = self
            .namespace_wide(&self.root_namespace)
            .and_then(|pa| is_set(pa.mtls.as_ref()))
        {
            out.mode = m;
        }
        if namespace != self.root_namespace
            && let Some(m) = self.namespace_wide(namespace).and_then(|pa| is_set(pa.mtls.as_ref()))
        {
            out.mode = m;
        }
        if namespace == self.root_namespace {
            return out;
        }
        let workload = self
            .policies
            .iter()
            .filter(|c| c.meta.namespace == namespace)
            .filter_map(|c| spec(c))
            .find(|pa| {
                pa.selector.as_ref().is_some_and(|s| {
                    !s.match_labels.is_empty() && s.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
                })
            });
        if let Some(pa) = workload {
            if let Some(m) = is_set(pa.mtls.as_ref()) {
                out.mode = m;
            }
            for (port, mtls) in pa.port_level_mtls.iter().flatten() {
                out.per_port.insert(*port, is_set(Some(mtls)).unwrap_or(out.mode));
            }
        }
        out
    }

    /// Istio's `GetNamespaceMutualTLSMode`: the namespace-wide policy's mode, else the mesh-wide
    /// one's; `None` when neither sets one.
    pub(crate) fn namespace_mode(&self, namespace: &str) -> Option<MtlsMode> {
        self.namespace_wide(namespace)
            .and_then(|pa| is_set(pa.mtls.as_ref()))
            .or_else(|| {
                self.namespace_wide(&self.root_namespace)
                    .and_then(|pa| is_set(pa.mtls.as_ref()))
            })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pa(name: &str, ns: &str, spec: serde_json::Value) -> Arc<Config> {
        let doc = json!({"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
            "metadata": {"name": name, "namespace": ns}, "spec": spec});
        Arc::new(model::config::parse_config(doc, "default").unwrap())
    }

    fn labels(l: &[(&str, &str)]) -> BTreeMap<String, String> {
        l.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
    }

    #[test]
    fn workload_over_namespace_over_mesh_and_unset_inherits() {
        let idx = PeerAuthnIndex::new(
            &[
                pa("mesh", "istio-system", json!({"mtls": {"mode": "STRICT"}})),
                pa("ns", "legacy", json!({"mtls": {"mode": "DISABLE"}})),
                pa("inherit", "default", json!({"mtls": {}})),
                pa(
                    "db",
                    "default",
                    json!({"selector": {"matchLabels": {"app": "db"}}, "mtls": {"mode": "PERMISSIVE"},
                        "portLevelMtls": {"3306": {"mode": "DISABLE"}, "9090": {}}}),
                ),
            ],
            "istio-system",
        );
        assert_eq!(
            idx.effective("default", &labels(&[("app", "web")])).mode,
            MtlsMode::Strict
        );
        assert_eq!(idx.effective("legacy", &labels(&[])).mode, MtlsMode::Disable);
        let db = idx.effective("default", &labels(&[("app", "db")]));
        assert_eq!(db.mode, MtlsMode::Permissive);
        assert_eq!(db.for_port(3306), MtlsMode::Disable);
        assert_eq!(db.for_port(9090), MtlsMode::Permissive);
        assert_eq!(db.for_port(80), MtlsMode::Permissive);
        assert_eq!(idx.namespace_mode("legacy"), Some(MtlsMode::Disable));
        assert_eq!(idx.namespace_mode("default"), Some(MtlsMode::Strict));
        assert_eq!(
            PeerAuthnIndex::default().effective("x", &labels(&[])).mode,
            MtlsMode::Permissive
        );
        assert_eq!(PeerAuthnIndex::default().namespace_mode("x"), None);
    }
}
