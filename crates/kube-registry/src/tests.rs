//! The Kubernetes registry, object by object: conversion as Istio's, and what each change does
//! (full push for a service, EDS for endpoints, nothing for a no-op).
#![allow(clippy::unwrap_used)]

use k8s_openapi::api::core::v1::{Node, Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use model::{Protocol, Resolution, ServiceKey};
use serde_json::{Value, json};

use crate::{Change, Context, KubeEvent, KubeRegistry};

const HOST: &str = "reviews.default.svc.cluster.local";

pub(crate) fn ctx() -> Context {
    Context {
        domain: "cluster.local".into(),
        trust_domain: "cluster.local".into(),
        cluster_id: "Kubernetes".into(),
        system_namespace: "istio-system".into(),
        discovery_selectors: Vec::new(),
    }
}

pub(crate) fn service(spec: Value) -> KubeService {
    serde_json::from_value(json!({"metadata": {"name": "reviews", "namespace": "default",
        "annotations": {"networking.istio.io/exportTo": "., istio-system"}}, "spec": spec}))
    .unwrap()
}

pub(crate) fn reviews() -> KubeService {
    service(json!({"clusterIP": "10.96.0.10", "selector": {"app": "reviews"},
        "ports": [{"name": "http", "port": 9080, "targetPort": "web"},
                  {"name": "grpc-api", "port": 9090},
                  {"name": "metrics", "port": 9100, "appProtocol": "http"},
                  {"name": "dns", "port": 53, "protocol": "UDP"}]}))
}

pub(crate) fn slice(name: &str, endpoints: Value) -> EndpointSlice {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default",
        "labels": {"kubernetes.io/service-name": "reviews"}},
        "addressType": "IPv4", "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080}, {"name": "grpc-api", "port": 9090}]}))
    .unwrap()
}

pub(crate) fn endpoint(ip: &str, pod: &str, ready: bool) -> Value {
    json!({"addresses": [ip], "conditions": {"ready": ready}, "targetRef": {"kind": "Pod", "name": pod, "namespace": "default"}})
}

pub(crate) fn pod(name: &str, version: &str, node: &str) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default",
        "labels": {"app": "reviews", "version": version, "security.istio.io/tlsMode": "istio"}},
        "spec": {"serviceAccountName": "bookinfo-reviews", "nodeName": node, "containers": []},
        "status": {"podIP": "10.1.0.1"}}))
    .unwrap()
}

fn node(name: &str, zone: &str) -> Node {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": {
        "topology.kubernetes.io/region": "us-east1", "topology.kubernetes.io/zone": zone}}}))
    .unwrap()
}

pub(crate) fn key() -> ServiceKey {
    ServiceKey::new(HOST, "default")
}

use model::service::TrafficDistribution;

#[test]
fn a_service_converts_as_istios() {
    let r = KubeRegistry::new(ctx());
    let diff = r.apply(vec![KubeEvent::Service(Change::Apply(reviews()))]);
    assert!(diff.services_changed.contains(&key()));
    let snap = r.snapshot();
    let s = snap.service(HOST, "default").unwrap();
    assert_eq!(s.addresses, ["10.96.0.10"]);
    assert_eq!(s.resolution, Resolution::ClientSideLb);
    let protocols: Vec<(u16, Protocol)> = s.ports.iter().map(|p| (p.port, p.protocol)).collect();
    assert_eq!(
        protocols,
        [
            (9080, Protocol::Http),
            (9090, Protocol::Grpc),
            (9100, Protocol::Http),
            (53, Protocol::Udp)
        ]
    );
    assert_eq!(s.attributes.service_registry, "Kubernetes");
    assert_eq!(s.attributes.cluster_id, "Kubernetes");
    assert_eq!(s.origin, "Service/default/reviews (Kubernetes)");
    assert_eq!(s.attributes.label_selectors["app"], "reviews");
    assert_eq!(s.attributes.export_to.len(), 2);
    assert_eq!(s.attributes.traffic_distribution, TrafficDistribution::Any);

    let close = service(json!({"trafficDistribution": "PreferClose", "ports": [{"name": "http", "port": 9080}]}));
    r.apply(vec![KubeEvent::Service(Change::Apply(close))]);
    let snap = r.snapshot();
    assert_eq!(
        snap.service(HOST, "default").unwrap().attributes.traffic_distribution,
        TrafficDistribution::PreferSameZone
    );

    let headless = service(json!({"clusterIP": "None", "ports": [{"name": "tcp", "port": 3306}]}));
    r.apply(vec![KubeEvent::Service(Change::Apply(headless))]);
    let snap = r.snapshot();
    let s = snap.service(HOST, "default").unwrap();
    assert!(s.addresses.is_empty());
    assert_eq!(s.resolution, Resolution::Passthrough);

    let external = service(json!({"type": "ExternalName", "externalName": "reviews.example.com",
        "ports": [{"name": "https", "port": 443}]}));
    r.apply(vec![KubeEvent::Service(Change::Apply(external))]);
    let snap = r.snapshot();
    let s = snap.service(HOST, "default").unwrap();
    assert!(s.mesh_external);
    assert_eq!(s.resolution, Resolution::DnsLb);
    assert_eq!(snap.endpoints_of(&key())[0].address, "reviews.example.com");
}

#[test]
fn endpoints_come_from_slices_with_their_pods_and_nodes() {
    let r = KubeRegistry::new(ctx());
    r.apply(vec![
        KubeEvent::Node(Change::Replace(vec![node("n1", "us-east1-b")])),
        KubeEvent::Pod(Change::Replace(vec![pod("reviews-v1", "v1", "n1")])),
        KubeEvent::Service(Change::Replace(vec![reviews()])),
        KubeEvent::EndpointSlice(Change::Replace(vec![slice(
            "reviews-abc",
            json!([
                endpoint("10.1.0.1", "reviews-v1", true),
                endpoint("10.1.0.2", "reviews-v2", false)
            ]),
        )])),
    ]);
    let snap = r.snapshot();
    let eps = snap.endpoints_of(&key());
    // Ready endpoint only, on the ports the slice serves (http's targetPort resolved to 8080).
    let got: Vec<(&str, u16, &str)> = eps
        .iter()
        .map(|e| (e.address.as_str(), e.endpoint_port, e.service_port_name.as_str()))
        .collect();
    assert_eq!(got, [("10.1.0.1", 9090, "grpc-api"), ("10.1.0.1", 8080, "http")]);
    let e = &eps[0];
    assert_eq!(e.labels["version"], "v1");
    assert_eq!(e.labels["security.istio.io/tlsMode"], "istio");
    assert_eq!(
        e.service_account,
        "spiffe://cluster.local/ns/default/sa/bookinfo-reviews"
    );
    assert_eq!(e.locality.to_string(), "us-east1/us-east1-b/");
    assert_eq!(e.labels["topology.kubernetes.io/zone"], "us-east1-b");
}

/// Istio's `Network` of a Kubernetes endpoint: its Pod's `topology.istio.io/network` label, else
/// the label of the cluster's system namespace, followed when that namespace changes; the
/// endpoint carries its cluster's `topology.istio.io/cluster` label.
#[test]
fn an_endpoints_network_is_its_pods_else_the_system_namespaces() {
    let r = KubeRegistry::new(ctx());
    let system = |network: &str| -> k8s_openapi::api::core::v1::Namespace {
        serde_json::from_value(
            json!({"metadata": {"name": "istio-system", "labels": {"topology.istio.io/network": network}}}),
        )
        .unwrap()
    };
    let mut labelled = pod("reviews-v2", "v2", "n1");
    labelled
        .metadata
        .labels
        .get_or_insert_default()
        .insert("topology.istio.io/network".into(), "pod-net".into());
    r.apply(vec![
        KubeEvent::Namespace(Change::Replace(vec![system("net-1")])),
        KubeEvent::Pod(Change::Replace(vec![pod("reviews-v1", "v1", "n1"), labelled])),
        KubeEvent::Service(Change::Replace(vec![reviews()])),
        KubeEvent::EndpointSlice(Change::Replace(vec![slice(
            "reviews-abc",
            json!([
                endpoint("10.1.0.1", "reviews-v1", true),
                endpoint("10.1.0.2", "reviews-v2", true)
            ]),
        )])),
    ]);
    let networks = |r: &KubeRegistry| -> Vec<(String, String)> {
        let snap = r.snapshot();
        snap.endpoints_of(&key())
            .iter()
            .filter(|e| e.service_port_name == "http")
            .map(|e| (e.address.clone(), e.network.clone()))
            .collect()
    };
    let want = |system: &str| {
        vec![
            ("10.1.0.1".to_owned(), system.to_owned()),
            ("10.1.0.2".to_owned(), "pod-net".to_owned()),
        ]
    };
    assert_eq!(networks(&r), want("net-1"));
    let snap = r.snapshot();
    let e = &snap.endpoints_of(&key())[0];
    assert_eq!(e.labels["topology.istio.io/cluster"], "Kubernetes");
    assert_eq!(e.cluster_id, "Kubernetes");
    // The system namespace's label changes: the endpoints follow, with an EDS push.
    let diff = r.apply(vec![KubeEvent::Namespace(Change::Apply(system("net-2")))]);
    assert!(diff.endpoints_changed.contains(&key()), "{diff:?}");
    assert_eq!(networks(&r), want("net-2"));
}

#[test]
fn changes_push_what_they_change() {
    let r = KubeRegistry::new(ctx());
    r.apply(vec![
        KubeEvent::Service(Change::Apply(reviews())),
        KubeEvent::Pod(Change::Apply(pod("reviews-v1", "v1", "n1"))),
    ]);
    // A slice: endpoints only.
    let d = r.apply(vec![KubeEvent::EndpointSlice(Change::Apply(slice(
        "s",
        json!([endpoint("10.1.0.1", "reviews-v1", true)]),
    )))]);
    assert!(d.services_changed.is_empty());
    assert!(d.endpoints_changed.contains(&key()));
    // The same slice again: nothing.
    let d = r.apply(vec![KubeEvent::EndpointSlice(Change::Apply(slice(
        "s",
        json!([endpoint("10.1.0.1", "reviews-v1", true)]),
    )))]);
    assert!(d.is_empty(), "{d:?}");
    // The Pod's labels change: its endpoints change.
    let d = r.apply(vec![KubeEvent::Pod(Change::Apply(pod("reviews-v1", "v2", "n1")))]);
    assert!(d.endpoints_changed.contains(&key()) && d.services_changed.is_empty());
    assert_eq!(r.snapshot().endpoints_of(&key())[0].labels["version"], "v2");
    // Scaling to zero ready endpoints.
    let d = r.apply(vec![KubeEvent::EndpointSlice(Change::Apply(slice(
        "s",
        json!([endpoint("10.1.0.1", "reviews-v1", false)]),
    )))]);
    assert!(d.endpoints_changed.contains(&key()));
    assert!(r.snapshot().endpoints_of(&key()).is_empty());
    // The Service goes: a full push.
    let d = r.apply(vec![KubeEvent::Service(Change::Delete(reviews()))]);
    assert!(d.services_changed.contains(&key()));
    assert!(r.snapshot().services.is_empty());
}

#[test]
fn not_ready_endpoints_are_kept_when_the_service_publishes_them() {
    let r = KubeRegistry::new(ctx());
    let mut svc = reviews();
    svc.spec.as_mut().unwrap().publish_not_ready_addresses = Some(true);
    r.apply(vec![
        KubeEvent::Service(Change::Apply(svc)),
        KubeEvent::EndpointSlice(Change::Apply(slice("s", json!([endpoint("10.1.0.2", "p", false)])))),
    ]);
    assert_eq!(r.snapshot().endpoints_of(&key()).len(), 2);
}

#[test]
fn a_proxy_without_labels_gets_its_pods_labels_and_its_nodes_locality() {
    use registry::ServiceRegistry;
    let r = KubeRegistry::new(ctx());
    r.apply(vec![
        KubeEvent::Node(Change::Apply(node("n1", "us-east1-b"))),
        KubeEvent::Pod(Change::Apply(pod("reviews-v1", "v1", "n1"))),
    ]);
    let w = r.workload("10.1.0.1", "other.default", "default").expect("by IP");
    assert_eq!(w.labels["version"], "v1");
    // Istio's AugmentLabels: the cluster and the locality as labels too.
    assert_eq!(w.labels["topology.istio.io/cluster"], "Kubernetes");
    assert_eq!(w.labels["topology.kubernetes.io/zone"], "us-east1-b");
    assert_eq!(w.locality, "us-east1/us-east1-b/");
    assert!(
        r.workload("10.9.9.9", "reviews-v1.default", "default").is_some(),
        "by the Pod its ID names"
    );
    assert!(r.workload("10.9.9.9", "nobody.default", "default").is_none());
    // A Pod at the proxy's IP but in another namespace is not the proxy's (host network).
    assert!(r.workload("10.1.0.1", "gw.istio-system", "istio-system").is_none());
    // The ID wins over the IP: another Pod sharing the IP (host network) is not taken.
    r.apply(vec![KubeEvent::Pod(Change::Apply(pod("reviews-v2", "v2", "n1")))]);
    let w = r.workload("10.1.0.1", "reviews-v1.default", "default").unwrap();
    assert_eq!(w.labels["version"], "v1");

    // Through the environment, as a proxy connects.
    let mesh = std::sync::Arc::new(model::MeshConfig::default());
    let r = std::sync::Arc::new(r);
    let env = environment::Environment::new(mesh, "cluster.local".into(), vec![Box::new(r.clone())]);
    let md = model::proxy::NodeMetadata::from_json("x", &json!({"NAMESPACE": "default"})).unwrap();
    let mut proxy = model::Proxy::parse("sidecar~10.1.0.1~reviews-v1.default~default.svc.cluster.local", md).unwrap();
    xds_server::SnapshotBuilder::init_proxy(&env, &mut proxy);
    assert_eq!(proxy.labels["app"], "reviews");
    assert_eq!(proxy.locality.zone, "us-east1-b");
    // The Pod is deleted: nothing found any more.
    r.apply(vec![
        KubeEvent::Pod(Change::Delete(pod("reviews-v1", "v1", "n1"))),
        KubeEvent::Pod(Change::Delete(pod("reviews-v2", "v2", "n1"))),
    ]);
    assert!(r.workload("10.1.0.1", "x.default", "default").is_none());
}

#[test]
fn discovery_selectors_limit_the_namespaces_served_and_follow_their_labels() {
    use k8s_openapi::api::core::v1::Namespace;
    let mut c = ctx();
    c.discovery_selectors =
        vec![serde_json::from_value(json!({"matchLabels": {"istio-discovery": "enabled"}})).unwrap()];
    let r = KubeRegistry::new(c);
    let ns = |labels: Value| -> Namespace {
        serde_json::from_value(json!({"metadata": {"name": "default", "labels": labels}})).unwrap()
    };
    r.apply(vec![
        KubeEvent::Namespace(Change::Apply(ns(json!({})))),
        KubeEvent::Service(Change::Apply(reviews())),
    ]);
    assert!(r.snapshot().services.is_empty(), "default is not selected");
    // Labelled live: the namespace's services appear, as a service change.
    let d = r.apply(vec![KubeEvent::Namespace(Change::Apply(ns(
        json!({"istio-discovery": "enabled"}),
    )))]);
    assert!(d.services_changed.contains(&key()));
    assert_eq!(r.snapshot().services.len(), 1);
    let d = r.apply(vec![KubeEvent::Namespace(Change::Apply(ns(json!({}))))]);
    assert!(d.services_changed.contains(&key()));
    assert!(r.snapshot().services.is_empty());
}
