//! TLS to pilot-discovery: a CA-signed serving certificate for `istiod.istio-system.svc`, the
//! bearer token seen upstream, and a wrong root that never connects.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use xds_api::type_url::CLUSTER;

use super::fake::FakeUpstream;
use super::{EnvoyClient, sotw_request, sotw_response, start_proxy};
use crate::xds_proxy::{DEFAULT_SERVER_NAME, UpstreamTls};

/// A CA (its PEM written to `<dir>/<name>`) and a serving cert and key for istiod signed by it.
fn pki(dir: &Path, name: &str) -> (PathBuf, (String, String)) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![DEFAULT_SERVER_NAME.to_owned()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let root = dir.join(name);
    std::fs::write(&root, ca.pem()).unwrap();
    (root, (cert.pem(), key.serialize_pem()))
}

#[tokio::test]
async fn tls_upstream_sees_the_bearer_token() {
    let dir = tempfile::tempdir().unwrap();
    let (root, identity) = pki(dir.path(), "root-cert.pem");
    let token = dir.path().join("istio-token");
    std::fs::write(&token, "eyJhbGciOi.payload.sig\n").unwrap();
    let mut upstream = FakeUpstream::start_on(0, Some(identity));
    let proxy = start_proxy(dir.path(), upstream.addr, |cfg| {
        cfg.tls = Some(UpstreamTls::new(&root).with_token(&token));
    })
    .await;
    let mut envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    envoy.send(sotw_request(CLUSTER, "", ""));
    let mut stream = upstream.next_sotw().await;
    assert_eq!(
        stream.metadata.get("authorization").unwrap(),
        "Bearer eyJhbGciOi.payload.sig"
    );
    assert_eq!(stream.metadata.get("clusterid").unwrap(), "Kubernetes");
    assert_eq!(stream.recv().await.type_url, CLUSTER);
    stream.send(sotw_response(CLUSTER, "v1", "n1", vec![]));
    assert_eq!(envoy.recv().await.version_info, "v1");
}

#[tokio::test]
async fn an_untrusted_upstream_certificate_never_connects() {
    let dir = tempfile::tempdir().unwrap();
    let (_, identity) = pki(dir.path(), "served-by.pem");
    let (other_root, _) = pki(dir.path(), "other-root.pem");
    let mut upstream = FakeUpstream::start_on(0, Some(identity));
    let proxy = start_proxy(dir.path(), upstream.addr, |cfg| {
        cfg.tls = Some(UpstreamTls::new(&other_root));
    })
    .await;
    let mut envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    envoy.send(sotw_request(CLUSTER, "", ""));
    upstream.expect_no_stream(Duration::from_millis(800)).await;
    envoy.expect_silence(Duration::from_millis(10)).await;
    assert!(proxy.metrics().istiod_connection_failures.get() >= 2);
}
