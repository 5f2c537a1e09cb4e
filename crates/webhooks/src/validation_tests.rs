use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::*;
use crate::admission::{GroupVersionKind, GroupVersionResource};

fn failed(reason: &'static str) -> Option<Count> {
    Some(Count::Failed {
        resource: "virtualservices".into(),
        reason,
    })
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
    let vs =
        virtual_service(json!({"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}]}]}));
    for op in ["CREATE", "UPDATE"] {
        let v = validate(&request(op, vs.clone()));
        assert!(v.response.allowed, "{v:?}");
        assert_eq!(
            v.count,
            Some(Count::Passed {
                resource: "virtualservices".into()
            })
        );
    }
}

#[test]
fn an_invalid_object_is_denied_naming_the_field() {
    let vs = virtual_service(
        json!({"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}, "weight": -1}]}]}),
    );
    let v = validate(&request("CREATE", vs));
    assert!(!v.response.allowed);
    assert!(message(&v.response).starts_with("configuration is invalid: "), "{v:?}");
    assert!(message(&v.response).contains("weight"), "{v:?}");
    assert_eq!(v.count, failed("invalid_resource"));
}

#[test]
fn istios_answers_for_each_kind_of_bad_object() {
    let mut vs =
        virtual_service(json!({"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}]}]}));
    vs["extra"] = json!(1);
    let cases = [
        // A list where a map belongs.
        (
            virtual_service(json!({"hosts": {"a": 1}})),
            "error decoding configuration: spec",
            "crd_conversion_error",
        ),
        // A top-level field Istio does not know.
        (
            vs,
            "unknown field \"extra\" on VirtualService resource default/reviews",
            "invalid_resource",
        ),
        // A kind of an Istio group that Istio does not know.
        (
            json!({"apiVersion": "networking.istio.io/v1", "kind": "Frobnicator", "metadata": {"name": "x"}}),
            "unrecognized type networking.istio.io/v1/Frobnicator",
            "unknown_type",
        ),
        // Not an object, or no kind.
        (json!([1, 2]), "cannot decode configuration", "yaml_decode_error"),
        (
            json!({"metadata": {"name": "x"}}),
            "cannot decode configuration",
            "yaml_decode_error",
        ),
    ];
    for (object, says, reason) in cases {
        let v = validate(&request("CREATE", object.clone()));
        assert!(!v.response.allowed, "{object}");
        assert!(message(&v.response).starts_with(says), "{object}: {v:?}");
        assert_eq!(v.count, failed(reason), "{object}");
    }
}

#[test]
fn other_operations_other_groups_and_dry_runs() {
    // DELETE (and CONNECT) are allowed, counted as unsupported_operation.
    let v = validate(&request("DELETE", virtual_service(json!({"hosts": {"a": 1}}))));
    assert!(v.response.allowed);
    assert_eq!(v.count, failed("unsupported_operation"));
    // A kind outside the Istio groups is not ours to judge.
    let v = validate(&request(
        "CREATE",
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}),
    ));
    assert!(v.response.allowed);
    // A dry run is answered the same and not counted as a failure.
    let mut dry = request("CREATE", virtual_service(json!({"hosts": []})));
    dry.dry_run = Some(true);
    let v = validate(&dry);
    assert!(!v.response.allowed, "{v:?}");
    assert_eq!(v.count, None);
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
                let r = validate(&request("CREATE", doc.clone())).response;
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

#[test]
fn istios_always_reject_annotation_is_denied() {
    let mut vs =
        virtual_service(json!({"hosts": ["reviews"], "http": [{"route": [{"destination": {"host": "reviews"}}]}]}));
    vs["metadata"]["annotations"] = json!({ALWAYS_REJECT: "true"});
    let v = validate(&request("CREATE", vs));
    assert!(!v.response.allowed);
    assert!(message(&v.response).contains("annotation found, rejecting"), "{v:?}");
}
