//! Where Istio config comes from (`--configDir`, else the API server; Ingresses from the cluster
//! as Istio's ingress controller reads them), and the config task that turns each change into a
//! push (Istio's `configController` event handlers feeding `ConfigUpdate`).

use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, bail};
use environment::Environment;
use model::{ConfigKind, MeshConfig};
use xds_server::DiscoveryServer;

use crate::args::DiscoveryArgs;
use crate::metrics::PipelineMetrics;
use crate::push::dispatch;

/// Where config comes from: the initial state, the state for the debug endpoints, and the
/// changes after it.
pub(super) struct ConfigSources {
    pub(super) initial: config_sources::ConfigChange,
    pub(super) state: tokio::sync::watch::Receiver<config_sources::StoreSnapshot>,
    pub(super) changes: tokio::sync::mpsc::UnboundedReceiver<config_sources::ConfigChange>,
}

/// Istio config from `--configDir`, else from the API server. As Istio's ingress controller,
/// Kubernetes Ingresses and IngressClasses are read from the cluster whenever Kubernetes is a
/// registry and meshConfig `ingressControllerMode` is not `OFF`, with `--configDir` too (whose
/// Ingress manifests are read as well).
pub(super) async fn start_config_sources(
    args: &DiscoveryArgs,
    mesh: &MeshConfig,
    client: Option<&kube::Client>,
    kube_is_registry: bool,
    watch_metrics: &kclient::WatchMetrics,
    pipeline_metrics: &PipelineMetrics,
) -> anyhow::Result<ConfigSources> {
    use config_sources::crdclient::{CONFIG_KINDS, ConfigResource};
    let (changes_tx, changes) = tokio::sync::mpsc::unbounded_channel();
    let ingresses = kube_is_registry && mesh.ingress_controller_mode != "OFF";
    let is_ingress = |r: &&ConfigResource| matches!(r.kind, ConfigKind::Ingress | ConfigKind::IngressClass);
    let kube_source = |kinds: Vec<ConfigResource>, client: kube::Client| {
        config_sources::crdclient::start(
            client,
            kinds,
            watch_metrics.clone(),
            mesh.discovery_selectors.clone(),
            Some(pipeline_metrics.invalid_observer()),
        )
    };
    if !args.config_dir.is_empty() {
        let (mut initial, state) = config_dir(&args.config_dir, pipeline_metrics, changes_tx.clone())?;
        if let (Some(c), true) = (client, ingresses) {
            let source = kube_source(CONFIG_KINDS.iter().filter(is_ingress).copied().collect(), c.clone()).await;
            tracing::info!(
                configs = source.initial.events.len(),
                "loaded Ingresses and IngressClasses from the Kubernetes API server"
            );
            initial.events.extend(source.initial.events);
            forward(
                tokio_stream::wrappers::UnboundedReceiverStream::new(source.changes),
                changes_tx,
            );
        }
        return Ok(ConfigSources {
            initial,
            state,
            changes,
        });
    }
    let Some(c) = client else {
        bail!(
            "no config source: give --configDir, or a Kubernetes cluster to read Istio config from \
             (--kubeconfig, KUBECONFIG, or in-cluster)"
        );
    };
    let kinds = CONFIG_KINDS
        .iter()
        .filter(|r| ingresses || !is_ingress(r))
        .copied()
        .collect();
    let source = kube_source(kinds, c.clone()).await;
    tracing::info!(
        configs = source.initial.events.len(),
        "loaded Istio config from the Kubernetes API server"
    );
    forward(
        tokio_stream::wrappers::UnboundedReceiverStream::new(source.changes),
        changes_tx,
    );
    Ok(ConfigSources {
        initial: source.initial,
        state: source.state,
        changes,
    })
}

/// `--configDir`: loaded now, then watched; its changes go to `to`.
fn config_dir(
    dir: &str,
    pipeline_metrics: &PipelineMetrics,
    to: tokio::sync::mpsc::UnboundedSender<config_sources::ConfigChange>,
) -> anyhow::Result<(
    config_sources::ConfigChange,
    tokio::sync::watch::Receiver<config_sources::StoreSnapshot>,
)> {
    if !Path::new(dir).is_dir() {
        bail!("--configDir {dir}: not a readable directory");
    }
    let mut store = config_sources::FileConfigStore::new(dir);
    store.set_invalid_observer(pipeline_metrics.invalid_observer());
    let initial = store.rescan();
    for e in store.errors() {
        tracing::warn!(error = ?e, "config problem");
    }
    tracing::info!(configs = initial.events.len(), dir, "loaded config directory");
    let dir_watch = config_sources::watch_store(store).context("watching --configDir")?;
    forward(tokio_stream::wrappers::ReceiverStream::new(dir_watch.changes), to);
    Ok((initial, dir_watch.state))
}

/// Hands every change of one source on to the config task.
fn forward(
    from: impl futures::Stream<Item = config_sources::ConfigChange> + Send + 'static,
    to: tokio::sync::mpsc::UnboundedSender<config_sources::ConfigChange>,
) {
    use futures::StreamExt;
    tokio::spawn(async move {
        futures::pin_mut!(from);
        while let Some(c) = from.next().await {
            if to.send(c).is_err() {
                return;
            }
        }
    });
}

/// One line for a batch of config events: counts by kind and action, e.g.
/// `VirtualService: 2 updated; ServiceEntry: 1 added, 1 deleted` (a batch may hold thousands).
fn summarize(change: &config_sources::ConfigChange) -> String {
    use std::collections::BTreeMap;
    let mut counts: BTreeMap<String, BTreeMap<&str, usize>> = BTreeMap::new();
    for e in &change.events {
        *counts
            .entry(e.key().kind.to_string())
            .or_default()
            .entry(event_name(e))
            .or_default() += 1;
    }
    counts
        .iter()
        .map(|(kind, actions)| {
            let actions: Vec<String> = actions.iter().map(|(a, n)| format!("{n} {a}")).collect();
            format!("{kind}: {}", actions.join(", "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn event_name(e: &config_sources::ConfigEvent) -> &'static str {
    match e {
        config_sources::ConfigEvent::Added(_) => "added",
        config_sources::ConfigEvent::Updated { .. } => "updated",
        config_sources::ConfigEvent::Deleted(_) => "deleted",
    }
}

/// The config task: each change of a source, and each new mesh config, to the environment and
/// its push to the server; the JWKS resolver is woken after a config change. Ends with an error
/// when the sources stop.
pub(super) async fn run(
    mut changes: tokio::sync::mpsc::UnboundedReceiver<config_sources::ConfigChange>,
    mut live_mesh: Option<tokio::sync::watch::Receiver<crate::mesh_configmap::LiveMesh>>,
    (env, srv): (Arc<Environment>, Arc<DiscoveryServer<Environment>>),
    jwks: Option<crate::jwks::JwksWake>,
    pipeline_metrics: PipelineMetrics,
) -> anyhow::Result<()> {
    loop {
        let change = tokio::select! {
            change = changes.recv() => change,
            mesh = super::mesh::next_mesh(&mut live_mesh) => {
                dispatch(&srv, env.mesh_changed(mesh));
                continue;
            }
        };
        let Some(change) = change else { break };
        tracing::info!(events = change.events.len(), "config changed: {}", summarize(&change));
        for e in &change.events {
            tracing::debug!(config = %e.key(), event = event_name(e), "config changed");
        }
        pipeline_metrics.validated(&change);
        dispatch(&srv, env.config_changed(&change));
        if let Some(jwks) = &jwks {
            jwks.configs_changed();
        }
        pipeline_metrics.observe(env.stats());
    }
    bail!("the config source stopped")
}

#[cfg(test)]
mod tests {
    use super::*;
    use config_sources::{ConfigChange, ConfigEvent};

    fn config(kind: &str, name: &str) -> std::sync::Arc<model::Config> {
        let spec = match kind {
            "VirtualService" => serde_json::json!({"hosts": ["a.example.com"],
                "http": [{"route": [{"destination": {"host": "a.example.com"}}]}]}),
            _ => serde_json::json!({"hosts": ["a.example.com"], "ports": [{"number": 80, "name": "http"}]}),
        };
        model::testing::config(serde_json::json!({"apiVersion": "networking.istio.io/v1", "kind": kind,
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}))
    }

    #[test]
    fn a_batch_of_config_events_is_one_line_of_counts() {
        let change = ConfigChange {
            events: vec![
                ConfigEvent::Added(config("ServiceEntry", "a")),
                ConfigEvent::Added(config("ServiceEntry", "b")),
                ConfigEvent::Deleted(config("ServiceEntry", "c")),
                ConfigEvent::Updated {
                    old: config("VirtualService", "v"),
                    new: config("VirtualService", "v"),
                },
            ],
        };
        assert_eq!(
            summarize(&change),
            "ServiceEntry: 2 added, 1 deleted; VirtualService: 1 updated"
        );
    }
}
