//! The scenarios in process: a real pilot-discovery, 10 services, 5 sidecars.

use std::time::Duration;

use loadgen::{LoadOptions, MeshSpec, Scenario};

fn options(scenario: Scenario, delta: bool) -> LoadOptions {
    LoadOptions {
        mesh: MeshSpec {
            services: 10,
            endpoints: 2,
            virtual_services: 1,
            destination_rules: 1,
        },
        proxies: 5,
        scenario,
        delta,
        debounce_after: "20ms".to_owned(),
        timeout: Duration::from_secs(60),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_proxy_converges_on_connect() {
    let report = loadgen::run(&options(Scenario::Connect, false)).await.unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.converged, 5, "{}", report.table());
    assert!(report.convergence_p99_ms.is_some_and(|p| p > 0.0));
    assert!(report.bytes_sent > 0);
    assert!(report.discovery_rss_mb.is_some_and(|mb| mb > 0.0));
    let json = report.to_json();
    assert_eq!(json["proxies"], 5);
    assert!(json["raw_p99_ms"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_proxy_acks_the_changed_routes_and_endpoints() {
    for (scenario, delta) in [
        (Scenario::ConfigChange, false),
        (Scenario::ConfigChange, true),
        (Scenario::EndpointChurn, false),
        (Scenario::EndpointChurn, true),
    ] {
        let report = loadgen::run(&options(scenario, delta)).await.unwrap();
        assert!(
            report.errors.is_empty(),
            "{scenario:?} delta={delta}: {:?}",
            report.errors
        );
        assert_eq!(report.converged, 5, "{scenario:?} delta={delta}: {}", report.table());
        assert!(report.connect_p50_ms.is_some() && report.convergence_p50_ms.is_some());
        // A config change is followed by its raw limit: the same responses, replayed.
        let raw = scenario == Scenario::ConfigChange;
        assert_eq!(report.raw_p99_ms.is_some(), raw, "{}", report.table());
        assert_eq!(report.to_json()["raw_ratio"].is_number(), raw);
    }
}
