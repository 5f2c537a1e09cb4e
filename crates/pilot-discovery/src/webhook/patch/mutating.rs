//! Istio's webhook cert patcher (pkg/webhooks/webhookpatch.go), which istiod runs for the
//! sidecar injector when `INJECTION_WEBHOOK_CONFIG_NAME` is not empty (its default,
//! `istio-sidecar-injector`, only turns it on: the configurations patched are chosen by label,
//! not by that name). Every MutatingWebhookConfiguration is watched; one is patched when its
//! `istio.io/rev` label is this istiod's revision: each webhook whose name ends in
//! `sidecar-injector.istio.io` gets the CA bundle as its `caBundle`, written only when it differs.
//! A configuration without the label is not Istio's and is left alone; one of another revision,
//! or without such a webhook, is counted and not retried; a failed update is retried with
//! Istio's fast-slow limiter (5 times at 100 ms, then every minute), for ever.
//!
//! Counted as Istio's: `webhook_patch_attempts_total{name}` (labelled, as Istio's is, with the
//! webhook name suffix), `webhook_patch_retries_total{name}`, and
//! `webhook_patch_failures_total{name, reason}` (`wrong_revision`, `load_ca_bundle_failure`,
//! `webhook_config_not_found`, `webhook_entry_not_found`, `webhook_update_failure`).

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::Api;
use kube::api::PostParams;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::patcher::{Outcome, Patcher};
use super::queue::Limiter;

/// Istio's `webhookName` of the injector (pilot/pkg/bootstrap/sidecarinjector.go).
pub const INJECTOR_WEBHOOK_SUFFIX: &str = "sidecar-injector.istio.io";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NameLabel {
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FailureLabels {
    name: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Default)]
pub struct MutatingMetrics {
    attempts: Family<NameLabel, Counter>,
    retries: Family<NameLabel, Counter>,
    failures: Family<FailureLabels, Counter>,
}

impl MutatingMetrics {
    pub fn register(registry: &mut Registry) -> MutatingMetrics {
        let m = MutatingMetrics::default();
        registry.register(
            "webhook_patch_attempts",
            "Webhook patching attempts",
            m.attempts.clone(),
        );
        registry.register("webhook_patch_retries", "Webhook patching retries", m.retries.clone());
        registry.register(
            "webhook_patch_failures",
            "Webhook patching total failures",
            m.failures.clone(),
        );
        m
    }

    fn failure(&self, name: &str, reason: &'static str) {
        self.failures
            .get_or_create(&FailureLabels {
                name: name.to_owned(),
                reason,
            })
            .inc();
    }
}

/// The injector's webhook cert patcher of one revision.
pub struct MutatingPatcher {
    pub revision: String,
    pub metrics: MutatingMetrics,
}

/// Istio's `VerifyCABundle`: the first PEM block is a parsable certificate.
fn verify_ca_bundle(pem: &str) -> Result<(), String> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    match CertificateDer::pem_slice_iter(pem.as_bytes()).next() {
        Some(Ok(der)) => x509_parser::parse_x509_certificate(&der)
            .map(|_| ())
            .map_err(|e| format!("cert contains invalid x509 certificate: {e}")),
        Some(Err(e)) => Err(format!("could not decode pem: {e}")),
        None => Err("could not decode pem".into()),
    }
}

impl Patcher for MutatingPatcher {
    type Config = MutatingWebhookConfiguration;
    const NAME: &'static str = "injection webhook cert patcher";

    fn selector(&self) -> Option<String> {
        None
    }

    fn limiter(&self) -> Limiter {
        Limiter::FastSlow {
            fast: Duration::from_millis(100),
            slow: Duration::from_secs(60),
            fast_attempts: 5,
        }
    }

    async fn reconcile(&self, api: &Api<MutatingWebhookConfiguration>, name: &str, ca_bundle: &str) -> Outcome {
        let outcome = self.patch(api, name, ca_bundle).await;
        if outcome == Outcome::Retry {
            self.metrics
                .retries
                .get_or_create(&NameLabel { name: name.to_owned() })
                .inc();
        }
        outcome
    }
}

impl MutatingPatcher {
    /// Istio's `patchMutatingWebhookConfig` with `webhookPatchTask`'s retry decision.
    async fn patch(&self, api: &Api<MutatingWebhookConfiguration>, name: &str, ca_bundle: &str) -> Outcome {
        let mut config = match api.get(name).await {
            Ok(c) => c,
            Err(kube::Error::Api(e)) if e.code == 404 => {
                self.metrics.failure(name, "webhook_config_not_found");
                return Outcome::Done;
            }
            Err(e) => {
                tracing::warn!(webhook = %name, "patching webhook {name} failed: {e}");
                return Outcome::Retry;
            }
        };
        match config.metadata.labels.as_ref().and_then(|l| l.get("istio.io/rev")) {
            None => {
                tracing::debug!(
                    "webhook config {name:?} does not have revision label. It is not a Istio webhook. Skipping patching"
                );
                return Outcome::Done;
            }
            Some(rev) if *rev != self.revision => {
                self.metrics.failure(name, "wrong_revision");
                return Outcome::Done;
            }
            Some(_) => {}
        }
        if let Err(e) = verify_ca_bundle(ca_bundle) {
            tracing::error!(webhook = %name, "Failed to load CA bundle: {e}");
            self.metrics.failure(name, "load_ca_bundle_failure");
            return Outcome::Retry;
        }
        let bundle = ByteString(ca_bundle.as_bytes().to_vec());
        let (mut found, mut updated) = (false, false);
        for w in config.webhooks.iter_mut().flatten() {
            if w.name.ends_with(INJECTOR_WEBHOOK_SUFFIX) {
                updated |= w.client_config.ca_bundle.as_ref() != Some(&bundle);
                w.client_config.ca_bundle = Some(bundle.clone());
                found = true;
            }
        }
        if !found {
            self.metrics.failure(name, "webhook_entry_not_found");
            return Outcome::Done;
        }
        if !updated {
            return Outcome::Done;
        }
        self.metrics
            .attempts
            .get_or_create(&NameLabel {
                name: INJECTOR_WEBHOOK_SUFFIX.to_owned(),
            })
            .inc();
        match api.replace(name, &PostParams::default(), &config).await {
            Ok(latest) => {
                tracing::info!(
                    webhook = %name,
                    resource_version = latest.metadata.resource_version.as_deref().unwrap_or_default(),
                    "mutating webhook configuration patched with the CA bundle"
                );
                Outcome::Done
            }
            Err(e) => {
                self.metrics.failure(name, "webhook_update_failure");
                tracing::error!(webhook = %name, "patching webhook {name} failed: {e}");
                Outcome::Retry
            }
        }
    }
}

#[cfg(test)]
mod tests;
