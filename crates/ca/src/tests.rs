//! Behaviour of the CA directory and of issued certificates, checked with x509-parser and with the
//! verifier a TLS client uses.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::Path;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use super::*;

const HOUR: Duration = Duration::from_secs(3600);

fn ders(pem: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.unwrap())
        .collect()
}

fn verify(ca: &CertificateAuthority, chain_pem: &str, name: &str) -> Result<(), String> {
    let chain = ders(chain_pem);
    verify_server_cert(&ders(ca.root_cert_pem()), &chain[0], &chain[1..], name)
}

/// A CA certificate and key made with rcgen, as an operator would plug in.
fn make_ca(org: &str, issuer: Option<&(CertificateParams, KeyPair)>) -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::OrganizationName, org);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
    let cert = match issuer {
        None => params.self_signed(&key).unwrap(),
        Some((ip, ik)) => params.signed_by(&key, &rcgen::Issuer::from_params(ip, ik)).unwrap(),
    };
    (params, key, cert.pem())
}

fn write(dir: &Path, files: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

#[test]
fn self_signed_root_is_created_then_reloaded() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("etc/cacerts");
    let ca = CertificateAuthority::load_or_create(&dir, "example.org").unwrap();
    assert_eq!(ca.source(), CaSource::SelfSignedCreated);
    for f in [CA_CERT_FILE, CA_PRIVATE_KEY_FILE, ROOT_CERT_FILE, ISTIO_GENERATED] {
        assert!(dir.join(f).is_file(), "{f} written");
    }
    assert!(!dir.join(CERT_CHAIN_FILE).exists());
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.join(CA_PRIVATE_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    assert_eq!(
        std::fs::read_to_string(ca.root_cert_file()).unwrap(),
        ca.root_cert_pem()
    );

    let root = &ders(ca.root_cert_pem())[0];
    let (_, x509) = X509Certificate::from_der(root).unwrap();
    assert!(x509.is_ca());
    assert_eq!(x509.subject().to_string(), "O=example.org");
    assert_eq!(x509.subject(), x509.issuer());
    let lifetime = x509.validity().not_after.timestamp() - x509.validity().not_before.timestamp();
    assert_eq!(lifetime, DEFAULT_SELF_SIGNED_CA_CERT_TTL.as_secs() as i64);
    assert!(x509.validity().is_valid());

    let again = CertificateAuthority::load_or_create(&dir, "other.org").unwrap();
    assert_eq!(again.source(), CaSource::SelfSignedLoaded);
    assert_eq!(again.root_cert_pem(), ca.root_cert_pem());
    // A certificate from the reloaded CA verifies against the root saved on the first start.
    let issued = again
        .issue_server_cert(&["istiod.istio-system.svc".into()], &[], HOUR)
        .unwrap();
    verify(&ca, &issued.cert_chain_pem, "istiod.istio-system.svc").unwrap();
}

#[test]
fn root_cert_file_is_restored_when_deleted() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::load_or_create(tmp.path(), "cluster.local").unwrap();
    std::fs::remove_file(ca.root_cert_file()).unwrap();
    let again = CertificateAuthority::load_or_create(tmp.path(), "cluster.local").unwrap();
    assert_eq!(
        std::fs::read_to_string(again.root_cert_file()).unwrap(),
        ca.root_cert_pem()
    );
}

#[test]
fn issued_server_cert_has_the_sans_and_chains_to_the_root() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::load_or_create(tmp.path(), "cluster.local").unwrap();
    let dns = vec!["istiod.istio-system.svc".to_string(), "localhost".to_string()];
    let ips = [IpAddr::V4(Ipv4Addr::LOCALHOST), IpAddr::V6(Ipv6Addr::LOCALHOST)];
    let issued = ca.issue_server_cert(&dns, &ips, HOUR).unwrap();
    assert!(issued.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
    let chain = ders(&issued.cert_chain_pem);
    assert_eq!(chain.len(), 1, "a self-signed root adds no chain");

    let (_, leaf) = X509Certificate::from_der(&chain[0]).unwrap();
    assert!(leaf.validity().is_valid());
    assert!(!leaf.is_ca());
    assert_eq!(leaf.subject().to_string(), "");
    assert_eq!(leaf.issuer().to_string(), "O=cluster.local");
    let san = leaf.subject_alternative_name().unwrap().unwrap();
    assert!(san.critical, "SAN is critical when the subject is empty");
    let names: Vec<String> = san
        .value
        .general_names
        .iter()
        .map(|n| match n {
            GeneralName::DNSName(d) => d.to_string(),
            GeneralName::IPAddress(b) => format!("ip:{b:?}"),
            other => panic!("unexpected SAN {other:?}"),
        })
        .collect();
    assert_eq!(
        names,
        vec![
            "istiod.istio-system.svc".to_string(),
            "localhost".into(),
            format!("ip:{:?}", [127u8, 0, 0, 1]),
            format!("ip:{:?}", Ipv6Addr::LOCALHOST.octets()),
        ]
    );
    let eku = leaf.extended_key_usage().unwrap().unwrap().value;
    assert!(eku.server_auth && eku.client_auth);
    let lifetime = leaf.validity().not_after.timestamp() - leaf.validity().not_before.timestamp();
    assert_eq!(lifetime, (HOUR + CLOCK_SKEW_GRACE_PERIOD).as_secs() as i64);

    for name in ["istiod.istio-system.svc", "localhost", "127.0.0.1", "::1"] {
        verify(&ca, &issued.cert_chain_pem, name).unwrap();
    }
    assert!(verify(&ca, &issued.cert_chain_pem, "istiod.other.svc").is_err());

    // Another mesh's root does not trust it.
    let other = tempfile::tempdir().unwrap();
    let other = CertificateAuthority::load_or_create(other.path(), "cluster.local").unwrap();
    assert!(verify(&other, &issued.cert_chain_pem, "istiod.istio-system.svc").is_err());
}

#[test]
fn leaf_lifetime_is_clamped_to_a_short_root() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::load_or_create_with_ttl(tmp.path(), "cluster.local", HOUR).unwrap();
    let issued = ca.issue_server_cert(&["a.example".into()], &[], 24 * HOUR).unwrap();
    let chain = ders(&issued.cert_chain_pem);
    let (_, leaf) = X509Certificate::from_der(&chain[0]).unwrap();
    assert_eq!(leaf.validity().not_after.to_datetime(), ca.signing_cert_not_after());
}

#[test]
fn bad_names_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::load_or_create(tmp.path(), "cluster.local").unwrap();
    assert!(matches!(ca.issue_server_cert(&[], &[], HOUR), Err(CaError::Issue(_))));
    assert!(ca.issue_server_cert(&["bad\u{e9}.example".into()], &[], HOUR).is_err());
}

#[test]
fn plugged_in_intermediate_is_used_and_sent_with_its_chain() {
    let (root_params, root_key, root_pem) = make_ca("Root CA", None);
    let root = (root_params, root_key);
    let (_, int_key, int_pem) = make_ca("Intermediate CA", Some(&root));
    let tmp = tempfile::tempdir().unwrap();
    let chain = format!("{int_pem}{root_pem}");
    write(
        tmp.path(),
        &[
            (CA_CERT_FILE, &int_pem),
            (CA_PRIVATE_KEY_FILE, &int_key.serialize_pem()),
            (ROOT_CERT_FILE, &root_pem),
            (CERT_CHAIN_FILE, &chain),
        ],
    );
    let ca = CertificateAuthority::load_or_create(tmp.path(), "cluster.local").unwrap();
    assert_eq!(ca.source(), CaSource::PluggedIn);
    assert_eq!(ders(ca.root_cert_pem()), ders(&root_pem));
    assert!(
        !tmp.path().join(ISTIO_GENERATED).exists(),
        "a plugged-in CA writes nothing"
    );

    let issued = ca
        .issue_server_cert(&["istiod.istio-system.svc".into()], &[], HOUR)
        .unwrap();
    let sent = ders(&issued.cert_chain_pem);
    assert_eq!(sent.len(), 3, "leaf + cert-chain.pem");
    assert_eq!(sent[1..], ders(&chain)[..]);
    let (_, leaf) = X509Certificate::from_der(&sent[0]).unwrap();
    assert_eq!(leaf.issuer().to_string(), "O=Intermediate CA");
    verify(&ca, &issued.cert_chain_pem, "istiod.istio-system.svc").unwrap();
}

#[test]
fn plugged_in_openssl_keys_pkcs1_rsa_and_sec1_ec() {
    for (cert, key) in [
        (
            include_str!("../testdata/rsa-ca-cert.pem"),
            include_str!("../testdata/rsa-pkcs1-ca-key.pem"),
        ),
        (
            include_str!("../testdata/ec-ca-cert.pem"),
            include_str!("../testdata/ec-sec1-ca-key.pem"),
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        write(
            tmp.path(),
            &[
                (CA_CERT_FILE, cert),
                (CA_PRIVATE_KEY_FILE, key),
                (ROOT_CERT_FILE, cert),
                (CERT_CHAIN_FILE, cert),
            ],
        );
        let ca = CertificateAuthority::load_or_create(tmp.path(), "cluster.local").unwrap();
        assert_eq!(ca.source(), CaSource::PluggedIn);
        let issued = ca
            .issue_server_cert(&["istiod.istio-system.svc".into()], &[], HOUR)
            .unwrap();
        verify(&ca, &issued.cert_chain_pem, "istiod.istio-system.svc").unwrap();
    }
}

#[test]
fn incomplete_bundle_names_the_missing_files() {
    let tmp = tempfile::tempdir().unwrap();
    write(
        tmp.path(),
        &[(CA_CERT_FILE, include_str!("../testdata/ec-ca-cert.pem"))],
    );
    let err = CertificateAuthority::load_or_create(tmp.path(), "cluster.local").unwrap_err();
    match &err {
        CaError::IncompleteBundle { missing, .. } => {
            assert_eq!(missing, "ca-key.pem, root-cert.pem, cert-chain.pem")
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(err.to_string().contains("hint"));
}

#[test]
fn wrong_key_broken_chain_and_leaf_as_ca_are_refused() {
    let (_, key, cert) = make_ca("CA", None);
    let (_, _, other_root) = make_ca("Other", None);
    let other_key = KeyPair::generate().unwrap().serialize_pem();
    let key_pem = key.serialize_pem();
    let case = |files: &[(&str, &str)]| {
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), files);
        CertificateAuthority::load_or_create(tmp.path(), "cluster.local").unwrap_err()
    };
    let err = case(&[
        (CA_CERT_FILE, &cert),
        (CA_PRIVATE_KEY_FILE, &other_key),
        (ROOT_CERT_FILE, &cert),
        (CERT_CHAIN_FILE, &cert),
    ]);
    assert!(
        matches!(&err, CaError::Invalid { path, .. } if path.ends_with(CA_PRIVATE_KEY_FILE)),
        "{err}"
    );
    let err = case(&[
        (CA_CERT_FILE, &cert),
        (CA_PRIVATE_KEY_FILE, &key_pem),
        (ROOT_CERT_FILE, &other_root),
        (CERT_CHAIN_FILE, &cert),
    ]);
    assert!(matches!(err, CaError::Chain { .. }), "{err}");

    let tmp = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::load_or_create(tmp.path(), "cluster.local").unwrap();
    let leaf = ca.issue_server_cert(&["leaf.example".into()], &[], HOUR).unwrap();
    let root = ca.root_cert_pem();
    let err = case(&[
        (CA_CERT_FILE, &leaf.cert_chain_pem),
        (CA_PRIVATE_KEY_FILE, &leaf.key_pem),
        (ROOT_CERT_FILE, root),
        (CERT_CHAIN_FILE, root),
    ]);
    assert!(
        matches!(&err, CaError::Invalid { path, .. } if path.ends_with(CA_CERT_FILE)),
        "{err}"
    );
    let err = case(&[
        (CA_CERT_FILE, "garbage"),
        (CA_PRIVATE_KEY_FILE, &key_pem),
        (ROOT_CERT_FILE, &cert),
        (CERT_CHAIN_FILE, &cert),
    ]);
    assert!(
        matches!(&err, CaError::Invalid { path, .. } if path.ends_with(CA_CERT_FILE)),
        "{err}"
    );
}

#[test]
fn unusable_directories_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("file");
    std::fs::write(&file, "x").unwrap();
    let err = CertificateAuthority::load_or_create(&file, "cluster.local").unwrap_err();
    assert!(matches!(err, CaError::Invalid { .. }), "{err}");
    // Cannot create the directory under a file: the write error names the path.
    let err = CertificateAuthority::load_or_create(&file.join("cacerts"), "cluster.local").unwrap_err();
    assert!(matches!(&err, CaError::Read { .. } | CaError::Write { .. }), "{err}");
    assert!(err.to_string().contains("cacerts"), "{err}");
}

/// A reload of the `cacerts` mount reads the plugged-in files only: an emptied directory (a
/// rotation half done) is an error naming what is missing, never a new self-signed root.
#[test]
fn load_plugged_never_creates_a_self_signed_root() {
    let tmp = tempfile::tempdir().unwrap();
    let err = CertificateAuthority::load_plugged(tmp.path()).unwrap_err();
    assert!(matches!(err, CaError::IncompleteBundle { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("ca-cert.pem, ca-key.pem, root-cert.pem, cert-chain.pem"),
        "{err}"
    );
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "nothing written");

    let (root_params, root_key, root_pem) = make_ca("Root CA", None);
    let (_, int_key, int_pem) = make_ca("Intermediate CA", Some(&(root_params, root_key)));
    write(
        tmp.path(),
        &[
            (CA_CERT_FILE, &int_pem),
            (CA_PRIVATE_KEY_FILE, &int_key.serialize_pem()),
            (ROOT_CERT_FILE, &root_pem),
            (CERT_CHAIN_FILE, &format!("{int_pem}{root_pem}")),
        ],
    );
    let ca = CertificateAuthority::load_plugged(tmp.path()).unwrap();
    assert_eq!(ca.source(), CaSource::PluggedIn);
    assert_eq!(ca.signing_cert(), &ders(&int_pem)[0]);
    assert_eq!(ca.roots(), &ders(&root_pem)[..]);
    assert_eq!(
        CertificateAuthority::read_root_certs(tmp.path()).unwrap(),
        ders(&root_pem)
    );
    let int_der = ders(&int_pem);
    let (_, int) = X509Certificate::from_der(&int_der[0]).unwrap();
    assert_eq!(
        ca.cert_chain_not_after_unix(),
        Some(int.validity().not_after.timestamp())
    );

    std::fs::remove_file(tmp.path().join(CA_PRIVATE_KEY_FILE)).unwrap();
    let err = CertificateAuthority::load_plugged(tmp.path()).unwrap_err();
    assert!(err.to_string().contains("missing ca-key.pem"), "{err}");
}
