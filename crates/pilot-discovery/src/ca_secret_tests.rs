use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use serde_json::json;
use test_support::kube_api::FakeApiServer;

use super::*;

const TTL: Duration = Duration::from_secs(3600 * 24 * 365);

/// Two replicas (and a third started later) sign with one root: the first creates
/// `istio-ca-secret` as istiod does, the others read it; none overwrites it.
#[tokio::test]
async fn replicas_share_the_root_of_istio_ca_secret() {
    let api = FakeApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let client = crate::kubernetes::fake_api_client(&api, dir.path()).await;
    let (a, b) = tokio::join!(
        shared_root(client.clone(), "istio-system", "cluster.local", &DirBundle::Empty, TTL),
        shared_root(client.clone(), "istio-system", "cluster.local", &DirBundle::Empty, TTL),
    );
    let ((a, a_origin), (b, b_origin)) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b, "two replicas starting together sign with one root");
    let mut origins = [a_origin, b_origin];
    origins.sort_by_key(|o| *o == Origin::Existing);
    assert_eq!(origins, [Origin::Created, Origin::Existing]);

    let (later, origin) = shared_root(client.clone(), "istio-system", "cluster.local", &DirBundle::Empty, TTL)
        .await
        .unwrap();
    assert_eq!((later, origin), (a.clone(), Origin::Existing));

    // The Secret as istiod writes it.
    let secret = Api::<Secret>::namespaced(client, "istio-system")
        .get(CA_SECRET)
        .await
        .unwrap();
    assert_eq!(secret.type_.as_deref(), Some("istio.io/ca-root"));
    let data = secret.data.unwrap();
    let text = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
    assert_eq!(text("ca-cert.pem"), a.cert_pem);
    assert_eq!(text("root-cert.pem"), a.cert_pem);
    assert_eq!(text("ca-key.pem"), a.key_pem);
    assert_eq!(
        (text("cert-chain.pem"), text("key.pem")),
        (String::new(), String::new())
    );
    // A CA of it signs, with the root as the only root.
    let ca = ca::CertificateAuthority::from_self_signed_pem(dir.path(), &a, ca::CaSource::SharedSecret).unwrap();
    assert_eq!(ca.root_cert_pem(), a.cert_pem);
}

/// A root the CA directory kept from a start without the cluster is the one published, so the
/// workloads that trust it keep verifying; the Secret's root wins over the directory's afterwards.
#[tokio::test]
async fn the_directorys_root_is_published_and_then_the_secret_wins() {
    let api = FakeApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let client = crate::kubernetes::fake_api_client(&api, dir.path()).await;
    let kept = SelfSignedPem::generate("cluster.local", TTL).unwrap();
    let (root, origin) = shared_root(
        client.clone(),
        "istio-system",
        "cluster.local",
        &DirBundle::SelfSigned(kept.clone()),
        TTL,
    )
    .await
    .unwrap();
    assert_eq!((root, origin), (kept.clone(), Origin::Published));

    let other = SelfSignedPem::generate("cluster.local", TTL).unwrap();
    let (root, origin) = shared_root(
        client,
        "istio-system",
        "cluster.local",
        &DirBundle::SelfSigned(other),
        TTL,
    )
    .await
    .unwrap();
    assert_eq!((root, origin), (kept, Origin::Existing), "the Secret wins");
}

#[tokio::test]
async fn a_secret_without_the_key_is_a_clear_error() {
    let api = FakeApiServer::start().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let client = crate::kubernetes::fake_api_client(&api, dir.path()).await;
    api.apply(json!({"apiVersion": "v1", "kind": "Secret", "type": "istio.io/ca-root",
        "metadata": {"name": CA_SECRET, "namespace": "istio-system"},
        "data": {"ca-cert.pem": "LS0tLS0="}}))
        .unwrap();
    let e = shared_root(client, "istio-system", "cluster.local", &DirBundle::Empty, TTL)
        .await
        .unwrap_err();
    let msg = format!("{e:#}");
    assert!(
        msg.contains("istio-system/istio-ca-secret") && msg.contains("ca-key.pem"),
        "{msg}"
    );
}

/// The mirror keeps ROOT_CA_DIR's self-signed root equal to the shared one.
#[test]
fn the_directory_mirrors_the_shared_root() {
    let dir = tempfile::tempdir().unwrap();
    let ca_dir = dir.path().join("cacerts");
    let root = SelfSignedPem::generate("cluster.local", TTL).unwrap();
    mirror(&ca_dir, &DirBundle::Empty, &root);
    assert_eq!(ca::dir_bundle(&ca_dir).unwrap(), DirBundle::SelfSigned(root.clone()));
    assert_eq!(
        std::fs::read_to_string(ca_dir.join("root-cert.pem")).unwrap(),
        root.cert_pem
    );
    // A start without the cluster signs with the same root.
    let ca = ca::CertificateAuthority::load_or_create(&ca_dir, "cluster.local").unwrap();
    assert_eq!(ca.root_cert_pem(), root.cert_pem);
}
