//! Delta ADS streams (`DeltaAggregatedResources`), as Istio's `StreamDeltas` and `pushDeltaXds`:
//! per type the server tracks what the proxy has (name -> version, a hash of the resource bytes),
//! and each response carries only what changed plus `removed_resources`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use crate::grpc::Requests as Streaming;
use futures::StreamExt;
use xds_api::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource as PbResource};
use xds_api::type_url;

use crate::connection::{Connection, Generated, accept, generate, lock, log_generate_error};
use crate::outbound::{OutSender, Slot};
use crate::server::{Closed, DiscoveryServer};
use crate::watched::{NameInterner, Respond, Version, WatchedResource, delta_request, version_str};
use crate::{PushRequest, PushSnapshot, reason};

pub(crate) type DeltaSender = OutSender<DeltaDiscoveryResponse>;

/// Serves one delta stream until the proxy goes away.
pub(crate) async fn serve(
    server: Arc<DiscoveryServer>,
    mut inbound: Streaming<DeltaDiscoveryRequest>,
    out: DeltaSender,
    peer: String,
) {
    let Some((first, registration)) = accept(&server, &mut inbound, &out, peer, true, |r: &DeltaDiscoveryRequest| {
        r.node.as_ref()
    })
    .await
    else {
        return;
    };
    let conn = registration.conn.clone();
    let mut stream = DeltaStream {
        server,
        conn: conn.clone(),
        out,
        nonce: 0,
    };
    let _ = stream.run(first, inbound).await;
    tracing::info!("ADS: {} {} delta terminated", conn.peer, conn.id);
}

struct DeltaStream {
    server: Arc<DiscoveryServer>,
    conn: Arc<Connection>,
    out: DeltaSender,
    nonce: u64,
}

/// Why a response is being built: answering a request always answers; a push only when
/// something changed.
#[derive(Clone, Copy, PartialEq)]
enum Cause {
    Request,
    Push,
}

impl DeltaStream {
    async fn run(
        &mut self,
        first: DeltaDiscoveryRequest,
        mut inbound: Streaming<DeltaDiscoveryRequest>,
    ) -> Result<(), Closed> {
        self.on_request(first).await?;
        let conn = self.conn.clone();
        let out = self.out.clone();
        loop {
            tokio::select! {
                biased;
                msg = inbound.next() => match msg {
                    Some(Ok(req)) => self.on_request(req).await?,
                    Some(Err(e)) => {
                        tracing::debug!("ADS: {} delta receive error: {e}", self.conn.id);
                        return Ok(());
                    }
                    None => return Ok(()),
                },
                req = conn.next_push() => self.push(req).await?,
                _ = out.closed() => return Ok(()),
            }
        }
    }

    async fn on_request(&mut self, req: DeltaDiscoveryRequest) -> Result<(), Closed> {
        if req.type_url.is_empty() {
            tracing::warn!("ADS: {} sent a delta request without type_url; ignored", self.conn.id);
            return Ok(());
        }
        let (outcome, respond) = delta_request(&mut lock(&self.conn.watched), &req, &self.server.names);
        self.server.record_outcome(&self.conn, &req.type_url, &outcome);
        let Some(mut target) = lock(&self.conn.watched).get(&req.type_url).map(|w| w.resource.clone()) else {
            return Ok(());
        };
        match respond {
            Respond::No => return Ok(()),
            Respond::All => {}
            Respond::Names(names) => {
                target = WatchedResource {
                    names: names.into_iter().collect(),
                    wildcard: false,
                    ..target
                }
            }
        }
        let Some(snapshot) = self.server.current_snapshot() else {
            return Ok(());
        };
        lock(&self.conn.last_pushed).get_or_insert_with(|| snapshot.clone());
        let push = PushRequest::full(reason::PROXY_REQUEST);
        // Answers take a throttle slot as pushes do: a thousand proxies connecting at once must
        // not hold a thousand full responses in memory.
        let mut slot = Slot::new(self.server.throttle().await);
        for g in generate(snapshot.clone(), self.conn.proxy.clone(), vec![target], push, true).await {
            self.send(snapshot.as_ref(), g, Cause::Request, &mut slot).await?;
        }
        slot.release().await;
        Ok(())
    }

    async fn push(&mut self, req: PushRequest) -> Result<(), Closed> {
        let Some(snapshot) = self.server.current_snapshot() else {
            return Ok(());
        };
        let last_pushed = lock(&self.conn.last_pushed).clone();
        if !snapshot.needs_push(&self.conn.proxy, &req, last_pushed.as_deref()) {
            tracing::debug!("Skipping delta push to {}, no updates required", self.conn.id);
            return Ok(());
        }
        let targets = self.conn.push_targets(&req);
        if targets.is_empty() {
            return Ok(());
        }
        // The slot is held from generation until the responses have left (see `outbound`).
        let mut slot = Slot::new(self.server.throttle().await);
        let generated = generate(snapshot.clone(), self.conn.proxy.clone(), targets, req.clone(), true).await;
        if req.full {
            *lock(&self.conn.last_pushed) = Some(snapshot.clone());
        }
        for g in generated {
            self.send(snapshot.as_ref(), g, Cause::Push, &mut slot).await?;
        }
        slot.release().await;
        self.server
            .metrics
            .convergence
            .observe(req.start.elapsed().as_secs_f64());
        Ok(())
    }

    async fn send(
        &mut self,
        snapshot: &dyn PushSnapshot,
        g: Generated,
        cause: Cause,
        slot: &mut Slot,
    ) -> Result<(), Closed> {
        let t = g.watched.type_url.as_str();
        let resources = match g.resources {
            Ok(r) => r,
            Err(e) => {
                log_generate_error(&self.conn.id, t, &e);
                return Ok(());
            }
        };
        let version = snapshot.version();
        let (changed, removed) = {
            let mut watched = lock(&self.conn.watched);
            let Some(w) = watched.get_mut(t) else {
                return Ok(());
            };
            let current: Vec<(&str, &Version)> = resources.iter().map(|r| r.name.as_str()).zip(&g.versions).collect();
            let answering = cause == Cause::Request;
            diff(&mut w.known, &current, &g.watched, answering, &self.server.names)
        };
        if cause == Cause::Push && changed.is_empty() && removed.is_empty() {
            return Ok(());
        }
        let by_name: BTreeMap<&str, _> = resources.iter().map(|r| (r.name.as_str(), r)).collect();
        let pb_resources: Vec<PbResource> = changed
            .iter()
            .filter_map(|&(name, v)| {
                by_name.get(name).map(|r| PbResource {
                    name: name.to_owned(),
                    version: version_str(v).to_owned(),
                    resource: Some((*r.resource).clone()),
                    ..Default::default()
                })
            })
            .collect();
        self.nonce += 1;
        let nonce = self.server.nonce(self.nonce);
        let n = pb_resources.len();
        let resp = DeltaDiscoveryResponse {
            system_version_info: version.to_owned(),
            resources: pb_resources,
            type_url: t.to_owned(),
            removed_resources: removed.clone(),
            nonce: nonce.clone(),
            ..Default::default()
        };
        let t0 = Instant::now();
        if slot.send(&self.out, resp).await.is_err() {
            if cause == Cause::Push {
                self.server.metrics.record_send_error(t);
            }
            return Err(Closed);
        }
        self.conn.record_sent(t, &nonce, version);
        self.server.record_sent(t, version, n, g.elapsed + t0.elapsed());
        tracing::debug!(
            "{}: {} for node:{} resources:{n} removed:{:?} nonce:{nonce} version:{version}",
            type_url::short(t).to_uppercase(),
            if cause == Cause::Push { "PUSH" } else { "PUSH request" },
            self.conn.id,
            removed,
        );
        Ok(())
    }
}

/// Compares what the proxy has (`known`) with `current` (name, version) for the `scope` that was
/// generated; updates `known` as if the response were applied. Returns the resources to send and
/// the names to remove. Names of a non-wildcard scope that do not exist are reported removed when
/// answering a request (so the proxy stops waiting for them), and when the proxy had them.
/// `known` keeps shared names (the scope's, else interned) and the resources' own version slots.
fn diff<'a>(
    known: &mut BTreeMap<Arc<str>, Version>,
    current: &[(&'a str, &'a Version)],
    scope: &WatchedResource,
    answering: bool,
    interner: &NameInterner,
) -> (Vec<(&'a str, &'a Version)>, Vec<String>) {
    let mut changed = Vec::new();
    let present: BTreeSet<&str> = current.iter().map(|(n, _)| *n).collect();
    let mut interning = None;
    // A first response fills `known` in one bulk build: full B-tree nodes, where inserting in
    // order leaves them about half empty.
    let mut new_entries = Vec::new();
    for &(name, version) in current {
        match known.get_mut(name) {
            Some(k) if Arc::ptr_eq(k, version) => {}
            // Same version, newer slot: hold the current one so older pushes' slots can go.
            Some(k) if version_str(k) == version_str(version) => *k = version.clone(),
            Some(k) => {
                *k = version.clone();
                changed.push((name, version));
            }
            None => {
                let n = match scope.names.get(name) {
                    Some(n) => n.clone(),
                    None => interning.get_or_insert_with(|| interner.lock()).name(name),
                };
                new_entries.push((n, version.clone()));
                changed.push((name, version));
            }
        }
    }
    if known.is_empty() {
        *known = new_entries.into_iter().collect();
    } else {
        known.extend(new_entries);
    }
    let mut removed: Vec<String> = if scope.wildcard {
        known
            .keys()
            .filter(|n| !present.contains(&***n))
            .map(|n| n.to_string())
            .collect()
    } else {
        scope
            .names
            .iter()
            .filter(|n| !present.contains(&***n) && (answering || known.contains_key(&***n)))
            .map(|n| n.to_string())
            .collect()
    };
    for n in &removed {
        known.remove(n.as_str());
    }
    removed.sort();
    (changed, removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::OnceLock;

    fn scope(names: &[&str], wildcard: bool) -> WatchedResource {
        WatchedResource {
            type_url: type_url::CLUSTER.into(),
            names: names.iter().copied().collect(),
            wildcard,
        }
    }

    fn v(s: &str) -> Version {
        Arc::new(OnceLock::from(s.to_owned()))
    }

    fn known(entries: &[(&str, &str)]) -> BTreeMap<Arc<str>, Version> {
        entries.iter().map(|(n, x)| (Arc::from(*n), v(x))).collect()
    }

    fn text(changed: &[(&str, &Version)]) -> Vec<(String, String)> {
        changed
            .iter()
            .map(|(n, v)| (n.to_string(), version_str(v).to_owned()))
            .collect()
    }

    #[test]
    fn wildcard_diff_sends_changes_and_removals() {
        let i = NameInterner::default();
        let mut known = known(&[("a", "1"), ("b", "1")]);
        let (a1, c1) = (v("1"), v("1"));
        let (changed, removed) = diff(&mut known, &[("a", &a1), ("c", &c1)], &scope(&[], true), false, &i);
        assert_eq!(text(&changed), [("c".to_string(), "1".to_string())]);
        assert_eq!(removed, vec!["b".to_string()]);
        assert_eq!(known.keys().map(|k| &**k).collect::<Vec<_>>(), vec!["a", "c"]);
        // the same version in a newer slot: nothing sent, the newer slot is held
        assert!(Arc::ptr_eq(&known["a"], &a1));
        // a name outside the scope's names is interned
        assert_eq!(i.len().0, 1);
        let a2 = v("2");
        let (changed, removed) = diff(&mut known, &[("a", &a2), ("c", &c1)], &scope(&[], true), false, &i);
        assert_eq!(text(&changed), [("a".to_string(), "2".to_string())]);
        assert!(removed.is_empty());
    }

    #[test]
    fn named_diff_reports_missing_names_only_when_answering_or_known() {
        let i = NameInterner::default();
        let mut known = known(&[("x", "1")]);
        let s = scope(&["x", "y"], false);
        let (changed, removed) = diff(&mut known, &[], &s, false, &i);
        assert!(changed.is_empty());
        assert_eq!(removed, vec!["x".to_string()]);
        let (_, removed) = diff(&mut known, &[], &s, true, &i);
        assert_eq!(removed, vec!["x".to_string(), "y".to_string()]);
    }

    #[test]
    fn known_names_of_a_named_scope_are_the_scope_s_own() {
        let i = NameInterner::default();
        let mut known = BTreeMap::new();
        let s = scope(&["y"], false);
        let y = v("1");
        diff(&mut known, &[("y", &y)], &s, true, &i);
        let (k, ver) = known.first_key_value().unwrap();
        assert!(Arc::ptr_eq(k, s.names.first().unwrap()));
        assert!(Arc::ptr_eq(ver, &y));
        assert_eq!(i.len(), (0, 0));
    }
}
