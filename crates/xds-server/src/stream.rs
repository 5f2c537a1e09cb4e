//! One ADS stream, state of the world or delta, as Istio's `StreamAggregatedResources` /
//! `StreamDeltas`, `pushConnection` and `pushXds` (`pilot/pkg/xds/ads.go`, `delta.go`): one task
//! per stream that answers requests and runs the pushes marked in its pending slot, in CDS, EDS,
//! LDS, RDS order. What differs between the two protocols (request bookkeeping, response shape)
//! is a [`Flavour`]: [`sotw::Sotw`] or [`delta::Delta`]. Below the loop: the stream's start
//! (`accept`) and its generation off the runtime (`generate`).

mod accept;
pub(crate) mod delta;
mod flavour;
mod generate;
pub(crate) mod sotw;

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use xds_api::type_url;

use crate::PushRequest;
use crate::connection::Connection;
use crate::framing::{RequestError, Requests};
use crate::lock::lock;
use crate::outbound::{OutSender, Outbound, Slot};
use crate::snapshot::{PushSnapshot, SnapshotBuilder};
use crate::state::ServerState;
use crate::type_filter::is_debug_type;
use crate::watched::WatchedResource;
use accept::{accept, end_with};
use flavour::Cause;
pub(crate) use flavour::Flavour;
use generate::{Generated, generate, log_generate_error};

/// The stream ended (the proxy went away); nothing more to send.
#[derive(Debug)]
pub(crate) struct Closed;

/// Serves one stream until the proxy goes away.
pub(crate) async fn serve<B: SnapshotBuilder, F: Flavour>(
    state: Arc<ServerState<B>>,
    mut inbound: Requests<F::Request>,
    out: OutSender<F::Response>,
    peer: String,
    identities: Option<Vec<String>>,
) {
    let Some((first, registration)) = accept(&state, &mut inbound, &out, peer, identities, F::DELTA, F::node).await
    else {
        return;
    };
    let conn = registration.conn.clone();
    let mut stream = Stream::<B, F> {
        state,
        conn: conn.clone(),
        out,
        nonce: 0,
    };
    let _ = stream.run(first, inbound).await;
    tracing::info!("ADS: {} {} {}terminated", conn.peer, conn.id, F::LOG);
}

struct Stream<B: SnapshotBuilder, F: Flavour> {
    state: Arc<ServerState<B>>,
    conn: Arc<Connection<B::Snapshot>>,
    out: OutSender<F::Response>,
    nonce: u64,
}

impl<B: SnapshotBuilder, F: Flavour> Stream<B, F> {
    async fn run(&mut self, first: F::Request, mut inbound: Requests<F::Request>) -> Result<(), Closed> {
        // The request and push futures are boxed: inline, they made every idle stream's task
        // 5 kB instead of 2.7 kB.
        Box::pin(self.on_request(first)).await?;
        let conn = self.conn.clone();
        let out = self.out.clone();
        loop {
            // Requests first: they are cheap (mostly ACKs) and a proxy may be waiting on them.
            tokio::select! {
                biased;
                msg = inbound.next() => match msg {
                    Some(Ok(req)) => Box::pin(self.on_request(req)).await?,
                    Some(Err(e)) => {
                        end_with(&self.state, &self.out, &self.conn.id, e).await;
                        return Ok(());
                    }
                    None => return Ok(()),
                },
                req = conn.next_push() => Box::pin(self.push(req)).await?,
                _ = out.closed() => return Ok(()),
            }
        }
    }

    async fn on_request(&mut self, req: F::Request) -> Result<(), Closed> {
        let t = F::type_url(&req);
        if t.is_empty() {
            if let Some(suppressed) = monitoring::throttle::allow("ads_no_type_url") {
                tracing::warn!(
                    suppressed,
                    "ADS: {} sent a {}request without type_url; ignored",
                    self.conn.id,
                    F::LOG
                );
            }
            return Ok(());
        }
        let (outcome, target) = F::on_request(&mut lock(&self.conn.watched), &req, &self.state.names);
        let watched = lock(&self.conn.watched).get(t).map_or(0, |w| w.resource.names.len());
        let max = self.state.max_resource_names();
        if watched > max {
            let status = tonic::Status::resource_exhausted(format!(
                "{watched} resource names of {} exceed PILOT_XDS_MAX_RESOURCE_NAMES ({max})",
                type_url::short(t)
            ));
            let e = RequestError::Invalid {
                status,
                reason: "too_many_names",
            };
            end_with(&self.state, &self.out, &self.conn.id, e).await;
            return Err(Closed);
        }
        self.state.record_outcome(&self.conn, t, &outcome);
        let Some(target) = target else {
            return Ok(());
        };
        let Some(snapshot) = self.state.current_snapshot() else {
            return Ok(());
        };
        if is_debug_type(t) {
            return self.debug(snapshot, target).await;
        }
        lock(&self.conn.last_pushed).get_or_insert_with(|| snapshot.clone());
        let Some(target) = self.conn.request_target(target) else {
            return Ok(());
        };
        let mut targets = vec![target];
        // New route configurations' virtual hosts follow their RDS answer over VHDS.
        let follow_up = (F::DELTA && t == type_url::ROUTE)
            .then(|| self.conn.vhds_follow_up())
            .flatten();
        targets.extend(follow_up);
        // Answers take a throttle slot as pushes do: a thousand proxies connecting at once must
        // not hold a thousand full responses in memory.
        let mut slot = Slot::new(self.state.throttle().await, self.state.stall_time());
        for g in generate(snapshot.clone(), self.conn.proxy(), targets, F::DELTA).await {
            // the follow-up is sent only if it carries something, as a push is
            let cause = if g.watched.type_url == t {
                Cause::Request
            } else {
                Cause::Push
            };
            self.send(snapshot.as_ref(), g, cause, &mut slot).await?;
        }
        self.send_warming_endpoints(&snapshot, &mut slot).await?;
        slot.release().await;
        Ok(())
    }

    /// Delta: after CDS, the assignments of the clusters it added or updated that no EDS response
    /// carried yet (a CDS request, as Istio's `forceEDSPush`; a push whose changes EDS skips), so
    /// that Envoy can finish warming them. Nothing when EDS went out with the clusters.
    async fn send_warming_endpoints(&mut self, snapshot: &Arc<B::Snapshot>, slot: &mut Slot) -> Result<(), Closed> {
        if !F::DELTA {
            return Ok(());
        }
        let Some(target) = self.conn.warming_endpoints() else {
            return Ok(());
        };
        for g in generate(snapshot.clone(), self.conn.proxy(), vec![target], true).await {
            self.send(snapshot.as_ref(), g, Cause::Push, slot).await?;
        }
        Ok(())
    }

    /// Answers a request for one of Istio's xDS debug types (`debug`): the resources, or the
    /// status that refuses it (then the stream ends, as istiod's generator error ends it).
    async fn debug(&mut self, snapshot: Arc<B::Snapshot>, target: WatchedResource) -> Result<(), Closed> {
        let t0 = Instant::now();
        let names: Vec<String> = target.names.iter().map(|n| n.to_string()).collect();
        let resources = match self.state.debug_resources(&self.conn, &target.type_url, &names) {
            Ok(r) => r,
            Err(status) => {
                let _ = self.out.send(Outbound::message(Err(status))).await;
                return Err(Closed);
            }
        };
        let versions = if F::DELTA {
            resources
                .iter()
                .map(|r| {
                    r.version();
                    r.version.clone()
                })
                .collect()
        } else {
            Vec::new()
        };
        let g = Generated {
            watched: target,
            resources: Ok(resources),
            versions,
            elapsed: t0.elapsed(),
        };
        let mut slot = Slot::new(self.state.throttle().await, self.state.stall_time());
        self.send(snapshot.as_ref(), g, Cause::Request, &mut slot).await?;
        slot.release().await;
        Ok(())
    }

    async fn push(&mut self, req: PushRequest) -> Result<(), Closed> {
        let Some(snapshot) = self.state.current_snapshot() else {
            return Ok(());
        };
        let last_pushed = lock(&self.conn.last_pushed).clone();
        let proxy = self.conn.proxy();
        if !snapshot.needs_push(&proxy, &req, last_pushed.as_deref()) {
            tracing::debug!("Skipping {}push to {}, no updates required", F::LOG, self.conn.id);
            return Ok(());
        }
        let targets = self.conn.push_targets(&req);
        if targets.is_empty() {
            return Ok(());
        }
        // The slot is held from generation until the responses have left (see `outbound`).
        let mut slot = Slot::new(self.state.throttle().await, self.state.stall_time());
        let generated = generate(snapshot.clone(), proxy, targets, F::DELTA).await;
        if req.full {
            *lock(&self.conn.last_pushed) = Some(snapshot.clone());
        }
        for g in generated {
            self.send(snapshot.as_ref(), g, Cause::Push, &mut slot).await?;
        }
        self.send_warming_endpoints(&snapshot, &mut slot).await?;
        slot.release().await;
        self.state
            .metrics
            .convergence
            .observe(req.start.elapsed().as_secs_f64());
        Ok(())
    }

    async fn send(
        &mut self,
        snapshot: &B::Snapshot,
        g: Generated,
        cause: Cause,
        slot: &mut Slot,
    ) -> Result<(), Closed> {
        let t = g.watched.type_url.as_str();
        let resources = match &g.resources {
            Ok(r) => r,
            Err(e) => {
                if matches!(e, crate::GenerateError::Failed { .. }) {
                    self.state.metrics.internal_errors.inc();
                }
                log_generate_error(&self.conn.id, t, e);
                return Ok(());
            }
        };
        let version = snapshot.version();
        let Some((mut resp, n, removed)) = F::response(&self.conn, &self.state.names, &g, resources, version, cause)
        else {
            return Ok(());
        };
        self.nonce += 1;
        let nonce = self.state.nonce(self.nonce);
        F::set_nonce(&mut resp, nonce.clone());
        let bytes = prost::Message::encoded_len(&resp);
        let t0 = Instant::now();
        if slot.send(&self.out, resp).await.is_err() {
            if cause == Cause::Push {
                self.state.metrics.record_send_error(t);
            }
            return Err(Closed);
        }
        self.conn.record_sent(t, &nonce, version);
        self.state.record_sent(t, version, n, bytes, g.elapsed + t0.elapsed());
        tracing::debug!(
            "{}: {} for node:{} resources:{n}{removed} nonce:{nonce} version:{version}",
            type_url::short(t).to_uppercase(),
            if cause == Cause::Push { "PUSH" } else { "PUSH request" },
            self.conn.id,
        );
        Ok(())
    }
}
