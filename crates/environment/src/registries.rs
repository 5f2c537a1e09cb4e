//! Service registries plugged into the environment, as Istio's `serviceregistry.Instance` and the
//! aggregate controller: each turns what it watches into services and endpoints; the environment
//! serves the union.

use std::sync::{Arc, Mutex, PoisonError};

use std::collections::BTreeSet;

use config_sources::ConfigEvent;
use model::service::Endpoints;
use model::{Service, ServiceKey};
use registry::{RegistryDiff, RegistrySnapshot, ServiceEntryRegistry};

/// One service registry.
pub trait ServiceRegistry: Send + Sync {
    /// Istio's provider ID: `External` for ServiceEntries, `Kubernetes`.
    fn provider(&self) -> &str;

    /// Istio config changed. Registries built from Istio config (ServiceEntries, WorkloadEntries)
    /// apply the events they read and return what changed; others return nothing.
    fn config_changed(&self, events: &[ConfigEvent]) -> RegistryDiff;

    /// Workloads of another registry may have changed in these namespaces (Kubernetes Pods; see
    /// `RegistryDiff::workload_namespaces`). Registries whose services select workloads
    /// (ServiceEntry `workloadSelector`) select again and return what changed; others return
    /// nothing.
    fn workloads_changed(&self, _namespaces: &BTreeSet<String>) -> RegistryDiff {
        RegistryDiff::default()
    }

    /// The workloads of a namespace that other registries' services may select (Kubernetes: its
    /// ready Pods, shaped as WorkloadEntries, keyed as Pods).
    fn workload_instances(&self, _namespace: &str) -> Vec<Arc<model::Config>> {
        Vec::new()
    }

    /// The services and endpoints as of the last change.
    fn snapshot(&self) -> Arc<RegistrySnapshot>;

    /// What the registry knows of the workload of a proxy (its IP, its ID `pod.namespace`, its
    /// namespace): its labels and locality (Kubernetes: the Pod's labels, its Node's topology).
    fn workload(&self, _ip: &str, _id: &str, _namespace: &str) -> Option<Workload> {
        None
    }
}

/// A workload as a registry knows it, to complete a proxy's node metadata.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Workload {
    pub labels: std::collections::BTreeMap<String, String>,
    /// `region/zone/subzone`, empty when unknown.
    pub locality: String,
    /// The ports of the Services that select it (Kubernetes: the Services whose selector matches
    /// the Pod's labels); `None`: its service instances are the endpoints at its IPs.
    pub service_targets: Option<Vec<model::WorkloadTarget>>,
}

/// A registry shared with whatever keeps it up to date (e.g. its watcher).
impl<T: ServiceRegistry + ?Sized> ServiceRegistry for Arc<T> {
    fn provider(&self) -> &str {
        self.as_ref().provider()
    }

    fn config_changed(&self, events: &[ConfigEvent]) -> RegistryDiff {
        self.as_ref().config_changed(events)
    }

    fn workloads_changed(&self, namespaces: &BTreeSet<String>) -> RegistryDiff {
        self.as_ref().workloads_changed(namespaces)
    }

    fn workload_instances(&self, namespace: &str) -> Vec<Arc<model::Config>> {
        self.as_ref().workload_instances(namespace)
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

    /// ServiceEntries that also select the workloads of these registries (Kubernetes Pods), as
    /// Istio's ServiceEntry controller selects Pods. Each change of theirs reaches this registry
    /// through the environment (`RegistryDiff::workload_namespaces`).
    pub fn with_workloads(mesh: Arc<model::MeshConfig>, sources: Vec<Arc<dyn ServiceRegistry>>) -> ServiceEntries {
        let source: registry::WorkloadSource =
            Arc::new(move |ns: &str| sources.iter().flat_map(|r| r.workload_instances(ns)).collect());
        ServiceEntries(Mutex::new(ServiceEntryRegistry::new(mesh).with_workloads(source)))
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

    fn workloads_changed(&self, namespaces: &BTreeSet<String>) -> RegistryDiff {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .workloads_changed(namespaces)
    }

    fn snapshot(&self) -> Arc<RegistrySnapshot> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).snapshot()
    }
}

/// The union of the registries' snapshots. A (hostname, namespace) that several registries
/// define keeps the first registry's service, and the endpoints of all of them.
pub(crate) fn aggregate(registries: &[Box<dyn ServiceRegistry>]) -> Arc<RegistrySnapshot> {
    let snapshots: Vec<Arc<RegistrySnapshot>> = registries.iter().map(|r| r.snapshot()).collect();
    match snapshots.as_slice() {
        [] => Arc::default(),
        [one] => one.clone(),
        all => {
            let keys: BTreeSet<&ServiceKey> = all.iter().flat_map(|s| s.endpoints.keys()).collect();
            let endpoints = keys
                .into_iter()
                .filter_map(|k| merged_endpoints(all, k).map(|e| (k.clone(), e)))
                .collect();
            Arc::new(RegistrySnapshot {
                services: merged_services(all),
                endpoints,
            })
        }
    }
}

/// The union after `diff`, from the union before it: the services merged again only when some
/// changed (a full push follows anyway), and the endpoints of the changed services only; the rest
/// is shared with `previous`. Equal to [`aggregate`].
pub(crate) fn aggregate_changed(
    previous: &RegistrySnapshot,
    registries: &[Box<dyn ServiceRegistry>],
    diff: &RegistryDiff,
) -> Arc<RegistrySnapshot> {
    let snapshots: Vec<Arc<RegistrySnapshot>> = registries.iter().map(|r| r.snapshot()).collect();
    if let [one] = snapshots.as_slice() {
        return one.clone();
    }
    let changed = diff.endpoints_changed.iter().chain(&diff.services_changed);
    let mut next = previous.with_endpoints(changed.map(|k| (k.clone(), merged_endpoints(&snapshots, k))));
    if !diff.services_changed.is_empty() {
        next.services = merged_services(&snapshots);
    }
    Arc::new(next)
}

/// One service per (hostname, namespace), the first registry's, sorted.
fn merged_services(snapshots: &[Arc<RegistrySnapshot>]) -> Arc<Vec<Arc<Service>>> {
    let mut keys = BTreeSet::new();
    let mut services: Vec<Arc<Service>> = snapshots
        .iter()
        .flat_map(|s| s.services.iter())
        .filter(|s| keys.insert(ServiceKey::of(s)))
        .cloned()
        .collect();
    services.sort_by(|a, b| (&a.hostname, a.namespace()).cmp(&(&b.hostname, b.namespace())));
    Arc::new(services)
}

/// The endpoints every registry has for `key`, in registry order.
fn merged_endpoints(snapshots: &[Arc<RegistrySnapshot>], key: &ServiceKey) -> Option<Endpoints> {
    let mut found = snapshots.iter().filter_map(|s| s.endpoints.get(key));
    let first = found.next()?;
    let rest: Vec<&Endpoints> = found.collect();
    if rest.is_empty() {
        return Some(first.clone());
    }
    let mut all = first.as_ref().clone();
    for e in rest {
        all.extend(e.iter().cloned());
    }
    Some(Arc::new(all))
}
