//! Which proxies a change concerns: a table of (change, proxy) → pushed or not.

use model::{Changed, ConfigKey, ConfigKind, ConfigsUpdated, Proxy, ServiceKey};
use serde_json::{Value, json};

use crate::{PushContext, proxy_needs_push};
use model::testing::proxy;

fn push(docs: &[Value]) -> PushContext {
    crate::testing::push(docs.iter().cloned())
}

fn sidecar_in(ns: &str) -> Proxy {
    proxy("sidecar", "10.9.9.9", ns, json!({"app": "client"}))
}

fn gateway() -> Proxy {
    proxy("router", "10.9.9.8", "istio-system", json!({"istio": "ingressgateway"}))
}

fn service_entry(ns: &str, host: &str, export_to: &[&str], endpoint: &str) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": host, "namespace": ns},
        "spec": {"hosts": [host], "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                 "resolution": "STATIC", "location": "MESH_INTERNAL", "exportTo": export_to,
                 "endpoints": [{"address": endpoint}]}})
}

fn virtual_service(name: &str, ns: &str, host: &str, gateways: &[&str], export_to: &[&str]) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"hosts": [host], "gateways": gateways, "exportTo": export_to,
                 "http": [{"route": [{"destination": {"host": host}}]}]}})
}

fn destination_rule(name: &str, ns: &str, host: &str, export_to: &[&str]) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"host": host, "exportTo": export_to}})
}

fn gateway_config(name: &str, selector: Value) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": "istio-system"},
        "spec": {"selector": selector,
                 "servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]}})
}

fn sidecar_resource(ns: &str, hosts: &[&str]) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
        "metadata": {"name": "default", "namespace": ns},
        "spec": {"egress": [{"hosts": hosts}]}})
}

fn key(kind: ConfigKind, ns: &str, name: &str) -> Changed {
    Changed::Config(ConfigKey {
        kind,
        namespace: ns.into(),
        name: name.into(),
    })
}

fn service_key(ns: &str, host: &str) -> Changed {
    Changed::Service(ServiceKey::new(host, ns))
}

fn mesh() -> Vec<Value> {
    vec![
        service_entry("a", "public.a.svc.cluster.local", &[], "10.1.0.1"),
        service_entry("a", "private.a.svc.cluster.local", &["."], "10.1.0.2"),
        // The sidecar in namespace "server" runs this one (10.9.9.9 is its address).
        service_entry("server", "mine.server.svc.cluster.local", &["."], "10.9.9.9"),
        virtual_service("public-vs", "a", "public.a.svc.cluster.local", &[], &[]),
        virtual_service("private-vs", "a", "private.a.svc.cluster.local", &[], &["."]),
        virtual_service("gw-vs", "istio-system", "*.example.com", &["istio-system/ingress"], &[]),
        destination_rule("public-dr", "a", "public.a.svc.cluster.local", &[]),
        destination_rule("private-dr", "a", "private", &["."]),
        gateway_config("ingress", json!({"istio": "ingressgateway"})),
        gateway_config("egress", json!({"istio": "egressgateway"})),
    ]
}

fn needs(push: &PushContext, previous: Option<&PushContext>, proxy: &Proxy, k: Changed) -> bool {
    let earlier: Vec<&PushContext> = previous.into_iter().collect();
    proxy_needs_push(push, &earlier, proxy, &ConfigsUpdated::Only([k].into()))
}

#[test]
fn services_concern_the_namespaces_they_are_exported_to_and_their_own_workloads() {
    let p = push(&mesh());
    let (b, a) = (sidecar_in("b"), sidecar_in("a"));
    assert!(needs(&p, None, &b, service_key("a", "public.a.svc.cluster.local")));
    assert!(!needs(&p, None, &b, service_key("a", "private.a.svc.cluster.local")));
    assert!(needs(&p, None, &a, service_key("a", "private.a.svc.cluster.local")));
    // Private to "server", but the proxy at 10.9.9.9 serves it: its inbound config depends on it.
    assert!(needs(
        &p,
        None,
        &b,
        service_key("server", "mine.server.svc.cluster.local")
    ));
    assert!(!needs(
        &p,
        None,
        &proxy("sidecar", "10.9.9.7", "b", json!({})),
        service_key("server", "mine.server.svc.cluster.local")
    ));
}

#[test]
fn virtual_services_concern_sidecars_that_see_them_and_gateways_they_bind() {
    let p = push(&mesh());
    let vs = |name: &str, ns: &str| key(ConfigKind::VirtualService, ns, name);
    assert!(needs(&p, None, &sidecar_in("b"), vs("public-vs", "a")));
    assert!(!needs(&p, None, &sidecar_in("b"), vs("private-vs", "a")));
    assert!(needs(&p, None, &sidecar_in("a"), vs("private-vs", "a")));
    assert!(!needs(&p, None, &sidecar_in("b"), vs("gw-vs", "istio-system")));
    assert!(needs(&p, None, &gateway(), vs("gw-vs", "istio-system")));
    assert!(!needs(&p, None, &gateway(), vs("public-vs", "a")));
}

#[test]
fn destination_rules_follow_export_to() {
    let p = push(&mesh());
    let dr = |name: &str| key(ConfigKind::DestinationRule, "a", name);
    assert!(needs(&p, None, &sidecar_in("b"), dr("public-dr")));
    assert!(!needs(&p, None, &sidecar_in("b"), dr("private-dr")));
    assert!(needs(&p, None, &sidecar_in("a"), dr("private-dr")));
}

#[test]
fn gateways_concern_the_routers_they_select_and_sidecars_resources_the_sidecars() {
    let mut docs = mesh();
    docs.push(sidecar_resource("a", &["./*"]));
    let p = push(&docs);
    let gw = |name: &str| key(ConfigKind::Gateway, "istio-system", name);
    assert!(needs(&p, None, &gateway(), gw("ingress")));
    assert!(!needs(&p, None, &gateway(), gw("egress")));
    assert!(!needs(&p, None, &sidecar_in("a"), gw("ingress")));
    let sc = key(ConfigKind::Sidecar, "a", "default");
    assert!(needs(&p, None, &sidecar_in("a"), sc.clone()));
    assert!(!needs(&p, None, &sidecar_in("b"), sc.clone()));
    assert!(!needs(&p, None, &gateway(), sc));
}

#[test]
fn a_sidecar_scope_hides_changes_outside_its_egress_hosts() {
    let mut docs = mesh();
    docs.push(service_entry("c", "other.c.svc.cluster.local", &[], "10.1.0.3"));
    docs.push(sidecar_resource("b", &["a/*"]));
    let p = push(&docs);
    let b = sidecar_in("b");
    assert!(needs(&p, None, &b, service_key("a", "public.a.svc.cluster.local")));
    assert!(!needs(&p, None, &b, service_key("c", "other.c.svc.cluster.local")));
    assert!(needs(
        &p,
        None,
        &sidecar_in("d"),
        service_key("c", "other.c.svc.cluster.local")
    ));
}

#[test]
fn the_push_before_the_change_counts_too() {
    // The VS moved from public to private: namespace b saw it before, so b is pushed (to drop it).
    let before = push(&mesh());
    let mut docs = mesh();
    docs[3] = virtual_service("public-vs", "a", "public.a.svc.cluster.local", &[], &["."]);
    let after = push(&docs);
    let k = key(ConfigKind::VirtualService, "a", "public-vs");
    assert!(!needs(&after, None, &sidecar_in("b"), k.clone()));
    assert!(needs(&after, Some(&before), &sidecar_in("b"), k.clone()));
    // Deleted: only the push before holds it.
    docs.remove(3);
    let deleted = push(&docs);
    assert!(needs(&deleted, Some(&before), &sidecar_in("b"), k.clone()));
    assert!(!needs(&deleted, Some(&after), &sidecar_in("b"), k.clone()));
    // Neither push knows the key: everyone is pushed.
    assert!(needs(&deleted, None, &sidecar_in("b"), k));
}

#[test]
fn everything_and_unknown_kinds_concern_everyone() {
    let p = push(&mesh());
    assert!(proxy_needs_push(&p, &[], &sidecar_in("b"), &ConfigsUpdated::All));
    assert!(needs(
        &p,
        None,
        &sidecar_in("b"),
        key(ConfigKind::WorkloadEntry, "a", "we")
    ));
}

#[test]
fn delegates_concern_proxies_that_see_a_root_naming_them() {
    let mut docs = mesh();
    docs.push(json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "root", "namespace": "a"},
        "spec": {"hosts": ["root.a.svc.cluster.local"], "exportTo": ["."],
                 "http": [{"delegate": {"name": "leaf", "namespace": "a"}}]}}));
    docs.push(json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "leaf", "namespace": "a"},
        "spec": {"http": [{"route": [{"destination": {"host": "public.a.svc.cluster.local"}}]}]}}));
    let p = push(&docs);
    let leaf = key(ConfigKind::VirtualService, "a", "leaf");
    assert!(needs(&p, None, &sidecar_in("a"), leaf.clone()));
    assert!(!needs(&p, None, &sidecar_in("b"), leaf.clone()));
    assert!(!needs(&p, None, &gateway(), leaf));
}

/// Configs are found by key whatever order the push holds them in (the environment hands them in
/// key order; tests and other callers may not): a config not found would concern every proxy.
#[test]
fn changed_configs_are_found_in_any_order() {
    let mut sorted: Vec<Value> = mesh();
    let key_of = |v: &Value| {
        let c = model::testing::config(v.clone());
        (c.kind, c.meta.namespace.clone(), c.meta.name.clone())
    };
    sorted.sort_by_key(key_of);
    let mut reversed = sorted.clone();
    reversed.reverse();
    for docs in [mesh(), sorted, reversed] {
        let p = push(&docs);
        let vs = |name: &str, ns: &str| key(ConfigKind::VirtualService, ns, name);
        assert!(!needs(&p, None, &sidecar_in("b"), vs("private-vs", "a")));
        assert!(needs(&p, None, &sidecar_in("a"), vs("private-vs", "a")));
        assert!(!needs(&p, None, &sidecar_in("b"), vs("gw-vs", "istio-system")));
        let dr = key(ConfigKind::DestinationRule, "a", "private-dr");
        assert!(!needs(&p, None, &sidecar_in("b"), dr.clone()));
        assert!(needs(&p, None, &sidecar_in("a"), dr));
        let gw = key(ConfigKind::Gateway, "istio-system", "egress");
        assert!(!needs(&p, None, &gateway(), gw));
        // a config this push does not hold concerns everyone
        assert!(needs(&p, None, &sidecar_in("b"), vs("missing", "a")));
    }
}
