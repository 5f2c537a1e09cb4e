//! One xDS connection's shared part: the proxy, the watches (read by the debug views), and the
//! pending push slot that the push loop merges requests into (never a queue that grows per push).
//! Also what both stream kinds share: node parsing, registration, generation off the runtime.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::Notify;
use tonic::Status;
use xds_api::envoy::config::core::v3::Node;
use xds_api::type_url;

use crate::clock::rfc3339;
use crate::lock::lock;
use crate::state::{Registration, ServerState};
use crate::status::ConnectionStatus;
use crate::watched::{Names, Version, Watch};
use crate::{GenerateError, Proxy, PushRequest, PushSnapshot, Resource, SnapshotBuilder, WatchedResource};

/// `proxy`, as the node's own `Proxy` when it equals the node (parsed node metadata is a few kB
/// per connection).
fn shared_with(node: &Arc<Proxy>, proxy: Proxy) -> Arc<Proxy> {
    if proxy == **node { node.clone() } else { Arc::new(proxy) }
}

pub(crate) struct Connection<S> {
    /// `<proxy id>-<counter>`, as Istio's `connectionID`.
    pub id: String,
    /// The proxy as its node described it, before the registries completed it.
    pub node: Arc<Proxy>,
    /// The proxy config is generated for: `node` completed by the registries (labels and
    /// locality of its workload), replaced when they change (`DiscoveryServer::proxy_update`).
    proxy: Mutex<Arc<Proxy>>,
    pub peer: String,
    /// The SPIFFE identity the caller proved that the proxy belongs to (secure port only; Istio's
    /// `VerifiedIdentity`).
    pub verified_identity: Option<String>,
    pub connected_at: SystemTime,
    pub delta: bool,
    pub watched: Mutex<HashMap<String, Watch>>,
    /// (type URL, gRPC code) of NACKs counted in the per node reject gauges.
    pub rejects: Mutex<BTreeSet<(String, i32)>>,
    /// The snapshot the proxy's config was last generated from (Istio's `PrevSidecarScope`).
    pub last_pushed: Mutex<Option<Arc<S>>>,
    pending: Mutex<Option<PushRequest>>,
    notify: Notify,
}

impl<S> Connection<S> {
    /// A connection of `node`, generated for `proxy` (the node completed by the registries). When
    /// they completed nothing, both are one `Proxy` ([`shared_with`]).
    pub fn new(id: String, node: Proxy, proxy: Proxy, peer: String, delta: bool) -> Connection<S> {
        let node = Arc::new(node);
        let proxy = shared_with(&node, proxy);
        Connection {
            id,
            node,
            proxy: Mutex::new(proxy),
            peer,
            verified_identity: None,
            connected_at: SystemTime::now(),
            delta,
            watched: Mutex::default(),
            rejects: Mutex::default(),
            last_pushed: Mutex::default(),
            pending: Mutex::default(),
            notify: Notify::new(),
        }
    }

    pub fn proxy(&self) -> Arc<Proxy> {
        lock(&self.proxy).clone()
    }

    /// Replaces the proxy; whether it differs from the one it replaces. A proxy equal to the
    /// node shares the node's ([`shared_with`]).
    pub fn replace_proxy(&self, proxy: Proxy) -> bool {
        let mut current = lock(&self.proxy);
        if **current == proxy {
            return false;
        }
        *current = shared_with(&self.node, proxy);
        true
    }

    /// Whether `req`, built into `snapshot`, may concern this proxy (Istio's `ProxyNeedsPush`,
    /// asked before the stream is woken). A connection not yet pushed from any snapshot is woken
    /// and decides once its first answer has been generated.
    pub fn concerned_by(&self, snapshot: &S, req: &PushRequest) -> bool
    where
        S: PushSnapshot,
    {
        let Some(last_pushed) = lock(&self.last_pushed).clone() else {
            return true;
        };
        snapshot.needs_push(&self.proxy(), req, Some(&last_pushed))
    }

    /// Marks a push pending, merged with any push not yet started. Never blocks on the peer.
    pub fn enqueue(&self, req: &PushRequest) {
        let mut p = lock(&self.pending);
        *p = Some(match p.take() {
            Some(prev) => prev.merge(req),
            None => req.clone(),
        });
        drop(p);
        self.notify.notify_one();
    }

    /// Waits until a push is pending and takes it.
    pub async fn next_push(&self) -> PushRequest {
        loop {
            if let Some(req) = lock(&self.pending).take() {
                return req;
            }
            self.notify.notified().await;
        }
    }

    pub fn status(&self) -> ConnectionStatus {
        let watched = lock(&self.watched);
        ConnectionStatus {
            connection_id: self.id.clone(),
            node_id: self.node.node_id.clone(),
            proxy_id: self.node.id.clone(),
            proxy_type: self.node.node_id.split('~').next().unwrap_or_default().to_owned(),
            cluster_id: self.node.metadata.cluster_id.clone().unwrap_or_default(),
            peer_address: self.peer.clone(),
            connected_at: rfc3339(self.connected_at),
            proxy_version: self.node.metadata.istio_version.clone().unwrap_or_default(),
            delta: self.delta,
            watched: watched.iter().map(|(t, w)| (t.clone(), w.into())).collect(),
        }
    }

    /// The watches a push covers: for a full push every type the changed kinds can affect (Istio's
    /// per-generator `*NeedsPush`), EDS only otherwise (and, in state of the world, only the
    /// clusters of the services whose endpoints moved); in push order.
    pub fn push_targets(&self, req: &PushRequest) -> Vec<WatchedResource> {
        let watched = lock(&self.watched);
        let mut targets: Vec<WatchedResource> = watched
            .values()
            .filter(|w| {
                let t = w.resource.type_url.as_str();
                // debug types are answered on request only
                if crate::type_filter::is_debug_type(t) {
                    return false;
                }
                if req.full {
                    crate::type_filter::type_needs_push(t, self.node.node_type, req)
                } else {
                    t == type_url::ENDPOINT
                }
            })
            .filter_map(|w| with_route_names(&watched, w.resource.clone()))
            .collect();
        drop(watched);
        if !req.full && !self.delta {
            targets = targets.into_iter().filter_map(|w| partial_eds(w, req)).collect();
        }
        targets.sort_by(|a, b| {
            (type_url::push_order(&a.type_url), &a.type_url).cmp(&(type_url::push_order(&b.type_url), &b.type_url))
        });
        targets
    }

    /// What a request is answered with: `target` as the watch rules gave it (VHDS completed with
    /// the route configurations, see [`with_route_names`]); `None` when it waits for RDS.
    pub fn request_target(&self, target: WatchedResource) -> Option<WatchedResource> {
        with_route_names(&lock(&self.watched), target)
    }

    /// The VHDS watch, completed with the route configurations, when the proxy has one: after
    /// its RDS subscription grew, the new configurations' virtual hosts follow unasked.
    pub fn vhds_follow_up(&self) -> Option<WatchedResource> {
        let watched = lock(&self.watched);
        let vhds = watched.get(type_url::VIRTUAL_HOST)?.resource.clone();
        with_route_names(&watched, vhds)
    }

    /// Delta: the EDS watch narrowed to the clusters that a CDS response added or updated and
    /// whose assignments no EDS response has carried since (`Watch::warming`, see `delta.rs`);
    /// `None` when there are none.
    pub fn warming_endpoints(&self) -> Option<WatchedResource> {
        let watched = lock(&self.watched);
        let warming = &watched.get(type_url::CLUSTER)?.warming;
        if warming.is_empty() {
            return None;
        }
        let eds = &watched.get(type_url::ENDPOINT)?.resource;
        let names: Names = warming.iter().filter(|n| eds.covers(n)).cloned().collect();
        (!names.is_empty()).then(|| WatchedResource { names, ..eds.clone() })
    }

    /// Records what was sent for `type_url`.
    pub fn record_sent(&self, type_url: &str, nonce: &str, version: &str) {
        if let Some(w) = lock(&self.watched).get_mut(type_url) {
            w.nonce_sent = nonce.to_owned();
            w.version_sent = version.to_owned();
            w.last_sent = Some(SystemTime::now());
        }
    }
}

/// Reads a stream's first request and registers its proxy, as both ADS flavours start. A node that
/// cannot be parsed is refused with `InvalidArgument` naming what is wrong (counted in
/// `pilot_xds_invalid_node`). `None` when the stream ended or was refused.
pub(crate) async fn accept<B: SnapshotBuilder, Req: crate::framing::Decode, Resp>(
    state: &Arc<ServerState<B>>,
    inbound: &mut crate::framing::Requests<Req>,
    out: &crate::outbound::OutSender<Resp>,
    peer: String,
    identities: Option<Vec<String>>,
    delta: bool,
    node: impl Fn(&Req) -> Option<&Node>,
) -> Option<(Req, Registration<B>)> {
    use futures::StreamExt;
    let first = match inbound.next().await {
        Some(Ok(req)) => req,
        Some(Err(e)) => {
            crate::stream::end_with(state, out, &peer, e).await;
            return None;
        }
        None => return None,
    };
    match authorize_node(node(&first), identities.as_deref()) {
        Ok((node, identity)) => Some((first, state.register(node, peer, identity, delta))),
        Err(status) if status.code() == tonic::Code::PermissionDenied => {
            if let Some(suppressed) = monitoring::throttle::allow("ads_unauthorized") {
                tracing::warn!(suppressed, "ADS: {peer} unauthorized XDS: {}", status.message());
            }
            state
                .metrics
                .auth_failures
                .get_or_create(&crate::metrics::ReasonLabel {
                    reason: "authorization",
                })
                .inc();
            let _ = out.send(crate::outbound::Outbound::message(Err(status))).await;
            None
        }
        Err(status) => {
            if let Some(suppressed) = monitoring::throttle::allow("ads_refused_node") {
                tracing::warn!(suppressed, "ADS: {peer} refused: {}", status.message());
            }
            state.metrics.invalid_nodes.inc();
            let _ = out.send(crate::outbound::Outbound::message(Err(status))).await;
            None
        }
    }
}

/// The proxy of a stream's first node and the identity it is served as: on the secure port
/// (`identities`, those its caller proved) one of them that the proxy belongs to, else
/// `PermissionDenied`. That identity becomes the proxy's `verified_identity` (Istio's
/// `VerifiedIdentity`, never one a node's metadata names), which the generators read (SDS serves
/// credentials only to a proxy that has one); on the plaintext port it stays `None`.
fn authorize_node(node: Option<&Node>, identities: Option<&[String]>) -> Result<(Proxy, Option<String>), Status> {
    let mut proxy = parse_node(node)?;
    match identities {
        Some(ids) => {
            let id = crate::auth::authorize(&proxy, ids)?;
            proxy.verified_identity = model::VerifiedIdentity::from_spiffe(&id);
            Ok((proxy, Some(id)))
        }
        None => Ok((proxy, None)),
    }
}

/// The longest node ID accepted (Envoy's are `type~ip~pod.namespace~domain`).
pub(crate) const MAX_NODE_ID: usize = 1024;
/// The most node metadata accepted, encoded, per stream (Envoy's and the agent's are a few KB).
pub(crate) const MAX_NODE_METADATA: usize = 256 * 1024;

/// Parses the node of the first request, refusing it with `InvalidArgument` naming what is wrong:
/// an ID with control characters (it would forge log lines) or too long, metadata over
/// [`MAX_NODE_METADATA`], or what `Proxy::parse` refuses.
pub(crate) fn parse_node(node: Option<&Node>) -> Result<Proxy, Status> {
    let Some(node) = node.filter(|n| !n.id.is_empty()) else {
        return Err(Status::invalid_argument(
            "missing node information (the first request must carry node.id)",
        ));
    };
    if node.id.len() > MAX_NODE_ID || node.id.chars().any(char::is_control) {
        return Err(Status::invalid_argument(format!(
            "node.id {:?} has control characters or is over {MAX_NODE_ID} bytes",
            node.id.chars().take(128).collect::<String>()
        )));
    }
    let metadata_size = node.metadata.as_ref().map_or(0, prost::Message::encoded_len);
    if metadata_size > MAX_NODE_METADATA {
        return Err(Status::invalid_argument(format!(
            "node {:?}: metadata of {metadata_size} bytes is over the limit of {MAX_NODE_METADATA} bytes",
            node.id
        )));
    }
    let metadata = match &node.metadata {
        Some(s) => model::proxy::NodeMetadata::from_json(&node.id, &xds_api::struct_to_json(s)),
        None => Ok(model::proxy::NodeMetadata::default()),
    };
    let mut proxy = metadata
        .and_then(|md| Proxy::parse(&node.id, md))
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    if let Some(l) = &node.locality {
        proxy.locality = model::Locality {
            region: l.region.clone(),
            zone: l.zone.clone(),
            subzone: l.sub_zone.clone(),
        };
    }
    Ok(proxy)
}

/// The resources generated for one watch.
pub(crate) struct Generated {
    pub watched: WatchedResource,
    pub resources: Result<Vec<Resource>, GenerateError>,
    /// Delta only: the version of each resource (a hash of its bytes, computed once per shared
    /// resource, shared with it), same order.
    pub versions: Vec<Version>,
    pub elapsed: Duration,
}

/// A VHDS watch covers every route configuration the proxy watches: Envoy subscribes to VHDS
/// without names (a wildcard), and the names of its RDS watch are what the virtual hosts are
/// generated for. Without an RDS watch (a reconnecting proxy or an agent replaying its requests
/// in another order) there is nothing to answer yet: answering would remove every host the
/// proxy says it has; the hosts follow the RDS answer. Other watches are returned as they are.
fn with_route_names(watched: &HashMap<String, Watch>, mut w: WatchedResource) -> Option<WatchedResource> {
    if w.type_url == type_url::VIRTUAL_HOST && w.wildcard {
        w.names = watched.get(type_url::ROUTE)?.resource.names.clone();
    }
    Some(w)
}

/// An endpoint-only push in state of the world sends only the clusters of the services whose
/// endpoints moved, as Istio's incremental EDS: EDS is not a wildcard type, so Envoy keeps the
/// load assignments a response leaves out. `None` when the proxy watches none of them.
fn partial_eds(w: WatchedResource, req: &PushRequest) -> Option<WatchedResource> {
    if req.configs_updated.is_all() {
        return Some(w);
    }
    let names: Names = req
        .configs_updated
        .services()
        .flat_map(|k| w.names.of_host(&k.hostname))
        .cloned()
        .collect();
    (!names.is_empty()).then_some(WatchedResource { names, ..w })
}

/// Generates `targets` in the blocking pool, so a large generation never stalls the runtime.
/// Resources of non-wildcard types are limited to the watched names.
pub(crate) async fn generate<S: PushSnapshot>(
    snapshot: Arc<S>,
    proxy: Arc<Proxy>,
    targets: Vec<WatchedResource>,
    delta: bool,
) -> Vec<Generated> {
    let work = move || {
        targets
            .into_iter()
            .map(|watched| {
                let t0 = Instant::now();
                let resources = snapshot.generate(&proxy, &watched, delta).map(|mut rs| {
                    if !watched.wildcard {
                        rs.retain(|r| watched.covers(&r.name));
                    }
                    rs
                });
                let versions = match (&resources, delta) {
                    (Ok(rs), true) => rs
                        .iter()
                        .map(|r| {
                            r.version();
                            r.version.clone()
                        })
                        .collect(),
                    _ => Vec::new(),
                };
                Generated {
                    watched,
                    resources,
                    versions,
                    elapsed: t0.elapsed(),
                }
            })
            .collect()
    };
    match tokio::task::spawn_blocking(work).await {
        Ok(g) => g,
        Err(e) => {
            tracing::error!("xDS generation panicked: {e}");
            Vec::new()
        }
    }
}

/// Logs why nothing was sent for a type: a type the generators do not serve (e.g. a proxy asking
/// for SDS) at debug, as it repeats on every push; a failure at warn.
pub(crate) fn log_generate_error(conn_id: &str, t: &str, e: &GenerateError) {
    match e {
        GenerateError::UnsupportedType { .. } => {
            tracing::debug!("ADS:{}: {conn_id} nothing sent: {e}", type_url::short(t))
        }
        GenerateError::Failed { .. } => tracing::warn!("ADS:{}: {conn_id} nothing sent: {e}", type_url::short(t)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_push_in_sotw_covers_only_the_clusters_of_the_moved_services() {
        let interner = crate::watched::NameInterner::default();
        let names = interner.lock().names([
            "outbound|80||a.ns.svc.cluster.local",
            "outbound|80|v1|a.ns.svc.cluster.local",
            "outbound|9090||a.ns.svc.cluster.local",
            "outbound|80||b.ns.svc.cluster.local",
            "outbound|80||ab.ns.svc.cluster.local",
        ]);
        let eds = |names: &Names| WatchedResource {
            type_url: type_url::ENDPOINT.into(),
            names: names.clone(),
            wildcard: false,
        };
        let moved = |hosts: &[&str]| PushRequest::endpoints(hosts.iter().map(|h| model::ServiceKey::new(*h, "ns")));
        let covered = |req: &PushRequest| {
            partial_eds(eds(&names), req).map(|w| w.names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        };
        assert_eq!(
            covered(&moved(&["a.ns.svc.cluster.local"])).unwrap(),
            [
                "outbound|80|v1|a.ns.svc.cluster.local",
                "outbound|80||a.ns.svc.cluster.local",
                "outbound|9090||a.ns.svc.cluster.local",
            ]
        );
        // the same host twice (two namespaces' keys) is covered once
        let twice = PushRequest::endpoints([
            model::ServiceKey::new("b.ns.svc.cluster.local", "ns"),
            model::ServiceKey::new("b.ns.svc.cluster.local", "other"),
        ]);
        assert_eq!(covered(&twice).unwrap(), ["outbound|80||b.ns.svc.cluster.local"]);
        assert_eq!(covered(&moved(&["c.ns.svc.cluster.local"])), None);
        // every service: the watch as it is
        let all = partial_eds(eds(&names), &PushRequest::all_endpoints()).unwrap();
        assert!(all.names.ptr_eq(&names));
    }

    /// A snapshot whose changes concern the proxies of one namespace only.
    struct OfNamespace(&'static str);

    impl PushSnapshot for OfNamespace {
        fn version(&self) -> &str {
            "v1"
        }
        fn generate(&self, _: &Proxy, _: &WatchedResource, _: bool) -> Result<Vec<Resource>, GenerateError> {
            Ok(Vec::new())
        }
        fn needs_push(&self, proxy: &Proxy, _: &PushRequest, _: Option<&Self>) -> bool {
            proxy.config_namespace == self.0
        }
    }

    /// A connection of the sidecar `app.a` (namespace `a`), its proxy as its node describes it.
    fn sidecar_connection() -> (Proxy, Connection<OfNamespace>) {
        let node = Node {
            id: "sidecar~10.0.0.1~app.a~a.svc.cluster.local".into(),
            ..Default::default()
        };
        let proxy = parse_node(Some(&node)).unwrap();
        let conn = Connection::new("c-1".into(), proxy.clone(), proxy.clone(), "peer".into(), false);
        (proxy, conn)
    }

    /// The secure port's proven identity becomes the proxy's `verified_identity`; the plaintext
    /// port gives none, whatever the node's metadata says.
    #[test]
    fn only_the_secure_ports_proven_identity_is_the_proxys_verified_identity() {
        let metadata = xds_api::json_to_struct(&serde_json::json!({
            "NAMESPACE": "a",
            "VERIFIED_IDENTITY": "spiffe://cluster.local/ns/a/sa/admin",
        }));
        let node = Node {
            id: "router~10.0.0.1~gw.a~a.svc.cluster.local".into(),
            metadata: Some(metadata),
            ..Default::default()
        };
        let (plaintext, id) = authorize_node(Some(&node), None).unwrap();
        assert_eq!((plaintext.verified_identity, id), (None, None));
        let proven = ["spiffe://cluster.local/ns/a/sa/gw".to_owned()];
        let (secure, id) = authorize_node(Some(&node), Some(&proven)).unwrap();
        let verified = secure.verified_identity.unwrap();
        assert_eq!(
            (verified.namespace.as_str(), verified.service_account.as_str()),
            ("a", "gw")
        );
        assert_eq!(id.as_deref(), Some("spiffe://cluster.local/ns/a/sa/gw"));
        let other = ["spiffe://cluster.local/ns/b/sa/gw".to_owned()];
        let refused = authorize_node(Some(&node), Some(&other)).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    }

    /// A proxy the registries did not complete is the node's own `Proxy`, not a copy.
    #[test]
    fn the_proxy_shares_the_node_unless_the_registries_changed_it() {
        let (proxy, conn) = sidecar_connection();
        assert!(Arc::ptr_eq(&conn.node, &conn.proxy()));
        let mut labelled = proxy.clone();
        labelled.labels.insert("app".into(), "reviews".into());
        assert!(conn.replace_proxy(labelled.clone()));
        assert!(!Arc::ptr_eq(&conn.node, &conn.proxy()));
        assert_eq!(*conn.proxy(), labelled);
        assert!(conn.replace_proxy(proxy));
        assert!(Arc::ptr_eq(&conn.node, &conn.proxy()));
    }

    /// The push loop asks the snapshot before it wakes a stream; a connection not yet pushed from
    /// any snapshot is always woken (its first answer may predate the push).
    #[test]
    fn a_push_concerns_a_connection_as_its_snapshot_says_once_it_was_pushed() {
        let (_, conn) = sidecar_connection();
        let req = PushRequest::full(model::TriggerReason::ConfigUpdate);
        assert!(conn.concerned_by(&OfNamespace("b"), &req));
        *lock(&conn.last_pushed) = Some(Arc::new(OfNamespace("a")));
        assert!(conn.concerned_by(&OfNamespace("a"), &req));
        assert!(!conn.concerned_by(&OfNamespace("b"), &req));
    }

    #[test]
    fn refuses_bad_nodes_with_invalid_argument_naming_the_node() {
        let e = parse_node(None).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let node = Node {
            id: "sidecar~not-an-ip~a.ns~ns.svc.cluster.local".into(),
            ..Default::default()
        };
        let e = parse_node(Some(&node)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("not-an-ip"), "{}", e.message());
        let md = xds_api::json_to_struct(&serde_json::json!({"LABELS": "x"}));
        let node = Node {
            id: "sidecar~1.2.3.4~a.ns~ns.svc.cluster.local".into(),
            metadata: Some(md),
            ..Default::default()
        };
        let e = parse_node(Some(&node)).unwrap_err();
        assert!(
            e.message().contains("LABELS") && e.message().contains("sidecar~1.2.3.4"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn refuses_control_characters_in_the_id_and_oversized_metadata() {
        let forged = Node {
            id: "sidecar~1.2.3.4~a.ns~ns.svc.cluster.local\nERROR forged line".into(),
            ..Default::default()
        };
        let e = parse_node(Some(&forged)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(
            e.message().contains("\\n") && !e.message().contains('\n'),
            "{}",
            e.message()
        );
        let big = xds_api::json_to_struct(&serde_json::json!({"PADDING": "x".repeat(MAX_NODE_METADATA)}));
        let heavy = Node {
            id: "sidecar~1.2.3.4~a.ns~ns.svc.cluster.local".into(),
            metadata: Some(big),
            ..Default::default()
        };
        let e = parse_node(Some(&heavy)).unwrap_err();
        assert!(
            e.message().contains("over the limit of 262144 bytes"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn parses_node_locality() {
        let node = Node {
            id: "router~1.2.3.4~gw.ns~ns.svc.cluster.local".into(),
            locality: Some(xds_api::envoy::config::core::v3::Locality {
                region: "r".into(),
                zone: "z".into(),
                sub_zone: "s".into(),
            }),
            ..Default::default()
        };
        let p = parse_node(Some(&node)).unwrap();
        assert_eq!(p.locality.zone, "z");
        assert!(p.is_router());
    }

    #[tokio::test]
    async fn pending_pushes_merge_into_one_slot() {
        let p = parse_node(Some(&node())).unwrap();
        let c = Connection::<()>::new("a-1".into(), p.clone(), p, "p".into(), false);
        c.enqueue(&PushRequest::all_endpoints());
        c.enqueue(&PushRequest::full(model::TriggerReason::ConfigUpdate));
        let req = c.next_push().await;
        assert!(req.full);
        assert_eq!(req.reason.len(), 2);
        assert!(lock(&c.pending).is_none());
    }

    fn node() -> Node {
        Node {
            id: "sidecar~1.2.3.4~a.ns~ns.svc.cluster.local".into(),
            ..Default::default()
        }
    }
}
