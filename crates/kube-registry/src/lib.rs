//! The Kubernetes service registry, as Istio's `pilot/pkg/serviceregistry/kube`: Services,
//! EndpointSlices, Pods and Nodes (watched with kube-rs, or read from manifests) turned into the
//! same services and endpoints the ServiceEntry registry produces, so that everything downstream
//! works unchanged.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod controller;
pub mod conversion;
pub mod manifests;
mod objects;
pub mod problems;
mod targets;
pub mod watch;

#[cfg(test)]
mod targets_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod workload_tests;

pub use controller::{KubeEvent, KubeRegistry};
pub use conversion::Context;
pub use kclient::Change;
use registry::SERVICE_REGISTRY_KUBERNETES;

impl registry::ServiceRegistry for KubeRegistry {
    fn provider(&self) -> &str {
        SERVICE_REGISTRY_KUBERNETES
    }

    fn cluster_id(&self) -> &str {
        &self.context().cluster_id
    }

    /// Core Kubernetes objects from manifests in --configDir feed this registry; Istio kinds do not.
    fn config_changed(&self, events: &[model::ConfigEvent]) -> registry::RegistryDiff {
        let (kube_events, errors) = manifests::events(events);
        for e in errors {
            tracing::warn!(object = e.object, "Kubernetes manifest does not decode: {}", e.reason);
        }
        if kube_events.is_empty() {
            return registry::RegistryDiff::default();
        }
        self.apply(kube_events)
    }

    fn workload_instances(&self, namespace: &str) -> Vec<std::sync::Arc<model::Config>> {
        KubeRegistry::workload_instances(self, namespace)
    }

    fn workload_namespaces(&self) -> std::collections::BTreeSet<String> {
        KubeRegistry::workload_namespaces(self)
    }

    fn snapshot(&self) -> std::sync::Arc<registry::RegistrySnapshot> {
        KubeRegistry::snapshot(self)
    }

    /// The Pod's labels with its cluster and locality labels (Istio's `GetProxyWorkloadLabels`:
    /// `AugmentLabels`), its locality (`istio-locality` label, else its Node's topology), and the
    /// ports of the Services selecting it (Istio's `GetProxyServiceTargets`).
    fn workload(&self, ip: &str, id: &str, namespace: &str) -> Option<registry::Workload> {
        let pod = self.find_pod(ip, id, namespace)?;
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .and_then(|n| self.node(n));
        let locality = conversion::locality(Some(&pod), node.as_ref());
        let mut labels = registry::augment_labels(&pod.metadata.labels.clone().unwrap_or_default(), &locality, "");
        labels.insert(conversion::CLUSTER_LABEL.to_owned(), self.context().cluster_id.clone());
        Some(registry::Workload {
            labels,
            locality,
            service_targets: self.service_targets(&pod),
        })
    }
}
