//! TLS termination on gateway servers: Istio's `BuildListenerTLSContext` for SIMPLE, MUTUAL and
//! OPTIONAL_MUTUAL servers whose certificates are files on the gateway (`serverCertificate`,
//! `privateKey`, `caCertificates`), as a `DownstreamTlsContext` with filename data sources, or a
//! `credentialName`, served by pilot-discovery over ADS (SDS `kubernetes://<name>` and, to check
//! clients, `kubernetes://<name>-cacert`; see `crate::sds`).
//!
//! ISTIO_MUTUAL servers present the gateway's workload certificate and require one of the mesh
//! (from the agent's SDS, `default` and `ROOTCA`).

use model::mesh::TlsDefaults;
use model::networking::ServerTlsSettings;
use xds_api::envoy::config::core::v3::{DataSource, TransportSocket, data_source, transport_socket};
use xds_api::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, SdsSecretConfig, TlsCertificate,
    TlsParameters, certificate_validation_context, common_tls_context, tls_parameters::TlsProtocol,
};
use xds_api::pbwkt::BoolValue;

use crate::route::matching::string_matcher;

/// ALPN a terminating HTTPS gateway offers (Istio's `ALPNHttp`).
pub(crate) const ALPN_HTTP: [&str; 2] = ["h2", "http/1.1"];
pub(crate) const TRANSPORT_SOCKET_TLS: &str = "envoy.transport_sockets.tls";

/// Why a server's TLS settings could not become a TLS context.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TlsContextError {
    #[error("tls mode {0} is not supported on gateways yet (hint: use SIMPLE or MUTUAL with certificate files)")]
    UnsupportedMode(String),
    #[error("serverCertificate and privateKey are required for tls mode {0}")]
    MissingCertificate(String),
}

/// ALPN of a TCP server terminating ISTIO_MUTUAL (Istio's `ALPNDownstreamWithMxc`).
const ALPN_DOWNSTREAM_WITH_MXC: [&str; 3] = ["istio-peer-exchange", "h2", "http/1.1"];

/// The downstream TLS context of a terminating server, as Istio's `BuildListenerTLSContext`.
/// `tcp_termination`: a TCP/TLS server terminating TLS into tcp_proxy (its ISTIO_MUTUAL ALPN
/// differs). SIMPLE, MUTUAL and OPTIONAL_MUTUAL servers take the mesh's `tlsDefaults`, then their
/// own TLS parameters.
pub(crate) fn downstream_tls_context(
    tls: &ServerTlsSettings,
    tcp_termination: bool,
    defaults: Option<&TlsDefaults>,
) -> Result<DownstreamTlsContext, TlsContextError> {
    let mode = tls.mode.as_deref().unwrap_or("PASSTHROUGH");
    if mode == "ISTIO_MUTUAL" {
        let alpn: &[&str] = if tcp_termination {
            &ALPN_DOWNSTREAM_WITH_MXC
        } else {
            &ALPN_HTTP
        };
        // the gateway's own workload certificate and the mesh root, from its agent's SDS
        return Ok(crate::mtls::downstream_istio_mutual_context(
            &tls.subject_alt_names,
            alpn.iter().map(|s| s.to_string()).collect(),
        ));
    }
    let require_client_certificate = match mode {
        "SIMPLE" | "OPTIONAL_MUTUAL" => false,
        "MUTUAL" => true,
        other => return Err(TlsContextError::UnsupportedMode(other.to_owned())),
    };
    // Istio's `ApplyCredentialSDSToServerCommonTLSContext`: `credentialNames` (an RSA and an ECDSA
    // certificate, say) win over `credentialName`; clients are checked with the CA of the first
    let credentials: Vec<&String> = if tls.credential_names.is_empty() {
        std::iter::once(&tls.credential_name)
            .filter(|n| !n.is_empty())
            .collect()
    } else {
        tls.credential_names.iter().filter(|n| !n.is_empty()).collect()
    };
    let validate_client = require_client_certificate || mode == "OPTIONAL_MUTUAL";
    let file = |path: &str| DataSource {
        specifier: Some(data_source::Specifier::Filename(path.to_owned())),
        ..Default::default()
    };
    let mut common = CommonTlsContext {
        alpn_protocols: ALPN_HTTP.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    if let Some(first) = credentials.first() {
        for name in &credentials {
            common
                .tls_certificate_sds_secret_configs
                .push(ads_secret(&crate::sds::resource_name(name)));
        }
        if validate_client {
            let ca = if tls.ca_cert_credential_name.is_empty() {
                format!("{}{}", crate::sds::resource_name(first), crate::sds::CA_SUFFIX)
            } else {
                crate::sds::resource_name(&tls.ca_cert_credential_name)
            };
            common.validation_context_type =
                Some(common_tls_context::ValidationContextType::CombinedValidationContext(
                    common_tls_context::CombinedCertificateValidationContext {
                        default_validation_context: Some(client_validation(tls, None)),
                        validation_context_sds_secret_config: Some(ads_secret(&ca)),
                        ..Default::default()
                    },
                ));
        }
    } else {
        if tls.server_certificate.is_empty() || tls.private_key.is_empty() {
            return Err(TlsContextError::MissingCertificate(mode.to_owned()));
        }
        common.tls_certificates.push(TlsCertificate {
            certificate_chain: Some(file(&tls.server_certificate)),
            private_key: Some(file(&tls.private_key)),
            ..Default::default()
        });
        if validate_client && !tls.ca_certificates.is_empty() {
            common.validation_context_type = Some(common_tls_context::ValidationContextType::ValidationContext(
                client_validation(tls, Some(file(&tls.ca_certificates))),
            ));
        }
    }
    apply_tls_parameters(&mut common, tls, defaults);
    Ok(DownstreamTlsContext {
        common_tls_context: Some(common),
        require_client_certificate: Some(BoolValue {
            value: require_client_certificate,
        }),
        ..Default::default()
    })
}

/// Istio's `applyDownstreamTLSDefaults` then `applyServerTLSSettings`: the mesh's defaults, each
/// overridden by the server's own setting; no parameters when neither sets any.
fn apply_tls_parameters(common: &mut CommonTlsContext, tls: &ServerTlsSettings, defaults: Option<&TlsDefaults>) {
    let mut params: Option<TlsParameters> = None;
    let mut set = |f: &mut dyn FnMut(&mut TlsParameters)| f(params.get_or_insert_with(TlsParameters::default));
    if let Some(d) = defaults {
        if !d.ecdh_curves.is_empty() {
            set(&mut |p| p.ecdh_curves = d.ecdh_curves.clone());
        }
        if !d.cipher_suites.is_empty() {
            set(&mut |p| p.cipher_suites = d.cipher_suites.clone());
        }
        if let Some(min) = tls_protocol(&d.min_protocol_version) {
            set(&mut |p| p.tls_minimum_protocol_version = min as i32);
        }
    }
    if let Some(min) = tls.min_protocol_version.as_deref().and_then(tls_protocol) {
        set(&mut |p| p.tls_minimum_protocol_version = min as i32);
    }
    if !tls.ecdh_curves.is_empty() {
        set(&mut |p| p.ecdh_curves = tls.ecdh_curves.clone());
    }
    if !tls.cipher_suites.is_empty() {
        set(&mut |p| p.cipher_suites = tls.cipher_suites.clone());
    }
    if let Some(max) = tls.max_protocol_version.as_deref().and_then(tls_protocol) {
        set(&mut |p| p.tls_maximum_protocol_version = max as i32);
    }
    common.tls_params = params;
}

/// How client certificates are checked: the CA (`trusted_ca`, unless it comes over SDS), CRL,
/// SANs, SPKI and hashes, `insecureSkipVerify`.
fn client_validation(tls: &ServerTlsSettings, trusted_ca: Option<DataSource>) -> CertificateValidationContext {
    let file = |path: &str| DataSource {
        specifier: Some(data_source::Specifier::Filename(path.to_owned())),
        ..Default::default()
    };
    #[allow(deprecated)] // Istio matches client SANs exactly with match_subject_alt_names
    CertificateValidationContext {
        trusted_ca,
        crl: (!tls.ca_crl.is_empty()).then(|| file(&tls.ca_crl)),
        match_subject_alt_names: tls
            .subject_alt_names
            .iter()
            .filter_map(|san| string_matcher(&model::networking::StringMatch::exact(san)))
            .collect(),
        verify_certificate_spki: tls.verify_certificate_spki.clone(),
        verify_certificate_hash: tls.verify_certificate_hash.clone(),
        // Istio: `insecureSkipVerify` accepts client certificates of any trust chain.
        trust_chain_verification: if tls.insecure_skip_verify == Some(true) {
            certificate_validation_context::TrustChainVerification::AcceptUntrusted as i32
        } else {
            certificate_validation_context::TrustChainVerification::VerifyTrustChain as i32
        },
        ..Default::default()
    }
}

/// Istio's `SDSAdsConfig`: a secret pilot-discovery serves on the ADS stream.
fn ads_secret(name: &str) -> SdsSecretConfig {
    use xds_api::envoy::config::core::v3::{AggregatedConfigSource, ApiVersion, ConfigSource, config_source};
    SdsSecretConfig {
        name: name.to_owned(),
        sds_config: Some(ConfigSource {
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
            resource_api_version: ApiVersion::V3 as i32,
            ..Default::default()
        }),
    }
}

/// `TLS_AUTO`/`TLSV1_2`/... to Envoy's enum; `None` for auto or unknown values.
fn tls_protocol(s: &str) -> Option<TlsProtocol> {
    match s {
        "TLSV1_0" => Some(TlsProtocol::TlSv10),
        "TLSV1_1" => Some(TlsProtocol::TlSv11),
        "TLSV1_2" => Some(TlsProtocol::TlSv12),
        "TLSV1_3" => Some(TlsProtocol::TlSv13),
        _ => None,
    }
}

/// `buildDownstreamTLSTransportSocket`.
pub(crate) fn tls_transport_socket(ctx: &DownstreamTlsContext) -> TransportSocket {
    TransportSocket {
        name: TRANSPORT_SOCKET_TLS.into(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(xds_api::pack(ctx))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn downstream_tls_context_of(tls: &ServerTlsSettings) -> Result<DownstreamTlsContext, TlsContextError> {
        downstream_tls_context(tls, false, None)
    }

    /// `ecdhCurves` and `insecureSkipVerify` (accepting client certificates of any trust chain).
    #[test]
    fn ecdh_curves_and_insecure_skip_verify() {
        let tls = ServerTlsSettings {
            mode: Some("MUTUAL".into()),
            ecdh_curves: vec!["X25519".into(), "P-256".into()],
            insecure_skip_verify: Some(true),
            ..simple()
        };
        let common = downstream_tls_context_of(&tls).unwrap().common_tls_context.unwrap();
        assert_eq!(common.tls_params.unwrap().ecdh_curves, ["X25519", "P-256"]);
        let Some(common_tls_context::ValidationContextType::ValidationContext(v)) = common.validation_context_type
        else {
            panic!("a validation context");
        };
        assert_eq!(
            v.trust_chain_verification,
            certificate_validation_context::TrustChainVerification::AcceptUntrusted as i32
        );
        let strict = downstream_tls_context_of(&ServerTlsSettings {
            mode: Some("MUTUAL".into()),
            ..simple()
        })
        .unwrap();
        assert!(strict.common_tls_context.unwrap().tls_params.is_none());
    }

    fn simple() -> ServerTlsSettings {
        ServerTlsSettings {
            mode: Some("SIMPLE".into()),
            server_certificate: "/etc/certs/cert.pem".into(),
            private_key: "/etc/certs/key.pem".into(),
            ca_certificates: "/etc/certs/ca.pem".into(),
            ..Default::default()
        }
    }

    #[test]
    fn simple_uses_certificate_files_and_no_client_validation() {
        let ctx = downstream_tls_context_of(&simple()).unwrap();
        assert_eq!(ctx.require_client_certificate, Some(BoolValue { value: false }));
        let common = ctx.common_tls_context.unwrap();
        assert_eq!(common.alpn_protocols, ["h2", "http/1.1"]);
        let cert = &common.tls_certificates[0];
        assert_eq!(
            cert.certificate_chain.as_ref().unwrap().specifier,
            Some(data_source::Specifier::Filename("/etc/certs/cert.pem".into()))
        );
        assert!(common.validation_context_type.is_none());
    }

    #[test]
    fn mutual_requires_and_validates_client_certificates() {
        let tls = ServerTlsSettings {
            mode: Some("MUTUAL".into()),
            min_protocol_version: Some("TLSV1_2".into()),
            subject_alt_names: vec!["spiffe://td/ns/a/sa/b".into()],
            ..simple()
        };
        let ctx = downstream_tls_context_of(&tls).unwrap();
        assert_eq!(ctx.require_client_certificate, Some(BoolValue { value: true }));
        let common = ctx.common_tls_context.unwrap();
        let Some(common_tls_context::ValidationContextType::ValidationContext(v)) = common.validation_context_type
        else {
            panic!("validation context expected");
        };
        assert!(v.trusted_ca.is_some());
        #[allow(deprecated)]
        let sans = v.match_subject_alt_names.len();
        assert_eq!(sans, 1);
        assert_eq!(
            common.tls_params.unwrap().tls_minimum_protocol_version,
            TlsProtocol::TlSv12 as i32
        );
    }

    /// `credentialName`: the certificate (and for MUTUAL the CA) from pilot-discovery over ADS.
    #[test]
    fn credential_names_are_sds_secrets_on_the_ads_stream() {
        let simple_sds = ServerTlsSettings {
            credential_name: "my-secret".into(),
            server_certificate: String::new(),
            private_key: String::new(),
            ..simple()
        };
        let common = downstream_tls_context_of(&simple_sds)
            .unwrap()
            .common_tls_context
            .unwrap();
        assert_eq!(
            common.tls_certificate_sds_secret_configs[0].name,
            "kubernetes://my-secret"
        );
        assert!(common.tls_certificates.is_empty() && common.validation_context_type.is_none());
        let mutual = ServerTlsSettings {
            mode: Some("MUTUAL".into()),
            ..simple_sds
        };
        let common = downstream_tls_context_of(&mutual).unwrap().common_tls_context.unwrap();
        let Some(common_tls_context::ValidationContextType::CombinedValidationContext(v)) =
            common.validation_context_type
        else {
            panic!("combined validation context");
        };
        assert_eq!(
            v.validation_context_sds_secret_config.unwrap().name,
            "kubernetes://my-secret-cacert"
        );
    }

    #[test]
    fn unsupported_settings_are_refused_with_a_reason() {
        let im = ServerTlsSettings {
            mode: Some("ISTIO_MUTUAL".into()),
            ..simple()
        };
        let ctx = downstream_tls_context_of(&im).unwrap();
        assert_eq!(ctx.require_client_certificate, Some(BoolValue { value: true }));
        assert_eq!(
            ctx.common_tls_context.unwrap().tls_certificate_sds_secret_configs[0].name,
            "default"
        );
        let bad = ServerTlsSettings {
            mode: Some("AUTO_PASSTHROUGH".into()),
            ..simple()
        };
        assert!(matches!(
            downstream_tls_context_of(&bad),
            Err(TlsContextError::UnsupportedMode(_))
        ));
        let nocert = ServerTlsSettings {
            server_certificate: String::new(),
            ..simple()
        };
        assert!(matches!(
            downstream_tls_context_of(&nocert),
            Err(TlsContextError::MissingCertificate(_))
        ));
    }

    /// Istio: `credentialNames` (RSA and ECDSA) each become a certificate, the first one's CA
    /// checks clients unless `caCertCredentialName` names another; the mesh's `tlsDefaults` come
    /// first and the server's own parameters win.
    #[test]
    fn several_credentials_a_ca_credential_and_mesh_tls_defaults() {
        let tls = ServerTlsSettings {
            mode: Some("MUTUAL".into()),
            server_certificate: String::new(),
            private_key: String::new(),
            credential_names: vec!["rsa".into(), "ecdsa".into()],
            ecdh_curves: vec!["X25519".into()],
            ..simple()
        };
        let defaults = TlsDefaults {
            min_protocol_version: "TLSV1_3".into(),
            ecdh_curves: vec!["P-256".into()],
            cipher_suites: vec!["ECDHE-RSA-AES256-GCM-SHA384".into()],
        };
        let common = downstream_tls_context(&tls, false, Some(&defaults))
            .unwrap()
            .common_tls_context
            .unwrap();
        let names: Vec<&str> = common
            .tls_certificate_sds_secret_configs
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(names, ["kubernetes://rsa", "kubernetes://ecdsa"]);
        let Some(common_tls_context::ValidationContextType::CombinedValidationContext(v)) =
            &common.validation_context_type
        else {
            panic!("combined validation context");
        };
        assert_eq!(
            v.validation_context_sds_secret_config.as_ref().unwrap().name,
            "kubernetes://rsa-cacert"
        );
        let params = common.tls_params.unwrap();
        assert_eq!(params.tls_minimum_protocol_version, TlsProtocol::TlSv13 as i32);
        assert_eq!(params.ecdh_curves, ["X25519"], "the server's own curves win");
        assert_eq!(params.cipher_suites, ["ECDHE-RSA-AES256-GCM-SHA384"]);

        let own_ca = ServerTlsSettings {
            ca_cert_credential_name: "client-roots".into(),
            ..tls
        };
        let common = downstream_tls_context(&own_ca, false, None)
            .unwrap()
            .common_tls_context
            .unwrap();
        let Some(common_tls_context::ValidationContextType::CombinedValidationContext(v)) =
            common.validation_context_type
        else {
            panic!("combined validation context");
        };
        assert_eq!(
            v.validation_context_sds_secret_config.unwrap().name,
            "kubernetes://client-roots"
        );
    }
}
