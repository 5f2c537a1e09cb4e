//! PushContext lookups end to end: configs parsed as users write them, registry built from them.

use std::sync::Arc;

use model::config::parse_config;
use model::{Config, ConfigSpec, MeshConfig, Proxy};
use serde_json::{Value, json};

use crate::PushContext;
use crate::testing::push;

fn proxy(node_type: &str, ns: &str, labels: Value) -> Proxy {
    model::testing::proxy(node_type, "10.0.0.9", ns, labels)
}

fn cfg(doc: Value) -> Arc<Config> {
    Arc::new(parse_config(doc, "default").unwrap())
}

fn service_entry(name: &str, ns: &str, host: &str, export_to: Value) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"hosts": [host], "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                 "resolution": "STATIC", "location": "MESH_INTERNAL", "exportTo": export_to,
                 "endpoints": [{"address": "10.1.0.1"}]}})
}

fn dr(name: &str, ns: &str, spec: Value) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "DestinationRule",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn vs(name: &str, ns: &str, mut spec: Value) -> Value {
    spec["http"] = json!([{"route": [{"destination": {"host": "backend"}}]}]);
    json!({"apiVersion": "networking.istio.io/v1", "kind": "VirtualService",
        "metadata": {"name": name, "namespace": ns}, "spec": spec})
}

fn names(configs: &[Arc<Config>]) -> Vec<String> {
    configs
        .iter()
        .map(|c| format!("{}/{}", c.meta.namespace, c.meta.name))
        .collect()
}

#[test]
fn services_and_endpoints_follow_export_to() {
    let p = push(vec![
        service_entry("a", "ns1", "a.example.com", json!(["*"])),
        service_entry("b", "ns1", "b.example.com", json!(["."])),
        service_entry("c", "ns2", "c.example.com", json!(["ns1"])),
    ]);
    let hosts = |ns: &str| -> Vec<String> {
        p.services_for_proxy(&proxy("sidecar", ns, json!({})))
            .iter()
            .map(|s| s.hostname.clone())
            .collect()
    };
    assert_eq!(hosts("ns1"), ["a.example.com", "b.example.com", "c.example.com"]);
    assert_eq!(hosts("ns2"), ["a.example.com"]);
    assert_eq!(hosts("ns3"), ["a.example.com"]);
    let ns3 = proxy("sidecar", "ns3", json!({}));
    assert!(p.service_for_host(&ns3, "b.example.com").is_none());
    assert_eq!(p.service_for_host(&ns3, "a.example.com").unwrap().namespace(), "ns1");
    assert_eq!(p.endpoints("a.example.com", "ns1").len(), 1);
    assert!(p.endpoints("a.example.com", "ns2").is_empty());
}

/// Which DestinationRule (by its first source) a proxy in `ns` gets for the service `host`.
fn dr_for(p: &PushContext, ns: &str, labels: Value, host: &str) -> Option<String> {
    let proxy = proxy("sidecar", ns, labels);
    let svc = p.service_for_host(&proxy, host)?;
    p.destination_rule(&proxy, &svc)
        .map(|r| format!("{}/{}", r.from[0].namespace, r.from[0].name))
}

#[test]
fn destination_rule_lookup_order() {
    let p = push(vec![
        service_entry("svc", "backend", "svc.example.com", json!(["*"])),
        dr("client-local", "frontend", json!({"host": "svc.example.com"})),
        dr("owner", "backend", json!({"host": "svc.example.com"})),
        dr("root", "istio-system", json!({"host": "*.example.com"})),
        dr(
            "private",
            "other",
            json!({"host": "svc.example.com", "exportTo": ["."]}),
        ),
    ]);
    // 1. the proxy's own namespace
    assert_eq!(
        dr_for(&p, "frontend", json!({}), "svc.example.com").as_deref(),
        Some("frontend/client-local")
    );
    // 2. the service's namespace (exported); a private rule elsewhere is not seen
    assert_eq!(
        dr_for(&p, "third", json!({}), "svc.example.com").as_deref(),
        Some("backend/owner")
    );
    // ...but it is seen from its own namespace
    assert_eq!(
        dr_for(&p, "other", json!({}), "svc.example.com").as_deref(),
        Some("other/private")
    );
    // 3. the root namespace, for services the others do not cover
    let p = push(vec![
        service_entry("svc", "backend", "svc.example.com", json!(["*"])),
        dr("root", "istio-system", json!({"host": "*.example.com"})),
        dr(
            "hidden",
            "backend",
            json!({"host": "svc.example.com", "exportTo": ["."]}),
        ),
    ]);
    assert_eq!(
        dr_for(&p, "frontend", json!({}), "svc.example.com").as_deref(),
        Some("istio-system/root")
    );
}

#[test]
fn destination_rule_most_specific_host_and_short_names() {
    let p = push(vec![
        service_entry("svc", "backend", "svc.api.example.com", json!(["*"])),
        service_entry("k", "backend", "reviews.backend.svc.cluster.local", json!(["*"])),
        dr("broad", "backend", json!({"host": "*.example.com"})),
        dr("narrow", "backend", json!({"host": "*.api.example.com"})),
        dr("short", "backend", json!({"host": "reviews"})),
    ]);
    assert_eq!(
        dr_for(&p, "x", json!({}), "svc.api.example.com").as_deref(),
        Some("backend/narrow")
    );
    assert_eq!(
        dr_for(&p, "x", json!({}), "reviews.backend.svc.cluster.local").as_deref(),
        Some("backend/short")
    );
    let proxy = proxy("sidecar", "x", json!({}));
    let svc = p.service_for_host(&proxy, "reviews.backend.svc.cluster.local").unwrap();
    assert_eq!(
        p.destination_rule(&proxy, &svc).unwrap().rule.host,
        "reviews.backend.svc.cluster.local"
    );
}

#[test]
fn destination_rules_for_one_host_merge_first_wins() {
    let p = push(vec![
        service_entry("svc", "backend", "svc.example.com", json!(["*"])),
        dr(
            "a",
            "backend",
            json!({"host": "svc.example.com",
            "trafficPolicy": {"loadBalancer": {"simple": "RANDOM"}},
            "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}),
        ),
        dr(
            "b",
            "backend",
            json!({"host": "svc.example.com",
            "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}},
            "subsets": [{"name": "v1", "labels": {"version": "other"}}, {"name": "v2", "labels": {"version": "v2"}}]}),
        ),
    ]);
    let proxy = proxy("sidecar", "frontend", json!({}));
    let svc = p.service_for_host(&proxy, "svc.example.com").unwrap();
    let merged = p.destination_rule(&proxy, &svc).unwrap();
    assert_eq!(
        merged.from.iter().map(|k| k.name.as_str()).collect::<Vec<_>>(),
        ["a", "b"]
    );
    let subsets: Vec<(&str, &str)> = merged
        .rule
        .subsets
        .iter()
        .map(|s| (s.name.as_str(), s.labels["version"].as_str()))
        .collect();
    assert_eq!(subsets, [("v1", "v1"), ("v2", "v2")]);
    let lb = merged
        .rule
        .traffic_policy
        .as_ref()
        .and_then(|t| t.load_balancer.as_ref())
        .unwrap();
    assert_eq!(lb.simple.as_deref(), Some("RANDOM"));
}

#[test]
fn destination_rule_with_workload_selector_applies_to_selected_proxies_only() {
    let p = push(vec![
        service_entry("svc", "backend", "svc.example.com", json!(["*"])),
        dr("all", "frontend", json!({"host": "svc.example.com"})),
        dr(
            "canary",
            "frontend",
            json!({"host": "svc.example.com", "workloadSelector": {"matchLabels": {"app": "canary"}}}),
        ),
    ]);
    assert_eq!(
        dr_for(&p, "frontend", json!({"app": "canary"}), "svc.example.com").as_deref(),
        Some("frontend/canary")
    );
    assert_eq!(
        dr_for(&p, "frontend", json!({"app": "web"}), "svc.example.com").as_deref(),
        Some("frontend/all")
    );
    // never exported: a proxy elsewhere sees neither
    assert_eq!(
        dr_for(&p, "elsewhere", json!({"app": "canary"}), "svc.example.com"),
        None
    );
}

fn gateway(name: &str, ns: &str, selector: Value) -> Value {
    json!({"apiVersion": "networking.istio.io/v1", "kind": "Gateway",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"selector": selector, "servers": [{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]}})
}

#[test]
fn gateways_select_by_labels_from_any_namespace() {
    let p = push(vec![
        gateway("ingress", "istio-system", json!({"istio": "ingressgateway"})),
        gateway("app-gw", "apps", json!({"istio": "ingressgateway"})),
        gateway("egress", "istio-system", json!({"istio": "egressgateway"})),
        gateway("everyone", "apps", json!({})),
    ]);
    let gw = proxy("router", "istio-system", json!({"istio": "ingressgateway", "app": "x"}));
    assert_eq!(
        names(&p.gateways_for_proxy(&gw)),
        ["apps/app-gw", "apps/everyone", "istio-system/ingress"]
    );
    let other = proxy("router", "istio-system", json!({"app": "y"}));
    assert_eq!(names(&p.gateways_for_proxy(&other)), ["apps/everyone"]);
    assert!(p.gateway("istio-system/egress").is_some());
}

#[test]
fn virtual_services_bind_to_resolved_gateway_names() {
    let p = push(vec![
        vs(
            "short",
            "istio-system",
            json!({"hosts": ["a.example.com"], "gateways": ["ingress"]}),
        ),
        vs(
            "qualified",
            "apps",
            json!({"hosts": ["b.example.com"], "gateways": ["istio-system/ingress"]}),
        ),
        vs(
            "dot",
            "istio-system",
            json!({"hosts": ["c.example.com"], "gateways": ["ingress", "mesh"]}),
        ),
        vs(
            "elsewhere",
            "apps",
            json!({"hosts": ["d.example.com"], "gateways": ["ingress"]}),
        ),
        vs("mesh-only", "apps", json!({"hosts": ["reviews"]})),
        vs(
            "private",
            "apps",
            json!({"hosts": ["e.example.com"], "gateways": ["istio-system/ingress"], "exportTo": ["."]}),
        ),
    ]);
    let gw = proxy("router", "istio-system", json!({}));
    assert_eq!(
        names(&p.virtual_services_for_gateway(&gw, "istio-system/ingress")),
        ["istio-system/dot", "apps/qualified", "istio-system/short"]
    );
    assert_eq!(
        names(&p.virtual_services_for_gateway(&gw, "apps/ingress")),
        ["apps/elsewhere"]
    );
    // private VSs are visible in their own namespace, first
    let app_gw = proxy("router", "apps", json!({}));
    assert_eq!(
        names(&p.virtual_services_for_gateway(&app_gw, "istio-system/ingress")),
        [
            "apps/private",
            "istio-system/dot",
            "apps/qualified",
            "istio-system/short"
        ]
    );
    let sidecar = proxy("sidecar", "apps", json!({}));
    let mesh = p.virtual_services_for_mesh(&sidecar);
    assert_eq!(names(&mesh), ["istio-system/dot", "apps/mesh-only"]);
    // hosts are resolved to FQDNs
    let ConfigSpec::VirtualService(spec) = &mesh[1].spec else {
        panic!("not a VirtualService")
    };
    assert_eq!(spec.hosts, ["reviews.apps.svc.cluster.local"]);
}

#[test]
fn rebuild_reuses_untouched_indexes() {
    let docs = vec![
        service_entry("a", "ns1", "a.example.com", json!(["*"])),
        gateway("gw", "ns1", json!({})),
    ];
    let p = push(docs.clone());
    let mesh = Arc::new(MeshConfig::default());
    let mut configs: Vec<Arc<Config>> = docs.into_iter().map(cfg).collect();
    configs.push(cfg(gateway("gw2", "ns1", json!({}))));
    let registry = Arc::new(registry::build(&configs, &mesh));
    let input = crate::testing::input(mesh, configs, registry, "v2");
    let changed = crate::ChangeScope {
        kinds: vec![model::ConfigKind::Gateway],
        services: false,
    };
    let next = p.rebuild(input, &changed);
    assert_eq!(next.version(), "v2");
    assert!(Arc::ptr_eq(&p.services, &next.services));
    assert_eq!(next.gateways_for_proxy(&proxy("router", "ns1", json!({}))).len(), 2);
}

/// Istio's `sortConfigByCreationTime`: the older of two rules for one host wins, whatever their
/// names; configs without a creation time count as the oldest.
#[test]
fn the_older_destination_rule_wins_by_creation_timestamp() {
    let created = |name: &str, at: Option<&str>, lb: &str| {
        let mut d = dr(
            name,
            "backend",
            json!({"host": "svc.example.com", "trafficPolicy": {"loadBalancer": {"simple": lb}}}),
        );
        if let Some(at) = at {
            d["metadata"]["creationTimestamp"] = json!(at);
        }
        d
    };
    let lb_of = |docs: Vec<Value>| {
        let mut all = vec![service_entry("svc", "backend", "svc.example.com", json!(["*"]))];
        all.extend(docs);
        let p = push(all);
        let proxy = proxy("sidecar", "frontend", json!({}));
        let svc = p.service_for_host(&proxy, "svc.example.com").unwrap();
        let merged = p.destination_rule(&proxy, &svc).unwrap();
        let lb = merged
            .rule
            .traffic_policy
            .as_ref()
            .and_then(|t| t.load_balancer.as_ref())
            .cloned();
        lb.and_then(|l| l.simple).unwrap_or_default()
    };
    let older_b = vec![
        created("a", Some("2024-05-02T00:00:00Z"), "RANDOM"),
        created("b", Some("2024-05-01T00:00:00Z"), "ROUND_ROBIN"),
    ];
    assert_eq!(lb_of(older_b), "ROUND_ROBIN", "b was created first");
    let untimed_b = vec![
        created("a", Some("2024-05-01T00:00:00Z"), "RANDOM"),
        created("b", None, "ROUND_ROBIN"),
    ];
    assert_eq!(lb_of(untimed_b), "ROUND_ROBIN", "no creation time: Go's zero time");
}
