//! Istio's status server on the agent's status port (15020): `/healthz/ready` (the sidecar's
//! readiness), `/stats/prometheus` and `/metrics` (the agent's metrics merged with Envoy's), the
//! rewritten app probes under `/app-health/`, and `/quitquitquit` (shut the agent down).
//!
//! The port is open to the pod's network, unauthenticated as Istio's: a scrape streams Envoy's
//! body (at most [`stats::MAX_CONCURRENT_SCRAPES`] at once), and a connection whose caller stops
//! reading is closed after [`DEFAULT_WRITE_TIMEOUT`] (see `listener`).

mod admin;
mod app_probe;
mod grpc_probe;
mod listener;
#[cfg(test)]
mod probe_tests;
mod ready;
mod stats;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;

use std::future::Future;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{any, post};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

pub use app_probe::{
    AppProbeError, GrpcAction, HttpGetAction, HttpHeader, KUBE_APP_PROBERS_ENV, KubeAppProbers, Prober, TcpSocketAction,
};
pub use ready::NotReady;
pub use stats::{MAX_CONCURRENT_SCRAPES, ScrapeMetrics, TEXT_CONTENT_TYPE};

use crate::readiness::XdsStatus;

/// Istio's status port.
pub const DEFAULT_STATUS_PORT: u16 = 15020;
/// The readiness path, as Istio's `readyPath`.
pub const READY_PATH: &str = "/healthz/ready";
/// The shutdown path, as Istio's `quitPath`.
pub const QUIT_PATH: &str = "/quitquitquit";
/// How long a write to a caller may make no progress before its connection is closed.
pub const DEFAULT_WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// How the status server runs.
#[derive(Debug, Clone)]
pub struct StatusServerOptions {
    /// `--statusPort`; 0 lets the system pick (tests).
    pub status_port: u16,
    /// Envoy's admin port on 127.0.0.1 (`--proxyAdminPort`, 15000).
    pub admin_port: u16,
    /// Bound on each admin call behind `/healthz/ready`.
    pub admin_timeout: Duration,
    /// The probes from `ISTIO_KUBE_APP_PROBERS`.
    pub app_probers: KubeAppProbers,
    /// Where app probes go: Istio sends them to the pod IP (127.0.0.1 here by default).
    pub probe_destination: IpAddr,
    /// The source address of app probes; Istio uses 127.0.0.6 so its iptables rules pass them.
    pub probe_source: Option<IpAddr>,
    /// Counters of scrapes and failed scrapes (see [`ScrapeMetrics::register`]).
    pub scrape_metrics: ScrapeMetrics,
    /// The SDS server: not ready while Envoy waits for its workload certificate.
    pub sds: Option<crate::sds::SdsStatus>,
    /// A connection whose writes make no progress this long (its caller stopped reading) is closed.
    pub write_timeout: Duration,
}

impl Default for StatusServerOptions {
    fn default() -> Self {
        Self {
            status_port: DEFAULT_STATUS_PORT,
            admin_port: 15000,
            admin_timeout: Duration::from_secs(1),
            app_probers: KubeAppProbers::default(),
            probe_destination: IpAddr::V4(Ipv4Addr::LOCALHOST),
            probe_source: None,
            scrape_metrics: ScrapeMetrics::default(),
            sds: None,
            write_timeout: DEFAULT_WRITE_TIMEOUT,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    #[error(transparent)]
    AppProbe(#[from] AppProbeError),
    #[error("building the Envoy admin client: {0}")]
    AdminClient(#[source] reqwest::Error),
    #[error("error listening on status port {port}: {source}")]
    Bind {
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("status server failed: {0}")]
    Serve(#[source] std::io::Error),
}

/// The status server; cheap to clone into a task.
#[derive(Clone)]
pub struct StatusServer {
    port: u16,
    write_timeout: Duration,
    state: Arc<ServerState>,
}

struct ServerState {
    ready: ready::ReadinessProbe,
    admin: admin::EnvoyAdmin,
    registry: Arc<Registry>,
    scrape_metrics: ScrapeMetrics,
    /// Scrape slots: a streaming scrape holds one until its body is done.
    scrapes: Arc<Semaphore>,
    app: app_probe::AppProbers,
    shutdown: watch::Sender<bool>,
    last_probe_successful: AtomicBool,
}

impl StatusServer {
    /// `xds` is the xDS proxy's view of Envoy's config; `registry` holds the agent's metrics;
    /// `shutdown` is set to `true` by `/quitquitquit` (and, set by anyone, fails readiness).
    pub fn new(
        options: StatusServerOptions,
        xds: watch::Receiver<XdsStatus>,
        registry: Arc<Registry>,
        shutdown: watch::Sender<bool>,
    ) -> Result<Self, StatusError> {
        let admin = admin::EnvoyAdmin::new(options.admin_port).map_err(StatusError::AdminClient)?;
        let app = app_probe::AppProbers::new(options.app_probers, options.probe_destination, options.probe_source)?;
        let ready = ready::ReadinessProbe::new(admin.clone(), options.admin_timeout, xds, shutdown.subscribe())
            .with_sds(options.sds.clone());
        let state = ServerState {
            ready,
            admin,
            registry,
            scrape_metrics: options.scrape_metrics,
            scrapes: Arc::new(Semaphore::new(MAX_CONCURRENT_SCRAPES)),
            app,
            shutdown,
            last_probe_successful: AtomicBool::new(false),
        };
        Ok(Self {
            port: options.status_port,
            write_timeout: options.write_timeout,
            state: Arc::new(state),
        })
    }

    /// The routes, as Istio's mux.
    pub fn router(&self) -> Router {
        Router::new()
            .route(READY_PATH, any(handle_ready_probe))
            .route("/stats/prometheus", any(handle_stats))
            .route("/metrics", any(handle_stats))
            .route(QUIT_PATH, post(handle_quit).fallback(method_not_allowed))
            .route("/app-health/{*probe}", any(handle_app_probe))
            .with_state(self.state.clone())
    }

    /// Listens on `0.0.0.0:<statusPort>`.
    pub async fn bind(&self) -> Result<TcpListener, StatusError> {
        let port = self.port;
        tracing::info!(port, "opening status port");
        TcpListener::bind((Ipv4Addr::UNSPECIFIED, port))
            .await
            .map_err(|source| StatusError::Bind { port, source })
    }

    /// Serves on `listener` until `stop` completes, finishing requests in flight.
    pub async fn serve(
        self,
        listener: TcpListener,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), StatusError> {
        let app = self.router().into_make_service_with_connect_info::<listener::Peer>();
        let listener = listener::StallGuardListener {
            inner: listener,
            write_timeout: self.write_timeout,
        };
        axum::serve(listener, app)
            .with_graceful_shutdown(stop)
            .await
            .map_err(StatusError::Serve)?;
        tracing::info!("status server has successfully terminated");
        Ok(())
    }

    /// Istio's readiness decision, as `/healthz/ready` makes it.
    pub async fn check_ready(&self) -> Result<(), NotReady> {
        self.state.ready.check().await
    }
}

async fn handle_ready_probe(State(state): State<Arc<ServerState>>) -> Response {
    match state.ready.check().await {
        Ok(()) => {
            if !state.last_probe_successful.swap(true, Ordering::AcqRel) {
                tracing::info!("Envoy proxy is ready");
            }
            StatusCode::OK.into_response()
        }
        Err(err) => {
            state.last_probe_successful.store(false, Ordering::Release);
            tracing::warn!("Envoy proxy is NOT ready: {err}");
            (StatusCode::SERVICE_UNAVAILABLE, err.to_string()).into_response()
        }
    }
}

async fn handle_stats(State(state): State<Arc<ServerState>>, headers: HeaderMap) -> Response {
    state.scrape_metrics.scraped();
    let Ok(permit) = state.scrapes.clone().try_acquire_owned() else {
        tracing::warn!("refused a scrape: {MAX_CONCURRENT_SCRAPES} scrapes are already in progress");
        state.scrape_metrics.failed("limit");
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("too many concurrent scrapes (at most {MAX_CONCURRENT_SCRAPES})"),
        )
            .into_response();
    };
    let body = stats::merged_scrape(&state.admin, &state.registry, &state.scrape_metrics, &headers, permit).await;
    ([(CONTENT_TYPE, TEXT_CONTENT_TYPE)], body).into_response()
}

async fn handle_quit(
    State(state): State<Arc<ServerState>>,
    ConnectInfo(listener::Peer(peer)): ConnectInfo<listener::Peer>,
) -> Response {
    if !peer.ip().is_loopback() {
        return (StatusCode::FORBIDDEN, "Only requests from localhost are allowed").into_response();
    }
    tracing::info!("handling {QUIT_PATH}, notifying pilot-agent to exit");
    state.shutdown.send_replace(true);
    (StatusCode::OK, "OK").into_response()
}

async fn method_not_allowed(method: Method) -> Response {
    (StatusCode::METHOD_NOT_ALLOWED, format!("Method Not Allowed: {method}")).into_response()
}

async fn handle_app_probe(State(state): State<Arc<ServerState>>, uri: Uri, headers: HeaderMap) -> Response {
    let path = uri.path();
    match state.app.probe(path, &headers).await {
        Some(status) => status.into_response(),
        None => {
            tracing::error!(path, "prober does not exist");
            (
                StatusCode::BAD_REQUEST,
                format!("app prober config does not exists for {path}"),
            )
                .into_response()
        }
    }
}
