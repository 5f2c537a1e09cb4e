//! `Environment`: the configs and registries as of the last change, and the push request each
//! change makes, as Istio's config handler (`configHandler` in `pilot/pkg/bootstrap`) and the
//! ServiceEntry controller's `serviceEntryHandler` / `workloadEntryHandler`:
//!
//! - an Istio config (VirtualService, DestinationRule, Gateway, Sidecar, ...) that changed makes a
//!   full push covering that config (`ConfigUpdate`);
//! - ServiceEntries and WorkloadEntries reach pushes as the services they changed: a service
//!   added, removed or changed in shape, or a DNS service whose endpoints moved (its endpoints are
//!   in CDS), makes a full push (`ServiceUpdate`); endpoints that moved otherwise make an EDS-only
//!   push (`EndpointUpdate`);
//! - a change that changes nothing (e.g. a WorkloadEntry no ServiceEntry selects) makes none;
//! - Kubernetes Ingresses and IngressClasses (from either config source) are turned into
//!   Gateways and VirtualServices (`ingress::IngressTranslator`, Istio's ingress controller),
//!   again when they change or when a Service one of their named ports reads changes; the
//!   derived configs that changed make the push, as Istio's ingress controller's own events.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use config_sources::{ConfigChange, ConfigEvent};
use model::{Changed, Config, ConfigKey, ConfigKind, ConfigsUpdated, MeshConfig, PushRequest, TriggerReason};
use push_index::PushContext;
use registry::{RegistryDiff, RegistrySnapshot};

use registry::ServiceRegistry;
use registry::aggregate::{aggregate, aggregate_changed};

/// The control plane's view of the mesh.
pub struct Environment {
    /// The mesh config every push is built with; replaced live by [`mesh_changed`](Self::mesh_changed).
    pub(crate) mesh: Mutex<Arc<MeshConfig>>,
    /// meshNetworks as the endpoints read it.
    pub(crate) networks: Mutex<Arc<model::mesh_networks::NetworkIndex>>,
    pub(crate) domain: String,
    pub(crate) features: model::Features,
    pub(crate) state: Mutex<State>,
    pub(crate) seq: AtomicU64,
    /// The previous push's index, whose untouched per-kind indexes the next push reuses.
    pub(crate) last: Mutex<Option<Arc<PushContext>>>,
    /// The JWKS fetched for RequestAuthentications (pilot-discovery's resolver sets them).
    pub(crate) jwks: Mutex<Arc<push_index::security_policies::JwksKeys>>,
    /// How Ingresses are converted (the mesh's ingress settings, the domain, `K8S_INGRESS_NS`).
    pub(crate) ingress: ingress::IngressOptions,
    /// Where each push's SDS generator counts the credentials it refuses.
    pub(crate) sds_metrics: generators::SdsMetrics,
    /// The registries whose workloads the ServiceEntries select, when they select any: the
    /// Kubernetes registries that join are added to them.
    pub(crate) workload_sources: Option<registry::WorkloadSources>,
}

pub(crate) struct State {
    /// Every Istio config, by key; shared with a push being built, copied only if changed then.
    pub configs: Arc<BTreeMap<ConfigKey, Arc<Config>>>,
    pub registries: Vec<Box<dyn ServiceRegistry>>,
    /// The union of the registries.
    pub registry: Arc<RegistrySnapshot>,
    /// Configs per kind, for the gauges.
    pub counts: BTreeMap<ConfigKind, usize>,
    /// The Ingresses and IngressClasses, and the Gateways and VirtualServices made of them (served
    /// beside `configs`; a config source's config of the same key wins).
    pub ingress: ingress::IngressTranslator,
}

/// What a change calls for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Update {
    /// The push, if any.
    pub push: Option<PushRequest>,
    /// IPs of workloads that appeared or whose labels changed: the proxies there are initialised
    /// again and pushed (Istio's `ProxyUpdate`).
    pub proxies: BTreeSet<String>,
}

/// What the gauges show (`pilot_services`, `pilot_virt_services`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnvironmentStats {
    pub services: usize,
    pub virtual_services: usize,
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Environment {
    /// An empty environment over these registries (in priority order); feed it the config
    /// sources' initial state with [`config_changed`](Self::config_changed).
    pub fn new(mesh: Arc<MeshConfig>, domain: String, registries: Vec<Box<dyn ServiceRegistry>>) -> Environment {
        let registry = aggregate(&registries);
        Environment {
            features: model::Features::default(),
            state: Mutex::new(State {
                configs: Arc::default(),
                registries,
                registry,
                counts: BTreeMap::new(),
                ingress: ingress::IngressTranslator::new(),
            }),
            seq: AtomicU64::new(0),
            last: Mutex::new(None),
            jwks: Mutex::default(),
            sds_metrics: generators::SdsMetrics::default(),
            workload_sources: None,
            ingress: ingress::IngressOptions::new(&mesh, &domain, ingress::DEFAULT_INGRESS_NAMESPACE),
            mesh: Mutex::new(mesh),
            networks: Mutex::default(),
            domain,
        }
    }

    /// Counts the credentials SDS refuses in `metrics` (`pilot_sds_denied`, ...).
    /// The registries whose workloads the ServiceEntry registry selects (the list it was made
    /// `with_workloads`): Kubernetes registries that join later are added to it.
    pub fn with_workload_sources(mut self, sources: registry::WorkloadSources) -> Environment {
        self.workload_sources = Some(sources);
        self
    }

    pub fn with_sds_metrics(mut self, metrics: generators::SdsMetrics) -> Environment {
        self.sds_metrics = metrics;
        self
    }

    /// The namespace of the Gateways made from Ingresses (Istio's `K8S_INGRESS_NS`, default
    /// `istio-system`).
    pub fn with_ingress_namespace(mut self, namespace: &str) -> Environment {
        self.ingress.ingress_namespace = namespace.to_owned();
        self
    }

    /// The Gateways and VirtualServices made from Ingresses, and what of the Ingresses is not
    /// served.
    pub fn ingress_output(&self) -> ingress::Output {
        lock(&self.state).ingress.output().clone()
    }

    /// Istio's feature flags for every push (default: Istio's defaults).
    pub fn with_features(mut self, features: model::Features) -> Environment {
        self.features = features;
        self
    }

    /// The mesh config of the next push.
    pub fn mesh(&self) -> Arc<MeshConfig> {
        lock(&self.mesh).clone()
    }

    /// The mesh config changed (istiod's mesh watcher handler): the next push is built with
    /// `mesh`, from scratch, and goes to every proxy (a full push, as istiod's
    /// `meshHandler` asks). An unchanged mesh config asks for nothing. Settings read when
    /// the registries and the Ingress conversion were made (trust domain, discovery selectors,
    /// ingress settings) are not changed here.
    pub fn mesh_changed(&self, mesh: Arc<MeshConfig>) -> Update {
        {
            let mut current = lock(&self.mesh);
            if **current == *mesh {
                return Update::default();
            }
            *current = mesh;
        }
        *lock(&self.last) = None;
        Update {
            push: Some(PushRequest::full(model::TriggerReason::GlobalUpdate)),
            proxies: BTreeSet::new(),
        }
    }

    /// meshNetworks changed: every push from now on reads endpoints' networks and the gateways
    /// into them from it (Istio's `NetworksTrigger`, a full push).
    pub fn networks_changed(&self, networks: &model::mesh_networks::MeshNetworks) -> Update {
        let index = Arc::new(model::mesh_networks::NetworkIndex::new(networks));
        {
            let mut current = lock(&self.networks);
            if **current == *index {
                return Update::default();
            }
            *current = index;
        }
        Update {
            push: Some(PushRequest::full(model::TriggerReason::NetworksTrigger)),
            proxies: BTreeSet::new(),
        }
    }

    /// The JWKS that the RequestAuthentications of the current configs need fetched, each with
    /// the RequestAuthentications asking for it.
    pub fn jwks_wanted(&self) -> BTreeMap<push_index::security_policies::JwksKey, Vec<ConfigKey>> {
        let configs: Vec<Arc<Config>> = lock(&self.state)
            .configs
            .values()
            .filter(|c| c.kind == ConfigKind::RequestAuthentication)
            .cloned()
            .collect();
        push_index::security_policies::jwks_wanted(&configs)
    }

    /// Replaces the fetched JWKS; returns the push that brings them to the proxies (the
    /// RequestAuthentications in `users` changed, as Istio's key refresh pushes), if they changed.
    pub fn set_jwks(&self, jwks: push_index::security_policies::JwksKeys, users: Vec<ConfigKey>) -> Update {
        {
            let mut current = lock(&self.jwks);
            if **current == jwks {
                return Update::default();
            }
            *current = Arc::new(jwks);
        }
        Update {
            push: Some(PushRequest::configs(users)),
            proxies: BTreeSet::new(),
        }
    }

    /// The services and endpoints of every registry.
    pub fn registry(&self) -> Arc<RegistrySnapshot> {
        lock(&self.state).registry.clone()
    }

    pub fn stats(&self) -> EnvironmentStats {
        let st = lock(&self.state);
        let derived = st
            .ingress
            .output()
            .configs
            .keys()
            .filter(|k| k.kind == ConfigKind::VirtualService)
            .count();
        EnvironmentStats {
            services: st.registry.services.len(),
            virtual_services: st.counts.get(&ConfigKind::VirtualService).copied().unwrap_or_default() + derived,
        }
    }

    /// Applies one batch of config events from a config source; returns the push it calls for.
    pub fn config_changed(&self, change: &ConfigChange) -> Update {
        if change.is_empty() {
            return Update::default();
        }
        let mut configs_changed = BTreeSet::new();
        let mut st = lock(&self.state);
        let st = &mut *st;
        let configs = Arc::make_mut(&mut st.configs);
        let mut counts: BTreeMap<ConfigKind, isize> = BTreeMap::new();
        let mut ingresses_changed = false;
        for event in &change.events {
            let key = event.key();
            let before = match event.current() {
                Some(c) => configs.insert(key.clone(), c.clone()).is_some(),
                None => configs.remove(&key).is_some(),
            };
            let (config, deleted) = match event {
                ConfigEvent::Added(c) | ConfigEvent::Updated { new: c, .. } => (c, false),
                ConfigEvent::Deleted(c) => (c, true),
            };
            ingresses_changed |= st.ingress.apply(config, deleted);
            let after = event.current().is_some();
            *counts.entry(key.kind).or_default() += isize::from(after) - isize::from(before);
            // Registries' inputs push through the registry diff, not as config changes.
            if !registry::ServiceEntryRegistry::reads(key.kind) && !key.kind.is_kubernetes() {
                configs_changed.insert(key);
            }
        }
        for (kind, delta) in counts {
            let n = st.counts.entry(kind).or_default();
            *n = n.saturating_add_signed(delta);
        }
        let mut diff = RegistryDiff::default();
        for r in &st.registries {
            diff.merge(r.config_changed(&change.events));
        }
        let diff = registries_changed(st, diff);
        configs_changed.extend(self.translate_ingresses(st, ingresses_changed, &diff));
        update(configs_changed, diff)
    }

    /// A registry changed by itself (e.g. Kubernetes endpoints moved): serve its new snapshot,
    /// tell the other registries where workloads changed, and return the push `diff` calls
    /// for.
    pub fn services_changed(&self, diff: RegistryDiff) -> Update {
        if diff.is_empty() {
            return Update::default();
        }
        let mut st = lock(&self.state);
        let diff = registries_changed(&mut st, diff);
        let derived = self.translate_ingresses(&mut st, false, &diff);
        drop(st);
        update(derived.into_iter().collect(), diff)
    }

    /// A registry joins, as a remote cluster's when its secret is read (Istio's aggregate
    /// `AddRegistry`): a Kubernetes registry goes before the first registry of another provider
    /// (the config cluster's first, then the remote ones in the order they came), any other
    /// last. It replaces the registries of its cluster, if any. Everything it has is pushed.
    pub fn add_registry(&self, registry: Arc<dyn ServiceRegistry>) -> Update {
        let mut diff = everything(&registry.snapshot());
        // ServiceEntries select its workloads too (Istio's WorkloadInstance handlers of each
        // cluster): they select again in the namespaces it has workloads in.
        if let Some(sources) = &self.workload_sources
            && registry.provider() == registry::SERVICE_REGISTRY_KUBERNETES
        {
            sources.add(registry.clone());
        }
        diff.workload_namespaces = registry.workload_namespaces();
        let mut st = lock(&self.state);
        // The registry it replaces (a cluster whose credentials were rotated), in one step: no push
        // goes out without the cluster.
        let cluster = registry.cluster_id();
        if !cluster.is_empty() {
            let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut st.registries)
                .into_iter()
                .partition(|r| r.cluster_id() == cluster);
            st.registries = kept;
            for r in &gone {
                diff.merge(everything(&r.snapshot()));
                diff.workload_namespaces.extend(r.workload_namespaces());
            }
        }
        let at = if registry.provider() == registry::SERVICE_REGISTRY_KUBERNETES {
            st.registries
                .iter()
                .position(|r| r.provider() != registry::SERVICE_REGISTRY_KUBERNETES)
                .unwrap_or(st.registries.len())
        } else {
            st.registries.len()
        };
        st.registries.insert(at, Box::new(registry));
        let diff = registries_changed(&mut st, diff);
        let derived = self.translate_ingresses(&mut st, false, &diff);
        drop(st);
        update(derived.into_iter().collect(), diff)
    }

    /// The registries of this cluster leave (a remote cluster whose secret was deleted or
    /// rotated), and their services and endpoints with them (Istio's `DeleteRegistry`).
    pub fn remove_registry(&self, cluster_id: &str) -> Update {
        if let Some(sources) = &self.workload_sources {
            sources.remove_cluster(cluster_id);
        }
        let mut st = lock(&self.state);
        let (gone, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut st.registries)
            .into_iter()
            .partition(|r| !cluster_id.is_empty() && r.cluster_id() == cluster_id);
        st.registries = kept;
        let mut diff = RegistryDiff::default();
        for r in &gone {
            diff.merge(everything(&r.snapshot()));
            diff.workload_namespaces.extend(r.workload_namespaces());
        }
        let diff = registries_changed(&mut st, diff);
        let derived = self.translate_ingresses(&mut st, false, &diff);
        drop(st);
        update(derived.into_iter().collect(), diff)
    }

    /// The clusters of the Kubernetes registries, in order.
    pub fn clusters(&self) -> Vec<String> {
        lock(&self.state)
            .registries
            .iter()
            .filter(|r| r.provider() == registry::SERVICE_REGISTRY_KUBERNETES)
            .map(|r| r.cluster_id().to_owned())
            .collect()
    }

    /// Converts the Ingresses again when they changed or a Service they read did; returns the
    /// Gateways and VirtualServices that changed. New problems are logged.
    fn translate_ingresses(&self, st: &mut State, ingresses_changed: bool, diff: &RegistryDiff) -> Vec<ConfigKey> {
        let reads_changed_service = || {
            diff.services_changed
                .iter()
                .any(|k| st.ingress.reads_service(&k.hostname, &k.namespace))
        };
        if !ingresses_changed && !reads_changed_service() {
            return Vec::new();
        }
        let before = st.ingress.output().problems.clone();
        let ports = KubernetesPorts {
            registry: &st.registry,
            domain: &self.domain,
        };
        let changed = st.ingress.translate(&ports, &self.ingress);
        for p in st.ingress.output().problems.iter().filter(|p| !before.contains(p)) {
            tracing::warn!(resource = %p.resource, "Ingress not fully served: {}", p.message);
        }
        changed
    }
}

/// The ports of the registries' Kubernetes Services, for Ingress backends that name their port.
struct KubernetesPorts<'a> {
    registry: &'a RegistrySnapshot,
    domain: &'a str,
}

impl ingress::ServicePorts for KubernetesPorts<'_> {
    fn ports(&self, namespace: &str, name: &str) -> Option<Vec<(String, u32)>> {
        let hostname = format!("{name}.{namespace}.svc.{}", self.domain);
        self.registry
            .service(&hostname, namespace)
            // Istio reads the Kubernetes Service (the registry's provider ID `Kubernetes`).
            .filter(|s| s.attributes.service_registry == "Kubernetes")
            .map(|s| s.ports.iter().map(|p| (p.name.clone(), u32::from(p.port))).collect())
    }
}

/// Every service and endpoint list of `snapshot`, as changed: a registry that joins or leaves.
fn everything(snapshot: &RegistrySnapshot) -> RegistryDiff {
    let services = snapshot.services.iter().map(|s| model::ServiceKey::of(s));
    RegistryDiff {
        services_changed: services.chain(snapshot.endpoints.keys().cloned()).collect(),
        ..Default::default()
    }
}

/// After registries changed by `diff`: every registry hears of the namespaces where workloads
/// changed (a ServiceEntry may select them), and the union of the registries is served.
fn registries_changed(st: &mut State, mut diff: RegistryDiff) -> RegistryDiff {
    let namespaces = std::mem::take(&mut diff.workload_namespaces);
    if !namespaces.is_empty() {
        for r in &st.registries {
            diff.merge(r.workloads_changed(&namespaces));
        }
    }
    if diff.changes_services() {
        st.registry = aggregate_changed(&st.registry, &st.registries, &diff);
    }
    diff
}

fn update(configs: BTreeSet<ConfigKey>, mut diff: RegistryDiff) -> Update {
    let proxies = std::mem::take(&mut diff.proxies);
    Update {
        push: push_request(configs, diff),
        proxies,
    }
}

/// The push for changed Istio configs and a registry diff: full when a config or a service
/// changed, EDS-only when only endpoints moved, none when nothing did.
pub(crate) fn push_request(configs: BTreeSet<ConfigKey>, diff: RegistryDiff) -> Option<PushRequest> {
    let full = !configs.is_empty() || diff.needs_full_push();
    if !full {
        return (!diff.endpoints_changed.is_empty()).then(|| PushRequest::endpoints(diff.endpoints_changed));
    }
    let mut reasons = Vec::new();
    if !configs.is_empty() {
        reasons.push(TriggerReason::ConfigUpdate);
    }
    if diff.needs_full_push() {
        reasons.push(TriggerReason::ServiceUpdate);
    }
    if diff
        .endpoints_changed
        .iter()
        .any(|k| !diff.services_changed.contains(k))
    {
        reasons.push(TriggerReason::EndpointUpdate);
    }
    let changes = configs
        .into_iter()
        .map(Changed::Config)
        .chain(diff.services_changed.into_iter().map(Changed::Service))
        .chain(diff.endpoints_changed.into_iter().map(Changed::Service));
    Some(PushRequest {
        full: true,
        configs_updated: ConfigsUpdated::Only(changes.collect()),
        reason: reasons.into_iter().map(|r| (r, 1)).collect(),
        start: Instant::now(),
    })
}
