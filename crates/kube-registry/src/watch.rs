//! Watching the API server, as Istio's informers: a list + watch per kind (the shared
//! [`informer`](crate::informer): resourceVersion, bookmarks, re-list on 410 Gone, re-watch with
//! backoff, each object decoded on its own), each change applied to the registry and its diff
//! sent on; objects that do not decode are the registry's problems (named, counted, listed).

use std::fmt::Debug;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Api, Client, Resource};
use registry::RegistryDiff;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

use kclient::informer::{Watched, watched};
use kclient::{Change, WatchMetrics};

use crate::problems::Source;
use crate::{KubeEvent, KubeRegistry};

/// The kinds watched.
pub const KINDS: &[&str] = &["Service", "EndpointSlice", "Pod", "Node", "Namespace"];

/// The watchers of one cluster's kinds: they run until this is dropped (a remote cluster whose
/// secret is rotated or deleted stops its watchers so).
pub struct Watchers {
    /// The kinds whose initial list is in (all of [`KINDS`] when the cluster is synced).
    pub synced: watch::Receiver<std::collections::BTreeSet<&'static str>>,
    tasks: Vec<tokio::task::AbortHandle>,
}

impl Watchers {
    /// Whether every kind's initial list is in.
    pub fn is_synced(&self) -> bool {
        self.synced.borrow().len() == KINDS.len()
    }
}

impl Drop for Watchers {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Starts one watcher per kind. Diffs go to `diffs`; see [`Watchers`] for when they are in and
/// how they stop.
pub fn watch_all(
    client: Client,
    registry: Arc<KubeRegistry>,
    diffs: mpsc::UnboundedSender<RegistryDiff>,
    metrics: WatchMetrics,
) -> Watchers {
    let (synced_tx, synced) = watch::channel(std::collections::BTreeSet::new());
    let s = Sink {
        registry,
        diffs,
        synced: Arc::new(synced_tx),
        metrics,
    };
    let tasks = vec![
        spawn::<KubeService>(
            Api::all(client.clone()),
            ("Service", "Services"),
            KubeEvent::Service,
            s.clone(),
        ),
        spawn::<EndpointSlice>(
            Api::all(client.clone()),
            ("EndpointSlice", "EndpointSlice"),
            KubeEvent::EndpointSlice,
            s.clone(),
        ),
        spawn::<Pod>(Api::all(client.clone()), ("Pod", "Pods"), KubeEvent::Pod, s.clone()),
        spawn::<Node>(Api::all(client.clone()), ("Node", "Nodes"), KubeEvent::Node, s.clone()),
        spawn::<Namespace>(Api::all(client), ("Namespace", "Namespaces"), KubeEvent::Namespace, s),
    ];
    Watchers { synced, tasks }
}

/// Where every watcher's changes go.
#[derive(Clone)]
struct Sink {
    registry: Arc<KubeRegistry>,
    diffs: mpsc::UnboundedSender<RegistryDiff>,
    synced: Arc<watch::Sender<std::collections::BTreeSet<&'static str>>>,
    metrics: WatchMetrics,
}

/// `(kind, metric type label)`.
fn spawn<K>(
    api: Api<K>,
    (kind, label): (&'static str, &'static str),
    wrap: fn(Change<K>) -> KubeEvent,
    sink: Sink,
) -> tokio::task::AbortHandle
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    tokio::spawn(async move {
        let stream = watched(api, kind, sink.metrics.clone());
        futures::pin_mut!(stream);
        let mut first = true;
        // What this watcher has seen, to tell an add from an update.
        let mut known = std::collections::HashSet::new();
        let id = |o: &K| (o.meta().namespace.clone(), o.meta().name.clone());
        // Objects of the list being read that do not decode.
        let mut undecodable = Vec::new();
        let problems = sink.registry.problems();
        while let Some(w) = stream.next().await {
            let change = match w {
                Watched::Undecodable(u) => {
                    let defect = vec![("undecodable", format!("does not decode as a {kind}: {}", u.reason))];
                    if u.listed {
                        undecodable.push((u.namespace, u.name, defect));
                    } else {
                        // In a watch: the last good version stays in effect.
                        problems.set(kind, &u.namespace, &u.name, Source::Decode, defect);
                    }
                    continue;
                }
                Watched::Change(c) => c,
            };
            match &change {
                Change::Replace(listed) => {
                    let n = listed.len();
                    if first {
                        tracing::info!(kind, objects = n, "Kubernetes: initial list synced");
                    } else {
                        tracing::info!(kind, objects = n, "Kubernetes: re-listed");
                    }
                    problems.replace(kind, Source::Decode, std::mem::take(&mut undecodable));
                    let now: std::collections::HashSet<_> = listed.iter().map(id).collect();
                    sink.metrics.count(label, "add", now.difference(&known).count() as u64);
                    sink.metrics
                        .count(label, "delete", known.difference(&now).count() as u64);
                    known = now;
                }
                Change::Apply(o) => {
                    let (ns, name) = id(o);
                    problems.set(
                        kind,
                        &ns.unwrap_or_default(),
                        &name.unwrap_or_default(),
                        Source::Decode,
                        Vec::new(),
                    );
                    let event = if known.insert(id(o)) { "add" } else { "update" };
                    sink.metrics.count(label, event, 1);
                }
                Change::Delete(o) => {
                    let (ns, name) = id(o);
                    problems.set(
                        kind,
                        &ns.unwrap_or_default(),
                        &name.unwrap_or_default(),
                        Source::Decode,
                        Vec::new(),
                    );
                    known.remove(&id(o));
                    sink.metrics.count(label, "delete", 1);
                }
            }
            let initial = matches!(change, Change::Replace(_)) && first;
            let diff = sink.registry.apply(vec![wrap(change)]);
            if !diff.is_empty() && sink.diffs.send(diff).is_err() {
                return;
            }
            if initial {
                first = false;
                sink.synced.send_modify(|s| {
                    s.insert(kind);
                });
            }
        }
    })
    .abort_handle()
}
