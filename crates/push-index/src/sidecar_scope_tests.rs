//! Sidecar scoping through `PushContext`: which Sidecar applies, and what it hides.

use std::sync::Arc;

use model::config::parse_config;
use model::proxy::NodeMetadata;
use model::{Config, ConfigKey, ConfigKind, MeshConfig, Proxy};
use serde_json::{Value, json};

use crate::{PushContext, PushInput};

fn push(docs: Vec<Value>) -> PushContext {
    let mesh = Arc::new(MeshConfig::default());
    let configs: Vec<Arc<Config>> = docs
        .into_iter()
        .map(|d| Arc::new(parse_config(d, "default").unwrap()))
        .collect();
    let registry = Arc::new(registry::build(&configs, &mesh));
    PushContext::new(PushInput {
        mesh,
        domain: "cluster.local".into(),
        configs,
        registry,
        version: "v1".into(),
    })
}

fn proxy_of(node_type: &str, ns: &str, labels: Value) -> Proxy {
    let md = NodeMetadata::from_json("x", &json!({"NAMESPACE": ns, "LABELS": labels})).unwrap();
    Proxy::parse(&format!("{node_type}~10.0.0.9~p.{ns}~{ns}.svc.cluster.local"), md).unwrap()
}

fn proxy(ns: &str, labels: Value) -> Proxy {
    proxy_of("sidecar", ns, labels)
}

fn service_entry(ns: &str, host: &str) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": host, "namespace": ns},
        "spec": {"hosts": [host], "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                 "resolution": "STATIC", "location": "MESH_INTERNAL",
                 "endpoints": [{"address": "10.1.0.1"}]}})
}

fn sidecar(name: &str, ns: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn egress(hosts: &[&str]) -> Value {
    json!({"egress": [{"hosts": hosts}]})
}

fn visible(p: &PushContext, proxy: &Proxy) -> Vec<String> {
    p.services_for_proxy(proxy).iter().map(|s| s.hostname.clone()).collect()
}

fn base() -> Vec<Value> {
    vec![
        service_entry("a", "svc-a.example.com"),
        service_entry("b", "svc-b.example.com"),
        service_entry("istio-system", "svc-sys.example.com"),
    ]
}

#[test]
fn no_sidecar_sees_everything() {
    let p = push(base());
    assert!(p.sidecar_scope(&proxy("a", json!({}))).is_default());
    assert_eq!(visible(&p, &proxy("a", json!({}))).len(), 3);
}

#[test]
fn own_namespace_and_istio_system() {
    let mut docs = base();
    docs.push(sidecar("default", "a", egress(&["./*", "istio-system/*"])));
    let p = push(docs);
    assert_eq!(
        visible(&p, &proxy("a", json!({}))),
        ["svc-a.example.com", "svc-sys.example.com"]
    );
    // the Sidecar of namespace a does not apply to namespace b
    assert_eq!(visible(&p, &proxy("b", json!({}))).len(), 3);
}

#[test]
fn selector_wins_over_namespace_default_which_wins_over_root() {
    let mut docs = base();
    docs.push(sidecar("root", "istio-system", egress(&["./*"])));
    docs.push(sidecar("ns", "a", egress(&["b/*"])));
    docs.push(sidecar(
        "sel",
        "a",
        json!({"workloadSelector": {"labels": {"app": "x"}}, "egress": [{"hosts": ["*/svc-sys.example.com"]}]}),
    ));
    let p = push(docs);
    assert_eq!(visible(&p, &proxy("a", json!({"app": "x"}))), ["svc-sys.example.com"]);
    assert_eq!(visible(&p, &proxy("a", json!({"app": "y"}))), ["svc-b.example.com"]);
    // root default: `.` is the proxy's own namespace
    assert_eq!(visible(&p, &proxy("b", json!({}))), ["svc-b.example.com"]);
    // gateways are never scoped, not even by the root namespace's Sidecar
    let gateway = proxy_of("router", "istio-system", json!({"istio": "ingressgateway"}));
    assert!(p.sidecar_scope(&gateway).is_default());
    assert_eq!(visible(&p, &gateway).len(), 3);
}

#[test]
fn no_namespace_hides_everything_and_policy_overrides_mesh() {
    let mut docs = base();
    docs.push(sidecar(
        "default",
        "a",
        json!({"egress": [{"hosts": ["~/*"]}], "outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}}),
    ));
    let p = push(docs);
    let a = proxy("a", json!({}));
    assert!(visible(&p, &a).is_empty());
    assert!(p.registry_only(&a));
    assert!(!p.registry_only(&proxy("b", json!({}))));
}

#[test]
fn virtual_services_and_destination_rules_follow_the_scope() {
    let mut docs = base();
    docs.push(sidecar("default", "a", egress(&["./*"])));
    for (ns, host) in [("a", "svc-a.example.com"), ("b", "svc-b.example.com")] {
        docs.push(json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "vs", "namespace": ns},
            "spec": {"hosts": [host], "http": [{"route": [{"destination": {"host": host}}]}]}}));
        docs.push(
            json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
            "metadata": {"name": "dr", "namespace": ns}, "spec": {"host": host}}),
        );
    }
    let p = push(docs);
    let a = proxy("a", json!({}));
    let vs: Vec<String> = p
        .virtual_services_for_mesh(&a)
        .iter()
        .map(|c| c.meta.namespace.clone())
        .collect();
    assert_eq!(vs, ["a"]);
    assert_eq!(p.virtual_services_for_mesh(&proxy("b", json!({}))).len(), 2);
    let svc_b = p.service_for_host(&a, "svc-b.example.com").unwrap();
    let svc_a = p.service_for_host(&a, "svc-a.example.com").unwrap();
    assert!(p.destination_rule(&a, &svc_b).is_none());
    assert!(p.destination_rule(&a, &svc_a).is_some());
    assert!(p.destination_rule(&proxy("b", json!({})), &svc_b).is_some());
}

#[test]
fn depends_on_imported_namespaces_and_sidecars() {
    let mut docs = base();
    docs.push(sidecar("default", "a", egress(&["./*", "istio-system/*"])));
    let p = push(docs);
    let scope = p.sidecar_scope(&proxy("a", json!({})));
    let key = |kind, ns: &str| ConfigKey {
        kind,
        namespace: ns.into(),
        name: "x".into(),
    };
    assert!(scope.depends_on(&key(ConfigKind::VirtualService, "a")));
    assert!(scope.depends_on(&key(ConfigKind::DestinationRule, "istio-system")));
    assert!(!scope.depends_on(&key(ConfigKind::VirtualService, "b")));
    assert!(scope.depends_on(&key(ConfigKind::Sidecar, "b")));
}
