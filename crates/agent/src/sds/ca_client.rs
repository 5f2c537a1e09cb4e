//! The agent's CA client (Istio's `citadel` CA client, security/pkg/nodeagent/caclient): a new
//! ECDSA P-256 key, a CSR naming the workload's SPIFFE identity, sent with the pod's service
//! account token to `CA_ADDR` over TLS verified with the mesh root.

use std::path::PathBuf;
use std::time::Duration;

use istio_api::ca::IstioCertificateRequest;
use istio_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use rcgen::{CertificateParams, KeyPair, SanType};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why no certificate came back.
#[derive(Debug, thiserror::Error)]
pub enum CaClientError {
    #[error("generating the workload key or CSR: {0}")]
    Key(String),
    #[error("reading {path}: {source}")]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("CA {addr}: {reason}")]
    Connect { addr: String, reason: String },
    #[error("CA {addr} refused the CSR: {status}")]
    Refused { addr: String, status: tonic::Status },
    #[error("CA {addr} answered {reason}")]
    Answer { addr: String, reason: String },
}

/// A signed workload certificate and its key.
#[derive(Clone)]
pub struct Signed {
    /// Leaf and intermediates, PEM.
    pub cert_chain_pem: String,
    /// PKCS#8, PEM.
    pub key_pem: String,
    /// The last element of the CA's answer.
    pub root_pem: String,
}

impl std::fmt::Debug for Signed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signed")
            .field("cert_chain_pem", &self.cert_chain_pem)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone)]
pub struct CaClient {
    /// `host:port`.
    pub addr: String,
    /// The mesh root that the CA's serving certificate chains to.
    pub root_cert: PathBuf,
    /// The name checked on the CA's certificate.
    pub server_name: String,
    /// The service account token sent as `authorization: Bearer`; re-read for each request.
    pub token: Option<PathBuf>,
}

impl CaClient {
    /// Asks for a certificate of `identity` valid for `ttl`.
    pub async fn sign(&self, identity: &str, ttl: Duration) -> Result<Signed, CaClientError> {
        let key =
            KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(|e| CaClientError::Key(e.to_string()))?;
        let mut params = CertificateParams::default();
        let uri = identity
            .to_owned()
            .try_into()
            .map_err(|e| CaClientError::Key(format!("identity {identity:?}: {e}")))?;
        params.subject_alt_names = vec![SanType::URI(uri)];
        let csr = params
            .serialize_request(&key)
            .and_then(|r| r.pem())
            .map_err(|e| CaClientError::Key(e.to_string()))?;
        let root = tokio::fs::read(&self.root_cert)
            .await
            .map_err(|source| CaClientError::File {
                path: self.root_cert.clone(),
                source,
            })?;
        let connect = |reason: String| CaClientError::Connect {
            addr: self.addr.clone(),
            reason,
        };
        let tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(root))
            .domain_name(self.server_name.clone());
        let channel = Endpoint::from_shared(format!("https://{}", self.addr))
            .map_err(|e| connect(e.to_string()))?
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .tls_config(tls)
            .map_err(|e| connect(e.to_string()))?
            .connect()
            .await
            .map_err(|e| connect(format!("{e:?}")))?;
        let mut request = tonic::Request::new(IstioCertificateRequest {
            csr,
            validity_duration: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
            metadata: None,
        });
        if let Some(path) = &self.token {
            let token = tokio::fs::read_to_string(path)
                .await
                .map_err(|source| CaClientError::File {
                    path: path.clone(),
                    source,
                })?;
            let value = format!("Bearer {}", token.trim())
                .parse()
                .map_err(|_| CaClientError::Key(format!("the token in {} is not a header value", path.display())))?;
            request.metadata_mut().insert("authorization", value);
        }
        let chain = IstioCertificateServiceClient::new(channel)
            .create_certificate(request)
            .await
            .map_err(|status| CaClientError::Refused {
                addr: self.addr.clone(),
                status,
            })?
            .into_inner()
            .cert_chain;
        let Some((root, certs)) = chain.split_last().filter(|(_, certs)| !certs.is_empty()) else {
            return Err(CaClientError::Answer {
                addr: self.addr.clone(),
                reason: format!(
                    "{} certificates; want the leaf, any intermediates and the root",
                    chain.len()
                ),
            });
        };
        let mut cert_chain_pem = String::new();
        for c in certs {
            cert_chain_pem.push_str(c.trim_end());
            cert_chain_pem.push('\n');
        }
        Ok(Signed {
            cert_chain_pem,
            key_pem: key.serialize_pem(),
            root_pem: root.trim_end().to_owned() + "\n",
        })
    }
}
