//! The bootstrap's static clusters and listeners, as Istio's template: `prometheus_stats` and
//! `agent` on localhost, `sds-grpc` and `xds-grpc` on the agent's Unix sockets (HTTP/2), a tracer's
//! collector when ProxyConfig asks for one, the Prometheus listener (`/stats/prometheus` → admin)
//! and the readiness listener (`/healthz/ready` → the agent's status server).

use serde_json::{Value, json};

use super::{AGENT_CLUSTER, PROMETHEUS_STATS_CLUSTER, SDS_CLUSTER, XDS_CLUSTER};
use crate::config::AgentConfig;

const HTTP_CONNECTION_MANAGER: &str =
    "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";
const ROUTER: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
/// Responses of the stats endpoints that are worth compressing.
const STATS_CONTENT_TYPES: [&str; 4] = [
    "text/plain",
    "application/vnd.google.protobuf",
    "application/openmetrics-text",
    "application/openmetrics-protobuf",
];

pub(super) fn static_resources(cfg: &AgentConfig) -> Value {
    let localhost = cfg.localhost();
    let mut clusters = vec![
        tcp_cluster(PROMETHEUS_STATS_CLUSTER, localhost, cfg.proxy_admin_port),
        tcp_cluster(AGENT_CLUSTER, localhost, cfg.status_port),
        sds_cluster(cfg),
        xds_cluster(cfg),
    ];
    clusters.extend(tracing_cluster(cfg));
    json!({
        "clusters": clusters,
        "listeners": [prometheus_listener(cfg), readiness_listener(cfg)],
    })
}

fn endpoint(cluster: &str, address: Value) -> Value {
    json!({
        "cluster_name": cluster,
        "endpoints": [{"lb_endpoints": [{"endpoint": {"address": address}}]}],
    })
}

fn socket_address(address: &str, port: u16) -> Value {
    json!({"socket_address": {"protocol": "TCP", "address": address, "port_value": port}})
}

/// HTTP/2 to the cluster; `max_requests_per_connection` here, as upstream Envoy deprecated the
/// Cluster field Istio's template still sets.
fn http2_options(max_requests_per_connection: Option<u32>) -> Value {
    let mut options = json!({
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}},
    });
    if let (Some(max), Some(o)) = (max_requests_per_connection, options.as_object_mut()) {
        o.insert(
            "common_http_protocol_options".into(),
            json!({"max_requests_per_connection": max}),
        );
    }
    json!({"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": options})
}

fn tcp_cluster(name: &str, address: &str, port: u16) -> Value {
    json!({
        "name": name,
        "alt_stat_name": format!("{name};"),
        "type": "STATIC",
        "connect_timeout": "0.250s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": endpoint(name, socket_address(address, port)),
    })
}

fn sds_cluster(cfg: &AgentConfig) -> Value {
    json!({
        "name": SDS_CLUSTER,
        "alt_stat_name": format!("{SDS_CLUSTER};"),
        "type": "STATIC",
        "typed_extension_protocol_options": http2_options(None),
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": endpoint(SDS_CLUSTER, json!({"pipe": {"path": cfg.paths.sds_uds}})),
    })
}

fn xds_cluster(cfg: &AgentConfig) -> Value {
    let thresholds: Vec<Value> = ["DEFAULT", "HIGH"]
        .iter()
        .map(|priority| {
            json!({
                "priority": priority,
                "max_connections": 100_000,
                "max_pending_requests": 100_000,
                "max_requests": 100_000,
            })
        })
        .collect();
    json!({
        "name": XDS_CLUSTER,
        "alt_stat_name": format!("{XDS_CLUSTER};"),
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": endpoint(XDS_CLUSTER, json!({"pipe": {"path": cfg.paths.xds_uds}})),
        "circuit_breakers": {"thresholds": thresholds},
        "upstream_connection_options": {"tcp_keepalive": {"keepalive_time": 300}},
        "typed_extension_protocol_options": http2_options(Some(1)),
    })
}

/// The tracer ProxyConfig names (`tracing.zipkin` or `tracing.datadog`) and its collector address.
/// Istio's collector cluster also sets `respect_dns_ttl` and a 30s `dns_refresh_rate`, Cluster
/// fields upstream Envoy deprecated; Envoy's defaults apply here.
fn tracer(cfg: &AgentConfig) -> Option<(&'static str, String, u16)> {
    let tracing = cfg.proxy_config.tracing.as_ref()?;
    let (kind, cluster) = [("zipkin", "zipkin"), ("datadog", "datadog_agent")]
        .into_iter()
        .find(|(kind, _)| tracing.get(kind).is_some())?;
    let address = tracing.get(kind)?.get("address")?.as_str()?;
    let (host, port) = address.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    Some((cluster, host.to_owned(), port.parse().ok()?))
}

fn tracing_cluster(cfg: &AgentConfig) -> Option<Value> {
    let (name, host, port) = tracer(cfg)?;
    Some(json!({
        "name": name,
        "alt_stat_name": format!("{name};"),
        "type": "STRICT_DNS",
        "dns_lookup_family": if cfg.ipv6_only() { "V6_ONLY" } else { "V4_ONLY" },
        "connect_timeout": "1s",
        "lb_policy": "ROUND_ROBIN",
        "load_assignment": endpoint(name, json!({"socket_address": {"address": host, "port_value": port}})),
    }))
}

/// Envoy's `tracing` for the tracer ProxyConfig names, as Istio's template.
pub(super) fn tracing(cfg: &AgentConfig) -> Option<Value> {
    let (cluster, _, _) = tracer(cfg)?;
    let http = if cluster == "zipkin" {
        json!({
            "name": "envoy.tracers.zipkin",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.trace.v3.ZipkinConfig",
                "collector_cluster": "zipkin",
                "collector_endpoint": "/api/v2/spans",
                "collector_endpoint_version": "HTTP_JSON",
                "trace_id_128bit": true,
                "shared_span_context": false,
            },
        })
    } else {
        json!({
            "name": "envoy.tracers.datadog",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.config.trace.v3.DatadogConfig",
                "collector_cluster": cluster,
                "service_name": cfg.service_cluster,
            },
        })
    };
    Some(json!({"http": http}))
}

fn http_connection_manager(stat_prefix: &str, prefix: &str, cluster: &str, mut filters: Vec<Value>) -> Value {
    filters.push(json!({"name": "envoy.filters.http.router", "typed_config": {"@type": ROUTER}}));
    json!({
        "name": "envoy.filters.network.http_connection_manager",
        "typed_config": {
            "@type": HTTP_CONNECTION_MANAGER,
            "codec_type": "AUTO",
            "stat_prefix": stat_prefix,
            "route_config": {
                "virtual_hosts": [{
                    "name": "backend",
                    "domains": ["*"],
                    "routes": [{"match": {"prefix": prefix}, "route": {"cluster": cluster}}],
                }],
            },
            "http_filters": filters,
        },
    })
}

/// Brotli, zstd and gzip for the stats responses (ProxyConfig `statsCompression`, default on). The
/// content types go in `content_type_matcher`: upstream Envoy deprecated Istio's `content_type`.
fn compressors() -> Vec<Value> {
    let content_types: Vec<Value> = STATS_CONTENT_TYPES.iter().map(|t| json!({"prefix": t})).collect();
    [
        ("brotli", "envoy.extensions.compression.brotli.compressor.v3.Brotli"),
        ("zstd", "envoy.extensions.compression.zstd.compressor.v3.Zstd"),
        ("gzip", "envoy.extensions.compression.gzip.compressor.v3.Gzip"),
    ]
    .iter()
    .map(|(name, library)| {
        json!({
            "name": format!("envoy.filters.http.compressor.{name}"),
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.compressor.v3.Compressor",
                "compressor_library": {
                    "name": format!("stats_{name}"),
                    "typed_config": {"@type": format!("type.googleapis.com/{library}")},
                },
                "response_direction_config": {"common_config": {"content_type_matcher": content_types}},
            },
        })
    })
    .collect()
}

/// `METRICS_LOCALHOST_ACCESS_ONLY` in proxyMetadata binds the Prometheus listener to localhost.
pub(super) fn metrics_localhost_only(cfg: &AgentConfig) -> bool {
    cfg.proxy_config
        .proxy_metadata
        .get("METRICS_LOCALHOST_ACCESS_ONLY")
        .is_some_and(|v| v == "true")
}

pub(super) fn stats_compression(cfg: &AgentConfig) -> bool {
    cfg.proxy_config
        .extra
        .get("statsCompression")
        .and_then(Value::as_bool)
        .unwrap_or(true)
}

fn listener(address: &str, port: u16, filter: Value) -> Value {
    json!({
        "name": format!("{address}_{port}"),
        "address": socket_address(address, port),
        "ignore_global_conn_limit": true,
        "bypass_overload_manager": true,
        "filter_chains": [{"filters": [filter]}],
    })
}

fn prometheus_listener(cfg: &AgentConfig) -> Value {
    let address = if metrics_localhost_only(cfg) {
        cfg.localhost()
    } else {
        cfg.wildcard()
    };
    let filters = if stats_compression(cfg) {
        compressors()
    } else {
        Vec::new()
    };
    let hcm = http_connection_manager("stats", "/stats/prometheus", PROMETHEUS_STATS_CLUSTER, filters);
    listener(address, cfg.envoy_prometheus_port, hcm)
}

fn readiness_listener(cfg: &AgentConfig) -> Value {
    let hcm = http_connection_manager("agent", "/healthz/ready", AGENT_CLUSTER, Vec::new());
    listener(cfg.wildcard(), cfg.envoy_status_port, hcm)
}
