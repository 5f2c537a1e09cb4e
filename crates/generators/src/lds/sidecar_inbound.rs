//! `virtualInbound` (0.0.0.0:15006), as Istio's `buildInboundListeners` (`listener_inbound.go`) in
//! plaintext: original_dst + tls_inspector + http_inspector listener filters; per target port of
//! the proxy's service instances a chain matched on `destination_port` (HTTP: HCM with an inline
//! route to `inbound|<port>||`; TCP: tcp_proxy to it; unknown protocol: both, sniffed); then the
//! passthrough chains (HTTP and TCP) to `InboundPassthroughCluster` for every other port.

use model::{MeshConfig, Protocol, Proxy};
use push_index::{PushContext, ServiceInstance};
use xds_api::envoy::config::core::v3::TrafficDirection;
use xds_api::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use xds_api::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route, route_action, route_match,
};
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager as hcm,
};
use xds_api::pbwkt::{BoolValue, Duration};

use super::gateway::WILDCARD_ADDRESS;
use super::sidecar::{
    INBOUND_LISTEN_PORT, PLAINTEXT_HTTP_ALPNS, VIRTUAL_INBOUND_LISTENER, destination_port_match, hcm_filter,
    http_inspector, original_dst, set_protocol_detection_timeout, sidecar_outbound_hcm, socket_address,
    tcp_proxy_filter, tls_inspector,
};
use crate::cds::inbound::inbound_cluster_name;
use crate::names;

/// `virtualInbound` for the proxy's service instances.
pub fn virtual_inbound_listener(proxy: &Proxy, push: &PushContext) -> Listener {
    virtual_inbound_listener_for(push.mesh(), proxy, &push.service_instances(proxy))
}

/// `virtualInbound` for the given instances; the first instance of a target port decides its protocol.
pub fn virtual_inbound_listener_for(mesh: &MeshConfig, proxy: &Proxy, instances: &[ServiceInstance]) -> Listener {
    let mut chains = vec![FilterChain {
        name: "virtualInbound-blackhole".into(),
        filter_chain_match: Some(destination_port_match(INBOUND_LISTEN_PORT)),
        filters: vec![tcp_proxy_filter(
            mesh,
            names::BLACK_HOLE_CLUSTER,
            names::BLACK_HOLE_CLUSTER,
        )],
        ..Default::default()
    }];
    let mut ports: Vec<u16> = Vec::new();
    for instance in instances {
        let port = instance.target_port;
        if ports.contains(&port) || u32::from(port) == INBOUND_LISTEN_PORT {
            continue;
        }
        ports.push(port);
        let cluster = inbound_cluster_name(port);
        let protocol = instance.service_port.protocol;
        let http = || FilterChain {
            name: cluster.clone(),
            filter_chain_match: Some(FilterChainMatch {
                application_protocols: if protocol == Protocol::Unsupported {
                    http_alpns()
                } else {
                    Vec::new()
                },
                ..destination_port_match(u32::from(port))
            }),
            filters: vec![hcm_filter(&inbound_hcm(mesh, proxy, port, &cluster))],
            ..Default::default()
        };
        let tcp = || FilterChain {
            name: cluster.clone(),
            filter_chain_match: Some(destination_port_match(u32::from(port))),
            filters: vec![tcp_proxy_filter(mesh, &cluster, &cluster)],
            ..Default::default()
        };
        match protocol {
            p if p.is_http() => chains.push(http()),
            Protocol::Unsupported => chains.extend([http(), tcp()]),
            _ => chains.push(tcp()),
        }
    }
    let passthrough = names::INBOUND_PASSTHROUGH_CLUSTER_IPV4;
    chains.push(FilterChain {
        name: "virtualInbound-catchall-http".into(),
        filter_chain_match: Some(FilterChainMatch {
            application_protocols: http_alpns(),
            ..Default::default()
        }),
        filters: vec![hcm_filter(&inbound_hcm(mesh, proxy, 0, passthrough))],
        ..Default::default()
    });
    chains.push(FilterChain {
        name: VIRTUAL_INBOUND_LISTENER.into(),
        filters: vec![tcp_proxy_filter(mesh, passthrough, passthrough)],
        ..Default::default()
    });
    let mut l = Listener {
        name: VIRTUAL_INBOUND_LISTENER.into(),
        address: Some(socket_address(WILDCARD_ADDRESS, INBOUND_LISTEN_PORT)),
        traffic_direction: TrafficDirection::Inbound as i32,
        listener_filters: vec![original_dst(), tls_inspector(), http_inspector()],
        filter_chains: chains,
        ..Default::default()
    };
    set_protocol_detection_timeout(&mut l, mesh);
    l
}

fn http_alpns() -> Vec<String> {
    PLAINTEXT_HTTP_ALPNS.iter().map(|s| s.to_string()).collect()
}

/// Istio's inbound HCM: stat prefix `inbound_0.0.0.0_<port>`, client certificate details
/// appended, and an inline route configuration `inbound|<port>||` sending everything to `cluster`.
fn inbound_hcm(mesh: &MeshConfig, proxy: &Proxy, port: u16, cluster: &str) -> HttpConnectionManager {
    // the passthrough chain (port 0) names its route after the passthrough cluster
    let route_name = if port == 0 {
        cluster.to_owned()
    } else {
        inbound_cluster_name(port)
    };
    let mut h = sidecar_outbound_hcm(mesh, proxy, &route_name, format!("inbound_{WILDCARD_ADDRESS}_{port}"));
    h.forward_client_cert_details = hcm::ForwardClientCertDetails::AppendForward as i32;
    h.set_current_client_cert_details = Some(hcm::SetCurrentClientCertDetails {
        subject: Some(BoolValue { value: true }),
        dns: true,
        uri: true,
        ..Default::default()
    });
    h.route_specifier = Some(hcm::RouteSpecifier::RouteConfig(inbound_route_config(
        &route_name,
        port,
        cluster,
    )));
    h
}

/// `inbound|<port>||` with one virtual host `inbound|http|<port>` matching everything.
fn inbound_route_config(name: &str, port: u16, cluster: &str) -> RouteConfiguration {
    let no_timeout = Duration { seconds: 0, nanos: 0 };
    RouteConfiguration {
        name: name.to_owned(),
        validate_clusters: Some(BoolValue { value: false }),
        virtual_hosts: vec![VirtualHost {
            name: format!("inbound|http|{port}"),
            domains: vec!["*".into()],
            routes: vec![Route {
                name: "default".into(),
                r#match: Some(RouteMatch {
                    path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                    ..Default::default()
                }),
                action: Some(route::Action::Route(RouteAction {
                    cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster.to_owned())),
                    timeout: Some(no_timeout),
                    max_stream_duration: Some(route_action::MaxStreamDuration {
                        max_stream_duration: Some(no_timeout),
                        grpc_timeout_header_max: Some(no_timeout),
                        ..Default::default()
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}
