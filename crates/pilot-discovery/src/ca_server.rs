//! The mesh CA as pilot-discovery serves it: Istio's `createIstioCA` and `RunCA`
//! (pilot/pkg/bootstrap/istio_ca.go) and `startCA` (pilot/pkg/bootstrap/server.go). The CA of
//! `ROOT_CA_DIR` (plugged-in files, or a self-signed root created and kept there) signs workload
//! CSRs through `IstioCertificateService` for callers that authenticate: a bearer token checked by
//! a Kubernetes TokenReview (with a cluster) or by `JWT_RULE`, and on the secure port a workload
//! certificate of this CA. As istiod's `startCA`, the service goes on the secure gRPC server, or
//! on the plaintext one when there is no secure server (`--secureGrpcAddr ""`); there only bearer
//! tokens can authenticate, and an unauthenticated CSR is refused as on the secure port.
//!
//! A plugged-in CA is followed on disk (`crate::cacerts`): a new intermediate under the same
//! root signs the next CSR, and istiod's serving certificate is signed again by it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ca::{CertificateAuthority, DirBundle, WorkloadTtl};
use model::MeshConfig;
use security::{Authenticator, CaMetrics, CaService, ClientCertAuthenticator, JwtAuthenticator, JwtRule};

use crate::settings::SettingsError;

/// Istio's environment for the CA and istiod's certificate.
#[derive(Debug, Clone, PartialEq)]
pub struct CaSettings {
    /// ROOT_CA_DIR: plugged-in CA files, or where the self-signed root is kept.
    pub root_ca_dir: PathBuf,
    /// ISTIOD_CUSTOM_HOST: more DNS names for istiod's certificate, comma separated.
    pub custom_hosts: Vec<String>,
    /// REVISION: istiod's revision; adds `istiod-<revision>.<namespace>.svc`.
    pub revision: String,
    /// CITADEL_SELF_SIGNED_CA_CERT_TTL: lifetime of a new self-signed root, and (as Istio) of
    /// istiod's own certificate.
    pub self_signed_ca_cert_ttl: Duration,
    /// DEFAULT_WORKLOAD_CERT_TTL (24h) and MAX_WORKLOAD_CERT_TTL (90d).
    pub workload_ttl: WorkloadTtl,
    /// JWT_RULE: how bearer tokens are checked without a cluster.
    pub jwt_rule: Option<JwtRule>,
    /// TOKEN_AUDIENCES (`istio-ca`): the audiences a token must name.
    pub token_audiences: Vec<String>,
}

impl CaSettings {
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<CaSettings, SettingsError> {
        let ttl = match get("CITADEL_SELF_SIGNED_CA_CERT_TTL").filter(|v| !v.is_empty()) {
            None => ca::DEFAULT_SELF_SIGNED_CA_CERT_TTL,
            Some(v) => match model::duration::parse(&v) {
                Some(d) if !d.is_zero() => d,
                _ => {
                    return Err(SettingsError {
                        name: "CITADEL_SELF_SIGNED_CA_CERT_TTL",
                        value: v,
                        reason: "not a positive duration (e.g. 87600h)",
                    });
                }
            },
        };
        let duration = |name: &'static str, default: Duration| -> Result<Duration, SettingsError> {
            match get(name).filter(|v| !v.is_empty()) {
                None => Ok(default),
                Some(v) => match model::duration::parse(&v) {
                    Some(d) if !d.is_zero() => Ok(d),
                    _ => Err(SettingsError {
                        name,
                        value: v,
                        reason: "not a positive duration (e.g. 24h)",
                    }),
                },
            }
        };
        let defaults = WorkloadTtl::default();
        let workload_ttl = WorkloadTtl {
            default: duration("DEFAULT_WORKLOAD_CERT_TTL", defaults.default)?,
            max: duration("MAX_WORKLOAD_CERT_TTL", defaults.max)?,
        };
        let jwt_rule = match get("JWT_RULE").filter(|v| !v.trim().is_empty()) {
            None => None,
            Some(v) => Some(JwtRule::parse(&v).map_err(|_| SettingsError {
                name: "JWT_RULE",
                value: v,
                reason: "not a JWT rule: JSON with issuer, and jwksUri or jwks, and audiences",
            })?),
        };
        let token_audiences: Vec<String> = get("TOKEN_AUDIENCES")
            .unwrap_or_else(|| "istio-ca".into())
            .split(',')
            .map(str::trim)
            .filter(|a| !a.is_empty())
            .map(String::from)
            .collect();
        Ok(CaSettings {
            workload_ttl,
            jwt_rule,
            token_audiences,
            root_ca_dir: get("ROOT_CA_DIR")
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| "./etc/cacerts".into())
                .into(),
            custom_hosts: get("ISTIOD_CUSTOM_HOST")
                .unwrap_or_default()
                .split(',')
                .map(str::trim)
                .filter(|h| !h.is_empty())
                .map(String::from)
                .collect(),
            revision: get("REVISION").unwrap_or_default(),
            self_signed_ca_cert_ttl: ttl,
        })
    }
}

/// Where the CA's service is served, which decides how callers can authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaTransport {
    /// `--secureGrpcAddr`: bearer tokens, and workload certificates of this CA.
    Secure,
    /// `--grpcAddr` when there is no secure port: bearer tokens only.
    Plaintext,
}

/// The mesh CA, who may call it, and its gRPC service, ready to be added to a gRPC server.
pub struct MeshCaServer {
    pub settings: CaSettings,
    /// The current CA: a new one when the plugged-in files are replaced (`crate::cacerts`).
    pub ca: crate::cacerts::CaWatch,
    /// Also those of ADS on the secure port.
    pub authenticators: Vec<Arc<dyn Authenticator>>,
    pub service: CaService,
}

impl MeshCaServer {
    /// Loads (or creates) the mesh CA and the authenticators of its callers: the plugged-in CA
    /// of `ROOT_CA_DIR` when there is one; else, with a cluster, the self-signed root every
    /// replica shares in the `istio-ca-secret` Secret of `namespace` (`crate::ca_secret`); else
    /// the self-signed root kept in `ROOT_CA_DIR`. `served_on` names the flag and address it is
    /// served on, for errors and logs.
    pub async fn init(
        transport: CaTransport,
        served_on: &str,
        mesh: &MeshConfig,
        namespace: &str,
        get: impl Fn(&str) -> Option<String>,
        registry: &mut prometheus_client::registry::Registry,
        kube: Option<kube::Client>,
    ) -> anyhow::Result<MeshCaServer> {
        let settings = CaSettings::from_env(get)?;
        let dir = &settings.root_ca_dir;
        let in_dir = || format!("{served_on}: the mesh CA in ROOT_CA_DIR={}", dir.display());
        let local = ca::dir_bundle(dir).with_context(in_dir)?;
        let ca = match (&kube, &local) {
            (Some(client), DirBundle::SelfSigned(_) | DirBundle::Empty) => {
                let ttl = settings.self_signed_ca_cert_ttl;
                let (root, _) =
                    crate::ca_secret::shared_root(client.clone(), namespace, &mesh.trust_domain, &local, ttl)
                        .await
                        .with_context(|| {
                            format!("{served_on}: the mesh CA's root in Secret {namespace}/istio-ca-secret")
                        })?;
                crate::ca_secret::mirror(dir, &local, &root);
                CertificateAuthority::from_self_signed_pem(dir, &root, ca::CaSource::SharedSecret)
                    .with_context(|| format!("{served_on}: the mesh CA's root in Secret {namespace}/istio-ca-secret"))?
            }
            _ => CertificateAuthority::load_or_create(dir, &mesh.trust_domain).with_context(in_dir)?,
        };
        let mut authenticators: Vec<Arc<dyn Authenticator>> = Vec::new();
        if transport == CaTransport::Secure {
            authenticators.push(Arc::new(ClientCertAuthenticator));
        }
        if let Some(client) = kube {
            tracing::info!(audiences = ?settings.token_audiences, "bearer tokens are checked by Kubernetes TokenReviews");
            authenticators.push(Arc::new(crate::token_review::TokenReviewAuthenticator::new(
                client,
                settings.token_audiences.clone(),
                &mesh.trust_domain,
            )));
        }
        match &settings.jwt_rule {
            Some(rule) => {
                tracing::info!(issuer = %rule.issuer, "JWT_RULE: bearer tokens of this issuer authenticate callers");
                authenticators.push(Arc::new(JwtAuthenticator::new(
                    rule.clone(),
                    settings.token_audiences.clone(),
                    &mesh.trust_domain,
                )));
            }
            None if transport == CaTransport::Plaintext && authenticators.is_empty() => tracing::warn!(
                "no cluster and no JWT_RULE: the CA on {served_on} can authenticate no caller and refuses every \
                 CSR; set JWT_RULE to the issuer of the agents' tokens (scripts/dev-token.py rule makes one)"
            ),
            None if authenticators.len() == 1 => tracing::warn!(
                "no cluster and no JWT_RULE: callers of {served_on} can authenticate only with a workload \
                 certificate of the mesh CA"
            ),
            None => {}
        }
        tracing::info!(
            root_cert = %ca.root_cert_file().display(),
            source = ?ca.source(),
            trust_domain = %mesh.trust_domain,
            "mesh CA ready on {served_on}"
        );
        let ca_metrics = CaMetrics::register(registry);
        let reloads = crate::cacerts::ReloadMetrics::register(registry);
        let ca = crate::cacerts::follow(ca, reloads, ca_metrics.clone());
        let service = CaService::following(ca.clone(), authenticators.clone(), settings.workload_ttl, ca_metrics);
        Ok(MeshCaServer {
            settings,
            ca,
            authenticators,
            service,
        })
    }

    /// The current CA.
    pub fn current(&self) -> Arc<CertificateAuthority> {
        self.ca.borrow().clone()
    }

    /// The mesh root, PEM (a reload never changes it).
    pub fn root_pem(&self) -> String {
        self.ca.borrow().root_cert_pem().to_owned()
    }
}

#[cfg(test)]
mod tests {
    use istio_api::ca::IstioCertificateRequest;
    use istio_api::ca::istio_certificate_service_server::IstioCertificateService;
    use prometheus_client::registry::Registry;

    use super::*;

    async fn init(transport: CaTransport, dir: &std::path::Path, rule: Option<String>) -> MeshCaServer {
        let dir = dir.display().to_string();
        let get = move |k: &str| match k {
            "ROOT_CA_DIR" => Some(dir.clone()),
            "JWT_RULE" => rule.clone(),
            _ => None,
        };
        MeshCaServer::init(
            transport,
            "test",
            &MeshConfig::default(),
            "istio-system",
            get,
            &mut Registry::default(),
            None,
        )
        .await
        .unwrap()
    }

    fn kinds(ca: &MeshCaServer) -> Vec<&'static str> {
        ca.authenticators.iter().map(|a| a.kind()).collect()
    }

    /// On the plaintext port only bearer tokens can authenticate (no client certificates); with
    /// no cluster and no `JWT_RULE` nothing can, and every CSR is refused: never unauthenticated
    /// signing, as istiod.
    #[tokio::test]
    async fn the_plaintext_ca_takes_bearer_tokens_only_and_without_a_rule_signs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let issuer = security::testing::TestIssuer::new("https://issuer.example.com", "k1");
        let rule = serde_json::json!({"issuer": issuer.issuer, "jwks": issuer.jwks()}).to_string();
        let secure = init(CaTransport::Secure, dir.path(), Some(rule.clone())).await;
        assert_eq!(kinds(&secure), ["ClientCertAuthenticator", "IDTokenAuthenticator"]);
        let plain = init(CaTransport::Plaintext, dir.path(), Some(rule)).await;
        assert_eq!(kinds(&plain), ["IDTokenAuthenticator"]);
        assert_eq!(plain.root_pem(), secure.root_pem(), "one CA in ROOT_CA_DIR");

        let none = init(CaTransport::Plaintext, dir.path(), None).await;
        assert!(kinds(&none).is_empty());
        let mut request = tonic::Request::new(IstioCertificateRequest {
            csr: "-----BEGIN CERTIFICATE REQUEST-----".into(),
            validity_duration: 3600,
            metadata: None,
        });
        let token = issuer.token("default", "reviews", &["istio-ca"], 600);
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        let e = none.service.create_certificate(request).await.unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated, "{e:?}");
        assert!(e.message().contains("no authenticator"), "{}", e.message());
    }
}
