//! The raw phase: a recorded change split into handshake and push, replayed to simulated proxies
//! by the in-process server (no pilot-discovery), and the `raw` scenario end to end.

use std::time::{Duration, Instant};

use loadgen::proxy::{Recorded, Watched};
use loadgen::raw::{Capture, raw_phase};
use loadgen::{LoadOptions, MeshSpec, Scenario};
use xds_api::envoy::config::cluster::v3::{Cluster, cluster};
use xds_api::envoy::config::endpoint::v3::ClusterLoadAssignment;
use xds_api::envoy::config::listener::v3::{Filter, FilterChain, Listener, filter};
use xds_api::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, Rds, http_connection_manager::RouteSpecifier,
};
use xds_api::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};
use xds_api::{pack, pbwkt, type_url};

fn response(t: &str, nonce: &str, resources: Vec<pbwkt::Any>) -> DiscoveryResponse {
    DiscoveryResponse {
        type_url: t.into(),
        version_info: format!("v-{nonce}"),
        nonce: nonce.into(),
        resources,
        ..Default::default()
    }
}

fn eds_cluster() -> pbwkt::Any {
    pack(&Cluster {
        name: "outbound|8080||a".into(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(cluster::DiscoveryType::Eds as i32)),
        ..Default::default()
    })
}

fn endpoints() -> pbwkt::Any {
    pack(&ClusterLoadAssignment {
        cluster_name: "outbound|8080||a".into(),
        ..Default::default()
    })
}

fn listener() -> pbwkt::Any {
    let hcm = HttpConnectionManager {
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            route_config_name: "8080".into(),
            ..Default::default()
        })),
        ..Default::default()
    };
    pack(&Listener {
        name: "0.0.0.0_8080".into(),
        filter_chains: vec![FilterChain {
            filters: vec![Filter {
                name: "envoy.filters.network.http_connection_manager".into(),
                config_type: Some(filter::ConfigType::TypedConfig(pack(&hcm))),
            }],
            ..Default::default()
        }],
        ..Default::default()
    })
}

fn routes(host: &str) -> pbwkt::Any {
    pack(&RouteConfiguration {
        name: "8080".into(),
        virtual_hosts: vec![VirtualHost {
            name: host.into(),
            domains: vec![host.into()],
            ..Default::default()
        }],
        ..Default::default()
    })
}

/// What a sidecar receives for its handshake (CDS, EDS, LDS, RDS) and then for a route change.
fn recorded(t0: Instant) -> Vec<(Instant, Recorded)> {
    let at = |ms| t0 + Duration::from_millis(ms);
    vec![
        (at(1), response(type_url::CLUSTER, "h1", vec![eds_cluster()])),
        (at(2), response(type_url::ENDPOINT, "h2", vec![endpoints()])),
        (at(3), response(type_url::LISTENER, "h3", vec![listener()])),
        (at(4), response(type_url::ROUTE, "h4", vec![routes("old.example")])),
        (at(5), response(type_url::CLUSTER, "h5", vec![eds_cluster()])),
        (at(20), response(type_url::CLUSTER, "p1", vec![eds_cluster()])),
        (at(21), response(type_url::ENDPOINT, "p2", vec![endpoints()])),
        (at(22), response(type_url::LISTENER, "p3", vec![listener()])),
        (at(23), response(type_url::ROUTE, "p4", vec![routes("new.example")])),
        (at(40), response(type_url::ROUTE, "late", vec![routes("later.example")])),
    ]
    .into_iter()
    .map(|(at, r)| (at, Recorded::Sotw(r)))
    .collect()
}

fn nonces(rs: &[DiscoveryResponse]) -> Vec<&str> {
    rs.iter().map(|r| r.nonce.as_str()).collect()
}

#[test]
fn a_recording_splits_into_the_state_before_the_change_and_its_push() {
    let t0 = Instant::now();
    let made = t0 + Duration::from_millis(10);
    let acked = Some(t0 + Duration::from_millis(30));
    let Capture::Sotw(script) = Capture::new(recorded(t0), made, acked).unwrap() else {
        panic!("expected a state-of-the-world capture");
    };
    // State of the world: the last response of each type before the change, in first-seen order.
    assert_eq!(nonces(&script.handshake), vec!["h5", "h2", "h3", "h4"]);
    assert_eq!(nonces(&script.push), vec!["p1", "p2", "p3", "p4"]);

    let delta = |nonce: &str| DeltaDiscoveryResponse {
        type_url: type_url::CLUSTER.into(),
        nonce: nonce.into(),
        ..Default::default()
    };
    let rec = vec![
        (t0, Recorded::Delta(delta("d1"))),
        (t0, Recorded::Delta(delta("d2"))),
        (t0 + Duration::from_millis(20), Recorded::Delta(delta("d3"))),
    ];
    let Capture::Delta(script) = Capture::new(rec, made, acked).unwrap() else {
        panic!("expected a delta capture");
    };
    // Delta: every response before the change, since each carries only what changed.
    assert_eq!(script.handshake.len(), 2);
    assert_eq!(script.push[0].nonce, "d3");

    let err = Capture::new(recorded(t0), made, None).unwrap_err().to_string();
    assert!(err.contains("never ACKed the change"), "{err}");
    let err = Capture::new(
        recorded(t0),
        t0 + Duration::from_secs(1),
        Some(t0 + Duration::from_secs(2)),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("0 push responses"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replayed_push_reaches_and_is_acked_by_every_proxy() {
    let t0 = Instant::now();
    let capture = Capture::new(
        recorded(t0),
        t0 + Duration::from_millis(10),
        Some(t0 + Duration::from_millis(30)),
    )
    .unwrap();
    assert_eq!(capture.push_len(), 4);
    let push: usize = recorded(t0)[5..9]
        .iter()
        .map(|(_, r)| match r {
            Recorded::Sotw(r) => prost::Message::encoded_len(r),
            Recorded::Delta(r) => prost::Message::encoded_len(r),
        })
        .sum();
    assert_eq!(capture.push_bytes(), push as u64);
    let outcome = raw_phase(capture, Watched::Routes, 6, 4, false, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(outcome.errors.is_empty(), "{:?}", outcome.errors);
    assert_eq!(outcome.connect.len(), 6);
    assert_eq!(outcome.samples.len(), 6);
    assert!(outcome.samples.iter().all(|d| *d < Duration::from_secs(30)));
    // Handshake and push, every response received by all six.
    let sizes: usize = recorded(t0)[..9]
        .iter()
        .filter(|(_, r)| !matches!(r, Recorded::Sotw(r) if r.nonce == "h1"))
        .map(|(_, r)| match r {
            Recorded::Sotw(r) => prost::Message::encoded_len(r),
            Recorded::Delta(r) => prost::Message::encoded_len(r),
        })
        .sum();
    assert_eq!(outcome.bytes, 6 * sizes as u64);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_raw_scenario_replays_a_real_config_change() {
    for delta in [false, true] {
        let opts = LoadOptions {
            mesh: MeshSpec {
                services: 5,
                endpoints: 2,
                virtual_services: 1,
                destination_rules: 1,
                namespaces: 1,
                sidecar_scope: false,
            },
            proxies: 4,
            scenario: Scenario::Raw,
            delta,
            debounce_after: "20ms".to_owned(),
            timeout: Duration::from_secs(60),
            ..Default::default()
        };
        let report = loadgen::run(&opts).await.unwrap();
        assert!(report.errors.is_empty(), "delta={delta}: {:?}", report.errors);
        assert_eq!(report.converged, 4, "delta={delta}: {}", report.table());
        assert!(report.raw_p99_ms.is_some_and(|p| p > 0.0));
        assert_eq!(report.convergence_p99_ms, report.raw_p99_ms);
        assert!(report.bytes_sent > 0);
        let json = report.to_json();
        assert_eq!(json["scenario"], "raw");
        assert!(
            json["discovery_bin"]
                .as_str()
                .is_some_and(|b| b.ends_with("pilot-discovery"))
        );
    }
}
