//! Equal config generates equal bytes: listeners with several AuthorizationPolicies and
//! RequestAuthentications (RBAC `policies`, jwt_authn `providers` are protobuf maps) and routes
//! with a fault and a CORS policy (`typed_per_filter_config`), generated from two pushes built
//! apart, so that no `HashMap` is shared between them.

use serde_json::{Value, json};

use crate::testing::{config_in, proxy, push, service_entry, virtual_service};
use crate::{PushCache, generate};

fn mesh() -> Vec<Value> {
    let mut docs = vec![
        service_entry(
            "reviews",
            "default",
            json!({"hosts": ["reviews.default.svc.cluster.local"], "addresses": ["240.240.0.10"],
                "location": "MESH_INTERNAL", "resolution": "STATIC",
                "ports": [{"number": 9080, "name": "http", "protocol": "HTTP"}],
                "workloadSelector": {"labels": {"app": "reviews"}}}),
        ),
        virtual_service(
            "reviews",
            "default",
            json!({"hosts": ["reviews.default.svc.cluster.local"], "http": [{
                "fault": {"delay": {"percentage": {"value": 10.0}, "fixedDelay": "1s"}},
                "corsPolicy": {"allowOrigins": [{"exact": "https://example.com"}]},
                "route": [{"destination": {"host": "reviews.default.svc.cluster.local"}}]}]}),
        ),
    ];
    for i in 0..12 {
        docs.push(config_in(
            "security.istio.io/v1",
            "AuthorizationPolicy",
            &format!("allow-{i}"),
            "default",
            json!({"rules": [{"from": [{"source": {"principals": [format!("cluster.local/ns/ns{i}/sa/sa{i}")]}}]}]}),
        ));
    }
    for i in 0..6 {
        docs.push(config_in(
            "security.istio.io/v1",
            "RequestAuthentication",
            &format!("jwt-{i}"),
            "default",
            json!({"jwtRules": [{"issuer": format!("https://issuer{i}.example.com"),
                "jwks": "{\"keys\":[]}"}]}),
        ));
    }
    docs
}

#[test]
fn equal_config_generates_equal_bytes() {
    let sidecar = proxy("sidecar", "default", json!({"app": "reviews"}));
    let generated = |type_url: &str, names: &[String]| {
        let p = push(mesh());
        let mut out: Vec<(String, Vec<u8>)> = generate(&p, &PushCache::default(), &sidecar, type_url, names)
            .unwrap()
            .into_iter()
            .map(|r| (r.name.clone(), r.resource.value.clone()))
            .collect();
        out.sort();
        out
    };
    for (type_url, names) in [
        (xds_api::type_url::LISTENER, vec![]),
        (xds_api::type_url::ROUTE, vec!["9080".to_owned()]),
    ] {
        let first = generated(type_url, &names);
        assert!(!first.is_empty(), "{type_url}: nothing generated");
        for _ in 0..3 {
            assert!(first == generated(type_url, &names), "{type_url}: the bytes changed");
        }
    }
}

/// A gateway's clusters, generated anew for a change of route weights, keep their bytes: Istio's
/// cluster metadata (`services`, a list of `Struct`s) encodes in a stable order, so delta xDS
/// does not resend them.
#[test]
fn gateway_clusters_do_not_change_with_a_route_weight() {
    let docs = |v1: u32| {
        vec![
            crate::testing::reviews(),
            crate::testing::destination_rule(
                "reviews",
                "default",
                json!({"host": "reviews.default.svc.cluster.local",
                       "subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}]}),
            ),
            crate::testing::ingress_gateway(
                json!([{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]),
            ),
            virtual_service(
                "bookinfo",
                "istio-system",
                json!({"hosts": ["bookinfo.example.com"], "gateways": ["gw"], "http": [{"route": [
                    {"destination": {"host": "reviews.default.svc.cluster.local", "subset": "v1"}, "weight": v1},
                    {"destination": {"host": "reviews.default.svc.cluster.local", "subset": "v2"}, "weight": 100 - v1}]}]}),
            ),
        ]
    };
    let gw = crate::testing::gateway_proxy();
    let clusters = |v1| {
        let p = push(docs(v1));
        generate(&p, &PushCache::default(), &gw, xds_api::type_url::CLUSTER, &[])
            .unwrap()
            .into_iter()
            .map(|r| (r.name.clone(), r.resource.value.clone()))
            .collect::<Vec<_>>()
    };
    let (a, b) = (clusters(75), clusters(0));
    assert!(!a.is_empty());
    for ((n, x), (_, y)) in a.iter().zip(&b) {
        assert!(x == y, "{n}: the bytes changed");
    }
    assert_eq!(a.len(), b.len());
}
