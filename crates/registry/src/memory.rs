//! The in-memory registry, as Istio's `pilot/pkg/serviceregistry/memory` (provider `Mock`):
//! services and endpoints set from code. `--registries Mock` adds an empty one to the environment;
//! tests make their meshes with it, one way to make a mesh in memory. Each change returns the
//! `RegistryDiff` it made, to hand to `Environment::services_changed` as a watcher would.

use std::sync::{Arc, Mutex, PoisonError};

use model::{ConfigEvent, Endpoint, Service, ServiceKey};

use crate::{RegistryDiff, RegistrySnapshot, ServiceRegistry, diff};

/// Istio's provider ID of the memory registry.
pub const SERVICE_REGISTRY_MOCK: &str = "Mock";

/// See the module doc. Its provider is `Mock` unless made [`MemoryRegistry::as_provider`]
/// (a test standing in for a Kubernetes cluster says `Kubernetes`).
#[derive(Debug)]
pub struct MemoryRegistry {
    provider: String,
    cluster_id: String,
    snapshot: Mutex<Arc<RegistrySnapshot>>,
}

impl Default for MemoryRegistry {
    fn default() -> MemoryRegistry {
        MemoryRegistry::new()
    }
}

impl MemoryRegistry {
    pub fn new() -> MemoryRegistry {
        MemoryRegistry::as_provider(SERVICE_REGISTRY_MOCK)
    }

    /// An empty registry that reports `provider` as its provider ID.
    pub fn as_provider(provider: &str) -> MemoryRegistry {
        MemoryRegistry {
            provider: provider.to_owned(),
            cluster_id: String::new(),
            snapshot: Mutex::default(),
        }
    }

    /// The registry as the one of this cluster (its [`ServiceRegistry::cluster_id`]).
    pub fn in_cluster(mut self, cluster_id: &str) -> MemoryRegistry {
        self.cluster_id = cluster_id.to_owned();
        self
    }

    /// Adds the service, or replaces the one of its hostname and namespace (Istio's `AddService`).
    pub fn add_service(&self, service: Service) -> RegistryDiff {
        self.change(|s| {
            let key = ServiceKey::of(&service);
            let mut services: Vec<Arc<Service>> = s
                .services
                .iter()
                .filter(|x| ServiceKey::of(x) != key)
                .cloned()
                .collect();
            services.push(Arc::new(service));
            services.sort_by(|a, b| (&a.hostname, a.namespace()).cmp(&(&b.hostname, b.namespace())));
            s.services = Arc::new(services);
        })
    }

    /// Removes the service and its endpoints (Istio's `RemoveService`).
    pub fn remove_service(&self, hostname: &str, namespace: &str) -> RegistryDiff {
        let key = ServiceKey::new(hostname, namespace);
        self.change(|s| {
            let services = s
                .services
                .iter()
                .filter(|x| ServiceKey::of(x) != key)
                .cloned()
                .collect();
            s.services = Arc::new(services);
            s.endpoints.remove(&key);
        })
    }

    /// The endpoints of the service, all of them (Istio's `SetEndpoints`); none removes them.
    pub fn set_endpoints(&self, hostname: &str, namespace: &str, endpoints: Vec<Endpoint>) -> RegistryDiff {
        let key = ServiceKey::new(hostname, namespace);
        self.change(|s| {
            if endpoints.is_empty() {
                s.endpoints.remove(&key);
            } else {
                s.endpoints.insert(key, Arc::new(endpoints));
            }
        })
    }

    /// One more endpoint of the service (Istio's `AddEndpoint`).
    pub fn add_endpoint(&self, hostname: &str, namespace: &str, endpoint: Endpoint) -> RegistryDiff {
        let key = ServiceKey::new(hostname, namespace);
        self.change(|s| {
            let mut all = s.endpoints.get(&key).map(|e| e.as_ref().clone()).unwrap_or_default();
            all.push(endpoint);
            s.endpoints.insert(key, Arc::new(all));
        })
    }

    fn change(&self, f: impl FnOnce(&mut RegistrySnapshot)) -> RegistryDiff {
        let mut current = self.snapshot.lock().unwrap_or_else(PoisonError::into_inner);
        let mut next = current.as_ref().clone();
        f(&mut next);
        let changed = diff(&current, &next);
        *current = Arc::new(next);
        changed
    }
}

impl ServiceRegistry for MemoryRegistry {
    fn provider(&self) -> &str {
        &self.provider
    }

    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    fn config_changed(&self, _events: &[ConfigEvent]) -> RegistryDiff {
        RegistryDiff::default()
    }

    fn snapshot(&self) -> Arc<RegistrySnapshot> {
        self.snapshot.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::{Port, Protocol, Resolution, ServiceAttributes};

    fn service(host: &str, vip: &str) -> Service {
        Service {
            hostname: host.into(),
            ports: vec![Port {
                name: "http".into(),
                port: 80,
                protocol: Protocol::Http,
            }],
            addresses: vec![vip.into()],
            cluster_vips: Default::default(),
            resolution: Resolution::ClientSideLb,
            mesh_external: false,
            attributes: ServiceAttributes {
                service_registry: SERVICE_REGISTRY_MOCK.into(),
                namespace: "default".into(),
                ..Default::default()
            },
            origin: "test".into(),
        }
    }

    fn endpoint(ip: &str) -> Endpoint {
        Endpoint {
            address: ip.into(),
            endpoint_port: 8080,
            service_port_name: "http".into(),
            namespace: "default".into(),
            ..Default::default()
        }
    }

    #[test]
    fn each_change_returns_the_push_it_calls_for() {
        let r = MemoryRegistry::new();
        let key = ServiceKey::new("a.example.com", "default");
        let d = r.add_service(service("a.example.com", "10.0.0.1"));
        assert!(d.services_changed.contains(&key));
        // The same service again changes nothing.
        assert!(r.add_service(service("a.example.com", "10.0.0.1")).is_empty());

        let d = r.add_endpoint("a.example.com", "default", endpoint("10.1.0.1"));
        assert!(d.services_changed.is_empty());
        assert!(d.endpoints_changed.contains(&key));
        r.add_endpoint("a.example.com", "default", endpoint("10.1.0.2"));
        assert_eq!(r.snapshot().endpoints_of(&key).len(), 2);

        let d = r.set_endpoints("a.example.com", "default", vec![endpoint("10.1.0.3")]);
        assert!(d.endpoints_changed.contains(&key));
        assert_eq!(r.snapshot().endpoints_of(&key)[0].address, "10.1.0.3");

        let d = r.remove_service("a.example.com", "default");
        assert!(d.services_changed.contains(&key));
        assert!(r.snapshot().services.is_empty());
        assert!(r.snapshot().endpoints.is_empty());
        assert_eq!(r.provider(), "Mock");
    }

    #[test]
    fn services_stay_sorted_as_the_snapshot_searches_them() {
        let r = MemoryRegistry::as_provider("Kubernetes");
        r.add_service(service("b.example.com", "10.0.0.2"));
        r.add_service(service("a.example.com", "10.0.0.1"));
        let s = r.snapshot();
        assert!(s.service("a.example.com", "default").is_some());
        assert!(s.service("b.example.com", "default").is_some());
        assert_eq!(r.provider(), "Kubernetes");
    }
}
