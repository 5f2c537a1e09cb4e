//! One test per template function of Istio's funcmap and the sprig subset.

use std::collections::BTreeMap;

use serde_json::json;

use crate::template::{FuncCtx, Template, Value};

fn render(src: &str, data: serde_json::Value) -> String {
    let env: BTreeMap<String, String> = [("FOO".to_string(), "bar".to_string())].into_iter().collect();
    let t = Template::parse(src).unwrap_or_else(|e| panic!("{src}: {e}"));
    t.render(&Value::from_json(&data), &FuncCtx { env: &env })
        .unwrap_or_else(|e| panic!("{src}: {e}"))
}

fn r(src: &str) -> String {
    render(src, json!({}))
}

#[test]
fn annotation_and_value_or_default() {
    let meta = json!({"m": {"Annotations": {"a": "x"}}});
    // `.m` is a map here; annotation reads its Annotations
    assert_eq!(
        render(
            r#"{{ annotation .m "a" "d" }}|{{ annotation .m "b" "d" }}|{{ annotation .m "b" 5 }}"#,
            meta
        ),
        "x|d|5"
    );
    assert_eq!(
        r(r#"{{ valueOrDefault "" "d" }}|{{ valueOrDefault "v" "d" }}|{{ valueOrDefault .missing 3 }}"#),
        "d|v|3"
    );
}

#[test]
fn isset_contains_directory_lower() {
    assert_eq!(
        render(r#"{{ isset .m "a" }} {{ isset .m "b" }}"#, json!({"m": {"a": ""}})),
        "true false"
    );
    assert_eq!(r(r#"{{ contains "/" "a/b" }} {{ contains "/" "ab" }}"#), "true false");
    assert_eq!(
        r(r#"{{ directory "/etc/certs/ca.pem" }}|{{ toLower "AbC" }}|{{ upper "a" }}"#),
        "/etc/certs/|abc|A"
    );
}

#[test]
fn inbound_ports() {
    let d = json!({"cs": [{"Name": "a", "Ports": [{"ContainerPort": 80}, {"ContainerPort": 53, "Protocol": "UDP"}]},
                          {"Name": "istio-proxy", "Ports": [{"ContainerPort": 15090}]}]});
    assert_eq!(
        render("{{ includeInboundPorts .cs }}|{{ applicationPorts .cs }}", d),
        "80,15090|80"
    );
    assert_eq!(
        r(
            r#"{{ excludeInboundPort 15020 "4,5" }}|{{ excludeInboundPort "15020" "15020" }}|{{ excludeInboundPort 0 "1" }}"#
        ),
        "4,5,15020|15020|1"
    );
    assert_eq!(
        r(r#"{{ excludeInboundPort "1" "" }}|{{ kubevirtInterfaces "a" }}|{{ excludeInterfaces "b" }}"#),
        "1|a|b"
    );
}

#[test]
fn json_functions() {
    let d = json!({"m": {"b": "2", "a": "1"}, "p": {"containerPort": 80, "name": "http"}});
    assert_eq!(
        render("{{ toJSON .m }}|{{ toJSON .none }}", d.clone()),
        r#"{"a":"1","b":"2"}|{}"#
    );
    assert_eq!(
        render("{{ structToJSON .p }}", d.clone()),
        r#"{"name":"http","containerPort":80}"#
    );
    assert_eq!(
        render(
            r#"{{ range $k, $v := fromJSON "{\"x\": 1, \"a\": [2]}" }}{{ $k }}={{ $v }};{{ end }}"#,
            d.clone()
        ),
        "a=[2];x=1;"
    );
    assert_eq!(r(r#"{{ fromJSON "not json" }}"#), "{}");
    assert_eq!(
        render(r#"{{ toJsonMap .m (strdict "c" "3") }}"#, d.clone()),
        r#"{"a":"1","b":"2","c":"3"}"#
    );
    assert_eq!(
        render(
            r#"{{ toJSON (omit .m "a") }}|{{ toJSON (mergeMaps .m (strdict "a" "9")) }}"#,
            d
        ),
        r#"{"b":"2"}|{"a":"9","b":"2"}"#
    );
    assert_eq!(r(r#"{{ toJSON (strdict "k") }}"#), r#"{"k":""}"#);
}

#[test]
fn proto_to_json_cleans_defaults() {
    let pc = Value::structure(
        crate::template::value::Kind::ProxyConfig,
        crate::MeshConfig::default().default_config(),
    );
    let t = Template::parse("{{ protoToJSON .ProxyConfig }}").unwrap_or_else(|e| panic!("{e}"));
    let data = Value::map([("ProxyConfig".to_string(), pc)].into_iter().collect());
    assert_eq!(t.render(&data, &FuncCtx { env: &BTreeMap::new() }), Ok("{}".into()));
}

#[test]
fn yaml_and_indent() {
    let d = json!({"r": {"limits": {"cpu": "2"}, "requests": {"memory": null}}});
    assert_eq!(
        render("{{ toYaml .r }}", d.clone()),
        "limits:\n  cpu: \"2\"\nrequests:\n  memory: null\n"
    );
    assert_eq!(
        render("{{ toYaml (omitNil .r) }}", d.clone()),
        "limits:\n  cpu: \"2\"\n"
    );
    assert_eq!(
        r(r#"{{ indent 2 "a\nb" }}|{{ nindent 2 "a\nb" }}"#),
        "a\n  b|\n  a\n  b"
    );
}

#[test]
fn multus_env_and_otel() {
    assert_eq!(
        r(r#"{{ appendMultusNetwork "" "default/istio-cni" }}"#),
        "default/istio-cni"
    );
    assert_eq!(
        r(r#"{{ appendMultusNetwork "a, b" "default/istio-cni" }}"#),
        "a, b, default/istio-cni"
    );
    assert_eq!(
        r(r#"{{ appendMultusNetwork "[{\"name\": \"x\"}]" "default/istio-cni" }}"#),
        r#"[{"name": "x"}, {"name": "istio-cni", "namespace": "default"}]"#
    );
    assert_eq!(r(r#"{{ env "FOO" "d" }}|{{ env "NOPE" "d" }}"#), "bar|d");
    let mc = json!({"mc": {"ExtensionProviders": [{"Opentelemetry": {"ServiceAttributeEnrichment": "OTEL_SEMANTIC_CONVENTIONS"}}]},
        "cs": [{"Name": "app", "Image": "nginx:1.21"}]});
    assert_eq!(
        render(r#"{{ otelResourceAttributes .mc .a .l "ns" .cs }}"#, mc),
        "service.namespace=ns,service.version=1.21,service.instance.id=ns.$(POD_NAME).app"
    );
    assert_eq!(
        r(r#"{{ formatDuration "23s" }}|{{ formatDuration "90s" }}|{{ formatDuration "0.5s" }}"#),
        "23s|1m30s|500ms"
    );
}

#[test]
fn sprig_subset() {
    assert_eq!(
        r(r#"{{ default "d" "" }}|{{ default "d" "v" }}|{{ .x | default 3 }}|{{ empty "" }}"#),
        "d|v|3|true"
    );
    assert_eq!(
        r(r#"{{ quote "a" }}|{{ .missing | quote }}|{{ 5 | quote }}|{{ squote "a" }}"#),
        r#""a"||"5"|'a'"#
    );
    assert_eq!(
        r(r#"{{ list "a" "b" | join "," }}|{{ $l := list }}{{ $l = append $l 1 }}{{ len $l }}"#),
        "a,b|1"
    );
    assert_eq!(
        r(r#"{{ trunc 3 "abcdef" }}|{{ trunc -2 "abcdef" }}|{{ trimAll "-_" "-a_" }}"#),
        "abc|ef|a"
    );
    assert_eq!(
        r(
            r#"{{ trim " a " }}|{{ trimPrefix "a" "ab" }}|{{ trimSuffix "b" "ab" }}|{{ hasPrefix "a" "ab" }}|{{ hasSuffix "x" "ab" }}"#
        ),
        "a|b|a|true|false"
    );
    assert_eq!(
        r(r#"{{ replace "a" "b" "aa" }}|{{ toString 3 }}|{{ (dict "k" 1).k }}|{{ printf "%s=%d" "a" 1 }}"#),
        "bb|3|1|a=1"
    );
}
