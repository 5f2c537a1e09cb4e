//! Istio's probe rewriting: the injector replaces each container's Kubernetes HTTP/TCP/gRPC probe
//! by an HTTP GET to `/app-health/<container>/{livez,readyz,startupz}` on the status port and
//! passes the original probes in `ISTIO_KUBE_APP_PROBERS`. The status server performs the real
//! probe against the application, from the sidecar, and answers with the result: the app's status
//! code for HTTP (a redirect counts as 200), 200/500 for TCP and gRPC.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use axum::http::header::{CONNECTION, CONTENT_LENGTH, HOST, TRANSFER_ENCODING};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde::Deserialize;
use tokio::net::TcpSocket;

use super::grpc_probe;

/// The variable carrying the app probes, as Istio's `KubeAppProberEnvName`.
pub const KUBE_APP_PROBERS_ENV: &str = "ISTIO_KUBE_APP_PROBERS";
/// Kubernetes' default `timeoutSeconds`.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);
/// Kubelet follows at most this many redirects.
const MAX_REDIRECTS: usize = 10;

/// A bad `ISTIO_KUBE_APP_PROBERS`: a startup error (the agent exits).
#[derive(Debug, thiserror::Error)]
pub enum AppProbeError {
    #[error("failed to decode app probers in {KUBE_APP_PROBERS_ENV}: {0}")]
    Decode(#[source] serde_json::Error),
    #[error("invalid app prober {path:?} in {KUBE_APP_PROBERS_ENV}: {reason}")]
    Invalid { path: String, reason: String },
    #[error("building the HTTP client for app prober {path:?}: {source}")]
    Client {
        path: String,
        #[source]
        source: reqwest::Error,
    },
}

/// One container probe as the injector writes it: a Kubernetes `Probe`'s handler and timeout.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Prober {
    #[serde(default)]
    pub http_get: Option<HttpGetAction>,
    #[serde(default)]
    pub tcp_socket: Option<TcpSocketAction>,
    #[serde(default)]
    pub grpc: Option<GrpcAction>,
    #[serde(default)]
    pub timeout_seconds: i32,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpGetAction {
    #[serde(default)]
    pub path: String,
    /// Kubernetes' IntOrString; Istio takes only a number.
    pub port: serde_json::Value,
    #[serde(default)]
    pub scheme: Option<String>,
    #[serde(default)]
    pub http_headers: Vec<HttpHeader>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct HttpHeader {
    pub name: String,
    pub value: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TcpSocketAction {
    /// Kubernetes' IntOrString; Istio takes only a number.
    pub port: serde_json::Value,
}

#[derive(Debug, Clone, Deserialize)]
pub struct GrpcAction {
    pub port: u16,
    #[serde(default)]
    pub service: Option<String>,
}

/// The validated `ISTIO_KUBE_APP_PROBERS`, keyed by status-server path.
#[derive(Debug, Clone, Default)]
pub struct KubeAppProbers(BTreeMap<String, Prober>);

impl KubeAppProbers {
    /// Parses and validates the variable's JSON (empty: no probes), with Istio's rules: paths
    /// `/app-health/<container>/{livez,readyz,startupz}`, exactly one handler, numeric ports.
    pub fn parse(json: &str) -> Result<Self, AppProbeError> {
        if json.trim().is_empty() {
            return Ok(Self::default());
        }
        let probers: BTreeMap<String, Prober> = serde_json::from_str(json).map_err(AppProbeError::Decode)?;
        for (path, prober) in &probers {
            validate(path, prober).map_err(|reason| AppProbeError::Invalid {
                path: path.clone(),
                reason,
            })?;
        }
        Ok(Self(probers))
    }

    pub fn paths(&self) -> impl Iterator<Item = &str> {
        self.0.keys().map(String::as_str)
    }
}

fn validate(path: &str, prober: &Prober) -> Result<(), String> {
    let kind = path
        .strip_prefix("/app-health/")
        .and_then(|rest| rest.split_once('/'))
        .filter(|(container, _)| !container.is_empty())
        .map(|(_, kind)| kind);
    if !matches!(kind, Some("livez" | "readyz" | "startupz")) {
        return Err("the path must be /app-health/<container>/livez, readyz or startupz".into());
    }
    let handlers = [
        prober.http_get.is_some(),
        prober.tcp_socket.is_some(),
        prober.grpc.is_some(),
    ];
    if handlers.iter().filter(|set| **set).count() != 1 {
        return Err("invalid prober type, must be one of type httpGet, tcpSocket or gRPC".into());
    }
    if let Some(http) = &prober.http_get {
        int_port(&http.port)?;
        probe_headers(&http.http_headers)?;
    }
    if let Some(tcp) = &prober.tcp_socket {
        int_port(&tcp.port)?;
    }
    Ok(())
}

fn int_port(port: &serde_json::Value) -> Result<u16, String> {
    port.as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .ok_or_else(|| format!("the port must be int type, got {port}"))
}

/// The probe's `httpHeaders` as HTTP headers; `:authority` names the Host, as in Istio.
fn probe_headers(headers: &[HttpHeader]) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    headers
        .iter()
        .map(|h| {
            let name = if h.name.eq_ignore_ascii_case(":authority") {
                HOST
            } else {
                HeaderName::from_bytes(h.name.as_bytes()).map_err(|e| format!("header {:?}: {e}", h.name))?
            };
            let value = HeaderValue::from_str(&h.value).map_err(|e| format!("header {:?}: {e}", h.name))?;
            Ok((name, value))
        })
        .collect()
}

enum Action {
    Http {
        url: String,
        headers: Vec<(HeaderName, HeaderValue)>,
        client: reqwest::Client,
    },
    Tcp {
        port: u16,
    },
    Grpc {
        port: u16,
        service: String,
    },
}

struct AppProbe {
    action: Action,
    timeout: Duration,
}

/// The app probes ready to run: where they go (Istio: the pod IP, or localhost) and from which
/// source address (Istio: 127.0.0.6, which the sidecar's iptables rules let through).
pub(crate) struct AppProbers {
    probes: HashMap<String, AppProbe>,
    destination: IpAddr,
    source: Option<IpAddr>,
}

impl AppProbers {
    pub(crate) fn new(
        probers: KubeAppProbers,
        destination: IpAddr,
        source: Option<IpAddr>,
    ) -> Result<Self, AppProbeError> {
        let mut probes = HashMap::new();
        for (path, prober) in probers.0 {
            let timeout = u64::try_from(prober.timeout_seconds)
                .ok()
                .filter(|s| *s > 0)
                .map_or(DEFAULT_TIMEOUT, Duration::from_secs);
            let invalid = |reason| AppProbeError::Invalid {
                path: path.clone(),
                reason,
            };
            let action = if let Some(http) = prober.http_get {
                if http.scheme.as_deref().is_some_and(|s| s.eq_ignore_ascii_case("https")) {
                    tracing::warn!(path, "HTTPS app probes are not supported; this probe will fail");
                }
                let port = int_port(&http.port).map_err(invalid)?;
                let headers = probe_headers(&http.http_headers).map_err(invalid)?;
                let client = http_client(source, timeout).map_err(|source| AppProbeError::Client {
                    path: path.clone(),
                    source,
                })?;
                let mut app_path = http.path;
                if !app_path.starts_with('/') {
                    app_path.insert(0, '/');
                }
                let scheme = http.scheme.unwrap_or_default().to_ascii_lowercase();
                let scheme = if scheme == "https" { "https" } else { "http" };
                let url = format!("{scheme}://{}{app_path}", SocketAddr::new(destination, port));
                Action::Http { url, headers, client }
            } else if let Some(tcp) = prober.tcp_socket {
                Action::Tcp {
                    port: int_port(&tcp.port).map_err(invalid)?,
                }
            } else if let Some(grpc) = prober.grpc {
                Action::Grpc {
                    port: grpc.port,
                    service: grpc.service.unwrap_or_default(),
                }
            } else {
                return Err(invalid("no handler".into()));
            };
            probes.insert(path, AppProbe { action, timeout });
        }
        Ok(Self {
            probes,
            destination,
            source,
        })
    }

    /// Runs the probe registered at `path`; `None` when there is none.
    pub(crate) async fn probe(&self, path: &str, incoming: &HeaderMap) -> Option<StatusCode> {
        let probe = self.probes.get(path)?;
        Some(match &probe.action {
            Action::Http { url, headers, client } => http_probe(client, url, headers, incoming, path).await,
            Action::Tcp { port } => {
                let addr = SocketAddr::new(self.destination, *port);
                match tcp_connect(addr, self.source, probe.timeout).await {
                    Ok(()) => StatusCode::OK,
                    Err(err) => {
                        tracing::debug!(path, %addr, error = %err, "tcp app probe failed");
                        StatusCode::INTERNAL_SERVER_ERROR
                    }
                }
            }
            Action::Grpc { port, service } => {
                let addr = SocketAddr::new(self.destination, *port);
                let user_agent = incoming.get("user-agent").and_then(|v| v.to_str().ok());
                match grpc_probe::check(addr, self.source, service, probe.timeout, user_agent).await {
                    Ok(true) => StatusCode::OK,
                    Ok(false) => StatusCode::INTERNAL_SERVER_ERROR,
                    Err(err) => {
                        tracing::error!(path, %addr, error = %err, "grpc app probe failed");
                        StatusCode::INTERNAL_SERVER_ERROR
                    }
                }
            }
        })
    }
}

/// Kubelet's HTTP client: no keep-alive, redirects followed on the same host only (a redirect
/// elsewhere is a success), at most ten.
fn http_client(source: Option<IpAddr>, timeout: Duration) -> Result<reqwest::Client, reqwest::Error> {
    let redirects = reqwest::redirect::Policy::custom(|attempt| {
        let first_host = attempt.previous().first().and_then(|u| u.host_str().map(str::to_owned));
        if attempt.url().host_str() != first_host.as_deref() {
            attempt.stop()
        } else if attempt.previous().len() >= MAX_REDIRECTS {
            attempt.error(format!("stopped after {MAX_REDIRECTS} redirects"))
        } else {
            attempt.follow()
        }
    });
    reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .pool_max_idle_per_host(0)
        .redirect(redirects)
        .local_address(source)
        .build()
}

async fn http_probe(
    client: &reqwest::Client,
    url: &str,
    probe_headers: &[(HeaderName, HeaderValue)],
    incoming: &HeaderMap,
    path: &str,
) -> StatusCode {
    // Forward the kubelet's headers (not the ones about this hop), then the probe's own.
    let mut headers = incoming.clone();
    for name in [HOST, CONTENT_LENGTH, TRANSFER_ENCODING, CONNECTION] {
        headers.remove(name);
    }
    for (name, _) in probe_headers {
        headers.remove(name);
    }
    for (name, value) in probe_headers {
        headers.append(name.clone(), value.clone());
    }
    match client.get(url).headers(headers).send().await {
        Ok(response) if response.status().is_redirection() => StatusCode::OK,
        Ok(response) => response.status(),
        Err(err) => {
            tracing::error!(path, url, error = %err, "request to probe app failed");
            StatusCode::INTERNAL_SERVER_ERROR
        }
    }
}

async fn tcp_connect(addr: SocketAddr, source: Option<IpAddr>, timeout: Duration) -> std::io::Result<()> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    if let Some(source) = source {
        socket.bind(SocketAddr::new(source, 0))?;
    }
    tokio::time::timeout(timeout, socket.connect(addr))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out"))??;
    Ok(())
}
