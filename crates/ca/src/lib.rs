//! The mesh CA of pilot-discovery, as istiod runs Istio's `security/pkg/pki/ca` when no external
//! CA is configured (`pilot/pkg/bootstrap/istio_ca.go`): a plugged-in or self-signed signing
//! certificate from the CA directory (`ROOT_CA_DIR`), the root bundle that clients trust, and the
//! certificates it signs: today istiod's own serving certificate for the secure xDS port.
//!
//! Workload CSRs (Istio's `IstioCertificateService`) are signed by
//! [`CertificateAuthority::sign_csr`] for the identities the caller proved; the gRPC service and
//! caller authentication are the `security` crate's.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod certs;
mod csr;
mod error;
mod files;
mod key;
mod shared;
#[cfg(test)]
mod tests;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rcgen::{Issuer, KeyPair, PublicKeyData, SanType};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use time::OffsetDateTime;

pub use certs::CLOCK_SKEW_GRACE_PERIOD;
pub use csr::{SignError, WorkloadTtl};
pub use error::CaError;
pub use files::{CA_CERT_FILE, CA_PRIVATE_KEY_FILE, CERT_CHAIN_FILE, ISTIO_GENERATED, ROOT_CERT_FILE};
pub use shared::{DirBundle, SelfSignedPem, dir_bundle, mirror};

/// Istio's `DefaultSelfSignedCACertTTL` (`CITADEL_SELF_SIGNED_CA_CERT_TTL`): 10 years.
pub const DEFAULT_SELF_SIGNED_CA_CERT_TTL: Duration = Duration::from_secs(3650 * 24 * 3600);

/// The name a freshly loaded CA signs a throwaway certificate for, to check its chain.
const CHECK_NAME: &str = "istiod.istio-system.svc";

/// Where the signing certificate came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaSource {
    /// `ca-cert.pem`, `ca-key.pem`, `root-cert.pem`, `cert-chain.pem` from the operator.
    PluggedIn,
    /// A self-signed root generated on an earlier start (`istio-generated` marker).
    SelfSignedLoaded,
    /// A self-signed root generated now and saved to the CA directory.
    SelfSignedCreated,
    /// The self-signed root of the `istio-ca-secret` Secret, made by this or another replica.
    SharedSecret,
}

/// A signed certificate and its new private key, both PEM (Istio's `GenKeyCert`).
#[derive(Clone)]
pub struct IssuedCert {
    /// The leaf, then the CA's chain (`cert-chain.pem` for a plugged-in CA; nothing more for a
    /// self-signed root).
    pub cert_chain_pem: String,
    /// PKCS#8 `PRIVATE KEY`.
    pub key_pem: String,
}

impl std::fmt::Debug for IssuedCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedCert")
            .field("cert_chain_pem", &self.cert_chain_pem)
            .finish_non_exhaustive()
    }
}

pub struct CertificateAuthority {
    dir: PathBuf,
    source: CaSource,
    issuer: Issuer<'static, KeyPair>,
    signing_not_after: OffsetDateTime,
    signing_cert: CertificateDer<'static>,
    cert_chain: Vec<CertificateDer<'static>>,
    roots: Vec<CertificateDer<'static>>,
    root_cert_pem: String,
}

impl std::fmt::Debug for CertificateAuthority {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertificateAuthority")
            .field("dir", &self.dir)
            .field("source", &self.source)
            .field("signing_not_after", &self.signing_not_after)
            .finish_non_exhaustive()
    }
}

impl CertificateAuthority {
    /// The CA of `dir`: its plugged-in CA files when present, else the self-signed root kept
    /// there, else a new self-signed root (`O=<trust_domain>`, ECDSA P-256, 10 years) saved there.
    pub fn load_or_create(dir: &Path, trust_domain: &str) -> Result<CertificateAuthority, CaError> {
        Self::load_or_create_with_ttl(dir, trust_domain, DEFAULT_SELF_SIGNED_CA_CERT_TTL)
    }

    /// [`load_or_create`](Self::load_or_create) with the lifetime of a new self-signed root.
    pub fn load_or_create_with_ttl(
        dir: &Path,
        trust_domain: &str,
        root_ttl: Duration,
    ) -> Result<CertificateAuthority, CaError> {
        let bundle = files::load_or_create(dir, trust_domain, root_ttl)?;
        Self::from_bundle(dir, bundle)
    }

    /// The plugged-in CA of `dir` (`ca-cert.pem`, `ca-key.pem`, `root-cert.pem`,
    /// `cert-chain.pem`), checked as at start; an error when any file is missing, never a
    /// self-signed root (what istiod reads again when its `cacerts` mount changes).
    pub fn load_plugged(dir: &Path) -> Result<CertificateAuthority, CaError> {
        Self::from_bundle(dir, files::load_plugged_only(dir)?)
    }

    /// The roots of `dir`'s `root-cert.pem`, DER, without loading the rest.
    pub fn read_root_certs(dir: &Path) -> Result<Vec<CertificateDer<'static>>, CaError> {
        files::read_roots(dir)
    }

    /// The CA of a signing bundle, checked: a CA certificate, its key, not expired, a chain that
    /// verifies. Errors name `dir`'s files.
    pub(crate) fn from_bundle(dir: &Path, bundle: files::SigningBundle) -> Result<CertificateAuthority, CaError> {
        let cert_path = dir.join(CA_CERT_FILE);
        let (_, x509) = x509_parser::parse_x509_certificate(&bundle.signing_cert)
            .map_err(|e| CaError::invalid(&cert_path, format!("not an X.509 certificate: {e}")))?;
        if !x509.is_ca() {
            return Err(CaError::invalid(
                &cert_path,
                "not a CA certificate (basicConstraints CA:FALSE)",
            ));
        }
        if x509.public_key().raw != bundle.signing_key.subject_public_key_info().as_slice() {
            return Err(CaError::invalid(
                dir.join(CA_PRIVATE_KEY_FILE),
                "this key does not belong to ca-cert.pem",
            ));
        }
        let signing_not_after = x509.validity().not_after.to_datetime();
        if signing_not_after <= certs::now() {
            return Err(CaError::invalid(&cert_path, format!("expired at {signing_not_after}")));
        }
        let issuer = Issuer::from_ca_cert_der(&bundle.signing_cert, bundle.signing_key)
            .map_err(|e| CaError::invalid(&cert_path, e))?;
        let ca = CertificateAuthority {
            dir: dir.to_path_buf(),
            source: bundle.source,
            issuer,
            signing_not_after,
            signing_cert: bundle.signing_cert.clone(),
            cert_chain: bundle.cert_chain,
            root_cert_pem: files::pem(&bundle.roots),
            roots: bundle.roots,
        };
        ca.check_chain()?;
        Ok(ca)
    }

    /// The roots that clients of this CA trust, PEM (Istio distributes them as the
    /// `istio-ca-root-cert` ConfigMap).
    pub fn root_cert_pem(&self) -> &str {
        &self.root_cert_pem
    }

    /// The file that holds [`root_cert_pem`](Self::root_cert_pem): `<dir>/root-cert.pem`.
    pub fn root_cert_file(&self) -> PathBuf {
        self.dir.join(ROOT_CERT_FILE)
    }

    /// When the first root expires, as Unix seconds (`citadel_server_root_cert_expiry_timestamp`).
    pub fn root_not_after_unix(&self) -> Option<i64> {
        let (_, root) = x509_parser::parse_x509_certificate(self.roots.first()?).ok()?;
        Some(root.validity().not_after.timestamp())
    }

    /// When the signing chain expires, as Unix seconds: the first certificate of `cert-chain.pem`
    /// (`citadel_server_cert_chain_expiry_timestamp`); `None` without a chain (a self-signed root).
    pub fn cert_chain_not_after_unix(&self) -> Option<i64> {
        let (_, first) = x509_parser::parse_x509_certificate(self.cert_chain.first()?).ok()?;
        Some(first.validity().not_after.timestamp())
    }

    /// The roots that clients trust, DER.
    pub fn roots(&self) -> &[CertificateDer<'static>] {
        &self.roots
    }

    /// The signing certificate (`ca-cert.pem`), DER.
    pub fn signing_cert(&self) -> &CertificateDer<'static> {
        &self.signing_cert
    }

    /// The chain sent after every issued certificate (`cert-chain.pem`), DER.
    pub fn cert_chain(&self) -> &[CertificateDer<'static>] {
        &self.cert_chain
    }

    pub fn source(&self) -> CaSource {
        self.source
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// When the signing certificate expires; nothing this CA signs outlives it.
    pub fn signing_cert_not_after(&self) -> OffsetDateTime {
        self.signing_not_after
    }

    /// A serving certificate with a new ECDSA P-256 key for `dns` names and `ips`, valid for
    /// `ttl` (clamped to the signing certificate), as istiod's `GenKeyCert` for its DNS names.
    /// With an RSA CA the leaf key is still ECDSA: ring cannot generate RSA keys.
    pub fn issue_server_cert(&self, dns: &[String], ips: &[IpAddr], ttl: Duration) -> Result<IssuedCert, CaError> {
        let mut sans = Vec::with_capacity(dns.len() + ips.len());
        for d in dns {
            let name = d
                .clone()
                .try_into()
                .map_err(|e| CaError::Issue(format!("DNS name {d:?}: {e}")))?;
            sans.push(SanType::DnsName(name));
        }
        sans.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
        if sans.is_empty() {
            return Err(CaError::Issue("a certificate needs at least one DNS name or IP".into()));
        }
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let cert_chain_pem = self.sign_with_cert_chain(sans, &key, ttl)?;
        Ok(IssuedCert {
            cert_chain_pem,
            key_pem: key.serialize_pem(),
        })
    }

    /// Signs a leaf for `public_key` naming `sans`, and returns it followed by the CA's chain, PEM
    /// (Istio's `signWithCertChain`). The seam for signing workload CSRs.
    pub(crate) fn sign_with_cert_chain(
        &self,
        sans: Vec<SanType>,
        public_key: &impl PublicKeyData,
        ttl: Duration,
    ) -> Result<String, CaError> {
        let leaf = certs::leaf(sans, ttl, self.signing_not_after)?.signed_by(public_key, &self.issuer)?;
        let mut out = leaf.pem();
        out.push_str(&files::pem(&self.cert_chain));
        Ok(out)
    }

    /// Checks that what this CA signs is trusted by a client of its roots: a throwaway leaf must
    /// verify against the roots through the chain, as a TLS client would check it.
    fn check_chain(&self) -> Result<(), CaError> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
        let name = CHECK_NAME.to_owned().try_into()?;
        let leaf = certs::leaf(
            vec![SanType::DnsName(name)],
            Duration::from_secs(60),
            self.signing_not_after,
        )?
        .signed_by(&key, &self.issuer)?;
        verify_server_cert(&self.roots, leaf.der(), &self.cert_chain, CHECK_NAME).map_err(|reason| CaError::Chain {
            dir: self.dir.clone(),
            reason,
        })
    }
}

/// Verifies `leaf` for `name` (DNS name or IP) against `roots` through `intermediates`, with
/// rustls' WebPKI verifier: what a TLS client of this CA does.
fn verify_server_cert(
    roots: &[CertificateDer<'static>],
    leaf: &CertificateDer<'_>,
    intermediates: &[CertificateDer<'_>],
    name: &str,
) -> Result<(), String> {
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store.add(root.clone()).map_err(|e| format!("{ROOT_CERT_FILE}: {e}"))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(store), provider)
        .build()
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(name.to_owned()).map_err(|e| e.to_string())?;
    verifier
        .verify_server_cert(leaf, intermediates, &name, &[], UnixTime::now())
        .map(|_| ())
        .map_err(|e| e.to_string())
}
