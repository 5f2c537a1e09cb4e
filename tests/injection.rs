//! pilot-discovery as istiod's sidecar injector in a cluster (the fake API server, which runs
//! mutating admission as the real one does, and `kubectl`): Istio's rendered default install is
//! applied with `kubectl` as written (its `istio-sidecar-injector` ConfigMap and
//! MutatingWebhookConfiguration, whose caBundle pilot-discovery patches); a Pod created with
//! `kubectl apply` in a namespace labelled `istio-injection=enabled`, as the ReplicaSet controller
//! creates a Deployment's Pods, is stored with Istio's `istio-init` and `istio-proxy` and the
//! status annotation; a namespace without the label and `sidecar.istio.io/inject: "false"` are
//! left alone; a change of the ConfigMap applies to the next Pod and an invalid one keeps the last
//! good config serving; a change of the `istio` ConfigMap's mesh config applies to the next Pod.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use test_support::discovery::{Discovery, DiscoveryOptions};
use test_support::kube_api::{FakeApiServer, kubectl};
use test_support::ports::free_port;

mod common;
use common::istiod::corpus_install;

/// A Pod of a Deployment `web`, as its ReplicaSet creates it (generateName, owner, pod-template-hash).
fn deployment_pod(namespace: &str, extra_labels: Value) -> String {
    let mut labels = json!({"app": "web", "pod-template-hash": "5d8f7c9b4"});
    if let (Some(l), Some(extra)) = (labels.as_object_mut(), extra_labels.as_object()) {
        l.extend(extra.clone());
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {
            "generateName": "web-5d8f7c9b4-", "namespace": namespace, "labels": labels,
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f7c9b4",
                "uid": "0b9d7a6e-2f4c-4e7b-9a53-1c2d3e4f5a6b", "controller": true, "blockOwnerDeletion": true}],
        },
        "spec": {
            "serviceAccountName": "default",
            "containers": [{"name": "web", "image": "nginx:1.27", "ports": [{"containerPort": 8080}]}],
        }
    })
    .to_string()
}

async fn eventually<F: Future<Output = bool>>(what: &str, mut check: impl FnMut() -> F) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(Instant::now() < deadline, "{what} within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Cluster {
    api: FakeApiServer,
    work: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Cluster {
    /// `kubectl create -f` of a Pod; the stored Pod.
    async fn create_pod(&self, namespace: &str, extra_labels: Value) -> anyhow::Result<Value> {
        let file = self.work.path().join(format!("pod-{}.json", free_port()));
        std::fs::write(&file, deployment_pod(namespace, extra_labels))?;
        let name = kubectl(
            &self.kubeconfig,
            &["create", "-f", file.to_str().unwrap(), "-o", "name"],
        )
        .await?;
        let name = name.trim().trim_start_matches("pod/");
        let out = kubectl(&self.kubeconfig, &["get", "pod", name, "-n", namespace, "-o", "json"]).await?;
        Ok(serde_json::from_str(&out)?)
    }

    async fn apply(&self, name: &str, doc: &Value) -> anyhow::Result<String> {
        let file = self.work.path().join(name);
        std::fs::write(&file, doc.to_string())?;
        kubectl(&self.kubeconfig, &["apply", "-f", file.to_str().unwrap()]).await
    }

    async fn injector_configmap(&self) -> Value {
        let out = kubectl(
            &self.kubeconfig,
            &[
                "get",
                "configmap",
                "istio-sidecar-injector",
                "-n",
                "istio-system",
                "-o",
                "json",
            ],
        )
        .await
        .unwrap();
        let mut cm: Value = serde_json::from_str(&out).unwrap();
        for k in [
            "resourceVersion",
            "uid",
            "creationTimestamp",
            "managedFields",
            "annotations",
        ] {
            cm["metadata"].as_object_mut().unwrap().remove(k);
        }
        cm
    }
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect()
}

fn proxy_image(pod: &Value) -> String {
    pod["spec"]["initContainers"]
        .as_array()
        .into_iter()
        .chain(pod["spec"]["containers"].as_array())
        .flatten()
        .find(|c| c["name"] == "istio-proxy")
        .and_then(|c| c["image"].as_str())
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test]
async fn kubectl_created_pods_are_injected_by_pilot_discovery() -> anyhow::Result<()> {
    let api = FakeApiServer::start().await?;
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "istio-system"}}))?;
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "apps", "labels": {"istio-injection": "enabled"}}}))?;
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "plain"}}))?;
    // A node whose kubelet runs native sidecars (Kubernetes 1.33): ENABLE_NATIVE_SIDECARS is
    // unset in the install, so `auto` decides from the nodes as istiod does.
    api.apply(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-1"},
        "status": {"nodeInfo": {"kubeletVersion": "v1.33.2"}}}),
    )?;
    let work = tempfile::tempdir()?;
    let kubeconfig = work.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig)?;
    kubectl(&kubeconfig, &["apply", "-f", corpus_install().to_str().unwrap()]).await?;
    let config = work.path().join("config");
    std::fs::create_dir(&config)?;
    let https = free_port();
    api.route_service("istiod", "istio-system", ([127, 0, 0, 1], https).into());
    let discovery = Discovery::start(
        &config,
        DiscoveryOptions {
            args: vec![
                "--kubeconfig".into(),
                kubeconfig.display().to_string(),
                "--secureGrpcAddr".into(),
                format!("127.0.0.1:{}", free_port()),
                "--httpsAddr".into(),
                format!("127.0.0.1:{https}"),
            ],
            env: vec![("ROOT_CA_DIR".into(), work.path().join("cacerts").display().to_string())],
            ..Default::default()
        },
    )
    .await?;
    let cluster = Cluster { api, work, kubeconfig };

    // The injector's webhook configuration gets the mesh root as its caBundle; until then the
    // API server cannot verify 15017 and (failurePolicy Fail) refuses the Pod.
    let pod = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match cluster.create_pod("apps", json!({})).await {
                Ok(pod) => break pod,
                Err(e) if Instant::now() < deadline => {
                    tracing_like_note(&e);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!(
                    "a Pod in an injected namespace within 30 s: {e:#}\n{}",
                    discovery.logs()
                ),
            }
        }
    };
    assert_eq!(
        names(&pod["spec"]["initContainers"]),
        ["istio-init", "istio-proxy"],
        "native sidecars: {pod}"
    );
    assert_eq!(pod["spec"]["initContainers"][1]["restartPolicy"], "Always");
    assert_eq!(names(&pod["spec"]["containers"]), ["web"]);
    let status: Value = serde_json::from_str(
        pod["metadata"]["annotations"]["sidecar.istio.io/status"]
            .as_str()
            .expect("the status annotation"),
    )?;
    assert_eq!(
        status["initContainers"],
        json!(["istio-init", "istio-proxy"]),
        "{status}"
    );
    assert_eq!(pod["metadata"]["labels"]["security.istio.io/tlsMode"], "istio");
    assert_eq!(pod["metadata"]["labels"]["service.istio.io/canonical-name"], "web");
    assert!(
        proxy_image(&pod).starts_with("registry.istio.io/release/proxyv2:"),
        "{pod}"
    );

    // Not selected by the webhook configuration: stored as created.
    let plain = cluster.create_pod("plain", json!({})).await?;
    assert_eq!(names(&plain["spec"]["containers"]), ["web"]);
    assert!(plain["spec"].get("initContainers").is_none(), "{plain}");
    let off = cluster
        .create_pod("apps", json!({"sidecar.istio.io/inject": "false"}))
        .await?;
    assert!(off["spec"].get("initContainers").is_none(), "{off}");

    // A change of the ConfigMap applies to the next Pod.
    let mut cm = cluster.injector_configmap().await;
    let mut values: Value = serde_json::from_str(cm["data"]["values"].as_str().unwrap())?;
    values["global"]["hub"] = json!("registry.example.com/mesh");
    cm["data"]["values"] = json!(values.to_string());
    cluster.apply("hub.json", &cm).await?;
    eventually("a Pod injected with the ConfigMap's new hub", || async {
        let pod = cluster.create_pod("apps", json!({})).await.unwrap();
        proxy_image(&pod).starts_with("registry.example.com/mesh/proxyv2:")
    })
    .await;

    // An invalid one keeps the last good config, and is counted.
    let mut bad = cm.clone();
    bad["data"]["config"] = json!("templates: [unclosed");
    cluster.apply("bad.json", &bad).await?;
    eventually("the invalid ConfigMap counted", || async {
        discovery
            .metric("sidecar_injection_config_errors_total")
            .await
            .unwrap_or_default()
            >= 1.0
    })
    .await;
    let pod = cluster.create_pod("apps", json!({})).await?;
    assert!(
        proxy_image(&pod).starts_with("registry.example.com/mesh/proxyv2:"),
        "the last good config injects: {pod}"
    );
    assert!(
        discovery
            .logs()
            .contains("ConfigMap istio-system/istio-sidecar-injector: istio-sidecar-injector config:"),
        "the log names the ConfigMap and the key:\n{}",
        discovery.logs()
    );

    // A change of the `istio` ConfigMap's mesh config applies to the next Pod (istiod's webhook
    // follows the mesh): its proxyMetadata becomes the proxy's env.
    let out = kubectl(
        &cluster.kubeconfig,
        &["get", "configmap", "istio", "-n", "istio-system", "-o", "json"],
    )
    .await?;
    let mut mesh_cm: Value = serde_json::from_str(&out)?;
    let mesh = mesh_cm["data"]["mesh"].as_str().unwrap_or_default().replacen(
        "defaultConfig:\n",
        "defaultConfig:\n  proxyMetadata:\n    MESH_CHANGE_SEEN: \"yes\"\n",
        1,
    );
    assert!(
        mesh.contains("MESH_CHANGE_SEEN"),
        "the install's mesh has no defaultConfig: {mesh_cm}"
    );
    mesh_cm["data"]["mesh"] = json!(mesh);
    mesh_cm["metadata"].as_object_mut().unwrap().remove("resourceVersion");
    cluster.apply("mesh.json", &mesh_cm).await?;
    eventually("a Pod injected with the mesh config's new proxyMetadata", || async {
        let pod = cluster.create_pod("apps", json!({})).await.unwrap();
        let proxy = &pod["spec"]["initContainers"][1];
        proxy["env"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|e| e["name"] == "MESH_CHANGE_SEEN" && e["value"] == "yes")
    })
    .await;

    let metric = |name: &'static str| {
        let discovery = &discovery;
        async move { discovery.metric(name).await.unwrap_or_default() }
    };
    // three injected Pods at least (the webhook is not called for the other two)
    let requests = metric("sidecar_injection_requests_total").await;
    assert!(requests >= 3.0, "sidecar_injection_requests_total {requests}");
    assert_eq!(metric("sidecar_injection_success_total").await, requests);
    assert_eq!(metric("sidecar_injection_failure_total").await, 0.0);
    assert_eq!(
        metric("sidecar_injection_skip_total").await,
        0.0,
        "skips are the API server's here"
    );
    assert!(cluster.api.forbidden().is_empty());
    Ok(())
}

/// Refusals while the caBundle is not yet patched are expected; others are worth seeing.
fn tracing_like_note(e: &anyhow::Error) {
    let text = format!("{e:#}");
    if !text.contains("failed calling webhook") {
        eprintln!("creating a Pod: {text}");
    }
}
