//! Split-horizon EDS and the endpoints a proxy may see, as Istio's `EndpointsByNetworkFilter` and
//! `filterIstioEndpoint`: endpoints on another network are reached through that network's
//! meshNetworks gateways (mTLS endpoints only), `REQUESTED_NETWORK_VIEW` narrows the networks
//! seen, and a cluster-local service keeps its callers in their cluster.

use std::sync::Arc;

use model::mesh_networks::{MeshNetworks, NetworkIndex};
use prost::Message;
use push_index::PushContext;
use serde_json::{Value, json};
use xds_api::envoy::config::core::v3 as core;
use xds_api::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};

use crate::PushCache;
use crate::testing::{node, push_input, service_entry};

const HOST: &str = "reviews.default.svc.cluster.local";

/// reviews with endpoints on three networks: n1 (10.1.0.1), n2 (two, mTLS), n3 (plaintext).
fn reviews() -> Value {
    let mtls = json!({"security.istio.io/tlsMode": "istio"});
    service_entry(
        "reviews",
        "default",
        json!({
            "hosts": [HOST], "location": "MESH_INTERNAL", "resolution": "STATIC",
            "ports": [{"number": 9080, "name": "http", "protocol": "HTTP"}],
            "endpoints": [
                {"address": "10.1.0.1", "network": "n1", "labels": mtls},
                {"address": "10.2.0.1", "network": "n2", "labels": mtls},
                {"address": "10.2.0.2", "network": "n2", "labels": mtls, "weight": 3},
                {"address": "10.3.0.1", "network": "n3"},
            ]
        }),
    )
}

fn networks(v: Value) -> Arc<NetworkIndex> {
    let m: MeshNetworks = serde_json::from_value(v).unwrap();
    Arc::new(NetworkIndex::new(&m))
}

fn gateways() -> Arc<NetworkIndex> {
    networks(json!({"networks": {
        "n2": {"endpoints": [{"fromRegistry": "c2"}], "gateways": [{"address": "192.0.2.2", "port": 15443}]},
        "n3": {"endpoints": [{"fromRegistry": "c3"}], "gateways": [{"address": "192.0.2.3", "port": 15443}]},
    }}))
}

fn sidecar(metadata: Value) -> model::Proxy {
    node("sidecar", "10.1.0.9", "default", "default", metadata)
}

/// `address:port` and weight of each endpoint, all localities together.
fn endpoints(p: &PushContext, proxy: &model::Proxy) -> Vec<(String, u32)> {
    let name = format!("outbound|9080||{HOST}");
    let got = crate::generate(p, &PushCache::default(), proxy, xds_api::type_url::ENDPOINT, &[name]).unwrap();
    let cla = ClusterLoadAssignment::decode(got[0].resource.value.as_slice()).unwrap();
    let mut out: Vec<(String, u32)> = cla
        .endpoints
        .iter()
        .flat_map(|g| &g.lb_endpoints)
        .map(|e| {
            let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                panic!("no endpoint")
            };
            let Some(core::address::Address::SocketAddress(sa)) = ep.address.as_ref().and_then(|a| a.address.as_ref())
            else {
                panic!("no socket address")
            };
            let Some(core::socket_address::PortSpecifier::PortValue(port)) = sa.port_specifier else {
                panic!("no port")
            };
            (
                format!("{}:{port}", sa.address),
                e.load_balancing_weight.as_ref().unwrap().value,
            )
        })
        .collect();
    out.sort();
    out
}

fn ep(a: &str, w: u32) -> (String, u32) {
    (a.to_owned(), w)
}

#[test]
fn without_gateways_every_endpoint_is_reached_directly() {
    let p = PushContext::new(push_input(Default::default(), vec![reviews()]));
    let got = endpoints(&p, &sidecar(json!({"NETWORK": "n1"})));
    let want = [
        ep("10.1.0.1:9080", 1),
        ep("10.2.0.1:9080", 1),
        ep("10.2.0.2:9080", 3),
        ep("10.3.0.1:9080", 1),
    ];
    assert_eq!(got, want);
}

#[test]
fn other_networks_are_reached_through_their_gateways_with_their_endpoints_weight() {
    let p = PushContext::new(push_input(Default::default(), vec![reviews()])).with_networks(gateways());
    // On n1: its own endpoint directly; n2's two mTLS endpoints (weights 1 and 3) through n2's
    // gateway, weight 4; n3's plaintext endpoint cannot cross a network.
    let got = endpoints(&p, &sidecar(json!({"NETWORK": "n1"})));
    assert_eq!(got, [ep("10.1.0.1:9080", 1), ep("192.0.2.2:15443", 4)]);
    // On n2: its own directly, n1's endpoint too (n1 has no gateway: reached as if flat).
    let got = endpoints(&p, &sidecar(json!({"NETWORK": "n2"})));
    assert_eq!(
        got,
        [ep("10.1.0.1:9080", 1), ep("10.2.0.1:9080", 1), ep("10.2.0.2:9080", 3)]
    );
    // A proxy of no network still goes through the gateways of networks that have them.
    let got = endpoints(&p, &sidecar(json!({})));
    assert_eq!(got, [ep("10.1.0.1:9080", 1), ep("192.0.2.2:15443", 4)]);
}

#[test]
fn two_gateways_into_a_network_share_its_endpoints_weight_evenly() {
    let two = networks(json!({"networks": {
        "n2": {"gateways": [{"address": "192.0.2.2", "port": 15443}, {"address": "192.0.2.22", "port": 15443}]},
    }}));
    let p = PushContext::new(push_input(Default::default(), vec![reviews()])).with_networks(two);
    // Weights scale by 2 (the gateways of n2) so that each endpoint splits evenly.
    let got = endpoints(&p, &sidecar(json!({"NETWORK": "n1"})));
    assert_eq!(
        got,
        [
            ep("10.1.0.1:9080", 2),
            ep("10.3.0.1:9080", 2),
            ep("192.0.2.22:15443", 4),
            ep("192.0.2.2:15443", 4),
        ]
    );
}

#[test]
fn a_requested_network_view_narrows_the_networks_seen() {
    let p = PushContext::new(push_input(Default::default(), vec![reviews()])).with_networks(gateways());
    let got = endpoints(
        &p,
        &sidecar(json!({"NETWORK": "n1", "REQUESTED_NETWORK_VIEW": "n1,n3"})),
    );
    assert_eq!(got, [ep("10.1.0.1:9080", 1)]);
}

#[test]
fn a_cluster_local_service_keeps_its_callers_in_their_cluster() {
    let mesh: model::MeshConfig = serde_json::from_value(json!({
        "serviceSettings": [{"settings": {"clusterLocal": true}, "hosts": [HOST]}]
    }))
    .unwrap();
    let mut input = push_input(mesh, vec![reviews()]);
    // The same endpoints, read from two clusters.
    let mut snapshot = (*input.registry).clone();
    let key = model::ServiceKey::new(HOST, "default");
    let mut eps = snapshot.endpoints_of(&key).to_vec();
    for (i, e) in eps.iter_mut().enumerate() {
        e.cluster_id = if i % 2 == 0 { "c1" } else { "c2" }.into();
    }
    snapshot.endpoints.insert(key, Arc::new(eps));
    input.registry = Arc::new(snapshot);
    let p = PushContext::new(input);
    let got = endpoints(&p, &sidecar(json!({"CLUSTER_ID": "c1"})));
    assert_eq!(got, [ep("10.1.0.1:9080", 1), ep("10.2.0.2:9080", 3)]);
    let got = endpoints(&p, &sidecar(json!({"CLUSTER_ID": "c2"})));
    assert_eq!(got, [ep("10.2.0.1:9080", 1), ep("10.3.0.1:9080", 1)]);
}
