//! Inbound clusters of a sidecar, as Istio's `buildInboundClusters` (inbound passthrough mode,
//! Istio ≥ 1.10): one `inbound|<targetPort>||` ORIGINAL_DST cluster per port of the proxy's
//! service instances, and `InboundPassthroughCluster` for ports no service declares. Both forward
//! to the connection's original destination (the local app), from source address 127.0.0.6 so
//! that the sidecar's iptables rules let the traffic through.

use model::{Port, Protocol, Proxy};
use push_index::{PushContext, ServiceInstance};
use xds_api::envoy::config::cluster::v3::{Cluster, cluster};
use xds_api::envoy::config::core::v3 as core;
use xds_api::pbwkt;

use super::{ClusterWrapper, mesh_connect_timeout, passthrough_cluster, traffic_policy};
use crate::names::{self, TrafficDirection};

/// Istio's `InboundPassthroughBindIpv4`: the source address of connections to the local app.
pub const INBOUND_PASSTHROUGH_BIND_IPV4: &str = "127.0.0.6";
/// Istio's `maxSecondsValue` (about 292 years, what fits in nanoseconds): inbound clusters are
/// never cleaned up.
const MAX_SECONDS: i64 = 9_223_372_035;

/// The inbound cluster name of a target port: `inbound|<port>||`.
pub fn inbound_cluster_name(target_port: u16) -> String {
    names::subset_key(TrafficDirection::Inbound, "", "", target_port)
}

/// The distinct target ports of the proxy's service instances, sorted, each with the protocol of
/// its first instance (none for routers): what its inbound clusters depend on, so a key for
/// caching them.
pub fn inbound_ports(proxy: &Proxy, push: &PushContext) -> Vec<(u16, Protocol)> {
    if proxy.is_router() {
        return Vec::new();
    }
    let instances = push.service_instances(proxy);
    target_ports(&instances)
        .into_iter()
        .filter_map(|port| {
            let first = instances.iter().find(|i| i.target_port == port)?;
            Some((port, first.service_port.protocol))
        })
        .collect()
}

fn target_ports(instances: &[ServiceInstance]) -> Vec<u16> {
    let mut ports: Vec<u16> = instances.iter().map(|i| i.target_port).collect();
    ports.sort_unstable();
    ports.dedup();
    ports
}

/// The inbound clusters of `proxy`: one per distinct target port of its service instances, then
/// `InboundPassthroughCluster`. Routers get none.
pub fn build_inbound_clusters(proxy: &Proxy, push: &PushContext) -> Vec<Cluster> {
    if proxy.is_router() {
        return Vec::new();
    }
    build_inbound_clusters_for(push, proxy, &push.service_instances(proxy))
}

/// As `build_inbound_clusters`, for the given instances (the first instance of a target port
/// decides its upstream protocol, as Istio).
pub fn build_inbound_clusters_for(push: &PushContext, proxy: &Proxy, instances: &[ServiceInstance]) -> Vec<Cluster> {
    let mut out: Vec<Cluster> = target_ports(instances)
        .into_iter()
        .filter_map(|port| {
            let first = instances.iter().find(|i| i.target_port == port)?;
            Some(inbound_cluster(push, proxy, port, &first.service_port))
        })
        .collect();
    out.push(inbound_passthrough_cluster(push));
    out
}

/// Istio's `buildInboundCluster` in passthrough mode: ORIGINAL_DST, never cleaned up, the mesh's
/// default connection pool, the service port's upstream protocol, bound to 127.0.0.6.
fn inbound_cluster(push: &PushContext, proxy: &Proxy, target_port: u16, port: &Port) -> Cluster {
    let mut cw = ClusterWrapper::new(&inbound_cluster_name(target_port), cluster::DiscoveryType::OriginalDst);
    cw.cluster.lb_policy = cluster::LbPolicy::ClusterProvided as i32;
    cw.cluster.connect_timeout = mesh_connect_timeout(push);
    cw.cluster.cleanup_interval = Some(pbwkt::Duration {
        seconds: MAX_SECONDS,
        nanos: 0,
    });
    cw.cluster.upstream_bind_config = Some(inbound_bind_config());
    traffic_policy::apply_connection_pool(&mut cw, push.mesh(), &Default::default());
    cw.set_upstream_protocol(port, proxy);
    cw.build()
}

/// Istio's `buildInboundPassthroughCluster`: the default passthrough cluster (its stat name
/// included) renamed and bound to 127.0.0.6.
fn inbound_passthrough_cluster(push: &PushContext) -> Cluster {
    let mut c = passthrough_cluster(push);
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
    use crate::testing::{proxy, push, service_entry, sidecar};

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
        let names = |proxy| -> Vec<String> {
            crate::generate(&p, &proxy, cds, &[])
                .unwrap()
                .iter()
                .map(|r| r.name.clone())
                .collect()
        };
        let md = model::proxy::NodeMetadata::from_json("test", &json!({"NAMESPACE": "default"})).unwrap();
        let elsewhere = model::Proxy::parse("sidecar~10.0.0.99~q.default~default.svc.cluster.local", md).unwrap();
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
}
