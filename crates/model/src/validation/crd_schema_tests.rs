//! Every field Istio's CRDs define for a kind we serve is accepted: the test walks the OpenAPI
//! schema of `../shared/corpus/istio/crd-all.gen.yaml` (v1 of VirtualService, DestinationRule,
//! Gateway, ServiceEntry, WorkloadEntry, Sidecar, PeerAuthentication, AuthorizationPolicy,
//! RequestAuthentication), builds for each field a spec that sets only
//! that field (a value of its schema type, inside the objects, lists and maps on its path), and
//! fails on any field our model refuses as unknown. A config written for Istio must never lose
//! every rule of its hosts because it uses a field the model lacks.

use serde_json::{Map, Value, json};

use super::corpus_tests::corpus_root;
use crate::config::parse_config;

const KINDS: [(&str, &str); 9] = [
    ("networking.istio.io", "VirtualService"),
    ("networking.istio.io", "DestinationRule"),
    ("networking.istio.io", "Gateway"),
    ("networking.istio.io", "ServiceEntry"),
    ("networking.istio.io", "WorkloadEntry"),
    ("networking.istio.io", "Sidecar"),
    ("security.istio.io", "PeerAuthentication"),
    ("security.istio.io", "AuthorizationPolicy"),
    ("security.istio.io", "RequestAuthentication"),
];

/// The `spec` schema of `kind`'s v1 version.
fn spec_schema(crds: &[Value], kind: &str) -> Value {
    let crd = crds
        .iter()
        .find(|d| d.pointer("/spec/names/kind").and_then(Value::as_str) == Some(kind))
        .unwrap_or_else(|| panic!("{kind}: no CRD in crd-all.gen.yaml"));
    let versions = crd
        .pointer("/spec/versions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let v1 = versions
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some("v1"))
        .unwrap_or_else(|| panic!("{kind}: no v1 version"));
    v1.pointer("/schema/openAPIV3Schema/properties/spec")
        .cloned()
        .unwrap_or_else(|| panic!("{kind}: no spec schema"))
}

/// A value of the schema's type, for a leaf.
fn sample(schema: &Value) -> Value {
    if schema.get("x-kubernetes-int-or-string").is_some() {
        return json!(1);
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => match schema.get("enum").and_then(Value::as_array).and_then(|e| e.first()) {
            Some(first) => first.clone(),
            None => json!("x"),
        },
        Some("integer") | Some("number") => json!(1),
        Some("boolean") => json!(true),
        Some("array") => json!([]),
        _ => json!({}),
    }
}

/// Every field path under `schema`, each with the spec value that sets only that field.
fn field_specs(schema: &Value, path: &str, out: &mut Vec<(String, Value)>, wrap: &dyn Fn(Value) -> Value) {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        for (name, sub) in props {
            let here = format!("{path}.{name}");
            let wrap_field = |v: Value| {
                let mut m = Map::new();
                m.insert(name.clone(), v);
                wrap(Value::Object(m))
            };
            out.push((here.clone(), wrap_field(sample(sub))));
            field_specs(sub, &here, out, &wrap_field);
        }
    }
    if let Some(items) = schema.get("items") {
        let wrap_item = |v: Value| wrap(Value::Array(vec![v]));
        field_specs(items, &format!("{path}[]"), out, &wrap_item);
    }
    if let Some(values) = schema.get("additionalProperties").filter(|v| v.is_object()) {
        let wrap_value = |v: Value| {
            let mut m = Map::new();
            m.insert("k".to_owned(), v);
            wrap(Value::Object(m))
        };
        field_specs(values, &format!("{path}.*"), out, &wrap_value);
    }
}

#[test]
fn every_field_of_istios_crds_for_the_kinds_we_serve_is_known() {
    let path = corpus_root().join("crd-all.gen.yaml");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let crds: Vec<Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: not YAML: {e}", path.display()));
    let mut unknown = Vec::new();
    let mut checked = 0;
    for (group, kind) in KINDS {
        let mut specs = Vec::new();
        field_specs(&spec_schema(&crds, kind), "spec", &mut specs, &|v| v);
        for (field, spec) in specs {
            checked += 1;
            let doc = json!({"apiVersion": format!("{group}/v1"), "kind": kind,
                             "metadata": {"name": "x", "namespace": "default"}, "spec": spec});
            if let Err(e) = parse_config(doc, "default")
                && e.to_string().contains("unknown field")
            {
                unknown.push(format!("{kind} {field}: {e}"));
            }
        }
    }
    assert!(
        checked > 500,
        "only {checked} fields walked: is the schema shape as expected?"
    );
    assert!(
        unknown.is_empty(),
        "{} of {checked} fields of Istio's CRDs are unknown to the model:\n{}",
        unknown.len(),
        unknown.join("\n")
    );
}
