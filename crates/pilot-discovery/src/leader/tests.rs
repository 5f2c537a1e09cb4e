//! Elections against the fake API server, with kube-lease-manager as it runs in pilot-discovery:
//! one holder at a time, a holder cut off from the API server steps down and another takes over,
//! a corrupt Lease is repaired and the election goes on.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use test_support::kube_api::FakeApiServer;

use super::*;

const LEASE: &str = NAMESPACE_CONTROLLER;
const TIMING: LeaseTiming = LeaseTiming { duration_secs: 3 };

async fn client(api: &FakeApiServer, dir: &std::path::Path, token: &str) -> kube::Client {
    let path = dir.join(format!("{token}.kubeconfig"));
    api.write_kubeconfig_with_token(&path, token)
        .unwrap_or_else(|e| panic!("kubeconfig: {e}"));
    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap_or_else(|e| panic!("kubeconfig: {e}"));
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("kubeconfig: {e}"));
    kube::Client::try_from(config).unwrap_or_else(|e| panic!("client: {e}"))
}

/// A replica: its election of [`LEASE`], whose controller counts how many are running.
struct Replica {
    leadership: Leadership,
    metrics: LeaderMetrics,
}

async fn replica(api: &FakeApiServer, dir: &std::path::Path, name: &str, running: &Arc<AtomicUsize>) -> Replica {
    replica_with(api, dir, name, running, TIMING).await
}

async fn replica_with(
    api: &FakeApiServer,
    dir: &std::path::Path,
    name: &str,
    running: &Arc<AtomicUsize>,
    timing: LeaseTiming,
) -> Replica {
    let metrics = LeaderMetrics::default();
    let elections = Elections {
        client: client(api, dir, name).await,
        namespace: "istio-system".into(),
        identity: name.into(),
        timing,
        enabled: true,
        metrics: metrics.clone(),
    };
    let running = running.clone();
    let leadership = elections.spawn(LEASE, move || {
        let running = running.clone();
        async move {
            running.fetch_add(1, Ordering::SeqCst);
            // Counted down when stopped (aborted), as a controller's writes stop.
            struct Guard(Arc<AtomicUsize>);
            impl Drop for Guard {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let _guard = Guard(running);
            std::future::pending::<()>().await;
        }
    });
    Replica { leadership, metrics }
}

/// Waits up to `within` for `check`, asserting on the way that never more than one controller
/// runs.
async fn until(what: &str, within: Duration, running: &AtomicUsize, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(running.load(Ordering::SeqCst) <= 1, "two controllers at once");
        assert!(Instant::now() < deadline, "{what} within {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn leaders(replicas: &[&Replica]) -> usize {
    replicas.iter().filter(|r| r.leadership.is_leader()).count()
}

#[tokio::test]
async fn one_replica_of_three_leads_and_one_cut_off_from_the_api_server_is_replaced() {
    let api = FakeApiServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let running = Arc::new(AtomicUsize::new(0));
    let mut replicas = Vec::new();
    for name in ["istiod-a", "istiod-b", "istiod-c"] {
        replicas.push(replica(&api, dir.path(), name, &running).await);
    }
    let all: Vec<&Replica> = replicas.iter().collect();
    until("a leader", Duration::from_secs(10), &running, || leaders(&all) == 1).await;
    // Stable for two lease durations: the same single leader, its controller alone running.
    let first = all.iter().position(|r| r.leadership.is_leader()).unwrap_or_default();
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2 * TIMING.duration_secs) {
        assert_eq!(leaders(&all), 1);
        assert!(all[first].leadership.is_leader(), "the leader changed while it renewed");
        assert_eq!(running.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The leader loses the API server (every request refused): it steps down at its renew
    // deadline, and another replica takes over once the Lease has expired.
    let name = ["istiod-a", "istiod-b", "istiod-c"][first];
    api.bind_cluster_role(name, "kind: ClusterRole\nrules: []\n")
        .unwrap_or_else(|e| panic!("{e}"));
    let cut = Instant::now();
    until(
        "the cut-off leader stepping down",
        Duration::from_secs(10),
        &running,
        || !all[first].leadership.is_leader(),
    )
    .await;
    let stepped_down = cut.elapsed();
    until("another leader", Duration::from_secs(10), &running, || {
        leaders(&all) == 1
    })
    .await;
    let took_over = cut.elapsed();
    assert!(
        stepped_down < Duration::from_secs(TIMING.duration_secs),
        "stepped down after {stepped_down:?}"
    );
    assert!(
        took_over <= Duration::from_secs(TIMING.duration_secs + 2),
        "taken over after {took_over:?} (lease {}s)",
        TIMING.duration_secs
    );
    let renew_deadline = all[first]
        .metrics
        .errors
        .get_or_create(&ReasonLabel {
            lease: LEASE.into(),
            reason: "renew_deadline".into(),
        })
        .get();
    let read = all[first]
        .metrics
        .errors
        .get_or_create(&ReasonLabel {
            lease: LEASE.into(),
            reason: "read".into(),
        })
        .get();
    assert!(renew_deadline + read >= 1, "stepping down is counted");

    for r in replicas {
        r.leadership.release(Duration::from_secs(2)).await;
    }
}

#[tokio::test]
async fn a_corrupt_lease_is_named_counted_and_repaired_and_the_election_goes_on() {
    let api = FakeApiServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // A holder nobody runs, renewed "yesterday", for a negative duration (kube-lease-manager
    // panics on it), and a renewTime that is no time at all.
    api.apply(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": "istio-system"},
        "spec": {"holderIdentity": "mallory", "leaseDurationSeconds": -1, "renewTime": "yesterday"}}))
        .unwrap_or_else(|e| panic!("{e}"));
    let running = Arc::new(AtomicUsize::new(0));
    let a = replica(&api, dir.path(), "istiod-a", &running).await;
    until(
        "a leader despite the corrupt Lease",
        Duration::from_secs(15),
        &running,
        || a.leadership.is_leader(),
    )
    .await;
    let invalid = |field: &str| {
        a.metrics
            .invalid
            .get_or_create(&FieldLabel {
                lease: LEASE.into(),
                field: field.into(),
            })
            .get()
    };
    assert_eq!((invalid("renewTime"), invalid("leaseDurationSeconds")), (1, 1));

    // Corrupted again while it leads (a renewTime far in the future for a wrong holder): the
    // holder steps down, repairs, and leads again.
    api.apply(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": "istio-system"},
        "spec": {"holderIdentity": "mallory", "leaseDurationSeconds": 3, "renewTime": "9999-01-01T00:00:00.000000Z"}}))
        .unwrap_or_else(|e| panic!("{e}"));
    until("the renewTime repaired", Duration::from_secs(10), &running, || {
        invalid("renewTime") == 2
    })
    .await;
    until("leading again", Duration::from_secs(15), &running, || {
        a.leadership.is_leader()
    })
    .await;
    a.leadership.release(Duration::from_secs(2)).await;
    assert_eq!(running.load(Ordering::SeqCst), 0, "the controller stops on release");
}

/// A leader that stops cleanly gives the Lease up, and another replica takes it within a renew
/// period, not at the end of the lease duration (istiod's candidates retry every RetryPeriod).
#[tokio::test]
async fn a_lease_given_up_is_taken_within_a_renew_period() {
    let api = FakeApiServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let running = Arc::new(AtomicUsize::new(0));
    let timing = LeaseTiming { duration_secs: 12 };
    let a = replica_with(&api, dir.path(), "istiod-a", &running, timing).await;
    until("a leads", Duration::from_secs(10), &running, || {
        a.leadership.is_leader()
    })
    .await;
    let b = replica_with(&api, dir.path(), "istiod-b", &running, timing).await;
    // b has read the Lease (held by a, expiring in up to 12 s) and waits.
    tokio::time::sleep(timing.renew_period() + Duration::from_millis(500)).await;
    assert!(!b.leadership.is_leader());
    let released = Instant::now();
    a.leadership.release(Duration::from_secs(2)).await;
    until("b leads", Duration::from_secs(12), &running, || {
        b.leadership.is_leader()
    })
    .await;
    let took = released.elapsed();
    assert!(
        took < timing.renew_period() + Duration::from_secs(2),
        "taken after {took:?}, renew period {:?}",
        timing.renew_period()
    );
    b.leadership.release(Duration::from_secs(2)).await;
}
