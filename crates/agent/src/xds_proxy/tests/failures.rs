//! Upstream failures: an upstream that dies or fails a stream ends Envoy's stream with a status;
//! a stream opened while the upstream is down waits with backoff and then works; a new Envoy
//! stream replaces the previous one.

use std::time::{Duration, Instant};

use tonic::{Code, Status};
use xds_api::type_url::{CLUSTER, LISTENER};

use super::fake::FakeUpstream;
use super::{EnvoyClient, sotw_request, sotw_response, start_proxy, within};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_death_ends_envoys_stream_and_a_new_stream_works_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let port = upstream.addr.port();
    let proxy = start_proxy(dir.path(), upstream.addr, |_| {}).await;
    let mut status = proxy.status();
    let mut envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    envoy.send(sotw_request(CLUSTER, "", ""));
    let mut stream = upstream.next_sotw().await;
    stream.recv().await;
    stream.send(sotw_response(CLUSTER, "v1", "n1", vec![]));
    envoy.recv().await;
    within("connected", status.wait_for(|s| s.upstream_connected))
        .await
        .unwrap();

    // The script's end of the stream lives until Envoy's stream has ended: dropping it ends the
    // upstream stream cleanly (grpc-status 0), which the proxy passes on as a clean end, as
    // Istio's does, if the killed server's connection task has not been dropped yet.
    upstream.kill();
    let ended = envoy
        .ended()
        .await
        .expect("Envoy's stream must end with an error status");
    drop(stream);
    assert_ne!(ended.code(), Code::Ok);
    assert!(ended.message().contains("upstream"), "{ended}");
    within("disconnected", status.wait_for(|s| !s.upstream_connected))
        .await
        .unwrap();

    // Envoy reconnects while pilot-discovery is still down: the stream waits.
    let mut envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    envoy.send(sotw_request(CLUSTER, "v1", ""));
    envoy.expect_silence(Duration::from_millis(300)).await;

    let mut upstream = FakeUpstream::start_on(port, None);
    let mut stream = upstream.next_sotw().await;
    assert_eq!(
        stream.recv().await,
        sotw_request(CLUSTER, "v1", ""),
        "the queued request goes upstream"
    );
    stream.send(sotw_response(CLUSTER, "v2", "n2", vec![]));
    assert_eq!(envoy.recv().await.version_info, "v2");
    within("reconnected", status.wait_for(|s| s.upstream_connected))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_stream_waits_with_backoff_while_upstream_is_down() {
    let dir = tempfile::tempdir().unwrap();
    let port = test_support::ports::free_port();
    let addr = ([127, 0, 0, 1], port).into();
    let proxy = start_proxy(dir.path(), addr, |_| {}).await;
    let mut envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    envoy.send(sotw_request(CLUSTER, "", ""));
    envoy.send(sotw_request(LISTENER, "", ""));
    let started = Instant::now();
    // Backoff 50ms doubling to 400ms: about 6 attempts in 1.5s, not a hot loop.
    envoy.expect_silence(Duration::from_millis(1500)).await;
    let failures = proxy.metrics().istiod_connection_failures.get();
    assert!(
        (3..=10).contains(&failures),
        "{failures} attempts in {:?}",
        started.elapsed()
    );

    let mut upstream = FakeUpstream::start_on(port, None);
    let mut stream = upstream.next_sotw().await;
    assert_eq!(stream.recv().await.type_url, CLUSTER);
    assert_eq!(stream.recv().await.type_url, LISTENER);
    stream.send(sotw_response(CLUSTER, "v1", "n1", vec![]));
    assert_eq!(envoy.recv().await.nonce, "n1");
    let after = proxy.metrics().istiod_connection_failures.get();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        proxy.metrics().istiod_connection_failures.get(),
        after,
        "no attempts once connected"
    );
}

#[tokio::test]
async fn an_upstream_error_status_reaches_envoy() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let proxy = start_proxy(dir.path(), upstream.addr, |_| {}).await;
    let mut envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    envoy.send(sotw_request(CLUSTER, "", ""));
    let mut stream = upstream.next_sotw().await;
    stream.recv().await;
    stream.send(sotw_response(CLUSTER, "v1", "n1", vec![]));
    envoy.recv().await;
    let _ = stream
        .responses
        .send(Err(Status::permission_denied("unauthorized node")));
    let ended = envoy.ended().await.expect("an error status");
    assert_eq!(ended.code(), Code::PermissionDenied);
    assert!(ended.message().contains("unauthorized node"), "{ended}");
    let terminations = proxy.metrics().istiod_connection_terminations.clone();
    let errors = terminations
        .get_or_create(&super::super::TerminationLabel { r#type: "error" })
        .get();
    assert_eq!(errors, 1);
}

#[tokio::test]
async fn a_new_envoy_stream_replaces_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let proxy = start_proxy(dir.path(), upstream.addr, |_| {}).await;
    let mut old = EnvoyClient::sotw(proxy.uds_path()).await;
    old.send(sotw_request(CLUSTER, "", ""));
    let mut old_upstream = upstream.next_sotw().await;
    old_upstream.recv().await;

    let mut new = EnvoyClient::sotw(proxy.uds_path()).await;
    assert!(old.ended().await.is_none(), "the old stream ends cleanly");
    new.send(sotw_request(CLUSTER, "", ""));
    let mut stream = upstream.next_sotw().await;
    stream.recv().await;
    stream.send(sotw_response(CLUSTER, "v1", "n1", vec![]));
    assert_eq!(new.recv().await.nonce, "n1");
    upstream.expect_no_stream(Duration::from_millis(100)).await;
}
