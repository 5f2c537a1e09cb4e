//! Delta (incremental) forwarding: metadata, order, ACK tracking and NDS interception, as for
//! state of the world.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use xds_api::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource};
use xds_api::type_url::{CLUSTER, LISTENER, NAME_TABLE};

use super::fake::FakeUpstream;
use super::{EnvoyClient, resource, start_proxy, within};

fn request(type_url: &str, nonce: &str, subscribe: &[&str]) -> DeltaDiscoveryRequest {
    DeltaDiscoveryRequest {
        type_url: type_url.to_owned(),
        response_nonce: nonce.to_owned(),
        resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

fn response(type_url: &str, nonce: &str, names: &[&str]) -> DeltaDiscoveryResponse {
    DeltaDiscoveryResponse {
        system_version_info: format!("sys-{nonce}"),
        type_url: type_url.to_owned(),
        nonce: nonce.to_owned(),
        resources: names
            .iter()
            .map(|name| Resource {
                name: name.to_string(),
                version: "1".into(),
                resource: Some(resource(type_url, name.as_bytes())),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

#[tokio::test]
async fn delta_forwards_both_ways_in_order_with_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let proxy = start_proxy(dir.path(), upstream.addr, |cfg| {
        cfg.cluster_id = "cluster-west".into();
        cfg.headers = vec![("x-revision".into(), "canary".into())];
    })
    .await;
    let mut envoy = EnvoyClient::delta(proxy.uds_path()).await;
    let first = request(CLUSTER, "", &[]);
    envoy.send(first.clone());
    let mut stream = upstream.next_delta().await;
    assert_eq!(stream.metadata.get("clusterid").unwrap(), "cluster-west");
    assert_eq!(stream.metadata.get("x-revision").unwrap(), "canary");
    assert_eq!(stream.recv().await, first);

    for i in 0..50 {
        stream.send(response(CLUSTER, &format!("n{i}"), &[&format!("cluster-{i}")]));
    }
    for i in 0..50 {
        let push = envoy.recv().await;
        assert_eq!(push.nonce, format!("n{i}"));
        assert_eq!(push.resources[0].name, format!("cluster-{i}"));
        envoy.send(request(CLUSTER, &push.nonce, &[]));
    }
    for i in 0..50 {
        assert_eq!(stream.recv().await.response_nonce, format!("n{i}"));
    }
}

#[tokio::test]
async fn delta_acks_drive_the_status() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let proxy = start_proxy(dir.path(), upstream.addr, |_| {}).await;
    let mut status = proxy.status();
    let mut envoy = EnvoyClient::delta(proxy.uds_path()).await;
    envoy.send(request(CLUSTER, "", &[]));
    let mut stream = upstream.next_delta().await;
    stream.recv().await;
    stream.send(response(CLUSTER, "c1", &["outbound|80||a.default.svc.cluster.local"]));
    envoy.recv().await;
    // A stale nonce is no ACK.
    envoy.send(request(CLUSTER, "c0", &[]));
    envoy.send(request(LISTENER, "", &[]));
    stream.send(response(LISTENER, "l1", &["0.0.0.0_8080"]));
    envoy.recv().await;
    envoy.send(request(LISTENER, "l1", &[]));
    within("LDS ACK", status.wait_for(|s| s.lds_acked)).await.unwrap();
    assert!(!status.borrow().cds_acked);
    envoy.send(request(CLUSTER, "c1", &[]));
    within("CDS ACK", status.wait_for(|s| s.config_received()))
        .await
        .unwrap();
}

#[tokio::test]
async fn delta_name_table_is_acked_by_the_agent() {
    let dir = tempfile::tempdir().unwrap();
    let mut upstream = FakeUpstream::start();
    let proxy = start_proxy(dir.path(), upstream.addr, |_| {}).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    proxy.register_handler(NAME_TABLE, move |any| {
        counter.fetch_add(1, Ordering::SeqCst);
        if any.value.is_empty() {
            Err("empty table".to_owned())
        } else {
            Ok(())
        }
    });
    let mut envoy = EnvoyClient::delta(proxy.uds_path()).await;
    envoy.send(request(LISTENER, "", &[]));
    let mut stream = upstream.next_delta().await;
    assert_eq!(stream.recv().await.type_url, LISTENER);
    assert_eq!(stream.recv().await, request(NAME_TABLE, "", &[]));

    stream.send(response(NAME_TABLE, "t1", &["table"]));
    let ack = stream.recv().await;
    assert_eq!((ack.type_url.as_str(), ack.response_nonce.as_str()), (NAME_TABLE, "t1"));
    assert_eq!(ack.error_detail, None);
    stream.send(response(NAME_TABLE, "t2", &[""]));
    let nack = stream.recv().await;
    assert_eq!(nack.response_nonce, "t2");
    assert_eq!(nack.error_detail.unwrap().message, "empty table");
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    stream.send(response(LISTENER, "l1", &["0.0.0.0_8080"]));
    assert_eq!(envoy.recv().await.type_url, LISTENER, "NDS never reaches Envoy");
}
