//! What Istio does to the merged Pod after the templates (`postProcessPod` in
//! `pkg/kube/inject/webhook.go`): cluster env vars from the webhook path, Prometheus metrics
//! merge, probe rewrite, the `sidecar.istio.io/status` annotation and `injectedAnnotations`,
//! container order; and the user-ID adjustments (`adjustInitContainerUser`, OpenShift's
//! `isSidecarUserMatchingAppUser`).

use std::collections::BTreeMap;

use serde_json::{Value as Json, json};

use crate::config::InjectorConfig;
use crate::inject::{STATUS_ANNOTATION, ensure_object, string_map};
use crate::mesh::{MeshConfig, merge_proxy_config};
use crate::probe::{dump_app_probers, merge_or_append_probers, rewrite_probes};
use crate::validate::parse_go_bool;
use crate::{Failure, PROXY_CONTAINER};

const VALIDATION_CONTAINER: &str = "istio-validation";
const INIT_CONTAINER: &str = "istio-init";
const CORE_DUMP_CONTAINER: &str = "enable-core-dump";

pub(crate) struct PostProcess<'a> {
    pub(crate) cfg: &'a InjectorConfig,
    pub(crate) mesh: &'a MeshConfig,
    /// The Pod as it came (Istio's `req.pod`).
    pub(crate) original: &'a Json,
    pub(crate) revision: &'a str,
    pub(crate) envs: &'a BTreeMap<String, String>,
    pub(crate) status_port: i64,
}

pub(crate) fn post_process(pod: &mut Json, template_pod: &Json, pp: &PostProcess<'_>) -> Result<(), Failure> {
    ensure_object(ensure_object_at(pod, "metadata"), "annotations");
    ensure_object(ensure_object_at(pod, "metadata"), "labels");
    if !pp.envs.is_empty()
        && let Some(sidecar) = find_sidecar_mut(pod)
    {
        let env = env_list(sidecar);
        env.retain(|e| {
            !e.get("name")
                .and_then(Json::as_str)
                .is_some_and(|n| pp.envs.contains_key(n))
        });
        env.extend(pp.envs.iter().map(|(k, v)| json!({"name": k, "value": v})));
    }
    apply_prometheus_merge(pod, pp.mesh, pp.status_port)?;
    apply_secure_prometheus_annotation(pod);
    apply_rewrite(pod, pp);
    let status = injection_status(template_pod, pp.revision);
    if let Some(n) = pp.envs.get("ISTIO_META_NETWORK") {
        ensure_object(ensure_object_at(pod, "metadata"), "labels").insert("topology.istio.io/network".into(), json!(n));
    }
    let anns = ensure_object(ensure_object_at(pod, "metadata"), "annotations");
    anns.insert(STATUS_ANNOTATION.into(), json!(status));
    for (k, v) in &pp.cfg.injected_annotations {
        anns.insert(k.clone(), json!(v));
    }
    reorder(pod, pp)
}

fn ensure_object_at<'a>(v: &'a mut Json, key: &str) -> &'a mut Json {
    ensure_object(v, key);
    &mut v[key]
}

fn name_of(c: &Json) -> &str {
    c.get("name").and_then(Json::as_str).unwrap_or_default()
}

/// Istio's `FindSidecar`: `istio-proxy` in the containers, else in the init containers.
fn find_sidecar_mut(pod: &mut Json) -> Option<&mut Json> {
    let spec = pod.get_mut("spec")?;
    let in_containers = spec
        .get("containers")
        .and_then(Json::as_array)
        .is_some_and(|l| l.iter().any(|c| name_of(c) == PROXY_CONTAINER));
    let key = if in_containers { "containers" } else { "initContainers" };
    spec.get_mut(key)?
        .as_array_mut()?
        .iter_mut()
        .find(|c| name_of(c) == PROXY_CONTAINER)
}

fn find_sidecar(pod: &Json) -> Option<&Json> {
    ["containers", "initContainers"].iter().find_map(|k| {
        pod.pointer(&format!("/spec/{k}"))
            .and_then(Json::as_array)?
            .iter()
            .find(|c| name_of(c) == PROXY_CONTAINER)
    })
}

fn env_list(c: &mut Json) -> &mut Vec<Json> {
    if !c["env"].is_array() {
        c["env"] = json!([]);
    }
    match c.get_mut("env") {
        Some(Json::Array(a)) => a,
        _ => unreachable!("made a list above"),
    }
}

/// Prometheus' `SanitizeLabelName`: what is not `[a-zA-Z0-9_]` becomes `_`.
fn sanitize(k: &str) -> String {
    k.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect()
}

fn annotations(pod: &Json) -> BTreeMap<String, String> {
    string_map(pod.pointer("/metadata/annotations"))
}

pub(crate) fn prometheus_port(pod: &Json) -> Option<String> {
    annotations(pod)
        .into_iter()
        .find(|(k, _)| sanitize(k) == "prometheus_io_port")
        .map(|(_, v)| v)
}

pub(crate) fn clear_prometheus_annotations(pod: &mut Json) {
    if let Some(Json::Object(a)) = pod.pointer_mut("/metadata/annotations") {
        a.retain(|k, _| {
            !matches!(
                sanitize(k).as_str(),
                "prometheus_io_path"
                    | "prometheus_io_port"
                    | "prometheus_io_scrape"
                    | "prometheus_istio_io_scrape_targets"
            )
        });
    }
}

const RESERVED_PORTS: &[(&str, &str)] = &[
    ("15000", "Envoy admin"),
    ("15001", "outbound traffic capture"),
    ("15004", "pilot debug"),
    ("15006", "inbound traffic capture"),
    ("15008", "HBONE tunnel"),
    ("15020", "pilot-agent status / merged Prometheus"),
    ("15021", "Envoy health"),
    ("15053", "DNS proxy"),
    ("15090", "Envoy Prometheus (already merged)"),
];

fn check_port(port: &str, target: &str, what: &str) -> Result<(), Failure> {
    let n: u32 = port
        .parse()
        .ok()
        .filter(|n| (1..=65535).contains(n))
        .ok_or_else(|| Failure::Prometheus(format!("invalid {what} {port:?}")))?;
    let canon = n.to_string();
    if canon == target {
        return Err(Failure::Prometheus(format!("{what} {port} conflicts with agent port")));
    }
    if let Some((_, reason)) = RESERVED_PORTS.iter().find(|(p, _)| *p == canon) {
        return Err(Failure::Prometheus(format!(
            "{what} {port} is reserved for Istio ({reason}) and cannot be scraped"
        )));
    }
    Ok(())
}

/// Istio's `applyPrometheusMerge`: the app's `prometheus.io/*` annotations move to the agent's
/// `ISTIO_PROMETHEUS_ANNOTATIONS` and the Pod's point at the agent's merged endpoint.
fn apply_prometheus_merge(pod: &mut Json, mesh: &MeshConfig, status_port: i64) -> Result<(), Failure> {
    let anns = annotations(pod);
    let scrape_on = anns
        .iter()
        .filter(|(k, _)| sanitize(k) == "prometheus_io_scrape")
        .find_map(|(_, v)| parse_go_bool(v))
        .unwrap_or(true);
    let merge_on = anns
        .get("prometheus.istio.io/merge-metrics")
        .and_then(|v| parse_go_bool(v))
        .unwrap_or_else(|| mesh.prometheus_merge());
    if !scrape_on || !merge_on {
        return Ok(());
    }
    let target = status_port.to_string();
    if prometheus_port(pod).as_deref() == Some(target.as_str()) {
        return Ok(());
    }
    let (mut port, mut path, mut scrape_v) = (String::new(), String::new(), String::new());
    let mut targets: Vec<(String, String)> = Vec::new();
    for (k, v) in &anns {
        match sanitize(k).as_str() {
            "prometheus_io_port" => port = v.clone(),
            "prometheus_io_scrape" => scrape_v = v.clone(),
            "prometheus_io_path" => path = v.clone(),
            "prometheus_istio_io_scrape_targets" => {
                if let Some(t) = parse_scrape_targets(v) {
                    targets = t;
                }
            }
            _ => {}
        }
    }
    if let Some((p, pa)) = targets.first() {
        port = p.clone();
        path = pa.clone();
        for (p, _) in &targets {
            check_port(p, &target, "target port").map_err(|e| Failure::Prometheus(format!("scrape targets: {e}")))?;
        }
    } else if !port.is_empty() {
        check_port(&port, &target, "port")?;
    }
    let empty = scrape_v.is_empty() && path.is_empty() && port.is_empty() && targets.is_empty();
    if !empty && let Some(sidecar) = find_sidecar_mut(pod) {
        // PrometheusScrapeConfiguration's JSON, in its fields' order (ScrapeTarget: port, path)
        let q = |s: &str| Json::String(s.to_string()).to_string();
        let mut text = format!(r#"{{"scrape":{},"path":{},"port":{}"#, q(&scrape_v), q(&path), q(&port));
        if !targets.is_empty() {
            let t: Vec<String> = targets
                .iter()
                .map(|(p, pa)| format!(r#"{{"port":{},"path":{}}}"#, q(p), q(pa)))
                .collect();
            text.push_str(&format!(r#","targets":[{}]"#, t.join(",")));
        }
        text.push('}');
        env_list(sidecar).push(json!({"name": "ISTIO_PROMETHEUS_ANNOTATIONS", "value": text}));
    }
    clear_prometheus_annotations(pod);
    let a = ensure_object(ensure_object_at(pod, "metadata"), "annotations");
    a.insert("prometheus.io/port".into(), json!(target));
    a.insert("prometheus.io/path".into(), json!("/stats/prometheus"));
    a.insert("prometheus.io/scrape".into(), json!("true"));
    Ok(())
}

/// The agent's `ParseScrapeTargets`: `port:path,...`, `/metrics` by default; `None` if a port
/// is empty.
fn parse_scrape_targets(raw: &str) -> Option<Vec<(String, String)>> {
    let mut out = Vec::new();
    for entry in raw.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (port, path) = entry.split_once(':').unwrap_or((entry, ""));
        if port.trim().is_empty() {
            return None;
        }
        let path = if path.trim().is_empty() {
            "/metrics"
        } else {
            path.trim()
        };
        out.push((port.trim().to_string(), path.to_string()));
    }
    Some(out)
}

/// Istio's `applySecurePrometheusAnnotation`.
fn apply_secure_prometheus_annotation(pod: &mut Json) {
    if annotations(pod)
        .keys()
        .any(|k| sanitize(k) == "prometheus_istio_io_secure_port")
    {
        return;
    }
    let port = find_sidecar(pod).and_then(|s| {
        s.get("env")?.as_array()?.iter().find_map(|e| {
            let v = e.get("value")?.as_str()?;
            (e.get("name")?.as_str()? == "ENVOY_SECURE_MERGED_METRICS_PORT" && !v.is_empty() && v != "0")
                .then(|| v.to_string())
        })
    });
    if let Some(p) = port {
        ensure_object(ensure_object_at(pod, "metadata"), "annotations")
            .insert("prometheus.istio.io/secure-port".into(), json!(p));
    }
}

/// Istio's `applyRewrite`: probes to the agent when `rewriteAppHTTPProbe` (or the
/// `sidecar.istio.io/rewriteAppHTTPProbers` annotation) says so.
fn apply_rewrite(pod: &mut Json, pp: &PostProcess<'_>) {
    if find_sidecar(pod).is_none() {
        return;
    }
    let anns = annotations(pod);
    let rewrite = anns
        .get("sidecar.istio.io/rewriteAppHTTPProbers")
        .and_then(|v| parse_go_bool(v))
        .unwrap_or_else(|| pp.cfg.value_bool("/sidecarInjectorWebhook/rewriteAppHTTPProbe"));
    if !rewrite {
        return;
    }
    let mesh_port = pp.mesh.status_port();
    if let Some(probers) = pod.get("spec").and_then(|s| dump_app_probers(s, mesh_port)) {
        let previously = anns.contains_key(STATUS_ANNOTATION);
        if let Some(sidecar) = find_sidecar_mut(pod) {
            merge_or_append_probers(previously, env_list(sidecar), probers);
        }
    }
    // Go's Atoi failure leaves 0.
    let port = anns
        .get("status.sidecar.istio.io/port")
        .map(|v| v.parse::<i64>().unwrap_or(0))
        .unwrap_or(mesh_port);
    if let Some(spec) = pod.get_mut("spec") {
        rewrite_probes(spec, port);
    }
}

/// Istio's `getInjectionStatus` of the rendered templates.
fn injection_status(template_pod: &Json, revision: &str) -> String {
    let names = |key: &str| -> Json {
        match template_pod.pointer(&format!("/spec/{key}")).and_then(Json::as_array) {
            Some(l) if !l.is_empty() => Json::Array(l.iter().map(|c| json!(name_of(c))).collect()),
            _ => Json::Null,
        }
    };
    let revision = if revision.is_empty() { "default" } else { revision };
    format!(
        r#"{{"initContainers":{},"containers":{},"volumes":{},"imagePullSecrets":{},"revision":{}}}"#,
        names("initContainers"),
        names("containers"),
        names("volumes"),
        names("imagePullSecrets"),
        json!(revision)
    )
}

enum Move {
    First,
    Last,
}

fn modify(list: &mut Vec<Json>, name: &str, m: Move) {
    let Some(i) = list.iter().position(|c| name_of(c) == name) else {
        return;
    };
    let c = list.remove(i);
    match m {
        Move::First => list.insert(0, c),
        Move::Last => list.push(c),
    }
}

/// Istio's `reorderPod`: the proxy last (first when the app waits for it), and the init
/// containers `istio-init`/`istio-validation` around the others.
fn reorder(pod: &mut Json, pp: &PostProcess<'_>) -> Result<(), Failure> {
    let mut pc = pp.mesh.default_config();
    if let Some(a) = pp
        .original
        .pointer("/metadata/annotations/proxy.istio.io~1config")
        .and_then(Json::as_str)
    {
        pc = merge_proxy_config(&pc, a).map_err(Failure::ProxyConfig)?;
    }
    let hold = pc
        .get("holdApplicationUntilProxyStarts")
        .and_then(Json::as_bool)
        .unwrap_or(false)
        || pp.cfg.value_bool("/global/proxy/holdApplicationUntilProxyStarts");
    let spec = ensure_object(pod, "spec");
    if let Some(Json::Array(cs)) = spec.get_mut("containers") {
        modify(cs, PROXY_CONTAINER, if hold { Move::First } else { Move::Last });
    }
    let Some(Json::Array(ics)) = spec.get_mut("initContainers") else {
        return Ok(());
    };
    if ics.iter().any(|c| name_of(c) == PROXY_CONTAINER) {
        for name in [
            CORE_DUMP_CONTAINER,
            PROXY_CONTAINER,
            VALIDATION_CONTAINER,
            INIT_CONTAINER,
        ] {
            modify(ics, name, Move::First);
        }
    } else {
        modify(ics, VALIDATION_CONTAINER, Move::First);
        modify(ics, INIT_CONTAINER, Move::Last);
        modify(ics, CORE_DUMP_CONTAINER, Move::Last);
    }
    Ok(())
}

fn run_as(c: &Json, field: &str) -> Option<i64> {
    c.pointer(&format!("/securityContext/{field}")).and_then(Json::as_i64)
}

/// Istio's `adjustInitContainerUser`: a user's `istio-proxy` with its own `runAsUser`/`runAsGroup`
/// carries them to `istio-validation` and to the init container's `-u`; in TPROXY mode the
/// proxy runs as 0.
pub(crate) fn adjust_init_container_user(pod: &mut Json, original: &Json, proxy_config: &Json) {
    let Some(user) = find_sidecar(original) else { return };
    let (uid, gid) = (run_as(user, "runAsUser"), run_as(user, "runAsGroup"));
    if uid.is_none() && gid.is_none() {
        return;
    }
    let tproxy = proxy_config.get("interceptionMode").and_then(Json::as_str) == Some("TPROXY")
        || pod
            .pointer("/metadata/annotations/sidecar.istio.io~1interceptionMode")
            .and_then(Json::as_str)
            == Some("TPROXY");
    if tproxy
        && uid.is_some()
        && let Some(sidecar) = find_sidecar_mut(pod)
        && let Some(sc) = sidecar.get_mut("securityContext").and_then(Json::as_object_mut)
    {
        sc.insert("runAsUser".into(), json!(0));
    }
    let Some(Json::Array(ics)) = pod.pointer_mut("/spec/initContainers") else {
        return;
    };
    let Some(init) = [INIT_CONTAINER, VALIDATION_CONTAINER]
        .iter()
        .find_map(|n| ics.iter().position(|c| name_of(c) == *n))
    else {
        return;
    };
    let init = &mut ics[init];
    if !tproxy && name_of(init) == VALIDATION_CONTAINER {
        let sc = ensure_object(init, "securityContext");
        if let Some(u) = uid {
            sc.insert("runAsUser".into(), json!(u));
        }
        if let Some(g) = gid {
            sc.insert("runAsGroup".into(), json!(g));
        }
    }
    let Some(u) = uid.filter(|u| *u != 0) else { return };
    if let Some(Json::Array(args)) = init.get_mut("args")
        && let Some(i) = args.iter().position(|a| a.as_str() == Some("-u"))
        && i + 1 < args.len()
    {
        args[i + 1] = json!(u.to_string());
    }
}

/// OpenShift gives every container of the Pod the same `runAsUser`; a sidecar whose user is
/// the app's would capture its own traffic, so its `runAsUser`/`runAsGroup` are dropped (Istio's
/// `isSidecarUserMatchingAppUser`).
pub(crate) fn reset_openshift_proxy_user(pod: &mut Json) {
    let all: Vec<&Json> = ["containers", "initContainers"]
        .iter()
        .filter_map(|k| pod.pointer(&format!("/spec/{k}")).and_then(Json::as_array))
        .flatten()
        .collect();
    let mut sidecar_user = 0;
    let mut app_user = 0;
    for c in &all {
        match name_of(c) {
            PROXY_CONTAINER => sidecar_user = run_as(c, "runAsUser").unwrap_or(sidecar_user),
            VALIDATION_CONTAINER | INIT_CONTAINER => {}
            _ => app_user = run_as(c, "runAsUser").unwrap_or(app_user),
        }
    }
    if sidecar_user != app_user {
        return;
    }
    if let Some(sc) = find_sidecar_mut(pod)
        .and_then(|s| s.get_mut("securityContext"))
        .and_then(Json::as_object_mut)
    {
        sc.remove("runAsUser");
        sc.remove("runAsGroup");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lists_what_the_templates_add() {
        let t = json!({"spec": {"initContainers": [{"name": "istio-init"}], "volumes": [{"name": "v"}]}});
        assert_eq!(
            injection_status(&t, ""),
            r#"{"initContainers":["istio-init"],"containers":null,"volumes":["v"],"imagePullSecrets":null,"revision":"default"}"#
        );
    }

    #[test]
    fn prometheus_annotations_move_to_the_agent() {
        let mut pod = json!({"metadata": {"annotations": {"prometheus.io/port": "8080", "prometheus.io/path": "/m"}},
            "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy"}]}});
        apply_prometheus_merge(&mut pod, &MeshConfig::default(), 15020).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            pod["metadata"]["annotations"],
            json!({"prometheus.io/port": "15020", "prometheus.io/path": "/stats/prometheus", "prometheus.io/scrape": "true"})
        );
        assert_eq!(
            pod["spec"]["containers"][1]["env"][0]["value"],
            r#"{"scrape":"","path":"/m","port":"8080"}"#
        );
        let mut bad = json!({"metadata": {"annotations": {"prometheus.io/port": "15000"}}, "spec": {}});
        assert!(apply_prometheus_merge(&mut bad, &MeshConfig::default(), 15020).is_err());
    }

    #[test]
    fn reorder_puts_proxy_last_and_init_containers_around() {
        let cfg = InjectorConfig::parse("policy: enabled", "{}").unwrap_or_else(|e| panic!("{e}"));
        let mesh = MeshConfig::default();
        let envs = BTreeMap::new();
        let orig = json!({});
        let pp = PostProcess {
            cfg: &cfg,
            mesh: &mesh,
            original: &orig,
            revision: "",
            envs: &envs,
            status_port: 15020,
        };
        let mut pod = json!({"spec": {"containers": [{"name": "istio-proxy"}, {"name": "app"}],
            "initContainers": [{"name": "istio-init"}, {"name": "user"}, {"name": "istio-validation"}]}});
        reorder(&mut pod, &pp).unwrap_or_else(|e| panic!("{e}"));
        let names = |k: &str| {
            pod["spec"][k]
                .as_array()
                .map(|a| a.iter().map(|c| name_of(c).to_string()).collect::<Vec<_>>())
                .unwrap_or_default()
        };
        assert_eq!(names("containers"), vec!["app", "istio-proxy"]);
        assert_eq!(names("initContainers"), vec!["istio-validation", "user", "istio-init"]);
    }
}
