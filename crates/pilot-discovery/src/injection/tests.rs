//! `/inject` through the router, with the `istio-sidecar-injector` ConfigMap of Istio's rendered
//! default install: a Pod is injected with Istio's containers, skips and bad input are answered
//! and counted as Istio's, and a bad ConfigMap version leaves the last good one serving.

use std::collections::BTreeMap;

use axum::http::Request;
use k8s_openapi::api::core::v1::ConfigMap;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::*;

const INSTALL: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../../shared/corpus/istio/operator/cmd/mesh/testdata/manifest-generate/output/pilot_default.golden.yaml"
);

/// The install's `istio-sidecar-injector` ConfigMap and the `istio` ConfigMap's mesh.
fn install() -> (ConfigMap, String) {
    let text = std::fs::read_to_string(INSTALL).unwrap_or_else(|e| {
        panic!("{INSTALL}: {e} (Istio's rendered install is read from ../shared/corpus beside the repository)")
    });
    let (mut injector, mut mesh) = (None, None);
    for doc in text.split("\n---") {
        let Ok(doc) = serde_saphyr::from_str::<Value>(doc.trim_start_matches("---")) else {
            continue;
        };
        if doc["kind"] != "ConfigMap" {
            continue;
        }
        match doc.pointer("/metadata/name").and_then(Value::as_str) {
            Some("istio-sidecar-injector") => injector = serde_json::from_value(doc).ok(),
            Some("istio") => mesh = doc.pointer("/data/mesh").and_then(Value::as_str).map(str::to_owned),
            _ => {}
        }
    }
    match (injector, mesh) {
        (Some(i), Some(m)) => (i, m),
        _ => panic!("{INSTALL}: no istio-sidecar-injector or istio ConfigMap"),
    }
}

fn injector(native: &str) -> (Injector, Registry, ConfigMap) {
    let (cm, mesh_yaml) = install();
    let mut registry = Registry::default();
    let metrics = InjectionMetrics::register(&mut registry);
    let env = BTreeMap::from([("ENABLE_NATIVE_SIDECARS".to_owned(), native.to_owned())]);
    let injector = Injector::new(
        Options {
            namespace: "istio-system".into(),
            revision: String::new(),
            mesh_yaml,
            env,
        },
        None,
        metrics,
    );
    (injector, registry, cm)
}

fn pod(labels: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "web-5d8f7c-", "labels": labels},
        "spec": {"containers": [{"name": "web", "image": "nginx", "ports": [{"containerPort": 80}]}]}
    })
}

fn review(object: Value) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "2d1f8a4c-5b0e-4b1a-9f57-0c7c2a1e3b11",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "apps", "operation": "CREATE", "object": object,
        }
    }))
    .unwrap_or_default()
}

async fn post(injector: &Injector, path: &str, content_type: &str, body: Vec<u8>) -> (u16, Value) {
    let request = Request::post(path)
        .header("content-type", content_type)
        .body(Body::from(body))
        .unwrap_or_else(|e| panic!("{e}"));
    let response = injector
        .clone()
        .routes()
        .oneshot(request)
        .await
        .unwrap_or_else(|e| match e {});
    let status = response.status().as_u16();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .unwrap_or_default();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// The Pod with the answer's patch applied.
fn patched(pod: &Value, answer: &Value) -> Value {
    use base64::Engine;
    let patch = answer["response"]["patch"]
        .as_str()
        .unwrap_or_else(|| panic!("no patch: {answer}"));
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(patch)
        .unwrap_or_else(|e| panic!("{e}"));
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{e}"));
    let mut out = pod.clone();
    json_patch::patch(&mut out, &patch).unwrap_or_else(|e| panic!("{e}"));
    out
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect()
}

fn metrics(registry: &Registry) -> String {
    monitoring::render(registry).unwrap_or_default()
}

#[tokio::test]
async fn the_installs_configmap_injects_istios_containers() {
    let (injector, registry, cm) = injector("false");
    injector.set_config(&cm);
    let pod = pod(json!({"app": "web"}));
    let (status, answer) = post(
        &injector,
        "/inject/cluster/c1/net/n1",
        "application/json",
        review(pod.clone()),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["uid"], "2d1f8a4c-5b0e-4b1a-9f57-0c7c2a1e3b11");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert_eq!(answer["response"]["patchType"], "JSONPatch");
    let injected = patched(&pod, &answer);
    assert_eq!(names(&injected["spec"]["initContainers"]), ["istio-init"]);
    assert_eq!(names(&injected["spec"]["containers"]), ["web", "istio-proxy"]);
    let proxy = &injected["spec"]["containers"][1];
    assert_eq!(proxy["args"][0], "proxy");
    let env = &proxy["env"];
    let value = |name: &str| {
        env.as_array()
            .into_iter()
            .flatten()
            .find(|e| e["name"] == name)
            .map(|e| e["value"].clone())
    };
    assert_eq!(value("ISTIO_META_CLUSTER_ID"), Some(json!("c1")));
    assert_eq!(value("ISTIO_META_NETWORK"), Some(json!("n1")));
    assert!(
        injected["metadata"]["annotations"]["sidecar.istio.io/status"]
            .as_str()
            .is_some_and(|s| s.contains("istio-proxy")),
        "{injected}"
    );
    let text = metrics(&registry);
    for line in [
        "sidecar_injection_requests_total 1\n",
        "sidecar_injection_success_total 1\n",
        "sidecar_injection_failure_total 0\n",
        "sidecar_injection_skip_total 0\n",
        "sidecar_injection_time_seconds_count 1\n",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
}

#[tokio::test]
async fn native_sidecars_put_the_proxy_among_the_init_containers() {
    let (injector, _registry, cm) = injector("true");
    injector.set_config(&cm);
    let pod = pod(json!({"app": "web"}));
    let (_, answer) = post(&injector, "/inject", "application/json", review(pod.clone())).await;
    let injected = patched(&pod, &answer);
    assert_eq!(
        names(&injected["spec"]["initContainers"]),
        ["istio-init", "istio-proxy"]
    );
    assert_eq!(injected["spec"]["initContainers"][1]["restartPolicy"], "Always");
    assert_eq!(names(&injected["spec"]["containers"]), ["web"]);
}

#[tokio::test]
async fn skips_and_bad_input_are_answered_and_counted_as_istio() {
    let (injector, registry, cm) = injector("false");
    // No config yet: not served.
    let (status, _) = post(&injector, "/inject", "application/json", review(pod(json!({})))).await;
    assert_eq!(status, 404);
    injector.set_config(&cm);
    let off = pod(json!({"sidecar.istio.io/inject": "false"}));
    let (status, answer) = post(&injector, "/inject", "application/json", review(off)).await;
    assert_eq!((status, &answer["response"]["allowed"]), (200, &json!(true)));
    assert!(answer["response"].get("patch").is_none(), "{answer}");
    let (status, answer) = post(&injector, "/inject", "application/json", b"{not json".to_vec()).await;
    assert_eq!(status, 200);
    assert_eq!(answer["response"]["allowed"], false);
    assert!(
        answer["response"]["status"]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("could not decode body")),
        "{answer}"
    );
    let (status, _) = post(&injector, "/inject", "text/yaml", review(pod(json!({})))).await;
    assert_eq!(status, 415);
    let huge = vec![b' '; webhooks::admission::MAX_REQUEST_BODY_BYTES + 1];
    let (status, _) = post(&injector, "/inject", "application/json", huge).await;
    assert_eq!(status, 413);
    // A Pod the templates cannot inject: denied with the reason.
    let mut bad = pod(json!({}));
    bad["metadata"]["annotations"] = json!({"inject.istio.io/templates": "no-such-template"});
    let (status, answer) = post(&injector, "/inject", "application/json", review(bad)).await;
    assert_eq!((status, &answer["response"]["allowed"]), (200, &json!(false)));
    let message = answer["response"]["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("apps/web-5d8f7c-***") && message.contains("no-such-template"),
        "{message}"
    );
    let text = metrics(&registry);
    for line in [
        "sidecar_injection_requests_total 6\n",
        "sidecar_injection_success_total 3\n",
        "sidecar_injection_failure_total 5\n",
        "sidecar_injection_skip_total 1\n",
    ] {
        assert!(text.contains(line), "{line} not in\n{text}");
    }
}

#[tokio::test]
async fn a_bad_configmap_version_leaves_the_last_good_one_serving() {
    let (injector, registry, cm) = injector("false");
    let with_values = |cm: &ConfigMap, key: &str, f: &dyn Fn(&str) -> String| {
        let mut cm = cm.clone();
        if let Some(d) = cm.data.as_mut()
            && let Some(v) = d.get_mut(key)
        {
            *v = f(v);
        }
        cm
    };
    let hub = |hub: &'static str| {
        move |v: &str| {
            let mut values: Value = serde_json::from_str(v).unwrap_or_default();
            values["global"]["hub"] = json!(hub);
            values.to_string()
        }
    };
    injector.set_config(&with_values(&cm, "values", &hub("first.example")));
    let image = |answer: &Value, pod: &Value| {
        patched(pod, answer)["spec"]["containers"][1]["image"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    };
    let pod = pod(json!({}));
    let (_, answer) = post(&injector, "/inject", "application/json", review(pod.clone())).await;
    let first = image(&answer, &pod);
    assert!(first.starts_with("first.example/proxyv2:"), "{first}");
    // Each bad version: values that are not JSON/YAML, config YAML that is not, a template
    // that does not parse, a missing key. None is applied, not even in part.
    let mut no_key = with_values(&cm, "values", &hub("bad.example"));
    if let Some(d) = no_key.data.as_mut() {
        d.remove("config");
    }
    for (i, bad) in [
        with_values(&cm, "values", &|_| "{not: [json".to_owned()),
        with_values(&cm, "config", &|_| "templates: [unclosed".to_owned()),
        with_values(&cm, "config", &|c| {
            c.replacen(
                "{{- define \"resources\"",
                "{{ nosuchfunction }}{{- define \"resources\"",
                1,
            )
        }),
        no_key,
    ]
    .into_iter()
    .enumerate()
    {
        injector.set_config(&bad);
        let (_, answer) = post(&injector, "/inject", "application/json", review(pod.clone())).await;
        let now = image(&answer, &pod);
        assert!(now.starts_with("first.example/"), "bad version {i} applied: {now}");
    }
    injector.set_config(&with_values(&cm, "values", &hub("second.example")));
    let (_, answer) = post(&injector, "/inject", "application/json", review(pod.clone())).await;
    assert!(image(&answer, &pod).starts_with("second.example/"), "{answer}");
    let text = metrics(&registry);
    assert!(text.contains("sidecar_injection_config_errors_total 4\n"), "{text}");
}

/// istiod's webhook follows the mesh config (its mesh handler): a change reaches the next Pod,
/// and a version the injector cannot read leaves the last good one injecting.
#[tokio::test]
async fn a_mesh_config_change_reaches_the_next_injected_pod() {
    let (injector, registry, cm) = injector("false");
    injector.set_config(&cm);
    let (_, install_mesh) = install();
    let live = |yaml: String| crate::mesh_configmap::LiveMesh {
        mesh: std::sync::Arc::new(model::MeshConfig::default()),
        yaml: yaml.into(),
    };
    let (tx, rx) = tokio::sync::watch::channel(live(install_mesh.clone()));
    let following = tokio::spawn(super::follow_mesh(injector.clone(), rx));
    let proxy_env = |injector: Injector| async move {
        let pod = pod(json!({"app": "web"}));
        let (status, answer) = post(&injector, "/inject", "application/json", review(pod.clone())).await;
        assert_eq!(status, 200, "{answer}");
        let injected = patched(&pod, &answer);
        let env = injected["spec"]["containers"][1]["env"].clone();
        let value = |name: &str| {
            env.as_array()
                .into_iter()
                .flatten()
                .find(|e| e["name"] == name)
                .map(|e| e["value"].clone())
        };
        value("MESH_CHANGE_SEEN")
    };
    assert_eq!(proxy_env(injector.clone()).await, None);

    let changed = install_mesh.replacen(
        "defaultConfig:\n",
        "defaultConfig:\n  proxyMetadata:\n    MESH_CHANGE_SEEN: \"yes\"\n",
        1,
    );
    assert_ne!(changed, install_mesh, "the install's mesh has no defaultConfig");
    tx.send(live(changed)).unwrap_or_else(|e| panic!("{e}"));
    let mut seen = None;
    for _ in 0..100 {
        seen = proxy_env(injector.clone()).await;
        if seen.is_some() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(
        seen,
        Some(json!("yes")),
        "the new mesh config's proxyMetadata is not injected"
    );

    tx.send(live("[a list, not a mesh config]\n".into()))
        .unwrap_or_else(|e| panic!("{e}"));
    let mut counted = false;
    for _ in 0..100 {
        if metrics(&registry).contains("sidecar_injection_config_errors_total 1\n") {
            counted = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(counted, "{}", metrics(&registry));
    assert_eq!(
        proxy_env(injector.clone()).await,
        Some(json!("yes")),
        "the last good mesh config stays"
    );
    drop(tx);
    following.await.unwrap_or_else(|e| panic!("{e}"));
}
