//! Gateway servers that are not HTTP, through `build_listeners`, `build_clusters` and EDS over a
//! push: TCP servers with `tcp` routes, TLS terminated into TCP, PASSTHROUGH by SNI with `tls`
//! routes, AUTO_PASSTHROUGH (east-west) with its SNI-DNAT clusters, unprivileged gateways and
//! Service port translation.

use prost::Message;
use serde_json::{Value, json};
use xds_api::envoy::config::endpoint::v3::ClusterLoadAssignment;
use xds_api::envoy::config::listener::v3::{FilterChain, Listener};
use xds_api::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;

use crate::lds::build_listeners;
use crate::testing::{
    config_in, destination_rule, gateway_proxy, ingress_gateway, node, push, service_entry, tcp_cluster,
    virtual_service,
};

fn listener<'a>(listeners: &'a [Listener], name: &str) -> &'a Listener {
    listeners
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no listener {name} in {:?}", names(listeners)))
}

fn names(listeners: &[Listener]) -> Vec<&str> {
    listeners.iter().map(|l| l.name.as_str()).collect()
}

fn filter_names(c: &FilterChain) -> Vec<&str> {
    c.filters.iter().map(|f| f.name.as_str()).collect()
}

fn downstream_tls(c: &FilterChain) -> DownstreamTlsContext {
    let ts = c.transport_socket.as_ref().expect("a TLS transport socket");
    let Some(xds_api::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(any)) = &ts.config_type else {
        panic!("typed config expected");
    };
    DownstreamTlsContext::decode(any.value.as_slice()).unwrap()
}

/// A MESH_INTERNAL service `name.default.svc.cluster.local` on `port` (`protocol`) with one
/// endpoint of `labels` at 10.1.0.1.
fn mesh_service(name: &str, port: u16, protocol: &str, labels: Value) -> Value {
    service_entry(
        name,
        "default",
        json!({"hosts": [format!("{name}.default.svc.cluster.local")], "location": "MESH_INTERNAL",
               "resolution": "STATIC", "ports": [{"number": port, "name": "p", "protocol": protocol}],
               "endpoints": [{"address": "10.1.0.1", "labels": labels}]}),
    )
}

#[test]
fn a_tcp_server_forwards_with_the_tcp_route_of_its_virtual_service() {
    let push = push(vec![
        ingress_gateway(json!([{"port": {"number": 31400, "name": "tcp", "protocol": "TCP"}, "hosts": ["*"]}])),
        mesh_service("tcp-echo", 9000, "TCP", json!({})),
        virtual_service(
            "tcp-echo",
            "default",
            json!({"hosts": ["*"], "gateways": ["istio-system/gw"],
                   "tcp": [{"match": [{"port": 31400}], "route": [{"destination": {"host": "tcp-echo", "port": {"number": 9000}}}]}]}),
        ),
    ]);
    let listeners = build_listeners(&gateway_proxy(), &push);
    let l = listener(&listeners, "0.0.0.0_31400");
    assert_eq!(l.filter_chains.len(), 1);
    let chain = &l.filter_chains[0];
    assert!(chain.filter_chain_match.is_none(), "plain TCP matches every connection");
    assert!(chain.transport_socket.is_none());
    assert!(l.listener_filters.is_empty(), "no TLS inspector for plain TCP");
    assert_eq!(
        tcp_cluster(chain).as_deref(),
        Some("outbound|9000||tcp-echo.default.svc.cluster.local")
    );
}

#[test]
fn a_tcp_route_matching_another_port_or_gateway_is_not_used() {
    let push = push(vec![
        ingress_gateway(json!([{"port": {"number": 31400, "name": "tcp", "protocol": "TCP"}, "hosts": ["*"]}])),
        mesh_service("tcp-echo", 9000, "TCP", json!({})),
        virtual_service(
            "tcp-echo",
            "default",
            json!({"hosts": ["*"], "gateways": ["istio-system/gw"],
                   "tcp": [{"match": [{"port": 31401}], "route": [{"destination": {"host": "tcp-echo"}}]},
                           {"match": [{"gateways": ["istio-system/other"]}], "route": [{"destination": {"host": "tcp-echo"}}]}]}),
        ),
    ]);
    assert!(
        build_listeners(&gateway_proxy(), &push).is_empty(),
        "no route applies: no chain, no listener"
    );
}

#[test]
fn passthrough_servers_route_each_sni_with_tls_routes() {
    let push = push(vec![
        ingress_gateway(
            json!([{"port": {"number": 443, "name": "tls", "protocol": "TLS"}, "hosts": ["*.example.com"],
                                 "tls": {"mode": "PASSTHROUGH"}}]),
        ),
        mesh_service("a", 8443, "TLS", json!({})),
        mesh_service("b", 8443, "TLS", json!({})),
        virtual_service(
            "sni",
            "default",
            json!({"hosts": ["a.example.com", "b.example.com"], "gateways": ["istio-system/gw"],
                   "tls": [{"match": [{"port": 443, "sniHosts": ["a.example.com"]}], "route": [{"destination": {"host": "a"}}]},
                           {"match": [{"sniHosts": ["b.example.com"]}], "route": [{"destination": {"host": "b"}}]}]}),
        ),
        // a second VirtualService naming an SNI host already routed: its match is dropped
        virtual_service(
            "z-dup",
            "default",
            json!({"hosts": ["a.example.com"], "gateways": ["istio-system/gw"],
                   "tls": [{"match": [{"sniHosts": ["a.example.com"]}], "route": [{"destination": {"host": "b"}}]}]}),
        ),
    ]);
    let listeners = build_listeners(&gateway_proxy(), &push);
    let l = listener(&listeners, "0.0.0.0_443");
    assert_eq!(l.listener_filters[0].name, "envoy.filters.listener.tls_inspector");
    let chains: Vec<(Vec<String>, Option<String>)> = l
        .filter_chains
        .iter()
        .map(|c| {
            assert!(c.transport_socket.is_none(), "passthrough: no TLS termination");
            (
                c.filter_chain_match.clone().unwrap_or_default().server_names,
                tcp_cluster(c),
            )
        })
        .collect();
    assert_eq!(
        chains,
        [
            (
                vec!["a.example.com".to_owned()],
                Some("outbound|8443||a.default.svc.cluster.local".into())
            ),
            (
                vec!["b.example.com".to_owned()],
                Some("outbound|8443||b.default.svc.cluster.local".into())
            ),
        ]
    );
}

#[test]
fn tls_terminated_into_tcp_uses_the_tcp_route_behind_the_servers_certificate() {
    let push = push(vec![
        ingress_gateway(json!([
            {"port": {"number": 9443, "name": "tls-db", "protocol": "TLS"}, "hosts": ["db.example.com"],
             "tls": {"mode": "SIMPLE", "credentialName": "db-cert"}},
            {"port": {"number": 9444, "name": "tls-mesh", "protocol": "TLS"}, "hosts": ["mesh.example.com"],
             "tls": {"mode": "ISTIO_MUTUAL"}}
        ])),
        mesh_service("db", 5432, "TCP", json!({})),
        virtual_service(
            "db",
            "default",
            json!({"hosts": ["db.example.com", "mesh.example.com"], "gateways": ["istio-system/gw"],
                   "tcp": [{"route": [{"destination": {"host": "db"}}]}]}),
        ),
    ]);
    let listeners = build_listeners(&gateway_proxy(), &push);
    let chain = &listener(&listeners, "0.0.0.0_9443").filter_chains[0];
    assert_eq!(
        chain.filter_chain_match.as_ref().unwrap().server_names,
        ["db.example.com"]
    );
    assert_eq!(
        tcp_cluster(chain).as_deref(),
        Some("outbound|5432||db.default.svc.cluster.local")
    );
    let tls = downstream_tls(chain);
    let common = tls.common_tls_context.unwrap();
    assert_eq!(
        common.tls_certificate_sds_secret_configs[0].name,
        "kubernetes://db-cert"
    );
    assert_eq!(
        common.alpn_protocols,
        ["h2", "http/1.1"],
        "Istio offers HTTP ALPN even to TCP"
    );
    let mesh = downstream_tls(&listener(&listeners, "0.0.0.0_9444").filter_chains[0]);
    assert_eq!(
        mesh.common_tls_context.unwrap().alpn_protocols,
        ["istio-peer-exchange", "h2", "http/1.1"],
        "ISTIO_MUTUAL terminated into TCP: Istio's ALPNDownstreamWithMxc"
    );
}

#[test]
fn tcp_chains_carry_the_gateways_authorization() {
    let push = push(vec![
        ingress_gateway(json!([{"port": {"number": 31400, "name": "tcp", "protocol": "TCP"}, "hosts": ["*"]}])),
        mesh_service("tcp-echo", 9000, "TCP", json!({})),
        virtual_service(
            "tcp-echo",
            "default",
            json!({"hosts": ["*"], "gateways": ["istio-system/gw"], "tcp": [{"route": [{"destination": {"host": "tcp-echo"}}]}]}),
        ),
        config_in(
            "security.istio.io/v1",
            "AuthorizationPolicy",
            "deny-some",
            "istio-system",
            json!({"selector": {"matchLabels": {"istio": "ingressgateway"}}, "action": "DENY",
                   "rules": [{"from": [{"source": {"ipBlocks": ["10.9.0.0/16"]}}]}]}),
        ),
    ]);
    let listeners = build_listeners(&gateway_proxy(), &push);
    let chain = &listener(&listeners, "0.0.0.0_31400").filter_chains[0];
    assert_eq!(
        filter_names(chain),
        ["envoy.filters.network.rbac", "envoy.filters.network.tcp_proxy"]
    );
}

/// The east-west gateway of Istio's multi-network install: AUTO_PASSTHROUGH on 15443 for `*.local`.
fn east_west_push(extra: Vec<Value>) -> push_index::PushContext {
    let mut docs = vec![
        crate::testing::config(
            "Gateway",
            "cross-network-gateway",
            "istio-system",
            json!({"selector": {"istio": "ingressgateway"},
                   "servers": [{"port": {"number": 15443, "name": "tls", "protocol": "TLS"}, "hosts": ["*.local"],
                                "tls": {"mode": "AUTO_PASSTHROUGH"}}]}),
        ),
        // one endpoint with a sidecar (mTLS), one without
        service_entry(
            "reviews",
            "default",
            json!({"hosts": ["reviews.default.svc.cluster.local"], "location": "MESH_INTERNAL", "resolution": "STATIC",
                   "ports": [{"number": 9080, "name": "http", "protocol": "HTTP"}],
                   "endpoints": [{"address": "10.1.0.1", "labels": {"version": "v1", "security.istio.io/tlsMode": "istio"}},
                                 {"address": "10.1.0.2", "labels": {"version": "v2"}}]}),
        ),
        service_entry(
            "external",
            "default",
            json!({"hosts": ["api.external.local"], "location": "MESH_EXTERNAL", "resolution": "DNS",
                   "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}]}),
        ),
        destination_rule(
            "reviews",
            "default",
            json!({"host": "reviews", "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}),
        ),
    ];
    docs.extend(extra);
    push(docs)
}

#[test]
fn auto_passthrough_matches_the_sni_of_each_mesh_cluster_and_istio_alpns() {
    let push = east_west_push(Vec::new());
    let listeners = build_listeners(&gateway_proxy(), &push);
    let l = listener(&listeners, "0.0.0.0_15443");
    let chains: Vec<(Vec<String>, Vec<String>, Option<String>)> = l
        .filter_chains
        .iter()
        .map(|c| {
            let m = c.filter_chain_match.clone().unwrap();
            (m.server_names, m.application_protocols, tcp_cluster(c))
        })
        .collect();
    let alpns: Vec<String> = crate::mtls::ALL_ISTIO_MTLS_ALPNS
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(
        chains,
        [
            (
                vec!["outbound_.9080_._.reviews.default.svc.cluster.local".to_owned()],
                alpns.clone(),
                Some("outbound_.9080_._.reviews.default.svc.cluster.local".into())
            ),
            (
                vec!["outbound_.9080_.v1_.reviews.default.svc.cluster.local".to_owned()],
                alpns,
                Some("outbound_.9080_.v1_.reviews.default.svc.cluster.local".into())
            ),
        ],
        "mesh services only (not MESH_EXTERNAL), one chain per subset"
    );
    assert!(l.filter_chains.iter().all(|c| c.transport_socket.is_none()));
}

#[test]
fn auto_passthrough_adds_sni_dnat_clusters_without_tls_and_only_mtls_endpoints() {
    let push = east_west_push(Vec::new());
    let proxy = gateway_proxy();
    let clusters = crate::cds::build_clusters(&proxy, &push);
    let dnat: Vec<&str> = clusters
        .iter()
        .map(|c| c.name.as_str())
        .filter(|n| n.starts_with("outbound_."))
        .collect();
    assert_eq!(
        dnat,
        [
            "outbound_.9080_._.reviews.default.svc.cluster.local",
            "outbound_.9080_.v1_.reviews.default.svc.cluster.local"
        ]
    );
    let c = clusters.iter().find(|c| c.name == dnat[0]).unwrap();
    assert!(
        c.transport_socket.is_none() && c.transport_socket_matches.is_empty(),
        "the client's mTLS passes through"
    );
    assert_eq!(
        c.eds_cluster_config.as_ref().unwrap().service_name,
        "outbound_.9080_._.reviews.default.svc.cluster.local"
    );
    let normal = clusters
        .iter()
        .find(|c| c.name == "outbound|9080||reviews.default.svc.cluster.local")
        .unwrap();
    assert!(
        !normal.transport_socket_matches.is_empty(),
        "the gateway's own clusters keep auto mTLS"
    );

    let cache = crate::PushCache::default();
    let eds = crate::generate(
        &push,
        &cache,
        &proxy,
        xds_api::type_url::ENDPOINT,
        &[dnat[0].to_owned()],
    )
    .unwrap();
    let cla = ClusterLoadAssignment::decode(eds[0].resource.value.as_slice()).unwrap();
    let addresses: Vec<String> = cla
        .endpoints
        .iter()
        .flat_map(|l| &l.lb_endpoints)
        .map(|e| format!("{e:?}"))
        .collect();
    assert_eq!(addresses.len(), 1, "only the endpoint with a sidecar: {addresses:?}");
    assert!(addresses[0].contains("10.1.0.1"));

    let plain = push_index_without_auto_passthrough();
    assert!(
        crate::cds::build_clusters(&proxy, &plain)
            .iter()
            .all(|c| !c.name.starts_with("outbound_.")),
        "no AUTO_PASSTHROUGH server, no SNI-DNAT clusters"
    );
}

fn push_index_without_auto_passthrough() -> push_index::PushContext {
    push(vec![
        ingress_gateway(json!([{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}])),
        mesh_service("reviews", 9080, "HTTP", json!({})),
    ])
}

/// The gateway Service of `istioctl install` (80 -> 8080, 443 -> 8443) with the gateway proxy
/// (10.0.0.9) as its endpoint.
fn ingress_gateway_service() -> Value {
    service_entry(
        "istio-ingressgateway",
        "istio-system",
        json!({"hosts": ["istio-ingressgateway.istio-system.svc.cluster.local"], "location": "MESH_INTERNAL",
               "resolution": "STATIC",
               "ports": [{"number": 80, "name": "http2", "protocol": "HTTP", "targetPort": 8080},
                         {"number": 443, "name": "https", "protocol": "HTTPS", "targetPort": 8443}],
               "endpoints": [{"address": "10.0.0.9", "labels": {"istio": "ingressgateway"}}]}),
    )
}

#[test]
fn gateway_servers_listen_on_the_target_ports_of_the_gateway_service() {
    let push = push(vec![
        ingress_gateway(json!([{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}])),
        ingress_gateway_service(),
        mesh_service("reviews", 9080, "HTTP", json!({})),
        virtual_service(
            "reviews",
            "default",
            json!({"hosts": ["bookinfo.example.com"], "gateways": ["istio-system/gw"],
                   "http": [{"match": [{"port": 80}], "route": [{"destination": {"host": "reviews"}}]}]}),
        ),
    ]);
    let proxy = gateway_proxy();
    let listeners = build_listeners(&proxy, &push);
    assert_eq!(names(&listeners), ["0.0.0.0_8080"]);
    assert_eq!(
        crate::testing::rds_name(&listeners[0].filter_chains[0]).as_deref(),
        Some("http.8080")
    );
    let routes = crate::rds::build_route_configs(&proxy, &push, &["http.8080".to_owned()]);
    let vhost = &routes[0].virtual_hosts[0];
    assert_eq!(
        vhost.domains,
        ["bookinfo.example.com"],
        "the VirtualService's port 80 match still applies"
    );
    assert_eq!(vhost.name, "bookinfo.example.com:80");
}

#[test]
fn an_unprivileged_gateway_skips_ports_below_1024() {
    let push = push(vec![ingress_gateway(json!([
        {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]},
        {"port": {"number": 8080, "name": "http-alt", "protocol": "HTTP"}, "hosts": ["*"]}
    ]))]);
    let unprivileged = node(
        "router",
        "10.0.0.9",
        "istio-system",
        "istio-system",
        json!({"LABELS": {"istio": "ingressgateway"}, "UNPRIVILEGED_POD": "true"}),
    );
    assert_eq!(names(&build_listeners(&unprivileged, &push)), ["0.0.0.0_8080"]);
    let privileged = node(
        "router",
        "10.0.0.9",
        "istio-system",
        "istio-system",
        json!({"LABELS": {"istio": "ingressgateway"}, "UNPRIVILEGED_POD": ""}),
    );
    assert_eq!(
        names(&build_listeners(&privileged, &push)),
        ["0.0.0.0_80", "0.0.0.0_8080"],
        "an empty UNPRIVILEGED_POD is privileged, as Istio"
    );
}
