//! xDS over TLS on `--secureGrpcAddr` (Istio's 15012): the mesh CA from `ROOT_CA_DIR`, istiod's
//! serving certificate signed by it for istiod's DNS names (Istio's `getDNSNames` in
//! `pilot/pkg/bootstrap/server.go`), and the ADS service served with it.
//!
//! Clients verify istiod with the mesh root, `$ROOT_CA_DIR/root-cert.pem` (Istio distributes it
//! as the `istio-ca-root-cert` ConfigMap). No client certificate is asked for: Istio
//! authenticates proxies on 15012 by their JWT, which is not checked here yet.

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use ca::{CertificateAuthority, IssuedCert};
use environment::Environment;
use model::MeshConfig;
use tokio::net::TcpListener;
use tonic::transport::{Identity, ServerTlsConfig};
use xds_server::AdsService;

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
        Ok(CaSettings {
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

/// istiod's serving certificate, signed by the mesh CA, ready to serve. (Signing workload CSRs on
/// this port, Istio's `IstioCertificateService`, will keep the `CertificateAuthority` here.)
pub struct SecureGrpc {
    cert: IssuedCert,
    addr: SocketAddr,
}

impl SecureGrpc {
    /// Loads (or creates) the mesh CA of `ROOT_CA_DIR` and signs istiod's certificate for
    /// serving on `addr`.
    pub fn init(
        addr: SocketAddr,
        mesh: &MeshConfig,
        namespace: &str,
        get: impl Fn(&str) -> Option<String>,
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
        Ok(SecureGrpc { cert, addr })
    }

    /// Serves `ads` over TLS on `listener` until the server fails.
    pub async fn serve(
        self,
        builder: tonic::transport::Server,
        listener: TcpListener,
        ads: AdsService<Environment>,
    ) -> anyhow::Result<()> {
        let tls = ServerTlsConfig::new().identity(Identity::from_pem(&self.cert.cert_chain_pem, &self.cert.key_pem));
        let addr = listener.local_addr().unwrap_or(self.addr);
        let server = builder
            .tls_config(tls)
            .with_context(|| format!("--secureGrpcAddr {addr}: TLS configuration"))?
            .add_service(ads);
        tracing::info!(%addr, "xDS (TLS) listening");
        tracing::warn!(
            %addr,
            "--secureGrpcAddr: proxies are not authenticated yet (their JWT is not verified); any client that \
             trusts the mesh root can fetch config"
        );
        server
            .serve_with_incoming(crate::server::incoming(listener))
            .await
            .with_context(|| format!("--secureGrpcAddr {addr}: gRPC server"))
    }
}

#[cfg(test)]
mod tests;
