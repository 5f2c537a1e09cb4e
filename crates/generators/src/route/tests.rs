//! Unit tests of route translation over a fake push.

use serde_json::json;
use xds_api::envoy::config::route::v3::{Route, route_action, route_action::hash_policy};

use super::testing::{FakePush, action, service};
use super::*;
use crate::testing::gateway_proxy;

fn vs_doc(http: serde_json::Value) -> serde_json::Value {
    crate::testing::virtual_service(
        "vs",
        "bookinfo",
        json!({"hosts": ["bookinfo.example.com"], "gateways": ["istio-system/gw"], "http": http}),
    )
}

fn routes(push: &FakePush, port: u32) -> Vec<Route> {
    let proxy = gateway_proxy();
    let gateways = vec!["istio-system/gw".to_owned()];
    let ctx = RouteContext::new(push, &proxy, &push.configs[0], port, &gateways, false);
    build_http_routes_for_virtual_service(&ctx)
}

#[test]
fn short_hosts_resolve_in_the_vs_namespace_and_single_port_services_give_the_port() {
    let push = FakePush::with_configs(&[vs_doc(json!([{"route": [{"destination": {"host": "reviews"}}]}]))])
        .with_service(service("reviews.bookinfo.svc.cluster.local", "bookinfo", &[9080]));
    let r = routes(&push, 80);
    assert_eq!(r.len(), 1);
    assert_eq!(
        action(&r[0]).cluster_specifier,
        Some(route_action::ClusterSpecifier::Cluster(
            "outbound|9080||reviews.bookinfo.svc.cluster.local".into()
        ))
    );
    assert_eq!(
        r[0].decorator.as_ref().unwrap().operation,
        "reviews.bookinfo.svc.cluster.local:9080/*"
    );
    let md = &r[0].metadata.as_ref().unwrap().filter_metadata["istio"];
    assert!(format!("{md:?}").contains("/apis/networking.istio.io/v1/namespaces/bookinfo/virtual-service/vs"));
}

#[test]
fn matches_for_other_ports_or_gateways_are_skipped_and_catch_all_ends_the_list() {
    let push = FakePush::with_configs(&[vs_doc(json!([
        {"match": [{"port": 8080, "uri": {"prefix": "/p"}}], "route": [{"destination": {"host": "a"}}]},
        {"match": [{"gateways": ["other"], "uri": {"prefix": "/g"}}], "route": [{"destination": {"host": "a"}}]},
        {"match": [{"gateways": ["istio-system/gw"], "uri": {"prefix": "/mine"}}], "route": [{"destination": {"host": "a"}}]},
        {"match": [{"uri": {"prefix": "/"}}, {"uri": {"prefix": "/never"}}], "route": [{"destination": {"host": "a"}}]},
        {"route": [{"destination": {"host": "unreachable"}}]}
    ]))]);
    let r = routes(&push, 80);
    let prefixes: Vec<_> = r
        .iter()
        .map(|r| format!("{:?}", r.r#match.as_ref().unwrap().path_specifier))
        .collect();
    assert_eq!(prefixes, [r#"Some(Prefix("/mine"))"#, r#"Some(Prefix("/"))"#]);
    assert_eq!(routes(&push, 8080).len(), 3, "port 8080 keeps the port match");
}

#[test]
fn weighted_destinations_skip_zero_weights_and_carry_their_headers() {
    let push = FakePush::with_configs(&[vs_doc(json!([{"route": [
        {"destination": {"host": "a", "subset": "v1", "port": {"number": 9080}}, "weight": 90,
         "headers": {"request": {"set": {"x-v": "1", "host": "a.example"}}}},
        {"destination": {"host": "a", "subset": "v2", "port": {"number": 9080}}, "weight": 10},
        {"destination": {"host": "a", "subset": "v3", "port": {"number": 9080}}, "weight": 0}
    ]}]))]);
    let r = routes(&push, 80);
    let Some(route_action::ClusterSpecifier::WeightedClusters(w)) = &action(&r[0]).cluster_specifier else {
        panic!("weighted clusters expected");
    };
    let names: Vec<_> = w
        .clusters
        .iter()
        .map(|c| (c.name.as_str(), c.weight.as_ref().unwrap().value))
        .collect();
    assert_eq!(
        names,
        [
            ("outbound|9080|v1|a.bookinfo.svc.cluster.local", 90),
            ("outbound|9080|v2|a.bookinfo.svc.cluster.local", 10)
        ]
    );
    assert_eq!(w.clusters[0].request_headers_to_add.len(), 1);
    assert!(w.clusters[0].host_rewrite_specifier.is_some());
    assert_eq!(r[0].decorator.as_ref().unwrap().operation, "vs:80/*");
}

#[test]
fn consistent_hash_from_the_destination_rule_drops_the_previous_hosts_predicate() {
    let push = FakePush::with_configs(&[
        vs_doc(json!([{"route": [{"destination": {"host": "a"}}]}])),
        crate::testing::destination_rule(
            "a",
            "bookinfo",
            json!({"host": "a", "trafficPolicy": {"loadBalancer": {"consistentHash": {"httpHeaderName": "x-user"}}}}),
        ),
    ])
    .with_service(service("a.bookinfo.svc.cluster.local", "bookinfo", &[80]));
    let r = routes(&push, 80);
    let a = action(&r[0]);
    assert!(matches!(
        &a.hash_policy[0].policy_specifier,
        Some(hash_policy::PolicySpecifier::Header(h)) if h.header_name == "x-user"
    ));
    let retry = a.retry_policy.as_ref().unwrap();
    assert!(retry.retry_host_predicate.is_empty());
}

#[test]
fn mesh_default_retry_policy_applies_when_the_route_has_none() {
    let mut push = FakePush::with_configs(&[vs_doc(json!([{"route": [{"destination": {"host": "a"}}]}]))]);
    push.mesh.default_http_retry_policy =
        Some(serde_json::from_value(json!({"attempts": 5, "retryOn": "5xx"})).unwrap());
    let r = routes(&push, 80);
    let retry = action(&r[0]).retry_policy.clone().unwrap();
    assert_eq!(retry.num_retries.unwrap().value, 5);
    assert_eq!(retry.retry_on, "5xx");
}

#[test]
fn unmerged_delegating_rules_produce_no_route() {
    let push = FakePush::with_configs(&[vs_doc(json!([{"delegate": {"name": "child", "namespace": "ns"}}]))]);
    assert!(routes(&push, 80).is_empty());
}

#[test]
fn catch_all_routes_sort_last() {
    let mk = |p: &str| Route {
        name: p.into(),
        r#match: Some(matching::translate_route_match(Some(
            &model::networking::HttpMatchRequest {
                uri: Some(model::networking::StringMatch::prefix(p)),
                ..Default::default()
            },
        ))),
        ..Default::default()
    };
    let sorted = sort_vhost_routes(vec![mk("/"), mk("/a"), mk("/b")]);
    let names: Vec<_> = sorted.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["/a", "/b", "/"]);
}

/// A VirtualService made from a Kubernetes Ingress (`internal.istio.io/route-semantics: ingress`):
/// a prefix matches whole path segments, as Istio's ingress semantics; an exact path only itself.
#[test]
fn ingress_virtual_services_match_prefixes_by_path_segment() {
    use super::testing::{Outcome, Request, evaluate};
    use xds_api::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
    let mut doc = vs_doc(json!([
        {"match": [{"uri": {"exact": "/exact"}}], "route": [{"destination": {"host": "a", "port": {"number": 80}}}]},
        {"match": [{"uri": {"prefix": "/api/"}}], "route": [{"destination": {"host": "b", "port": {"number": 80}}}]},
    ]));
    doc["metadata"]["annotations"] = json!({"internal.istio.io/route-semantics": "ingress"});
    let push = FakePush::with_configs(&[doc]);
    let rc = RouteConfiguration {
        virtual_hosts: vec![VirtualHost {
            domains: vec!["*".into()],
            routes: routes(&push, 80),
            ..Default::default()
        }],
        ..Default::default()
    };
    let to = |path: &str| match evaluate(&rc, &Request::get("bookinfo.example.com", path)).0 {
        Outcome::Cluster(c) => c,
        other => format!("{other:?}"),
    };
    assert_eq!(to("/api"), "outbound|80||b.bookinfo.svc.cluster.local");
    assert_eq!(to("/api/v1"), "outbound|80||b.bookinfo.svc.cluster.local");
    assert_eq!(to("/apiv1"), "NotFound");
    assert_eq!(to("/exact"), "outbound|80||a.bookinfo.svc.cluster.local");
    assert_eq!(to("/exact/more"), "NotFound");
    // Without the annotation the same prefix is a plain string prefix.
    let plain = FakePush::with_configs(&[vs_doc(json!([
        {"match": [{"uri": {"prefix": "/api"}}], "route": [{"destination": {"host": "b", "port": {"number": 80}}}]},
    ]))]);
    let spec = routes(&plain, 80)[0].r#match.clone().and_then(|m| m.path_specifier);
    assert_eq!(spec, Some(PathSpecifier::Prefix("/api".into())));
}
