//! Loopback HTTP/1.1 backends that echo what reached them as JSON and record every request, and a
//! small HTTP client for tests that never goes through a proxy from the environment.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use anyhow::Context as _;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// The largest request body a backend reads; larger bodies are answered 413.
const MAX_BODY: usize = 4 << 20;

/// One request as the backend saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordedRequest {
    pub method: String,
    /// The URI path, without the query.
    pub path: String,
    /// The path and query, as sent on the request line.
    pub uri: String,
    /// The `Host` header (HTTP/1.1 authority).
    pub host: String,
    /// Header names in lower case; repeated headers joined with `,`.
    pub headers: BTreeMap<String, String>,
    pub body: Vec<u8>,
}

impl RecordedRequest {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }
}

/// How a backend answers.
#[derive(Clone, Debug)]
pub struct BackendOptions {
    /// Status code of every response.
    pub status: u16,
    /// Wait this long before answering each request (for timeout tests).
    pub delay: Duration,
    /// Extra headers on every response.
    pub response_headers: Vec<(String, String)>,
    /// Listen on this port of 127.0.0.1 instead of a free one (for the demo's fixed addresses).
    pub port: Option<u16>,
    /// Listen on this loopback address instead of 127.0.0.1 (several backends on one port, as
    /// the instances of a service on several hosts).
    pub ip: Option<Ipv4Addr>,
}

impl Default for BackendOptions {
    fn default() -> Self {
        Self {
            status: 200,
            delay: Duration::ZERO,
            response_headers: Vec::new(),
            port: None,
            ip: None,
        }
    }
}

#[derive(Clone)]
struct Shared {
    name: Arc<str>,
    options: Arc<BackendOptions>,
    requests: Arc<Mutex<Vec<RecordedRequest>>>,
}

/// An HTTP/1.1 server on 127.0.0.1 (or [`BackendOptions::ip`]) that answers every request with
/// `{"backend", "method", "path", "uri", "host", "headers"}`; stopped on drop.
pub struct Backend {
    shared: Shared,
    addr: SocketAddr,
    server: JoinHandle<()>,
}

impl Backend {
    /// Starts a backend that answers 200 at once.
    pub async fn start(name: &str) -> anyhow::Result<Backend> {
        Self::start_with(name, BackendOptions::default()).await
    }

    pub async fn start_with(name: &str, options: BackendOptions) -> anyhow::Result<Backend> {
        StatusCode::from_u16(options.status).with_context(|| format!("backend {name}: bad status"))?;
        let ip = options.ip.unwrap_or(Ipv4Addr::LOCALHOST);
        let listener = tokio::net::TcpListener::bind((ip, options.port.unwrap_or(0)))
            .await
            .with_context(|| format!("backend {name}: cannot listen"))?;
        let addr = listener.local_addr()?;
        let shared = Shared {
            name: name.into(),
            options: Arc::new(options),
            requests: Arc::new(Mutex::new(Vec::new())),
        };
        let router = Router::new().fallback(echo).with_state(shared.clone());
        let server = tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, router).await {
                tracing::warn!("backend server stopped: {err}");
            }
        });
        Ok(Backend { shared, addr, server })
    }

    pub fn name(&self) -> &str {
        &self.shared.name
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Every request received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn count(&self) -> usize {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    pub fn last(&self) -> Option<RecordedRequest> {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last()
            .cloned()
    }

    /// Forgets the requests recorded so far.
    pub fn clear(&self) {
        self.shared
            .requests
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Fixed documents at fixed paths (a JWKS, an OpenID discovery document, ...) on 127.0.0.1,
/// counting the requests; stopped on drop.
pub struct DocumentServer {
    pub addr: SocketAddr,
    hits: Arc<Mutex<usize>>,
    server: JoinHandle<()>,
}

impl DocumentServer {
    pub async fn start(documents: Vec<(String, String)>) -> anyhow::Result<DocumentServer> {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let hits = Arc::new(Mutex::new(0));
        let mut router = Router::new();
        for (path, body) in documents {
            let hits = hits.clone();
            router = router.route(
                &path,
                axum::routing::get(move || async move {
                    *hits.lock().unwrap_or_else(PoisonError::into_inner) += 1;
                    ([(axum::http::header::CONTENT_TYPE, "application/json")], body)
                }),
            );
        }
        let server = tokio::spawn(async move {
            if let Err(err) = axum::serve(listener, router).await {
                tracing::warn!("document server stopped: {err}");
            }
        });
        Ok(DocumentServer { addr, hits, server })
    }

    /// Requests answered so far.
    pub fn hits(&self) -> usize {
        *self.hits.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for DocumentServer {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn header_map(headers: &HeaderMap) -> BTreeMap<String, String> {
    let mut map: BTreeMap<String, String> = BTreeMap::new();
    for (name, value) in headers {
        let value = String::from_utf8_lossy(value.as_bytes());
        map.entry(name.as_str().to_owned())
            .and_modify(|joined| {
                joined.push(',');
                joined.push_str(&value);
            })
            .or_insert_with(|| value.into_owned());
    }
    map
}

async fn echo(State(shared): State<Shared>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let Ok(body) = axum::body::to_bytes(body, MAX_BODY).await else {
        return StatusCode::PAYLOAD_TOO_LARGE.into_response();
    };
    let headers = header_map(&parts.headers);
    let host = headers
        .get("host")
        .cloned()
        .or_else(|| parts.uri.authority().map(|authority| authority.to_string()))
        .unwrap_or_default();
    let recorded = RecordedRequest {
        method: parts.method.to_string(),
        path: parts.uri.path().to_owned(),
        uri: parts
            .uri
            .path_and_query()
            .map(|pq| pq.to_string())
            .unwrap_or_else(|| "/".into()),
        host,
        headers,
        body: body.to_vec(),
    };
    let echoed = json!({
        "backend": &*shared.name,
        "method": recorded.method,
        "path": recorded.path,
        "uri": recorded.uri,
        "host": recorded.host,
        "headers": recorded.headers,
    });
    shared
        .requests
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(recorded);
    if !shared.options.delay.is_zero() {
        tokio::time::sleep(shared.options.delay).await;
    }
    let status = StatusCode::from_u16(shared.options.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, axum::Json(echoed)).into_response();
    for (name, value) in &shared.options.response_headers {
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(name.as_str()), HeaderValue::from_str(value)) {
            response.headers_mut().append(name, value);
        }
    }
    response
}

/// A response read whole by [`http_get`] or [`http_request`].
#[derive(Clone, Debug)]
pub struct HttpResponse {
    pub status: u16,
    /// Header names in lower case; repeated headers joined with `,`.
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(&name.to_ascii_lowercase()).map(String::as_str)
    }

    /// The body parsed as JSON (a [`Backend`]'s echo, for instance).
    pub fn json(&self) -> anyhow::Result<Value> {
        serde_json::from_str(&self.body)
            .with_context(|| format!("response body is not JSON (status {}): {}", self.status, self.body))
    }
}

/// The timeout of [`http_get`].
pub(crate) const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// GET `url` with extra `headers` (a `host` header overrides the URL's authority), with a 5 s
/// timeout, no connection reuse, and no proxy from the environment.
pub async fn http_get(url: &str, headers: &[(&str, &str)]) -> anyhow::Result<HttpResponse> {
    http_request("GET", url, headers, Vec::new(), HTTP_TIMEOUT).await
}

/// Sends one request on a fresh connection and reads the whole response.
pub async fn http_request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: Vec<u8>,
    timeout: Duration,
) -> anyhow::Result<HttpResponse> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .pool_max_idle_per_host(0)
        // Tests look at redirects themselves.
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
    let method = reqwest::Method::from_bytes(method.as_bytes()).with_context(|| format!("bad method {method}"))?;
    let mut request = client.request(method.clone(), url).body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.with_context(|| format!("{method} {url}"))?;
    let status = response.status().as_u16();
    let headers = header_map(response.headers());
    let body = response
        .text()
        .await
        .with_context(|| format!("{method} {url}: reading the body"))?;
    Ok(HttpResponse { status, headers, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn backend_echoes_and_records_requests() -> anyhow::Result<()> {
        let backend = Backend::start("reviews-v1").await?;
        let url = format!("http://127.0.0.1:{}/api/v1?x=1", backend.port());
        let response = http_get(&url, &[("host", "reviews.example.com"), ("x-test", "a")]).await?;
        assert_eq!(response.status, 200);
        let echo = response.json()?;
        assert_eq!(echo["backend"], "reviews-v1");
        assert_eq!(echo["method"], "GET");
        assert_eq!(echo["path"], "/api/v1");
        assert_eq!(echo["uri"], "/api/v1?x=1");
        assert_eq!(echo["host"], "reviews.example.com");
        assert_eq!(echo["headers"]["x-test"], "a");

        http_request("POST", &url, &[], b"hello".to_vec(), HTTP_TIMEOUT).await?;
        assert_eq!(backend.count(), 2);
        let last = backend.last().context("no request recorded")?;
        assert_eq!(last.method, "POST");
        assert_eq!(last.body, b"hello");
        assert_eq!(backend.requests()[0].header("X-Test"), Some("a"));
        backend.clear();
        assert_eq!(backend.count(), 0);
        Ok(())
    }

    #[tokio::test]
    async fn backend_answers_with_configured_status_and_headers() -> anyhow::Result<()> {
        let options = BackendOptions {
            status: 503,
            response_headers: vec![("x-served-by".into(), "ratings".into())],
            ..BackendOptions::default()
        };
        let backend = Backend::start_with("ratings", options).await?;
        let response = http_get(&format!("http://127.0.0.1:{}/", backend.port()), &[]).await?;
        assert_eq!(response.status, 503);
        assert_eq!(response.header("X-Served-By"), Some("ratings"));
        assert_eq!(response.json()?["backend"], "ratings");
        Ok(())
    }

    #[tokio::test]
    async fn slow_backend_makes_the_client_time_out() -> anyhow::Result<()> {
        let options = BackendOptions {
            delay: Duration::from_secs(2),
            ..BackendOptions::default()
        };
        let backend = Backend::start_with("slow", options).await?;
        let url = format!("http://127.0.0.1:{}/slow", backend.port());
        let result = http_request("GET", &url, &[], Vec::new(), Duration::from_millis(200)).await;
        assert!(result.is_err(), "expected a timeout, got {result:?}");
        assert_eq!(backend.count(), 1, "the request is recorded before the delay");
        Ok(())
    }
}
