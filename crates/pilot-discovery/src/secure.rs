//! The secure gRPC port, `--secureGrpcAddr` (Istio's 15012): the mesh CA from `ROOT_CA_DIR`
//! (`crate::ca_server`), istiod's serving certificate (`crate::serving_cert`: signed by the mesh
//! CA for istiod's DNS names, Istio's `getDNSNames` in `pilot/pkg/bootstrap/server.go`, or
//! external files), and on it the CA's `IstioCertificateService` and ADS.
//!
//! Clients verify istiod with the mesh root, `$ROOT_CA_DIR/root-cert.pem` (Istio distributes it
//! as the `istio-ca-root-cert` ConfigMap). Callers authenticate as istiod's: a bearer JWT checked
//! by `JWT_RULE`, or a workload certificate of this CA (asked for, not required, in the TLS
//! handshake). Both the CA and ADS refuse unauthenticated callers; ADS serves a caller only the
//! proxies of the identities it proved.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use anyhow::Context;
use environment::Environment;
use model::MeshConfig;
use rustls::pki_types::CertificateDer;
use security::{AuthContext, Authenticator};
use tokio::net::TcpListener;
use xds_server::{AdsService, StreamAuthenticator};

pub use crate::ca_server::CaSettings;
use crate::ca_server::{CaTransport, MeshCaServer};
use crate::serving_cert::{Bundles, Names, Resolver, Source};

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
    bundles: Bundles,
    addr: SocketAddr,
    ca: MeshCaServer,
}

impl SecureGrpc {
    /// Loads (or creates) the mesh CA of `ROOT_CA_DIR`, and istiod's serving certificate for
    /// `addr` from `source`: files (watched), or signed by the mesh CA (and kept fresh).
    #[allow(clippy::too_many_arguments)]
    pub async fn init(
        addr: SocketAddr,
        mesh: &MeshConfig,
        namespace: &str,
        get: impl Fn(&str) -> Option<String>,
        registry: &mut prometheus_client::registry::Registry,
        kube: Option<kube::Client>,
        source: Source,
    ) -> anyhow::Result<SecureGrpc> {
        let served_on = format!("--secureGrpcAddr {addr}");
        let ca = MeshCaServer::init(CaTransport::Secure, &served_on, mesh, namespace, get, registry, kube).await?;
        let errors = prometheus_client::metrics::counter::Counter::default();
        registry.register(
            "pilot_istiod_cert_errors",
            "Failures to sign istiod's serving certificate again or to reload it from its files \
             (the previous one keeps serving)",
            errors.clone(),
        );
        let bundles = match source {
            Source::Files(files) => {
                tracing::info!(
                    cert = %files.cert.display(),
                    key = %files.key.display(),
                    ca = %files.ca.display(),
                    "istiod's serving certificate comes from files (Istio's --tlsCertFile or ./var/run/secrets/istiod/tls)"
                );
                crate::serving_cert::watch_files(files, errors).with_context(|| served_on.clone())?
            }
            Source::Istiod => {
                let (dns, ips) = istiod_names(&ca.settings, mesh, namespace, addr);
                let names = Names {
                    dns,
                    ips,
                    ttl: ca.settings.self_signed_ca_cert_ttl,
                };
                tracing::info!(
                    root_cert = %ca.current().root_cert_file().display(),
                    dns = ?names.dns,
                    ips = ?names.ips,
                    "clients of --secureGrpcAddr verify istiod with the root certificate in root_cert"
                );
                crate::serving_cert::rotate(ca.ca.clone(), names, errors)
                    .with_context(|| format!("{served_on}: signing istiod's certificate"))?
            }
        };
        Ok(SecureGrpc { bundles, addr, ca })
    }

    /// The mesh root, PEM.
    pub fn root_pem(&self) -> String {
        self.ca.root_pem()
    }

    /// istiod's serving certificate and CA bundle, the current one and each new one.
    pub fn bundles(&self) -> Bundles {
        self.bundles.clone()
    }

    /// `REVISION` (istiod's revision), `default` when unset, as the `istio.io/rev` label says it.
    pub fn revision(&self) -> String {
        match self.ca.settings.revision.as_str() {
            "" => "default".to_owned(),
            r => r.to_owned(),
        }
    }

    /// istiod's serving certificate, for the webhooks' HTTPS port too.
    pub fn https_acceptor(&self) -> anyhow::Result<tokio_rustls::TlsAcceptor> {
        crate::accept::https_acceptor(Resolver::new(self.bundles.clone()))
    }

    /// Serves the CA and `ads` over TLS on `listener` until the server fails.
    pub async fn serve(
        self,
        mut builder: tonic::transport::Server,
        listener: TcpListener,
        setup: crate::accept::Setup,
        ca_limit: crate::ca_limits::RequestLimit,
        ads: AdsService<Environment>,
    ) -> anyhow::Result<()> {
        let addr = listener.local_addr().unwrap_or(self.addr);
        let tls = crate::accept::acceptor(Resolver::new(self.bundles.clone()), &self.ca.root_pem())
            .with_context(|| format!("--secureGrpcAddr {addr}: TLS configuration"))?;
        let ads = ads.authenticated(Arc::new(XdsAuthenticator(Arc::new(self.ca.authenticators))));
        let server = builder
            .add_service(crate::ca_limits::LimitedCa::new(self.ca.service, ca_limit))
            .add_service(ads);
        tracing::info!(%addr, "CA and xDS (TLS) listening");
        server
            .serve_with_incoming(crate::accept::tls(
                listener,
                tls,
                setup,
                crate::accept::Ready::Http2Preface,
            ))
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
