//! istiod's serving certificate as loaded (Istio's `keycertbundle.Watcher` value): the key,
//! chain and CA bundle, checked together, published on a `watch` channel and handed to rustls per
//! handshake.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// Why a bundle cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{what}: {reason}")]
    Invalid { what: String, reason: String },
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl BundleError {
    fn invalid(what: &str, reason: impl std::fmt::Display) -> BundleError {
        BundleError::Invalid {
            what: what.to_owned(),
            reason: reason.to_string(),
        }
    }
}

/// Istio's `KeyCertBundle`: istiod's certificate chain and key, and the CA bundle (PEM) that
/// its clients trust and that is patched into the webhook configurations.
pub struct KeyCertBundle {
    pub cert_chain_pem: String,
    pub key_pem: String,
    pub ca_bundle_pem: String,
    /// The leaf's serial number, hex (for logs and tests).
    pub serial: String,
    /// When the leaf was signed or loaded, and its validity.
    pub loaded_at: SystemTime,
    pub not_before: SystemTime,
    pub not_after: SystemTime,
    certified: Arc<CertifiedKey>,
}

impl std::fmt::Debug for KeyCertBundle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyCertBundle")
            .field("serial", &self.serial)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl KeyCertBundle {
    /// Checks the bundle as Go's `tls.X509KeyPair` does istiod's (a chain, a key that belongs to
    /// its leaf) and that the CA bundle holds a certificate (Istio's `VerifyCABundle`).
    pub fn new(cert_chain_pem: String, key_pem: String, ca_bundle_pem: String) -> Result<KeyCertBundle, BundleError> {
        let chain = CertificateDer::pem_slice_iter(cert_chain_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| BundleError::invalid("istiod's certificate chain", e))?;
        let Some(leaf) = chain.first() else {
            return Err(BundleError::invalid(
                "istiod's certificate chain",
                "no CERTIFICATE in it",
            ));
        };
        let (_, x509) = x509_parser::parse_x509_certificate(leaf)
            .map_err(|e| BundleError::invalid("istiod's certificate", format!("not an X.509 certificate: {e}")))?;
        let time = |t: x509_parser::time::ASN1Time| {
            let secs = u64::try_from(t.timestamp()).unwrap_or_default();
            UNIX_EPOCH + Duration::from_secs(secs)
        };
        let (not_before, not_after) = (time(x509.validity().not_before), time(x509.validity().not_after));
        let serial = x509.raw_serial_as_string().replace(':', "");
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| BundleError::invalid("istiod's private key", e))?;
        let provider = rustls::crypto::ring::default_provider();
        let certified = CertifiedKey::from_der(chain, key, &provider)
            .map_err(|e| BundleError::invalid("istiod's certificate and key", e))?;
        let mut roots = CertificateDer::pem_slice_iter(ca_bundle_pem.as_bytes());
        match roots.next() {
            Some(Ok(root)) => {
                x509_parser::parse_x509_certificate(&root)
                    .map_err(|e| BundleError::invalid("the CA bundle", format!("not an X.509 certificate: {e}")))?;
            }
            Some(Err(e)) => return Err(BundleError::invalid("the CA bundle", e)),
            None => return Err(BundleError::invalid("the CA bundle", "no CERTIFICATE in it")),
        }
        Ok(KeyCertBundle {
            cert_chain_pem,
            key_pem,
            ca_bundle_pem,
            serial,
            loaded_at: SystemTime::now(),
            not_before,
            not_after,
            certified: Arc::new(certified),
        })
    }
}

/// Istio's `keycertbundle.Watcher`: the latest bundle, and a notification on each new one.
pub type Bundles = watch::Receiver<Arc<KeyCertBundle>>;

/// Serves the current bundle's certificate on every new TLS handshake.
#[derive(Debug)]
pub struct Resolver(Bundles);

impl Resolver {
    pub fn new(bundles: Bundles) -> Arc<Resolver> {
        Arc::new(Resolver(bundles))
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.borrow().certified.clone())
    }
}

/// Logs a bundle as istiod's `loadIstiodCert` does.
pub(super) fn log_loaded(bundle: &KeyCertBundle, what: &str) {
    let secs = |t: SystemTime| t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default();
    tracing::info!(
        serial = %bundle.serial,
        not_before = secs(bundle.not_before),
        not_after = secs(bundle.not_after),
        "istiod's serving certificate {what}"
    );
}
