//! The agent's CA client (Istio's `citadel` CA client, security/pkg/nodeagent/caclient, chosen
//! by `createCitadel` in pkg/istio-agent/plugins.go): a new workload key, a CSR naming the
//! workload's SPIFFE identity, sent with the pod's service account token (when the file is there,
//! as Istio's token provider) to `CA_ADDR`: in plaintext when that address ends in `:15010`
//! (Istio's "Debug mode or IP-secure network"; pilot-discovery serves its CA there when it runs
//! with `--secureGrpcAddr ""`), otherwise over TLS verified with the mesh root.

use std::path::PathBuf;
use std::time::Duration;

use istio_api::ca::IstioCertificateRequest;
use istio_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use rcgen::{CertificateParams, KeyPair, SanType};

use crate::config::WorkloadKey;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint};

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Istio's plaintext port: a CA address on it is reached without TLS.
pub(super) const PLAINTEXT_CA_PORT_SUFFIX: &str = ":15010";

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
    /// The CA is reached over TLS and the root that verifies it cannot be read.
    #[error("CA {addr} (TLS): reading its root certificate {path}: {source}")]
    RootCert {
        addr: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("CA {addr}: {reason}")]
    Connect { addr: String, reason: String },
    /// `token`: the token file sent, `None` when there was none.
    #[error("CA {addr} refused the CSR: {status}")]
    Refused {
        addr: String,
        status: tonic::Status,
        token: Option<PathBuf>,
    },
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

/// How the CA's serving certificate is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaTls {
    /// The mesh root that the CA's serving certificate chains to (`XDS_ROOT_CA`).
    pub root_cert: PathBuf,
    /// The name checked on the CA's certificate.
    pub server_name: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaClient {
    /// `host:port`.
    pub addr: String,
    /// `None`: plaintext (the address is on port 15010).
    pub tls: Option<CaTls>,
    /// The service account token sent as `authorization: Bearer`, read for each request; no
    /// header when the file is not there (another credential may do, as in Istio).
    pub token: PathBuf,
}

impl CaClient {
    /// Istio's choice: plaintext exactly when `addr` ends in `:15010`, else TLS with `tls`.
    pub fn new(addr: &str, tls: CaTls, token: PathBuf) -> CaClient {
        CaClient {
            addr: addr.to_owned(),
            tls: (!addr.ends_with(PLAINTEXT_CA_PORT_SUFFIX)).then_some(tls),
            token,
        }
    }
}

/// A new workload key: ECDSA P-256/P-384 (ring), or RSA made with the `rsa` crate and signed
/// with by ring (PKCS#1 v1.5 SHA-256, as Go's x509 signs Istio's CSRs).
pub(super) fn generate_key(kind: WorkloadKey) -> Result<KeyPair, CaClientError> {
    let key = match kind {
        WorkloadKey::EcdsaP256 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256),
        WorkloadKey::EcdsaP384 => KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384),
        WorkloadKey::Rsa(bits) => {
            use rsa::pkcs8::EncodePrivateKey;
            let private = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, bits as usize)
                .map_err(|e| CaClientError::Key(format!("RSA {bits}: {e}")))?;
            let der = private
                .to_pkcs8_der()
                .map_err(|e| CaClientError::Key(format!("RSA {bits}: {e}")))?;
            KeyPair::try_from(der.as_bytes())
        }
    };
    key.map_err(|e| CaClientError::Key(e.to_string()))
}

impl CaClient {
    /// Asks for a certificate of `identity` valid for `ttl`, for a new key of kind `key`.
    pub async fn sign(&self, identity: &str, ttl: Duration, key: WorkloadKey) -> Result<Signed, CaClientError> {
        // RSA keys take a while to make: off the async threads
        let key = tokio::task::spawn_blocking(move || generate_key(key))
            .await
            .map_err(|e| CaClientError::Key(e.to_string()))??;
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
        let connect = |reason: String| CaClientError::Connect {
            addr: self.addr.clone(),
            reason,
        };
        let endpoint = match &self.tls {
            None => Endpoint::from_shared(format!("http://{}", self.addr)).map_err(|e| connect(e.to_string()))?,
            Some(tls) => {
                let root = tokio::fs::read(&tls.root_cert)
                    .await
                    .map_err(|source| CaClientError::RootCert {
                        addr: self.addr.clone(),
                        path: tls.root_cert.clone(),
                        source,
                    })?;
                let config = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(root))
                    .domain_name(tls.server_name.clone());
                Endpoint::from_shared(format!("https://{}", self.addr))
                    .map_err(|e| connect(e.to_string()))?
                    .tls_config(config)
                    .map_err(|e| connect(e.to_string()))?
            }
        };
        let channel = endpoint
            .connect_timeout(CONNECT_TIMEOUT)
            .timeout(REQUEST_TIMEOUT)
            .connect()
            .await
            .map_err(|e| connect(source_chain(&e)))?;
        let mut request = tonic::Request::new(IstioCertificateRequest {
            csr,
            validity_duration: i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX),
            metadata: None,
        });
        let token = match tokio::fs::read_to_string(&self.token).await {
            Ok(token) => Some(token),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(source) => {
                return Err(CaClientError::File {
                    path: self.token.clone(),
                    source,
                });
            }
        };
        if let Some(token) = &token {
            let value = format!("Bearer {}", token.trim()).parse().map_err(|_| {
                CaClientError::Key(format!("the token in {} is not a header value", self.token.display()))
            })?;
            request.metadata_mut().insert("authorization", value);
        }
        let chain = IstioCertificateServiceClient::new(channel)
            .create_certificate(request)
            .await
            .map_err(|status| CaClientError::Refused {
                addr: self.addr.clone(),
                status,
                token: token.is_some().then(|| self.token.clone()),
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

/// An error and its sources on one line (tonic's transport errors say little at the top).
fn source_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        next = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use rcgen::PublicKeyData;
    use x509_parser::prelude::{FromDer, X509Certificate};

    use super::*;

    /// The CSR of each key kind is signed by the mesh CA, and the certificate carries that key.
    #[test]
    fn ecdsa_and_rsa_workload_keys_are_signed_by_the_mesh_ca() {
        let dir = tempfile::tempdir().unwrap();
        let ca = ca::CertificateAuthority::load_or_create(dir.path(), "cluster.local").unwrap();
        let id = "spiffe://cluster.local/ns/default/sa/reviews";
        for (kind, oid) in [
            (WorkloadKey::EcdsaP256, "1.2.840.10045.2.1"),
            (WorkloadKey::EcdsaP384, "1.2.840.10045.2.1"),
            (WorkloadKey::Rsa(2048), "1.2.840.113549.1.1.1"),
        ] {
            let key = generate_key(kind).unwrap();
            let mut params = CertificateParams::default();
            params.subject_alt_names = vec![SanType::URI(id.to_owned().try_into().unwrap())];
            let csr = params.serialize_request(&key).unwrap().pem().unwrap();
            let chain = ca
                .sign_csr(&csr, &[id.to_owned()], 3600, ca::WorkloadTtl::default())
                .unwrap_or_else(|e| panic!("{kind:?}: {e}"));
            let (_, pem) = x509_parser::pem::parse_x509_pem(chain[0].as_bytes()).unwrap();
            let (_, cert) = X509Certificate::from_der(&pem.contents).unwrap();
            assert_eq!(cert.public_key().algorithm.algorithm.to_id_string(), oid, "{kind:?}");
            assert_eq!(
                cert.public_key().raw,
                key.subject_public_key_info().as_slice(),
                "{kind:?}"
            );
            if let WorkloadKey::Rsa(bits) = kind {
                assert!(key.serialize_pem().starts_with("-----BEGIN PRIVATE KEY-----"));
                assert!(key.subject_public_key_info().len() > bits as usize / 8);
            }
        }
    }
}
