//! EDS behaviour: locality grouping and weights, subset filtering, port matching, locality
//! priorities, empty answers; and the shared per-push caches of `generate`.

use std::sync::Arc;

use prost::Message;
use serde_json::json;
use xds_api::envoy::config::core::v3 as core;
use xds_api::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};

use crate::PushCache;
use crate::testing::{destination_rule, in_locality, proxy, push, reviews, service_entry, sidecar};

const REVIEWS: &str = "reviews.default.svc.cluster.local";

/// The assignments `generate` answers an EDS request for `names` with, on a fresh cache.
fn load_assignments(p: &push_index::PushContext, proxy: &model::Proxy, names: &[String]) -> Vec<ClusterLoadAssignment> {
    crate::generate(p, &PushCache::default(), proxy, xds_api::type_url::ENDPOINT, names)
        .unwrap()
        .iter()
        .map(|r| ClusterLoadAssignment::decode(r.resource.value.as_slice()).unwrap())
        .collect()
}

fn cla(p: &push_index::PushContext, proxy: &model::Proxy, name: &str) -> ClusterLoadAssignment {
    load_assignments(p, proxy, &[name.to_owned()]).remove(0)
}

/// (locality "region/zone", priority, locality weight, [(address:port, weight)]) per group.
type Group = (String, u32, u32, Vec<(String, u32)>);

fn groups(cla: &ClusterLoadAssignment) -> Vec<Group> {
    cla.endpoints
        .iter()
        .map(|g| {
            let l = g.locality.clone().unwrap_or_default();
            let eps = g
                .lb_endpoints
                .iter()
                .map(|e| {
                    let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                        panic!("no endpoint")
                    };
                    let Some(core::address::Address::SocketAddress(sa)) =
                        ep.address.as_ref().and_then(|a| a.address.as_ref())
                    else {
                        panic!("no socket address")
                    };
                    let Some(core::socket_address::PortSpecifier::PortValue(port)) = sa.port_specifier else {
                        panic!()
                    };
                    (
                        format!("{}:{port}", sa.address),
                        e.load_balancing_weight.as_ref().unwrap().value,
                    )
                })
                .collect();
            (
                format!("{}/{}", l.region, l.zone),
                g.priority,
                g.load_balancing_weight.as_ref().unwrap().value,
                eps,
            )
        })
        .collect()
}

fn ep(addr: &str, w: u32) -> (String, u32) {
    (addr.to_owned(), w)
}

#[test]
fn endpoints_are_grouped_by_locality_with_summed_weights() {
    let p = push(vec![reviews()]);
    let got = cla(&p, &sidecar("default"), &format!("outbound|9080||{REVIEWS}"));
    assert_eq!(got.cluster_name, format!("outbound|9080||{REVIEWS}"));
    assert_eq!(
        groups(&got),
        vec![
            (
                "us-east/zone-a".into(),
                0,
                2,
                vec![ep("10.1.0.1:9080", 1), ep("10.1.0.3:9080", 1)]
            ),
            ("us-east/zone-b".into(), 0, 3, vec![ep("10.1.0.2:9080", 3)]),
        ]
    );
}

#[test]
fn subsets_select_endpoints_by_labels() {
    let p = push(vec![
        reviews(),
        destination_rule(
            "reviews",
            "default",
            json!({"host": "reviews",
            "subsets": [{"name": "v1", "labels": {"version": "v1"}}, {"name": "v2", "labels": {"version": "v2"}}]}),
        ),
    ]);
    let proxy = sidecar("default");
    let v1 = cla(&p, &proxy, &format!("outbound|9080|v1|{REVIEWS}"));
    assert_eq!(
        groups(&v1),
        vec![(
            "us-east/zone-a".into(),
            0,
            2,
            vec![ep("10.1.0.1:9080", 1), ep("10.1.0.3:9080", 1)]
        )]
    );
    let v2 = cla(&p, &proxy, &format!("outbound|9080|v2|{REVIEWS}"));
    assert_eq!(
        groups(&v2),
        vec![("us-east/zone-b".into(), 0, 3, vec![ep("10.1.0.2:9080", 3)])]
    );
}

#[test]
fn endpoints_follow_the_service_port_name_to_their_target_port() {
    let p = push(vec![service_entry(
        "multi",
        "default",
        json!({
            "hosts": ["multi.default.svc.cluster.local"], "location": "MESH_INTERNAL", "resolution": "STATIC",
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}, {"number": 9090, "name": "metrics", "protocol": "HTTP"}],
            "endpoints": [{"address": "10.3.0.1", "ports": {"http": 8080, "metrics": 19090}}]
        }),
    )]);
    let proxy = sidecar("default");
    let http = cla(&p, &proxy, "outbound|80||multi.default.svc.cluster.local");
    assert_eq!(groups(&http)[0].3, vec![ep("10.3.0.1:8080", 1)]);
    let metrics = cla(&p, &proxy, "outbound|9090||multi.default.svc.cluster.local");
    assert_eq!(groups(&metrics)[0].3, vec![ep("10.3.0.1:19090", 1)]);
}

#[test]
fn unknown_or_non_eds_clusters_get_empty_assignments() {
    let p = push(vec![
        reviews(),
        service_entry(
            "api",
            "default",
            json!({"hosts": ["api.example.com"], "resolution": "DNS",
            "ports": [{"number": 443, "name": "tls", "protocol": "TLS"}]}),
        ),
        service_entry(
            "private",
            "other",
            json!({"hosts": ["private.example.com"], "resolution": "STATIC", "exportTo": ["."],
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}], "endpoints": [{"address": "10.4.0.1"}]}),
        ),
    ]);
    let names: Vec<String> = [
        "outbound|9080||nothere.default.svc.cluster.local",
        "outbound|9999||reviews.default.svc.cluster.local",
        "outbound|443||api.example.com",
        "outbound|80||private.example.com",
        "inbound|9080||",
        "not-a-cluster-name",
    ]
    .map(String::from)
    .to_vec();
    let got = load_assignments(&p, &sidecar("default"), &names);
    assert_eq!(got.iter().map(|c| c.cluster_name.clone()).collect::<Vec<_>>(), names);
    assert!(got.iter().all(|c| c.endpoints.is_empty()));
}

fn zoned_push(traffic_policy: serde_json::Value) -> push_index::PushContext {
    push(vec![
        service_entry(
            "svc",
            "default",
            json!({
                "hosts": ["svc.default.svc.cluster.local"], "location": "MESH_INTERNAL", "resolution": "STATIC",
                "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
                "endpoints": [
                    {"address": "10.0.1.1", "locality": "us-east/zone-a"},
                    {"address": "10.0.1.2", "locality": "us-east/zone-b"},
                    {"address": "10.0.2.1", "locality": "us-west/zone-a"},
                    {"address": "10.0.3.1", "locality": "eu-west/zone-a"}
                ]
            }),
        ),
        destination_rule(
            "svc",
            "default",
            json!({"host": "svc", "trafficPolicy": traffic_policy}),
        ),
    ])
}

fn priorities(cla: &ClusterLoadAssignment) -> Vec<(String, u32)> {
    groups(cla).into_iter().map(|(l, p, _, _)| (l, p)).collect()
}

fn proxy_in(locality: &str) -> model::Proxy {
    in_locality(sidecar("default"), locality)
}

const SVC: &str = "outbound|80||svc.default.svc.cluster.local";

#[test]
fn failover_priorities_follow_proximity_when_outlier_detection_is_set() {
    let p = zoned_push(json!({"outlierDetection": {"consecutive5xxErrors": 5}}));
    let got = cla(&p, &proxy_in("us-east/zone-a"), SVC);
    assert_eq!(
        priorities(&got),
        [
            ("eu-west/zone-a", 2),
            ("us-east/zone-a", 0),
            ("us-east/zone-b", 1),
            ("us-west/zone-a", 2)
        ]
        .map(|(l, p)| (l.into(), p))
    );
    // without outlier detection Envoy could never fail over: everything stays at priority 0
    let p = zoned_push(json!({"loadBalancer": {"simple": "ROUND_ROBIN"}}));
    assert!(
        priorities(&cla(&p, &proxy_in("us-east/zone-a"), SVC))
            .iter()
            .all(|(_, p)| *p == 0)
    );
}

#[test]
fn failover_regions_rank_the_named_region_before_the_others() {
    let p = zoned_push(json!({
        "outlierDetection": {"consecutive5xxErrors": 5},
        "loadBalancer": {"localityLbSetting": {"enabled": true, "failover": [{"from": "us-east", "to": "eu-west"}]}}
    }));
    let got = cla(&p, &proxy_in("us-east/zone-a"), SVC);
    assert_eq!(
        priorities(&got),
        [
            ("eu-west/zone-a", 2),
            ("us-east/zone-a", 0),
            ("us-east/zone-b", 1),
            ("us-west/zone-a", 3)
        ]
        .map(|(l, p)| (l.into(), p))
    );
}

/// Istio's `applyZoneAwareRegionalFailover`: the proxy's region first whatever the zone (Envoy
/// balances the zones), its `failover` region next, the rest last; no outlier detection needed.
#[test]
fn zone_aware_settings_rank_regions_and_leave_zones_to_envoy() {
    let p = zoned_push(json!({
        "loadBalancer": {"zoneAwareLbSetting": {"failover": [{"from": "us-east", "to": "eu-west"}]}}
    }));
    let got = cla(&p, &proxy_in("us-east/zone-a"), SVC);
    assert_eq!(
        priorities(&got),
        [
            ("eu-west/zone-a", 1),
            ("us-east/zone-a", 0),
            ("us-east/zone-b", 0),
            ("us-west/zone-a", 2)
        ]
        .map(|(l, p)| (l.into(), p))
    );
    // without failover: the other regions share the next priority
    let p = zoned_push(json!({"loadBalancer": {"zoneAwareLbSetting": {}}}));
    let got = priorities(&cla(&p, &proxy_in("us-west/zone-b"), SVC));
    assert_eq!(
        got,
        [
            ("eu-west/zone-a", 1),
            ("us-east/zone-a", 1),
            ("us-east/zone-b", 1),
            ("us-west/zone-a", 0)
        ]
        .map(|(l, p)| (l.into(), p))
    );
    // `enabled: false`: no partitioning at all
    let p = zoned_push(json!({"loadBalancer": {"zoneAwareLbSetting": {"enabled": false}}}));
    assert!(
        priorities(&cla(&p, &proxy_in("us-east/zone-a"), SVC))
            .iter()
            .all(|(_, p)| *p == 0)
    );
}

/// Istio's traffic distribution (`networking.istio.io/traffic-distribution` on a ServiceEntry,
/// `spec.trafficDistribution` on a Kubernetes Service): same zone first, then same region, then
/// the rest, by the proxy's topology labels, without any DestinationRule or outlier detection.
#[test]
fn traffic_distribution_prefers_the_proxys_zone_then_region() {
    let mut se = service_entry(
        "svc",
        "default",
        json!({
            "hosts": ["svc.default.svc.cluster.local"], "location": "MESH_INTERNAL", "resolution": "STATIC",
            "ports": [{"number": 80, "name": "http", "protocol": "HTTP"}],
            "endpoints": [
                {"address": "10.0.1.1", "locality": "us-east/zone-a"},
                {"address": "10.0.1.2", "locality": "us-east/zone-b"},
                {"address": "10.0.2.1", "locality": "us-west/zone-a"}
            ]
        }),
    );
    se["metadata"]["annotations"] = json!({"networking.istio.io/traffic-distribution": "PreferClose"});
    let p = push(vec![se]);
    let mut proxy = proxy_in("us-east/zone-a");
    proxy
        .labels
        .insert("topology.kubernetes.io/region".into(), "us-east".into());
    proxy
        .labels
        .insert("topology.kubernetes.io/zone".into(), "zone-a".into());
    assert_eq!(
        priorities(&cla(&p, &proxy, SVC)),
        [("us-east/zone-a", 0), ("us-east/zone-b", 1), ("us-west/zone-a", 2)].map(|(l, p)| (l.into(), p))
    );
}

#[test]
fn distribute_sets_locality_weights_and_drops_unlisted_localities() {
    let p = zoned_push(json!({"loadBalancer": {"localityLbSetting": {"distribute": [
        {"from": "us-east/*", "to": {"us-east/*": 80, "us-west/*": 20}}
    ]}}}));
    let got = groups(&cla(&p, &proxy_in("us-east/zone-a"), SVC));
    let weights: Vec<(String, u32, usize)> = got.into_iter().map(|(l, _, w, eps)| (l, w, eps.len())).collect();
    assert_eq!(
        weights,
        [
            ("eu-west/zone-a", 1, 0),
            ("us-east/zone-a", 40, 1),
            ("us-east/zone-b", 40, 1),
            ("us-west/zone-a", 20, 1)
        ]
        .map(|(l, w, n)| (l.into(), w, n))
    );
}

#[test]
fn generate_shares_encoded_resources_between_equal_proxies() {
    let p = push(vec![reviews()]);
    let names = vec![format!("outbound|9080||{REVIEWS}")];
    let cache = PushCache::default();
    let eds = xds_api::type_url::ENDPOINT;
    let a = crate::generate(&p, &cache, &sidecar("default"), eds, &names).unwrap();
    let b = crate::generate(
        &p,
        &cache,
        &proxy("sidecar", "default", json!({"app": "other"})),
        eds,
        &names,
    )
    .unwrap();
    assert!(
        Arc::ptr_eq(&a[0].resource, &b[0].resource),
        "one encoding per cluster and push"
    );
    let cds = xds_api::type_url::CLUSTER;
    let c1 = crate::generate(&p, &cache, &sidecar("default"), cds, &[]).unwrap();
    let c2 = crate::generate(&p, &cache, &sidecar("default"), cds, &[]).unwrap();
    assert!(Arc::ptr_eq(&c1[0].resource, &c2[0].resource));
    let other_ns = crate::generate(&p, &cache, &sidecar("other"), cds, &[]).unwrap();
    assert!(!Arc::ptr_eq(&c1[0].resource, &other_ns[0].resource));
    assert_eq!(
        c1.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
        [
            "outbound|9080||reviews.default.svc.cluster.local",
            "BlackHoleCluster",
            "PassthroughCluster",
            "InboundPassthroughCluster"
        ]
    );
    assert!(matches!(
        crate::generate(&p, &cache, &sidecar("default"), "type.googleapis.com/unknown.Type", &[]),
        Err(xds_api::GenerateError::UnsupportedType(_))
    ));
}
