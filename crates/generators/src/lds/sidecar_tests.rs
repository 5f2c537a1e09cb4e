//! Sidecar LDS behaviour ("inbound port P is handled by chain C to cluster X", "outbound host:port
//! goes to listener L"), the golden file `lds_sidecar.json`, and the real Envoy's verdict on a
//! sidecar's full LDS + CDS set.

use serde_json::{Value, json};
use xds_api::envoy::config::listener::v3::{FilterChain, Listener};

use super::build_listeners;
use super::sidecar::{HTTP_INSPECTOR, ORIGINAL_DST_FILTER};
use crate::testing::{
    assert_golden, envoy_binary, hcm_of, inline_route_cluster, push, push_with_mesh, rds_name, reviews, service_entry,
    sidecar, tcp_cluster,
};

/// The proxy (10.0.0.9) runs `ratings` (HTTP 9080 → 8080, TCP 9090, unknown 7070); it sees
/// `reviews` (HTTP 9080), `mysql` (TCP 3306, VIP 240.0.0.10), `legacy` (TCP 9080, no VIP) and
/// `cache` (unknown protocol 6379, VIP 240.0.0.11).
fn mesh() -> Vec<Value> {
    vec![
        reviews(),
        service_entry(
            "ratings",
            "default",
            json!({"hosts": ["ratings.default.svc.cluster.local"], "location": "MESH_INTERNAL", "resolution": "STATIC",
                "ports": [{"number": 9080, "name": "http", "protocol": "HTTP", "targetPort": 8080},
                          {"number": 9090, "name": "tcp", "protocol": "TCP"},
                          {"number": 7070, "name": "sniffed"}],
                "endpoints": [{"address": "10.0.0.9"}, {"address": "10.0.0.20"}]}),
        ),
        service_entry(
            "mysql",
            "default",
            json!({"hosts": ["mysql.default.svc.cluster.local"], "addresses": ["240.0.0.10"], "location": "MESH_INTERNAL",
                "resolution": "STATIC", "ports": [{"number": 3306, "name": "tcp", "protocol": "TCP"}],
                "endpoints": [{"address": "10.3.0.1"}]}),
        ),
        service_entry(
            "legacy",
            "default",
            json!({"hosts": ["legacy.default.svc.cluster.local"], "location": "MESH_INTERNAL",
                "resolution": "STATIC", "ports": [{"number": 9080, "name": "tcp", "protocol": "TCP"},
                                                  {"number": 5000, "name": "tcp-other", "protocol": "TCP"}],
                "endpoints": [{"address": "10.4.0.1"}]}),
        ),
        service_entry(
            "cache",
            "default",
            json!({"hosts": ["cache.default.svc.cluster.local"], "addresses": ["240.0.0.11"], "location": "MESH_INTERNAL",
                "resolution": "STATIC", "ports": [{"number": 6379, "name": "cache"}],
                "endpoints": [{"address": "10.5.0.1"}]}),
        ),
    ]
}

fn listener<'a>(ls: &'a [Listener], name: &str) -> &'a Listener {
    ls.iter().find(|l| l.name == name).unwrap_or_else(|| {
        panic!(
            "no listener {name} in {:?}",
            ls.iter().map(|l| &l.name).collect::<Vec<_>>()
        )
    })
}

/// The chain Envoy picks for a connection to `port` (`alpn` from http_inspector, if any):
/// destination port first, then application protocols, as Envoy's filter chain matching; the
/// default chain when none matches.
fn chain_for<'a>(l: &'a Listener, port: u32, alpn: Option<&str>) -> &'a FilterChain {
    let matches_alpn = |c: &FilterChain| {
        let protocols = c.filter_chain_match.as_ref().map(|m| &m.application_protocols);
        protocols.is_none_or(|p| p.is_empty() || alpn.is_some_and(|a| p.iter().any(|x| x == a)))
    };
    let dport = |c: &FilterChain| {
        c.filter_chain_match
            .as_ref()
            .and_then(|m| m.destination_port.as_ref())
            .map(|p| p.value)
    };
    let by_port: Vec<_> = l.filter_chains.iter().filter(|c| dport(c) == Some(port)).collect();
    let candidates = if by_port.is_empty() {
        l.filter_chains.iter().filter(|c| dport(c).is_none()).collect()
    } else {
        by_port
    };
    let alpn_specific = candidates.iter().find(|c| {
        c.filter_chain_match
            .as_ref()
            .is_some_and(|m| !m.application_protocols.is_empty())
            && matches_alpn(c)
    });
    alpn_specific
        .or_else(|| candidates.iter().find(|c| matches_alpn(c)))
        .copied()
        .or(l.default_filter_chain.as_ref())
        .unwrap_or_else(|| panic!("no chain of {} for port {port}", l.name))
}

/// HTTP ports share the wildcard listener, sniffed as Istio's: HTTP (by ALPN) to RDS `<port>`,
/// anything else to the TCP service of the port without VIP (`legacy`'s 9080), which Istio keeps
/// as the fall-through chain.
#[test]
fn outbound_http_port_goes_to_the_shared_wildcard_listener_with_rds_named_after_the_port() {
    let ls = build_listeners(&sidecar("default"), &push(mesh()));
    let l = listener(&ls, "0.0.0.0_9080");
    assert_eq!(l.bind_to_port.as_ref().map(|b| b.value), Some(false));
    assert!(l.listener_filters.iter().any(|f| f.name == HTTP_INSPECTOR));
    let chain = chain_for(l, 9080, Some("http/1.1"));
    assert_eq!(rds_name(chain).as_deref(), Some("9080"));
    let m = chain.filter_chain_match.as_ref().unwrap();
    assert_eq!(m.transport_protocol, "raw_buffer");
    let h = hcm_of(chain).unwrap();
    assert_eq!(h.stat_prefix, "outbound_0.0.0.0_9080;", "Istio's delimiter");
    assert_eq!(h.use_remote_address.map(|b| b.value), Some(false));
    assert_eq!(
        tcp_cluster(chain_for(l, 9080, None)).as_deref(),
        Some("outbound|9080||legacy.default.svc.cluster.local"),
        "TCP to 9080 reaches the TCP service without VIP"
    );
}

/// Without a TCP service on the port, a connection the HTTP inspector does not recognise (TLS,
/// raw TCP) passes through to its destination (Istio's `PassthroughFilterChain`), or is
/// blackholed under REGISTRY_ONLY.
#[test]
fn non_http_traffic_to_an_http_port_passes_through() {
    let mut docs = mesh();
    docs.retain(|d| d["metadata"]["name"] != "legacy");
    let ls = build_listeners(&sidecar("default"), &push(docs));
    let l = listener(&ls, "0.0.0.0_9080");
    let fallthrough = l.default_filter_chain.as_ref().expect("a default chain");
    assert_eq!(fallthrough.name, "PassthroughFilterChain");
    assert_eq!(tcp_cluster(fallthrough).as_deref(), Some("PassthroughCluster"));
}

#[test]
fn outbound_tcp_ports_get_a_vip_listener_or_the_wildcard_one_without_vip() {
    let ls = build_listeners(&sidecar("default"), &push(mesh()));
    let mysql = listener(&ls, "240.0.0.10_3306");
    assert_eq!(mysql.bind_to_port.as_ref().map(|b| b.value), Some(false));
    assert_eq!(
        tcp_cluster(chain_for(mysql, 3306, None)).as_deref(),
        Some("outbound|3306||mysql.default.svc.cluster.local")
    );
    let legacy = listener(&ls, "0.0.0.0_5000");
    assert_eq!(
        tcp_cluster(chain_for(legacy, 5000, None)).as_deref(),
        Some("outbound|5000||legacy.default.svc.cluster.local")
    );
}

#[test]
fn unknown_protocol_ports_are_sniffed_into_http_or_tcp() {
    let ls = build_listeners(&sidecar("default"), &push(mesh()));
    let l = listener(&ls, "240.0.0.11_6379");
    assert!(l.listener_filters.iter().any(|f| f.name == HTTP_INSPECTOR));
    // Istio: a sniffed service on its own address routes by `<host>:<port>`
    assert_eq!(
        rds_name(chain_for(l, 6379, Some("http/1.1"))).as_deref(),
        Some("cache.default.svc.cluster.local:6379")
    );
    assert_eq!(
        tcp_cluster(chain_for(l, 6379, None)).as_deref(),
        Some("outbound|6379||cache.default.svc.cluster.local")
    );
}

#[test]
fn virtual_outbound_passes_unknown_destinations_through_or_blackholes_them() {
    let ls = build_listeners(&sidecar("default"), &push(mesh()));
    let vo = listener(&ls, "virtualOutbound");
    assert_eq!(vo.use_original_dst.map(|b| b.value), Some(true));
    assert_eq!(
        tcp_cluster(chain_for(vo, 12345, None)).as_deref(),
        Some("PassthroughCluster")
    );
    assert_eq!(
        tcp_cluster(chain_for(vo, 15001, None)).as_deref(),
        Some("BlackHoleCluster")
    );

    let mut registry_only = model::MeshConfig::default();
    registry_only.outbound_traffic_policy.mode = "REGISTRY_ONLY".into();
    let ls = build_listeners(&sidecar("default"), &push_with_mesh(registry_only, mesh()));
    let vo = listener(&ls, "virtualOutbound");
    assert_eq!(
        tcp_cluster(chain_for(vo, 12345, None)).as_deref(),
        Some("BlackHoleCluster")
    );
}

#[test]
fn virtual_inbound_sends_each_instance_port_to_its_inbound_cluster_and_others_through() {
    let ls = build_listeners(&sidecar("default"), &push(mesh()));
    let vi = listener(&ls, "virtualInbound");
    assert!(vi.listener_filters.iter().any(|f| f.name == ORIGINAL_DST_FILTER));
    // HTTP service port 9080 targets 8080: HCM with an inline route to inbound|8080||
    let http = chain_for(vi, 8080, None);
    assert_eq!(inline_route_cluster(http).as_deref(), Some("inbound|8080||"));
    assert_eq!(hcm_of(http).unwrap().stat_prefix, "inbound_0.0.0.0_8080;");
    assert_eq!(
        hcm_of(http).unwrap().server_name,
        "istio-envoy",
        "inbound answers say istio-envoy, as Istio's"
    );
    assert_eq!(
        tcp_cluster(chain_for(vi, 9090, None)).as_deref(),
        Some("inbound|9090||")
    );
    // unknown protocol: sniffed
    assert_eq!(
        inline_route_cluster(chain_for(vi, 7070, Some("h2c"))).as_deref(),
        Some("inbound|7070||")
    );
    assert_eq!(
        tcp_cluster(chain_for(vi, 7070, None)).as_deref(),
        Some("inbound|7070||")
    );
    // any other port: passthrough
    assert_eq!(
        tcp_cluster(chain_for(vi, 3000, None)).as_deref(),
        Some("InboundPassthroughCluster")
    );
    assert_eq!(
        inline_route_cluster(chain_for(vi, 3000, Some("http/1.1"))).as_deref(),
        Some("InboundPassthroughCluster")
    );
}

/// PeerAuthentication on the inbound chains (Istio's filter chain match options): the transport
/// protocols `virtualInbound` accepts on the HTTP port 8080, TCP 9090 and for passthrough, and
/// which of those chains terminate mTLS.
#[test]
fn peer_authentication_decides_the_inbound_chains() {
    let chains = |extra: Vec<Value>, proxy: model::Proxy| {
        let mut docs = mesh();
        docs.extend(extra);
        let ls = build_listeners(&proxy, &push(docs));
        let vi = listener(&ls, "virtualInbound").clone();
        let of = |port: Option<u32>| -> Vec<(String, bool)> {
            vi.filter_chains
                .iter()
                .filter(|c| {
                    c.filter_chain_match
                        .as_ref()
                        .and_then(|m| m.destination_port.as_ref())
                        .map(|p| p.value)
                        == port
                })
                .map(|c| {
                    let m = c.filter_chain_match.clone().unwrap_or_default();
                    (m.transport_protocol, c.transport_socket.is_some())
                })
                .collect()
        };
        (of(Some(8080)), of(Some(9090)), of(None), of(Some(3000)))
    };
    let pa =
        |ns: &str, spec: Value| crate::testing::config_in("security.istio.io/v1", "PeerAuthentication", "pa", ns, spec);
    let tls = |mtls| ("tls".to_owned(), mtls);
    let raw = || ("raw_buffer".to_owned(), false);

    // PERMISSIVE by default: mTLS (terminated) and plaintext
    let (http, tcp, _, _) = chains(vec![], sidecar("default"));
    assert_eq!(http, [tls(true), raw()]);
    assert_eq!(tcp, [tls(true), tls(false), raw()]);
    // mesh-wide STRICT: mTLS only, on passthrough ports too
    let (http, tcp, passthrough, _) = chains(
        vec![pa("istio-system", json!({"mtls": {"mode": "STRICT"}}))],
        sidecar("default"),
    );
    assert_eq!(http, [tls(true)]);
    assert_eq!(tcp, [tls(true)]);
    assert!(
        passthrough.iter().all(|(t, mtls)| t == "tls" && *mtls),
        "{passthrough:?}"
    );
    // namespace DISABLE, and a workload-level port exception to STRICT
    let (http, tcp, _, _) = chains(
        vec![
            pa("default", json!({"mtls": {"mode": "DISABLE"}})),
            crate::testing::config_in(
                "security.istio.io/v1",
                "PeerAuthentication",
                "ratings",
                "default",
                json!({"selector": {"matchLabels": {"app": "ratings"}}, "portLevelMtls": {"9090": {"mode": "STRICT"}}}),
            ),
        ],
        crate::testing::proxy("sidecar", "default", json!({"app": "ratings"})),
    );
    assert_eq!(http, [raw()]);
    assert_eq!(tcp, [tls(true)]);
    // an Envoy without a workload identity: plaintext where PERMISSIVE allows it
    let bare = crate::testing::node(
        "sidecar",
        "10.0.0.9",
        "default",
        "default",
        json!({"WORKLOAD_IDENTITY_SOCKET_FILE": ""}),
    );
    let (http, _, _, _) = chains(vec![], bare);
    assert_eq!(http, [raw()]);
    // STRICT, but port 3000 (no service declares it) DISABLE: a passthrough chain of its own,
    // plaintext only, as Istio's per-port passthrough chains
    let (_, _, passthrough, port_3000) = chains(
        vec![
            pa("istio-system", json!({"mtls": {"mode": "STRICT"}})),
            crate::testing::config_in(
                "security.istio.io/v1",
                "PeerAuthentication",
                "legacy-port",
                "default",
                json!({"selector": {"matchLabels": {"app": "ratings"}}, "portLevelMtls": {"3000": {"mode": "DISABLE"}}}),
            ),
        ],
        crate::testing::proxy("sidecar", "default", json!({"app": "ratings"})),
    );
    assert!(
        passthrough.iter().all(|(t, mtls)| t == "tls" && *mtls),
        "{passthrough:?}"
    );
    assert!(
        !port_3000.is_empty() && port_3000.iter().all(|(_, mtls)| !mtls),
        "{port_3000:?}"
    );
}

#[test]
fn routers_keep_gateway_listeners_only() {
    let gateway = crate::testing::proxy("router", "istio-system", json!({"istio": "ingressgateway"}));
    let ls = build_listeners(&gateway, &push(mesh()));
    assert!(ls.iter().all(|l| !l.name.starts_with("virtual")), "{ls:?}");
}

#[test]
fn lds_sidecar_golden() {
    let ls = build_listeners(&sidecar("default"), &push(mesh()));
    let rendered: Vec<Value> = ls.iter().map(|l| xds_api::json::message_to_json(l).unwrap()).collect();
    assert_golden("lds_sidecar.json", &serde_json::to_string_pretty(&rendered).unwrap());
}

/// A sidecar whose ProxyConfig sets every `proxyHeaders` field: its HCMs, router filters and
/// clusters carry them, and Envoy takes the result.
#[test]
fn envoy_accepts_a_sidecar_with_every_proxy_header_setting() {
    use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
        HttpConnectionManager, http_connection_manager as hcm,
    };
    let envoy = envoy_binary();
    let p = push(mesh());
    let proxy = crate::testing::node(
        "sidecar",
        "10.0.0.9",
        "default",
        "default",
        json!({"PROXY_CONFIG": {"proxyHeaders": {
            "forwardedClientCert": "SANITIZE_SET", "setCurrentClientCertDetails": {"cert": true, "uri": false},
            "requestId": {"disabled": true}, "server": {"value": "my-proxy"}, "attemptCount": {"disabled": true},
            "envoyDebugHeaders": {"disabled": true}, "metadataExchangeHeaders": {"mode": "IN_MESH"},
            "preserveHttp1HeaderCase": true, "xForwardedPort": {"enabled": true}, "xForwardedHost": {"enabled": true}}}}),
    );
    let mut listeners = build_listeners(&proxy, &p);
    let hcms: Vec<(String, HttpConnectionManager)> = listeners
        .iter()
        .flat_map(|l| l.filter_chains.iter().map(move |c| (l.name.clone(), c)))
        .flat_map(|(l, c)| c.filters.iter().map(move |f| (l.clone(), f)))
        .filter_map(|(l, f)| match &f.config_type {
            Some(xds_api::envoy::config::listener::v3::filter::ConfigType::TypedConfig(any))
                if any.type_url.ends_with("HttpConnectionManager") =>
            {
                Some((l, prost::Message::decode(any.value.as_slice()).ok()?))
            }
            _ => None,
        })
        .collect();
    assert!(hcms.iter().any(|(l, _)| l == "virtualInbound") && hcms.len() > 1);
    for (listener, h) in &hcms {
        assert_eq!(h.server_name, "my-proxy", "{listener}");
        assert_eq!(
            h.generate_request_id,
            Some(xds_api::pbwkt::BoolValue { value: false }),
            "{listener}"
        );
        assert!(h.append_x_forwarded_port, "{listener}");
        assert!(
            h.http_protocol_options
                .as_ref()
                .is_some_and(|o| o.header_key_format.is_some()),
            "{listener}"
        );
        if listener == "virtualInbound" {
            assert_eq!(
                h.forward_client_cert_details,
                hcm::ForwardClientCertDetails::SanitizeSet as i32
            );
            let d = h.set_current_client_cert_details.unwrap_or_default();
            assert!(d.cert && !d.uri && d.dns && !d.chain, "{d:?}");
        }
    }
    let routes = crate::rds::build_route_configs(&proxy, &p, &["9080".to_owned()]);
    assert!(routes[0].virtual_hosts.iter().all(|v| !v.include_request_attempt_count));
    super::envoy_tests::inline_rds(&mut listeners, super::envoy_tests::passthrough_route);
    let clusters = crate::cds::build_clusters(&proxy, &p);
    let preserved = clusters
        .iter()
        .filter(|c| {
            c.typed_extension_protocol_options
                .get(crate::cds::HTTP_PROTOCOL_OPTIONS)
                .is_some_and(|o| String::from_utf8_lossy(&o.value).contains("preserve_case"))
        })
        .count();
    assert!(preserved >= 2, "HTTP clusters keep header case");
    super::envoy_tests::assert_accepted_with_ads(
        &envoy,
        &proxy.node_id,
        listeners,
        clusters,
        "every proxyHeaders setting",
    );
}

#[test]
fn envoy_accepts_a_sidecars_listeners_and_clusters() {
    let envoy = envoy_binary();
    let p = push(mesh());
    let proxy = sidecar("default");
    let mut listeners = build_listeners(&proxy, &p);
    // validate mode does not fetch RDS: serve each `<port>` as an inline route to PassthroughCluster
    super::envoy_tests::inline_rds(&mut listeners, super::envoy_tests::passthrough_route);
    let clusters = crate::cds::build_clusters(&proxy, &p);
    assert!(
        clusters.iter().any(|c| c.name == "inbound|8080||"),
        "inbound clusters present"
    );
    super::envoy_tests::assert_accepted_with_ads(&envoy, &proxy.node_id, listeners, clusters, "the sidecar config");
}
