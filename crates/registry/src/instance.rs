//! The seam every service registry plugs into, as Istio's `serviceregistry.Instance`: each turns
//! what it watches into services and endpoints; the environment serves their union
//! ([`crate::aggregate`]). [`ServiceEntries`] is the ServiceEntry registry behind it.

use std::sync::{Arc, Mutex, PoisonError, RwLock};

use std::collections::BTreeSet;

use crate::{RegistryDiff, RegistrySnapshot, ServiceEntryRegistry};
use model::ConfigEvent;

/// One service registry.
pub trait ServiceRegistry: Send + Sync {
    /// Istio's provider ID: `External` for ServiceEntries, `Kubernetes`.
    fn provider(&self) -> &str;

    /// Istio's `Cluster()`: the ID of the cluster a Kubernetes registry reads; empty for the
    /// registries of no cluster.
    fn cluster_id(&self) -> &str {
        ""
    }

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

    /// The namespaces it has such workloads in (a registry that joins or leaves changes them).
    fn workload_namespaces(&self) -> BTreeSet<String> {
        BTreeSet::new()
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

    fn cluster_id(&self) -> &str {
        self.as_ref().cluster_id()
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

    fn workload_namespaces(&self) -> BTreeSet<String> {
        self.as_ref().workload_namespaces()
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

    /// ServiceEntries that also select the workloads of these registries (Kubernetes Pods, of
    /// every cluster), as Istio's ServiceEntry controller selects Pods. Each change of theirs
    /// reaches this registry through the environment (`RegistryDiff::workload_namespaces`).
    pub fn with_workloads(mesh: Arc<model::MeshConfig>, sources: WorkloadSources) -> ServiceEntries {
        let source: crate::WorkloadSource = Arc::new(move |ns: &str| sources.instances(ns));
        ServiceEntries(Mutex::new(ServiceEntryRegistry::new(mesh).with_workloads(source)))
    }
}

/// The registries whose workloads ServiceEntries select: shared by the ServiceEntry registry,
/// which reads them, and the environment, which adds and removes clusters.
#[derive(Clone, Default)]
pub struct WorkloadSources(Arc<RwLock<Vec<Arc<dyn ServiceRegistry>>>>);

impl std::fmt::Debug for WorkloadSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let clusters: Vec<String> = self.read().iter().map(|r| r.cluster_id().to_owned()).collect();
        f.debug_tuple("WorkloadSources").field(&clusters).finish()
    }
}

impl WorkloadSources {
    pub fn new(registries: Vec<Arc<dyn ServiceRegistry>>) -> WorkloadSources {
        WorkloadSources(Arc::new(RwLock::new(registries)))
    }

    /// Adds `registry`, in place of the registries of its cluster (when it names one).
    pub fn add(&self, registry: Arc<dyn ServiceRegistry>) {
        let mut all = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let cluster = registry.cluster_id().to_owned();
        all.retain(|r| cluster.is_empty() || r.cluster_id() != cluster);
        all.push(registry);
    }

    /// Removes the registries of `cluster`.
    pub fn remove_cluster(&self, cluster: &str) {
        if cluster.is_empty() {
            return;
        }
        let mut all = self.0.write().unwrap_or_else(PoisonError::into_inner);
        all.retain(|r| r.cluster_id() != cluster);
    }

    fn instances(&self, namespace: &str) -> Vec<Arc<model::Config>> {
        self.read()
            .iter()
            .flat_map(|r| r.workload_instances(namespace))
            .collect()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<dyn ServiceRegistry>>> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
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
