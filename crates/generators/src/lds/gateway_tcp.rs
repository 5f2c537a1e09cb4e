//! Gateway servers that are not HTTP, as Istio's `createGatewayTCPFilterChainOpts`
//! (`pilot/pkg/networking/core/gateway.go`): a `TCP` server forwards with the `tcp` routes of the
//! VirtualServices bound to its gateway; a `TLS` server that terminates TLS does the same behind
//! its TLS context; a `PASSTHROUGH` server routes by SNI with their `tls` routes, one chain per
//! match; an `AUTO_PASSTHROUGH` server (the east-west gateway on 15443) gets one chain per mesh
//! service port and subset, matched on the SNI `outbound_.<port>_.<subset>_.<host>` that Istio's
//! mTLS clients send and Istio's mTLS ALPNs (`allIstioMtlsALPNs`, so that only mTLS reaches the
//! SNI-DNAT clusters), forwarding to the SNI-DNAT cluster of that name.

use std::collections::BTreeMap;

use model::networking::{L4MatchAttributes, Server, TlsMatchAttributes, VirtualService};
use model::{Config, Port, Protocol, Proxy};
use xds_api::envoy::config::listener::v3::Filter;

use super::merged_gateway::{MergedServer, is_passthrough_server, tls_mode};
use super::sidecar_tcp::{build_outbound_network_filters, single_destination_filter};
use crate::mtls::ALL_ISTIO_MTLS_ALPNS;
use crate::names::{TrafficDirection, dns_srv_subset_key};
use crate::route::PushView;

/// A network filter chain of a gateway listener: what it matches and its filters (tcp_proxy;
/// authorization is added by the listener builder).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GatewayNetworkChain {
    pub(crate) sni_hosts: Vec<String>,
    pub(crate) application_protocols: Vec<String>,
    pub(crate) filters: Vec<Filter>,
    /// AUTO_PASSTHROUGH chains carry no authorization (Istio builds them without it).
    pub(crate) authorized: bool,
}

/// The chains of a TCP, terminated-TLS or passthrough server listening on `listener_port`.
/// `tls_hosts` holds the SNI hosts already served on each listener port (with their bind), so
/// that two chains never match the same connections.
pub(crate) fn network_chains<P: PushView>(
    push: &P,
    proxy: &Proxy,
    server: &MergedServer,
    listener_port: u32,
    tls_hosts: &mut BTreeMap<u32, BTreeMap<String, String>>,
) -> Vec<GatewayNetworkChain> {
    let s = &server.server;
    if s.tls.is_some() && is_passthrough_server(s) {
        if tls_mode(s) == Some("AUTO_PASSTHROUGH") {
            return auto_passthrough_chains(push, proxy, &server.sni_hosts);
        }
        return tls_route_chains(push, proxy, server, listener_port, tls_hosts);
    }
    match tcp_route_filters(push, proxy, server) {
        Some(filters) => vec![GatewayNetworkChain {
            // a terminating server matches its hosts as SNI; plain TCP matches everything
            sni_hosts: if s.tls.is_some() {
                server.sni_hosts.clone()
            } else {
                Vec::new()
            },
            application_protocols: Vec::new(),
            filters,
            authorized: true,
        }],
        None => {
            tracing::warn!(gateway = %server.gateway_name, port = server.port(), "gateway listener missed network filter: no tcp route for this server");
            Vec::new()
        }
    }
}

/// The server's port as a service port (the protocol decides the filters Istio adds).
fn server_port(s: &Server) -> Port {
    let p = s.port.clone().unwrap_or_default();
    Port {
        name: p.name,
        port: u16::try_from(p.number).unwrap_or(0),
        protocol: Protocol::parse(&p.protocol),
    }
}

/// `pickMatchingGatewayHosts`: whether some host of the VirtualService matches a server host
/// (`ns/host` server hosts only for VirtualServices of `ns`).
fn picks_gateway_hosts(server_hosts: &[String], config: &Config, vs: &VirtualService) -> bool {
    vs.hosts.iter().any(|vs_host| {
        server_hosts.iter().any(|gw_host| {
            let gw_host = match gw_host.split_once('/') {
                Some((ns, h)) if ns == config.meta.namespace => h,
                Some(_) => return false,
                None => gw_host.as_str(),
            };
            model::host::matches(gw_host, vs_host)
        })
    })
}

/// The VirtualServices among `vses` with a host the server serves (`pickMatchingGatewayHosts`).
fn for_server_hosts<'a>(
    vses: &'a [std::sync::Arc<Config>],
    server: &'a Server,
) -> impl Iterator<Item = (&'a Config, &'a VirtualService)> {
    vses.iter().filter_map(move |config| {
        let vs = crate::route::virtual_service(config)?;
        picks_gateway_hosts(&server.hosts, config, vs).then_some((config.as_ref(), vs))
    })
}

/// `l4SingleMatch`: the port (the server's own, not the translated one) and the gateway.
fn l4_match(port: u32, gateways: &[String], server: &Server, gateway: &str) -> bool {
    let server_port = server.port.as_ref().map_or(0, |p| p.number);
    (port == 0 || port == server_port) && (gateways.is_empty() || gateways.iter().any(|g| g == gateway))
}

fn tcp_match(m: &L4MatchAttributes, server: &Server, gateway: &str) -> bool {
    l4_match(m.port, &m.gateways, server, gateway)
}

fn tls_match(m: &TlsMatchAttributes, server: &Server, gateway: &str) -> bool {
    l4_match(m.port, &m.gateways, server, gateway)
}

/// `buildGatewayNetworkFiltersFromTCPRoutes`: the first `tcp` route (with routes) of the first
/// VirtualService bound to the gateway with a host of the server whose matches apply (a route
/// without matches applies).
fn tcp_route_filters<P: PushView>(push: &P, proxy: &Proxy, server: &MergedServer) -> Option<Vec<Filter>> {
    let s = &server.server;
    let port = server_port(s);
    let vses = push.virtual_services_for_gateway(proxy, &server.gateway_name);
    if vses.is_empty() {
        tracing::debug!(gateway = %server.gateway_name, "no virtual service bound to gateway");
    }
    for (config, vs) in for_server_hosts(&vses, s) {
        for tcp in &vs.tcp {
            let applies = tcp.match_.is_empty() || tcp.match_.iter().any(|m| tcp_match(m, s, &server.gateway_name));
            if applies && !tcp.route.is_empty() {
                return build_outbound_network_filters(push, proxy, &tcp.route, &port, config);
            }
        }
    }
    None
}

/// `buildGatewayNetworkFiltersFromTLSRoutes` for PASSTHROUGH: one chain per applicable `tls`
/// match, on its SNI hosts; a host already served on the listener port (same bind) drops the match.
fn tls_route_chains<P: PushView>(
    push: &P,
    proxy: &Proxy,
    server: &MergedServer,
    listener_port: u32,
    tls_hosts: &mut BTreeMap<u32, BTreeMap<String, String>>,
) -> Vec<GatewayNetworkChain> {
    let s = &server.server;
    let port = server_port(s);
    let mut out = Vec::new();
    let vses = push.virtual_services_for_gateway(proxy, &server.gateway_name);
    for (config, vs) in for_server_hosts(&vses, s) {
        for tls in vs.tls.iter().filter(|t| !t.route.is_empty()) {
            for (i, m) in tls.match_.iter().enumerate() {
                if !tls_match(m, s, &server.gateway_name) {
                    continue;
                }
                let known = tls_hosts.entry(listener_port).or_default();
                let dups = super::merged_gateway::check_duplicates(&m.sni_hosts, &s.bind, known);
                if !dups.is_empty() {
                    tracing::warn!(vs = %config.key(), rule = i, port = listener_port, gateway = %server.gateway_name,
                        "skipping VirtualService rule: duplicate SNI host names {dups:?}");
                    continue;
                }
                if let Some(filters) = build_outbound_network_filters(push, proxy, &tls.route, &port, config) {
                    out.push(GatewayNetworkChain {
                        sni_hosts: m.sni_hosts.clone(),
                        application_protocols: Vec::new(),
                        filters,
                        authorized: true,
                    });
                }
            }
        }
    }
    out
}

/// `builtAutoPassthroughFilterChains`: for each mesh service the proxy sees with a hostname
/// within the server's hosts, each non-UDP port, and each subset of its DestinationRule, a chain
/// matching the SNI of its mTLS clusters and forwarding to the SNI-DNAT cluster of that name.
fn auto_passthrough_chains<P: PushView>(push: &P, proxy: &Proxy, hosts: &[String]) -> Vec<GatewayNetworkChain> {
    let mut out = Vec::new();
    for service in push.scope_services(proxy).iter().filter(|s| !s.mesh_external) {
        if !hosts.iter().any(|h| model::host::subset_of(&service.hostname, h)) {
            continue;
        }
        let subsets: Vec<String> = push
            .with_destination_rule(proxy, service, |dr| dr.subsets.iter().map(|s| s.name.clone()).collect())
            .unwrap_or_default();
        for port in service.ports.iter().filter(|p| p.protocol != Protocol::Udp) {
            for subset in std::iter::once("").chain(subsets.iter().map(String::as_str)) {
                let cluster = dns_srv_subset_key(TrafficDirection::Outbound, subset, &service.hostname, port.port);
                let stat_prefix = crate::cds::outbound_stat_prefix(push.mesh(), service, subset, port)
                    .unwrap_or_else(|| cluster.clone());
                out.push(GatewayNetworkChain {
                    sni_hosts: vec![cluster.clone()],
                    application_protocols: ALL_ISTIO_MTLS_ALPNS.iter().map(|a| a.to_string()).collect(),
                    filters: vec![single_destination_filter(
                        push,
                        proxy,
                        &stat_prefix,
                        &cluster,
                        subset,
                        service,
                    )],
                    authorized: false,
                });
            }
        }
    }
    out
}

#[cfg(test)]
#[path = "gateway_tcp_tests.rs"]
mod tests;
