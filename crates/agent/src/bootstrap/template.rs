//! `--templateFile`: a user's Go text/template of the bootstrap, rendered with the `gtmpl` crate and
//! the parameter names of Istio's `pkg/bootstrap/option` (`nodeID`, `cluster`, `meta_json_str`,
//! `config.ProxyAdminPort`, `xds_type`, `inclusionPrefix`, ...), so a template written for Istio's
//! agent renders here. Functions: Go's builtins, `js`, and `toJSON`/`toJson`. Sprig's other
//! functions are not available; a template that calls one fails with the function's name.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use gtmpl::{Context, FuncError, Template, Value as Tmpl};
use serde_json::{Map, Value, json};

use super::{BootstrapError, BootstrapOptions, static_resources, stats};
use crate::config::AgentConfig;

/// Istio's template parameters for `cfg`, as JSON (maps become template fields).
pub fn template_params(cfg: &AgentConfig, opts: &BootstrapOptions) -> Value {
    let (prefixes, suffixes, regexps) = stats::inclusion_lists(cfg);
    let discovery_host = cfg.discovery_address.split(':').next().unwrap_or_default();
    let pilot_san: Vec<Value> = cfg.pilot_san.iter().map(|s| json!({"exact": s})).collect();
    let mut p = json!({
        "nodeID": cfg.node_id,
        "nodeType": cfg.node_type.as_str(),
        "cluster": cfg.service_cluster,
        "meta_json_str": cfg.metadata.to_string(),
        "metadata": cfg.metadata,
        "runtime_flags": stats::runtime_flags(&cfg.proxy_config).to_string(),
        "config": go_field_names(serde_json::to_value(&cfg.proxy_config).unwrap_or_default()),
        "localhost": cfg.localhost(),
        "wildcard": cfg.wildcard(),
        "dns_lookup_family": if cfg.ipv6_only() { "V6_ONLY" } else { "V4_ONLY" },
        "xds_type": opts.ads_api.api_type(),
        "discovery_address": cfg.discovery_address,
        "discovery_host": discovery_host,
        "pilot_SAN": Value::Array(pilot_san).to_string(),
        "log_json": opts.log_as_json,
        "metadata_discovery": false,
        "metrics_localhost_access_only": static_resources::metrics_localhost_only(cfg),
        "envoy_metrics_stats_compression": static_resources::stats_compression(cfg),
        "workload_identity_socket_file": cfg.paths.workload_identity_socket_file,
        "envoy_status_port": cfg.envoy_status_port,
        "envoy_prometheus_port": cfg.envoy_prometheus_port,
        "global_downstream_max_connections": cfg.global_downstream_max_connections,
        "inclusionPrefix": prefixes,
        "inclusionSuffix": suffixes,
        "inclusionRegexps": regexps,
        "extraStatTags": stats::extra_stat_tags(cfg),
        // Not Istio's: where this agent serves xDS and SDS, and its ports.
        "xds_uds_path": cfg.paths.xds_uds,
        "sds_uds_path": cfg.paths.sds_uds,
        "proxy_admin_port": cfg.proxy_admin_port,
        "status_port": cfg.status_port,
    });
    let Some(obj) = p.as_object_mut() else {
        return p;
    };
    let mut put = |k: &str, v: Option<Value>| {
        if let Some(v) = v {
            obj.insert(k.into(), v);
        }
    };
    let nonempty = |s: &str| (!s.is_empty()).then(|| Value::String(s.to_owned()));
    put("region", nonempty(&cfg.locality.region));
    put("zone", nonempty(&cfg.locality.zone));
    put("sub_zone", nonempty(&cfg.locality.subzone));
    put("outlier_log_path", cfg.outlier_log_path.as_deref().and_then(nonempty));
    put("pilot_grpc_address", address_json(&cfg.discovery_address));
    put("histogram_buckets", stats::histogram_buckets(cfg));
    put("stats_flush_interval", stats::flush_interval(cfg).map(Value::String));
    put(
        "stats_eviction_interval",
        stats::eviction_interval(cfg).map(Value::String),
    );
    if cfg.sts_port != 0 {
        put("sts", Some(true.into()));
        put("sts_port", Some(cfg.sts_port.into()));
    }
    for tracer in ["zipkin", "datadog"] {
        let address = cfg
            .proxy_config
            .tracing
            .as_ref()
            .and_then(|t| t.get(tracer)?.get("address")?.as_str());
        put(tracer, address.and_then(address_json));
    }
    let statsd = cfg.proxy_config.extra.get("statsdUdpAddress").and_then(Value::as_str);
    put("statsd", statsd.and_then(address_json));
    p
}

/// Istio's `addressConverter`: `host:port` as Envoy's `{"address": .., "port_value": ..}` text.
fn address_json(addr: &str) -> Option<Value> {
    let (host, port) = addr.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some(Value::String(format!(
        "{{\"address\": \"{host}\", \"port_value\": {port}}}"
    )))
}

/// The ProxyConfig as Go templates see the protobuf struct: `ProxyAdminPort`, `Tracing.Zipkin`.
/// Map fields (`proxyMetadata`, `runtimeValues`) keep their keys.
fn go_field_names(v: Value) -> Value {
    match v {
        Value::Object(o) => Value::Object(
            o.into_iter()
                .map(|(k, v)| {
                    let is_map = matches!(k.as_str(), "proxyMetadata" | "runtimeValues");
                    let mut chars = k.chars();
                    let go = chars
                        .next()
                        .map(|c| c.to_ascii_uppercase().to_string() + chars.as_str())
                        .unwrap_or_default();
                    (go, if is_map { v } else { go_field_names(v) })
                })
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.into_iter().map(go_field_names).collect()),
        v => v,
    }
}

fn to_tmpl(v: &Value) -> Tmpl {
    match v {
        Value::Null => Tmpl::Nil,
        Value::Bool(b) => Tmpl::from(*b),
        Value::Number(n) => match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => Tmpl::from(u),
            (_, Some(i), _) => Tmpl::from(i),
            (_, _, Some(f)) => Tmpl::from(f),
            _ => Tmpl::Nil,
        },
        Value::String(s) => Tmpl::from(s.clone()),
        Value::Array(a) => Tmpl::from(a.iter().map(to_tmpl).collect::<Vec<_>>()),
        Value::Object(o) => Tmpl::from(
            o.iter()
                .map(|(k, v)| (k.clone(), to_tmpl(v)))
                .collect::<HashMap<_, _>>(),
        ),
    }
}

fn from_tmpl(v: &Tmpl) -> Value {
    match v {
        Tmpl::NoValue | Tmpl::Nil | Tmpl::Function(_) => Value::Null,
        Tmpl::Bool(b) => Value::Bool(*b),
        Tmpl::String(s) => Value::String(s.clone()),
        Tmpl::Number(n) => n
            .as_u64()
            .map(Value::from)
            .or_else(|| n.as_i64().map(Value::from))
            .or_else(|| n.as_f64().map(Value::from))
            .unwrap_or(Value::Null),
        Tmpl::Array(a) => Value::Array(a.iter().map(from_tmpl).collect()),
        Tmpl::Object(o) | Tmpl::Map(o) => {
            Value::Object(o.iter().map(|(k, v)| (k.clone(), from_tmpl(v))).collect::<Map<_, _>>())
        }
    }
}

/// Istio's `toJSON`: the value as JSON, `{}` for nil.
fn to_json(args: &[Tmpl]) -> Result<Tmpl, FuncError> {
    let [arg] = args else {
        return Err(FuncError::ExactlyXArgs("toJSON".into(), 1));
    };
    let json = match from_tmpl(arg) {
        Value::Null => "{}".to_owned(),
        v => v.to_string(),
    };
    Ok(Tmpl::from(json))
}

/// Go's `js`: the argument escaped for a JavaScript (and JSON) string.
fn js(args: &[Tmpl]) -> Result<Tmpl, FuncError> {
    let text: String = args.iter().map(|a| a.to_string()).collect();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\\' => out.push_str(r"\\"),
            '\'' => out.push_str(r"\'"),
            '"' => out.push_str("\\\""),
            '<' => out.push_str(r"\u003C"),
            '>' => out.push_str(r"\u003E"),
            '&' => out.push_str(r"\u0026"),
            '=' => out.push_str(r"\u003D"),
            c if c.is_control() => out.push_str(&format!(r"\u{:04X}", u32::from(c))),
            c => out.push(c),
        }
    }
    Ok(Tmpl::from(out))
}

/// Renders `text` with `params`; the error is the template engine's message.
/// Runs on a thread with a deadline: `gtmpl` can loop forever on some malformed templates.
pub(super) fn render(text: &str, params: &Value) -> Result<String, String> {
    check_actions_closed(text)?;
    let (text, params) = (text.to_owned(), to_tmpl(params));
    let (done, result) = mpsc::channel();
    std::thread::spawn(move || {
        let mut template = Template::default();
        template.add_func("toJSON", to_json);
        template.add_func("toJson", to_json);
        template.add_func("js", js);
        let rendered = template
            .parse(text)
            .map_err(|e| e.to_string())
            .and_then(|()| template.render(&Context::from(params)).map_err(|e| e.to_string()));
        // The receiver is gone only once the deadline has passed; nobody is left to tell.
        let _ = done.send(rendered);
    });
    result
        .recv_timeout(RENDER_DEADLINE)
        .unwrap_or_else(|_| Err(format!("rendering did not finish in {RENDER_DEADLINE:?}")))
}

/// How long rendering a template may take.
const RENDER_DEADLINE: Duration = Duration::from_secs(10);

/// Every `{{` has a `}}` after it: `gtmpl` never returns on an action left open at the end.
fn check_actions_closed(text: &str) -> Result<(), String> {
    let mut rest = text;
    while let Some(open) = rest.find("{{") {
        let after = &rest[open + 2..];
        let Some(close) = after.find("}}") else {
            let offset = text.len() - rest.len() + open;
            let line = text[..offset].matches('\n').count() + 1;
            return Err(format!(
                "line {line}: an action opened with {{{{ is never closed with }}}}"
            ));
        };
        rest = &after[close + 2..];
    }
    Ok(())
}

/// Reads and renders the template at `path`; a `.json` result must be JSON.
pub(super) fn render_file(path: &Path, cfg: &AgentConfig, opts: &BootstrapOptions) -> Result<String, BootstrapError> {
    let text = std::fs::read_to_string(path).map_err(|source| BootstrapError::ReadTemplate {
        path: path.to_path_buf(),
        source,
    })?;
    let err = |reason: String| BootstrapError::Template {
        path: path.to_path_buf(),
        reason,
    };
    let out = render(&text, &template_params(cfg, opts)).map_err(err)?;
    if !is_yaml(path) {
        serde_json::from_str::<Value>(&out).map_err(|e| err(format!("the rendered bootstrap is not JSON: {e}")))?;
    }
    Ok(out)
}

fn is_yaml(template: &Path) -> bool {
    let name = template.to_string_lossy();
    name.ends_with(".yaml") || name.ends_with(".yaml.tmpl")
}

/// `envoy-rev.json`, or `envoy-rev.yaml` for a YAML template (Envoy reads the format by extension).
pub(super) fn output_path(config_path: &Path, template: &Path) -> PathBuf {
    config_path.join(if is_yaml(template) {
        "envoy-rev.yaml"
    } else {
        crate::config::BOOTSTRAP_FILE
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_template_constructs_render() {
        let params = json!({
            "nodeID": "sidecar~1.2.3.4~a.b~b.svc.cluster.local",
            "config": {"ProxyAdminPort": 15000},
            "inclusionPrefix": ["a", "b"],
            "flag": false,
            "meta": {"A": 1},
        });
        let text = r#"{"id": "{{ .nodeID }}", "port": {{ .config.ProxyAdminPort }},
            "p": [{{- range $i, $p := .inclusionPrefix }}{{ if $i }},{{ end }}"{{ $p }}"{{- end }}],
            {{- if .flag }} "flag": true, {{- end }}
            {{- if .missing }} "missing": true, {{- end }}
            "meta": {{ toJSON .meta }}, "js": "{{ js "a\"b" }}"}"#;
        let out: Value = serde_json::from_str(&render(text, &params).unwrap()).unwrap();
        assert_eq!(
            out,
            json!({"id": "sidecar~1.2.3.4~a.b~b.svc.cluster.local", "port": 15000, "p": ["a", "b"],
                   "meta": {"A": 1}, "js": "a\"b"})
        );
    }

    #[test]
    fn template_errors_are_reported() {
        let err = render("{\n{{ .a }}\n{{ .a ", &json!({})).unwrap_err();
        assert!(err.contains("line 3") && err.contains("never closed"), "{err}");
        assert!(render("{{ .a }", &json!({})).is_err());
        let err = render("{{ sprigOnly .a }}", &json!({"a": 1})).unwrap_err();
        assert!(err.contains("sprigOnly"), "{err}");
    }

    #[test]
    fn go_field_names_keep_map_keys() {
        let v = go_field_names(json!({"proxyAdminPort": 1, "tracing": {"zipkin": {"address": "z:1"}},
                                      "proxyMetadata": {"ISTIO_META_X": "y"}}));
        assert_eq!(
            v,
            json!({"ProxyAdminPort": 1, "Tracing": {"Zipkin": {"Address": "z:1"}}, "ProxyMetadata": {"ISTIO_META_X": "y"}})
        );
    }

    #[test]
    fn js_escapes_like_go() {
        let out = js(&[Tmpl::from(r"vhost\..*<=>&'")]).unwrap().to_string();
        assert_eq!(out, r"vhost\\..*\u003C\u003D\u003E\u0026\'");
    }

    #[test]
    fn yaml_templates_write_yaml() {
        let dir = Path::new("/etc/istio/proxy");
        assert_eq!(output_path(dir, Path::new("t.yaml.tmpl")), dir.join("envoy-rev.yaml"));
        assert_eq!(output_path(dir, Path::new("t.json")), dir.join("envoy-rev.json"));
    }
}
