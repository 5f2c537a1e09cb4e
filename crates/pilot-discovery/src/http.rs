//! Pilot's HTTP servers: the debug server (`--httpAddr`: `/ready`, `/debug/*`) and the monitoring
//! server (`--monitoringAddr`: `/metrics`, `/version`, and the same debug endpoints, as istiod).

use std::net::SocketAddr;

use axum::Router;
use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use serde_json::{Value, json};
use xds_api::type_url;
use xds_server::{CurrentResources, CurrentResourcesError};

pub use crate::app_state::AppState;

/// The debug routes (and `/ready`), behind Istio's debug endpoint authentication.
fn debug_routes(state: &AppState) -> Router<AppState> {
    Router::new()
        .route("/ready", get(ready))
        .route("/debug/adsz", get(adsz))
        .route("/debug/syncz", get(crate::configz::syncz))
        .route("/debug/configz", get(crate::configz::configz))
        .route("/debug/config_errors", get(crate::configz::config_errors))
        .route("/debug/registryz", get(crate::registryz::registryz))
        .route("/debug/endpointz", get(crate::registryz::endpoint_shardz))
        .route("/debug/endpointShardz", get(crate::registryz::endpoint_shardz))
        .route("/debug/config_dump", get(config_dump))
        .route("/debug/ndsz", get(ndsz))
        .route("/debug/push_status", get(push_status))
        .route("/debug/mesh", get(mesh))
        .route("/debug/networkz", get(networkz))
        .route("/debug/clusterz", get(clusterz))
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
        "/debug/adsz", "/debug/syncz", "/debug/configz", "/debug/config_errors", "/debug/registryz", "/debug/endpointShardz", "/debug/endpointz",
        "/debug/config_dump?proxyID=", "/debug/ndsz?proxyID=", "/debug/push_status", "/debug/mesh", "/debug/networkz", "/debug/clusterz", "/ready", "/metrics", "/version"
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

async fn mesh(State(s): State<AppState>) -> Json<Value> {
    Json(json!(s.environment.mesh()))
}

/// Istio's `/debug/networkz`: the cross-network gateways (those meshNetworks names by address).
async fn networkz(State(s): State<AppState>) -> Json<Value> {
    let gateways = s.networks.borrow().address_gateways();
    Json(json!(gateways))
}

/// Istio's `/debug/clusterz`: the config cluster and the remote clusters, with the secret that
/// names each and its sync status; 400 without a Kubernetes registry, as istiod without its
/// multicluster controller.
async fn clusterz(State(s): State<AppState>) -> Response {
    match &s.clusters {
        Some(c) => Json(json!(c.debug_info(true))).into_response(),
        None => (StatusCode::BAD_REQUEST, "no Kubernetes registry: no clusters\n").into_response(),
    }
}

async fn push_status(State(s): State<AppState>) -> Json<Value> {
    Json(json!(s.server.push_status()))
}

#[derive(serde::Deserialize)]
struct DumpQuery {
    #[serde(rename = "proxyID")]
    proxy_id: Option<String>,
}

/// The resources of `types` the proxy named by `?proxyID=` would be sent now, or the answer
/// saying why not (400 without proxyID, 404 not connected, 503 before the first push).
fn proxy_resources(s: &AppState, q: DumpQuery, types: &[&str]) -> Result<CurrentResources, (StatusCode, String)> {
    let Some(id) = q.proxy_id.filter(|s| !s.is_empty()) else {
        return Err((
            StatusCode::BAD_REQUEST,
            "proxyID is required (a connection ID, node ID, or pod.namespace)\n".to_owned(),
        ));
    };
    s.server.current_resources(&id, types).map_err(|e| {
        let status = match e {
            CurrentResourcesError::NotConnected(_) => StatusCode::NOT_FOUND,
            CurrentResourcesError::NoPush => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, format!("{e}\n"))
    })
}

/// The xDS pilot would send a connected proxy now, in the layout of Envoy's `/config_dump`.
async fn config_dump(State(s): State<AppState>, Query(q): Query<DumpQuery>) -> Response {
    const SECTIONS: [(&str, &str, &str, &str); 4] = [
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
    ];
    let current = match proxy_resources(&s, q, &SECTIONS.map(|(t, ..)| t)) {
        Ok(c) => c,
        Err(answer) => return answer.into_response(),
    };
    let version = &current.version;
    let mut sections = Vec::new();
    for (t, dump_type, list_field, item_field) in SECTIONS {
        let mut items = Vec::new();
        for r in current.of(t) {
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

/// Istio's `/debug/ndsz?proxyID=`: the name table the proxy's DNS proxy is sent, as JSON
/// (`{"table": {host: {"ips", "registry", "shortname", "namespace"}}}`).
async fn ndsz(State(s): State<AppState>, Query(q): Query<DumpQuery>) -> Response {
    use prost::Message as _;
    let current = match proxy_resources(&s, q, &[type_url::NAME_TABLE]) {
        Ok(c) => c,
        Err(answer) => return answer.into_response(),
    };
    let mut table = serde_json::Map::new();
    for r in current.of(type_url::NAME_TABLE) {
        let Ok(nt) = istio_api::nds::NameTable::decode(r.resource.value.as_slice()) else {
            return (StatusCode::INTERNAL_SERVER_ERROR, "name table does not decode\n").into_response();
        };
        for (host, info) in nt.table {
            let mut entry = json!({"ips": info.ips, "registry": info.registry});
            if !info.shortname.is_empty() {
                entry["shortname"] = json!(info.shortname);
                entry["namespace"] = json!(info.namespace);
            }
            table.insert(host, entry);
        }
    }
    Json(json!({"table": table})).into_response()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use config_sources::StoreSnapshot;
    use prometheus_client::registry::Registry;
    use tokio::sync::watch;
    use xds_server::DiscoveryServer;

    use super::*;
    use axum::body::Body;
    use environment::Environment;
    use registry::ServiceEntries;
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
            networks: watch::channel(Arc::default()).1,
            clusters: None,
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
