//! State-of-the-world ADS behaviour against a fake snapshot: handshake, push order, ACK/NACK,
//! stale nonces, EDS subscription changes, refused nodes, metrics and debug views.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use test_support::ads::AdsClient;
use xds_api::envoy::config::endpoint::v3::ClusterLoadAssignment;
use xds_api::envoy::service::discovery::v3::DiscoveryRequest;
use xds_api::type_url;
use xds_server::{PushRequest, TriggerReason};

const QUIET: Duration = Duration::from_millis(300);

async fn connected() -> (TestServer, AdsClient) {
    let ts = serve(Mesh::basic(), fast_options()).await;
    let mut c = AdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    let hs = c.handshake(None).await.unwrap();
    assert_eq!(hs.clusters.unwrap().names, vec![A, B, C]);
    assert_eq!(hs.endpoints.unwrap().names, vec![A, B, C]);
    assert_eq!(hs.listeners.unwrap().names, vec!["0.0.0.0_80"]);
    // RDS names come from the listener's HTTP connection manager; "8080" is never asked for.
    assert_eq!(hs.routes.unwrap().names, vec!["80"]);
    (ts, c)
}

#[tokio::test]
async fn handshake_then_full_push_in_cds_eds_lds_rds_order() {
    let (ts, mut c) = connected().await;
    c.expect_no_response(QUIET).await.unwrap();
    ts.server.config_update(PushRequest::full(TriggerReason::ConfigUpdate));
    let mut order = Vec::new();
    for _ in 0..4 {
        let r = c.recv_ack().await.unwrap();
        assert_eq!(r.version(), "v2");
        order.push(r.type_url().to_owned());
    }
    assert_eq!(
        order,
        [
            type_url::CLUSTER,
            type_url::ENDPOINT,
            type_url::LISTENER,
            type_url::ROUTE
        ]
    );
    c.expect_no_response(QUIET).await.unwrap();

    let status = ts.push_status_checked();
    assert_eq!(status.version, "v2");
    assert_eq!(status.types["cds"].pushes, 1);
    assert_eq!(status.types["eds"].resources, 3);
}

#[tokio::test]
async fn nack_is_recorded_and_not_answered() {
    let (ts, mut c) = connected().await;
    ts.server.config_update(PushRequest::full(TriggerReason::ConfigUpdate));
    let cds = c.expect_type(type_url::CLUSTER).await.unwrap();
    c.nack("cluster outbound|80||a: bad config").unwrap();
    // The rest of the push still arrives; CDS is not resent.
    for t in [type_url::ENDPOINT, type_url::LISTENER, type_url::ROUTE] {
        c.expect_type(t).await.unwrap();
        c.ack().unwrap();
    }
    c.expect_no_response(QUIET).await.unwrap();

    let conn = &ts.server.connections()[0];
    let cds_status = &conn.watched[type_url::CLUSTER];
    assert_eq!(cds_status.last_error, "cluster outbound|80||a: bad config");
    assert_eq!(cds_status.nonce_nacked, cds.nonce());
    assert_ne!(cds_status.nonce_acked, cds.nonce());
    assert_eq!(ts.metric(r#"pilot_total_xds_rejects_total{type="cds"}"#), Some(1.0));
    assert_eq!(
        ts.metric(r#"pilot_xds_cds_reject{node="app-1.default",err="Internal"}"#),
        Some(1.0)
    );

    // The next push is ACKed: the error is cleared.
    ts.server.config_update(PushRequest::full(TriggerReason::ConfigUpdate));
    for _ in 0..4 {
        c.recv_ack().await.unwrap();
    }
    c.expect_no_response(QUIET).await.unwrap();
    assert_eq!(ts.server.connections()[0].watched[type_url::CLUSTER].last_error, "");
}

#[tokio::test]
async fn stale_nonce_is_ignored_and_counted() {
    let (ts, mut c) = connected().await;
    c.send_raw(DiscoveryRequest {
        type_url: type_url::ENDPOINT.into(),
        resource_names: vec![A.into()],
        response_nonce: "not-a-nonce-we-sent".into(),
        version_info: "v1".into(),
        ..Default::default()
    })
    .unwrap();
    c.expect_no_response(QUIET).await.unwrap();
    assert_eq!(ts.metric(r#"pilot_xds_expired_nonce_total{type="eds"}"#), Some(1.0));
    // The stale request did not change the subscription: a push still covers A, B and C.
    ts.server.config_update(PushRequest::all_endpoints());
    assert_eq!(c.recv_ack().await.unwrap().names, vec![A, B, C]);
}

#[tokio::test]
async fn eds_subscription_change_is_answered_with_the_new_set() {
    let ts = serve(Mesh::basic(), fast_options()).await;
    let mut c = AdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    c.request(type_url::CLUSTER, &[]).unwrap();
    c.recv_ack().await.unwrap();
    c.request(type_url::ENDPOINT, &[A]).unwrap();
    let eds = c.recv_ack().await.unwrap();
    assert_eq!(eds.names, vec![A]);
    assert_eq!(eds.decode::<ClusterLoadAssignment>().unwrap()[0].cluster_name, A);

    c.request(type_url::ENDPOINT, &[A, C]).unwrap();
    assert_eq!(c.recv_ack().await.unwrap().names, vec![A, C]);
    // Only a removal: nothing to send (Istio answers added names only).
    c.request(type_url::ENDPOINT, &[C]).unwrap();
    c.expect_no_response(QUIET).await.unwrap();
    ts.server.config_update(PushRequest::all_endpoints());
    assert_eq!(c.recv_ack().await.unwrap().names, vec![C]);
    // Empty names unsubscribe EDS: pushes skip it.
    c.request(type_url::ENDPOINT, &[]).unwrap();
    c.expect_no_response(QUIET).await.unwrap();
    ts.server.config_update(PushRequest::all_endpoints());
    c.expect_no_response(QUIET).await.unwrap();
}

#[tokio::test]
async fn eds_only_push_sends_only_eds() {
    let (ts, mut c) = connected().await;
    ts.set_mesh(|m| {
        m.clusters.insert(A.into(), vec!["10.0.0.9".into()]);
    });
    ts.server.config_update(PushRequest::all_endpoints());
    let r = c.expect_type(type_url::ENDPOINT).await.unwrap();
    c.ack().unwrap();
    assert_eq!(r.version(), "v2");
    let cla = &r.decode::<ClusterLoadAssignment>().unwrap()[0];
    assert_eq!(format!("{cla:?}").matches("10.0.0.9").count(), 1);
    c.expect_no_response(QUIET).await.unwrap();
}

#[tokio::test]
async fn malformed_node_is_refused_with_invalid_argument() {
    let ts = serve(Mesh::basic(), fast_options()).await;
    let mut c = AdsClient::connect(ts.addr, "sidecar~10.1.0.1~only-three", metadata())
        .await
        .unwrap();
    c.request(type_url::CLUSTER, &[]).unwrap();
    let status = c.recv_status().await.unwrap();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("sidecar~10.1.0.1~only-three"),
        "{}",
        status.message()
    );

    let bad_labels = serde_json::json!({"LABELS": ["not", "a", "map"]});
    let mut c = AdsClient::connect(ts.addr, NODE, bad_labels).await.unwrap();
    c.request(type_url::CLUSTER, &[]).unwrap();
    let status = c.recv_status().await.unwrap();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("LABELS"), "{}", status.message());

    // No node at all.
    let mut c = AdsClient::connect(ts.addr, "", metadata()).await.unwrap();
    c.send_raw(DiscoveryRequest {
        type_url: type_url::CLUSTER.into(),
        node: None,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(c.recv_status().await.unwrap().code(), tonic::Code::InvalidArgument);
    assert!(ts.server.connections().is_empty());
}

#[tokio::test]
async fn metrics_and_debug_views_follow_connections() {
    let (ts, mut c) = connected().await;
    assert_eq!(ts.metric(r#"pilot_xds{version="1.28.0"}"#), Some(1.0));
    assert_eq!(ts.metric(r#"pilot_xds_pushes_total{type="cds"}"#), Some(1.0));
    ts.server.config_update(PushRequest::full(TriggerReason::ConfigUpdate));
    for _ in 0..4 {
        c.recv_ack().await.unwrap();
    }
    assert_eq!(ts.metric(r#"pilot_xds_pushes_total{type="cds"}"#), Some(2.0));
    assert_eq!(ts.metric(r#"pilot_xds_pushes_total{type="rds"}"#), Some(2.0));
    assert_eq!(ts.metric(r#"pilot_push_triggers_total{type="config"}"#), Some(1.0));
    assert_eq!(ts.metric("pilot_debounce_time_count"), Some(1.0));
    assert_eq!(ts.metric(r#"pilot_xds_push_time_count{type="eds"}"#), Some(2.0));
    // Convergence is observed once the whole push is sent, just after the last response.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(ts.metric("pilot_proxy_convergence_time_count"), Some(1.0));

    let conns = ts.server.connections();
    assert_eq!(conns.len(), 1);
    let conn = &conns[0];
    assert!(
        conn.connection_id.starts_with("app-1.default-"),
        "{}",
        conn.connection_id
    );
    assert_eq!(conn.node_id, NODE);
    assert_eq!(conn.proxy_version, "1.28.0");
    assert!(conn.peer_address.starts_with("127.0.0.1:"));
    let eds = &conn.watched[type_url::ENDPOINT];
    assert_eq!(eds.names, vec![A, B, C]);
    assert_eq!(eds.version_sent, "v2");
    assert_eq!(eds.nonce_acked, eds.nonce_sent);
    let json = serde_json::to_value(&conns).unwrap();
    assert_eq!(json[0]["watched"][type_url::CLUSTER]["wildcard"], true);

    drop(c);
    for _ in 0..100 {
        if ts.server.connections().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(ts.server.connections().is_empty());
    assert_eq!(ts.metric(r#"pilot_xds{version="1.28.0"}"#), Some(0.0));
}

trait PushStatusExt {
    fn push_status_checked(&self) -> xds_server::PushStatus;
}

impl PushStatusExt for TestServer {
    fn push_status_checked(&self) -> xds_server::PushStatus {
        let s = self.server.push_status();
        assert!(!s.time.is_empty());
        assert!(s.full);
        s
    }
}

#[tokio::test]
async fn odd_requests_are_survived() {
    let ts = serve(Mesh::basic(), fast_options()).await;
    let mut c = AdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    // No type URL, a type the snapshot does not serve, a NACK of something never sent, an ACK
    // of a nonce never sent: none is answered, none ends the stream.
    c.send_raw(DiscoveryRequest::default()).unwrap();
    c.request(type_url::SECRET, &["default"]).unwrap();
    c.send_raw(DiscoveryRequest {
        type_url: type_url::LISTENER.into(),
        response_nonce: "x".into(),
        error_detail: Some(xds_api::envoy_types::pb::google::rpc::Status {
            code: 3,
            message: "?".into(),
            details: vec![],
        }),
        ..Default::default()
    })
    .unwrap();
    c.expect_no_response(QUIET).await.unwrap();
    let hs = c.handshake(Some(&["8080"])).await.unwrap();
    assert_eq!(hs.routes.unwrap().names, vec!["8080"]);
    assert_eq!(ts.server.connections().len(), 1);
}
