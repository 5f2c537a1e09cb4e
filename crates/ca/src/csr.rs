//! Signing workload CSRs, as Istio's `IstioCA.sign`: the CSR must parse and carry a valid
//! signature (proof that the caller holds the key), only its public key is used, and the
//! certificate names the identities the caller proved, never those the CSR asks for.

use std::time::Duration;

use rcgen::{SanType, SubjectPublicKeyInfo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, CertificateSigningRequestDer};
use x509_parser::certification_request::X509CertificationRequest;
use x509_parser::prelude::FromDer;

use crate::{CertificateAuthority, files};

/// Why a CSR was not signed, with Istio's error types (`caerror.ErrType`).
#[derive(Debug, thiserror::Error)]
pub enum SignError {
    /// Istio's `CSRError`: not PEM, not a CSR, or its signature does not verify.
    #[error("CSR error: {0}")]
    Csr(String),
    /// Istio's `TTLError`: longer than `MAX_WORKLOAD_CERT_TTL`.
    #[error("requested TTL {requested:?} is greater than the max allowed TTL {max:?}")]
    Ttl { requested: Duration, max: Duration },
    /// Istio's `CertGenError`.
    #[error("certificate generation error: {0}")]
    CertGen(String),
}

impl SignError {
    /// Istio's `ErrType` names, for `citadel_server_csr_sign_err_count{error}`.
    pub fn error_type(&self) -> &'static str {
        match self {
            SignError::Csr(_) => "CSR_ERROR",
            SignError::Ttl { .. } => "TTL_ERROR",
            SignError::CertGen(_) => "CERT_GEN_ERROR",
        }
    }
}

/// The lifetimes a workload may ask for: `DEFAULT_WORKLOAD_CERT_TTL` when it asks for none,
/// refused above `MAX_WORKLOAD_CERT_TTL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkloadTtl {
    pub default: Duration,
    pub max: Duration,
}

impl Default for WorkloadTtl {
    /// Istio's 24 hours and 90 days.
    fn default() -> WorkloadTtl {
        WorkloadTtl {
            default: Duration::from_secs(24 * 3600),
            max: Duration::from_secs(90 * 24 * 3600),
        }
    }
}

impl CertificateAuthority {
    /// Signs `csr_pem` for `identities` (URI SANs, e.g. SPIFFE IDs) valid for `requested_secs`
    /// (0 or less: the default), and returns the leaf, the CA's chain and the root, one PEM
    /// certificate per element, as Istio's `CreateCertificate` response.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        identities: &[String],
        requested_secs: i64,
        ttl: WorkloadTtl,
    ) -> Result<Vec<String>, SignError> {
        let der = csr_der(csr_pem)?;
        let (rest, csr) = X509CertificationRequest::from_der(&der)
            .map_err(|e| SignError::Csr(format!("not a certificate request: {e}")))?;
        if !rest.is_empty() {
            return Err(SignError::Csr("trailing bytes after the certificate request".into()));
        }
        csr.verify_signature()
            .map_err(|e| SignError::Csr(format!("the signature does not verify: {e}")))?;
        let requested = Duration::from_secs(u64::try_from(requested_secs).unwrap_or(0));
        if requested > ttl.max {
            return Err(SignError::Ttl {
                requested,
                max: ttl.max,
            });
        }
        let lifetime = if requested.is_zero() { ttl.default } else { requested };
        if identities.is_empty() {
            return Err(SignError::CertGen("no identity to name in the certificate".into()));
        }
        let sans = identities
            .iter()
            .map(|id| {
                id.clone()
                    .try_into()
                    .map(SanType::URI)
                    .map_err(|e| SignError::CertGen(format!("identity {id:?}: {e}")))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let key = SubjectPublicKeyInfo::from_der(csr.certification_request_info.subject_pki.raw)
            .map_err(|e| SignError::Csr(format!("public key: {e}")))?;
        let chain = self
            .sign_with_cert_chain(sans, &key, lifetime)
            .map_err(|e| SignError::CertGen(e.to_string()))?;
        let mut out: Vec<String> = split_pem(&chain);
        out.extend(split_pem(self.root_cert_pem()));
        Ok(out)
    }
}

/// The DER of the `CERTIFICATE REQUEST` (or `NEW CERTIFICATE REQUEST`) block of `pem`.
fn csr_der(pem: &str) -> Result<Vec<u8>, SignError> {
    CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
        .map(|d| d.as_ref().to_vec())
        .map_err(|e| SignError::Csr(format!("no PEM certificate request: {e}")))
}

/// Each certificate of a PEM bundle as its own PEM string (Istio answers one per element).
fn split_pem(bundle: &str) -> Vec<String> {
    CertificateDer::pem_slice_iter(bundle.as_bytes())
        .filter_map(Result::ok)
        .map(|c| files::pem(&[c]))
        .collect()
}

#[cfg(test)]
mod tests {
    use rcgen::{CertificateParams, KeyPair, PublicKeyData};
    use x509_parser::prelude::{GeneralName, X509Certificate};

    use super::*;

    const ALICE: &str = "spiffe://cluster.local/ns/default/sa/alice";
    const ADMIN: &str = "spiffe://cluster.local/ns/istio-system/sa/admin";

    fn ca() -> (tempfile::TempDir, CertificateAuthority) {
        let dir = tempfile::tempdir().unwrap();
        let ca = CertificateAuthority::load_or_create(dir.path(), "cluster.local").unwrap();
        (dir, ca)
    }

    /// A CSR as an agent makes it, asking for `san`.
    fn csr(san: &str) -> (KeyPair, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.subject_alt_names = vec![SanType::URI(san.to_owned().try_into().unwrap())];
        let pem = params.serialize_request(&key).unwrap().pem().unwrap();
        (key, pem)
    }

    fn uris(cert_pem: &str) -> Vec<String> {
        let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let san = cert.subject_alternative_name().unwrap().unwrap();
        san.value
            .general_names
            .iter()
            .filter_map(|n| match n {
                GeneralName::URI(u) => Some((*u).to_owned()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_certificate_names_the_callers_identity_not_the_csrs() {
        let (_dir, ca) = ca();
        let (key, pem) = csr(ADMIN);
        let chain = ca
            .sign_csr(&pem, &[ALICE.to_owned()], 3600, WorkloadTtl::default())
            .unwrap();
        assert_eq!(chain.len(), 2, "leaf then root: {chain:?}");
        assert_eq!(uris(&chain[0]), [ALICE]);
        assert_eq!(chain[1], ca.root_cert_pem());
        let der = CertificateDer::from_pem_slice(chain[0].as_bytes()).unwrap();
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        assert_eq!(cert.public_key().raw, key.subject_public_key_info().as_slice());
        let life = cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp();
        assert_eq!(life, 3600 + crate::CLOCK_SKEW_GRACE_PERIOD.as_secs() as i64);
    }

    #[test]
    fn ttl_defaults_and_is_refused_above_the_maximum() {
        let (_dir, ca) = ca();
        let (_, pem) = csr(ALICE);
        let ttl = WorkloadTtl {
            default: Duration::from_secs(600),
            max: Duration::from_secs(3600),
        };
        let chain = ca.sign_csr(&pem, &[ALICE.to_owned()], 0, ttl).unwrap();
        let der = CertificateDer::from_pem_slice(chain[0].as_bytes()).unwrap();
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        assert_eq!(
            cert.validity().not_after.timestamp() - cert.validity().not_before.timestamp(),
            600 + 120
        );
        let e = ca.sign_csr(&pem, &[ALICE.to_owned()], 7200, ttl).unwrap_err();
        assert_eq!(e.error_type(), "TTL_ERROR");
        assert!(e.to_string().contains("greater than the max allowed TTL"), "{e}");
    }

    #[test]
    fn garbage_and_forged_csrs_are_refused() {
        let (_dir, ca) = ca();
        let id = [ALICE.to_owned()];
        for garbage in [
            "",
            "hello",
            "-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----\n",
        ] {
            let e = ca.sign_csr(garbage, &id, 0, WorkloadTtl::default()).unwrap_err();
            assert_eq!(e.error_type(), "CSR_ERROR", "{garbage:?}: {e}");
        }
        // a CSR whose signature does not match its key: the caller does not hold the key
        let (_, pem) = csr(ALICE);
        let mut der = CertificateSigningRequestDer::from_pem_slice(pem.as_bytes())
            .unwrap()
            .as_ref()
            .to_vec();
        let last = der.len() - 1;
        der[last] ^= 0x55;
        let forged = crate::files::pem_block("CERTIFICATE REQUEST", &der);
        let e = ca.sign_csr(&forged, &id, 0, WorkloadTtl::default()).unwrap_err();
        assert!(e.to_string().contains("signature does not verify"), "{e}");
    }
}
