//! `ConfigEvent`s and `ConfigChange`: what changed between two snapshots of a config source,
//! computed by diffing them (unchanged configs give no event). Config sources produce them;
//! the environment and the registries built from Istio config (ServiceEntries) consume them.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::{Config, ConfigKey};

/// The configs of a source at one moment, shared read-only.
pub type ConfigSnapshot = Arc<BTreeMap<ConfigKey, Arc<Config>>>;

/// One config added, changed or removed.
#[derive(Debug, Clone, PartialEq)]
pub enum ConfigEvent {
    Added(Arc<Config>),
    Updated { old: Arc<Config>, new: Arc<Config> },
    Deleted(Arc<Config>),
}

impl ConfigEvent {
    pub fn key(&self) -> ConfigKey {
        match self {
            ConfigEvent::Added(c) | ConfigEvent::Deleted(c) | ConfigEvent::Updated { new: c, .. } => c.key(),
        }
    }

    /// The config as it is now; `None` for a deletion.
    pub fn current(&self) -> Option<&Arc<Config>> {
        match self {
            ConfigEvent::Added(c) | ConfigEvent::Updated { new: c, .. } => Some(c),
            ConfigEvent::Deleted(_) => None,
        }
    }
}

/// The events of one batch (one debounced burst of file changes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConfigChange {
    pub events: Vec<ConfigEvent>,
}

impl ConfigChange {
    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }
}

/// What turns `old` into `new`: additions and updates in key order, then deletions in key order.
/// A config equal in kind, metadata and spec gives no event.
pub fn diff(old: &BTreeMap<ConfigKey, Arc<Config>>, new: &BTreeMap<ConfigKey, Arc<Config>>) -> ConfigChange {
    let mut events = Vec::new();
    for (key, n) in new {
        match old.get(key) {
            None => events.push(ConfigEvent::Added(n.clone())),
            Some(o) if !Arc::ptr_eq(o, n) && o != n => {
                events.push(ConfigEvent::Updated {
                    old: o.clone(),
                    new: n.clone(),
                });
            }
            Some(_) => {}
        }
    }
    events.extend(
        old.iter()
            .filter(|(k, _)| !new.contains_key(*k))
            .map(|(_, o)| ConfigEvent::Deleted(o.clone())),
    );
    ConfigChange { events }
}

/// How bad a problem is: a warning leaves the config served (or skips something pilot does not
/// know); an error means a resource or a file's new contents were rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Warning,
    Error,
}

/// A problem as `/debug/config_errors` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SourceErrorEntry {
    pub file: std::path::PathBuf,
    /// `Kind namespace/name` when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    pub reason: String,
    pub level: Level,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::parse_config;

    fn config(name: &str, host: &str) -> Arc<Config> {
        let doc = serde_json::json!({
            "apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": name}, "spec": {"hosts": [host]},
        });
        Arc::new(parse_config(doc, "default").unwrap())
    }

    fn map(configs: &[Arc<Config>]) -> BTreeMap<ConfigKey, Arc<Config>> {
        configs.iter().map(|c| (c.key(), c.clone())).collect()
    }

    #[test]
    fn diff_reports_added_updated_deleted_and_skips_equal() {
        let old = map(&[config("a", "a.com"), config("b", "b.com"), config("c", "c.com")]);
        // `b` is a fresh but equal copy: no event.
        let new = map(&[config("b", "b.com"), config("c", "c2.com"), config("d", "d.com")]);
        let change = diff(&old, &new);
        let summary: Vec<_> = change
            .events
            .iter()
            .map(|e| match e {
                ConfigEvent::Added(c) => format!("+{}", c.meta.name),
                ConfigEvent::Updated { old, new } => format!("~{}:{}", old.meta.name, new.meta.name),
                ConfigEvent::Deleted(c) => format!("-{}", c.meta.name),
            })
            .collect();
        assert_eq!(summary, ["~c:c", "+d", "-a"]);
        assert_eq!(change.events[0].current().unwrap().key().name, "c");
        assert!(change.events[2].current().is_none());
        assert!(diff(&new, &new).is_empty());
    }
}
