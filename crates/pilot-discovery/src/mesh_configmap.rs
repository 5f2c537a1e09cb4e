//! MeshConfig from the `istio` ConfigMap, as istiod reads it when no mesh config file is mounted
//! (Istio's `initMeshConfiguration`, pilot/pkg/bootstrap/mesh.go: the `mesh` key of the ConfigMap
//! `istio`, or `istio-<revision>` for a revision other than `default`, in istiod's namespace).
//! Istio's own install mounts no file: this is where its `meshConfig` values arrive.
//!
//! Read at start, then followed as istiod's mesh watcher does: a changed `mesh` is applied to the
//! running process, the next push built with it and sent to every proxy. What the registries and
//! the CA took at start (the trust domain and its aliases, discovery selectors, the ingress
//! settings) still needs a restart: a change of those is named in a warning and counted in
//! `pilot_mesh_config_changes_ignored`, as is a `mesh` that does not parse (the last good one keeps
//! serving). The sidecar injector follows the same `mesh` (as istiod's webhook, through its mesh
//! handler), whole: its templates read fields the registries took at start too.
//! The `meshNetworks` key is `mesh_networks.rs`'s.

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

/// The fields of the mesh config that are read once, at start, by the registries, the CA and the
/// Ingress conversion: a change of them needs a restart.
pub fn restart_only_changes(started: &MeshConfig, new: &MeshConfig) -> Vec<&'static str> {
    let mut changed = Vec::new();
    let mut check = |name: &'static str, differs: bool| {
        if differs {
            changed.push(name);
        }
    };
    check("trustDomain", started.trust_domain != new.trust_domain);
    check(
        "trustDomainAliases",
        started.trust_domain_aliases != new.trust_domain_aliases,
    );
    check(
        "discoverySelectors",
        started.discovery_selectors != new.discovery_selectors,
    );
    check("ingressClass", started.ingress_class != new.ingress_class);
    check("ingressService", started.ingress_service != new.ingress_service);
    check("ingressSelector", started.ingress_selector != new.ingress_selector);
    check(
        "ingressControllerMode",
        started.ingress_controller_mode != new.ingress_controller_mode,
    );
    changed
}

/// `new` with the fields read only at start as they were then: what the process runs with.
fn with_start_only_fields(started: &MeshConfig, mut new: MeshConfig) -> MeshConfig {
    new.trust_domain.clone_from(&started.trust_domain);
    new.trust_domain_aliases.clone_from(&started.trust_domain_aliases);
    new.discovery_selectors.clone_from(&started.discovery_selectors);
    new.ingress_class.clone_from(&started.ingress_class);
    new.ingress_service.clone_from(&started.ingress_service);
    new.ingress_selector.clone_from(&started.ingress_selector);
    new.ingress_controller_mode.clone_from(&started.ingress_controller_mode);
    new
}

/// One valid version of the `mesh` key, as the running process takes it.
#[derive(Debug, Clone)]
pub struct LiveMesh {
    /// The mesh config pushes are built with: the fields read only at start as they were then.
    pub mesh: std::sync::Arc<MeshConfig>,
    /// The key's YAML as written (the injector's mesh config, parsed by its own reader).
    pub yaml: std::sync::Arc<str>,
}

/// Follows the ConfigMap's `mesh`: each valid change is sent on `live` (the config task applies
/// it to the next push, the injector injects with it); a change that does not parse, or of a
/// field read only at start, is warned about and counted in `ignored`.
pub async fn follow(
    client: kube::Client,
    namespace: String,
    revision: String,
    started: std::sync::Arc<MeshConfig>,
    live: tokio::sync::watch::Sender<LiveMesh>,
    ignored: Counter,
) {
    let name = config_map_name(&revision);
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut last = live.borrow().yaml.to_string();
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
        let mesh = match parse(&text) {
            Ok(mesh) => mesh,
            Err(e) => {
                ignored.inc();
                tracing::warn!(
                    "ConfigMap {namespace}/{name}: the new mesh config is invalid ({e:#}); still serving the last valid one"
                );
                continue;
            }
        };
        let restart = restart_only_changes(&started, &mesh);
        let mesh = with_start_only_fields(&started, mesh);
        if !restart.is_empty() {
            ignored.inc();
            tracing::warn!(
                fields = ?restart,
                "ConfigMap {namespace}/{name}: mesh config fields read only at start changed; they apply when \
                 pilot-discovery restarts (the rest of the change is applied now)"
            );
        }
        tracing::info!("ConfigMap {namespace}/{name}: the mesh config changed; pushing it to every proxy");
        let next = LiveMesh {
            mesh: std::sync::Arc::new(mesh),
            yaml: text.into(),
        };
        if live.send(next).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use test_support::kube_api::FakeApiServer;

    use super::*;

    #[test]
    fn fields_read_at_start_are_named_when_they_change() {
        let started = parse("trustDomain: a.org\ningressClass: istio\n").unwrap();
        let live = parse("trustDomain: a.org\ningressClass: istio\nenableAutoMtls: false\nrootNamespace: r\n").unwrap();
        assert!(restart_only_changes(&started, &live).is_empty());
        let restart = parse("trustDomain: b.org\ningressClass: nginx\n").unwrap();
        assert_eq!(
            restart_only_changes(&started, &restart),
            vec!["trustDomain", "ingressClass"]
        );
        let running = with_start_only_fields(&started, restart);
        assert_eq!(running.trust_domain, "a.org");
        assert_eq!(running.ingress_class, "istio");
    }

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
