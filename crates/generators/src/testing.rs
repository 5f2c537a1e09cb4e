//! Test fixtures shared by the generators' tests: a push built from configs as users write them
//! (`push`), config documents (`config`, `service_entry`, `gateway`, ...), proxies from node IDs
//! (`proxy`, `sidecar`, `gateway_proxy`, ...), readers of generated filter chains, golden files
//! (`REFRESH_GOLDEN=true` rewrites them), the Envoy binary and `envoy --mode validate` with stub
//! clusters for what routes name.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use model::config::parse_config;
use model::proxy::NodeMetadata;
use model::{Config, Locality, MeshConfig, Proxy};
use prost::Message;
use push_index::{PushContext, PushInput};
use serde_json::{Value, json};
use xds_api::envoy::config::bootstrap::v3::Bootstrap;
use xds_api::envoy::config::cluster::v3::{Cluster, cluster::ClusterDiscoveryType, cluster::DiscoveryType};
use xds_api::envoy::config::listener::v3::{FilterChain, filter};
use xds_api::envoy::config::route::v3::{RouteConfiguration, route, route_action};
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager as hcm,
};
use xds_api::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};

/// The input of a push of `docs` (configs as users write them, namespace `default` when absent)
/// over `mesh`, in the domain `cluster.local`.
pub(crate) fn push_input(mesh: MeshConfig, docs: Vec<Value>) -> PushInput {
    let mesh = Arc::new(mesh);
    let configs: Vec<Arc<Config>> = docs
        .into_iter()
        .map(|d| Arc::new(parse_config(d, "default").unwrap_or_else(|e| panic!("test config rejected: {e}"))))
        .collect();
    let registry = Arc::new(registry::build(&configs, &mesh));
    PushInput {
        mesh,
        domain: "cluster.local".into(),
        configs,
        registry,
        version: "1".into(),
        features: Default::default(),
        jwks: Default::default(),
    }
}

pub(crate) fn push_with_mesh(mesh: MeshConfig, docs: Vec<Value>) -> PushContext {
    PushContext::new(push_input(mesh, docs))
}

pub(crate) fn push(docs: Vec<Value>) -> PushContext {
    push_with_mesh(MeshConfig::default(), docs)
}

/// A `networking.istio.io/v1` config document of `kind`.
pub(crate) fn config(kind: &str, name: &str, ns: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": kind,
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// A config document of any API group (`security.istio.io/v1`, ...).
pub(crate) fn config_in(api_version: &str, kind: &str, name: &str, ns: &str, spec: Value) -> Value {
    json!({"apiVersion": api_version, "kind": kind,
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// A ServiceEntry with `spec` as given.
pub(crate) fn service_entry(name: &str, ns: &str, spec: Value) -> Value {
    config("ServiceEntry", name, ns, spec)
}

pub(crate) fn destination_rule(name: &str, ns: &str, spec: Value) -> Value {
    config("DestinationRule", name, ns, spec)
}

pub(crate) fn virtual_service(name: &str, ns: &str, spec: Value) -> Value {
    config("VirtualService", name, ns, spec)
}

/// A Gateway `ns/name` for the ingress gateway (selector `istio: ingressgateway`) with `servers`.
pub(crate) fn gateway(name: &str, ns: &str, servers: Value) -> Value {
    config(
        "Gateway",
        name,
        ns,
        json!({"selector": {"istio": "ingressgateway"}, "servers": servers}),
    )
}

/// The Gateway `istio-system/gw` of the ingress gateway, with `servers`.
pub(crate) fn ingress_gateway(servers: Value) -> Value {
    gateway("gw", "istio-system", servers)
}

/// `reviews.default.svc.cluster.local` on port 9080 (`http`), STATIC, with endpoints of
/// versions v1 (zone a) and v2 (zone b).
pub(crate) fn reviews() -> Value {
    service_entry(
        "reviews",
        "default",
        json!({
            "hosts": ["reviews.default.svc.cluster.local"],
            "location": "MESH_INTERNAL",
            "resolution": "STATIC",
            "ports": [{"number": 9080, "name": "http", "protocol": "HTTP"}],
            "endpoints": [
                {"address": "10.1.0.1", "labels": {"version": "v1"}, "locality": "us-east/zone-a"},
                {"address": "10.1.0.2", "labels": {"version": "v2"}, "locality": "us-east/zone-b", "weight": 3},
                {"address": "10.1.0.3", "labels": {"version": "v1"}, "locality": "us-east/zone-a"}
            ]
        }),
    )
}

/// A proxy with node ID `<node_type>~<ip>~p.<ns>~<domain_ns>.svc.cluster.local` and node
/// `metadata` (its `NAMESPACE` set to `ns`).
/// Proxies run beside an agent with a workload identity (`WORKLOAD_IDENTITY_SOCKET_FILE`), as
/// pilot-agent's and Istio's do, unless `metadata` sets it to `""`.
pub(crate) fn node(node_type: &str, ip: &str, ns: &str, domain_ns: &str, mut metadata: Value) -> Proxy {
    metadata["NAMESPACE"] = json!(ns);
    if metadata.get("WORKLOAD_IDENTITY_SOCKET_FILE").is_none() {
        metadata["WORKLOAD_IDENTITY_SOCKET_FILE"] = json!("socket");
    }
    let md = NodeMetadata::from_json("test", &metadata).unwrap();
    Proxy::parse(&format!("{node_type}~{ip}~p.{ns}~{domain_ns}.svc.cluster.local"), md).unwrap()
}

/// A proxy of `node_type` (`sidecar`, `router`) in `ns` with `labels`, at 10.0.0.9.
pub(crate) fn proxy(node_type: &str, ns: &str, labels: Value) -> Proxy {
    node(node_type, "10.0.0.9", ns, ns, json!({"LABELS": labels}))
}

pub(crate) fn sidecar(ns: &str) -> Proxy {
    proxy("sidecar", ns, json!({}))
}

/// A sidecar of `default` without labels at `ip`.
pub(crate) fn sidecar_at(ip: &str) -> Proxy {
    node("sidecar", ip, "default", "default", json!({}))
}

/// An ingress gateway proxy in `istio-system` labelled `istio: ingressgateway`.
pub(crate) fn gateway_proxy() -> Proxy {
    proxy("router", "istio-system", json!({"istio": "ingressgateway"}))
}

/// `proxy` in `locality` (`region/zone[/subzone]`).
pub(crate) fn in_locality(mut proxy: Proxy, locality: &str) -> Proxy {
    proxy.locality = Locality::parse(locality);
    proxy
}

/// The HTTP connection manager of a filter chain, if it has one.
pub(crate) fn hcm_of(c: &FilterChain) -> Option<HttpConnectionManager> {
    let f = c
        .filters
        .iter()
        .find(|f| f.name == crate::lds::hcm::HTTP_CONNECTION_MANAGER)?;
    let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        return None;
    };
    Some(HttpConnectionManager::decode(any.value.as_slice()).unwrap())
}

/// The RDS name of a filter chain's HTTP connection manager.
pub(crate) fn rds_name(c: &FilterChain) -> Option<String> {
    match hcm_of(c)?.route_specifier {
        Some(hcm::RouteSpecifier::Rds(r)) => Some(r.route_config_name),
        _ => None,
    }
}

/// The cluster of a filter chain's tcp_proxy (a single cluster).
pub(crate) fn tcp_cluster(c: &FilterChain) -> Option<String> {
    let f = c.filters.iter().find(|f| f.name == crate::lds::sidecar::TCP_PROXY)?;
    let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
        return None;
    };
    match TcpProxy::decode(any.value.as_slice()).unwrap().cluster_specifier {
        Some(tcp_proxy::ClusterSpecifier::Cluster(c)) => Some(c),
        _ => None,
    }
}

/// The cluster the inline route configuration of a filter chain sends everything to.
pub(crate) fn inline_route_cluster(c: &FilterChain) -> Option<String> {
    let Some(hcm::RouteSpecifier::RouteConfig(rc)) = hcm_of(c)?.route_specifier else {
        return None;
    };
    match &rc.virtual_hosts.first()?.routes.first()?.action {
        Some(route::Action::Route(a)) => match &a.cluster_specifier {
            Some(route_action::ClusterSpecifier::Cluster(c)) => Some(c.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// Compares `actual` with `testdata/golden/<name>`; `REFRESH_GOLDEN=true` rewrites the file.
pub(crate) fn assert_golden(name: &str, actual: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("testdata/golden")
        .join(name);
    if std::env::var("REFRESH_GOLDEN").as_deref() == Ok("true") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (hint: run with REFRESH_GOLDEN=true to create it)",
            path.display()
        )
    });
    if expected != actual {
        let diff_line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(0);
        panic!(
            "{} differs from the generated output at line {} (hint: REFRESH_GOLDEN=true rewrites it)\nexpected: {:?}\nactual:   {:?}",
            path.display(),
            diff_line + 1,
            expected.lines().nth(diff_line),
            actual.lines().nth(diff_line)
        );
    }
}

/// The Envoy binary (`$ENVOY_BIN`, else the one `scripts/install-envoy.sh` installs); panics, failing
/// the test, with how to get one when there is none.
#[track_caller]
pub(crate) fn envoy_binary() -> PathBuf {
    test_support::envoy::require_envoy_bin()
}

/// Runs `envoy --mode validate` on `bootstrap`: Ok with Envoy's log, or Err with it.
pub(crate) fn envoy_validate(envoy: &Path, bootstrap: &Bootstrap) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bootstrap.pb");
    std::fs::write(&path, bootstrap.encode_to_vec()).unwrap();
    let out = std::process::Command::new(envoy)
        .args([
            "--mode",
            "validate",
            "--disable-hot-restart",
            "--log-level",
            "info",
            "-c",
        ])
        .arg(&path)
        .output()
        .expect("envoy runs");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() { Ok(log) } else { Err(log) }
}

/// Stub clusters for every cluster the routes send to or mirror to.
pub(crate) fn stub_clusters(routes: &[RouteConfiguration]) -> Vec<Cluster> {
    let mut names = BTreeSet::new();
    for r in routes
        .iter()
        .flat_map(|rc| rc.virtual_hosts.iter())
        .flat_map(|v| v.routes.iter())
    {
        let Some(route::Action::Route(a)) = &r.action else {
            continue;
        };
        match &a.cluster_specifier {
            Some(route_action::ClusterSpecifier::Cluster(c)) => {
                names.insert(c.clone());
            }
            Some(route_action::ClusterSpecifier::WeightedClusters(w)) => {
                names.extend(w.clusters.iter().map(|c| c.name.clone()))
            }
            _ => {}
        }
        names.extend(a.request_mirror_policies.iter().map(|m| m.cluster.clone()));
    }
    names
        .into_iter()
        .map(|name| Cluster {
            name,
            cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Static as i32)),
            connect_timeout: Some(xds_api::pbwkt::Duration { seconds: 1, nanos: 0 }),
            ..Default::default()
        })
        .collect()
}
