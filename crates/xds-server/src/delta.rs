//! Delta ADS streams (`DeltaAggregatedResources`), as Istio's `StreamDeltas` and `pushDeltaXds`:
//! per type the server tracks what the proxy has (name -> version, a hash of the resource bytes),
//! and each response carries only what changed plus `removed_resources`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use tokio::sync::{OwnedSemaphorePermit, oneshot};
use tonic::Streaming;
use xds_api::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource as PbResource};
use xds_api::type_url;

use crate::connection::{Connection, Generated, accept, generate, lock, log_generate_error};
use crate::outbound::{self, OutSender, Outbound, drained};
use crate::server::{Closed, DiscoveryServer};
use crate::watched::{Respond, WatchedResource, delta_request};
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
        pushed: None,
    };
    let _ = stream.run(first, inbound).await;
    tracing::info!("ADS: {} {} delta terminated", conn.peer, conn.id);
}

struct DeltaStream {
    server: Arc<DiscoveryServer>,
    conn: Arc<Connection>,
    out: DeltaSender,
    nonce: u64,
    /// Fires once tonic is past the last response a push sent.
    pushed: Option<oneshot::Receiver<()>>,
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
        let (outcome, respond) = delta_request(&mut lock(&self.conn.watched), &req);
        self.server.record_outcome(&self.conn, &req.type_url, &outcome);
        let Some(mut target) = lock(&self.conn.watched).get(&req.type_url).map(|w| w.resource.clone()) else {
            return Ok(());
        };
        match respond {
            Respond::No => return Ok(()),
            Respond::All => {}
            Respond::Names(names) => {
                target = WatchedResource {
                    names,
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
        let mut slot = self.server.throttle().await;
        for g in generate(snapshot.clone(), self.conn.proxy.clone(), vec![target], push, true).await {
            self.send(snapshot.as_ref(), g, Cause::Request, &mut slot).await?;
        }
        self.release(slot).await;
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
        let mut slot = self.server.throttle().await;
        let generated = generate(snapshot.clone(), self.conn.proxy.clone(), targets, req.clone(), true).await;
        if req.full {
            *lock(&self.conn.last_pushed) = Some(snapshot.clone());
        }
        for g in generated {
            self.send(snapshot.as_ref(), g, Cause::Push, &mut slot).await?;
        }
        self.release(slot).await;
        self.server
            .metrics
            .convergence
            .observe(req.start.elapsed().as_secs_f64());
        Ok(())
    }

    /// Gives a throttle slot back once tonic is past the last response sent under it.
    async fn release(&mut self, slot: Option<OwnedSemaphorePermit>) {
        if let Some(pushed) = self.pushed.take()
            && slot.is_some()
        {
            drained(pushed).await;
        }
        drop(slot);
    }

    async fn send(
        &mut self,
        snapshot: &dyn PushSnapshot,
        g: Generated,
        cause: Cause,
        slot: &mut Option<OwnedSemaphorePermit>,
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
            let current: Vec<(String, String)> = resources
                .iter()
                .zip(g.versions)
                .map(|(r, v)| (r.name.clone(), v))
                .collect();
            diff(&mut w.known, &current, &g.watched, cause == Cause::Request)
        };
        if cause == Cause::Push && changed.is_empty() && removed.is_empty() {
            return Ok(());
        }
        let by_name: BTreeMap<&str, _> = resources.iter().map(|r| (r.name.as_str(), r)).collect();
        let pb_resources: Vec<PbResource> = changed
            .iter()
            .filter_map(|(name, v)| {
                by_name.get(name.as_str()).map(|r| PbResource {
                    name: name.clone(),
                    version: v.clone(),
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
        let taken = if slot.is_some() {
            let (tx, rx) = oneshot::channel();
            self.pushed = Some(rx);
            Some(tx)
        } else {
            None
        };
        let out = Outbound { item: Ok(resp), taken };
        if outbound::send(&self.out, out, slot).await.is_err() {
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
fn diff(
    known: &mut BTreeMap<String, String>,
    current: &[(String, String)],
    scope: &WatchedResource,
    answering: bool,
) -> (Vec<(String, String)>, Vec<String>) {
    let mut changed = Vec::new();
    let present: BTreeSet<&str> = current.iter().map(|(n, _)| n.as_str()).collect();
    for (name, version) in current {
        if known.get(name) != Some(version) {
            known.insert(name.clone(), version.clone());
            changed.push((name.clone(), version.clone()));
        }
    }
    let mut removed: Vec<String> = if scope.wildcard {
        known
            .keys()
            .filter(|n| !present.contains(n.as_str()))
            .cloned()
            .collect()
    } else {
        scope
            .names
            .iter()
            .filter(|n| !present.contains(n.as_str()) && (answering || known.contains_key(n.as_str())))
            .cloned()
            .collect()
    };
    for n in &removed {
        known.remove(n);
    }
    removed.sort();
    (changed, removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scope(names: &[&str], wildcard: bool) -> WatchedResource {
        WatchedResource {
            type_url: type_url::CLUSTER.into(),
            names: names.iter().map(|s| s.to_string()).collect(),
            wildcard,
        }
    }

    fn cur(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    #[test]
    fn wildcard_diff_sends_changes_and_removals() {
        let mut known = BTreeMap::from([("a".to_string(), "1".to_string()), ("b".to_string(), "1".to_string())]);
        let (changed, removed) = diff(&mut known, &cur(&[("a", "1"), ("c", "1")]), &scope(&[], true), false);
        assert_eq!(changed, cur(&[("c", "1")]));
        assert_eq!(removed, vec!["b".to_string()]);
        assert_eq!(known.keys().collect::<Vec<_>>(), vec!["a", "c"]);
        let (changed, removed) = diff(&mut known, &cur(&[("a", "2"), ("c", "1")]), &scope(&[], true), false);
        assert_eq!((changed, removed), (cur(&[("a", "2")]), vec![]));
    }

    #[test]
    fn named_diff_reports_missing_names_only_when_answering_or_known() {
        let mut known = BTreeMap::from([("x".to_string(), "1".to_string())]);
        let s = scope(&["x", "y"], false);
        let (changed, removed) = diff(&mut known, &[], &s, false);
        assert!(changed.is_empty());
        assert_eq!(removed, vec!["x".to_string()]);
        let (_, removed) = diff(&mut known, &[], &s, true);
        assert_eq!(removed, vec!["x".to_string(), "y".to_string()]);
    }
}
