//! State-of-the-world forwarding: metadata, order, a push storm against a slow Envoy, ACK
//! tracking, and the agent's own handling of NDS.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use xds_api::envoy::config::core::v3::Node;
use xds_api::envoy::service::discovery::v3::DiscoveryRequest;
use xds_api::type_url::{CLUSTER, LISTENER, NAME_TABLE, ROUTE};

use super::fake::FakeUpstream;
use super::{EnvoyClient, resource, sotw_request, sotw_response, start_proxy, within};

#[tokio::test]
async fn forwards_both_ways_with_cluster_id_and_xds_headers() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let proxy = start_proxy(dir.path(), upstream.addr, |cfg| {
        cfg.cluster_id = "cluster-east".into();
        cfg.headers = vec![("X-Tenant".into(), "blue".into())];
    })
    .await;
    let mut envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    let first = DiscoveryRequest {
        node: Some(Node {
            id: "router~10.0.0.1~gw.istio-system~istio-system.svc.cluster.local".into(),
            ..Default::default()
        }),
        ..sotw_request(CLUSTER, "", "")
    };
    envoy.send(first.clone());

    let mut stream = upstream.next_sotw().await;
    assert_eq!(stream.metadata.get("clusterid").unwrap(), "cluster-east");
    assert_eq!(stream.metadata.get("x-tenant").unwrap(), "blue");
    assert_eq!(stream.recv().await, first);

    let push = sotw_response(CLUSTER, "v1", "n1", vec![resource(CLUSTER, b"cluster-a")]);
    stream.send(push.clone());
    assert_eq!(envoy.recv().await, push);

    let ack = sotw_request(CLUSTER, "v1", "n1");
    envoy.send(ack.clone());
    assert_eq!(stream.recv().await, ack);
    assert_eq!(proxy.metrics().requests.get(), 2);
    assert_eq!(proxy.metrics().responses.get(), 1);
}

#[tokio::test]
async fn order_is_preserved_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let proxy = start_proxy(dir.path(), upstream.addr, |_| {}).await;
    let mut envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    for i in 0..200 {
        envoy.send(sotw_request(ROUTE, &format!("v{i}"), ""));
    }
    let mut stream = upstream.next_sotw().await;
    for i in 0..200 {
        stream.send(sotw_response(ROUTE, &format!("v{i}"), &format!("n{i}"), vec![]));
    }
    for i in 0..200 {
        assert_eq!(stream.recv().await.version_info, format!("v{i}"));
        assert_eq!(envoy.recv().await.nonce, format!("n{i}"));
    }
}

/// istio/istio#39209: upstream pushes 1,000 large responses while Envoy sends 1,000 large
/// requests and reads slowly. Nothing may deadlock; everything arrives, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn push_storm_against_a_slow_envoy_does_not_deadlock() {
    const N: usize = 1000;
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let proxy = start_proxy(dir.path(), upstream.addr, |_| {}).await;
    let mut envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    envoy.send(sotw_request(CLUSTER, "", ""));
    let mut stream = upstream.next_sotw().await;
    stream.recv().await;

    let payload = vec![b'x'; 64 * 1024];
    for i in 0..N {
        stream.send(sotw_response(
            CLUSTER,
            &format!("v{i}"),
            &format!("{i}"),
            vec![resource(CLUSTER, &payload)],
        ));
    }
    let names: Vec<String> = (0..200)
        .map(|j| format!("outbound|9080|v{j}|reviews.default.svc.cluster.local"))
        .collect();
    let requests = tokio::spawn(async move {
        for i in 0..N {
            let req = stream.recv().await;
            assert_eq!(req.version_info, format!("r{i}"), "requests out of order");
        }
        stream
    });
    let storm = async {
        for i in 0..N {
            let mut req = sotw_request(ROUTE, &format!("r{i}"), "");
            req.resource_names = names.clone();
            envoy.send(req);
        }
        for i in 0..N {
            let resp = envoy.recv().await;
            assert_eq!(resp.nonce, format!("{i}"), "responses out of order");
            assert_eq!(resp.resources[0].value.len(), payload.len());
            if i % 50 == 0 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(120), storm)
        .await
        .expect("push storm deadlocked");
    within("all requests upstream", requests).await.unwrap();
    assert_eq!(proxy.metrics().responses.get(), N as u64);
}

#[tokio::test]
async fn status_follows_envoys_cds_and_lds_acks_and_nacks() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let proxy = start_proxy(dir.path(), upstream.addr, |_| {}).await;
    let mut status = proxy.status();
    assert!(!status.borrow().upstream_connected);
    let mut envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    envoy.send(sotw_request(CLUSTER, "", ""));
    let mut stream = upstream.next_sotw().await;
    stream.recv().await;
    within("connected", status.wait_for(|s| s.upstream_connected))
        .await
        .unwrap();

    stream.send(sotw_response(CLUSTER, "c1", "nc1", vec![]));
    envoy.recv().await;
    envoy.send(sotw_request(CLUSTER, "c1", "nc1"));
    within("CDS ACK", status.wait_for(|s| s.cds_acked)).await.unwrap();
    assert!(!status.borrow().config_received());

    envoy.send(sotw_request(LISTENER, "", ""));
    stream.send(sotw_response(LISTENER, "l1", "nl1", vec![]));
    envoy.recv().await;
    let mut nack = sotw_request(LISTENER, "", "nl1");
    nack.error_detail = Some(xds_api::envoy_types::pb::google::rpc::Status {
        code: 3,
        message: "unknown filter".into(),
        details: vec![],
    });
    envoy.send(nack);
    within("NACK", status.wait_for(|s| s.last_nack.is_some()))
        .await
        .unwrap();
    assert_eq!(status.borrow().last_nack.as_deref(), Some("lds: unknown filter"));
    assert!(!status.borrow().lds_acked);

    stream.send(sotw_response(LISTENER, "l2", "nl2", vec![]));
    envoy.recv().await;
    envoy.send(sotw_request(LISTENER, "l2", "nl2"));
    within("LDS ACK", status.wait_for(|s| s.config_received()))
        .await
        .unwrap();
    assert_eq!(status.borrow().last_nack, None);
}

#[tokio::test]
async fn name_table_is_handled_and_acked_by_the_agent_never_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let proxy = start_proxy(dir.path(), upstream.addr, |_| {}).await;
    let seen = Arc::new(Mutex::new(Vec::new()));
    let tables = seen.clone();
    proxy.register_handler(NAME_TABLE, move |any| {
        tables.lock().unwrap().push(any.value.clone());
        if any.value == b"bad" {
            Err("malformed name table".to_owned())
        } else {
            Ok(())
        }
    });
    let mut envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    envoy.send(sotw_request(LISTENER, "", ""));
    let mut stream = upstream.next_sotw().await;
    assert_eq!(stream.recv().await.type_url, LISTENER);
    // After Envoy's first LDS request the agent subscribes to NDS itself.
    assert_eq!(stream.recv().await, sotw_request(NAME_TABLE, "", ""));

    stream.send(sotw_response(
        NAME_TABLE,
        "t1",
        "nt1",
        vec![resource(NAME_TABLE, b"table-1")],
    ));
    assert_eq!(stream.recv().await, sotw_request(NAME_TABLE, "t1", "nt1"), "agent ACK");
    stream.send(sotw_response(
        NAME_TABLE,
        "t2",
        "nt2",
        vec![resource(NAME_TABLE, b"bad")],
    ));
    let nack = stream.recv().await;
    assert_eq!(
        (nack.version_info.as_str(), nack.response_nonce.as_str()),
        ("t1", "nt2")
    );
    assert_eq!(nack.error_detail.unwrap().message, "malformed name table");
    assert_eq!(*seen.lock().unwrap(), vec![b"table-1".to_vec(), b"bad".to_vec()]);

    // Envoy sees only its own types: the next thing it gets is the listener push.
    stream.send(sotw_response(LISTENER, "l1", "nl1", vec![]));
    assert_eq!(envoy.recv().await.type_url, LISTENER);
    // A second LDS request does not subscribe again.
    envoy.send(sotw_request(LISTENER, "l1", "nl1"));
    assert_eq!(stream.recv().await.response_nonce, "nl1");
    stream.expect_silence(Duration::from_millis(200)).await;
}

#[tokio::test]
async fn unhandled_non_envoy_types_are_not_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let proxy = start_proxy(dir.path(), upstream.addr, |_| {}).await;
    let mut envoy = EnvoyClient::sotw(proxy.uds_path()).await;
    envoy.send(sotw_request(LISTENER, "", ""));
    let mut stream = upstream.next_sotw().await;
    stream.recv().await;
    stream.expect_silence(Duration::from_millis(200)).await;
    stream.send(sotw_response(NAME_TABLE, "t1", "nt1", vec![resource(NAME_TABLE, b"x")]));
    stream.send(sotw_response(LISTENER, "l1", "nl1", vec![]));
    assert_eq!(envoy.recv().await.type_url, LISTENER);
}
