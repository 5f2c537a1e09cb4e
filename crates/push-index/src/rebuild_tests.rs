//! `PushContext::rebuild`: what a push shares with the one before it, and that what it shares is
//! still right after the change.

use std::sync::Arc;

use model::{Config, ConfigKind, MeshConfig, Proxy};
use serde_json::{Value, json};

use crate::{ChangeScope, PushContext, PushInput};

fn service_entry(name: &str, ns: &str, endpoint: &str) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"hosts": [format!("{name}.{ns}.svc.cluster.local")],
                 "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                 "resolution": "STATIC", "location": "MESH_INTERNAL",
                 "endpoints": [{"address": endpoint}]}})
}

fn sidecar(ns: &str, hosts: &[&str]) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "Sidecar",
        "metadata": {"name": "default", "namespace": ns},
        "spec": {"egress": [{"hosts": hosts}]}})
}

fn virtual_service(ns: &str, host: &str, weight: u32) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "vs", "namespace": ns},
        "spec": {"hosts": [host], "http": [{"route": [
            {"destination": {"host": host}, "weight": weight},
            {"destination": {"host": host, "subset": "v2"}, "weight": 100 - weight}]}]}})
}

fn proxy(ip: &str) -> Proxy {
    model::testing::proxy("sidecar", ip, "a", json!({}))
}

fn configs(docs: &[Value]) -> Vec<Arc<Config>> {
    docs.iter().cloned().map(model::testing::config).collect()
}

fn input(configs: Vec<Arc<Config>>, registry: Arc<registry::RegistrySnapshot>, version: &str) -> PushInput {
    crate::testing::input(Arc::new(MeshConfig::default()), configs, registry, version)
}

fn first(docs: &[Value]) -> PushContext {
    let configs = configs(docs);
    let registry = Arc::new(registry::build(&configs, &MeshConfig::default()));
    PushContext::new(input(configs, registry, "v1"))
}

fn changed(kind: ConfigKind, services: bool) -> ChangeScope {
    ChangeScope {
        kinds: vec![kind],
        services,
    }
}

fn hosts(p: &PushContext, proxy: &Proxy) -> Vec<String> {
    p.services_for_proxy(proxy).iter().map(|s| s.hostname.clone()).collect()
}

fn instances(p: &PushContext, proxy: &Proxy) -> Vec<String> {
    p.service_instances(proxy)
        .iter()
        .map(|i| i.service.hostname.clone())
        .collect()
}

fn mesh(weight: u32) -> Vec<Value> {
    vec![
        service_entry("one", "a", "10.0.0.1"),
        service_entry("two", "b", "10.0.0.2"),
        sidecar("a", &["./*"]),
        virtual_service("a", "one.a.svc.cluster.local", weight),
    ]
}

/// A VirtualService change keeps the registry and every Sidecar: the next push finds the
/// instances by address and the Sidecar scopes the last one built, and answers as it did.
#[test]
fn a_virtual_service_change_shares_instances_and_sidecar_scopes() {
    let p = first(&mesh(90));
    let (at_one, at_two) = (proxy("10.0.0.1"), proxy("10.0.0.2"));
    assert_eq!(instances(&p, &at_one), ["one.a.svc.cluster.local"]);
    assert_eq!(hosts(&p, &at_one), ["one.a.svc.cluster.local"]);
    let scope = p.sidecar_scope(&at_one);

    let next = p.rebuild(
        input(configs(&mesh(80)), p.registry.clone(), "v2"),
        &changed(ConfigKind::VirtualService, false),
    );
    assert!(Arc::ptr_eq(&p.instances, &next.instances));
    assert!(Arc::ptr_eq(&p.sidecars, &next.sidecars));
    assert!(Arc::ptr_eq(&scope, &next.sidecar_scope(&at_one)));
    assert_eq!(instances(&next, &at_one), ["one.a.svc.cluster.local"]);
    assert_eq!(instances(&next, &at_two), ["two.b.svc.cluster.local"]);
    assert_eq!(hosts(&next, &at_one), ["one.a.svc.cluster.local"]);
}

/// A changed Sidecar is read again: the scope the last push built would hide a namespace the
/// Sidecar now imports.
#[test]
fn a_sidecar_change_builds_the_scopes_again() {
    let p = first(&mesh(90));
    let at_one = proxy("10.0.0.1");
    assert_eq!(hosts(&p, &at_one), ["one.a.svc.cluster.local"]);

    let mut docs = mesh(90);
    docs[2] = sidecar("a", &["./*", "b/*"]);
    let next = p.rebuild(
        input(configs(&docs), p.registry.clone(), "v2"),
        &changed(ConfigKind::Sidecar, false),
    );
    assert!(!Arc::ptr_eq(&p.sidecars, &next.sidecars));
    assert!(Arc::ptr_eq(&p.instances, &next.instances));
    assert_eq!(
        hosts(&next, &at_one),
        ["one.a.svc.cluster.local", "two.b.svc.cluster.local"]
    );
    // the earlier push still answers from its own Sidecar
    assert_eq!(hosts(&p, &at_one), ["one.a.svc.cluster.local"]);
}

/// Another registry (an endpoint moved) indexes the instances again.
#[test]
fn a_registry_change_indexes_the_instances_again() {
    let p = first(&mesh(90));
    assert_eq!(instances(&p, &proxy("10.0.0.1")), ["one.a.svc.cluster.local"]);

    let mut docs = mesh(90);
    docs[0] = service_entry("one", "a", "10.0.0.3");
    let configs = configs(&docs);
    let registry = Arc::new(registry::build(&configs, &MeshConfig::default()));
    let next = p.rebuild(
        input(configs, registry, "v2"),
        &changed(ConfigKind::ServiceEntry, false),
    );
    assert!(!Arc::ptr_eq(&p.instances, &next.instances));
    assert!(instances(&next, &proxy("10.0.0.1")).is_empty());
    assert_eq!(instances(&next, &proxy("10.0.0.3")), ["one.a.svc.cluster.local"]);
}
