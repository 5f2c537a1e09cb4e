//! One xDS connection's state, shared by its stream task, the push loop and the debug views, as
//! Istio's `Connection` (`pilot/pkg/xds/ads.go`, `pkg/xds/server.go`): the proxy, the watches,
//! and the pending push slot that the push loop merges requests into (never a queue that grows
//! per push: Istio's `PushQueue` merges a connection's pending requests the same way). What a
//! push covers of the watches is read here too (Istio's `watchedResourcesByOrder` and the
//! per-type `*NeedsPush`).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use tokio::sync::Notify;
use xds_api::type_url;

use crate::clock::rfc3339;
use crate::lock::lock;
use crate::snapshot::PushSnapshot;
use crate::status::ConnectionStatus;
use crate::type_filter::{is_debug_type, type_needs_push};
use crate::watched::{Names, Watch, WatchedResource};
use crate::{Proxy, PushRequest};

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
    pub(crate) fn new(id: String, node: Proxy, proxy: Proxy, peer: String, delta: bool) -> Connection<S> {
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

    pub(crate) fn proxy(&self) -> Arc<Proxy> {
        lock(&self.proxy).clone()
    }

    /// Replaces the proxy; whether it differs from the one it replaces. A proxy equal to the
    /// node shares the node's ([`shared_with`]).
    pub(crate) fn replace_proxy(&self, proxy: Proxy) -> bool {
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
    pub(crate) fn concerned_by(&self, snapshot: &S, req: &PushRequest) -> bool
    where
        S: PushSnapshot,
    {
        let Some(last_pushed) = lock(&self.last_pushed).clone() else {
            return true;
        };
        snapshot.needs_push(&self.proxy(), req, Some(&last_pushed))
    }

    /// Marks a push pending, merged with any push not yet started. Never blocks on the peer.
    pub(crate) fn enqueue(&self, req: &PushRequest) {
        let mut p = lock(&self.pending);
        *p = Some(match p.take() {
            Some(prev) => prev.merge(req),
            None => req.clone(),
        });
        drop(p);
        self.notify.notify_one();
    }

    /// Waits until a push is pending and takes it.
    pub(crate) async fn next_push(&self) -> PushRequest {
        loop {
            if let Some(req) = lock(&self.pending).take() {
                return req;
            }
            self.notify.notified().await;
        }
    }

    pub(crate) fn status(&self) -> ConnectionStatus {
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
    pub(crate) fn push_targets(&self, req: &PushRequest) -> Vec<WatchedResource> {
        let watched = lock(&self.watched);
        let mut targets: Vec<WatchedResource> = watched
            .values()
            .filter(|w| {
                let t = w.resource.type_url.as_str();
                // debug types are answered on request only
                if is_debug_type(t) {
                    return false;
                }
                if req.full {
                    type_needs_push(t, self.node.node_type, req)
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
    pub(crate) fn request_target(&self, target: WatchedResource) -> Option<WatchedResource> {
        with_route_names(&lock(&self.watched), target)
    }

    /// The VHDS watch, completed with the route configurations, when the proxy has one: after
    /// its RDS subscription grew, the new configurations' virtual hosts follow unasked.
    pub(crate) fn vhds_follow_up(&self) -> Option<WatchedResource> {
        let watched = lock(&self.watched);
        let vhds = watched.get(type_url::VIRTUAL_HOST)?.resource.clone();
        with_route_names(&watched, vhds)
    }

    /// Delta: the EDS watch narrowed to the clusters that a CDS response added or updated and
    /// whose assignments no EDS response has carried since (`Watch::warming`, see `delta.rs`);
    /// `None` when there are none.
    pub(crate) fn warming_endpoints(&self) -> Option<WatchedResource> {
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
    pub(crate) fn record_sent(&self, type_url: &str, nonce: &str, version: &str) {
        if let Some(w) = lock(&self.watched).get_mut(type_url) {
            w.nonce_sent = nonce.to_owned();
            w.version_sent = version.to_owned();
            w.last_sent = Some(SystemTime::now());
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GenerateError, Resource};

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
        let proxy = proxy_of("sidecar~10.0.0.1~app.a~a.svc.cluster.local");
        let conn = Connection::new("c-1".into(), proxy.clone(), proxy.clone(), "peer".into(), false);
        (proxy, conn)
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

    #[tokio::test]
    async fn pending_pushes_merge_into_one_slot() {
        let p = proxy_of("sidecar~1.2.3.4~a.ns~ns.svc.cluster.local");
        let c = Connection::<()>::new("a-1".into(), p.clone(), p, "p".into(), false);
        c.enqueue(&PushRequest::all_endpoints());
        c.enqueue(&PushRequest::full(model::TriggerReason::ConfigUpdate));
        let req = c.next_push().await;
        assert!(req.full);
        assert_eq!(req.reason.len(), 2);
        assert!(lock(&c.pending).is_none());
    }

    /// The proxy of a node that sends only its ID, as the stream's `parse_node` reads it.
    fn proxy_of(id: &str) -> Proxy {
        Proxy::parse(id, model::proxy::NodeMetadata::default()).unwrap()
    }
}
