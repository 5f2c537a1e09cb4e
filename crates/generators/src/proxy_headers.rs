//! Istio's `GetProxyHeaders` (pilot/pkg/networking/util/proxy_headers.go): the headers a proxy
//! adds or strips on one class of listener, from the `proxyHeaders` of its ProxyConfig, and how
//! they land on the HTTP connection manager, the router filter, virtual hosts and routes.

use model::proxy_headers::ProxyHeaders as Config;
use model::{MeshConfig, Proxy};
use xds_api::envoy::config::core::v3::{Http1ProtocolOptions, TypedExtensionConfig, http1_protocol_options};
use xds_api::envoy::extensions::filters::http::router::v3::Router;
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager as hcm, http_filter,
};
use xds_api::envoy::extensions::http::header_formatters::preserve_case::v3::PreserveCaseFormatterConfig;
use xds_api::pbwkt::BoolValue;

use crate::lds::hcm::{ROUTER_FILTER, SERVER_NAME};

/// Istio's `ListenerClass`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListenerClass {
    SidecarInbound,
    SidecarOutbound,
    Gateway,
}

/// Istio's `ProxyHeaders`: what one listener class of one proxy does with proxy headers.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ProxyHeaders {
    /// `server` header value; empty: Envoy's own (`envoy`) or none (with PASS_THROUGH).
    pub server_name: String,
    pub server_header_transformation: hcm::ServerHeaderTransformation,
    /// XFCC on sidecar inbound listeners (gateways take it from `gatewayTopology`).
    pub forwarded_client_cert: hcm::ForwardClientCertDetails,
    pub set_current_cert_details: Option<model::proxy_headers::SetCurrentClientCertDetails>,
    pub include_request_attempt_count: bool,
    /// `Some(false)`: no `x-request-id`; `None`: Envoy's default (generated).
    pub generate_request_id: Option<bool>,
    pub suppress_debug_headers: bool,
    pub x_forwarded_port: bool,
    pub x_forwarded_host: bool,
    pub preserve_http1_header_case: bool,
}

impl ProxyHeaders {
    /// Istio's `GetProxyHeaders` for `proxy` on listeners of `class`.
    pub(crate) fn of(proxy: &Proxy, mesh: &MeshConfig, class: ListenerClass) -> ProxyHeaders {
        Self::from_config(proxy.proxy_headers_config(mesh), class)
    }

    /// Istio's `GetProxyHeadersFromProxyConfig`.
    pub(crate) fn from_config(config: Option<&Config>, class: ListenerClass) -> ProxyHeaders {
        let mut base = ProxyHeaders {
            // Istio: "outbound uses envoy while inbound uses istio-envoy", kept for compatibility.
            server_name: if class == ListenerClass::SidecarOutbound {
                String::new()
            } else {
                SERVER_NAME.into()
            },
            server_header_transformation: hcm::ServerHeaderTransformation::Overwrite,
            forwarded_client_cert: hcm::ForwardClientCertDetails::AppendForward,
            set_current_cert_details: None,
            include_request_attempt_count: true,
            generate_request_id: None,
            suppress_debug_headers: false,
            x_forwarded_port: false,
            x_forwarded_host: false,
            preserve_http1_header_case: false,
        };
        let Some(c) = config else { return base };
        let disabled =
            |d: &Option<model::proxy_headers::Disableable>| d.as_ref().and_then(|d| d.disabled) == Some(true);
        let enabled = |e: &Option<model::proxy_headers::Enableable>| e.as_ref().and_then(|e| e.enabled) == Some(true);
        if disabled(&c.attempt_count) {
            base.include_request_attempt_count = false;
        }
        if let Some(f) = c.forwarded_client_cert.as_deref().and_then(forward_client_cert_details) {
            base.forwarded_client_cert = f;
        }
        if let Some(s) = &c.server {
            if s.disabled == Some(true) {
                base.server_name = String::new();
                base.server_header_transformation = hcm::ServerHeaderTransformation::PassThrough;
            } else if !s.value.is_empty() {
                base.server_name = s.value.clone();
            }
        }
        if disabled(&c.request_id) {
            base.generate_request_id = Some(false);
        }
        base.suppress_debug_headers = disabled(&c.envoy_debug_headers);
        base.x_forwarded_port = enabled(&c.x_forwarded_port);
        base.x_forwarded_host = enabled(&c.x_forwarded_host);
        base.set_current_cert_details = c.set_current_client_cert_details.clone();
        base.preserve_http1_header_case = c.preserve_http1_header_case == Some(true);
        base
    }

    /// What every class shares on the connection manager (Istio's `buildHTTPConnectionManager`
    /// and the per-class HCM options): `server`, `x-request-id`, `x-forwarded-port`, header case,
    /// and the router filter's Envoy debug headers.
    pub(crate) fn apply_to_hcm(&self, h: &mut HttpConnectionManager) {
        h.server_name = self.server_name.clone();
        h.server_header_transformation = self.server_header_transformation as i32;
        h.generate_request_id = self.generate_request_id.map(|value| BoolValue { value });
        h.append_x_forwarded_port = self.x_forwarded_port;
        if self.preserve_http1_header_case {
            h.http_protocol_options
                .get_or_insert_with(Default::default)
                .header_key_format = Some(preserve_case());
        }
        if self.suppress_debug_headers {
            for f in h.http_filters.iter_mut().filter(|f| f.name == ROUTER_FILTER) {
                f.config_type = Some(http_filter::ConfigType::TypedConfig(xds_api::pack(&Router {
                    suppress_envoy_headers: true,
                    ..Default::default()
                })));
            }
        }
    }

    /// Sidecar inbound XFCC (Istio's `buildSidecarInboundHTTPOpts`): subject, URI and DNS unless
    /// turned off, cert and chain only when asked.
    pub(crate) fn apply_inbound_client_cert(&self, h: &mut HttpConnectionManager) {
        let d = self.set_current_cert_details.clone().unwrap_or_default();
        h.forward_client_cert_details = self.forwarded_client_cert as i32;
        h.set_current_client_cert_details = Some(hcm::SetCurrentClientCertDetails {
            subject: Some(BoolValue {
                value: d.subject.unwrap_or(true),
            }),
            uri: d.uri.unwrap_or(true),
            dns: d.dns.unwrap_or(true),
            cert: d.cert.unwrap_or(false),
            chain: d.chain.unwrap_or(false),
            ..Default::default()
        });
    }
}

/// Envoy's `preserve_case` stateful header formatter (Istio's `preserveCaseFormatterConfig`).
pub(crate) fn preserve_case() -> http1_protocol_options::HeaderKeyFormat {
    http1_protocol_options::HeaderKeyFormat {
        header_format: Some(
            http1_protocol_options::header_key_format::HeaderFormat::StatefulFormatter(TypedExtensionConfig {
                name: "preserve_case".into(),
                typed_config: Some(xds_api::pack(&PreserveCaseFormatterConfig::default())),
            }),
        ),
    }
}

/// HTTP/1 options for upstream clusters of a proxy that preserves header case.
pub(crate) fn preserve_case_http1_options() -> Http1ProtocolOptions {
    Http1ProtocolOptions {
        header_key_format: Some(preserve_case()),
        ..Default::default()
    }
}

/// Istio's `MeshConfigToEnvoyForwardClientCertDetails`.
pub(crate) fn forward_client_cert_details(s: &str) -> Option<hcm::ForwardClientCertDetails> {
    use hcm::ForwardClientCertDetails as F;
    Some(match s {
        "SANITIZE" => F::Sanitize,
        "FORWARD_ONLY" => F::ForwardOnly,
        "APPEND_FORWARD" => F::AppendForward,
        "SANITIZE_SET" => F::SanitizeSet,
        "ALWAYS_FORWARD_ONLY" => F::AlwaysForwardOnly,
        _ => return None,
    })
}
