//! Pods as workloads: selected by ServiceEntries (Istio's Pod `WorkloadInstance`s), proxy updates
//! when a Pod's labels change, and changes that convert only what they touch.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;

use config_sources::{ConfigChange, ConfigEvent};
use environment::Environment;
use k8s_openapi::api::core::v1::Pod;
use model::{MeshConfig, ServiceKey};
use registry::ServiceEntries;
use serde_json::{Value, json};

use crate::tests::{ctx, endpoint, key, reviews, service, slice};
use crate::{Change, KubeEvent, KubeRegistry};

const LEGACY: &str = "legacy.example.com";

/// A running Pod: ready unless said otherwise, with a named container port.
fn ready_pod(name: &str, ip: &str, labels: Value, ready: bool) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "default", "labels": labels},
        "spec": {"serviceAccountName": "legacy", "containers": [
            {"name": "app", "ports": [{"name": "http", "containerPort": 9080},
                                       {"name": "dns", "containerPort": 53, "protocol": "UDP"}]}]},
        "status": {"phase": "Running", "podIP": ip,
                   "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}}))
    .unwrap()
}

fn selecting_service_entry() -> Arc<model::Config> {
    let v = json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": "legacy", "namespace": "default"},
        "spec": {"hosts": [LEGACY], "location": "MESH_INTERNAL", "resolution": "STATIC",
                 "ports": [{"number": 80, "name": "http", "targetPort": 8080},
                           {"number": 81, "name": "admin", "targetPort": 8081}],
                 "workloadSelector": {"labels": {"app": "legacy"}}}});
    model::testing::config(v)
}

/// A Kubernetes registry, and the environment over it and the ServiceEntry registry that selects
/// its Pods.
fn kube_and_service_entries() -> (Arc<KubeRegistry>, Environment) {
    let kube = Arc::new(KubeRegistry::new(ctx()));
    let mesh = Arc::new(MeshConfig::default());
    let source: Arc<dyn registry::ServiceRegistry> = kube.clone();
    let env = Environment::new(
        mesh.clone(),
        "cluster.local".into(),
        vec![
            Box::new(kube.clone()),
            Box::new(ServiceEntries::with_workloads(
                mesh,
                registry::WorkloadSources::new(vec![source]),
            )),
        ],
    );
    (kube, env)
}

/// As `kube_and_service_entries`, with the ServiceEntry that selects `app: legacy`.
fn setup() -> (Arc<KubeRegistry>, Environment) {
    let (kube, env) = kube_and_service_entries();
    let se = ConfigChange {
        events: vec![ConfigEvent::Added(selecting_service_entry())],
    };
    env.config_changed(&se);
    (kube, env)
}

fn legacy_endpoints(env: &Environment) -> Vec<(String, u16, String)> {
    env.registry()
        .endpoints_of(&ServiceKey::new(LEGACY, "default"))
        .iter()
        .map(|e| (e.address.clone(), e.endpoint_port, e.origin.clone()))
        .collect()
}

#[test]
fn a_service_entry_selects_ready_pods_by_its_workload_selector() {
    let (kube, env) = setup();
    let pod = ready_pod("legacy-1", "10.2.0.1", json!({"app": "legacy"}), true);
    let u = env.services_changed(kube.apply(vec![KubeEvent::Pod(Change::Apply(pod))]));
    // The Pod's named container port `http` wins over the ServiceEntry's targetPort; `admin` has
    // no container port of its name and takes the targetPort.
    let origin = "Pod/default/legacy-1".to_owned();
    assert_eq!(
        legacy_endpoints(&env),
        [
            ("10.2.0.1".to_owned(), 8081, origin.clone()),
            ("10.2.0.1".to_owned(), 9080, origin.clone())
        ]
    );
    let registry = env.registry();
    let e = &registry.endpoints_of(&ServiceKey::new(LEGACY, "default"))[0];
    assert_eq!(e.service_account, "spiffe://cluster.local/ns/default/sa/legacy");
    // Endpoints of a STATIC ServiceEntry moved: EDS only, for that host.
    let push = u.push.unwrap();
    assert!(!push.full);
    assert_eq!(u.proxies, BTreeSet::from(["10.2.0.1".to_owned()]));

    // Not ready any more: no longer an endpoint. Its labels did not change: no proxy update.
    let pod = ready_pod("legacy-1", "10.2.0.1", json!({"app": "legacy"}), false);
    let u = env.services_changed(kube.apply(vec![KubeEvent::Pod(Change::Apply(pod))]));
    assert!(legacy_endpoints(&env).is_empty());
    assert!(u.push.is_some() && u.proxies.is_empty());

    // Ready again, then relabelled out of the selector.
    let pod = ready_pod("legacy-1", "10.2.0.1", json!({"app": "legacy"}), true);
    env.services_changed(kube.apply(vec![KubeEvent::Pod(Change::Apply(pod))]));
    assert_eq!(legacy_endpoints(&env).len(), 2);
    let pod = ready_pod("legacy-1", "10.2.0.1", json!({"app": "other"}), true);
    let u = env.services_changed(kube.apply(vec![KubeEvent::Pod(Change::Apply(pod.clone()))]));
    assert!(legacy_endpoints(&env).is_empty());
    assert_eq!(u.proxies, BTreeSet::from(["10.2.0.1".to_owned()]));

    // Deleted: nothing left, and nothing to do.
    let u = env.services_changed(kube.apply(vec![KubeEvent::Pod(Change::Delete(pod))]));
    assert!(u.push.is_none() && u.proxies.is_empty(), "{u:?}");
}

#[test]
fn a_pod_in_a_namespace_without_selecting_service_entries_changes_nothing_there() {
    let (kube, env) = setup();
    let mut pod = ready_pod("web-1", "10.3.0.1", json!({"app": "legacy"}), true);
    pod.metadata.namespace = Some("other".into());
    let u = env.services_changed(kube.apply(vec![KubeEvent::Pod(Change::Apply(pod))]));
    assert!(u.push.is_none());
    assert!(
        legacy_endpoints(&env).is_empty(),
        "a ServiceEntry selects Pods of its own namespace"
    );
}

#[test]
fn a_change_converts_only_the_services_it_touches() {
    let kube = KubeRegistry::new(ctx());
    let ratings = service(json!({"clusterIP": "10.96.0.11", "ports": [{"name": "http", "port": 9080}]}));
    let mut ratings = ratings;
    ratings.metadata.name = Some("ratings".into());
    let mut ratings_slice = slice("ratings-1", json!([endpoint("10.1.0.9", "ratings-v1", true)]));
    ratings_slice
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("kubernetes.io/service-name".into(), "ratings".into());
    kube.apply(vec![
        KubeEvent::Service(Change::Apply(reviews())),
        KubeEvent::Service(Change::Apply(ratings)),
        KubeEvent::EndpointSlice(Change::Apply(slice(
            "reviews-1",
            json!([endpoint("10.1.0.1", "reviews-v1", true)]),
        ))),
        KubeEvent::EndpointSlice(Change::Apply(ratings_slice)),
    ]);
    let ratings_key = ServiceKey::new("ratings.default.svc.cluster.local", "default");
    let before = kube.snapshot();

    // A Pod named by the ratings slice only: ratings' endpoints are converted again (its labels
    // moved), reviews' are the same objects as before.
    let pod = ready_pod("ratings-v1", "10.1.0.9", json!({"app": "ratings"}), true);
    let d = kube.apply(vec![KubeEvent::Pod(Change::Apply(pod))]);
    assert_eq!(d.endpoints_changed, BTreeSet::from([ratings_key.clone()]));
    let after = kube.snapshot();
    assert!(Arc::ptr_eq(
        before.endpoints.get(&key()).unwrap(),
        after.endpoints.get(&key()).unwrap()
    ));

    // A slice moving from one Service to the other changes both.
    let mut moved = slice("reviews-1", json!([endpoint("10.1.0.1", "reviews-v1", true)]));
    moved
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("kubernetes.io/service-name".into(), "ratings".into());
    let d = kube.apply(vec![KubeEvent::EndpointSlice(Change::Apply(moved))]);
    assert_eq!(d.endpoints_changed, BTreeSet::from([key(), ratings_key.clone()]));
    assert!(kube.snapshot().endpoints_of(&key()).is_empty());
    assert_eq!(kube.snapshot().endpoints_of(&ratings_key).len(), 2);
}

/// Snapshots made change by change (the registry's, and the environment's union with the
/// ServiceEntry registry) equal the ones built from the final objects at once.
#[test]
fn incremental_snapshots_equal_a_rebuild() {
    let (kube, env) = setup();
    let svc = |name: &str, ip: &str| {
        let mut s = service(json!({"clusterIP": ip, "ports": [{"name": "http", "port": 9080}]}));
        s.metadata.name = Some(name.into());
        s
    };
    let slice_of = |name: &str, service: &str, ips: &[&str]| {
        let eps: Vec<Value> = ips.iter().map(|ip| endpoint(ip, &format!("p-{ip}"), true)).collect();
        let mut s = slice(name, Value::Array(eps));
        let labels = s.metadata.labels.as_mut().unwrap();
        labels.insert("kubernetes.io/service-name".into(), service.into());
        s
    };
    let steps = vec![
        KubeEvent::Service(Change::Apply(svc("a", "10.96.0.1"))),
        KubeEvent::Service(Change::Apply(svc("b", "10.96.0.2"))),
        KubeEvent::EndpointSlice(Change::Apply(slice_of("a-1", "a", &["10.1.0.1", "10.1.0.2"]))),
        KubeEvent::EndpointSlice(Change::Apply(slice_of("b-1", "b", &["10.1.0.3"]))),
        KubeEvent::Pod(Change::Apply(ready_pod(
            "legacy-1",
            "10.2.0.1",
            json!({"app": "legacy"}),
            true,
        ))),
        KubeEvent::EndpointSlice(Change::Apply(slice_of("a-1", "a", &["10.1.0.2"]))),
        KubeEvent::Service(Change::Apply(svc("c", "10.96.0.3"))),
        KubeEvent::EndpointSlice(Change::Apply(slice_of("c-1", "c", &["10.1.0.9"]))),
        KubeEvent::Service(Change::Delete(svc("b", "10.96.0.2"))),
        KubeEvent::EndpointSlice(Change::Delete(slice_of("a-1", "a", &[]))),
        KubeEvent::Pod(Change::Apply(ready_pod(
            "legacy-2",
            "10.2.0.2",
            json!({"app": "legacy"}),
            true,
        ))),
    ];
    for e in steps.clone() {
        env.services_changed(kube.apply(vec![e]));
    }
    let (fresh, fresh_env) = setup();
    fresh_env.services_changed(fresh.apply(steps));
    assert_eq!(*kube.snapshot(), *fresh.snapshot());
    assert_eq!(*env.registry(), *fresh_env.registry());
    assert_eq!(legacy_endpoints(&env).len(), 4, "two Pods, two ports");
    let hosts: Vec<String> = env.registry().services.iter().map(|s| s.hostname.clone()).collect();
    assert_eq!(
        hosts,
        ["a.default.svc.cluster.local", "c.default.svc.cluster.local", LEGACY]
    );
}

/// A ServiceEntry created after its Pods selects them at once: Pods are asked for, not copied.
#[test]
fn a_service_entry_added_later_selects_the_pods_already_there() {
    let (kube, env) = kube_and_service_entries();
    let pod = ready_pod("legacy-1", "10.2.0.1", json!({"app": "legacy"}), true);
    env.services_changed(kube.apply(vec![KubeEvent::Pod(Change::Apply(pod))]));
    let u = env.config_changed(&ConfigChange {
        events: vec![ConfigEvent::Added(selecting_service_entry())],
    });
    assert!(u.push.is_some_and(|p| p.full));
    assert_eq!(legacy_endpoints(&env).len(), 2);
}
