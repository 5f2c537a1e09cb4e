//! The Kubernetes registry's state, as Istio's kube `Controller`: the Services, EndpointSlices,
//! Pods and Nodes it was told about, the services and endpoints converted from them, and what each
//! change did to them (a full push for services, EDS for endpoints).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use model::{Endpoint, Service, ServiceKey};
use registry::{RegistryDiff, RegistrySnapshot};

use crate::conversion::{
    Context, PodInfo, SERVICE_NAME_LABEL, convert_endpoints, convert_service, external_name_endpoints,
};

/// A change to objects of one kind.
#[derive(Debug, Clone)]
pub enum Change<K> {
    /// Added or modified.
    Apply(K),
    Delete(K),
    /// Everything of the kind, after a (re-)list: replaces what was known.
    Replace(Vec<K>),
}

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

type NsName = (String, String);

fn key<K: ResourceExt>(o: &K) -> NsName {
    (o.namespace().unwrap_or_default(), o.name_any())
}

#[derive(Debug, Default)]
struct Objects {
    services: BTreeMap<NsName, KubeService>,
    slices: BTreeMap<NsName, EndpointSlice>,
    pods: BTreeMap<NsName, Pod>,
    /// Pod IPs to the Pod, to find a proxy's Pod.
    pods_by_ip: std::collections::HashMap<String, NsName>,
    nodes: BTreeMap<String, Node>,
    namespaces: BTreeMap<String, Namespace>,
}

#[derive(Debug, Default)]
struct Inner {
    objects: Objects,
    /// Per Service (namespace, name): what it converts to.
    converted: BTreeMap<NsName, (Arc<Service>, Arc<Vec<Endpoint>>)>,
    snapshot: Arc<RegistrySnapshot>,
}

/// Which Services a change may affect.
enum Affected {
    All,
    Some(BTreeSet<NsName>),
}

impl Affected {
    fn add(&mut self, k: NsName) {
        if let Affected::Some(s) = self {
            s.insert(k);
        }
    }
}

/// The Kubernetes service registry.
#[derive(Debug)]
pub struct KubeRegistry {
    ctx: Context,
    inner: Mutex<Inner>,
}

/// Replaces a map's contents with `items`, keyed by `key`.
fn replace_all<K, T>(map: &mut BTreeMap<K, T>, items: Vec<T>, key: impl Fn(&T) -> K)
where
    K: Ord,
{
    map.clear();
    for i in items {
        map.insert(key(&i), i);
    }
}

impl KubeRegistry {
    pub fn new(ctx: Context) -> KubeRegistry {
        KubeRegistry {
            ctx,
            inner: Mutex::default(),
        }
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

    /// The Pod of a proxy: by IP, else by `name.namespace`.
    pub fn find_pod(&self, ip: &str, pod_name: &str, namespace: &str) -> Option<Pod> {
        let inner = self.lock();
        let o = &inner.objects;
        o.pods_by_ip
            .get(ip)
            .and_then(|k| o.pods.get(k))
            .or_else(|| o.pods.get(&(namespace.to_owned(), pod_name.to_owned())))
            .cloned()
    }

    /// The Node a Pod runs on.
    pub fn node(&self, name: &str) -> Option<Node> {
        self.lock().objects.nodes.get(name).cloned()
    }

    /// Applies changes and returns what they did to services and endpoints.
    pub fn apply(&self, events: Vec<KubeEvent>) -> RegistryDiff {
        let mut inner = self.lock();
        let mut affected = Affected::Some(BTreeSet::new());
        for e in events {
            apply_one(&mut inner.objects, e, &mut affected);
        }
        let keys: Vec<NsName> = match affected {
            Affected::All => inner
                .objects
                .services
                .keys()
                .chain(inner.converted.keys())
                .cloned()
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            Affected::Some(s) => s.into_iter().collect(),
        };
        let mut diff = RegistryDiff::default();
        for k in keys {
            let new = convert(&inner.objects, &k, &self.ctx);
            let old = inner.converted.get(&k).cloned();
            let (service_key, changed_service, changed_endpoints) = match (&old, &new) {
                (None, None) => continue,
                (Some((s, _)), None) => (ServiceKey::of(s), true, true),
                (None, Some((s, e))) => (ServiceKey::of(s), true, !e.is_empty()),
                (Some((os, oe)), Some((ns, ne))) => (ServiceKey::of(ns), os != ns, oe != ne),
            };
            if changed_service {
                diff.services_changed.insert(service_key.clone());
            }
            if changed_endpoints {
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
        if !diff.is_empty() {
            let snapshot = build_snapshot(&inner.converted);
            inner.snapshot = Arc::new(snapshot);
        }
        diff
    }
}

fn apply_one(o: &mut Objects, e: KubeEvent, affected: &mut Affected) {
    match e {
        KubeEvent::Service(c) => match c {
            Change::Apply(s) => {
                let k = key(&s);
                affected.add(k.clone());
                o.services.insert(k, s);
            }
            Change::Delete(s) => {
                let k = key(&s);
                affected.add(k.clone());
                o.services.remove(&k);
            }
            Change::Replace(all) => {
                *affected = Affected::All;
                replace_all(&mut o.services, all, key);
            }
        },
        KubeEvent::EndpointSlice(c) => match c {
            Change::Apply(s) => {
                let k = key(&s);
                if let Some(old) = o.slices.get(&k) {
                    add_slice_service(old, affected);
                }
                add_slice_service(&s, affected);
                o.slices.insert(k, s);
            }
            Change::Delete(s) => {
                add_slice_service(&s, affected);
                o.slices.remove(&key(&s));
            }
            Change::Replace(all) => {
                *affected = Affected::All;
                replace_all(&mut o.slices, all, key);
            }
        },
        KubeEvent::Pod(c) => match c {
            Change::Apply(p) => {
                add_pod_services(o, &p, affected);
                let k = key(&p);
                if let Some(old) = o.pods.get(&k) {
                    for ip in pod_ips(old) {
                        o.pods_by_ip.remove(&ip);
                    }
                }
                for ip in pod_ips(&p) {
                    o.pods_by_ip.insert(ip, k.clone());
                }
                o.pods.insert(k, p);
            }
            Change::Delete(p) => {
                add_pod_services(o, &p, affected);
                let k = key(&p);
                if let Some(old) = o.pods.remove(&k) {
                    for ip in pod_ips(&old) {
                        o.pods_by_ip.remove(&ip);
                    }
                }
            }
            Change::Replace(all) => {
                *affected = Affected::All;
                replace_all(&mut o.pods, all, key);
                o.pods_by_ip = o
                    .pods
                    .iter()
                    .flat_map(|(k, p)| pod_ips(p).into_iter().map(move |ip| (ip, k.clone())))
                    .collect();
            }
        },
        // Nodes change rarely; their labels give the locality of every endpoint on them.
        KubeEvent::Node(c) => {
            *affected = Affected::All;
            match c {
                Change::Apply(n) => {
                    o.nodes.insert(n.name_any(), n);
                }
                Change::Delete(n) => {
                    o.nodes.remove(&n.name_any());
                }
                Change::Replace(all) => replace_all(&mut o.nodes, all, |n| n.name_any()),
            }
        }
        // A namespace's labels decide whether discoverySelectors select it.
        KubeEvent::Namespace(c) => match c {
            Change::Apply(n) => {
                *affected = Affected::All;
                o.namespaces.insert(n.name_any(), n);
            }
            Change::Delete(n) => {
                *affected = Affected::All;
                o.namespaces.remove(&n.name_any());
            }
            Change::Replace(all) => {
                *affected = Affected::All;
                replace_all(&mut o.namespaces, all, |n| n.name_any());
            }
        },
    }
}

/// A Pod's IPs (`podIPs`, and `podIP` for older objects).
fn pod_ips(p: &Pod) -> Vec<String> {
    let Some(status) = p.status.as_ref() else {
        return Vec::new();
    };
    let mut ips: Vec<String> = status.pod_ips.iter().flatten().map(|i| i.ip.clone()).collect();
    if let Some(ip) = &status.pod_ip
        && !ips.contains(ip)
    {
        ips.push(ip.clone());
    }
    ips
}

/// The Service an EndpointSlice belongs to.
fn add_slice_service(s: &EndpointSlice, affected: &mut Affected) {
    if let Some(name) = s.labels().get(SERVICE_NAME_LABEL) {
        affected.add((s.namespace().unwrap_or_default(), name.clone()));
    }
}

/// The Services with an endpoint on this Pod.
fn add_pod_services(o: &Objects, p: &Pod, affected: &mut Affected) {
    let (ns, name) = key(p);
    for s in o
        .slices
        .values()
        .filter(|s| s.namespace().as_deref() == Some(ns.as_str()))
    {
        let refers = s.endpoints.iter().any(|e| {
            e.target_ref
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some("Pod") && r.name.as_deref() == Some(name.as_str()))
        });
        if refers {
            add_slice_service(s, affected);
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
            let slices = o.slices.values().filter(|s| {
                s.metadata.namespace.as_deref().unwrap_or_default() == k.0
                    && s.labels().get(SERVICE_NAME_LABEL) == Some(&k.1)
            });
            let pod = |name: &str| {
                let pod = o.pods.get(&(k.0.clone(), name.to_owned()))?;
                let node = pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .and_then(|n| o.nodes.get(n));
                Some(PodInfo { pod, node })
            };
            convert_endpoints(&service, publish, slices, pod, ctx)
        }
    };
    Some((Arc::new(service), Arc::new(endpoints)))
}

fn build_snapshot(converted: &BTreeMap<NsName, (Arc<Service>, Arc<Vec<Endpoint>>)>) -> RegistrySnapshot {
    let mut services: Vec<Arc<Service>> = converted.values().map(|(s, _)| s.clone()).collect();
    services.sort_by(|a, b| (a.hostname.as_str(), a.namespace()).cmp(&(b.hostname.as_str(), b.namespace())));
    let endpoints = converted
        .values()
        .filter(|(_, e)| !e.is_empty())
        .map(|(s, e)| (ServiceKey::of(s), e.clone()))
        .collect();
    RegistrySnapshot { services, endpoints }
}
