//! Sustained endpoint churn against a real pilot-discovery: 20 changes/s for 2 s over 5 services.

use std::time::Duration;

use loadgen::{ChurnOptions, LoadOptions, MeshSpec, Scenario};

fn options(delta: bool) -> LoadOptions {
    LoadOptions {
        mesh: MeshSpec {
            services: 5,
            endpoints: 2,
            virtual_services: 1,
            destination_rules: 1,
            namespaces: 1,
            sidecar_scope: false,
        },
        proxies: 3,
        scenario: Scenario::EndpointChurn,
        delta,
        churn: ChurnOptions {
            rate: 20.0,
            duration: Duration::from_secs(2),
        },
        debounce_after: "100ms".to_owned(),
        timeout: Duration::from_secs(60),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sustained_churn_reaches_every_proxy() {
    for delta in [false, true] {
        let report = loadgen::run(&options(delta)).await.unwrap();
        let table = report.table();
        assert!(report.errors.is_empty(), "delta={delta}: {:?}\n{table}", report.errors);
        assert_eq!(report.converged, 3, "{table}");
        let changes = report.churn_changes.unwrap();
        assert!((36..=41).contains(&changes), "{table}");
        let rate = report.churn_rate_achieved.unwrap();
        assert!((17.0..=21.0).contains(&rate), "{table}");
        let (p50, p99) = (report.churn_lag_p50_ms.unwrap(), report.churn_lag_p99_ms.unwrap());
        // Every lag includes the file watcher's and the push debounce: it is never instant.
        assert!(0.0 < p50 && p50 <= p99 && p99 < 30_000.0, "{table}");
        assert!(report.churn_lag_first10s_p99_ms.is_some() && report.churn_lag_last10s_p99_ms.is_some());
        assert!(
            report.churn_settle_ms.is_some_and(|s| (0.0..30_000.0).contains(&s)),
            "{table}"
        );
        assert_eq!(report.convergence_p99_ms, report.churn_lag_p99_ms);
        let json = report.to_json();
        assert_eq!(json["churn_changes"], changes);
        assert!(json["discovery_rss_mb"].as_f64().is_some_and(|mb| mb > 0.0));
    }
}
