//! Istio config from the Kubernetes API server, as Istio's `crdclient`: a watcher per kind of
//! [`CONFIG_KINDS`] (every Istio CRD, Secrets, Ingress and IngressClass), on the first version the
//! API server serves. Each object goes through the same parsing and validation as files: an
//! invalid one is dropped with an error naming it (log, `/debug/config_errors`, counted), an
//! invalid update keeps the last valid version, and a kind not yet supported (EnvoyFilter,
//! Telemetry, ...) is kept and reported in `/debug/config_errors`, as `--configDir` does; so is
//! an object that does not even decode as a Kubernetes object (the shared
//! [`informer`](kclient::informer) names it; the kind's other objects are served). A CRD that is
//! not installed is reported once and skipped.
//!
//! It hands out what the file source does: the initial configs, a channel of `ConfigChange`s, and
//! a `StoreSnapshot` for `/debug/configz` and `/debug/config_errors`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Namespace;
use kclient::informer::{FetchError, MAX_PAGE, Undecodable, Watched, get_list, watched};
use kclient::{Change, WatchMetrics};
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use kube::{Api, Client};
use model::event::{ConfigChange, ConfigEvent, Level, SourceErrorEntry};
use model::{Config, ConfigKey, ConfigKind};
use tokio::sync::{mpsc, watch};

use crate::StoreSnapshot;
use crate::config_kinds::default_api_version;
pub use crate::config_kinds::{CONFIG_KINDS, ConfigResource};

/// The config source: as `crate::ConfigDirWatch`.
pub struct KubeConfigSource {
    /// Everything the initial lists held, as one change.
    pub initial: ConfigChange,
    pub changes: mpsc::UnboundedReceiver<ConfigChange>,
    pub state: watch::Receiver<StoreSnapshot>,
}

#[derive(Default)]
struct State {
    /// Every valid config read, selected by discoverySelectors or not.
    all: BTreeMap<ConfigKey, Arc<Config>>,
    /// What is served: `all` in the namespaces discoverySelectors select.
    configs: BTreeMap<ConfigKey, Arc<Config>>,
    /// meshConfig `discoverySelectors`, and the namespaces' labels they are matched against.
    selectors: Vec<model::mesh::LabelSelector>,
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// Per object (`Kind namespace/name`), its current problem.
    errors: BTreeMap<String, SourceErrorEntry>,
    /// During a re-list, the kind's problems before it: one found again is not reported again.
    relisting: BTreeMap<String, SourceErrorEntry>,
    invalid_counts: BTreeMap<String, u64>,
    scans: u64,
    /// Told the kind of each invalid object (pilot's metrics), as the file source tells it.
    invalid: Option<crate::InvalidObserver>,
}

impl State {
    /// Whether configs of `namespace` are served (cluster-scoped ones, without, always are).
    fn selected(&self, namespace: &str) -> bool {
        self.selectors.is_empty()
            || namespace.is_empty()
            || self
                .namespaces
                .get(namespace)
                .is_some_and(|labels| self.selectors.iter().any(|s| s.matches(labels)))
    }

    /// Re-derives what is served from `all` and returns the change, counted by kind and event.
    fn refilter(&mut self, m: &WatchMetrics) -> ConfigChange {
        let new: BTreeMap<ConfigKey, Arc<Config>> = self
            .all
            .iter()
            .filter(|(k, _)| self.selected(&k.namespace))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let change = crate::diff(&self.configs, &new);
        for e in &change.events {
            let event = match e {
                ConfigEvent::Added(_) => "add",
                ConfigEvent::Updated { .. } => "update",
                ConfigEvent::Deleted(_) => "delete",
            };
            m.count_config(e.key().kind.as_str(), event);
        }
        self.configs = new;
        change
    }

    fn snapshot(&self) -> StoreSnapshot {
        StoreSnapshot {
            configs: Arc::new(self.configs.clone()),
            origins: Arc::new(self.configs.keys().map(|k| (k.clone(), origin(k))).collect()),
            errors: Arc::new(self.errors.values().cloned().collect()),
            invalid_counts: Arc::new(self.invalid_counts.clone()),
            scans: self.scans,
            files_read: 0,
        }
    }
}

/// Where a config came from, as `/debug/config_errors` shows it.
fn origin(k: &ConfigKey) -> PathBuf {
    PathBuf::from(format!("kubernetes://{}/{}/{}", k.kind, k.namespace, k.name))
}

/// Finds the served version of each of `kinds` (usually [`CONFIG_KINDS`]), lists them all, and
/// then follows them. With `discovery_selectors`, only configs in the namespaces they select are
/// served, and namespace label changes take effect live.
pub async fn start(
    client: Client,
    kinds: Vec<ConfigResource>,
    metrics: WatchMetrics,
    discovery_selectors: Vec<model::mesh::LabelSelector>,
    invalid: Option<crate::InvalidObserver>,
) -> KubeConfigSource {
    let state = Arc::new(Mutex::new(State {
        selectors: discovery_selectors,
        invalid,
        ..State::default()
    }));
    let (state_tx, state_rx) = watch::channel(StoreSnapshot::default());
    let state_tx = Arc::new(state_tx);
    let (tx, changes) = mpsc::unbounded_channel();
    let mut initial = ConfigChange::default();
    if !state
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .selectors
        .is_empty()
    {
        let (first_tx, first_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(follow_namespaces(
            Api::all(client.clone()),
            state.clone(),
            state_tx.clone(),
            tx.clone(),
            metrics.clone(),
            first_tx,
        ));
        let _ = first_rx.await;
    }
    // Every kind at once: its served version, then its initial list.
    let lists = kinds.into_iter().map(|r| {
        let (client, state, state_tx, tx, metrics) = (
            client.clone(),
            state.clone(),
            state_tx.clone(),
            tx.clone(),
            metrics.clone(),
        );
        async move {
            let api = served(&client, &r).await?;
            let (first_tx, first_rx) = tokio::sync::oneshot::channel();
            tokio::spawn(follow(api, r.kind, state, state_tx, tx, metrics, first_tx));
            first_rx.await.ok()
        }
    });
    for change in futures::future::join_all(lists).await.into_iter().flatten() {
        initial.events.extend(change.events);
    }
    let snapshot = state.lock().unwrap_or_else(PoisonError::into_inner).snapshot();
    state_tx.send_replace(snapshot);
    KubeConfigSource {
        initial,
        changes,
        state: state_rx,
    }
}

/// The API of a kind at the first version the server serves; `None` (reported once) when no
/// version is: the CRD is not installed, or listing it failed (e.g. not allowed by the ClusterRole).
async fn served(client: &Client, r: &ConfigResource) -> Option<Api<DynamicObject>> {
    let kind = r.kind.as_str();
    let mut failed = None;
    for v in r.versions {
        let gvk = GroupVersionKind::gvk(r.group, v, kind);
        let ar = ApiResource::from_gvk_with_plural(&gvk, r.plural);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        // Whether the server lists the kind at this version; what it lists is not decoded here
        // (an object that does not decode is the informer's to report, once).
        let listed = get_list(client, api.resource_url(), &ListParams::default().limit(1), MAX_PAGE).await;
        match listed {
            Ok(_) => return Some(api),
            Err(FetchError::Status { code: 404, .. }) => continue,
            Err(e) => {
                let e = e.to_string();
                tracing::debug!(kind, version = v, "listing {kind}: {e}; trying the next version");
                failed = Some(e);
            }
        }
    }
    let group = if r.group.is_empty() { "core" } else { r.group };
    match failed {
        None => tracing::warn!(kind, group, "CRD not installed: {kind} is not read from the API server"),
        Some(e) => tracing::warn!(
            kind,
            group,
            "{kind} cannot be listed ({e}): not read from the API server (hint: does the ClusterRole \
             allow get, list and watch of {}.{group}?)",
            r.plural
        ),
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
    let stream = watched(api, kind.as_str(), metrics.clone());
    futures::pin_mut!(stream);
    // Objects of the list being read that do not decode, recorded with its `Replace`.
    let mut undecodable = Vec::new();
    while let Some(w) = stream.next().await {
        let step = step(
            &mut state.lock().unwrap_or_else(PoisonError::into_inner),
            kind,
            w,
            &mut undecodable,
            &metrics,
        );
        let change = match step {
            Step::Pending => continue,
            Step::Recorded(snapshot) => {
                state_tx.send_replace(snapshot);
                continue;
            }
            Step::Changed(change, snapshot) => {
                state_tx.send_replace(snapshot);
                change
            }
        };
        if let Some(f) = first.take() {
            let _ = f.send(change);
            continue;
        }
        if !change.is_empty() && tx.send(change).is_err() {
            return;
        }
    }
}

/// What one item of a kind's list+watch did to the config source.
enum Step {
    /// An undecodable item of a list, recorded with the list's `Replace`.
    Pending,
    /// An undecodable object of a watch, recorded (the last valid version stays in effect).
    Recorded(StoreSnapshot),
    /// A change of what is served (maybe empty), and the state after it.
    Changed(ConfigChange, StoreSnapshot),
}

/// One item of `kind`'s list+watch applied to the state; `undecodable` holds the list's
/// undecodable objects until its `Replace`.
fn step(
    st: &mut State,
    kind: ConfigKind,
    w: Watched<DynamicObject>,
    undecodable: &mut Vec<Undecodable>,
    metrics: &WatchMetrics,
) -> Step {
    let change = match w {
        Watched::Undecodable(u) if u.listed => {
            undecodable.push(u);
            return Step::Pending;
        }
        Watched::Undecodable(u) => {
            // In a watch: the last valid version stays in effect, as for an invalid one.
            record_undecodable(st, kind, &u);
            return Step::Recorded(st.snapshot());
        }
        Watched::Change(c) => c,
    };
    let change = match change {
        Change::Replace(objects) => {
            tracing::info!(
                kind = kind.as_str(),
                objects = objects.len(),
                undecodable = undecodable.len(),
                "Kubernetes: Istio config listed"
            );
            let change = replace(st, kind, objects, metrics);
            for u in undecodable.drain(..) {
                record_undecodable(st, kind, &u);
            }
            st.relisting.clear();
            change
        }
        Change::Apply(o) => apply(st, kind, &o, metrics),
        Change::Delete(o) => delete(st, kind, &o, metrics),
    };
    Step::Changed(change, st.snapshot())
}

/// The config source's state driven by hand, item by item, as a kind's list+watch drives it
/// (the `kube_object` fuzz target's way in): the same parsing, validation and error records.
#[derive(Default)]
pub struct ConfigReader {
    state: State,
    undecodable: Vec<Undecodable>,
    metrics: WatchMetrics,
}

impl ConfigReader {
    /// Applies one item of `kind`'s list+watch; the change of what is served, if any.
    pub fn read(&mut self, kind: ConfigKind, w: Watched<DynamicObject>) -> Option<ConfigChange> {
        match step(&mut self.state, kind, w, &mut self.undecodable, &self.metrics) {
            Step::Changed(change, _) => Some(change),
            Step::Pending | Step::Recorded(_) => None,
        }
    }

    /// What is served and the config errors, as `/debug/configz` and `/debug/config_errors`.
    pub fn snapshot(&self) -> StoreSnapshot {
        self.state.snapshot()
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
        m.entry("apiVersion")
            .or_insert_with(|| default_api_version(kind).into());
    }
    match model::config::parse_config(v, "default") {
        Ok(c) if c.kind != kind => {
            // The object says it is another kind: it is not served as that kind from this list
            // (its deletion or the other kind's re-list would not remove it).
            record_error(st, kind, o, format!("is a {}, not a {kind}: not served", c.kind));
            None
        }
        Ok(c) => {
            let name = name_of(kind, o);
            if c.kind.is_supported() {
                st.errors.remove(&name);
            } else {
                st.errors.insert(name, unsupported(&c));
            }
            Some(c)
        }
        Err(e) => {
            record_error(st, kind, o, e.to_string());
            None
        }
    }
}

/// A kind kept but not yet acted on, as the file source reports it (a warning).
fn unsupported(c: &Config) -> SourceErrorEntry {
    let key = c.key();
    SourceErrorEntry {
        file: origin(&key),
        resource: Some(key.to_string()),
        reason: format!("{key}: kind not yet supported: kept, but not acted on"),
        level: Level::Warning,
    }
}

fn record_error(st: &mut State, kind: ConfigKind, o: &DynamicObject, reason: String) {
    record(st, name_of(kind, o), kind, reason);
}

/// An object that does not decode as a Kubernetes object, recorded as an invalid config.
fn record_undecodable(st: &mut State, kind: ConfigKind, u: &Undecodable) {
    let name = if u.name.is_empty() {
        "(no readable name)"
    } else {
        &u.name
    };
    let name = format!("{kind} {}/{name}", u.namespace);
    let reason = format!("{name}: does not decode as a Kubernetes object: {}", u.reason);
    record(st, name, kind, reason);
}

fn record(st: &mut State, name: String, kind: ConfigKind, reason: String) {
    let known = |e: Option<&SourceErrorEntry>| e.is_some_and(|e| e.reason == reason);
    // Reported and counted once: a re-list that finds it again only keeps it listed.
    if !known(st.errors.get(&name)) && !known(st.relisting.get(&name)) {
        tracing::warn!(
            resource = name,
            "invalid Istio config from the API server dropped: {reason}"
        );
        *st.invalid_counts.entry(kind.as_str().to_owned()).or_default() += 1;
        if let Some(observer) = &st.invalid {
            observer(kind.as_str());
        }
    }
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
    // An invalid update keeps the last valid version, as the file source does.
    if let Some(c) = parse(st, kind, o) {
        st.all.insert(c.key(), Arc::new(c));
    }
    st.refilter(m)
}

fn delete(st: &mut State, kind: ConfigKind, o: &DynamicObject, m: &WatchMetrics) -> ConfigChange {
    st.errors.remove(&name_of(kind, o));
    st.all.remove(&ConfigKey {
        kind,
        namespace: o.metadata.namespace.clone().unwrap_or_default(),
        name: o.metadata.name.clone().unwrap_or_default(),
    });
    st.refilter(m)
}

/// A (re-)list: the kind's configs become exactly the listed valid ones.
fn replace(st: &mut State, kind: ConfigKind, objects: Vec<DynamicObject>, m: &WatchMetrics) -> ConfigChange {
    st.scans += 1;
    let prefix = format!("{kind} ");
    let (before, others) = std::mem::take(&mut st.errors)
        .into_iter()
        .partition(|(name, _)| name.starts_with(&prefix));
    st.errors = others;
    st.relisting = before;
    st.all.retain(|k, _| k.kind != kind);
    for o in &objects {
        if let Some(c) = parse(st, kind, o) {
            st.all.insert(c.key(), Arc::new(c));
        }
    }
    st.refilter(m)
}

/// Namespaces, for discoverySelectors: each change re-derives what is served.
async fn follow_namespaces(
    api: Api<Namespace>,
    state: Arc<Mutex<State>>,
    state_tx: Arc<watch::Sender<StoreSnapshot>>,
    tx: mpsc::UnboundedSender<ConfigChange>,
    metrics: WatchMetrics,
    first: tokio::sync::oneshot::Sender<()>,
) {
    let mut first = Some(first);
    let stream = watched(api, "Namespace", metrics.clone());
    futures::pin_mut!(stream);
    let labels = |n: &Namespace| n.metadata.labels.clone().unwrap_or_default();
    while let Some(w) = stream.next().await {
        let change = match w {
            Watched::Change(c) => c,
            Watched::Undecodable(u) => {
                // The registry's watcher of Namespaces (when Kubernetes is a registry) lists it
                // in /debug/config_errors; here it selects nothing.
                if let Some(suppressed) = monitoring::throttle::allow("kube_undecodable_namespace") {
                    tracing::warn!(
                        suppressed,
                        "Kubernetes: Namespace {} does not decode ({}): its labels select no config",
                        u.name,
                        u.reason
                    );
                }
                continue;
            }
        };
        let change = {
            let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
            match change {
                Change::Replace(listed) => {
                    st.namespaces = listed
                        .iter()
                        .map(|n| (n.metadata.name.clone().unwrap_or_default(), labels(n)))
                        .collect();
                }
                Change::Apply(n) => {
                    st.namespaces
                        .insert(n.metadata.name.clone().unwrap_or_default(), labels(&n));
                }
                Change::Delete(n) => {
                    st.namespaces.remove(n.metadata.name.as_deref().unwrap_or_default());
                }
            }
            st.refilter(&metrics)
        };
        if let Some(f) = first.take() {
            let _ = f.send(());
            continue;
        }
        let snapshot = state.lock().unwrap_or_else(PoisonError::into_inner).snapshot();
        state_tx.send_replace(snapshot);
        if !change.is_empty() && tx.send(change).is_err() {
            return;
        }
    }
}
