//! The push path: debouncing of config updates into snapshot builds, and a proxy that never
//! reads its stream not holding up pushes to others.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use test_support::ads::AdsClient;
use xds_api::envoy::service::discovery::v3::DiscoveryRequest;
use xds_api::type_url;
use xds_server::{PushRequest, PushSnapshot, ServerOptions, TriggerReason};

/// Subscribes to every type of the fake mesh, as Envoy does, and then never reads.
fn subscribe_without_reading(c: &mut AdsClient) {
    for (t, names) in [
        (type_url::CLUSTER, vec![]),
        (type_url::ENDPOINT, vec![A.to_string(), B.to_string(), C.to_string()]),
        (type_url::LISTENER, vec![]),
        (type_url::ROUTE, vec!["80".to_string()]),
    ] {
        c.send_raw(DiscoveryRequest {
            type_url: t.into(),
            resource_names: names,
            ..Default::default()
        })
        .unwrap();
    }
}

fn builds(ts: &TestServer) -> Vec<(tokio::time::Instant, PushRequest)> {
    ts.builds.lock().unwrap().clone()
}

#[tokio::test(start_paused = true)]
async fn a_change_is_built_at_once_and_a_burst_at_most_once_per_interval() {
    let ts = server(Mesh::basic(), ServerOptions::default()).await;
    assert_eq!(builds(&ts).len(), 1, "the initial snapshot");
    assert_eq!(builds(&ts)[0].1.reason.get(&TriggerReason::GlobalUpdate), Some(&1));

    // An isolated change (a config and an endpoint event together): built at once.
    let t0 = tokio::time::Instant::now();
    ts.server.config_update(PushRequest::full(TriggerReason::ConfigUpdate));
    ts.server.config_update(PushRequest::all_endpoints());
    tokio::time::sleep(Duration::from_millis(1)).await;
    let b = builds(&ts);
    assert_eq!(b.len(), 2);
    assert_eq!(b[1].0, t0);
    assert!(b[1].1.full);
    assert_eq!(b[1].1.reason.get(&TriggerReason::EndpointUpdate), Some(&1));
    assert_eq!(ts.server.current_snapshot().unwrap().version(), "v2");
    assert_eq!(ts.server.push_status().version, "v2");

    // A burst right after it: merged, one build per 100 ms (PILOT_DEBOUNCE_AFTER).
    tokio::time::sleep(Duration::from_millis(9)).await;
    for _ in 0..10 {
        ts.server.config_update(PushRequest::full(TriggerReason::ConfigUpdate));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let b = builds(&ts);
    let at: Vec<Duration> = b[2..].iter().map(|(t, _)| *t - t0).collect();
    assert_eq!(at, [100, 200].map(Duration::from_millis), "events at 10..190 ms");
    let merged: u32 = b[2..]
        .iter()
        .filter_map(|(_, r)| r.reason.get(&TriggerReason::ConfigUpdate))
        .sum();
    assert_eq!(merged, 10);
    assert_eq!(ts.metric("pilot_debounce_time_count"), Some(3.0));

    // Never quiet for 12 s: still a build every 100 ms, no more.
    let t1 = tokio::time::Instant::now();
    for _ in 0..400 {
        ts.server.config_update(PushRequest::full(TriggerReason::ConfigUpdate));
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let b = builds(&ts);
    let storm: Vec<_> = b.iter().filter(|(t, _)| *t >= t1).map(|(t, _)| *t).collect();
    assert!((115..=121).contains(&storm.len()), "{} builds in 12 s", storm.len());
    assert!(storm.windows(2).all(|w| w[1] - w[0] >= Duration::from_millis(100)));
}

#[tokio::test(start_paused = true)]
async fn eds_only_updates_skip_debounce_when_disabled() {
    let opts = ServerOptions {
        enable_eds_debounce: false,
        ..ServerOptions::default()
    };
    let ts = server(Mesh::basic(), opts).await;
    let t0 = tokio::time::Instant::now();
    ts.server.config_update(PushRequest::all_endpoints());
    tokio::time::sleep(Duration::from_millis(1)).await;
    let b = builds(&ts);
    assert_eq!(b.len(), 2);
    assert_eq!(b[1].0, t0);
    assert!(!b[1].1.full);
}

/// A proxy that subscribes to everything and then never reads: its responses (megabytes each)
/// fill its stream, and its task blocks. Pushes to the other proxy go on, even with a push
/// throttle of one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_never_reads_does_not_block_others() {
    let mesh = Mesh {
        padding: 1 << 20,
        ..Mesh::basic()
    };
    let opts = ServerOptions {
        push_throttle: 1,
        ..fast_options()
    };
    let ts = serve(mesh, opts).await;

    let mut slow = AdsClient::connect(
        ts.addr,
        "sidecar~10.1.0.2~slow.default~default.svc.cluster.local",
        metadata(),
    )
    .await
    .unwrap();
    subscribe_without_reading(&mut slow);

    let mut fast = AdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    fast.handshake(None).await.unwrap();
    for i in 0..4 {
        ts.set_mesh(|m| m.padding += 1);
        ts.server.config_update(PushRequest::full(TriggerReason::ConfigUpdate));
        let want = format!("v{}", i + 2);
        for t in [
            type_url::CLUSTER,
            type_url::ENDPOINT,
            type_url::LISTENER,
            type_url::ROUTE,
        ] {
            let r = tokio::time::timeout(Duration::from_secs(10), fast.expect_type(t))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(r.version(), want);
            fast.ack().unwrap();
        }
    }
    // The slow proxy is still connected and got at most what fits in its stream.
    let conns = ts.server.connections();
    let slow_status = conns
        .iter()
        .find(|c| c.connection_id.starts_with("slow.default-"))
        .unwrap();
    assert!(
        slow_status.watched.values().all(|w| w.version_sent != "v5"),
        "{slow_status:?}"
    );
    drop(slow);
}

/// Proxies that stop reading give their push slots up after the stall time (the push debounce),
/// not after a fixed wait: twenty of them, with two slots, delay a healthy proxy's handshake and
/// push by a few stall times, where a 2 s hold per stalled stream took tens of seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_proxies_cost_a_healthy_one_about_the_push_debounce() {
    let mesh = Mesh {
        padding: 1 << 20,
        ..Mesh::basic()
    };
    let opts = ServerOptions {
        push_throttle: 2,
        debounce_after: Duration::from_millis(100),
        ..ServerOptions::default()
    };
    let ts = serve(mesh, opts).await;
    let mut stalled = Vec::new();
    for i in 0..20 {
        let node = format!("sidecar~10.1.1.{i}~stalled-{i}.default~default.svc.cluster.local");
        let mut c = AdsClient::connect(ts.addr, &node, metadata()).await.unwrap();
        subscribe_without_reading(&mut c);
        stalled.push(c);
    }
    let t0 = std::time::Instant::now();
    let mut healthy = AdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    healthy.handshake(None).await.unwrap();

    ts.set_mesh(|m| m.padding += 1);
    ts.server.config_update(PushRequest::full(TriggerReason::ConfigUpdate));
    for t in [
        type_url::CLUSTER,
        type_url::ENDPOINT,
        type_url::LISTENER,
        type_url::ROUTE,
    ] {
        tokio::time::timeout(Duration::from_secs(30), healthy.expect_type(t))
            .await
            .unwrap()
            .unwrap();
        healthy.ack().unwrap();
    }
    let took = t0.elapsed();
    // About 2.7 s here (80 answers to stalled streams, two slots, 100 ms each at most); with a
    // 2 s hold per stalled stream, over 11 s.
    assert!(
        took < Duration::from_secs(8),
        "the healthy handshake and push took {took:?}"
    );
    drop(stalled);
}
