//! Inbound listeners of a sidecar, as Istio's `buildInboundListeners` (`listener_inbound.go`) in
//! plaintext. The application chains (`InboundChain`, Istio's `inboundChainConfig`) come from the
//! Sidecar's ingress listeners when it has some (port and protocol as declared), else from the
//! target ports of the proxy's service instances. Each is matched on `destination_port` (HTTP: HCM
//! with an inline route to `inbound|<port>||`; TCP: tcp_proxy to it; unknown protocol: both,
//! sniffed). They go into `virtualInbound` (0.0.0.0:15006: original_dst + tls_inspector +
//! http_inspector, then the passthrough chains (HTTP and TCP) to `InboundPassthroughCluster` for
//! every other port), except ingress listeners with capture mode `NONE`, which get a listener of
//! their own bound to `<bind>:<port>` (`bind` defaulting to the proxy's global unicast IP).

use std::net::IpAddr;

use model::security::MtlsMode;
use model::{Features, MeshConfig, Protocol, Proxy};
use push_index::{PushContext, ServiceInstance, SidecarScope};
use xds_api::envoy::config::core::v3::TrafficDirection;
use xds_api::envoy::config::listener::v3::{FilterChain, FilterChainMatch, Listener};
use xds_api::envoy::config::route::v3::{
    Decorator, RetryPolicy, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route, route_action,
    route_match,
};
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager as hcm,
};
use xds_api::pbwkt::{BoolValue, Duration};

use super::gateway::WILDCARD_ADDRESS;
use super::sidecar::{
    INBOUND_LISTEN_PORT, VIRTUAL_INBOUND_LISTENER, destination_port_match, hcm_filter, original_dst, set_bind_to_port,
    set_protocol_detection_timeout, sidecar_outbound_hcm, socket_address, tcp_proxy_filter,
};
use crate::authz::AuthzFilters;
use crate::cds::inbound::inbound_cluster_name;
use crate::names;

/// One application port of the inbound listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InboundChain {
    /// The port the connection was sent to: the instance's target port, or the ingress port.
    pub(crate) port: u16,
    pub(crate) protocol: Protocol,
    /// The address of a listener of its own (ingress capture mode `NONE`); `None` for a chain of
    /// `virtualInbound`.
    pub(crate) bind: Option<String>,
    /// The tracing decorator of its route, Istio's `TraceOperation(InstanceHostname, port)`:
    /// `<service host>:<service port>/*`, `<sidecar>.<namespace>:<port>/*` for Sidecar ingress.
    pub(crate) operation: String,
    /// The PeerAuthentication mode of the port.
    pub(crate) mtls: MtlsMode,
}

/// `virtualInbound` with the proxy's application chains, then a listener per bound ingress listener.
pub(crate) fn inbound_listeners(proxy: &Proxy, push: &PushContext) -> Vec<Listener> {
    let chains = inbound_chains(proxy, push);
    // Istio's `ForPassthrough`: the workload's mode on every other port, and the workload
    // policy's `portLevelMtls` on ports no application chain serves.
    let peer_authn = push.peer_authentication(&proxy.config_namespace, &proxy.labels);
    let mut passthrough = vec![(0, identity_mode(proxy, peer_authn.mode))];
    passthrough.extend(
        peer_authn
            .per_port
            .iter()
            .filter_map(|(port, mode)| Some((u16::try_from(*port).ok()?, *mode)))
            .filter(|(port, _)| *port != 0 && !chains.iter().any(|c| c.port == *port))
            .map(|(port, mode)| (port, identity_mode(proxy, mode))),
    );
    let (bound, redirected): (Vec<InboundChain>, Vec<InboundChain>) =
        chains.into_iter().partition(|c| c.bind.is_some());
    let authz = AuthzFilters::for_proxy(push, proxy);
    let mut out = vec![virtual_inbound_listener_for(
        push.mesh(),
        push.features(),
        proxy,
        &redirected,
        &passthrough,
        &authz,
    )];
    out.extend(
        bound
            .iter()
            .map(|c| bound_inbound_listener(push.mesh(), push.features(), proxy, c, &authz)),
    );
    out
}

/// A proxy without a workload identity cannot terminate mTLS: PERMISSIVE is plaintext there
/// (STRICT stays STRICT, and refuses what it cannot check).
fn identity_mode(proxy: &Proxy, mode: MtlsMode) -> MtlsMode {
    if proxy.has_workload_identity() || mode == MtlsMode::Strict {
        mode
    } else {
        MtlsMode::Disable
    }
}

/// Istio's `buildInboundChainConfigs`: the Sidecar's ingress listeners if it has some, else the
/// target ports of the proxy's service instances (the first instance of a port decides its
/// protocol); ports are unique and never 15006.
pub(crate) fn inbound_chains(proxy: &Proxy, push: &PushContext) -> Vec<InboundChain> {
    let scope = push.sidecar_scope(proxy);
    let mut chains = if scope.has_ingress_listener() {
        ingress_chains(&scope, ingress_default_bind(proxy, &scope))
    } else {
        instance_chains(&push.service_instances(proxy))
    };
    let peer_authn = push.peer_authentication(&proxy.config_namespace, &proxy.labels);
    for c in &mut chains {
        c.mtls = identity_mode(proxy, peer_authn.for_port(u32::from(c.port)));
    }
    chains
}

/// The chains of the proxy's service instances.
pub(crate) fn instance_chains(instances: &[ServiceInstance]) -> Vec<InboundChain> {
    let mut out: Vec<InboundChain> = Vec::new();
    for instance in instances {
        let port = instance.target_port;
        if out.iter().any(|c| c.port == port) || u32::from(port) == INBOUND_LISTEN_PORT {
            continue;
        }
        out.push(InboundChain {
            port,
            protocol: instance.service_port.protocol,
            bind: None,
            operation: format!("{}:{}/*", instance.service.hostname, instance.service_port.port),
            mtls: MtlsMode::Permissive,
        });
    }
    out
}

/// The chains of the Sidecar's ingress listeners, sorted by port; `default_bind` is where those
/// binding a port without `bind` listen.
fn ingress_chains(scope: &SidecarScope, default_bind: Option<IpAddr>) -> Vec<InboundChain> {
    let mut out: Vec<InboundChain> = Vec::new();
    for ingress in scope.ingress_listeners() {
        let Some(port) = ingress.port.as_ref().and_then(|p| u16::try_from(p.number).ok()) else {
            continue;
        };
        if out.iter().any(|c| c.port == port) || u32::from(port) == INBOUND_LISTEN_PORT {
            continue;
        }
        let protocol = ingress
            .port
            .as_ref()
            .map_or(Protocol::Unsupported, |p| Protocol::parse(&p.protocol));
        // Istio's `getBindToPort`: only an explicit NONE binds (the proxy's own mode is REDIRECT)
        let bind = (ingress.capture_mode.as_deref() == Some("NONE")).then(|| match ingress.bind.as_str() {
            "" => default_bind.map_or_else(|| WILDCARD_ADDRESS.to_owned(), |ip| ip.to_string()),
            bind => bind.to_owned(),
        });
        // Istio: "Sidecar config doesn't have a real hostname", so `<sidecar>.<namespace>`.
        let host = scope
            .sidecar()
            .map(|k| format!("{}.{}", k.name, k.namespace))
            .unwrap_or_default();
        out.push(InboundChain {
            port,
            protocol,
            bind,
            operation: format!("{host}:{port}/*"),
            mtls: MtlsMode::Permissive,
        });
    }
    out.sort_by_key(|c| c.port);
    out
}

/// Istio's `getSidecarInboundBindIPs` for ingress listeners that bind a port without `bind`: the
/// proxy's first global unicast address (`GlobalUnicastIP`). `None` when the scope has no such
/// listener, or the proxy no such address (then they bind 0.0.0.0). The LDS cache key holds it.
pub(crate) fn ingress_default_bind(proxy: &Proxy, scope: &SidecarScope) -> Option<IpAddr> {
    let needed = scope
        .ingress_listeners()
        .iter()
        .any(|l| l.capture_mode.as_deref() == Some("NONE") && l.bind.is_empty());
    if !needed {
        return None;
    }
    proxy.ip_addresses.iter().copied().find(is_global_unicast)
}

/// Go's `IP.IsGlobalUnicast`: not unspecified, loopback, multicast, link-local or broadcast.
fn is_global_unicast(ip: &IpAddr) -> bool {
    let link_local = match ip {
        IpAddr::V4(v4) => v4.is_link_local() || v4.is_broadcast(),
        IpAddr::V6(v6) => v6.is_unicast_link_local(),
    };
    !(ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || link_local)
}

/// `virtualInbound` for the given application chains (those without a bind of their own), with
/// the passthrough chains for every other port under the mTLS modes `passthrough` gives (port 0:
/// the catch-all; others: ports of their own); the application and passthrough chains all start
/// with the workload's authorization filters.
pub(crate) fn virtual_inbound_listener_for(
    mesh: &MeshConfig,
    features: &Features,
    proxy: &Proxy,
    app_chains: &[InboundChain],
    passthrough: &[(u16, MtlsMode)],
    authz: &AuthzFilters,
) -> Listener {
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
    chains.extend(
        app_chains
            .iter()
            .flat_map(|c| filter_chains(mesh, features, proxy, c, authz)),
    );
    // Istio's passthrough chains: port 0 (hence the decorator `:0/*`), protocol unknown.
    let cluster = names::INBOUND_PASSTHROUGH_CLUSTER_IPV4;
    for &(port, mode) in passthrough {
        let catchall = InboundChain {
            port: 0,
            protocol: Protocol::Unsupported,
            bind: None,
            operation: ":0/*".into(),
            mtls: mode,
        };
        for option in super::inbound_mtls::match_options(Protocol::Unsupported, mode, features.http10) {
            let filters = if option.http {
                vec![hcm_filter(&inbound_hcm(
                    mesh, features, proxy, &catchall, cluster, authz,
                ))]
            } else {
                authz.network_filters(vec![tcp_proxy_filter(mesh, cluster, cluster)])
            };
            chains.push(FilterChain {
                name: if option.http {
                    "virtualInbound-catchall-http".into()
                } else {
                    VIRTUAL_INBOUND_LISTENER.into()
                },
                filter_chain_match: Some(chain_match((port != 0).then_some(port), &option)),
                filters,
                transport_socket: option.mtls.then(|| crate::mtls::downstream_istio_mutual(!option.http)),
                ..Default::default()
            });
        }
    }
    // Istio's `populateListenerFilters`: the inspectors only where a chain needs them, so that
    // ports declared TCP (server-first protocols, short messages) are never held for sniffing.
    let mut listener_filters = vec![original_dst()];
    listener_filters.extend(super::inspectors::inspectors(&chains));
    let mut l = Listener {
        name: VIRTUAL_INBOUND_LISTENER.into(),
        address: Some(socket_address(WILDCARD_ADDRESS, INBOUND_LISTEN_PORT)),
        traffic_direction: TrafficDirection::Inbound as i32,
        listener_filters,
        filter_chains: chains,
        ..Default::default()
    };
    set_protocol_detection_timeout(&mut l, mesh);
    l
}

/// The match of one chain option on `port` (`None`: every port).
fn chain_match(port: Option<u16>, option: &super::inbound_mtls::ChainMatch) -> FilterChainMatch {
    let base = port.map_or_else(FilterChainMatch::default, |p| destination_port_match(u32::from(p)));
    FilterChainMatch {
        transport_protocol: option.transport.to_owned(),
        application_protocols: option.alpns.iter().map(|s| (*s).to_owned()).collect(),
        ..base
    }
}

/// Istio's `inboundCustomListener`: `<bind>_<port>` bound to that address, with the chain's filter
/// chains and the inspectors they need (the HTTP inspector only when the protocol is sniffed).
fn bound_inbound_listener(
    mesh: &MeshConfig,
    features: &Features,
    proxy: &Proxy,
    chain: &InboundChain,
    authz: &AuthzFilters,
) -> Listener {
    let bind = chain.bind.as_deref().unwrap_or(WILDCARD_ADDRESS);
    let filter_chains = filter_chains(mesh, features, proxy, chain, authz);
    let mut l = Listener {
        name: format!("{bind}_{}", chain.port),
        address: Some(socket_address(bind, u32::from(chain.port))),
        traffic_direction: TrafficDirection::Inbound as i32,
        listener_filters: super::inspectors::inspectors(&filter_chains),
        filter_chains,
        ..Default::default()
    };
    set_protocol_detection_timeout(&mut l, mesh);
    set_bind_to_port(&mut l, true);
    l
}

/// The filter chains of one application port: HTTP (HCM), TCP (tcp_proxy), or both when sniffed,
/// each as plaintext and/or mutual TLS as the port's PeerAuthentication mode says.
fn filter_chains(
    mesh: &MeshConfig,
    features: &Features,
    proxy: &Proxy,
    chain: &InboundChain,
    authz: &AuthzFilters,
) -> Vec<FilterChain> {
    let cluster = inbound_cluster_name(chain.port);
    super::inbound_mtls::match_options(chain.protocol, chain.mtls, features.http10)
        .iter()
        .map(|option| FilterChain {
            name: cluster.clone(),
            filter_chain_match: Some(chain_match(Some(chain.port), option)),
            filters: if option.http {
                vec![hcm_filter(&inbound_hcm(mesh, features, proxy, chain, &cluster, authz))]
            } else {
                authz.network_filters(vec![tcp_proxy_filter(mesh, &cluster, &cluster)])
            },
            transport_socket: option.mtls.then(|| crate::mtls::downstream_istio_mutual(!option.http)),
            ..Default::default()
        })
        .collect()
}

/// Istio's inbound HCM: stat prefix `inbound_0.0.0.0_<port>;`, client certificate details
/// appended, HTTP/2 options for HTTP/2 and gRPC ports, and an inline route configuration
/// `inbound|<port>||` sending everything to `cluster`, the authorization filters first.
fn inbound_hcm(
    mesh: &MeshConfig,
    features: &Features,
    proxy: &Proxy,
    chain: &InboundChain,
    cluster: &str,
    authz: &AuthzFilters,
) -> HttpConnectionManager {
    let InboundChain {
        port,
        protocol,
        ref operation,
        ..
    } = *chain;
    // The passthrough chain (port 0) names its route and stats after the passthrough cluster;
    // stat prefixes end with Istio's `;` delimiter (`DelimitedStatsPrefix`), which the
    // bootstrap's `http_conn_manager_prefix` tag extraction expects.
    let (route_name, stat_prefix) = if port == 0 {
        (cluster.to_owned(), format!("{cluster};"))
    } else {
        let bind = chain.bind.as_deref().unwrap_or(WILDCARD_ADDRESS);
        (inbound_cluster_name(port), format!("inbound_{bind}_{port};"))
    };
    let mut h = sidecar_outbound_hcm(mesh, features, proxy, &route_name, stat_prefix);
    // Istio's `GetProxyHeaders`: only outbound leaves Envoy's `server: envoy`; inbound answers
    // say `istio-envoy`; XFCC appended and forwarded unless `proxyHeaders` says otherwise.
    let headers =
        crate::proxy_headers::ProxyHeaders::of(proxy, mesh, crate::proxy_headers::ListenerClass::SidecarInbound);
    headers.apply_to_hcm(&mut h);
    headers.apply_inbound_client_cert(&mut h);
    if protocol.is_http2() {
        h.http2_protocol_options = Some(Default::default());
    }
    let route = InboundRoute {
        name: &route_name,
        port,
        cluster,
        operation,
        // Istio: "reset-before-request" does not work well for gRPC streams, so no inbound
        // retries on gRPC ports.
        retries: if matches!(protocol, Protocol::Grpc | Protocol::GrpcWeb) {
            None
        } else {
            crate::route::policy::inbound_retry_policy(mesh.default_inbound_http_retry_policy.as_ref())
        },
    };
    h.route_specifier = Some(hcm::RouteSpecifier::RouteConfig(inbound_route_config(&route)));
    authz.apply_to_hcm(&mut h);
    h
}

struct InboundRoute<'a> {
    name: &'a str,
    port: u16,
    cluster: &'a str,
    operation: &'a str,
    retries: Option<RetryPolicy>,
}

/// `inbound|<port>||` with one virtual host `inbound|http|<port>` matching everything, as Istio's
/// `BuildDefaultHTTPInboundRoute`: no timeouts, the inbound retry policy, a tracing decorator.
fn inbound_route_config(r: &InboundRoute<'_>) -> RouteConfiguration {
    let InboundRoute {
        name,
        port,
        cluster,
        operation,
        ..
    } = *r;
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
                    retry_policy: r.retries.clone(),
                    ..Default::default()
                })),
                decorator: Some(Decorator {
                    operation: operation.to_owned(),
                    propagate: None,
                }),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}
