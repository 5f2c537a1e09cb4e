//! Upstream TLS origination from a DestinationRule's `tls`, as Istio's `cluster_tls.go`:
//! `SIMPLE` and `MUTUAL` with certificates from files, or from a `credentialName` (a Kubernetes
//! Secret that pilot-discovery serves over ADS, as Istio's `ApplyCustomSDSToClientCommonTLSContext`:
//! `kubernetes://<name>` is the client certificate, for MUTUAL only, and `kubernetes://<name>-cacert`
//! the CA to verify the server with), SNI, SAN verification, `insecureSkipVerify` and the mesh's
//! `tlsDefaults`. Envoy reads the files itself (Istio serves them over SDS through its agent;
//! upstream Envoy does not need that).
//!
//! `ISTIO_MUTUAL` and auto mTLS (Istio's `buildUpstreamTLSSettings`, `applyUpstreamTLSSettings`):
//! the workload certificate and mesh root from the agent's SDS, SNI
//! `outbound_.<port>_.<subset>_.<host>`, the destination's SPIFFE identities; without a
//! DestinationRule `tls`, `enableAutoMtls` sends mTLS to endpoints labelled
//! `security.istio.io/tlsMode: istio` and plaintext to the others (`transport_socket_matches`),
//! unless the destination's namespace- or mesh-wide PeerAuthentication disables mTLS.

use model::networking::ClientTlsSettings;
use xds_api::envoy::config::core::v3 as core;
use xds_api::envoy::extensions::transport_sockets::tls::v3 as tls;
use xds_api::envoy::r#type::matcher::v3::{StringMatcher, string_matcher::MatchPattern};

use super::{Builder, ClusterWrapper};

/// Where `ca_certificates` comes from when a DestinationRule gives none (Istio's `system`: the
/// OS trust bundle).
pub(crate) const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Suffix of the SDS resource holding a credential's CA (Istio's `SdsCaSuffix`).
const SDS_CA_SUFFIX: &str = "-cacert";

pub(super) fn apply(cw: &mut ClusterWrapper, b: &Builder<'_>, settings: Option<&ClientTlsSettings>) {
    let Some(settings) = settings else {
        auto_mtls(cw, b);
        return;
    };
    let mutual = match settings.mode.as_deref() {
        Some("SIMPLE") => false,
        Some("MUTUAL") => true,
        Some("ISTIO_MUTUAL") => {
            let sni = settings
                .sni
                .clone()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| istio_sni(&cw.cluster.name));
            let sans = if settings.subject_alt_names.is_empty() {
                service_accounts(b)
            } else {
                settings.subject_alt_names.clone()
            };
            cw.cluster.transport_socket = Some(crate::mtls::upstream_istio_mutual(&sni, &sans, cw.is_http2()));
            return;
        }
        // DISABLE (also a `tls` without mode): plaintext.
        _ => return,
    };
    let credential = settings.credential_name.as_deref().filter(|c| !c.is_empty());
    // Istio does not hand a credential to every sidecar a rule without workload selector reaches:
    // only gateways and selected workloads fetch it.
    let has_selector = b.rule.is_some_and(|r| r.rule.workload_selector.is_some());
    if credential.is_some() && b.proxy.is_sidecar() && !has_selector {
        return;
    }
    if mutual && credential.is_none() && (is_empty(&settings.client_certificate) || is_empty(&settings.private_key)) {
        tracing::warn!(
            cluster = cw.cluster.name,
            "MUTUAL TLS without clientCertificate and privateKey: TLS not applied"
        );
        return;
    }
    // Istio: a ServiceEntry's `subjectAltNames` (and its workloads' identities) when the rule names
    // none
    let mut settings = std::borrow::Cow::Borrowed(settings);
    if b.service.attributes.service_registry == "External" && settings.subject_alt_names.is_empty() {
        settings.to_mut().subject_alt_names = service_accounts(b);
    }
    let mut context = upstream_tls_context(cw, &settings, credential, mutual);
    if let (Some(defaults), Some(common)) = (&b.push.mesh().tls_defaults, context.common_tls_context.as_mut()) {
        // Istio's `applyTLSDefaults`: curves and ciphers (the versions stay 1.2 to 1.3)
        let params = common.tls_params.get_or_insert_with(Default::default);
        if !defaults.ecdh_curves.is_empty() {
            params.ecdh_curves = defaults.ecdh_curves.clone();
        }
        if !defaults.cipher_suites.is_empty() {
            params.cipher_suites = defaults.cipher_suites.clone();
        }
    }
    cw.cluster.transport_socket = Some(core::TransportSocket {
        name: "envoy.transport_sockets.tls".into(),
        config_type: Some(core::transport_socket::ConfigType::TypedConfig(xds_api::pack(&context))),
    });
}

/// Istio's auto mTLS: mTLS to the endpoints with a sidecar (`tlsMode: istio` in their EDS
/// metadata), plaintext to the others; only for proxies with a workload identity to present.
fn auto_mtls(cw: &mut ClusterWrapper, b: &Builder<'_>) {
    use model::security::MtlsMode;
    if !b.push.mesh().enable_auto_mtls
        || !b.proxy.has_workload_identity()
        || b.service.mesh_external
        || cw.cluster_type() == xds_api::envoy::config::cluster::v3::cluster::DiscoveryType::OriginalDst
        || b.push.service_mtls_mode(b.service) == MtlsMode::Disable
    {
        return;
    }
    let istio = crate::mtls::upstream_istio_mutual(&istio_sni(&cw.cluster.name), &service_accounts(b), cw.is_http2());
    let tls_mode = |mode: &str| xds_api::pbwkt::Struct {
        fields: [(
            TLS_MODE_KEY.to_owned(),
            xds_api::pbwkt::Value {
                kind: Some(xds_api::pbwkt::value::Kind::StringValue(mode.to_owned())),
            },
        )]
        .into(),
    };
    use xds_api::envoy::config::cluster::v3::cluster::TransportSocketMatch;
    cw.cluster.transport_socket_matches = vec![
        TransportSocketMatch {
            name: "tlsMode-istio".into(),
            r#match: Some(tls_mode("istio")),
            transport_socket: Some(istio),
        },
        TransportSocketMatch {
            name: "tlsMode-disabled".into(),
            r#match: Some(xds_api::pbwkt::Struct::default()),
            transport_socket: Some(crate::mtls::raw_buffer()),
        },
    ];
}

/// The SNI of an ISTIO_MUTUAL cluster: `outbound_.<port>_.<subset>_.<host>`.
fn istio_sni(cluster: &str) -> String {
    match crate::names::parse_subset_key(cluster) {
        Some((direction, subset, host, port)) => crate::names::dns_srv_subset_key(direction, subset, host, port),
        None => cluster.to_owned(),
    }
}

/// The key of endpoint metadata `envoy.transport_socket_match` (Istio's `TLSModeLabelShortname`).
pub(crate) const TLS_MODE_KEY: &str = "tlsMode";

/// The SPIFFE identities of the destination (Istio's `push.ServiceAccounts` plus a
/// ServiceEntry's `subjectAltNames`): those of its endpoints, sorted.
fn service_accounts(b: &Builder<'_>) -> Vec<String> {
    let key = model::ServiceKey::new(b.service.hostname.clone(), b.service.namespace());
    let mut out: Vec<String> = b
        .push
        .registry()
        .endpoints_of(&key)
        .iter()
        .map(|e| e.service_account.clone())
        .filter(|sa| !sa.is_empty())
        .chain(b.service.attributes.service_accounts.iter().cloned())
        .collect();
    out.sort();
    out.dedup();
    out
}

fn is_empty(s: &Option<String>) -> bool {
    s.as_deref().is_none_or(str::is_empty)
}

fn upstream_tls_context(
    cw: &mut ClusterWrapper,
    settings: &ClientTlsSettings,
    credential: Option<&str>,
    mutual: bool,
) -> tls::UpstreamTlsContext {
    let sni = settings.sni.clone().unwrap_or_default();
    let insecure = settings.insecure_skip_verify == Some(true);
    set_auto_sni_and_san_validation(cw, &sni, &settings.subject_alt_names, insecure);
    let mut common = tls::CommonTlsContext {
        tls_params: Some(tls::TlsParameters {
            tls_minimum_protocol_version: tls::tls_parameters::TlsProtocol::TlSv12 as i32,
            tls_maximum_protocol_version: tls::tls_parameters::TlsProtocol::TlSv13 as i32,
            ..Default::default()
        }),
        ..Default::default()
    };
    let san_matchers = subject_alt_name_matchers(&settings.subject_alt_names);
    use tls::common_tls_context::ValidationContextType;
    match credential {
        Some(name) => {
            let resource = crate::sds::resource_name(name);
            if mutual {
                common.tls_certificate_sds_secret_configs.push(ads_secret(&resource));
            }
            if !insecure {
                common.validation_context_type = Some(ValidationContextType::CombinedValidationContext(
                    tls::common_tls_context::CombinedCertificateValidationContext {
                        default_validation_context: Some(tls::CertificateValidationContext {
                            match_typed_subject_alt_names: san_matchers,
                            ..Default::default()
                        }),
                        validation_context_sds_secret_config: Some(ads_secret(&format!("{resource}{SDS_CA_SUFFIX}"))),
                        ..Default::default()
                    },
                ));
            }
        }
        None => {
            if mutual {
                common.tls_certificates.push(tls::TlsCertificate {
                    certificate_chain: file(settings.client_certificate.as_deref()),
                    private_key: file(settings.private_key.as_deref()),
                    ..Default::default()
                });
            }
            let validation = if insecure {
                tls::CertificateValidationContext::default()
            } else {
                let ca = settings
                    .ca_certificates
                    .as_deref()
                    .filter(|c| !c.is_empty())
                    .unwrap_or(SYSTEM_CA_BUNDLE);
                tls::CertificateValidationContext {
                    trusted_ca: file(Some(ca)),
                    match_typed_subject_alt_names: san_matchers,
                    crl: settings
                        .ca_crl
                        .as_deref()
                        .filter(|c| !c.is_empty())
                        .and_then(|c| file(Some(c))),
                    ..Default::default()
                }
            };
            common.validation_context_type = Some(ValidationContextType::ValidationContext(validation));
        }
    }
    if cw.is_http2() {
        common.alpn_protocols = vec!["h2".into()];
    }
    tls::UpstreamTlsContext {
        common_tls_context: Some(common),
        sni,
        ..Default::default()
    }
}

/// Istio's `setAutoSniAndAutoSanValidation`: without an explicit SNI Envoy sends the request's
/// host as SNI, and (unless SANs are given or verification is skipped) checks the certificate
/// against it.
fn set_auto_sni_and_san_validation(cw: &mut ClusterWrapper, sni: &str, sans: &[String], insecure: bool) {
    if !sni.is_empty() {
        return;
    }
    let options = cw
        .http_options()
        .upstream_http_protocol_options
        .get_or_insert_with(Default::default);
    options.auto_sni = true;
    if sans.is_empty() && !insecure {
        options.auto_san_validation = true;
    }
}

/// SAN matchers: `spiffe://` and other URIs match URI SANs, IPs match IP SANs, the rest DNS SANs.
fn subject_alt_name_matchers(sans: &[String]) -> Vec<tls::SubjectAltNameMatcher> {
    sans.iter()
        .map(|san| {
            let san_type = if san.contains("://") {
                tls::subject_alt_name_matcher::SanType::Uri
            } else if san.parse::<std::net::IpAddr>().is_ok() {
                tls::subject_alt_name_matcher::SanType::IpAddress
            } else {
                tls::subject_alt_name_matcher::SanType::Dns
            };
            tls::SubjectAltNameMatcher {
                san_type: san_type as i32,
                matcher: Some(StringMatcher {
                    match_pattern: Some(MatchPattern::Exact(san.clone())),
                    ..Default::default()
                }),
                ..Default::default()
            }
        })
        .collect()
}

/// Istio's `SDSAdsConfig`: a secret pilot-discovery serves on the proxy's ADS stream.
fn ads_secret(name: &str) -> tls::SdsSecretConfig {
    tls::SdsSecretConfig {
        name: name.to_owned(),
        sds_config: Some(core::ConfigSource {
            config_source_specifier: Some(core::config_source::ConfigSourceSpecifier::Ads(
                core::AggregatedConfigSource {},
            )),
            resource_api_version: core::ApiVersion::V3 as i32,
            ..Default::default()
        }),
    }
}

fn file(path: Option<&str>) -> Option<core::DataSource> {
    path.map(|p| core::DataSource {
        specifier: Some(core::data_source::Specifier::Filename(p.to_owned())),
        ..Default::default()
    })
}
