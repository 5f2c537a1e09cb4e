//! A DestinationRule traffic policy applied to an outbound cluster, as Istio's
//! `cluster_traffic_policy.go`: connection pool (circuit breakers, timeouts, keepalive, HTTP
//! options, h2 upgrade), outlier detection, load balancer (simple, consistent hash, locality)
//! and TLS origination.

use model::networking::{ConnectionPoolSettings, LoadBalancerSettings, OutlierDetection, TcpKeepalive};
use model::{MeshConfig, Port};
use xds_api::envoy::config::cluster::v3::{self as cv3, cluster};
use xds_api::envoy::config::core::v3 as core;
use xds_api::envoy::r#type::v3::Percent;
use xds_api::pbwkt;

use super::{Builder, ClusterWrapper, config_duration, proto_duration};
use crate::eds;
use crate::traffic_policy::ClusterPolicy;

/// Istio's `applyTrafficPolicy` for an outbound cluster.
pub(super) fn apply(cw: &mut ClusterWrapper, b: &Builder<'_>, policy: Option<&ClusterPolicy>) {
    let default_pool = ConnectionPoolSettings::default();
    let pool = policy.and_then(|p| p.connection_pool.as_ref()).unwrap_or(&default_pool);
    if should_h2_upgrade(b.port, b.push.mesh(), pool) {
        cw.set_h2();
    }
    apply_connection_pool(cw, b.push.mesh(), pool);
    let outlier = policy.and_then(|p| p.outlier_detection.as_ref());
    apply_outlier_detection(&mut cw.cluster, outlier);
    if let Some(o) = outlier.filter(|o| !o.outlier_detection_http_error_codes.is_empty()) {
        apply_outlier_detection_error_codes(cw, &o.outlier_detection_http_error_codes);
    }
    apply_load_balancer(cw, b, policy.and_then(|p| p.load_balancer.as_ref()));
    if b.mode != super::ClusterMode::SniDnat {
        super::tls::apply(cw, b, policy.and_then(|p| p.tls.as_ref()));
        if let Some(pp) = policy.and_then(|p| p.proxy_protocol.as_ref()) {
            apply_upstream_proxy_protocol(cw, pp);
        }
    }
    if cw.cluster_type() == cluster::DiscoveryType::OriginalDst {
        cw.cluster.lb_policy = cluster::LbPolicy::ClusterProvided as i32;
    }
}

/// Istio's `shouldH2Upgrade`: the DestinationRule's `h2UpgradePolicy` wins (and
/// `useClientProtocol` never upgrades); else the mesh's `h2UpgradePolicy`, for HTTP ports only.
fn should_h2_upgrade(port: &Port, mesh: &MeshConfig, pool: &ConnectionPoolSettings) -> bool {
    if let Some(http) = &pool.http {
        if http.use_client_protocol == Some(true) {
            return false;
        }
        match http.h2_upgrade_policy.as_deref() {
            Some("UPGRADE") => return true,
            Some("DO_NOT_UPGRADE") => return false,
            _ => {}
        }
    }
    port.protocol.is_http() && mesh.h2_upgrade_policy == "UPGRADE"
}

fn u32_value(v: u32) -> Option<pbwkt::UInt32Value> {
    Some(pbwkt::UInt32Value { value: v })
}

/// Istio's `getDefaultCircuitBreakerThresholds`: effectively unlimited (Envoy's defaults of 1024
/// connections and 3 retries are too low for a mesh), remaining counts not tracked.
fn default_thresholds() -> cv3::circuit_breakers::Thresholds {
    cv3::circuit_breakers::Thresholds {
        max_connections: u32_value(u32::MAX),
        max_pending_requests: u32_value(u32::MAX),
        max_requests: u32_value(u32::MAX),
        max_retries: u32_value(u32::MAX),
        track_remaining: false,
        ..Default::default()
    }
}

fn positive(v: Option<i32>) -> Option<u32> {
    v.and_then(|v| u32::try_from(v).ok()).filter(|v| *v > 0)
}

/// Istio's `applyConnectionPool`: circuit breaker thresholds, connect timeout, TCP keepalive and
/// the HTTP options (idle timeout, max requests per connection, max connection duration,
/// max concurrent streams for h2, `useClientProtocol`).
pub(super) fn apply_connection_pool(cw: &mut ClusterWrapper, mesh: &MeshConfig, pool: &ConnectionPoolSettings) {
    let mut threshold = default_thresholds();
    let mut idle_timeout = None;
    let mut max_requests_per_connection = None;
    let mut max_concurrent_streams = None;
    let mut max_connection_duration = None;
    if let Some(http) = &pool.http {
        if let Some(v) = positive(http.http2_max_requests) {
            threshold.max_requests = u32_value(v);
        }
        if let Some(v) = positive(http.http1_max_pending_requests) {
            threshold.max_pending_requests = u32_value(v);
        }
        if let Some(v) = positive(http.max_retries) {
            threshold.max_retries = u32_value(v);
        }
        idle_timeout = config_duration(http.idle_timeout.as_ref());
        max_requests_per_connection = positive(http.max_requests_per_connection);
        max_concurrent_streams = positive(http.max_concurrent_streams);
    }
    cw.cluster.connect_timeout = model::duration::parse(&mesh.connect_timeout).map(proto_duration);
    if let Some(tcp) = &pool.tcp {
        if let Some(t) = config_duration(tcp.connect_timeout.as_ref()) {
            cw.cluster.connect_timeout = Some(t);
        }
        if let Some(v) = positive(tcp.max_connections) {
            threshold.max_connections = u32_value(v);
        }
        max_connection_duration = config_duration(tcp.max_connection_duration.as_ref());
        if idle_timeout.is_none() {
            idle_timeout = config_duration(tcp.idle_timeout.as_ref());
        }
    }
    apply_tcp_keepalive(
        &mut cw.cluster,
        mesh,
        pool.tcp.as_ref().and_then(|t| t.tcp_keepalive.as_ref()),
    );
    cw.cluster.circuit_breakers = Some(cv3::CircuitBreakers {
        thresholds: vec![threshold],
        ..Default::default()
    });

    if idle_timeout.is_some()
        || max_requests_per_connection.is_some()
        || max_connection_duration.is_some()
        || max_concurrent_streams.is_some()
    {
        let is_h2 = cw.is_http2();
        let options = cw.http_options();
        let common = options
            .common_http_protocol_options
            .get_or_insert_with(Default::default);
        if idle_timeout.is_some() {
            common.idle_timeout = idle_timeout;
        }
        if let Some(v) = max_requests_per_connection {
            common.max_requests_per_connection = u32_value(v);
        }
        if max_connection_duration.is_some() {
            common.max_connection_duration = max_connection_duration;
        }
        if is_h2
            && let Some(v) = max_concurrent_streams
            && let Some(
                xds_api::envoy::extensions::upstreams::http::v3::http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                    explicit,
                ),
            ) = options.upstream_protocol_options.as_mut()
            && let Some(
                xds_api::envoy::extensions::upstreams::http::v3::http_protocol_options::explicit_http_config::ProtocolConfig::Http2ProtocolOptions(h2),
            ) = explicit.protocol_config.as_mut()
        {
            h2.max_concurrent_streams = u32_value(v);
        }
    }
    if pool.http.as_ref().and_then(|h| h.use_client_protocol) == Some(true) {
        cw.set_use_downstream_protocol();
    }
}

/// Mesh-wide TCP keepalive, then the DestinationRule's fields over it (Istio's `applyTCPKeepalive`).
fn apply_tcp_keepalive(c: &mut cv3::Cluster, mesh: &MeshConfig, rule: Option<&TcpKeepalive>) {
    let mesh_keepalive: Option<TcpKeepalive> = mesh.tcp_keepalive.clone().and_then(|v| serde_json::from_value(v).ok());
    for keepalive in [mesh_keepalive.as_ref(), rule].into_iter().flatten() {
        let options = c
            .upstream_connection_options
            .get_or_insert_with(|| cv3::UpstreamConnectionOptions {
                tcp_keepalive: Some(core::TcpKeepalive::default()),
                ..Default::default()
            });
        let tcp = options.tcp_keepalive.get_or_insert_with(Default::default);
        if let Some(p) = keepalive.probes.filter(|p| *p > 0) {
            tcp.keepalive_probes = u32_value(p);
        }
        let secs = |d: Option<&String>| {
            d.and_then(|d| model::duration::parse(d))
                .map(|d| u32::try_from(d.as_secs()).unwrap_or(u32::MAX))
        };
        if let Some(t) = secs(keepalive.time.as_ref()) {
            tcp.keepalive_time = u32_value(t);
        }
        if let Some(i) = secs(keepalive.interval.as_ref()) {
            tcp.keepalive_interval = u32_value(i);
        }
    }
}

/// Istio's `applyOutlierDetectionErrorCodes`: only responses with these `:status` codes count as
/// errors for outlier detection (Envoy's HTTP protocol option `outlier_detection.error_matcher`).
fn apply_outlier_detection_error_codes(cw: &mut ClusterWrapper, codes: &[u32]) {
    use xds_api::envoy::config::common::matcher::v3::{MatchPredicate, match_predicate};
    use xds_api::envoy::config::route::v3::{HeaderMatcher, header_matcher};
    use xds_api::envoy::extensions::upstreams::http::v3::http_protocol_options::OutlierDetection as HttpOutlier;
    use xds_api::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
    let mut rules: Vec<MatchPredicate> = codes
        .iter()
        .map(|code| MatchPredicate {
            rule: Some(match_predicate::Rule::HttpResponseHeadersMatch(
                xds_api::envoy::config::common::matcher::v3::HttpHeadersMatch {
                    headers: vec![HeaderMatcher {
                        name: ":status".into(),
                        header_match_specifier: Some(header_matcher::HeaderMatchSpecifier::StringMatch(
                            StringMatcher {
                                match_pattern: Some(string_matcher::MatchPattern::Exact(code.to_string())),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }],
                },
            )),
        })
        .collect();
    let predicate = if rules.len() == 1 {
        rules.remove(0)
    } else {
        MatchPredicate {
            rule: Some(match_predicate::Rule::OrMatch(match_predicate::MatchSet { rules })),
        }
    };
    cw.http_options().outlier_detection = Some(HttpOutlier {
        error_matcher: Some(predicate),
    });
}

/// Istio's `applyOutlierDetection`: success-rate ejection off; consecutive 5xx and gateway
/// errors enforced at 100% when set above 0; the panic threshold set to `minHealthPercent`
/// (0 unless given), since Kubernetes services often have few endpoints.
fn apply_outlier_detection(c: &mut cv3::Cluster, outlier: Option<&OutlierDetection>) {
    let Some(outlier) = outlier else { return };
    let mut out = cv3::OutlierDetection {
        enforcing_success_rate: u32_value(0),
        ..Default::default()
    };
    let enforcing = |v: u32| u32_value(if v > 0 { 100 } else { 0 });
    if let Some(v) = outlier.consecutive_5xx_errors {
        out.consecutive_5xx = u32_value(v);
        out.enforcing_consecutive_5xx = enforcing(v);
    }
    if let Some(v) = outlier.consecutive_gateway_errors {
        out.consecutive_gateway_failure = u32_value(v);
        out.enforcing_consecutive_gateway_failure = enforcing(v);
    }
    out.interval = config_duration(outlier.interval.as_ref());
    out.base_ejection_time = config_duration(outlier.base_ejection_time.as_ref());
    if let Some(v) = positive(outlier.max_ejection_percent) {
        out.max_ejection_percent = u32_value(v);
    }
    if outlier.split_external_local_origin_errors == Some(true) {
        out.split_external_local_origin_errors = true;
        if let Some(v) = outlier.consecutive_local_origin_failures.filter(|v| *v > 0) {
            out.consecutive_local_origin_failure = u32_value(v);
            out.enforcing_consecutive_local_origin_failure = u32_value(100);
        }
        out.enforcing_local_origin_success_rate = u32_value(0);
    }
    c.outlier_detection = Some(out);
    let min_health = outlier.min_health_percent.unwrap_or(0);
    if min_health >= 0 {
        c.common_lb_config
            .get_or_insert_with(Default::default)
            .healthy_panic_threshold = Some(Percent {
            value: f64::from(min_health),
        });
    }
}

/// Istio's `applyLoadBalancer`: locality settings, then the simple policy (default
/// LEAST_REQUEST), then consistent hash (ring hash or maglev) over it. The hash policy itself
/// lives on routes: RDS reads `consistentHash` from the DestinationRule.
fn apply_load_balancer(cw: &mut ClusterWrapper, b: &Builder<'_>, lb: Option<&LoadBalancerSettings>) {
    let original_dst = cw.cluster_type() == cluster::DiscoveryType::OriginalDst;
    let c = &mut cw.cluster;
    if let Some(setting) = eds::locality::effective_setting(b.push.mesh(), lb, b.service) {
        let enable_failover = c.outlier_detection.is_some();
        setting.apply_to_cluster(c.common_lb_config.get_or_insert_with(Default::default), enable_failover);
        if let Some(cla) = c.load_assignment.as_mut() {
            // DNS clusters: the registry endpoints behind each locality group, for failoverPriority.
            let refs: Vec<&model::Endpoint> = cw.dns_endpoints.iter().collect();
            let groups: Vec<Vec<&model::Endpoint>> =
                eds::group_by_locality(&refs).into_iter().map(|(_, eps)| eps).collect();
            setting.apply(cla, &groups, &b.proxy.locality, &b.proxy.labels, enable_failover);
        }
    }
    if original_dst {
        c.lb_policy = cluster::LbPolicy::ClusterProvided as i32;
        return;
    }
    let simple = lb.and_then(|lb| lb.simple.as_deref()).unwrap_or("UNSPECIFIED");
    match simple {
        "LEAST_CONN" | "LEAST_REQUEST" => least_request(c, lb),
        "RANDOM" => c.lb_policy = cluster::LbPolicy::Random as i32,
        "ROUND_ROBIN" => round_robin(c, lb),
        "PASSTHROUGH" => {
            c.lb_policy = cluster::LbPolicy::ClusterProvided as i32;
            c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::OriginalDst as i32,
            ));
            c.load_assignment = None;
        }
        _ => least_request(c, lb),
    }
    if let Some(hash) = lb.and_then(|lb| lb.consistent_hash.as_ref()) {
        if let Some(maglev) = &hash.maglev {
            c.lb_policy = cluster::LbPolicy::Maglev as i32;
            if maglev.table_size != 0 {
                c.lb_config = Some(cluster::LbConfig::MaglevLbConfig(cluster::MaglevLbConfig {
                    table_size: Some(pbwkt::UInt64Value {
                        value: maglev.table_size,
                    }),
                }));
            }
        } else if let Some(ring) = &hash.ring_hash {
            c.lb_policy = cluster::LbPolicy::RingHash as i32;
            if ring.minimum_ring_size != 0 {
                c.lb_config = Some(ring_hash(ring.minimum_ring_size));
            }
        } else {
            // Deprecated top-level minimumRingSize; 1024 is Envoy's default.
            c.lb_policy = cluster::LbPolicy::RingHash as i32;
            c.lb_config = Some(ring_hash(hash.minimum_ring_size.filter(|s| *s != 0).unwrap_or(1024)));
        }
    }
}

fn ring_hash(minimum: u64) -> cluster::LbConfig {
    cluster::LbConfig::RingHashLbConfig(cluster::RingHashLbConfig {
        minimum_ring_size: Some(pbwkt::UInt64Value { value: minimum }),
        ..Default::default()
    })
}

fn least_request(c: &mut cv3::Cluster, lb: Option<&LoadBalancerSettings>) {
    c.lb_policy = cluster::LbPolicy::LeastRequest as i32;
    if let Some(slow_start) = slow_start(lb) {
        c.lb_config = Some(cluster::LbConfig::LeastRequestLbConfig(cluster::LeastRequestLbConfig {
            slow_start_config: Some(slow_start),
            ..Default::default()
        }));
    }
}

fn round_robin(c: &mut cv3::Cluster, lb: Option<&LoadBalancerSettings>) {
    c.lb_policy = cluster::LbPolicy::RoundRobin as i32;
    if let Some(slow_start) = slow_start(lb) {
        c.lb_config = Some(cluster::LbConfig::RoundRobinLbConfig(cluster::RoundRobinLbConfig {
            slow_start_config: Some(slow_start),
        }));
    }
}

/// `warmup` (aggression 1 and minimum 10% unless given, as Istio's `setWarmup`), else the
/// deprecated `warmupDurationSecs`.
fn slow_start(lb: Option<&LoadBalancerSettings>) -> Option<cluster::SlowStartConfig> {
    let lb = lb?;
    if let Some(w) = &lb.warmup {
        return Some(cluster::SlowStartConfig {
            slow_start_window: config_duration(w.duration.as_ref()),
            aggression: Some(core::RuntimeDouble {
                default_value: w.aggression.unwrap_or(1.0),
                runtime_key: "(".into(),
            }),
            min_weight_percent: Some(Percent {
                value: w.minimum_percent.unwrap_or(10.0),
            }),
        });
    }
    let window = config_duration(lb.warmup_duration_secs.as_ref())?;
    Some(cluster::SlowStartConfig {
        slow_start_window: Some(window),
        ..Default::default()
    })
}

/// Istio's `applyUpstreamProxyProtocol`: every transport socket of the cluster (plaintext when it
/// has none, each of its `transport_socket_matches`) starts connections with a PROXY header of
/// the policy's `version` (`V1`, the default, or `V2`).
fn apply_upstream_proxy_protocol(cw: &mut ClusterWrapper, proxy_protocol: &serde_json::Value) {
    use xds_api::envoy::config::core::v3::{
        ProxyProtocolConfig, TransportSocket, proxy_protocol_config, transport_socket,
    };
    use xds_api::envoy::extensions::transport_sockets::proxy_protocol::v3::ProxyProtocolUpstreamTransport;
    let version = match proxy_protocol.get("version").and_then(serde_json::Value::as_str) {
        Some("V2") => proxy_protocol_config::Version::V2,
        _ => proxy_protocol_config::Version::V1,
    };
    let wrap = |inner: TransportSocket| TransportSocket {
        name: "envoy.transport_sockets.upstream_proxy_protocol".into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(xds_api::pack(
            &ProxyProtocolUpstreamTransport {
                config: Some(ProxyProtocolConfig {
                    version: version as i32,
                    ..Default::default()
                }),
                transport_socket: Some(inner),
                ..Default::default()
            },
        ))),
    };
    let c = &mut cw.cluster;
    if c.transport_socket.is_none() && c.transport_socket_matches.is_empty() {
        c.transport_socket = Some(wrap(crate::mtls::raw_buffer()));
        return;
    }
    if let Some(ts) = c.transport_socket.take() {
        c.transport_socket = Some(wrap(ts));
    }
    for m in &mut c.transport_socket_matches {
        if let Some(ts) = m.transport_socket.take() {
            m.transport_socket = Some(wrap(ts));
        }
    }
}
