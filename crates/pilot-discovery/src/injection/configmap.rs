//! The injector's config from the `istio-sidecar-injector` ConfigMap (`-<revision>` for a
//! revision other than `default`) of istiod's namespace, keys `config` and `values`, watched as
//! Istio's `NewConfigMapWatcher` (`pkg/kube/inject/watcher.go`, chosen by
//! `pilot/pkg/bootstrap/sidecarinjector.go` when `./var/lib/istio/inject/config` is not mounted,
//! as in Istio's own install).
//!
//! Every version of the ConfigMap is parsed whole (the `config` YAML, every template, the
//! `values` JSON/YAML) before it replaces the running one: a version with an error is logged
//! naming the ConfigMap, the key and what is wrong, counted in
//! `sidecar_injection_config_errors_total`, and the last good config keeps serving (Istio's
//! `updateConfig` can half-apply a version whose `values` are bad; this never does). A deleted
//! ConfigMap keeps the last config too, as Istio's watcher does ("no ConfigMap found").
//!
//! Unlike istiod, which registers `/inject` only if the ConfigMap exists when it starts, a
//! ConfigMap created later is served from then on, without a restart.

use std::time::Duration;

use futures::StreamExt;
use inject::InjectorConfig;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::runtime::watcher;

/// Istio's `getInjectorConfigMapName`.
pub fn config_map_name(revision: &str) -> String {
    match revision {
        "" | "default" => "istio-sidecar-injector".to_owned(),
        r => format!("istio-sidecar-injector-{r}"),
    }
}

/// Istio's `readConfigMap`, then the templates parsed: the config, or what is wrong with it.
pub fn read(cm: &ConfigMap) -> Result<InjectorConfig, String> {
    let data = cm.data.as_ref();
    let key = |k: &str| {
        data.and_then(|d| d.get(k))
            .ok_or_else(|| format!("missing ConfigMap {k} key {k:?}"))
    };
    let (config, values) = (key("config")?, key("values")?);
    InjectorConfig::parse(config, values).map_err(|e| e.to_string())
}

/// Follows the ConfigMap until the process ends, handing each new version to `apply`.
pub async fn follow(client: kube::Client, namespace: String, name: String, apply: impl Fn(&ConfigMap)) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = watcher(api, config).boxed();
    let mut last_version = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => {
                let version = cm.metadata.resource_version.clone();
                if version.is_some() && version == last_version {
                    continue;
                }
                last_version = version;
                apply(&cm);
            }
            Ok(watcher::Event::Delete(_)) => {
                last_version = None;
                tracing::warn!(
                    "ConfigMap {namespace}/{name} was deleted: sidecar injection keeps serving with the last config"
                );
            }
            Ok(_) => {}
            Err(e) => {
                tracing::debug!("watching ConfigMap {namespace}/{name}: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
