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
