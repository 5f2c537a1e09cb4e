//! client-go's `LeaderElectionRecord` as Istio's fork keeps it (pilot/pkg/leaderelection/
//! k8sleaderelection/k8sresourcelock/interface.go): JSON in the annotation
//! `control-plane.alpha.kubernetes.io/leader` of the election's ConfigMap, read and written by
//! istiod's replicas and ours alike. A field that does not decode stops client-go from reading
//! the record at all (every istiod replica waits forever); here each field is decoded alone, a
//! bad one is named and taken as unset, and the next write replaces the whole record.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// The annotation that holds the record (client-go's `LeaderElectionRecordAnnotationKey`).
pub const ANNOTATION: &str = "control-plane.alpha.kubernetes.io/leader";

/// Who leads an election, since when, and for how long without renewal.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// Empty when no one holds it (a holder that stepped down cleanly).
    pub holder_identity: String,
    /// Istio's: the holder's revision (`^` before it for a remote cluster's istiod), by which
    /// the default revision takes the lock over from another (`steals`).
    pub holder_key: String,
    pub lease_duration_seconds: i64,
    pub acquire_time: Option<Time>,
    pub renew_time: Option<Time>,
    pub leader_transitions: i64,
}

/// A field of a record that does not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corrupt {
    pub field: &'static str,
    pub reason: String,
}

impl Record {
    /// The record of `raw` (the annotation's value), and what in it is corrupt.
    pub fn decode(raw: &str) -> (Record, Vec<Corrupt>) {
        let mut corrupt = Vec::new();
        let value = match serde_json::from_str::<Value>(raw) {
            Ok(Value::Object(map)) => map,
            Ok(other) => {
                corrupt.push(Corrupt {
                    field: "record",
                    reason: format!("not a JSON object: {}", short(&other.to_string())),
                });
                return (Record::default(), corrupt);
            }
            Err(e) => {
                corrupt.push(Corrupt {
                    field: "record",
                    reason: format!("not JSON ({e}): {}", short(raw)),
                });
                return (Record::default(), corrupt);
            }
        };
        let record = Record {
            holder_identity: decode_field(&value, "holderIdentity", &mut corrupt).unwrap_or_default(),
            holder_key: decode_field(&value, "holderKey", &mut corrupt).unwrap_or_default(),
            lease_duration_seconds: decode_field(&value, "leaseDurationSeconds", &mut corrupt).unwrap_or_default(),
            acquire_time: decode_field(&value, "acquireTime", &mut corrupt),
            renew_time: decode_field(&value, "renewTime", &mut corrupt),
            leader_transitions: decode_field(&value, "leaderTransitions", &mut corrupt).unwrap_or_default(),
        };
        (record, corrupt)
    }

    /// The annotation's value for this record, as client-go writes it.
    pub fn encode(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// `map[name]` as a `T`, or `None` when absent, null, or (named in `corrupt`) of another type.
fn decode_field<T: DeserializeOwned>(
    map: &serde_json::Map<String, Value>,
    name: &'static str,
    corrupt: &mut Vec<Corrupt>,
) -> Option<T> {
    let v = map.get(name).filter(|v| !v.is_null())?;
    match serde_json::from_value::<T>(v.clone()) {
        Ok(t) => Some(t),
        Err(e) => {
            corrupt.push(Corrupt {
                field: name,
                reason: format!("{} does not decode: {e}", short(&v.to_string())),
            });
            None
        }
    }
}

/// At most 80 characters of `s`, for a log line.
fn short(s: &str) -> String {
    match s.char_indices().nth(80) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_owned(),
    }
}

/// Istio's `LocationPrioritizedComparison`: whether a candidate whose key is `ours` takes a live
/// lock held under `holder_key` over. It does when the candidate is of the default revision
/// (`default_revision`, the `istio.io/rev` of the `istio-revision-tag-default` webhook) and the
/// holder is of another, or when both are of one revision and the holder is a remote cluster's
/// istiod (`^` before its key) and the candidate is not.
pub fn steals(ours: &str, holder_key: &str, default_revision: Option<&str>) -> bool {
    let (holder_revision, holder_remote) = match holder_key.strip_prefix('^') {
        Some(r) => (r, true),
        None => (holder_key, false),
    };
    let (our_revision, we_remote) = match ours.strip_prefix('^') {
        Some(r) => (r, true),
        None => (ours, false),
    };
    if our_revision != holder_revision && default_revision.is_some_and(|d| !d.is_empty() && d == our_revision) {
        return true;
    }
    our_revision == holder_revision && !we_remote && holder_remote
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_written_by_istiod_reads_back_and_writes_as_client_go_does() {
        let raw = r#"{"holderIdentity":"istiod-5d9c-x","holderKey":"default","leaseDurationSeconds":30,"acquireTime":"2026-11-27T10:00:00Z","renewTime":"2026-11-27T10:05:00Z","leaderTransitions":2}"#;
        let (record, corrupt) = Record::decode(raw);
        assert!(corrupt.is_empty(), "{corrupt:?}");
        assert_eq!(record.holder_identity, "istiod-5d9c-x");
        assert_eq!(record.holder_key, "default");
        assert_eq!((record.lease_duration_seconds, record.leader_transitions), (30, 2));
        assert_eq!(record.encode(), raw);
        // A record given up (client-go's release) has no holder.
        let (free, _) = Record::decode(
            r#"{"holderIdentity":"","holderKey":"","leaseDurationSeconds":1,"acquireTime":null,"renewTime":null,"leaderTransitions":2}"#,
        );
        assert_eq!(free.holder_identity, "");
        assert_eq!(free.renew_time, None);
    }

    #[test]
    fn corrupt_fields_are_named_and_taken_as_unset() {
        let (record, corrupt) = Record::decode(
            r#"{"holderIdentity":7,"leaseDurationSeconds":"long","renewTime":"yesterday","holderKey":"default"}"#,
        );
        let fields: Vec<&str> = corrupt.iter().map(|c| c.field).collect();
        assert_eq!(fields, ["holderIdentity", "leaseDurationSeconds", "renewTime"]);
        assert_eq!(record.holder_identity, "");
        assert_eq!(record.holder_key, "default");
        assert!(corrupt[2].reason.contains("\"yesterday\""), "{}", corrupt[2].reason);
        for raw in ["{not json", "[1,2]", "\"a string\"", ""] {
            let (record, corrupt) = Record::decode(raw);
            assert_eq!(record, Record::default(), "{raw}");
            assert_eq!(corrupt.len(), 1, "{raw}");
            assert_eq!(corrupt[0].field, "record");
        }
        let long = format!("\"{}\"", "x".repeat(10_000));
        let (_, corrupt) = Record::decode(&long);
        assert!(corrupt[0].reason.len() < 200, "the reason quotes at most 80 characters");
    }

    #[test]
    fn the_default_revision_takes_over_as_istiods_prioritized_election() {
        // The default revision over another.
        assert!(steals("default", "canary", Some("default")));
        assert!(steals("canary", "default", Some("canary")));
        // Not the default: waits for the lock to expire.
        assert!(!steals("canary", "default", Some("default")));
        assert!(!steals("canary", "stable", None));
        assert!(!steals("canary", "stable", Some("")));
        // Same revision: never, unless the holder is a remote cluster's istiod.
        assert!(!steals("default", "default", Some("default")));
        assert!(steals("default", "^default", Some("default")));
        assert!(steals("default", "^default", None));
        assert!(!steals("^default", "default", None));
        // A remote holder of another revision, taken by the default revision.
        assert!(steals("default", "^canary", Some("default")));
    }
}
