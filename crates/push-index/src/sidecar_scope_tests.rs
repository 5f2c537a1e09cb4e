//! Sidecar scoping through `PushContext`: which Sidecar applies, and what it hides.

use std::sync::Arc;

use model::{ConfigKey, ConfigKind, Proxy};
use serde_json::{Value, json};

use crate::PushContext;
use crate::testing::push;

fn proxy_of(node_type: &str, ns: &str, labels: Value) -> Proxy {
    model::testing::proxy(node_type, "10.0.0.9", ns, labels)
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

/// Istio's `hostClassification.Matches`: an egress host imports the services whose hosts are a
/// subset of it. `ns/api.example.com` does not import the `*.example.com` ServiceEntry; the
/// wildcard egress host imports both.
#[test]
fn egress_hosts_import_services_that_are_a_subset_of_them() {
    let mut docs = vec![
        service_entry("ns", "*.example.com"),
        service_entry("ns", "api.example.com"),
    ];
    docs[0]["metadata"]["name"] = json!("wildcard");
    docs[0]["spec"]["resolution"] = json!("NONE");
    docs[0]["spec"].as_object_mut().unwrap().remove("endpoints");
    let exact = {
        let mut d = docs.clone();
        d.push(sidecar("default", "app", egress(&["ns/api.example.com"])));
        push(d)
    };
    assert_eq!(visible(&exact, &proxy("app", json!({}))), ["api.example.com"]);
    let wildcard = {
        let mut d = docs.clone();
        d.push(sidecar("default", "app", egress(&["ns/*.example.com"])));
        push(d)
    };
    assert_eq!(
        visible(&wildcard, &proxy("app", json!({}))),
        ["*.example.com", "api.example.com"]
    );
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

/// A ServiceEntry of `host` in `ns` with HTTP `ports`.
fn service_entry_ports(ns: &str, host: &str, ports: &[u16]) -> Value {
    let ports: Vec<Value> = ports
        .iter()
        .map(|p| json!({"number": p, "name": format!("http-{p}"), "protocol": "HTTP"}))
        .collect();
    json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": host, "namespace": ns},
        "spec": {"hosts": [host], "ports": ports, "resolution": "STATIC", "location": "MESH_INTERNAL",
                 "endpoints": [{"address": "10.1.0.1"}]}})
}

fn port_listener(number: u16, hosts: &[&str]) -> Value {
    json!({"port": {"number": number, "protocol": "HTTP", "name": format!("http-{number}")}, "hosts": hosts})
}

fn ports_of(services: &[Arc<model::Service>], host: &str) -> Option<Vec<u16>> {
    let s = services.iter().find(|s| s.hostname == host)?;
    Some(s.ports.iter().map(|p| p.port).collect())
}

/// The services CDS gets for `proxy` (Istio's `SidecarScope.Services()`).
fn cds_services(p: &PushContext, proxy: &Proxy) -> Vec<Arc<model::Service>> {
    p.sidecar_scope(proxy).services(
        &p.services_for_namespace(&proxy.config_namespace),
        || p.virtual_services_for_mesh(proxy),
        |h| p.service_for_host(proxy, h),
    )
}

#[test]
fn each_egress_listener_keeps_its_own_hosts_port_and_bind() {
    let mut docs = base();
    docs.push(sidecar(
        "default",
        "a",
        json!({"egress": [
            {"port": {"number": 9080, "protocol": "HTTP", "name": "http"}, "hosts": ["./svc-a.example.com"],
             "bind": "127.0.0.2", "captureMode": "NONE"},
            {"hosts": ["istio-system/*"]}]}),
    ));
    let p = push(docs);
    let scope = p.sidecar_scope(&proxy("a", json!({})));
    let [on_port, catch_all] = scope.egress_listeners() else {
        panic!("two egress listeners expected")
    };
    assert!(on_port.imports("a", "svc-a.example.com"));
    assert!(!on_port.imports("istio-system", "svc-sys.example.com"));
    assert!(catch_all.imports("istio-system", "svc-sys.example.com"));
    assert!(!catch_all.imports("a", "svc-a.example.com"));
    assert!(on_port.match_port() && !catch_all.match_port());
    assert!(on_port.bind_to_port() && !catch_all.bind_to_port());
    assert_eq!(on_port.bind(), "127.0.0.2");
    // RDS of port 9080 is the listener on 9080; any other port the catch-all's
    assert_eq!(scope.egress_listener_for_rds(9080, "9080"), Some(on_port));
    assert_eq!(scope.egress_listener_for_rds(80, "80"), Some(catch_all));
    // the scope as a whole imports the union
    assert_eq!(
        visible(&p, &proxy("a", json!({}))),
        ["svc-a.example.com", "svc-sys.example.com"]
    );
}

#[test]
fn without_a_catch_all_listener_other_ports_have_no_egress_listener() {
    let mut docs = base();
    docs.push(sidecar(
        "default",
        "a",
        json!({"egress": [port_listener(9080, &["./*"])]}),
    ));
    let p = push(docs);
    let scope = p.sidecar_scope(&proxy("a", json!({})));
    assert!(scope.egress_listener_for_rds(9080, "9080").is_some());
    assert!(scope.egress_listener_for_rds(80, "80").is_none());
}

#[test]
fn a_listener_on_a_port_imports_only_services_with_that_port_trimmed_to_it() {
    let mut docs = vec![
        service_entry_ports("a", "multi.example.com", &[80, 9080]),
        service_entry_ports("a", "only80.example.com", &[80]),
    ];
    docs.push(sidecar(
        "default",
        "a",
        json!({"egress": [port_listener(9080, &["./*"])]}),
    ));
    let p = push(docs);
    let a = proxy("a", json!({}));
    let scope = p.sidecar_scope(&a);
    let listener = &scope.egress_listeners()[0];
    let all = p.services_for_namespace("a");
    let selected: Vec<_> = all.iter().filter_map(|s| listener.select_service(s)).collect();
    assert_eq!(selected.len(), 1);
    assert_eq!(ports_of(&selected, "multi.example.com"), Some(vec![9080]));
    // CDS: only the 9080 cluster of multi, nothing of only80
    let cds = cds_services(&p, &a);
    assert_eq!(ports_of(&cds, "multi.example.com"), Some(vec![9080]));
    assert_eq!(ports_of(&cds, "only80.example.com"), None);
}

#[test]
fn cds_services_merge_the_ports_of_all_listeners_and_add_virtual_service_destinations() {
    let mut docs = vec![
        service_entry_ports("a", "multi.example.com", &[80, 9080, 9090]),
        service_entry_ports("b", "dest.example.com", &[80, 8000]),
        service_entry_ports("b", "unused.example.com", &[80]),
        service_entry_ports("b", "other-source.example.com", &[80]),
        service_entry_ports("b", "same-source.example.com", &[80]),
    ];
    docs.push(sidecar(
        "default",
        "a",
        json!({"egress": [port_listener(9080, &["./multi.example.com"]), port_listener(80, &["./multi.example.com"])]}),
    ));
    // a VirtualService of the listener on port 80 routes to a service it does not import
    docs.push(json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "multi", "namespace": "a"},
        "spec": {"hosts": ["multi.example.com"], "http": [
            {"match": [{"sourceNamespace": "elsewhere"}], "route": [{"destination": {"host": "other-source.example.com"}}]},
            {"match": [{"sourceNamespace": "elsewhere"}, {"sourceNamespace": "a"}],
             "route": [{"destination": {"host": "same-source.example.com"}}]},
            {"route": [{"destination": {"host": "dest.example.com", "port": {"number": 8000}}}]}]}}));
    let p = push(docs);
    let a = proxy("a", json!({}));
    let cds = cds_services(&p, &a);
    assert_eq!(ports_of(&cds, "multi.example.com"), Some(vec![9080, 80]));
    // a listener with a port trims the destination to its own port, which dest does have
    assert_eq!(ports_of(&cds, "dest.example.com"), Some(vec![80]));
    assert_eq!(ports_of(&cds, "unused.example.com"), None);
    // a rule for another source namespace does not count; one that admits the proxy's does
    assert_eq!(ports_of(&cds, "other-source.example.com"), None);
    assert_eq!(ports_of(&cds, "same-source.example.com"), Some(vec![80]));

    // under a catch-all listener the destination keeps the ports the VirtualService names
    let mut docs: Vec<Value> = vec![
        service_entry_ports("a", "multi.example.com", &[80]),
        service_entry_ports("b", "dest.example.com", &[80, 8000]),
    ];
    docs.push(sidecar("default", "a", egress(&["./*"])));
    docs.push(json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "multi", "namespace": "a"},
        "spec": {"hosts": ["multi.example.com"], "tcp": [
            {"route": [{"destination": {"host": "dest.example.com", "port": {"number": 8000}}}]}]}}));
    let cds = cds_services(&push(docs), &a);
    assert_eq!(ports_of(&cds, "dest.example.com"), Some(vec![8000]));
}

#[test]
fn a_sidecar_without_egress_imports_everything_and_declares_the_inbound_side() {
    let mut docs = base();
    docs.push(sidecar(
        "default",
        "a",
        json!({"ingress": [
                {"port": {"number": 9080, "protocol": "HTTP", "name": "http"}, "defaultEndpoint": "127.0.0.1:8080",
                 "connectionPool": {"tcp": {"maxConnections": 7}}},
                {"port": {"number": 9090, "protocol": "TCP", "name": "tcp"}, "captureMode": "NONE"}],
               "inboundConnectionPool": {"tcp": {"maxConnections": 3}}}),
    ));
    let p = push(docs);
    let a = proxy("a", json!({}));
    assert_eq!(visible(&p, &a).len(), 3);
    let scope = p.sidecar_scope(&a);
    assert!(scope.has_ingress_listener());
    assert_eq!(scope.ingress_listeners()[0].default_endpoint, "127.0.0.1:8080");
    let max = |port| {
        scope
            .inbound_connection_pool_for_port(port)
            .and_then(|c| c.tcp.as_ref())
            .and_then(|t| t.max_connections)
    };
    assert_eq!(max(9080), Some(7));
    assert_eq!(max(9090), Some(3));
    // no Sidecar: one catch-all listener, no ingress, CDS sees what is visible
    let b = proxy("b", json!({}));
    let default = p.sidecar_scope(&b);
    assert!(!default.has_ingress_listener());
    assert_eq!(default.egress_listeners().len(), 1);
    assert!(default.egress_listeners()[0].port().is_none());
    assert_eq!(cds_services(&p, &b).len(), 3);
}

/// A scope is computed once per namespace and Sidecar in effect: proxies whose labels differ share
/// it, unless a workload selector picks a Sidecar of their own.
#[test]
fn proxies_share_the_scope_of_the_sidecar_that_applies_whatever_their_labels() {
    let mut docs = base();
    docs.push(sidecar("default", "a", egress(&["./*"])));
    docs.push(sidecar(
        "wide",
        "a",
        json!({"workloadSelector": {"labels": {"app": "wide"}}, "egress": [{"hosts": ["./*", "b/*"]}]}),
    ));
    let p = push(docs);
    let one = p.sidecar_scope(&proxy("a", json!({"app": "one", "version": "v1"})));
    let two = p.sidecar_scope(&proxy("a", json!({"app": "two"})));
    let wide = p.sidecar_scope(&proxy("a", json!({"app": "wide", "version": "v2"})));
    assert!(Arc::ptr_eq(&one, &two));
    assert!(!Arc::ptr_eq(&one, &wide));
    let key = |name: &str| ConfigKey {
        kind: ConfigKind::Sidecar,
        namespace: "a".into(),
        name: name.into(),
    };
    assert_eq!(one.sidecar(), Some(&key("default")));
    assert_eq!(wide.sidecar(), Some(&key("wide")));
    assert_eq!(visible(&p, &proxy("a", json!({"app": "two"}))), ["svc-a.example.com"]);
    assert_eq!(
        visible(&p, &proxy("a", json!({"app": "wide"}))),
        ["svc-a.example.com", "svc-b.example.com"]
    );
    // Another namespace without a Sidecar: the default scope, not a's.
    let b = p.sidecar_scope(&proxy("b", json!({"app": "one"})));
    assert!(b.is_default());
}
