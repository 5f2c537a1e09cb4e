//! The Kubernetes service registry, as Istio's `pilot/pkg/serviceregistry/kube`: Services,
//! EndpointSlices, Pods and Nodes (watched with kube-rs, or read from manifests) turned into the
//! same services and endpoints the ServiceEntry registry produces, so that everything downstream
//! works unchanged.
#![forbid(unsafe_code)]

mod controller;
pub mod conversion;

#[cfg(test)]
mod tests;

pub use controller::{Change, KubeEvent, KubeRegistry};
pub use conversion::{Context, SERVICE_REGISTRY_KUBERNETES};
