//! MeshConfig from the `istio` ConfigMap, as istiod reads it when no mesh config file is mounted
//! (Istio's `initMeshConfiguration`, pilot/pkg/bootstrap/mesh.go: the `mesh` key of the ConfigMap
//! `istio`, or `istio-<revision>` for a revision other than `default`, in istiod's namespace).
//! Istio's own install mounts no file: this is where its `meshConfig` values arrive.
//!
//! Read at start. A later change of the ConfigMap is not applied to the running process (the
//! mesh config is fixed for its life here); it is said in a warning, which names the change and
//! that a restart applies it, and counted in `pilot_mesh_config_changes_ignored`.

use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::watcher;
use model::MeshConfig;
use prometheus_client::metrics::counter::Counter;

/// Istio's `configMapName`: `istio`, or `istio-<revision>`.
pub fn config_map_name(revision: &str) -> String {
    match revision {
        "" | "default" => "istio".to_owned(),
        r => format!("istio-{r}"),
    }
}

/// The mesh config of the ConfigMap and its `mesh` text; `None` when the ConfigMap is absent
/// (Istio's defaults then, as istiod).
pub async fn load(
    client: &kube::Client,
    namespace: &str,
    revision: &str,
) -> anyhow::Result<Option<(MeshConfig, String)>> {
    let name = config_map_name(revision);
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let cm = match api.get_opt(&name).await {
        Ok(Some(cm)) => cm,
        Ok(None) => {
            tracing::info!("ConfigMap {namespace}/{name} not found: the mesh config is Istio's defaults");
            return Ok(None);
        }
        Err(e) => return Err(e).with_context(|| format!("reading the mesh config from ConfigMap {namespace}/{name}")),
    };
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get("mesh"))
        .cloned()
        .unwrap_or_default();
    Ok(Some((
        parse(&text).with_context(|| format!("ConfigMap {namespace}/{name}, key mesh"))?,
        text,
    )))
}

/// The `mesh` key's YAML; empty is Istio's defaults.
pub fn parse(text: &str) -> anyhow::Result<MeshConfig> {
    let value: serde_json::Value = if text.trim().is_empty() {
        serde_json::Value::Null
    } else {
        serde_saphyr::from_str(text).context("not YAML")?
    };
    Ok(MeshConfig::from_value(value)?)
}

/// Warns (once per change) when the ConfigMap's `mesh` no longer says what the process runs with.
pub async fn follow(client: kube::Client, namespace: String, revision: String, running: String, ignored: Counter) {
    let name = config_map_name(&revision);
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut last = running.clone();
    let mut events = watcher(api, config).boxed();
    while let Some(event) = events.next().await {
        let text = match event {
            Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                cm.data.and_then(|mut d| d.remove("mesh")).unwrap_or_default()
            }
            Ok(watcher::Event::Delete(_)) => String::new(),
            Ok(_) => continue,
            Err(e) => {
                tracing::debug!("watching ConfigMap {namespace}/{name}: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        if text == last {
            continue;
        }
        last = text.clone();
        if text == running {
            tracing::info!("ConfigMap {namespace}/{name}: the mesh config is back to what this process runs with");
            continue;
        }
        ignored.inc();
        match parse(&text) {
            Ok(_) => tracing::warn!(
                "ConfigMap {namespace}/{name}: the mesh config changed; pilot-discovery applies it when restarted \
                 (it runs with the mesh config it started with)"
            ),
            Err(e) => tracing::warn!(
                "ConfigMap {namespace}/{name}: the new mesh config is invalid ({e:#}); still running with the one it started with"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use test_support::kube_api::FakeApiServer;

    use super::*;

    #[test]
    fn the_configmap_of_a_revision() {
        assert_eq!(config_map_name(""), "istio");
        assert_eq!(config_map_name("default"), "istio");
        assert_eq!(config_map_name("canary"), "istio-canary");
    }

    #[tokio::test]
    async fn the_mesh_config_of_istios_configmap() {
        let api = FakeApiServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let client = crate::kubernetes::fake_api_client(&api, dir.path()).await;
        assert!(load(&client, "istio-system", "default").await.unwrap().is_none());
        api.apply(
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "istio", "namespace": "istio-system"},
            "data": {"mesh": "trustDomain: example.org\nenableTracing: true\n", "meshNetworks": "networks: {}"}}),
        )
        .unwrap();
        let (mesh, _) = load(&client, "istio-system", "").await.unwrap().unwrap();
        assert_eq!(mesh.trust_domain, "example.org");
        api.apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "istio-canary", "namespace": "istio-system"},
            "data": {"mesh": "trustDomain: [not, a, string]"}}))
            .unwrap();
        let e = load(&client, "istio-system", "canary").await.unwrap_err();
        assert!(
            format!("{e:#}").contains("ConfigMap istio-system/istio-canary, key mesh"),
            "{e:#}"
        );
    }
}
