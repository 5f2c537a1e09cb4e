//! A small typed client of Consul's HTTP catalog API over hyper (the project's HTTP stack), as
//! much of Consul's Go client (`api.Catalog().Services`, `.Service`) as Istio 1.7 used, with the
//! bounds an answer from the network needs: a timeout per request (a blocking query's `wait`,
//! plus Consul's jitter of `wait/16`, plus [`ClientOptions::request_timeout`]) and a bound on the
//! body ([`ClientOptions::max_body_bytes`]). Every error names the URL asked.
//!
//! Why not a crate from crates.io: `rs-consul` reads instances through `/v1/health/service` (not
//! the catalog Istio read), has no bound on an answer's size, and brings a second HTTP client
//! (ureq) and TLS roots of its own; the older `consul` and `consulrs` crates are unmaintained.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty, Limited};
use hyper::{Request, StatusCode, Uri};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::catalog::{CatalogService, DecodeError, Services, decode_service, decode_services};

/// The header that carries a blocking query's index.
pub const INDEX_HEADER: &str = "x-consul-index";

/// Bounds of one request.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// How long an answer may take beyond a blocking query's wait (all of it for other requests):
    /// connecting, Consul's work, the body.
    pub request_timeout: Duration,
    /// The largest body read; a larger answer is an error.
    pub max_body_bytes: usize,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            request_timeout: Duration::from_secs(10),
            max_body_bytes: 64 << 20,
        }
    }
}

/// A blocking query's parameters: `index` 0 answers at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query {
    pub index: u64,
    pub wait: Duration,
}

/// An answer and its `X-Consul-Index` (0 when absent).
#[derive(Debug, Clone, PartialEq)]
pub struct Answer<T> {
    pub index: u64,
    pub value: T,
}

/// What went wrong with one request; each names the URL.
#[derive(Debug, thiserror::Error)]
pub enum ConsulError {
    #[error(
        "Consul {url}: cannot connect or send the request: {reason} (hint: is --consulserverURL right and Consul up?)"
    )]
    Unreachable { url: String, reason: String },
    #[error("Consul {url}: no complete answer within {after:?}")]
    Timeout { url: String, after: Duration },
    #[error("Consul {url}: HTTP {status}: {body}")]
    Status { url: String, status: u16, body: String },
    #[error("Consul {url}: the answer is larger than {limit} bytes")]
    TooLarge { url: String, limit: usize },
    #[error("Consul {url}: reading the answer: {reason}")]
    Body { url: String, reason: String },
    #[error("Consul {url}: {source}")]
    Malformed {
        url: String,
        #[source]
        source: DecodeError,
    },
    #[error("Consul {url}: X-Consul-Index {value:?} is not a number")]
    BadIndex { url: String, value: String },
}

impl ConsulError {
    /// The `type` label of `pilot_consul_errors`.
    pub fn kind(&self) -> &'static str {
        match self {
            ConsulError::Unreachable { .. } => "unreachable",
            ConsulError::Timeout { .. } => "timeout",
            ConsulError::Status { .. } => "status",
            ConsulError::TooLarge { .. } => "too_large",
            ConsulError::Body { .. } => "body",
            ConsulError::Malformed { .. } | ConsulError::BadIndex { .. } => "malformed",
        }
    }
}

/// `--consulserverURL` that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("Consul address {address:?}: {reason}")]
pub struct AddressError {
    pub address: String,
    pub reason: &'static str,
}

/// The base URL (`http://host:port`) of a Consul address written as Consul's Go client takes it:
/// `host:port` or `http://host:port`, a trailing `/` allowed.
pub fn base_url(address: &str) -> Result<String, AddressError> {
    let err = |reason| AddressError {
        address: address.to_owned(),
        reason,
    };
    let rest = address.trim();
    let rest = match rest.split_once("://") {
        None => rest,
        Some(("http", rest)) => rest,
        Some(("https" | "unix", _)) => return Err(err("only http:// is supported (no TLS, no unix socket)")),
        Some(_) => return Err(err("the scheme must be http://")),
    }
    .trim_end_matches('/');
    if rest.is_empty() || rest.contains(['/', '?', '#', '@', ' ']) {
        return Err(err("expected host:port or http://host:port"));
    }
    let base = format!("http://{rest}");
    format!("{base}/")
        .parse::<Uri>()
        .map_err(|_| err("expected host:port or http://host:port"))?;
    Ok(base)
}

/// A client of one Consul agent or server.
#[derive(Clone)]
pub struct Client {
    http: HttpClient<HttpConnector, Empty<Bytes>>,
    base: String,
    options: ClientOptions,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("base", &self.base).finish()
    }
}

impl Client {
    pub fn new(address: &str, options: ClientOptions) -> Result<Client, AddressError> {
        let base = base_url(address)?;
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(options.request_timeout));
        connector.set_nodelay(true);
        let http = HttpClient::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .build(connector);
        Ok(Client { http, base, options })
    }

    /// `http://host:port`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `/v1/catalog/services`.
    pub async fn services(&self, q: Query) -> Result<Answer<Services>, ConsulError> {
        let url = self.url("/v1/catalog/services", q);
        let (index, body) = self.get(&url, q).await?;
        let value = decode_services(&body).map_err(|source| ConsulError::Malformed { url, source })?;
        Ok(Answer { index, value })
    }

    /// `/v1/catalog/service/<name>`.
    pub async fn service(&self, name: &str, q: Query) -> Result<Answer<Vec<CatalogService>>, ConsulError> {
        let url = self.url(&format!("/v1/catalog/service/{}", escape(name)), q);
        let (index, body) = self.get(&url, q).await?;
        let value = decode_service(&body).map_err(|source| ConsulError::Malformed { url, source })?;
        Ok(Answer { index, value })
    }

    fn url(&self, path: &str, q: Query) -> String {
        if q.index == 0 {
            format!("{}{path}", self.base)
        } else {
            format!("{}{path}?index={}&wait={}", self.base, q.index, go_duration(q.wait))
        }
    }

    /// How long the whole request may take: a blocking one waits up to `wait` plus Consul's
    /// jitter (`wait/16`) before it answers.
    fn deadline(&self, q: Query) -> Duration {
        let blocking = if q.index == 0 {
            Duration::ZERO
        } else {
            q.wait + q.wait / 16
        };
        blocking + self.options.request_timeout
    }

    async fn get(&self, url: &str, q: Query) -> Result<(u64, Bytes), ConsulError> {
        let after = self.deadline(q);
        match tokio::time::timeout(after, self.fetch(url)).await {
            Ok(r) => r,
            Err(_) => Err(ConsulError::Timeout {
                url: url.to_owned(),
                after,
            }),
        }
    }

    async fn fetch(&self, url: &str) -> Result<(u64, Bytes), ConsulError> {
        let unreachable = |reason: String| ConsulError::Unreachable {
            url: url.to_owned(),
            reason,
        };
        let req = Request::get(url)
            .header("accept", "application/json")
            .body(Empty::new())
            .map_err(|e| unreachable(e.to_string()))?;
        let resp = self.http.request(req).await.map_err(|e| unreachable(chain(&e)))?;
        let status = resp.status();
        let index = match resp.headers().get(INDEX_HEADER) {
            None => 0,
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| ConsulError::BadIndex {
                    url: url.to_owned(),
                    value: String::from_utf8_lossy(v.as_bytes()).into_owned(),
                })?,
        };
        let limit = self.options.max_body_bytes;
        let declared = resp
            .headers()
            .get(hyper::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > limit as u64) {
            return Err(ConsulError::TooLarge {
                url: url.to_owned(),
                limit,
            });
        }
        let body = match Limited::new(resp.into_body(), limit).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(ConsulError::TooLarge {
                    url: url.to_owned(),
                    limit,
                });
            }
            Err(e) => {
                return Err(ConsulError::Body {
                    url: url.to_owned(),
                    reason: e.to_string(),
                });
            }
        };
        if status != StatusCode::OK {
            let text = String::from_utf8_lossy(&body);
            let text: String = text.trim().chars().take(200).collect();
            return Err(ConsulError::Status {
                url: url.to_owned(),
                status: status.as_u16(),
                body: text,
            });
        }
        Ok((index, body))
    }
}

/// A Go duration Consul parses: `300s`, `1500ms`.
fn go_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Percent-encodes a path segment (anything but RFC 3986's unreserved characters).
fn escape(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An error and its sources, `: `-separated (hyper's own message is only the outermost).
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_as_consuls_go_client_takes_them() {
        assert_eq!(base_url("127.0.0.1:8500").unwrap(), "http://127.0.0.1:8500");
        assert_eq!(
            base_url("http://consul.local:8500/").unwrap(),
            "http://consul.local:8500"
        );
        assert_eq!(base_url(" http://[::1]:8500 ").unwrap(), "http://[::1]:8500");
        for bad in [
            "",
            "https://c:8501",
            "unix:///run/consul.sock",
            "ftp://c",
            "c:8500/prefix",
            "http://",
        ] {
            let e = base_url(bad).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
        }
    }

    #[test]
    fn query_strings() {
        let c = Client::new("127.0.0.1:8500", ClientOptions::default()).unwrap();
        let q = |index, ms| Query {
            index,
            wait: Duration::from_millis(ms),
        };
        assert_eq!(
            c.url("/v1/catalog/services", q(0, 5000)),
            "http://127.0.0.1:8500/v1/catalog/services"
        );
        assert_eq!(
            c.url("/v1/catalog/services", q(42, 300_000)),
            "http://127.0.0.1:8500/v1/catalog/services?index=42&wait=300s"
        );
        assert_eq!(
            c.url("/v1/catalog/service/web", q(7, 1500)),
            "http://127.0.0.1:8500/v1/catalog/service/web?index=7&wait=1500ms"
        );
        assert_eq!(escape("web api/v1"), "web%20api%2Fv1");
        assert_eq!(c.deadline(q(0, 1600)), Duration::from_secs(10));
        assert_eq!(c.deadline(q(1, 1600)), Duration::from_millis(11_700));
    }
}
