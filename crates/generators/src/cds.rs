//! CDS: the outbound clusters of a proxy, as Istio's `ClusterBuilder` (`cluster.go`,
//! `cluster_builder.go`): one cluster per visible service port (`outbound|9080||reviews...`), one
//! per DestinationRule subset (`outbound|9080|v1|reviews...`), plus `BlackHoleCluster` and, for
//! sidecars, `PassthroughCluster`. Traffic policy is applied in `cluster_traffic_policy`, TLS in `tls`.

mod cluster_traffic_policy;
pub(crate) mod inbound;
mod tls;
mod wrapper;

pub(crate) use tls::TLS_MODE_KEY;
pub(crate) use wrapper::ClusterWrapper;

#[cfg(test)]
mod golden_tests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use model::{Endpoint, Port, Protocol, Proxy, Resolution, Service};
use push_index::{MergedDestinationRule, PushContext};
use xds_api::envoy::config::cluster::v3::{Cluster, cluster};
use xds_api::envoy::config::core::v3 as core;
use xds_api::envoy::config::endpoint::v3::ClusterLoadAssignment;
use xds_api::envoy::extensions::network::dns_resolver::cares::v3::CaresDnsResolverConfig;
use xds_api::pbwkt;

use crate::names::{self, TrafficDirection};
use crate::traffic_policy::cluster_policy;

/// Key of the upstream HTTP protocol options extension in `typed_extension_protocol_options`.
pub(crate) const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
/// Istio's separator after a cluster's `alt_stat_name` (`constants.StatPrefixDelimiter`).
const STAT_PREFIX_DELIMITER: &str = ";";
/// Istio's `PILOT_DNS_CARES_UDP_MAX_QUERIES` and `PILOT_DNS_JITTER_DURATION` defaults.
const DNS_CARES_UDP_MAX_QUERIES: u32 = 100;
const DNS_JITTER: Duration = Duration::from_millis(100);

/// The clusters of `proxy`: outbound clusters of every service its Sidecar scope imports (every
/// visible one without a Sidecar), then Istio's catch-all clusters and the inbound clusters.
/// Cluster names are unique (the first of duplicates is kept, as `normalizeClusters`).
pub(crate) fn build_clusters(proxy: &Proxy, push: &PushContext) -> Vec<Cluster> {
    let mut out = Vec::new();
    let services = scope_services(proxy, push);
    let merged = proxy
        .is_router()
        .then(|| crate::lds::merged_gateway::MergedGateway::for_proxy(push, proxy));
    let outbound = match &merged {
        Some(m) if push.features().filter_gateway_cluster_config => gateway_services(proxy, push, m, &services),
        _ => services.clone(),
    };
    for service in &outbound {
        out.extend(build_outbound_clusters(proxy, push, service));
    }
    if merged.as_ref().is_some_and(|m| m.contains_auto_passthrough()) {
        for service in services.iter().filter(|s| !s.mesh_external) {
            out.extend(build_sni_dnat_clusters(proxy, push, service));
        }
    }
    out.push(black_hole_cluster(push));
    if !proxy.is_router() {
        // Gateways have no original-destination listeners, so no passthrough cluster.
        out.push(passthrough_cluster(push, preserve_header_case(proxy, push)));
        out.extend(inbound::build_inbound_clusters(proxy, push));
    }
    let mut seen = HashSet::new();
    out.retain(|c| {
        let first = seen.insert(c.name.clone());
        if !first {
            tracing::debug!(cluster = c.name, proxy = proxy.id, "duplicate cluster dropped");
        }
        first
    });
    out
}

/// Istio's `SidecarScope.Services()`: what the proxy's Sidecar egress listeners import (every
/// visible service without a Sidecar).
pub(crate) fn scope_services(proxy: &Proxy, push: &PushContext) -> Vec<Arc<Service>> {
    push.sidecar_scope(proxy).services(
        &push.services_for_namespace(&proxy.config_namespace),
        || push.virtual_services_for_mesh(proxy),
        |host| push.service_for_host(proxy, host),
    )
}

/// Istio's `GatewayServices` (`PILOT_FILTER_GATEWAY_CLUSTER_CONFIG`): of `services`, those the
/// VirtualServices bound to the gateway's servers route to, and those of the mesh's extension
/// providers (`<host>` or `<namespace>/<host>`).
fn gateway_services(
    proxy: &Proxy,
    push: &PushContext,
    merged: &crate::lds::merged_gateway::MergedGateway,
    services: &[Arc<Service>],
) -> Vec<Arc<Service>> {
    let mut hosts = std::collections::BTreeSet::new();
    let mut gateways: Vec<&str> = merged.servers.iter().map(|s| s.gateway_name.as_str()).collect();
    gateways.sort_unstable();
    gateways.dedup();
    for gateway in gateways {
        hosts.extend(push.gateway_destinations(proxy, gateway));
    }
    let providers: Vec<&str> = push
        .mesh()
        .extension_providers
        .iter()
        .filter_map(|p| p.as_object())
        .flat_map(|p| p.values())
        .filter_map(|v| v.get("service").and_then(serde_json::Value::as_str))
        .collect();
    services
        .iter()
        .filter(|s| {
            hosts.contains(&s.hostname)
                || providers.iter().any(|p| match p.split_once('/') {
                    Some((ns, host)) => ns == s.namespace() && host == s.hostname,
                    None => *p == s.hostname,
                })
        })
        .cloned()
        .collect()
}

/// The stat prefix of an outbound cluster from the mesh's `outboundClusterStatName` pattern
/// (Istio's `BuildStatPrefix`); `None` when the mesh sets no pattern.
pub(crate) fn outbound_stat_prefix(
    mesh: &model::MeshConfig,
    service: &Service,
    subset: &str,
    port: &Port,
) -> Option<String> {
    let pattern = &mesh.outbound_cluster_stat_name;
    (!pattern.is_empty()).then(|| stat_prefix(pattern, service, subset, port))
}

/// The clusters of one service: per non-UDP port, the default cluster and one per subset.
pub(crate) fn build_outbound_clusters(proxy: &Proxy, push: &PushContext, service: &Service) -> Vec<Cluster> {
    service_clusters(proxy, push, service, ClusterMode::Default)
}

/// Istio's `buildOutboundSniDnatClusters`, for gateways with an AUTO_PASSTHROUGH server: the
/// clusters of `service` named `outbound_.<port>_.<subset>_.<host>` (the SNI Istio's mTLS clients
/// send), without TLS of their own: the client's mTLS passes through to the workload.
fn build_sni_dnat_clusters(proxy: &Proxy, push: &PushContext, service: &Service) -> Vec<Cluster> {
    service_clusters(proxy, push, service, ClusterMode::SniDnat)
}

/// Istio's `ClusterMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClusterMode {
    /// `outbound|<port>|<subset>|<host>`.
    Default,
    /// `outbound_.<port>_.<subset>_.<host>`, no upstream TLS.
    SniDnat,
}

fn service_clusters(proxy: &Proxy, push: &PushContext, service: &Service, mode: ClusterMode) -> Vec<Cluster> {
    let rule = push.destination_rule(proxy, service);
    let mut out = Vec::new();
    for port in service.ports.iter().filter(|p| p.protocol != Protocol::Udp) {
        let builder = Builder {
            proxy,
            push,
            service,
            port,
            rule: rule.as_deref(),
            mode,
        };
        let Some(default) = builder.cluster("") else {
            continue;
        };
        out.push(default);
        let subsets = rule.as_ref().map(|r| r.rule.subsets.as_slice()).unwrap_or_default();
        out.extend(subsets.iter().filter_map(|s| builder.cluster(&s.name)));
    }
    out
}

/// Builds the clusters of one service port.
struct Builder<'a> {
    proxy: &'a Proxy,
    push: &'a PushContext,
    service: &'a Service,
    port: &'a Port,
    rule: Option<&'a MergedDestinationRule>,
    mode: ClusterMode,
}

impl Builder<'_> {
    /// The cluster for `subset` ("" for the service's default cluster); `None` when it would have
    /// no way to reach anything (a DNS cluster without endpoints, as Istio).
    // Istio still sets the DNS fields that Envoy deprecated in favour of the DNS cluster extension.
    #[allow(deprecated)]
    fn cluster(&self, subset: &str) -> Option<Cluster> {
        let key = match self.mode {
            ClusterMode::Default => names::subset_key,
            ClusterMode::SniDnat => names::dns_srv_subset_key,
        };
        let name = key(
            TrafficDirection::Outbound,
            subset,
            &self.service.hostname,
            self.port.port,
        );
        let mesh_default = self.push.mesh().default_traffic_policy.as_ref();
        let policy = cluster_policy(self.rule.map(|r| &r.rule), self.port.port, subset, mesh_default);
        let mut discovery = discovery_type(self.proxy, self.service);
        // A subset whose own policy is PASSTHROUGH forwards to the original destination.
        let own_lb = self
            .rule
            .and_then(|r| r.subset(subset))
            .and_then(|s| s.traffic_policy.as_ref());
        if own_lb
            .and_then(|p| p.load_balancer.as_ref())
            .and_then(|lb| lb.simple.as_deref())
            == Some("PASSTHROUGH")
        {
            discovery = cluster::DiscoveryType::OriginalDst;
        }
        let mut cw = ClusterWrapper::new(&name, discovery);
        let c = &mut cw.cluster;
        match discovery {
            cluster::DiscoveryType::StrictDns | cluster::DiscoveryType::LogicalDns => {
                c.dns_lookup_family = dns_lookup_family(&self.proxy.ip_addresses) as i32;
                c.typed_dns_resolver_config = Some(core::TypedExtensionConfig {
                    name: "envoy.network.dns_resolver.cares".into(),
                    typed_config: Some(xds_api::pack(&CaresDnsResolverConfig {
                        udp_max_queries: Some(pbwkt::UInt32Value {
                            value: DNS_CARES_UDP_MAX_QUERIES,
                        }),
                        ..Default::default()
                    })),
                });
                c.dns_jitter = Some(proto_duration(DNS_JITTER));
                c.dns_refresh_rate = model::duration::parse(&self.push.mesh().dns_refresh_rate).map(proto_duration);
                c.respect_dns_ttl = true;
                let mut endpoints = self.dns_endpoints(subset);
                if endpoints.is_empty() {
                    tracing::debug!(cluster = name, "DNS cluster without endpoints skipped");
                    return None;
                }
                if discovery == cluster::DiscoveryType::LogicalDns {
                    // Envoy accepts exactly one host for LOGICAL_DNS.
                    endpoints.truncate(1);
                }
                c.load_assignment = Some(ClusterLoadAssignment {
                    cluster_name: name.clone(),
                    endpoints: crate::eds::locality_lb_endpoints(&endpoints),
                    ..Default::default()
                });
                cw.dns_endpoints = endpoints;
            }
            _ => {}
        }
        let stat_pattern = &self.push.mesh().outbound_cluster_stat_name;
        if !stat_pattern.is_empty() {
            let prefix = stat_prefix(stat_pattern, self.service, subset, self.port);
            cw.cluster.alt_stat_name = format!("{prefix}{STAT_PREFIX_DELIMITER}");
        }
        cw.set_upstream_protocol(self.port, self.proxy, preserve_header_case(self.proxy, self.push));
        set_service_metadata(&mut cw.cluster, self.service);
        cluster_traffic_policy::apply(&mut cw, self, policy.as_ref());
        if cw.cluster_type() == cluster::DiscoveryType::Eds {
            cw.cluster.eds_cluster_config = Some(eds_cluster_config(&name));
        }
        if let Some(rule) = self.rule {
            set_config_metadata(&mut cw.cluster, rule, subset);
        }
        Some(cw.build())
    }

    /// Endpoints of a DNS cluster: the service's endpoints for this port (hostnames or IPs),
    /// filtered by the subset's labels.
    fn dns_endpoints(&self, subset: &str) -> Vec<Endpoint> {
        let labels = subset_labels(self.rule, subset);
        self.push
            .endpoints(&self.service.hostname, self.service.namespace())
            .iter()
            .filter(|e| e.service_port_name == self.port.name)
            .filter(|e| {
                labels
                    .iter()
                    .all(|(k, v)| e.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .cloned()
            .collect()
    }
}

/// The labels of `subset` in the DestinationRule (empty for the default cluster or an unknown subset).
pub(crate) fn subset_labels<'a>(rule: Option<&'a MergedDestinationRule>, subset: &str) -> BTreeMap<&'a str, &'a str> {
    if subset.is_empty() {
        return BTreeMap::new();
    }
    rule.and_then(|r| r.subset(subset))
        .map(|s| s.labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect())
        .unwrap_or_default()
}

/// Istio's `BuildStatPrefix` for `outboundClusterStatName` patterns (`%SERVICE%`,
/// `%SERVICE_NAME%`, `%SERVICE_FQDN%`, `%SUBSET_NAME%`, `%TARGET_PORT%`, `%SERVICE_PORT%`,
/// `%SERVICE_PORT_NAME%`); Kubernetes services use their short names.
fn stat_prefix(pattern: &str, service: &Service, subset: &str, port: &Port) -> String {
    let kube = service.attributes.service_registry == "Kubernetes";
    let short_host = if kube {
        format!("{}.{}", service.attributes.name, service.namespace())
    } else {
        service.hostname.clone()
    };
    let name = if kube {
        service.attributes.name.as_str()
    } else {
        service.hostname.as_str()
    };
    pattern
        .replace("%SERVICE%", &short_host)
        .replace("%SERVICE_NAME%", name)
        .replace("%SERVICE_FQDN%", &service.hostname)
        .replace("%SUBSET_NAME%", subset)
        .replace("%TARGET_PORT%", "0")
        .replace("%SERVICE_PORT%", &port.port.to_string())
        .replace("%SERVICE_PORT_NAME%", &port.name)
}

/// Istio's `convertResolution`. Gateways cannot use ORIGINAL_DST, so passthrough services use EDS there.
pub(crate) fn discovery_type(proxy: &Proxy, service: &Service) -> cluster::DiscoveryType {
    match service.resolution {
        Resolution::ClientSideLb => cluster::DiscoveryType::Eds,
        Resolution::DnsLb => cluster::DiscoveryType::StrictDns,
        Resolution::DnsRoundRobinLb => cluster::DiscoveryType::LogicalDns,
        Resolution::Passthrough if proxy.is_router() => cluster::DiscoveryType::Eds,
        Resolution::Passthrough => cluster::DiscoveryType::OriginalDst,
    }
}

/// Istio's `SelectDNSLookupFamily` with dual stack disabled: IPv6-only proxies resolve AAAA,
/// everyone else A records.
fn dns_lookup_family(ips: &[IpAddr]) -> cluster::DnsLookupFamily {
    if !ips.is_empty() && ips.iter().all(IpAddr::is_ipv6) {
        cluster::DnsLookupFamily::V6Only
    } else {
        cluster::DnsLookupFamily::V4Only
    }
}

/// EDS over ADS, as Istio's `maybeApplyEdsConfig`.
fn eds_cluster_config(name: &str) -> cluster::EdsClusterConfig {
    cluster::EdsClusterConfig {
        service_name: name.to_owned(),
        eds_config: Some(core::ConfigSource {
            config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
                core::AggregatedConfigSource::default(),
            )),
            initial_fetch_timeout: Some(pbwkt::Duration::default()),
            resource_api_version: core::ApiVersion::V3 as i32,
            ..Default::default()
        }),
    }
}

/// `BlackHoleCluster`: STATIC with no endpoints, for traffic that must go nowhere.
pub(crate) fn black_hole_cluster(push: &PushContext) -> Cluster {
    Cluster {
        name: names::BLACK_HOLE_CLUSTER.into(),
        alt_stat_name: format!("{}{STAT_PREFIX_DELIMITER}", names::BLACK_HOLE_CLUSTER),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Static as i32,
        )),
        connect_timeout: mesh_connect_timeout(push),
        lb_policy: cluster::LbPolicy::RoundRobin as i32,
        ..Default::default()
    }
}

/// `PassthroughCluster`: ORIGINAL_DST, for traffic to destinations outside the registry
/// (`ALLOW_ANY`), with Istio's passthrough HTTP options and default circuit breakers.
pub(crate) fn passthrough_cluster(push: &PushContext, preserve_header_case: bool) -> Cluster {
    let mut cw = ClusterWrapper {
        cluster: Cluster {
            name: names::PASSTHROUGH_CLUSTER.into(),
            alt_stat_name: format!("{}{STAT_PREFIX_DELIMITER}", names::PASSTHROUGH_CLUSTER),
            cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::OriginalDst as i32,
            )),
            connect_timeout: mesh_connect_timeout(push),
            lb_policy: cluster::LbPolicy::ClusterProvided as i32,
            ..Default::default()
        },
        http: None,
        dns_endpoints: Vec::new(),
    };
    cw.http_options().common_http_protocol_options = Some(core::HttpProtocolOptions {
        idle_timeout: Some(proto_duration(Duration::from_secs(300))),
        ..Default::default()
    });
    if preserve_header_case {
        use xds_api::envoy::extensions::upstreams::http::v3::http_protocol_options::{
            ExplicitHttpConfig, UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
        };
        cw.http_options().upstream_protocol_options =
            Some(UpstreamProtocolOptions::ExplicitHttpConfig(ExplicitHttpConfig {
                protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                    crate::proxy_headers::preserve_case_http1_options(),
                )),
            }));
    }
    cw.set_use_downstream_protocol();
    cluster_traffic_policy::apply_connection_pool(&mut cw, push.mesh(), &Default::default());
    cw.build()
}

/// Istio's `shouldPreserveHeaderCase`: the proxy's `proxyHeaders.preserveHttp1HeaderCase`.
pub(crate) fn preserve_header_case(proxy: &Proxy, push: &PushContext) -> bool {
    proxy
        .proxy_headers_config(push.mesh())
        .is_some_and(|h| h.preserve_http1_header_case == Some(true))
}

fn mesh_connect_timeout(push: &PushContext) -> Option<pbwkt::Duration> {
    model::duration::parse(&push.mesh().connect_timeout).map(proto_duration)
}

pub(crate) fn proto_duration(d: Duration) -> pbwkt::Duration {
    pbwkt::Duration {
        seconds: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(d.subsec_nanos()).unwrap_or_default(),
    }
}

/// Parses a config duration string into a protobuf Duration (`None` if absent or malformed,
/// which validation rejects before it gets here).
pub(crate) fn config_duration(s: Option<&String>) -> Option<pbwkt::Duration> {
    s.and_then(|s| model::duration::parse(s)).map(proto_duration)
}

/// The `istio` filter metadata, created on first use.
fn istio_metadata(c: &mut Cluster) -> &mut pbwkt::Struct {
    c.metadata
        .get_or_insert_with(Default::default)
        .filter_metadata
        .entry("istio".into())
        .or_default()
}

fn string_value(s: &str) -> pbwkt::Value {
    pbwkt::Value {
        kind: Some(pbwkt::value::Kind::StringValue(s.to_owned())),
    }
}

/// Istio's telemetry metadata: `istio.services = [{host, name, namespace}]`.
fn set_service_metadata(c: &mut Cluster, service: &Service) {
    let fields = [
        ("host", service.hostname.as_str()),
        ("name", service.attributes.name.as_str()),
        ("namespace", service.namespace()),
    ];
    let entry = pbwkt::Struct {
        fields: fields.iter().map(|(k, v)| ((*k).to_owned(), string_value(v))).collect(),
    };
    let list = pbwkt::ListValue {
        values: vec![pbwkt::Value {
            kind: Some(pbwkt::value::Kind::StructValue(entry)),
        }],
    };
    istio_metadata(c).fields.insert(
        "services".into(),
        pbwkt::Value {
            kind: Some(pbwkt::value::Kind::ListValue(list)),
        },
    );
}

/// Istio's `AddConfigInfoMetadata` (+ `AddSubsetToMetadata`): which DestinationRule shaped the cluster.
fn set_config_metadata(c: &mut Cluster, rule: &MergedDestinationRule, subset: &str) {
    let Some(first) = rule.from.first() else { return };
    let path = format!(
        "/apis/networking.istio.io/v1/namespaces/{}/destination-rule/{}",
        first.namespace, first.name
    );
    let md = istio_metadata(c);
    md.fields.insert("config".into(), string_value(&path));
    if !subset.is_empty() {
        md.fields.insert("subset".into(), string_value(subset));
    }
}
