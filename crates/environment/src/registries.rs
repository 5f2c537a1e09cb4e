//! Service registries plugged into the environment, as Istio's `serviceregistry.Instance` and the
//! aggregate controller: each turns what it watches into services and endpoints; the environment
//! serves the union.

use std::sync::{Arc, Mutex, PoisonError};

use config_sources::ConfigEvent;
use registry::{RegistryDiff, RegistrySnapshot, ServiceEntryRegistry};

/// One service registry.
pub trait ServiceRegistry: Send + Sync {
    /// Istio's provider ID: `External` for ServiceEntries, `Kubernetes`.
    fn provider(&self) -> &str;

    /// Istio config changed. Registries built from Istio config (ServiceEntries, WorkloadEntries)
    /// apply the events they read and return what changed; others return nothing.
    fn config_changed(&self, events: &[ConfigEvent]) -> RegistryDiff;

    /// Workloads of another registry changed (Kubernetes Pods; see `RegistryDiff::workloads`).
    /// Registries whose services select workloads (ServiceEntry `workloadSelector`) apply them
    /// and return what changed; others return nothing.
    fn workloads_changed(&self, _workloads: &Workloads) -> RegistryDiff {
        RegistryDiff::default()
    }

    /// The services and endpoints as of the last change.
    fn snapshot(&self) -> Arc<RegistrySnapshot>;

    /// What the registry knows of the workload of a proxy (its IP, its ID `pod.namespace`, its
    /// namespace): its labels and locality (Kubernetes: the Pod's labels, its Node's topology).
    fn workload(&self, _ip: &str, _id: &str, _namespace: &str) -> Option<Workload> {
        None
    }
}

/// Workloads by key, `None` when removed (`RegistryDiff::workloads`).
pub type Workloads = std::collections::BTreeMap<model::ConfigKey, Option<Arc<model::Config>>>;

/// A workload as a registry knows it, to complete a proxy's node metadata.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Workload {
    pub labels: std::collections::BTreeMap<String, String>,
    /// `region/zone/subzone`, empty when unknown.
    pub locality: String,
}

/// A registry shared with whatever keeps it up to date (e.g. its watcher).
impl<T: ServiceRegistry> ServiceRegistry for Arc<T> {
    fn provider(&self) -> &str {
        self.as_ref().provider()
    }

    fn config_changed(&self, events: &[ConfigEvent]) -> RegistryDiff {
        self.as_ref().config_changed(events)
    }

    fn workloads_changed(&self, workloads: &Workloads) -> RegistryDiff {
        self.as_ref().workloads_changed(workloads)
    }

    fn snapshot(&self) -> Arc<RegistrySnapshot> {
        self.as_ref().snapshot()
    }

    fn workload(&self, ip: &str, id: &str, namespace: &str) -> Option<Workload> {
        self.as_ref().workload(ip, id, namespace)
    }
}

/// The ServiceEntry registry (`External`), fed by ServiceEntry and WorkloadEntry events.
#[derive(Debug)]
pub struct ServiceEntries(Mutex<ServiceEntryRegistry>);

impl ServiceEntries {
    pub fn new(mesh: Arc<model::MeshConfig>) -> ServiceEntries {
        ServiceEntries(Mutex::new(ServiceEntryRegistry::new(mesh)))
    }
}

impl ServiceRegistry for ServiceEntries {
    fn provider(&self) -> &str {
        "External"
    }

    fn config_changed(&self, events: &[ConfigEvent]) -> RegistryDiff {
        let changes = events.iter().map(|e| (e.key(), e.current()));
        self.0.lock().unwrap_or_else(PoisonError::into_inner).apply(changes)
    }

    fn workloads_changed(&self, workloads: &Workloads) -> RegistryDiff {
        let changes = workloads.iter().map(|(k, c)| (k.clone(), c.as_ref()));
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .apply_workloads(changes)
    }

    fn snapshot(&self) -> Arc<RegistrySnapshot> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).snapshot()
    }
}

/// The union of the registries' snapshots. A (hostname, namespace) that several registries
/// define keeps the first registry's service, and the endpoints of all of them.
pub(crate) fn aggregate(registries: &[Box<dyn ServiceRegistry>]) -> Arc<RegistrySnapshot> {
    let mut snapshots = registries.iter().map(|r| r.snapshot());
    let Some(first) = snapshots.next() else {
        return Arc::default();
    };
    let rest: Vec<_> = snapshots.collect();
    if rest.is_empty() {
        return first;
    }
    let mut services = first.services.clone();
    let mut keys: std::collections::BTreeSet<model::ServiceKey> =
        services.iter().map(|s| model::ServiceKey::of(s)).collect();
    let mut endpoints = first.endpoints.clone();
    for s in rest {
        for service in &s.services {
            if keys.insert(model::ServiceKey::of(service)) {
                services.push(service.clone());
            }
        }
        for (key, eps) in &s.endpoints {
            endpoints
                .entry(key.clone())
                .and_modify(|e| {
                    let mut all = e.as_ref().clone();
                    all.extend(eps.iter().cloned());
                    *e = Arc::new(all);
                })
                .or_insert_with(|| eps.clone());
        }
    }
    services.sort_by(|a, b| (&a.hostname, a.namespace()).cmp(&(&b.hostname, b.namespace())));
    Arc::new(RegistrySnapshot { services, endpoints })
}
