//! Remote clusters, as istiod's multicluster secret controller (`pkg/kube/multicluster`): the
//! Secrets labelled `istio/multiCluster=true` in pilot-discovery's namespace (each data key a
//! cluster ID, each value a kubeconfig, as `istioctl create-remote-secret` writes them), or the
//! kubeconfigs of `PILOT_MULTICLUSTER_KUBECONFIG_PATH` ([`sources`]), each start a Kubernetes
//! registry of that cluster ([`remote`]).
//!
//! As istiod: a cluster ID equal to the config cluster's is ignored, and so is one another
//! secret has registered already; a kubeconfig that did not change keeps its cluster running; a
//! changed one starts the cluster again with the new credentials, the old registry serving until
//! the new one has synced; a cluster no secret names any more leaves, with its services and
//! endpoints. A kubeconfig that does not load is an error naming the secret and the cluster,
//! counted in `pilot_remote_cluster_errors`; an unreachable cluster is retried with backoff and
//! holds up nothing but itself (`PILOT_REMOTE_CLUSTER_TIMEOUT`).

pub mod remote;
pub mod sources;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use environment::Environment;
use kclient::WatchMetrics;
use kube_registry::Context;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use xds_server::DiscoveryServer;

/// The label istiod reads remote secrets by.
pub const MULTICLUSTER_SECRET_LABEL: &str = "istio/multiCluster";

/// What a source of remote kubeconfigs reports.
#[derive(Debug, Clone, PartialEq)]
pub enum RemoteConfig {
    /// The clusters the source `key` (a Secret `namespace/name`, a file) names now: cluster ID
    /// to kubeconfig. Clusters it named before and does not now leave.
    Set {
        key: String,
        clusters: BTreeMap<String, Vec<u8>>,
    },
    /// The source is gone: its clusters leave.
    Deleted { key: String },
    /// Every source, after a (re-)list: sources not named leave.
    Replace(Vec<(String, BTreeMap<String, Vec<u8>>)>),
}

/// istiod's sync statuses (`/debug/clusterz`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncStatus {
    Syncing,
    Synced,
    /// Not synced within `PILOT_REMOTE_CLUSTER_TIMEOUT`: start-up went on without it; it is still
    /// retried.
    Timeout,
}

impl SyncStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            SyncStatus::Syncing => "syncing",
            SyncStatus::Synced => "synced",
            SyncStatus::Timeout => "timeout",
        }
    }
}

/// One line of `/debug/clusterz`, as istiod's `cluster.DebugInfo`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DebugInfo {
    pub id: String,
    pub secret_name: String,
    pub sync_status: String,
}

/// Labels of `pilot_remote_cluster_errors`: why a cluster a secret names is not served
/// (`invalid_kubeconfig`, `local_cluster`, `duplicate_cluster`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub reason: String,
}

/// Labels of `istiod_managed_clusters`: `local` or `remote`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterTypeLabels {
    pub cluster_type: String,
}

/// istiod's `istiod_managed_clusters` and `remote_cluster_sync_timeouts_total`, and
/// `pilot_remote_cluster_errors`.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub managed: Family<ClusterTypeLabels, Gauge>,
    pub sync_timeouts: Counter,
    pub errors: Family<ErrorLabels, Counter>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics::default();
        registry.register(
            "istiod_managed_clusters",
            "Number of clusters managed by istiod",
            m.managed.clone(),
        );
        registry.register(
            "remote_cluster_sync_timeouts",
            "Number of times remote clusters took too long to sync, causing slow startup that excludes remote clusters.",
            m.sync_timeouts.clone(),
        );
        registry.register(
            "pilot_remote_cluster_errors",
            "Clusters named by remote secrets that are not served, by reason.",
            m.errors.clone(),
        );
        m
    }

    fn error(&self, reason: &str) {
        self.errors
            .get_or_create(&ErrorLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    fn managed(&self, cluster_type: &str, n: usize) {
        self.managed
            .get_or_create(&ClusterTypeLabels {
                cluster_type: cluster_type.to_owned(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// Aborts its task when dropped.
#[derive(Debug)]
pub struct AbortOnDrop(tokio::task::AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A remote cluster being served.
struct Remote {
    /// The source that names it.
    key: String,
    /// Its kubeconfig, to tell a rotation from the same secret read again.
    kubeconfig: Vec<u8>,
    status: watch::Receiver<SyncStatus>,
    _run: AbortOnDrop,
}

/// What the remote clusters are served into.
pub struct Served {
    pub environment: Arc<Environment>,
    pub server: Arc<DiscoveryServer<Environment>>,
    /// The config cluster's conversion context: remote clusters' objects convert the same way,
    /// with their own cluster ID.
    pub context: Context,
    pub watch_metrics: WatchMetrics,
    pub metrics: Metrics,
    /// `PILOT_REMOTE_CLUSTER_TIMEOUT`.
    pub timeout: Duration,
}

/// The remote clusters (see the module doc).
pub struct Multicluster {
    served: Arc<Served>,
    clusters: Mutex<BTreeMap<String, Remote>>,
}

impl Multicluster {
    pub fn new(served: Served) -> Multicluster {
        served.metrics.managed("local", 1);
        served.metrics.managed("remote", 0);
        Multicluster {
            served: Arc::new(served),
            clusters: Mutex::default(),
        }
    }

    /// Applies what a source reported.
    pub async fn apply(&self, event: RemoteConfig) {
        match event {
            RemoteConfig::Set { key, clusters } => self.set(&key, clusters).await,
            RemoteConfig::Deleted { key } => self.set(&key, BTreeMap::new()).await,
            RemoteConfig::Replace(all) => {
                let keys: Vec<String> = self.lock().values().map(|r| r.key.clone()).collect();
                for key in keys.iter().filter(|k| !all.iter().any(|(a, _)| a == *k)) {
                    self.set(key, BTreeMap::new()).await;
                }
                for (key, clusters) in all {
                    self.set(&key, clusters).await;
                }
            }
        }
        let n = self.lock().len();
        self.served.metrics.managed("remote", n);
    }

    /// istiod's `addRemoteConfig` for the source `key`.
    async fn set(&self, key: &str, clusters: BTreeMap<String, Vec<u8>>) {
        let gone: Vec<String> = self
            .lock()
            .iter()
            .filter(|(id, r)| r.key == key && !clusters.contains_key(*id))
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            self.remove(&id, key);
        }
        let local = &self.served.context.cluster_id;
        for (id, kubeconfig) in clusters {
            if &id == local {
                self.served.metrics.error("local_cluster");
                tracing::warn!(
                    secret = key,
                    cluster = id,
                    "ignoring remote cluster: its ID is the config cluster's"
                );
                continue;
            }
            let previous = match self.lock().get(&id) {
                Some(r) if r.key != key => {
                    self.served.metrics.error("duplicate_cluster");
                    tracing::warn!(
                        secret = key,
                        cluster = id,
                        registered_by = r.key,
                        "ignoring remote cluster: another secret has registered this cluster ID"
                    );
                    continue;
                }
                Some(r) if r.kubeconfig == kubeconfig => continue,
                Some(_) => true,
                None => false,
            };
            let client = match remote::client(&kubeconfig).await {
                Ok(c) => c,
                Err(e) => {
                    self.served.metrics.error("invalid_kubeconfig");
                    tracing::error!(secret = key, cluster = id, "remote cluster not served: {e}");
                    continue;
                }
            };
            let action = if previous { "update" } else { "add" };
            tracing::info!(secret = key, cluster = id, action, "remote cluster");
            // The previous run (rotated credentials) serves until the new one has synced.
            let replaced = self.lock().remove(&id).map(|r| r._run);
            let (status_tx, status) = watch::channel(SyncStatus::Syncing);
            let run = tokio::spawn(remote::run(
                self.served.clone(),
                id.clone(),
                client,
                replaced,
                status_tx,
            ));
            self.lock().insert(
                id,
                Remote {
                    key: key.to_owned(),
                    kubeconfig,
                    status,
                    _run: AbortOnDrop(run.abort_handle()),
                },
            );
        }
    }

    /// The cluster leaves: its run stops, its services and endpoints go.
    fn remove(&self, id: &str, key: &str) {
        tracing::info!(secret = key, cluster = id, "remote cluster removed");
        drop(self.lock().remove(id));
        let update = self.served.environment.remove_registry(id);
        crate::push::dispatch(&self.served.server, update);
    }

    /// Waits until every remote cluster has synced or timed out (istiod's `HasSynced`).
    pub async fn wait_synced(&self) {
        let statuses: Vec<watch::Receiver<SyncStatus>> = self.lock().values().map(|r| r.status.clone()).collect();
        for mut s in statuses {
            let _ = s.wait_for(|s| *s != SyncStatus::Syncing).await;
        }
    }

    /// `/debug/clusterz`: the config cluster, then each remote cluster with its secret.
    pub fn debug_info(&self, config_cluster_synced: bool) -> Vec<DebugInfo> {
        let config = DebugInfo {
            id: self.served.context.cluster_id.clone(),
            secret_name: String::new(),
            sync_status: if config_cluster_synced { "synced" } else { "syncing" }.into(),
        };
        let remotes: Vec<DebugInfo> = self
            .lock()
            .iter()
            .map(|(id, r)| DebugInfo {
                id: id.clone(),
                secret_name: r.key.clone(),
                sync_status: r.status.borrow().as_str().into(),
            })
            .collect();
        std::iter::once(config).chain(remotes).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Remote>> {
        self.clusters.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Starts following the remote clusters (the secrets of the config cluster's namespace, or
/// `PILOT_MULTICLUSTER_KUBECONFIG_PATH`) and waits for the clusters of the first read to sync or
/// time out, as istiod's readiness does.
pub async fn start(served: Served, client: kube::Client, settings: &crate::settings::Settings) -> Arc<Multicluster> {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    if settings.multicluster_kubeconfig_path.is_empty() {
        sources::watch_secrets(client, &settings.pod_namespace, served.watch_metrics.clone(), tx);
    } else {
        let dir = std::path::PathBuf::from(&settings.multicluster_kubeconfig_path);
        sources::watch_directory(dir, tx);
    }
    let timeout = served.timeout;
    let mc = Arc::new(Multicluster::new(served));
    // The first read: the secrets' list (retried by the informer while it fails) or the directory.
    let first = if timeout.is_zero() {
        rx.recv().await
    } else {
        tokio::time::timeout(timeout, rx.recv()).await.unwrap_or_else(|_| {
            tracing::warn!(
                ?timeout,
                "remote secrets not listed within PILOT_REMOTE_CLUSTER_TIMEOUT: going on"
            );
            None
        })
    };
    if let Some(first) = first {
        mc.apply(first).await;
        mc.wait_synced().await;
    }
    let following = mc.clone();
    tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            following.apply(event).await;
        }
    });
    mc
}

#[cfg(test)]
mod tests;
