//! The HTTP connection manager of gateway listeners, as Istio's `buildGatewayConnectionManager` +
//! `buildHTTPConnectionManager`, restricted to upstream Envoy extensions (no `istio.*` filters):
//! fault, CORS and router HTTP filters, a file access log, websocket upgrades, RDS over ADS.

use model::{Features, MeshConfig, Proxy};
use serde_json::Value as Json;
use xds_api::envoy::config::accesslog::v3::{AccessLog, access_log};
use xds_api::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, DataSource, Http1ProtocolOptions, HttpProtocolOptions,
    SubstitutionFormatString, config_source, data_source, substitution_format_string,
};
use xds_api::envoy::extensions::access_loggers::file::v3::{FileAccessLog, file_access_log};
use xds_api::envoy::extensions::filters::http::cors::v3::Cors;
use xds_api::envoy::extensions::filters::http::fault::v3::HttpFault;
use xds_api::envoy::extensions::filters::http::router::v3::Router;
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager as hcm, http_filter,
};
use xds_api::pbwkt::{BoolValue, Duration, Struct, Value, value::Kind};

use crate::proxy_headers::{ListenerClass, ProxyHeaders};
use crate::route::{CORS_FILTER, FAULT_FILTER};

pub(crate) const HTTP_CONNECTION_MANAGER: &str = "envoy.filters.network.http_connection_manager";
pub(crate) const ROUTER_FILTER: &str = "envoy.filters.http.router";
const FILE_ACCESS_LOG: &str = "envoy.access_loggers.file";
/// Istio's `EnvoyServerName`: the `server` header gateways send.
pub(crate) const SERVER_NAME: &str = "istio-envoy";

/// Istio's default text access log format (`EnvoyTextLogFormat`).
pub(crate) const DEFAULT_ACCESS_LOG_FORMAT: &str = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% \
%PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% %RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% \
\"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% %DURATION% \
%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" \"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \
\"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" %UPSTREAM_CLUSTER_RAW% %UPSTREAM_LOCAL_ADDRESS% \
%DOWNSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_REMOTE_ADDRESS% %REQUESTED_SERVER_NAME% %ROUTE_NAME%\n";

/// Istio's default JSON access log fields (`EnvoyJSONLogFormatIstio`).
const DEFAULT_JSON_LOG_FIELDS: [(&str, &str); 24] = [
    ("start_time", "%START_TIME%"),
    ("route_name", "%ROUTE_NAME%"),
    ("method", "%REQ(:METHOD)%"),
    ("path", "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%"),
    ("protocol", "%PROTOCOL%"),
    ("response_code", "%RESPONSE_CODE%"),
    ("response_flags", "%RESPONSE_FLAGS%"),
    ("response_code_details", "%RESPONSE_CODE_DETAILS%"),
    ("connection_termination_details", "%CONNECTION_TERMINATION_DETAILS%"),
    ("bytes_received", "%BYTES_RECEIVED%"),
    ("bytes_sent", "%BYTES_SENT%"),
    ("duration", "%DURATION%"),
    ("upstream_service_time", "%RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)%"),
    ("x_forwarded_for", "%REQ(X-FORWARDED-FOR)%"),
    ("user_agent", "%REQ(USER-AGENT)%"),
    ("request_id", "%REQ(X-REQUEST-ID)%"),
    ("authority", "%REQ(:AUTHORITY)%"),
    ("upstream_host", "%UPSTREAM_HOST%"),
    ("upstream_cluster", "%UPSTREAM_CLUSTER_RAW%"),
    ("upstream_local_address", "%UPSTREAM_LOCAL_ADDRESS%"),
    ("downstream_local_address", "%DOWNSTREAM_LOCAL_ADDRESS%"),
    ("downstream_remote_address", "%DOWNSTREAM_REMOTE_ADDRESS%"),
    ("requested_server_name", "%REQUESTED_SERVER_NAME%"),
    (
        "upstream_transport_failure_reason",
        "%UPSTREAM_TRANSPORT_FAILURE_REASON%",
    ),
];

/// The gateway HCM serving route configuration `rds` over ADS.
pub(crate) fn gateway_connection_manager(
    mesh: &MeshConfig,
    features: &Features,
    proxy: &Proxy,
    rds: &str,
    stat_prefix: String,
) -> HttpConnectionManager {
    let topology = mesh.default_config.gateway_topology.as_ref();
    let xff_num_trusted_hops = topology
        .and_then(|t| t.get("numTrustedProxies"))
        .and_then(Json::as_u64)
        .unwrap_or(0) as u32;
    let forward_client_cert_details = topology
        .and_then(|t| t.get("forwardClientCertDetails"))
        .and_then(Json::as_str)
        .and_then(crate::proxy_headers::forward_client_cert_details)
        .unwrap_or(hcm::ForwardClientCertDetails::SanitizeSet);
    let set_current_client_cert_details = matches!(
        forward_client_cert_details,
        hcm::ForwardClientCertDetails::AppendForward | hcm::ForwardClientCertDetails::SanitizeSet
    )
    .then_some(hcm::SetCurrentClientCertDetails {
        subject: Some(BoolValue { value: true }),
        cert: true,
        dns: true,
        uri: true,
        ..Default::default()
    });
    // Istio: `PILOT_HTTP10`, or the proxy's `HTTP10` metadata
    let http10 = features.http10 || proxy.metadata.raw.get("HTTP10").and_then(Json::as_str) == Some("1");
    let idle_timeout = proxy
        .metadata
        .raw
        .get("IDLE_TIMEOUT")
        .and_then(Json::as_str)
        .and_then(model::duration::parse);
    let (normalize_path, merge_slashes, escaped_slashes) = path_normalization(mesh);

    let mut h = HttpConnectionManager {
        codec_type: hcm::CodecType::Auto as i32,
        stat_prefix,
        xff_num_trusted_hops,
        forward_client_cert_details: forward_client_cert_details as i32,
        set_current_client_cert_details,
        http_protocol_options: Some(Http1ProtocolOptions {
            accept_http_10: http10,
            ..Default::default()
        }),
        common_http_protocol_options: idle_timeout.map(|d| HttpProtocolOptions {
            idle_timeout: Some(crate::route::policy::proto_duration(d)),
            ..Default::default()
        }),
        access_log: access_logs(mesh),
        normalize_path: Some(BoolValue { value: normalize_path }),
        merge_slashes,
        path_with_escaped_slashes_action: escaped_slashes as i32,
        use_remote_address: Some(BoolValue { value: true }),
        upgrade_configs: vec![hcm::UpgradeConfig {
            upgrade_type: "websocket".into(),
            ..Default::default()
        }],
        // Istio disables the stream idle timeout (Envoy's default is 5m)
        stream_idle_timeout: Some(Duration { seconds: 0, nanos: 0 }),
        route_specifier: Some(hcm::RouteSpecifier::Rds(Rds {
            config_source: Some(ads_config_source()),
            route_config_name: rds.to_owned(),
        })),
        http_filters: http_filters(),
        tracing: crate::tracing_config::hcm_tracing(mesh, features, proxy),
        ..Default::default()
    };
    ProxyHeaders::of(proxy, mesh, ListenerClass::Gateway).apply_to_hcm(&mut h);
    h
}

/// Fault and CORS (their per-route configs need the filters present), then the router; every
/// filter with its `typed_config`, as Envoy requires.
pub(crate) fn http_filters() -> Vec<HttpFilter> {
    let filter = |name: &str, any| HttpFilter {
        name: name.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any)),
        ..Default::default()
    };
    vec![
        filter(FAULT_FILTER, xds_api::pack(&HttpFault::default())),
        filter(CORS_FILTER, xds_api::pack(&Cors {})),
        filter(ROUTER_FILTER, xds_api::pack(&Router::default())),
    ]
}

/// ADS as the config source, waiting for the first response indefinitely (`initial_fetch_timeout: 0s`).
pub(crate) fn ads_config_source() -> ConfigSource {
    ConfigSource {
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        initial_fetch_timeout: Some(Duration { seconds: 0, nanos: 0 }),
        resource_api_version: ApiVersion::V3 as i32,
        ..Default::default()
    }
}

/// `meshConfig.pathNormalization`: (normalize_path, merge_slashes, escaped slashes action).
fn path_normalization(mesh: &MeshConfig) -> (bool, bool, hcm::PathWithEscapedSlashesAction) {
    use hcm::PathWithEscapedSlashesAction as A;
    let mode = mesh
        .extra
        .get("pathNormalization")
        .and_then(|p| p.get("normalization"))
        .and_then(Json::as_str);
    match mode {
        Some("NONE") => (false, false, A::KeepUnchanged),
        Some("MERGE_SLASHES") => (true, true, A::KeepUnchanged),
        Some("DECODE_AND_MERGE_SLASHES") => (true, true, A::UnescapeAndForward),
        _ => (true, false, A::KeepUnchanged),
    }
}

/// `meshConfig.accessLogFile` as a file access log (text or JSON per `accessLogEncoding`).
pub(crate) fn access_logs(mesh: &MeshConfig) -> Vec<AccessLog> {
    if mesh.access_log_file.is_empty() {
        return Vec::new();
    }
    let custom = mesh
        .extra
        .get("accessLogFormat")
        .and_then(Json::as_str)
        .filter(|s| !s.is_empty());
    let format = if mesh.access_log_encoding.eq_ignore_ascii_case("JSON") {
        let fields = custom
            .and_then(|s| serde_json::from_str::<Json>(s).ok())
            .filter(Json::is_object)
            .map(|j| xds_api::json_to_struct(&j))
            .unwrap_or_else(|| Struct {
                fields: DEFAULT_JSON_LOG_FIELDS
                    .iter()
                    .map(|(k, v)| {
                        (
                            k.to_string(),
                            Value {
                                kind: Some(Kind::StringValue(v.to_string())),
                            },
                        )
                    })
                    .collect(),
            });
        substitution_format_string::Format::JsonFormat(fields)
    } else {
        let mut text = custom.unwrap_or(DEFAULT_ACCESS_LOG_FORMAT).to_owned();
        if !text.ends_with('\n') {
            text.push('\n');
        }
        substitution_format_string::Format::TextFormatSource(DataSource {
            specifier: Some(data_source::Specifier::InlineString(text)),
            ..Default::default()
        })
    };
    let file = FileAccessLog {
        path: mesh.access_log_file.clone(),
        access_log_format: Some(file_access_log::AccessLogFormat::LogFormat(SubstitutionFormatString {
            format: Some(format),
            ..Default::default()
        })),
    };
    vec![AccessLog {
        name: FILE_ACCESS_LOG.into(),
        filter: None,
        config_type: Some(access_log::ConfigType::TypedConfig(xds_api::pack(&file))),
    }]
}
