//! The Kubernetes objects the registry was told about, with the indexes that keep a change's work
//! proportional to what it touches (as Istio's informer indexes): EndpointSlices by Service and by
//! the Pods their endpoints name, Pods by IP. Applying an event records which Services and Pods
//! it may affect; the controller converts only those.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;

use kclient::Change;

use crate::controller::KubeEvent;
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
    slices_by_service: Index<NsName>,
    /// EndpointSlices by the Pods their endpoints refer to (`targetRef` of kind Pod).
    slices_by_pod: Index<NsName>,
    pub pods: BTreeMap<NsName, Pod>,
    /// Pod IPs to the Pods with that IP (several for hostNetwork Pods), to find a proxy's Pod.
    pods_by_ip: Index<String>,
    pub nodes: BTreeMap<String, Node>,
    pub namespaces: BTreeMap<String, Namespace>,
}

/// What a batch of events may have changed.
#[derive(Debug, Default)]
pub(crate) struct Affected {
    /// Everything may have changed (a re-list, a Node or a Namespace): convert all again.
    pub all: bool,
    pub services: BTreeSet<NsName>,
    /// Namespaces where a Pod changed, or whose Pods may be workloads differently (a Node's
    /// locality, a namespace's selection).
    pub pod_namespaces: BTreeSet<String>,
    /// IPs of Pods that appeared, whose labels changed, or that a changed Service selects (Istio's
    /// `ProxyUpdate`).
    pub proxies: BTreeSet<String>,
}

impl Objects {
    /// The Pods of a namespace.
    pub(crate) fn pods_in<'a>(&'a self, namespace: &str) -> impl Iterator<Item = (&'a NsName, &'a Pod)> {
        let from = (namespace.to_owned(), String::new());
        let ns = namespace.to_owned();
        self.pods.range(from..).take_while(move |((n, _), _)| *n == ns)
    }

    /// The namespaces that have Pods.
    fn pod_namespaces(&self) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        let mut next = self.pods.keys().next().map(|(ns, _)| ns.clone());
        while let Some(ns) = next {
            // Skip to the first Pod of the next namespace.
            next = self
                .pods
                .range((ns.clone(), String::new())..)
                .find(|((n, _), _)| *n != ns)
                .map(|((n, _), _)| n.clone());
            out.insert(ns);
        }
        out
    }

    /// The EndpointSlices of a Service.
    pub(crate) fn slices_of(&self, service: &NsName) -> impl Iterator<Item = &EndpointSlice> {
        self.slices_by_service
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|k| self.slices.get(k))
    }

    /// A proxy's Pod, as istiod's `getPodByProxy`: the Pod its ID names (`<pod>.<namespace>`,
    /// in the proxy's namespace), else the Pod of its IP in the proxy's namespace (several Pods
    /// share an IP on the host network; one of another namespace is never taken for the proxy's).
    pub(crate) fn pod_of_proxy(&self, ip: &str, id: &str, namespace: &str) -> Option<&Pod> {
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

    pub(crate) fn apply(&mut self, e: KubeEvent, affected: &mut Affected) {
        match e {
            KubeEvent::Service(c) => self.apply_service(c, affected),
            KubeEvent::EndpointSlice(c) => self.apply_slice(c, affected),
            KubeEvent::Pod(c) => self.apply_pod(c, affected),
            KubeEvent::Node(c) => self.apply_node(c, affected),
            KubeEvent::Namespace(c) => self.apply_namespace(c, affected),
        }
    }

    /// The proxies of the Pods a Service selects, before or after, have other service targets
    /// (Istio recomputes them at the full push a Service change makes).
    fn apply_service(&mut self, c: Change<KubeService>, affected: &mut Affected) {
        match c {
            Change::Apply(s) => {
                let k = key(&s);
                affected.services.insert(k.clone());
                if let Some(old) = self.services.get(&k) {
                    affected.proxies.extend(self.selected_pod_ips(old));
                }
                affected.proxies.extend(self.selected_pod_ips(&s));
                self.services.insert(k, s);
            }
            Change::Delete(s) => {
                let k = key(&s);
                affected.services.insert(k.clone());
                if let Some(old) = self.services.remove(&k) {
                    affected.proxies.extend(self.selected_pod_ips(&old));
                }
            }
            Change::Replace(all) => {
                affected.all = true;
                affected.proxies.extend(self.pods.values().flat_map(pod_ips));
                replace_all(&mut self.services, all, key);
            }
        }
    }

    fn apply_slice(&mut self, c: Change<EndpointSlice>, affected: &mut Affected) {
        match c {
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
        }
    }

    fn apply_pod(&mut self, c: Change<Pod>, affected: &mut Affected) {
        match c {
            Change::Apply(mut p) => {
                strip_pod(&mut p);
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
                    add_to(&mut self.pods_by_ip, ip, &k);
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
                affected.pod_namespaces.extend(self.pod_namespaces());
                let mut old = std::mem::take(&mut self.pods);
                for mut p in all {
                    strip_pod(&mut p);
                    let k = key(&p);
                    if old.remove(&k).is_none_or(|o| o.metadata.labels != p.metadata.labels) {
                        affected.proxies.extend(pod_ips(&p));
                    }
                    self.pods.insert(k, p);
                }
                affected.pod_namespaces.extend(self.pod_namespaces());
                self.pods_by_ip.clear();
                for (k, p) in &self.pods {
                    for ip in pod_ips(p) {
                        add_to(&mut self.pods_by_ip, ip, k);
                    }
                }
            }
        }
    }

    /// Nodes change rarely; their labels give the locality of every endpoint on them.
    fn apply_node(&mut self, c: Change<Node>, affected: &mut Affected) {
        affected.all = true;
        affected.pod_namespaces.extend(self.pod_namespaces());
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

    /// A namespace's labels decide whether discoverySelectors select it.
    fn apply_namespace(&mut self, c: Change<Namespace>, affected: &mut Affected) {
        affected.all = true;
        match c {
            Change::Apply(n) => {
                affected.pod_namespaces.insert(n.name_any());
                self.namespaces.insert(n.name_any(), n);
            }
            Change::Delete(n) => {
                affected.pod_namespaces.insert(n.name_any());
                self.namespaces.remove(&n.name_any());
            }
            Change::Replace(all) => {
                affected.pod_namespaces.extend(self.pod_namespaces());
                replace_all(&mut self.namespaces, all, |n| n.name_any());
            }
        }
    }

    /// The IPs of the Pods of its namespace that `svc` selects.
    fn selected_pod_ips(&self, svc: &KubeService) -> Vec<String> {
        let namespace = svc.metadata.namespace.clone().unwrap_or_default();
        self.pods_in(&namespace)
            .filter(|(_, p)| crate::targets::selects(svc, p.metadata.labels.as_ref()))
            .flat_map(|(_, p)| pod_ips(p))
            .collect()
    }

    /// A Pod changed: the Services with an endpoint on it, and the Pod as a workload.
    fn pod_affects(&self, pod: &NsName, affected: &mut Affected) {
        affected.pod_namespaces.insert(pod.0.clone());
        for s in self.slices_by_pod.get(pod).into_iter().flatten() {
            if let Some(service) = self.slices.get(s).and_then(slice_service) {
                affected.services.insert(service);
            }
        }
    }

    fn insert_slice(&mut self, k: NsName, s: EndpointSlice, affected: &mut Affected) {
        if let Some(service) = slice_service(&s) {
            affected.services.insert(service.clone());
            add_to(&mut self.slices_by_service, service, &k);
        }
        for pod in slice_pods(&s) {
            add_to(&mut self.slices_by_pod, pod, &k);
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

/// Objects by something they have: almost always one each (a Pod per IP, a slice per Pod), so a
/// short list rather than a set (a one-element BTreeSet allocates room for eleven).
type Index<A> = HashMap<A, Vec<NsName>>;

fn add_to<A: std::hash::Hash + Eq>(index: &mut Index<A>, at: A, k: &NsName) {
    let list = index.entry(at).or_default();
    if !list.contains(k) {
        list.push(k.clone());
    }
}

fn remove_from<A: std::hash::Hash + Eq>(index: &mut Index<A>, at: &A, k: &NsName) {
    if let Some(list) = index.get_mut(at) {
        list.retain(|x| x != k);
        if list.is_empty() {
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

/// Drops what the registry never reads from a Pod it keeps, as istiod's `StripPodUnusedFields`:
/// managed fields, the proxy-config annotation, containers other than their ports (and native
/// sidecar init containers with ports), container statuses. A cluster's Pods are mostly that.
fn strip_pod(p: &mut Pod) {
    p.metadata.managed_fields = None;
    if let Some(a) = p.metadata.annotations.as_mut() {
        a.remove("proxy.istio.io/config");
    }
    if let Some(spec) = p.spec.take() {
        let ports_only = |c: k8s_openapi::api::core::v1::Container| k8s_openapi::api::core::v1::Container {
            name: c.name,
            ports: c.ports,
            restart_policy: c.restart_policy,
            ..Default::default()
        };
        let has_ports = |c: &k8s_openapi::api::core::v1::Container| c.ports.as_ref().is_some_and(|p| !p.is_empty());
        let init: Vec<_> = spec
            .init_containers
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.restart_policy.as_deref() == Some("Always") && has_ports(c))
            .map(ports_only)
            .collect();
        p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            containers: spec.containers.into_iter().filter(has_ports).map(ports_only).collect(),
            init_containers: (!init.is_empty()).then_some(init),
            service_account_name: spec.service_account_name,
            node_name: spec.node_name,
            host_network: spec.host_network,
            hostname: spec.hostname,
            subdomain: spec.subdomain,
            ..Default::default()
        });
    }
    if let Some(status) = p.status.as_mut() {
        status.container_statuses = None;
        status.init_container_statuses = None;
        status.ephemeral_container_statuses = None;
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn kept_pods_lose_what_the_registry_never_reads() {
        let mut p: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "default", "labels": {"app": "a"},
                "annotations": {"proxy.istio.io/config": "{}", "keep": "me"},
                "managedFields": [{"manager": "kubectl", "operation": "Apply"}]},
            "spec": {"serviceAccountName": "sa", "nodeName": "n1",
                "containers": [{"name": "app", "image": "app", "env": [{"name": "A", "value": "b"}],
                                "ports": [{"name": "http", "containerPort": 8080}]},
                               {"name": "noports", "image": "x"}],
                "initContainers": [{"name": "init", "image": "x"},
                                   {"name": "native", "image": "x", "restartPolicy": "Always",
                                    "ports": [{"name": "admin", "containerPort": 9000}]}],
                "volumes": [{"name": "v", "emptyDir": {}}]},
            "status": {"podIP": "10.0.0.1", "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True"}],
                "containerStatuses": [{"name": "app", "image": "app", "imageID": "", "ready": true, "restartCount": 0}]}
        }))
        .unwrap();
        strip_pod(&mut p);
        assert!(p.metadata.managed_fields.is_none());
        let annotations = p.metadata.annotations.as_ref().unwrap();
        assert!(!annotations.contains_key("proxy.istio.io/config") && annotations.contains_key("keep"));
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.service_account_name.as_deref(), Some("sa"));
        assert_eq!(spec.node_name.as_deref(), Some("n1"));
        assert_eq!(spec.containers.len(), 1);
        assert!(spec.containers[0].env.is_none() && spec.containers[0].image.is_none());
        assert_eq!(spec.containers[0].ports.as_ref().unwrap()[0].container_port, 8080);
        let init = spec.init_containers.as_ref().unwrap();
        assert_eq!(init.len(), 1);
        assert_eq!(init[0].restart_policy.as_deref(), Some("Always"));
        assert!(spec.volumes.is_none());
        let status = p.status.as_ref().unwrap();
        assert!(status.container_statuses.is_none());
        assert_eq!(status.pod_ip.as_deref(), Some("10.0.0.1"));
        assert_eq!(status.conditions.as_ref().unwrap().len(), 1);
    }
}
