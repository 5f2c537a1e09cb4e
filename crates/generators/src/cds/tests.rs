//! CDS behaviour: "service S port P with DestinationRule D produces clusters C with settings X".

use prost::Message;
use serde_json::json;
use xds_api::envoy::config::cluster::v3::{Cluster, cluster};
use xds_api::envoy::config::core::v3 as core;
use xds_api::envoy::extensions::transport_sockets::tls::v3::{UpstreamTlsContext, common_tls_context};
use xds_api::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use xds_api::envoy::extensions::upstreams::http::v3::http_protocol_options::{
    UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
};

use super::{HTTP_PROTOCOL_OPTIONS, build_clusters};
use crate::testing::{destination_rule, proxy, push, reviews, service_entry, sidecar};

fn find<'a>(clusters: &'a [Cluster], name: &str) -> &'a Cluster {
    clusters
        .iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no cluster {name}"))
}

fn names(clusters: &[Cluster]) -> Vec<&str> {
    clusters.iter().map(|c| c.name.as_str()).collect()
}

fn discovery(c: &Cluster) -> cluster::DiscoveryType {
    match c.cluster_discovery_type {
        Some(cluster::ClusterDiscoveryType::Type(t)) => cluster::DiscoveryType::try_from(t).unwrap(),
        _ => panic!("no discovery type"),
    }
}

fn lb(c: &Cluster) -> cluster::LbPolicy {
    cluster::LbPolicy::try_from(c.lb_policy).unwrap()
}

fn http_options(c: &Cluster) -> Option<HttpProtocolOptions> {
    c.typed_extension_protocol_options
        .get(HTTP_PROTOCOL_OPTIONS)
        .map(|a| HttpProtocolOptions::decode(a.value.as_slice()).unwrap())
}

fn secs(d: &Option<xds_api::pbwkt::Duration>) -> f64 {
    let d = d.as_ref().expect("duration set");
    d.seconds as f64 + f64::from(d.nanos) / 1e9
}

const REVIEWS: &str = "reviews.default.svc.cluster.local";

#[test]
fn service_with_subsets_gets_one_cluster_per_subset_with_the_rule_applied() {
    let p = push(vec![
        reviews(),
        destination_rule(
            "reviews",
            "default",
            json!({
                "host": "reviews",
                "trafficPolicy": {"loadBalancer": {"simple": "LEAST_CONN"},
                                  "outlierDetection": {"consecutive5xxErrors": 7, "interval": "5s", "baseEjectionTime": "30s",
                                                       "maxEjectionPercent": 50}},
                "subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}]
            }),
        ),
    ]);
    let clusters = build_clusters(&sidecar("default"), &p);
    assert_eq!(
        names(&clusters),
        [
            "outbound|9080||reviews.default.svc.cluster.local",
            "outbound|9080|v1|reviews.default.svc.cluster.local",
            "outbound|9080|v2|reviews.default.svc.cluster.local",
            "BlackHoleCluster",
            "PassthroughCluster",
            "InboundPassthroughCluster"
        ]
    );
    for c in &clusters[..3] {
        assert_eq!(discovery(c), cluster::DiscoveryType::Eds, "{}", c.name);
        let eds = c.eds_cluster_config.as_ref().unwrap();
        assert_eq!(eds.service_name, c.name);
        let source = eds.eds_config.as_ref().unwrap();
        assert_eq!(source.resource_api_version, core::ApiVersion::V3 as i32);
        assert!(matches!(
            source.config_source_specifier,
            Some(core::config_source::ConfigSourceSpecifier::Ads(_))
        ));
        assert_eq!(lb(c), cluster::LbPolicy::LeastRequest);
        let od = c.outlier_detection.as_ref().unwrap();
        assert_eq!(od.consecutive_5xx.as_ref().unwrap().value, 7);
        assert_eq!(od.enforcing_consecutive_5xx.as_ref().unwrap().value, 100);
        assert_eq!(od.enforcing_success_rate.as_ref().unwrap().value, 0);
        assert_eq!(od.max_ejection_percent.as_ref().unwrap().value, 50);
        assert_eq!(secs(&od.interval), 5.0);
        assert_eq!(secs(&od.base_ejection_time), 30.0);
        assert_eq!(
            c.common_lb_config
                .as_ref()
                .unwrap()
                .healthy_panic_threshold
                .as_ref()
                .unwrap()
                .value,
            0.0
        );
        assert_eq!(secs(&c.connect_timeout), 10.0);
        assert_eq!(c.alt_stat_name, format!("{};", c.name));
    }
}

#[test]
fn default_cluster_has_istio_defaults() {
    let p = push(vec![reviews()]);
    let clusters = build_clusters(&sidecar("default"), &p);
    let c = find(&clusters, &format!("outbound|9080||{REVIEWS}"));
    assert_eq!(lb(c), cluster::LbPolicy::LeastRequest);
    assert!(c.outlier_detection.is_none());
    let t = &c.circuit_breakers.as_ref().unwrap().thresholds[0];
    for v in [
        &t.max_connections,
        &t.max_pending_requests,
        &t.max_requests,
        &t.max_retries,
    ] {
        assert_eq!(v.as_ref().unwrap().value, u32::MAX);
    }
    assert!(http_options(c).is_none(), "plain HTTP/1.1 needs no protocol options");
    assert!(c.transport_socket.is_none());
}

#[test]
fn dns_services_get_dns_clusters_with_their_hosts() {
    let p = push(vec![
        service_entry(
            "api",
            "default",
            json!({
                "hosts": ["api.example.com"], "resolution": "DNS",
                "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}]
            }),
        ),
        service_entry(
            "db",
            "default",
            json!({
                "hosts": ["db.example.com"], "resolution": "DNS_ROUND_ROBIN",
                "ports": [{"number": 5432, "name": "tcp", "protocol": "TCP"}],
                "endpoints": [{"address": "db1.example.com"}]
            }),
        ),
    ]);
    let clusters = build_clusters(&sidecar("default"), &p);
    let api = find(&clusters, "outbound|443||api.example.com");
    assert_eq!(discovery(api), cluster::DiscoveryType::StrictDns);
    assert_eq!(api.dns_lookup_family, cluster::DnsLookupFamily::V4Only as i32);
    assert!(api.eds_cluster_config.is_none());
    let la = api.load_assignment.as_ref().unwrap();
    assert_eq!(la.cluster_name, api.name);
    let ep = &la.endpoints[0].lb_endpoints[0];
    let Some(xds_api::envoy::config::endpoint::v3::lb_endpoint::HostIdentifier::Endpoint(e)) = &ep.host_identifier
    else {
        panic!("no endpoint")
    };
    let Some(core::address::Address::SocketAddress(sa)) = e.address.as_ref().and_then(|a| a.address.as_ref()) else {
        panic!("no socket address")
    };
    assert_eq!(sa.address, "api.example.com");
    assert_eq!(
        sa.port_specifier,
        Some(core::socket_address::PortSpecifier::PortValue(443))
    );
    let db = find(&clusters, "outbound|5432||db.example.com");
    assert_eq!(discovery(db), cluster::DiscoveryType::LogicalDns);
    assert_eq!(db.load_assignment.as_ref().unwrap().endpoints[0].lb_endpoints.len(), 1);
}

#[test]
fn passthrough_services_forward_to_the_original_destination_except_on_gateways() {
    let p = push(vec![service_entry(
        "any",
        "default",
        json!({
            "hosts": ["*.internal.example.com"], "resolution": "NONE",
            "ports": [{"number": 8080, "name": "http", "protocol": "HTTP"}, {"number": 53, "name": "dns", "protocol": "UDP"}]
        }),
    )]);
    let clusters = build_clusters(&sidecar("default"), &p);
    let c = find(&clusters, "outbound|8080||*.internal.example.com");
    assert_eq!(discovery(c), cluster::DiscoveryType::OriginalDst);
    assert_eq!(lb(c), cluster::LbPolicy::ClusterProvided);
    assert!(c.eds_cluster_config.is_none());
    assert!(
        !names(&clusters).iter().any(|n| n.starts_with("outbound|53|")),
        "UDP ports get no cluster"
    );
    let gw = build_clusters(&proxy("router", "istio-system", json!({})), &p);
    assert_eq!(
        discovery(find(&gw, "outbound|8080||*.internal.example.com")),
        cluster::DiscoveryType::Eds
    );
    assert!(!names(&gw).contains(&"PassthroughCluster"));
    let pt = find(&clusters, "PassthroughCluster");
    assert_eq!(
        (discovery(pt), lb(pt)),
        (cluster::DiscoveryType::OriginalDst, cluster::LbPolicy::ClusterProvided)
    );
    let bh = find(&clusters, "BlackHoleCluster");
    assert_eq!(discovery(bh), cluster::DiscoveryType::Static);
    assert!(bh.load_assignment.is_none());
}

fn two_port_service() -> serde_json::Value {
    service_entry(
        "ratings",
        "default",
        json!({
            "hosts": ["ratings.default.svc.cluster.local"], "location": "MESH_INTERNAL", "resolution": "STATIC",
            "ports": [{"number": 9080, "name": "http", "protocol": "HTTP"}, {"number": 9443, "name": "grpc", "protocol": "GRPC"}],
            "endpoints": [{"address": "10.2.0.1", "labels": {"version": "v1"}}]
        }),
    )
}

#[test]
fn port_level_settings_replace_the_top_level_policy_for_their_port() {
    let p = push(vec![
        two_port_service(),
        destination_rule(
            "ratings",
            "default",
            json!({
                "host": "ratings",
                "trafficPolicy": {
                    "loadBalancer": {"simple": "RANDOM"},
                    "outlierDetection": {"consecutiveGatewayErrors": 3},
                    "portLevelSettings": [{"port": {"number": 9443}, "loadBalancer": {"simple": "ROUND_ROBIN"}}]
                }
            }),
        ),
    ]);
    let clusters = build_clusters(&sidecar("default"), &p);
    let http = find(&clusters, "outbound|9080||ratings.default.svc.cluster.local");
    assert_eq!(lb(http), cluster::LbPolicy::Random);
    assert_eq!(
        http.outlier_detection
            .as_ref()
            .unwrap()
            .consecutive_gateway_failure
            .as_ref()
            .unwrap()
            .value,
        3
    );
    let grpc = find(&clusters, "outbound|9443||ratings.default.svc.cluster.local");
    assert_eq!(lb(grpc), cluster::LbPolicy::RoundRobin);
    assert!(grpc.outlier_detection.is_none(), "port-level settings do not inherit");
}

#[test]
fn subsets_inherit_the_top_level_policy_and_override_their_own_fields() {
    let p = push(vec![
        two_port_service(),
        destination_rule(
            "ratings",
            "default",
            json!({
                "host": "ratings",
                "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 100}}, "loadBalancer": {"simple": "RANDOM"}},
                "subsets": [
                    {"name": "v1", "labels": {"version": "v1"}, "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}}},
                    {"name": "v2", "labels": {"version": "v2"}, "trafficPolicy": {
                        "portLevelSettings": [{"port": {"number": 9080}, "outlierDetection": {"consecutive5xxErrors": 2}}]}}
                ]
            }),
        ),
    ]);
    let clusters = build_clusters(&sidecar("default"), &p);
    let max_conn = |c: &Cluster| {
        c.circuit_breakers.as_ref().unwrap().thresholds[0]
            .max_connections
            .as_ref()
            .unwrap()
            .value
    };
    let v1 = find(&clusters, "outbound|9080|v1|ratings.default.svc.cluster.local");
    assert_eq!((lb(v1), max_conn(v1)), (cluster::LbPolicy::RoundRobin, 100));
    let v2_http = find(&clusters, "outbound|9080|v2|ratings.default.svc.cluster.local");
    // the subset's port-level entry replaces every field for 9080: default LB and pool
    assert_eq!(
        (lb(v2_http), max_conn(v2_http)),
        (cluster::LbPolicy::LeastRequest, u32::MAX)
    );
    assert_eq!(
        v2_http
            .outlier_detection
            .as_ref()
            .unwrap()
            .consecutive_5xx
            .as_ref()
            .unwrap()
            .value,
        2
    );
    let v2_grpc = find(&clusters, "outbound|9443|v2|ratings.default.svc.cluster.local");
    assert_eq!((lb(v2_grpc), max_conn(v2_grpc)), (cluster::LbPolicy::Random, 100));
}

fn is_h2(c: &Cluster) -> bool {
    matches!(
        http_options(c).and_then(|o| o.upstream_protocol_options),
        Some(UpstreamProtocolOptions::ExplicitHttpConfig(e)) if matches!(e.protocol_config, Some(ProtocolConfig::Http2ProtocolOptions(_)))
    )
}

#[test]
fn http2_ports_and_upgrades_speak_h2_upstream() {
    let p = push(vec![two_port_service()]);
    let clusters = build_clusters(&sidecar("default"), &p);
    assert!(is_h2(find(
        &clusters,
        "outbound|9443||ratings.default.svc.cluster.local"
    )));
    assert!(!is_h2(find(
        &clusters,
        "outbound|9080||ratings.default.svc.cluster.local"
    )));
    let p = push(vec![
        two_port_service(),
        destination_rule(
            "r",
            "default",
            json!({"host": "ratings",
            "trafficPolicy": {"connectionPool": {"http": {"h2UpgradePolicy": "UPGRADE"}}}}),
        ),
    ]);
    let clusters = build_clusters(&sidecar("default"), &p);
    assert!(is_h2(find(
        &clusters,
        "outbound|9080||ratings.default.svc.cluster.local"
    )));
}

#[test]
fn connection_pool_maps_to_circuit_breakers_timeouts_and_keepalive() {
    let p = push(vec![
        reviews(),
        destination_rule(
            "reviews",
            "default",
            json!({"host": "reviews", "trafficPolicy": {"connectionPool": {
                "tcp": {"maxConnections": 10, "connectTimeout": "2s", "tcpKeepalive": {"probes": 3, "time": "60s", "interval": "10s"}},
                "http": {"http1MaxPendingRequests": 5, "http2MaxRequests": 20, "maxRetries": 2, "maxRequestsPerConnection": 1,
                         "idleTimeout": "15s"}
            }}}),
        ),
    ]);
    let clusters = build_clusters(&sidecar("default"), &p);
    let c = find(&clusters, &format!("outbound|9080||{REVIEWS}"));
    let t = &c.circuit_breakers.as_ref().unwrap().thresholds[0];
    let v = |w: &Option<xds_api::pbwkt::UInt32Value>| w.as_ref().unwrap().value;
    assert_eq!(
        (
            v(&t.max_connections),
            v(&t.max_pending_requests),
            v(&t.max_requests),
            v(&t.max_retries)
        ),
        (10, 5, 20, 2)
    );
    assert_eq!(secs(&c.connect_timeout), 2.0);
    let ka = c
        .upstream_connection_options
        .as_ref()
        .unwrap()
        .tcp_keepalive
        .as_ref()
        .unwrap();
    assert_eq!(
        (
            v(&ka.keepalive_probes),
            v(&ka.keepalive_time),
            v(&ka.keepalive_interval)
        ),
        (3, 60, 10)
    );
    let common = http_options(c).unwrap().common_http_protocol_options.unwrap();
    assert_eq!(secs(&common.idle_timeout), 15.0);
    assert_eq!(v(&common.max_requests_per_connection), 1);
}

#[test]
fn consistent_hash_selects_ring_hash_or_maglev() {
    let lb_of = |hash: serde_json::Value| {
        let p = push(vec![
            reviews(),
            destination_rule(
                "reviews",
                "default",
                json!({"host": "reviews",
                "trafficPolicy": {"loadBalancer": {"consistentHash": hash}}}),
            ),
        ]);
        let clusters = build_clusters(&sidecar("default"), &p);
        let c = find(&clusters, &format!("outbound|9080||{REVIEWS}")).clone();
        (lb(&c), c.lb_config)
    };
    let (policy, config) = lb_of(json!({"httpHeaderName": "x-user", "ringHash": {"minimumRingSize": 2048}}));
    assert_eq!(policy, cluster::LbPolicy::RingHash);
    assert!(
        matches!(config, Some(cluster::LbConfig::RingHashLbConfig(r)) if r.minimum_ring_size.unwrap().value == 2048)
    );
    let (policy, _) = lb_of(json!({"useSourceIp": true, "maglev": {"tableSize": 65537}}));
    assert_eq!(policy, cluster::LbPolicy::Maglev);
    let (policy, config) = lb_of(json!({"httpCookie": {"name": "session", "ttl": "0s"}}));
    assert_eq!(policy, cluster::LbPolicy::RingHash);
    assert!(
        matches!(config, Some(cluster::LbConfig::RingHashLbConfig(r)) if r.minimum_ring_size.unwrap().value == 1024)
    );
}

fn tls_context(c: &Cluster) -> UpstreamTlsContext {
    let ts = c.transport_socket.as_ref().expect("transport socket");
    assert_eq!(ts.name, "envoy.transport_sockets.tls");
    let Some(core::transport_socket::ConfigType::TypedConfig(any)) = &ts.config_type else {
        panic!("no config")
    };
    UpstreamTlsContext::decode(any.value.as_slice()).unwrap()
}

#[test]
fn simple_tls_originates_with_sni_ca_and_sans() {
    let p = push(vec![
        service_entry(
            "api",
            "default",
            json!({"hosts": ["api.example.com"], "resolution": "DNS",
            "ports": [{"number": 443, "name": "https", "protocol": "HTTPS"}, {"number": 8443, "name": "tls-insecure", "protocol": "TLS"}]}),
        ),
        destination_rule(
            "api",
            "default",
            json!({"host": "api.example.com", "trafficPolicy": {
                "tls": {"mode": "SIMPLE", "sni": "api.example.com", "caCertificates": "/etc/certs/ca.pem",
                        "subjectAltNames": ["api.example.com", "spiffe://example.com/ns/x/sa/y"]},
                "portLevelSettings": [{"port": {"number": 8443}, "tls": {"mode": "SIMPLE", "insecureSkipVerify": true}}]
            }}),
        ),
    ]);
    let clusters = build_clusters(&sidecar("default"), &p);
    let ctx = tls_context(find(&clusters, "outbound|443||api.example.com"));
    assert_eq!(ctx.sni, "api.example.com");
    let common = ctx.common_tls_context.unwrap();
    let Some(common_tls_context::ValidationContextType::ValidationContext(v)) = common.validation_context_type else {
        panic!("no validation context")
    };
    assert_eq!(
        v.trusted_ca.unwrap().specifier,
        Some(core::data_source::Specifier::Filename("/etc/certs/ca.pem".into()))
    );
    let sans: Vec<(i32, String)> = v
        .match_typed_subject_alt_names
        .iter()
        .map(|m| (m.san_type, format!("{:?}", m.matcher.as_ref().unwrap().match_pattern)))
        .collect();
    assert_eq!(sans.len(), 2);
    assert_eq!(
        sans[1].0,
        xds_api::envoy::extensions::transport_sockets::tls::v3::subject_alt_name_matcher::SanType::Uri as i32
    );
    let insecure = find(&clusters, "outbound|8443||api.example.com");
    let ctx = tls_context(insecure);
    let Some(common_tls_context::ValidationContextType::ValidationContext(v)) =
        ctx.common_tls_context.unwrap().validation_context_type
    else {
        panic!("no validation context")
    };
    assert!(v.trusted_ca.is_none(), "insecureSkipVerify: no verification");
    let upstream = http_options(insecure).unwrap().upstream_http_protocol_options.unwrap();
    assert!(upstream.auto_sni && !upstream.auto_san_validation);
}

/// Istio's upstream TLS for in-mesh destinations: ISTIO_MUTUAL explicit (SNI
/// `outbound_.<port>_.<subset>_.<host>`, the endpoints' SPIFFE identities, Istio's ALPN), DISABLE
/// plaintext, no `tls` at all: auto mTLS by the endpoints' `tlsMode` metadata, unless
/// `enableAutoMtls` is off or the destination's PeerAuthentication disables mTLS.
#[test]
fn istio_mutual_explicit_and_auto_as_istio() {
    use cluster::TransportSocketMatch;
    let reviews_with_identity = || {
        service_entry(
            "reviews",
            "default",
            json!({"hosts": [REVIEWS], "location": "MESH_INTERNAL", "resolution": "STATIC",
                "ports": [{"number": 9080, "name": "http", "protocol": "HTTP"}],
                "endpoints": [{"address": "10.0.0.7", "serviceAccount": "bookinfo-reviews"}]}),
        )
    };
    let upstream = |ts: &core::TransportSocket| match &ts.config_type {
        Some(core::transport_socket::ConfigType::TypedConfig(any)) => {
            UpstreamTlsContext::decode(any.value.as_slice()).unwrap()
        }
        None => panic!("no config"),
    };
    let cluster_with = |docs: Vec<serde_json::Value>, mesh: serde_json::Value| {
        let p = crate::testing::push_with_mesh(model::MeshConfig::from_value(mesh).unwrap(), docs);
        find(
            &build_clusters(&sidecar("default"), &p),
            &format!("outbound|9080||{REVIEWS}"),
        )
        .clone()
    };
    let rule = |mode: &str| {
        destination_rule(
            "reviews",
            "default",
            json!({"host": "reviews", "trafficPolicy": {"tls": {"mode": mode}}}),
        )
    };

    let explicit = cluster_with(vec![reviews_with_identity(), rule("ISTIO_MUTUAL")], json!({}));
    let ctx = upstream(explicit.transport_socket.as_ref().expect("ISTIO_MUTUAL is TLS"));
    assert_eq!(ctx.sni, format!("outbound_.9080_._.{REVIEWS}"));
    let common = ctx.common_tls_context.unwrap();
    assert_eq!(common.alpn_protocols, ["istio-peer-exchange", "istio"]);
    assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "default");
    let Some(common_tls_context::ValidationContextType::CombinedValidationContext(v)) = common.validation_context_type
    else {
        panic!("combined validation context");
    };
    assert_eq!(v.validation_context_sds_secret_config.unwrap().name, "ROOTCA");
    let sans = v.default_validation_context.unwrap().match_typed_subject_alt_names;
    assert_eq!(sans.len(), 1);
    assert!(format!("{:?}", sans[0]).contains("spiffe://cluster.local/ns/default/sa/bookinfo-reviews"));

    // a ServiceEntry's subjectAltNames are identities of the destination too
    let mut with_sans = reviews_with_identity();
    with_sans["spec"]["subjectAltNames"] = json!(["spiffe://cluster.local/ns/legacy/sa/reviews"]);
    let explicit = cluster_with(vec![with_sans, rule("ISTIO_MUTUAL")], json!({}));
    let text = format!("{:?}", upstream(explicit.transport_socket.as_ref().unwrap()));
    assert!(
        text.contains("ns/legacy/sa/reviews") && text.contains("sa/bookinfo-reviews"),
        "{text}"
    );

    let disabled = cluster_with(vec![reviews_with_identity(), rule("DISABLE")], json!({}));
    assert!(disabled.transport_socket.is_none() && disabled.transport_socket_matches.is_empty());

    let auto = cluster_with(vec![reviews_with_identity()], json!({}));
    assert!(auto.transport_socket.is_none());
    let names: Vec<&str> = auto
        .transport_socket_matches
        .iter()
        .map(|m: &TransportSocketMatch| m.name.as_str())
        .collect();
    assert_eq!(names, ["tlsMode-istio", "tlsMode-disabled"]);
    assert_eq!(
        xds_api::struct_to_json(auto.transport_socket_matches[0].r#match.as_ref().unwrap()),
        json!({"tlsMode": "istio"})
    );

    let off = cluster_with(vec![reviews_with_identity()], json!({"enableAutoMtls": false}));
    assert!(off.transport_socket_matches.is_empty());
    let pa = |ns: &str, mode: &str| {
        crate::testing::config_in(
            "security.istio.io/v1",
            "PeerAuthentication",
            "pa",
            ns,
            json!({"mtls": {"mode": mode}}),
        )
    };
    let ns_disabled = cluster_with(vec![reviews_with_identity(), pa("default", "DISABLE")], json!({}));
    assert!(
        ns_disabled.transport_socket_matches.is_empty(),
        "the namespace disables mTLS"
    );
    let strict = cluster_with(vec![reviews_with_identity(), pa("istio-system", "STRICT")], json!({}));
    assert_eq!(strict.transport_socket_matches.len(), 2);

    // an Envoy without an agent (no WORKLOAD_IDENTITY_SOCKET_FILE) has no certificate to present
    let p = push(vec![reviews_with_identity()]);
    let bare = crate::testing::node(
        "sidecar",
        "10.0.0.9",
        "default",
        "default",
        json!({"WORKLOAD_IDENTITY_SOCKET_FILE": ""}),
    );
    assert!(
        find(&build_clusters(&bare, &p), &format!("outbound|9080||{REVIEWS}"))
            .transport_socket_matches
            .is_empty()
    );
}

#[test]
fn mesh_h2_upgrade_policy_upgrades_http_ports_only() {
    let mesh = model::MeshConfig {
        h2_upgrade_policy: "UPGRADE".into(),
        ..Default::default()
    };
    let p = crate::testing::push_with_mesh(
        mesh,
        vec![
            reviews(),
            service_entry(
                "tcp",
                "default",
                json!({"hosts": ["tcp.example.com"], "resolution": "STATIC",
            "ports": [{"number": 9000, "name": "tcp", "protocol": "TCP"}], "endpoints": [{"address": "10.9.0.1"}]}),
            ),
        ],
    );
    let clusters = build_clusters(&sidecar("default"), &p);
    assert!(is_h2(find(&clusters, &format!("outbound|9080||{REVIEWS}"))));
    assert!(!is_h2(find(&clusters, "outbound|9000||tcp.example.com")));
}

#[test]
fn outbound_cluster_stat_name_pattern_sets_alt_stat_name() {
    let mesh = model::MeshConfig {
        outbound_cluster_stat_name: "%SERVICE%_%SERVICE_PORT_NAME%_%SUBSET_NAME%".into(),
        ..Default::default()
    };
    let p = crate::testing::push_with_mesh(
        mesh,
        vec![
            reviews(),
            destination_rule(
                "reviews",
                "default",
                json!({"host": "reviews", "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}),
            ),
        ],
    );
    let clusters = build_clusters(&sidecar("default"), &p);
    assert_eq!(
        find(&clusters, &format!("outbound|9080|v1|{REVIEWS}")).alt_stat_name,
        format!("{REVIEWS}_http_v1;")
    );
}

#[test]
fn mutual_tls_presents_the_client_certificate_files() {
    let p = push(vec![
        service_entry(
            "api",
            "default",
            json!({"hosts": ["api.example.com"], "resolution": "DNS",
            "ports": [{"number": 443, "name": "https", "protocol": "HTTPS"}]}),
        ),
        destination_rule(
            "api",
            "default",
            json!({"host": "api.example.com", "trafficPolicy": {"tls": {
            "mode": "MUTUAL", "clientCertificate": "/certs/client.pem", "privateKey": "/certs/key.pem"}}}),
        ),
    ]);
    let clusters = build_clusters(&sidecar("default"), &p);
    let c = find(&clusters, "outbound|443||api.example.com");
    let common = tls_context(c).common_tls_context.unwrap();
    let cert = &common.tls_certificates[0];
    let file = |d: &Option<core::DataSource>| d.as_ref().unwrap().specifier.clone();
    assert_eq!(
        file(&cert.certificate_chain),
        Some(core::data_source::Specifier::Filename("/certs/client.pem".into()))
    );
    assert_eq!(
        file(&cert.private_key),
        Some(core::data_source::Specifier::Filename("/certs/key.pem".into()))
    );
    let Some(common_tls_context::ValidationContextType::ValidationContext(v)) = common.validation_context_type else {
        panic!("no validation context")
    };
    assert_eq!(
        file(&v.trusted_ca),
        Some(core::data_source::Specifier::Filename(
            super::tls::SYSTEM_CA_BUNDLE.into()
        ))
    );
    let upstream = http_options(c).unwrap().upstream_http_protocol_options.unwrap();
    assert!(
        upstream.auto_sni && upstream.auto_san_validation,
        "no SNI or SANs given: Envoy checks the host"
    );
}

#[test]
fn locality_failover_settings_enable_locality_weighted_lb() {
    let weighted = |policy: serde_json::Value| {
        let p = push(vec![
            reviews(),
            destination_rule(
                "reviews",
                "default",
                json!({"host": "reviews", "trafficPolicy": policy}),
            ),
        ]);
        let clusters = build_clusters(&sidecar("default"), &p);
        let c = find(&clusters, &format!("outbound|9080||{REVIEWS}")).clone();
        matches!(
            c.common_lb_config.unwrap().locality_config_specifier,
            Some(cluster::common_lb_config::LocalityConfigSpecifier::LocalityWeightedLbConfig(_))
        )
    };
    let failover = json!({"localityLbSetting": {"failover": [{"from": "us-east", "to": "us-west"}]}});
    assert!(weighted(
        json!({"loadBalancer": failover.clone(), "outlierDetection": {"consecutive5xxErrors": 1}})
    ));
    assert!(
        !weighted(json!({"loadBalancer": failover})),
        "failover needs outlier detection"
    );
    assert!(weighted(
        json!({"loadBalancer": {"localityLbSetting": {"distribute": [{"from": "*", "to": {"*": 100}}]}}})
    ));
    assert!(!weighted(json!({"outlierDetection": {"consecutive5xxErrors": 1}})));
}

/// Istio's zone-aware settings (DestinationRule, else mesh): `zone_aware_lb_config` with the
/// minimum cluster size, or a 0% routing to switch Envoy's zone-aware routing off.
#[test]
fn zone_aware_settings_configure_envoys_zone_aware_routing() {
    use cluster::common_lb_config::{LocalityConfigSpecifier, ZoneAwareLbConfig};
    let config = |mesh: serde_json::Value, policy: serde_json::Value| -> Option<LocalityConfigSpecifier> {
        let p = crate::testing::push_with_mesh(
            model::MeshConfig::from_value(mesh).unwrap(),
            vec![
                reviews(),
                destination_rule(
                    "reviews",
                    "default",
                    json!({"host": "reviews", "trafficPolicy": policy}),
                ),
            ],
        );
        let clusters = build_clusters(&sidecar("default"), &p);
        find(&clusters, &format!("outbound|9080||{REVIEWS}"))
            .clone()
            .common_lb_config
            .and_then(|c| c.locality_config_specifier)
    };
    let zone_aware = |z: ZoneAwareLbConfig| Some(LocalityConfigSpecifier::ZoneAwareLbConfig(z));
    assert_eq!(
        config(
            json!({}),
            json!({"loadBalancer": {"zoneAwareLbSetting": {"minClusterSize": 3}}})
        ),
        zone_aware(ZoneAwareLbConfig {
            min_cluster_size: Some(xds_api::pbwkt::UInt64Value { value: 3 }),
            ..Default::default()
        })
    );
    assert_eq!(
        config(
            json!({}),
            json!({"loadBalancer": {"zoneAwareLbSetting": {"enabled": false}}})
        ),
        zone_aware(ZoneAwareLbConfig {
            routing_enabled: Some(xds_api::envoy::r#type::v3::Percent { value: 0.0 }),
            ..Default::default()
        })
    );
    // the mesh's setting applies under a rule without one, and loses to the rule's locality setting
    let mesh = json!({"zoneAwareLbSetting": {}});
    assert_eq!(
        config(mesh.clone(), json!({"outlierDetection": {"consecutive5xxErrors": 1}})),
        zone_aware(Default::default())
    );
    let distribute = json!({"localityLbSetting": {"distribute": [{"from": "*", "to": {"*": 100}}]}});
    assert!(matches!(
        config(mesh, json!({"loadBalancer": distribute})),
        Some(LocalityConfigSpecifier::LocalityWeightedLbConfig(_))
    ));
}

/// Istio's `outlierDetectionHttpErrorCodes`: only these statuses count as errors, through the
/// cluster's HTTP protocol options (one code: a header match; several: any of them).
#[test]
fn outlier_detection_http_error_codes_become_the_error_matcher() {
    use xds_api::envoy::config::common::matcher::v3::match_predicate::Rule;
    let with_codes = |codes: serde_json::Value| {
        let p = push(vec![
            two_port_service(),
            destination_rule(
                "ratings",
                "default",
                json!({"host": "ratings", "trafficPolicy": {"outlierDetection": {
                    "consecutive5xxErrors": 2, "outlierDetectionHttpErrorCodes": codes}}}),
            ),
        ]);
        let clusters = build_clusters(&sidecar("default"), &p);
        let c = find(&clusters, "outbound|9080||ratings.default.svc.cluster.local").clone();
        http_options(&c)
            .and_then(|o| o.outlier_detection)
            .and_then(|o| o.error_matcher)
            .and_then(|m| m.rule)
    };
    let Some(Rule::HttpResponseHeadersMatch(one)) = with_codes(json!([503])) else {
        panic!("one code: a header match");
    };
    assert_eq!(one.headers[0].name, ":status");
    let Some(Rule::OrMatch(any)) = with_codes(json!([502, 503, 504])) else {
        panic!("several codes: any of them");
    };
    assert_eq!(any.rules.len(), 3);
    assert!(with_codes(json!([])).is_none());
}

/// meshConfig `defaultTrafficPolicy` (Istio's `applyDefaultTrafficPolicy`): its connection pool
/// and outlier detection apply to clusters whose DestinationRule sets none, with or without a
/// rule; what a rule sets wins.
#[test]
fn mesh_default_traffic_policy_is_the_baseline_under_destination_rules() {
    let mesh = model::MeshConfig::from_value(json!({"defaultTrafficPolicy": {
        "connectionPool": {"tcp": {"maxConnections": 11}},
        "outlierDetection": {"consecutive5xxErrors": 3}}}))
    .unwrap();
    let max_connections = |c: &Cluster| {
        c.circuit_breakers.as_ref().unwrap().thresholds[0]
            .max_connections
            .as_ref()
            .map(|v| v.value)
    };
    let consecutive_5xx = |c: &Cluster| {
        c.outlier_detection
            .as_ref()
            .and_then(|o| o.consecutive_5xx.as_ref())
            .map(|v| v.value)
    };
    let without_rule = crate::testing::push_with_mesh(mesh.clone(), vec![two_port_service()]);
    let clusters = build_clusters(&sidecar("default"), &without_rule);
    let c = find(&clusters, "outbound|9080||ratings.default.svc.cluster.local");
    assert_eq!((max_connections(c), consecutive_5xx(c)), (Some(11), Some(3)));

    let with_rule = crate::testing::push_with_mesh(
        mesh,
        vec![
            two_port_service(),
            destination_rule(
                "ratings",
                "default",
                json!({"host": "ratings", "trafficPolicy": {"connectionPool": {"tcp": {"maxConnections": 5}}}}),
            ),
        ],
    );
    let clusters = build_clusters(&sidecar("default"), &with_rule);
    let c = find(&clusters, "outbound|9080||ratings.default.svc.cluster.local");
    assert_eq!(
        (max_connections(c), consecutive_5xx(c)),
        (Some(5), Some(3)),
        "the rule's pool, the mesh's outlier detection"
    );
}

/// Istio's `ApplyCustomSDSToClientCommonTLSContext`: a `credentialName` is served over ADS, the
/// CA as `kubernetes://<name>-cacert` always, the client certificate `kubernetes://<name>` only
/// for MUTUAL; sidecars reached by a rule without workload selector get no credential (plaintext,
/// as Istio); the mesh's `tlsDefaults` set curves and ciphers.
#[test]
fn credential_name_origination_asks_ads_for_the_ca_and_for_mutual_the_certificate() {
    let rule = |name: &str, mode: &str| {
        destination_rule(
            name,
            "istio-system",
            json!({"host": format!("{name}.example.com"), "trafficPolicy": {"tls": {"mode": mode, "credentialName": "cred"}}}),
        )
    };
    let entry = |name: &str| {
        service_entry(
            name,
            "istio-system",
            json!({"hosts": [format!("{name}.example.com")], "resolution": "DNS", "location": "MESH_EXTERNAL",
                   "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}]}),
        )
    };
    let mesh = model::MeshConfig {
        tls_defaults: Some(model::mesh::TlsDefaults {
            ecdh_curves: vec!["P-256".into()],
            cipher_suites: vec!["ECDHE-ECDSA-AES256-GCM-SHA384".into()],
            ..Default::default()
        }),
        ..Default::default()
    };
    let p = crate::testing::push_with_mesh(
        mesh,
        vec![
            entry("simple"),
            entry("mutual"),
            rule("simple", "SIMPLE"),
            rule("mutual", "MUTUAL"),
        ],
    );
    let gateway = crate::testing::gateway_proxy();
    let clusters = build_clusters(&gateway, &p);
    let ads_names = |c: &Cluster| -> (Vec<String>, Option<String>) {
        let common = tls_context(c).common_tls_context.unwrap();
        let certs = common
            .tls_certificate_sds_secret_configs
            .iter()
            .map(|s| {
                assert!(
                    matches!(
                        s.sds_config.as_ref().and_then(|c| c.config_source_specifier.as_ref()),
                        Some(core::config_source::ConfigSourceSpecifier::Ads(_))
                    ),
                    "served over ADS"
                );
                s.name.clone()
            })
            .collect();
        let ca = match common.validation_context_type {
            Some(common_tls_context::ValidationContextType::CombinedValidationContext(v)) => {
                v.validation_context_sds_secret_config.map(|s| s.name)
            }
            _ => None,
        };
        (certs, ca)
    };
    let simple = find(&clusters, "outbound|443||simple.example.com");
    assert_eq!(ads_names(simple), (vec![], Some("kubernetes://cred-cacert".into())));
    let mutual = find(&clusters, "outbound|443||mutual.example.com");
    assert_eq!(
        ads_names(mutual),
        (
            vec!["kubernetes://cred".to_owned()],
            Some("kubernetes://cred-cacert".into())
        )
    );
    let params = tls_context(simple).common_tls_context.unwrap().tls_params.unwrap();
    assert_eq!(params.ecdh_curves, ["P-256"]);
    assert_eq!(params.cipher_suites, ["ECDHE-ECDSA-AES256-GCM-SHA384"]);

    let sidecar_clusters = build_clusters(&sidecar("istio-system"), &p);
    assert!(
        find(&sidecar_clusters, "outbound|443||simple.example.com")
            .transport_socket
            .is_none(),
        "a rule without workload selector hands no credential to sidecars"
    );
}

/// `PILOT_FILTER_GATEWAY_CLUSTER_CONFIG`: a gateway gets clusters only for what its
/// VirtualServices route to (their delegates too) and the mesh's extension providers.
#[test]
fn filter_gateway_cluster_config_keeps_the_routed_services_only() {
    let entry = |name: &str| {
        service_entry(
            name,
            "default",
            json!({"hosts": [format!("{name}.default.svc.cluster.local")], "resolution": "STATIC",
                   "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}], "endpoints": [{"address": "10.0.0.1"}]}),
        )
    };
    let docs = vec![
        crate::testing::ingress_gateway(
            json!([{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]),
        ),
        entry("web"),
        entry("mirror"),
        entry("leaf"),
        entry("authz"),
        entry("unrelated"),
        crate::testing::virtual_service(
            "web",
            "default",
            json!({"hosts": ["web.example.com"], "gateways": ["istio-system/gw"],
                   "http": [{"match": [{"uri": {"prefix": "/leaf"}}], "delegate": {"name": "leaf", "namespace": "default"}},
                            {"route": [{"destination": {"host": "web"}}], "mirror": {"host": "mirror"}}]}),
        ),
        crate::testing::virtual_service(
            "leaf",
            "default",
            json!({"http": [{"route": [{"destination": {"host": "leaf"}}]}]}),
        ),
    ];
    let mesh = || model::MeshConfig {
        extension_providers: vec![
            json!({"name": "ext", "envoyExtAuthzHttp": {"service": "default/authz.default.svc.cluster.local", "port": 80}}),
        ],
        ..Default::default()
    };
    let outbound = |filter: bool| {
        let mut input = crate::testing::push_input(mesh(), docs.clone());
        input.features.filter_gateway_cluster_config = filter;
        let push = push_index::PushContext::new(input);
        let clusters = build_clusters(&crate::testing::gateway_proxy(), &push);
        names(&clusters)
            .into_iter()
            .filter(|n| n.starts_with("outbound|"))
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    assert_eq!(outbound(false).len(), 5, "Istio's default: every visible service");
    assert_eq!(
        outbound(true),
        [
            "outbound|80||authz.default.svc.cluster.local",
            "outbound|80||leaf.default.svc.cluster.local",
            "outbound|80||mirror.default.svc.cluster.local",
            "outbound|80||web.default.svc.cluster.local",
        ]
    );
}

/// `trafficPolicy.proxyProtocol`: the cluster's transport sockets (plaintext, TLS origination,
/// each auto-mTLS match) are wrapped in Envoy's upstream PROXY protocol socket; a port-level
/// policy carries none (Istio's `shadowCopyPortTrafficPolicy`).
#[test]
fn proxy_protocol_wraps_every_transport_socket() {
    let p = push(vec![
        reviews(),
        destination_rule(
            "reviews",
            "default",
            json!({"host": "reviews.default.svc.cluster.local", "trafficPolicy": {"proxyProtocol": {"version": "V2"}},
                   "subsets": [{"name": "v1", "labels": {"version": "v1"}}]}),
        ),
    ]);
    let clusters = build_clusters(&sidecar("default"), &p);
    let c = find(&clusters, "outbound|9080|v1|reviews.default.svc.cluster.local");
    assert!(c.transport_socket.is_none());
    assert_eq!(c.transport_socket_matches.len(), 2, "auto mTLS");
    for m in &c.transport_socket_matches {
        let ts = m.transport_socket.as_ref().unwrap();
        assert_eq!(ts.name, "envoy.transport_sockets.upstream_proxy_protocol");
        let Some(core::transport_socket::ConfigType::TypedConfig(any)) = &ts.config_type else {
            panic!("typed config")
        };
        let pp =
            xds_api::envoy::extensions::transport_sockets::proxy_protocol::v3::ProxyProtocolUpstreamTransport::decode(
                any.value.as_slice(),
            )
            .unwrap();
        assert_eq!(
            pp.config.unwrap().version,
            core::proxy_protocol_config::Version::V2 as i32
        );
        assert!(pp.transport_socket.is_some(), "the original socket inside");
    }
    let plain = push(vec![
        reviews(),
        destination_rule(
            "reviews",
            "default",
            json!({"host": "reviews.default.svc.cluster.local", "trafficPolicy": {"proxyProtocol": {"version": "V1"},
                   "tls": {"mode": "DISABLE"}, "portLevelSettings": [{"port": {"number": 9999}, "tls": {"mode": "DISABLE"}}]}}),
        ),
    ]);
    let c = build_clusters(&sidecar("default"), &plain);
    let c = find(&c, "outbound|9080||reviews.default.svc.cluster.local");
    assert_eq!(
        c.transport_socket.as_ref().map(|t| t.name.as_str()),
        Some("envoy.transport_sockets.upstream_proxy_protocol"),
        "plaintext is wrapped too"
    );
}
