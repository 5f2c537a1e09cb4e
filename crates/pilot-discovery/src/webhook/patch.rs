//! istiod's validation webhook controller (Istio's pkg/webhooks/validation/controller): keeps the
//! ValidatingWebhookConfigurations of its revision (label `istio.io/rev=<revision>`) pointing at
//! it. Each one's webhooks get the mesh root as their `caBundle`, so that the API server trusts
//! the serving certificate of 15017, and their `failurePolicy` goes from `Ignore` to `Fail` once
//! the webhook is proven to answer: an invalid Gateway carrying Istio's always-reject annotation,
//! created with `dryRun=All`, must come back "denied the request". A configuration someone
//! overwrites is patched again when its change is seen (the watch), as istiod's informer does.
//!
//! Counted as Istio's: `galley_validation_config_updates`, and
//! `galley_validation_config_update_error{error}` with the API server's reason.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::watcher;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde_json::json;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabel {
    error: String,
}

#[derive(Clone, Debug, Default)]
pub struct PatchMetrics {
    updates: Counter,
    update_errors: Family<ErrorLabel, Counter>,
}

impl PatchMetrics {
    pub fn register(registry: &mut Registry) -> PatchMetrics {
        let m = PatchMetrics::default();
        registry.register(
            "galley_validation_config_updates",
            "k8s webhook configuration updates",
            m.updates.clone(),
        );
        registry.register(
            "galley_validation_config_update_error",
            "k8s webhook configuration update error",
            m.update_errors.clone(),
        );
        m
    }
}

/// What the controller needs: where it runs and the root to publish.
#[derive(Clone)]
pub struct Controller {
    pub client: kube::Client,
    pub revision: String,
    pub namespace: String,
    pub ca_bundle: String,
    pub metrics: PatchMetrics,
}

impl Controller {
    /// Watches the configurations of the revision and patches each until the process ends.
    pub async fn run(self) {
        let api: Api<ValidatingWebhookConfiguration> = Api::all(self.client.clone());
        let selector = format!("istio.io/rev={}", self.revision);
        let mut ready_for_fail_close = false;
        loop {
            let mut events = watcher(api.clone(), watcher::Config::default().labels(&selector)).boxed();
            while let Some(event) = events.next().await {
                let configuration = match event {
                    Ok(watcher::Event::Apply(c) | watcher::Event::InitApply(c)) => c,
                    Ok(_) => continue,
                    Err(e) => {
                        tracing::warn!("validation webhook controller: watching ValidatingWebhookConfigurations: {e}");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                // Until the webhook is proven, retry with backoff (the watch sees no change).
                let mut backoff = Duration::from_millis(100);
                while !self.reconcile(&api, &configuration, &mut ready_for_fail_close).await {
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(60));
                }
            }
        }
    }

    /// Brings one configuration up to date; false to try again later.
    async fn reconcile(
        &self,
        api: &Api<ValidatingWebhookConfiguration>,
        current: &ValidatingWebhookConfiguration,
        ready_for_fail_close: &mut bool,
    ) -> bool {
        let name = current.metadata.name.clone().unwrap_or_default();
        // The latest, not the event's: a retry after a conflict must not undo a newer write.
        let current = match api.get(&name).await {
            Ok(c) => c,
            Err(kube::Error::Api(e)) if e.code == 404 => return true,
            Err(e) => {
                tracing::warn!(webhook = %name, "validation webhook controller: {e}");
                return false;
            }
        };
        let webhooks = current.webhooks.as_deref().unwrap_or_default();
        let bundle = ByteString(self.ca_bundle.as_bytes().to_vec());
        let ca_change = webhooks
            .iter()
            .any(|w| w.client_config.ca_bundle.as_ref() != Some(&bundle));
        let fail_open = webhooks
            .iter()
            .any(|w| w.failure_policy.as_deref().is_some_and(|p| p != "Fail"));
        if !ca_change && !fail_open {
            return true;
        }
        let set_fail = fail_open && self.ready_for_fail_close(ready_for_fail_close).await;
        let mut updated = current.clone();
        for w in updated.webhooks.iter_mut().flatten() {
            w.client_config.ca_bundle = Some(bundle.clone());
            if set_fail {
                w.failure_policy = Some("Fail".into());
            }
        }
        if !ca_change && !set_fail {
            return false;
        }
        match api.replace(&name, &PostParams::default(), &updated).await {
            Ok(latest) => {
                self.metrics.updates.inc();
                tracing::info!(
                    webhook = %name,
                    resource_version = latest.metadata.resource_version.as_deref().unwrap_or_default(),
                    failure_policy = if set_fail { "Fail" } else { "unchanged" },
                    "validation webhook configuration patched with the mesh root"
                );
                !fail_open || set_fail
            }
            Err(e) => {
                let reason = match &e {
                    kube::Error::Api(s) => s.reason.clone(),
                    _ => "Unknown".to_owned(),
                };
                self.metrics
                    .update_errors
                    .get_or_create(&ErrorLabel { error: reason })
                    .inc();
                tracing::warn!(webhook = %name, "validation webhook controller: updating: {e}");
                false
            }
        }
    }

    /// Istio's `isDryRunOfInvalidConfigRejected`: an invalid Gateway with the always-reject
    /// annotation, created as a dry run, comes back denied by the webhook.
    async fn ready_for_fail_close(&self, ready: &mut bool) -> bool {
        if *ready {
            return true;
        }
        let gateways: Api<kube::api::DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.namespace,
            &kube::api::ApiResource {
                group: "networking.istio.io".into(),
                version: "v1".into(),
                api_version: "networking.istio.io/v1".into(),
                kind: "Gateway".into(),
                plural: "gateways".into(),
            },
        );
        let mut invalid = kube::api::DynamicObject {
            types: Some(kube::api::TypeMeta {
                api_version: "networking.istio.io/v1".into(),
                kind: "Gateway".into(),
            }),
            metadata: ObjectMeta {
                name: Some("invalid-gateway".into()),
                namespace: Some(self.namespace.clone()),
                labels: Some([("istio.io/rev".to_owned(), self.revision.clone())].into()),
                annotations: Some([(webhooks::validation::ALWAYS_REJECT.to_owned(), "true".to_owned())].into()),
                ..Default::default()
            },
            data: json!({"spec": {}}),
        };
        let dry_run = PostParams {
            dry_run: true,
            ..Default::default()
        };
        let mut result = gateways.create(&dry_run, &invalid).await;
        if matches!(&result, Err(kube::Error::Api(e)) if e.code == 409) {
            invalid.metadata.resource_version = None;
            result = gateways.replace("invalid-gateway", &dry_run, &invalid).await;
        }
        let why = match result {
            Ok(_) => "the invalid config was not rejected".to_owned(),
            Err(kube::Error::Api(e)) if e.message.contains("denied the request") => {
                tracing::info!("the validation webhook rejected invalid config: switching it to fail-closed");
                *ready = true;
                return true;
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {
                tracing::warn!("no Gateway CRD: cannot check the validation webhook; taking it as ready");
                *ready = true;
                return true;
            }
            Err(e) => format!("the invalid config was rejected for the wrong reason: {e}"),
        };
        tracing::info!("not ready to switch validation to fail-closed: {why}");
        false
    }
}
