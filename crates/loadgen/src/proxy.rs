//! One simulated sidecar: a real ADS client (state of the world or delta) that subscribes like
//! Envoy (CDS wildcard, EDS for the EDS clusters, LDS, RDS for the listeners' route names, and in
//! delta VHDS once a route configuration points at it), decodes and ACKs every response, and
//! reports what it saw as [`ProxyEvent`]s.

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::{Duration, Instant};

use anyhow::Result;
use prost::Message;
use test_support::ads::delta::{DeltaAdsClient, DeltaResponse};
use test_support::ads::{AdsClient, eds_cluster_names, rds_route_names, uses_vhds};
use tokio::sync::mpsc;
use xds_api::envoy::config::endpoint::v3::ClusterLoadAssignment;
use xds_api::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse};
use xds_api::{pbwkt, type_url};

use crate::mesh::{namespace, sidecar_metadata, sidecar_node_id};
use crate::upstream::Upstream;

/// How a simulated proxy runs.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ProxyOptions {
    /// Delta xDS instead of state of the world.
    pub delta: bool,
    /// Report every response received as [`ProxyEvent::Received`] (the raw phase replays them).
    pub record: bool,
    /// Report the endpoint addresses of every plain cluster whose addresses change
    /// ([`ProxyEvent::Endpoints`], for endpoint churn).
    pub endpoints: bool,
    /// The mesh's namespace count: proxy `n` runs in [`namespace`]`(namespaces, n)`.
    pub namespaces: usize,
    /// The light client (`--client light`): checks each response's envelope (type, version,
    /// nonce, resource names read without decoding the resources, a checksum of the bytes) and
    /// decodes clusters and listeners only when their bytes changed (to follow EDS and RDS as
    /// Envoy does).
    pub light: bool,
}

/// A response as received, for replay.
#[derive(Debug, Clone)]
pub enum Recorded {
    Sotw(DiscoveryResponse),
    Delta(DeltaDiscoveryResponse),
}

/// What a proxy reports to the scenario.
#[derive(Debug, Clone)]
pub(crate) enum ProxyEvent {
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
    /// An EDS response was ACKed at `at` that moved the addresses of these plain
    /// (`outbound|<port>||<host>`) clusters: their addresses now, one list per cluster.
    Endpoints {
        proxy: usize,
        clusters: Vec<Vec<String>>,
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
            type_url::ROUTE | type_url::VIRTUAL_HOST => Some(Watched::Routes),
            type_url::ENDPOINT => Some(Watched::Endpoints),
            _ => None,
        }
    }
}

/// Runs proxy `n` against `upstream` until its stream ends or the task is aborted.
pub(crate) async fn run_proxy(
    upstream: Upstream,
    n: usize,
    opts: ProxyOptions,
    events: mpsc::UnboundedSender<ProxyEvent>,
) {
    let result = if opts.delta {
        run_delta(upstream.addr(), n, opts, &events).await
    } else {
        run_sotw(&upstream, n, opts, &events).await
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
    opts: ProxyOptions,
    events: &mpsc::UnboundedSender<ProxyEvent>,
) -> Result<()> {
    let record = opts.record;
    let mut moved = opts.endpoints.then(MovedEndpoints::default);
    let start = Instant::now();
    let channel = upstream.channel(n).await?;
    let ns = namespace(opts.namespaces, n);
    let mut client = AdsClient::on_channel(channel, &sidecar_node_id(&ns, n), sidecar_metadata(&ns, n)).await?;
    client.timeout = RECV_TIMEOUT;
    client.set_light(opts.light);
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
    // The light client decodes CDS and LDS again only when their bytes changed.
    let mut followed: HashMap<String, u64> = HashMap::new();
    if opts.light {
        for r in [&hs.clusters, &hs.listeners].into_iter().flatten() {
            followed.insert(r.type_url().to_owned(), content_hash(r.raw.resources.iter()));
        }
    }
    // Moved out, not kept: 2,000 proxies holding a large mesh's handshake would be gigabytes.
    if let (Some(moved), Some(r)) = (&mut moved, &hs.endpoints) {
        moved.update(r.raw.resources.iter());
    }
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
        let unchanged = opts.light && matches!(r.type_url(), type_url::CLUSTER | type_url::LISTENER) && {
            let hash = content_hash(r.raw.resources.iter());
            followed.insert(r.type_url().to_owned(), hash) == Some(hash)
        };
        match r.type_url() {
            _ if unchanged => {}
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
        if let Some(moved) = &mut moved
            && r.type_url() == type_url::ENDPOINT
        {
            moved.report(n, r.raw.resources.iter(), acked, events);
        }
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

async fn run_delta(addr: &str, n: usize, opts: ProxyOptions, events: &mpsc::UnboundedSender<ProxyEvent>) -> Result<()> {
    let start = Instant::now();
    let ns = namespace(opts.namespaces, n);
    let mut client = DeltaAdsClient::connect(addr, &sidecar_node_id(&ns, n), sidecar_metadata(&ns, n)).await?;
    client.timeout = RECV_TIMEOUT;
    client.set_light(opts.light);
    let mut proxy = DeltaProxy {
        client,
        n,
        record: opts.record,
        moved: opts.endpoints.then(MovedEndpoints::default),
        events,
        eds: BTreeSet::new(),
        rds: BTreeSet::new(),
        vhds: false,
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
    if proxy.vhds {
        proxy.until(type_url::VIRTUAL_HOST).await?;
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
    moved: Option<MovedEndpoints>,
    events: &'a mpsc::UnboundedSender<ProxyEvent>,
    eds: BTreeSet<String>,
    rds: BTreeSet<String>,
    /// Subscribed to VHDS: as Envoy, once, without names, when a route configuration says so.
    vhds: bool,
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
            type_url::ROUTE if !self.vhds => {
                let bodies = r.raw.resources.iter().filter_map(|r| r.resource.as_ref());
                if bodies.into_iter().any(uses_vhds) {
                    self.client.subscribe(type_url::VIRTUAL_HOST, &[])?;
                    self.vhds = true;
                }
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
        if let Some(moved) = &mut self.moved
            && t == type_url::ENDPOINT
        {
            let bodies = r.raw.resources.iter().filter_map(|r| r.resource.as_ref());
            moved.report(self.n, bodies, acked, self.events);
        }
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

/// Per plain cluster, a hash of the endpoint addresses last ACKed, to report only those that move.
#[derive(Debug, Default)]
struct MovedEndpoints {
    seen: HashMap<String, u64>,
}

impl MovedEndpoints {
    /// The addresses of the plain clusters among `resources` that differ from those seen before.
    fn update<'a>(&mut self, resources: impl Iterator<Item = &'a pbwkt::Any>) -> Vec<Vec<String>> {
        let mut moved = Vec::new();
        for any in resources {
            let Ok(cla) = ClusterLoadAssignment::decode(any.value.as_slice()) else {
                continue;
            };
            if !is_plain_cluster(&cla.cluster_name) {
                continue;
            }
            let addresses = addresses(&cla);
            let mut h = DefaultHasher::new();
            addresses.hash(&mut h);
            let hash = h.finish();
            if self.seen.insert(cla.cluster_name, hash) != Some(hash) {
                moved.push(addresses);
            }
        }
        moved
    }

    fn report<'a>(
        &mut self,
        proxy: usize,
        resources: impl Iterator<Item = &'a pbwkt::Any>,
        at: Instant,
        events: &mpsc::UnboundedSender<ProxyEvent>,
    ) {
        let clusters = self.update(resources);
        if !clusters.is_empty() {
            send(events, ProxyEvent::Endpoints { proxy, clusters, at });
        }
    }
}

/// `outbound|<port>||<host>`: a service's cluster without a subset.
fn is_plain_cluster(name: &str) -> bool {
    let mut parts = name.split('|');
    parts.next() == Some("outbound") && parts.nth(1) == Some("")
}

/// The socket addresses of a ClusterLoadAssignment's endpoints, in order.
fn addresses(cla: &ClusterLoadAssignment) -> Vec<String> {
    test_support::ads::endpoint_addresses(cla)
        .into_iter()
        .map(|(a, _)| a)
        .collect()
}

/// A hash of resources' encoded bodies.
pub(crate) fn content_hash<'a>(resources: impl Iterator<Item = &'a pbwkt::Any>) -> u64 {
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

#[cfg(test)]
mod tests {
    use super::*;
    use xds_api::envoy::config::core::v3::{Address, SocketAddress, address};
    use xds_api::envoy::config::endpoint::v3::{Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint};

    fn cla(name: &str, ips: &[&str]) -> pbwkt::Any {
        let lb_endpoints = ips
            .iter()
            .map(|ip| LbEndpoint {
                host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(Endpoint {
                    address: Some(Address {
                        address: Some(address::Address::SocketAddress(SocketAddress {
                            address: (*ip).to_owned(),
                            ..Default::default()
                        })),
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            })
            .collect();
        let cla = ClusterLoadAssignment {
            cluster_name: name.to_owned(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints,
                ..Default::default()
            }],
            ..Default::default()
        };
        pbwkt::Any {
            type_url: type_url::ENDPOINT.to_owned(),
            value: cla.encode_to_vec(),
        }
    }

    #[test]
    fn only_plain_clusters_whose_addresses_moved_are_reported() {
        assert!(is_plain_cluster("outbound|8080||svc-0.load.svc.cluster.local"));
        assert!(!is_plain_cluster("outbound|8080|v1|svc-0.load.svc.cluster.local"));
        assert!(!is_plain_cluster("inbound|8080||"));
        let mut m = MovedEndpoints::default();
        let a = cla("outbound|8080||a", &["10.0.0.1", "10.0.0.2"]);
        let b = cla("outbound|8080||b", &["10.0.1.1"]);
        let subset = cla("outbound|8080|v1|a", &["10.0.0.1"]);
        assert_eq!(m.update([&a, &b, &subset].into_iter()).len(), 2);
        assert!(m.update([&a, &b].into_iter()).is_empty());
        let moved = cla("outbound|8080||a", &["10.9.0.1", "10.9.0.2"]);
        assert_eq!(
            m.update([&moved, &b].into_iter()),
            vec![vec!["10.9.0.1".to_owned(), "10.9.0.2".to_owned()]]
        );
    }
}
