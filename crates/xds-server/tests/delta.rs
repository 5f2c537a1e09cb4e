//! Delta ADS behaviour against a fake snapshot: wildcard, subscribe/unsubscribe, changed-only
//! pushes with removed_resources, initial_resource_versions, NACK and refused nodes.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use test_support::ads::delta::DeltaAdsClient;
use xds_api::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use xds_api::type_url;
use xds_server::{PushRequest, TriggerReason};

const QUIET: Duration = Duration::from_millis(300);

#[tokio::test]
async fn wildcard_subscribe_unsubscribe_and_removed_resources() {
    let ts = serve(Mesh::basic(), fast_options()).await;
    let mut c = DeltaAdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    c.subscribe(type_url::CLUSTER, &[]).unwrap();
    let cds = c.recv_ack().await.unwrap();
    assert_eq!(cds.names(), vec![A, B, C]);
    assert_eq!(cds.raw.system_version_info, "v1");

    c.subscribe(type_url::ENDPOINT, &[A]).unwrap();
    assert_eq!(c.recv_ack().await.unwrap().names(), vec![A]);
    // Only the newly subscribed name is sent.
    c.subscribe(type_url::ENDPOINT, &[B]).unwrap();
    assert_eq!(c.recv_ack().await.unwrap().names(), vec![B]);
    // A name that does not exist is reported removed, so the proxy stops waiting for it.
    c.subscribe(type_url::ENDPOINT, &["outbound|80||missing"]).unwrap();
    let r = c.recv_ack().await.unwrap();
    assert!(r.names().is_empty());
    assert_eq!(r.removed(), ["outbound|80||missing"]);
    c.unsubscribe(type_url::ENDPOINT, &[A]).unwrap();
    c.expect_no_response(QUIET).await.unwrap();
    c.subscribe(type_url::LISTENER, &[]).unwrap();
    assert_eq!(c.recv_ack().await.unwrap().names(), vec!["0.0.0.0_80"]);

    // C goes away, B's endpoints change, A's (unsubscribed) too; listeners stay the same.
    ts.set_mesh(|m| {
        m.clusters.remove(C);
        m.clusters.insert(A.into(), vec!["10.9.9.1".into()]);
        m.clusters.insert(B.into(), vec!["10.9.9.2".into()]);
    });
    ts.server.config_update(PushRequest::full(TriggerReason::ConfigUpdate));
    let cds = c.recv_ack().await.unwrap();
    assert_eq!(cds.type_url(), type_url::CLUSTER);
    assert!(
        cds.names().is_empty(),
        "unchanged clusters are not resent: {:?}",
        cds.names()
    );
    assert_eq!(cds.removed(), [C]);
    let eds = c.recv_ack().await.unwrap();
    assert_eq!(eds.type_url(), type_url::ENDPOINT);
    assert_eq!(eds.names(), vec![B]);
    assert!(eds.removed().is_empty());
    c.expect_no_response(QUIET).await.unwrap();
    assert_eq!(c.resources(type_url::CLUSTER).keys().collect::<Vec<_>>(), vec![A, B]);

    let conn = &ts.server.connections()[0];
    assert!(conn.delta);
    assert_eq!(conn.watched[type_url::CLUSTER].resources, 2);
    assert_eq!(conn.watched[type_url::ENDPOINT].names, vec![B, "outbound|80||missing"]);
}

#[tokio::test]
async fn initial_resource_versions_are_respected() {
    let ts = serve(Mesh::basic(), fast_options()).await;
    let mut first = DeltaAdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    first.subscribe(type_url::CLUSTER, &[]).unwrap();
    first.recv_ack().await.unwrap();
    let mut have: BTreeMap<String, String> = first.resources(type_url::CLUSTER);
    have.insert(A.into(), "an-old-version".into());
    have.insert("outbound|80||gone".into(), "x".into());

    // A reconnecting proxy says what it has: only A (changed) is sent, and "gone" is removed.
    let mut c = DeltaAdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    c.subscribe_with(type_url::CLUSTER, &[], &have).unwrap();
    let r = c.recv_ack().await.unwrap();
    assert_eq!(r.names(), vec![A]);
    assert_eq!(r.removed(), ["outbound|80||gone"]);
    assert_eq!(c.resources(type_url::CLUSTER), first.resources(type_url::CLUSTER));
}

#[tokio::test]
async fn nack_is_counted_and_not_resent_and_stale_nonce_is_ignored() {
    let ts = serve(Mesh::basic(), fast_options()).await;
    let mut c = DeltaAdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    c.subscribe(type_url::CLUSTER, &[]).unwrap();
    c.recv_ack().await.unwrap();
    ts.set_mesh(|m| m.padding = 10);
    ts.server.config_update(PushRequest::full(TriggerReason::ConfigUpdate));
    let r = c.recv().await.unwrap();
    assert_eq!(r.names().len(), 3);
    c.nack("rejected").unwrap();
    c.expect_no_response(QUIET).await.unwrap();
    assert_eq!(ts.metric(r#"pilot_total_xds_rejects_total{type="cds"}"#), Some(1.0));
    assert_eq!(
        ts.server.connections()[0].watched[type_url::CLUSTER].last_error,
        "rejected"
    );

    c.send_raw(DeltaDiscoveryRequest {
        type_url: type_url::CLUSTER.into(),
        response_nonce: "stale".into(),
        ..Default::default()
    })
    .unwrap();
    c.expect_no_response(QUIET).await.unwrap();
    assert_eq!(ts.metric(r#"pilot_xds_expired_nonce_total{type="cds"}"#), Some(1.0));
}

#[tokio::test]
async fn malformed_node_is_refused() {
    let ts = serve(Mesh::basic(), fast_options()).await;
    let mut c = DeltaAdsClient::connect(ts.addr, "gateway~10.0.0.1~x.ns~ns.svc.cluster.local", metadata())
        .await
        .unwrap();
    c.subscribe(type_url::CLUSTER, &[]).unwrap();
    let status = c.recv_status().await.unwrap();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(status.message().contains("gateway"), "{}", status.message());
}

/// VHDS as Envoy speaks it: one subscription without names (namespace matching keeps route
/// configuration names out of requests) gets the virtual hosts of every route configuration the
/// proxy watches; a route configuration subscribed later has its hosts follow its RDS answer
/// unasked; a change sends the changed host alone, a host gone is removed.
#[tokio::test]
async fn vhds_follows_the_route_configurations_watched() {
    let ts = serve(Mesh::basic(), fast_options()).await;
    let mut c = DeltaAdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    c.subscribe(type_url::ROUTE, &["80"]).unwrap();
    assert_eq!(c.recv_ack().await.unwrap().names(), vec!["80"]);
    c.subscribe(type_url::VIRTUAL_HOST, &[]).unwrap();
    let vhds = c.recv_ack().await.unwrap();
    assert_eq!(vhds.type_url(), type_url::VIRTUAL_HOST);
    assert_eq!(vhds.names(), vec!["80/a", "80/b"]);

    // a second route configuration: RDS answers it, its hosts follow over VHDS
    c.subscribe(type_url::ROUTE, &["8080"]).unwrap();
    assert_eq!(c.recv_ack().await.unwrap().names(), vec!["8080"]);
    let follow_up = c.recv_ack().await.unwrap();
    assert_eq!(follow_up.type_url(), type_url::VIRTUAL_HOST);
    assert_eq!(follow_up.names(), vec!["8080/a", "8080/b"]);
    c.expect_no_response(QUIET).await.unwrap();

    // host a changes, host b goes: RDS is not resent
    ts.set_mesh(|m| {
        m.hosts.insert("a".into(), "a.example.org".into());
        m.hosts.remove("b");
    });
    ts.server.config_update(PushRequest::full(TriggerReason::ConfigUpdate));
    let change = c.recv_ack().await.unwrap();
    assert_eq!(change.type_url(), type_url::VIRTUAL_HOST);
    assert_eq!(change.names(), vec!["80/a", "8080/a"]);
    assert_eq!(change.removed(), ["80/b", "8080/b"]);
    c.expect_no_response(QUIET).await.unwrap();
    assert_eq!(
        c.resources(type_url::VIRTUAL_HOST).keys().collect::<Vec<_>>(),
        vec!["80/a", "8080/a"]
    );
}

/// A proxy that reconnects may ask VHDS again before RDS (an agent replaying its requests): the
/// request waits for the route configurations instead of removing every host the proxy says it
/// has; once RDS is asked, only the hosts whose versions differ are sent.
#[tokio::test]
async fn vhds_before_rds_waits_for_the_route_configurations() {
    let ts = serve(Mesh::basic(), fast_options()).await;
    let mut first = DeltaAdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    first.subscribe(type_url::ROUTE, &["80"]).unwrap();
    first.recv_ack().await.unwrap();
    first.subscribe(type_url::VIRTUAL_HOST, &[]).unwrap();
    first.recv_ack().await.unwrap();
    let mut have = first.resources(type_url::VIRTUAL_HOST);
    assert_eq!(have.len(), 2);
    have.insert("80/a".into(), "an-old-version".into());

    let mut again = DeltaAdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    again.subscribe_with(type_url::VIRTUAL_HOST, &[], &have).unwrap();
    again.expect_no_response(QUIET).await.unwrap();
    again.subscribe(type_url::ROUTE, &["80"]).unwrap();
    assert_eq!(again.recv_ack().await.unwrap().names(), vec!["80"]);
    let follow_up = again.recv_ack().await.unwrap();
    assert_eq!(follow_up.type_url(), type_url::VIRTUAL_HOST);
    assert_eq!(follow_up.names(), vec!["80/a"]);
    assert!(follow_up.removed().is_empty());
    again.expect_no_response(QUIET).await.unwrap();
}

/// Envoy warms a cluster that CDS adds or updates until it gets the cluster's
/// ClusterLoadAssignment, and asks nothing for a name it already subscribes to: a push that
/// changes clusters but not their endpoints (a DestinationRule's TLS mode, subsets' load
/// balancer) sends their assignments again, as Istio's EDS does on full pushes. So does a push
/// whose changes EDS skips, and a CDS answer to a proxy that reconnects with endpoints it has.
#[tokio::test]
async fn clusters_updated_without_their_endpoints_get_their_assignments_again() {
    let ts = serve(Mesh::basic(), fast_options()).await;
    let mut c = DeltaAdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    c.subscribe(type_url::CLUSTER, &[]).unwrap();
    c.recv_ack().await.unwrap();
    c.subscribe(type_url::ENDPOINT, &[A, B]).unwrap();
    assert_eq!(c.recv_ack().await.unwrap().names(), vec![A, B]);

    // Every cluster changes, no assignment does.
    ts.set_mesh(|m| m.padding = 10);
    ts.server.config_update(PushRequest::full(TriggerReason::ConfigUpdate));
    let cds = c.recv_ack().await.unwrap();
    assert_eq!(cds.names(), vec![A, B, C]);
    let eds = c.recv_ack().await.unwrap();
    assert_eq!(
        eds.type_url(),
        type_url::ENDPOINT,
        "the warming clusters' assignments follow"
    );
    assert_eq!(eds.names(), vec![A, B], "the watched ones: C is not subscribed");
    c.expect_no_response(QUIET).await.unwrap();

    // A VirtualService change skips EDS; had it changed clusters, their assignments follow.
    ts.set_mesh(|m| m.padding = 20);
    let vs = model::ConfigKey {
        kind: model::ConfigKind::VirtualService,
        namespace: "default".into(),
        name: "reviews".into(),
    };
    ts.server.config_update(PushRequest::configs([vs]));
    assert_eq!(c.recv_ack().await.unwrap().names(), vec![A, B, C]);
    let eds = c.recv_ack().await.unwrap();
    assert_eq!(eds.type_url(), type_url::ENDPOINT);
    assert_eq!(eds.names(), vec![A, B]);
    c.expect_no_response(QUIET).await.unwrap();

    // Unchanged clusters and assignments: nothing is sent.
    ts.server.config_update(PushRequest::full(TriggerReason::ConfigUpdate));
    c.expect_no_response(QUIET).await.unwrap();

    // A reconnect that replays EDS before CDS, with A's cluster out of date: A's assignment,
    // which the proxy has, follows the CDS answer.
    let endpoints = c.resources(type_url::ENDPOINT);
    let mut clusters = c.resources(type_url::CLUSTER);
    clusters.insert(A.into(), "an-old-version".into());
    let mut again = DeltaAdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    again.subscribe_with(type_url::ENDPOINT, &[A, B], &endpoints).unwrap();
    assert!(again.recv_ack().await.unwrap().names().is_empty());
    again.subscribe_with(type_url::CLUSTER, &[], &clusters).unwrap();
    assert_eq!(again.recv_ack().await.unwrap().names(), vec![A]);
    let eds = again.recv_ack().await.unwrap();
    assert_eq!(eds.type_url(), type_url::ENDPOINT);
    assert_eq!(eds.names(), vec![A]);
    again.expect_no_response(QUIET).await.unwrap();
}
