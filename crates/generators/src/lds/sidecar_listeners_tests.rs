//! Sidecar ingress listeners and per-port egress listeners across LDS, RDS and CDS: behaviour
//! tables ("a request from the sidecar to host H port P reaches cluster C, passthrough or
//! blackhole"; "inbound port P goes to cluster C whose endpoint is D"), the per-proxy cache keys,
//! the golden file `lds_sidecar_ingress_egress.json` and the real Envoy's verdict on the full set.

use prost::Message;
use serde_json::{Value, json};
use xds_api::envoy::config::cluster::v3::{Cluster, cluster};
use xds_api::envoy::config::core::v3::address;
use xds_api::envoy::config::endpoint::v3::lb_endpoint;
use xds_api::envoy::config::listener::v3::{FilterChain, Listener};
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager as hcm;

use crate::lds::build_listeners;
use crate::route::testing::{Outcome, Request, evaluate};
use crate::testing::{
    assert_golden, config, envoy_binary, hcm_of, inline_route_cluster, push, service_entry, sidecar, sidecar_at,
    tcp_cluster,
};
use model::Proxy;
use push_index::PushContext;

/// `name.ns.svc.cluster.local` with a VIP, `ports` and `endpoints` as a ServiceEntry writes them.
fn svc(name: &str, ns: &str, vip: &str, ports: Value, endpoints: Value) -> Value {
    service_entry(
        name,
        ns,
        json!({"hosts": [format!("{name}.{ns}.svc.cluster.local")], "addresses": [vip], "location": "MESH_INTERNAL",
            "resolution": "STATIC", "ports": ports, "endpoints": endpoints}),
    )
}

fn http(port: u16) -> Value {
    json!({"number": port, "name": format!("http-{port}"), "protocol": "HTTP"})
}

fn tcp(port: u16) -> Value {
    json!({"number": port, "name": format!("tcp-{port}"), "protocol": "TCP"})
}

/// The services; the proxy (10.0.0.9) is an endpoint of `reviews` (target port 8080).
fn services() -> Vec<Value> {
    let far = json!([{"address": "10.1.0.1"}]);
    vec![
        svc(
            "reviews",
            "default",
            "10.96.0.10",
            json!([{"number": 9080, "name": "http", "protocol": "HTTP", "targetPort": 8080}]),
            json!([{"address": "10.0.0.9"}]),
        ),
        svc("details", "default", "10.96.0.11", json!([http(9080)]), far.clone()),
        svc(
            "productpage",
            "default",
            "10.96.0.12",
            json!([http(9080), http(9081)]),
            far.clone(),
        ),
        svc("ratings", "other", "10.96.0.20", json!([http(9080)]), far.clone()),
        svc("mysql", "default", "240.0.0.10", json!([tcp(3306)]), far.clone()),
        svc("legacy", "default", "240.0.0.30", json!([tcp(9080)]), far.clone()),
        svc("mongo", "other", "240.0.0.20", json!([tcp(27017)]), far),
        config(
            "VirtualService",
            "details",
            "default",
            json!({"hosts": ["details"], "http": [{"route": [{"destination": {"host": "ratings.other.svc.cluster.local"}}]}]}),
        ),
    ]
}

/// The Sidecar of `default`: ingress on 9080 (HTTP to 127.0.0.1:8080), 9090 (TCP to the pod IP's
/// 7070), 9443 (gRPC to a unix socket) and 9100 (TCP, capture mode NONE); egress on 9080 for reviews
/// and details only, and the catch-all for the rest of `default`.
fn mesh(outbound_mode: &str) -> Vec<Value> {
    let mut docs = services();
    docs.push(config(
        "Sidecar",
        "default",
        "default",
        json!({
            "ingress": [
                {"port": {"number": 9080, "protocol": "HTTP", "name": "http"}, "defaultEndpoint": "127.0.0.1:8080"},
                {"port": {"number": 9090, "protocol": "TCP", "name": "tcp"}, "defaultEndpoint": "0.0.0.0:7070"},
                {"port": {"number": 9443, "protocol": "GRPC", "name": "grpc"}, "defaultEndpoint": "unix:///var/run/app.sock"},
                {"port": {"number": 9100, "protocol": "TCP", "name": "tcp-bound"}, "captureMode": "NONE",
                 "defaultEndpoint": "127.0.0.1:9100"}],
            "egress": [
                {"port": {"number": 9080, "protocol": "HTTP", "name": "http"},
                 "hosts": ["./reviews.default.svc.cluster.local", "./details.default.svc.cluster.local"]},
                {"hosts": ["./*"]}],
            "outboundTrafficPolicy": {"mode": outbound_mode}
        }),
    ));
    docs
}

fn listener<'a>(ls: &'a [Listener], name: &str) -> Option<&'a Listener> {
    ls.iter().find(|l| l.name == name)
}

/// The cluster of a chain: its tcp_proxy's, or the one its inline route sends everything to.
fn chain_cluster(c: &FilterChain) -> Option<String> {
    if c.filters.iter().any(|f| f.name == crate::lds::sidecar::TCP_PROXY) {
        return tcp_cluster(c);
    }
    inline_route_cluster(c)
}

/// Where an outbound connection from the sidecar to `ip:port` (an HTTP request for `host` when
/// `host` is set) ends: the listener of that address, else of 0.0.0.0, else `virtualOutbound`'s
/// catch-all; HTTP through the route configuration its HCM names (`502` for `block_all`).
fn outbound(push: &PushContext, proxy: &Proxy, ip: &str, port: u16, host: Option<&str>) -> String {
    let ls = build_listeners(proxy, push);
    let by_name = |n: String| listener(&ls, &n).filter(|l| l.bind_to_port.as_ref().is_some_and(|b| !b.value));
    let Some(l) = by_name(format!("{ip}_{port}")).or_else(|| by_name(format!("0.0.0.0_{port}"))) else {
        let vo = listener(&ls, crate::lds::sidecar::VIRTUAL_OUTBOUND_LISTENER).unwrap();
        let catch_all = vo
            .filter_chains
            .iter()
            .find(|c| c.filter_chain_match.is_none())
            .unwrap();
        return chain_cluster(catch_all).unwrap();
    };
    let chains = || l.filter_chains.iter().chain(&l.default_filter_chain);
    match host {
        Some(host) => {
            let h = chains().find_map(hcm_of).expect("an HTTP chain");
            let Some(hcm::RouteSpecifier::Rds(rds)) = h.route_specifier else {
                panic!("outbound HCM without RDS")
            };
            let rc = crate::rds::build_route_configs(proxy, push, &[rds.route_config_name]).remove(0);
            match evaluate(&rc, &Request::get(&format!("{host}:{port}"), "/")).0 {
                Outcome::Cluster(c) => c,
                Outcome::Direct(status, _) => status.to_string(),
                other => format!("{other:?}"),
            }
        }
        None => chains().find_map(chain_cluster).expect("a TCP chain"),
    }
}

/// The endpoint of a cluster: `ip:port`, `unix:<path>`, or `original destination`.
fn endpoint_of(clusters: &[Cluster], name: &str) -> String {
    let c = clusters
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no cluster {name}"));
    if c.cluster_discovery_type
        == Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::OriginalDst as i32,
        ))
    {
        return "original destination".into();
    }
    let la = c
        .load_assignment
        .as_ref()
        .expect("a STATIC cluster has its endpoint inline");
    let e = &la.endpoints[0].lb_endpoints[0];
    let Some(lb_endpoint::HostIdentifier::Endpoint(e)) = &e.host_identifier else {
        panic!("no endpoint")
    };
    match e.address.as_ref().and_then(|a| a.address.as_ref()) {
        Some(address::Address::SocketAddress(s)) => match s.port_specifier {
            Some(xds_api::envoy::config::core::v3::socket_address::PortSpecifier::PortValue(p)) => {
                format!("{}:{p}", s.address)
            }
            _ => s.address.clone(),
        },
        Some(address::Address::Pipe(p)) => format!("unix:{}", p.path),
        other => format!("{other:?}"),
    }
}

/// Where an inbound connection to `port` through `listener_name` goes: (cluster, its endpoint).
fn inbound(push: &PushContext, proxy: &Proxy, listener_name: &str, port: u32) -> (String, String) {
    let ls = build_listeners(proxy, push);
    let l = listener(&ls, listener_name).unwrap_or_else(|| panic!("no listener {listener_name}"));
    let dport = |c: &&FilterChain| {
        c.filter_chain_match
            .as_ref()
            .and_then(|m| m.destination_port.as_ref())
            .map(|p| p.value)
    };
    let chain = l
        .filter_chains
        .iter()
        .find(|c| dport(c) == Some(port))
        .or_else(|| {
            l.filter_chains
                .iter()
                .find(|c| c.name == crate::lds::sidecar::VIRTUAL_INBOUND_LISTENER)
        })
        .unwrap();
    let cluster = chain_cluster(chain).unwrap();
    let clusters = crate::cds::build_clusters(proxy, push);
    let endpoint = endpoint_of(&clusters, &cluster);
    (cluster, endpoint)
}

const REVIEWS: &str = "reviews.default.svc.cluster.local";
const DETAILS: &str = "details.default.svc.cluster.local";
const PRODUCTPAGE: &str = "productpage.default.svc.cluster.local";
const RATINGS: &str = "ratings.other.svc.cluster.local";

#[test]
fn outbound_requests_follow_the_egress_listener_of_their_port() {
    for (mode, passthrough, blocked_http, blocked_tcp) in [
        (
            "ALLOW_ANY",
            "PassthroughCluster",
            "PassthroughCluster",
            "PassthroughCluster",
        ),
        ("REGISTRY_ONLY", "BlackHoleCluster", "502", "BlackHoleCluster"),
    ] {
        let p = push(mesh(mode));
        let proxy = sidecar("default");
        let table: [(&str, u16, Option<&str>, &str); 8] = [
            // the 9080 egress listener: reviews and details (whose VirtualService sends to ratings)
            (
                "10.96.0.10",
                9080,
                Some(REVIEWS),
                "outbound|9080||reviews.default.svc.cluster.local",
            ),
            (
                "10.96.0.11",
                9080,
                Some(DETAILS),
                "outbound|9080||ratings.other.svc.cluster.local",
            ),
            // productpage is imported by the catch-all only, which has no say on port 9080
            ("10.96.0.12", 9080, Some(PRODUCTPAGE), blocked_http),
            (
                "10.96.0.12",
                9081,
                Some(PRODUCTPAGE),
                "outbound|9081||productpage.default.svc.cluster.local",
            ),
            // another namespace is imported by no listener
            ("10.96.0.20", 9080, Some(RATINGS), blocked_http),
            // TCP services of the catch-all, on their VIPs (even on port 9080)
            (
                "240.0.0.10",
                3306,
                None,
                "outbound|3306||mysql.default.svc.cluster.local",
            ),
            (
                "240.0.0.30",
                9080,
                None,
                "outbound|9080||legacy.default.svc.cluster.local",
            ),
            ("240.0.0.20", 27017, None, blocked_tcp),
        ];
        for (ip, port, host, want) in table {
            assert_eq!(
                outbound(&p, &proxy, ip, port, host),
                want,
                "{mode}: {ip}:{port} ({host:?})"
            );
        }
        // an undeclared destination goes where the Sidecar's policy says
        assert_eq!(outbound(&p, &proxy, "192.0.2.1", 4000, None), passthrough, "{mode}");
    }
}

#[test]
fn clusters_are_those_of_every_egress_listener_and_their_virtual_service_destinations() {
    let p = push(mesh("ALLOW_ANY"));
    let names: Vec<String> = crate::cds::build_clusters(&sidecar("default"), &p)
        .into_iter()
        .map(|c| c.name)
        .collect();
    for want in [
        "outbound|9080||reviews.default.svc.cluster.local",
        "outbound|9080||details.default.svc.cluster.local",
        "outbound|9080||productpage.default.svc.cluster.local",
        "outbound|9081||productpage.default.svc.cluster.local",
        "outbound|3306||mysql.default.svc.cluster.local",
        // not imported, but the destination of the details VirtualService
        "outbound|9080||ratings.other.svc.cluster.local",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} missing from {names:?}");
    }
    assert!(!names.iter().any(|n| n.contains("mongo")), "{names:?}");
}

#[test]
fn inbound_ports_are_the_ingress_listeners_going_to_their_default_endpoint() {
    let p = push(mesh("ALLOW_ANY"));
    let proxy = sidecar("default");
    let vi = crate::lds::sidecar::VIRTUAL_INBOUND_LISTENER;
    let table = [
        (vi, 9080, "inbound|9080||", "127.0.0.1:8080"),
        (vi, 9090, "inbound|9090||", "10.0.0.9:7070"),
        (vi, 9443, "inbound|9443||", "unix:/var/run/app.sock"),
        // the instance port of reviews is no longer served: the Sidecar replaces the instances
        (vi, 8080, "InboundPassthroughCluster", "original destination"),
        // capture mode NONE: a listener of its own on the pod IP, not a chain of virtualInbound
        (vi, 9100, "InboundPassthroughCluster", "original destination"),
        ("10.0.0.9_9100", 9100, "inbound|9100||", "127.0.0.1:9100"),
    ];
    for (l, port, cluster, endpoint) in table {
        assert_eq!(
            inbound(&p, &proxy, l, port),
            (cluster.to_owned(), endpoint.to_owned()),
            "{l} port {port}"
        );
    }
    let clusters = crate::cds::build_clusters(&proxy, &p);
    let cluster = |n: &str| clusters.iter().find(|c| c.name == n).unwrap();
    assert!(!clusters.iter().any(|c| c.name == "inbound|8080||"));
    // only connections to localhost skip the 127.0.0.6 source address
    assert!(cluster("inbound|9080||").upstream_bind_config.is_none());
    assert!(cluster("inbound|9090||").upstream_bind_config.is_some());
    // the ingress port's protocol decides the upstream protocol
    let h2 = |c: &Cluster| {
        c.typed_extension_protocol_options
            .contains_key(crate::cds::HTTP_PROTOCOL_OPTIONS)
    };
    assert!(h2(cluster("inbound|9443||")) && !h2(cluster("inbound|9090||")));
    let bound = build_listeners(&proxy, &p)
        .into_iter()
        .find(|l| l.name == "10.0.0.9_9100")
        .unwrap();
    assert_eq!(bound.bind_to_port, None, "binds its port");
    // PERMISSIVE (no PeerAuthentication): mTLS or plaintext, told apart by the TLS inspector; a TCP
    // port needs no HTTP inspector
    let filters: Vec<&str> = bound.listener_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(filters, ["envoy.filters.listener.tls_inspector"]);
}

/// In `bound`: egress on 9080 with capture mode NONE (127.0.0.1) for reviews, on 3306 bound to
/// 127.0.0.2 for mysql, on 9081 bound to 127.0.0.3 but redirected, and the catch-all for `default`.
fn bound_mesh() -> Vec<Value> {
    let mut docs = services();
    docs.push(config(
        "Sidecar",
        "default",
        "bound",
        json!({"egress": [
            {"port": {"number": 9080, "protocol": "HTTP", "name": "http"}, "captureMode": "NONE",
             "hosts": ["default/reviews.default.svc.cluster.local"]},
            {"port": {"number": 3306, "protocol": "TCP", "name": "tcp"}, "bind": "127.0.0.2", "captureMode": "NONE",
             "hosts": ["default/mysql.default.svc.cluster.local"]},
            {"port": {"number": 9081, "protocol": "HTTP", "name": "http-redirected"}, "bind": "127.0.0.3",
             "hosts": ["default/*"]},
            {"hosts": ["default/*"]}]}),
    ));
    docs
}

#[test]
fn egress_listeners_with_capture_mode_none_bind_their_address() {
    let p = push(bound_mesh());
    let proxy = crate::testing::proxy("sidecar", "bound", json!({}));
    let ls = build_listeners(&proxy, &p);
    let http = listener(&ls, "127.0.0.1_9080").expect("bound to localhost by default");
    assert_eq!(http.bind_to_port, None);
    assert_eq!(
        http.max_connections_to_accept_per_socket_event.map(|v| v.value),
        Some(1)
    );
    let h = http.filter_chains.iter().find_map(hcm_of).unwrap();
    let Some(hcm::RouteSpecifier::Rds(rds)) = h.route_specifier else {
        panic!("RDS expected")
    };
    let rc = crate::rds::build_route_configs(&proxy, &p, &[rds.route_config_name]).remove(0);
    let to = |host: &str| evaluate(&rc, &Request::get(&format!("{host}:9080"), "/")).0;
    assert_eq!(to(REVIEWS), Outcome::Cluster(format!("outbound|9080||{REVIEWS}")));
    assert_eq!(
        to(DETAILS),
        Outcome::Cluster("PassthroughCluster".into()),
        "details is not on 9080's listener"
    );
    let mysql = listener(&ls, "127.0.0.2_3306").expect("bound to its bind");
    assert_eq!(mysql.bind_to_port, None);
    assert_eq!(
        mysql.filter_chains.iter().find_map(chain_cluster).as_deref(),
        Some("outbound|3306||mysql.default.svc.cluster.local")
    );
    // a bind without capture mode NONE names the listener but takes redirected connections
    let redirected = listener(&ls, "127.0.0.3_9081").expect("named after its bind");
    assert_eq!(redirected.bind_to_port.map(|b| b.value), Some(false));
    // as Istio, the lock is per (bind, port): the catch-all still builds 0.0.0.0:9081
    assert!(listener(&ls, "0.0.0.0_9081").is_some());
    // the catch-all still builds what the other listeners did not claim, on their own addresses
    assert_eq!(
        outbound(&p, &proxy, "240.0.0.10", 3306, None),
        "outbound|3306||mysql.default.svc.cluster.local"
    );
    // ... and HTTP on 0.0.0.0:9080, whose routes `9080` are still those of the 9080 egress
    // listener (Istio's `GetEgressListenerForRDS` goes by port only)
    assert!(listener(&ls, "0.0.0.0_9080").is_some());
    assert_eq!(
        outbound(&p, &proxy, "10.96.0.11", 9080, Some(DETAILS)),
        "PassthroughCluster"
    );
}

#[test]
fn cached_listeners_and_clusters_follow_the_proxy_ip_that_ingress_listeners_use() {
    let p = push(mesh("ALLOW_ANY"));
    let cache = crate::PushCache::default();
    let names = |type_url: &str, proxy: &Proxy| -> Vec<String> {
        crate::generate(&p, &cache, proxy, type_url, &[])
            .unwrap()
            .into_iter()
            .map(|r| r.name)
            .collect()
    };
    let (a, b) = (sidecar_at("10.0.0.9"), sidecar_at("10.0.0.10"));
    assert!(names(xds_api::type_url::LISTENER, &a).contains(&"10.0.0.9_9100".to_owned()));
    assert!(names(xds_api::type_url::LISTENER, &b).contains(&"10.0.0.10_9100".to_owned()));
    let cluster_9090 = |proxy: &Proxy| {
        let any = crate::generate(&p, &cache, proxy, xds_api::type_url::CLUSTER, &[])
            .unwrap()
            .into_iter()
            .find(|r| r.name == "inbound|9090||")
            .unwrap()
            .resource;
        let c = Cluster::decode(any.value.as_slice()).unwrap();
        endpoint_of(&[c], "inbound|9090||")
    };
    assert_eq!(cluster_9090(&a), "10.0.0.9:7070");
    assert_eq!(cluster_9090(&b), "10.0.0.10:7070");
}

#[test]
fn lds_sidecar_ingress_egress_golden() {
    let p = push(mesh("ALLOW_ANY"));
    let proxy = sidecar("default");
    let listeners: Vec<Value> = build_listeners(&proxy, &p)
        .iter()
        .map(|l| xds_api::json::message_to_json(l).unwrap())
        .collect();
    let clusters: Vec<Value> = crate::cds::build_clusters(&proxy, &p)
        .iter()
        .filter(|c| c.name.starts_with("inbound|"))
        .map(|c| xds_api::json::message_to_json(c).unwrap())
        .collect();
    let routes: Vec<Value> = crate::rds::build_route_configs(&proxy, &p, &["9080".into(), "9081".into()])
        .iter()
        .map(|r| xds_api::json::message_to_json(r).unwrap())
        .collect();
    let all = json!({"listeners": listeners, "inboundClusters": clusters, "routes": routes});
    assert_golden(
        "lds_sidecar_ingress_egress.json",
        &serde_json::to_string_pretty(&all).unwrap(),
    );
}

#[test]
fn envoy_accepts_listeners_and_clusters_of_sidecars_with_ingress_and_egress_listeners() {
    let envoy = envoy_binary();
    let cases = [
        (push(mesh("REGISTRY_ONLY")), sidecar("default")),
        (push(bound_mesh()), crate::testing::proxy("sidecar", "bound", json!({}))),
    ];
    for (p, proxy) in cases {
        let mut listeners = build_listeners(&proxy, &p);
        let clusters = crate::cds::build_clusters(&proxy, &p);
        // validate mode does not fetch RDS: each HCM gets its real route configuration inline
        crate::lds::envoy_tests::inline_rds(&mut listeners, |name| {
            crate::rds::build_route_configs(&proxy, &p, &[name.to_owned()]).remove(0)
        });
        crate::lds::envoy_tests::assert_accepted_with_ads(&envoy, &proxy.node_id, listeners, clusters, &proxy.id);
    }
}
