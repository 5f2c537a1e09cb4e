//! Envoy's messages are bounded as pilot-discovery bounds them (issue 28): a request over
//! `ISTIO_GPRC_MAXRECVMSGSIZE` (default 4 MiB) ends Envoy's stream with tonic's status and is not
//! forwarded; the next stream works; a larger setting lets a larger request through.

use tonic::Code;
use xds_api::envoy::service::discovery::v3::DiscoveryRequest;
use xds_api::type_url::CLUSTER;

use super::super::DEFAULT_MAX_RECV_MSG_SIZE;
use super::fake::FakeUpstream;
use super::{EnvoyClient, sotw_request, sotw_response, start_proxy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_over_the_limit_ends_envoys_stream_and_is_not_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let proxy = start_proxy(dir.path(), upstream.addr, |_| {}).await;
    let mut envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    envoy.send(sotw_request(CLUSTER, "", ""));
    let mut stream = upstream.next_sotw().await;
    assert_eq!(stream.recv().await, sotw_request(CLUSTER, "", ""));
    stream.send(sotw_response(CLUSTER, "v1", "n1", vec![]));
    assert_eq!(envoy.recv().await.version_info, "v1");

    let huge = DiscoveryRequest {
        type_url: CLUSTER.to_owned(),
        resource_names: vec!["x".repeat(DEFAULT_MAX_RECV_MSG_SIZE)],
        ..Default::default()
    };
    envoy.send(huge);
    let ended = envoy
        .ended()
        .await
        .expect("the oversized request ends the stream with a status");
    assert!(
        matches!(ended.code(), Code::ResourceExhausted | Code::OutOfRange),
        "{ended:?}"
    );
    assert!(ended.message().contains("too large"), "{ended}");

    // nothing of it went upstream, and a new stream works
    let envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    envoy.send(sotw_request(CLUSTER, "v1", ""));
    let mut stream = upstream.next_sotw().await;
    let first = stream.recv().await;
    assert_eq!(first, sotw_request(CLUSTER, "v1", ""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_limit_is_the_configured_max_recv_msg_size() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    // ISTIO_GPRC_MAXRECVMSGSIZE=8 MiB: a 5 MiB request (over the default) is forwarded whole
    let proxy = start_proxy(dir.path(), upstream.addr, |cfg| cfg.max_recv_msg_size = 8 << 20).await;
    let envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    let big = DiscoveryRequest {
        type_url: CLUSTER.to_owned(),
        resource_names: vec!["x".repeat(5 << 20)],
        ..Default::default()
    };
    envoy.send(big.clone());
    let mut stream = upstream.next_sotw().await;
    assert_eq!(stream.recv().await, big);
    drop((envoy, stream, proxy));

    // ISTIO_GPRC_MAXRECVMSGSIZE=64 KiB: a 100 KiB request ends the stream
    let dir = tempfile::tempdir().unwrap();
    let proxy = start_proxy(dir.path(), upstream.addr, |cfg| cfg.max_recv_msg_size = 64 << 10).await;
    let mut envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    envoy.send(DiscoveryRequest {
        type_url: CLUSTER.to_owned(),
        resource_names: vec!["x".repeat(100 << 10)],
        ..Default::default()
    });
    let ended = envoy.ended().await.expect("the request over 64 KiB ends the stream");
    assert!(ended.message().contains("too large"), "{ended}");
}
