//! istiod's sidecar injector on `--httpsAddr` (15017): `/inject` and `/inject/<key>/<value>...`
//! (Istio's `pkg/kube/inject/webhook.go`, `serveInject` and `inject`), set up as
//! `pilot/pkg/bootstrap/sidecarinjector.go` does (`INJECT_ENABLED`, the `istio-sidecar-injector`
//! ConfigMap: `configmap.rs`; native sidecars: `nodes.rs`). The verdict is the `webhooks` crate's
//! (`webhooks::injection`, the `inject` crate's engine); this module reads the request, counts
//! and logs as Istio does:
//!
//! - `sidecar_injection_requests_total`: every request; `sidecar_injection_time_seconds`: its time;
//! - `sidecar_injection_success_total`: every request answered with an AdmissionReview (as Istio
//!   counts it, a denied review too);
//! - `sidecar_injection_failure_total`: Istio's `handleError` (a body that cannot be read or
//!   decoded, a Pod that cannot be injected, no config to inject with);
//! - `sidecar_injection_skip_total`: Pods the policy skips (allowed without a patch);
//! - `sidecar_injection_config_errors_total` (ours): ConfigMap versions not applied.
//!
//! The mesh config is the one pilot-discovery runs with: the mesh file read at start, else the
//! `istio` ConfigMap's `mesh`, followed live as istiod's webhook follows it (its mesh handler in
//! `NewWebhook`); a version the injector cannot read is counted in
//! `sidecar_injection_config_errors_total` and the last good one keeps injecting.

mod configmap;
mod nodes;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use inject::{InjectorConfig, MeshConfig};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use webhooks::admission::{self, AdmissionRequest, AdmissionResponse};
use webhooks::injection::{self, Verdict};

pub use configmap::config_map_name;

/// Istio's injection metrics (`pkg/kube/inject/monitoring.go`), and ours for the ConfigMap.
#[derive(Clone)]
pub struct InjectionMetrics {
    requests: Counter,
    success: Counter,
    failure: Counter,
    skip: Counter,
    time: Histogram,
    config_errors: Counter,
}

impl InjectionMetrics {
    pub fn register(registry: &mut Registry) -> InjectionMetrics {
        let m = InjectionMetrics {
            requests: Counter::default(),
            success: Counter::default(),
            failure: Counter::default(),
            skip: Counter::default(),
            time: Histogram::new([0.1, 1.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0]),
            config_errors: Counter::default(),
        };
        // Counters keep Istio's names, `_total` included (see the monitoring crate).
        registry.register(
            "sidecar_injection_requests_total",
            "Total number of sidecar injection requests.",
            m.requests.clone(),
        );
        registry.register(
            "sidecar_injection_success_total",
            "Total number of successful sidecar injection requests.",
            m.success.clone(),
        );
        registry.register(
            "sidecar_injection_failure_total",
            "Total number of failed sidecar injection requests.",
            m.failure.clone(),
        );
        registry.register(
            "sidecar_injection_skip_total",
            "Total number of skipped sidecar injection requests.",
            m.skip.clone(),
        );
        registry.register(
            "sidecar_injection_time_seconds",
            "Total time taken for injection in seconds.",
            m.time.clone(),
        );
        registry.register(
            "sidecar_injection_config_errors_total",
            "Versions of the istio-sidecar-injector ConfigMap not applied (invalid YAML, a template error, a missing key).",
            m.config_errors.clone(),
        );
        m
    }
}

/// The injector the `/inject` routes serve with; cheap to clone.
#[derive(Clone)]
pub struct Injector(Arc<Inner>);

struct Inner {
    /// The last good config; `None` until the ConfigMap was read once.
    config: RwLock<Option<Arc<InjectorConfig>>>,
    /// `namespace/name` of the ConfigMap, for messages.
    configmap: String,
    /// The last good mesh config.
    mesh: RwLock<Arc<MeshConfig>>,
    revision: String,
    env: BTreeMap<String, String>,
    compliance_policy: String,
    native: nodes::Native,
    metrics: InjectionMetrics,
}

fn read<T>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// What the injector is built from besides the cluster.
pub struct Options {
    pub namespace: String,
    /// `REVISION`.
    pub revision: String,
    /// The mesh config's YAML pilot-discovery runs with (empty: Istio's defaults).
    pub mesh_yaml: String,
    /// istiod's environment (`ENABLE_NATIVE_SIDECARS`, `COMPLIANCE_POLICY`, the templates' `env`).
    pub env: BTreeMap<String, String>,
}

impl Injector {
    /// An injector with no config yet (see [`Injector::set_config`] and `start`).
    pub fn new(opts: Options, client: Option<&kube::Client>, metrics: InjectionMetrics) -> Injector {
        let mesh = match MeshConfig::parse(&opts.mesh_yaml) {
            Ok(m) => m,
            Err(e) => {
                metrics.config_errors.inc();
                tracing::error!(
                    "sidecar injection: the mesh config does not parse for the injector ({e}); injecting with Istio's defaults"
                );
                MeshConfig::default()
            }
        };
        let revision = match opts.revision.as_str() {
            "" => "default".to_owned(),
            r => r.to_owned(),
        };
        let native = nodes::Native::from_env(opts.env.get("ENABLE_NATIVE_SIDECARS").map(String::as_str), client);
        Injector(Arc::new(Inner {
            config: RwLock::new(None),
            configmap: format!("{}/{}", opts.namespace, config_map_name(&revision)),
            mesh: RwLock::new(Arc::new(mesh)),
            compliance_policy: opts.env.get("COMPLIANCE_POLICY").cloned().unwrap_or_default(),
            revision,
            env: opts.env,
            native,
            metrics,
        }))
    }

    /// One version of the ConfigMap: swapped in whole, or logged and counted.
    pub fn set_config(&self, cm: &k8s_openapi::api::core::v1::ConfigMap) {
        let inner = &self.0;
        match configmap::read(cm) {
            Ok(config) => {
                let templates: Vec<&str> = config.template_names().collect();
                tracing::info!(
                    configmap = %inner.configmap,
                    ?templates,
                    "sidecar injection config loaded"
                );
                *write(&inner.config) = Some(Arc::new(config));
            }
            Err(e) => {
                inner.metrics.config_errors.inc();
                let serving = if read(&inner.config).is_some() {
                    "the last good config keeps serving"
                } else {
                    "there is no config to inject with yet"
                };
                tracing::error!("ConfigMap {}: {e}; {serving}", inner.configmap);
            }
        }
    }

    /// Applies one version of the mesh config's YAML; one that does not parse is counted and
    /// logged, and the last good one stays.
    pub fn set_mesh(&self, yaml: &str) {
        match MeshConfig::parse(yaml) {
            Ok(mesh) => *write(&self.0.mesh) = Arc::new(mesh),
            Err(e) => {
                self.0.metrics.config_errors.inc();
                tracing::error!(
                    "sidecar injection: the new mesh config does not parse for the injector ({e}); still injecting with the last good one"
                );
            }
        }
    }

    /// The `/inject` routes.
    pub fn routes(self) -> Router {
        Router::new()
            .route("/inject", axum::routing::any(serve))
            .route("/inject/", axum::routing::any(serve))
            .route("/inject/{*params}", axum::routing::any(serve))
            .with_state(self)
    }
}

/// Where the injector's mesh config comes from.
pub enum MeshSource {
    /// A mesh config file's YAML (empty: Istio's defaults), read once.
    Fixed(String),
    /// The `istio` ConfigMap's `mesh`, followed.
    Live(tokio::sync::watch::Receiver<crate::mesh_configmap::LiveMesh>),
}

/// istiod's `initSidecarInjector`: `None` when `INJECT_ENABLED=false`; else the injector,
/// following the `istio-sidecar-injector` ConfigMap when there is a cluster, and the mesh config.
pub fn start(
    registry: &mut Registry,
    client: Option<&kube::Client>,
    mesh: MeshSource,
    namespace: &str,
) -> Option<Injector> {
    let env: BTreeMap<String, String> = std::env::vars().collect();
    if env.get("INJECT_ENABLED").is_some_and(|v| v == "false" || v == "0") {
        tracing::info!("Skipping sidecar injector, injection path is missing or disabled (INJECT_ENABLED=false)");
        return None;
    }
    let revision = env.get("REVISION").cloned().unwrap_or_default();
    let mesh_yaml = match &mesh {
        MeshSource::Fixed(yaml) => yaml.clone(),
        MeshSource::Live(rx) => rx.borrow().yaml.to_string(),
    };
    let metrics = InjectionMetrics::register(registry);
    let injector = Injector::new(
        Options {
            namespace: namespace.to_owned(),
            revision: revision.clone(),
            mesh_yaml,
            env,
        },
        client,
        metrics,
    );
    if let MeshSource::Live(rx) = mesh {
        tokio::spawn(follow_mesh(injector.clone(), rx));
    }
    match client {
        Some(client) => {
            tracing::info!(configmap = %injector.0.configmap, "initializing sidecar injector: /inject");
            let following = injector.clone();
            tokio::spawn(configmap::follow(
                client.clone(),
                namespace.to_owned(),
                config_map_name(&revision),
                move |cm| following.set_config(cm),
            ));
        }
        None => tracing::info!("Skipping sidecar injector, template not found (no cluster to read it from)"),
    }
    Some(injector)
}

/// Applies each new version of the mesh config until its sender is gone.
async fn follow_mesh(injector: Injector, mut rx: tokio::sync::watch::Receiver<crate::mesh_configmap::LiveMesh>) {
    while rx.changed().await.is_ok() {
        let yaml = rx.borrow_and_update().yaml.clone();
        injector.set_mesh(&yaml);
        tracing::info!("sidecar injection: the mesh config changed; new Pods are injected with it");
    }
}

/// Istio's `serveInject`.
async fn serve(State(injector): State<Injector>, uri: Uri, headers: HeaderMap, body: Body) -> Response {
    let inner = &injector.0;
    let metrics = &inner.metrics;
    metrics.requests.inc();
    let t0 = Instant::now();
    let path = uri.path().to_owned();
    let response = answer(inner, &path, &headers, body).await;
    metrics.time.observe(t0.elapsed().as_secs_f64());
    response
}

async fn answer(inner: &Inner, path: &str, headers: &HeaderMap, body: Body) -> Response {
    let metrics = &inner.metrics;
    let http_error = |status: StatusCode, message: String| {
        metrics.failure.inc();
        tracing::error!(path, "{message}");
        (status, format!("{message}\n")).into_response()
    };
    let body = match crate::admission_body::read(body).await {
        Ok(b) => b,
        Err((status, message)) => return http_error(status, message),
    };
    let Some(config) = read(&inner.config).clone() else {
        return http_error(
            StatusCode::NOT_FOUND,
            format!(
                "sidecar injection is not configured: ConfigMap {} has not been read (absent, or never valid)",
                inner.configmap
            ),
        );
    };
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    let mut admitted = false;
    let admit = |request: &AdmissionRequest| -> AdmissionResponse {
        admitted = true;
        let pod = injection::pod_name(request);
        tracing::info!(path, %pod, "Process sidecar injection request");
        let mesh = read(&inner.mesh).clone();
        let ctx = injection::Context {
            mesh: &mesh,
            revision: &inner.revision,
            path,
            compliance_policy: &inner.compliance_policy,
            env: &inner.env,
        };
        let (response, verdict) = injection::admit(&config, request, &ctx, |p| inner.native.for_pod(p));
        match verdict {
            Verdict::Injected => tracing::debug!(path, %pod, "injected"),
            Verdict::Skipped(reason) => {
                metrics.skip.inc();
                tracing::info!(path, %pod, reason = reason.label(), "Skipping due to policy check");
            }
            Verdict::Failed(message) => {
                metrics.failure.inc();
                tracing::error!(path, %pod, "Pod injection failed: {message}");
            }
        }
        response
    };
    match admission::serve(content_type, &body, admit) {
        Ok(json) => {
            if !admitted {
                // The body was not an AdmissionReview: denied ("could not decode body").
                metrics.failure.inc();
                tracing::error!(
                    path,
                    "Could not decode body: {}",
                    admission::bounded(&String::from_utf8_lossy(&json))
                );
            }
            metrics.success.inc();
            ([(header::CONTENT_TYPE, "application/json")], json).into_response()
        }
        Err(e) => http_error(
            StatusCode::from_u16(e.status).unwrap_or(StatusCode::BAD_REQUEST),
            e.message,
        ),
    }
}

#[cfg(test)]
mod tests;
