//! What a `DiscoveryServer` shares with its streams, as the fields of Istio's `DiscoveryServer`
//! (`pilot/pkg/xds/discovery.go`) that its connections read: the connected proxies (`adsClients`,
//! `addCon`, `removeCon`), the current push snapshot (`globalPushContext`), the push throttle
//! (`concurrentPushLimit`), the nonces, the last push's status, the interned subscribed names and
//! the metrics. The streams hold this, never the server: the server above drives pushes into it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use xds_api::type_url;

use crate::connection::Connection;
use crate::lock::lock;
use crate::metrics::{Metrics, VersionLabel, code_name, type_label};
use crate::options::ServerOptions;
use crate::snapshot::SnapshotBuilder;
use crate::status::{ConnectionStatus, PushStatus};
use crate::watched::{NameInterner, Outcome};
use crate::{Proxy, PushRequest};

pub(crate) struct ServerState<B: SnapshotBuilder> {
    pub builder: Arc<B>,
    opts: ServerOptions,
    pub metrics: Metrics,
    snapshot: RwLock<Option<Arc<B::Snapshot>>>,
    ready: watch::Sender<bool>,
    /// Push requests for the debouncer (`DiscoveryServer::config_update`), and its end of them
    /// until `DiscoveryServer::start` takes it.
    pub updates: mpsc::UnboundedSender<PushRequest>,
    pub updates_rx: Mutex<Option<mpsc::UnboundedReceiver<PushRequest>>>,
    connections: Mutex<BTreeMap<String, Arc<Connection<B::Snapshot>>>>,
    throttle: Arc<Semaphore>,
    counter: AtomicU64,
    /// Distinguishes this server's nonces from another instance's.
    instance: String,
    push_status: Mutex<PushStatus>,
    /// Subscribed names and name sets, shared by every connection.
    pub names: NameInterner,
}

impl<B: SnapshotBuilder> ServerState<B> {
    pub(crate) fn new(
        builder: Arc<B>,
        opts: ServerOptions,
        registry: &mut prometheus_client::registry::Registry,
    ) -> ServerState<B> {
        let (updates, rx) = mpsc::unbounded_channel();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        ServerState {
            builder,
            throttle: Arc::new(Semaphore::new(opts.push_throttle.max(1))),
            opts,
            metrics: Metrics::new(registry),
            snapshot: RwLock::new(None),
            ready: watch::Sender::new(false),
            updates,
            updates_rx: Mutex::new(Some(rx)),
            connections: Mutex::default(),
            counter: AtomicU64::new(0),
            instance: format!("{nanos:08x}"),
            push_status: Mutex::default(),
            names: NameInterner::default(),
        }
    }

    pub(crate) fn options(&self) -> &ServerOptions {
        &self.opts
    }

    /// Whether the initial snapshot is built (connections are refused until then).
    pub(crate) fn ready(&self) -> bool {
        *self.ready.borrow()
    }

    pub(crate) fn set_ready(&self) {
        self.ready.send_replace(true);
    }

    pub(crate) async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    pub(crate) fn current_snapshot(&self) -> Option<Arc<B::Snapshot>> {
        self.snapshot.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Makes `snapshot` the current one, and `status` the last push's.
    pub(crate) fn publish(&self, snapshot: Arc<B::Snapshot>, status: PushStatus) {
        *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = Some(snapshot);
        *lock(&self.push_status) = status;
    }

    /// The last push (`/debug/push_status`).
    pub(crate) fn push_status(&self) -> PushStatus {
        lock(&self.push_status).clone()
    }

    /// Every connection, sorted by connection ID; their number becomes the last push's.
    pub(crate) fn connections_to_push(&self) -> Vec<Arc<Connection<B::Snapshot>>> {
        let conns = self.connection_list();
        lock(&self.push_status).connections = conns.len();
        conns
    }

    /// Every connection, sorted by connection ID.
    pub(crate) fn connection_list(&self) -> Vec<Arc<Connection<B::Snapshot>>> {
        lock(&self.connections).values().cloned().collect()
    }

    /// A connected proxy by connection ID, node ID, or Istio's `pod.namespace` proxy ID
    /// (`/debug/config_dump?proxyID=`), with its sync state.
    pub(crate) fn find_proxy(&self, id: &str) -> Option<(Arc<Proxy>, ConnectionStatus)> {
        let conn = lock(&self.connections)
            .values()
            .find(|c| c.id == id || c.node.node_id == id || c.node.id == id)
            .cloned()?;
        Some((conn.proxy(), conn.status()))
    }

    /// Registers a connection for the proxy its node describes, completed by the registries.
    pub(crate) fn register(
        self: &Arc<Self>,
        node: Proxy,
        peer: String,
        verified_identity: Option<String>,
        delta: bool,
    ) -> Registration<B> {
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let id = format!("{}-{n}", node.id);
        let mut proxy = node.clone();
        self.builder.init_proxy(&mut proxy);
        let mut conn = Connection::new(id.clone(), node, proxy, peer, delta);
        conn.verified_identity = verified_identity;
        let conn = Arc::new(conn);
        lock(&self.connections).insert(id, conn.clone());
        self.metrics.xds_clients.get_or_create(&version_label(&conn.node)).inc();
        tracing::info!(
            "ADS: new {}connection for node:{} from {}",
            if delta { "delta " } else { "" },
            conn.id,
            conn.peer
        );
        Registration {
            state: self.clone(),
            conn,
        }
    }

    fn unregister(&self, conn: &Connection<B::Snapshot>) {
        lock(&self.connections).remove(&conn.id);
        self.metrics.xds_clients.get_or_create(&version_label(&conn.node)).dec();
        for (t, code) in lock(&conn.rejects).iter() {
            self.metrics.forget_rejects(t, &conn.node.id, *code);
        }
    }

    pub(crate) async fn throttle(&self) -> Option<OwnedSemaphorePermit> {
        self.throttle.clone().acquire_owned().await.ok()
    }

    /// How long a push waits for a proxy to take a response before it counts as stalled and
    /// the push gives its throttle slot up: the push debounce (`PILOT_DEBOUNCE_AFTER`).
    pub(crate) fn stall_time(&self) -> Duration {
        self.opts.debounce_after
    }

    pub(crate) fn max_recv_msg_size(&self) -> usize {
        self.opts.max_recv_msg_size
    }

    pub(crate) fn debug_requires_loopback(&self) -> bool {
        self.opts.debug_endpoint_auth
    }

    pub(crate) fn system_namespace(&self) -> &str {
        &self.opts.system_namespace
    }

    pub(crate) fn max_resource_names(&self) -> usize {
        self.opts.max_resource_names
    }

    /// A request the client sent could not be read: counted, logged, and the stream ends with
    /// `status`.
    pub(crate) fn record_invalid_request(&self, peer: &str, reason: &'static str, status: &tonic::Status) {
        if let Some(suppressed) = monitoring::throttle::allow("ads_invalid_request") {
            tracing::warn!(
                suppressed,
                "ADS: {peer} sent an invalid request ({reason}): {}",
                status.message()
            );
        }
        self.metrics
            .invalid_requests
            .get_or_create(&crate::metrics::ReasonLabel { reason })
            .inc();
    }

    pub(crate) fn nonce(&self, n: u64) -> String {
        format!("{n}-{}", self.instance)
    }

    /// Logs and counts what a request meant, as Istio does in `ShouldRespond`.
    pub(crate) fn record_outcome(&self, conn: &Connection<B::Snapshot>, t: &str, outcome: &Outcome) {
        let stype = type_url::short(t);
        match outcome {
            Outcome::Nack { code, message } => {
                // The detail is the proxy's text, kept to a bound: escaped so it stays one line, and
                // rate limited (a proxy can NACK as often as it likes).
                if let Some(suppressed) = monitoring::throttle::allow("ads_nack") {
                    tracing::warn!(
                        suppressed,
                        "ADS:{stype}: ACK ERROR {} {}:{}",
                        conn.id,
                        code_name(*code),
                        message.escape_debug()
                    );
                }
                self.metrics.record_reject(t, &conn.node.id, *code);
                lock(&conn.rejects).insert((t.to_owned(), *code));
            }
            Outcome::ExpiredNonce { sent } => {
                tracing::debug!("ADS:{stype}: REQ {} Expired nonce received, sent {sent}", conn.id);
                self.metrics.expired_nonce.get_or_create(&type_label(t)).inc();
            }
            Outcome::Init => tracing::debug!("ADS:{stype}: INIT/RECONNECT {}", conn.id),
            Outcome::Ack => tracing::debug!("ADS:{stype}: ACK {}", conn.id),
            Outcome::Unsubscribe => tracing::debug!("ADS:{stype}: UNSUBSCRIBE {}", conn.id),
            Outcome::Subscription => tracing::debug!("ADS:{stype}: SUBSCRIPTION CHANGE {}", conn.id),
        }
    }

    /// Counts a response sent: metrics, and the push status when it is of the current version.
    pub(crate) fn record_sent(&self, t: &str, version: &str, resources: usize, bytes: usize, took: Duration) {
        self.metrics.record_push(t, took.as_secs_f64(), bytes);
        let mut status = lock(&self.push_status);
        if status.version == version {
            let e = status.types.entry(type_url::short(t).to_owned()).or_default();
            e.pushes += 1;
            e.resources += resources as u64;
        }
    }
}

fn version_label(proxy: &Proxy) -> VersionLabel {
    VersionLabel {
        version: proxy.metadata.istio_version.clone().unwrap_or_default(),
    }
}

/// Removes the connection from the server when its stream task ends, however it ends.
pub(crate) struct Registration<B: SnapshotBuilder> {
    pub state: Arc<ServerState<B>>,
    pub conn: Arc<Connection<B::Snapshot>>,
}

impl<B: SnapshotBuilder> Drop for Registration<B> {
    fn drop(&mut self) {
        self.state.unregister(&self.conn);
    }
}
