//! The agent's CA client (Istio's `citadel` CA client, security/pkg/nodeagent/caclient): a new
//! ECDSA P-256 key, a CSR naming the workload's SPIFFE identity, sent with the pod's service
//! account token to `CA_ADDR` over TLS verified with the mesh root.

use std::path::PathBuf;
use std::time::Duration;

use istio_api::ca::IstioCertificateRequest;
use istio_api::ca::istio_certificate_service_client::IstioCertificateServiceClient;
use rcgen::{CertificateParams, KeyPair, SanType};

use crate::config::WorkloadKey;
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

/// A new workload key: ECDSA P-256/P-384 (ring), or RSA made with the `rsa` crate and signed
/// with by ring (PKCS#1 v1.5 SHA-256, as Go's x509 signs Istio's CSRs).
pub fn generate_key(kind: WorkloadKey) -> Result<KeyPair, CaClientError> {
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
