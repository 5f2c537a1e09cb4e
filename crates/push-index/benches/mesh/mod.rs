//! The synthetic mesh of the benches, shaped as the load generator's (`loadgen::mesh`): S
//! ServiceEntries of E inline endpoints each (HTTP port 8080, versions v1/v2), S/10
//! VirtualServices with a 90/10 split between subsets, S/10 DestinationRules with those two
//! subsets, and sidecars in the same namespace. Configs are parsed and validated as users write
//! them (`model::config::parse_config`), and the push is built as the pipeline builds it.
//! Shared by the push-index and generators benches (`#[path]`).

// Each bench binary uses its own part of the fixture.
#![allow(dead_code)]

use std::sync::Arc;

use model::config::parse_config;
use model::proxy::NodeMetadata;
use model::{Config, MeshConfig, Proxy};
use push_index::{PushContext, PushInput};
use serde_json::{Value, json};

/// Namespace of every resource and proxy.
pub const NAMESPACE: &str = "load";
/// Inline endpoints per ServiceEntry.
pub const ENDPOINTS: usize = 5;
/// Mesh sizes the benches run at (number of services).
pub const SIZES: &[usize] = &[100, 1000];

/// Hostname of service `i`.
pub fn service_host(i: usize) -> String {
    format!("svc-{i}.{NAMESPACE}.svc.cluster.local")
}

/// Address of endpoint `k` of the whole mesh, in 10.128.0.0/9.
fn endpoint_address(k: usize) -> String {
    format!("10.{}.{}.{}", 128 + (k >> 16) % 128, (k >> 8) & 255, k & 255)
}

fn parse(doc: Value) -> Arc<Config> {
    Arc::new(parse_config(doc, NAMESPACE).unwrap_or_else(|e| panic!("bench config rejected: {e}")))
}

/// ServiceEntry `i`: STATIC, MESH_INTERNAL, `endpoints` inline endpoints alternating v1/v2.
pub fn service_entry(i: usize, endpoints: usize) -> Arc<Config> {
    let eps: Vec<Value> = (0..endpoints)
        .map(|j| {
            let version = if j % 2 == 0 { "v1" } else { "v2" };
            json!({"address": endpoint_address(i * endpoints + j), "labels": {"version": version}})
        })
        .collect();
    parse(json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": format!("svc-{i}"), "namespace": NAMESPACE},
        "spec": {"hosts": [service_host(i)], "location": "MESH_INTERNAL", "resolution": "STATIC",
                 "ports": [{"number": 8080, "name": "http", "protocol": "HTTP"}], "endpoints": eps}}))
}

/// VirtualService `i` for service `i`: 90/10 between subsets v1 and v2, timeout by `generation`.
pub fn virtual_service(i: usize, generation: u64) -> Arc<Config> {
    let host = service_host(i);
    parse(json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": format!("vs-{i}"), "namespace": NAMESPACE},
        "spec": {"hosts": [host], "http": [{"timeout": format!("{}s", generation + 1), "route": [
            {"destination": {"host": host, "subset": "v1"}, "weight": 90},
            {"destination": {"host": host, "subset": "v2"}, "weight": 10}]}]}}))
}

/// DestinationRule `i` for service `i` with subsets v1 and v2.
pub fn destination_rule(i: usize) -> Arc<Config> {
    parse(
        json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
        "metadata": {"name": format!("dr-{i}"), "namespace": NAMESPACE},
        "spec": {"host": service_host(i), "subsets": [
            {"name": "v1", "labels": {"version": "v1"}},
            {"name": "v2", "labels": {"version": "v2"}}]}}),
    )
}

/// Every config of a mesh of `services` services with `ENDPOINTS` endpoints each.
pub fn configs(services: usize) -> Vec<Arc<Config>> {
    let mut out: Vec<Arc<Config>> = (0..services).map(|i| service_entry(i, ENDPOINTS)).collect();
    out.extend((0..services / 10).map(|i| virtual_service(i, 0)));
    out.extend((0..services / 10).map(destination_rule));
    out
}

/// `configs` with VirtualService `i` replaced by its `generation` (the config-change push).
pub fn with_virtual_service(configs: &[Arc<Config>], i: usize, generation: u64) -> Vec<Arc<Config>> {
    let changed = virtual_service(i, generation);
    configs
        .iter()
        .map(|c| {
            if c.key() == changed.key() {
                changed.clone()
            } else {
                c.clone()
            }
        })
        .collect()
}

/// The push input the pipeline builds: the registry snapshot from the ServiceEntries.
pub fn input(mesh: &Arc<MeshConfig>, configs: Vec<Arc<Config>>, version: &str) -> PushInput {
    let registry = Arc::new(registry::build(&configs, mesh));
    PushInput {
        mesh: mesh.clone(),
        domain: "cluster.local".into(),
        configs,
        registry,
        version: version.into(),
        features: Default::default(),
        jwks: Default::default(),
    }
}

/// A full push of a mesh of `services` services, with the default mesh config.
pub fn push(services: usize) -> PushContext {
    PushContext::new(input(&Arc::new(MeshConfig::default()), configs(services), "1"))
}

/// Sidecar proxy `n` of the mesh, with the metadata Istio's injector sets (as the load generator's).
pub fn sidecar(n: usize) -> Proxy {
    sidecar_in(NAMESPACE, n)
}

/// Sidecar proxy `n` in namespace `ns`, as [`sidecar`].
pub fn sidecar_in(ns: &str, n: usize) -> Proxy {
    let md = json!({"NAMESPACE": ns, "ISTIO_VERSION": "1.28.0", "CLUSTER_ID": "Kubernetes",
        "LABELS": {"app": format!("pod-{}", n % 16)}, "POD_NAME": format!("pod-{n}")});
    let id = format!(
        "sidecar~10.0.{}.{}~pod-{n}.{ns}~{ns}.svc.cluster.local",
        n / 250,
        n % 250 + 1
    );
    let metadata = NodeMetadata::from_json(&id, &md).unwrap_or_else(|e| panic!("bench proxy metadata: {e}"));
    Proxy::parse(&id, metadata).unwrap_or_else(|e| panic!("bench proxy: {e}"))
}
