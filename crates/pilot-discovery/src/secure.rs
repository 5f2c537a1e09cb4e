//! The secure gRPC port, `--secureGrpcAddr` (Istio's 15012): the mesh CA from `ROOT_CA_DIR`,
//! istiod's serving certificate signed by it for istiod's DNS names (Istio's `getDNSNames` in
//! `pilot/pkg/bootstrap/server.go`), and on it the CA's `IstioCertificateService` and ADS.
//!
//! Clients verify istiod with the mesh root, `$ROOT_CA_DIR/root-cert.pem` (Istio distributes it
//! as the `istio-ca-root-cert` ConfigMap). Callers authenticate as istiod's: a bearer JWT checked
//! by `JWT_RULE`, or a workload certificate of this CA (asked for, not required, in the TLS
//! handshake). Both the CA and ADS refuse unauthenticated callers; ADS serves a caller only the
//! proxies of the identities it proved.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use ca::{CertificateAuthority, IssuedCert, WorkloadTtl};
use environment::Environment;
use model::MeshConfig;
use rustls::pki_types::CertificateDer;
use security::{AuthContext, Authenticator, CaMetrics, CaService, ClientCertAuthenticator, JwtAuthenticator, JwtRule};
use tokio::net::TcpListener;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use xds_server::{AdsService, StreamAuthenticator};

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

/// istiod's DNS names and IPs: Istio's `getDNSNames` (the host of the mesh's discovery address,
/// `ISTIOD_CUSTOM_HOST`, `istiod`, `istiod-remote`, `istio-pilot` and `istiod-<revision>` in
/// `<namespace>.svc`), plus, for clients on this machine, `localhost`, 127.0.0.1, ::1 and the
/// address listened on when it is a specific one.
pub fn istiod_names(
    settings: &CaSettings,
    mesh: &MeshConfig,
    namespace: &str,
    listen: SocketAddr,
) -> (Vec<String>, Vec<IpAddr>) {
    let mut dns: BTreeSet<String> = settings.custom_hosts.iter().cloned().collect();
    let mut ips = vec![IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V6(Ipv6Addr::LOCALHOST)];
    let mut add_ip = |ip: IpAddr| {
        if !ip.is_unspecified() && !ips.contains(&ip) {
            ips.push(ip);
        }
    };
    let host = discovery_host(&mesh.default_config.discovery_address);
    match host.parse::<IpAddr>() {
        Ok(ip) => add_ip(ip),
        Err(_) if !host.is_empty() => {
            dns.insert(host.to_owned());
        }
        Err(_) => {}
    }
    let mut known = vec!["istiod".to_owned(), "istiod-remote".into(), "istio-pilot".into()];
    if !settings.revision.is_empty() && settings.revision != "default" {
        known.push(format!("istiod-{}", settings.revision));
    }
    dns.extend(known.iter().map(|k| format!("{k}.{namespace}.svc")));
    dns.insert("localhost".into());
    add_ip(listen.ip());
    (dns.into_iter().collect(), ips)
}

/// `host` of `host:port`, `[v6]:port` or a bare host.
fn discovery_host(address: &str) -> &str {
    if let Some(rest) = address.strip_prefix('[') {
        return rest.split(']').next().unwrap_or_default();
    }
    match address.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') && port.parse::<u16>().is_ok() => host,
        _ => address,
    }
}

/// istiod's serving certificate, the mesh CA and the authenticators of its callers, ready to serve.
pub struct SecureGrpc {
    cert: IssuedCert,
    addr: SocketAddr,
    ca: Arc<CertificateAuthority>,
    authenticators: Vec<Arc<dyn Authenticator>>,
    ca_service: CaService,
}

impl SecureGrpc {
    /// Loads (or creates) the mesh CA of `ROOT_CA_DIR` and signs istiod's certificate for
    /// serving on `addr`.
    pub fn init(
        addr: SocketAddr,
        mesh: &MeshConfig,
        namespace: &str,
        get: impl Fn(&str) -> Option<String>,
        registry: &mut prometheus_client::registry::Registry,
        kube: Option<kube::Client>,
    ) -> anyhow::Result<SecureGrpc> {
        let settings = CaSettings::from_env(get)?;
        let dir = &settings.root_ca_dir;
        let ca = CertificateAuthority::load_or_create(dir, &mesh.trust_domain).with_context(|| {
            format!(
                "--secureGrpcAddr {addr}: the mesh CA in ROOT_CA_DIR={} (--secureGrpcAddr \"\" serves xDS in \
                 plaintext only, without a CA)",
                dir.display()
            )
        })?;
        let (dns, ips) = istiod_names(&settings, mesh, namespace, addr);
        let cert = ca
            .issue_server_cert(&dns, &ips, settings.self_signed_ca_cert_ttl)
            .with_context(|| format!("--secureGrpcAddr {addr}: signing istiod's certificate"))?;
        tracing::info!(
            root_cert = %ca.root_cert_file().display(),
            source = ?ca.source(),
            trust_domain = %mesh.trust_domain,
            ?dns,
            ?ips,
            "mesh CA ready; clients of --secureGrpcAddr verify istiod with the root certificate in root_cert"
        );
        let ca = Arc::new(ca);
        let mut authenticators: Vec<Arc<dyn Authenticator>> = vec![Arc::new(ClientCertAuthenticator)];
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
            None if authenticators.len() == 1 => tracing::warn!(
                "no cluster and no JWT_RULE: callers of --secureGrpcAddr can authenticate only with a workload certificate of the mesh CA"
            ),
            None => {}
        }
        let ca_service = CaService::new(
            ca.clone(),
            authenticators.clone(),
            settings.workload_ttl,
            CaMetrics::register(registry),
        );
        Ok(SecureGrpc {
            cert,
            addr,
            ca,
            authenticators,
            ca_service,
        })
    }

    /// The mesh root, PEM.
    pub fn root_pem(&self) -> String {
        self.ca.root_cert_pem().to_owned()
    }

    /// Serves the CA and `ads` over TLS on `listener` until the server fails.
    pub async fn serve(
        self,
        builder: tonic::transport::Server,
        listener: TcpListener,
        ads: AdsService<Environment>,
    ) -> anyhow::Result<()> {
        let tls = ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert.cert_chain_pem, &self.cert.key_pem))
            .client_ca_root(Certificate::from_pem(self.ca.root_cert_pem()))
            .client_auth_optional(true);
        let addr = listener.local_addr().unwrap_or(self.addr);
        let ads = ads.authenticated(Arc::new(XdsAuthenticator(Arc::new(self.authenticators))));
        let server = builder
            .tls_config(tls)
            .with_context(|| format!("--secureGrpcAddr {addr}: TLS configuration"))?
            .add_service(self.ca_service.into_server())
            .add_service(ads);
        tracing::info!(%addr, "CA and xDS (TLS) listening");
        server
            .serve_with_incoming(crate::server::incoming(listener))
            .await
            .with_context(|| format!("--secureGrpcAddr {addr}: gRPC server"))
    }
}

/// ADS streams on the secure port authenticate as CSRs do.
struct XdsAuthenticator(Arc<Vec<Arc<dyn Authenticator>>>);

impl StreamAuthenticator for XdsAuthenticator {
    fn authenticate(
        &self,
        headers: tonic::codegen::http::HeaderMap,
        peer_certs: Option<Arc<Vec<CertificateDer<'static>>>>,
        peer: Option<SocketAddr>,
    ) -> tonic::codegen::BoxFuture<Vec<String>, String> {
        let authenticators = self.0.clone();
        Box::pin(async move {
            let ctx = AuthContext::from_http(&headers, peer_certs, peer);
            security::authenticate(&authenticators, &ctx)
                .await
                .map(|caller| caller.identities)
                .map_err(|e| e.to_string())
        })
    }
}

#[cfg(test)]
mod tests;
