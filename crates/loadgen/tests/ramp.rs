//! The ramp against a real pilot-discovery: steps until all proxies joined, or until a memory or
//! latency limit; and the choice of the pilot-discovery executable.

use std::path::PathBuf;
use std::time::Duration;

use loadgen::{LoadOptions, MeshSpec, RampOptions, Scenario};

fn ramp(proxies: usize, ramp: RampOptions) -> LoadOptions {
    LoadOptions {
        mesh: MeshSpec {
            services: 1,
            endpoints: 1,
            virtual_services: 1,
            destination_rules: 0,
            namespaces: 1,
            sidecar_scope: false,
        },
        proxies,
        scenario: Scenario::Ramp,
        ramp,
        timeout: Duration::from_secs(60),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_until_every_proxy_joined() {
    let opts = ramp(
        7,
        RampOptions {
            step: 3,
            ..Default::default()
        },
    );
    let report = loadgen::run(&opts).await.unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let joined: Vec<usize> = report.steps.iter().map(|s| s.proxies).collect();
    assert_eq!(joined, vec![3, 6, 7], "{}", report.table());
    assert!(report.steps.iter().all(|s| s.rss_mb.is_some_and(|mb| mb > 1.0)));
    assert!(report.steps.iter().all(|s| s.p99_ms.is_some_and(|p| p > 0.0)));
    assert_eq!((report.proxies, report.converged), (7, 7));
    assert_eq!(report.ramp_stop.as_deref(), Some("proxies"));
    let json = report.to_json();
    assert_eq!(json["steps"].as_array().map(Vec::len), Some(3));
    assert_eq!(json["steps"][2]["proxies"], 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stops_at_the_first_step_past_a_limit() {
    for (limits, stop) in [
        (
            RampOptions {
                step: 2,
                max_p99_ms: Some(0.001),
                ..Default::default()
            },
            "max-p99-ms",
        ),
        (
            RampOptions {
                step: 2,
                max_rss_mb: Some(1.0),
                ..Default::default()
            },
            "max-rss-mb",
        ),
    ] {
        let report = loadgen::run(&ramp(20, limits)).await.unwrap();
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!(report.ramp_stop.as_deref(), Some(stop), "{}", report.table());
        assert_eq!(report.steps.len(), 1, "{}", report.table());
        assert_eq!((report.proxies, report.converged), (2, 2));
        assert!(report.table().contains(&format!("ramp stopped by      {stop}")));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_the_pilot_discovery_it_is_given() {
    let debug = test_support::bin::cargo_bin("pilot-discovery", "pilot-discovery").unwrap();
    let mut opts = ramp(1, RampOptions::default());
    opts.discovery_bin = Some(debug.clone());
    let report = loadgen::run(&opts).await.unwrap();
    assert_eq!(report.discovery_bin, Some(debug.display().to_string()));
    opts.discovery_bin = Some(PathBuf::from("/nonexistent/pilot-discovery"));
    let err = format!("{:#}", loadgen::run(&opts).await.err().unwrap());
    assert!(err.contains("/nonexistent/pilot-discovery"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_may_share_connections_in_state_of_the_world_only() {
    let mut opts = ramp(
        5,
        RampOptions {
            step: 5,
            ..Default::default()
        },
    );
    opts.streams_per_connection = 2;
    let report = loadgen::run(&opts).await.unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!((report.proxies, report.converged), (5, 5));
    opts.delta = true;
    let err = loadgen::run(&opts).await.err().unwrap().to_string();
    assert!(err.contains("need state of the world"), "{err}");
}
