//! App probe rewrite (Istio's `pkg/kube/inject/app_probe.go`): the HTTP, TCP and gRPC
//! readiness/liveness/startup probes and the HTTP/TCP lifecycle hooks of the app containers are
//! pointed at the agent's status port (`/app-health/<container>/readyz`, ...), and the originals
//! go to the agent in the sidecar's `ISTIO_KUBE_APP_PROBERS` env var.

use serde_json::{Map, Value as Json, json};

use crate::PROXY_CONTAINER;
use crate::json_order::to_ordered_json;

pub(crate) const KUBE_APP_PROBERS: &str = "ISTIO_KUBE_APP_PROBERS";

/// The agent's URLs for a container: readyz, livez, startupz, prestopz, poststartz.
fn prober_urls(container: &str) -> [String; 5] {
    [
        format!("/app-health/{container}/readyz"),
        format!("/app-health/{container}/livez"),
        format!("/app-health/{container}/startupz"),
        format!("/app-lifecycle/{container}/prestopz"),
        format!("/app-lifecycle/{container}/poststartz"),
    ]
}

/// Istio's `DumpAppProbers`: the JSON of the app containers' probes (named ports resolved), or
/// `None` when there is none to hand over.
pub(crate) fn dump_app_probers(spec: &Json, status_port: i64) -> Option<String> {
    let mut out = Map::new();
    let containers = list(spec, "initContainers").into_iter().chain(list(spec, "containers"));
    for c in containers {
        let name = c.get("name").and_then(Json::as_str).unwrap_or_default();
        if name == PROXY_CONTAINER {
            continue;
        }
        let ports: Map<String, Json> = list(c, "ports")
            .iter()
            .filter_map(|p| {
                Some((
                    p.get("name")?.as_str().filter(|n| !n.is_empty())?.to_string(),
                    p.get("containerPort")?.clone(),
                ))
            })
            .collect();
        let [readyz, livez, startupz, prestopz, poststartz] = prober_urls(name);
        let probes = [
            (readyz, c.get("readinessProbe"), true),
            (livez, c.get("livenessProbe"), true),
            (startupz, c.get("startupProbe"), true),
            (prestopz, c.pointer("/lifecycle/preStop"), false),
            (poststartz, c.pointer("/lifecycle/postStart"), false),
        ];
        for (url, probe, is_probe) in probes {
            if let Some(p) = probe
                .and_then(|p| internal_prober(p, is_probe))
                .and_then(|p| resolve_named_port(p, &ports, status_port))
            {
                out.insert(url, p);
            }
        }
    }
    (!out.is_empty()).then(|| to_ordered_json(&Json::Object(out), prober_field_order))
}

/// Go's field order of `Prober`, `HTTPGetAction`, `TCPSocketAction`, `GRPCAction`.
fn prober_field_order(key: &str) -> Option<usize> {
    const ORDER: &[&str] = &[
        "httpGet",
        "tcpSocket",
        "grpc",
        "timeoutSeconds",
        "path",
        "port",
        "host",
        "scheme",
        "httpHeaders",
        "service",
        "name",
        "value",
    ];
    ORDER.iter().position(|k| *k == key)
}

fn list<'a>(v: &'a Json, key: &str) -> Vec<&'a Json> {
    v.get(key)
        .and_then(Json::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

/// Istio's `Prober`: the probe's action and (for probes) its timeout.
fn internal_prober(p: &Json, is_probe: bool) -> Option<Json> {
    let mut out = Map::new();
    let kinds: &[&str] = if is_probe {
        &["httpGet", "tcpSocket", "grpc"]
    } else {
        &["httpGet", "tcpSocket"]
    };
    let kind = kinds.iter().find(|k| p.get(**k).is_some_and(|v| !v.is_null()))?;
    out.insert((*kind).to_string(), p[*kind].clone());
    if is_probe && let Some(t) = p.get("timeoutSeconds").filter(|t| t.as_i64() != Some(0)) {
        out.insert("timeoutSeconds".into(), t.clone());
    }
    Some(Json::Object(out))
}

fn resolve_named_port(mut p: Json, ports: &Map<String, Json>, status_port: i64) -> Option<Json> {
    if p.get("grpc").is_some() {
        return Some(p);
    }
    let action = if p.get("httpGet").is_some() {
        "httpGet"
    } else {
        "tcpSocket"
    };
    let slot = p.get_mut(action)?.get_mut("port")?;
    match slot {
        Json::String(name) => {
            let n = ports.get(name.as_str())?.clone();
            *slot = n;
        }
        Json::Number(n) if n.as_i64() == Some(status_port) => return None,
        _ => {}
    }
    Some(p)
}

/// Istio's `patchRewriteProbe`: the app containers' probes and hooks now ask the agent.
pub(crate) fn rewrite_probes(spec: &mut Json, status_port: i64) {
    for key in ["containers", "initContainers"] {
        let Some(Json::Array(cs)) = spec.get_mut(key) else {
            continue;
        };
        for c in cs.iter_mut() {
            let name = c.get("name").and_then(Json::as_str).unwrap_or_default().to_string();
            if name == PROXY_CONTAINER {
                continue;
            }
            let [readyz, livez, startupz, prestopz, poststartz] = prober_urls(&name);
            for (field, url) in [
                ("readinessProbe", readyz),
                ("livenessProbe", livez),
                ("startupProbe", startupz),
            ] {
                if let Some(p) = c.get_mut(field) {
                    convert(p, &url, status_port, &["httpGet", "tcpSocket", "grpc"]);
                }
            }
            if let Some(lc) = c.get_mut("lifecycle") {
                for (field, url) in [("preStop", prestopz), ("postStart", poststartz)] {
                    if let Some(h) = lc.get_mut(field) {
                        convert(h, &url, status_port, &["httpGet", "tcpSocket"]);
                    }
                }
            }
        }
    }
}

fn convert(p: &mut Json, url: &str, status_port: i64, kinds: &[&str]) {
    let Some(obj) = p.as_object_mut() else { return };
    let Some(kind) = kinds.iter().find(|k| obj.get(**k).is_some_and(|v| !v.is_null())) else {
        return;
    };
    if *kind == "httpGet" {
        if let Some(Json::Object(h)) = obj.get_mut("httpGet") {
            h.insert("port".into(), json!(status_port));
            h.insert("path".into(), json!(url));
            if h.get("scheme").and_then(Json::as_str) == Some("HTTPS") {
                h.insert("scheme".into(), json!("HTTP"));
            }
        }
        return;
    }
    // TCP and gRPC become HTTP to the agent, which checks them.
    obj.remove(*kind);
    obj.insert("httpGet".into(), json!({"path": url, "port": status_port}));
}

/// Istio's `mergeOrAppendProbers`: on re-injection the old probers stay (they win).
pub(crate) fn merge_or_append_probers(previously_injected: bool, env: &mut Vec<Json>, probers: String) {
    if previously_injected
        && let Some(e) = env
            .iter_mut()
            .find(|e| e.get("name").and_then(Json::as_str) == Some(KUBE_APP_PROBERS))
    {
        let old: Option<Map<String, Json>> = e
            .get("value")
            .and_then(Json::as_str)
            .and_then(|v| serde_json::from_str(v).ok());
        let new: Option<Map<String, Json>> = serde_json::from_str(&probers).ok();
        if let (Some(old), Some(mut new)) = (old, new) {
            new.extend(old);
            *e = json!({"name": KUBE_APP_PROBERS, "value": to_ordered_json(&Json::Object(new), prober_field_order)});
        }
        return;
    }
    env.push(json!({"name": KUBE_APP_PROBERS, "value": probers}));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_point_at_the_agent_and_are_dumped() {
        let mut spec = json!({"containers": [
            {"name": "app", "ports": [{"name": "http", "containerPort": 8080}],
             "readinessProbe": {"httpGet": {"port": "http", "path": "/ready", "scheme": "HTTPS"}, "timeoutSeconds": 2},
             "livenessProbe": {"tcpSocket": {"port": 9000}},
             "startupProbe": {"grpc": {"port": 7000}}},
            {"name": "istio-proxy", "readinessProbe": {"httpGet": {"port": 15021}}}
        ]});
        let dump = dump_app_probers(&spec, 15020).unwrap_or_default();
        let dump: Json = serde_json::from_str(&dump).unwrap_or_default();
        assert_eq!(
            dump["/app-health/app/readyz"],
            json!({"httpGet": {"port": 8080, "path": "/ready", "scheme": "HTTPS"}, "timeoutSeconds": 2})
        );
        assert_eq!(dump["/app-health/app/livez"], json!({"tcpSocket": {"port": 9000}}));
        assert_eq!(dump["/app-health/app/startupz"], json!({"grpc": {"port": 7000}}));
        rewrite_probes(&mut spec, 15020);
        assert_eq!(
            spec["containers"][0]["readinessProbe"]["httpGet"],
            json!({"port": 15020, "path": "/app-health/app/readyz", "scheme": "HTTP"})
        );
        assert_eq!(
            spec["containers"][0]["livenessProbe"],
            json!({"httpGet": {"path": "/app-health/app/livez", "port": 15020}})
        );
        assert_eq!(spec["containers"][1]["readinessProbe"]["httpGet"]["port"], 15021);
        // already rewritten: nothing to hand over
        assert_eq!(dump_app_probers(&spec, 15020), None);
    }

    #[test]
    fn probers_merge_on_reinjection() {
        let mut env = vec![json!({"name": KUBE_APP_PROBERS, "value": r#"{"/a":{"tcpSocket":{"port":1}}}"#})];
        merge_or_append_probers(true, &mut env, r#"{"/b":{"tcpSocket":{"port":2}}}"#.into());
        let v: Json = serde_json::from_str(env[0]["value"].as_str().unwrap_or_default()).unwrap_or_default();
        assert_eq!(
            v,
            json!({"/a": {"tcpSocket": {"port": 1}}, "/b": {"tcpSocket": {"port": 2}}})
        );
        merge_or_append_probers(false, &mut env, "{}".into());
        assert_eq!(env.len(), 2);
    }
}
