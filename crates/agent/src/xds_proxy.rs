//! pilot-agent's xDS proxy (Istio's `pkg/istio-agent/xds_proxy.go`): serves ADS to Envoy on a
//! Unix socket and forwards each Envoy stream, state of the world or delta, over its own upstream
//! stream to pilot-discovery. Agent-internal types (NDS for the DNS proxy, PCDS) go to registered
//! handlers instead of Envoy. Publishes Envoy's xDS state as [`XdsStatus`].

mod ack;
mod flavour;
mod metrics;
mod stream;
mod upstream;

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status, Streaming};
use xds_api::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use xds_api::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use xds_api::pbwkt::Any;

use crate::readiness::XdsStatus;
use ack::StatusPublisher;
use flavour::{Delta, Flavour, Sotw};
pub use metrics::{TerminationLabel, XdsProxyMetrics};
use upstream::Upstream;

/// The default largest message Envoy may send the agent. Istio's agent serves Envoy with
/// `istiogrpc.ServerOptions` (pilot/pkg/grpc), whose `MaxRecvMsgSize` is `ISTIO_GPRC_MAXRECVMSGSIZE`
/// (default 4 MiB, as pilot-discovery's); a larger message ends Envoy's stream with tonic's status
/// and is never forwarded.
pub const DEFAULT_MAX_RECV_MSG_SIZE: usize = 4 * 1024 * 1024;

/// Istio's default SAN and authority of istiod (`istiod.istio-system.svc`).
pub const DEFAULT_SERVER_NAME: &str = "istiod.istio-system.svc";

/// TLS to pilot-discovery (Istio's `:15012`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamTls {
    /// PEM root certificate(s) that signed pilot-discovery's serving certificate; re-read per connection.
    pub root_cert: PathBuf,
    /// SNI and the name the certificate must carry.
    pub server_name: String,
    /// A JWT sent as `authorization: Bearer <token>`; re-read per stream.
    pub token_path: Option<PathBuf>,
}

impl UpstreamTls {
    pub fn new(root_cert: impl Into<PathBuf>) -> UpstreamTls {
        UpstreamTls {
            root_cert: root_cert.into(),
            server_name: DEFAULT_SERVER_NAME.to_owned(),
            token_path: None,
        }
    }

    pub fn with_token(mut self, token_path: impl Into<PathBuf>) -> UpstreamTls {
        self.token_path = Some(token_path.into());
        self
    }
}

/// Reconnect backoff to pilot-discovery: `initial`, doubling per consecutive failure, up to `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub initial: Duration,
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            initial: Duration::from_millis(100),
            max: Duration::from_secs(5),
        }
    }
}

/// How the xDS proxy listens and where it forwards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct XdsProxyConfig {
    /// The Unix socket Envoy's `xds-grpc` cluster points at (Istio's `./etc/istio/proxy/XDS`).
    pub uds_path: PathBuf,
    /// `host:port` of pilot-discovery (Istio's `discoveryAddress`).
    pub upstream: String,
    /// TLS to pilot-discovery; plaintext when `None` (`:15010`).
    pub tls: Option<UpstreamTls>,
    /// Sent as gRPC metadata `ClusterID`.
    pub cluster_id: String,
    /// `XDS_HEADERS`: extra gRPC metadata on every upstream stream.
    pub headers: Vec<(String, String)>,
    pub backoff: Backoff,
    /// `ISTIO_GPRC_MAXRECVMSGSIZE`: the largest message Envoy may send (default
    /// [`DEFAULT_MAX_RECV_MSG_SIZE`]).
    pub max_recv_msg_size: usize,
}

impl XdsProxyConfig {
    /// Plaintext to `upstream`, cluster ID `Kubernetes` (Istio's default), no extra headers.
    pub fn new(uds_path: impl Into<PathBuf>, upstream: impl Into<String>) -> XdsProxyConfig {
        XdsProxyConfig {
            uds_path: uds_path.into(),
            upstream: upstream.into(),
            tls: None,
            cluster_id: "Kubernetes".to_owned(),
            headers: Vec::new(),
            backoff: Backoff::default(),
            max_recv_msg_size: DEFAULT_MAX_RECV_MSG_SIZE,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum XdsProxyError {
    #[error("invalid upstream address {addr:?}: {source} (hint: discoveryAddress is host:port)")]
    Upstream {
        addr: String,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("invalid XDS header {key:?} (hint: names are ASCII tokens, values visible ASCII)")]
    Header { key: String },
    #[error("listening on the xDS socket {path}: {source} (hint: is the directory writable?)")]
    Socket {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

/// Takes the one resource of an agent-internal xDS response (NDS, PCDS). `Err` is sent upstream
/// as the NACK's `error_detail`; `Ok` ACKs.
pub type ResponseHandler = dyn Fn(&Any) -> Result<(), String> + Send + Sync;

/// What the proxy streams to Envoy on one ADS stream.
type ResponseStream<F> = ReceiverStream<Result<<F as Flavour>::Response, Status>>;

/// State shared by the proxy's streams.
pub(crate) struct Shared {
    upstream: Upstream,
    handlers: RwLock<HashMap<String, Arc<ResponseHandler>>>,
    status: StatusPublisher,
    metrics: XdsProxyMetrics,
    /// The one Envoy stream being served, as Istio keeps one: a new stream stops the previous.
    active: Mutex<Option<(u64, oneshot::Sender<()>)>>,
    next_id: AtomicU64,
    /// Set when the proxy stops: streams still arriving on open connections are refused.
    closed: AtomicBool,
}

impl Shared {
    fn handler(&self, type_url: &str) -> Option<Arc<ResponseHandler>> {
        let handlers = self.handlers.read().unwrap_or_else(|e| e.into_inner());
        handlers.get(type_url).cloned()
    }

    fn register_stream(&self) -> (u64, oneshot::Receiver<()>) {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (tx, rx) = oneshot::channel();
        let previous = self.active.lock().unwrap_or_else(|e| e.into_inner()).replace((id, tx));
        if let Some((previous, stop)) = previous {
            tracing::warn!(previous, id, "registered overlapping xDS stream; closing previous");
            let _ = stop.send(());
        }
        (id, rx)
    }

    fn unregister_stream(&self, id: u64) {
        let mut active = self.active.lock().unwrap_or_else(|e| e.into_inner());
        if active.as_ref().is_some_and(|(active_id, _)| *active_id == id) {
            *active = None;
        }
    }

    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let active = self.active.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((_, stop)) = active {
            let _ = stop.send(());
        }
    }

    fn serve<F: Flavour>(
        self: &Arc<Self>,
        downstream: Streaming<F::Request>,
    ) -> Result<Response<ResponseStream<F>>, Status> {
        if self.closed.load(Ordering::SeqCst) {
            return Err(Status::unavailable("the xDS proxy is shutting down"));
        }
        // One response in flight: a slow Envoy slows the upstream reads, never the request path.
        let (tx, rx) = mpsc::channel(1);
        let (id, stop) = self.register_stream();
        tokio::spawn(stream::run::<F>(self.clone(), id, downstream, tx, stop));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The running xDS proxy. Dropping it ends Envoy's stream, stops accepting (gracefully) and
/// removes the socket.
pub struct XdsProxy {
    shared: Arc<Shared>,
    uds_path: PathBuf,
    server: JoinHandle<()>,
    shutdown: Option<oneshot::Sender<()>>,
}

impl XdsProxy {
    /// Listens on `cfg.uds_path` (creating its directory, replacing a stale socket) and serves ADS
    /// there; registers the proxy's metrics into `registry`.
    pub async fn start(cfg: XdsProxyConfig, registry: &mut Registry) -> Result<XdsProxy, XdsProxyError> {
        let upstream = Upstream::new(&cfg)?;
        let listener = bind(&cfg.uds_path).map_err(|source| XdsProxyError::Socket {
            path: cfg.uds_path.display().to_string(),
            source,
        })?;
        let shared = Arc::new(Shared {
            upstream,
            handlers: RwLock::new(HashMap::new()),
            status: StatusPublisher::new(),
            metrics: XdsProxyMetrics::register(registry),
            active: Mutex::new(None),
            next_id: AtomicU64::new(0),
            closed: AtomicBool::new(false),
        });
        // Envoy's requests are bounded as pilot-discovery bounds them; the responses it gets are
        // pilot-discovery's, as large as they come.
        let service = AggregatedDiscoveryServiceServer::new(AdsService(shared.clone()))
            .max_decoding_message_size(cfg.max_recv_msg_size)
            .max_encoding_message_size(usize::MAX);
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let server = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = shutdown_rx.await;
            });
        let path = cfg.uds_path.clone();
        let server = tokio::spawn(async move {
            if let Err(err) = server.await {
                tracing::error!(path = %path.display(), %err, "xDS proxy server failed");
            }
        });
        tracing::info!(uds = %cfg.uds_path.display(), upstream = cfg.upstream, cluster_id = cfg.cluster_id,
            tls = cfg.tls.is_some(), "xDS proxy started");
        Ok(XdsProxy {
            shared,
            uds_path: cfg.uds_path,
            server,
            shutdown: Some(shutdown_tx),
        })
    }

    /// Routes upstream responses of `type_url` to `handler` instead of Envoy. With a handler for
    /// NDS or PCDS, the agent subscribes to that type itself after Envoy's first LDS request on each
    /// stream, so register before Envoy connects.
    pub fn register_handler(
        &self,
        type_url: impl Into<String>,
        handler: impl Fn(&Any) -> Result<(), String> + Send + Sync + 'static,
    ) {
        let mut handlers = self.shared.handlers.write().unwrap_or_else(|e| e.into_inner());
        handlers.insert(type_url.into(), Arc::new(handler));
    }

    /// Envoy's xDS state as the proxy sees it (for `/healthz/ready`).
    pub fn status(&self) -> watch::Receiver<XdsStatus> {
        self.shared.status.subscribe()
    }

    pub fn metrics(&self) -> &XdsProxyMetrics {
        &self.shared.metrics
    }

    pub fn uds_path(&self) -> &Path {
        &self.uds_path
    }

    /// Ends the Envoy stream, stops accepting, and waits (up to 5s) for the server to finish.
    pub async fn shutdown(mut self) {
        self.stop();
        if tokio::time::timeout(Duration::from_secs(5), &mut self.server)
            .await
            .is_err()
        {
            self.server.abort();
        }
    }

    fn stop(&mut self) {
        self.shared.close();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        let _ = std::fs::remove_file(&self.uds_path);
    }
}

impl Drop for XdsProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Istio's `uds.NewListener`: make the directory, remove a stale socket, listen.
pub(crate) fn bind(path: &Path) -> std::io::Result<tokio::net::UnixListener> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    tokio::net::UnixListener::bind(path)
}

struct AdsService(Arc<Shared>);

#[tonic::async_trait]
impl AggregatedDiscoveryService for AdsService {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        self.0.serve::<Sotw>(request.into_inner())
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        self.0.serve::<Delta>(request.into_inner())
    }
}
