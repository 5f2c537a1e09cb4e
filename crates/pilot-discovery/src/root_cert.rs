//! Istio's `NamespaceController` (pilot/pkg/serviceregistry/kube/controller/namespacecontroller.go):
//! with a cluster, the mesh root goes to every namespace as the ConfigMap `istio-ca-root-cert`
//! (`root-cert.pem`), which workloads mount to trust pilot-discovery and each other. Namespaces
//! that appear get it, a ConfigMap that is deleted or edited is written back. Kubernetes' own
//! namespaces are skipped, as Istio's; with `discoverySelectors`, only the selected ones get it.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::watcher::{self, Event, watcher};
use model::MeshConfig;

/// Istio's `CACertNamespaceConfigMap`.
pub const CONFIG_MAP: &str = "istio-ca-root-cert";
/// Istio's `constants.CACertNamespaceConfigMapDataName`.
pub const DATA_KEY: &str = "root-cert.pem";
/// Istio's `inject.IgnoredNamespaces`.
const IGNORED: [&str; 4] = ["kube-system", "kube-public", "kube-node-lease", "local-path-storage"];

/// Keeps `istio-ca-root-cert` with `root_pem` in every namespace, for as long as it runs.
pub async fn publish(client: kube::Client, root_pem: String, mesh: Arc<MeshConfig>) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let config_maps: Api<ConfigMap> = Api::all(client.clone());
    let ns_events = watcher(namespaces, watcher::Config::default()).map(|e| {
        e.map(|e| match e {
            Event::Apply(ns) | Event::InitApply(ns) => {
                Some((ns.metadata.name.clone().unwrap_or_default(), labels(&ns.metadata)))
            }
            _ => None,
        })
    });
    let cm_events = watcher(
        config_maps,
        watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP}")),
    )
    .map(|e| {
        e.map(|e| match e {
            Event::Apply(cm) | Event::Delete(cm) | Event::InitApply(cm) => {
                Some((cm.metadata.namespace.unwrap_or_default(), None))
            }
            _ => None,
        })
    });
    let mut events = std::pin::pin!(futures::stream::select(ns_events, cm_events));
    let mut known: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    while let Some(event) = events.next().await {
        let (ns, ns_labels) = match event {
            Ok(Some(e)) => e,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(error = %e, "istio-ca-root-cert: watch failed; retrying");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        if let Some(l) = ns_labels {
            known.insert(ns.clone(), l);
        }
        let Some(l) = known.get(&ns) else { continue };
        let selected = mesh.discovery_selectors.is_empty() || mesh.discovery_selectors.iter().any(|s| s.matches(l));
        if ns.is_empty() || IGNORED.contains(&ns.as_str()) || !selected {
            continue;
        }
        if let Err(e) = ensure(&client, &ns, &root_pem).await {
            tracing::warn!(namespace = ns, error = %e, "istio-ca-root-cert: could not write the ConfigMap");
        }
    }
}

fn labels(meta: &ObjectMeta) -> Option<BTreeMap<String, String>> {
    Some(meta.labels.clone().unwrap_or_default())
}

/// Creates the ConfigMap, or puts the root back into it.
async fn ensure(client: &kube::Client, ns: &str, root_pem: &str) -> Result<(), kube::Error> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let want = BTreeMap::from([(DATA_KEY.to_owned(), root_pem.to_owned())]);
    match api.get_opt(CONFIG_MAP).await? {
        Some(cm) if cm.data.as_ref() == Some(&want) => Ok(()),
        Some(mut cm) => {
            cm.data = Some(want);
            api.replace(CONFIG_MAP, &PostParams::default(), &cm).await?;
            tracing::info!(namespace = ns, "istio-ca-root-cert updated");
            Ok(())
        }
        None => {
            let cm = ConfigMap {
                metadata: ObjectMeta {
                    name: Some(CONFIG_MAP.into()),
                    namespace: Some(ns.into()),
                    labels: Some(BTreeMap::from([("istio.io/config".to_owned(), "true".to_owned())])),
                    ..Default::default()
                },
                data: Some(want),
                ..Default::default()
            };
            api.create(&PostParams::default(), &cm).await?;
            tracing::info!(namespace = ns, "istio-ca-root-cert created");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use serde_json::json;
    use test_support::kube_api::FakeApiServer;

    use super::*;

    async fn root_in(client: &kube::Client, ns: &str) -> Option<String> {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        api.get_opt(CONFIG_MAP)
            .await
            .ok()
            .flatten()?
            .data?
            .get(DATA_KEY)
            .cloned()
    }

    async fn eventually(what: &str, mut check: impl AsyncFnMut() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !check().await {
            assert!(Instant::now() < deadline, "{what} within 10 s");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn every_namespace_gets_the_root_and_keeps_it() {
        let api = FakeApiServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        for ns in ["default", "kube-system", "bookinfo"] {
            api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
                .unwrap();
        }
        let c = crate::kubernetes::fake_api_client(&api, dir.path()).await;
        tokio::spawn(publish(c.clone(), "ROOT\n".into(), Arc::new(MeshConfig::default())));
        eventually("a ConfigMap in default and bookinfo", async || {
            root_in(&c, "default").await.as_deref() == Some("ROOT\n") && root_in(&c, "bookinfo").await.is_some()
        })
        .await;
        assert_eq!(
            root_in(&c, "kube-system").await,
            None,
            "Kubernetes' namespaces are skipped"
        );

        // a new namespace gets it; a deleted or edited ConfigMap comes back
        api.apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "late"}}))
            .unwrap();
        eventually("a ConfigMap in a new namespace", async || {
            root_in(&c, "late").await.is_some()
        })
        .await;
        api.delete(&json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": CONFIG_MAP, "namespace": "bookinfo"}}))
            .unwrap();
        eventually("the deleted ConfigMap back", async || {
            root_in(&c, "bookinfo").await.is_some()
        })
        .await;
        api.apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": CONFIG_MAP, "namespace": "default"}, "data": {DATA_KEY: "forged"}}))
            .unwrap();
        eventually("the edited ConfigMap restored", async || {
            root_in(&c, "default").await.as_deref() == Some("ROOT\n")
        })
        .await;
    }
}
