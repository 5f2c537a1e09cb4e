//! CDS golden files for a small mesh (`testdata/golden/cds_*.txt`, `REFRESH_GOLDEN=true` rewrites
//! them), and the real Envoy's verdict on the same clusters (`envoy --mode validate`).

use prost::Message;
use serde_json::{Value, json};
use xds_api::envoy::config::bootstrap::v3::{Bootstrap, bootstrap};
use xds_api::envoy::config::cluster::v3::{Cluster, cluster};
use xds_api::envoy::config::core::v3 as core;
use xds_api::envoy::extensions::network::dns_resolver::cares::v3::CaresDnsResolverConfig;
use xds_api::envoy::extensions::transport_sockets::tls::v3::UpstreamTlsContext;
use xds_api::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;

use super::{HTTP_PROTOCOL_OPTIONS, build_clusters};
use crate::testing::{assert_golden, destination_rule, envoy_binary, proxy, push, reviews, service_entry, sidecar};

/// A small mesh touching each cluster kind and most traffic policy fields.
fn golden_mesh() -> Vec<Value> {
    vec![
        reviews(),
        destination_rule(
            "reviews",
            "default",
            json!({
                "host": "reviews",
                "trafficPolicy": {
                    "loadBalancer": {"simple": "LEAST_REQUEST"},
                    "connectionPool": {"tcp": {"maxConnections": 100, "connectTimeout": "3s"},
                                       "http": {"http1MaxPendingRequests": 10, "idleTimeout": "30s"}},
                    "outlierDetection": {"consecutive5xxErrors": 7, "interval": "10s", "baseEjectionTime": "30s"}
                },
                "subsets": [
                    {"name": "v1", "labels": {"version": "v1"}},
                    {"name": "v2", "labels": {"version": "v2"}, "trafficPolicy": {"loadBalancer": {"simple": "ROUND_ROBIN"}}}
                ]
            }),
        ),
        service_entry(
            "ratings",
            "default",
            json!({
                "hosts": ["ratings.default.svc.cluster.local"], "location": "MESH_INTERNAL", "resolution": "STATIC",
                "ports": [{"number": 9080, "name": "http", "protocol": "HTTP"}, {"number": 9443, "name": "grpc", "protocol": "GRPC"}],
                "endpoints": [{"address": "10.2.0.1"}]
            }),
        ),
        destination_rule(
            "ratings",
            "default",
            json!({
                "host": "ratings",
                "trafficPolicy": {
                    "loadBalancer": {"consistentHash": {"httpHeaderName": "x-user"}},
                    "portLevelSettings": [{"port": {"number": 9443}, "loadBalancer": {"simple": "RANDOM"},
                                           "connectionPool": {"http": {"http2MaxRequests": 50}}}]
                }
            }),
        ),
        service_entry(
            "api",
            "default",
            json!({
                "hosts": ["api.example.com"], "resolution": "DNS",
                "ports": [{"number": 443, "name": "https", "protocol": "HTTPS"}]
            }),
        ),
        destination_rule(
            "api",
            "default",
            json!({
                "host": "api.example.com",
                "trafficPolicy": {"tls": {"mode": "SIMPLE", "sni": "api.example.com",
                                          "caCertificates": "/etc/ssl/certs/ca-certificates.crt",
                                          "subjectAltNames": ["api.example.com"]}}
            }),
        ),
        service_entry(
            "wildcard",
            "default",
            json!({
                "hosts": ["*.internal.example.com"], "resolution": "NONE",
                "ports": [{"number": 8080, "name": "http-alt", "protocol": "HTTP"}]
            }),
        ),
    ]
}

/// Readable, deterministic text for clusters: the cluster without its `Any`s and metadata
/// (whose maps print in random order), then those decoded, metadata as sorted JSON.
fn render(clusters: &[Cluster]) -> String {
    let mut out = String::new();
    for c in clusters {
        let mut bare = c.clone();
        let metadata = bare.metadata.take();
        let options = std::mem::take(&mut bare.typed_extension_protocol_options);
        let tls = bare.transport_socket.as_mut().and_then(|t| t.config_type.take());
        let matches = std::mem::take(&mut bare.transport_socket_matches);
        let dns = bare
            .typed_dns_resolver_config
            .as_mut()
            .and_then(|t| t.typed_config.take());
        out.push_str(&format!("=== {}\n{bare:#?}\n", c.name));
        if let Some(md) = metadata {
            let mut keys: Vec<_> = md.filter_metadata.iter().collect();
            keys.sort_by_key(|(k, _)| k.as_str());
            for (k, s) in keys {
                out.push_str(&format!("metadata {k}: {}\n", xds_api::struct_to_json(s)));
            }
        }
        if let Some(any) = options.get(HTTP_PROTOCOL_OPTIONS) {
            let decoded = HttpProtocolOptions::decode(any.value.as_slice()).unwrap();
            out.push_str(&format!("{HTTP_PROTOCOL_OPTIONS}: {decoded:#?}\n"));
        }
        if let Some(core::transport_socket::ConfigType::TypedConfig(any)) = tls {
            out.push_str(&format!(
                "transport_socket: {:#?}\n",
                UpstreamTlsContext::decode(any.value.as_slice()).unwrap()
            ));
        }
        for m in matches {
            let socket = m
                .transport_socket
                .as_ref()
                .map_or(serde_json::Value::Null, |t| match &t.config_type {
                    Some(core::transport_socket::ConfigType::TypedConfig(any)) => {
                        xds_api::json::any_to_json(any).unwrap()
                    }
                    None => serde_json::Value::Null,
                });
            let matched = m.r#match.as_ref().map(xds_api::struct_to_json).unwrap_or_default();
            out.push_str(&format!("transport_socket_match {}: {matched} -> {socket:#}\n", m.name));
        }
        if let Some(any) = dns {
            out.push_str(&format!(
                "dns resolver: {:#?}\n",
                CaresDnsResolverConfig::decode(any.value.as_slice()).unwrap()
            ));
        }
    }
    out
}

#[test]
fn cds_golden() {
    let p = push(golden_mesh());
    assert_golden("cds_sidecar.txt", &render(&build_clusters(&sidecar("default"), &p)));
    let gateway = proxy("router", "istio-system", json!({"istio": "ingressgateway"}));
    assert_golden("cds_router.txt", &render(&build_clusters(&gateway, &p)));
}

/// A bootstrap with the generated clusters as static resources, plus the ADS cluster their EDS
/// configs point at.
fn bootstrap(clusters: Vec<Cluster>) -> Bootstrap {
    let mut xds = crate::cds::black_hole_cluster(&push(vec![]));
    xds.name = "xds-grpc".into();
    xds.typed_extension_protocol_options.insert(
        HTTP_PROTOCOL_OPTIONS.into(),
        xds_api::pack(&HttpProtocolOptions {
            upstream_protocol_options: Some(
                xds_api::envoy::extensions::upstreams::http::v3::http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                    xds_api::envoy::extensions::upstreams::http::v3::http_protocol_options::ExplicitHttpConfig {
                        protocol_config: Some(
                            xds_api::envoy::extensions::upstreams::http::v3::http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(
                                Default::default(),
                            ),
                        ),
                    },
                ),
            ),
            ..Default::default()
        }),
    );
    let ads = core::ApiConfigSource {
        api_type: core::api_config_source::ApiType::Grpc as i32,
        transport_api_version: core::ApiVersion::V3 as i32,
        grpc_services: vec![core::GrpcService {
            target_specifier: Some(core::grpc_service::TargetSpecifier::EnvoyGrpc(
                core::grpc_service::EnvoyGrpc {
                    cluster_name: "xds-grpc".into(),
                    ..Default::default()
                },
            )),
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut all = vec![xds];
    all.extend(clusters);
    Bootstrap {
        node: Some(core::Node {
            id: "sidecar~10.0.0.9~p.default~default.svc.cluster.local".into(),
            cluster: "test".into(),
            ..Default::default()
        }),
        static_resources: Some(bootstrap::StaticResources {
            clusters: all,
            ..Default::default()
        }),
        dynamic_resources: Some(bootstrap::DynamicResources {
            ads_config: Some(ads),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Runs `envoy --mode validate` on the bootstrap of `clusters`; `Err(output)` if Envoy rejects it.
fn envoy_validate(envoy: &std::path::Path, clusters: Vec<Cluster>) -> Result<(), String> {
    crate::testing::envoy_validate(envoy, &bootstrap(clusters)).map(|_| ())
}

#[test]
fn envoy_accepts_generated_clusters() {
    let envoy = envoy_binary();
    let p = push(golden_mesh());
    for (name, proxy) in [
        ("sidecar", sidecar("default")),
        ("router", proxy("router", "istio-system", json!({}))),
    ] {
        let clusters = build_clusters(&proxy, &p);
        assert!(clusters.len() > 5);
        if let Err(out) = envoy_validate(&envoy, clusters) {
            panic!("Envoy rejected the {name} clusters:\n{out}");
        }
    }
    // The harness itself: Envoy must reject what is invalid (LOGICAL_DNS with two hosts).
    let mut broken = build_clusters(&sidecar("default"), &p);
    let dns = broken
        .iter_mut()
        .find(|c| c.name == "outbound|443||api.example.com")
        .unwrap();
    dns.cluster_discovery_type = Some(
        xds_api::envoy::config::cluster::v3::cluster::ClusterDiscoveryType::Type(
            xds_api::envoy::config::cluster::v3::cluster::DiscoveryType::LogicalDns as i32,
        ),
    );
    let la = dns.load_assignment.as_mut().unwrap();
    let extra = la.endpoints[0].lb_endpoints[0].clone();
    la.endpoints[0].lb_endpoints.push(extra);
    assert!(
        envoy_validate(&envoy, broken).is_err(),
        "Envoy accepted an invalid cluster: the check is not working"
    );
}

/// Envoy takes the settings of Istio's newer DestinationRule fields (outlier detection error
/// codes in the cluster's HTTP protocol options; zone-aware load balancing, on a subset with
/// routing switched off).
#[test]
fn envoy_accepts_outlier_detection_error_codes() {
    let envoy = envoy_binary();
    let p = push(vec![
        reviews(),
        destination_rule(
            "reviews",
            "default",
            json!({"host": "reviews", "trafficPolicy": {"outlierDetection": {
                "consecutive5xxErrors": 2, "outlierDetectionHttpErrorCodes": [502, 503]},
                "loadBalancer": {"zoneAwareLbSetting": {"minClusterSize": 2}}},
                "subsets": [{"name": "v1", "labels": {"version": "v1"},
                    "trafficPolicy": {"loadBalancer": {"zoneAwareLbSetting": {"enabled": false}}}}]}),
        ),
    ]);
    let clusters = build_clusters(&sidecar("default"), &p);
    let c = clusters
        .iter()
        .find(|c| c.name.starts_with("outbound|") && c.name.contains("reviews"))
        .expect("a reviews cluster");
    assert!(c.typed_extension_protocol_options.contains_key(HTTP_PROTOCOL_OPTIONS));
    let zone_aware = |c: &Cluster| {
        matches!(
            c.common_lb_config
                .as_ref()
                .and_then(|l| l.locality_config_specifier.as_ref()),
            Some(cluster::common_lb_config::LocalityConfigSpecifier::ZoneAwareLbConfig(_))
        )
    };
    assert!(zone_aware(c) && clusters.iter().any(|c| c.name.contains("|v1|") && zone_aware(c)));
    if let Err(out) = envoy_validate(&envoy, clusters) {
        panic!("Envoy rejected outlier detection error codes or zone-aware settings:\n{out}");
    }
}

/// Envoy takes a DestinationRule `proxyProtocol` around plaintext, auto-mTLS and TLS-origination
/// sockets, and the SNI-DNAT clusters of an AUTO_PASSTHROUGH gateway.
#[test]
fn envoy_accepts_proxy_protocol_and_sni_dnat_clusters() {
    let envoy = envoy_binary();
    let p = push(vec![
        reviews(),
        destination_rule(
            "reviews",
            "default",
            json!({"host": "reviews", "trafficPolicy": {"proxyProtocol": {"version": "V2"}},
                "subsets": [{"name": "v1", "labels": {"version": "v1"},
                    "trafficPolicy": {"tls": {"mode": "SIMPLE", "sni": "reviews"}, "proxyProtocol": {"version": "V1"}}}]}),
        ),
        crate::testing::config(
            "Gateway",
            "cross-network-gateway",
            "istio-system",
            json!({"selector": {}, "servers": [{"port": {"number": 15443, "name": "tls", "protocol": "TLS"},
                "hosts": ["*.local"], "tls": {"mode": "AUTO_PASSTHROUGH"}}]}),
        ),
    ]);
    for proxy in [sidecar("default"), proxy("router", "istio-system", json!({}))] {
        let clusters = build_clusters(&proxy, &p);
        assert_eq!(
            proxy.is_router(),
            clusters.iter().any(|c| c.name.starts_with("outbound_.")),
            "SNI-DNAT clusters for the gateway only"
        );
        if let Err(out) = envoy_validate(&envoy, clusters) {
            panic!(
                "Envoy rejected proxyProtocol or SNI-DNAT clusters of {}:\n{out}",
                proxy.id
            );
        }
    }
}
