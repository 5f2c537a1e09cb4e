//! The environment's decisions, change by change: full, EDS-only or no push; what the push covers;
//! which proxies it concerns; which types it sends.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;

use config_sources::{ConfigChange, ConfigEvent};
use model::testing::{config, proxy};
use model::{Changed, Config, ConfigKey, ConfigKind, ConfigsUpdated, MeshConfig, Proxy, ServiceKey};
use registry::RegistryDiff;
use serde_json::{Value, json};
use xds_api::type_url;
use xds_server::{PushSnapshot, SnapshotBuilder, TriggerReason, type_needs_push};

use crate::push::change_scope;
use crate::{Environment, PushRequest, Update};
use registry::ServiceEntries;

fn env() -> Environment {
    let mesh = Arc::new(MeshConfig::default());
    Environment::new(
        mesh.clone(),
        "cluster.local".into(),
        vec![Box::new(ServiceEntries::new(mesh))],
    )
}

fn service_entry(ns: &str, name: &str, spec: Value) -> Arc<Config> {
    config(json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": ns}, "spec": spec}))
}

fn static_se(ns: &str, host: &str, port: u32, addresses: &[&str]) -> Arc<Config> {
    let endpoints: Vec<Value> = addresses.iter().map(|a| json!({"address": a})).collect();
    service_entry(
        ns,
        host,
        json!({"hosts": [host], "ports": [{"number": port, "name": "http", "protocol": "HTTP"}],
               "resolution": "STATIC", "location": "MESH_INTERNAL", "endpoints": endpoints}),
    )
}

fn virtual_service(ns: &str, name: &str, host: &str, export_to: &[&str]) -> Arc<Config> {
    config(json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"hosts": [host], "exportTo": export_to,
                 "http": [{"route": [{"destination": {"host": host}}]}]}}))
}

fn added(configs: &[Arc<Config>]) -> ConfigChange {
    ConfigChange {
        events: configs.iter().cloned().map(ConfigEvent::Added).collect(),
    }
}

fn updated(old: &Arc<Config>, new: &Arc<Config>) -> ConfigChange {
    ConfigChange {
        events: vec![ConfigEvent::Updated {
            old: old.clone(),
            new: new.clone(),
        }],
    }
}

fn deleted(c: &Arc<Config>) -> ConfigChange {
    ConfigChange {
        events: vec![ConfigEvent::Deleted(c.clone())],
    }
}

fn service(host: &str, ns: &str) -> Changed {
    Changed::Service(ServiceKey::new(host, ns))
}

fn only(changes: impl IntoIterator<Item = Changed>) -> ConfigsUpdated {
    ConfigsUpdated::Only(changes.into_iter().collect())
}

fn sidecar(ns: &str) -> Proxy {
    proxy("sidecar", "10.9.9.9", ns, json!({"app": "client"}))
}

/// The types a push sends to a proxy of `p`'s type.
fn types(p: &Proxy, req: &PushRequest) -> Vec<&'static str> {
    if !req.full {
        return vec!["eds"];
    }
    [
        type_url::CLUSTER,
        type_url::ENDPOINT,
        type_url::LISTENER,
        type_url::ROUTE,
    ]
    .into_iter()
    .filter(|t| type_needs_push(t, p.node_type, req))
    .map(type_url::short)
    .collect()
}

#[test]
fn an_istio_config_change_is_a_full_push_of_that_config() {
    let e = env();
    let vs = virtual_service("a", "reviews", "reviews.a.svc.cluster.local", &[]);
    let req = e.config_changed(&added(std::slice::from_ref(&vs))).push.unwrap();
    assert!(req.full);
    assert_eq!(req.configs_updated, only([Changed::Config(vs.key())]));
    assert_eq!(req.reason_string(), "config:1");
    assert_eq!(types(&sidecar("a"), &req), ["cds", "lds", "rds"]);
    assert_eq!(e.stats().virtual_services, 1);
    e.config_changed(&deleted(&vs)).push.unwrap();
    assert_eq!(e.stats().virtual_services, 0);
}

#[test]
fn endpoints_that_move_are_an_eds_only_push_of_their_service() {
    let e = env();
    let v1 = static_se("a", "db.example.com", 5432, &["10.0.0.1"]);
    let req = e.config_changed(&added(std::slice::from_ref(&v1))).push.unwrap();
    assert!(req.full, "a new service");
    assert_eq!(req.configs_updated, only([service("db.example.com", "a")]));
    assert_eq!(req.reason_string(), "service:1");
    assert_eq!(types(&sidecar("a"), &req), ["cds", "eds", "lds", "rds"]);

    let v2 = static_se("a", "db.example.com", 5432, &["10.0.0.2"]);
    let req = e.config_changed(&updated(&v1, &v2)).push.unwrap();
    assert!(!req.full);
    assert_eq!(req.configs_updated, only([service("db.example.com", "a")]));
    assert_eq!(req.reason_string(), "endpoint:1");
    assert_eq!(
        e.registry().endpoints_of(&ServiceKey::new("db.example.com", "a"))[0].address,
        "10.0.0.2"
    );

    // A new port changes the service: full push.
    let v3 = static_se("a", "db.example.com", 5433, &["10.0.0.2"]);
    let req = e.config_changed(&updated(&v2, &v3)).push.unwrap();
    assert!(req.full);
    assert_eq!(req.configs_updated, only([service("db.example.com", "a")]));
}

#[test]
fn a_dns_service_whose_endpoints_move_is_a_full_push() {
    let e = env();
    let dns = |addr: &str| {
        service_entry(
            "a",
            "d",
            json!({"hosts": ["d.example.com"], "resolution": "DNS",
                   "ports": [{"number": 80, "name": "http"}], "endpoints": [{"address": addr}]}),
        )
    };
    let (one, two) = (dns("one.internal"), dns("two.internal"));
    e.config_changed(&added(std::slice::from_ref(&one))).push.unwrap();
    let req = e.config_changed(&updated(&one, &two)).push.unwrap();
    assert!(req.full);
    assert_eq!(req.configs_updated, only([service("d.example.com", "a")]));
}

#[test]
fn workload_entries_reach_pushes_as_the_services_they_change() {
    let e = env();
    let selecting = |app: &str| {
        service_entry(
            "a",
            app,
            json!({"hosts": [format!("{app}.example.com")], "resolution": "STATIC",
                   "ports": [{"number": 80, "name": "http"}], "workloadSelector": {"labels": {"app": app}}}),
        )
    };
    let vm = |app: &str| {
        config(json!({"apiVersion": "networking.istio.io/v1", "kind": "WorkloadEntry",
            "metadata": {"name": "vm", "namespace": "a"},
            "spec": {"address": "10.0.0.5", "labels": {"app": app}}}))
    };
    e.config_changed(&added(&[selecting("blue"), selecting("green")]))
        .push
        .unwrap();
    let blue = vm("blue");
    let req = e.config_changed(&added(std::slice::from_ref(&blue))).push.unwrap();
    assert!(!req.full);
    assert_eq!(req.configs_updated, only([service("blue.example.com", "a")]));
    // Relabelled: its endpoint moves from blue to green.
    let green = vm("green");
    let req = e.config_changed(&updated(&blue, &green)).push.unwrap();
    assert!(!req.full);
    assert_eq!(
        req.configs_updated,
        only([service("blue.example.com", "a"), service("green.example.com", "a")])
    );
    // Selected by nothing: no push.
    let nobody = vm("nobody");
    assert_eq!(
        e.config_changed(&updated(&green, &nobody)).push.map(|r| r.full),
        Some(false)
    );
    assert_eq!(e.config_changed(&deleted(&nobody)).push, None);
    assert_eq!(e.config_changed(&ConfigChange::default()).push, None);
}

#[test]
fn a_push_concerns_the_proxies_that_see_the_change() {
    let e = env();
    let public = virtual_service("a", "public", "public.a.svc.cluster.local", &[]);
    let private = virtual_service("a", "private", "private.a.svc.cluster.local", &["."]);
    e.config_changed(&added(&[public.clone(), private.clone()]))
        .push
        .unwrap();
    let first = e.build(&PushRequest::full(TriggerReason::GlobalUpdate));

    let req = PushRequest::configs([private.key()]);
    let push = e.build(&req);
    assert!(push.needs_push(&sidecar("a"), &req, Some(&first)));
    assert!(!push.needs_push(&sidecar("b"), &req, Some(&first)));
    let req = PushRequest::configs([public.key()]);
    assert!(push.needs_push(&sidecar("b"), &req, None));
    // Everything concerns everyone.
    let all = PushRequest::full(TriggerReason::GlobalUpdate);
    assert!(push.needs_push(&sidecar("b"), &all, None));
}

#[test]
fn pushes_reuse_the_indexes_a_change_did_not_touch_and_generate_from_the_new_state() {
    let e = env();
    e.config_changed(&added(&[static_se("a", "db.example.com", 5432, &["10.0.0.1"])]))
        .push
        .unwrap();
    let first = e.build(&PushRequest::full(TriggerReason::GlobalUpdate));
    let vs = virtual_service("a", "db", "db.example.com", &[]);
    let req = e.config_changed(&added(std::slice::from_ref(&vs))).push.unwrap();
    let second = e.build(&req);
    assert_ne!(first.version(), second.version());
    assert_eq!(second.context().configs().len(), 2);
    let watched = xds_server::WatchedResource {
        type_url: type_url::CLUSTER.into(),
        names: Default::default(),
        wildcard: true,
    };
    let clusters = second.generate(&sidecar("a"), &watched, false).unwrap();
    assert!(clusters.iter().any(|c| c.name == "outbound|5432||db.example.com"));
    // A type nobody generates is answered quietly with nothing.
    let other = xds_server::WatchedResource {
        type_url: type_url::PROXY_CONFIG.into(),
        ..watched
    };
    assert!(matches!(
        second.generate(&sidecar("a"), &other, false),
        Err(xds_api::GenerateError::UnsupportedType(_))
    ));
}

#[test]
fn change_scope_follows_the_push_request() {
    let key = |kind, name: &str| ConfigKey {
        kind,
        namespace: "default".into(),
        name: name.into(),
    };
    assert_eq!(change_scope(&PushRequest::full(TriggerReason::GlobalUpdate)), None);
    let vs = change_scope(&PushRequest::configs([key(ConfigKind::VirtualService, "a")])).unwrap();
    assert_eq!(vs.kinds, vec![ConfigKind::VirtualService]);
    assert!(!vs.services);
    let eds = change_scope(&PushRequest::endpoints([ServiceKey::new("h.example.com", "default")])).unwrap();
    assert!(!eds.services, "endpoint-only pushes keep the service index");
    assert!(eds.kinds.is_empty());
    let both = change_scope(&PushRequest::changed(
        TriggerReason::ConfigUpdate,
        [
            Changed::Config(key(ConfigKind::VirtualService, "a")),
            service("h.example.com", "default"),
        ],
    ))
    .unwrap();
    assert!(both.services);
    assert_eq!(both.kinds, vec![ConfigKind::VirtualService]);
}

#[test]
fn a_second_registry_plugs_in_beside_service_entries() {
    let mesh = Arc::new(MeshConfig::default());
    // A registry that changes by itself, as a Kubernetes one would.
    let k8s = Arc::new(registry::MemoryRegistry::as_provider("Kubernetes"));
    let e = Environment::new(
        mesh.clone(),
        "cluster.local".into(),
        vec![Box::new(ServiceEntries::new(mesh.clone())), Box::new(k8s.clone())],
    );
    e.config_changed(&added(&[static_se("a", "db.example.com", 5432, &["10.0.0.1"])]))
        .push
        .unwrap();
    // The other registry learns of a service: it reports the diff, the environment serves both.
    let theirs = registry::build(&[static_se("b", "web.b.svc.cluster.local", 80, &["10.1.0.1"])], &mesh);
    let diff = k8s.add_service(theirs.services[0].as_ref().clone());
    let req = e.services_changed(diff).push.unwrap();
    assert!(req.full);
    assert_eq!(req.configs_updated, only([service("web.b.svc.cluster.local", "b")]));
    let hosts: Vec<String> = e.registry().services.iter().map(|s| s.hostname.clone()).collect();
    assert_eq!(hosts, ["db.example.com", "web.b.svc.cluster.local"]);
    assert_eq!(e.stats().services, 2);
    assert_eq!(e.services_changed(RegistryDiff::default()).push, None);
}

#[test]
fn a_new_mesh_config_makes_a_full_push_built_with_it() {
    let e = env();
    e.config_changed(&added(&[static_se("a", "db.example.com", 5432, &["10.0.0.1"])]))
        .push
        .unwrap();
    let first = e.build(&PushRequest::full(TriggerReason::GlobalUpdate));
    assert_eq!(first.context().mesh().root_namespace, "istio-system");
    assert_eq!(
        e.mesh_changed(e.mesh()),
        Update::default(),
        "the same mesh config asks for nothing"
    );

    let mut mesh = (*e.mesh()).clone();
    mesh.root_namespace = "mesh-root".into();
    let req = e.mesh_changed(Arc::new(mesh)).push.expect("a push");
    assert!(req.full);
    assert_eq!(req.configs_updated, ConfigsUpdated::All);
    let second = e.build(&req);
    assert_eq!(second.context().mesh().root_namespace, "mesh-root");
    assert_eq!(e.mesh().root_namespace, "mesh-root");
    assert!(second.needs_push(&sidecar("b"), &req, Some(&first)));
}

/// A cluster's registry with one Service, `web.shop`, its VIP and one endpoint.
fn cluster(id: &str, vip: &str, ip: &str) -> registry::MemoryRegistry {
    let r = registry::MemoryRegistry::as_provider("Kubernetes").in_cluster(id);
    r.add_service(model::Service {
        hostname: "web.shop.svc.cluster.local".into(),
        ports: vec![model::Port {
            name: "http".into(),
            port: 80,
            protocol: model::Protocol::Http,
        }],
        addresses: vec![vip.into()],
        cluster_vips: [(id.to_owned(), vec![vip.to_owned()])].into(),
        resolution: model::Resolution::ClientSideLb,
        mesh_external: false,
        attributes: model::ServiceAttributes {
            service_registry: "Kubernetes".into(),
            name: "web".into(),
            namespace: "shop".into(),
            cluster_id: id.into(),
            ..Default::default()
        },
        origin: format!("Service/shop/web in {id}"),
    });
    let endpoint = model::Endpoint {
        address: ip.into(),
        endpoint_port: 8080,
        service_port_name: "http".into(),
        namespace: "shop".into(),
        cluster_id: id.into(),
        ..Default::default()
    };
    r.set_endpoints("web.shop.svc.cluster.local", "shop", vec![endpoint]);
    r
}

#[test]
fn a_remote_cluster_joins_and_leaves_with_its_services_and_endpoints() {
    let mesh = Arc::new(MeshConfig::default());
    let e = Environment::new(
        mesh.clone(),
        "cluster.local".into(),
        vec![
            Box::new(cluster("c1", "10.96.0.1", "10.1.0.1")),
            Box::new(ServiceEntries::new(mesh)),
        ],
    );
    let key = ServiceKey::new("web.shop.svc.cluster.local", "shop");
    let addresses = |e: &Environment| -> Vec<String> {
        let r = e.registry();
        r.endpoints_of(&key)
            .iter()
            .map(|x| format!("{}@{}", x.address, x.cluster_id))
            .collect()
    };
    assert_eq!(addresses(&e), ["10.1.0.1@c1"]);

    // A remote cluster joins: before the ServiceEntries, after the config cluster; a full push
    // of its services.
    let req = e
        .add_registry(Arc::new(cluster("c2", "10.96.0.2", "10.2.0.1")))
        .push
        .unwrap();
    assert!(req.full);
    assert_eq!(
        req.configs_updated,
        only([service("web.shop.svc.cluster.local", "shop")])
    );
    assert_eq!(e.clusters(), ["c1", "c2"]);
    assert_eq!(addresses(&e), ["10.1.0.1@c1", "10.2.0.1@c2"]);
    let svc = e
        .registry()
        .service("web.shop.svc.cluster.local", "shop")
        .cloned()
        .unwrap();
    assert_eq!(svc.addresses_for("c2"), ["10.96.0.2"]);

    // It leaves: its endpoints and VIP go, the config cluster's stay.
    let req = e.remove_registry("c2").push.unwrap();
    assert_eq!(
        req.configs_updated,
        only([service("web.shop.svc.cluster.local", "shop")])
    );
    assert_eq!(e.clusters(), ["c1"]);
    assert_eq!(addresses(&e), ["10.1.0.1@c1"]);
    let svc = e
        .registry()
        .service("web.shop.svc.cluster.local", "shop")
        .cloned()
        .unwrap();
    assert_eq!(svc.cluster_vips.len(), 1);
    // A cluster that is not there: nothing to push.
    assert_eq!(e.remove_registry("c9").push, None);
    assert_eq!(e.remove_registry("").push, None);
}
