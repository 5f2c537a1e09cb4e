//! What the certificates of the mesh CA look like, as Istio's `security/pkg/pki/util`
//! (`genCertTemplateFromOptions`, `genCertTemplateFromCSR`): the self-signed root and the leaves
//! it signs, their validity, key usages and serial numbers.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyUsagePurpose,
    SanType, SerialNumber,
};
use time::OffsetDateTime;

use crate::CaError;

/// Istio's `ClockSkewGracePeriod`: leaves are valid from two minutes before they are signed.
pub const CLOCK_SKEW_GRACE_PERIOD: Duration = Duration::from_secs(2 * 60);

/// The current time as `time` counts it.
pub(crate) fn now() -> OffsetDateTime {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    OffsetDateTime::from_unix_timestamp(i64::try_from(secs).unwrap_or(i64::MAX)).unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

/// `t + d`, saturating at the end of what X.509 (and `time`) can say.
pub(crate) fn add(t: OffsetDateTime, d: Duration) -> OffsetDateTime {
    let d = time::Duration::try_from(d).unwrap_or(time::Duration::MAX);
    t.checked_add(d).unwrap_or_else(|| {
        OffsetDateTime::from_unix_timestamp(253_402_300_799).unwrap_or(OffsetDateTime::UNIX_EPOCH) // 9999-12-31
    })
}

/// A 128-bit random serial number (Istio's `genSerialNum`), positive as DER wants it.
fn random_serial() -> Result<SerialNumber, CaError> {
    let mut bytes = [0u8; 16];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .map_err(|_| CaError::Issue("no random numbers for a serial number".into()))?;
    bytes[0] &= 0x7f;
    Ok(SerialNumber::from_slice(&bytes))
}

/// The self-signed root of a mesh without a plugged-in CA: subject `O=<trust domain>`, a CA that
/// may only sign certificates, valid from now for `ttl` (Istio: `CITADEL_SELF_SIGNED_CA_CERT_TTL`,
/// 10 years).
pub(crate) fn self_signed_root(trust_domain: &str, ttl: Duration) -> Result<CertificateParams, CaError> {
    let mut params = CertificateParams::default();
    let mut subject = DistinguishedName::new();
    subject.push(DnType::OrganizationName, trust_domain);
    params.distinguished_name = subject;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    params.serial_number = Some(random_serial()?);
    let not_before = now();
    params.not_before = not_before;
    params.not_after = add(not_before, ttl);
    Ok(params)
}

/// A leaf as Istio signs for workloads and for istiod itself: no subject (so the SAN extension is
/// critical), `sans` as subject alternative names, digital signature and key encipherment for
/// both server and client authentication, valid from [`CLOCK_SKEW_GRACE_PERIOD`] ago for `ttl`,
/// never past `signer_not_after`.
pub(crate) fn leaf(
    sans: Vec<SanType>,
    ttl: Duration,
    signer_not_after: OffsetDateTime,
) -> Result<CertificateParams, CaError> {
    let now = now();
    if now >= signer_not_after {
        return Err(CaError::Issue(format!(
            "the signing certificate expired at {signer_not_after}"
        )));
    }
    let mut params = CertificateParams::default();
    params.distinguished_name = DistinguishedName::new();
    params.subject_alt_names = sans;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
    params.use_authority_key_identifier_extension = true;
    params.serial_number = Some(random_serial()?);
    params.not_before = now - CLOCK_SKEW_GRACE_PERIOD;
    params.not_after = add(now, ttl).min(signer_not_after);
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serials_are_random_and_positive() {
        let a = random_serial().unwrap().to_bytes();
        let b = random_serial().unwrap().to_bytes();
        assert_ne!(a, b);
        assert_eq!(a.len(), 16);
        assert!(a[0] < 0x80);
    }

    #[test]
    fn leaf_validity_is_clamped_to_the_signer() {
        let signer_end = add(now(), Duration::from_secs(3600));
        let p = leaf(Vec::new(), Duration::from_secs(10 * 24 * 3600), signer_end).unwrap();
        assert_eq!(p.not_after, signer_end);
        assert!(p.not_before <= now() - CLOCK_SKEW_GRACE_PERIOD);
        let p = leaf(Vec::new(), Duration::from_secs(60), signer_end).unwrap();
        assert!(p.not_after < signer_end);
    }

    #[test]
    fn expired_signer_issues_nothing() {
        let past = now() - time::Duration::seconds(1);
        assert!(matches!(
            leaf(Vec::new(), Duration::from_secs(60), past),
            Err(CaError::Issue(_))
        ));
    }

    #[test]
    fn far_future_saturates() {
        let t = add(now(), Duration::from_secs(u64::MAX));
        assert_eq!(t.year(), 9999);
    }
}
