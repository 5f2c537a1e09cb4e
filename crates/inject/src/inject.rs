//! The webhook's injection of one Pod (Istio's `Webhook.inject`, `injectPod`, `RunTemplate`,
//! `stripPod`, `reinsertOverrides`, `reapplyOverwrittenContainers`, `createPatch`).

use std::collections::BTreeMap;

use serde_json::{Map, Value as Json, json};

use crate::config::InjectorConfig;
use crate::data::{TemplateInput, template_data};
use crate::decision::{inject_required, webhook_selects};
use crate::mesh::merge_proxy_config;
use crate::meta::{cluster_and_network, deploy_meta, parse_inject_envs, proxy_ids, proxy_image};
use crate::postprocess::{PostProcess, clear_prometheus_annotations, post_process, prometheus_port};
use crate::smp::strategic_merge;
use crate::template::FuncCtx;
use crate::validate::validate_annotations;
use crate::yaml::from_yaml;
use crate::{Failure, InjectError, InjectParams, Outcome, PROXY_CONTAINER};

pub(crate) const STATUS_ANNOTATION: &str = "sidecar.istio.io/status";
const OVERRIDES_ANNOTATION: &str = "proxy.istio.io/overrides";
const PROXY_CONFIG_ANNOTATION: &str = "proxy.istio.io/config";

pub(crate) fn string_map(v: Option<&Json>) -> BTreeMap<String, String> {
    v.and_then(Json::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| {
                    (
                        k.clone(),
                        v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string()),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `namespace/name`, or the generated name to come (Istio's `potentialPodName`).
fn pod_name(pod: &Json) -> String {
    let s = |p: &str| pod.pointer(p).and_then(Json::as_str).unwrap_or_default();
    let name = match (s("/metadata/name"), s("/metadata/generateName")) {
        ("", "") => String::new(),
        ("", g) => format!("{g}***** (actual name not yet known)"),
        (n, _) => n.to_string(),
    };
    format!("{}/{name}", s("/metadata/namespace"))
}

pub(crate) fn inject(cfg: &InjectorConfig, p: &InjectParams<'_>) -> Result<Outcome, InjectError> {
    let fail = |pod: &Json, reason: Failure| InjectError {
        pod: pod_name(pod),
        reason,
    };
    if !p.pod.is_object() {
        return Err(fail(p.pod, Failure::NotAPod(format!("got {}", type_name(p.pod)))));
    }
    for key in ["spec", "metadata"] {
        if let Some(v) = p.pod.get(key).filter(|v| !v.is_object()) {
            return Err(fail(
                p.pod,
                Failure::NotAPod(format!("{key} is {}, not a map", type_name(v))),
            ));
        }
    }
    let mut pod = p.pod.clone();
    let meta = ensure_object(&mut pod, "metadata");
    // Istio drops managedFields (large, never read) and gives them back untouched.
    let managed_fields = meta.remove("managedFields");
    let ns_given = meta
        .get("namespace")
        .and_then(Json::as_str)
        .is_some_and(|n| !n.is_empty());
    if !ns_given {
        meta.insert("namespace".into(), json!(p.namespace));
    }
    let labels = string_map(pod.pointer("/metadata/labels"));
    let annotations = string_map(pod.pointer("/metadata/annotations"));
    if let Some(ns_labels) = p.namespace_labels
        && !webhook_selects(p.revision, ns_labels, &labels)
    {
        return Ok(Outcome::Skipped(crate::SkipReason::NotSelected));
    }
    let namespace = pod
        .pointer("/metadata/namespace")
        .and_then(Json::as_str)
        .unwrap_or_default()
        .to_string();
    let host_network = pod
        .pointer("/spec/hostNetwork")
        .and_then(Json::as_bool)
        .unwrap_or(false);
    if let Err(skip) = inject_required(cfg, &namespace, host_network, &labels, &annotations) {
        return Ok(Outcome::Skipped(skip));
    }
    if p.openshift_namespace_annotations.is_some() {
        crate::postprocess::reset_openshift_proxy_user(&mut pod);
    }
    let injected = inject_pod(cfg, p, &pod, &annotations).map_err(|r| fail(&pod, r))?;
    let mut injected = injected;
    if let Some(m) = injected.get_mut("metadata").and_then(Json::as_object_mut) {
        if !ns_given {
            m.remove("namespace");
        }
        if let Some(mf) = managed_fields {
            m.insert("managedFields".into(), mf);
        }
    }
    let patch = json_patch::diff(p.pod, &injected);
    let mut check = p.pod.clone();
    json_patch::patch(&mut check, &patch).map_err(|e| fail(&pod, Failure::Patch(e.to_string())))?;
    if check != injected {
        return Err(fail(&pod, Failure::Patch("applying it gives another pod".into())));
    }
    Ok(Outcome::Injected { pod: injected, patch })
}

fn type_name(v: &Json) -> &'static str {
    match v {
        Json::Null => "null",
        Json::Bool(_) => "a bool",
        Json::Number(_) => "a number",
        Json::String(_) => "a string",
        Json::Array(_) => "a list",
        Json::Object(_) => "a map",
    }
}

/// The map at `v[key]`, made a map (and `v` too) when it is not one.
pub(crate) fn ensure_object<'a>(v: &'a mut Json, key: &str) -> &'a mut Map<String, Json> {
    if !v.is_object() {
        *v = Json::Object(Map::new());
    }
    let Json::Object(parent) = v else {
        unreachable!("made a map above")
    };
    let child = parent.entry(key).or_insert_with(|| Json::Object(Map::new()));
    if !child.is_object() {
        *child = Json::Object(Map::new());
    }
    let Json::Object(m) = child else {
        unreachable!("made a map above")
    };
    m
}

/// Istio's `injectPod` without the patch: the injected Pod.
fn inject_pod(
    cfg: &InjectorConfig,
    p: &InjectParams<'_>,
    pod: &Json,
    annotations: &BTreeMap<String, String>,
) -> Result<Json, Failure> {
    validate_annotations(annotations).map_err(Failure::Annotations)?;
    let mesh = p.mesh;
    let mut proxy_config = mesh.default_config();
    if let Some(pc) = annotations.get(PROXY_CONFIG_ANNOTATION) {
        proxy_config = merge_proxy_config(&proxy_config, pc).map_err(Failure::ProxyConfig)?;
    }
    let mut envs = parse_inject_envs(p.path);
    let (cluster, network) = cluster_and_network(cfg, &envs, pod);
    if !cluster.is_empty() {
        envs.insert("ISTIO_META_CLUSTER_ID".into(), cluster);
    }
    if !network.is_empty() {
        envs.insert("ISTIO_META_NETWORK".into(), network);
    }
    let status_port = mesh.status_port();
    let stripped = reinsert_overrides(strip_pod(pod, status_port))?;
    let (uid, gid) = proxy_ids(p.openshift_namespace_annotations);
    let deploy = deploy_meta(pod);
    let stripped_anns = stripped
        .pointer("/metadata/annotations")
        .cloned()
        .unwrap_or_else(|| json!({}));
    let image_type = proxy_config
        .pointer("/image/imageType")
        .and_then(Json::as_str)
        .unwrap_or_default();
    let data = template_data(&TemplateInput {
        deploy: &deploy,
        pod: &stripped,
        proxy_config: &proxy_config,
        mesh: mesh.as_json(),
        values: &cfg.values,
        revision: p.revision,
        native_sidecars: p.native_sidecar,
        proxy_image: proxy_image(cfg, "/global/proxy/image", image_type, &stripped_anns),
        proxy_init_image: proxy_image(cfg, "/global/proxy_init/image", "", &stripped_anns),
        proxy_uid: uid,
        proxy_gid: gid,
        inbound_traffic_policy_mode: mesh.inbound_traffic_policy_mode(),
        compliance_policy: p.compliance_policy,
    });
    let ctx = FuncCtx { env: p.env };
    let mut merged = pod.clone();
    let mut template_pod = json!({});
    for name in select_templates(cfg, annotations) {
        let t = cfg.templates.get(&name).ok_or_else(|| Failure::NoTemplate {
            name: name.clone(),
            have: cfg.templates.keys().cloned().collect::<Vec<_>>().join(", "),
        })?;
        let rendered = t.render(&data, &ctx).map_err(|source| Failure::Template {
            name: name.clone(),
            source,
        })?;
        let overlay = match from_yaml(&rendered) {
            Ok(o @ (Json::Object(_) | Json::Null)) => o,
            Ok(other) => {
                return Err(Failure::RenderedYaml {
                    name,
                    reason: format!("not a map: {}", type_name(&other)),
                });
            }
            Err(reason) => return Err(Failure::RenderedYaml { name, reason }),
        };
        template_pod = strategic_merge(&template_pod, &overlay).map_err(Failure::Overlay)?;
        let native = match merged
            .pointer("/metadata/annotations/sidecar.istio.io~1nativeSidecar")
            .and_then(Json::as_str)
        {
            Some("true") => true,
            Some("false") => false,
            _ => p.native_sidecar,
        };
        if native
            && has_container(&template_pod, "initContainers", PROXY_CONTAINER)
            && has_container(&merged, "containers", PROXY_CONTAINER)
        {
            move_container(&mut merged, "containers", "initContainers", PROXY_CONTAINER);
        }
        merged = strategic_merge(&merged, &overlay).map_err(Failure::Overlay)?;
    }
    let mut merged = reapply_overwritten_containers(merged, pod, &template_pod, &proxy_config)?;
    post_process(
        &mut merged,
        &template_pod,
        &PostProcess {
            cfg,
            mesh,
            original: pod,
            revision: p.revision,
            envs: &envs,
            status_port,
        },
    )?;
    Ok(merged)
}

fn containers<'a>(pod: &'a Json, key: &str) -> &'a [Json] {
    pod.get("spec")
        .and_then(|s| s.get(key))
        .and_then(Json::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn has_container(pod: &Json, key: &str, name: &str) -> bool {
    find_container(containers(pod, key), name).is_some()
}

pub(crate) fn find_container<'a>(list: &'a [Json], name: &str) -> Option<&'a Json> {
    list.iter().find(|c| c.get("name").and_then(Json::as_str) == Some(name))
}

fn move_container(pod: &mut Json, from: &str, to: &str, name: &str) {
    let spec = ensure_object(pod, "spec");
    let Some(Json::Array(list)) = spec.get_mut(from) else {
        return;
    };
    let Some(i) = list
        .iter()
        .position(|c| c.get("name").and_then(Json::as_str) == Some(name))
    else {
        return;
    };
    let c = list.remove(i);
    match spec.get_mut(to) {
        Some(Json::Array(l)) => l.push(c),
        _ => {
            spec.insert(to.into(), json!([c]));
        }
    }
}

/// Istio's `selectTemplates`: the `inject.istio.io/templates` annotation or the defaults, with
/// aliases expanded (once).
fn select_templates(cfg: &InjectorConfig, annotations: &BTreeMap<String, String>) -> Vec<String> {
    let names: Vec<String> = match annotations.get("inject.istio.io/templates") {
        Some(a) => a.split(',').map(|n| n.trim().to_string()).collect(),
        None => cfg.default_templates.clone(),
    };
    names
        .into_iter()
        .flat_map(|n| cfg.aliases.get(&n).cloned().unwrap_or_else(|| vec![n]))
        .collect()
}

/// The container names an earlier injection recorded in `sidecar.istio.io/status`.
fn status_names(pod: &Json) -> Option<(Vec<String>, Vec<String>)> {
    let status = pod
        .pointer("/metadata/annotations/sidecar.istio.io~1status")
        .and_then(Json::as_str)?;
    let v: Json = serde_json::from_str(status).ok()?;
    let names = |k: &str| -> Vec<String> {
        v.get(k)
            .and_then(Json::as_array)
            .map(|a| a.iter().filter_map(|n| n.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    Some((names("containers"), names("initContainers")))
}

/// Istio's `stripPod`: an already injected Pod without what the injection added, so that
/// injecting again gives the same Pod.
fn strip_pod(pod: &Json, status_port: i64) -> Json {
    let mut pod = pod.clone();
    let Some((cs, ics)) = status_names(&pod) else {
        return pod;
    };
    let spec = ensure_object(&mut pod, "spec");
    for (key, names) in [("containers", cs), ("initContainers", ics)] {
        if let Some(Json::Array(list)) = spec.get_mut(key) {
            list.retain(|c| !names.iter().any(|n| c.get("name").and_then(Json::as_str) == Some(n)));
        }
    }
    if prometheus_port(&pod).as_deref() == Some(status_port.to_string().as_str()) {
        clear_prometheus_annotations(&mut pod);
    }
    if let Some(Json::Object(a)) = pod.pointer_mut("/metadata/annotations") {
        a.remove(STATUS_ANNOTATION);
    }
    pod
}

fn overrides(pod: &Json) -> Result<(Vec<Json>, Vec<Json>), Failure> {
    let Some(text) = pod
        .pointer("/metadata/annotations/proxy.istio.io~1overrides")
        .and_then(Json::as_str)
    else {
        return Ok((Vec::new(), Vec::new()));
    };
    let v: Json =
        serde_json::from_str(text).map_err(|e| Failure::ProxyOverrides(format!("{OVERRIDES_ANNOTATION}: {e}")))?;
    let list = |k: &str| v.get(k).and_then(Json::as_array).cloned().unwrap_or_default();
    Ok((list("containers"), list("initContainers")))
}

/// Istio's `reinsertOverrides`: the containers of `proxy.istio.io/overrides` back in the Pod.
fn reinsert_overrides(mut pod: Json) -> Result<Json, Failure> {
    let (cs, ics) = overrides(&pod)?;
    let spec = ensure_object(&mut pod, "spec");
    for (key, list) in [("containers", cs), ("initContainers", ics)] {
        for c in list {
            let name = c.get("name").and_then(Json::as_str).unwrap_or_default().to_string();
            let slot = spec.entry(key.to_string()).or_insert_with(|| json!([]));
            if let Json::Array(l) = slot
                && find_container(l, &name).is_none()
            {
                l.push(c);
            }
        }
    }
    Ok(pod)
}

/// Istio's `reapplyOverwrittenContainers`: a container the user declared with the name of an
/// injected one (`istio-proxy`) is merged back over the injected one, and remembered in
/// `proxy.istio.io/overrides` for re-injection.
fn reapply_overwritten_containers(
    mut merged: Json,
    original: &Json,
    template_pod: &Json,
    proxy_config: &Json,
) -> Result<Json, Failure> {
    let (existing_cs, existing_ics) = overrides(original)?;
    let injected = status_names(original);
    let already_injected = injected.is_some();
    let (injected_cs, injected_ics) = injected.unwrap_or_default();
    let mut applied: Map<String, Json> = Map::new();
    for (key, existing, injected) in [
        ("containers", &existing_cs, &injected_cs),
        ("initContainers", &existing_ics, &injected_ics),
    ] {
        let mut list = Vec::new();
        for c in containers(template_pod, key) {
            let name = c.get("name").and_then(Json::as_str).unwrap_or_default();
            if injected.iter().any(|n| n == name) {
                continue;
            }
            let found = find_container(existing, name).or_else(|| match key {
                "containers" => find_container(containers(original, "containers"), name),
                _ => find_container(containers(original, "containers"), name)
                    .or_else(|| find_container(containers(original, "initContainers"), name)),
            });
            let Some(found) = found else { continue };
            let mut overlay = found.clone();
            if overlay.get("image").and_then(Json::as_str) == Some("auto")
                && let Some(o) = overlay.as_object_mut()
            {
                o.remove("image");
            }
            list.push(overlay.clone());
            let patch = if key == "containers" {
                json!({"spec": {"containers": [overlay]}})
            } else {
                json!({"spec": {"containers": [], "initContainers": [overlay]}})
            };
            merged = strategic_merge(&merged, &patch).map_err(Failure::Overlay)?;
        }
        if !list.is_empty() {
            applied.insert(key.to_string(), Json::Array(list));
        }
    }
    if !already_injected && !applied.is_empty() {
        let text = crate::json_order::to_ordered_json(&Json::Object(applied), crate::json_order::container_field_order);
        ensure_object(ensure_object_value(&mut merged, "metadata"), "annotations")
            .insert(OVERRIDES_ANNOTATION.into(), json!(text));
    }
    crate::postprocess::adjust_init_container_user(&mut merged, original, proxy_config);
    Ok(merged)
}

fn ensure_object_value<'a>(v: &'a mut Json, key: &str) -> &'a mut Json {
    ensure_object(v, key);
    &mut v[key]
}
