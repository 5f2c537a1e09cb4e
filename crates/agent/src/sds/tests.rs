//! The secret manager with mounted files and the SDS server over its Unix socket, played by a
//! tonic client as Envoy: what is asked is answered, a changed file is pushed on the same stream,
//! an ACK is not answered, and readiness waits for the workload certificate.

use std::path::Path;
use std::time::Duration;

use prost::Message;
use rcgen::{CertificateParams, KeyPair, SanType};
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::transport::Endpoint;
use xds_api::envoy::extensions::transport_sockets::tls::v3::{Secret, secret};
use xds_api::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use xds_api::envoy::service::secret::v3::secret_discovery_service_client::SecretDiscoveryServiceClient;

use super::*;
use crate::config::SecretConfig;

const ID: &str = "spiffe://cluster.local/ns/default/sa/reviews";

pub(super) fn config() -> SecretConfig {
    SecretConfig {
        ttl: Duration::from_secs(3600),
        grace_period_ratio: 0.5,
        grace_period_ratio_jitter: 0.01,
        key: crate::config::WorkloadKey::EcdsaP256,
    }
}

/// Writes a self-signed workload certificate, its key and a root into `dir` (Istio's
/// `./etc/certs` layout); returns the certificate PEM.
pub(super) fn write_certs(dir: &Path) -> String {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.subject_alt_names = vec![SanType::URI(ID.to_owned().try_into().unwrap())];
    let cert = params.self_signed(&key).unwrap().pem();
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("cert-chain.pem"), &cert).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    std::fs::write(dir.join("root-cert.pem"), &cert).unwrap();
    cert
}

#[tokio::test]
async fn mounted_files_and_file_names_are_served_and_unknown_names_say_what_is() {
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("etc/certs");
    let cert = write_certs(&certs);
    let m = SecretManager::new(ID.into(), None, config(), certs.clone());
    match m.generate(WORKLOAD).await.unwrap() {
        SecretItem::Certificate { cert_chain_pem, .. } => assert_eq!(cert_chain_pem, cert),
        other => panic!("{other:?}"),
    }
    assert!(matches!(m.generate(ROOT).await.unwrap(), SecretItem::Root { .. }));
    let root = format!("file-root:{}", certs.join("root-cert.pem").display());
    assert_eq!(
        m.generate(&root).await.unwrap(),
        SecretItem::Root { root_pem: cert.clone() }
    );
    let pair = format!(
        "file-cert:{}~{}",
        certs.join("cert-chain.pem").display(),
        certs.join("key.pem").display()
    );
    assert!(matches!(
        m.generate(&pair).await.unwrap(),
        SecretItem::Certificate { .. }
    ));
    let e = m.generate("other").await.unwrap_err().to_string();
    assert!(e.contains("unknown secret \"other\"") && e.contains("ROOTCA"), "{e}");
    let e = m
        .generate("file-root:/nonexistent/root.pem")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("/nonexistent/root.pem"), "{e}");

    // no files and no CA: nothing to sign with, and the error says so
    let bare = SecretManager::new(ID.into(), None, config(), tmp.path().join("none"));
    assert!(bare.generate(WORKLOAD).await.unwrap_err().to_string().contains("no CA"));
}

fn secrets_of(r: &DiscoveryResponse) -> Vec<Secret> {
    r.resources
        .iter()
        .map(|a| Secret::decode(a.value.as_slice()).unwrap())
        .collect()
}

#[tokio::test]
async fn sds_answers_envoys_names_pushes_changed_files_and_gates_readiness() {
    let tmp = tempfile::tempdir().unwrap();
    let certs = tmp.path().join("etc/certs");
    write_certs(&certs);
    let manager = SecretManager::new(ID.into(), None, config(), certs.clone());
    tokio::spawn(manager.clone().run());
    let socket = tmp.path().join("SDS");
    let server = SdsServer::start(&socket, manager).unwrap();
    let status = server.status();
    assert_eq!(status.pending(), None, "nothing asked yet");

    let channel = Endpoint::from_shared(format!("unix://{}", socket.display()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let (tx, rx) = mpsc::unbounded_channel();
    let mut inbound = SecretDiscoveryServiceClient::new(channel)
        .stream_secrets(UnboundedReceiverStream::new(rx))
        .await
        .unwrap()
        .into_inner();
    let ask = |nonce: &str, version: &str| DiscoveryRequest {
        resource_names: vec!["default".into(), "ROOTCA".into()],
        type_url: "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret".into(),
        response_nonce: nonce.into(),
        version_info: version.into(),
        ..Default::default()
    };
    tx.send(ask("", "")).unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), inbound.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let secrets = secrets_of(&first);
    assert_eq!(
        secrets.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
        ["default", "ROOTCA"]
    );
    assert!(matches!(secrets[0].r#type, Some(secret::Type::TlsCertificate(_))));
    assert!(matches!(secrets[1].r#type, Some(secret::Type::ValidationContext(_))));
    assert!(status.pending().is_some(), "asked, not yet ACKed");

    // the ACK is not answered, and readiness passes
    tx.send(ask(&first.nonce, &first.version_info)).unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(300), inbound.message())
            .await
            .is_err()
    );
    assert_eq!(status.pending(), None);

    // new files: pushed on the same stream
    std::thread::sleep(Duration::from_millis(1100)); // a new modification time
    let new_cert = write_certs(&certs);
    let pushed = tokio::time::timeout(Duration::from_secs(10), inbound.message())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_ne!(pushed.version_info, first.version_info);
    match &secrets_of(&pushed)[0].r#type {
        Some(secret::Type::TlsCertificate(c)) => {
            let bytes = match c.certificate_chain.as_ref().and_then(|d| d.specifier.as_ref()) {
                Some(xds_api::envoy::config::core::v3::data_source::Specifier::InlineBytes(b)) => b.clone(),
                other => panic!("{other:?}"),
            };
            assert_eq!(String::from_utf8(bytes).unwrap(), new_cert);
        }
        other => panic!("{other:?}"),
    }
}
