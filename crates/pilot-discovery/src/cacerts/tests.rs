//! The reload decision of the plugged-in CA and the watch that follows its directory.

use std::path::Path;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use super::*;

/// A CA certificate and its key, as an operator makes them.
struct TestCa {
    params: CertificateParams,
    key: KeyPair,
    pem: String,
}

impl TestCa {
    fn root(org: &str) -> TestCa {
        Self::make(org, None)
    }

    fn intermediate(&self, org: &str) -> TestCa {
        Self::make(org, Some(self))
    }

    fn make(org: &str, issuer: Option<&TestCa>) -> TestCa {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::OrganizationName, org);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let cert = match issuer {
            None => params.self_signed(&key).unwrap(),
            Some(i) => params.signed_by(&key, &Issuer::from_params(&i.params, &i.key)).unwrap(),
        };
        TestCa {
            pem: cert.pem(),
            params,
            key,
        }
    }

    fn der(&self) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(self.pem.as_bytes()).unwrap()
    }
}

/// Writes `int`'s plugged-in files under `root` into `dir`.
fn plug(dir: &Path, int: &TestCa, root: &TestCa) {
    let chain = format!("{}{}", int.pem, root.pem);
    for (name, text) in [
        ("ca-cert.pem", int.pem.as_str()),
        ("ca-key.pem", &int.key.serialize_pem()),
        ("root-cert.pem", &root.pem),
        ("cert-chain.pem", &chain),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

fn loaded(dir: &Path, int: &TestCa, root: &TestCa) -> CertificateAuthority {
    plug(dir, int, root);
    let ca = CertificateAuthority::load_or_create(dir, "cluster.local").unwrap();
    assert_eq!(ca.source(), CaSource::PluggedIn);
    ca
}

#[test]
fn a_new_intermediate_under_the_same_root_is_taken() {
    let tmp = tempfile::tempdir().unwrap();
    let root = TestCa::root("Root");
    let (a, b) = (root.intermediate("Intermediate A"), root.intermediate("Intermediate B"));
    let current = loaded(tmp.path(), &a, &root);
    plug(tmp.path(), &b, &root);
    match decide(&current) {
        Reload::Updated(new) => {
            assert_eq!(new.signing_cert(), &b.der());
            assert_eq!(new.cert_chain(), &[b.der(), root.der()]);
            assert_eq!(new.roots(), current.roots());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_same_files_written_again_change_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = TestCa::root("Root");
    let a = root.intermediate("Intermediate A");
    let current = loaded(tmp.path(), &a, &root);
    plug(tmp.path(), &a, &root);
    assert!(matches!(decide(&current), Reload::Unchanged), "{:?}", decide(&current));
}

#[test]
fn a_new_root_is_refused_even_with_a_valid_bundle() {
    let tmp = tempfile::tempdir().unwrap();
    let (root, other) = (TestCa::root("Root"), TestCa::root("Other root"));
    let current = loaded(tmp.path(), &root.intermediate("A"), &root);
    plug(tmp.path(), &other.intermediate("B"), &other);
    assert!(matches!(decide(&current), Reload::RootChanged));
    // a root added to the bundle is a root change too (ISTIO_MULTIROOT_MESH is not supported)
    std::fs::write(tmp.path().join("root-cert.pem"), format!("{}{}", root.pem, other.pem)).unwrap();
    assert!(matches!(decide(&current), Reload::RootChanged));
}

#[test]
fn files_that_do_not_make_a_ca_are_refused_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let root = TestCa::root("Root");
    let (a, b) = (root.intermediate("A"), root.intermediate("B"));
    let current = loaded(tmp.path(), &a, &root);
    let invalid = |what: &str| match decide(&current) {
        Reload::Invalid(e) => e.to_string(),
        other => panic!("{what}: {other:?}"),
    };

    plug(tmp.path(), &b, &root);
    std::fs::write(tmp.path().join("ca-key.pem"), a.key.serialize_pem()).unwrap();
    let e = invalid("key of another certificate");
    assert!(e.contains("ca-key.pem") && e.contains("does not belong"), "{e}");

    plug(tmp.path(), &b, &root);
    std::fs::write(tmp.path().join("ca-cert.pem"), "-----BEGIN CERTIFICATE-----\ngarbage\n").unwrap();
    let e = invalid("garbage PEM");
    assert!(e.contains("ca-cert.pem"), "{e}");

    // an intermediate of another root, with the current root-cert.pem: no chain to it
    let other = TestCa::root("Other root");
    plug(tmp.path(), &other.intermediate("C"), &other);
    std::fs::write(tmp.path().join("root-cert.pem"), &root.pem).unwrap();
    let e = invalid("chain to another root");
    assert!(e.contains("does not chain to root-cert.pem"), "{e}");
}

/// Files gone in the middle of a rotation: refused, and no self-signed root is made in their
/// place (`load_or_create` would make one in an empty directory).
#[test]
fn files_removed_mid_rotation_keep_the_current_ca_and_create_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let root = TestCa::root("Root");
    let current = loaded(tmp.path(), &root.intermediate("A"), &root);
    for f in ["ca-cert.pem", "ca-key.pem", "cert-chain.pem"] {
        std::fs::remove_file(tmp.path().join(f)).unwrap();
    }
    match decide(&current) {
        Reload::Invalid(e) => assert!(
            e.to_string()
                .contains("missing ca-cert.pem, ca-key.pem, cert-chain.pem"),
            "{e}"
        ),
        other => panic!("{other:?}"),
    }
    std::fs::remove_file(tmp.path().join("root-cert.pem")).unwrap();
    match decide(&current) {
        Reload::Invalid(e) => assert!(e.to_string().contains("root-cert.pem"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0, "nothing written");
}

/// Kubelet's update of a Secret mount: the files are symlinks through `..data`, which is swapped
/// for a new timestamped directory.
struct SecretMount {
    dir: tempfile::TempDir,
    generation: u32,
}

impl SecretMount {
    fn new(int: &TestCa, root: &TestCa) -> SecretMount {
        let mut m = SecretMount {
            dir: tempfile::tempdir().unwrap(),
            generation: 0,
        };
        m.update(int, root);
        for f in ["ca-cert.pem", "ca-key.pem", "root-cert.pem", "cert-chain.pem"] {
            std::os::unix::fs::symlink(Path::new("..data").join(f), m.dir.path().join(f)).unwrap();
        }
        m
    }

    fn update(&mut self, int: &TestCa, root: &TestCa) {
        self.update_with(int, root, |_| {});
    }

    /// Writes the files of `int`, changed by `edit`, then swaps `..data`.
    fn update_with(&mut self, int: &TestCa, root: &TestCa, edit: impl FnOnce(&Path)) {
        self.generation += 1;
        let data = format!("..2026_11_28_{}", self.generation);
        std::fs::create_dir(self.dir.path().join(&data)).unwrap();
        plug(&self.dir.path().join(&data), int, root);
        edit(&self.dir.path().join(&data));
        let tmp = self.dir.path().join("..data_tmp");
        std::os::unix::fs::symlink(&data, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("..data")).unwrap();
    }
}

async fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..100 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within 5s: {what}");
}

/// The watch follows a Secret mount: a new intermediate is published and counted, a root change
/// and a broken bundle are counted and leave the published CA alone.
#[tokio::test]
async fn the_watch_follows_a_secret_mount_swapping_its_data_symlink() {
    let root = TestCa::root("Root");
    let (a, b) = (root.intermediate("A"), root.intermediate("B"));
    let mut mount = SecretMount::new(&a, &root);
    let ca = CertificateAuthority::load_or_create(mount.dir.path(), "cluster.local").unwrap();
    let metrics = ReloadMetrics::default();
    let ca_metrics = CaMetrics::default();
    let rx = follow(ca, metrics.clone(), ca_metrics.clone());
    assert_eq!(rx.borrow().signing_cert(), &a.der());

    mount.update(&b, &root);
    wait_for("intermediate B published", || rx.borrow().signing_cert() == &b.der()).await;
    assert_eq!(metrics.get("updated"), 1);
    assert_eq!(
        ca_metrics.cert_chain_expiry_timestamp.get(),
        rx.borrow().cert_chain_not_after_unix().unwrap()
    );

    let other = TestCa::root("Other root");
    mount.update(&other.intermediate("C"), &other);
    wait_for("root change counted", || metrics.get("root_changed") >= 1).await;
    assert_eq!(rx.borrow().signing_cert(), &b.der(), "B keeps signing");

    mount.update_with(&root.intermediate("D"), &root, |data| {
        std::fs::write(data.join("ca-key.pem"), a.key.serialize_pem()).unwrap();
    });
    wait_for("invalid counted", || metrics.get("invalid") >= 1).await;
    assert_eq!(rx.borrow().signing_cert(), &b.der(), "B keeps signing");
}

/// A self-signed root is not followed: nothing watches its directory.
#[tokio::test]
async fn a_self_signed_root_is_not_followed() {
    let tmp = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::load_or_create(tmp.path(), "cluster.local").unwrap();
    let mut rx = follow(ca, ReloadMetrics::default(), CaMetrics::default());
    assert!(rx.changed().await.is_err(), "no sender: nothing will replace the CA");
}
