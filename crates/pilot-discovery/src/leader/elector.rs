//! client-go's `LeaderElector` as Istio's fork runs it (pilot/pkg/leaderelection/
//! k8sleaderelection/leaderelection.go), on a ConfigMap lock: a candidate reads the record every
//! retry period and takes the lock when no one holds it, when the record has not changed for a
//! lease duration (timed by this replica's clock from when it saw the record change, never by
//! the record's own times, so that clocks need not agree), or when its revision is the default
//! one and the holder's is not (Istio's prioritized election). Every write carries the
//! `resourceVersion` read, so two candidates never both win. The leader renews every retry
//! period.
//!
//! Where it differs from client-go, it is safer or faster: a leader that finds the record naming
//! another holder stops at once (client-go goes on until its renew deadline); a candidate that
//! waits for a lock to expire tries again right at the expiry, not up to a retry period later;
//! the retry period is jittered by up to a fifth (client-go: up to 1.2 periods).

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use tokio::sync::watch;
use tokio::time::Instant;

use super::config_map_lock::{ConfigMapLock, LockError};
use super::record::{Record, steals};
use tokio::task::JoinHandle;

use super::elections::{Elections, FieldLabel};

/// The `istio.io/rev` of this webhook configuration is the default revision (Istio's
/// `revisions.DefaultWatcher`).
const DEFAULT_TAG_WEBHOOK: &str = "istio-revision-tag-default";

/// What one read-and-write of the lock found.
#[derive(Debug)]
enum Attempt {
    /// This replica holds the lock now: created, taken or renewed.
    Leading,
    /// Another holds it, live for this replica until `free_at`.
    Held { holder: String, free_at: Instant },
    /// The API server refused, did not answer, or another replica wrote first.
    Failed,
}

/// One election as this replica runs it.
pub(super) struct Elector {
    pub(super) election: &'static str,
    pub(super) elections: Elections,
    pub(super) lock: ConfigMapLock,
    /// The record as last read or written, and when this replica saw it change.
    pub(super) observed: Record,
    pub(super) observed_raw: Option<String>,
    pub(super) observed_at: Instant,
}

impl Elector {
    pub(super) fn new(election: &'static str, elections: Elections) -> Elector {
        let lock = ConfigMapLock::new(elections.client.clone(), &elections.namespace, election);
        Elector {
            election,
            elections,
            lock,
            observed: Record::default(),
            observed_raw: None,
            observed_at: Instant::now(),
        }
    }

    fn is_leader(&self) -> bool {
        self.observed.holder_identity == self.elections.identity
    }

    /// Campaigns, runs `controller` while leading, campaigns again after a loss; gives the lock
    /// up when `stop` says so.
    pub(super) async fn run<F, Fut>(
        mut self,
        controller: &F,
        stop: &mut watch::Receiver<bool>,
        leading: &watch::Sender<bool>,
    ) where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let timing = self.elections.timing;
        let metrics = self.elections.metrics.clone();
        loop {
            tracing::info!(lock = %self.lock.describe(), "attempting to acquire the leader election lock");
            loop {
                let wait = match self.try_acquire_or_renew().await {
                    Attempt::Leading => break,
                    Attempt::Held { free_at, .. } => jitter(timing.retry_period())
                        .min(free_at.saturating_duration_since(Instant::now()) + Duration::from_millis(10)),
                    Attempt::Failed => jitter(timing.retry_period()),
                };
                tokio::select! {
                    () = stopped(stop) => return,
                    () = tokio::time::sleep(wait) => {}
                }
            }
            tracing::info!(election = self.election, identity = %self.elections.identity, "leader election lock obtained");
            metrics.leading(self.election, true);
            let _ = leading.send(true);
            let running = Running(tokio::spawn(controller()));
            let lost = self.lead(stop).await;
            drop(running);
            metrics.leading(self.election, false);
            let _ = leading.send(false);
            if !lost {
                self.release().await;
                return;
            }
            tracing::info!(election = self.election, "leader election lock lost");
            // As istiod, which starts a new elector after a loss.
            self.observed_raw = None;
        }
    }

    /// Renews every retry period while leading; true when the lock is lost, false on `stop`.
    async fn lead(&mut self, stop: &mut watch::Receiver<bool>) -> bool {
        let timing = self.elections.timing;
        let mut renewed = Instant::now();
        loop {
            tokio::select! {
                () = stopped(stop) => return false,
                () = tokio::time::sleep(timing.retry_period()) => {}
            }
            match self.try_acquire_or_renew().await {
                Attempt::Leading => renewed = Instant::now(),
                Attempt::Held { holder, .. } => {
                    self.elections.metrics.error(self.election, "superseded");
                    tracing::warn!(election = self.election, %holder, "the lock names another holder: stepping down");
                    return true;
                }
                Attempt::Failed => {
                    // client-go's RenewDeadline, counted from the retry after the last renewal:
                    // a lease duration after the others last saw it change is later still.
                    if renewed.elapsed() >= timing.retry_period() + timing.renew_deadline() {
                        self.elections.metrics.error(self.election, "renew_deadline");
                        tracing::warn!(
                            election = self.election,
                            "the lock was not renewed within the renew deadline: stepping down"
                        );
                        return true;
                    }
                }
            }
        }
    }

    /// client-go's `tryAcquireOrRenew`.
    async fn try_acquire_or_renew(&mut self) -> Attempt {
        let timing = self.elections.timing;
        let call = timing.retry_period();
        let now = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        let mut record = Record {
            holder_identity: self.elections.identity.clone(),
            holder_key: self.elections.key(),
            lease_duration_seconds: i64::try_from(timing.duration_secs).unwrap_or(i64::MAX),
            acquire_time: now.clone(),
            renew_time: now,
            leader_transitions: 0,
        };
        let raw = match tokio::time::timeout(call, self.lock.get()).await {
            Ok(Ok(Some(raw))) => raw,
            Ok(Ok(None)) => {
                return match tokio::time::timeout(call, self.lock.create(&record)).await {
                    Ok(Ok(())) => {
                        self.observe(record);
                        Attempt::Leading
                    }
                    Ok(Err(e)) => self.failed("create", Some(&e)),
                    Err(_) => self.failed("create", None),
                };
            }
            Ok(Err(e)) => return self.failed("read", Some(&e)),
            Err(_) => return self.failed("read", None),
        };
        if self.observed_raw.as_deref() != Some(raw.as_str()) {
            let record = if raw.is_empty() {
                Record::default()
            } else {
                self.decode(&raw)
            };
            self.observed = record;
            self.observed_raw = Some(raw);
            self.observed_at = Instant::now();
        }
        let free_at = self.observed_at + Duration::from_secs(timing.duration_secs);
        if !self.observed.holder_identity.is_empty() && !self.is_leader() && Instant::now() < free_at {
            if !self.takes_over().await {
                return Attempt::Held {
                    holder: self.observed.holder_identity.clone(),
                    free_at,
                };
            }
            tracing::info!(
                election = self.election,
                holder = %self.observed.holder_identity,
                holder_key = %self.observed.holder_key,
                key = %record.holder_key,
                "the lock is held, but this replica's revision is the default one: taking it over"
            );
        }
        if self.is_leader() {
            record.acquire_time = self.observed.acquire_time.clone();
            record.leader_transitions = self.observed.leader_transitions;
        } else {
            record.leader_transitions = self.observed.leader_transitions.saturating_add(1);
        }
        match tokio::time::timeout(call, self.lock.update(&record)).await {
            Ok(Ok(())) => {
                self.observe(record);
                Attempt::Leading
            }
            Ok(Err(e)) => self.failed("update", Some(&e)),
            Err(_) => self.failed("update", None),
        }
    }

    fn observe(&mut self, record: Record) {
        self.observed_raw = Some(record.encode());
        self.observed = record;
        self.observed_at = Instant::now();
    }

    /// Counts and logs a failed attempt (`e` is `None` when the API server did not answer in
    /// time); a race lost to another replica (409) is counted as `conflict` and only logged at
    /// debug.
    fn failed(&self, what: &str, e: Option<&LockError>) -> Attempt {
        match e {
            Some(e) if e.is_conflict() => {
                self.elections.metrics.error(self.election, "conflict");
                tracing::debug!(
                    election = self.election,
                    "leader election: {what}: another replica wrote first: {e}"
                );
            }
            _ => {
                self.elections.metrics.error(self.election, what);
                let e = e.map_or_else(
                    || "the API server did not answer in time".to_owned(),
                    ToString::to_string,
                );
                tracing::warn!(election = self.election, lock = %self.lock.describe(), "leader election: {what}: {e}");
            }
        }
        Attempt::Failed
    }

    /// The record of `raw`, its corrupt fields named and counted.
    fn decode(&self, raw: &str) -> Record {
        let (record, corrupt) = Record::decode(raw);
        for c in &corrupt {
            self.elections
                .metrics
                .invalid
                .get_or_create(&FieldLabel {
                    election: self.election.to_owned(),
                    field: c.field.to_owned(),
                })
                .inc();
            tracing::warn!(
                election = self.election,
                lock = %self.lock.describe(),
                field = c.field,
                "corrupt leader election record: {}: {}; taken as unset (the next write replaces the record)",
                c.field,
                c.reason
            );
        }
        record
    }

    /// Whether this replica takes the live lock over (Istio's prioritized election).
    async fn takes_over(&self) -> bool {
        let ours = self.elections.key();
        let holder = &self.observed.holder_key;
        if steals(&ours, holder, None) {
            return true;
        }
        if holder.trim_start_matches('^') == ours.trim_start_matches('^') {
            return false;
        }
        steals(&ours, holder, self.default_revision().await.as_deref())
    }

    /// The default revision: the `istio.io/rev` label of `istio-revision-tag-default`.
    async fn default_revision(&self) -> Option<String> {
        use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
        let api: kube::Api<MutatingWebhookConfiguration> = kube::Api::all(self.elections.client.clone());
        match tokio::time::timeout(self.elections.timing.retry_period(), api.get_opt(DEFAULT_TAG_WEBHOOK)).await {
            Ok(Ok(webhook)) => webhook?.metadata.labels?.get("istio.io/rev").cloned(),
            Ok(Err(e)) => {
                self.elections.metrics.error(self.election, "default_revision");
                tracing::debug!(election = self.election, "reading {DEFAULT_TAG_WEBHOOK}: {e}");
                None
            }
            Err(_) => None,
        }
    }

    /// client-go's `release`: a leader stopping gives the lock up, so that another replica
    /// takes it at its next retry rather than after a lease duration.
    async fn release(&mut self) {
        if !self.is_leader() {
            return;
        }
        let now = Some(Time(k8s_openapi::jiff::Timestamp::now()));
        let record = Record {
            leader_transitions: self.observed.leader_transitions,
            lease_duration_seconds: 1,
            acquire_time: now.clone(),
            renew_time: now,
            ..Record::default()
        };
        match self.lock.update(&record).await {
            Ok(()) => {
                tracing::info!(election = self.election, "leader election lock released");
                self.observe(record);
            }
            Err(e) => {
                self.elections.metrics.error(self.election, "release");
                tracing::warn!(election = self.election, "leader election: releasing the lock: {e}");
            }
        }
    }
}

/// `period` and up to a fifth more, at random, so that candidates do not retry in step.
fn jitter(period: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let random = std::collections::hash_map::RandomState::new().build_hasher().finish();
    period + period.mul_f64((random % 1000) as f64 / 5000.0)
}

/// A running controller, stopped when dropped.
pub(super) struct Running(pub(super) JoinHandle<()>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Until `stop` says so (or its sender is gone).
pub(super) async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await.map(|_| ());
}
