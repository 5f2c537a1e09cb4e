//! A self-signed root kept outside the CA directory, for istiod's `istio-ca-secret` (Istio's
//! `NewSelfSignedIstioCAOptions`, security/pkg/pki/ca/ca.go): every replica, and a restarted one,
//! signs with the root the first one made. This module holds the PEM side; reading and creating
//! the Secret is the caller's (pilot-discovery, which has the Kubernetes client).
//!
//! The root is also mirrored into the CA directory when it is writable (`ca-cert.pem`,
//! `ca-key.pem`, `root-cert.pem`, the `istio-generated` marker), as the directory's own
//! self-signed root, so that clients on the same machine find `root-cert.pem` there and a start
//! without the cluster signs with the same root. In a Pod the directory is the read-only
//! `cacerts` mount; the mirror is then skipped.

use std::path::Path;
use std::time::Duration;

use rcgen::KeyPair;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::files::{self, CA_CERT_FILE, CA_PRIVATE_KEY_FILE, CERT_CHAIN_FILE, ISTIO_GENERATED, ROOT_CERT_FILE};
use crate::{CaError, CaSource, CertificateAuthority, certs, key};

/// A self-signed root and its key, PEM, as the Secret's `ca-cert.pem` and `ca-key.pem` hold them.
#[derive(Clone, PartialEq, Eq)]
pub struct SelfSignedPem {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for SelfSignedPem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelfSignedPem")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

/// What the CA directory holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirBundle {
    /// An operator's plugged-in CA (the four files, no `istio-generated` marker): it wins.
    PluggedIn,
    /// A self-signed root generated on an earlier start.
    SelfSigned(SelfSignedPem),
    /// Nothing (or no directory).
    Empty,
}

impl SelfSignedPem {
    /// A new self-signed root (`O=<trust_domain>`, ECDSA P-256) valid for `ttl`.
    pub fn generate(trust_domain: &str, ttl: Duration) -> Result<SelfSignedPem, CaError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let cert = certs::self_signed_root(trust_domain, ttl)?.self_signed(&key)?;
        Ok(SelfSignedPem {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// What `dir` holds; an incomplete plugged-in bundle is an error, as istiod's.
pub fn dir_bundle(dir: &Path) -> Result<DirBundle, CaError> {
    if !dir.is_dir() {
        return Ok(DirBundle::Empty);
    }
    let has = |f: &str| dir.join(f).exists();
    if has(ISTIO_GENERATED) {
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f)).map_err(|source| CaError::Read {
                path: dir.join(f),
                source,
            })
        };
        return Ok(DirBundle::SelfSigned(SelfSignedPem {
            cert_pem: read(CA_CERT_FILE)?,
            key_pem: read(CA_PRIVATE_KEY_FILE)?,
        }));
    }
    let plugged = [CA_CERT_FILE, CA_PRIVATE_KEY_FILE, ROOT_CERT_FILE, CERT_CHAIN_FILE];
    let missing: Vec<&str> = plugged.iter().copied().filter(|f| !has(f)).collect();
    match missing.len() {
        0 => Ok(DirBundle::PluggedIn),
        n if n == plugged.len() => Ok(DirBundle::Empty),
        _ => Err(CaError::IncompleteBundle {
            dir: dir.to_path_buf(),
            missing: missing.join(", "),
        }),
    }
}

impl CertificateAuthority {
    /// The CA of a self-signed root held outside `dir` (the `istio-ca-secret` Secret), checked as
    /// a loaded one; `source` says where it came from. `dir` is only where the mirror goes.
    pub fn from_self_signed_pem(
        dir: &Path,
        root: &SelfSignedPem,
        source: CaSource,
    ) -> Result<CertificateAuthority, CaError> {
        let what = Path::new("istio-ca-secret");
        let signing_cert = CertificateDer::pem_slice_iter(root.cert_pem.as_bytes())
            .next()
            .ok_or_else(|| CaError::invalid(what.join(CA_CERT_FILE), "no PEM certificate"))?
            .map_err(|e| CaError::invalid(what.join(CA_CERT_FILE), format!("bad PEM: {e}")))?;
        let signing_key = key::parse_private_key(root.key_pem.as_bytes())
            .map_err(|e| CaError::invalid(what.join(CA_PRIVATE_KEY_FILE), e))?;
        CertificateAuthority::from_bundle(
            dir,
            files::SigningBundle {
                source,
                roots: vec![signing_cert.clone()],
                signing_cert,
                signing_key,
                cert_chain: Vec::new(),
            },
        )
    }
}

/// Writes `root` into `dir` as its self-signed root (the marker last).
pub fn mirror(dir: &Path, root: &SelfSignedPem) -> Result<(), CaError> {
    files::save_self_signed(dir, root.cert_pem.as_bytes(), root.key_pem.as_bytes())
}
