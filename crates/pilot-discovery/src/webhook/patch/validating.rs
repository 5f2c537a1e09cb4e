//! istiod's validation webhook controller (Istio's pkg/webhooks/validation/controller): keeps the
//! ValidatingWebhookConfigurations of its revision (label `istio.io/rev=<revision>`) pointing at
//! it. Each one's webhooks get the CA bundle as their `caBundle`, so that the API server trusts
//! the serving certificate of 15017, and their `failurePolicy` goes from `Ignore` to `Fail` once
//! the webhook is proven to answer: an invalid Gateway carrying Istio's always-reject annotation,
//! created with `dryRun=All`, must come back "denied the request". Until then the configuration
//! is retried with Istio's exponential backoff (100 ms to 1 min).
//!
//! Counted as Istio's: `galley_validation_config_updates`, and
//! `galley_validation_config_update_error{error}` with the API server's reason.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use serde_json::json;

use super::patcher::{Outcome, Patcher};
use super::queue::Limiter;

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

/// The validation controller of one revision.
pub struct ValidatingPatcher {
    pub client: kube::Client,
    pub revision: String,
    pub namespace: String,
    pub metrics: PatchMetrics,
    /// Proven once: the dry run was denied by the webhook.
    pub ready_for_fail_close: AtomicBool,
}

impl Patcher for ValidatingPatcher {
    type Config = ValidatingWebhookConfiguration;
    const NAME: &'static str = "validation webhook controller";

    fn selector(&self) -> Option<String> {
        Some(format!("istio.io/rev={}", self.revision))
    }

    fn limiter(&self) -> Limiter {
        Limiter::Exponential {
            base: Duration::from_millis(100),
            max: Duration::from_secs(60),
        }
    }

    async fn reconcile(&self, api: &Api<ValidatingWebhookConfiguration>, name: &str, ca_bundle: &str) -> Outcome {
        // The latest, not the event's: a retry after a conflict must not undo a newer write.
        let current = match api.get(name).await {
            Ok(c) => c,
            Err(kube::Error::Api(e)) if e.code == 404 => return Outcome::Done,
            Err(e) => {
                tracing::warn!(webhook = %name, "validation webhook controller: {e}");
                return Outcome::Retry;
            }
        };
        let webhooks = current.webhooks.as_deref().unwrap_or_default();
        let bundle = ByteString(ca_bundle.as_bytes().to_vec());
        let ca_change = webhooks
            .iter()
            .any(|w| w.client_config.ca_bundle.as_ref() != Some(&bundle));
        let fail_open = webhooks
            .iter()
            .any(|w| w.failure_policy.as_deref().is_some_and(|p| p != "Fail"));
        if !ca_change && !fail_open {
            return Outcome::Done;
        }
        let set_fail = fail_open && self.ready_for_fail_close().await;
        let mut updated = current.clone();
        for w in updated.webhooks.iter_mut().flatten() {
            w.client_config.ca_bundle = Some(bundle.clone());
            if set_fail {
                w.failure_policy = Some("Fail".into());
            }
        }
        if !ca_change && !set_fail {
            return Outcome::Retry;
        }
        match api.replace(name, &PostParams::default(), &updated).await {
            Ok(latest) => {
                self.metrics.updates.inc();
                tracing::info!(
                    webhook = %name,
                    resource_version = latest.metadata.resource_version.as_deref().unwrap_or_default(),
                    failure_policy = if set_fail { "Fail" } else { "unchanged" },
                    "validation webhook configuration patched with the CA bundle"
                );
                if !fail_open || set_fail {
                    Outcome::Done
                } else {
                    Outcome::Retry
                }
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
                Outcome::Retry
            }
        }
    }
}

impl ValidatingPatcher {
    /// Istio's `isDryRunOfInvalidConfigRejected`: an invalid Gateway with the always-reject
    /// annotation, created as a dry run, comes back denied by the webhook.
    async fn ready_for_fail_close(&self) -> bool {
        if self.ready_for_fail_close.load(Ordering::Relaxed) {
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
                self.ready_for_fail_close.store(true, Ordering::Relaxed);
                return true;
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {
                tracing::warn!("no Gateway CRD: cannot check the validation webhook; taking it as ready");
                self.ready_for_fail_close.store(true, Ordering::Relaxed);
                return true;
            }
            Err(e) => format!("the invalid config was rejected for the wrong reason: {e}"),
        };
        tracing::info!("not ready to switch validation to fail-closed: {why}");
        false
    }
}
