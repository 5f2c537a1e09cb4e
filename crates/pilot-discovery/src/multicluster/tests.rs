//! Remote clusters against fake API servers: secrets that add, rotate and remove clusters, the
//! secrets istiod ignores, and rotation that leaves no tasks or memory behind.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use environment::Environment;
use model::ServiceKey;
use prometheus_client::registry::Registry;
use registry::ServiceEntries;
use serde_json::{Value, json};
use test_support::kube_api::FakeApiServer;
use xds_server::DiscoveryServer;

use super::sources::cluster_id;
use super::*;

const HOST: &str = "web.shop.svc.cluster.local";

fn service() -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop"},
        "spec": {"clusterIP": "10.96.0.10", "selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
}

fn slice(ip: &str) -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-abc", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}],
        "ports": [{"name": "http", "port": 8080}]})
}

/// A remote cluster: a fake API server with `web.shop` at one Pod IP.
async fn cluster(ip: &str) -> FakeApiServer {
    let api = FakeApiServer::start().await.unwrap();
    api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop"}}))
        .unwrap();
    api.apply(service()).unwrap();
    api.apply(slice(ip)).unwrap();
    api
}

fn kubeconfig(api: &FakeApiServer, token: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    api.write_kubeconfig_with_token(&path, token).unwrap();
    std::fs::read(path).unwrap()
}

struct Fixture {
    environment: Arc<Environment>,
    mc: Multicluster,
    metrics: Metrics,
}

fn fixture(timeout: Duration) -> Fixture {
    let mesh = Arc::new(model::MeshConfig::default());
    // ServiceEntries select the Pods of every cluster, as pilot-discovery's.
    let sources = registry::WorkloadSources::default();
    let environment = Arc::new(
        Environment::new(
            mesh.clone(),
            "cluster.local".into(),
            vec![Box::new(ServiceEntries::with_workloads(mesh, sources.clone()))],
        )
        .with_workload_sources(sources),
    );
    let mut registry = Registry::default();
    let server = DiscoveryServer::new(environment.clone(), Default::default(), &mut registry);
    let metrics = Metrics::register(&mut registry);
    let mc = Multicluster::new(Served {
        environment: environment.clone(),
        server,
        context: kube_registry::Context {
            domain: "cluster.local".into(),
            trust_domain: "cluster.local".into(),
            cluster_id: "config".into(),
            system_namespace: "istio-system".into(),
            discovery_selectors: Vec::new(),
        },
        watch_metrics: WatchMetrics::default(),
        metrics: metrics.clone(),
        timeout,
    });
    Fixture {
        environment,
        mc,
        metrics,
    }
}

/// The endpoints of `web.shop` as `ip@cluster`.
fn endpoints(e: &Environment) -> Vec<String> {
    let r = e.registry();
    let key = ServiceKey::new(HOST, "shop");
    r.endpoints_of(&key)
        .iter()
        .map(|x| format!("{}@{}", x.address, x.cluster_id))
        .collect()
}

async fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < Duration::from_secs(10), "not within 10 s: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn set(key: &str, clusters: &[(&str, Vec<u8>)]) -> RemoteConfig {
    RemoteConfig::Set {
        key: key.into(),
        clusters: clusters.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect(),
    }
}

fn errors(m: &Metrics, reason: &str) -> u64 {
    m.errors.get_or_create(&ErrorLabels { reason: reason.into() }).get()
}

#[tokio::test]
async fn remote_secrets_add_rotate_and_remove_clusters() {
    let (east, west) = (cluster("10.2.0.1").await, cluster("10.3.0.1").await);
    let f = fixture(Duration::from_secs(5));

    f.mc.apply(set(
        "istio-system/istio-remote-secret-east",
        &[("east", kubeconfig(&east, "t1"))],
    ))
    .await;
    f.mc.wait_synced().await;
    assert_eq!(endpoints(&f.environment), ["10.2.0.1@east"]);
    assert_eq!(f.environment.clusters(), ["east"]);
    let svc = f.environment.registry().service(HOST, "shop").cloned().unwrap();
    assert_eq!(svc.addresses_for("east"), ["10.96.0.10"]);
    let info = f.mc.debug_info(true);
    assert_eq!(
        info[1],
        DebugInfo {
            id: "east".into(),
            secret_name: "istio-system/istio-remote-secret-east".into(),
            sync_status: "synced".into()
        }
    );
    assert_eq!(info[0].id, "config");

    // Scaling in the remote cluster moves its endpoints.
    east.apply(slice("10.2.0.2")).unwrap();
    eventually("the new Pod IP", || endpoints(&f.environment) == ["10.2.0.2@east"]).await;

    // What istiod ignores: the config cluster's ID, an ID another secret registered, a kubeconfig
    // that does not load. The cluster served is not disturbed.
    f.mc.apply(set("istio-system/local", &[("config", kubeconfig(&west, "t"))]))
        .await;
    f.mc.apply(set("istio-system/twin", &[("east", kubeconfig(&west, "t"))]))
        .await;
    f.mc.apply(set("istio-system/broken", &[("south", b"clusters: [".to_vec())]))
        .await;
    assert_eq!(errors(&f.metrics, "local_cluster"), 1);
    assert_eq!(errors(&f.metrics, "duplicate_cluster"), 1);
    assert_eq!(errors(&f.metrics, "invalid_kubeconfig"), 1);
    assert_eq!(f.environment.clusters(), ["east"]);
    assert_eq!(endpoints(&f.environment), ["10.2.0.2@east"]);

    // The same secret read again changes nothing; new credentials (here: another server) replace
    // the cluster's registry once the new one has synced.
    f.mc.apply(set(
        "istio-system/istio-remote-secret-east",
        &[("east", kubeconfig(&east, "t1"))],
    ))
    .await;
    assert_eq!(f.environment.clusters(), ["east"]);
    f.mc.apply(set(
        "istio-system/istio-remote-secret-east",
        &[("east", kubeconfig(&west, "t2"))],
    ))
    .await;
    f.mc.wait_synced().await;
    eventually("the rotated cluster's endpoints", || {
        endpoints(&f.environment) == ["10.3.0.1@east"]
    })
    .await;
    assert_eq!(f.environment.clusters(), ["east"]);

    // A second cluster in a second secret: a service of both is one, with the endpoints of both.
    f.mc.apply(set(
        "istio-system/istio-remote-secret-north",
        &[("north", kubeconfig(&east, "t"))],
    ))
    .await;
    f.mc.wait_synced().await;
    assert_eq!(endpoints(&f.environment), ["10.3.0.1@east", "10.2.0.2@north"]);

    // Deleting a secret removes that cluster's endpoints and nothing else.
    f.mc.apply(RemoteConfig::Deleted {
        key: "istio-system/istio-remote-secret-east".into(),
    })
    .await;
    assert_eq!(endpoints(&f.environment), ["10.2.0.2@north"]);
    assert_eq!(f.environment.clusters(), ["north"]);
    // A re-list without it removes the other.
    f.mc.apply(RemoteConfig::Replace(Vec::new())).await;
    assert!(endpoints(&f.environment).is_empty());
    assert!(f.environment.clusters().is_empty());
    assert_eq!(f.mc.debug_info(true).len(), 1);
}

#[tokio::test]
async fn an_unreachable_cluster_times_out_and_holds_up_nothing_else() {
    let east = cluster("10.2.0.1").await;
    let f = fixture(Duration::from_millis(500));
    // Nothing listens there.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let unreachable = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: dead\n  cluster: {{server: \"http://{dead}\"}}\n\
         contexts:\n- name: dead\n  context: {{cluster: dead, user: u}}\ncurrent-context: dead\nusers:\n- name: u\n  user: {{token: t}}\n"
    );
    f.mc.apply(RemoteConfig::Replace(vec![
        (
            "istio-system/dead".into(),
            BTreeMap::from([("dead".to_owned(), unreachable.into_bytes())]),
        ),
        (
            "istio-system/east".into(),
            BTreeMap::from([("east".to_owned(), kubeconfig(&east, "t"))]),
        ),
    ]))
    .await;
    tokio::time::timeout(Duration::from_secs(10), f.mc.wait_synced())
        .await
        .expect("start-up waits no longer than the timeout");
    assert_eq!(endpoints(&f.environment), ["10.2.0.1@east"]);
    let status: BTreeMap<String, String> =
        f.mc.debug_info(true)
            .into_iter()
            .map(|d| (d.id, d.sync_status))
            .collect();
    assert_eq!(status["dead"], "timeout");
    assert_eq!(status["east"], "synced");
    assert_eq!(f.metrics.sync_timeouts.get(), 1);
}

#[test]
fn the_cluster_id_of_a_kubeconfig_file_is_its_current_contexts_cluster() {
    let kc = |current: &str| {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: b\n  cluster: {{server: \"https://b\"}}\n- name: a\n  cluster: {{server: \"https://a\"}}\n\
             contexts:\n- name: y\n  context: {{cluster: b, user: u}}\n- name: x\n  context: {{cluster: a, user: u}}\n{current}users:\n- name: u\n  user: {{token: t}}\n"
        )
    };
    assert_eq!(cluster_id(kc("current-context: y\n").as_bytes()).unwrap(), "b");
    // Else the first context by name, then the first cluster by name.
    assert_eq!(cluster_id(kc("").as_bytes()).unwrap(), "a");
    let clusters_only = "apiVersion: v1\nkind: Config\nclusters:\n- name: z\n  cluster: {server: \"https://z\"}\n- name: m\n  cluster: {server: \"https://m\"}\n";
    assert_eq!(cluster_id(clusters_only.as_bytes()).unwrap(), "m");
    assert!(cluster_id(b"apiVersion: v1\nkind: Config\n").is_err());
    assert!(cluster_id(b"clusters: [").is_err());
}

/// Istio #57269: rotating a remote secret leaked memory. Here 100 rotations leave the task count
/// where it was (within a few connection tasks still closing) and the resident memory within a
/// few MiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_a_remote_secret_100_times_leaves_tasks_and_memory_flat() {
    let east = cluster("10.2.0.1").await;
    let f = fixture(Duration::from_secs(5));
    let rotate = |i: usize| {
        set(
            "istio-system/east",
            &[("east", kubeconfig(&east, &format!("token-{i}")))],
        )
    };
    // Warm up (allocator pools, connection pools), then measure.
    for i in 0..10 {
        f.mc.apply(rotate(i)).await;
        f.mc.wait_synced().await;
    }
    let tasks = || tokio::runtime::Handle::current().metrics().num_alive_tasks();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (tasks_before, rss_before) = (tasks(), rss_kib());
    for i in 10..110 {
        f.mc.apply(rotate(i)).await;
        f.mc.wait_synced().await;
    }
    assert_eq!(endpoints(&f.environment), ["10.2.0.1@east"]);
    // The aborted runs' tasks end at their next poll.
    let mut tasks_after = tasks();
    let t0 = Instant::now();
    while tasks_after > tasks_before && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        tasks_after = tasks();
    }
    let rss_after = rss_kib();
    eprintln!(
        "100 rotations: tasks {tasks_before} -> {tasks_after}, resident {rss_before} KiB -> {rss_after} KiB ({:+} KiB)",
        rss_after as i64 - rss_before as i64
    );
    // A leaking rotation leaves ~27 tasks behind each time (its watchers, informers and
    // connections): 100 rotations may leave a few in-flight connection tasks, not thousands.
    assert!(
        tasks_after <= tasks_before + 10,
        "tasks {tasks_before} -> {tasks_after}"
    );
    assert!(
        rss_after < rss_before + 16 * 1024,
        "resident memory grew by {} KiB over 100 rotations",
        rss_after - rss_before
    );
}

/// This process's resident set, in KiB (Linux).
fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4
}

#[tokio::test]
async fn a_kubeconfig_directory_names_a_cluster_per_file_and_is_followed() {
    let (east, west) = (cluster("10.2.0.1").await, cluster("10.3.0.1").await);
    let dir = tempfile::tempdir().unwrap();
    // A mounted Secret's files: `..data` and other hidden entries are skipped.
    std::fs::write(dir.path().join("east"), kubeconfig(&east, "t")).unwrap();
    std::fs::write(dir.path().join("broken"), b"clusters: [").unwrap();
    std::fs::write(dir.path().join("..data"), b"ignored").unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    sources::watch_directory(dir.path().to_path_buf(), tx);
    let next = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<RemoteConfig>| {
        let got = rx.try_recv();
        got.ok()
    };
    let first = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    let RemoteConfig::Replace(all) = &first else {
        panic!("{first:?}")
    };
    // The fake API server's kubeconfig names its cluster `fake`: the file's cluster ID.
    let ids: Vec<(&str, Vec<&String>)> = all.iter().map(|(k, c)| (k.as_str(), c.keys().collect())).collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert!(ids[0].0.ends_with("/east"));
    let f = fixture(Duration::from_secs(5));
    f.mc.apply(first).await;
    f.mc.wait_synced().await;
    assert_eq!(endpoints(&f.environment).len(), 1);
    assert!(endpoints(&f.environment)[0].starts_with("10.2.0.1@"));

    // The file's contents change: the cluster follows; the directory read again.
    std::fs::write(dir.path().join("east"), kubeconfig(&west, "t")).unwrap();
    let changed = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    f.mc.apply(changed).await;
    f.mc.wait_synced().await;
    eventually("the new file's cluster", || {
        endpoints(&f.environment)
            .first()
            .is_some_and(|e| e.starts_with("10.3.0.1@"))
    })
    .await;
    // Nothing changes: nothing is sent.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(next(&mut rx), None);
    // The file goes: its cluster leaves.
    std::fs::remove_file(dir.path().join("east")).unwrap();
    let gone = tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .unwrap()
        .unwrap();
    f.mc.apply(gone).await;
    assert!(endpoints(&f.environment).is_empty());
}

#[tokio::test]
async fn a_service_entry_selects_the_pods_of_a_remote_cluster() {
    let east = cluster("10.2.0.1").await;
    east.apply(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "legacy-1", "namespace": "shop", "labels": {"app": "legacy"}},
        "spec": {"serviceAccountName": "legacy", "containers": [{"name": "app", "image": "app",
                 "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": "10.2.0.7", "podIPs": [{"ip": "10.2.0.7"}],
                   "conditions": [{"type": "Ready", "status": "True"}]}}))
        .unwrap();
    let f = fixture(Duration::from_secs(5));
    let se = model::config::parse_config(
        json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": "legacy", "namespace": "shop"},
            "spec": {"hosts": ["legacy.example.com"], "location": "MESH_INTERNAL", "resolution": "STATIC",
                     "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                     "workloadSelector": {"labels": {"app": "legacy"}}}}),
        "default",
    )
    .unwrap();
    let _ = f.environment.config_changed(&model::ConfigChange {
        events: vec![model::ConfigEvent::Added(Arc::new(se))],
    });
    let legacy = |e: &Environment| -> Vec<String> {
        let key = ServiceKey::new("legacy.example.com", "shop");
        e.registry()
            .endpoints_of(&key)
            .iter()
            .map(|x| format!("{}:{}", x.address, x.endpoint_port))
            .collect()
    };
    assert!(legacy(&f.environment).is_empty());
    // The cluster joins: its Pod is selected.
    f.mc.apply(set("istio-system/east", &[("east", kubeconfig(&east, "t"))]))
        .await;
    f.mc.wait_synced().await;
    assert_eq!(legacy(&f.environment), ["10.2.0.7:8080"]);
    // A Pod that comes later in that cluster too.
    east.apply(json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "legacy-2", "namespace": "shop", "labels": {"app": "legacy"}},
        "spec": {"containers": [{"name": "app", "image": "app", "ports": [{"name": "http", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": "10.2.0.8", "podIPs": [{"ip": "10.2.0.8"}],
                   "conditions": [{"type": "Ready", "status": "True"}]}}))
        .unwrap();
    eventually("the second Pod", || legacy(&f.environment).len() == 2).await;
    // It leaves: its Pods are not selected any more.
    f.mc.apply(RemoteConfig::Deleted {
        key: "istio-system/east".into(),
    })
    .await;
    assert!(legacy(&f.environment).is_empty());
}
