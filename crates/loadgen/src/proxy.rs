//! One simulated sidecar: a real ADS client (state of the world or delta) that subscribes like
//! Envoy (CDS wildcard, EDS for the EDS clusters, LDS, RDS for the listeners' route names),
//! decodes and ACKs every response, and reports what it saw as [`ProxyEvent`]s.

use std::collections::BTreeSet;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

use anyhow::Result;
use prost::Message;
use test_support::ads::delta::{DeltaAdsClient, DeltaResponse};
use test_support::ads::{AdsClient, eds_cluster_names, rds_route_names};
use tokio::sync::mpsc;
use xds_api::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};
use xds_api::{pbwkt, type_url};

use crate::mesh::{sidecar_metadata, sidecar_node_id};
use crate::upstream::Upstream;

/// How a simulated proxy runs.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProxyOptions {
    /// Delta xDS instead of state of the world.
    pub delta: bool,
    /// Report every response received as [`ProxyEvent::Received`] (the raw phase replays them).
    pub record: bool,
}

/// A response as received, for replay.
#[derive(Debug, Clone)]
pub enum Recorded {
    Sotw(DiscoveryResponse),
    Delta(DeltaDiscoveryResponse),
}

/// What a proxy reports to the scenario.
#[derive(Debug, Clone)]
pub enum ProxyEvent {
    /// The handshake is done: every type received and ACKed, `elapsed` after the connect began.
    Converged { proxy: usize, elapsed: Duration },
    /// An RDS or EDS response was received and ACKed at `at`; `content` is a hash of its
    /// resources, so a push that repeats the same resources under a new version is told apart
    /// from a change.
    Acked {
        proxy: usize,
        watched: Watched,
        content: u64,
        at: Instant,
    },
    /// Encoded size of one response received.
    Bytes(usize),
    /// A response received at `at`, reported (with [`ProxyOptions::record`]) before its ACK's
    /// [`ProxyEvent::Acked`].
    Received { at: Instant, response: Recorded },
    /// The proxy stopped on an error.
    Failed { proxy: usize, error: String },
}

/// The types whose changes the scenarios time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watched {
    Routes = 0,
    Endpoints = 1,
}

impl Watched {
    fn of(type_url: &str) -> Option<Watched> {
        match type_url {
            type_url::ROUTE => Some(Watched::Routes),
            type_url::ENDPOINT => Some(Watched::Endpoints),
            _ => None,
        }
    }
}

/// Runs proxy `n` against `upstream` until its stream ends or the task is aborted.
pub async fn run_proxy(upstream: Upstream, n: usize, opts: ProxyOptions, events: mpsc::UnboundedSender<ProxyEvent>) {
    let result = if opts.delta {
        run_delta(upstream.addr(), n, opts.record, &events).await
    } else {
        run_sotw(&upstream, n, opts.record, &events).await
    };
    if let Err(e) = result {
        let _ = events.send(ProxyEvent::Failed {
            proxy: n,
            error: format!("{e:#}"),
        });
    }
}

/// Long enough that only the scenario's own timeout ends a proxy.
const RECV_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

async fn run_sotw(
    upstream: &Upstream,
    n: usize,
    record: bool,
    events: &mpsc::UnboundedSender<ProxyEvent>,
) -> Result<()> {
    let start = Instant::now();
    let channel = upstream.channel(n).await?;
    let mut client = AdsClient::on_channel(channel, &sidecar_node_id(n), sidecar_metadata(n)).await?;
    client.timeout = RECV_TIMEOUT;
    let hs = client.handshake(None).await?;
    let elapsed = start.elapsed();
    let at = Instant::now();
    let mut eds: Vec<String> = hs
        .clusters
        .as_ref()
        .map(|r| eds_cluster_names(&r.raw.resources))
        .unwrap_or_default();
    let mut rds: Vec<String> = hs
        .listeners
        .as_ref()
        .map(|r| rds_route_names(&r.raw.resources))
        .unwrap_or_default();
    // Moved out, not kept: 2,000 proxies holding a large mesh's handshake would be gigabytes.
    for r in [hs.clusters, hs.endpoints, hs.listeners, hs.routes]
        .into_iter()
        .flatten()
    {
        send(events, ProxyEvent::Bytes(r.raw.encoded_len()));
        if record {
            let response = Recorded::Sotw(r.raw);
            send(events, ProxyEvent::Received { at, response });
        }
    }
    send(events, ProxyEvent::Converged { proxy: n, elapsed });
    loop {
        let r = client.recv().await?;
        let at = Instant::now();
        send(events, ProxyEvent::Bytes(r.raw.encoded_len()));
        // Envoy follows a new CDS/LDS with its EDS/RDS subscription, when it changed, before ACKing.
        match r.type_url() {
            type_url::CLUSTER => follow(
                &mut client,
                type_url::ENDPOINT,
                &mut eds,
                eds_cluster_names(&r.raw.resources),
            )?,
            type_url::LISTENER => follow(
                &mut client,
                type_url::ROUTE,
                &mut rds,
                rds_route_names(&r.raw.resources),
            )?,
            _ => {}
        }
        client.ack_response(&r)?;
        let acked = Instant::now();
        let watched = Watched::of(r.type_url()).map(|w| (w, content_hash(r.raw.resources.iter())));
        if record {
            let response = Recorded::Sotw(r.raw);
            send(events, ProxyEvent::Received { at, response });
        }
        if let Some((watched, content)) = watched {
            send(
                events,
                ProxyEvent::Acked {
                    watched,
                    proxy: n,
                    content,
                    at: acked,
                },
            );
        }
    }
}

/// Re-subscribes `type_url` to `wanted` if it differs from `current`.
fn follow(client: &mut AdsClient, type_url: &str, current: &mut Vec<String>, mut wanted: Vec<String>) -> Result<()> {
    wanted.sort();
    current.sort();
    if wanted != *current {
        let names: Vec<&str> = wanted.iter().map(String::as_str).collect();
        client.request(type_url, &names)?;
        *current = wanted;
    }
    Ok(())
}

async fn run_delta(addr: &str, n: usize, record: bool, events: &mpsc::UnboundedSender<ProxyEvent>) -> Result<()> {
    let start = Instant::now();
    let mut client = DeltaAdsClient::connect(addr, &sidecar_node_id(n), sidecar_metadata(n)).await?;
    client.timeout = RECV_TIMEOUT;
    let mut proxy = DeltaProxy {
        client,
        n,
        record,
        events,
        eds: BTreeSet::new(),
        rds: BTreeSet::new(),
    };
    proxy.client.subscribe(type_url::CLUSTER, &[])?;
    proxy.until(type_url::CLUSTER).await?;
    if !proxy.eds.is_empty() {
        proxy.until(type_url::ENDPOINT).await?;
    }
    proxy.client.subscribe(type_url::LISTENER, &[])?;
    proxy.until(type_url::LISTENER).await?;
    if !proxy.rds.is_empty() {
        proxy.until(type_url::ROUTE).await?;
    }
    send(
        events,
        ProxyEvent::Converged {
            proxy: n,
            elapsed: start.elapsed(),
        },
    );
    loop {
        proxy.step().await?;
    }
}

struct DeltaProxy<'a> {
    client: DeltaAdsClient,
    n: usize,
    record: bool,
    events: &'a mpsc::UnboundedSender<ProxyEvent>,
    eds: BTreeSet<String>,
    rds: BTreeSet<String>,
}

impl DeltaProxy<'_> {
    /// Handles responses until one of `type_url` has been handled.
    async fn until(&mut self, type_url: &str) -> Result<()> {
        while self.step().await? != type_url {}
        Ok(())
    }

    /// Receives, follows and ACKs one response; returns its type.
    async fn step(&mut self) -> Result<String> {
        let r = self.client.recv().await?;
        let at = Instant::now();
        send(self.events, ProxyEvent::Bytes(r.raw.encoded_len()));
        let t = r.type_url().to_owned();
        match t.as_str() {
            type_url::CLUSTER => {
                let have = self.client.resources(type_url::CLUSTER);
                let names = eds_cluster_names(&bodies(&r));
                let wanted: BTreeSet<String> = self
                    .eds
                    .iter()
                    .filter(|n| have.contains_key(*n))
                    .cloned()
                    .chain(names)
                    .collect();
                self.resubscribe(type_url::ENDPOINT, wanted, true)?;
            }
            type_url::LISTENER => {
                let wanted: BTreeSet<String> = rds_route_names(&bodies(&r))
                    .into_iter()
                    .chain(self.rds.iter().cloned())
                    .collect();
                self.resubscribe(type_url::ROUTE, wanted, false)?;
            }
            _ => {}
        }
        self.client
            .send_raw(xds_api::envoy::service::discovery::v3::DeltaDiscoveryRequest {
                type_url: t.clone(),
                response_nonce: r.nonce().to_owned(),
                ..Default::default()
            })?;
        let acked = Instant::now();
        let watched = Watched::of(&t).map(|w| {
            let content = content_hash(r.raw.resources.iter().filter_map(|r| r.resource.as_ref()));
            (w, content)
        });
        if self.record {
            let response = Recorded::Delta(r.raw);
            send(self.events, ProxyEvent::Received { at, response });
        }
        if let Some((watched, content)) = watched {
            send(
                self.events,
                ProxyEvent::Acked {
                    watched,
                    proxy: self.n,
                    content,
                    at: acked,
                },
            );
        }
        Ok(t)
    }

    /// Subscribes to the names of `wanted` not yet subscribed (EDS: also drops removed clusters).
    fn resubscribe(&mut self, type_url: &str, wanted: BTreeSet<String>, drop_missing: bool) -> Result<()> {
        let current = if type_url == type_url::ENDPOINT {
            &mut self.eds
        } else {
            &mut self.rds
        };
        let added: Vec<String> = wanted.difference(current).cloned().collect();
        let removed: Vec<String> = if drop_missing {
            current.difference(&wanted).cloned().collect()
        } else {
            vec![]
        };
        for a in &added {
            current.insert(a.clone());
        }
        for r in &removed {
            current.remove(r);
        }
        if !added.is_empty() {
            let names: Vec<&str> = added.iter().map(String::as_str).collect();
            self.client.subscribe(type_url, &names)?;
        }
        if !removed.is_empty() {
            let names: Vec<&str> = removed.iter().map(String::as_str).collect();
            self.client.unsubscribe(type_url, &names)?;
        }
        Ok(())
    }
}

fn bodies(r: &DeltaResponse) -> Vec<pbwkt::Any> {
    r.raw.resources.iter().filter_map(|r| r.resource.clone()).collect()
}

/// A hash of resources' encoded bodies.
pub fn content_hash<'a>(resources: impl Iterator<Item = &'a pbwkt::Any>) -> u64 {
    let mut h = DefaultHasher::new();
    for r in resources {
        r.value.hash(&mut h);
    }
    h.finish()
}

fn send(events: &mpsc::UnboundedSender<ProxyEvent>, e: ProxyEvent) {
    // The scenario may have finished and dropped its receiver; the proxy is aborted soon after.
    let _ = events.send(e);
}
