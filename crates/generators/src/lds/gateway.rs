//! Gateway listeners, as Istio's `buildGatewayListeners` (`pilot/pkg/networking/core/gateway.go`):
//! one listener per merged port (the Service's target port; see `merged_gateway`); plaintext HTTP
//! servers share one HCM chain (RDS `http.<port>`), TLS-terminating HTTPS servers get one chain
//! each, matched on SNI (RDS `https.<port>.<...>`); TCP, TLS and passthrough servers get
//! tcp_proxy chains (`gateway_tcp`). An unprivileged gateway (`UNPRIVILEGED_POD`) skips ports
//! below 1024, which it could not bind.

use std::collections::BTreeMap;

use model::networking::Server;
use model::{Protocol, Proxy};
use xds_api::envoy::config::core::v3::{Address, SocketAddress, TrafficDirection, address, socket_address};
use xds_api::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter, listener_filter,
};
use xds_api::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use xds_api::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
use xds_api::pbwkt::{Duration, UInt32Value};

use super::gateway_tcp::network_chains;
use super::hcm::{HTTP_CONNECTION_MANAGER, gateway_connection_manager};
use super::merged_gateway::{MergedGateway, MergedServer, ServerPort, is_https_with_tls_termination};
use super::tls::{downstream_tls_context, tls_transport_socket};
use crate::authz::AuthzFilters;
use crate::route::PushView;

pub(crate) const WILDCARD_ADDRESS: &str = "0.0.0.0";
pub(crate) const TLS_INSPECTOR: &str = "envoy.filters.listener.tls_inspector";
/// Istio's default gateway transport socket connect timeout (bounds slow TLS handshakes).
const TRANSPORT_SOCKET_CONNECT_TIMEOUT: Duration = Duration { seconds: 15, nanos: 0 };

/// One filter chain being built (Istio's `filterChainOpts`): what it matches, how it terminates
/// TLS, and what it runs.
struct ChainOpts {
    sni_hosts: Vec<String>,
    application_protocols: Vec<String>,
    tls: Option<DownstreamTlsContext>,
    kind: ChainKind,
}

enum ChainKind {
    /// An HTTP connection manager on RDS `route_name`.
    Http {
        route_name: String,
        stat_prefix: Option<String>,
    },
    /// Network filters (tcp_proxy); `authorized`: the gateway's authorization filters go first.
    Network { filters: Vec<Filter>, authorized: bool },
}

/// Istio's `IsUnprivileged`: the proxy runs without the capability to bind ports below 1024.
fn is_unprivileged(proxy: &Proxy) -> bool {
    proxy
        .metadata
        .raw
        .get("UNPRIVILEGED_POD")
        .and_then(|v| v.as_str())
        .is_some_and(|v| !v.is_empty())
}

/// Listeners of a router proxy from the gateways selecting it; every chain starts with the
/// gateway's authorization filters, except AUTO_PASSTHROUGH ones (as Istio).
pub(crate) fn build_gateway_listeners<P: PushView>(proxy: &Proxy, push: &P, authz: &AuthzFilters) -> Vec<Listener> {
    let merged = MergedGateway::for_proxy(push, proxy);
    let unprivileged = is_unprivileged(proxy);
    // listener port -> SNI host -> bind, across the passthrough servers of the listener
    let mut tls_hosts: BTreeMap<u32, BTreeMap<String, String>> = BTreeMap::new();
    // listener name -> (bind, port, chains), in port order
    let mut listeners: Vec<(String, String, u32, Vec<ChainOpts>)> = Vec::new();
    for sp in &merged.server_ports {
        if unprivileged && sp.number < 1024 {
            tracing::warn!(proxy = %proxy.id, port = sp.number, "skipping privileged gateway port for an unprivileged pod");
            continue;
        }
        let Some(merged_servers) = merged.merged_servers.get(sp) else {
            continue;
        };
        let bind = if sp.bind.is_empty() {
            WILDCARD_ADDRESS.to_owned()
        } else {
            sp.bind.clone()
        };
        let name = format!("{bind}_{}", sp.number);
        let servers = merged_servers.servers.iter().map(|i| &merged.servers[*i]);
        let chains = filter_chain_opts(push, proxy, sp, &merged_servers.route_name, servers, &mut tls_hosts);
        match listeners.iter_mut().find(|(n, ..)| *n == name) {
            Some(existing) => existing.3.extend(chains),
            None => listeners.push((name, bind, sp.number, chains)),
        }
    }
    listeners
        .into_iter()
        .filter_map(|(name, bind, port, chains)| {
            if chains.is_empty() {
                tracing::info!(proxy = %proxy.id, listener = %name, "gateway listener omitted: no filter chains");
                return None;
            }
            Some(build_listener(push, proxy, name, bind, port, chains, authz))
        })
        .collect()
}

/// `buildGatewayTCPBasedFilterChains`: plaintext HTTP servers share one chain; otherwise each
/// server gives its chains (HTTPS terminated into an HCM, or network chains).
fn filter_chain_opts<'a, P: PushView>(
    push: &P,
    proxy: &Proxy,
    sp: &ServerPort,
    http_route_name: &str,
    servers: impl Iterator<Item = &'a MergedServer>,
    tls_hosts: &mut BTreeMap<u32, BTreeMap<String, String>>,
) -> Vec<ChainOpts> {
    if Protocol::parse(&sp.protocol).is_http() {
        // plaintext HTTP: all servers of the port share one HCM and one route configuration
        return vec![ChainOpts {
            sni_hosts: Vec::new(),
            application_protocols: Vec::new(),
            tls: None,
            kind: ChainKind::Http {
                route_name: http_route_name.to_owned(),
                stat_prefix: None,
            },
        }];
    }
    let mut out = Vec::new();
    for s in servers {
        let tls = match terminating_tls(s, push.mesh()) {
            Ok(tls) => tls,
            Err(e) => {
                tracing::warn!(gateway = %s.gateway_name, port = sp.number, "server skipped: {e}");
                continue;
            }
        };
        if is_https_with_tls_termination(&s.server) {
            out.push(ChainOpts {
                sni_hosts: s.sni_hosts.clone(),
                application_protocols: Vec::new(),
                tls,
                kind: ChainKind::Http {
                    route_name: s.route_name.clone(),
                    stat_prefix: server_stat_prefix(&s.server),
                },
            });
            continue;
        }
        for chain in network_chains(push, proxy, s, sp.number, tls_hosts) {
            out.push(ChainOpts {
                sni_hosts: chain.sni_hosts,
                application_protocols: chain.application_protocols,
                tls: tls.clone(),
                kind: ChainKind::Network {
                    filters: chain.filters,
                    authorized: chain.authorized,
                },
            });
        }
    }
    out
}

/// The TLS context of a server that terminates TLS (none for plain TCP and passthrough).
fn terminating_tls(
    s: &MergedServer,
    mesh: &model::MeshConfig,
) -> Result<Option<DownstreamTlsContext>, super::tls::TlsContextError> {
    match &s.server.tls {
        Some(tls) if !super::merged_gateway::is_passthrough_server(&s.server) => {
            let tcp = is_tcp_server_with_tls_termination(&s.server);
            downstream_tls_context(tls, tcp, mesh.tls_defaults.as_ref()).map(Some)
        }
        _ => Ok(None),
    }
}

/// Istio's `IsTCPServerWithTLSTermination`: a server that is neither HTTP nor HTTPS and does not
/// pass TLS through.
fn is_tcp_server_with_tls_termination(server: &Server) -> bool {
    let p = Protocol::parse(server.port.as_ref().map_or("", |p| p.protocol.as_str()));
    !super::merged_gateway::is_passthrough_server(server) && !p.is_http() && p != Protocol::Https
}

/// HTTPS chains use the server name as stat prefix, as Istio, when it has one.
fn server_stat_prefix(server: &Server) -> Option<String> {
    (!server.name.is_empty()).then(|| server.name.clone())
}

/// `buildGatewayListener` plus the HCM of every chain (`MutableGatewayListener.build`).
fn build_listener<P: PushView>(
    push: &P,
    proxy: &Proxy,
    name: String,
    bind: String,
    port: u32,
    chains: Vec<ChainOpts>,
    authz: &AuthzFilters,
) -> Listener {
    let needs_inspector = chains.iter().any(|c| !c.sni_hosts.is_empty() || c.tls.is_some());
    let listener_filters = if needs_inspector {
        vec![tls_inspector()]
    } else {
        Vec::new()
    };
    // Istio: `outbound_<listener name>;` (`DelimitedStatsPrefix`); a named server keeps its name.
    let default_stat_prefix = format!("outbound_{name};");
    // Envoy refuses a listener whose chains match the same connections: keep the first of each
    let mut seen: Vec<Option<FilterChainMatch>> = Vec::with_capacity(chains.len());
    let filter_chains = chains
        .into_iter()
        .filter_map(|c| {
            let m = filter_chain_match(&c.sni_hosts, &c.application_protocols);
            if seen.contains(&m) {
                tracing::warn!(listener = %name, sni = ?c.sni_hosts, "filter chain with a duplicate match dropped");
                return None;
            }
            seen.push(m.clone());
            let filters = match c.kind {
                ChainKind::Http {
                    route_name,
                    stat_prefix,
                } => {
                    let stat_prefix = stat_prefix.unwrap_or_else(|| default_stat_prefix.clone());
                    let mut hcm =
                        gateway_connection_manager(push.mesh(), push.features(), proxy, &route_name, stat_prefix);
                    authz.apply_to_hcm(&mut hcm);
                    vec![Filter {
                        name: HTTP_CONNECTION_MANAGER.into(),
                        config_type: Some(filter::ConfigType::TypedConfig(xds_api::pack(&hcm))),
                    }]
                }
                ChainKind::Network {
                    filters,
                    authorized: true,
                } => authz.network_filters(filters),
                ChainKind::Network {
                    filters,
                    authorized: false,
                } => filters,
            };
            Some(FilterChain {
                filter_chain_match: m,
                filters,
                transport_socket: c.tls.as_ref().map(tls_transport_socket),
                transport_socket_connect_timeout: Some(TRANSPORT_SOCKET_CONNECT_TIMEOUT),
                ..Default::default()
            })
        })
        .collect();
    Listener {
        name,
        address: Some(socket_address(&bind, port)),
        traffic_direction: TrafficDirection::Outbound as i32,
        listener_filters,
        filter_chains,
        ..Default::default()
    }
}

/// `toFilterChainMatch`: SNI hosts sorted (none when `*` is among them) and application protocols;
/// no match (match all) without either.
fn filter_chain_match(sni_hosts: &[String], application_protocols: &[String]) -> Option<FilterChainMatch> {
    if (sni_hosts.is_empty() || sni_hosts.iter().any(|h| h == "*")) && application_protocols.is_empty() {
        return None;
    }
    let mut server_names = Vec::new();
    if !sni_hosts.iter().any(|h| h == "*") {
        server_names = sni_hosts.to_vec();
        server_names.sort();
    }
    Some(FilterChainMatch {
        server_names,
        application_protocols: application_protocols.to_vec(),
        ..Default::default()
    })
}

fn tls_inspector() -> ListenerFilter {
    ListenerFilter {
        name: TLS_INSPECTOR.into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(xds_api::pack(&TlsInspector {
            // Istio reads 512 bytes at first instead of Envoy's 64KiB
            initial_read_buffer_size: Some(UInt32Value { value: 512 }),
            ..Default::default()
        }))),
        ..Default::default()
    }
}

fn socket_address(ip: &str, port: u32) -> Address {
    Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: ip.to_owned(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}
