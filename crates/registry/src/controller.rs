//! The ServiceEntry registry kept up to date change by change, as Istio's `serviceentry.Controller`:
//! it holds the ServiceEntries and WorkloadEntries it was given, by namespace, and a change
//! rebuilds only the namespaces of the changed objects. Namespaces are independent: a
//! ServiceEntry selects WorkloadEntries of its own namespace, and services and endpoints are keyed
//! by (hostname, namespace), so a namespace built alone is exactly its part of [`build`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use model::{Config, ConfigKey, ConfigKind, ConfigSpec, MeshConfig};

use crate::{RegistryDiff, RegistrySnapshot, build, diff};

/// Workloads of other registries in a namespace (Kubernetes: its ready Pods), shaped as the
/// WorkloadEntries a ServiceEntry's `workloadSelector` selects (Istio's `WorkloadInstance`s).
pub type WorkloadSource = Arc<dyn Fn(&str) -> Vec<Arc<Config>> + Send + Sync>;

/// The ServiceEntry registry's state.
pub struct ServiceEntryRegistry {
    mesh: Arc<MeshConfig>,
    /// Where Pods come from; asked only for namespaces with a ServiceEntry selecting workloads, so
    /// that no copy of every Pod is kept here.
    workloads: Option<WorkloadSource>,
    /// ServiceEntries and WorkloadEntries by namespace, then key.
    configs: BTreeMap<String, BTreeMap<ConfigKey, Arc<Config>>>,
    /// Services and endpoints built per namespace.
    namespaces: BTreeMap<String, RegistrySnapshot>,
    snapshot: Arc<RegistrySnapshot>,
}

impl std::fmt::Debug for ServiceEntryRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceEntryRegistry")
            .field("namespaces", &self.configs.len())
            .field("services", &self.snapshot.services.len())
            .field("workloads", &self.workloads.is_some())
            .finish()
    }
}

impl ServiceEntryRegistry {
    pub fn new(mesh: Arc<MeshConfig>) -> ServiceEntryRegistry {
        ServiceEntryRegistry {
            mesh,
            workloads: None,
            configs: BTreeMap::new(),
            namespaces: BTreeMap::new(),
            snapshot: Arc::default(),
        }
    }

    /// ServiceEntries select the workloads of `source` as well as WorkloadEntries.
    pub fn with_workloads(mut self, source: WorkloadSource) -> ServiceEntryRegistry {
        self.workloads = Some(source);
        self
    }

    /// Whether configs of this kind shape the registry.
    pub fn reads(kind: ConfigKind) -> bool {
        matches!(kind, ConfigKind::ServiceEntry | ConfigKind::WorkloadEntry)
    }

    /// The services and endpoints as of the last change.
    pub fn snapshot(&self) -> Arc<RegistrySnapshot> {
        self.snapshot.clone()
    }

    /// Applies changed configs, each with its current value (`None`: deleted); configs of other
    /// kinds are ignored. Rebuilds the namespaces they are in and returns what changed there.
    pub fn apply<'a>(
        &mut self,
        changes: impl IntoIterator<Item = (ConfigKey, Option<&'a Arc<Config>>)>,
    ) -> RegistryDiff {
        let changes = changes.into_iter().filter(|(key, _)| Self::reads(key.kind));
        let touched = self.store(changes);
        self.rebuild(touched)
    }

    /// Workloads of another registry may have changed in these namespaces (Istio's
    /// `WorkloadInstanceHandler`): the namespaces with a ServiceEntry selecting workloads are
    /// rebuilt; elsewhere a Pod changes nothing here.
    pub fn workloads_changed(&mut self, namespaces: &BTreeSet<String>) -> RegistryDiff {
        let touched = namespaces
            .iter()
            .filter(|ns| self.selects_workloads(ns))
            .cloned()
            .collect();
        self.rebuild(touched)
    }

    /// Whether a ServiceEntry of the namespace has a `workloadSelector`.
    fn selects_workloads(&self, namespace: &str) -> bool {
        self.configs.get(namespace).is_some_and(|configs| {
            configs.values().any(|c| match &c.spec {
                ConfigSpec::ServiceEntry(se) => se.workload_selector.is_some(),
                _ => false,
            })
        })
    }

    /// Stores configs; returns the namespaces they are in.
    fn store<'a>(&mut self, changes: impl Iterator<Item = (ConfigKey, Option<&'a Arc<Config>>)>) -> BTreeSet<String> {
        let mut touched = BTreeSet::new();
        for (key, config) in changes {
            touched.insert(key.namespace.clone());
            let namespace = self.configs.entry(key.namespace.clone()).or_default();
            match config {
                Some(c) => {
                    namespace.insert(key, c.clone());
                }
                None => {
                    namespace.remove(&key);
                }
            }
        }
        for ns in &touched {
            if self.configs.get(ns).is_some_and(BTreeMap::is_empty) {
                self.configs.remove(ns);
            }
        }
        touched
    }

    /// Rebuilds these namespaces; returns what changed there.
    fn rebuild(&mut self, touched: BTreeSet<String>) -> RegistryDiff {
        let mut out = RegistryDiff::default();
        for ns in touched {
            let mut configs: Vec<Arc<Config>> = self
                .configs
                .get(&ns)
                .map(|c| c.values().cloned().collect())
                .unwrap_or_default();
            if let Some(source) = self.workloads.as_ref().filter(|_| self.selects_workloads(&ns)) {
                configs.extend(source(&ns));
            }
            let new = build(&configs, &self.mesh);
            let old = self.namespaces.remove(&ns).unwrap_or_default();
            out.merge(diff(&old, &new));
            if !new.services.is_empty() || !new.endpoints.is_empty() {
                self.namespaces.insert(ns, new);
            }
        }
        if !out.is_empty() {
            self.snapshot = Arc::new(self.assemble());
        }
        out
    }

    /// The whole registry from the namespaces' parts: services sorted by (hostname, namespace).
    fn assemble(&self) -> RegistrySnapshot {
        let mut services: Vec<_> = self
            .namespaces
            .values()
            .flat_map(|n| n.services.iter().cloned())
            .collect();
        services.sort_by(|a, b| (&a.hostname, a.namespace()).cmp(&(&b.hostname, b.namespace())));
        let endpoints = self
            .namespaces
            .values()
            .flat_map(|n| n.endpoints.iter().map(|(k, e)| (k.clone(), e.clone())))
            .collect();
        RegistrySnapshot {
            services: Arc::new(services),
            endpoints,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{key, se, snapshot, we};
    use serde_json::json;

    fn static_se(ns: &str, name: &str, host: &str, addr: &str) -> Arc<Config> {
        se(
            ns,
            name,
            json!({"hosts": [host], "ports": [{"number": 80, "name": "http"}], "resolution": "STATIC",
                   "endpoints": [{"address": addr}]}),
        )
    }

    fn selecting_se(ns: &str, name: &str, host: &str, app: &str) -> Arc<Config> {
        se(
            ns,
            name,
            json!({"hosts": [host], "ports": [{"number": 80, "name": "http"}], "resolution": "STATIC",
                   "workloadSelector": {"labels": {"app": app}}}),
        )
    }

    fn add(configs: &[Arc<Config>]) -> impl Iterator<Item = (ConfigKey, Option<&Arc<Config>>)> {
        configs.iter().map(|c| (c.key(), Some(c)))
    }

    #[test]
    fn changes_applied_one_by_one_give_the_registry_built_from_all_configs() {
        let all = vec![
            static_se("a", "one", "one.example.com", "10.0.0.1"),
            static_se("b", "one", "one.example.com", "10.0.0.2"),
            selecting_se("b", "two", "two.example.com", "two"),
            we(
                "b",
                "vm",
                json!({}),
                json!({"address": "10.0.0.3", "labels": {"app": "two"}}),
            ),
            static_se("c", "dup", "z.example.com", "10.0.0.4"),
        ];
        let mut r = ServiceEntryRegistry::new(Arc::default());
        for c in &all {
            r.apply(add(std::slice::from_ref(c)));
        }
        assert_eq!(*r.snapshot(), snapshot(&all));

        // Deleting the WorkloadEntry empties two.example.com's endpoints: EDS only, namespace b only.
        let vm = all[3].key();
        let d = r.apply([(vm, None)]);
        assert!(!d.needs_full_push());
        assert_eq!(d.endpoints_changed, BTreeSet::from([key("two.example.com", "b")]));
        let mut left = all.clone();
        left.remove(3);
        assert_eq!(*r.snapshot(), snapshot(&left));

        // Deleting the last config of a namespace removes its services.
        let d = r.apply([(all[4].key(), None)]);
        assert!(d.needs_full_push());
        assert_eq!(d.services_changed, BTreeSet::from([key("z.example.com", "c")]));
        left.remove(3);
        assert_eq!(*r.snapshot(), snapshot(&left));
        assert!(!r.configs.contains_key("c") && !r.namespaces.contains_key("c"));
    }

    #[test]
    fn other_kinds_and_unchanged_configs_change_nothing() {
        let mut r = ServiceEntryRegistry::new(Arc::default());
        let one = [static_se("a", "one", "one.example.com", "10.0.0.1")];
        r.apply(add(&one));
        let before = r.snapshot();
        let vs = ConfigKey {
            kind: ConfigKind::VirtualService,
            namespace: "a".into(),
            name: "x".into(),
        };
        assert!(r.apply([(vs, None)]).is_empty());
        // The same ServiceEntry again: no diff, and the snapshot is the same one.
        let again = [static_se("a", "one", "one.example.com", "10.0.0.1")];
        assert!(r.apply(add(&again)).is_empty());
        assert!(Arc::ptr_eq(&before, &r.snapshot()));
    }
}
