//! istiod's sidecar injection engine without the server (Istio's `pkg/kube/inject`): the
//! `istio-sidecar-injector` ConfigMap parsed once (`InjectorConfig`), the decision
//! (`injectRequired` behind the webhook's selectors), the templates (a Go `text/template`
//! engine with Istio's and sprig's functions) applied to the Pod as strategic merge patches,
//! Istio's post-processing, and the RFC 6902 patch the webhook answers with. Pure: no I/O.
//!
//! ```text
//! inject(cfg, params) ─► decision ─► template data ─► render each template ─► SMP onto the Pod
//!                                                      (template.rs, funcs)   (smp.rs)
//!                     ─► reapply user containers ─► post-process (probes, prometheus, status,
//!                        reorder) ─► json_patch::diff(original, injected)
//! ```
#![warn(unreachable_pub)]

mod config;
mod data;
mod decision;
mod funcs;
mod inject;
mod json_order;
mod mesh;
mod meta;
mod otel;
mod postprocess;
mod probe;
mod smp;
mod template;
mod validate;
mod yaml;

use std::collections::BTreeMap;

pub use config::{ConfigError, InjectorConfig, Policy};
pub use decision::{IGNORED_NAMESPACES, SkipReason, webhook_selects};
pub use mesh::{MeshConfig, MeshError};
pub use meta::parse_inject_envs;
pub use smp::SmpError;
pub use template::TemplateError;

/// The sidecar container's name (Istio's `ProxyContainerName`).
pub(crate) const PROXY_CONTAINER: &str = "istio-proxy";

/// One admission request's input besides the config.
#[derive(Debug, Clone)]
pub struct InjectParams<'a> {
    /// The Pod of the AdmissionRequest (`request.object`).
    pub pod: &'a serde_json::Value,
    /// The request's namespace (`request.namespace`), used when the Pod has none.
    pub namespace: &'a str,
    /// The namespace's labels, when known: then the webhook configuration's selectors are
    /// checked first (`SkipReason::NotSelected`), as the API server would before calling.
    pub namespace_labels: Option<&'a BTreeMap<String, String>>,
    /// The namespace's annotations on OpenShift (the proxy's UID/GID come from its ranges, and a
    /// sidecar `runAsUser` equal to the app's is dropped); `None` elsewhere.
    pub openshift_namespace_annotations: Option<&'a BTreeMap<String, String>>,
    pub mesh: &'a MeshConfig,
    /// This istiod's revision (`REVISION`, `default` when empty).
    pub revision: &'a str,
    /// The request path (`/inject/cluster/c1/net/n1`): proxy env vars.
    pub path: &'a str,
    /// Whether the proxy runs as a native sidecar (an init container with `restartPolicy:
    /// Always`): `ENABLE_NATIVE_SIDECARS`, or the node versions when auto-detected.
    pub native_sidecar: bool,
    /// `COMPLIANCE_POLICY` (e.g. `fips-140-3`), empty when unset.
    pub compliance_policy: &'a str,
    /// istiod's environment, for the templates' `env` function.
    pub env: &'a BTreeMap<String, String>,
}

/// What the webhook answers.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Allowed unchanged.
    Skipped(SkipReason),
    /// Allowed with `patch`, which applied to the request's Pod gives `pod`.
    Injected {
        pod: serde_json::Value,
        patch: json_patch::Patch,
    },
}

/// Why a Pod that was to be injected could not be; the request is answered with this message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("injecting pod {pod}: {reason}")]
pub struct InjectError {
    /// `namespace/name` (or `generateName***`).
    pub pod: String,
    pub reason: Failure,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Failure {
    #[error("not a Pod object: {0}")]
    NotAPod(String),
    #[error("{0}")]
    Annotations(String),
    #[error("requested template {name:?} not found; have {have}")]
    NoTemplate { name: String, have: String },
    #[error("template {name:?}: {source}")]
    Template {
        name: String,
        #[source]
        source: TemplateError,
    },
    #[error("template {name:?} rendered YAML that is not a Pod patch: {reason}")]
    RenderedYaml { name: String, reason: String },
    #[error("failed applying injection overlay: {0}")]
    Overlay(#[source] SmpError),
    #[error("{0}")]
    ProxyOverrides(String),
    #[error("invalid prometheus scrape configuration: {0}")]
    Prometheus(String),
    #[error("proxy config annotation: {0}")]
    ProxyConfig(#[source] MeshError),
    #[error("the patch does not give the injected pod: {0}")]
    Patch(String),
}

/// Decides and, when required, injects the sidecar into `params.pod`.
pub fn inject(cfg: &InjectorConfig, params: &InjectParams<'_>) -> Result<Outcome, InjectError> {
    inject::inject(cfg, params)
}
