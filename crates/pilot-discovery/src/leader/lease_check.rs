//! What a replica reads of a coordination.k8s.io/v1 Lease besides kube-lease-manager: who holds
//! it and until when, and what in it is corrupt. client-go's `LeaseToLeaderElectionRecord`
//! (Istio's pilot/pkg/leaderelection/k8sleaderelection/k8sresourcelock/leaselock.go) decodes the
//! same fields; a field that does not decode, a lease duration that is not positive, or a
//! renewTime further in the future than the lease lasts blocks every replica (kube-lease-manager
//! cannot read the Lease, panics on a negative duration, or waits for the far future), so such a
//! field is named, counted and removed: the Lease then reads as expired and the election goes on.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::LeaseSpec;
use serde_json::{Value, json};

/// The holder of a Lease, as read from its raw JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct Holding {
    pub holder: Option<String>,
    /// renewTime + leaseDurationSeconds; `None` when either is missing.
    pub expiry: Option<SystemTime>,
}

/// A corrupt field of a Lease's spec: its name and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt {
    pub field: &'static str,
    pub reason: String,
}

const FIELDS: [&str; 5] = [
    "holderIdentity",
    "leaseDurationSeconds",
    "acquireTime",
    "renewTime",
    "leaseTransitions",
];

/// Reads `lease` (the object as the API server sent it): the holding, and the corrupt fields.
pub fn inspect(lease: &Value, now: SystemTime) -> (Holding, Vec<Corrupt>) {
    let mut corrupt = Vec::new();
    let spec = match lease.get("spec") {
        None | Some(Value::Null) => &json!({}),
        Some(s) if s.is_object() => s,
        Some(other) => {
            corrupt.push(Corrupt {
                field: "spec",
                reason: format!("not an object: {}", short(other)),
            });
            &json!({})
        }
    };
    // Each field as k8s-openapi (and so kube-lease-manager) decodes it, alone.
    let mut decoded = LeaseSpec::default();
    for field in FIELDS {
        let Some(v) = spec.get(field).filter(|v| !v.is_null()) else {
            continue;
        };
        match serde_json::from_value::<LeaseSpec>(json!({ field: v })) {
            Ok(one) => merge(&mut decoded, one),
            Err(e) => corrupt.push(Corrupt {
                field,
                reason: format!("{} does not decode: {e}", short(v)),
            }),
        }
    }
    let duration = match decoded.lease_duration_seconds {
        Some(d) if d <= 0 => {
            corrupt.push(Corrupt {
                field: "leaseDurationSeconds",
                reason: format!("{d} is not a positive number of seconds"),
            });
            None
        }
        d => d.map(|d| Duration::from_secs(d.unsigned_abs().into())),
    };
    let renew: Option<SystemTime> = decoded.renew_time.as_ref().map(|t| SystemTime::from(t.0));
    if let (Some(r), Some(d)) = (renew, duration)
        && r.duration_since(now).is_ok_and(|ahead| ahead > d)
    {
        corrupt.push(Corrupt {
            field: "renewTime",
            reason: format!(
                "{} is more than the lease duration ({}s) in the future",
                decoded.renew_time.as_ref().map(|t| t.0.to_string()).unwrap_or_default(),
                d.as_secs()
            ),
        });
    }
    let fine = |f: &str| !corrupt.iter().any(|c| c.field == f || c.field == "spec");
    let expiry = match (
        renew.filter(|_| fine("renewTime")),
        duration.filter(|_| fine("leaseDurationSeconds")),
    ) {
        (Some(r), Some(d)) => r.checked_add(d),
        _ => None,
    };
    let holding = Holding {
        holder: decoded.holder_identity.filter(|_| fine("holderIdentity")),
        expiry,
    };
    (holding, corrupt)
}

fn merge(into: &mut LeaseSpec, one: LeaseSpec) {
    into.holder_identity = into.holder_identity.take().or(one.holder_identity);
    into.lease_duration_seconds = into.lease_duration_seconds.or(one.lease_duration_seconds);
    into.acquire_time = into.acquire_time.take().or(one.acquire_time);
    into.renew_time = into.renew_time.take().or(one.renew_time);
    into.lease_transitions = into.lease_transitions.or(one.lease_transitions);
}

/// The JSON merge patch that removes the corrupt fields, only if the Lease is still at
/// `resource_version` (another replica's repair or renewal wins).
pub fn repair_patch(corrupt: &[Corrupt], resource_version: &str) -> Value {
    let spec = if corrupt.iter().any(|c| c.field == "spec") {
        Value::Null
    } else {
        Value::Object(corrupt.iter().map(|c| (c.field.to_owned(), Value::Null)).collect())
    };
    json!({"metadata": {"resourceVersion": resource_version}, "spec": spec})
}

/// A value for a log line: at most 64 characters of its JSON.
fn short(v: &Value) -> String {
    let s = v.to_string();
    match s.char_indices().nth(64) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    const NOW: u64 = 1_800_000_000; // 2027-01-15T08:00:00Z

    #[test]
    fn a_valid_lease_has_a_holder_until_renew_time_plus_its_duration() {
        let lease = json!({"spec": {"holderIdentity": "istiod-a", "leaseDurationSeconds": 30,
            "renewTime": "2027-01-15T08:00:00.000000Z", "acquireTime": "2027-01-15T07:00:00.000000Z", "leaseTransitions": 3}});
        let (holding, corrupt) = inspect(&lease, at(NOW));
        assert_eq!(corrupt, []);
        assert_eq!(holding.holder.as_deref(), Some("istiod-a"));
        assert_eq!(holding.expiry, Some(at(NOW + 30)));
        // A released Lease (kube-lease-manager nulls the fields): no holder, no expiry.
        let (free, corrupt) = inspect(&json!({"spec": {"leaseTransitions": 4}}), at(NOW));
        assert_eq!((free.holder, free.expiry, corrupt), (None, None, vec![]));
    }

    #[test]
    fn garbage_renew_time_wrong_types_and_bad_durations_are_named_and_removed() {
        let lease = json!({"metadata": {"resourceVersion": "7"}, "spec": {"holderIdentity": 42,
            "leaseDurationSeconds": -1, "renewTime": "yesterday"}});
        let (holding, corrupt) = inspect(&lease, at(NOW));
        let fields: Vec<&str> = corrupt.iter().map(|c| c.field).collect();
        assert_eq!(fields, ["holderIdentity", "renewTime", "leaseDurationSeconds"]);
        assert!(
            corrupt[1].reason.contains("\"yesterday\" does not decode"),
            "{corrupt:?}"
        );
        assert!(corrupt[2].reason.contains("-1 is not a positive"), "{corrupt:?}");
        assert_eq!((holding.holder, holding.expiry), (None, None));
        assert_eq!(
            repair_patch(&corrupt, "7"),
            json!({"metadata": {"resourceVersion": "7"},
                   "spec": {"holderIdentity": null, "renewTime": null, "leaseDurationSeconds": null}})
        );
    }

    #[test]
    fn a_renew_time_far_in_the_future_would_hold_the_lease_forever() {
        let lease = json!({"spec": {"holderIdentity": "mallory", "leaseDurationSeconds": 30,
            "renewTime": "9999-01-01T00:00:00.000000Z"}});
        let (holding, corrupt) = inspect(&lease, at(NOW));
        assert_eq!(corrupt.iter().map(|c| c.field).collect::<Vec<_>>(), ["renewTime"]);
        assert_eq!(holding.holder.as_deref(), Some("mallory"));
        assert_eq!(holding.expiry, None, "read as expired");
        let (_, corrupt) = inspect(&json!({"spec": "garbage"}), at(NOW));
        assert_eq!(repair_patch(&corrupt, "1")["spec"], Value::Null);
    }
}
