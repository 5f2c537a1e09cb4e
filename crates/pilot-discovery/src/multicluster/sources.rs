//! Where remote kubeconfigs come from, as istiod's remote config sources
//! (`pkg/kube/multicluster/remote_config_source.go`): the Secrets labelled
//! `istio/multiCluster=true` in pilot-discovery's namespace, listed and watched; or, with
//! `PILOT_MULTICLUSTER_KUBECONFIG_PATH`, the kubeconfig files of a directory (each file one
//! cluster, its ID the cluster of its current context), read again every second.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Secret;
use kclient::informer::{Watched, watched};
use kclient::{Change, WatchMetrics};
use kube::config::Kubeconfig;
use kube::{Api, Client};
use tokio::sync::mpsc;

use super::{MULTICLUSTER_SECRET_LABEL, RemoteConfig};

/// How often the kubeconfig directory is read again.
const POLL: Duration = Duration::from_secs(1);

/// Follows the remote secrets of `namespace` until `tx` is dropped.
pub fn watch_secrets(client: Client, namespace: &str, metrics: WatchMetrics, tx: mpsc::UnboundedSender<RemoteConfig>) {
    let api: Api<Secret> = Api::namespaced(client, namespace);
    tokio::spawn(async move {
        let stream = watched(api, "Secret", metrics);
        futures::pin_mut!(stream);
        while let Some(w) = stream.next().await {
            let event = match w {
                Watched::Change(Change::Replace(all)) => {
                    RemoteConfig::Replace(all.iter().filter(|s| is_remote(s)).map(clusters_of).collect())
                }
                Watched::Change(Change::Apply(s)) if is_remote(&s) => {
                    let (key, clusters) = clusters_of(&s);
                    RemoteConfig::Set { key, clusters }
                }
                // A secret that lost its label is no remote secret any more.
                Watched::Change(Change::Apply(s) | Change::Delete(s)) => RemoteConfig::Deleted { key: key(&s) },
                Watched::Undecodable(u) => {
                    tracing::warn!(object = u.name, "Secret does not decode: {}", u.reason);
                    continue;
                }
            };
            if tx.send(event).is_err() {
                return;
            }
        }
    });
}

fn is_remote(s: &Secret) -> bool {
    s.metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(MULTICLUSTER_SECRET_LABEL))
        .is_some_and(|v| v == "true")
}

fn key(s: &Secret) -> String {
    format!(
        "{}/{}",
        s.metadata.namespace.as_deref().unwrap_or_default(),
        s.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The secret's key and its clusters: each data key a cluster ID, its value the kubeconfig.
fn clusters_of(s: &Secret) -> (String, BTreeMap<String, Vec<u8>>) {
    let data = s.data.iter().flatten().map(|(k, v)| (k.clone(), v.0.clone())).collect();
    (key(s), data)
}

/// Follows the kubeconfig files of `dir` until `tx` is dropped: a [`RemoteConfig::Replace`] each
/// time what the directory holds changes (the first read included).
pub fn watch_directory(dir: PathBuf, tx: mpsc::UnboundedSender<RemoteConfig>) {
    tokio::spawn(async move {
        let mut last: Option<BTreeMap<PathBuf, Vec<u8>>> = None;
        let mut reported: BTreeMap<PathBuf, Vec<u8>> = BTreeMap::new();
        loop {
            let files = read_directory(&dir);
            if last.as_ref() != Some(&files) {
                let mut all = Vec::new();
                for (path, bytes) in &files {
                    match cluster_id(bytes) {
                        Ok(id) => all.push((path.display().to_string(), BTreeMap::from([(id, bytes.clone())]))),
                        // Reported once per contents, not every second.
                        Err(e) if reported.get(path) != Some(bytes) => {
                            tracing::error!(file = %path.display(), "remote kubeconfig not served: {e}");
                            reported.insert(path.clone(), bytes.clone());
                        }
                        Err(_) => {}
                    }
                }
                if tx.send(RemoteConfig::Replace(all)).is_err() {
                    return;
                }
                last = Some(files);
            }
            tokio::time::sleep(POLL).await;
        }
    });
}

/// The regular files of `dir` (symlinks followed, as a mounted Secret's are; hidden files such as
/// a mount's `..data` skipped) and their contents.
fn read_directory(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return BTreeMap::new();
    };
    entries
        .flatten()
        .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .filter_map(|p| std::fs::read(&p).ok().map(|b| (p, b)))
        .collect()
}

/// istiod's `clusterIDFromKubeconfig`: the cluster of the current context, else of the first
/// context (by name) that names one, else the first cluster (by name).
pub fn cluster_id(kubeconfig: &[u8]) -> Result<String, String> {
    let text = std::str::from_utf8(kubeconfig).map_err(|e| format!("not UTF-8: {e}"))?;
    let kc = Kubeconfig::from_yaml(text).map_err(|e| format!("kubeconfig does not parse: {e}"))?;
    let cluster_of = |name: &str| {
        kc.contexts
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.context.as_ref())
            .map(|c| c.cluster.clone())
            .filter(|c| !c.is_empty())
    };
    if let Some(c) = kc.current_context.as_deref().and_then(cluster_of) {
        return Ok(c);
    }
    let mut contexts: Vec<&str> = kc.contexts.iter().map(|c| c.name.as_str()).collect();
    contexts.sort_unstable();
    if let Some(c) = contexts.into_iter().find_map(cluster_of) {
        return Ok(c);
    }
    let mut clusters: Vec<&str> = kc
        .clusters
        .iter()
        .map(|c| c.name.as_str())
        .filter(|n| !n.is_empty())
        .collect();
    clusters.sort_unstable();
    clusters
        .first()
        .map(|c| (*c).to_owned())
        .ok_or_else(|| "the kubeconfig names no cluster".to_owned())
}
