//! Status server behaviour over real HTTP: readiness against a fake Envoy admin (and a real
//! Envoy), the merged Prometheus scrape, and `/quitquitquit`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use test_support::backend::{HttpResponse, http_get, http_request};
use tokio::sync::watch;

use super::*;

/// What the fake Envoy admin answers.
#[derive(Clone)]
pub(super) struct AdminState {
    /// `/ready`: 200 "LIVE" when this is "LIVE", else 503 with this body.
    pub server_state: &'static str,
    pub workers_started: u8,
    /// `/stats/prometheus` body; `None` answers 500.
    pub prometheus: Option<&'static str>,
    /// Delay before every answer.
    pub delay: Duration,
}

impl Default for AdminState {
    fn default() -> Self {
        Self {
            server_state: "LIVE",
            workers_started: 1,
            prometheus: Some("# TYPE envoy_server_live gauge\nenvoy_server_live{} 1\n"),
            delay: Duration::ZERO,
        }
    }
}

type SharedAdmin = Arc<Mutex<AdminState>>;

/// An Envoy admin API stand-in on a free loopback port.
pub(super) async fn fake_admin(state: AdminState) -> (u16, SharedAdmin) {
    async fn current(shared: &SharedAdmin) -> AdminState {
        let state = shared.lock().unwrap().clone();
        tokio::time::sleep(state.delay).await;
        state
    }
    let shared = Arc::new(Mutex::new(state));
    let app = Router::new()
        .route(
            "/ready",
            get(|State(s): State<SharedAdmin>| async move {
                let state = current(&s).await;
                let code = if state.server_state == "LIVE" {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                (code, format!("{}\n", state.server_state))
            }),
        )
        .route(
            "/stats",
            get(|State(s): State<SharedAdmin>, uri: axum::http::Uri| async move {
                let state = current(&s).await;
                let query = uri.query().unwrap_or_default().to_owned();
                assert!(query.contains("workers_started"), "{query}");
                format!("listener_manager.workers_started: {}\n", state.workers_started)
            }),
        )
        .route(
            "/stats/prometheus",
            get(|State(s): State<SharedAdmin>| async move {
                match current(&s).await.prometheus {
                    Some(text) => (StatusCode::OK, text),
                    None => (StatusCode::INTERNAL_SERVER_ERROR, "boom"),
                }
            }),
        )
        .with_state(shared.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, shared)
}

/// A running status server: its base URL and the channels the lead would hold.
pub(super) struct Running {
    pub url: String,
    pub xds: watch::Sender<XdsStatus>,
    pub shutdown: watch::Receiver<bool>,
}

impl Running {
    pub(crate) async fn get(&self, path: &str) -> HttpResponse {
        http_get(&format!("{}{path}", self.url), &[]).await.unwrap()
    }
}

pub(super) async fn start(options: StatusServerOptions, registry: Registry) -> Running {
    let (xds, xds_rx) = watch::channel(XdsStatus::default());
    let (shutdown_tx, shutdown) = watch::channel(false);
    let options = StatusServerOptions {
        status_port: 0,
        ..options
    };
    let server = StatusServer::new(options, xds_rx, Arc::new(registry), shutdown_tx).unwrap();
    let listener = server.bind().await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(server.serve(listener, std::future::pending()));
    Running {
        url: format!("http://127.0.0.1:{port}"),
        xds,
        shutdown,
    }
}

fn received() -> XdsStatus {
    XdsStatus {
        cds_acked: true,
        lds_acked: true,
        last_nack: None,
        upstream_connected: true,
    }
}

#[tokio::test]
async fn ready_needs_config_and_a_live_envoy_then_stays_ready() {
    let (admin_port, admin) = fake_admin(AdminState {
        server_state: "PRE_INITIALIZING",
        ..Default::default()
    })
    .await;
    let server = start(
        StatusServerOptions {
            admin_port,
            ..Default::default()
        },
        Registry::default(),
    )
    .await;

    let response = server.get(READY_PATH).await;
    assert_eq!(response.status, 503);
    assert!(
        response
            .body
            .starts_with("config not received from XDS server (is Istiod running?): "),
        "{}",
        response.body
    );

    server.xds.send_replace(XdsStatus {
        cds_acked: true,
        ..Default::default()
    });
    let response = server.get(READY_PATH).await;
    assert_eq!(response.status, 503);
    assert!(
        response.body.starts_with("config not fully received from XDS server"),
        "{}",
        response.body
    );

    server.xds.send_replace(received());
    let response = server.get(READY_PATH).await;
    assert_eq!(
        (response.status, response.body.as_str()),
        (503, "server is not live, current state is: PRE_INITIALIZING")
    );

    admin.lock().unwrap().server_state = "LIVE";
    admin.lock().unwrap().workers_started = 0;
    let response = server.get(READY_PATH).await;
    assert_eq!(
        (response.status, response.body.as_str()),
        (503, "workers have not yet started")
    );

    admin.lock().unwrap().workers_started = 1;
    assert_eq!(server.get(READY_PATH).await.status, 200);

    // Istio caches both halves once they passed.
    admin.lock().unwrap().server_state = "PRE_INITIALIZING";
    server.xds.send_replace(XdsStatus::default());
    assert_eq!(server.get(READY_PATH).await.status, 200);
}

#[tokio::test]
async fn ready_reports_the_rejected_config() {
    let (admin_port, _admin) = fake_admin(AdminState::default()).await;
    let server = start(
        StatusServerOptions {
            admin_port,
            ..Default::default()
        },
        Registry::default(),
    )
    .await;
    server.xds.send_replace(XdsStatus {
        cds_acked: true,
        last_nack: Some("LDS: Error adding/updating listener(s) virtualInbound".into()),
        ..Default::default()
    });
    let response = server.get(READY_PATH).await;
    assert_eq!(response.status, 503);
    assert!(
        response
            .body
            .starts_with("config received from XDS server, but was rejected: "),
        "{}",
        response.body
    );
    assert!(
        response
            .body
            .ends_with("last rejected: LDS: Error adding/updating listener(s) virtualInbound")
    );
}

#[tokio::test]
async fn ready_is_bounded_when_envoy_is_down_or_slow() {
    let closed = test_support::ports::free_port();
    let server = start(
        StatusServerOptions {
            admin_port: closed,
            ..Default::default()
        },
        Registry::default(),
    )
    .await;
    server.xds.send_replace(received());
    let response = server.get(READY_PATH).await;
    assert_eq!(response.status, 503);
    assert!(
        response.body.starts_with("failed to get readiness stats: "),
        "{}",
        response.body
    );

    let (admin_port, _admin) = fake_admin(AdminState {
        delay: Duration::from_secs(5),
        ..Default::default()
    })
    .await;
    let options = StatusServerOptions {
        admin_port,
        admin_timeout: Duration::from_millis(200),
        ..Default::default()
    };
    let server = start(options, Registry::default()).await;
    server.xds.send_replace(received());
    let started = Instant::now();
    let response = server.get(READY_PATH).await;
    assert_eq!(response.status, 503);
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn ready_fails_once_the_agent_shuts_down() {
    let (admin_port, _admin) = fake_admin(AdminState::default()).await;
    let (xds, xds_rx) = watch::channel(received());
    let (shutdown, _) = watch::channel(false);
    let options = StatusServerOptions {
        admin_port,
        ..Default::default()
    };
    let server = StatusServer::new(options, xds_rx, Arc::new(Registry::default()), shutdown.clone()).unwrap();
    assert_eq!(server.check_ready().await, Ok(()));
    shutdown.send_replace(true);
    assert_eq!(server.check_ready().await, Err(NotReady::Terminated));
    drop(xds);
}

#[tokio::test]
async fn stats_merge_the_agents_metrics_with_envoys() {
    let (admin_port, admin) = fake_admin(AdminState::default()).await;
    let mut registry = Registry::default();
    let scrape_metrics = ScrapeMetrics::register(&mut registry);
    let requests = Counter::<u64>::default();
    registry.register("istio_agent_outgoing_requests", "Outgoing requests", requests.clone());
    requests.inc_by(7);
    let options = StatusServerOptions {
        admin_port,
        scrape_metrics,
        ..Default::default()
    };
    let server = start(options, registry).await;

    let response = server.get("/stats/prometheus").await;
    assert_eq!(response.status, 200);
    assert_eq!(response.header("content-type"), Some(TEXT_CONTENT_TYPE));
    let body = response.body;
    assert!(body.contains("\nistio_agent_outgoing_requests 7\n"), "{body}");
    assert!(body.contains("\nistio_agent_scrapes_total 1\n"), "{body}");
    assert!(
        body.ends_with("# TYPE envoy_server_live gauge\nenvoy_server_live{} 1\n"),
        "agent first, then Envoy: {body}"
    );
    assert!(!body.contains("# EOF"), "{body}");

    // Envoy failing still serves the agent's metrics, and counts the failure.
    admin.lock().unwrap().prometheus = None;
    let body = server.get("/metrics").await.body;
    assert!(!body.contains("envoy_server_live"), "{body}");
    assert!(body.contains("\nistio_agent_outgoing_requests 7\n"), "{body}");
    let body = server.get("/stats/prometheus").await.body;
    assert!(
        body.contains("# HELP istio_agent_scrapes_total The total number of scrapes.\n"),
        "{body}"
    );
    assert!(
        body.contains("istio_agent_scrape_failures_total{type=\"envoy\"} 2\n"),
        "{body}"
    );
    assert!(body.contains("\nistio_agent_scrapes_total 3\n"), "{body}");
}

#[tokio::test]
async fn quitquitquit_fires_the_shutdown_channel() {
    let mut server = start(StatusServerOptions::default(), Registry::default()).await;
    let response = server.get(QUIT_PATH).await;
    assert_eq!(response.status, 405);
    assert!(!*server.shutdown.borrow());

    let url = format!("{}{QUIT_PATH}", server.url);
    let response = http_request("POST", &url, &[], Vec::new(), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!((response.status, response.body.as_str()), (200, "OK"));
    tokio::time::timeout(Duration::from_secs(1), server.shutdown.wait_for(|quit| *quit))
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn serve_stops_when_told() {
    let (_xds, xds_rx) = watch::channel(XdsStatus::default());
    let (shutdown, _) = watch::channel(false);
    let options = StatusServerOptions {
        status_port: 0,
        ..Default::default()
    };
    let server = StatusServer::new(options, xds_rx, Arc::new(Registry::default()), shutdown).unwrap();
    let listener = server.bind().await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.serve(listener, async move {
        let _ = stopped.await;
    }));
    assert_eq!(
        http_get(&format!("http://127.0.0.1:{port}/healthz/ready"), &[])
            .await
            .unwrap()
            .status,
        503
    );
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(
        http_get(&format!("http://127.0.0.1:{port}/healthz/ready"), &[])
            .await
            .is_err()
    );
}

#[tokio::test]
async fn a_real_envoy_admin_behind_ready_and_stats() {
    let upstream = "127.0.0.1:9".parse().unwrap();
    let bootstrap = test_support::bootstrap::static_proxy_bootstrap(0, upstream);
    let envoy = test_support::envoy::Envoy::start(bootstrap).await.unwrap();
    envoy.wait_ready(Duration::from_secs(20)).await.unwrap();
    let admin_port = envoy.admin_addr().port();
    let server = start(
        StatusServerOptions {
            admin_port,
            ..Default::default()
        },
        Registry::default(),
    )
    .await;

    let body = server.get("/stats/prometheus").await.body;
    assert!(
        body.lines()
            .any(|l| l.starts_with("envoy_server_live") && l.ends_with(" 1")),
        "{body}"
    );
    assert!(body.contains("# TYPE envoy_cluster_manager_cds_version gauge") || body.contains("envoy_server_uptime"));

    let response = server.get(READY_PATH).await;
    assert_eq!(response.status, 503, "no xDS config yet: {}", response.body);
    server.xds.send_replace(received());
    let response = server.get(READY_PATH).await;
    assert_eq!(response.status, 200, "{}", response.body);
}
