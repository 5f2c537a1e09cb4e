//! Delegate VirtualServices end to end through a real `PushContext`: "a request to host H path P,
//! at the gateway or from a sidecar, reaches cluster C" when the routing comes from a delegate,
//! and what changes when the delegate changes, goes missing or is not exported to the root.

use model::{ConfigKind, MeshConfig};
use push_index::{ChangeScope, PushContext};
use serde_json::{Value, json};
use xds_api::envoy::config::route::v3::RouteConfiguration;

use super::build_route_configs;
use crate::route::testing::{Outcome, Request, evaluate};
use crate::testing::{config, gateway_proxy, ingress_gateway, proxy, push, push_input, service_entry};

/// A service `name.ns.svc.cluster.local` on 9080 with a VIP.
fn svc(name: &str, ns: &str, vip: &str) -> Value {
    service_entry(
        name,
        ns,
        json!({"hosts": [format!("{name}.{ns}.svc.cluster.local")], "addresses": [vip],
               "location": "MESH_INTERNAL", "resolution": "STATIC",
               "ports": [{"number": 9080, "name": "http", "protocol": "HTTP"}],
               "endpoints": [{"address": "10.1.0.1"}]}),
    )
}

fn to(host: &str) -> Value {
    json!([{"destination": {"host": host, "port": {"number": 9080}}}])
}

/// Services, the ingress gateway, and the root VirtualService `bookinfo/front` (gateway and mesh)
/// that delegates `/shop` to `shop/cart` and sends everything else to productpage.
fn base() -> Vec<Value> {
    vec![
        svc("productpage", "bookinfo", "10.96.0.10"),
        svc("cart", "shop", "10.96.0.20"),
        svc("checkout", "shop", "10.96.0.30"),
        ingress_gateway(json!([{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}])),
        config(
            "VirtualService",
            "front",
            "bookinfo",
            json!({"hosts": ["shop.example.com", "productpage"], "gateways": ["istio-system/gw", "mesh"],
            "http": [
                {"match": [{"uri": {"prefix": "/shop"}}], "timeout": "7s",
                 "delegate": {"name": "cart", "namespace": "shop"}},
                {"route": to("productpage")}
            ]}),
        ),
    ]
}

/// The delegate `shop/cart`; its short hosts resolve in `shop`.
fn cart(export_to: Value, http: Value) -> Value {
    config(
        "VirtualService",
        "cart",
        "shop",
        json!({"exportTo": export_to, "http": http}),
    )
}

fn cart_v1() -> Value {
    cart(
        json!(["bookinfo"]),
        json!([
            {"match": [{"uri": {"prefix": "/shop/checkout"}}], "route": to("checkout")},
            // outside the root's `/shop`: conflicts, so this route is dropped
            {"match": [{"uri": {"prefix": "/admin"}}], "route": to("checkout")},
            {"route": to("cart")}
        ]),
    )
}

fn with(extra: Vec<Value>) -> Vec<Value> {
    let mut docs = base();
    docs.extend(extra);
    docs
}

fn gateway_routes(docs: Vec<Value>) -> RouteConfiguration {
    let push = push(docs);
    let gw = gateway_proxy();
    build_route_configs(&gw, &push, &["http.80".to_owned()]).remove(0)
}

fn sidecar_routes(docs: Vec<Value>) -> RouteConfiguration {
    let push = push(docs);
    build_route_configs(&proxy("sidecar", "bookinfo", json!({})), &push, &["9080".to_owned()]).remove(0)
}

fn cluster(name: &str, ns: &str) -> Outcome {
    Outcome::Cluster(format!("outbound|9080||{name}.{ns}.svc.cluster.local"))
}

/// Asserts `path → outcome` for `host` at the gateway and for `productpage` from a sidecar.
fn assert_both(docs: Vec<Value>, table: &[(&str, Outcome)]) {
    let gw = gateway_routes(docs.clone());
    let sc = sidecar_routes(docs);
    for (path, want) in table {
        assert_eq!(
            &evaluate(&gw, &Request::get("shop.example.com", path)).0,
            want,
            "gateway {path}"
        );
        assert_eq!(
            &evaluate(&sc, &Request::get("productpage", path)).0,
            want,
            "sidecar {path}"
        );
    }
}

#[test]
fn delegate_routes_replace_the_delegating_route_at_gateway_and_sidecar() {
    assert_both(
        with(vec![cart_v1()]),
        &[
            ("/shop/checkout/pay", cluster("checkout", "shop")),
            ("/shop/items", cluster("cart", "shop")),
            ("/shop", cluster("cart", "shop")),
            ("/admin", cluster("productpage", "bookinfo")),
            ("/", cluster("productpage", "bookinfo")),
        ],
    );
}

#[test]
fn merged_routes_keep_the_root_policy_where_the_delegate_sets_none() {
    let rc = gateway_routes(with(vec![cart_v1()]));
    let (_, route) = evaluate(&rc, &Request::get("shop.example.com", "/shop/items"));
    let Some(xds_api::envoy::config::route::v3::route::Action::Route(action)) = &route.expect("a route").action else {
        panic!("a route action")
    };
    assert_eq!(action.timeout.as_ref().map(|d| d.seconds), Some(7));
}

#[test]
fn a_delegate_change_changes_the_answer() {
    let cart_v2 = cart(json!(["bookinfo"]), json!([{"route": to("checkout")}]));
    assert_both(
        with(vec![cart_v2.clone()]),
        &[
            ("/shop/items", cluster("checkout", "shop")),
            ("/shop/checkout/pay", cluster("checkout", "shop")),
            ("/", cluster("productpage", "bookinfo")),
        ],
    );
    // the same change as a rebuilt push (only VirtualServices touched), as the server makes it
    let input = |docs: Vec<Value>| push_input(MeshConfig::default(), docs);
    let gw = gateway_proxy();
    let items = Request::get("shop.example.com", "/shop/items");
    let before = PushContext::new(input(with(vec![cart_v1()])));
    let rc = build_route_configs(&gw, &before, &["http.80".to_owned()]).remove(0);
    assert_eq!(evaluate(&rc, &items).0, cluster("cart", "shop"));
    let changed = ChangeScope {
        kinds: vec![ConfigKind::VirtualService],
        services: false,
    };
    let after = before.rebuild(input(with(vec![cart_v2])), &changed);
    let rc = build_route_configs(&gw, &after, &["http.80".to_owned()]).remove(0);
    assert_eq!(evaluate(&rc, &items).0, cluster("checkout", "shop"));
    // the root names its delegate in both pushes, so a change to the delegate concerns the root
    for push in [&before, &after] {
        let roots = push.virtual_services_for_gateway(&gw, "istio-system/gw");
        let names: Vec<String> = push
            .delegate_virtual_services(&roots)
            .iter()
            .map(|k| format!("{}/{}", k.namespace, k.name))
            .collect();
        assert_eq!(names, ["shop/cart"]);
    }
}

#[test]
fn a_missing_delegate_drops_the_delegating_route() {
    assert_both(
        base(),
        &[
            ("/shop/items", cluster("productpage", "bookinfo")),
            ("/shop/checkout/pay", cluster("productpage", "bookinfo")),
        ],
    );
}

#[test]
fn a_delegate_not_exported_to_the_root_namespace_is_not_used() {
    for export_to in [json!(["."]), json!(["other"])] {
        let hidden = cart(export_to.clone(), json!([{"route": to("cart")}]));
        let rc = gateway_routes(with(vec![hidden]));
        assert_eq!(
            evaluate(&rc, &Request::get("shop.example.com", "/shop/items")).0,
            cluster("productpage", "bookinfo"),
            "exportTo {export_to}"
        );
    }
    // exported to all (the mesh default) or to the root's namespace: used
    for export_to in [json!([]), json!(["*"]), json!(["bookinfo", "shop"])] {
        let visible = cart(export_to.clone(), json!([{"route": to("cart")}]));
        let rc = gateway_routes(with(vec![visible]));
        assert_eq!(
            evaluate(&rc, &Request::get("shop.example.com", "/shop/items")).0,
            cluster("cart", "shop"),
            "exportTo {export_to}"
        );
    }
}

#[test]
fn a_delegate_is_never_routed_on_its_own() {
    // a delegate has no hosts: nothing in it reaches any virtual host by itself
    let rc = gateway_routes(vec![
        svc("cart", "shop", "10.96.0.20"),
        ingress_gateway(json!([{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}])),
        cart_v1(),
    ]);
    // only the gateway's blackhole virtual host, with no routes
    assert!(
        rc.virtual_hosts.iter().all(|v| v.routes.is_empty()),
        "{:?}",
        rc.virtual_hosts
    );
    assert_eq!(
        evaluate(&rc, &Request::get("shop.example.com", "/shop/items")).0,
        Outcome::NotFound
    );
}
