//! Istio's leader election (pilot/pkg/leaderelection/leaderelection.go): every replica serves
//! xDS, the CA and the webhooks, but each controller that writes cluster-wide state runs only in
//! the replica that holds its coordination.k8s.io/v1 Lease in istiod's namespace, under Istio's
//! lease name. Gaining the Lease starts the controller (which re-syncs everything it owns),
//! losing it stops the controller; `ENABLE_LEADER_ELECTION=false` runs every controller at once,
//! as istiod's "bypassing leader election".
//!
//! The Lease is kept by kube-lease-manager (server-side apply, so that of two replicas taking a
//! free Lease at once the API server refuses the second with 409 Conflict). Beside it, every
//! renew period, each replica reads the Lease itself (`lease_check.rs`): a holder that finds the
//! Lease no longer names it, or that has not renewed it within the renew deadline, steps down
//! (kube-lease-manager keeps calling itself leader while the API server cannot be reached,
//! where client-go gives up at `RenewDeadline`); a corrupt Lease (a field that does not decode,
//! a duration that is not positive, a renewTime far in the future) is named in the log,
//! counted in `pilot_leader_election_lease_invalid{lease,field}` and repaired, never a crash.
//!
//! Timing as istiod's (`ttl` 30s, renewed every `RetryPeriod` = ttl/4) unless
//! `PILOT_LEADER_ELECTION_LEASE_DURATION` says otherwise.

pub mod lease_check;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use kube_lease_manager::LeaseManagerBuilder;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Istio's `NamespaceController` election: the `istio-ca-root-cert` ConfigMaps (`root_cert.rs`).
pub const NAMESPACE_CONTROLLER: &str = "istio-namespace-controller-election";
/// The validation webhook controller's election (`webhook/patch.rs`): the name istiod used while
/// its validation controller was leader-elected (Istio 1.6 to 1.9); istiod at HEAD patches from
/// every replica.
pub const VALIDATION_CONTROLLER: &str = "istio-validation-controller-election";

/// How long a Lease lasts without renewal, and so how often it is renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LeaseTiming {
    /// Whole seconds, at least 3.
    pub duration_secs: u64,
}

impl LeaseTiming {
    /// istiod's: `ttl` 30 s.
    pub const ISTIOD: LeaseTiming = LeaseTiming { duration_secs: 30 };
    pub const MIN_SECS: u64 = 3;

    /// istiod's `RetryPeriod`, ttl/4 (at least a second): how often the holder renews and every
    /// replica reads the Lease.
    pub fn renew_period(&self) -> Duration {
        Duration::from_secs((self.duration_secs / 4).max(1))
    }

    /// kube-lease-manager's grace: the holder renews this long before the Lease would expire.
    fn grace_secs(&self) -> u64 {
        self.duration_secs - self.renew_period().as_secs()
    }

    /// A holder that has not renewed within this of its last renewal steps down, a renew period
    /// before any other replica may take the Lease.
    fn renew_deadline(&self) -> Duration {
        Duration::from_secs(self.grace_secs())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NameLabel {
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FieldLabel {
    lease: String,
    field: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    lease: String,
    reason: String,
}

/// `leader_election_master_status{name}` (client-go's: 1 while this replica leads), the corrupt
/// Lease fields repaired and the election's errors.
#[derive(Clone, Debug, Default)]
pub struct LeaderMetrics {
    status: Family<NameLabel, Gauge>,
    invalid: Family<FieldLabel, Counter>,
    errors: Family<ReasonLabel, Counter>,
}

impl LeaderMetrics {
    pub fn register(registry: &mut Registry) -> LeaderMetrics {
        let m = LeaderMetrics::default();
        registry.register(
            "leader_election_master_status",
            "1 while this replica holds the lease of the controller `name`, else 0",
            m.status.clone(),
        );
        registry.register(
            "pilot_leader_election_lease_invalid",
            "Corrupt fields found in a leader election Lease (and removed)",
            m.invalid.clone(),
        );
        registry.register(
            "pilot_leader_election_errors",
            "Leader election failures: reading or repairing the Lease, the lease manager ending, stepping down",
            m.errors.clone(),
        );
        m
    }

    fn leading(&self, lease: &str, leading: bool) {
        self.status
            .get_or_create(&NameLabel { name: lease.to_owned() })
            .set(i64::from(leading));
    }

    fn error(&self, lease: &str, reason: &str) {
        self.errors
            .get_or_create(&ReasonLabel {
                lease: lease.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }
}

/// What every election of this replica shares.
#[derive(Clone)]
pub struct Elections {
    pub client: kube::Client,
    /// istiod's namespace (`POD_NAMESPACE`), where the Leases are.
    pub namespace: String,
    /// `POD_NAME`, else `unknown-<hostname>` (Istio's).
    pub identity: String,
    pub timing: LeaseTiming,
    /// `ENABLE_LEADER_ELECTION`.
    pub enabled: bool,
    pub metrics: LeaderMetrics,
}

/// One controller's election, running in the background.
pub struct Leadership {
    stop: watch::Sender<bool>,
    leading: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Leadership {
    /// Whether this replica runs the controller now.
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn is_leader(&self) -> bool {
        *self.leading.borrow()
    }

    /// Stops the controller and gives the Lease up (Istio's `ReleaseOnCancel`), waiting at most
    /// `within` for the API server.
    pub async fn release(self, within: Duration) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(within, &mut task).await.is_err() {
            task.abort();
        }
    }
}

/// A running controller, stopped when dropped.
struct Running(JoinHandle<()>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What a replica's own read of the Lease found.
enum Checked {
    Held(lease_check::Holding),
    /// The API server did not answer: the holder steps down at its renew deadline.
    Unreadable,
    /// Deleted: the lease manager, which only creates it when it starts, is started anew.
    Missing,
    /// Corrupt and repaired: the lease manager may have stopped on it, so it is started anew.
    Repaired,
}

/// Why one lease manager's run ended.
#[derive(Debug, PartialEq)]
enum Ended {
    Stopped,
    Restart,
    /// The Lease is free: a new lease manager takes it at once.
    Free,
}

impl Elections {
    /// Runs `controller` whenever this replica holds `lease`: started anew on each gain (so it
    /// re-syncs what it owns), stopped on each loss.
    pub fn spawn<F, Fut>(&self, lease: &'static str, controller: F) -> Leadership
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (stop, stop_rx) = watch::channel(false);
        let (leading_tx, leading) = watch::channel(false);
        let this = self.clone();
        let task = tokio::spawn(async move {
            if this.enabled {
                this.campaign(lease, &controller, stop_rx, &leading_tx).await;
            } else {
                tracing::info!(lease, "bypassing leader election");
                this.metrics.leading(lease, true);
                let _ = leading_tx.send(true);
                let _running = Running(tokio::spawn(controller()));
                let mut stop_rx = stop_rx;
                stopped(&mut stop_rx).await;
            }
        });
        Leadership { stop, leading, task }
    }

    async fn campaign<F, Fut>(
        &self,
        lease: &'static str,
        controller: &F,
        mut stop: watch::Receiver<bool>,
        leading: &watch::Sender<bool>,
    ) where
        F: Fn() -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut backoff = Duration::from_secs(1);
        loop {
            self.check(lease).await;
            let manager = LeaseManagerBuilder::new(self.client.clone(), lease)
                .with_namespace(&self.namespace)
                .with_identity(&self.identity)
                .with_duration(self.timing.duration_secs)
                .with_grace(self.timing.grace_secs())
                .build()
                .await;
            let ended = match manager {
                Ok(manager) => {
                    let (mut channel, task) = manager.watch().await;
                    let ended = self.follow(lease, controller, &mut channel, &mut stop, leading).await;
                    // Dropping the channel makes the manager give the Lease up if it holds it.
                    drop(channel);
                    self.await_manager(lease, task).await;
                    if ended == Ended::Restart {
                        backoff = Duration::from_secs(1);
                    }
                    ended
                }
                Err(e) => {
                    self.metrics.error(lease, "start");
                    tracing::warn!(lease, namespace = %self.namespace, "leader election: {e}; retrying in {backoff:?}");
                    Ended::Restart
                }
            };
            if ended == Ended::Stopped || *stop.borrow() {
                return;
            }
            if ended == Ended::Free {
                continue;
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                () = stopped(&mut stop) => return,
            }
            backoff = (backoff * 2).min(Duration::from_secs(30));
        }
    }

    /// Runs the controller while the manager says this replica leads and the Lease confirms it.
    async fn follow<F, Fut>(
        &self,
        lease: &'static str,
        controller: &F,
        channel: &mut watch::Receiver<bool>,
        stop: &mut watch::Receiver<bool>,
        leading: &watch::Sender<bool>,
    ) -> Ended
    where
        F: Fn() -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut running: Option<Running> = None;
        let mut deadline = SystemTime::now();
        let period = self.timing.renew_period();
        let started = tokio::time::Instant::now();
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let set = |running: &mut Option<Running>, lead: bool| {
            if !lead && running.take().is_some() {
                tracing::info!(lease, "leader election lock lost");
            }
            self.metrics.leading(lease, lead);
            let _ = leading.send(lead);
        };
        let ended = loop {
            tokio::select! {
                () = stopped(stop) => break Ended::Stopped,
                changed = channel.changed() => {
                    if changed.is_err() {
                        self.metrics.error(lease, "manager_ended");
                        break Ended::Restart;
                    }
                    let lead = *channel.borrow_and_update();
                    if lead && running.is_none() {
                        tracing::info!(lease, identity = %self.identity, "leader election lock obtained");
                        deadline = SystemTime::now() + self.timing.renew_deadline();
                        running = Some(Running(tokio::spawn(controller())));
                    }
                    set(&mut running, lead);
                }
                _ = tick.tick() => {
                    let holding = match self.check(lease).await {
                        Checked::Held(h) => Some(h),
                        Checked::Unreadable => None,
                        Checked::Missing | Checked::Repaired => break Ended::Restart,
                    };
                    if running.is_none() {
                        // A Lease given up (a holder that stopped cleanly) is free now, but the
                        // lease manager sleeps until the expiry it last read: start it anew, as
                        // client-go's candidates retry every RetryPeriod.
                        let free = holding.as_ref().is_some_and(|h| h.holder.is_none());
                        if free && started.elapsed() >= period {
                            break Ended::Free;
                        }
                        continue;
                    }
                    if let Some(holding) = &holding && holding.holder.as_deref() != Some(self.identity.as_str()) {
                        self.metrics.error(lease, "superseded");
                        tracing::warn!(lease, holder = ?holding.holder, "the Lease names another holder: stepping down");
                        break Ended::Restart;
                    }
                    if let Some(expiry) = holding.and_then(|h| h.expiry) {
                        let renewed = expiry - Duration::from_secs(self.timing.duration_secs);
                        deadline = deadline.max(renewed + self.timing.renew_deadline());
                    }
                    if SystemTime::now() > deadline {
                        self.metrics.error(lease, "renew_deadline");
                        tracing::warn!(lease, "the Lease was not renewed within the renew deadline: stepping down");
                        break Ended::Restart;
                    }
                }
            }
        };
        set(&mut running, false);
        ended
    }

    /// Waits for a lease manager that was told to stop; counts how it ended.
    async fn await_manager(
        &self,
        lease: &str,
        task: JoinHandle<kube_lease_manager::Result<kube_lease_manager::LeaseManager>>,
    ) {
        let mut task = task;
        match tokio::time::timeout(Duration::from_secs(5), &mut task).await {
            Ok(Ok(Ok(_))) => {}
            Ok(Ok(Err(e))) => {
                self.metrics.error(lease, "manager");
                tracing::warn!(lease, "leader election: {e}");
            }
            Ok(Err(e)) => {
                self.metrics.error(lease, "manager_panic");
                tracing::warn!(lease, "leader election: the lease manager failed: {e}");
            }
            Err(_) => {
                task.abort();
                self.metrics.error(lease, "release_timeout");
                tracing::warn!(lease, "leader election: the Lease could not be released within 5 s");
            }
        }
    }

    /// Reads the Lease and repairs a corrupt one.
    async fn check(&self, lease: &str) -> Checked {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), &self.namespace, &ApiResource::erase::<Lease>(&()));
        let raw = match api.get_opt(lease).await {
            Ok(Some(obj)) => serde_json::to_value(&obj).unwrap_or_default(),
            Ok(None) => return Checked::Missing,
            Err(e) => {
                self.metrics.error(lease, "read");
                tracing::warn!(lease, namespace = %self.namespace, "leader election: reading the Lease: {e}");
                return Checked::Unreadable;
            }
        };
        let (holding, corrupt) = lease_check::inspect(&raw, SystemTime::now());
        if corrupt.is_empty() {
            return Checked::Held(holding);
        }
        for c in &corrupt {
            self.metrics
                .invalid
                .get_or_create(&FieldLabel {
                    lease: lease.to_owned(),
                    field: c.field.to_owned(),
                })
                .inc();
            tracing::warn!(
                lease,
                namespace = %self.namespace,
                field = c.field,
                "corrupt leader election Lease: spec.{}: {}; removing it (the Lease reads as expired)",
                c.field,
                c.reason
            );
        }
        let rv = raw
            .pointer("/metadata/resourceVersion")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default();
        let patch = lease_check::repair_patch(&corrupt, rv);
        if let Err(e) = api.patch(lease, &PatchParams::default(), &Patch::Merge(&patch)).await {
            // A 409 is another replica's repair or a renewal: read again next time.
            self.metrics.error(lease, "repair");
            tracing::info!(lease, "leader election: repairing the Lease: {e}");
        }
        Checked::Repaired
    }
}

/// Until `stop` says so (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}

/// Istio's identity of a replica: `POD_NAME`, else `unknown-<hostname>`.
pub fn identity(pod_name: &str) -> String {
    if !pod_name.is_empty() {
        return pod_name.to_owned();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_default();
    format!("unknown-{host}")
}
