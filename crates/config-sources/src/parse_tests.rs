//! Tests of `parse`: document splitting, List expansion, and per-document outcomes.

use std::path::Path;

use model::config::ConfigError;
use model::{ConfigKind, ConfigSpec};

use super::*;
use crate::testutil::service_entry;

fn ok_names(results: &[Result<Config, SourceError>]) -> Vec<String> {
    results
        .iter()
        .filter_map(|r| r.as_ref().ok())
        .map(|c| c.meta.name.clone())
        .collect()
}

#[test]
fn config_files_are_yaml_and_json_but_not_hidden_or_scratch() {
    for yes in ["a.yaml", "dir/b.yml", "c.json", "D.YAML"] {
        assert!(is_config_file(Path::new(yes)), "{yes}");
    }
    for no in [
        ".hidden.yaml",
        "a.yaml~",
        "a.yaml.swp",
        ".#a.yaml",
        "#a.yaml#",
        "a.txt",
        "Makefile",
        "a.yaml.tmp",
    ] {
        assert!(!is_config_file(Path::new(no)), "{no}");
    }
}

#[test]
fn multi_document_yaml_skips_empty_documents() {
    let text = format!(
        "---\n# only a comment\n---\n{}---\n---\n{}\n---\n",
        service_entry("a"),
        service_entry("b")
    );
    let results = parse_documents(&text, Path::new("se.yaml"));
    assert_eq!(ok_names(&results), ["a", "b"]);
    assert_eq!(results.len(), 2);
    let first = results[0].as_ref().unwrap();
    assert_eq!(first.kind, ConfigKind::ServiceEntry);
    assert_eq!(first.meta.namespace, "default");
    let ConfigSpec::ServiceEntry(se) = &first.spec else {
        panic!("not a ServiceEntry: {first:?}")
    };
    assert_eq!(se.hosts, ["a.example.com"]);
    assert_eq!(se.ports[0].number, 80);
    assert_eq!(se.endpoints[0].address, "127.0.0.1");
}

/// `addresses: [1.2.3.4, 2001:db8::]` is two addresses, as Go's YAML parser (istiod's) reads it,
/// where a YAML 1.2 parser reads the IPv6 one as a one-key map.
#[test]
fn ipv6_addresses_in_flow_lists_are_read_as_istio_reads_them() {
    let text = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: v6}\n\
        spec: {hosts: [v6.example.com], addresses: [1.2.3.4, 2001:db8::], location: MESH_INTERNAL,\n\
        ports: [{number: 80, name: http}], resolution: STATIC, endpoints: [{address: \"2001:db8::1\"}]}\n";
    let results = parse_documents(text, Path::new("v6.yaml"));
    let config = results[0].as_ref().unwrap_or_else(|e| panic!("{e}"));
    let ConfigSpec::ServiceEntry(se) = &config.spec else {
        panic!("not a ServiceEntry")
    };
    assert_eq!(se.addresses, ["1.2.3.4", "2001:db8::"]);
    // A one-key map that is no address stays a map (and is refused as the kind says).
    let mut v = serde_json::json!([{"a:b": null}, {"fe80:": null}, {"x": 1}]);
    ipv6_list_items_as_go_reads_them(&mut v);
    assert_eq!(v, serde_json::json!([{"a:b": null}, "fe80::", {"x": 1}]));
}

#[test]
fn namespace_defaults_when_missing() {
    let text = "apiVersion: networking.istio.io/v1\nkind: ServiceEntry\nmetadata: {name: x}\nspec: {hosts: [x.com]}\n";
    let results = parse_documents(text, Path::new("x.yaml"));
    assert_eq!(results[0].as_ref().unwrap().meta.namespace, DEFAULT_NAMESPACE);
}

#[test]
fn json_object_array_list_and_stream() {
    let object = r#"{"apiVersion":"networking.istio.io/v1","kind":"ServiceEntry",
        "metadata":{"name":"one","namespace":"ns1"},"spec":{"hosts":["one.com"]}}"#;
    assert_eq!(ok_names(&parse_documents(object, Path::new("o.json"))), ["one"]);

    let two = object.replace("\"one", "\"two");
    let array = format!("[{object}, {two}]");
    assert_eq!(ok_names(&parse_documents(&array, Path::new("a.json"))), ["one", "two"]);

    let list = format!(r#"{{"apiVersion":"v1","kind":"List","items":[{object},{two}]}}"#);
    assert_eq!(ok_names(&parse_documents(&list, Path::new("l.json"))), ["one", "two"]);

    let stream = format!("{object}\n\n{two}\n");
    let docs = parse_file(&stream, Path::new("s.json"), DEFAULT_NAMESPACE).unwrap();
    assert_eq!(docs.len(), 2);
    assert_eq!(
        docs[0].doc,
        DocRef {
            document: 1,
            item: None,
            line: Some(1)
        }
    );
    assert_eq!(
        docs[1].doc,
        DocRef {
            document: 2,
            item: None,
            line: Some(4)
        }
    );
}

#[test]
fn yaml_list_expands_items() {
    let items: String = ["a", "b"].iter().map(|n| indent(&service_entry(n))).collect();
    let text = format!("apiVersion: v1\nkind: List\nitems:\n{items}");
    let docs = parse_file(&text, Path::new("list.yaml"), DEFAULT_NAMESPACE).unwrap();
    let names: Vec<_> = docs
        .iter()
        .map(|d| d.result.as_ref().unwrap().meta.name.clone())
        .collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(docs[1].doc.item, Some(1));
    let typed = format!("apiVersion: networking.istio.io/v1\nkind: ServiceEntryList\nitems:\n{items}");
    assert_eq!(ok_names(&parse_documents(&typed, Path::new("list.yaml"))), ["a", "b"]);
}

fn indent(doc: &str) -> String {
    doc.lines()
        .enumerate()
        .map(|(i, l)| if i == 0 { format!("- {l}\n") } else { format!("  {l}\n") })
        .collect()
}

#[test]
fn unknown_kind_is_reported_as_a_warning_and_skipped() {
    let text = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: cm, namespace: kube}}\ndata: {{a: b}}\n---\n{}",
        service_entry("kept")
    );
    let results = parse_documents(&text, Path::new("mixed.yaml"));
    assert_eq!(ok_names(&results), ["kept"]);
    let err = results[0].as_ref().unwrap_err();
    assert!(
        matches!(err, SourceError::UnknownKind { kind, .. } if kind == "ConfigMap"),
        "{err:?}"
    );
    assert_eq!(err.level(), crate::Level::Warning);
    assert_eq!(err.resource().as_deref(), Some("ConfigMap kube/cm"));
    assert!(
        err.to_string()
            .starts_with("mixed.yaml: document 1 (line 1): unknown kind"),
        "{err}"
    );
}

#[test]
fn unsupported_istio_kind_is_kept() {
    let text = "apiVersion: telemetry.istio.io/v1\nkind: Telemetry\nmetadata: {name: logs, namespace: foo}\n\
                spec: {accessLogging: [{providers: [{name: envoy}]}]}\n";
    let results = parse_documents(text, Path::new("telemetry.yaml"));
    let config = results[0].as_ref().unwrap();
    assert_eq!(config.kind, ConfigKind::Telemetry);
    assert!(!config.kind.is_supported());
    let ConfigSpec::Unsupported(spec) = &config.spec else {
        panic!("{config:?}")
    };
    assert_eq!(spec["accessLogging"][0]["providers"][0]["name"], "envoy");
}

/// Kubernetes Ingress and IngressClass manifests are kept whole for the Ingress conversion, as
/// the API server would hand them over (an IngressClass has no namespace).
#[test]
fn ingress_and_ingress_class_manifests_are_kept_whole() {
    let text = "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata: {name: web, namespace: shop}\n\
                spec: {ingressClassName: istio, rules: [{host: a.example.com}]}\n---\n\
                apiVersion: networking.k8s.io/v1\nkind: IngressClass\nmetadata: {name: istio}\n\
                spec: {controller: istio.io/ingress-controller}\n";
    let results = parse_documents(text, Path::new("ingress.yaml"));
    let ingress = results[0].as_ref().unwrap();
    assert_eq!(
        (ingress.kind, ingress.meta.namespace.as_str()),
        (ConfigKind::Ingress, "shop")
    );
    assert!(ingress.kind.is_supported() && ingress.kind.is_kubernetes());
    let ConfigSpec::Kubernetes(v) = &ingress.spec else {
        panic!("{ingress:?}")
    };
    assert_eq!(v["spec"]["rules"][0]["host"], "a.example.com");
    let class = results[1].as_ref().unwrap();
    assert_eq!(
        (class.kind, class.meta.namespace.as_str()),
        (ConfigKind::IngressClass, "")
    );
}

#[test]
fn invalid_documents_are_dropped_and_siblings_kept() {
    let unknown_field = service_entry("typo").replace("resolution:", "resolutionz:");
    let wrong_type = service_entry("wrongtype").replace("number: 80", "number: eighty");
    let no_name = service_entry("noname").replace("name: noname, ", "");
    let text = [
        service_entry("good1"),
        unknown_field,
        wrong_type,
        no_name,
        service_entry("good2"),
    ]
    .join("---\n");
    let results = parse_documents(&text, Path::new("some-bad.yaml"));
    assert_eq!(results.len(), 5);
    assert_eq!(ok_names(&results), ["good1", "good2"]);

    let typo = results[1].as_ref().unwrap_err();
    assert!(
        matches!(typo, SourceError::Invalid { source, .. } if matches!(**source, ConfigError::Decode { .. })),
        "{typo:?}"
    );
    assert_eq!(typo.resource().as_deref(), Some("ServiceEntry default/typo"));
    assert!(typo.to_string().contains("resolutionz"), "{typo}");
    assert!(typo.to_string().contains("document 2 (line 10)"), "{typo}");

    let wrong = results[2].as_ref().unwrap_err();
    assert_eq!(wrong.resource().as_deref(), Some("ServiceEntry default/wrongtype"));
    assert!(wrong.is_invalid_resource());

    let unnamed = results[3].as_ref().unwrap_err();
    assert!(
        matches!(unnamed, SourceError::Invalid { source, .. } if matches!(**source, ConfigError::Metadata { .. })),
        "{unnamed:?}"
    );
    assert_eq!(unnamed.kind().as_deref(), Some("ServiceEntry"));
}

#[test]
fn not_a_resource_is_invalid() {
    let results = parse_documents("just a string\n---\n- 1\n- [2]\n", Path::new("junk.yaml"));
    assert_eq!(
        results.len(),
        1 + 2,
        "a top-level sequence expands like a List: {results:?}"
    );
    for r in &results {
        assert!(
            matches!(r, Err(SourceError::Invalid { source, .. }) if matches!(**source, ConfigError::NotAResource)),
            "{r:?}"
        );
    }
}

#[test]
fn syntax_error_is_one_error_for_the_whole_file() {
    let text = format!("{}---\nspec: [unclosed\n", service_entry("a"));
    let results = parse_documents(&text, Path::new("broken.yaml"));
    assert_eq!(results.len(), 1);
    let err = results[0].as_ref().unwrap_err();
    assert!(matches!(err, SourceError::Syntax { .. }), "{err:?}");
    assert!(err.is_file_level());
    assert!(!err.to_string().contains('\n'), "one line: {err}");

    let json = parse_documents("{\"apiVersion\": ", Path::new("broken.json"));
    assert!(matches!(&json[..], [Err(SourceError::Syntax { .. })]), "{json:?}");
    let dup = parse_documents("a: 1\na: 2\n", Path::new("dup.yaml"));
    assert!(matches!(&dup[..], [Err(SourceError::Syntax { .. })]), "{dup:?}");
}

#[test]
fn empty_files_have_no_documents() {
    assert!(parse_documents("", Path::new("e.yaml")).is_empty());
    assert!(parse_documents("# nothing\n---\n", Path::new("e.yaml")).is_empty());
    assert!(parse_documents("  \n", Path::new("e.json")).is_empty());
}
