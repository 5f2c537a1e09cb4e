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

mod config;
mod decision;
mod funcs;
mod json_order;
mod mesh;
mod otel;
pub mod smp;
pub mod template;
mod validate;
mod yaml;

pub use config::{ConfigError, InjectorConfig, Policy};
pub use decision::{IGNORED_NAMESPACES, SkipReason, webhook_selects};
pub use mesh::{MeshConfig, MeshError};
pub use smp::SmpError;
pub use template::TemplateError;
