//! Istio's leader election (pilot/pkg/leaderelection/leaderelection.go): every replica serves
//! xDS, the CA and the webhooks, but each controller that writes cluster-wide state runs only in
//! the replica that holds its lock in istiod's namespace, under Istio's election name. Gaining
//! the lock starts the controller (which re-syncs everything it owns), losing it stops the
//! controller; `ENABLE_LEADER_ELECTION=false` runs every controller at once, as istiod's
//! "bypassing leader election".
//!
//! The lock is istiod's own for these elections, a ConfigMap named after the election whose
//! annotation `control-plane.alpha.kubernetes.io/leader` holds client-go's record
//! (`config_map_lock.rs`, `record.rs`), so that istiod and pilot-discovery replicas on one
//! cluster (a rolling swap) elect one leader between them. `elector.rs` is client-go's
//! algorithm with Istio's prioritized election: a replica of the default revision takes the
//! lock over from one of another revision. A corrupt record is named in the log, counted in
//! `pilot_leader_election_record_invalid{election,field}` and replaced by the next write, never a
//! crash.
//!
//! Timing as istiod's (`ttl` 30s, `RenewDeadline` ttl/2, `RetryPeriod` ttl/4) unless
//! `PILOT_LEADER_ELECTION_LEASE_DURATION` says otherwise.

mod config_map_lock;
mod elections;
mod elector;
mod record;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

pub use elections::{Elections, LeaderMetrics, LeaseTiming};
#[cfg(test)]
use elections::{FieldLabel, ReasonLabel};
use elector::{Running, stopped};

/// Istio's `NamespaceController` election: the `istio-ca-root-cert` ConfigMaps (`root_cert.rs`).
pub const NAMESPACE_CONTROLLER: &str = "istio-namespace-controller-election";
/// The validation webhook controller's election (`webhook/patch.rs`): the name istiod used while
/// its validation controller was leader-elected (Istio 1.6 to 1.9); istiod at HEAD patches from
/// every replica.
pub const VALIDATION_CONTROLLER: &str = "istio-validation-controller-election";

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

    /// Stops the controller and gives the lock up (Istio's `ReleaseOnCancel`), waiting at most
    /// `within` for the API server.
    pub async fn release(self, within: Duration) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(within, &mut task).await.is_err() {
            task.abort();
        }
    }
}

impl Elections {
    /// Runs `controller` whenever this replica holds the lock of `election`: started anew on
    /// each gain (so it re-syncs what it owns), stopped on each loss.
    pub fn spawn<F, Fut>(&self, election: &'static str, controller: F) -> Leadership
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (stop, stop_rx) = watch::channel(false);
        let (leading_tx, leading) = watch::channel(false);
        let this = self.clone();
        let task = tokio::spawn(async move {
            if this.enabled {
                let mut stop_rx = stop_rx;
                elector::Elector::new(election, this)
                    .run(&controller, &mut stop_rx, &leading_tx)
                    .await;
            } else {
                tracing::info!(election, "bypassing leader election");
                this.metrics.leading(election, true);
                let _ = leading_tx.send(true);
                let _running = Running(tokio::spawn(controller()));
                let mut stop_rx = stop_rx;
                stopped(&mut stop_rx).await;
            }
        });
        Leadership { stop, leading, task }
    }
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
