//! A sidecar's service instances come from its Pod and the Services selecting it, as Istio's
//! `GetProxyServiceTargets`: from the first push, before the Pod is ready and its endpoint is, and
//! again when a Service selecting it changes (a proxy update).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::sync::Arc;

use environment::Environment;
use k8s_openapi::api::core::v1::Pod;
use model::{MeshConfig, TriggerReason};
use serde_json::{Value, json};
use xds_server::SnapshotBuilder;

use crate::tests::{ctx, endpoint, reviews, service, slice};
use crate::{Change, KubeEvent, KubeRegistry};

fn pod(labels: Value) -> Pod {
    serde_json::from_value(json!({"metadata": {"name": "reviews-v1", "namespace": "default", "labels": labels},
        "spec": {"serviceAccountName": "reviews", "containers": [{"name": "app", "ports": [{"name": "web", "containerPort": 8080}]}]},
        "status": {"phase": "Running", "podIP": "10.1.0.1", "conditions": [{"type": "Ready", "status": "False"}]}}))
    .unwrap()
}

fn proxy(env: &Environment) -> model::Proxy {
    let md = model::proxy::NodeMetadata::from_json("x", &json!({"NAMESPACE": "default"})).unwrap();
    let mut proxy = model::Proxy::parse("sidecar~10.1.0.1~reviews-v1.default~default.svc.cluster.local", md).unwrap();
    env.init_proxy(&mut proxy);
    proxy
}

/// (service port name, target port) of the proxy's instances in a full push.
fn instances(env: &Environment, proxy: &model::Proxy) -> Vec<(String, u16)> {
    let push = env.build(&model::PushRequest::full(TriggerReason::ServiceUpdate));
    push.context()
        .service_instances(proxy)
        .iter()
        .map(|i| (i.service_port.name.clone(), i.target_port))
        .collect()
}

#[test]
fn a_pod_not_ready_yet_serves_the_ports_of_the_services_selecting_it() {
    let r = Arc::new(KubeRegistry::new(ctx()));
    let env = Environment::new(
        Arc::new(MeshConfig::default()),
        "cluster.local".into(),
        vec![Box::new(r.clone())],
    );
    let apply = |events| {
        let diff = r.apply(events);
        let proxies = diff.proxies.clone();
        env.services_changed(diff);
        proxies
    };
    apply(vec![
        KubeEvent::Service(Change::Apply(reviews())),
        KubeEvent::Pod(Change::Apply(pod(json!({"app": "reviews"})))),
        // the EndpointSlice controller lists the Pod, not ready: no endpoint is served yet
        KubeEvent::EndpointSlice(Change::Apply(slice(
            "reviews-1",
            json!([endpoint("10.1.0.1", "reviews-v1", false)]),
        ))),
    ]);
    assert!(r.snapshot().endpoints.is_empty());
    let sidecar = proxy(&env);
    // the named targetPort `web` is the Pod's 8080; the others are their own port
    assert_eq!(
        instances(&env, &sidecar),
        [
            ("http".to_owned(), 8080),
            ("grpc-api".to_owned(), 9090),
            ("metrics".to_owned(), 9100),
            ("dns".to_owned(), 53)
        ]
    );

    // A change of a Service selecting the Pod is a proxy update of its proxy, which then has
    // the new ports.
    let mut changed = reviews();
    if let Some(ports) = changed.spec.as_mut().and_then(|s| s.ports.as_mut()) {
        ports.retain(|p| p.name.as_deref() == Some("http"));
    }
    let proxies = apply(vec![KubeEvent::Service(Change::Apply(changed))]);
    assert_eq!(proxies, BTreeSet::from(["10.1.0.1".to_owned()]));
    assert_eq!(instances(&env, &proxy(&env)), [("http".to_owned(), 8080)]);

    // A Service that no longer selects it: none from Kubernetes, and its endpoints are looked at
    // (there are none).
    let other = service(json!({"selector": {"app": "ratings"}, "ports": [{"name": "http", "port": 9080}]}));
    let proxies = apply(vec![KubeEvent::Service(Change::Apply(other))]);
    assert_eq!(proxies, BTreeSet::from(["10.1.0.1".to_owned()]), "selected before");
    let sidecar = proxy(&env);
    assert_eq!(sidecar.service_targets, None);
    assert!(instances(&env, &sidecar).is_empty());
}
