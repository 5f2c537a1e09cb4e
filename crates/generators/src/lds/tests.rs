//! Gateway listener tests through `build_listeners` over a push: one listener per port, HTTP
//! chains on RDS `http.<port>`, HTTPS chains per server with SNI, certificate files and a TLS
//! inspector; what is skipped, and sidecars.

use model::MeshConfig;
use prost::Message;
use serde_json::json;
use xds_api::envoy::config::core::v3::{address, data_source, socket_address};
use xds_api::envoy::config::listener::v3::Listener;
use xds_api::envoy::extensions::access_loggers::file::v3::FileAccessLog;
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager as hcm, http_filter,
};
use xds_api::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;

use super::build_listeners;
use crate::testing::{gateway_proxy, ingress_gateway, push, push_with_mesh, sidecar};

fn hcm_of(l: &Listener, chain: usize) -> HttpConnectionManager {
    crate::testing::hcm_of(&l.filter_chains[chain]).expect("an HTTP connection manager")
}

fn rds_name(h: &HttpConnectionManager) -> &str {
    match &h.route_specifier {
        Some(hcm::RouteSpecifier::Rds(rds)) => &rds.route_config_name,
        other => panic!("rds expected, got {other:?}"),
    }
}

#[test]
fn http_servers_share_one_listener_and_route_configuration() {
    let push = push(vec![ingress_gateway(json!([
        {"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["a.com"]},
        {"port": {"number": 80, "name": "http2", "protocol": "HTTP"}, "hosts": ["b.com"]},
        {"port": {"number": 8080, "name": "grpc", "protocol": "GRPC"}, "hosts": ["*"]}
    ]))]);
    let listeners = build_listeners(&gateway_proxy(), &push);
    let names: Vec<_> = listeners.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["0.0.0.0_80", "0.0.0.0_8080"]);
    let l = &listeners[0];
    let Some(address::Address::SocketAddress(sa)) = l.address.as_ref().and_then(|a| a.address.as_ref()) else {
        panic!("socket address expected");
    };
    assert_eq!(
        (sa.address.as_str(), &sa.port_specifier),
        ("0.0.0.0", &Some(socket_address::PortSpecifier::PortValue(80)))
    );
    assert_eq!(l.filter_chains.len(), 1);
    assert!(l.listener_filters.is_empty(), "no TLS inspector for plaintext");
    let h = hcm_of(l, 0);
    assert_eq!(rds_name(&h), "http.80");
    assert_eq!(h.stat_prefix, "outbound_0.0.0.0_80;");
    assert_eq!(h.codec_type, hcm::CodecType::Auto as i32);
    assert_eq!(h.use_remote_address.map(|b| b.value), Some(true));
    assert_eq!(h.normalize_path.map(|b| b.value), Some(true));
    assert_eq!(
        h.path_with_escaped_slashes_action,
        hcm::PathWithEscapedSlashesAction::KeepUnchanged as i32
    );
    assert_eq!(h.upgrade_configs[0].upgrade_type, "websocket");
    assert_eq!(
        h.forward_client_cert_details,
        hcm::ForwardClientCertDetails::SanitizeSet as i32
    );
    let filters: Vec<_> = h.http_filters.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        filters,
        [
            "envoy.filters.http.fault",
            "envoy.filters.http.cors",
            "envoy.filters.http.router"
        ]
    );
    assert!(
        h.http_filters
            .iter()
            .all(|f| matches!(f.config_type, Some(http_filter::ConfigType::TypedConfig(_))))
    );
    assert!(h.access_log.is_empty(), "no access log unless the mesh asks");
    assert_eq!(rds_name(&hcm_of(&listeners[1], 0)), "http.8080");
}

#[test]
fn https_servers_get_sni_chains_with_certificate_files() {
    let push = push(vec![ingress_gateway(json!([
        {"port": {"number": 443, "name": "https-a", "protocol": "HTTPS"}, "hosts": ["ns/b.com", "a.com"], "name": "srv-a",
         "tls": {"mode": "SIMPLE", "serverCertificate": "/etc/a/cert.pem", "privateKey": "/etc/a/key.pem"}},
        {"port": {"number": 443, "name": "https-c", "protocol": "HTTPS"}, "hosts": ["*"],
         "tls": {"mode": "SIMPLE", "serverCertificate": "/etc/c/cert.pem", "privateKey": "/etc/c/key.pem"}}
    ]))]);
    let listeners = build_listeners(&gateway_proxy(), &push);
    assert_eq!(listeners.len(), 1);
    let l = &listeners[0];
    assert_eq!(l.name, "0.0.0.0_443");
    assert_eq!(l.listener_filters[0].name, "envoy.filters.listener.tls_inspector");
    assert_eq!(l.filter_chains.len(), 2);
    let m = l.filter_chains[0].filter_chain_match.as_ref().unwrap();
    assert_eq!(m.server_names, ["a.com", "b.com"]);
    assert!(l.filter_chains[1].filter_chain_match.is_none(), "`*` matches every SNI");
    let h = hcm_of(l, 0);
    assert_eq!(rds_name(&h), "https.443.https-a.gw.istio-system");
    assert_eq!(h.stat_prefix, "srv-a", "server name is the stat prefix");
    assert_eq!(hcm_of(l, 1).stat_prefix, "outbound_0.0.0.0_443;");
    let ts = l.filter_chains[0].transport_socket.as_ref().unwrap();
    assert_eq!(ts.name, "envoy.transport_sockets.tls");
    let Some(xds_api::envoy::config::core::v3::transport_socket::ConfigType::TypedConfig(any)) = &ts.config_type else {
        panic!("typed config expected");
    };
    let tls = DownstreamTlsContext::decode(any.value.as_slice()).unwrap();
    let cert = &tls.common_tls_context.unwrap().tls_certificates[0];
    assert_eq!(
        cert.private_key.as_ref().unwrap().specifier,
        Some(data_source::Specifier::Filename("/etc/a/key.pem".into()))
    );
}

#[test]
fn tcp_and_passthrough_servers_without_routes_produce_no_chains() {
    let push = push(vec![ingress_gateway(json!([
        {"port": {"number": 443, "name": "tls", "protocol": "TLS"}, "hosts": ["a.com"], "tls": {"mode": "PASSTHROUGH"}},
        {"port": {"number": 8443, "name": "https", "protocol": "HTTPS"}, "hosts": ["b.com"], "tls": {"mode": "PASSTHROUGH"}},
        {"port": {"number": 3306, "name": "mysql", "protocol": "TCP"}, "hosts": ["*"]}
    ]))]);
    assert!(build_listeners(&gateway_proxy(), &push).is_empty());
}

#[test]
fn gateways_not_selecting_the_proxy_and_sidecars_get_nothing() {
    let mut doc =
        ingress_gateway(json!([{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]));
    doc["spec"]["selector"] = json!({"istio": "egressgateway"});
    assert!(build_listeners(&gateway_proxy(), &push(vec![doc])).is_empty());

    let push = push(vec![ingress_gateway(
        json!([{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]),
    )]);
    let listeners = build_listeners(&sidecar("ns"), &push);
    assert!(!listeners.is_empty(), "sidecars get their own listeners");
    assert!(
        listeners.iter().all(|l| l.name != "0.0.0.0_80"),
        "but nothing of a gateway"
    );
}

#[test]
fn access_log_follows_mesh_config() {
    let mesh = MeshConfig {
        access_log_file: "/dev/stdout".into(),
        ..Default::default()
    };
    let push = push_with_mesh(
        mesh,
        vec![ingress_gateway(
            json!([{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}]),
        )],
    );
    let h = hcm_of(&build_listeners(&gateway_proxy(), &push)[0], 0);
    assert_eq!(h.access_log.len(), 1);
    let Some(xds_api::envoy::config::accesslog::v3::access_log::ConfigType::TypedConfig(any)) =
        &h.access_log[0].config_type
    else {
        panic!("typed config expected");
    };
    let file = FileAccessLog::decode(any.value.as_slice()).unwrap();
    assert_eq!(file.path, "/dev/stdout");
    assert!(format!("{:?}", file.access_log_format).contains("%UPSTREAM_CLUSTER_RAW%"));
}

#[test]
fn chains_matching_the_same_connections_are_not_both_sent() {
    let push = push(vec![ingress_gateway(json!([
        {"port": {"number": 443, "name": "https", "protocol": "HTTPS"}, "hosts": ["*"],
         "tls": {"mode": "SIMPLE", "serverCertificate": "/c", "privateKey": "/k"}},
        {"port": {"number": 443, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}
    ]))]);
    let listeners = build_listeners(&gateway_proxy(), &push);
    assert_eq!(listeners.len(), 1);
    assert_eq!(listeners[0].filter_chains.len(), 1, "the match-all HTTPS chain wins");
    assert_eq!(rds_name(&hcm_of(&listeners[0], 0)), "https.443.https.gw.istio-system");
}

/// `PILOT_HTTP10`: every HCM accepts HTTP/1.0 and sniffed ports send the HTTP inspector's
/// `http/1.0` to their HTTP chain; without it, HTTP/1.0 passes as TCP (Istio's
/// `plaintextHTTPALPNs`).
#[test]
fn pilot_http10_accepts_http_1_0_everywhere() {
    let docs = || {
        vec![
            ingress_gateway(json!([{"port": {"number": 80, "name": "http", "protocol": "HTTP"}, "hosts": ["*"]}])),
            crate::testing::service_entry(
                "db",
                "default",
                json!({"hosts": ["db.default.svc.cluster.local"], "addresses": ["240.0.0.9"], "resolution": "STATIC",
                       "ports": [{"number": 7000, "name": "db"}], "endpoints": [{"address": "10.0.0.3"}]}),
            ),
        ]
    };
    let push_with = |http10: bool| {
        let mut input = crate::testing::push_input(MeshConfig::default(), docs());
        input.features.http10 = http10;
        push_index::PushContext::new(input)
    };
    let sniffed_alpns = |push: &push_index::PushContext| -> Vec<String> {
        let listeners = build_listeners(&sidecar("default"), push);
        let l = listeners
            .iter()
            .find(|l| l.name == "240.0.0.9_7000")
            .expect("the sniffed listener");
        l.filter_chains[0]
            .filter_chain_match
            .clone()
            .unwrap()
            .application_protocols
    };
    let accepts = |push: &push_index::PushContext| {
        hcm_of(&build_listeners(&gateway_proxy(), push)[0], 0)
            .http_protocol_options
            .unwrap()
            .accept_http_10
    };
    let off = push_with(false);
    assert!(!accepts(&off));
    assert_eq!(sniffed_alpns(&off), ["http/1.1", "h2c"]);
    let on = push_with(true);
    assert!(accepts(&on));
    assert_eq!(sniffed_alpns(&on), ["http/1.0", "http/1.1", "h2c"]);
}
