//! The proxy's socket and lifecycle: a stale socket file is replaced, its directory created, and
//! stopping the proxy ends Envoy's stream, refuses new ones and removes the socket.

use prometheus_client::registry::Registry;
use xds_api::type_url::CLUSTER;

use super::fake::FakeUpstream;
use super::{EnvoyClient, sotw_request, sotw_response, start_proxy, within};
use crate::xds_proxy::{XdsProxy, XdsProxyConfig, XdsProxyError};

#[tokio::test]
async fn a_stale_socket_is_replaced_and_its_directory_created() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let path = dir.path().join("etc/istio/proxy/XDS");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, "left over by a previous agent").unwrap();
    let proxy = start_proxy(dir.path(), upstream.addr, |_| {}).await;
    assert_eq!(proxy.uds_path(), path);
    let mut envoy = EnvoyClient::sotw(&path).await;
    envoy.send(sotw_request(CLUSTER, "", ""));
    let mut stream = upstream.next_sotw().await;
    stream.recv().await;
    stream.send(sotw_response(CLUSTER, "v1", "n1", vec![]));
    assert_eq!(envoy.recv().await.version_info, "v1");
}

#[tokio::test]
async fn shutdown_ends_envoys_stream_and_removes_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let proxy = start_proxy(dir.path(), upstream.addr, |_| {}).await;
    let path = proxy.uds_path().to_owned();
    let mut envoy = EnvoyClient::sotw(&path).await;
    envoy.send(sotw_request(CLUSTER, "", ""));
    let mut stream = upstream.next_sotw().await;
    stream.recv().await;

    within("shutdown", proxy.shutdown()).await;
    assert!(envoy.ended().await.is_none(), "Envoy's stream ends cleanly");
    assert!(!path.exists(), "the socket is removed");
    // The upstream stream is cancelled with it.
    let end = within("upstream end", stream.requests.message()).await;
    assert!(!matches!(end, Ok(Some(_))), "{end:?}");
}

#[tokio::test]
async fn a_bad_socket_path_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    let cfg = XdsProxyConfig::new(file.join("XDS"), "127.0.0.1:15010");
    let err = XdsProxy::start(cfg, &mut Registry::default()).await.err().unwrap();
    assert!(matches!(err, XdsProxyError::Socket { .. }), "{err}");
    let cfg = XdsProxyConfig::new(dir.path().join("XDS"), "not a host port");
    let err = XdsProxy::start(cfg, &mut Registry::default()).await.err().unwrap();
    assert!(matches!(err, XdsProxyError::Upstream { .. }), "{err}");
}
