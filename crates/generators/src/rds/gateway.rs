//! Gateway route configurations, as Istio's `buildGatewayHTTPRouteConfig`: for each server behind
//! the RDS name, the VirtualServices bound to its gateway give one virtual host per host they
//! share with the server; a second VirtualService for a host appends its routes; vhosts with the
//! same routes are collapsed (`collapseDuplicateRoutes`); no vhost at all gives a 404 blackhole.

use std::collections::BTreeMap;
use std::sync::Arc;

use model::{Config, Proxy};
use xds_api::envoy::config::route::v3::{Route, RouteConfiguration, VirtualHost, virtual_host::TlsRequirementType};

use super::{empty_route_config, route_config};
use crate::lds::merged_gateway::{MergedGateway, MergedServer};
use crate::route::{self, PushView, RouteContext};

/// A virtual host being assembled. Routes come in chunks, one per (gateway, VirtualService);
/// equal chunk lists mean identical routes (Istio compares route pointers).
struct VHost {
    name: String,
    domains: Vec<String>,
    chunks: Vec<usize>,
    require_tls: bool,
}

/// The route configuration `route_name` of a router proxy.
pub(crate) fn build_gateway_http_route_config<P: PushView>(
    proxy: &Proxy,
    push: &P,
    merged: &MergedGateway,
    route_name: &str,
) -> RouteConfiguration {
    let servers: Vec<&MergedServer> = merged.servers_for_route(route_name).collect();
    if servers.is_empty() {
        // normal shortly after a gateway is deleted: Envoy still asks while draining
        tracing::debug!(proxy = %proxy.id, route = route_name, "no gateway server for route; empty configuration");
        return empty_route_config(route_name);
    }
    let attempt_count =
        crate::proxy_headers::ProxyHeaders::of(proxy, push.mesh(), crate::proxy_headers::ListenerClass::Gateway)
            .include_request_attempt_count;
    let mut vhosts = GatewayVirtualHosts::default();
    for server in &servers {
        vhosts.add_server(push, proxy, server, route_name);
    }
    let mut virtual_hosts = vhosts.into_virtual_hosts(attempt_count, servers[0].port(), route_name);
    virtual_hosts.sort_by(|a, b| a.name.cmp(&b.name));
    route_config(route_name, virtual_hosts)
}

/// The virtual hosts of one gateway route configuration as its servers add them: each
/// VirtualService's routes built once per gateway (a chunk), shared by the hosts it serves.
#[derive(Default)]
struct GatewayVirtualHosts {
    chunks: Vec<Vec<Route>>,
    chunk_by_vs: BTreeMap<(String, String), Option<usize>>,
    vs_by_gateway: BTreeMap<String, Vec<Arc<Config>>>,
    vhosts: BTreeMap<String, VHost>,
}

impl GatewayVirtualHosts {
    /// The hosts of `server` that its gateway's VirtualServices route (and, with `httpsRedirect`,
    /// the server's other hosts, redirected to TLS).
    fn add_server<P: PushView>(&mut self, push: &P, proxy: &Proxy, server: &MergedServer, route_name: &str) {
        let gateway = &server.gateway_name;
        let port = server.port();
        let https_redirect = server.server.tls.as_ref().is_some_and(|t| t.https_redirect);
        let virtual_services = self
            .vs_by_gateway
            .entry(gateway.clone())
            .or_insert_with(|| push.virtual_services_for_gateway(proxy, gateway))
            .clone();
        for vs_config in &virtual_services {
            let Some(vs) = route::virtual_service(vs_config) else {
                continue;
            };
            let ns = &vs_config.meta.namespace;
            let vs_hosts: Vec<String> = vs
                .hosts
                .iter()
                .map(|h| model::host::resolve_short_name(h, ns, push.domain()))
                .collect();
            let intersecting = intersect_hosts(&server_hosts_for_namespace(&server.server.hosts, ns), &vs_hosts);
            if intersecting.is_empty() {
                continue;
            }
            let Some(chunk) = self.chunk(push, proxy, server, vs_config, route_name) else {
                continue;
            };
            for host in intersecting {
                let vhost = self.vhost(host.to_ascii_lowercase(), port);
                vhost.chunks.push(chunk);
                vhost.require_tls |= https_redirect;
            }
        }
        if https_redirect {
            // hosts with no VirtualService still redirect to TLS (namespace prefixes dropped)
            for host in &server.server.hosts {
                let host = host.split_once('/').map_or(host.as_str(), |(_, h)| h);
                self.vhost(host.to_ascii_lowercase(), port).require_tls = true;
            }
        }
    }

    /// The routes of `vs_config` for `server`'s gateway and port, built the first time they are
    /// asked for; `None` when it has none there.
    fn chunk<P: PushView>(
        &mut self,
        push: &P,
        proxy: &Proxy,
        server: &MergedServer,
        vs_config: &Arc<Config>,
        route_name: &str,
    ) -> Option<usize> {
        let gateway = &server.gateway_name;
        let key = (
            gateway.clone(),
            format!("{}/{}", vs_config.meta.name, vs_config.meta.namespace),
        );
        let chunks = &mut self.chunks;
        *self.chunk_by_vs.entry(key).or_insert_with(|| {
            let gateway_names = [gateway.clone()];
            let ctx = RouteContext::new(
                push,
                proxy,
                vs_config,
                server.port(),
                &gateway_names,
                server.server.tls.is_some(),
            );
            let routes = route::build_http_routes_for_virtual_service(&ctx);
            if routes.is_empty() {
                tracing::debug!(vs = %vs_config.key(), route = route_name, "no routes for this gateway and port");
                return None;
            }
            chunks.push(routes);
            Some(chunks.len() - 1)
        })
    }

    fn vhost(&mut self, host: String, port: u32) -> &mut VHost {
        self.vhosts.entry(host.clone()).or_insert_with(|| VHost {
            name: domain_name(&host, port),
            domains: vec![host],
            chunks: Vec::new(),
            require_tls: false,
        })
    }

    /// Envoy's virtual hosts: duplicates collapsed, each with its chunks' routes sorted; with
    /// none, the default 404 virtual host.
    fn into_virtual_hosts(self, attempt_count: bool, port: u32, route_name: &str) -> Vec<VirtualHost> {
        if self.vhosts.is_empty() {
            tracing::debug!(route = route_name, "no virtual hosts; default 404 vhost");
            return vec![VirtualHost {
                name: domain_name("blackhole", port),
                domains: vec!["*".into()],
                ..Default::default()
            }];
        }
        let chunks = self.chunks;
        collapse_duplicate_routes(self.vhosts)
            .into_iter()
            .map(|v| VirtualHost {
                name: v.name,
                domains: v.domains,
                routes: route::sort_vhost_routes(v.chunks.iter().flat_map(|c| chunks[*c].iter().cloned()).collect()),
                require_tls: if v.require_tls {
                    TlsRequirementType::All as i32
                } else {
                    TlsRequirementType::None as i32
                },
                include_request_attempt_count: attempt_count,
                ..Default::default()
            })
            .collect()
    }
}

/// Istio's `host.NamesForNamespace`: `ns/host` entries apply only to VirtualServices in `ns`
/// (or any, for `*`), and lose the prefix.
fn server_hosts_for_namespace(hosts: &[String], namespace: &str) -> Vec<String> {
    hosts
        .iter()
        .filter_map(|h| match h.split_once('/') {
            Some((ns, host)) if ns == namespace || ns == "*" => Some(host.to_owned()),
            Some(_) => None,
            None => Some(h.clone()),
        })
        .collect()
}

/// Istio's `Names.Intersection`: for each pair, the narrower of the two when one contains the other.
fn intersect_hosts(server_hosts: &[String], vs_hosts: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for h in server_hosts {
        for o in vs_hosts {
            let pick = if model::host::subset_of(h, o) {
                h
            } else if model::host::subset_of(o, h) {
                o
            } else {
                continue;
            };
            if !out.contains(pick) {
                out.push(pick.clone());
            }
        }
    }
    out
}

/// `util.DomainName`: `host:port`.
fn domain_name(host: &str, port: u32) -> String {
    format!("{host}:{port}")
}

/// `collapseDuplicateRoutes`: vhosts (in host order) whose routes and TLS requirement equal an
/// earlier one's are folded into it as extra domains.
fn collapse_duplicate_routes(vhosts: BTreeMap<String, VHost>) -> Vec<VHost> {
    let mut out: Vec<VHost> = Vec::with_capacity(vhosts.len());
    for (_, v) in vhosts {
        match out
            .iter_mut()
            .find(|o| o.chunks == v.chunks && o.require_tls == v.require_tls)
        {
            Some(primary) => primary.domains.extend(v.domains),
            None => out.push(v),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_scoped_server_hosts() {
        let hosts = vec!["ns1/a.com".to_owned(), "*/b.com".to_owned(), "c.com".to_owned()];
        assert_eq!(server_hosts_for_namespace(&hosts, "ns1"), ["a.com", "b.com", "c.com"]);
        assert_eq!(server_hosts_for_namespace(&hosts, "ns2"), ["b.com", "c.com"]);
    }

    #[test]
    fn intersection_picks_the_narrower_host() {
        let s = |v: &[&str]| v.iter().map(|h| h.to_string()).collect::<Vec<_>>();
        assert_eq!(
            intersect_hosts(&s(&["*.foo.com"]), &s(&["a.foo.com", "b.bar.com"])),
            ["a.foo.com"]
        );
        assert_eq!(
            intersect_hosts(&s(&["a.foo.com", "b.foo.com"]), &s(&["*.foo.com"])),
            ["a.foo.com", "b.foo.com"]
        );
        assert_eq!(
            intersect_hosts(&s(&["*"]), &s(&["*.foo.com", "x.com"])),
            ["*.foo.com", "x.com"]
        );
        assert!(intersect_hosts(&s(&["a.com"]), &s(&["b.com"])).is_empty());
    }
}
