//! The watchers against a cluster holding what should not be there and an API server sending
//! what it should not (issue 28): an object that does not decode is named and the others are
//! served; a truncated event, an event of an unknown type and a line that never ends are
//! reported and the watch goes on; Services and EndpointSlices whose IPs or ports are dropped
//! say so.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use kclient::{ObjectErrorLabels, WatchErrorLabels, WatchMetrics, client_config, connect};
use kube_registry::watch::{KINDS, watch_all};
use kube_registry::{Context, KubeRegistry};
use model::ServiceKey;
use serde_json::{Value, json};
use test_support::kube_api::{FakeApiServer, RawWatch};
use tokio::sync::mpsc;

fn service(name: &str, ports: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "default"},
        "spec": {"clusterIP": "10.96.0.10", "selector": {"app": name}, "ports": ports}})
}

fn slice(service: &str, ips: &[&str]) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("{service}-abc"), "namespace": "default", "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4", "endpoints": [{"addresses": ips, "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 8080}]})
}

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
    for _ in 0..300 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("timed out waiting for {what}");
}

fn addresses(r: &KubeRegistry, name: &str) -> Vec<String> {
    r.snapshot()
        .endpoints_of(&ServiceKey::new(format!("{name}.default.svc.cluster.local"), "default"))
        .iter()
        .map(|e| e.address.clone())
        .collect()
}

fn problems(r: &KubeRegistry) -> Vec<String> {
    r.problems().entries().into_iter().map(|e| e.reason).collect()
}

#[tokio::test]
async fn one_undecodable_object_does_not_stop_the_others_and_broken_watch_lines_are_survived() {
    let api = FakeApiServer::start().await.unwrap();
    api.apply(service("reviews", json!([{"name": "http", "port": 9080}])))
        .unwrap();
    api.apply(slice("reviews", &["10.1.0.1"])).unwrap();
    // a map where the list of ports belongs: no Service decodes from it
    api.apply(service("broken", json!({"http": 9080}))).unwrap();
    // an address that is not an IP; a port without a number
    api.apply(service(
        "ratings",
        json!([{"name": "http", "port": 9080}, {"name": "grpc"}]),
    ))
    .unwrap();
    api.apply(slice("ratings", &["10.1.0.2", "10.1.0.999"])).unwrap();
    let (_dir, client) = client_for(&api).await;
    let metrics = WatchMetrics::default();
    let registry = Arc::new(
        KubeRegistry::new(Context {
            domain: "cluster.local".into(),
            trust_domain: "cluster.local".into(),
            cluster_id: "Kubernetes".into(),
            system_namespace: "istio-system".into(),
            discovery_selectors: Vec::new(),
        })
        .counting_problems(metrics.object_errors.clone()),
    );
    let (tx, _diffs) = mpsc::unbounded_channel();
    let mut watchers = watch_all(client, registry.clone(), tx, metrics.clone());
    tokio::time::timeout(
        Duration::from_secs(10),
        watchers.synced.wait_for(|s| s.len() == KINDS.len()),
    )
    .await
    .expect("every kind synced within 10 s, the undecodable Service notwithstanding")
    .unwrap();
    assert_eq!(addresses(&registry, "reviews"), ["10.1.0.1"]);
    assert_eq!(addresses(&registry, "ratings"), ["10.1.0.2"]);
    let ratings = registry
        .snapshot()
        .services
        .iter()
        .find(|s| s.attributes.name == "ratings")
        .cloned()
        .unwrap();
    let ports: Vec<u16> = ratings.ports.iter().map(|p| p.port).collect();
    assert_eq!(ports, [9080], "no port-0 cluster");
    let listed = problems(&registry);
    assert_eq!(listed.len(), 3, "{listed:#?}");
    assert!(
        listed[0]
            .starts_with("EndpointSlice default/ratings-abc: endpoint address \"10.1.0.999\" is not an IPv4 address"),
        "{listed:#?}"
    );
    assert!(
        listed[1].starts_with("Service default/broken: does not decode as a Service: invalid type: map"),
        "{listed:#?}"
    );
    assert!(
        listed[2].starts_with("Service default/ratings: port \"grpc\" has no valid port number (0;"),
        "{listed:#?}"
    );
    let objects = |kind: &str, reason: &str| {
        metrics
            .object_errors
            .get_or_create(&ObjectErrorLabels {
                r#type: kind.into(),
                reason: reason.into(),
            })
            .get()
    };
    assert_eq!(
        (
            objects("Service", "undecodable"),
            objects("Service", "invalid_port"),
            objects("EndpointSlice", "invalid_ip")
        ),
        (1, 1, 1)
    );
    let watch_errors = |reason: &str| {
        metrics
            .watch_errors
            .get_or_create(&WatchErrorLabels {
                r#type: "Service".into(),
                reason: reason.into(),
            })
            .get()
    };

    // In a watch: the bad version is named, the last good one stays.
    api.apply(service("reviews", json!({"http": 1}))).unwrap();
    eventually("the bad update named", || {
        problems(&registry)
            .iter()
            .any(|p| p.starts_with("Service default/reviews: does not decode"))
    })
    .await;
    assert_eq!(addresses(&registry, "reviews"), ["10.1.0.1"]);
    api.apply(service("reviews", json!([{"name": "http", "port": 9080}])))
        .unwrap();
    eventually("the fixed version clears it", || {
        !problems(&registry)
            .iter()
            .any(|p| p.starts_with("Service default/reviews"))
    })
    .await;

    // A truncated event: reported, and the kind re-listed (what it held is not lost).
    let lists = || {
        api.requests()
            .iter()
            .filter(|r| r.starts_with("GET /api/v1/services?") && !r.contains("watch="))
            .count()
    };
    let before = lists();
    assert!(
        api.send_raw(
            "v1",
            "Service",
            RawWatch::Line(r#"{"type":"ADDED","object":{"metadata":"#.into())
        )
        .unwrap()
            > 0
    );
    eventually("the truncated line reported", || watch_errors("not_json") == 1).await;
    eventually("a re-list", || lists() > before).await;

    // An event of a type Kubernetes does not send: dropped, the watch goes on.
    api.send_raw(
        "v1",
        "Service",
        RawWatch::Line(r#"{"type":"RESIZED","object":{}}"#.into()),
    )
    .unwrap();
    api.apply(slice("reviews", &["10.1.0.1", "10.1.0.3"])).unwrap();
    eventually("changes after it", || addresses(&registry, "reviews").len() == 2).await;
    assert_eq!(watch_errors("unknown_event"), 1);

    // A line that never ends: refused at 16 MiB, the watch restarted, nothing else lost.
    eventually("a Service watch open", || {
        api.requests()
            .iter()
            .filter(|r| r.starts_with("GET /api/v1/services?") && r.contains("watch="))
            .count()
            >= 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    api.send_raw("v1", "Service", RawWatch::Endless { bytes: 40 << 20 })
        .unwrap();
    eventually("the endless line refused", || watch_errors("line_too_long") == 1).await;
    api.apply(service("details", json!([{"name": "http", "port": 9080}])))
        .unwrap();
    eventually("a Service added after it", || {
        registry
            .snapshot()
            .services
            .iter()
            .any(|s| s.attributes.name == "details")
    })
    .await;
    // Once each: a re-list finds the undecodable Service again without reporting it again.
    assert_eq!(
        objects("Service", "undecodable"),
        2,
        "broken once, reviews' bad update once"
    );
}

/// An Istio config object that does not even decode as a Kubernetes object (labels a list) sits
/// between valid ones: the others are served, it is named in the config errors.
#[tokio::test]
async fn istio_config_with_an_undecodable_object_is_served_without_it() {
    let api = FakeApiServer::start().await.unwrap();
    let vs = |name: &str, labels: Value| {
        json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"hosts": [name], "http": [{"route": [{"destination": {"host": name}}]}]}})
    };
    api.apply(vs("a-bad", json!(["app", "reviews"]))).unwrap();
    api.apply(vs("good", json!({"app": "reviews"}))).unwrap();
    let (_dir, client) = client_for(&api).await;
    let kinds = config_sources::crdclient::CONFIG_KINDS.to_vec();
    let source = tokio::time::timeout(
        Duration::from_secs(10),
        config_sources::crdclient::start(client, kinds, WatchMetrics::default(), Vec::new(), None),
    )
    .await
    .expect("the initial lists within 10 s");
    let keys: Vec<String> = source.initial.events.iter().map(|e| e.key().to_string()).collect();
    assert_eq!(keys, ["VirtualService default/good"]);
    let state = source.state.borrow().clone();
    let errors: Vec<&str> = state.errors.iter().map(|e| e.reason.as_str()).collect();
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with(
            "VirtualService default/a-bad: does not decode as a Kubernetes object: invalid type: sequence"
        ),
        "{errors:?}"
    );
    assert_eq!(state.invalid_counts.get("VirtualService"), Some(&1));
}

/// Log lines written while a test runs (`tracing` on this thread).
#[derive(Clone, Default)]
struct Logs(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An API server that floods a watch with events of a type Kubernetes does not send: each is
/// counted in `pilot_k8s_watch_errors{reason="unknown_event"}`, at most a burst of them is
/// logged (monitoring::throttle), and the watch goes on.
#[tokio::test(flavor = "current_thread")]
async fn unknown_watch_events_are_counted_and_their_warnings_rate_limited() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let api = FakeApiServer::start().await.unwrap();
    api.apply(service("reviews", json!([{"name": "http", "port": 9080}])))
        .unwrap();
    let (_dir, client) = client_for(&api).await;
    let metrics = WatchMetrics::default();
    let registry = Arc::new(KubeRegistry::new(Context {
        domain: "cluster.local".into(),
        trust_domain: "cluster.local".into(),
        cluster_id: "Kubernetes".into(),
        system_namespace: "istio-system".into(),
        discovery_selectors: Vec::new(),
    }));
    let (tx, _diffs) = mpsc::unbounded_channel();
    let mut watchers = watch_all(client, registry.clone(), tx, metrics.clone());
    tokio::time::timeout(
        Duration::from_secs(10),
        watchers.synced.wait_for(|s| s.len() == KINDS.len()),
    )
    .await
    .expect("synced within 10 s")
    .unwrap();
    eventually("a Service watch open", || {
        api.requests()
            .iter()
            .any(|r| r.starts_with("GET /api/v1/services?") && r.contains("watch="))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    const SENT: u64 = 40;
    for i in 0..SENT {
        api.send_raw(
            "v1",
            "Service",
            RawWatch::Line(format!(r#"{{"type":"RESIZED-{i}","object":{{}}}}"#)),
        )
        .unwrap();
    }
    api.apply(service("details", json!([{"name": "http", "port": 9080}])))
        .unwrap();
    eventually("a Service added after them", || {
        registry
            .snapshot()
            .services
            .iter()
            .any(|s| s.attributes.name == "details")
    })
    .await;
    let counted = metrics
        .watch_errors
        .get_or_create(&WatchErrorLabels {
            r#type: "Service".into(),
            reason: "unknown_event".into(),
        })
        .get();
    assert_eq!(counted, SENT);
    let text = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    let logged = text
        .lines()
        .filter(|l| l.contains("dropped an event of unknown type"))
        .count();
    assert!(
        (1..=monitoring::throttle::BURST as usize).contains(&logged),
        "{logged} of {SENT} logged:\n{text}"
    );
    assert!(text.contains(r#"unknown type "RESIZED-0""#), "{text}");
}
