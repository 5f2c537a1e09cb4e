//! meshNetworks as istiod reads it (Istio's `initMeshNetworks` and `getConfigurationSources`,
//! pilot/pkg/bootstrap/mesh.go): the `--networksConfig` file when it exists (read at start), else
//! the `meshNetworks` key of the `istio` ConfigMap (`istio-<revision>`), read at start and
//! followed live; else no networks. A value that does not parse or validate (Istio's
//! `ParseMeshNetworks`) is named in a warning and counted in `pilot_mesh_config_changes_ignored`,
//! and the last valid one (none at start) stays; a bad file stops the start, as a bad mesh file.
//!
//! What reads it today: `/debug/networkz` (the gateways named by address, Istio's
//! `NetworkManager`). Endpoints' networks (`fromCidr`, `fromRegistry`) and split-horizon EDS
//! through the gateways come with several clusters.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::watcher;
use model::mesh_networks::MeshNetworks;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::watch;

use crate::mesh_configmap::config_map_name;

/// The ConfigMap key (Istio's `kubemesh.MeshNetworksKey`).
const KEY: &str = "meshNetworks";

/// The YAML of a `meshNetworks`; empty is no networks.
pub fn parse(text: &str, resolve_hostname_gateways: bool) -> anyhow::Result<MeshNetworks> {
    let value: serde_json::Value = if text.trim().is_empty() {
        serde_json::Value::Null
    } else {
        serde_saphyr::from_str(text).context("not YAML")?
    };
    Ok(MeshNetworks::from_value(value, resolve_hostname_gateways)?)
}

/// Where the networks come from, and what makes a valid one.
pub struct Source<'a> {
    /// `--networksConfig`.
    pub file: &'a str,
    pub namespace: &'a str,
    pub revision: &'a str,
    /// `RESOLVE_HOSTNAME_GATEWAYS`.
    pub resolve_hostname_gateways: bool,
}

/// The mesh networks at start, and each valid change after.
pub async fn init(
    source: Source<'_>,
    client: Option<&kube::Client>,
    ignored: Counter,
) -> anyhow::Result<watch::Receiver<Arc<MeshNetworks>>> {
    let resolve = source.resolve_hostname_gateways;
    if !source.file.is_empty() && Path::new(source.file).exists() {
        let file = source.file;
        let text = std::fs::read_to_string(file).with_context(|| format!("reading mesh networks {file}"))?;
        let networks = parse(&text, resolve).with_context(|| format!("mesh networks {file}"))?;
        log(&networks, file);
        return Ok(watch::channel(Arc::new(networks)).1);
    }
    let Some(client) = client else {
        tracing::info!(
            file = source.file,
            "mesh networks file not found and no cluster: no networks"
        );
        return Ok(watch::channel(Arc::new(MeshNetworks::default())).1);
    };
    let name = config_map_name(source.revision);
    let at = format!("ConfigMap {}/{name}, key {KEY}", source.namespace);
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), source.namespace);
    let text = api
        .get_opt(&name)
        .await
        .with_context(|| format!("reading the mesh networks from {at}"))?
        .and_then(|cm| cm.data?.remove(KEY))
        .unwrap_or_default();
    let networks = match parse(&text, resolve) {
        Ok(n) => n,
        Err(e) => {
            ignored.inc();
            tracing::warn!("{at}: invalid mesh networks ({e:#}); starting with none");
            MeshNetworks::default()
        }
    };
    log(&networks, &at);
    let (tx, rx) = watch::channel(Arc::new(networks));
    let follower = Follower {
        api,
        name,
        at,
        resolve,
        ignored,
    };
    tokio::spawn(follower.run(text, tx));
    Ok(rx)
}

fn log(networks: &MeshNetworks, from: &str) {
    let gateways: usize = networks.networks.values().map(|n| n.gateways.len()).sum();
    tracing::info!(
        networks = ?networks.networks.keys().collect::<Vec<_>>(),
        gateways,
        "mesh networks configuration from {from}"
    );
}

struct Follower {
    api: Api<ConfigMap>,
    name: String,
    at: String,
    resolve: bool,
    ignored: Counter,
}

impl Follower {
    /// Follows the key: each valid change is sent on `tx`; one that does not parse is warned
    /// about and counted, and the last valid one stays.
    async fn run(self, mut last: String, tx: watch::Sender<Arc<MeshNetworks>>) {
        let config = watcher::Config::default().fields(&format!("metadata.name={}", self.name));
        let mut events = watcher(self.api.clone(), config).boxed();
        while let Some(event) = events.next().await {
            let text = match event {
                Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                    cm.data.and_then(|mut d| d.remove(KEY)).unwrap_or_default()
                }
                Ok(watcher::Event::Delete(_)) => String::new(),
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!("watching {}: {e}", self.at);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            if text == last {
                continue;
            }
            last.clone_from(&text);
            match parse(&text, self.resolve) {
                Ok(networks) => {
                    log(&networks, &self.at);
                    if tx.send(Arc::new(networks)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    self.ignored.inc();
                    tracing::warn!(
                        "{}: the new mesh networks are invalid ({e:#}); still using the last valid ones",
                        self.at
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use test_support::kube_api::FakeApiServer;

    use super::*;

    fn source(file: &str) -> Source<'_> {
        Source {
            file,
            namespace: "istio-system",
            revision: "",
            resolve_hostname_gateways: true,
        }
    }

    fn config_map(networks: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "istio", "namespace": "istio-system"},
            "data": {"mesh": "", "meshNetworks": networks}})
    }

    const TWO: &str = "networks:\n  n1:\n    gateways:\n    - address: 10.0.0.1\n      port: 15443\n  n2:\n    endpoints:\n    - fromCidr: 10.2.0.0/16\n";

    #[tokio::test]
    async fn the_configmaps_networks_are_followed_and_an_invalid_change_keeps_the_last() {
        let api = FakeApiServer::start().await.unwrap_or_else(|e| panic!("{e}"));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let client = crate::kubernetes::fake_api_client(&api, dir.path()).await;
        api.apply(config_map("networks: {}")).unwrap_or_else(|e| panic!("{e}"));
        let ignored = Counter::default();
        let mut rx = init(source(""), Some(&client), ignored.clone())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(rx.borrow().networks.is_empty());
        api.apply(config_map(TWO)).unwrap_or_else(|e| panic!("{e}"));
        tokio::time::timeout(Duration::from_secs(5), rx.changed())
            .await
            .unwrap_or_else(|_| panic!("the change did not arrive"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rx.borrow_and_update().address_gateways()[0].addr, "10.0.0.1");
        // Invalid: counted, the last valid one stays.
        api.apply(config_map(
            "networks:\n  n1:\n    endpoints:\n    - fromCidr: 300.0.0.0/8\n",
        ))
        .unwrap_or_else(|e| panic!("{e}"));
        let t0 = std::time::Instant::now();
        while ignored.get() == 0 {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the invalid change was not counted"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(!rx.has_changed().unwrap_or(true));
        assert_eq!(rx.borrow().networks.len(), 2);
    }

    #[tokio::test]
    async fn a_file_wins_over_the_configmap_and_a_bad_file_stops_the_start() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("meshNetworks");
        std::fs::write(&file, TWO).unwrap_or_else(|e| panic!("{e}"));
        let path = file.display().to_string();
        let rx = init(source(&path), None, Counter::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(rx.borrow().networks.len(), 2);
        std::fs::write(
            &file,
            "networks:\n  n1:\n    gateways:\n    - address: 1.2.3.4\n      port: 70000\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let e = init(source(&path), None, Counter::default())
            .await
            .err()
            .map(|e| format!("{e:#}"));
        let e = e.unwrap_or_else(|| panic!("a bad file was accepted"));
        assert!(e.contains(&path) && e.contains("port number 70000"), "{e}");
        // No file, no cluster: no networks.
        let rx = init(source("/nonexistent/meshNetworks"), None, Counter::default())
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(rx.borrow().networks.is_empty());
    }
}
