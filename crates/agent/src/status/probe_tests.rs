//! App probes through the status server: HTTP against a real loopback app (path, headers,
//! status, redirects, timeout), TCP, gRPC health, unknown paths, and bad `ISTIO_KUBE_APP_PROBERS`.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use prometheus_client::registry::Registry;
use serde_json::json;
use test_support::backend::{Backend, BackendOptions, http_get};
use tonic::codegen::{BoxFuture, Service, http};

use super::grpc_probe::{HealthCheckRequest, HealthCheckResponse, SERVING};
use super::tests::{Running, start};
use super::*;

async fn with_probers(probers: serde_json::Value) -> Running {
    let app_probers = KubeAppProbers::parse(&probers.to_string()).unwrap();
    start(
        StatusServerOptions {
            app_probers,
            ..Default::default()
        },
        Registry::default(),
    )
    .await
}

#[tokio::test]
async fn http_probe_reaches_the_app_with_its_path_and_headers() {
    let app = Backend::start("app").await.unwrap();
    let failing = Backend::start_with(
        "failing",
        BackendOptions {
            status: 503,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let server = with_probers(json!({
        "/app-health/app/livez": {"httpGet": {"path": "healthz?full=1", "port": app.port(), "scheme": "HTTP",
            "httpHeaders": [{"name": "X-Probe", "value": "from-istio"}, {"name": "Host", "value": "app.local"}]}},
        "/app-health/app/readyz": {"httpGet": {"path": "/ready", "port": failing.port()}, "timeoutSeconds": 2},
    }))
    .await;

    let url = format!("{}/app-health/app/livez", server.url);
    let response = http_get(&url, &[("user-agent", "kube-probe/1.31"), ("x-probe", "kubelet")])
        .await
        .unwrap();
    assert_eq!(response.status, 200);
    assert_eq!(response.body, "", "only the status code is returned");
    let seen = app.last().unwrap();
    assert_eq!((seen.method.as_str(), seen.uri.as_str()), ("GET", "/healthz?full=1"));
    assert_eq!(seen.host, "app.local");
    assert_eq!(
        seen.header("x-probe"),
        Some("from-istio"),
        "the probe's header overrides the kubelet's"
    );
    assert_eq!(
        seen.header("user-agent"),
        Some("kube-probe/1.31"),
        "the kubelet's headers are forwarded"
    );

    assert_eq!(
        server.get("/app-health/app/readyz").await.status,
        503,
        "the app's status is returned"
    );
    assert_eq!(failing.last().unwrap().path, "/ready");
}

#[tokio::test]
async fn http_probe_redirects_and_timeouts() {
    let options = BackendOptions {
        status: 302,
        response_headers: vec![("location".into(), "http://elsewhere.invalid/login".into())],
        ..Default::default()
    };
    let redirecting = Backend::start_with("redirect", options).await.unwrap();
    let slow_options = BackendOptions {
        delay: Duration::from_secs(4),
        ..Default::default()
    };
    let slow = Backend::start_with("slow", slow_options).await.unwrap();
    let server = with_probers(json!({
        "/app-health/web/livez": {"httpGet": {"path": "/", "port": redirecting.port()}},
        "/app-health/slow/readyz": {"httpGet": {"path": "/", "port": slow.port()}, "timeoutSeconds": 1},
    }))
    .await;

    assert_eq!(
        server.get("/app-health/web/livez").await.status,
        200,
        "a redirect elsewhere is a success"
    );
    assert_eq!(redirecting.count(), 1);

    let started = Instant::now();
    assert_eq!(server.get("/app-health/slow/readyz").await.status, 500);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(3),
        "took {took:?}"
    );
}

#[tokio::test]
async fn tcp_probe_is_200_when_the_port_accepts() {
    let open = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed = test_support::ports::free_port();
    let server = with_probers(json!({
        "/app-health/db/livez": {"tcpSocket": {"port": open.local_addr().unwrap().port()}},
        "/app-health/db/readyz": {"tcpSocket": {"port": closed}},
    }))
    .await;
    assert_eq!(server.get("/app-health/db/livez").await.status, 200);
    assert_eq!(server.get("/app-health/db/readyz").await.status, 500);
}

#[tokio::test]
async fn unknown_probe_path_is_a_bad_request() {
    let server = with_probers(json!({"/app-health/db/livez": {"tcpSocket": {"port": 1}}})).await;
    let response = server.get("/app-health/other/livez").await;
    assert_eq!(response.status, 400);
    assert_eq!(
        response.body,
        "app prober config does not exists for /app-health/other/livez"
    );
}

/// A `grpc.health.v1.Health` server answering `status` and recording the services asked about.
#[derive(Clone)]
struct Health {
    status: i32,
    asked: Arc<Mutex<Vec<String>>>,
}

impl tonic::server::NamedService for Health {
    const NAME: &'static str = "grpc.health.v1.Health";
}

impl Service<http::Request<tonic::body::Body>> for Health {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let health = self.clone();
        Box::pin(async move {
            let codec = tonic_prost::ProstCodec::<HealthCheckResponse, HealthCheckRequest>::default();
            Ok(tonic::server::Grpc::new(codec).unary(health, request).await)
        })
    }
}

impl tonic::server::UnaryService<HealthCheckRequest> for Health {
    type Response = HealthCheckResponse;
    type Future = BoxFuture<tonic::Response<HealthCheckResponse>, tonic::Status>;

    fn call(&mut self, request: tonic::Request<HealthCheckRequest>) -> Self::Future {
        self.asked.lock().unwrap().push(request.into_inner().service);
        let status = self.status;
        Box::pin(async move { Ok(tonic::Response::new(HealthCheckResponse { status })) })
    }
}

async fn health_server(status: i32) -> (u16, Arc<Mutex<Vec<String>>>) {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let service = Health {
        status,
        asked: asked.clone(),
    };
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    (port, asked)
}

#[tokio::test]
async fn grpc_probe_asks_the_health_service() {
    let (serving, asked) = health_server(SERVING).await;
    let (not_serving, _) = health_server(2).await;
    let nothing = test_support::ports::free_port();
    let server = with_probers(json!({
        "/app-health/api/livez": {"grpc": {"port": serving, "service": "api.v1"}},
        "/app-health/api/readyz": {"grpc": {"port": not_serving}},
        "/app-health/api/startupz": {"grpc": {"port": nothing}},
    }))
    .await;
    assert_eq!(server.get("/app-health/api/livez").await.status, 200);
    assert_eq!(*asked.lock().unwrap(), ["api.v1"]);
    assert_eq!(server.get("/app-health/api/readyz").await.status, 500);
    assert_eq!(server.get("/app-health/api/startupz").await.status, 500);
}

#[test]
fn malformed_probers_are_startup_errors_naming_the_variable() {
    let cases = [
        ("{not json", "failed to decode app probers in ISTIO_KUBE_APP_PROBERS"),
        (
            r#"{"/healthz/app": {"tcpSocket": {"port": 1}}}"#,
            "must be /app-health/<container>/livez",
        ),
        (
            r#"{"/app-health/app/livez": {}}"#,
            "must be one of type httpGet, tcpSocket or gRPC",
        ),
        (
            r#"{"/app-health/app/livez": {"tcpSocket": {"port": 1}, "httpGet": {"port": 1}}}"#,
            "must be one of type httpGet, tcpSocket or gRPC",
        ),
        (
            r#"{"/app-health/app/livez": {"httpGet": {"port": "http"}}}"#,
            "the port must be int type",
        ),
        (
            r#"{"/app-health/app/livez": {"tcpSocket": {"port": 70000}}}"#,
            "the port must be int type",
        ),
        (
            r#"{"/app-health/app/livez": {"httpGet": {"port": 1, "httpHeaders": [{"name": "a b", "value": "x"}]}}}"#,
            "header \"a b\"",
        ),
    ];
    for (json, reason) in cases {
        let err = KubeAppProbers::parse(json).unwrap_err().to_string();
        assert!(err.contains(KUBE_APP_PROBERS_ENV), "{json}: {err}");
        assert!(err.contains(reason), "{json}: {err}");
    }
}

#[test]
fn istio_injector_output_parses() {
    let json = r#"{"/app-health/httpbin/livez":{"httpGet":{"path":"/hello","port":8080,"scheme":"HTTP"},"timeoutSeconds":3},
        "/app-health/httpbin/readyz":{"tcpSocket":{"port":9000}},"/app-health/grpc/startupz":{"grpc":{"port":9090,"service":null}}}"#;
    let probers = KubeAppProbers::parse(json).unwrap();
    let paths: Vec<&str> = probers.paths().collect();
    assert_eq!(
        paths,
        [
            "/app-health/grpc/startupz",
            "/app-health/httpbin/livez",
            "/app-health/httpbin/readyz"
        ]
    );
    assert!(KubeAppProbers::parse("").unwrap().paths().next().is_none());
}
