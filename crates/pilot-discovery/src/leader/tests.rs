//! Elections against the fake API server, as they run in pilot-discovery: one holder at a time
//! (also when candidates race for a lock whose holder died), a holder cut off from the API
//! server steps down and another takes over, a lock held by istiod is honoured, the default
//! revision takes the lock over, a corrupt record is named, counted and replaced.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::json;
use test_support::kube_api::FakeApiServer;

use super::record::{ANNOTATION, Record};
use super::*;

const ELECTION: &str = NAMESPACE_CONTROLLER;
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

/// A replica: its election of [`ELECTION`], whose controller counts how many are running.
struct Replica {
    leadership: Leadership,
    metrics: LeaderMetrics,
}

impl Replica {
    fn errors(&self, reason: &str) -> u64 {
        self.metrics
            .errors
            .get_or_create(&ReasonLabel {
                election: ELECTION.into(),
                reason: reason.into(),
            })
            .get()
    }

    fn invalid(&self, field: &str) -> u64 {
        self.metrics
            .invalid
            .get_or_create(&FieldLabel {
                election: ELECTION.into(),
                field: field.into(),
            })
            .get()
    }
}

struct Options<'a> {
    timing: LeaseTiming,
    revision: &'a str,
}

const DEFAULTS: Options<'static> = Options {
    timing: TIMING,
    revision: "",
};

async fn replica(api: &FakeApiServer, dir: &std::path::Path, name: &str, running: &Arc<AtomicUsize>) -> Replica {
    replica_with(api, dir, name, running, DEFAULTS).await
}

async fn replica_with(
    api: &FakeApiServer,
    dir: &std::path::Path,
    name: &str,
    running: &Arc<AtomicUsize>,
    o: Options<'_>,
) -> Replica {
    let metrics = LeaderMetrics::default();
    let elections = Elections {
        client: client(api, dir, name).await,
        namespace: "istio-system".into(),
        identity: name.into(),
        revision: o.revision.into(),
        timing: o.timing,
        enabled: true,
        metrics: metrics.clone(),
    };
    let running = running.clone();
    let leadership = elections.spawn(ELECTION, move || {
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
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn leaders(replicas: &[&Replica]) -> usize {
    replicas.iter().filter(|r| r.leadership.is_leader()).count()
}

/// The election's ConfigMap, with `record` (raw) as its annotation.
fn lock_with(api: &FakeApiServer, raw: &str) {
    api.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": ELECTION, "namespace": "istio-system", "annotations": {ANNOTATION: raw}}}))
        .unwrap_or_else(|e| panic!("{e}"));
}

/// The record in the election's ConfigMap, as stored.
async fn stored(api: &FakeApiServer) -> serde_json::Value {
    let url = format!("{}/api/v1/namespaces/istio-system/configmaps/{ELECTION}", api.url());
    let cm: serde_json::Value = reqwest::get(url)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
        .json()
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let raw = cm
        .pointer(&format!("/metadata/annotations/{}", ANNOTATION.replace('/', "~1")))
        .and_then(serde_json::Value::as_str)
        .unwrap_or_else(|| panic!("no record in {cm}"));
    serde_json::from_str(raw).unwrap_or_else(|e| panic!("{e}: {raw}"))
}

#[tokio::test]
async fn one_replica_of_three_leads_and_one_cut_off_from_the_api_server_is_replaced() {
    let api = FakeApiServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let running = Arc::new(AtomicUsize::new(0));
    let names = ["istiod-a", "istiod-b", "istiod-c"];
    let mut replicas = Vec::new();
    for name in names {
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
    // Written as client-go writes it: istiod's replicas read the same record.
    let record = stored(&api).await;
    assert_eq!(record["holderIdentity"], names[first]);
    assert_eq!(record["holderKey"], "default");
    assert_eq!(record["leaseDurationSeconds"], 3);

    // The leader loses the API server (every request refused): it steps down at its renew
    // deadline, and another replica takes over once the lock has not changed for a lease
    // duration.
    api.bind_cluster_role(names[first], "kind: ClusterRole\nrules: []\n")
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
    // The others saw the last renewal at most a retry period (and its jitter) after it was
    // made, and try again right when a lease duration has passed since.
    let bound = Duration::from_secs(TIMING.duration_secs) + TIMING.retry_period().mul_f64(1.2) + Duration::from_secs(1);
    assert!(took_over <= bound, "taken over after {took_over:?}, bound {bound:?}");
    assert!(
        all[first].errors("renew_deadline") + all[first].errors("read") >= 1,
        "stepping down is counted"
    );
    for r in replicas {
        r.leadership.release(Duration::from_secs(2)).await;
    }
}

/// Regression: candidates that find the lock of a holder that died (killed, so it could not give
/// the lock up) race to take it; every write carries the resourceVersion read, so exactly one
/// wins and no two controllers ever run at once. (kube-lease-manager, used before, cleared an
/// expired Lease without a precondition and could clear the one a faster candidate had just
/// taken: two leaders for up to a renew period.)
#[tokio::test]
async fn candidates_racing_for_a_dead_holders_lock_never_both_lead() {
    let api = FakeApiServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let running = Arc::new(AtomicUsize::new(0));
    let mut alive: Vec<Replica> = Vec::new();
    for name in ["istiod-a", "istiod-b", "istiod-c", "istiod-d", "istiod-e"] {
        alive.push(replica(&api, dir.path(), name, &running).await);
    }
    for round in 0..3 {
        let refs: Vec<&Replica> = alive.iter().collect();
        until(
            &format!("a leader in round {round}"),
            Duration::from_secs(10),
            &running,
            || leaders(&refs) == 1 && running.load(Ordering::SeqCst) == 1,
        )
        .await;
        // Never two leaders for a lease duration.
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(TIMING.duration_secs) {
            assert!(leaders(&refs) <= 1, "two leaders at once in round {round}");
            assert!(running.load(Ordering::SeqCst) <= 1, "two controllers in round {round}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let i = refs.iter().position(|r| r.leadership.is_leader()).unwrap_or_default();
        drop(refs);
        // Killed: its task is gone and its controller with it; the lock stays as it was.
        let killed = alive.remove(i);
        killed.leadership.task.abort();
        let _ = killed.leadership.task.await;
        let t0 = Instant::now();
        while running.load(Ordering::SeqCst) != 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(1),
                "the killed leader's controller runs on"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    let refs: Vec<&Replica> = alive.iter().collect();
    until("a last leader", Duration::from_secs(10), &running, || {
        leaders(&refs) == 1
    })
    .await;
    let conflicts: u64 = alive.iter().map(|r| r.errors("conflict")).sum();
    eprintln!("races lost (409): {conflicts}");
    drop(refs);
    for r in alive {
        r.leadership.release(Duration::from_secs(2)).await;
    }
}

/// istiod's replicas and ours share the lock: a record istiod keeps renewing is never taken; when
/// istiod stops renewing it, a replica takes it a lease duration after it last changed.
#[tokio::test]
async fn a_lock_renewed_by_istiod_is_honoured_until_istiod_stops_renewing() {
    let api = FakeApiServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let running = Arc::new(AtomicUsize::new(0));
    let istiod = |renewed: &str| {
        format!(
            r#"{{"holderIdentity":"istiod-7f9c4-xk2p","holderKey":"default","leaseDurationSeconds":3,"acquireTime":"2026-11-27T10:00:00Z","renewTime":"{renewed}","leaderTransitions":4}}"#
        )
    };
    lock_with(&api, &istiod("2026-11-27T10:00:00Z"));
    let a = replica(&api, dir.path(), "pilot-a", &running).await;
    // istiod renews every retry period (the renewTime it writes is its own clock's business).
    for n in 0..8 {
        lock_with(&api, &istiod(&format!("2026-11-27T10:00:{n:02}Z")));
        tokio::time::sleep(TIMING.retry_period()).await;
        assert!(!a.leadership.is_leader(), "took a lock istiod renews");
    }
    let stopped_renewing = Instant::now();
    until("taken once istiod stopped", Duration::from_secs(10), &running, || {
        a.leadership.is_leader()
    })
    .await;
    let took = stopped_renewing.elapsed();
    assert!(
        took >= Duration::from_secs(TIMING.duration_secs) - TIMING.retry_period(),
        "taken after {took:?}"
    );
    let record = stored(&api).await;
    assert_eq!(
        (record["holderIdentity"].as_str(), record["leaderTransitions"].as_i64()),
        (Some("pilot-a"), Some(5))
    );
    a.leadership.release(Duration::from_secs(2)).await;
    // Given up as client-go gives it up: no holder, so istiod takes it at its next retry.
    let record = stored(&api).await;
    assert_eq!(
        (
            record["holderIdentity"].as_str(),
            record["leaseDurationSeconds"].as_i64()
        ),
        (Some(""), Some(1))
    );
    assert_eq!(running.load(Ordering::SeqCst), 0, "the controller stops on release");
}

/// Istio's prioritized election: a replica of the default revision (`istio.io/rev` of the
/// `istio-revision-tag-default` webhook) takes the live lock over from one of another revision,
/// which steps down at its next renewal; one of another revision never takes it from the default.
#[tokio::test]
async fn the_default_revision_takes_the_lock_over_from_another_revision() {
    let api = FakeApiServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    api.apply(json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "istio-revision-tag-default", "labels": {"istio.io/rev": "stable", "istio.io/tag": "default"}},
        "webhooks": []}))
        .unwrap_or_else(|e| panic!("{e}"));
    let running = Arc::new(AtomicUsize::new(0));
    let timing = LeaseTiming { duration_secs: 20 };
    let canary = replica_with(
        &api,
        dir.path(),
        "istiod-canary-a",
        &running,
        Options {
            timing,
            revision: "canary",
        },
    )
    .await;
    until("canary leads", Duration::from_secs(10), &running, || {
        canary.leadership.is_leader()
    })
    .await;
    let started = Instant::now();
    let stable = replica_with(
        &api,
        dir.path(),
        "istiod-stable-a",
        &running,
        Options {
            timing,
            revision: "stable",
        },
    )
    .await;
    // Much sooner than the 20 s lease: at the newcomer's first read, and the old holder's next
    // renewal (every 5 s).
    let deadline = Instant::now() + timing.retry_period() + Duration::from_secs(3);
    while !stable.leadership.is_leader() || canary.leadership.is_leader() {
        assert!(Instant::now() < deadline, "the default revision did not take over");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!("taken over by the default revision after {:?}", started.elapsed());
    assert_eq!(stored(&api).await["holderKey"], "stable");
    assert_eq!(canary.errors("superseded"), 1);
    // The canary waits: it does not take the lock back while the stable replica renews it.
    tokio::time::sleep(timing.retry_period() * 2).await;
    assert!(stable.leadership.is_leader() && !canary.leadership.is_leader());
    assert_eq!(running.load(Ordering::SeqCst), 1);
    for r in [canary, stable] {
        r.leadership.release(Duration::from_secs(2)).await;
    }
}

#[tokio::test]
async fn a_corrupt_record_is_named_counted_and_replaced_and_the_election_goes_on() {
    let api = FakeApiServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    // A holder that does not decode (client-go cannot read this record at all), and a renewTime
    // that is no time.
    lock_with(
        &api,
        r#"{"holderIdentity": 7, "leaseDurationSeconds": 30, "renewTime": "yesterday"}"#,
    );
    let running = Arc::new(AtomicUsize::new(0));
    let a = replica(&api, dir.path(), "istiod-a", &running).await;
    until(
        "a leader despite the corrupt record",
        Duration::from_secs(5),
        &running,
        || a.leadership.is_leader(),
    )
    .await;
    assert_eq!((a.invalid("holderIdentity"), a.invalid("renewTime")), (1, 1));
    assert_eq!(
        stored(&api).await["holderIdentity"],
        "istiod-a",
        "replaced by a whole record"
    );

    // Corrupted again while it leads (not even JSON): named, counted, replaced at the next
    // renewal; the holder leads on.
    lock_with(&api, "{not json");
    until("the record replaced", Duration::from_secs(5), &running, || {
        a.invalid("record") == 1
    })
    .await;
    tokio::time::sleep(TIMING.retry_period() * 2).await;
    assert!(a.leadership.is_leader());
    let (record, corrupt) = Record::decode(&stored(&api).await.to_string());
    assert!(corrupt.is_empty());
    assert_eq!(record.holder_identity, "istiod-a");
    a.leadership.release(Duration::from_secs(2)).await;
    assert_eq!(running.load(Ordering::SeqCst), 0, "the controller stops on release");
}

/// A leader that stops cleanly gives the lock up, and another replica takes it within a retry
/// period, not at the end of the lease duration.
#[tokio::test]
async fn a_lock_given_up_is_taken_within_a_retry_period() {
    let api = FakeApiServer::start().await.unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let running = Arc::new(AtomicUsize::new(0));
    let timing = LeaseTiming { duration_secs: 12 };
    let a = replica_with(&api, dir.path(), "istiod-a", &running, Options { timing, revision: "" }).await;
    until("a leads", Duration::from_secs(10), &running, || {
        a.leadership.is_leader()
    })
    .await;
    let b = replica_with(&api, dir.path(), "istiod-b", &running, Options { timing, revision: "" }).await;
    // b has read the lock (held by a for up to 12 s) and waits.
    tokio::time::sleep(timing.retry_period() + Duration::from_millis(500)).await;
    assert!(!b.leadership.is_leader());
    let released = Instant::now();
    a.leadership.release(Duration::from_secs(2)).await;
    until("b leads", Duration::from_secs(12), &running, || {
        b.leadership.is_leader()
    })
    .await;
    let took = released.elapsed();
    assert!(
        took < timing.retry_period().mul_f64(1.2) + Duration::from_secs(1),
        "taken after {took:?}, retry period {:?}",
        timing.retry_period()
    );
    b.leadership.release(Duration::from_secs(2)).await;
}
