//! The Kubernetes objects the registry was told about, with the indexes that keep a change's work
//! proportional to what it touches (as Istio's informer indexes): EndpointSlices by Service and by
//! the Pods their endpoints name, Pods by IP. Applying an event records which Services and Pods
//! it may affect; the controller converts only those.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;

use crate::controller::{Change, KubeEvent};
use crate::conversion::SERVICE_NAME_LABEL;

/// (namespace, name).
pub(crate) type NsName = (String, String);

pub(crate) fn key<K: ResourceExt>(o: &K) -> NsName {
    (o.namespace().unwrap_or_default(), o.name_any())
}

#[derive(Debug, Default)]
pub(crate) struct Objects {
    pub services: BTreeMap<NsName, KubeService>,
    pub slices: BTreeMap<NsName, EndpointSlice>,
    /// EndpointSlices by the Service they belong to (`kubernetes.io/service-name`).
    slices_by_service: HashMap<NsName, BTreeSet<NsName>>,
    /// EndpointSlices by the Pods their endpoints refer to (`targetRef` of kind Pod).
    slices_by_pod: HashMap<NsName, BTreeSet<NsName>>,
    pub pods: BTreeMap<NsName, Pod>,
    /// Pod IPs to the Pods with that IP (several for hostNetwork Pods), to find a proxy's Pod.
    pods_by_ip: HashMap<String, BTreeSet<NsName>>,
    pub nodes: BTreeMap<String, Node>,
    pub namespaces: BTreeMap<String, Namespace>,
}

/// What a batch of events may have changed.
#[derive(Debug, Default)]
pub(crate) struct Affected {
    /// Everything may have changed (a re-list, a Node or a Namespace): convert all again.
    pub all: bool,
    pub services: BTreeSet<NsName>,
    pub pods: BTreeSet<NsName>,
    /// IPs of Pods that appeared or whose labels changed (Istio's `ProxyUpdate`).
    pub proxies: BTreeSet<String>,
}

impl Objects {
    /// The EndpointSlices of a Service.
    pub fn slices_of(&self, service: &NsName) -> impl Iterator<Item = &EndpointSlice> {
        self.slices_by_service
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|k| self.slices.get(k))
    }

    /// A proxy's Pod, as istiod's `getPodByProxy`: the Pod its ID names (`<pod>.<namespace>`,
    /// in the proxy's namespace), else the Pod of its IP in the proxy's namespace (several Pods
    /// share an IP on the host network; one of another namespace is never taken for the proxy's).
    pub fn pod_of_proxy(&self, ip: &str, id: &str, namespace: &str) -> Option<&Pod> {
        if let Some((name, ns)) = id.split_once('.')
            && ns == namespace
            && let Some(p) = self.pods.get(&(ns.to_owned(), name.to_owned()))
        {
            return Some(p);
        }
        self.pods_by_ip
            .get(ip)?
            .iter()
            .find(|(ns, _)| ns == namespace)
            .and_then(|k| self.pods.get(k))
    }

    pub fn apply(&mut self, e: KubeEvent, affected: &mut Affected) {
        match e {
            KubeEvent::Service(c) => match c {
                Change::Apply(s) => {
                    let k = key(&s);
                    affected.services.insert(k.clone());
                    self.services.insert(k, s);
                }
                Change::Delete(s) => {
                    let k = key(&s);
                    affected.services.insert(k.clone());
                    self.services.remove(&k);
                }
                Change::Replace(all) => {
                    affected.all = true;
                    replace_all(&mut self.services, all, key);
                }
            },
            KubeEvent::EndpointSlice(c) => match c {
                Change::Apply(s) => {
                    let k = key(&s);
                    self.remove_slice(&k, affected);
                    self.insert_slice(k, s, affected);
                }
                Change::Delete(s) => self.remove_slice(&key(&s), affected),
                Change::Replace(all) => {
                    affected.all = true;
                    self.slices.clear();
                    self.slices_by_service.clear();
                    self.slices_by_pod.clear();
                    for s in all {
                        self.insert_slice(key(&s), s, affected);
                    }
                }
            },
            KubeEvent::Pod(c) => match c {
                Change::Apply(p) => {
                    let k = key(&p);
                    self.pod_affects(&k, affected);
                    let old = self.pods.get(&k);
                    if old.is_none_or(|old| old.metadata.labels != p.metadata.labels) {
                        affected.proxies.extend(pod_ips(&p));
                    }
                    if let Some(old) = old {
                        for ip in pod_ips(old) {
                            remove_from(&mut self.pods_by_ip, &ip, &k);
                        }
                    }
                    for ip in pod_ips(&p) {
                        self.pods_by_ip.entry(ip).or_default().insert(k.clone());
                    }
                    self.pods.insert(k, p);
                }
                Change::Delete(p) => {
                    let k = key(&p);
                    self.pod_affects(&k, affected);
                    if let Some(old) = self.pods.remove(&k) {
                        for ip in pod_ips(&old) {
                            remove_from(&mut self.pods_by_ip, &ip, &k);
                        }
                    }
                }
                Change::Replace(all) => {
                    affected.all = true;
                    let mut old = std::mem::take(&mut self.pods);
                    for p in all {
                        let k = key(&p);
                        if old.remove(&k).is_none_or(|o| o.metadata.labels != p.metadata.labels) {
                            affected.proxies.extend(pod_ips(&p));
                        }
                        self.pods.insert(k, p);
                    }
                    self.pods_by_ip.clear();
                    for (k, p) in &self.pods {
                        for ip in pod_ips(p) {
                            self.pods_by_ip.entry(ip).or_default().insert(k.clone());
                        }
                    }
                }
            },
            // Nodes change rarely; their labels give the locality of every endpoint on them.
            KubeEvent::Node(c) => {
                affected.all = true;
                match c {
                    Change::Apply(n) => {
                        self.nodes.insert(n.name_any(), n);
                    }
                    Change::Delete(n) => {
                        self.nodes.remove(&n.name_any());
                    }
                    Change::Replace(all) => replace_all(&mut self.nodes, all, |n| n.name_any()),
                }
            }
            // A namespace's labels decide whether discoverySelectors select it.
            KubeEvent::Namespace(c) => {
                affected.all = true;
                match c {
                    Change::Apply(n) => {
                        self.namespaces.insert(n.name_any(), n);
                    }
                    Change::Delete(n) => {
                        self.namespaces.remove(&n.name_any());
                    }
                    Change::Replace(all) => replace_all(&mut self.namespaces, all, |n| n.name_any()),
                }
            }
        }
    }

    /// A Pod changed: the Services with an endpoint on it, and the Pod as a workload.
    fn pod_affects(&self, pod: &NsName, affected: &mut Affected) {
        affected.pods.insert(pod.clone());
        for s in self.slices_by_pod.get(pod).into_iter().flatten() {
            if let Some(service) = self.slices.get(s).and_then(slice_service) {
                affected.services.insert(service);
            }
        }
    }

    fn insert_slice(&mut self, k: NsName, s: EndpointSlice, affected: &mut Affected) {
        if let Some(service) = slice_service(&s) {
            affected.services.insert(service.clone());
            self.slices_by_service.entry(service).or_default().insert(k.clone());
        }
        for pod in slice_pods(&s) {
            self.slices_by_pod.entry(pod).or_default().insert(k.clone());
        }
        self.slices.insert(k, s);
    }

    fn remove_slice(&mut self, k: &NsName, affected: &mut Affected) {
        let Some(old) = self.slices.remove(k) else {
            return;
        };
        if let Some(service) = slice_service(&old) {
            remove_from(&mut self.slices_by_service, &service, k);
            affected.services.insert(service);
        }
        for pod in slice_pods(&old) {
            remove_from(&mut self.slices_by_pod, &pod, k);
        }
    }
}

fn remove_from<A: std::hash::Hash + Eq>(index: &mut HashMap<A, BTreeSet<NsName>>, at: &A, k: &NsName) {
    if let Some(set) = index.get_mut(at) {
        set.remove(k);
        if set.is_empty() {
            index.remove(at);
        }
    }
}

/// Replaces a map's contents with `items`, keyed by `key`.
fn replace_all<K: Ord, T>(map: &mut BTreeMap<K, T>, items: Vec<T>, key: impl Fn(&T) -> K) {
    map.clear();
    for i in items {
        map.insert(key(&i), i);
    }
}

/// A Pod's IPs (`podIPs`, and `podIP` for older objects).
pub(crate) fn pod_ips(p: &Pod) -> Vec<String> {
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
fn slice_service(s: &EndpointSlice) -> Option<NsName> {
    let name = s.labels().get(SERVICE_NAME_LABEL)?;
    Some((s.namespace().unwrap_or_default(), name.clone()))
}

/// The Pods an EndpointSlice's endpoints refer to (in the slice's namespace).
fn slice_pods(s: &EndpointSlice) -> BTreeSet<NsName> {
    let ns = s.namespace().unwrap_or_default();
    s.endpoints
        .iter()
        .filter_map(|e| e.target_ref.as_ref())
        .filter(|r| r.kind.as_deref() == Some("Pod"))
        .filter_map(|r| r.name.clone())
        .map(|name| (ns.clone(), name))
        .collect()
}
