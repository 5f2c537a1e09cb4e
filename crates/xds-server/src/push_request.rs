//! `PushRequest`: what changed and why, merged by the debouncer and by each connection's pending
//! push slot, as Istio's `model.PushRequest` and its `Merge`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use model::ConfigKey;

/// Trigger reasons, Istio's `model.TriggerReason` values (the `type` label of
/// `pilot_push_triggers`).
pub mod reason {
    /// An endpoint of a service changed (EDS-only when nothing else did).
    pub const ENDPOINT: &str = "endpoint";
    /// An Istio config resource changed.
    pub const CONFIG: &str = "config";
    /// A service was added, changed or removed.
    pub const SERVICE: &str = "service";
    /// Something about a proxy changed (labels, workload).
    pub const PROXY: &str = "proxy";
    /// Everything must be recomputed (start, mesh config).
    pub const GLOBAL: &str = "global";
    /// Pushed on a proxy's own request.
    pub const PROXY_REQUEST: &str = "proxyrequest";
    /// Pushed from the debug interface.
    pub const DEBUG: &str = "debug";
    pub const SECRET: &str = "secret";
    pub const NETWORKS: &str = "networks";
    pub const NAMESPACE: &str = "namespace";
    pub const UNKNOWN: &str = "unknown";
}

/// A request to push. `full: false` means only endpoints changed: only EDS is pushed.
#[derive(Debug, Clone, PartialEq)]
pub struct PushRequest {
    /// Push every type (true) or EDS only (false).
    pub full: bool,
    /// The config that changed. Empty on a full push means "everything may have changed".
    pub configs_updated: BTreeSet<ConfigKey>,
    /// Trigger reason -> count of events merged into this request.
    pub reason: BTreeMap<String, u32>,
    /// When the first event merged into this request happened (for convergence time).
    pub start: Instant,
}

impl PushRequest {
    /// A full push for every proxy, e.g. at start.
    pub fn full(reason: &str) -> PushRequest {
        PushRequest {
            full: true,
            configs_updated: BTreeSet::new(),
            reason: BTreeMap::from([(reason.to_owned(), 1)]),
            start: Instant::now(),
        }
    }

    /// A full push caused by these config changes.
    pub fn config_update(configs: impl IntoIterator<Item = ConfigKey>) -> PushRequest {
        PushRequest {
            configs_updated: configs.into_iter().collect(),
            ..PushRequest::full(reason::CONFIG)
        }
    }

    /// An EDS-only push for endpoints of the services named by `configs`.
    pub fn endpoints(configs: impl IntoIterator<Item = ConfigKey>) -> PushRequest {
        PushRequest {
            full: false,
            configs_updated: configs.into_iter().collect(),
            ..PushRequest::full(reason::ENDPOINT)
        }
    }

    /// Merges `other` into a request that covers both, as Istio's `PushRequest.Merge`: full if
    /// either is, the earliest start, reasons added up, and the union of changed configs unless
    /// either side's set is empty (which means "all", so the merge is "all" too).
    pub fn merge(&self, other: &PushRequest) -> PushRequest {
        let configs_updated = if self.configs_updated.is_empty() || other.configs_updated.is_empty() {
            BTreeSet::new()
        } else {
            self.configs_updated.union(&other.configs_updated).cloned().collect()
        };
        let mut reason = self.reason.clone();
        for (r, n) in &other.reason {
            *reason.entry(r.clone()).or_default() += n;
        }
        PushRequest {
            full: self.full || other.full,
            configs_updated,
            reason,
            start: self.start.min(other.start),
        }
    }

    /// Reasons as a short string for logs, e.g. `config:2 endpoint:1`.
    pub fn reason_string(&self) -> String {
        self.reason
            .iter()
            .map(|(r, n)| format!("{r}:{n}"))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::ConfigKind;
    use std::time::Duration;

    fn key(name: &str) -> ConfigKey {
        ConfigKey {
            kind: ConfigKind::ServiceEntry,
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    #[test]
    fn merge_is_full_if_either_is_and_keeps_earliest_start() {
        let eds = PushRequest::endpoints([key("a")]);
        let mut cfg = PushRequest::config_update([key("b")]);
        cfg.start = eds.start + Duration::from_secs(1);
        let m = eds.merge(&cfg);
        assert!(m.full);
        assert_eq!(m.start, eds.start);
        assert_eq!(m.configs_updated, BTreeSet::from([key("a"), key("b")]));
        assert_eq!(m.reason, BTreeMap::from([("config".into(), 1), ("endpoint".into(), 1)]));
        assert_eq!(cfg.merge(&eds).start, eds.start);
    }

    #[test]
    fn merge_with_empty_configs_means_all() {
        let all = PushRequest::full(reason::GLOBAL);
        let one = PushRequest::config_update([key("a")]);
        assert!(one.merge(&all).configs_updated.is_empty());
        assert!(all.merge(&one).configs_updated.is_empty());
    }

    #[test]
    fn endpoint_only_merges_stay_incremental() {
        let m = PushRequest::endpoints([key("a")]).merge(&PushRequest::endpoints([key("a")]));
        assert!(!m.full);
        assert_eq!(m.reason.get("endpoint"), Some(&2));
        assert_eq!(m.reason_string(), "endpoint:2");
    }
}
