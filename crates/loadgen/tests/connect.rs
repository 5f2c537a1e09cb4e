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
            namespaces: 1,
            sidecar_scope: false,
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

/// The light client sees what the full one sees: every proxy converges on a change, with about
/// the same bytes per proxy (two runs of pilot-discovery: versions and nonces differ), and the
/// raw phase runs with light clients too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn light_clients_converge_like_full_ones() {
    for delta in [false, true] {
        let full = loadgen::run(&options(Scenario::ConfigChange, delta)).await.unwrap();
        let light = loadgen::run(&LoadOptions {
            light: true,
            ..options(Scenario::ConfigChange, delta)
        })
        .await
        .unwrap();
        assert!(light.errors.is_empty(), "delta={delta}: {:?}", light.errors);
        assert_eq!(light.converged, 5, "delta={delta}: {}", light.table());
        assert_eq!(light.to_json()["client"], "light");
        assert_eq!(full.to_json()["client"], "full");
        assert!(light.raw_p99_ms.is_some(), "{}", light.table());
        let (light_bytes, full_bytes) = (
            light.change_bytes_per_proxy.unwrap(),
            full.change_bytes_per_proxy.unwrap(),
        );
        assert!(
            light_bytes > 0.0 && (light_bytes / full_bytes - 1.0).abs() < 0.25,
            "delta={delta}: {light_bytes} bytes per proxy, full client {full_bytes}"
        );
    }
}

/// Delta xDS carries what changed: the VirtualService change reaches the delta clients as the one
/// virtual host it changed (over VHDS, as Envoy subscribes to it), a fraction of the route
/// configuration state of the world resends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_change_carries_the_changed_virtual_host() {
    let bytes = |delta| async move {
        let o = LoadOptions {
            light: true,
            raw: false,
            ..options(Scenario::ConfigChange, delta)
        };
        let report = loadgen::run(&o).await.unwrap();
        assert!(report.errors.is_empty(), "delta={delta}: {:?}", report.errors);
        assert_eq!(report.converged, 5, "delta={delta}: {}", report.table());
        report.change_bytes_per_proxy.unwrap()
    };
    let (sotw, delta) = (bytes(false).await, bytes(true).await);
    assert!(
        delta > 0.0 && delta < sotw / 4.0,
        "delta {delta} B per proxy, SotW {sotw} B"
    );
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

/// istio.io's reference mesh: services and proxies over namespaces, a Sidecar per namespace.
/// The VirtualService change reaches the proxies of its namespace only, and carries only their
/// namespace's routes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reference_mesh_scopes_each_namespace() {
    let scoped = |sidecar_scope: bool, scenario: Scenario| {
        let mut o = options(scenario, false);
        o.mesh.namespaces = 2;
        o.mesh.sidecar_scope = sidecar_scope;
        o.mesh.virtual_services = 2;
        o.proxies = 6;
        o.raw = false;
        o
    };
    let report = loadgen::run(&scoped(true, Scenario::Connect)).await.unwrap();
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    assert_eq!(report.converged, 6, "{}", report.table());
    let unscoped_connect = loadgen::run(&scoped(false, Scenario::Connect)).await.unwrap();
    assert!(
        report.bytes_sent < unscoped_connect.bytes_sent,
        "scoped {} >= unscoped {}",
        report.bytes_sent,
        unscoped_connect.bytes_sent
    );

    let change = loadgen::run(&scoped(true, Scenario::ConfigChange)).await.unwrap();
    assert!(change.errors.is_empty(), "{:?}", change.errors);
    // proxies 0, 2 and 4 are in load-0 with VirtualService 0
    assert_eq!(change.converged, 3, "{}", change.table());
    let unscoped = loadgen::run(&scoped(false, Scenario::ConfigChange)).await.unwrap();
    assert_eq!(unscoped.converged, 6, "{}", unscoped.table());
    let (a, b) = (
        change.change_bytes_per_proxy.unwrap_or_default(),
        unscoped.change_bytes_per_proxy.unwrap_or_default(),
    );
    assert!(a > 0.0 && a < b, "scoped {a} bytes per proxy, unscoped {b}");
    // pilot-discovery's CPU over the change, per proxy it reached (ticks of 10 ms: may read 0)
    assert!(
        change.change_cpu_s_per_proxy.is_some_and(|s| s >= 0.0),
        "{}",
        change.table()
    );
    let json = change.to_json();
    assert_eq!(json["namespaces"], 2);
    assert_eq!(json["sidecar_scope"], "namespace");
}
