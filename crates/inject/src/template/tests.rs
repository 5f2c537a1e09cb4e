//! Tests of the Go template engine on the constructs Istio's templates use.

use std::collections::BTreeMap;

use serde_json::json;

use super::value::Kind;
use super::*;

fn run(src: &str, data: &Value) -> Result<String, TemplateError> {
    Template::parse(src)?.render(data, &FuncCtx { env: &BTreeMap::new() })
}

fn r(src: &str, data: serde_json::Value) -> String {
    run(src, &Value::from_json(&data)).unwrap_or_else(|e| panic!("{src}: {e}"))
}

#[test]
fn if_else_if_with_range_and_trim() {
    let d = json!({"a": 1, "b": "", "l": ["x", "y"], "m": {"k2": "v2", "k1": "v1"}});
    assert_eq!(r("{{ if .b }}b{{ else if .a }}a{{ else }}n{{ end }}", d.clone()), "a");
    assert_eq!(
        r(
            "{{ with .b }}b{{ else }}none{{ end }}{{ with .a }}{{ . }}{{ end }}",
            d.clone()
        ),
        "none1"
    );
    assert_eq!(
        r("{{ range $i, $v := .l }}{{ $i }}{{ $v }},{{ end }}", d.clone()),
        "0x,1y,"
    );
    // maps range in key order, as Go's
    assert_eq!(
        r("{{ range $k, $v := .m }}{{ $k }}={{ $v }} {{ end }}", d.clone()),
        "k1=v1 k2=v2 "
    );
    assert_eq!(r("{{ range .none }}x{{ else }}empty{{ end }}", d.clone()), "empty");
    assert_eq!(r("{{ range $i := 3 }}{{ $i }}{{ end }}", d.clone()), "012");
    assert_eq!(
        r(
            "{{ range .l }}{{ if eq . \"y\" }}{{ break }}{{ end }}{{ . }}{{ end }}",
            d.clone()
        ),
        "x"
    );
    assert_eq!(r("a  \n  {{- .a -}}  \n b", d.clone()), "a1b");
    assert_eq!(r("{{- /* comment */ -}} x {{/* c */}}", d), "x ");
}

#[test]
fn variables_assign_in_range_and_scope() {
    let d = json!({"cs": [{"Name": "a"}, {"Name": "istio-proxy"}, {"Name": "b"}]});
    let src = r#"{{- $names := list }}{{- range $i, $c := .cs }}{{ if not (eq $c.Name "istio-proxy") }}{{ $names = append $names $c.Name }}{{ end }}{{ end }}{{ $names | join "," }}"#;
    assert_eq!(r(src, d.clone()), "a,b");
    assert_eq!(
        r(
            "{{ $x := 1 }}{{ if true }}{{ $x := 2 }}{{ $x }}{{ end }}{{ $x }}",
            d.clone()
        ),
        "21"
    );
    assert_eq!(r("{{ range .cs }}{{ $.cs | len }}{{ end }}", d.clone()), "333");
    assert!(run("{{ $y = 1 }}", &Value::Nil).is_err());
}

#[test]
fn pipelines_parens_and_chains() {
    let d = json!({"pilot": {"env": {"X": true}}, "s": "v"});
    assert_eq!(r("{{ if eq (.pilot.env).X true }}yes{{ end }}", d.clone()), "yes");
    assert_eq!(r("{{ .s | printf \"%s-%s\" \"a\" }}", d.clone()), "a-v");
    assert_eq!(
        r("{{ and 1 0 }}|{{ or 0 \"\" 3 }}|{{ and .nope.deeper .x }}", d.clone()),
        "0|3|<no value>"
    );
    assert_eq!(
        r("{{ .missing }}|{{ index .pilot \"nope\" }}", d),
        "<no value>|<no value>"
    );
}

#[test]
fn define_and_template() {
    let src = r#"{{ define "t" }}[{{ .v }}]{{ end }}a{{ template "t" . }}b{{ template "t" .inner }}"#;
    assert_eq!(r(src, json!({"v": 1, "inner": {"v": 2}})), "a[1]b[2]");
    assert!(run(r#"{{ template "nope" . }}"#, &Value::Nil).is_err());
}

#[test]
fn structs_read_by_go_names_and_print_as_kubernetes_json() {
    let spec = Value::structure(
        Kind::Kube,
        json!({"containers": [{"name": "app", "ports": [{"containerPort": 80}]}]}),
    );
    let data = Value::map([("Spec".to_string(), spec)].into_iter().collect());
    let out = run(
        "{{ range .Spec.Containers }}{{ .Name }}:{{ range .Ports }}{{ .ContainerPort }}{{ toJSON . }}{{ end }}{{ end }}|{{ .Spec.ServiceAccountName }}|{{ eq .Spec.ServiceAccountName \"\" }}",
        &data,
    );
    assert_eq!(out, Ok(r#"app:80{"containerPort":80}||true"#.to_string()));
}

#[test]
fn errors_name_the_line_and_never_panic() {
    for bad in [
        "{{ if }}",
        "{{ end }}",
        "{{ .a ",
        "{{ if .a }}x",
        "{{ \"unterminated }}",
        "{{ range $i, }}",
        "{{ | x }}",
        "{{ (1 }}",
    ] {
        assert!(Template::parse(bad).is_err(), "{bad} parsed");
    }
    // an undefined function is a parse error, as in Go
    let e = Template::parse("a\n{{ if true }}{{ nofunc 1 }}{{ end }}");
    assert!(matches!(e, Err(TemplateError::Parse(2, _))), "{e:?}");
    assert!(run("{{ index .l 5 }}", &Value::from_json(&json!({"l": [1]}))).is_err());
    assert!(run("{{ 1 2 }}", &Value::Nil).is_err());
    // a runaway loop stops at the output limit
    let big = run(
        "{{ range 100000000 }}0123456789abcdef0123456789abcdef{{ end }}",
        &Value::Nil,
    );
    assert!(
        matches!(big, Err(TemplateError::Exec(_, ref m)) if m.contains("MiB")),
        "{big:?}"
    );
}
