//! Network (tcp_proxy) filter chains of sidecar outbound listeners, as Istio's
//! `buildSidecarOutboundTCPListenerOpts` (`listener.go`), `buildSidecarOutboundTLSFilterChainOpts`,
//! `buildSidecarOutboundTCPFilterChainOpts` (`tls.go`) and `buildOutboundNetworkFilters`
//! (`networkfilter.go`): the `tls` (SNI) and `tcp` routes of the mesh VirtualServices naming a
//! service decide where its TCP/TLS port goes; without one, the service's own cluster. Also the
//! listener assembly of `buildListenerFromEntry` for such chains (tls_inspector, default chain).

use std::collections::HashSet;
use std::net::IpAddr;

use model::networking::{DestinationRule, L4MatchAttributes, RouteDestination, TlsMatchAttributes, VirtualService};
use model::{Config, MeshConfig, Port, Protocol, Proxy, Service};
use xds_api::envoy::config::core::v3::{CidrRange, TrafficDirection};
use xds_api::envoy::config::listener::v3::{Filter, FilterChain, FilterChainMatch, Listener, filter};
use xds_api::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use xds_api::envoy::r#type::v3::{HashPolicy, hash_policy};
use xds_api::pbwkt::{BoolValue, Duration, UInt32Value};

use super::gateway::WILDCARD_ADDRESS;
use super::hcm::access_logs;
use super::sidecar::{TCP_PROXY, socket_address, tls_inspector};
use crate::names::{self, TrafficDirection as Direction};
use crate::route::{MESH_GATEWAY, PushView, destination::destination_cluster, policy::parse_duration};

/// Istio's `util.PassthroughFilterChain`: the default chain of listeners whose chains all match on
/// something (SNI, destination subnets).
pub(crate) const PASSTHROUGH_FILTER_CHAIN: &str = "PassthroughFilterChain";

/// Istio's `filterChainOpts` for a network chain: what it matches and its filters.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NetworkChain {
    pub(crate) sni_hosts: Vec<String>,
    pub(crate) destination_cidrs: Vec<String>,
    pub(crate) filters: Vec<Filter>,
}

impl NetworkChain {
    /// Istio's `isMatchAll`: no SNI (or `*`) and no destination subnet.
    pub(crate) fn is_match_all(&self) -> bool {
        (self.sni_hosts.is_empty() || self.sni_hosts.iter().any(|h| h == "*")) && self.destination_cidrs.is_empty()
    }

    /// Istio's `conflictsWith`: the same SNI set (ignoring `*`) and the same masked subnets
    /// (ignoring `0.0.0.0`), so Envoy could not tell the two chains apart.
    pub(crate) fn conflicts_with(&self, other: &NetworkChain) -> bool {
        let sni = |c: &NetworkChain| -> HashSet<String> { c.sni_hosts.iter().filter(|h| *h != "*").cloned().collect() };
        let cidrs = |c: &NetworkChain| -> HashSet<(IpAddr, u32)> {
            c.destination_cidrs
                .iter()
                .filter_map(|s| parse_cidr(s))
                .filter(|(ip, _)| *ip != IpAddr::from([0, 0, 0, 0]))
                .map(|(ip, len)| (mask(ip, len), len))
                .collect()
        };
        sni(self) == sni(other) && cidrs(self) == cidrs(other)
    }

    /// Istio's `toFilterChainMatch`: sorted `server_names` (none with `*`) and `prefix_ranges`.
    pub(crate) fn filter_chain_match(&self) -> Option<FilterChainMatch> {
        if self.is_match_all() {
            return None;
        }
        let mut m = FilterChainMatch::default();
        if !self.sni_hosts.iter().any(|h| h == "*") {
            m.server_names = self.sni_hosts.clone();
            m.server_names.sort();
        }
        let mut cidrs = self.destination_cidrs.clone();
        cidrs.sort();
        m.prefix_ranges = cidrs
            .iter()
            .filter_map(|c| parse_cidr(c))
            .filter(|(ip, _)| *ip != IpAddr::from([0, 0, 0, 0]))
            .map(|(ip, len)| CidrRange {
                address_prefix: ip.to_string(),
                prefix_len: Some(UInt32Value { value: len }),
            })
            .collect();
        Some(m)
    }
}

/// `10.0.0.0/16` or a plain IP (a full-length prefix), as Istio's `ConvertAddressToCidr`.
fn parse_cidr(s: &str) -> Option<(IpAddr, u32)> {
    let (ip, len) = match s.split_once('/') {
        Some((ip, len)) => (ip.parse::<IpAddr>().ok()?, len.parse().ok()?),
        None => {
            let ip: IpAddr = s.parse().ok()?;
            (ip, if ip.is_ipv4() { 32 } else { 128 })
        }
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some((ip, len))
}

fn mask(ip: IpAddr, len: u32) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::from(std::net::Ipv4Addr::from(
            u32::from(v4) & u32::MAX.checked_shl(32 - len).unwrap_or(0),
        )),
        IpAddr::V6(v6) => IpAddr::from(std::net::Ipv6Addr::from(
            u128::from(v6) & u128::MAX.checked_shl(128 - len).unwrap_or(0),
        )),
    }
}

/// The mesh VirtualServices that can send TCP or TLS somewhere (those with `tcp` or `tls` routes).
pub(crate) fn l4_virtual_services(vses: &[std::sync::Arc<Config>]) -> Vec<&Config> {
    vses.iter()
        .map(AsRef::as_ref)
        .filter(|c| crate::route::virtual_service(c).is_some_and(|vs| !vs.tcp.is_empty() || !vs.tls.is_empty()))
        .collect()
}

/// Istio's `buildSidecarOutboundTCPListenerOpts`: the TLS chains of a TLS/HTTPS port, else the TCP
/// chains, from the VirtualServices among `vses` with a host matching the service (`getConfigsForHost`).
/// `bind` is the listener address; `cidr` the service's address when it is a CIDR.
pub(crate) fn outbound_network_chains<P: PushView>(
    push: &P,
    proxy: &Proxy,
    service: &Service,
    port: &Port,
    bind: &str,
    cidr: Option<&str>,
    vses: &[&Config],
) -> Vec<NetworkChain> {
    let configs: Vec<(&Config, &VirtualService)> = vses
        .iter()
        .filter_map(|c| crate::route::virtual_service(c).map(|vs| (*c, vs)))
        .filter(|(_, vs)| {
            vs.hosts
                .iter()
                .any(|h| model::host::matches(&h.to_ascii_lowercase(), &service.hostname))
        })
        .collect();
    let b = ChainBuilder {
        push,
        proxy,
        service,
        port,
        cidrs: cidr.map(|c| vec![c.to_owned()]).unwrap_or_default(),
    };
    let chains = if port.protocol.is_tls() {
        b.tls_chains(bind, &configs)
    } else {
        b.tcp_chains(&configs)
    };
    // matches Envoy cannot tell apart (`sniHosts` in another order, say) would get the listener NACKed
    let mut out = Vec::with_capacity(chains.len());
    merge_network_chains(&mut out, chains, &service.hostname);
    out
}

struct ChainBuilder<'a, P: PushView> {
    push: &'a P,
    proxy: &'a Proxy,
    service: &'a Service,
    port: &'a Port,
    /// The service's own destination CIDRs (empty for services with a VIP or none).
    cidrs: Vec<String>,
}

impl<P: PushView> ChainBuilder<'_, P> {
    /// `buildSidecarOutboundTLSFilterChainOpts`: one chain per applicable `tls` match with new
    /// runtime predicates (SNI hosts, destination subnets); without any, the service's cluster,
    /// matched on the service's hostname as SNI when the listener has no VIP to tell it apart.
    fn tls_chains(&self, bind: &str, configs: &[(&Config, &VirtualService)]) -> Vec<NetworkChain> {
        let mut handled = HashSet::new();
        let mut out = Vec::new();
        // as Istio: a match's destination subnets also apply to the matches after it
        let mut destination_cidrs = self.cidrs.clone();
        for (cfg, vs) in configs {
            for tls in &vs.tls {
                for m in tls.match_.iter().filter(|m| self.match_tls(m)) {
                    if !m.destination_subnets.is_empty() {
                        destination_cidrs = m.destination_subnets.clone();
                    }
                    let runtime = format!("{}|{}", m.sni_hosts.join(","), m.destination_subnets.join(","));
                    if !handled.insert(runtime) {
                        continue;
                    }
                    if let Some(filters) =
                        build_outbound_network_filters(self.push, self.proxy, &tls.route, self.port, cfg)
                    {
                        out.push(NetworkChain {
                            sni_hosts: m.sni_hosts.clone(),
                            destination_cidrs: destination_cidrs.clone(),
                            filters,
                        });
                    }
                }
            }
        }
        if out.is_empty() {
            let sni_hosts = if !self.cidrs.is_empty() || bind == WILDCARD_ADDRESS {
                vec![self.service.hostname.clone()]
            } else {
                Vec::new()
            };
            out.push(NetworkChain {
                sni_hosts,
                destination_cidrs: self.cidrs.clone(),
                filters: self.service_filters(),
            });
        }
        out
    }

    /// `buildSidecarOutboundTCPFilterChainOpts`: the first `tcp` route without matches, or with an
    /// applicable match without destination subnets, is the catch-all and ends the list; applicable
    /// matches with subnets give chains on those subnets. Without a catch-all, the service's cluster.
    fn tcp_chains(&self, configs: &[(&Config, &VirtualService)]) -> Vec<NetworkChain> {
        let mut out = Vec::new();
        let mut default_added = false;
        'configs: for (cfg, vs) in configs {
            for tcp in &vs.tcp {
                let filters = || build_outbound_network_filters(self.push, self.proxy, &tcp.route, self.port, cfg);
                let applicable: Vec<&L4MatchAttributes> = tcp.match_.iter().filter(|m| self.match_tcp(m)).collect();
                if tcp.match_.is_empty() || applicable.iter().any(|m| m.destination_subnets.is_empty()) {
                    if let Some(filters) = filters() {
                        out.push(NetworkChain {
                            sni_hosts: Vec::new(),
                            destination_cidrs: self.cidrs.clone(),
                            filters,
                        });
                        default_added = true;
                        break 'configs;
                    }
                    continue;
                }
                let mut subnets: Vec<String> = applicable
                    .iter()
                    .flat_map(|m| m.destination_subnets.iter().cloned())
                    .collect();
                if subnets.is_empty() {
                    continue;
                }
                let Some(filters) = filters() else { continue };
                out.push(NetworkChain {
                    sni_hosts: Vec::new(),
                    destination_cidrs: subnets.clone(),
                    filters,
                });
                // the service's own chain would match the same subnets: Envoy refuses duplicates
                let mut own = self.cidrs.clone();
                subnets.sort();
                own.sort();
                default_added |= subnets == own;
            }
        }
        if !default_added {
            out.push(NetworkChain {
                sni_hosts: Vec::new(),
                destination_cidrs: self.cidrs.clone(),
                filters: self.service_filters(),
            });
        }
        out
    }

    /// Istio's `matchTLS`: the static predicates (gateways, source labels, port, source namespace).
    fn match_tls(&self, m: &TlsMatchAttributes) -> bool {
        self.static_match(&m.gateways, &m.source_labels, m.port, &m.source_namespace)
    }

    /// Istio's `matchTCP`.
    fn match_tcp(&self, m: &L4MatchAttributes) -> bool {
        self.static_match(&m.gateways, &m.source_labels, m.port, &m.source_namespace)
    }

    fn static_match(
        &self,
        gateways: &[String],
        source_labels: &std::collections::BTreeMap<String, String>,
        port: u32,
        source_namespace: &str,
    ) -> bool {
        (gateways.is_empty() || gateways.iter().any(|g| g == MESH_GATEWAY))
            && source_labels.iter().all(|(k, v)| self.proxy.labels.get(k) == Some(v))
            && (port == 0 || port == u32::from(self.port.port))
            && (source_namespace.is_empty() || source_namespace == self.proxy.config_namespace)
    }

    /// The tcp_proxy to the service's own cluster: `outbound|<port>||<host>`, the port being the
    /// service's only port if it has one, else the listener port.
    fn service_filters(&self) -> Vec<Filter> {
        let port = match self.service.ports.as_slice() {
            [only] => only.port,
            _ => self.port.port,
        };
        let cluster = names::subset_key(Direction::Outbound, "", &self.service.hostname, port);
        let policy = self
            .push
            .with_destination_rule(self.proxy, self.service, |dr| TcpPolicy::new(dr, ""))
            .unwrap_or_default();
        vec![tcp_proxy_filter(
            self.push.mesh(),
            self.proxy,
            &cluster,
            tcp_proxy::ClusterSpecifier::Cluster(cluster.clone()),
            &policy,
        )]
    }
}

/// Istio's `buildOutboundNetworkFilters`: one destination → tcp_proxy to its cluster (stat prefix
/// the cluster name); several → `weighted_clusters` of those with a positive weight (stat prefix
/// `<vs name>.<vs namespace>`). The DestinationRule of the first destination's service sets the
/// idle timeout, maximum connection duration and source-IP hashing. `None` without destinations.
pub(crate) fn build_outbound_network_filters<P: PushView>(
    push: &P,
    proxy: &Proxy,
    routes: &[RouteDestination],
    port: &Port,
    config: &Config,
) -> Option<Vec<Filter>> {
    let first = routes.first()?;
    let listen_port = u32::from(port.port);
    let service = push.service_for_host(proxy, &first.destination.host);
    let subset = if routes.len() == 1 {
        first.destination.subset.as_str()
    } else {
        ""
    };
    let policy = service
        .as_deref()
        .and_then(|s| push.with_destination_rule(proxy, s, |dr| TcpPolicy::new(dr, subset)))
        .unwrap_or_default();
    if let [only] = routes {
        let d = &only.destination;
        let cluster = destination_cluster(d, &d.host, service.as_deref(), listen_port);
        let specifier = tcp_proxy::ClusterSpecifier::Cluster(cluster.clone());
        return Some(vec![tcp_proxy_filter(push.mesh(), proxy, &cluster, specifier, &policy)]);
    }
    let clusters: Vec<tcp_proxy::weighted_cluster::ClusterWeight> = routes
        .iter()
        .filter(|r| r.weight > 0)
        .map(|r| {
            let d = &r.destination;
            let svc = push.service_for_host(proxy, &d.host);
            tcp_proxy::weighted_cluster::ClusterWeight {
                name: destination_cluster(d, &d.host, svc.as_deref(), listen_port),
                weight: r.weight.unsigned_abs(),
                ..Default::default()
            }
        })
        .collect();
    if clusters.is_empty() {
        tracing::debug!(vs = %config.key(), "tcp/tls route without a positive weight: no chain");
        return None;
    }
    let stat_prefix = format!("{}.{}", config.meta.name, config.meta.namespace);
    let specifier = tcp_proxy::ClusterSpecifier::WeightedClusters(tcp_proxy::WeightedCluster { clusters });
    Some(vec![tcp_proxy_filter(
        push.mesh(),
        proxy,
        &stat_prefix,
        specifier,
        &policy,
    )])
}

/// Istio's `buildOutboundNetworkFiltersWithSingleDestination` for AUTO_PASSTHROUGH chains: a
/// tcp_proxy to `cluster` with `stat_prefix`, shaped by the DestinationRule of `service` (and
/// `subset`) for this proxy, without its tunnel.
pub(crate) fn single_destination_filter<P: PushView>(
    push: &P,
    proxy: &Proxy,
    stat_prefix: &str,
    cluster: &str,
    subset: &str,
    service: &Service,
) -> Filter {
    let mut policy = push
        .with_destination_rule(proxy, service, |dr| TcpPolicy::new(dr, subset))
        .unwrap_or_default();
    // Istio's `tunnelingconfig.Skip`: AUTO_PASSTHROUGH forwards the client's mTLS as it is
    policy.tunnel = None;
    tcp_proxy_filter(
        push.mesh(),
        proxy,
        stat_prefix,
        tcp_proxy::ClusterSpecifier::Cluster(cluster.to_owned()),
        &policy,
    )
}

/// What a DestinationRule sets on a tcp_proxy.
#[derive(Debug, Default)]
struct TcpPolicy {
    idle_timeout: Option<Duration>,
    max_connection_duration: Option<Duration>,
    use_source_ip: bool,
    /// Istio's `tunnelingconfig.Apply`: the DestinationRule's `tunnel` (the subset's when a subset
    /// is named) turns the tcp_proxy into an HTTP CONNECT (or POST) tunnel to `targetHost:targetPort`.
    tunnel: Option<tcp_proxy::TunnelingConfig>,
}

impl TcpPolicy {
    /// The rule's top-level `connectionPool.tcp` timeouts; source-IP hashing from its load
    /// balancer, overridden by the subset's (Istio's `maybeSetHashPolicy`).
    fn new(dr: &DestinationRule, subset: &str) -> TcpPolicy {
        let policy = dr.traffic_policy.as_ref();
        let tcp = policy
            .and_then(|p| p.connection_pool.as_ref())
            .and_then(|c| c.tcp.as_ref());
        let mut use_source_ip = policy
            .and_then(|p| p.load_balancer.as_ref())
            .and_then(|lb| lb.consistent_hash.as_ref())
            .and_then(|h| h.use_source_ip)
            .unwrap_or(false);
        let subset_lb = dr
            .subsets
            .iter()
            .find(|s| s.name == subset)
            .and_then(|s| s.traffic_policy.as_ref())
            .and_then(|p| p.load_balancer.as_ref());
        if let Some(lb) = subset_lb {
            use_source_ip = lb
                .consistent_hash
                .as_ref()
                .and_then(|h| h.use_source_ip)
                .unwrap_or(false);
        }
        let tunnel = if subset.is_empty() {
            policy.and_then(|p| p.tunnel.as_ref())
        } else {
            dr.subsets
                .iter()
                .find(|s| s.name == subset)
                .and_then(|s| s.traffic_policy.as_ref())
                .and_then(|p| p.tunnel.as_ref())
        };
        TcpPolicy {
            idle_timeout: parse_duration(tcp.and_then(|t| t.idle_timeout.as_deref())),
            max_connection_duration: parse_duration(tcp.and_then(|t| t.max_connection_duration.as_deref())),
            use_source_ip,
            tunnel: tunnel.and_then(tunneling_config),
        }
    }
}

/// The tcp_proxy tunnel of a DestinationRule `tunnel` (`protocol` CONNECT or POST, `targetHost`,
/// `targetPort`), as Istio's `tunnelingconfig.Apply`: `hostname` is `host:port` (IPv6 bracketed).
fn tunneling_config(tunnel: &serde_json::Value) -> Option<tcp_proxy::TunnelingConfig> {
    let host = tunnel.get("targetHost")?.as_str()?;
    let port = tunnel.get("targetPort")?.as_u64()?;
    let hostname = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    Some(tcp_proxy::TunnelingConfig {
        hostname,
        use_post: tunnel.get("protocol").and_then(serde_json::Value::as_str) == Some("POST"),
        ..Default::default()
    })
}

/// A tcp_proxy with the mesh's access log; the idle timeout falls back to the proxy's
/// `IDLE_TIMEOUT` metadata.
fn tcp_proxy_filter(
    mesh: &MeshConfig,
    proxy: &Proxy,
    stat_prefix: &str,
    specifier: tcp_proxy::ClusterSpecifier,
    policy: &TcpPolicy,
) -> Filter {
    let metadata_idle = || parse_duration(proxy.metadata.raw.get("IDLE_TIMEOUT").and_then(|v| v.as_str()));
    let hash_policy = if policy.use_source_ip {
        vec![HashPolicy {
            policy_specifier: Some(hash_policy::PolicySpecifier::SourceIp(hash_policy::SourceIp {})),
        }]
    } else {
        Vec::new()
    };
    let tcp = TcpProxy {
        stat_prefix: stat_prefix.to_owned(),
        cluster_specifier: Some(specifier),
        idle_timeout: policy.idle_timeout.or_else(metadata_idle),
        max_downstream_connection_duration: policy.max_connection_duration,
        hash_policy,
        tunneling_config: policy.tunnel.clone(),
        access_log: access_logs(mesh),
        ..Default::default()
    };
    Filter {
        name: TCP_PROXY.into(),
        config_type: Some(filter::ConfigType::TypedConfig(xds_api::pack(&tcp))),
    }
}

/// Merges `incoming` chains into a listener's (Istio's `mergeTCPFilterChains`): a chain that
/// Envoy could not tell apart from one already there is dropped. `context` (listener or service)
/// is for the log.
pub(crate) fn merge_network_chains(current: &mut Vec<NetworkChain>, incoming: Vec<NetworkChain>, context: &str) {
    for chain in incoming {
        if current.iter().any(|c| c.conflicts_with(&chain)) {
            tracing::debug!(
                context,
                "outbound TCP filter chain conflicts with an existing one: dropped"
            );
            continue;
        }
        current.push(chain);
    }
}

/// Istio's `isConflictWithWellKnownPort`: Mongo and MySQL share a listener with nothing else.
pub(crate) fn well_known_port_conflict(incoming: Protocol, existing: Protocol) -> bool {
    let special = |p| matches!(p, Protocol::Mongo | Protocol::Mysql);
    (special(incoming) || special(existing)) && incoming != existing
}

/// Istio's `buildListenerFromEntry` for network chains: a tls_inspector when a chain matches on
/// SNI; a single catch-all chain is the listener's only chain; next to other chains it becomes the
/// default chain; without one, the default chain passes through (or blackholes, `REGISTRY_ONLY`).
pub(crate) fn network_listener(
    mesh: &MeshConfig,
    registry_only: bool,
    name: String,
    bind: &str,
    port: u16,
    chains: Vec<NetworkChain>,
) -> Listener {
    let needs_tls_inspector = chains.iter().any(|c| !c.sni_hosts.is_empty());
    let mut filter_chains = Vec::new();
    let mut default_filter_chain = None;
    for c in chains {
        let filter_chain_match = c.filter_chain_match();
        let chain = FilterChain {
            filter_chain_match: filter_chain_match.clone(),
            filters: c.filters,
            ..Default::default()
        };
        if filter_chain_match.is_none() {
            default_filter_chain = Some(chain);
        } else {
            filter_chains.push(chain);
        }
    }
    match default_filter_chain {
        Some(only) if filter_chains.is_empty() => {
            filter_chains.push(only);
            default_filter_chain = None;
        }
        Some(_) => {}
        None => {
            let catch_all = if registry_only {
                names::BLACK_HOLE_CLUSTER
            } else {
                names::PASSTHROUGH_CLUSTER
            };
            default_filter_chain = Some(FilterChain {
                name: PASSTHROUGH_FILTER_CHAIN.into(),
                filter_chain_match: Some(FilterChainMatch::default()),
                filters: vec![super::sidecar::tcp_proxy_filter(mesh, catch_all, catch_all)],
                ..Default::default()
            });
        }
    }
    let mut l = Listener {
        name,
        address: Some(socket_address(bind, u32::from(port))),
        bind_to_port: Some(BoolValue { value: false }),
        traffic_direction: TrafficDirection::Outbound as i32,
        filter_chains,
        default_filter_chain,
        ..Default::default()
    };
    if needs_tls_inspector {
        // as Istio without an http_inspector: wait for the ClientHello as long as it takes
        l.listener_filters = vec![tls_inspector()];
        l.listener_filters_timeout = Some(Duration::default());
        l.continue_on_listener_filters_timeout = true;
    }
    l
}
