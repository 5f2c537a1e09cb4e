//! `DiscoveryServer`, as Istio's (`pilot/pkg/xds/discovery.go`): what pilot-discovery holds. It
//! hands out the ADS service (`grpc`), takes push requests (`ConfigUpdate`, `ProxyUpdate`) and
//! runs the push loop: the debouncer (`debounce`), then per debounced push the snapshot build and
//! the marking of every connection it concerns (Istio's `Push` and `AdsPushAll`).
//!
//! The push loop only builds the snapshot and marks every connection's pending slot; each
//! connection's own task generates (bounded by the push throttle) and sends, so a slow proxy
//! holds up nobody but itself. Everything the streams share with the server is its `state`.

mod debounce;

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::{Instant, SystemTime};

use crate::clock::rfc3339;
use crate::current::{CurrentResources, CurrentResourcesError};
use crate::grpc::AdsService;
use crate::lock::lock;
use crate::options::ServerOptions;
use crate::snapshot::{PushSnapshot, SnapshotBuilder};
use crate::state::ServerState;
use crate::status::{ConnectionStatus, PushStatus};
use crate::{Proxy, PushRequest, TriggerReason};
use debounce::{DebounceOptions, Debounced};

pub struct DiscoveryServer<B: SnapshotBuilder> {
    state: Arc<ServerState<B>>,
}

impl<B: SnapshotBuilder> DiscoveryServer<B> {
    pub fn new(
        builder: Arc<B>,
        opts: ServerOptions,
        registry: &mut prometheus_client::registry::Registry,
    ) -> Arc<DiscoveryServer<B>> {
        Arc::new(DiscoveryServer {
            state: Arc::new(ServerState::new(builder, opts, registry)),
        })
    }

    /// Builds the initial snapshot, then runs the debouncer and push loop. Call once.
    pub fn start(self: &Arc<Self>) {
        let Some(rx) = lock(&self.state.updates_rx).take() else {
            tracing::warn!("DiscoveryServer::start called twice; ignored");
            return;
        };
        let state = Arc::downgrade(&self.state);
        let opts = DebounceOptions {
            debounce_after: self.state.options().debounce_after,
            enable_eds_debounce: self.state.options().enable_eds_debounce,
        };
        tokio::spawn(async move {
            let Some(s) = state.upgrade() else { return };
            build_snapshot(&s, &PushRequest::full(TriggerReason::GlobalUpdate)).await;
            s.set_ready();
            tracing::info!("xDS server ready: initial push snapshot built");
            drop(s);
            debounce::run(rx, opts, move |req, debounced| push(state.clone(), req, debounced)).await;
        });
    }

    /// Queues a push request for the debouncer. Never blocks.
    pub fn config_update(&self, req: PushRequest) {
        if self.state.updates.send(req).is_err() {
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
        let conns = self.state.connection_list();
        let conns = conns
            .into_iter()
            .filter(|c| c.node.ip_addresses.first().is_some_and(|ip| ips.contains(ip)));
        for c in conns {
            let mut proxy = (*c.node).clone();
            self.state.builder.init_proxy(&mut proxy);
            if c.replace_proxy(proxy) {
                tracing::info!("ADS: proxy update for {}: its workload changed", c.id);
                c.enqueue(&PushRequest::full(TriggerReason::ProxyUpdate));
            }
        }
    }

    /// Whether the initial snapshot is built (connections are refused until then).
    pub fn ready(&self) -> bool {
        self.state.ready()
    }

    /// Waits until [`ready`](Self::ready).
    pub async fn wait_ready(&self) {
        self.state.wait_ready().await;
    }

    /// The ADS service for `tonic::transport::Server::add_service` (requests up to 100 MiB).
    pub fn ads_service(self: &Arc<Self>) -> AdsService<B> {
        AdsService::new(self.state.clone())
    }

    /// Every connection, sorted by connection ID (`/debug/adsz`, `/debug/syncz`).
    pub fn connections(&self) -> Vec<ConnectionStatus> {
        self.state.connection_list().iter().map(|c| c.status()).collect()
    }

    /// A connected proxy by connection ID, node ID, or Istio's `pod.namespace` proxy ID
    /// (`/debug/config_dump?proxyID=`), with its sync state.
    pub fn find_proxy(&self, id: &str) -> Option<(Arc<Proxy>, ConnectionStatus)> {
        self.state.find_proxy(id)
    }

    pub fn current_snapshot(&self) -> Option<Arc<B::Snapshot>> {
        self.state.current_snapshot()
    }

    /// The last push (`/debug/push_status`).
    pub fn push_status(&self) -> PushStatus {
        self.state.push_status()
    }

    /// The resources of `types` that the proxy `proxy_id` (connection ID, node ID or
    /// `pod.namespace`) would be sent now: the names it watches, or every resource of a type it
    /// watches by wildcard or does not watch at all.
    pub fn current_resources(&self, proxy_id: &str, types: &[&str]) -> Result<CurrentResources, CurrentResourcesError> {
        self.state.current_resources(proxy_id, types)
    }
}

/// Builds the snapshot of `req` in the blocking pool and makes it the current one (Istio's
/// `initPushContext`); on failure the previous one stays.
async fn build_snapshot<B: SnapshotBuilder>(state: &ServerState<B>, req: &PushRequest) -> Option<Arc<B::Snapshot>> {
    let builder = state.builder.clone();
    let r = req.clone();
    let t0 = Instant::now();
    let snapshot = match tokio::task::spawn_blocking(move || builder.build(&r)).await {
        Ok(s) => s,
        Err(e) => {
            tracing::error!("building the push snapshot failed: {e}; keeping the previous one");
            return None;
        }
    };
    let status = PushStatus {
        version: snapshot.version().to_owned(),
        time: rfc3339(SystemTime::now()),
        full: req.full,
        reason: req.reason.iter().map(|(r, n)| (r.as_str().to_owned(), *n)).collect(),
        configs_updated: req.configs_updated.count().unwrap_or_default(),
        build_seconds: t0.elapsed().as_secs_f64(),
        connections: 0,
        types: BTreeMap::new(),
    };
    state.publish(snapshot.clone(), status);
    Some(snapshot)
}

/// One debounced push, as Istio's `Push`: build the snapshot, then mark every connection.
async fn push<B: SnapshotBuilder>(state: Weak<ServerState<B>>, req: PushRequest, debounced: Debounced) {
    let Some(s) = state.upgrade() else { return };
    s.metrics.debounce_time.observe(debounced.delay.as_secs_f64());
    for (r, n) in &req.reason {
        s.metrics
            .push_triggers
            .get_or_create(&crate::metrics::TypeLabel {
                r#type: r.as_str().to_owned(),
            })
            .inc_by(u64::from(*n));
    }
    let Some(snapshot) = build_snapshot(&s, &req).await else {
        return;
    };
    let conns = s.connections_to_push();
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
