//! The serving certificate as a TLS client sees it: a new handshake gets the new certificate,
//! an established connection keeps working; files replaced on disk are served; a broken
//! replacement is refused and the last good certificate kept.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ca::CertificateAuthority;
use prometheus_client::metrics::counter::Counter;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::client::TlsStream;

use super::source::TlsFiles;
use super::*;

fn names(ttl: Duration) -> Names {
    Names {
        dns: vec!["istiod.istio-system.svc".into()],
        ips: vec![],
        ttl,
    }
}

/// An echo server over TLS whose certificate comes from `bundles`.
async fn echo_server(bundles: Bundles) -> std::net::SocketAddr {
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_cert_resolver(Resolver::new(bundles));
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = [0u8; 64];
                while let Ok(n) = tls.read(&mut buf).await {
                    if n == 0 || tls.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

async fn connect(addr: std::net::SocketAddr, root_pem: &str) -> TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(root_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = ServerName::try_from("istiod.istio-system.svc").unwrap();
    connector.connect(name, tcp).await.unwrap()
}

fn served_serial(tls: &TlsStream<TcpStream>) -> String {
    let certs = tls.get_ref().1.peer_certificates().unwrap();
    let (_, x509) = x509_parser::parse_x509_certificate(&certs[0]).unwrap();
    x509.raw_serial_as_string().replace(':', "")
}

async fn echo(tls: &mut TlsStream<TcpStream>, what: &[u8]) -> Vec<u8> {
    tls.write_all(what).await.unwrap();
    let mut buf = vec![0u8; what.len()];
    tls.read_exact(&mut buf).await.unwrap();
    buf
}

#[tokio::test]
async fn a_short_lived_certificate_is_signed_again_and_new_handshakes_get_it() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Arc::new(CertificateAuthority::load_or_create(dir.path(), "cluster.local").unwrap());
    let root = ca.root_cert_pem().to_owned();
    let (_ca_tx, ca_rx) = tokio::sync::watch::channel(ca);
    let errors = Counter::default();
    let mut bundles = rotate(ca_rx, names(Duration::from_secs(4)), errors.clone()).unwrap();
    let first = bundles.borrow_and_update().clone();
    let wait = rotation::renew_in(&first, SystemTime::now());
    assert!(
        wait <= Duration::from_secs(2) && wait >= Duration::from_secs(1),
        "{wait:?}"
    );
    let addr = echo_server(bundles.clone()).await;
    let mut old = connect(addr, &root).await;
    assert_eq!(served_serial(&old), first.serial);

    tokio::time::timeout(Duration::from_secs(10), bundles.changed())
        .await
        .expect("signed again within 10 s")
        .unwrap();
    let second = bundles.borrow_and_update().clone();
    assert_ne!(second.serial, first.serial);
    assert!(second.not_after > first.not_after);
    assert_eq!(second.ca_bundle_pem, root, "the same CA: the same CA bundle");
    let new = connect(addr, &root).await;
    assert_eq!(
        served_serial(&new),
        second.serial,
        "a new handshake gets the new certificate"
    );
    assert_eq!(
        echo(&mut old, b"still here").await,
        b"still here",
        "the old connection lives"
    );
    assert_eq!(errors.get(), 0);
}

#[tokio::test]
async fn a_new_signing_ca_signs_at_once_and_its_roots_become_the_ca_bundle() {
    let dir = tempfile::tempdir().unwrap();
    let ca = Arc::new(CertificateAuthority::load_or_create(dir.path(), "cluster.local").unwrap());
    let (ca_tx, ca_rx) = tokio::sync::watch::channel(ca);
    let mut bundles = rotate(ca_rx, names(Duration::from_secs(3600)), Counter::default()).unwrap();
    let first = bundles.borrow_and_update().clone();
    let other = tempfile::tempdir().unwrap();
    let next = Arc::new(CertificateAuthority::load_or_create(other.path(), "cluster.local").unwrap());
    let next_root = next.root_cert_pem().to_owned();
    ca_tx.send_replace(next);
    tokio::time::timeout(Duration::from_secs(5), bundles.changed())
        .await
        .expect("signed again at once")
        .unwrap();
    let second = bundles.borrow().clone();
    assert_ne!(second.serial, first.serial);
    assert_eq!(second.ca_bundle_pem, next_root);
}

fn write_files(dir: &std::path::Path, ca: &CertificateAuthority) -> TlsFiles {
    let issued = ca
        .issue_server_cert(&["istiod.istio-system.svc".to_owned()], &[], Duration::from_secs(3600))
        .unwrap();
    let files = TlsFiles {
        cert: dir.join("tls.crt"),
        key: dir.join("tls.key"),
        ca: dir.join("ca.crt"),
    };
    std::fs::write(&files.cert, issued.cert_chain_pem).unwrap();
    std::fs::write(&files.key, issued.key_pem).unwrap();
    std::fs::write(&files.ca, ca.root_cert_pem()).unwrap();
    files
}

#[tokio::test]
async fn files_replaced_on_disk_are_served_and_a_broken_pair_is_refused() {
    let ca_dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::load_or_create(ca_dir.path(), "cluster.local").unwrap();
    let tls_dir = tempfile::tempdir().unwrap();
    let files = write_files(tls_dir.path(), &ca);
    let errors = Counter::default();
    let mut bundles = watch_files(files.clone(), errors.clone()).unwrap();
    let first = bundles.borrow_and_update().clone();
    let addr = echo_server(bundles.clone()).await;
    assert_eq!(served_serial(&connect(addr, ca.root_cert_pem()).await), first.serial);

    // Another CA's certificate, key and root, written as a Secret update would.
    let other_dir = tempfile::tempdir().unwrap();
    let other = CertificateAuthority::load_or_create(other_dir.path(), "cluster.local").unwrap();
    write_files(tls_dir.path(), &other);
    tokio::time::timeout(Duration::from_secs(10), bundles.changed())
        .await
        .expect("reloaded within 10 s")
        .unwrap();
    let second = bundles.borrow_and_update().clone();
    assert_eq!(second.ca_bundle_pem, other.root_cert_pem());
    assert_eq!(
        served_serial(&connect(addr, other.root_cert_pem()).await),
        second.serial
    );

    // A key that does not belong to the certificate: refused, counted, the last good one kept.
    let stray = ca
        .issue_server_cert(&["x.example.com".to_owned()], &[], Duration::from_secs(60))
        .unwrap();
    let before = errors.get();
    std::fs::write(&files.key, stray.key_pem).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while errors.get() == before {
        assert!(tokio::time::Instant::now() < deadline, "the broken pair is noticed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(bundles.borrow().serial, second.serial);
    assert_eq!(
        served_serial(&connect(addr, other.root_cert_pem()).await),
        second.serial
    );
}

#[test]
fn a_bundle_whose_key_is_not_its_certificates_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let ca = CertificateAuthority::load_or_create(dir.path(), "cluster.local").unwrap();
    let a = ca
        .issue_server_cert(&["a.example.com".to_owned()], &[], Duration::from_secs(60))
        .unwrap();
    let b = ca
        .issue_server_cert(&["b.example.com".to_owned()], &[], Duration::from_secs(60))
        .unwrap();
    let e = KeyCertBundle::new(a.cert_chain_pem.clone(), b.key_pem, ca.root_cert_pem().to_owned()).unwrap_err();
    assert!(e.to_string().contains("istiod's certificate and key"), "{e}");
    let e = KeyCertBundle::new(a.cert_chain_pem, a.key_pem, "not a PEM".into()).unwrap_err();
    assert!(e.to_string().contains("the CA bundle"), "{e}");
}
