//! Sidecar route configurations: behaviour tables ("a request from a sidecar in N to host H on
//! port P reaches cluster C"), the domain forms, one golden file and a real-Envoy validation.

use std::sync::Arc;

use model::{Config, ConfigSpec, MeshConfig, Proxy, Service};
use serde_json::{Value, json};
use xds_api::envoy::config::bootstrap::v3::{Bootstrap, bootstrap::StaticResources};
use xds_api::envoy::config::core::v3::{Address, SocketAddress, address, socket_address};
use xds_api::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use xds_api::envoy::config::route::v3::{RouteConfiguration, route};
use xds_api::envoy::extensions::filters::http::router::v3::Router;
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_connection_manager as hcm, http_filter,
};

use super::build_route_configs;
use super::sidecar::{SidecarPushView, generate_alt_virtual_hosts};
use crate::route::testing::{FakePush, Outcome, Request, evaluate};
use crate::route::{MESH_GATEWAY, virtual_service};
use crate::testing::{config, proxy, push_with_mesh, service_entry};

/// The fake push of the gateway tests sees every service and every mesh VirtualService.
impl SidecarPushView for FakePush {
    fn services_for_proxy(&self, _proxy: &Proxy) -> Vec<Arc<Service>> {
        let mut out = self.services.clone();
        out.sort_by(|a, b| a.hostname.cmp(&b.hostname));
        out
    }

    fn virtual_services_for_mesh(&self, _proxy: &Proxy) -> Vec<Arc<Config>> {
        self.configs
            .iter()
            .filter(|c| {
                virtual_service(c)
                    .is_some_and(|vs| vs.gateways.is_empty() || vs.gateways.iter().any(|g| g == MESH_GATEWAY))
            })
            .cloned()
            .collect()
    }

    fn registry_only(&self, _proxy: &Proxy) -> bool {
        self.mesh.registry_only()
    }
}

/// A Kubernetes-like service as a ServiceEntry: `name.ns.svc.cluster.local` with a VIP.
fn svc(name: &str, ns: &str, port: u16, vip: &str, export_to: &[&str]) -> Value {
    let mut spec = json!({
        "hosts": [format!("{name}.{ns}.svc.cluster.local")], "addresses": [vip],
        "location": "MESH_INTERNAL", "resolution": "STATIC",
        "ports": [{"number": port, "name": "http", "protocol": "HTTP"}],
        "endpoints": [{"address": "10.1.0.1"}]
    });
    if !export_to.is_empty() {
        spec["exportTo"] = json!(export_to);
    }
    service_entry(name, ns, spec)
}

/// bookinfo in `default`, ratings in `other`, a private service, a mesh VS and a gateway-only VS.
fn mesh_docs() -> Vec<Value> {
    vec![
        svc("reviews", "default", 9080, "10.96.0.10", &[]),
        svc("ratings", "other", 9080, "10.96.0.20", &[]),
        svc("secret", "other", 9080, "10.96.0.30", &["."]),
        svc("details", "default", 9080, "10.96.0.40", &[]),
        svc("telemetry", "istio-system", 9080, "10.96.0.50", &[]),
        config(
            "VirtualService",
            "reviews",
            "default",
            json!({"hosts": ["reviews"], "http": [
                {"match": [{"headers": {"end-user": {"exact": "jason"}}}],
                 "route": [{"destination": {"host": "reviews", "subset": "v2"}}]},
                {"route": [{"destination": {"host": "reviews", "subset": "v1"}, "weight": 90},
                           {"destination": {"host": "reviews", "subset": "v3"}, "weight": 10}]}]}),
        ),
        config(
            "VirtualService",
            "details-gw",
            "default",
            json!({"hosts": ["details"], "gateways": ["istio-system/gw"],
                   "http": [{"route": [{"destination": {"host": "details", "subset": "gw-only"}}]}]}),
        ),
        config(
            "VirtualService",
            "external",
            "default",
            json!({"hosts": ["api.example.com"],
                   "http": [{"route": [{"destination": {"host": "details", "port": {"number": 9080}}}]}]}),
        ),
    ]
}

fn routes_for(mesh: MeshConfig, docs: Vec<Value>, from_ns: &str, port: &str) -> RouteConfiguration {
    let push = push_with_mesh(mesh, docs);
    build_route_configs(&proxy("sidecar", from_ns, json!({})), &push, &[port.to_owned()]).remove(0)
}

fn cluster(host: &str) -> Outcome {
    Outcome::Cluster(format!("outbound|9080||{host}"))
}

const REVIEWS: &str = "reviews.default.svc.cluster.local";
const RATINGS: &str = "ratings.other.svc.cluster.local";
const DETAILS: &str = "details.default.svc.cluster.local";
const TELEMETRY: &str = "telemetry.istio-system.svc.cluster.local";
const PASSTHROUGH: &str = "PassthroughCluster";

fn assert_table(rc: &RouteConfiguration, table: &[(Request, Outcome)]) {
    for (req, want) in table {
        let (got, _) = evaluate(rc, req);
        assert_eq!(&got, want, "request to {} {}", req.host, req.path);
    }
}

#[test]
fn absolute_fqdn_domains_follow_pilot_enable_absolute_fqdn_vhost_domain() {
    let absolute = format!("{DETAILS}.");
    let with = routes_for(MeshConfig::default(), mesh_docs(), "default", "9080");
    let input = crate::testing::push_input(MeshConfig::default(), mesh_docs());
    let without = push_index::PushContext::new(push_index::PushInput {
        features: model::Features {
            enable_absolute_fqdn_vhost_domain: false,
            ..Default::default()
        },
        ..input
    });
    let without =
        build_route_configs(&proxy("sidecar", "default", json!({})), &without, &["9080".to_owned()]).remove(0);
    let domains =
        |rc: &RouteConfiguration| -> Vec<String> { rc.virtual_hosts.iter().flat_map(|v| v.domains.clone()).collect() };
    assert!(domains(&with).contains(&absolute));
    assert!(
        !domains(&without).iter().any(|d| d.ends_with('.')),
        "{:?}",
        domains(&without)
    );
    assert_table(&without, &[(Request::get(DETAILS, "/"), cluster(DETAILS))]);
    assert_eq!(
        evaluate(&without, &Request::get(&absolute, "/")).0,
        Outcome::Cluster(PASSTHROUGH.into())
    );
}

#[test]
fn sidecar_in_default_reaches_services_by_every_name() {
    let rc = routes_for(MeshConfig::default(), mesh_docs(), "default", "9080");
    let passthrough = Outcome::Cluster(PASSTHROUGH.into());
    assert_table(
        &rc,
        &[
            (Request::get("details", "/"), cluster(DETAILS)),
            (Request::get("details:9080", "/"), cluster(DETAILS)),
            (Request::get("details.default", "/"), cluster(DETAILS)),
            (Request::get("details.default.svc", "/"), cluster(DETAILS)),
            (Request::get(DETAILS, "/"), cluster(DETAILS)),
            // the absolute FQDN (Istio 1.27+)
            (Request::get(&format!("{DETAILS}."), "/"), cluster(DETAILS)),
            (Request::get("10.96.0.40:9080", "/"), cluster(DETAILS)),
            (Request::get("ratings.other", "/"), cluster(RATINGS)),
            (Request::get("10.96.0.20", "/"), cluster(RATINGS)),
            // no short name for another namespace's service, and `other`'s private one is hidden
            (Request::get("ratings", "/"), passthrough.clone()),
            (Request::get("secret.other", "/"), passthrough.clone()),
            (Request::get("unknown.example.org", "/"), passthrough),
            // the mesh VirtualService replaces the default route; header match first
            (
                Request::get("reviews", "/").header("end-user", "jason"),
                Outcome::Cluster(format!("outbound|9080|v2|{REVIEWS}")),
            ),
            (
                Request::get("10.96.0.10", "/"),
                Outcome::Weighted(vec![
                    (format!("outbound|9080|v1|{REVIEWS}"), 90),
                    (format!("outbound|9080|v3|{REVIEWS}"), 10),
                ]),
            ),
            // a VirtualService host that is no service: only on port 80 (see below)
            (
                Request::get("api.example.com", "/"),
                Outcome::Cluster(PASSTHROUGH.into()),
            ),
        ],
    );
    assert_eq!(rc.name, "9080");
    assert_eq!(rc.validate_clusters.as_ref().map(|b| b.value), Some(false));
}

#[test]
fn sidecar_in_other_namespace_uses_its_own_short_names() {
    let rc = routes_for(MeshConfig::default(), mesh_docs(), "other", "9080");
    assert_table(
        &rc,
        &[
            (Request::get("ratings", "/"), cluster(RATINGS)),
            (Request::get("secret", "/"), cluster("secret.other.svc.cluster.local")),
            (Request::get("details.default", "/"), cluster(DETAILS)),
            (Request::get("details", "/"), Outcome::Cluster(PASSTHROUGH.into())),
        ],
    );
}

#[test]
fn registry_only_blocks_unknown_hosts_with_502() {
    let mesh = MeshConfig::from_value(json!({"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}})).unwrap();
    let rc = routes_for(mesh, mesh_docs(), "default", "9080");
    assert_table(
        &rc,
        &[
            (Request::get("unknown.example.org", "/"), Outcome::Direct(502, None)),
            (Request::get("details", "/"), cluster(DETAILS)),
        ],
    );
    let last = rc.virtual_hosts.last().unwrap();
    assert_eq!(
        (last.name.as_str(), last.domains.as_slice()),
        ("block_all", &["*".to_owned()][..])
    );
}

#[test]
fn sidecar_resource_scopes_hosts_and_overrides_the_policy() {
    let mut docs = mesh_docs();
    docs.push(config(
        "Sidecar",
        "default",
        "default",
        json!({"egress": [{"hosts": ["./*", "istio-system/*"]}], "outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}}),
    ));
    let rc = routes_for(MeshConfig::default(), docs.clone(), "default", "9080");
    assert_table(
        &rc,
        &[
            (Request::get("details", "/"), cluster(DETAILS)),
            (Request::get("telemetry.istio-system", "/"), cluster(TELEMETRY)),
            // `other` is not imported: its service falls to the Sidecar's REGISTRY_ONLY catch-all
            (Request::get("ratings.other", "/"), Outcome::Direct(502, None)),
            (Request::get("10.96.0.20", "/"), Outcome::Direct(502, None)),
        ],
    );
    // the Sidecar of `default` does not apply in `other`
    let rc = routes_for(MeshConfig::default(), docs, "other", "9080");
    assert_table(
        &rc,
        &[(Request::get("telemetry.istio-system", "/"), cluster(TELEMETRY))],
    );
}

#[test]
fn virtual_service_host_without_service_gets_a_vhost_on_port_80() {
    let mut docs = mesh_docs();
    docs.push(svc("web", "default", 80, "10.96.0.80", &[]));
    let rc = routes_for(MeshConfig::default(), docs, "default", "80");
    assert_table(
        &rc,
        &[
            (Request::get("api.example.com", "/"), cluster(DETAILS)),
            (
                Request::get("web", "/"),
                Outcome::Cluster("outbound|80||web.default.svc.cluster.local".into()),
            ),
            (Request::get("details", "/"), Outcome::Cluster(PASSTHROUGH.into())),
        ],
    );
}

#[test]
fn host_port_route_names_serve_that_host_only() {
    let push = push_with_mesh(MeshConfig::default(), mesh_docs());
    let me = proxy("sidecar", "default", json!({}));
    let names = [format!("{DETAILS}:9080"), "bogus".to_owned(), "x:y".to_owned()];
    let rcs = build_route_configs(&me, &push, &names);
    let vhosts: Vec<&str> = rcs[0].virtual_hosts.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(vhosts, [format!("{DETAILS}:9080")]);
    assert_table(
        &rcs[0],
        &[
            (Request::get("details", "/"), cluster(DETAILS)),
            // Istio's `getVirtualHostsForSniffedServicePort`: the one virtual host takes any Host,
            // as the connection was sent to that service's own address
            (Request::get("ratings.other", "/"), cluster(DETAILS)),
        ],
    );
    assert_eq!(rcs[0].virtual_hosts[0].domains, ["*"]);
    let with_vs = build_route_configs(&me, &push, &[format!("{REVIEWS}:9080")]).remove(0);
    let (got, _) = evaluate(&with_vs, &Request::get("reviews", "/").header("end-user", "jason"));
    assert_eq!(got, Outcome::Cluster(format!("outbound|9080|v2|{REVIEWS}")));
    for rc in &rcs[1..] {
        assert!(rc.virtual_hosts.is_empty(), "{}", rc.name);
    }
    assert_eq!(rcs[2].name, "x:y");
}

#[test]
fn default_route_hashes_as_the_destination_rule_says_unless_scoped_out() {
    let dr = config(
        "DestinationRule",
        "ratings",
        "other",
        json!({"host": "ratings", "trafficPolicy": {"loadBalancer": {"consistentHash": {"httpHeaderName": "x-user"}}}}),
    );
    let hash_header = |rc: &RouteConfiguration| {
        let (_, r) = evaluate(rc, &Request::get("ratings.other", "/"));
        match r.and_then(|r| r.action.as_ref()) {
            Some(route::Action::Route(a)) => a.hash_policy.len(),
            _ => usize::MAX,
        }
    };
    let mut docs = mesh_docs();
    docs.push(dr.clone());
    assert_eq!(
        hash_header(&routes_for(MeshConfig::default(), docs.clone(), "default", "9080")),
        1
    );
    // a Sidecar importing the service but a rule from a namespace it does not import still applies
    // (rules follow the service), while a service that is not imported has no vhost at all
    docs.push(config(
        "Sidecar",
        "default",
        "default",
        json!({"egress": [{"hosts": ["*/ratings.other.svc.cluster.local"]}]}),
    ));
    assert_eq!(
        hash_header(&routes_for(MeshConfig::default(), docs, "default", "9080")),
        1
    );
}

#[test]
fn alt_virtual_hosts_follow_istio() {
    let same = generate_alt_virtual_hosts(REVIEWS, "default.svc.cluster.local");
    assert_eq!(same, ["reviews", "reviews.default.svc", "reviews.default"]);
    let other = generate_alt_virtual_hosts(REVIEWS, "other.svc.cluster.local");
    assert_eq!(other, ["reviews.default.svc", "reviews.default"]);
    assert!(generate_alt_virtual_hosts("api.example.com", "default.svc.cluster.local").is_empty());
    assert!(generate_alt_virtual_hosts(REVIEWS, "").is_empty());
}

#[test]
fn gateway_bound_virtual_service_is_not_a_mesh_one() {
    let push = push_with_mesh(MeshConfig::default(), mesh_docs());
    let mesh_vs: Vec<String> = push
        .virtual_services_for_mesh(&proxy("sidecar", "default", json!({})))
        .iter()
        .filter(|c| matches!(c.spec, ConfigSpec::VirtualService(_)))
        .map(|c| c.meta.name.clone())
        .collect();
    assert!(!mesh_vs.contains(&"details-gw".to_owned()), "{mesh_vs:?}");
    let rc = routes_for(MeshConfig::default(), mesh_docs(), "default", "9080");
    let (_, r) = evaluate(&rc, &Request::get("details", "/"));
    assert_eq!(r.map(|r| r.name.as_str()), Some("default"));
}

#[test]
fn sidecar_routes_golden() {
    let push = push_with_mesh(MeshConfig::default(), mesh_docs());
    let rc = build_route_configs(&proxy("sidecar", "default", json!({})), &push, &["9080".into()]);
    crate::testing::assert_golden(
        "sidecar_routes.golden",
        &without_defaults(&super::golden_tests::expand_any(&format!("{rc:#?}"))),
    );
}

/// Drops `field: <proto3 default>,` lines so the golden shows what is set (as the gateway goldens).
fn without_defaults(text: &str) -> String {
    const DEFAULTS: [&str; 6] = ["None,", "[],", "\"\",", "false,", "0,", "{},"];
    text.lines()
        .filter(|l| {
            let field = l.trim_start().split_once(": ");
            !field
                .is_some_and(|(k, v)| k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') && DEFAULTS.contains(&v))
        })
        .map(|l| format!("{l}\n"))
        .collect()
}

/// A listener on 127.0.0.1:`port` whose HCM carries `rc` inline.
fn listener_with(rc: &RouteConfiguration, port: u32) -> Listener {
    let hcm = HttpConnectionManager {
        stat_prefix: format!("outbound_0.0.0.0_{port}"),
        route_specifier: Some(hcm::RouteSpecifier::RouteConfig(rc.clone())),
        http_filters: vec![HttpFilter {
            name: "envoy.filters.http.router".into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(xds_api::pack(&Router::default()))),
            ..Default::default()
        }],
        ..Default::default()
    };
    Listener {
        name: format!("0.0.0.0_{port}"),
        address: Some(Address {
            address: Some(address::Address::SocketAddress(SocketAddress {
                address: "127.0.0.1".into(),
                port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
                ..Default::default()
            })),
        }),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(filter::ConfigType::TypedConfig(xds_api::pack(&hcm))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[test]
fn envoy_accepts_sidecar_route_configs() {
    let envoy = crate::testing::envoy_binary();
    let mut docs = mesh_docs();
    docs.push(svc("web", "default", 80, "10.96.0.80", &[]));
    let allow = push_with_mesh(MeshConfig::default(), docs.clone());
    // The registry-only mesh also sets default retries with Istio 1.26+'s back-off and
    // previous-hosts fields, so that Envoy checks their translation too.
    let block = push_with_mesh(
        MeshConfig::from_value(json!({"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"},
            "defaultHttpRetryPolicy": {"attempts": 3, "backoff": "25ms", "retryIgnorePreviousHosts": true,
                                       "retryOn": "reset,503"}}))
        .unwrap(),
        docs,
    );
    let me = proxy("sidecar", "default", json!({}));
    let mut rcs = build_route_configs(&me, &allow, &["9080".into(), "80".into()]);
    let mut blocked = build_route_configs(&me, &block, &["9080".into()]);
    blocked[0].name = "9080-registry-only".into();
    rcs.append(&mut blocked);
    let listeners: Vec<Listener> = rcs
        .iter()
        .zip([19080, 19081, 19082])
        .map(|(rc, port)| listener_with(rc, port))
        .collect();
    let bootstrap = Bootstrap {
        static_resources: Some(StaticResources {
            listeners,
            clusters: crate::testing::stub_clusters(&rcs),
            ..Default::default()
        }),
        ..Default::default()
    };
    let log = crate::testing::envoy_validate(&envoy, &bootstrap)
        .unwrap_or_else(|log| panic!("envoy rejected the sidecar routes:\n{log}"));
    assert!(log.contains("loading 3 listener(s)"), "listeners not loaded:\n{log}");
}

#[test]
fn match_naming_mesh_applies_to_sidecars_and_one_naming_a_gateway_does_not() {
    let mut docs = mesh_docs();
    docs.push(config(
        "VirtualService",
        "details-split",
        "default",
        json!({
            "hosts": ["details"],
            "gateways": ["mesh", "istio-system/ingress"],
            "http": [
                {"match": [{"gateways": ["istio-system/ingress"], "uri": {"prefix": "/gw"}}],
                 "route": [{"destination": {"host": "ratings.other.svc.cluster.local"}}]},
                {"match": [{"gateways": ["mesh"], "uri": {"prefix": "/mesh"}}],
                 "route": [{"destination": {"host": "details", "subset": "v1"}}]},
                {"route": [{"destination": {"host": "details"}}]}
            ]
        }),
    ));
    let rc = routes_for(MeshConfig::default(), docs, "default", "9080");
    assert_table(
        &rc,
        &[
            (
                Request::get("details", "/mesh/x"),
                Outcome::Cluster(format!("outbound|9080|v1|{DETAILS}")),
            ),
            (Request::get("details", "/gw/x"), cluster(DETAILS)),
        ],
    );
}

/// A VirtualService that produces no route for this proxy or port (its rules match other source
/// labels, or another port) leaves the service its default route, as Istio: `reviews:9080`
/// from `app=ratings` reaches `outbound|9080||reviews...`, not PassthroughCluster (or 502).
#[test]
fn a_virtual_service_without_routes_for_the_proxy_keeps_the_default_route() {
    let docs = |http: Value| {
        vec![
            svc("reviews", "default", 9080, "10.96.0.10", &[]),
            config(
                "VirtualService",
                "reviews",
                "default",
                json!({"hosts": ["reviews"], "http": http}),
            ),
        ]
    };
    let by_source = docs(json!([{"match": [{"sourceLabels": {"app": "productpage"}}],
        "route": [{"destination": {"host": "reviews", "subset": "v2"}}]}]));
    let other_port = docs(json!([{"match": [{"port": 9999}],
        "route": [{"destination": {"host": "reviews", "subset": "v2"}}]}]));
    let routes = |docs: Vec<Value>, app: &str, mesh: MeshConfig| {
        let push = push_with_mesh(mesh, docs);
        let p = proxy("sidecar", "default", json!({"app": app}));
        build_route_configs(&p, &push, &["9080".to_owned()]).remove(0)
    };
    let registry_only = MeshConfig::from_value(json!({"outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"}})).unwrap();
    for mesh in [MeshConfig::default(), registry_only] {
        let from_ratings = routes(by_source.clone(), "ratings", mesh.clone());
        assert_table(&from_ratings, &[(Request::get("reviews", "/"), cluster(REVIEWS))]);
        let from_productpage = routes(by_source.clone(), "productpage", mesh.clone());
        let v2 = Outcome::Cluster(format!("outbound|9080|v2|{REVIEWS}"));
        assert_table(&from_productpage, &[(Request::get("reviews", "/"), v2)]);
        let on_9080 = routes(other_port.clone(), "ratings", mesh);
        assert_table(&on_9080, &[(Request::get("reviews:9080", "/"), cluster(REVIEWS))]);
    }
}

/// The default route takes `meshConfig.defaultHttpRetryPolicy` (a mesh that disables retries gets
/// none), and keeps the previous-hosts predicate even when a DestinationRule hashes, as Istio's
/// `BuildDefaultHTTPOutboundRoute`.
#[test]
fn default_route_retries_follow_the_mesh_default() {
    let retry = |mesh: MeshConfig, docs: Vec<Value>| {
        let rc = routes_for(mesh, docs, "default", "9080");
        let (_, r) = evaluate(&rc, &Request::get("ratings.other", "/"));
        match r.and_then(|r| r.action.as_ref()) {
            Some(route::Action::Route(a)) => (a.retry_policy.clone(), a.hash_policy.len()),
            other => panic!("not a route: {other:?}"),
        }
    };
    let (p, _) = retry(MeshConfig::default(), mesh_docs());
    assert_eq!(p.map(|p| p.num_retries.map(|n| n.value)), Some(Some(2)));

    let disabled = MeshConfig::from_value(json!({"defaultHttpRetryPolicy": {"attempts": 0}})).unwrap();
    assert_eq!(retry(disabled, mesh_docs()).0, None, "retries disabled mesh-wide");

    let custom =
        MeshConfig::from_value(json!({"defaultHttpRetryPolicy": {"attempts": 4, "retryOn": "gateway-error"}})).unwrap();
    let p = retry(custom, mesh_docs()).0.unwrap();
    assert_eq!(
        (p.num_retries.unwrap().value, p.retry_on.as_str()),
        (4, "gateway-error")
    );

    let mut hashed = mesh_docs();
    hashed.push(config(
        "DestinationRule",
        "ratings",
        "other",
        json!({"host": "ratings", "trafficPolicy": {"loadBalancer": {"consistentHash": {"httpHeaderName": "x-user"}}}}),
    ));
    let (p, hashes) = retry(MeshConfig::default(), hashed);
    assert_eq!(hashes, 1);
    let p = p.unwrap();
    assert_eq!(
        p.retry_host_predicate[0].name,
        "envoy.retry_host_predicates.previous_hosts"
    );
}
