//! Watching the API server, as Istio's informers: a list + watch per kind (the shared
//! [`informer`](crate::informer): resourceVersion, bookmarks, re-list on 410 Gone, re-watch with
//! backoff, each object decoded on its own), each change applied to the registry and its diff
//! sent on; objects that do not decode are the registry's problems (named, counted, listed).

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service as KubeService};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::{Api, Client, Resource};
use registry::RegistryDiff;
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};

use crate::informer::{Watched, watched};
use crate::problems::{ObjectErrorLabels, Source};
use crate::{Change, KubeEvent, KubeRegistry};

/// Labels of `pilot_k8s_watch_errors`: the kind and what failed (`list_failed`, `watch_failed`,
/// `line_too_long`, `not_json`, `error_event`, `page_too_large`, `unknown_event`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct WatchErrorLabels {
    pub r#type: String,
    pub reason: String,
}

/// Labels of `pilot_k8s_reg_events`, as Istio's: the kind (`Services`, `EndpointSlice`, `Pods`,
/// `Nodes`, `Namespaces`) and the event (`add`, `update`, `delete`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
pub struct EventLabels {
    pub r#type: String,
    pub event: String,
}

type Counters<L> = prometheus_client::metrics::family::Family<L, prometheus_client::metrics::counter::Counter>;

/// Istio's `pilot_k8s_reg_events` (registry events by kind and event) and `pilot_k8s_cfg_events`
/// (Istio config events from the API server); pilot-discovery's own `pilot_k8s_watch_errors`
/// (lists and watches that failed, by kind and why) and `pilot_k8s_object_errors` (registry
/// objects that do not decode or convert whole, by kind and why). Istio config that does not
/// decode is invalid config: `pilot_config_invalid` and `galley_validation_failed`, as from files.
#[derive(Clone, Debug, Default)]
pub struct WatchMetrics {
    pub events: Counters<EventLabels>,
    pub config_events: Counters<EventLabels>,
    pub watch_errors: Counters<WatchErrorLabels>,
    pub object_errors: Counters<ObjectErrorLabels>,
}

impl WatchMetrics {
    pub fn register(registry: &mut prometheus_client::registry::Registry) -> WatchMetrics {
        let m = WatchMetrics::default();
        registry.register(
            "pilot_k8s_reg_events",
            "Events from the Kubernetes registry.",
            m.events.clone(),
        );
        registry.register(
            "pilot_k8s_cfg_events",
            "Events from the Kubernetes config source.",
            m.config_events.clone(),
        );
        registry.register(
            "pilot_k8s_watch_errors",
            "Lists and watches of the Kubernetes API server that failed, by kind and reason.",
            m.watch_errors.clone(),
        );
        registry.register(
            "pilot_k8s_object_errors",
            "Kubernetes registry objects that do not decode or convert, by kind and reason.",
            m.object_errors.clone(),
        );
        m
    }

    pub(crate) fn watch_error(&self, kind: &str, reason: &str) {
        self.watch_errors
            .get_or_create(&WatchErrorLabels {
                r#type: kind.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub(crate) fn count_config(&self, kind: &str, event: &str) {
        self.config_events
            .get_or_create(&EventLabels {
                r#type: kind.to_owned(),
                event: event.to_owned(),
            })
            .inc();
    }

    fn count(&self, kind: &str, event: &str, n: u64) {
        if n > 0 {
            self.events
                .get_or_create(&EventLabels {
                    r#type: kind.to_owned(),
                    event: event.to_owned(),
                })
                .inc_by(n);
        }
    }
}

/// Where pilot-discovery finds its cluster, as the issue and Istio's flags say: `--kubeconfig`,
/// else `KUBECONFIG`, else the in-cluster service account. `None` when there is none of them.
pub async fn client_config(
    kubeconfig: &str,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Option<kube::Config>, Error> {
    // An explicit --kubeconfig must exist; KUBECONFIG's files are skipped when missing, as
    // client-go's loading rules do (istiod's Deployment sets KUBECONFIG to an optional Secret's
    // mount, /var/run/secrets/remote/config, and runs in-cluster without it).
    let path = if !kubeconfig.is_empty() {
        Some(kubeconfig.to_owned())
    } else {
        let listed = env("KUBECONFIG").unwrap_or_default();
        let existing = listed
            .split(':')
            .find(|p| !p.is_empty() && std::path::Path::new(p).exists())
            .map(str::to_owned);
        if existing.is_none() && !listed.is_empty() {
            tracing::info!(KUBECONFIG = %listed, "KUBECONFIG names no existing file: using the in-cluster config if any");
        }
        existing
    };
    if let Some(path) = path {
        // KUBECONFIG may list several files; the first existing one is the one read here.
        let first = path.split(':').next().unwrap_or(&path).to_owned();
        let kc = kube::config::Kubeconfig::read_from(&first).map_err(|e| Error::Config {
            from: first.clone(),
            reason: e.to_string(),
        })?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Config {
                from: first,
                reason: e.to_string(),
            })?;
        return Ok(Some(cfg));
    }
    if env("KUBERNETES_SERVICE_HOST").is_some() {
        let cfg = kube::Config::incluster().map_err(|e| Error::Config {
            from: "in-cluster service account".into(),
            reason: e.to_string(),
        })?;
        return Ok(Some(cfg));
    }
    Ok(None)
}

/// A reason the cluster cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes client config from {from}: {reason}")]
    Config { from: String, reason: String },
    #[error("Kubernetes API server {address}: {reason}")]
    Unreachable { address: String, reason: String },
}

/// A client for `cfg`, checked by asking the server its version (within `timeout`).
pub async fn connect(cfg: kube::Config, timeout: Duration) -> Result<Client, Error> {
    let address = cfg.cluster_url.to_string();
    let client = Client::try_from(cfg).map_err(|e| Error::Unreachable {
        address: address.clone(),
        reason: e.to_string(),
    })?;
    match tokio::time::timeout(timeout, client.apiserver_version()).await {
        Ok(Ok(_)) => Ok(client),
        Ok(Err(e)) => Err(Error::Unreachable {
            address,
            reason: e.to_string(),
        }),
        Err(_) => Err(Error::Unreachable {
            address,
            reason: format!("no answer within {timeout:?}"),
        }),
    }
}

/// The kinds watched.
pub const KINDS: &[&str] = &["Service", "EndpointSlice", "Pod", "Node", "Namespace"];

/// Starts one watcher per kind. Diffs go to `diffs`; `synced` holds the kinds whose initial list
/// is in (all of [`KINDS`] when start-up may go on).
pub fn watch_all(
    client: Client,
    registry: Arc<KubeRegistry>,
    diffs: mpsc::UnboundedSender<RegistryDiff>,
    metrics: WatchMetrics,
) -> watch::Receiver<std::collections::BTreeSet<&'static str>> {
    let (synced_tx, synced) = watch::channel(std::collections::BTreeSet::new());
    let s = Sink {
        registry,
        diffs,
        synced: Arc::new(synced_tx),
        metrics,
    };
    spawn::<KubeService>(
        Api::all(client.clone()),
        ("Service", "Services"),
        KubeEvent::Service,
        s.clone(),
    );
    spawn::<EndpointSlice>(
        Api::all(client.clone()),
        ("EndpointSlice", "EndpointSlice"),
        KubeEvent::EndpointSlice,
        s.clone(),
    );
    spawn::<Pod>(Api::all(client.clone()), ("Pod", "Pods"), KubeEvent::Pod, s.clone());
    spawn::<Node>(Api::all(client.clone()), ("Node", "Nodes"), KubeEvent::Node, s.clone());
    spawn::<Namespace>(Api::all(client), ("Namespace", "Namespaces"), KubeEvent::Namespace, s);
    synced
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
fn spawn<K>(api: Api<K>, (kind, label): (&'static str, &'static str), wrap: fn(Change<K>) -> KubeEvent, sink: Sink)
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
    });
}

#[cfg(test)]
mod client_config_tests {
    use super::client_config;

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: \"http://127.0.0.1:1\"}\n\
        contexts:\n- name: x\n  context: {cluster: c, user: u}\ncurrent-context: x\nusers:\n- name: u\n  user: {token: t}\n";

    #[tokio::test]
    async fn kubeconfig_files_as_client_go_loads_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("config");
        std::fs::write(&file, KUBECONFIG).unwrap();
        let missing = dir.path().join("absent").display().to_string();
        let no_env = |_: &str| None;
        // istiod's Deployment: KUBECONFIG names an optional Secret's mount that is absent, and
        // there is no in-cluster config here either: no cluster, not an error.
        let env = |k: &str| (k == "KUBECONFIG").then(|| missing.clone());
        assert!(client_config("", env).await.unwrap().is_none());
        // The first existing file of the list is read.
        let listed = format!("{missing}:{}", file.display());
        let env = |k: &str| (k == "KUBECONFIG").then(|| listed.clone());
        let cfg = client_config("", env).await.unwrap().unwrap();
        assert_eq!(cfg.cluster_url.to_string(), "http://127.0.0.1:1/");
        // An explicit --kubeconfig that is missing is an error naming it.
        let e = client_config(&missing, no_env).await.unwrap_err();
        assert!(e.to_string().contains(&missing), "{e}");
    }
}
