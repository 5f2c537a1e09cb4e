//! The Kubernetes registry's state, as Istio's kube `Controller`: the Services, EndpointSlices,
//! Pods and Nodes it was told about, the services and endpoints converted from them, and what each
//! change did to them (a full push for services, EDS for endpoints, workloads for the ServiceEntry
//! registry, proxy updates for Pods whose labels changed). A change converts only the Services
//! and Pods it touches (see `objects`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kclient::Change;
use model::{Config, Endpoint, Service, ServiceKey};
use registry::{RegistryDiff, RegistrySnapshot};

use crate::conversion::{
    Context, PodInfo, convert_endpoints, convert_service, external_name_endpoints, service_defects, slice_defects,
    workload_instance,
};
use crate::objects::{Affected, NsName, Objects};
use kclient::ObjectErrorLabels;

use crate::problems::{Defect, Problems, Source};

/// A change the watchers (or manifests) report. Pods are large, and events are short-lived.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum KubeEvent {
    Service(Change<KubeService>),
    EndpointSlice(Change<EndpointSlice>),
    Pod(Change<Pod>),
    Node(Change<Node>),
    Namespace(Change<Namespace>),
}

#[derive(Debug, Default)]
struct Inner {
    objects: Objects,
    /// Per Service (namespace, name): what it converts to.
    converted: BTreeMap<NsName, (Arc<Service>, Arc<Vec<Endpoint>>)>,
    snapshot: Arc<RegistrySnapshot>,
}

/// The Kubernetes service registry.
#[derive(Debug)]
pub struct KubeRegistry {
    ctx: Context,
    inner: Mutex<Inner>,
    problems: Arc<Problems>,
}

impl KubeRegistry {
    pub fn new(ctx: Context) -> KubeRegistry {
        KubeRegistry {
            ctx,
            inner: Mutex::default(),
            problems: Arc::default(),
        }
    }

    /// The registry, counting its objects' problems in `counter` (`pilot_k8s_object_errors`).
    pub fn counting_problems(
        mut self,
        counter: prometheus_client::metrics::family::Family<
            ObjectErrorLabels,
            prometheus_client::metrics::counter::Counter,
        >,
    ) -> KubeRegistry {
        self.problems = Arc::new(Problems::new(counter));
        self
    }

    /// Its objects that do not decode or convert whole (see `problems`).
    pub fn problems(&self) -> Arc<Problems> {
        self.problems.clone()
    }

    pub fn context(&self) -> &Context {
        &self.ctx
    }

    pub fn snapshot(&self) -> Arc<RegistrySnapshot> {
        self.lock().snapshot.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The Pod of a proxy (see `Objects::pod_of_proxy`): `id` is the proxy's ID (`pod.namespace`).
    pub fn find_pod(&self, ip: &str, id: &str, namespace: &str) -> Option<Pod> {
        self.lock().objects.pod_of_proxy(ip, id, namespace).cloned()
    }

    /// The ports of the Services selecting `pod` (see `targets::service_targets`).
    pub fn service_targets(&self, pod: &Pod) -> Option<Vec<model::WorkloadTarget>> {
        let inner = self.lock();
        let namespace = pod.metadata.namespace.clone().unwrap_or_default();
        let services = inner
            .objects
            .services
            .range((namespace.clone(), String::new())..)
            .take_while(|((ns, _), _)| *ns == namespace)
            .filter_map(|(k, svc)| Some((svc, inner.converted.get(k)?.0.as_ref())));
        crate::targets::service_targets(pod, services)
    }

    /// The ready Pods of a namespace as workloads for other registries' services (Istio's Pod
    /// `WorkloadInstance`s; see `conversion::workload_instance`), built when asked.
    pub fn workload_instances(&self, namespace: &str) -> Vec<Arc<Config>> {
        let inner = self.lock();
        let o = &inner.objects;
        o.pods_in(namespace)
            .filter_map(|(k, _)| workload(o, k, &self.ctx))
            .map(Arc::new)
            .collect()
    }

    /// The namespaces that have Pods.
    pub fn workload_namespaces(&self) -> BTreeSet<String> {
        self.lock().objects.pods.keys().map(|(ns, _)| ns.clone()).collect()
    }

    /// The Node a Pod runs on.
    pub fn node(&self, name: &str) -> Option<Node> {
        self.lock().objects.nodes.get(name).cloned()
    }

    /// Applies changes and returns what they did: services and endpoints, the namespaces where
    /// Pods (workloads for the other registries) changed, and the IPs of Pods whose labels changed.
    pub fn apply(&self, events: Vec<KubeEvent>) -> RegistryDiff {
        let mut inner = self.lock();
        let inner = &mut *inner;
        let mut affected = Affected::default();
        for e in events {
            match &e {
                KubeEvent::Service(c) => self.check(c, "Service", service_defects),
                KubeEvent::EndpointSlice(c) => self.check(c, "EndpointSlice", slice_defects),
                _ => {}
            }
            inner.objects.apply(e, &mut affected);
        }
        let services: Vec<NsName> = if affected.all {
            let o = &inner.objects;
            let all: BTreeSet<NsName> = o.services.keys().chain(inner.converted.keys()).cloned().collect();
            all.into_iter().collect()
        } else {
            affected.services.into_iter().collect()
        };
        let mut diff = RegistryDiff {
            proxies: affected.proxies,
            workload_namespaces: affected.pod_namespaces,
            ..Default::default()
        };
        let mut endpoint_updates = Vec::new();
        for k in services {
            let new = convert(&inner.objects, &k, &self.ctx);
            let old = inner.converted.get(&k).cloned();
            let (service_key, changed_service, changed_endpoints) = match (&old, &new) {
                (None, None) => continue,
                (Some((s, _)), None) => (ServiceKey::of(s), true, true),
                (None, Some((s, e))) => (ServiceKey::of(s), true, !e.is_empty()),
                (Some((os, oe)), Some((ns, ne))) => (ServiceKey::of(ns), os != ns, oe != ne),
            };
            // a headless Service's endpoints are its DNS answers (NDS): a full push, as Istio's
            let headless = new.iter().chain(&old).any(|(s, _)| model::service::is_headless(s));
            if changed_service || (changed_endpoints && headless) {
                diff.services_changed.insert(service_key.clone());
            }
            if changed_endpoints {
                let eps = new.as_ref().map(|(_, e)| e.clone());
                endpoint_updates.push((service_key.clone(), eps));
                diff.endpoints_changed.insert(service_key);
            }
            match new {
                Some(v) if changed_service || changed_endpoints || old.is_none() => {
                    inner.converted.insert(k, v);
                }
                Some(_) => {}
                None => {
                    inner.converted.remove(&k);
                }
            }
        }
        // The next snapshot shares what did not change with the last one.
        if diff.changes_services() {
            let mut next = inner.snapshot.with_endpoints(endpoint_updates);
            if !diff.services_changed.is_empty() {
                next.services = Arc::new(sorted_services(&inner.converted));
            }
            inner.snapshot = Arc::new(next);
        }
        diff
    }
}

impl KubeRegistry {
    /// Records what the conversion drops of the changed objects (logged and counted once).
    fn check<K: kube::Resource>(&self, change: &Change<K>, kind: &'static str, defects: fn(&K) -> Vec<Defect>) {
        let id = |o: &K| {
            (
                o.meta().namespace.clone().unwrap_or_default(),
                o.meta().name.clone().unwrap_or_default(),
            )
        };
        match change {
            Change::Apply(o) => {
                let (ns, name) = id(o);
                self.problems.set(kind, &ns, &name, Source::Convert, defects(o));
            }
            Change::Delete(o) => {
                let (ns, name) = id(o);
                self.problems.set(kind, &ns, &name, Source::Convert, Vec::new());
            }
            Change::Replace(all) => {
                let now = all
                    .iter()
                    .map(|o| {
                        let (ns, name) = id(o);
                        (ns, name, defects(o))
                    })
                    .filter(|(_, _, d)| !d.is_empty())
                    .collect();
                self.problems.replace(kind, Source::Convert, now);
            }
        }
    }
}

/// Whether discoverySelectors select `namespace` (Istio: a namespace matching any selector; all
/// namespaces when there are none; a namespace not known yet matches none).
fn selected(o: &Objects, namespace: &str, ctx: &Context) -> bool {
    if ctx.discovery_selectors.is_empty() {
        return true;
    }
    let Some(ns) = o.namespaces.get(namespace) else {
        return false;
    };
    let empty = BTreeMap::new();
    let labels = ns.metadata.labels.as_ref().unwrap_or(&empty);
    ctx.discovery_selectors.iter().any(|s| s.matches(labels))
}

fn convert(o: &Objects, k: &NsName, ctx: &Context) -> Option<(Arc<Service>, Arc<Vec<Endpoint>>)> {
    if !selected(o, &k.0, ctx) {
        return None;
    }
    let svc = o.services.get(k)?;
    let service = convert_service(svc, ctx)?;
    let spec = svc.spec.as_ref();
    let endpoints = match spec
        .and_then(|s| s.external_name.as_deref())
        .filter(|_| service.mesh_external)
    {
        Some(name) => external_name_endpoints(&service, name),
        None => {
            let publish = spec.and_then(|s| s.publish_not_ready_addresses).unwrap_or(false);
            let slices = o.slices_of(k);
            let pod = |name: &str| {
                let pod = o.pods.get(&(k.0.clone(), name.to_owned()))?;
                let node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .and_then(|n| o.nodes.get(n));
                Some(PodInfo { pod, node })
            };
            // Istio's `networkFromSystemNamespace`: the network label of the cluster's system
            // namespace, for the Pods without one of their own (a Namespace change converts all again)
            let cluster_network = o
                .namespaces
                .get(&ctx.system_namespace)
                .and_then(|n| n.metadata.labels.as_ref())
                .and_then(|l| l.get(registry::TOPOLOGY_NETWORK))
                .map_or("", String::as_str);
            convert_endpoints(&service, publish, slices, pod, (ctx, cluster_network))
        }
    };
    Some((Arc::new(service), Arc::new(endpoints)))
}

/// The Pod as a workload for the other registries, if it is one.
fn workload(o: &Objects, k: &NsName, ctx: &Context) -> Option<Config> {
    if !selected(o, &k.0, ctx) {
        return None;
    }
    let pod = o.pods.get(k)?;
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_ref())
        .and_then(|n| o.nodes.get(n));
    workload_instance(pod, node)
}

fn sorted_services(converted: &BTreeMap<NsName, (Arc<Service>, Arc<Vec<Endpoint>>)>) -> Vec<Arc<Service>> {
    let mut services: Vec<Arc<Service>> = converted.values().map(|(s, _)| s.clone()).collect();
    services.sort_by(|a, b| (a.hostname.as_str(), a.namespace()).cmp(&(b.hostname.as_str(), b.namespace())));
    services
}
