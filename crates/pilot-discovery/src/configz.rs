//! `/debug/configz` and `/debug/syncz` in istiod's shapes (Kiali reads them), and our
//! `/debug/config_errors`: every config problem and what proxies rejected traced to the configs
//! that produced it (`crate::nacks`).
//!
//! configz is serialized straight from the store's snapshot (no JSON tree copied from it), off
//! the async runtime, one dump at a time (`AppState::dumps`): ten concurrent requests on a
//! 100k-resource config took the probe from 0.7 to 2.5 GB when each built its own tree.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Json, Response};
use config_sources::SourceErrorEntry;
use model::ConfigSpec;
use serde::Serialize;
use serde_json::{Value, json};
use xds_api::type_url;

use crate::app_state::AppState;
use crate::nacks::{names_config, rejections};

/// Istio's syncz (`SyncStatus`, which Kiali reads): per proxy its ID (`pod.namespace`), type,
/// cluster and version, the nonces sent and ACKed per type under Istio's keys (`cluster_sent`,
/// `listener_acked`, ... and `resources` by type URL); besides, per short type, the sync status,
/// the version sent and, for a NACK, the rejected resources and the configs they came from.
pub async fn syncz(State(s): State<AppState>) -> Json<Vec<Value>> {
    let traced = rejections(&s.server);
    let out = s
        .server
        .connections()
        .into_iter()
        .map(|c| {
            let mut entry = serde_json::Map::new();
            entry.insert("proxy".into(), json!(c.proxy_id));
            entry.insert("proxy_type".into(), json!(c.proxy_type));
            if !c.cluster_id.is_empty() {
                entry.insert("cluster_id".into(), json!(c.cluster_id));
            }
            entry.insert("node_id".into(), json!(c.node_id));
            entry.insert("connection_id".into(), json!(c.connection_id));
            entry.insert("istio_version".into(), json!(c.proxy_version));
            let mut resources = serde_json::Map::new();
            for (t, w) in &c.watched {
                // Istio's `SyncStatus`: `<cluster|listener|route|endpoint>_sent/_acked`
                let istio = match t.as_str() {
                    type_url::CLUSTER => Some("cluster"),
                    type_url::LISTENER => Some("listener"),
                    type_url::ROUTE => Some("route"),
                    type_url::ENDPOINT => Some("endpoint"),
                    _ => None,
                };
                if let Some(k) = istio {
                    if !w.nonce_sent.is_empty() {
                        entry.insert(format!("{k}_sent"), json!(w.nonce_sent));
                    }
                    if !w.nonce_acked.is_empty() {
                        entry.insert(format!("{k}_acked"), json!(w.nonce_acked));
                    }
                }
                let mut r = serde_json::Map::new();
                for (key, v) in [
                    ("sent", &w.nonce_sent),
                    ("acked", &w.nonce_acked),
                    ("lastError", &w.last_error),
                ] {
                    if !v.is_empty() {
                        r.insert(key.into(), json!(v));
                    }
                }
                if let Some(at) = &w.last_sent {
                    r.insert("sentTime".into(), json!(at));
                }
                resources.insert(t.clone(), Value::Object(r));
            }
            entry.insert("resources".into(), Value::Object(resources));
            for (t, w) in &c.watched {
                let short = type_url::short(t);
                let status = if !w.last_error.is_empty() {
                    "NACKED"
                } else if w.nonce_sent.is_empty() {
                    "NOT SENT"
                } else if w.nonce_sent == w.nonce_acked {
                    "SYNCED"
                } else {
                    "STALE"
                };
                entry.insert(format!("{short}_sent"), json!(w.nonce_sent));
                entry.insert(format!("{short}_acked"), json!(w.nonce_acked));
                entry.insert(format!("{short}_status"), json!(status));
                entry.insert(format!("{short}_version"), json!(w.version_sent));
                if !w.last_error.is_empty() {
                    entry.insert(format!("{short}_error"), json!(w.last_error));
                }
                if let Some(r) = traced.iter().find(|r| r.proxy == c.node_id && &r.type_url == t) {
                    entry.insert(format!("{short}_rejected_resources"), json!(r.resources));
                    entry.insert(format!("{short}_rejected_configs"), json!(r.configs));
                }
            }
            Value::Object(entry)
        })
        .collect();
    Json(out)
}

/// One config as istiod's configz shows it (`crd.ConvertConfig`): a Kubernetes object.
#[derive(Serialize)]
struct KubernetesConfig<'a> {
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    kind: &'static str,
    metadata: ObjectMeta<'a>,
    spec: &'a ConfigSpec,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ObjectMeta<'a> {
    name: &'a str,
    namespace: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_version: Option<&'a str>,
    #[serde(skip_serializing_if = "is_zero")]
    generation: i64,
    /// RFC 3339, or `null` when the config has none (Go's zero `metav1.Time`).
    creation_timestamp: Option<String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    labels: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    annotations: &'a BTreeMap<String, String>,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// istiod's `/debug/configz` (Kiali reads it): every Istio config in effect, a JSON array of
/// Kubernetes objects, with the Gateways and VirtualServices made from Ingresses. Core Kubernetes
/// objects (Services, EndpointSlices, Pods, Ingresses) are input, not config, and left out as
/// istiod does. What was rejected is `/debug/config_errors`.
pub async fn configz(State(s): State<AppState>) -> Response {
    let Ok(_permit) = s.dumps.acquire().await else {
        return StatusCode::SERVICE_UNAVAILABLE.into_response();
    };
    let store = s.store.borrow().clone();
    let derived = s.environment.ingress_output().configs;
    let built = tokio::task::spawn_blocking(move || {
        let from_ingresses = derived.iter().filter(|(k, _)| !store.configs.contains_key(*k));
        let configs: Vec<_> = store
            .configs
            .iter()
            .chain(from_ingresses)
            .map(|(_, c)| c)
            .filter(|c| !matches!(c.spec, ConfigSpec::Kubernetes(_)))
            .map(|c| KubernetesConfig {
                api_version: &c.meta.api_version,
                kind: c.kind.as_str(),
                metadata: ObjectMeta {
                    name: &c.meta.name,
                    namespace: &c.meta.namespace,
                    resource_version: c.meta.resource_version.as_deref(),
                    generation: c.meta.generation,
                    creation_timestamp: c.meta.creation_time.map(creation_timestamp),
                    labels: &c.meta.labels,
                    annotations: &c.meta.annotations,
                },
                spec: &c.spec,
            })
            .collect();
        serde_json::to_vec(&configs)
    })
    .await;
    json_body("configz", built)
}

/// `metav1.Time`'s form: RFC 3339 to the second, UTC.
fn creation_timestamp((secs, _nanos): (i64, u32)) -> String {
    let at = u64::try_from(secs).map_or(UNIX_EPOCH, |s| UNIX_EPOCH + Duration::from_secs(s));
    xds_server::rfc3339(at)
}

#[derive(Serialize)]
struct ConfigErrors<'a> {
    /// Every current problem: unreadable files, invalid configs, unknown or unsupported kinds,
    /// and what of the Ingresses is not served.
    errors: Vec<SourceErrorEntry>,
    /// Configs rejected since start, by kind.
    invalid_counts: &'a BTreeMap<String, u64>,
    /// What proxies rejected (NACKs), with the configs that produced it and their files.
    rejected: Vec<Rejected<'a>>,
}

#[derive(Serialize)]
struct Rejected<'a> {
    proxy: &'a str,
    #[serde(rename = "type")]
    type_url: &'a str,
    resources: &'a [String],
    error: &'a str,
    /// Istio config paths (`/apis/<group>/<version>/namespaces/<ns>/<kind>/<name>`).
    configs: &'a [String],
    /// Where those configs came from (files, or `kubernetes://<kind>/<ns>/<name>`).
    sources: Vec<&'a PathBuf>,
}

/// What istiod's validation webhook would have refused and what proxies NACKed: every config
/// problem (invalid, unsupported, unknown kinds, unreadable files; cluster objects that do not
/// decode or whose IPs or ports are dropped; Ingress paths, TLS entries and
/// backends not served, as warnings) and each rejection traced to the configs behind it.
/// pilot-discovery's own; istiod has no such view.
pub async fn config_errors(State(s): State<AppState>) -> Response {
    let store = s.store.borrow().clone();
    let mut errors = store.errors.to_vec();
    // the cluster registry's objects that do not decode or convert whole
    errors.extend(crate::kubernetes::problems());
    errors.extend(s.environment.ingress_output().problems.iter().map(|p| {
        SourceErrorEntry {
            file: store
                .origins
                .get(&p.resource)
                .cloned()
                .unwrap_or_else(|| PathBuf::from(format!("kubernetes://{}", p.resource))),
            resource: Some(p.resource.to_string()),
            reason: p.to_string(),
            level: config_sources::Level::Warning,
        }
    }));
    let traced = rejections(&s.server);
    let rejected = traced
        .iter()
        .map(|r| Rejected {
            proxy: &r.proxy,
            type_url: &r.type_url,
            resources: &r.resources,
            error: &r.error,
            configs: &r.configs,
            sources: store
                .origins
                .iter()
                .filter(|(k, _)| {
                    r.configs
                        .iter()
                        .any(|p| names_config(p, k.kind.as_str(), &k.namespace, &k.name))
                })
                .map(|(_, f)| f)
                .collect(),
        })
        .collect();
    json_body::<std::convert::Infallible>(
        "config_errors",
        Ok(serde_json::to_vec(&ConfigErrors {
            errors,
            invalid_counts: &store.invalid_counts,
            rejected,
        })),
    )
}

fn json_body<E: std::fmt::Display>(what: &str, built: Result<serde_json::Result<Vec<u8>>, E>) -> Response {
    match built {
        Ok(Ok(body)) => ([(header::CONTENT_TYPE, "application/json")], body).into_response(),
        Ok(Err(e)) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{what}: {e}\n")).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("{what}: {e}\n")).into_response(),
    }
}
