//! Gateway listeners, as Istio's `buildGatewayListeners` (`pilot/pkg/networking/core/gateway.go`):
//! one listener per merged port; plaintext HTTP servers share one HCM chain (RDS `http.<port>`),
//! TLS-terminating HTTPS servers get one chain each, matched on SNI (RDS `https.<port>.<...>`).
//!
//! Not yet: TCP servers and TLS servers (PASSTHROUGH, AUTO_PASSTHROUGH, or TLS termination into
//! tcp_proxy): they need `tcp`/`tls` VirtualService routes and are skipped, so they produce no
//! filter chain (and no config Envoy could NACK).

use model::networking::Server;
use model::{Protocol, Proxy};
use xds_api::envoy::config::core::v3::{Address, SocketAddress, TrafficDirection, address, socket_address};
use xds_api::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter, filter, listener_filter,
};
use xds_api::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector;
use xds_api::pbwkt::{Duration, UInt32Value};

use super::hcm::{HTTP_CONNECTION_MANAGER, gateway_connection_manager};
use super::merged_gateway::{MergedGateway, MergedServer, ServerPort, is_https_with_tls_termination};
use super::tls::{downstream_tls_context, tls_transport_socket};
use crate::authz::AuthzFilters;
use crate::route::PushView;

pub(crate) const WILDCARD_ADDRESS: &str = "0.0.0.0";
pub(crate) const TLS_INSPECTOR: &str = "envoy.filters.listener.tls_inspector";
/// Istio's default gateway transport socket connect timeout (bounds slow TLS handshakes).
const TRANSPORT_SOCKET_CONNECT_TIMEOUT: Duration = Duration { seconds: 15, nanos: 0 };

/// One filter chain being built: what to match, how to terminate TLS, which RDS to serve.
struct ChainOpts {
    sni_hosts: Vec<String>,
    tls: Option<xds_api::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext>,
    route_name: String,
    stat_prefix: Option<String>,
}

/// Listeners of a router proxy from the gateways selecting it; every HCM starts with the
/// gateway's authorization filters.
pub(crate) fn build_gateway_listeners<P: PushView>(proxy: &Proxy, push: &P, authz: &AuthzFilters) -> Vec<Listener> {
    let merged = MergedGateway::merge(&push.gateways_for_proxy(proxy));
    // listener name -> (bind, port, chains), in port order
    let mut listeners: Vec<(String, String, u32, Vec<ChainOpts>)> = Vec::new();
    for sp in &merged.server_ports {
        let Some(servers) = merged.merged_servers.get(sp) else {
            continue;
        };
        let bind = if sp.bind.is_empty() {
            WILDCARD_ADDRESS.to_owned()
        } else {
            sp.bind.clone()
        };
        let name = format!("{bind}_{}", sp.number);
        let chains = filter_chain_opts(
            sp,
            servers.route_name.as_str(),
            servers.servers.iter().map(|i| &merged.servers[*i]),
        );
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

/// `buildGatewayTCPBasedFilterChains`, for the chains this generator supports.
fn filter_chain_opts<'a>(
    sp: &ServerPort,
    http_route_name: &str,
    servers: impl Iterator<Item = &'a MergedServer>,
) -> Vec<ChainOpts> {
    if Protocol::parse(&sp.protocol).is_http() {
        // plaintext HTTP: all servers of the port share one HCM and one route configuration
        return vec![ChainOpts {
            sni_hosts: Vec::new(),
            tls: None,
            route_name: http_route_name.to_owned(),
            stat_prefix: None,
        }];
    }
    let mut out = Vec::new();
    for s in servers {
        if !is_https_with_tls_termination(&s.server) {
            // TODO(tcp-gateways): TCP and TLS (passthrough or terminating) servers need tcp_proxy
            // chains built from the tcp/tls routes of VirtualServices.
            tracing::debug!(gateway = %s.gateway_name, port = sp.number, "TCP/TLS gateway servers are not supported yet; skipped");
            continue;
        }
        match s.server.tls.as_ref().map(downstream_tls_context) {
            Some(Ok(ctx)) => out.push(ChainOpts {
                sni_hosts: s.sni_hosts.clone(),
                tls: Some(ctx),
                route_name: s.route_name.clone(),
                stat_prefix: server_stat_prefix(&s.server),
            }),
            Some(Err(e)) => tracing::warn!(gateway = %s.gateway_name, port = sp.number, "HTTPS server skipped: {e}"),
            None => {}
        }
    }
    out
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
        .filter(|c| {
            let m = filter_chain_match(&c.sni_hosts);
            if seen.contains(&m) {
                tracing::warn!(listener = %name, route = %c.route_name, "filter chain with a duplicate match dropped");
                return false;
            }
            seen.push(m);
            true
        })
        .map(|c| {
            let stat_prefix = c.stat_prefix.unwrap_or_else(|| default_stat_prefix.clone());
            let mut hcm = gateway_connection_manager(push.mesh(), proxy, &c.route_name, stat_prefix);
            authz.apply_to_hcm(&mut hcm);
            FilterChain {
                filter_chain_match: filter_chain_match(&c.sni_hosts),
                filters: vec![Filter {
                    name: HTTP_CONNECTION_MANAGER.into(),
                    config_type: Some(filter::ConfigType::TypedConfig(xds_api::pack(&hcm))),
                }],
                transport_socket: c.tls.as_ref().map(tls_transport_socket),
                transport_socket_connect_timeout: c.tls.as_ref().map(|_| TRANSPORT_SOCKET_CONNECT_TIMEOUT),
                ..Default::default()
            }
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

/// `toFilterChainMatch`: SNI hosts sorted; none (match all) when `*` is among them.
fn filter_chain_match(sni_hosts: &[String]) -> Option<FilterChainMatch> {
    if sni_hosts.is_empty() || sni_hosts.iter().any(|h| h == "*") {
        return None;
    }
    let mut server_names = sni_hosts.to_vec();
    server_names.sort();
    Some(FilterChainMatch {
        server_names,
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
