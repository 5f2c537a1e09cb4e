//! `PushRequest`: what changed and why, as Istio's `model.PushRequest` and `TriggerReason`
//! (`pilot/pkg/model/push_request.go`). Made by the environment for each change, merged by the
//! debouncer and by each connection's pending slot, read by the push filters.
//!
//! Unlike Istio's `ConfigsUpdated` (a set in which an empty set means "everything" and services
//! travel as ServiceEntry keys named by hostname), the change set here says what it means:
//! [`ConfigsUpdated::All`], or the configs and the services that changed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Instant;

use crate::service::ServiceKey;
use crate::{ConfigKey, ConfigKind};

/// Why a push happens, Istio's `TriggerReason` (the `type` label of `pilot_push_triggers`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TriggerReason {
    /// An endpoint of a service changed (EDS-only when nothing else did).
    EndpointUpdate,
    /// An Istio config resource changed.
    ConfigUpdate,
    /// A service was added, changed or removed.
    ServiceUpdate,
    /// Something about a proxy changed (labels, workload).
    ProxyUpdate,
    /// Everything must be recomputed (start, mesh config).
    GlobalUpdate,
    /// Pushed on a proxy's own request.
    ProxyRequest,
    /// Pushed from the debug interface.
    DebugTrigger,
    SecretTrigger,
    NetworksTrigger,
    NamespaceUpdate,
    UnknownTrigger,
}

impl TriggerReason {
    /// The label value, as Istio's.
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerReason::EndpointUpdate => "endpoint",
            TriggerReason::ConfigUpdate => "config",
            TriggerReason::ServiceUpdate => "service",
            TriggerReason::ProxyUpdate => "proxy",
            TriggerReason::GlobalUpdate => "global",
            TriggerReason::ProxyRequest => "proxyrequest",
            TriggerReason::DebugTrigger => "debug",
            TriggerReason::SecretTrigger => "secret",
            TriggerReason::NetworksTrigger => "networks",
            TriggerReason::NamespaceUpdate => "namespace",
            TriggerReason::UnknownTrigger => "unknown",
        }
    }
}

impl fmt::Display for TriggerReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One thing that changed.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Changed {
    /// An Istio config resource: VirtualService, DestinationRule, Gateway, Sidecar, ...
    Config(ConfigKey),
    /// A service of a registry: its definition (ports, addresses, resolution, ...) or its
    /// endpoints. ServiceEntries and WorkloadEntries reach pushes this way, as the services
    /// they change.
    Service(ServiceKey),
}

impl Changed {
    /// The kind the push filters read: a service counts as a ServiceEntry, as in Istio.
    pub fn kind(&self) -> ConfigKind {
        match self {
            Changed::Config(k) => k.kind,
            Changed::Service(_) => ConfigKind::ServiceEntry,
        }
    }
}

impl fmt::Display for Changed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Changed::Config(k) => k.fmt(f),
            Changed::Service(k) => write!(f, "service {k}"),
        }
    }
}

/// What a push covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigsUpdated {
    /// Anything may have changed (start, mesh config, a debug push).
    All,
    /// Only these.
    Only(BTreeSet<Changed>),
}

impl ConfigsUpdated {
    /// Both changes: `All` if either is.
    pub fn merge(&self, other: &ConfigsUpdated) -> ConfigsUpdated {
        match (self, other) {
            (ConfigsUpdated::Only(a), ConfigsUpdated::Only(b)) => ConfigsUpdated::Only(a.union(b).cloned().collect()),
            _ => ConfigsUpdated::All,
        }
    }

    pub fn is_all(&self) -> bool {
        matches!(self, ConfigsUpdated::All)
    }

    /// The changes listed; none for `All`.
    pub fn changes(&self) -> impl Iterator<Item = &Changed> {
        match self {
            ConfigsUpdated::All => None,
            ConfigsUpdated::Only(set) => Some(set.iter()),
        }
        .into_iter()
        .flatten()
    }

    /// The services listed; none for `All`.
    pub fn services(&self) -> impl Iterator<Item = &ServiceKey> {
        self.changes().filter_map(|c| match c {
            Changed::Service(k) => Some(k),
            Changed::Config(_) => None,
        })
    }

    /// How many changes are listed (`None` for `All`), for the push status.
    pub fn count(&self) -> Option<usize> {
        match self {
            ConfigsUpdated::All => None,
            ConfigsUpdated::Only(set) => Some(set.len()),
        }
    }
}

/// Trigger reason -> number of events merged into a request.
pub type ReasonStats = BTreeMap<TriggerReason, u32>;

/// A request to push. `full: false` means only endpoints changed: only EDS is pushed.
#[derive(Debug, Clone, PartialEq)]
pub struct PushRequest {
    /// Push every type the change can affect (true) or EDS only (false).
    pub full: bool,
    pub configs_updated: ConfigsUpdated,
    pub reason: ReasonStats,
    /// When the first event merged into this request happened (for convergence time).
    pub start: Instant,
}

impl PushRequest {
    /// A full push of everything to every proxy, e.g. at start.
    pub fn full(reason: TriggerReason) -> PushRequest {
        PushRequest {
            full: true,
            configs_updated: ConfigsUpdated::All,
            reason: ReasonStats::from([(reason, 1)]),
            start: Instant::now(),
        }
    }

    /// A full push for these changes.
    pub fn changed(reason: TriggerReason, changes: impl IntoIterator<Item = Changed>) -> PushRequest {
        PushRequest {
            configs_updated: ConfigsUpdated::Only(changes.into_iter().collect()),
            ..PushRequest::full(reason)
        }
    }

    /// A full push for these config changes.
    pub fn configs(keys: impl IntoIterator<Item = ConfigKey>) -> PushRequest {
        PushRequest::changed(TriggerReason::ConfigUpdate, keys.into_iter().map(Changed::Config))
    }

    /// An EDS-only push for the endpoints of these services.
    pub fn endpoints(services: impl IntoIterator<Item = ServiceKey>) -> PushRequest {
        PushRequest {
            full: false,
            ..PushRequest::changed(
                TriggerReason::EndpointUpdate,
                services.into_iter().map(Changed::Service),
            )
        }
    }

    /// An EDS-only push for the endpoints of every service.
    pub fn all_endpoints() -> PushRequest {
        PushRequest {
            full: false,
            ..PushRequest::full(TriggerReason::EndpointUpdate)
        }
    }

    /// Merges `other` into a request that covers both, as Istio's `PushRequest.Merge`: full if
    /// either is, the earliest start, reasons added up, changes joined.
    pub fn merge(&self, other: &PushRequest) -> PushRequest {
        let mut reason = self.reason.clone();
        for (r, n) in &other.reason {
            *reason.entry(*r).or_default() += n;
        }
        PushRequest {
            full: self.full || other.full,
            configs_updated: self.configs_updated.merge(&other.configs_updated),
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
    use std::time::Duration;

    fn vs(name: &str) -> ConfigKey {
        ConfigKey {
            kind: ConfigKind::VirtualService,
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn svc(host: &str) -> ServiceKey {
        ServiceKey::new(host, "ns")
    }

    #[test]
    fn merge_is_full_if_either_is_and_keeps_earliest_start() {
        let eds = PushRequest::endpoints([svc("a")]);
        let mut cfg = PushRequest::configs([vs("b")]);
        cfg.start = eds.start + Duration::from_secs(1);
        let m = eds.merge(&cfg);
        assert!(m.full);
        assert_eq!(m.start, eds.start);
        assert_eq!(
            m.configs_updated,
            ConfigsUpdated::Only(BTreeSet::from([Changed::Config(vs("b")), Changed::Service(svc("a"))]))
        );
        assert_eq!(
            m.reason,
            ReasonStats::from([(TriggerReason::ConfigUpdate, 1), (TriggerReason::EndpointUpdate, 1)])
        );
        assert_eq!(cfg.merge(&eds).start, eds.start);
    }

    #[test]
    fn merge_with_all_is_all() {
        let all = PushRequest::full(TriggerReason::GlobalUpdate);
        let one = PushRequest::configs([vs("a")]);
        assert!(one.merge(&all).configs_updated.is_all());
        assert!(all.merge(&one).configs_updated.is_all());
        assert_eq!(all.configs_updated.changes().count(), 0);
        assert_eq!(all.configs_updated.count(), None);
    }

    #[test]
    fn endpoint_only_merges_stay_incremental() {
        let m = PushRequest::endpoints([svc("a")]).merge(&PushRequest::endpoints([svc("a")]));
        assert!(!m.full);
        assert_eq!(m.reason.get(&TriggerReason::EndpointUpdate), Some(&2));
        assert_eq!(m.reason_string(), "endpoint:2");
        assert_eq!(m.configs_updated.services().collect::<Vec<_>>(), vec![&svc("a")]);
        assert!(!PushRequest::all_endpoints().full);
        assert!(PushRequest::all_endpoints().configs_updated.is_all());
    }

    #[test]
    fn a_service_counts_as_a_service_entry_for_the_push_filters() {
        assert_eq!(Changed::Service(svc("a")).kind(), ConfigKind::ServiceEntry);
        assert_eq!(Changed::Config(vs("a")).kind(), ConfigKind::VirtualService);
        assert_eq!(Changed::Service(svc("a")).to_string(), "service ns/a");
    }
}
