//! The watchers against the fake API server (test-support's, proven with kubectl): the initial
//! lists, then changes; a dropped watch and an expired resourceVersion (410 Gone) lose nothing.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use kclient::{WatchMetrics, client_config, connect};
use kube_registry::watch::{KINDS, watch_all};
use kube_registry::{Context, KubeRegistry};
use model::ServiceKey;
use serde_json::{Value, json};
use test_support::kube_api::FakeApiServer;
use tokio::sync::mpsc;

const HOST: &str = "reviews.default.svc.cluster.local";

fn objects() -> Vec<Value> {
    vec![
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1",
            "labels": {"topology.kubernetes.io/region": "r1", "topology.kubernetes.io/zone": "z1"}}}),
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "reviews-v1", "namespace": "default",
            "labels": {"app": "reviews", "version": "v1"}},
            "spec": {"nodeName": "n1", "serviceAccountName": "reviews", "containers": [{"name": "app", "image": "x"}]},
            "status": {"podIP": "10.1.0.1"}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "reviews", "namespace": "default"},
            "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "reviews"}, "ports": [{"name": "http", "port": 9080}]}}),
        slice(&["10.1.0.1"]),
    ]
}

fn slice(ips: &[&str]) -> Value {
    let endpoints: Vec<Value> = ips
        .iter()
        .map(|ip| {
            json!({"addresses": [ip], "conditions": {"ready": true},
                          "targetRef": {"kind": "Pod", "name": "reviews-v1", "namespace": "default"}})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "reviews-abc", "namespace": "default", "labels": {"kubernetes.io/service-name": "reviews"}},
        "addressType": "IPv4", "endpoints": endpoints, "ports": [{"name": "http", "port": 8080}]})
}

/// A kube-rs client for `api`, through a kubeconfig file as pilot-discovery reads it (the
/// directory holding it is returned to be kept).
async fn client_for(api: &FakeApiServer) -> (tempfile::TempDir, kube::Client) {
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    api.write_kubeconfig(&kubeconfig).unwrap();
    let cfg = client_config(kubeconfig.to_str().unwrap(), |_| None)
        .await
        .unwrap()
        .unwrap();
    (dir, connect(cfg, Duration::from_secs(5)).await.unwrap())
}

async fn eventually(what: &str, f: impl Fn() -> bool) {
    for _ in 0..200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

fn addresses(r: &KubeRegistry) -> Vec<String> {
    r.snapshot()
        .endpoints_of(&ServiceKey::new(HOST, "default"))
        .iter()
        .map(|e| e.address.clone())
        .collect()
}

#[tokio::test]
async fn watchers_sync_then_follow_changes_through_drops_and_410() {
    let api = FakeApiServer::start().await.unwrap();
    for o in objects() {
        api.apply(o).unwrap();
    }
    let (_dir, client) = client_for(&api).await;
    let registry = Arc::new(KubeRegistry::new(Context {
        domain: "cluster.local".into(),
        trust_domain: "cluster.local".into(),
        cluster_id: "Kubernetes".into(),
        system_namespace: "istio-system".into(),
        discovery_selectors: Vec::new(),
    }));
    let (tx, mut diffs) = mpsc::unbounded_channel();
    let metrics = WatchMetrics::default();
    let mut watchers = watch_all(client, registry.clone(), tx, metrics.clone());
    tokio::time::timeout(
        Duration::from_secs(10),
        watchers.synced.wait_for(|s| s.len() == KINDS.len()),
    )
    .await
    .expect("initial lists within 10 s")
    .unwrap();
    assert_eq!(addresses(&registry), ["10.1.0.1"]);
    let snapshot = registry.snapshot();
    let e = &snapshot.endpoints_of(&ServiceKey::new(HOST, "default"))[0];
    assert_eq!((e.endpoint_port, e.locality.to_string().as_str()), (8080, "r1/z1/"));
    assert!(diffs.try_recv().is_ok(), "the initial lists were reported");

    // A change through the API.
    api.apply(slice(&["10.1.0.1", "10.1.0.2"])).unwrap();
    eventually("the scaled slice", || addresses(&registry).len() == 2).await;

    // Watches cut mid-stream: kube-rs re-watches from where it was; nothing is lost.
    api.drop_watches();
    api.apply(slice(&["10.1.0.1", "10.1.0.2", "10.1.0.3"])).unwrap();
    eventually("the change made while the watches were down", || {
        addresses(&registry).len() == 3
    })
    .await;

    // History expired while disconnected: the re-watch gets 410 Gone, kube-rs re-lists.
    api.drop_watches();
    api.apply(slice(&["10.1.0.4"])).unwrap();
    api.compact();
    eventually("the change behind a 410", || addresses(&registry) == ["10.1.0.4"]).await;
    let count = |t: &str, e: &str| {
        metrics
            .events
            .get_or_create(&kclient::EventLabels {
                r#type: t.into(),
                event: e.into(),
            })
            .get()
    };
    assert_eq!(count("Services", "add"), 1);
    assert!(
        count("EndpointSlice", "update") >= 2,
        "{}",
        count("EndpointSlice", "update")
    );
    // Listed twice: at start, and again after the 410.
    let requests = api.requests();
    let lists = requests
        .iter()
        .filter(|r| r.contains("/endpointslices") && !r.contains("watch="))
        .count();
    assert!(lists >= 2, "{requests:#?}");
}

#[tokio::test]
async fn an_unreachable_api_server_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    let port = test_support::ports::free_port();
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n\
             users: [{{name: u, user: {{token: t}}}}]\ncontexts: [{{name: x, context: {{cluster: c, user: u}}}}]\ncurrent-context: x\n"
        ),
    )
    .unwrap();
    let cfg = client_config(path.to_str().unwrap(), |_| None).await.unwrap().unwrap();
    let Err(e) = connect(cfg, Duration::from_secs(3)).await else {
        panic!("nothing listens on port {port}")
    };
    let e = e.to_string();
    assert!(e.contains(&format!("127.0.0.1:{port}")), "{e}");
    // No kubeconfig, no KUBECONFIG, not in a cluster: no Kubernetes registry.
    assert!(client_config("", |_| None).await.unwrap().is_none());
    let missing = client_config("/nonexistent/kubeconfig", |_| None)
        .await
        .unwrap_err()
        .to_string();
    assert!(missing.contains("/nonexistent/kubeconfig"), "{missing}");
}

fn all_kinds() -> Vec<config_sources::crdclient::ConfigResource> {
    config_sources::crdclient::CONFIG_KINDS.to_vec()
}

#[tokio::test]
async fn istio_config_is_read_per_served_version_and_missing_crds_are_skipped() {
    let api = FakeApiServer::start().await.unwrap();
    api.apply(
        json!({"apiVersion": "networking.istio.io/v1beta1", "kind": "VirtualService",
        "metadata": {"name": "r", "namespace": "default"},
        "spec": {"hosts": ["r"], "http": [{"route": [{"destination": {"host": "r"}}]}]}}),
    )
    .unwrap();
    // security.istio.io kinds and gateway credentials (Secrets) are config too
    api.apply(
        json!({"apiVersion": "security.istio.io/v1", "kind": "PeerAuthentication",
        "metadata": {"name": "default", "namespace": "istio-system"}, "spec": {"mtls": {"mode": "STRICT"}}}),
    )
    .unwrap();
    api.apply(
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "gw-cert", "namespace": "istio-system"},
        "type": "kubernetes.io/tls", "data": {"tls.crt": "Q0VSVA==", "tls.key": "S0VZ"}}),
    )
    .unwrap();
    // Kinds not yet supported are read too, kept and reported; Ingresses and IngressClasses are
    // read for the Ingress conversion.
    for o in [
        json!({"apiVersion": "networking.istio.io/v1alpha3", "kind": "EnvoyFilter",
            "metadata": {"name": "lua", "namespace": "default"}, "spec": {"configPatches": []}}),
        json!({"apiVersion": "telemetry.istio.io/v1", "kind": "Telemetry",
            "metadata": {"name": "logs", "namespace": "default"}, "spec": {"accessLogging": [{"providers": [{"name": "envoy"}]}]}}),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "web", "namespace": "default"},
            "spec": {"ingressClassName": "istio", "rules": [{"host": "a.example.com"}]}}),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "istio"},
            "spec": {"controller": "istio.io/ingress-controller"}}),
    ] {
        api.apply(o).unwrap();
    }
    let (_dir, client) = client_for(&api).await;
    let source =
        config_sources::crdclient::start(client.clone(), all_kinds(), WatchMetrics::default(), Vec::new(), None).await;
    assert_eq!(source.initial.events.len(), 7);
    let state = source.state.borrow().clone();
    let kinds: Vec<String> = state.configs.keys().map(|k| k.kind.as_str().to_owned()).collect();
    assert_eq!(kinds.len(), 7, "{kinds:?}");
    for kind in [
        "VirtualService",
        "PeerAuthentication",
        "Secret",
        "EnvoyFilter",
        "Telemetry",
        "Ingress",
        "IngressClass",
    ] {
        assert!(kinds.iter().any(|k| k == kind), "{kind} in {kinds:?}");
    }
    // as --configDir reports them: warnings naming the resource
    let warnings: Vec<(String, String)> = state
        .errors
        .iter()
        .map(|e| (e.resource.clone().unwrap_or_default(), e.reason.clone()))
        .collect();
    assert_eq!(
        warnings,
        [
            (
                "EnvoyFilter default/lua".to_owned(),
                "EnvoyFilter default/lua: kind not yet supported: kept, but not acted on".to_owned()
            ),
            (
                "Telemetry default/logs".to_owned(),
                "Telemetry default/logs: kind not yet supported: kept, but not acted on".to_owned()
            ),
        ]
    );
    assert!(state.errors.iter().all(|e| e.level == config_sources::Level::Warning));

    drop(client);

    // Without Istio's CRDs: reported and skipped, not retried.
    let bare = FakeApiServer::start().await.unwrap();
    bare.uninstall_group("networking.istio.io");
    let (_bare_dir, client) = client_for(&bare).await;
    let source = tokio::time::timeout(
        Duration::from_secs(10),
        config_sources::crdclient::start(client, all_kinds(), WatchMetrics::default(), Vec::new(), None),
    )
    .await
    .expect("start does not wait for CRDs that are not there");
    assert!(source.initial.events.is_empty());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let requests: Vec<String> = bare
        .requests()
        .into_iter()
        .filter(|r| r.contains("networking.istio.io"))
        .collect();
    // One list per kind and version (seven kinds of three versions, EnvoyFilter and
    // ProxyConfig of one), no watches.
    assert_eq!(requests.len(), 7 * 3 + 2, "{requests:#?}");
    assert!(requests.iter().all(|r| !r.contains("watch=")), "{requests:#?}");
}

#[tokio::test]
async fn discovery_selectors_filter_istio_config_from_the_api_server_live() {
    let api = FakeApiServer::start().await.unwrap();
    let ns = |name: &str, labels: Value| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}});
    api.apply(ns("a", json!({"istio-discovery": "enabled"}))).unwrap();
    api.apply(ns("b", json!({}))).unwrap();
    for n in ["a", "b"] {
        api.apply(json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": "r", "namespace": n},
            "spec": {"hosts": ["r"], "http": [{"route": [{"destination": {"host": "r"}}]}]}}))
            .unwrap();
    }
    let (_dir, client) = client_for(&api).await;
    let selectors = vec![serde_json::from_value(json!({"matchLabels": {"istio-discovery": "enabled"}})).unwrap()];
    let mut source =
        config_sources::crdclient::start(client, all_kinds(), WatchMetrics::default(), selectors, None).await;
    let namespaces: Vec<String> = source.initial.events.iter().map(|e| e.key().namespace).collect();
    assert_eq!(namespaces, ["a"]);
    // Namespace b gets the label: its VirtualService is served from now on.
    api.apply(ns("b", json!({"istio-discovery": "enabled"}))).unwrap();
    let change = tokio::time::timeout(Duration::from_secs(10), source.changes.recv())
        .await
        .unwrap()
        .unwrap();
    let added: Vec<String> = change.events.iter().map(|e| e.key().to_string()).collect();
    assert_eq!(added, ["VirtualService b/r"]);
    assert_eq!(source.state.borrow().configs.len(), 2);
}

/// A kind the service account may not list (RBAC 403) is skipped like a missing CRD: start-up
/// does not wait for it and the other kinds are read.
#[tokio::test]
async fn kinds_the_cluster_role_does_not_allow_are_skipped() {
    let api = FakeApiServer::start().await.unwrap();
    api.apply(json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": "r", "namespace": "default"},
        "spec": {"hosts": ["r"], "http": [{"route": [{"destination": {"host": "r"}}]}]}}))
        .unwrap();
    api.apply(json!({"apiVersion": "telemetry.istio.io/v1", "kind": "Telemetry",
        "metadata": {"name": "logs", "namespace": "default"}, "spec": {}}))
        .unwrap();
    api.bind_cluster_role(
        "fake-token",
        "kind: ClusterRole\nrules:\n- apiGroups: [networking.istio.io]\n  resources: [\"*\"]\n  verbs: [get, list, watch]\n",
    )
    .unwrap();
    let (_dir, client) = client_for(&api).await;
    let source = tokio::time::timeout(
        Duration::from_secs(10),
        config_sources::crdclient::start(client, all_kinds(), WatchMetrics::default(), Vec::new(), None),
    )
    .await
    .expect("start does not wait for kinds it may not list");
    let keys: Vec<String> = source.initial.events.iter().map(|e| e.key().to_string()).collect();
    assert_eq!(keys, ["VirtualService default/r"]);
    assert!(
        api.forbidden()
            .iter()
            .any(|r| r.contains("list telemetries.telemetry.istio.io")),
        "{:?}",
        api.forbidden()
    );
}
