//! What every election of a replica shares: who it is, its revision, the timing and the
//! metrics (`leader_election_master_status`, Istio's; the corrupt records and the errors).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// How long a lock lasts without renewal (client-go's `LeaseDuration`, istiod's `ttl`), and so
/// how often it is renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct LeaseTiming {
    /// Whole seconds, at least 3.
    pub duration_secs: u64,
}

impl LeaseTiming {
    /// istiod's: `ttl` 30 s.
    pub const ISTIOD: LeaseTiming = LeaseTiming { duration_secs: 30 };
    pub const MIN_SECS: u64 = 3;

    /// istiod's `RetryPeriod`, ttl/4: how often the holder renews and candidates read the lock.
    pub fn retry_period(&self) -> Duration {
        Duration::from_secs(self.duration_secs) / 4
    }

    /// istiod's `RenewDeadline`, ttl/2: a holder that cannot renew for this long after its
    /// renewal was due steps down, before any other replica may take the lock.
    pub(super) fn renew_deadline(&self) -> Duration {
        Duration::from_secs(self.duration_secs) / 2
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct NameLabel {
    name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct FieldLabel {
    pub(super) election: String,
    pub(super) field: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct ReasonLabel {
    pub(super) election: String,
    pub(super) reason: String,
}

/// `leader_election_master_status{name}` (client-go's: 1 while this replica leads), the corrupt
/// record fields found and the election's errors.
#[derive(Clone, Debug, Default)]
pub struct LeaderMetrics {
    pub(super) status: Family<NameLabel, Gauge>,
    pub(super) invalid: Family<FieldLabel, Counter>,
    pub(super) errors: Family<ReasonLabel, Counter>,
}

impl LeaderMetrics {
    pub fn register(registry: &mut Registry) -> LeaderMetrics {
        let m = LeaderMetrics::default();
        registry.register(
            "leader_election_master_status",
            "1 while this replica holds the leader election lock `name`, else 0",
            m.status.clone(),
        );
        registry.register(
            "pilot_leader_election_record_invalid",
            "Corrupt fields found in a leader election record (taken as unset, replaced by the next write)",
            m.invalid.clone(),
        );
        registry.register(
            "pilot_leader_election_errors",
            "Leader election failures: reading, creating, updating or releasing the lock, a race lost (conflict), stepping down (renew_deadline, superseded)",
            m.errors.clone(),
        );
        m
    }

    pub(super) fn leading(&self, election: &str, leading: bool) {
        self.status
            .get_or_create(&NameLabel {
                name: election.to_owned(),
            })
            .set(i64::from(leading));
    }

    pub(super) fn error(&self, election: &str, reason: &str) {
        self.errors
            .get_or_create(&ReasonLabel {
                election: election.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }
}

/// What every election of this replica shares.
#[derive(Clone)]
pub struct Elections {
    pub client: kube::Client,
    /// istiod's namespace (`POD_NAMESPACE`), where the locks are.
    pub namespace: String,
    /// `POD_NAME`, else `unknown-<hostname>` (Istio's).
    pub identity: String,
    /// `REVISION`; empty is Istio's `default`.
    pub revision: String,
    pub timing: LeaseTiming,
    /// `ENABLE_LEADER_ELECTION`.
    pub enabled: bool,
    pub metrics: LeaderMetrics,
}

impl Elections {
    /// This replica's key in the record (Istio's `holderKey`): its revision.
    pub(super) fn key(&self) -> String {
        if self.revision.is_empty() {
            "default".into()
        } else {
            self.revision.clone()
        }
    }
}
