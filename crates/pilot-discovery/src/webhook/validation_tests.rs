use std::path::{Path, PathBuf};

use prometheus_client::registry::Registry;
use serde_json::{Value, json};

use super::*;
use crate::webhook::admission::{GroupVersionKind, GroupVersionResource};

fn metrics() -> (PipelineMetrics, Registry) {
    let mut registry = Registry::default();
    (PipelineMetrics::register(&mut registry), registry)
}

fn counted(registry: &Registry, prefix: &str) -> Vec<String> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).unwrap();
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

fn request(operation: &str, object: Value) -> AdmissionRequest {
    AdmissionRequest {
        uid: "u1".into(),
        kind: GroupVersionKind {
            kind: object.get("kind").and_then(Value::as_str).unwrap_or_default().into(),
        },
        resource: GroupVersionResource {
            resource: "virtualservices".into(),
        },
        namespace: "default".into(),
        name: object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .into(),
        operation: operation.into(),
        object: Some(object),
        dry_run: None,
    }
}

fn virtual_service(spec: Value) -> Value {
    json!({
        "apiVersion": "networking.istio.io/v1",
        "kind": "VirtualService",
        "metadata": {"name": "reviews", "namespace": "default"},
        "spec": spec,
    })
}

fn message(r: &AdmissionResponse) -> &str {
    r.result.as_ref().map_or("", |s| s.message.as_str())
}

#[test]
fn a_valid_object_is_allowed_and_counted() {
    let (m, registry) = metrics();
    let vs =
        virtual_service(json!({"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}]}]}));
    for op in ["CREATE", "UPDATE"] {
        let r = validate(&request(op, vs.clone()), &m);
        assert!(r.allowed, "{r:?}");
    }
    assert_eq!(
        counted(&registry, "galley_validation_passed_total"),
        ["galley_validation_passed_total{resource=\"virtualservices\"} 2"]
    );
}

#[test]
fn an_invalid_object_is_denied_naming_the_field() {
    let (m, registry) = metrics();
    let vs = virtual_service(
        json!({"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}, "weight": -1}]}]}),
    );
    let r = validate(&request("CREATE", vs), &m);
    assert!(!r.allowed);
    assert!(message(&r).starts_with("configuration is invalid: "), "{}", message(&r));
    assert!(message(&r).contains("weight"), "{}", message(&r));
    assert_eq!(
        counted(&registry, "galley_validation_failed_total"),
        ["galley_validation_failed_total{resource=\"virtualservices\",reason=\"invalid_resource\"} 1"]
    );
}

#[test]
fn istios_answers_for_each_kind_of_bad_object() {
    let (m, registry) = metrics();
    // A list where a map belongs.
    let r = validate(&request("CREATE", virtual_service(json!({"hosts": {"a": 1}}))), &m);
    assert!(
        message(&r).starts_with("error decoding configuration: spec"),
        "{}",
        message(&r)
    );
    // A top-level field Istio does not know.
    let mut vs =
        virtual_service(json!({"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}]}]}));
    vs["extra"] = json!(1);
    let r = validate(&request("CREATE", vs), &m);
    assert_eq!(
        message(&r),
        "unknown field \"extra\" on VirtualService resource default/reviews"
    );
    // A kind of an Istio group that Istio does not know.
    let r = validate(
        &request(
            "CREATE",
            json!({"apiVersion": "networking.istio.io/v1", "kind": "Frobnicator", "metadata": {"name": "x"}}),
        ),
        &m,
    );
    assert_eq!(message(&r), "unrecognized type networking.istio.io/v1/Frobnicator");
    // Not an object, or no kind.
    let r = validate(&request("CREATE", json!([1, 2])), &m);
    assert!(
        message(&r).starts_with("cannot decode configuration"),
        "{}",
        message(&r)
    );
    let r = validate(&request("CREATE", json!({"metadata": {"name": "x"}})), &m);
    assert!(
        message(&r).starts_with("cannot decode configuration"),
        "{}",
        message(&r)
    );
    // Each denied, each counted with Istio's reason.
    let mut failed = counted(&registry, "galley_validation_failed_total");
    failed.sort();
    assert_eq!(
        failed,
        [
            "galley_validation_failed_total{resource=\"virtualservices\",reason=\"crd_conversion_error\"} 1",
            "galley_validation_failed_total{resource=\"virtualservices\",reason=\"invalid_resource\"} 1",
            "galley_validation_failed_total{resource=\"virtualservices\",reason=\"unknown_type\"} 1",
            "galley_validation_failed_total{resource=\"virtualservices\",reason=\"yaml_decode_error\"} 2",
        ]
    );
}

#[test]
fn other_operations_other_groups_and_dry_runs() {
    let (m, registry) = metrics();
    // DELETE (and CONNECT) are allowed, counted as unsupported_operation.
    let r = validate(&request("DELETE", virtual_service(json!({"hosts": {"a": 1}}))), &m);
    assert!(r.allowed);
    // A kind outside the Istio groups is not ours to judge.
    let r = validate(
        &request(
            "CREATE",
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}),
        ),
        &m,
    );
    assert!(r.allowed);
    // A dry run is answered the same and not counted as a failure.
    let mut dry = request("CREATE", virtual_service(json!({"hosts": []})));
    dry.dry_run = Some(true);
    let r = validate(&dry, &m);
    assert!(!r.allowed, "{r:?}");
    assert_eq!(
        counted(&registry, "galley_validation_failed_total"),
        ["galley_validation_failed_total{resource=\"virtualservices\",reason=\"unsupported_operation\"} 1"]
    );
}

/// `<workspace>/../shared/corpus/istio`; fails when the corpus is not there.
fn corpus_root() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/corpus/istio");
    assert!(
        root.is_dir(),
        "the Istio corpus is missing: {} (these tests need ../shared beside the project)",
        root.display()
    );
    root
}

/// Istio's validation test data through the webhook: every document of `*-valid.yaml` allowed,
/// every one of `*-invalid.yaml` denied, for the kinds pilot-discovery validates.
#[test]
fn istio_validation_testdata_through_the_webhook() {
    let dir = corpus_root().join("pkg/config/validation/testdata/crds");
    let (m, _registry) = metrics();
    let (mut allowed, mut denied, mut failures) = (0, 0, Vec::new());
    for prefix in [
        "destinationrule",
        "serviceentry",
        "workloadentry",
        "peerauth",
        "authz",
        "reqauth",
    ] {
        for (suffix, expect_allowed) in [("valid", true), ("invalid", false)] {
            let path = dir.join(format!("{prefix}-{suffix}.yaml"));
            // Go reads `[1.2.3.4, 001:db8::]` as two addresses; quoted so YAML 1.2 agrees.
            let text = std::fs::read_to_string(&path)
                .unwrap()
                .replace("[1.2.3.4, 001:db8::]", r#"[1.2.3.4, "001:db8::"]"#);
            let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
            for mut doc in docs.into_iter().filter(|d| !d.is_null()) {
                // The expected error, not part of the object.
                doc.as_object_mut().map(|o| o.remove("_err"));
                let r = validate(&request("CREATE", doc.clone()), &m);
                match (expect_allowed, r.allowed) {
                    (true, true) => allowed += 1,
                    (false, false) => denied += 1,
                    _ => failures.push(format!("{}: {} -> {r:?}", path.display(), doc)),
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        allowed >= 10 && denied >= 15,
        "too few documents: {allowed} allowed, {denied} denied"
    );
}
