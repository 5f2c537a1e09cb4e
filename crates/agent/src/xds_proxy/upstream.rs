//! The upstream side of the xDS proxy: dialing pilot-discovery (plaintext for `:15010`-style
//! addresses, TLS with the mesh root and an optional bearer token otherwise), the gRPC metadata
//! every upstream stream carries (`ClusterID`, `XDS_HEADERS`, `authorization`), and the reconnect
//! backoff shared by all streams.

use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use xds_api::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;

use super::{Backoff, XdsProxyConfig, XdsProxyError};

/// Istio's `defaultClientMaxReceiveMessageSize` (math.MaxInt32): a full push for a large mesh is
/// far over tonic's 4 MiB default.
pub(crate) const MAX_RECEIVE_MESSAGE_SIZE: usize = i32::MAX as usize;
/// Istio's dial timeout for the upstream connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Istio's client keepalive (`pkg/keepalive`): ping every 30s, give up after 10s without an answer.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) type AdsClient = AggregatedDiscoveryServiceClient<Channel>;

/// Why one attempt to reach pilot-discovery failed. Logged and retried with backoff.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    #[error("reading the upstream root certificate {path}: {source} (hint: is the root cert mounted?)")]
    RootCert {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("reading the upstream token {path}: {source} (hint: is the service account token mounted?)")]
    Token {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the token in {path} is not a valid header value")]
    TokenValue { path: String },
    #[error("configuring TLS to {addr}: {source}")]
    Tls {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("connecting to {addr}: {source} (hint: is pilot-discovery running and reachable?)")]
    Connect {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
}

/// Dials pilot-discovery and decorates upstream requests; one per proxy, shared by its streams.
pub(crate) struct Upstream {
    addr: String,
    endpoint: Endpoint,
    tls: Option<super::UpstreamTls>,
    metadata: MetadataMap,
    backoff: Backoff,
    /// Consecutive failed attempts, across streams: a new Envoy stream while pilot-discovery is
    /// down waits as long as the last one would have.
    failures: AtomicU32,
}

impl Upstream {
    pub(crate) fn new(cfg: &XdsProxyConfig) -> Result<Upstream, XdsProxyError> {
        let scheme = if cfg.tls.is_some() { "https" } else { "http" };
        let uri = format!("{scheme}://{}", cfg.upstream);
        let endpoint = Endpoint::from_shared(uri)
            .map_err(|source| XdsProxyError::Upstream {
                addr: cfg.upstream.clone(),
                source,
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
            .keep_alive_timeout(KEEPALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let mut metadata = MetadataMap::new();
        let pairs = std::iter::once(("ClusterID", cfg.cluster_id.as_str()))
            .chain(cfg.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        for (key, value) in pairs {
            let invalid = || XdsProxyError::Header { key: key.to_owned() };
            // gRPC metadata keys are lowercase on the wire, as grpc-go sends them.
            let k = AsciiMetadataKey::from_str(&key.to_ascii_lowercase()).map_err(|_| invalid())?;
            let v = AsciiMetadataValue::try_from(value).map_err(|_| invalid())?;
            metadata.append(k, v);
        }
        Ok(Upstream {
            addr: cfg.upstream.clone(),
            endpoint,
            tls: cfg.tls.clone(),
            metadata,
            backoff: cfg.backoff,
            failures: AtomicU32::new(0),
        })
    }

    pub(crate) fn addr(&self) -> &str {
        &self.addr
    }

    /// One attempt: a new HTTP/2 connection (as Istio dials one per Envoy stream), reading the
    /// root certificate afresh so a rotated root is picked up.
    pub(crate) async fn dial(&self) -> Result<AdsClient, DialError> {
        let mut endpoint = self.endpoint.clone();
        if let Some(tls) = &self.tls {
            let pem = read(&tls.root_cert).await.map_err(|source| DialError::RootCert {
                path: tls.root_cert.display().to_string(),
                source,
            })?;
            let config = ClientTlsConfig::new()
                .ca_certificate(Certificate::from_pem(pem))
                .domain_name(tls.server_name.clone());
            endpoint = endpoint.tls_config(config).map_err(|source| DialError::Tls {
                addr: self.addr.clone(),
                source,
            })?;
        }
        let channel = endpoint.connect().await.map_err(|source| DialError::Connect {
            addr: self.addr.clone(),
            source,
        })?;
        Ok(AggregatedDiscoveryServiceClient::new(channel)
            .max_decoding_message_size(MAX_RECEIVE_MESSAGE_SIZE)
            .max_encoding_message_size(MAX_RECEIVE_MESSAGE_SIZE))
    }

    /// The metadata of an upstream stream: `ClusterID`, `XDS_HEADERS` and, with TLS and a token
    /// file, `authorization: Bearer <token>` read from the file now (tokens rotate).
    pub(crate) async fn metadata(&self) -> Result<MetadataMap, DialError> {
        let mut metadata = self.metadata.clone();
        if let Some(path) = self.tls.as_ref().and_then(|t| t.token_path.as_deref()) {
            let token = read(path).await.map_err(|source| DialError::Token {
                path: path.display().to_string(),
                source,
            })?;
            let token = String::from_utf8_lossy(&token);
            let value = AsciiMetadataValue::try_from(format!("Bearer {}", token.trim())).map_err(|_| {
                DialError::TokenValue {
                    path: path.display().to_string(),
                }
            })?;
            metadata.insert("authorization", value);
        }
        Ok(metadata)
    }

    /// Sleeps for the backoff that the consecutive failures so far call for (none after a success).
    pub(crate) async fn wait_backoff(&self) {
        let failures = self.failures.load(Ordering::Relaxed);
        if failures > 0 {
            tokio::time::sleep(self.backoff.delay(failures)).await;
        }
    }

    pub(crate) fn record_failure(&self) {
        self.failures.fetch_add(1, Ordering::Relaxed);
    }

    /// An upstream stream delivered a response: the next attempt need not wait.
    pub(crate) fn record_success(&self) {
        self.failures.store(0, Ordering::Relaxed);
    }
}

async fn read(path: &Path) -> std::io::Result<Vec<u8>> {
    tokio::fs::read(path).await
}

impl Backoff {
    /// The wait before the attempt that follows `failures` consecutive failures: `initial`,
    /// doubling, capped at `max`.
    pub fn delay(&self, failures: u32) -> Duration {
        let doublings = failures.saturating_sub(1).min(31);
        self.initial.saturating_mul(1 << doublings).min(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::xds_proxy::UpstreamTls;

    fn config() -> XdsProxyConfig {
        XdsProxyConfig {
            cluster_id: "Kubernetes".into(),
            headers: vec![("X-Team".into(), "blue".into())],
            ..XdsProxyConfig::new("/tmp/xds.sock", "127.0.0.1:15010")
        }
    }

    #[test]
    fn backoff_doubles_up_to_max() {
        let b = Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
        };
        assert_eq!(b.delay(1), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(200));
        assert_eq!(b.delay(4), Duration::from_millis(800));
        assert_eq!(b.delay(7), Duration::from_secs(5));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(5));
    }

    #[tokio::test]
    async fn requests_carry_cluster_id_and_xds_headers() {
        let upstream = Upstream::new(&config()).unwrap();
        let metadata = upstream.metadata().await.unwrap();
        assert_eq!(metadata.get("clusterid").unwrap(), "Kubernetes");
        assert_eq!(metadata.get("x-team").unwrap(), "blue");
        assert!(metadata.get("authorization").is_none());
    }

    #[tokio::test]
    async fn bearer_token_is_read_from_the_file_each_time() {
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "first\n").unwrap();
        let cfg = XdsProxyConfig {
            tls: Some(UpstreamTls::new(dir.path().join("root.pem")).with_token(&token)),
            ..config()
        };
        let upstream = Upstream::new(&cfg).unwrap();
        let m = upstream.metadata().await.unwrap();
        assert_eq!(m.get("authorization").unwrap(), "Bearer first");
        std::fs::write(&token, "second").unwrap();
        let m = upstream.metadata().await.unwrap();
        assert_eq!(m.get("authorization").unwrap(), "Bearer second");
        std::fs::remove_file(&token).unwrap();
        assert!(matches!(upstream.metadata().await, Err(DialError::Token { .. })));
    }

    #[test]
    fn invalid_header_is_rejected_at_start() {
        let cfg = XdsProxyConfig {
            headers: vec![("bad header".into(), "x".into())],
            ..config()
        };
        assert!(matches!(Upstream::new(&cfg), Err(XdsProxyError::Header { key }) if key == "bad header"));
    }

    #[tokio::test]
    async fn missing_root_cert_fails_the_attempt() {
        let cfg = XdsProxyConfig {
            tls: Some(UpstreamTls::new("/nonexistent/root-cert.pem")),
            ..config()
        };
        let upstream = Upstream::new(&cfg).unwrap();
        let err = upstream.dial().await.unwrap_err();
        assert!(matches!(err, DialError::RootCert { .. }), "{err}");
        assert!(err.to_string().contains("/nonexistent/root-cert.pem"), "{err}");
    }
}
