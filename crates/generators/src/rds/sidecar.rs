//! Sidecar outbound route configurations, as Istio's `buildSidecarOutboundHTTPRouteConfig`: the
//! route name is the listener port (`9080`); each visible service with an HTTP port there gets a
//! virtual host (`<fqdn>:<port>`, domains from `generateVirtualHostDomains`) whose routes come
//! from the mesh VirtualService naming it, else one default route to `outbound|<port>||<fqdn>`;
//! VirtualService hosts that are no service get their own virtual host; last, the catch-all
//! `allow_any` (PassthroughCluster) or `block_all` (502) virtual host.
//!
//! A `<host>:<port>` name gives that host's virtual hosts only, with no catch-all.
//!
//! The services and VirtualServices are those of the Sidecar egress listener serving the port
//! (Istio's `GetEgressListenerForRDS`): the listener declared on that port, else the catch-all one;
//! with neither, only the catch-all virtual host.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use model::networking::{Destination, PortSelector};
use model::service::Resolution;
use model::{Config, Features, Protocol, Proxy, Service};
use push_index::{PushContext, SidecarScope};
use xds_api::envoy::config::route::v3::{
    Decorator, DirectResponseAction, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route::Action,
    route_action, route_match::PathSpecifier,
};
use xds_api::pbwkt::Duration;

use super::{empty_route_config, route_config};
use crate::names::{PASSTHROUGH_CLUSTER, TrafficDirection, subset_key};
use crate::proxy_headers::{ListenerClass, ProxyHeaders};
use crate::route::{self, MESH_GATEWAY, PushView, RouteContext, hash, policy};

/// Istio's `util.PassthroughRouteName`: the catch-all under ALLOW_ANY.
pub(crate) const PASSTHROUGH_ROUTE_NAME: &str = "allow_any";
/// Istio's `util.BlackHoleRouteName`: the catch-all under REGISTRY_ONLY.
pub(crate) const BLACK_HOLE_ROUTE_NAME: &str = "block_all";
/// Istio's `DefaultRouteName`.
const DEFAULT_ROUTE_NAME: &str = "default";

/// What sidecar route building reads from a push beyond `PushView`.
pub(crate) trait SidecarPushView: PushView {
    /// Services the proxy sees (`exportTo` and its Sidecar resource), sorted by hostname.
    fn services_for_proxy(&self, proxy: &Proxy) -> Vec<Arc<Service>>;
    /// VirtualServices for the mesh (no gateways, or `mesh`) that the proxy sees, in Istio's order.
    fn virtual_services_for_mesh(&self, proxy: &Proxy) -> Vec<Arc<Config>>;
    /// Whether unknown hosts are refused (`REGISTRY_ONLY`), from the Sidecar or the mesh config.
    fn registry_only(&self, proxy: &Proxy) -> bool;
    /// The proxy's `SidecarScope` (its egress listeners); by default Istio's catch-all scope.
    fn sidecar_scope(&self, _proxy: &Proxy) -> Arc<SidecarScope> {
        Arc::default()
    }
}

impl SidecarPushView for PushContext {
    fn services_for_proxy(&self, proxy: &Proxy) -> Vec<Arc<Service>> {
        PushContext::services_for_proxy(self, proxy)
    }

    fn virtual_services_for_mesh(&self, proxy: &Proxy) -> Vec<Arc<Config>> {
        PushContext::virtual_services_for_mesh(self, proxy)
    }

    fn registry_only(&self, proxy: &Proxy) -> bool {
        PushContext::registry_only(self, proxy)
    }

    fn sidecar_scope(&self, proxy: &Proxy) -> Arc<SidecarScope> {
        PushContext::sidecar_scope(self, proxy)
    }
}

/// The route configuration `route_name` of a sidecar proxy.
pub(crate) fn build_sidecar_outbound_http_route_config<P: SidecarPushView>(
    proxy: &Proxy,
    push: &P,
    route_name: &str,
) -> RouteConfiguration {
    let Some((only_host, port)) = parse_route_name(route_name) else {
        tracing::debug!(proxy = %proxy.id, route = route_name, "sidecar route name is neither a port nor host:port; empty configuration");
        return empty_route_config(route_name);
    };
    // a `host:port` name serves that host only (Istio's sniffed listeners), with no catch-all
    let wanted = |h: &str| only_host.is_none_or(|only| h == only || model::host::subset_of(only, h));
    let (services, virtual_services) = egress_services_and_virtual_services(proxy, push, route_name, only_host, port);
    let owners = VirtualServiceOwners::new(&virtual_services, push.domain());
    let services_by_host: HashMap<&str, &Arc<Service>> = services.iter().map(|s| (s.hostname.as_str(), s)).collect();
    let mut vhosts = VirtualHosts::default();
    let mut services_with_vs: HashSet<&str> = HashSet::new();

    for (vs_index, vs_config) in virtual_services.iter().enumerate() {
        let Some(vs_hosts) = owners.hosts.get(vs_index) else {
            continue;
        };
        let vs_hosts: Vec<&str> = vs_hosts.iter().map(String::as_str).filter(|h| wanted(h)).collect();
        let (own_services, plain_hosts) =
            separate_vs_hosts_and_services(vs_hosts, &services, &services_by_host, &owners, vs_index);
        // Istio builds vhosts for hosts that are no service only with services, or on port 80
        if own_services.is_empty() && port != 80 {
            continue;
        }
        let gateway_names = [MESH_GATEWAY.to_owned()];
        let ctx = RouteContext::new(push, proxy, vs_config, u32::from(port), &gateway_names, false);
        let routes = route::build_http_routes_for_virtual_service(&ctx);
        // A VirtualService with no routes here (its matches name other source labels or another
        // port) leaves its services their default route, as Istio's
        // `buildSidecarVirtualHostsForVirtualService` returning no virtual host.
        if routes.is_empty() {
            tracing::debug!(vs = %vs_config.key(), route = route_name, "no routes of this VirtualService for the port");
            continue;
        }
        services_with_vs.extend(own_services.iter().map(|s| s.hostname.as_str()));
        for h in plain_hosts {
            vhosts.push(domain_name(h, port), vec![h.to_owned()], &routes);
        }
        for s in own_services {
            let domains = generate_virtual_host_domains(s, proxy, push.features());
            vhosts.push(domain_name(&s.hostname, port), domains, &routes);
        }
    }
    for s in services
        .iter()
        .filter(|s| !services_with_vs.contains(s.hostname.as_str()))
    {
        let routes = [default_route(proxy, push, s, port)];
        let domains = generate_virtual_host_domains(s, proxy, push.features());
        vhosts.push(domain_name(&s.hostname, port), domains, &routes);
    }
    let VirtualHosts {
        out: mut virtual_hosts,
        used,
        ..
    } = vhosts;
    virtual_hosts.sort_by(|a, b| a.name.cmp(&b.name));
    let headers = ProxyHeaders::of(proxy, push.mesh(), ListenerClass::SidecarOutbound);
    if only_host.is_none() && !used.contains("*") {
        virtual_hosts.push(catch_all_virtual_host(push.registry_only(proxy), &headers));
    }
    for v in &mut virtual_hosts {
        v.include_request_attempt_count = headers.include_request_attempt_count;
    }
    // Istio's `getVirtualHostsForSniffedServicePort`: the listener of one service on its own
    // address routes whatever Host header arrives by that service's virtual host.
    if only_host.is_some()
        && let [only] = virtual_hosts.as_mut_slice()
    {
        only.domains = vec!["*".into()];
    }
    route_config(route_name, virtual_hosts)
}

/// The services and VirtualServices the proxy's egress listener for this route imports: services
/// with an HTTP (or unsniffed) port `port`, only `only_host` for a `host:port` route.
fn egress_services_and_virtual_services<P: SidecarPushView>(
    proxy: &Proxy,
    push: &P,
    route_name: &str,
    only_host: Option<&str>,
    port: u16,
) -> (Vec<Arc<Service>>, Vec<Arc<Config>>) {
    let scope = push.sidecar_scope(proxy);
    let listener = scope.egress_listener_for_rds(port, route_name);
    let services: Vec<Arc<Service>> = match listener {
        None => Vec::new(),
        Some(listener) => push
            .services_for_proxy(proxy)
            .iter()
            .filter_map(|s| listener.select_service(s))
            .filter(|s| {
                only_host.is_none_or(|only| s.hostname == only)
                    && s.ports
                        .iter()
                        .any(|p| p.port == port && (p.protocol.is_http() || p.protocol == Protocol::Unsupported))
            })
            .collect(),
    };
    let virtual_services: Vec<Arc<Config>> = match listener {
        None => Vec::new(),
        Some(listener) => push
            .virtual_services_for_mesh(proxy)
            .into_iter()
            .filter(|c| listener.imports_virtual_service(c))
            .collect(),
    };
    (services, virtual_services)
}

/// Istio's `separateVSHostsAndServices`: the services a VirtualService's hosts name (those it
/// owns), and the hosts that name no service.
fn separate_vs_hosts_and_services<'a, 'h>(
    vs_hosts: Vec<&'h str>,
    services: &'a [Arc<Service>],
    services_by_host: &HashMap<&str, &'a Arc<Service>>,
    owners: &VirtualServiceOwners,
    vs_index: usize,
) -> (Vec<&'a Arc<Service>>, Vec<&'h str>) {
    let mut own_services: Vec<&Arc<Service>> = Vec::new();
    let mut plain_hosts: Vec<&str> = Vec::new();
    for h in vs_hosts {
        let matching: Vec<&Arc<Service>> = if model::host::is_wildcard(h) {
            services
                .iter()
                .filter(|s| s.hostname == h || model::host::subset_of(&s.hostname, h))
                .collect()
        } else {
            services_by_host.get(h).copied().into_iter().collect()
        };
        if matching.is_empty() {
            plain_hosts.push(h);
        }
        for s in matching {
            if owners.owner(&s.hostname) == Some(vs_index) && !own_services.iter().any(|o| o.hostname == s.hostname) {
                own_services.push(s);
            }
        }
    }
    (own_services, plain_hosts)
}

/// A sidecar route name: `<port>`, or `<host>:<port>` (then `Some(host)`).
fn parse_route_name(name: &str) -> Option<(Option<&str>, u16)> {
    if let Ok(port) = name.parse() {
        return Some((None, port));
    }
    let (host, port) = name.rsplit_once(':')?;
    let host = Some(host).filter(|h| !h.is_empty())?;
    Some((Some(host), port.parse().ok()?))
}

/// The resolved hosts of the mesh VirtualServices, and which one a service gets its routes from:
/// the first naming its hostname exactly, else the one with the most specific wildcard host
/// matching it (Istio's `mostSpecificWildcardVsIndex`).
struct VirtualServiceOwners {
    /// Hosts of each VirtualService (by index), resolved to lower-case FQDNs.
    hosts: Vec<Vec<String>>,
    /// The first VirtualService naming each exact host.
    exact: HashMap<String, usize>,
    /// Wildcard hosts with their VirtualService, in order.
    wildcards: Vec<(String, usize)>,
}

impl VirtualServiceOwners {
    fn new(vses: &[Arc<Config>], domain: &str) -> VirtualServiceOwners {
        let hosts: Vec<Vec<String>> = vses
            .iter()
            .map(|c| {
                route::virtual_service(c).map_or_else(Vec::new, |vs| {
                    vs.hosts
                        .iter()
                        .map(|h| model::host::resolve_short_name(h, &c.meta.namespace, domain).to_ascii_lowercase())
                        .collect()
                })
            })
            .collect();
        let mut exact = HashMap::new();
        let mut wildcards = Vec::new();
        for (i, list) in hosts.iter().enumerate() {
            for h in list {
                exact.entry(h.clone()).or_insert(i);
                if model::host::is_wildcard(h) {
                    wildcards.push((h.clone(), i));
                }
            }
        }
        VirtualServiceOwners {
            hosts,
            exact,
            wildcards,
        }
    }

    /// The index of the VirtualService owning `hostname`, if any.
    fn owner(&self, hostname: &str) -> Option<usize> {
        if let Some(i) = self.exact.get(hostname) {
            return Some(*i);
        }
        let mut best: Option<(usize, usize)> = None;
        for (h, i) in &self.wildcards {
            if model::host::subset_of(hostname, h) && best.is_none_or(|(len, _)| h.len() > len) {
                best = Some((h.len(), *i));
            }
        }
        best.map(|(_, i)| i)
    }
}

/// The virtual hosts of a route configuration being built, with the names and domains taken.
#[derive(Default)]
struct VirtualHosts {
    out: Vec<VirtualHost>,
    names: HashSet<String>,
    used: HashSet<String>,
}

impl VirtualHosts {
    /// Adds a virtual host with the domains no earlier one claimed (Envoy refuses duplicates);
    /// none left means no virtual host, as Istio's `dedupeDomains`. A name already taken is skipped.
    fn push(&mut self, name: String, domains: Vec<String>, routes: &[Route]) {
        if self.names.contains(&name) {
            tracing::debug!(vhost = name, "duplicate virtual host; the first wins");
            return;
        }
        let domains: Vec<String> = domains.into_iter().filter(|d| self.used.insert(d.clone())).collect();
        if domains.is_empty() {
            return;
        }
        self.names.insert(name.clone());
        self.out.push(VirtualHost {
            name,
            domains,
            routes: route::sort_vhost_routes(routes.to_vec()),
            include_request_attempt_count: true,
            ..Default::default()
        });
    }
}

/// Istio's `generateVirtualHostDomains` for sidecars (ports ignored in host matching): the FQDN,
/// its Kubernetes short forms (`GenerateAltVirtualHosts`), `*.`-forms of headless Kubernetes
/// services, and the service addresses.
pub(crate) fn generate_virtual_host_domains(service: &Service, proxy: &Proxy, features: &Features) -> Vec<String> {
    let mut domains = vec![service.hostname.clone()];
    // Istio 1.27+ (`PILOT_ENABLE_ABSOLUTE_FQDN_VHOST_DOMAIN`, on by default): the absolute FQDN,
    // as a client that resolved `name.` sends it in the Host header.
    if features.enable_absolute_fqdn_vhost_domain && service.hostname.parse::<std::net::IpAddr>().is_err() {
        domains.push(format!("{}.", service.hostname));
    }
    domains.extend(generate_alt_virtual_hosts(&service.hostname, &proxy.dns_domain));
    if service.resolution == Resolution::Passthrough && service.attributes.service_registry == "Kubernetes" {
        let wildcards: Vec<String> = domains.iter().map(|d| format!("*.{d}")).collect();
        domains.extend(wildcards);
    }
    for a in service.addresses_for(proxy.cluster_id()) {
        if a == "0.0.0.0" || a == "::" || a.is_empty() {
            continue;
        }
        let a = a.split('/').next().unwrap_or(a);
        domains.push(if a.contains(':') {
            format!("[{a}]")
        } else {
            a.to_owned()
        });
    }
    domains
}

/// Istio's `GenerateAltVirtualHosts` for a proxy whose DNS domain is `<ns>.svc.<suffix>`: a
/// Kubernetes service of the same namespace is also `name`, `name.ns.svc` and `name.ns`; of
/// another namespace `name.ns.svc` and `name.ns`; other hosts get no short forms.
pub(crate) fn generate_alt_virtual_hosts(hostname: &str, proxy_domain: &str) -> Vec<String> {
    let Some(proxy_svc) = proxy_domain.find(".svc.") else {
        return Vec::new();
    };
    // the shared suffix after the namespace: `svc.cluster.local`
    let suffix = &proxy_domain[proxy_svc + 1..];
    let Some(ih) = hostname.find(".svc.") else {
        return Vec::new();
    };
    if !hostname.ends_with(suffix) {
        return Vec::new();
    }
    let Some(dot) = hostname.find('.') else {
        return Vec::new();
    };
    if dot + 1 > ih {
        return Vec::new();
    }
    let name_ns = &hostname[..ih];
    let mut out = Vec::with_capacity(3);
    if hostname[dot + 1..ih] == proxy_domain[..proxy_svc] {
        out.push(hostname[..dot].to_owned());
    }
    out.push(format!("{name_ns}.svc"));
    out.push(name_ns.to_owned());
    out
}

/// `util.DomainName`: `host:port`.
fn domain_name(host: &str, port: u16) -> String {
    format!("{host}:{port}")
}

/// Istio's `BuildDefaultHTTPOutboundRoute`: `/` to the service's cluster, no timeout, default
/// retries, and the hash policy of the DestinationRule's consistent hash for the port (`hashByService`).
fn default_route<P: PushView>(proxy: &Proxy, push: &P, service: &Service, port: u16) -> Route {
    let hostname = service.hostname.as_str();
    let destination = Destination {
        host: hostname.to_owned(),
        subset: String::new(),
        port: Some(PortSelector { number: port.into() }),
    };
    let hash_policy: Vec<_> = push
        .with_destination_rule(proxy, service, |dr| {
            hash::consistent_hash_for_destination(dr, &destination)
        })
        .flatten()
        .and_then(|h| hash::hash_policy(&h))
        .into_iter()
        .collect();
    let no_timeout = Duration::default();
    #[allow(deprecated)]
    let action = RouteAction {
        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(subset_key(
            TrafficDirection::Outbound,
            "",
            hostname,
            port,
        ))),
        timeout: Some(no_timeout),
        max_grpc_timeout: Some(no_timeout),
        // Istio's `BuildDefaultHTTPOutboundRoute`: the mesh's default retries, previous hosts
        // avoided even when the DestinationRule hashes (its `hashPolicy` argument is false here).
        retry_policy: policy::retry_policy(push.mesh().default_http_retry_policy.as_ref(), false),
        hash_policy,
        ..Default::default()
    };
    Route {
        name: DEFAULT_ROUTE_NAME.into(),
        r#match: Some(prefix_match()),
        action: Some(Action::Route(action)),
        decorator: Some(Decorator {
            operation: format!("{hostname}:{port}/*"),
            propagate: None,
        }),
        ..Default::default()
    }
}

fn prefix_match() -> RouteMatch {
    RouteMatch {
        path_specifier: Some(PathSpecifier::Prefix("/".into())),
        ..Default::default()
    }
}

/// Istio's `BuildCatchAllVirtualHost`: `allow_any` to PassthroughCluster, or `block_all` (502).
pub(crate) fn catch_all_virtual_host(registry_only: bool, headers: &ProxyHeaders) -> VirtualHost {
    let (name, action) = if registry_only {
        (
            BLACK_HOLE_ROUTE_NAME,
            Action::DirectResponse(DirectResponseAction {
                status: 502,
                ..Default::default()
            }),
        )
    } else {
        let no_timeout = Duration::default();
        #[allow(deprecated)]
        let action = RouteAction {
            cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(PASSTHROUGH_CLUSTER.into())),
            timeout: Some(no_timeout),
            max_grpc_timeout: Some(no_timeout),
            append_x_forwarded_host: headers.x_forwarded_host,
            ..Default::default()
        };
        (PASSTHROUGH_ROUTE_NAME, Action::Route(action))
    };
    VirtualHost {
        name: name.into(),
        domains: vec!["*".into()],
        routes: vec![Route {
            name: name.into(),
            r#match: Some(prefix_match()),
            action: Some(action),
            ..Default::default()
        }],
        include_request_attempt_count: headers.include_request_attempt_count,
        ..Default::default()
    }
}
