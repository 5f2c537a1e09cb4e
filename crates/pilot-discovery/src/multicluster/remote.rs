//! One remote cluster's run, as istiod's `multicluster.Cluster.Run`: a client from its
//! kubeconfig, a Kubernetes registry of its Services, EndpointSlices, Pods and Nodes under its
//! cluster ID, served once its initial lists are in (replacing the registry of its previous
//! credentials, if any), then followed change by change.

use std::sync::Arc;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube_registry::KubeRegistry;
use kube_registry::watch::{KINDS, watch_all};
use tokio::sync::{mpsc, watch};

use super::{AbortOnDrop, Served, SyncStatus};

/// Why a kubeconfig does not make a client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig does not parse: {0}")]
    Parse(String),
    #[error("kubeconfig does not make a client config: {0}")]
    Config(String),
    #[error("no client for the kubeconfig's server: {0}")]
    Client(String),
}

/// A client for the cluster a kubeconfig names (its current context). Nothing is asked of the
/// server yet: an unreachable one is retried by the watchers.
pub async fn client(kubeconfig: &[u8]) -> Result<Client, ClientError> {
    let text = std::str::from_utf8(kubeconfig).map_err(|e| ClientError::Parse(format!("not UTF-8: {e}")))?;
    let kc = Kubeconfig::from_yaml(text).map_err(|e| ClientError::Parse(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| ClientError::Config(e.to_string()))?;
    Client::try_from(config).map_err(|e| ClientError::Client(e.to_string()))
}

/// Runs the cluster `id` until aborted (its secret changed or went): see the module doc.
/// `replaced` is the run of its previous credentials, stopped once this one serves.
pub(super) async fn run(
    served: Arc<Served>,
    id: String,
    client: Client,
    replaced: Option<AbortOnDrop>,
    status: watch::Sender<SyncStatus>,
) {
    let mut context = served.context.clone();
    context.cluster_id = id.clone();
    let registry = Arc::new(KubeRegistry::new(context).counting_problems(served.watch_metrics.object_errors.clone()));
    let (tx, mut diffs) = mpsc::unbounded_channel();
    let mut watchers = watch_all(client, registry.clone(), tx, served.watch_metrics.clone());
    let all = |s: &std::collections::BTreeSet<&'static str>| s.len() == KINDS.len();
    let t0 = std::time::Instant::now();
    let within = served.timeout.is_zero() || {
        tokio::time::timeout(served.timeout, watchers.synced.wait_for(all))
            .await
            .is_ok()
    };
    if !within {
        served.metrics.sync_timeouts.inc();
        status.send_replace(SyncStatus::Timeout);
        tracing::warn!(
            cluster = id,
            timeout = ?served.timeout,
            "remote cluster not synced within PILOT_REMOTE_CLUSTER_TIMEOUT: going on without it, still trying"
        );
    }
    if watchers.synced.wait_for(all).await.is_err() {
        return;
    }
    // The registry holds what the initial lists brought: the diffs so far are in its snapshot.
    while diffs.try_recv().is_ok() {}
    let update = served.environment.add_registry(registry.clone());
    crate::push::dispatch(&served.server, update);
    drop(replaced);
    status.send_replace(SyncStatus::Synced);
    let snapshot = registry.snapshot();
    tracing::info!(
        cluster = id,
        services = snapshot.services.len(),
        services_with_endpoints = snapshot.endpoints.len(),
        seconds = t0.elapsed().as_secs_f64(),
        "remote cluster synced"
    );
    while let Some(diff) = diffs.recv().await {
        crate::push::dispatch(&served.server, served.environment.services_changed(diff));
    }
}
