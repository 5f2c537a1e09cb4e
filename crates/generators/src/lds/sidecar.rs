//! Sidecar listeners, as Istio's `buildSidecarListeners` (`listener.go`, `listener_builder.go`):
//! `virtualOutbound` (0.0.0.0:15001, original destination, passthrough or blackhole by the
//! proxy's `outboundTrafficPolicy`), `virtualInbound` (0.0.0.0:15006) and listeners bound by Sidecar
//! ingress listeners (see `sidecar_inbound`), and the outbound listeners of each egress listener of
//! the proxy's `SidecarScope`, with `bind_to_port: false` unless its capture mode is `NONE`: HTTP
//! ports share `<bind or 0.0.0.0>_<port>` (RDS `<port>`), TCP and TLS ports get `<bind or vip>_<port>`
//! with tcp_proxy chains that follow the `tcp`/`tls` routes of the listener's mesh VirtualServices
//! (`sidecar_tcp`), ports of unknown protocol get HTTP/TCP protocol sniffing chains behind an
//! http_inspector. An egress listener with a port serves only its services there; the catch-all
//! listener serves every other service port.

use std::sync::Arc;

use model::{Config, Features, MeshConfig, Port, Protocol, Proxy, Service};
use push_index::PushContext;
use xds_api::envoy::config::core::v3::{Address, SocketAddress, TrafficDirection, address, socket_address};
use xds_api::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter, listener_filter,
};
use xds_api::envoy::extensions::filters::listener::http_inspector::v3::HttpInspector;
use xds_api::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use xds_api::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager as hcm,
};
use xds_api::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use xds_api::pbwkt::{BoolValue, UInt32Value};

use super::gateway::{TLS_INSPECTOR, WILDCARD_ADDRESS};
use super::hcm::{HTTP_CONNECTION_MANAGER, access_logs, gateway_connection_manager};
use super::sidecar_tcp::{self, NetworkChain};
use crate::names;
use crate::proxy_headers::{ListenerClass, ProxyHeaders};

pub(crate) const VIRTUAL_OUTBOUND_LISTENER: &str = "virtualOutbound";
pub(crate) const VIRTUAL_INBOUND_LISTENER: &str = "virtualInbound";
/// Istio's `ProxyOutboundListenPort` and `ProxyInboundListenPort`.
pub(crate) const OUTBOUND_LISTEN_PORT: u32 = 15001;
/// Istio's `LocalhostAddress`: where a listener bound to a port without `bind` listens.
pub(crate) const LOCALHOST_ADDRESS: &str = "127.0.0.1";
pub(crate) const INBOUND_LISTEN_PORT: u32 = 15006;
pub(crate) const ORIGINAL_DST_FILTER: &str = "envoy.filters.listener.original_dst";
pub(crate) const HTTP_INSPECTOR: &str = "envoy.filters.listener.http_inspector";
pub(crate) const TCP_PROXY: &str = "envoy.filters.network.tcp_proxy";

/// All listeners of a sidecar: virtualOutbound, the inbound listeners (virtualInbound first), then
/// the outbound listeners.
pub(crate) fn build_sidecar_listeners(proxy: &Proxy, push: &PushContext) -> Vec<Listener> {
    let mut out = vec![virtual_outbound_listener(push.mesh(), push.registry_only(proxy))];
    out.extend(super::sidecar_inbound::inbound_listeners(proxy, push));
    out.extend(outbound_listeners(proxy, push));
    out
}

/// `virtualOutbound`: takes every intercepted outbound connection and hands it to the listener of
/// its original destination; what no listener claims goes to `PassthroughCluster` (`ALLOW_ANY`) or
/// `BlackHoleCluster` (`REGISTRY_ONLY`, from the Sidecar or the mesh config). Connections to 15001
/// itself are blackholed (no loops).
pub(crate) fn virtual_outbound_listener(mesh: &MeshConfig, registry_only: bool) -> Listener {
    let catch_all = if registry_only {
        names::BLACK_HOLE_CLUSTER
    } else {
        names::PASSTHROUGH_CLUSTER
    };
    Listener {
        name: VIRTUAL_OUTBOUND_LISTENER.into(),
        address: Some(socket_address(WILDCARD_ADDRESS, OUTBOUND_LISTEN_PORT)),
        use_original_dst: Some(BoolValue { value: true }),
        traffic_direction: TrafficDirection::Outbound as i32,
        filter_chains: vec![
            FilterChain {
                name: "virtualOutbound-blackhole".into(),
                filter_chain_match: Some(destination_port_match(OUTBOUND_LISTEN_PORT)),
                filters: vec![tcp_proxy_filter(
                    mesh,
                    names::BLACK_HOLE_CLUSTER,
                    names::BLACK_HOLE_CLUSTER,
                )],
                ..Default::default()
            },
            FilterChain {
                name: "virtualOutbound-catchall-tcp".into(),
                filters: vec![tcp_proxy_filter(mesh, catch_all, catch_all)],
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

/// The transport protocol of a connection no TLS inspector recognised as TLS.
const RAW_BUFFER_TRANSPORT_PROTOCOL: &str = "raw_buffer";

/// What an outbound listener serves.
#[derive(Debug, Clone, PartialEq)]
enum OutboundKind {
    /// HTTP on an address of its own (a Sidecar egress `bind`): the HCM with RDS `<port>`.
    Http,
    /// TCP, TLS, Mongo, Redis, MySQL: network chains (`sidecar_tcp`), from `tcp`/`tls` routes of
    /// mesh VirtualServices or to the service's cluster.
    Tcp {
        protocol: Protocol,
        chains: Vec<NetworkChain>,
    },
    /// Sniffed: HTTP (by the HTTP inspector's ALPN) to RDS `<port>` or `<host>:<port>`, anything else to the network
    /// chains of the TCP services of the port, else through (`PassthroughFilterChain`). Unknown
    /// protocols, and HTTP on the wildcard address, as Istio: a TCP or TLS connection to a port
    /// that some mesh service declares HTTP still reaches its destination.
    Sniffed {
        chains: Vec<NetworkChain>,
        /// The RDS of a sniffed service on an address of its own: `<host>:<port>` (one virtual
        /// host for any Host header, as Istio's); `None`: `<port>`.
        rds: Option<String>,
    },
}

struct OutboundEntry {
    name: String,
    bind: String,
    port: u16,
    kind: OutboundKind,
    /// A real socket (egress capture mode `NONE`) rather than a target of `virtualOutbound`.
    bind_to_port: bool,
    /// Built for an egress listener with a port: the catch-all listener's services add nothing to it.
    locked: bool,
}

/// What the services of one egress listener are built with.
struct EgressContext<'a> {
    push: &'a PushContext,
    proxy: &'a Proxy,
    /// The listener's VirtualServices with `tcp`/`tls` routes.
    l4_virtual_services: Vec<&'a Config>,
    /// The listener's `bind` (127.0.0.1 when it binds a port without one); `None`: per service.
    bind: Option<&'a str>,
    bind_to_port: bool,
}

/// `buildSidecarOutboundListeners`: per egress listener of the proxy's `SidecarScope`, its services
/// (those its hosts import), on the listener's port (only services with that port) or, for the
/// catch-all listener, on each service port that no listener with a port claimed. One listener per
/// (bind, port); on a conflict the first service to claim a listener name keeps it, except that
/// HTTP takes a wildcard port from TCP, and TCP services merge their chains when Envoy can tell them
/// apart (SNI, destination subnets).
fn outbound_listeners(proxy: &Proxy, push: &PushContext) -> Vec<Listener> {
    let scope = push.sidecar_scope(proxy);
    let mesh_virtual_services = push.virtual_services_for_mesh(proxy);
    let visible = push.services_for_namespace(&proxy.config_namespace);
    let mut listeners: Vec<OutboundEntry> = Vec::new();
    for egress in scope.egress_listeners() {
        if egress.is_http_proxy() || egress.port().is_some_and(|p| p.number == 0) {
            tracing::debug!(
                proxy = proxy.id,
                bind = egress.bind(),
                "HTTP_PROXY and unix socket egress listeners are not built"
            );
            continue;
        }
        let virtual_services: Vec<Arc<Config>> = mesh_virtual_services
            .iter()
            .filter(|c| egress.imports_virtual_service(c))
            .cloned()
            .collect();
        let bind_to_port = egress.bind_to_port();
        let ctx = EgressContext {
            push,
            proxy,
            l4_virtual_services: sidecar_tcp::l4_virtual_services(&virtual_services),
            bind: match egress.bind() {
                "" if bind_to_port => Some(LOCALHOST_ADDRESS),
                "" => None,
                bind => Some(bind),
            },
            bind_to_port,
        };
        let services = visible.iter().filter_map(|s| egress.select_service(s));
        match egress.port() {
            Some(p) => {
                let Ok(number) = u16::try_from(p.number) else { continue };
                let listen_port = Port {
                    name: p.name.clone(),
                    port: number,
                    protocol: Protocol::parse(&p.protocol),
                };
                for service in services {
                    add_outbound_entry(&ctx, &mut listeners, &service, &listen_port);
                }
            }
            None => {
                listeners.iter_mut().for_each(|e| e.locked = true);
                for service in services {
                    for port in service.ports.iter().filter(|p| p.protocol != Protocol::Udp) {
                        add_outbound_entry(&ctx, &mut listeners, &service, port);
                    }
                }
            }
        }
    }
    let registry_only = push.registry_only(proxy);
    listeners
        .into_iter()
        .map(|e| outbound_listener(push.mesh(), push.features(), registry_only, proxy, e))
        .collect()
}

/// Istio's `buildSidecarOutboundListener`: adds `service` on `port` (the egress listener's port, or
/// one of the service's) to the listener of its (bind, port), or creates that listener.
fn add_outbound_entry(ctx: &EgressContext<'_>, listeners: &mut Vec<OutboundEntry>, service: &Service, port: &Port) {
    let addresses = ctx.push.service_addresses(ctx.proxy, service);
    let (vip, cidr) = match ctx.bind {
        Some(bind) => (bind.to_owned(), None),
        None => service_bind(&addresses),
    };
    let bind = if port.protocol.is_http() {
        ctx.bind.unwrap_or(WILDCARD_ADDRESS).to_owned()
    } else {
        vip.clone()
    };
    // Istio's `conflictWithReservedListener`: the wildcard address never takes 15001 or 15006
    if bind == WILDCARD_ADDRESS && [OUTBOUND_LISTEN_PORT, INBOUND_LISTEN_PORT].contains(&u32::from(port.port)) {
        tracing::debug!(
            proxy = ctx.proxy.id,
            port = port.port,
            "outbound port conflicts with a virtual listener"
        );
        return;
    }
    let name = format!("{bind}_{}", port.port);
    let existing = listeners.iter().position(|e| e.name == name);
    if existing.is_some_and(|i| listeners[i].locked) {
        // the user declared this port on an egress listener with its own services
        return;
    }
    let chains = || {
        let (push, proxy, vses) = (ctx.push, ctx.proxy, &ctx.l4_virtual_services);
        sidecar_tcp::outbound_network_chains(push, proxy, service, port, &vip, cidr.as_deref(), vses)
    };
    let kind = match port.protocol {
        // Istio: HTTP on the wildcard is sniffed, with a TCP fall-through
        p if p.is_http() && bind == WILDCARD_ADDRESS => OutboundKind::Sniffed {
            chains: Vec::new(),
            rds: None,
        },
        p if p.is_http() => OutboundKind::Http,
        // Istio: a sniffed service on its own address routes by `<host>:<port>`
        Protocol::Unsupported => OutboundKind::Sniffed {
            chains: chains(),
            rds: (bind != WILDCARD_ADDRESS).then(|| format!("{}:{}", service.hostname, port.port)),
        },
        protocol => OutboundKind::Tcp {
            protocol,
            chains: chains(),
        },
    };
    let Some(existing) = existing.and_then(|i| listeners.get_mut(i)) else {
        listeners.push(OutboundEntry {
            name,
            bind,
            port: port.port,
            kind,
            bind_to_port: ctx.bind_to_port,
            locked: false,
        });
        return;
    };
    merge_outbound_kind(&mut existing.kind, kind, port.protocol, &name);
}

/// Istio's conflict handling between the services of one outbound listener: HTTP and TCP mixed
/// are merged and sniffed (`HTTPOverTCP`, `TCPOverHTTP`, `AutoOverTCP`), TCP chains merge where
/// Envoy can tell them apart (`TCPOverTCP`, `TCPOverAuto`), a sniffed service replaces HTTP on an
/// address of its own (`AutoOverHTTP`), and HTTP joins HTTP. Mongo and MySQL, server-first
/// protocols an inspector would break, share a listener with nothing else.
fn merge_outbound_kind(existing: &mut OutboundKind, incoming: OutboundKind, incoming_protocol: Protocol, name: &str) {
    let existing_protocol = match existing {
        OutboundKind::Tcp { protocol, .. } => *protocol,
        OutboundKind::Http => Protocol::Http,
        OutboundKind::Sniffed { .. } => Protocol::Unsupported,
    };
    if sidecar_tcp::well_known_port_conflict(incoming_protocol, existing_protocol) {
        tracing::debug!(
            listener = name,
            ?incoming_protocol,
            ?existing_protocol,
            "outbound listener conflict on a well known port: first service kept"
        );
        return;
    }
    let tcp_chains = |k: OutboundKind| match k {
        OutboundKind::Tcp { chains, .. } | OutboundKind::Sniffed { chains, .. } => chains,
        OutboundKind::Http => Vec::new(),
    };
    match (existing, incoming) {
        (OutboundKind::Sniffed { chains, .. }, incoming) => {
            sidecar_tcp::merge_network_chains(chains, tcp_chains(incoming), name);
        }
        (OutboundKind::Tcp { chains, .. }, OutboundKind::Tcp { chains: incoming, .. }) => {
            sidecar_tcp::merge_network_chains(chains, incoming, name);
        }
        (existing @ OutboundKind::Tcp { .. }, incoming) => {
            let rds = match &incoming {
                OutboundKind::Sniffed { rds, .. } => rds.clone(),
                _ => None,
            };
            let mut chains = tcp_chains(std::mem::replace(existing, OutboundKind::Http));
            sidecar_tcp::merge_network_chains(&mut chains, tcp_chains(incoming), name);
            *existing = OutboundKind::Sniffed { chains, rds };
        }
        (existing @ OutboundKind::Http, incoming @ (OutboundKind::Sniffed { .. } | OutboundKind::Tcp { .. })) => {
            *existing = OutboundKind::Sniffed {
                chains: tcp_chains(incoming),
                rds: None,
            };
        }
        (OutboundKind::Http, OutboundKind::Http) => {}
    }
}

/// Istio's listener bind for a TCP or sniffed port: the service's first address for the proxy
/// (its own, or the VIP allocated to it when the proxy captures DNS) when it is an IP; when it is
/// a CIDR, the wildcard with the CIDR as the chains' destination match; without an address, the
/// wildcard.
fn service_bind(addresses: &[String]) -> (String, Option<String>) {
    match addresses.first() {
        Some(a) if a.parse::<std::net::IpAddr>().is_ok() => (a.clone(), None),
        Some(a) if a.contains('/') => (WILDCARD_ADDRESS.to_owned(), Some(a.clone())),
        _ => (WILDCARD_ADDRESS.to_owned(), None),
    }
}

fn outbound_listener(
    mesh: &MeshConfig,
    features: &Features,
    registry_only: bool,
    proxy: &Proxy,
    entry: OutboundEntry,
) -> Listener {
    let OutboundEntry {
        name,
        bind,
        port,
        kind,
        bind_to_port,
        ..
    } = entry;
    let (sniffed_chains, rds) = match kind {
        OutboundKind::Tcp { chains, .. } => {
            let mut l = sidecar_tcp::network_listener(mesh, registry_only, name, &bind, port, chains);
            set_bind_to_port(&mut l, bind_to_port);
            return l;
        }
        OutboundKind::Http => (None, None),
        OutboundKind::Sniffed { chains, rds } => (Some(chains), rds),
    };
    let rds = rds.unwrap_or_else(|| port.to_string());
    // Istio: `outbound_<listener name>;` (`DelimitedStatsPrefix`).
    let stat_prefix = format!("outbound_{name};");
    let http_chain = |filter_chain_match| FilterChain {
        filter_chain_match,
        filters: vec![hcm_filter(&sidecar_outbound_hcm(
            mesh,
            features,
            proxy,
            &rds,
            stat_prefix.clone(),
        ))],
        ..Default::default()
    };
    let Some(chains) = sniffed_chains else {
        let mut l = Listener {
            name,
            address: Some(socket_address(&bind, u32::from(port))),
            traffic_direction: TrafficDirection::Outbound as i32,
            filter_chains: vec![http_chain(None)],
            ..Default::default()
        };
        set_bind_to_port(&mut l, bind_to_port);
        return l;
    };
    // Istio's `buildListenerFromEntry` for a sniffed listener: the network chains as a TCP
    // listener has them (a catch-all chain as the default one, else `PassthroughFilterChain`), in
    // front of them the HTTP chain for what the HTTP inspector recognises.
    let mut l = sidecar_tcp::network_listener(mesh, registry_only, name, &bind, port, chains);
    if l.default_filter_chain.is_none() && l.filter_chains.len() == 1 && l.filter_chains[0].filter_chain_match.is_none()
    {
        l.default_filter_chain = l.filter_chains.pop();
    }
    l.filter_chains.insert(
        0,
        http_chain(Some(FilterChainMatch {
            application_protocols: super::inbound_mtls::plaintext_http_alpns(features.http10)
                .iter()
                .map(|s| s.to_string())
                .collect(),
            transport_protocol: RAW_BUFFER_TRANSPORT_PROTOCOL.into(),
            ..Default::default()
        })),
    );
    l.listener_filters.push(http_inspector());
    set_protocol_detection_timeout(&mut l, mesh);
    set_bind_to_port(&mut l, bind_to_port);
    l
}

/// A listener that binds its port (capture mode `NONE`) accepts one connection per socket event,
/// as Istio's default `MAX_CONNECTIONS_PER_SOCKET_EVENT_LOOP`; the others only take connections
/// handed over by a virtual listener (`bind_to_port: false`).
pub(super) fn set_bind_to_port(l: &mut Listener, bind_to_port: bool) {
    if bind_to_port {
        l.bind_to_port = None;
        l.max_connections_to_accept_per_socket_event = Some(UInt32Value { value: 1 });
    } else {
        l.bind_to_port = Some(BoolValue { value: false });
    }
}

/// Istio's protocol detection settings: listener filters give up after
/// `meshConfig.protocolDetectionTimeout` (0s: never) and the connection goes on undetected.
pub(super) fn set_protocol_detection_timeout(l: &mut Listener, mesh: &MeshConfig) {
    l.listener_filters_timeout = model::duration::parse(&mesh.protocol_detection_timeout)
        .map(crate::cds::proto_duration)
        .or(Some(xds_api::pbwkt::Duration::default()));
    l.continue_on_listener_filters_timeout = true;
}

/// The sidecar's outbound HCM: the gateway HCM without gateway-only settings (no trusting of
/// the remote address, client certificate details sanitized), with the outbound proxy headers
/// (Envoy's own `server` header).
pub(crate) fn sidecar_outbound_hcm(
    mesh: &MeshConfig,
    features: &Features,
    proxy: &Proxy,
    rds: &str,
    stat_prefix: String,
) -> HttpConnectionManager {
    let mut h = gateway_connection_manager(mesh, features, proxy, rds, stat_prefix);
    ProxyHeaders::of(proxy, mesh, ListenerClass::SidecarOutbound).apply_to_hcm(&mut h);
    h.use_remote_address = Some(BoolValue { value: false });
    h.xff_num_trusted_hops = 0;
    h.forward_client_cert_details = hcm::ForwardClientCertDetails::Sanitize as i32;
    h.set_current_client_cert_details = None;
    h
}

pub(super) fn hcm_filter(h: &HttpConnectionManager) -> Filter {
    Filter {
        name: HTTP_CONNECTION_MANAGER.into(),
        config_type: Some(filter::ConfigType::TypedConfig(xds_api::pack(h))),
    }
}

/// A tcp_proxy to `cluster`, with the mesh's access log.
pub(super) fn tcp_proxy_filter(mesh: &MeshConfig, stat_prefix: &str, cluster: &str) -> Filter {
    let proxy = TcpProxy {
        stat_prefix: stat_prefix.to_owned(),
        cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(cluster.to_owned())),
        access_log: access_logs(mesh),
        ..Default::default()
    };
    Filter {
        name: TCP_PROXY.into(),
        config_type: Some(filter::ConfigType::TypedConfig(xds_api::pack(&proxy))),
    }
}

pub(super) fn destination_port_match(port: u32) -> FilterChainMatch {
    FilterChainMatch {
        destination_port: Some(UInt32Value { value: port }),
        ..Default::default()
    }
}

pub(super) fn http_inspector() -> ListenerFilter {
    ListenerFilter {
        name: HTTP_INSPECTOR.into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(xds_api::pack(
            &HttpInspector::default(),
        ))),
        ..Default::default()
    }
}

pub(super) fn original_dst() -> ListenerFilter {
    ListenerFilter {
        name: ORIGINAL_DST_FILTER.into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(xds_api::pack(
            &OriginalDst::default(),
        ))),
        ..Default::default()
    }
}

pub(super) fn tls_inspector() -> ListenerFilter {
    ListenerFilter {
        name: TLS_INSPECTOR.into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(xds_api::pack(
            &TlsInspector::default(),
        ))),
        ..Default::default()
    }
}

pub(super) fn socket_address(ip: &str, port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_owned(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

#[cfg(test)]
#[path = "sidecar_listeners_tests.rs"]
mod sidecar_listeners_tests;
