//! Inbound clusters of a sidecar, as Istio's `buildInboundClusters`: one `inbound|<port>||`
//! cluster per application port, then `InboundPassthroughCluster` for ports no service declares.
//! Without Sidecar ingress listeners the ports are the target ports of the proxy's service
//! instances and each cluster is ORIGINAL_DST (inbound passthrough mode, Istio ≥ 1.10), forwarding
//! to the connection's original destination (the local app). With ingress listeners
//! (`buildInboundClustersFromSidecar`) the ports are theirs and a `defaultEndpoint` makes the cluster
//! STATIC to that address: `127.0.0.1:<port>` (or `[::1]`), `0.0.0.0:<port>` (the proxy's IPv4
//! address, `[::]` its IPv6 one; localhost without one) or `unix://<path>`. Connections to anything
//! but localhost leave from 127.0.0.6 so that the sidecar's iptables rules let them through. The
//! Sidecar's `connectionPool` of the port, else its `inboundConnectionPool`, sets the circuit breakers.

use std::net::IpAddr;

use model::{Port, Protocol, Proxy};
use push_index::{PushContext, ServiceInstance, SidecarScope, UNIX_ADDRESS_PREFIX};
use xds_api::envoy::config::cluster::v3::{Cluster, cluster};
use xds_api::envoy::config::core::v3 as core;
use xds_api::envoy::config::endpoint::v3::{ClusterLoadAssignment, LbEndpoint, LocalityLbEndpoints, lb_endpoint};
use xds_api::pbwkt;

use super::{ClusterWrapper, cluster_traffic_policy, mesh_connect_timeout, passthrough_cluster};
use crate::names::{self, TrafficDirection};

/// Istio's `InboundPassthroughBindIpv4`: the source address of connections to the local app.
pub(crate) const INBOUND_PASSTHROUGH_BIND_IPV4: &str = "127.0.0.6";
/// Istio's `maxSecondsValue` (about 292 years, what fits in nanoseconds): inbound clusters are
/// never cleaned up.
const MAX_SECONDS: i64 = 9_223_372_035;
const LOCALHOST_IPV4: &str = "127.0.0.1";
const LOCALHOST_IPV6: &str = "::1";

/// The inbound cluster name of a target port: `inbound|<port>||`.
pub(crate) fn inbound_cluster_name(target_port: u16) -> String {
    names::subset_key(TrafficDirection::Inbound, "", "", target_port)
}

/// Where an inbound cluster sends connections.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum InboundEndpoint {
    /// The connection's original destination (ORIGINAL_DST).
    OriginalDestination,
    /// An address and port (STATIC).
    Socket { address: IpAddr, port: u16 },
    /// A unix domain socket path (STATIC).
    Pipe(String),
}

/// What one inbound cluster is built from: everything it reads, so also a key for caching it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct InboundClusterSpec {
    /// The cluster's port: `inbound|<port>||`.
    pub(crate) port: u16,
    /// The protocol that decides the upstream protocol.
    pub(crate) protocol: Protocol,
    pub(crate) endpoint: InboundEndpoint,
    /// The service (hostname, namespace, service port) of the instance the cluster serves, whose
    /// DestinationRule's connection pool applies server-side too.
    pub(crate) service: Option<(String, String, u16)>,
}

/// The inbound clusters `proxy` gets (none for routers), without the passthrough cluster.
pub(crate) fn inbound_cluster_specs(proxy: &Proxy, push: &PushContext) -> Vec<InboundClusterSpec> {
    if proxy.is_router() {
        return Vec::new();
    }
    let scope = push.sidecar_scope(proxy);
    let instances = push.service_instances(proxy);
    if scope.has_ingress_listener() {
        return ingress_specs(proxy, &scope, &instances);
    }
    instance_specs(&instances)
}

/// One ORIGINAL_DST cluster per distinct target port, sorted, with the protocol of its first instance.
pub(crate) fn instance_specs(instances: &[ServiceInstance]) -> Vec<InboundClusterSpec> {
    let mut out: Vec<InboundClusterSpec> = Vec::new();
    for instance in instances {
        if out.iter().all(|s| s.port != instance.target_port) {
            out.push(InboundClusterSpec {
                port: instance.target_port,
                protocol: instance.service_port.protocol,
                endpoint: InboundEndpoint::OriginalDestination,
                service: Some((
                    instance.service.hostname.clone(),
                    instance.service.namespace().to_owned(),
                    instance.service_port.port,
                )),
            });
        }
    }
    out.sort_by_key(|s| s.port);
    out
}

/// Istio's `buildInboundClustersFromSidecar`: one cluster per ingress listener, to its
/// `defaultEndpoint`; a listener whose endpoint has no valid port gets none. The service is the
/// proxy's instance whose target port is the listener's port (Istio's `findOrCreateService`), for
/// its DestinationRule's connection pool.
fn ingress_specs(proxy: &Proxy, scope: &SidecarScope, instances: &[ServiceInstance]) -> Vec<InboundClusterSpec> {
    let mut out: Vec<InboundClusterSpec> = Vec::new();
    for ingress in scope.ingress_listeners() {
        let Some(port) = &ingress.port else { continue };
        let Ok(number) = u16::try_from(port.number) else {
            continue;
        };
        let Some(endpoint) = default_endpoint(proxy, &ingress.default_endpoint) else {
            tracing::debug!(
                port = number,
                endpoint = ingress.default_endpoint,
                "ingress defaultEndpoint without a port: no cluster"
            );
            continue;
        };
        if out.iter().any(|s| s.port == number) {
            continue;
        }
        let service = instances.iter().find(|i| i.target_port == number).map(|i| {
            (
                i.service.hostname.clone(),
                i.service.namespace().to_owned(),
                i.service_port.port,
            )
        });
        out.push(InboundClusterSpec {
            port: number,
            protocol: Protocol::parse(&port.protocol),
            endpoint,
            service,
        });
    }
    out
}

/// Where a `defaultEndpoint` points for this proxy; `None` when its port is missing or invalid.
fn default_endpoint(proxy: &Proxy, endpoint: &str) -> Option<InboundEndpoint> {
    if endpoint.is_empty() {
        return Some(InboundEndpoint::OriginalDestination);
    }
    if let Some(path) = endpoint.strip_prefix(UNIX_ADDRESS_PREFIX) {
        return Some(InboundEndpoint::Pipe(path.to_owned()));
    }
    let (host, port) = match endpoint.strip_prefix('[') {
        Some(rest) => {
            let (host, after) = rest.split_once(']')?;
            (host, after.strip_prefix(':')?)
        }
        None => endpoint.rsplit_once(':')?,
    };
    let port: u16 = port.parse().ok()?;
    let first = |v4: bool| proxy.ip_addresses.iter().copied().find(|ip| ip.is_ipv4() == v4);
    // Istio's `actualLocalHosts` of the proxy's IP mode (IPv4 unless it has IPv6 addresses only),
    // the preferred family when the mode has both
    let has_v4 = proxy.ip_addresses.is_empty() || first(true).is_some();
    let has_v6 = first(false).is_some();
    let localhost = |prefer_v4: bool| {
        let pick_v4 = if prefer_v4 { has_v4 } else { !has_v6 };
        if pick_v4 { LOCALHOST_IPV4 } else { LOCALHOST_IPV6 }
    };
    let address = match host {
        "0.0.0.0" => first(true).map_or_else(|| LOCALHOST_IPV4.to_owned(), |ip| ip.to_string()),
        "::" => first(false).map_or_else(|| LOCALHOST_IPV6.to_owned(), |ip| ip.to_string()),
        "127.0.0.1" => localhost(true).to_owned(),
        "::1" => localhost(false).to_owned(),
        _ => return Some(InboundEndpoint::OriginalDestination),
    };
    let address = address.parse().ok()?;
    Some(InboundEndpoint::Socket { address, port })
}

/// The inbound clusters of `proxy` (`inbound_cluster_specs`), then `InboundPassthroughCluster`.
/// Routers get none.
pub(crate) fn build_inbound_clusters(proxy: &Proxy, push: &PushContext) -> Vec<Cluster> {
    if proxy.is_router() {
        return Vec::new();
    }
    let scope = push.sidecar_scope(proxy);
    let mut out: Vec<Cluster> = inbound_cluster_specs(proxy, push)
        .iter()
        .map(|spec| inbound_cluster(push, proxy, &scope, spec))
        .collect();
    out.push(inbound_passthrough_cluster(
        push,
        super::preserve_header_case(proxy, push),
    ));
    out
}

/// Istio's `buildInboundCluster`: ORIGINAL_DST and never cleaned up, or STATIC to the endpoint;
/// the mesh's connection pool with the Sidecar's for the port on top, the port's upstream protocol,
/// bound to 127.0.0.6 unless it goes to localhost.
fn inbound_cluster(push: &PushContext, proxy: &Proxy, scope: &SidecarScope, spec: &InboundClusterSpec) -> Cluster {
    let name = inbound_cluster_name(spec.port);
    let address = match &spec.endpoint {
        InboundEndpoint::OriginalDestination => None,
        InboundEndpoint::Socket { address, port } => Some(socket_address(&address.to_string(), u32::from(*port))),
        InboundEndpoint::Pipe(path) => Some(core::Address {
            address: Some(core::address::Address::Pipe(core::Pipe {
                path: path.clone(),
                mode: 0,
            })),
        }),
    };
    let discovery = if address.is_some() {
        cluster::DiscoveryType::Static
    } else {
        cluster::DiscoveryType::OriginalDst
    };
    let mut cw = ClusterWrapper::new(&name, discovery);
    cw.cluster.connect_timeout = mesh_connect_timeout(push);
    match address {
        None => {
            cw.cluster.lb_policy = cluster::LbPolicy::ClusterProvided as i32;
            cw.cluster.cleanup_interval = Some(pbwkt::Duration {
                seconds: MAX_SECONDS,
                nanos: 0,
            });
        }
        Some(address) => {
            cw.cluster.load_assignment = Some(ClusterLoadAssignment {
                cluster_name: name.clone(),
                endpoints: vec![LocalityLbEndpoints {
                    lb_endpoints: vec![LbEndpoint {
                        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(
                            xds_api::envoy::config::endpoint::v3::Endpoint {
                                address: Some(address),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            });
        }
    }
    let to_localhost = matches!(&spec.endpoint, InboundEndpoint::Socket { address, .. } if address.is_loopback());
    if !to_localhost {
        cw.cluster.upstream_bind_config = Some(inbound_bind_config());
    }
    // Istio's `buildInboundCluster`: the connection pool of the service's DestinationRule (its
    // port-level settings for the service port) applies server-side too, so that the receiver has
    // the capacity the clients are allowed; the Sidecar's inbound pool for the port replaces it.
    let from_rule = spec.service.as_ref().and_then(|(hostname, namespace, service_port)| {
        let service = push.registry().service(hostname, namespace)?;
        let rule = push.inbound_destination_rule(proxy, service)?;
        let (policy, _) = crate::traffic_policy::port_level_policy(rule.rule.traffic_policy.as_ref(), *service_port);
        policy?.connection_pool
    });
    let mesh_default = push
        .mesh()
        .default_traffic_policy
        .as_ref()
        .and_then(|d| d.connection_pool.clone());
    let pool = scope
        .inbound_connection_pool_for_port(u32::from(spec.port))
        .cloned()
        .or(from_rule)
        .or(mesh_default)
        .unwrap_or_default();
    cluster_traffic_policy::apply_connection_pool(&mut cw, push.mesh(), &pool);
    let port = Port {
        name: String::new(),
        port: spec.port,
        protocol: spec.protocol,
    };
    cw.set_upstream_protocol(&port, proxy, super::preserve_header_case(proxy, push));
    cw.build()
}

fn socket_address(ip: &str, port: u32) -> core::Address {
    core::Address {
        address: Some(core::address::Address::SocketAddress(core::SocketAddress {
            address: ip.to_owned(),
            port_specifier: Some(core::socket_address::PortSpecifier::PortValue(port)),
            ..Default::default()
        })),
    }
}

/// Istio's `buildInboundPassthroughCluster`: the default passthrough cluster (its stat name
/// included) renamed and bound to 127.0.0.6.
fn inbound_passthrough_cluster(push: &PushContext, preserve_header_case: bool) -> Cluster {
    let mut c = passthrough_cluster(push, preserve_header_case);
    c.name = names::INBOUND_PASSTHROUGH_CLUSTER_IPV4.into();
    c.upstream_bind_config = Some(inbound_bind_config());
    c
}

fn inbound_bind_config() -> core::BindConfig {
    core::BindConfig {
        source_address: Some(core::SocketAddress {
            address: INBOUND_PASSTHROUGH_BIND_IPV4.into(),
            port_specifier: Some(core::socket_address::PortSpecifier::PortValue(0)),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use xds_api::envoy::config::cluster::v3::cluster;

    use super::build_inbound_clusters;
    use crate::testing::{proxy, push, service_entry, sidecar, sidecar_at};

    fn ratings() -> serde_json::Value {
        service_entry(
            "ratings",
            "default",
            json!({"hosts": ["ratings.default.svc.cluster.local"], "location": "MESH_INTERNAL",
                "resolution": "STATIC",
                "ports": [{"number": 9080, "name": "http", "protocol": "HTTP", "targetPort": 8080},
                          {"number": 9090, "name": "tcp", "protocol": "TCP"}],
                "endpoints": [{"address": "10.0.0.9"}]}),
        )
    }

    #[test]
    fn sidecar_gets_one_original_dst_cluster_per_target_port_plus_inbound_passthrough() {
        let p = push(vec![ratings()]);
        let clusters = build_inbound_clusters(&sidecar("default"), &p);
        let names: Vec<_> = clusters.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["inbound|8080||", "inbound|9090||", "InboundPassthroughCluster"]);
        for c in &clusters {
            assert_eq!(
                c.cluster_discovery_type,
                Some(cluster::ClusterDiscoveryType::Type(
                    cluster::DiscoveryType::OriginalDst as i32
                ))
            );
            assert_eq!(c.lb_policy, cluster::LbPolicy::ClusterProvided as i32);
            let bind = c
                .upstream_bind_config
                .as_ref()
                .unwrap()
                .source_address
                .as_ref()
                .unwrap();
            assert_eq!(bind.address, "127.0.0.6");
        }
    }

    #[test]
    fn routers_and_proxies_without_instances_get_only_what_applies() {
        let p = push(vec![ratings()]);
        assert!(build_inbound_clusters(&proxy("router", "default", json!({})), &p).is_empty());
        let other = push(vec![]);
        let names: Vec<_> = build_inbound_clusters(&sidecar("default"), &other)
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(names, ["InboundPassthroughCluster"]);
    }

    #[test]
    fn cds_of_sidecars_with_different_instances_is_not_shared() {
        let p = push(vec![ratings()]);
        let cds = xds_api::type_url::CLUSTER;
        let cache = crate::PushCache::default();
        let names = |proxy| -> Vec<String> {
            crate::generate(&p, &cache, &proxy, cds, &[])
                .unwrap()
                .iter()
                .map(|r| r.name.clone())
                .collect()
        };
        let elsewhere = sidecar_at("10.0.0.99");
        // same namespace and labels, but only the first runs ratings
        assert!(names(sidecar("default")).contains(&"inbound|8080||".to_owned()));
        assert!(!names(elsewhere).contains(&"inbound|8080||".to_owned()));
    }

    #[test]
    fn inbound_cluster_speaks_the_service_ports_protocol() {
        use prost::Message;
        use xds_api::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
        use xds_api::envoy::extensions::upstreams::http::v3::http_protocol_options::{
            UpstreamProtocolOptions, explicit_http_config::ProtocolConfig,
        };
        let p = push(vec![service_entry(
            "grpc",
            "default",
            json!({"hosts": ["grpc.default.svc.cluster.local"], "location": "MESH_INTERNAL", "resolution": "STATIC",
                "ports": [{"number": 7000, "name": "grpc", "protocol": "GRPC"}], "endpoints": [{"address": "10.0.0.9"}]}),
        )]);
        let clusters = build_inbound_clusters(&sidecar("default"), &p);
        let any = &clusters[0].typed_extension_protocol_options[super::super::HTTP_PROTOCOL_OPTIONS];
        let options = HttpProtocolOptions::decode(any.value.as_slice()).unwrap();
        assert!(matches!(
            options.upstream_protocol_options,
            Some(UpstreamProtocolOptions::ExplicitHttpConfig(e))
                if matches!(e.protocol_config, Some(ProtocolConfig::Http2ProtocolOptions(_)))
        ));
    }

    /// Istio's `buildInboundCluster`: the DestinationRule's connection pool for the service port
    /// (port-level settings first) is the inbound cluster's circuit breaker too; a rule selecting
    /// workloads does not apply inbound, and the Sidecar's inbound pool replaces the rule's.
    #[test]
    fn destination_rule_connection_pool_applies_server_side() {
        let svc = service_entry(
            "web",
            "default",
            json!({"hosts": ["web.default.svc.cluster.local"], "location": "MESH_INTERNAL", "resolution": "STATIC",
                "ports": [{"number": 80, "name": "http", "protocol": "HTTP", "targetPort": 8080}],
                "endpoints": [{"address": "10.0.0.9"}]}),
        );
        let dr = crate::testing::destination_rule(
            "web",
            "default",
            json!({"host": "web.default.svc.cluster.local", "trafficPolicy": {
                "connectionPool": {"tcp": {"maxConnections": 7}},
                "portLevelSettings": [{"port": {"number": 80}, "connectionPool": {"tcp": {"maxConnections": 9}}}]}}),
        );
        let max_connections = |docs: Vec<serde_json::Value>| {
            let clusters = build_inbound_clusters(&sidecar("default"), &push(docs));
            let c = clusters
                .iter()
                .find(|c| c.name == "inbound|8080||")
                .expect("inbound|8080||");
            c.circuit_breakers.as_ref().unwrap().thresholds[0]
                .max_connections
                .as_ref()
                .map(|v| v.value)
        };
        assert_eq!(
            max_connections(vec![svc.clone(), dr.clone()]),
            Some(9),
            "port level first"
        );
        assert_eq!(max_connections(vec![svc.clone()]), Some(u32::MAX), "Istio's default");
        let sidecar_pool = crate::testing::config(
            "Sidecar",
            "default",
            "default",
            json!({"inboundConnectionPool": {"tcp": {"maxConnections": 3}}}),
        );
        assert_eq!(
            max_connections(vec![svc, dr, sidecar_pool]),
            Some(3),
            "the Sidecar's wins"
        );
    }
}
