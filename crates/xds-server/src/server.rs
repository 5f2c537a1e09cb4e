//! `DiscoveryServer`: owns the current push snapshot, the connections, the debouncer and the push
//! loop, and serves `AggregatedDiscoveryService` (see `grpc`), as Istio's `DiscoveryServer`.
//!
//! The push loop only builds the snapshot and marks every connection's pending slot; each
//! connection's own task generates (bounded by the push throttle) and sends, so a slow proxy
//! holds up nobody but itself.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use xds_api::type_url;

use crate::clock::rfc3339;
use crate::connection::{Connection, Registration};
use crate::debounce::{self, DebounceOptions, Debounced};
use crate::lock::lock;
use crate::metrics::{Metrics, VersionLabel, code_name, type_label};
use crate::options::ServerOptions;
use crate::status::{ConnectionStatus, PushStatus};
use crate::watched::{NameInterner, Outcome};
use crate::{Proxy, PushRequest, PushSnapshot, SnapshotBuilder, TriggerReason};

/// The stream ended (the proxy went away); nothing more to send.
#[derive(Debug)]
pub(crate) struct Closed;

pub struct DiscoveryServer<B: SnapshotBuilder> {
    builder: Arc<B>,
    opts: ServerOptions,
    pub(crate) metrics: Metrics,
    snapshot: RwLock<Option<Arc<B::Snapshot>>>,
    ready: watch::Sender<bool>,
    updates: mpsc::UnboundedSender<PushRequest>,
    updates_rx: Mutex<Option<mpsc::UnboundedReceiver<PushRequest>>>,
    connections: Mutex<BTreeMap<String, Arc<Connection<B::Snapshot>>>>,
    throttle: Arc<Semaphore>,
    counter: AtomicU64,
    /// Distinguishes this server's nonces from another instance's.
    instance: String,
    push_status: Mutex<PushStatus>,
    /// Subscribed names and name sets, shared by every connection.
    pub(crate) names: NameInterner,
}

impl<B: SnapshotBuilder> DiscoveryServer<B> {
    pub fn new(
        builder: Arc<B>,
        opts: ServerOptions,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Arc<DiscoveryServer<B>> {
        let (updates, rx) = mpsc::unbounded_channel();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        Arc::new(DiscoveryServer {
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
        })
    }

    /// Builds the initial snapshot, then runs the debouncer and push loop. Call once.
    pub fn start(self: &Arc<Self>) {
        let Some(rx) = lock(&self.updates_rx).take() else {
            tracing::warn!("DiscoveryServer::start called twice; ignored");
            return;
        };
        let server = Arc::downgrade(self);
        let opts = DebounceOptions {
            debounce_after: self.opts.debounce_after,
            enable_eds_debounce: self.opts.enable_eds_debounce,
        };
        tokio::spawn(async move {
            let Some(s) = server.upgrade() else { return };
            s.build_snapshot(&PushRequest::full(TriggerReason::GlobalUpdate)).await;
            s.ready.send_replace(true);
            tracing::info!("xDS server ready: initial push snapshot built");
            drop(s);
            debounce::run(rx, opts, move |req, debounced| push(server.clone(), req, debounced)).await;
        });
    }

    /// Queues a push request for the debouncer. Never blocks.
    pub fn config_update(&self, req: PushRequest) {
        if self.updates.send(req).is_err() {
            tracing::warn!("push request dropped: the push loop has stopped");
        }
    }

    /// Istio's `ProxyUpdate`: what the registries know of the workloads at `ips` changed (a Pod
    /// appeared, or its labels changed). Their proxies are completed again from the registries
    /// and, when that changed them (labels select other Sidecars, DestinationRule subsets, ...),
    /// pushed in full at once, without waiting for the debounce.
    pub fn proxy_update(&self, ips: &std::collections::BTreeSet<String>) {
        let ips: Vec<std::net::IpAddr> = ips.iter().filter_map(|ip| ip.parse().ok()).collect();
        if ips.is_empty() {
            return;
        }
        let conns: Vec<Arc<Connection<B::Snapshot>>> = lock(&self.connections)
            .values()
            .filter(|c| c.node.ip_addresses.first().is_some_and(|ip| ips.contains(ip)))
            .cloned()
            .collect();
        for c in conns {
            let mut proxy = (*c.node).clone();
            self.builder.init_proxy(&mut proxy);
            if c.replace_proxy(proxy) {
                tracing::info!("ADS: proxy update for {}: its workload changed", c.id);
                c.enqueue(&PushRequest::full(TriggerReason::ProxyUpdate));
            }
        }
    }

    /// Whether the initial snapshot is built (connections are refused until then).
    pub fn ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Waits until [`ready`](Self::ready).
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// The ADS service for `tonic::transport::Server::add_service` (requests up to 100 MiB).
    pub fn ads_service(self: &Arc<Self>) -> crate::grpc::AdsService<B> {
        crate::grpc::AdsService::new(self.clone())
    }

    /// Every connection, sorted by connection ID (`/debug/adsz`, `/debug/syncz`).
    pub fn connections(&self) -> Vec<ConnectionStatus> {
        let conns: Vec<Arc<Connection<B::Snapshot>>> = lock(&self.connections).values().cloned().collect();
        conns.iter().map(|c| c.status()).collect()
    }

    /// A connected proxy by connection ID, node ID, or Istio's `pod.namespace` proxy ID
    /// (`/debug/config_dump?proxyID=`), with its sync state.
    pub fn find_proxy(&self, id: &str) -> Option<(Arc<Proxy>, ConnectionStatus)> {
        let conn = lock(&self.connections)
            .values()
            .find(|c| c.id == id || c.node.node_id == id || c.node.id == id)
            .cloned()?;
        Some((conn.proxy(), conn.status()))
    }

    pub fn current_snapshot(&self) -> Option<Arc<B::Snapshot>> {
        self.snapshot.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The last push (`/debug/push_status`).
    pub fn push_status(&self) -> PushStatus {
        lock(&self.push_status).clone()
    }

    async fn build_snapshot(&self, req: &PushRequest) -> Option<Arc<B::Snapshot>> {
        let builder = self.builder.clone();
        let r = req.clone();
        let t0 = Instant::now();
        let snapshot = match tokio::task::spawn_blocking(move || builder.build(&r)).await {
            Ok(s) => s,
            Err(e) => {
                tracing::error!("building the push snapshot failed: {e}; keeping the previous one");
                return None;
            }
        };
        *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = Some(snapshot.clone());
        *lock(&self.push_status) = PushStatus {
            version: snapshot.version().to_owned(),
            time: rfc3339(SystemTime::now()),
            full: req.full,
            reason: req.reason.iter().map(|(r, n)| (r.as_str().to_owned(), *n)).collect(),
            configs_updated: req.configs_updated.count().unwrap_or_default(),
            build_seconds: t0.elapsed().as_secs_f64(),
            connections: 0,
            types: BTreeMap::new(),
        };
        Some(snapshot)
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
            server: self.clone(),
            conn,
        }
    }

    pub(crate) fn unregister(&self, conn: &Connection<B::Snapshot>) {
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

    /// Every connection, sorted by connection ID.
    pub(crate) fn connection_list(&self) -> Vec<Arc<Connection<B::Snapshot>>> {
        lock(&self.connections).values().cloned().collect()
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

/// One debounced push, as Istio's `Push`: build the snapshot, then mark every connection.
async fn push<B: SnapshotBuilder>(server: Weak<DiscoveryServer<B>>, req: PushRequest, debounced: Debounced) {
    let Some(s) = server.upgrade() else { return };
    s.metrics.debounce_time.observe(debounced.delay.as_secs_f64());
    for (r, n) in &req.reason {
        s.metrics
            .push_triggers
            .get_or_create(&crate::metrics::TypeLabel {
                r#type: r.as_str().to_owned(),
            })
            .inc_by(u64::from(*n));
    }
    let Some(snapshot) = s.build_snapshot(&req).await else {
        return;
    };
    let conns: Vec<Arc<Connection<B::Snapshot>>> = lock(&s.connections).values().cloned().collect();
    lock(&s.push_status).connections = conns.len();
    tracing::info!(
        "Push debounce stable[{}] {}: {:?} since last change, full={}, {} connections",
        debounced.events,
        req.reason_string(),
        debounced.delay,
        req.full,
        conns.len()
    );
    let t0 = Instant::now();
    let mut woken = 0;
    for c in conns {
        if c.concerned_by(&snapshot, &req) {
            c.enqueue(&req);
            woken += 1;
        } else {
            tracing::debug!("Skipping push to {}, no updates required", c.id);
        }
    }
    tracing::debug!("push dispatched to {woken} connections in {:?}", t0.elapsed());
}
