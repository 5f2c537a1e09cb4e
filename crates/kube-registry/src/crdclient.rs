//! Istio config from the Kubernetes API server, as Istio's `crdclient`: a watcher per Istio kind
//! pilot-discovery serves (networking.istio.io VirtualService, DestinationRule, Gateway,
//! ServiceEntry, WorkloadEntry, Sidecar), on the first version the API server serves (v1, else
//! v1beta1, else v1alpha3). Each object goes through the same parsing and validation as files: an
//! invalid one is dropped with an error naming it (log, `/debug/configz`, counted), an invalid
//! update keeps the last valid version. A CRD that is not installed is reported once and skipped.
//!
//! It hands out what the file source does: the initial configs, a channel of `ConfigChange`s, and
//! a `StoreSnapshot` for `/debug/configz`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use config_sources::{ConfigChange, ConfigEvent, Level, SourceErrorEntry, StoreSnapshot};
use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client};
use model::{Config, ConfigKey, ConfigKind};
use tokio::sync::{mpsc, watch};

use crate::watch::WatchMetrics;

/// The Istio kinds read from the API server: `(kind, plural)`.
pub const ISTIO_KINDS: &[(ConfigKind, &str)] = &[
    (ConfigKind::VirtualService, "virtualservices"),
    (ConfigKind::DestinationRule, "destinationrules"),
    (ConfigKind::Gateway, "gateways"),
    (ConfigKind::ServiceEntry, "serviceentries"),
    (ConfigKind::WorkloadEntry, "workloadentries"),
    (ConfigKind::Sidecar, "sidecars"),
];

const GROUP: &str = "networking.istio.io";
const VERSIONS: &[&str] = &["v1", "v1beta1", "v1alpha3"];

/// The config source: as `config_sources::ConfigDirWatch`.
pub struct KubeConfigSource {
    /// Everything the initial lists held, as one change.
    pub initial: ConfigChange,
    pub changes: mpsc::UnboundedReceiver<ConfigChange>,
    pub state: watch::Receiver<StoreSnapshot>,
}

#[derive(Default)]
struct State {
    configs: BTreeMap<ConfigKey, Arc<Config>>,
    /// Per object (`Kind namespace/name`), its current problem.
    errors: BTreeMap<String, SourceErrorEntry>,
    invalid_counts: BTreeMap<String, u64>,
    scans: u64,
}

impl State {
    fn snapshot(&self) -> StoreSnapshot {
        StoreSnapshot {
            configs: Arc::new(self.configs.clone()),
            origins: Arc::new(self.configs.keys().map(|k| (k.clone(), origin(k))).collect()),
            errors: Arc::new(self.errors.values().cloned().collect()),
            invalid_counts: Arc::new(self.invalid_counts.clone()),
            scans: self.scans,
        }
    }
}

/// Where a config came from, as `/debug/configz` shows it.
fn origin(k: &ConfigKey) -> PathBuf {
    PathBuf::from(format!("kubernetes://{}/{}/{}", k.kind, k.namespace, k.name))
}

/// Finds the served version of each kind, lists them all, and then follows them.
pub async fn start(client: Client, metrics: WatchMetrics) -> KubeConfigSource {
    let state = Arc::new(Mutex::new(State::default()));
    let (state_tx, state_rx) = watch::channel(StoreSnapshot::default());
    let state_tx = Arc::new(state_tx);
    let (tx, changes) = mpsc::unbounded_channel();
    let mut initial = ConfigChange::default();
    for &(kind, plural) in ISTIO_KINDS {
        let Some(api) = served(&client, kind, plural).await else {
            tracing::warn!(
                kind = kind.as_str(),
                group = GROUP,
                "CRD not installed: {kind} is not read from the API server"
            );
            continue;
        };
        let (first_tx, first_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(follow(
            api,
            kind,
            state.clone(),
            state_tx.clone(),
            tx.clone(),
            metrics.clone(),
            first_tx,
        ));
        if let Ok(change) = first_rx.await {
            initial.events.extend(change.events);
        }
    }
    let snapshot = state.lock().unwrap_or_else(PoisonError::into_inner).snapshot();
    state_tx.send_replace(snapshot);
    KubeConfigSource {
        initial,
        changes,
        state: state_rx,
    }
}

/// The API of `kind` at the first version the server serves; `None` when no version is.
async fn served(client: &Client, kind: ConfigKind, plural: &str) -> Option<Api<DynamicObject>> {
    for v in VERSIONS {
        let gvk = GroupVersionKind::gvk(GROUP, v, kind.as_str());
        let ar = ApiResource::from_gvk_with_plural(&gvk, plural);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        match api.list(&ListParams::default().limit(1)).await {
            Ok(_) => return Some(api),
            Err(kube::Error::Api(e)) if e.code == 404 => continue,
            Err(e) => {
                tracing::warn!(
                    kind = kind.as_str(),
                    version = v,
                    "listing {kind}: {e}; trying the next version"
                );
                continue;
            }
        }
    }
    None
}

async fn follow(
    api: Api<DynamicObject>,
    kind: ConfigKind,
    state: Arc<Mutex<State>>,
    state_tx: Arc<watch::Sender<StoreSnapshot>>,
    tx: mpsc::UnboundedSender<ConfigChange>,
    metrics: WatchMetrics,
    first: tokio::sync::oneshot::Sender<ConfigChange>,
) {
    let mut first = Some(first);
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    let mut listed = Vec::new();
    while let Some(event) = stream.next().await {
        let change = {
            let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
            match event {
                Ok(Event::Init) => {
                    listed.clear();
                    continue;
                }
                Ok(Event::InitApply(o)) => {
                    listed.push(o);
                    continue;
                }
                Ok(Event::InitDone) => {
                    let objects = std::mem::take(&mut listed);
                    tracing::info!(
                        kind = kind.as_str(),
                        objects = objects.len(),
                        "Kubernetes: Istio config listed"
                    );
                    replace(&mut st, kind, objects, &metrics)
                }
                Ok(Event::Apply(o)) => apply(&mut st, kind, &o, &metrics),
                Ok(Event::Delete(o)) => delete(&mut st, kind, &o, &metrics),
                Err(e) => {
                    if let Some(suppressed) = monitoring::throttle::allow("kube_config_watch_error") {
                        tracing::warn!(
                            kind = kind.as_str(),
                            suppressed,
                            "Kubernetes: watch failed, retrying with backoff: {e}"
                        );
                    }
                    continue;
                }
            }
        };
        let snapshot = state.lock().unwrap_or_else(PoisonError::into_inner).snapshot();
        state_tx.send_replace(snapshot);
        if let Some(f) = first.take() {
            let _ = f.send(change);
            continue;
        }
        if !change.is_empty() && tx.send(change).is_err() {
            return;
        }
    }
}

fn name_of(kind: ConfigKind, o: &DynamicObject) -> String {
    format!(
        "{kind} {}/{}",
        o.metadata.namespace.as_deref().unwrap_or(""),
        o.metadata.name.as_deref().unwrap_or("")
    )
}

/// The object as a config, or the reason it is not one (recorded).
fn parse(st: &mut State, kind: ConfigKind, o: &DynamicObject) -> Option<Config> {
    let mut v = match serde_json::to_value(o) {
        Ok(v) => v,
        Err(e) => {
            record_error(st, kind, o, e.to_string());
            return None;
        }
    };
    if let Some(m) = v.as_object_mut() {
        m.entry("kind").or_insert_with(|| kind.as_str().into());
        m.entry("apiVersion").or_insert_with(|| format!("{GROUP}/v1").into());
    }
    match model::config::parse_config(v, "default") {
        Ok(c) => {
            st.errors.remove(&name_of(kind, o));
            Some(c)
        }
        Err(e) => {
            record_error(st, kind, o, e.to_string());
            None
        }
    }
}

fn record_error(st: &mut State, kind: ConfigKind, o: &DynamicObject, reason: String) {
    let name = name_of(kind, o);
    tracing::warn!(
        resource = name,
        "invalid Istio config from the API server dropped: {reason}"
    );
    *st.invalid_counts.entry(kind.as_str().to_owned()).or_default() += 1;
    st.errors.insert(
        name.clone(),
        SourceErrorEntry {
            file: PathBuf::from(format!("kubernetes://{name}")),
            resource: Some(name),
            reason,
            level: Level::Error,
        },
    );
}

fn apply(st: &mut State, kind: ConfigKind, o: &DynamicObject, m: &WatchMetrics) -> ConfigChange {
    let Some(c) = parse(st, kind, o) else {
        // An invalid update keeps the last valid version, as the file source does.
        return ConfigChange::default();
    };
    let c = Arc::new(c);
    let event = match st.configs.insert(c.key(), c.clone()) {
        Some(old) if old == c => return ConfigChange::default(),
        Some(old) => {
            m.count_config(kind.as_str(), "update");
            ConfigEvent::Updated { old, new: c }
        }
        None => {
            m.count_config(kind.as_str(), "add");
            ConfigEvent::Added(c)
        }
    };
    ConfigChange { events: vec![event] }
}

fn delete(st: &mut State, kind: ConfigKind, o: &DynamicObject, m: &WatchMetrics) -> ConfigChange {
    st.errors.remove(&name_of(kind, o));
    let key = ConfigKey {
        kind,
        namespace: o.metadata.namespace.clone().unwrap_or_default(),
        name: o.metadata.name.clone().unwrap_or_default(),
    };
    match st.configs.remove(&key) {
        Some(old) => {
            m.count_config(kind.as_str(), "delete");
            ConfigChange {
                events: vec![ConfigEvent::Deleted(old)],
            }
        }
        None => ConfigChange::default(),
    }
}

/// A (re-)list: the kind's configs become exactly the listed valid ones.
fn replace(st: &mut State, kind: ConfigKind, objects: Vec<DynamicObject>, m: &WatchMetrics) -> ConfigChange {
    st.scans += 1;
    st.errors.retain(|name, _| !name.starts_with(&format!("{kind} ")));
    let old: BTreeMap<ConfigKey, Arc<Config>> = st
        .configs
        .iter()
        .filter(|(k, _)| k.kind == kind)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut new = BTreeMap::new();
    for o in &objects {
        if let Some(c) = parse(st, kind, o) {
            new.insert(c.key(), Arc::new(c));
        }
    }
    let change = config_sources::diff(&old, &new);
    for e in &change.events {
        let event = match e {
            ConfigEvent::Added(_) => "add",
            ConfigEvent::Updated { .. } => "update",
            ConfigEvent::Deleted(_) => "delete",
        };
        m.count_config(kind.as_str(), event);
    }
    st.configs.retain(|k, _| k.kind != kind);
    st.configs.extend(new);
    change
}
