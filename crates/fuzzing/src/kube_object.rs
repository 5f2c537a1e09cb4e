//! Target `kube_object`: what the Kubernetes API server sends for one kind, a watch line or a
//! list page, through what pilot-discovery does with it: the informer's per-object decoding
//! (`kclient::decode`, client-go's reflector), then for the registry's kinds (Service,
//! EndpointSlice, Pod, Node, Namespace) the `KubeRegistry` update and its conversion into
//! services and endpoints (Istio's `serviceregistry/kube/controller`), and for the config kinds
//! (Secret, Ingress, IngressClass, Istio CRDs) the config source's parsing and validation
//! (Istio's `crdclient`) and, for Ingresses, their translation (Istio's `config/kube/ingress`).
//! Each starts from a cluster holding real objects of the kind, so that updates and deletes meet
//! something. Any bytes are either served, or named and dropped: a bug is a panic, an error or a
//! name longer than its bound, config of another kind served as this one, an event that changes
//! services again when applied twice, a port 0 or an endpoint address that is not an IP.
//!
//! Input: a mode byte (low 4 bits: the kind, see [`KINDS`]; bit 4: a list page, else a watch
//! line), then the body as sent.

use std::collections::BTreeMap;
use std::fmt::Debug;

use config_sources::crdclient::ConfigReader;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kclient::decode::{EXCERPT, Event, Undecodable, decode_event, decode_page};
use kclient::informer::Watched;
use kube::api::DynamicObject;
use kube_registry::problems::Source;
use kube_registry::{Change, Context, KubeEvent, KubeRegistry};
use model::ConfigKind;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// The kinds, by the mode byte's low 4 bits: the registry's, then the config source's.
pub(crate) const KINDS: [&str; 16] = [
    "Service",
    "EndpointSlice",
    "Pod",
    "Node",
    "Namespace",
    "Secret",
    "Ingress",
    "IngressClass",
    "VirtualService",
    "DestinationRule",
    "Gateway",
    "ServiceEntry",
    "WorkloadEntry",
    "Sidecar",
    "PeerAuthentication",
    "AuthorizationPolicy",
];
const LIST: u8 = 0x10;

pub fn kube_object(data: &[u8]) {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    let list = mode & LIST != 0;
    let kind = KINDS[usize::from(mode & 0x0f)];
    match kind {
        "Service" => registry::<Service>(kind, body, list, KubeEvent::Service),
        "EndpointSlice" => registry::<EndpointSlice>(kind, body, list, KubeEvent::EndpointSlice),
        "Pod" => registry::<Pod>(kind, body, list, KubeEvent::Pod),
        "Node" => registry::<Node>(kind, body, list, KubeEvent::Node),
        "Namespace" => registry::<Namespace>(kind, body, list, KubeEvent::Namespace),
        _ => config(kind, body, list),
    }
}

/// A text the informer builds from what the server sent: excerpts, and a few words around them.
fn bounded(what: &str, text: &str, excerpts: usize) {
    let max = excerpts * (EXCERPT + 40) + 200;
    assert!(
        text.chars().count() <= max,
        "{what} is {} characters (at most {max}): {}",
        text.chars().count(),
        text.chars().take(400).collect::<String>()
    );
}

fn check_undecodable(u: &Undecodable) {
    bounded("an undecodable object's reason", &u.reason, 1);
    bounded("an undecodable object's name", &u.name, 1);
    bounded("an undecodable object's namespace", &u.namespace, 1);
}

/// What the informer hands on for `body`, as it decodes a list page or a watch line.
fn decoded<K: DeserializeOwned + Debug>(body: &[u8], list: bool) -> Vec<Watched<K>> {
    let mut out = Vec::new();
    if list {
        let Ok(text) = std::str::from_utf8(body) else {
            return out; // the informer refuses an answer that is not UTF-8
        };
        match decode_page::<K>(text) {
            Ok(page) => {
                for u in page.undecodable {
                    assert!(u.listed, "{u:?}");
                    check_undecodable(&u);
                    out.push(Watched::Undecodable(u));
                }
                out.push(Watched::Change(Change::Replace(page.objects)));
            }
            Err(e) => bounded("a list error", &e, 2),
        }
        return out;
    }
    match decode_event::<K>(body) {
        Event::Change { change, .. } => out.push(Watched::Change(change)),
        Event::Undecodable { undecodable, .. } => {
            assert!(!undecodable.listed);
            check_undecodable(&undecodable);
            out.push(Watched::Undecodable(undecodable));
        }
        Event::Bookmark { version } => bounded("a bookmark's version", version.as_deref().unwrap_or(""), 100),
        Event::Error { reason, message, .. } => {
            bounded("an ERROR event's reason", &reason, 1);
            bounded("an ERROR event's message", &message, 1);
        }
        Event::Unknown { type_, line } => {
            bounded("an unknown event's type", &type_, 1);
            bounded("an unknown event's line", &line, 1);
        }
        Event::NotJson(message) => bounded("a line that is not JSON", &message, 2),
    }
    out
}

fn ctx() -> Context {
    Context {
        domain: "cluster.local".into(),
        trust_domain: "cluster.local".into(),
        cluster_id: "Kubernetes".into(),
        system_namespace: "istio-system".into(),
        discovery_selectors: Vec::new(),
    }
}

fn from<K: DeserializeOwned>(v: Value) -> K {
    serde_json::from_value(v).unwrap_or_else(|e| panic!("a seed object does not decode: {e}"))
}

/// The registry of a cluster with the seed objects (reviews, its slice, Pod, Node, namespace).
fn cluster() -> KubeRegistry {
    let r = KubeRegistry::new(ctx());
    r.apply(vec![
        KubeEvent::Namespace(Change::Replace(vec![from(object("Namespace"))])),
        KubeEvent::Node(Change::Replace(vec![from(object("Node"))])),
        KubeEvent::Pod(Change::Replace(vec![from(object("Pod"))])),
        KubeEvent::Service(Change::Replace(vec![from(object("Service"))])),
        KubeEvent::EndpointSlice(Change::Replace(vec![from(object("EndpointSlice"))])),
    ]);
    r
}

fn registry<K>(kind: &'static str, body: &[u8], list: bool, wrap: fn(Change<K>) -> KubeEvent)
where
    K: DeserializeOwned + Debug + Clone,
{
    let r = cluster();
    for w in decoded::<K>(body, list) {
        match w {
            // As the watcher does (watch.rs): named, the last good version stays.
            Watched::Undecodable(u) => r.problems().set(
                kind,
                &u.namespace,
                &u.name,
                Source::Decode,
                vec![("undecodable", format!("does not decode as a {kind}: {}", u.reason))],
            ),
            Watched::Change(c) => {
                r.apply(vec![wrap(c.clone())]);
                let again = r.apply(vec![wrap(c)]);
                assert!(
                    again.services_changed.is_empty() && again.endpoints_changed.is_empty(),
                    "a {kind} event applied again changed services or endpoints: {again:?}"
                );
            }
        }
    }
    let snapshot = r.snapshot();
    for s in snapshot.services.iter() {
        assert!(s.ports.iter().all(|p| p.port != 0), "a port 0: {s:?}");
        if s.resolution == model::Resolution::ClientSideLb {
            for e in snapshot.endpoints_of(&model::ServiceKey::of(s)) {
                assert!(
                    e.address.parse::<std::net::IpAddr>().is_ok(),
                    "endpoint address {:?} of {} is not an IP",
                    e.address,
                    s.hostname
                );
            }
        }
    }
    for e in r.problems().entries() {
        assert!(e.resource.is_some(), "{e:?}");
    }
}

fn config_kind(kind: &str) -> ConfigKind {
    config_sources::crdclient::CONFIG_KINDS
        .iter()
        .map(|r| r.kind)
        .find(|k| k.as_str() == kind)
        .unwrap_or_else(|| panic!("{kind} is not read from the API server"))
}

fn config(kind_name: &str, body: &[u8], list: bool) {
    let kind = config_kind(kind_name);
    let mut reader = ConfigReader::default();
    reader.read(kind, Watched::Change(Change::Replace(vec![from(object(kind_name))])));
    for w in decoded::<DynamicObject>(body, list) {
        reader.read(kind, w);
    }
    let state = reader.snapshot();
    for (key, c) in state.configs.iter() {
        assert_eq!(
            key.kind, kind,
            "a {} served as read from the {kind} list+watch",
            key.kind
        );
        assert_eq!(&c.key(), key);
    }
    for e in state.errors.iter() {
        assert!(
            e.resource.as_deref().is_some_and(|r| r.starts_with(kind.as_str())),
            "{e:?}"
        );
    }
    if matches!(kind, ConfigKind::Ingress | ConfigKind::IngressClass) {
        let mut translator = ingress::IngressTranslator::new();
        for c in state.configs.values() {
            translator.apply(c, false);
        }
        let ports: BTreeMap<(String, String), Vec<(String, u32)>> =
            BTreeMap::from([(("default".into(), "reviews".into()), vec![("http".into(), 9080)])]);
        let opts = ingress::IngressOptions::new(
            &model::MeshConfig::default(),
            "cluster.local",
            ingress::DEFAULT_INGRESS_NAMESPACE,
        );
        translator.translate(&ports, &opts);
        for key in translator.output().configs.keys() {
            assert!(
                matches!(key.kind, ConfigKind::Gateway | ConfigKind::VirtualService),
                "an Ingress made a {key}"
            );
        }
    }
}

/// A real object of each kind, as the API server sends it.
pub(crate) fn object(kind: &str) -> Value {
    let meta = |name: &str| {
        json!({"name": name, "namespace": "default", "resourceVersion": "41",
        "uid": "0b7c3c5e-8f0e-4b8a-9d5c-2f1a8e6c4d21", "labels": {"app": "reviews"}})
    };
    let istio = |version: &str, spec: Value| json!({"apiVersion": version, "kind": kind, "metadata": meta("reviews"), "spec": spec});
    match kind {
        "Service" => json!({"apiVersion": "v1", "kind": "Service", "metadata": meta("reviews"),
            "spec": {"clusterIP": "10.96.0.10", "clusterIPs": ["10.96.0.10"], "type": "ClusterIP",
                "selector": {"app": "reviews"}, "ipFamilies": ["IPv4"],
                "ports": [{"name": "http", "port": 9080, "protocol": "TCP", "targetPort": 9080},
                          {"name": "grpc-api", "port": 9090, "appProtocol": "grpc"}]}}),
        "EndpointSlice" => json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "reviews-x7k2p", "namespace": "default", "resourceVersion": "42",
                "labels": {"kubernetes.io/service-name": "reviews"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.1.0.7"], "conditions": {"ready": true, "serving": true},
                "nodeName": "node-1", "zone": "us-east1-b",
                "targetRef": {"kind": "Pod", "name": "reviews-v1-5d4c8", "namespace": "default"}}],
            "ports": [{"name": "http", "port": 9080, "protocol": "TCP"}]}),
        "Pod" => json!({"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "reviews-v1-5d4c8", "namespace": "default", "resourceVersion": "43",
                "labels": {"app": "reviews", "version": "v1", "security.istio.io/tlsMode": "istio"}},
            "spec": {"serviceAccountName": "bookinfo-reviews", "nodeName": "node-1",
                "containers": [{"name": "reviews", "image": "reviews:v1", "ports": [{"containerPort": 9080}]}]},
            "status": {"phase": "Running", "podIP": "10.1.0.7", "podIPs": [{"ip": "10.1.0.7"}],
                "conditions": [{"type": "Ready", "status": "True"}]}}),
        "Node" => json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1",
            "resourceVersion": "44", "labels": {"topology.kubernetes.io/region": "us-east1",
                "topology.kubernetes.io/zone": "us-east1-b"}}}),
        "Namespace" => json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "default",
            "resourceVersion": "45", "labels": {"istio-injection": "enabled"}}}),
        "Secret" => json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta("reviews-cert"),
            "type": "kubernetes.io/tls", "data": {"tls.crt": "LS0tLS1CRUdJTg==", "tls.key": "LS0tLS1CRUdJTg=="}}),
        "Ingress" => json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": meta("reviews"),
            "spec": {"ingressClassName": "istio", "tls": [{"hosts": ["reviews.example.com"], "secretName": "reviews-cert"}],
                "rules": [{"host": "reviews.example.com", "http": {"paths": [
                    {"path": "/api", "pathType": "Prefix", "backend": {"service": {"name": "reviews", "port": {"name": "http"}}}},
                    {"path": "/exact", "pathType": "Exact", "backend": {"service": {"name": "reviews", "port": {"number": 9080}}}}]}}]}}),
        "IngressClass" => json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass",
            "metadata": {"name": "istio", "resourceVersion": "46"}, "spec": {"controller": "istio.io/ingress-controller"}}),
        "VirtualService" => istio(
            "networking.istio.io/v1",
            json!({"hosts": ["reviews"],
            "http": [{"match": [{"uri": {"prefix": "/v2"}}], "route": [{"destination": {"host": "reviews", "subset": "v2"}}]},
                     {"route": [{"destination": {"host": "reviews", "subset": "v1"}, "weight": 100}]}]}),
        ),
        "DestinationRule" => istio(
            "networking.istio.io/v1",
            json!({"host": "reviews",
            "trafficPolicy": {"tls": {"mode": "ISTIO_MUTUAL"}},
            "subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}]}),
        ),
        "Gateway" => istio(
            "networking.istio.io/v1",
            json!({"selector": {"istio": "ingressgateway"},
            "servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]}),
        ),
        "ServiceEntry" => istio(
            "networking.istio.io/v1",
            json!({"hosts": ["api.example.com"],
            "ports": [{"number": 443, "name": "https", "protocol": "TLS"}], "resolution": "DNS", "location": "MESH_EXTERNAL"}),
        ),
        "WorkloadEntry" => istio(
            "networking.istio.io/v1",
            json!({"address": "10.2.0.4",
            "labels": {"app": "reviews", "version": "v3"}, "serviceAccount": "bookinfo-reviews"}),
        ),
        "Sidecar" => istio(
            "networking.istio.io/v1",
            json!({"egress": [{"hosts": ["./*", "istio-system/*"]}]}),
        ),
        "PeerAuthentication" => istio("security.istio.io/v1", json!({"mtls": {"mode": "STRICT"}})),
        "AuthorizationPolicy" => istio(
            "security.istio.io/v1",
            json!({"selector": {"matchLabels": {"app": "reviews"}},
            "action": "ALLOW", "rules": [{"from": [{"source": {"principals": ["cluster.local/ns/default/sa/productpage"]}}],
                "to": [{"operation": {"methods": ["GET"]}}]}]}),
        ),
        _ => panic!("no object of kind {kind}"),
    }
}

/// Each kind as a watch event (ADDED), the registry's kinds, an Ingress and a VirtualService
/// also as a list page, and one list with an item that does not decode.
pub(crate) fn seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for (i, kind) in KINDS.iter().enumerate() {
        let mode = u8::try_from(i).unwrap_or_default();
        let line = json!({"type": "ADDED", "object": object(kind)}).to_string();
        seeds.push([vec![mode], line.into_bytes()].concat());
    }
    for kind in [
        "Service",
        "EndpointSlice",
        "Pod",
        "Node",
        "Namespace",
        "Ingress",
        "VirtualService",
    ] {
        let mode = u8::try_from(KINDS.iter().position(|k| *k == kind).unwrap_or_default()).unwrap_or_default() | LIST;
        let mut item = object(kind);
        if let Some(o) = item.as_object_mut() {
            // Built-in kinds' list items carry no kind (the list does).
            o.remove("kind");
            o.remove("apiVersion");
        }
        let page = json!({"kind": format!("{kind}List"), "metadata": {"resourceVersion": "50", "continue": ""},
            "items": [item]});
        seeds.push([vec![mode], page.to_string().into_bytes()].concat());
    }
    let mut bad = object("Service");
    bad["spec"]["ports"] = json!({"http": 9080});
    let page = json!({"metadata": {"resourceVersion": "51"}, "items": [object("Service"), bad]});
    seeds.push([vec![LIST], page.to_string().into_bytes()].concat());
    seeds.push(
        [
            vec![1],
            json!({"type": "DELETED", "object": object("EndpointSlice")})
                .to_string()
                .into_bytes(),
        ]
        .concat(),
    );
    seeds
}

#[cfg(test)]
mod tests {
    /// The seeds are served whole: each registry seed converts to services with endpoints, each
    /// config seed is a valid config (else the fuzzer starts from errors only).
    #[test]
    fn seed_objects_are_valid() {
        let r = super::cluster();
        let snapshot = r.snapshot();
        assert_eq!(snapshot.services.len(), 1);
        assert_eq!(
            snapshot
                .endpoints_of(&model::ServiceKey::of(&snapshot.services[0]))
                .len(),
            1
        );
        assert!(r.problems().entries().is_empty(), "{:?}", r.problems().entries());
        for kind in &super::KINDS[5..] {
            let mut reader = config_sources::crdclient::ConfigReader::default();
            reader.read(
                super::config_kind(kind),
                kclient::informer::Watched::Change(kube_registry::Change::Replace(vec![super::from(super::object(
                    kind,
                ))])),
            );
            let state = reader.snapshot();
            assert!(state.errors.is_empty(), "{kind}: {:?}", state.errors);
            assert_eq!(state.configs.len(), 1, "{kind}");
        }
        for seed in super::seeds() {
            super::kube_object(&seed);
        }
    }
}
