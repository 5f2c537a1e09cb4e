//! Pilot's HTTP servers: the debug server (`--httpAddr`: `/ready`, `/debug/*`) and the monitoring
//! server (`--monitoringAddr`: `/metrics`, `/version`, and the same debug endpoints, as istiod).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use config_sources::StoreSnapshot;
use environment::Environment;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio::sync::watch;
use xds_api::type_url;
use xds_server::{DiscoveryServer, PushSnapshot, WatchedResource};

#[derive(Clone)]
pub struct AppState {
    pub server: Arc<DiscoveryServer<Environment>>,
    pub environment: Arc<Environment>,
    pub registry: Arc<Registry>,
    /// `process_*`, read at each scrape.
    pub process: monitoring::process::ProcessMetrics,
    pub store: watch::Receiver<StoreSnapshot>,
    /// ENABLE_DEBUG_ENDPOINT_AUTH.
    pub debug_auth: bool,
    /// The large debug dumps (`/debug/configz`, ...) are built one at a time: ten concurrent
    /// dumps of a large config must not hold ten copies of it.
    pub dumps: Arc<tokio::sync::Semaphore>,
}

impl AppState {
    /// One permit: see `dumps`.
    pub fn dump_permits() -> Arc<tokio::sync::Semaphore> {
        Arc::new(tokio::sync::Semaphore::new(1))
    }
}

/// The debug routes (and `/ready`), behind Istio's debug endpoint authentication.
fn debug_routes(state: &AppState) -> Router<AppState> {
    Router::new()
        .route("/ready", get(ready))
        .route("/debug/adsz", get(adsz))
        .route("/debug/syncz", get(crate::configz::syncz))
        .route("/debug/configz", get(crate::configz::configz))
        .route("/debug/registryz", get(registryz))
        .route("/debug/endpointz", get(endpointz))
        .route("/debug/config_dump", get(config_dump))
        .route("/debug/push_status", get(push_status))
        .route("/debug/mesh", get(mesh))
        .route("/debug", get(index))
        .route_layer(middleware::from_fn_with_state(state.clone(), debug_auth))
}

/// Istio's debug endpoint authentication (`ENABLE_DEBUG_ENDPOINT_AUTH`, default on): `/debug/*`
/// is served to loopback callers; others would need a token the mesh's authenticators accept,
/// and until pilot-discovery has authenticators (the mTLS work) they are refused. `/ready`,
/// `/metrics` and `/version` stay open, as Istio's.
async fn debug_auth(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    let open = !s.debug_auth || !req.uri().path().starts_with("/debug") || peer.is_some_and(|p| p.ip().is_loopback());
    if open {
        return next.run(req).await;
    }
    let who = peer.map_or_else(|| "an unknown address".to_owned(), |p| p.ip().to_string());
    (
        StatusCode::UNAUTHORIZED,
        format!(
            "debug endpoints are served to loopback only: {who} would need a token, and no authenticator is \
             configured (ENABLE_DEBUG_ENDPOINT_AUTH=false serves everyone)\n"
        ),
    )
        .into_response()
}

/// `--httpAddr`.
pub fn debug_router(state: AppState) -> Router {
    debug_routes(&state).with_state(state)
}

/// `--monitoringAddr`.
pub fn monitoring_router(state: AppState) -> Router {
    debug_routes(&state)
        .route("/metrics", get(metrics))
        .route("/version", get(version))
        .with_state(state)
}

async fn index() -> Json<Value> {
    Json(json!({"endpoints": [
        "/debug/adsz", "/debug/syncz", "/debug/configz", "/debug/registryz", "/debug/endpointz",
        "/debug/config_dump?proxyID=", "/debug/push_status", "/debug/mesh", "/ready", "/metrics", "/version"
    ]}))
}

async fn ready(State(s): State<AppState>) -> Response {
    if s.server.ready() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: initial push context not built\n",
        )
            .into_response()
    }
}

async fn version() -> String {
    crate::version::INFO.line()
}

async fn metrics(State(s): State<AppState>) -> Response {
    s.process.update();
    match monitoring::render(&s.registry) {
        Ok(text) => ([(header::CONTENT_TYPE, monitoring::TEXT_CONTENT_TYPE)], text).into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics: {e}\n")).into_response(),
    }
}

/// Istio's adsz: every connected proxy and what it watches.
async fn adsz(State(s): State<AppState>) -> Json<Value> {
    let conns = s.server.connections();
    Json(json!({"totalClients": conns.len(), "clients": conns}))
}

/// Istio's registryz: every service as istiod's `model.Service` JSON (which Kiali parses):
/// `Attributes` (Go field names), `ports`, `hostname`, `clusterVIPs`, `defaultAddress`,
/// `Resolution` (Istio's enum number), `MeshExternal`; plus `origin`, the object it came from.
async fn registryz(State(s): State<AppState>) -> Json<Value> {
    let registry = s.environment.registry();
    Json(Value::Array(
        registry.services.iter().map(|svc| istio_service_json(svc)).collect(),
    ))
}

fn istio_service_json(svc: &model::Service) -> Value {
    use model::service::Visibility;
    let a = &svc.attributes;
    let export_to: serde_json::Map<String, Value> = a
        .export_to
        .iter()
        .map(|v| {
            let k = match v {
                Visibility::Public => "*".to_owned(),
                Visibility::Private => ".".to_owned(),
                Visibility::None => "~".to_owned(),
                Visibility::Namespace(ns) => ns.clone(),
            };
            (k, json!({}))
        })
        .collect();
    // Istio's `Resolution` numbers: ClientSideLB 0, DNSLB 1, Passthrough 2, DNSRoundRobinLB 3.
    let resolution = match svc.resolution {
        model::Resolution::ClientSideLb => 0,
        model::Resolution::DnsLb => 1,
        model::Resolution::Passthrough => 2,
        model::Resolution::DnsRoundRobinLb => 3,
    };
    let cluster = if a.cluster_id.is_empty() {
        ""
    } else {
        a.cluster_id.as_str()
    };
    let mut out = json!({
        "Attributes": {
            "ServiceRegistry": a.service_registry,
            "Name": a.name,
            "Namespace": a.namespace,
            "Labels": a.labels,
            "ExportTo": export_to,
            "LabelSelectors": a.label_selectors,
        },
        "ports": svc.ports.iter().map(|p| json!({"name": p.name, "port": p.port, "protocol": p.protocol.as_str()})).collect::<Vec<_>>(),
        "hostname": svc.hostname,
        "Resolution": resolution,
        "MeshExternal": svc.mesh_external,
        "origin": svc.origin,
    });
    if let Some(first) = svc.addresses.first() {
        out["defaultAddress"] = json!(first);
        out["clusterVIPs"] = json!({"Addresses": {cluster: svc.addresses}});
    }
    out
}

async fn endpointz(State(s): State<AppState>) -> Json<Value> {
    let registry = s.environment.registry();
    let by_service: BTreeMap<String, Value> = registry
        .endpoints
        .iter()
        .map(|(k, eps)| (k.to_string(), json!(**eps)))
        .collect();
    Json(json!(by_service))
}

async fn mesh(State(s): State<AppState>) -> Json<Value> {
    Json(json!(s.environment.mesh()))
}

async fn push_status(State(s): State<AppState>) -> Json<Value> {
    Json(json!(s.server.push_status()))
}

#[derive(serde::Deserialize)]
struct DumpQuery {
    #[serde(rename = "proxyID")]
    proxy_id: Option<String>,
}

/// The xDS pilot would send a connected proxy now, in the layout of Envoy's `/config_dump`.
async fn config_dump(State(s): State<AppState>, Query(q): Query<DumpQuery>) -> Response {
    let Some(id) = q.proxy_id.filter(|s| !s.is_empty()) else {
        return (
            StatusCode::BAD_REQUEST,
            "proxyID is required (a connection ID, node ID, or pod.namespace)\n",
        )
            .into_response();
    };
    let Some((proxy, status)) = s.server.find_proxy(&id) else {
        return (StatusCode::NOT_FOUND, format!("proxy {id:?} is not connected\n")).into_response();
    };
    let Some(snapshot) = s.server.current_snapshot() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "no push context yet\n").into_response();
    };
    let version = snapshot.version().to_owned();
    let mut sections = Vec::new();
    for (t, dump_type, list_field, item_field) in [
        (
            type_url::CLUSTER,
            "ClustersConfigDump",
            "dynamic_active_clusters",
            "cluster",
        ),
        (
            type_url::ENDPOINT,
            "EndpointsConfigDump",
            "dynamic_endpoint_configs",
            "endpoint_config",
        ),
        (
            type_url::LISTENER,
            "ListenersConfigDump",
            "dynamic_listeners",
            "listener",
        ),
        (
            type_url::ROUTE,
            "RoutesConfigDump",
            "dynamic_route_configs",
            "route_config",
        ),
    ] {
        let watched = match status.watched.get(t) {
            Some(w) => WatchedResource {
                type_url: t.to_owned(),
                names: w.names.iter().cloned().collect(),
                wildcard: w.wildcard,
            },
            None => WatchedResource {
                type_url: t.to_owned(),
                names: Default::default(),
                wildcard: true,
            },
        };
        let resources = match snapshot.generate(&proxy, &watched) {
            Ok(r) => r,
            Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response(),
        };
        let mut items = Vec::new();
        for r in resources {
            let body = match xds_api::json::any_to_json(&r.resource) {
                Ok(v) => v,
                Err(e) => return (StatusCode::INTERNAL_SERVER_ERROR, format!("{}: {e}\n", r.name)).into_response(),
            };
            let item = if t == type_url::LISTENER {
                json!({"name": r.name, "active_state": {"version_info": version, "listener": body}})
            } else {
                json!({"version_info": version, item_field: body})
            };
            items.push(item);
        }
        sections.push(json!({
            "@type": format!("type.googleapis.com/envoy.admin.v3.{dump_type}"),
            list_field: items,
        }));
    }
    Json(json!({"configs": sections})).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use environment::{Environment, ServiceEntries};
    use tower::ServiceExt;

    fn state(debug_auth: bool) -> AppState {
        let mesh = Arc::new(model::MeshConfig::default());
        let environment = Arc::new(Environment::new(
            mesh.clone(),
            "cluster.local".into(),
            vec![Box::new(ServiceEntries::new(mesh))],
        ));
        let mut registry = Registry::default();
        let server = DiscoveryServer::new(environment.clone(), Default::default(), &mut registry);
        let process = monitoring::process::ProcessMetrics::register(&mut registry);
        AppState {
            server,
            environment,
            registry: Arc::new(registry),
            process,
            store: watch::channel(StoreSnapshot::default()).1,
            debug_auth,
            dumps: AppState::dump_permits(),
        }
    }

    async fn status(app: &Router, from: [u8; 4], path: &str) -> StatusCode {
        let mut req = Request::builder().uri(path).body(Body::empty()).unwrap_or_default();
        req.extensions_mut()
            .insert(ConnectInfo(SocketAddr::from((from, 40000))));
        match app.clone().oneshot(req).await {
            Ok(r) => r.status(),
            Err(e) => match e {},
        }
    }

    #[tokio::test]
    async fn debug_endpoints_are_served_to_loopback_only() {
        for app in [debug_router(state(true)), monitoring_router(state(true))] {
            assert_eq!(status(&app, [127, 0, 0, 1], "/debug/adsz").await, StatusCode::OK);
            assert_eq!(
                status(&app, [10, 1, 2, 3], "/debug/adsz").await,
                StatusCode::UNAUTHORIZED
            );
            assert_eq!(
                status(&app, [10, 1, 2, 3], "/debug/configz").await,
                StatusCode::UNAUTHORIZED
            );
            assert_ne!(status(&app, [10, 1, 2, 3], "/ready").await, StatusCode::UNAUTHORIZED);
        }
        let monitoring = monitoring_router(state(true));
        assert_eq!(status(&monitoring, [10, 1, 2, 3], "/metrics").await, StatusCode::OK);
        assert_eq!(status(&monitoring, [10, 1, 2, 3], "/version").await, StatusCode::OK);
        let open = debug_router(state(false));
        assert_eq!(status(&open, [10, 1, 2, 3], "/debug/adsz").await, StatusCode::OK);
    }
}
