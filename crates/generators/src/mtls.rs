//! Istio mutual TLS as the generators emit it (Istio's `pilot/pkg/security/model` and the
//! `authn` MTLS settings): the workload certificate (`default`) and mesh root (`ROOTCA`) from the
//! agent's SDS cluster, the client side of ISTIO_MUTUAL clusters (ALPN `istio-peer-exchange`,
//! `istio`, SNI, the destination's SPIFFE identities) and the server side of inbound chains (a
//! client certificate of the mesh root required).

use xds_api::envoy::config::core::v3 as core;
use xds_api::envoy::extensions::transport_sockets::tls::v3 as tls;
use xds_api::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};

/// The agent's SDS cluster (Istio's `SDSClusterName`).
pub(crate) const SDS_CLUSTER: &str = "sds-grpc";
/// Istio's `SDSDefaultResourceName`: the workload certificate.
pub(crate) const WORKLOAD_CERT: &str = "default";
/// Istio's `SDSRootResourceName`: the mesh root.
pub(crate) const ROOT_CERT: &str = "ROOTCA";
pub(crate) const TLS_TRANSPORT_SOCKET: &str = "envoy.transport_sockets.tls";

/// Istio's `ALPNInMeshWithMxc` and `ALPNInMeshH2WithMxc`: what a sidecar offers another.
pub(crate) fn in_mesh_alpns(http2: bool) -> Vec<String> {
    let mut v = vec!["istio-peer-exchange".to_owned(), "istio".to_owned()];
    if http2 {
        v.push("h2".into());
    }
    v
}

/// Istio's `mtlsHTTPALPNs` and `allIstioMtlsALPNs` (what a sidecar's client side may offer).
pub(crate) const ALL_ISTIO_MTLS_ALPNS: [&str; 5] = [
    "istio",
    "istio-peer-exchange",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];
/// Istio's `mtlsTCPWithMxcALPNs`.
pub(crate) const MTLS_TCP_ALPNS: [&str; 2] = ["istio-peer-exchange", "istio"];

/// Istio's `ConstructSdsSecretConfig` for the agent's SDS: waits for the secret (0s timeout).
pub(crate) fn sds_secret(name: &str) -> tls::SdsSecretConfig {
    tls::SdsSecretConfig {
        name: name.to_owned(),
        sds_config: Some(core::ConfigSource {
            config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::ApiConfigSource(
                core::ApiConfigSource {
                    api_type: core::api_config_source::ApiType::Grpc as i32,
                    set_node_on_first_message_only: true,
                    transport_api_version: core::ApiVersion::V3 as i32,
                    grpc_services: vec![core::GrpcService {
                        target_specifier: Some(core::grpc_service::TargetSpecifier::EnvoyGrpc(
                            core::grpc_service::EnvoyGrpc {
                                cluster_name: SDS_CLUSTER.into(),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )),
            initial_fetch_timeout: Some(Default::default()),
            resource_api_version: core::ApiVersion::V3 as i32,
            ..Default::default()
        }),
    }
}

fn tls_params() -> tls::TlsParameters {
    tls::TlsParameters {
        tls_minimum_protocol_version: tls::tls_parameters::TlsProtocol::TlSv12 as i32,
        tls_maximum_protocol_version: tls::tls_parameters::TlsProtocol::TlSv13 as i32,
        ..Default::default()
    }
}

/// The workload certificate, and the mesh root with `sans` (exact) to check the peer by.
fn istio_common(sans: &[String], alpns: Vec<String>) -> tls::CommonTlsContext {
    use tls::common_tls_context::{CombinedCertificateValidationContext, ValidationContextType};
    tls::CommonTlsContext {
        tls_params: Some(tls_params()),
        tls_certificate_sds_secret_configs: vec![sds_secret(WORKLOAD_CERT)],
        validation_context_type: Some(ValidationContextType::CombinedValidationContext(
            CombinedCertificateValidationContext {
                default_validation_context: Some(tls::CertificateValidationContext {
                    match_typed_subject_alt_names: sans
                        .iter()
                        .map(|san| tls::SubjectAltNameMatcher {
                            san_type: tls::subject_alt_name_matcher::SanType::Uri as i32,
                            matcher: Some(StringMatcher {
                                match_pattern: Some(MatchPattern::Exact(san.clone())),
                                ..Default::default()
                            }),
                            ..Default::default()
                        })
                        .collect(),
                    ..Default::default()
                }),
                validation_context_sds_secret_config: Some(sds_secret(ROOT_CERT)),
                ..Default::default()
            },
        )),
        alpn_protocols: alpns,
        ..Default::default()
    }
}

/// The client side of ISTIO_MUTUAL (Istio's `buildUpstreamClusterTLSContext`).
pub(crate) fn upstream_istio_mutual(sni: &str, sans: &[String], http2: bool) -> core::TransportSocket {
    transport_socket(&tls::UpstreamTlsContext {
        common_tls_context: Some(istio_common(sans, in_mesh_alpns(http2))),
        sni: sni.to_owned(),
        ..Default::default()
    })
}

/// The server side of an inbound mTLS chain (Istio's `buildInboundTLS`): a client certificate of
/// the mesh root required; ALPN `h2`, `http/1.1` (and `istio-peer-exchange` for TCP chains).
pub(crate) fn downstream_istio_mutual(tcp: bool) -> core::TransportSocket {
    let mut alpns = vec!["h2".to_owned(), "http/1.1".to_owned()];
    if tcp {
        alpns.insert(0, "istio-peer-exchange".into());
    }
    transport_socket(&downstream_istio_mutual_context(&[], alpns))
}

/// The server side of Istio mTLS: the workload certificate, a client certificate of the mesh
/// root (with one of `sans`, when given) required.
pub(crate) fn downstream_istio_mutual_context(sans: &[String], alpns: Vec<String>) -> tls::DownstreamTlsContext {
    tls::DownstreamTlsContext {
        common_tls_context: Some(istio_common(sans, alpns)),
        require_client_certificate: Some(xds_api::pbwkt::BoolValue { value: true }),
        ..Default::default()
    }
}

pub(crate) fn transport_socket<M: prost::Message + prost::Name>(context: &M) -> core::TransportSocket {
    core::TransportSocket {
        name: TLS_TRANSPORT_SOCKET.into(),
        config_type: Some(core::transport_socket::ConfigType::TypedConfig(xds_api::pack(context))),
    }
}

/// Istio's `RawBufferTransportSocket`.
pub(crate) fn raw_buffer() -> core::TransportSocket {
    core::TransportSocket {
        name: "envoy.transport_sockets.raw_buffer".into(),
        config_type: Some(core::transport_socket::ConfigType::TypedConfig(xds_api::pack(
            &xds_api::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer {},
        ))),
    }
}
