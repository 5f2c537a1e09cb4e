//! The Kubernetes service registry, as Istio's `pilot/pkg/serviceregistry/kube`: Services,
//! EndpointSlices, Pods and Nodes (watched with kube-rs, or read from manifests) turned into the
//! same services and endpoints the ServiceEntry registry produces, so that everything downstream
//! works unchanged.
#![forbid(unsafe_code)]

mod controller;
pub mod conversion;
pub mod watch;

#[cfg(test)]
mod tests;

pub use controller::{Change, KubeEvent, KubeRegistry};
pub use conversion::{Context, SERVICE_REGISTRY_KUBERNETES};

impl environment::ServiceRegistry for KubeRegistry {
    fn provider(&self) -> &str {
        SERVICE_REGISTRY_KUBERNETES
    }

    /// Istio config does not feed this registry.
    fn config_changed(&self, _events: &[config_sources::ConfigEvent]) -> registry::RegistryDiff {
        registry::RegistryDiff::default()
    }

    fn snapshot(&self) -> std::sync::Arc<registry::RegistrySnapshot> {
        KubeRegistry::snapshot(self)
    }
}
