//! Debug views of the server (`/debug/adsz`, `/debug/syncz`, `/debug/push_status`): plain
//! serializable copies, taken under short locks.

use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::watched::Watch;

/// One connected proxy, as Istio's `adsz` entry plus the per type sync state of `syncz`.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectionStatus {
    /// `<proxy id>-<counter>`, as Istio's connection ID.
    pub connection_id: String,
    pub node_id: String,
    pub peer_address: String,
    /// RFC 3339, UTC.
    pub connected_at: String,
    /// ISTIO_VERSION of the node metadata, empty if not sent.
    pub proxy_version: String,
    /// Delta xDS (`DeltaAggregatedResources`) rather than state of the world.
    pub delta: bool,
    /// Per type URL.
    pub watched: BTreeMap<String, WatchedStatus>,
}

/// Sync state of one type URL on one connection.
#[derive(Debug, Clone, Serialize)]
pub struct WatchedStatus {
    pub names: Vec<String>,
    pub wildcard: bool,
    pub version_sent: String,
    pub nonce_sent: String,
    pub nonce_acked: String,
    pub nonce_nacked: String,
    /// Envoy's message of the last NACK; empty once a later response is ACKed.
    pub last_error: String,
    pub last_sent: Option<String>,
    /// Delta only: number of resources the proxy has.
    pub resources: usize,
}

impl From<&Watch> for WatchedStatus {
    fn from(w: &Watch) -> Self {
        WatchedStatus {
            names: w.resource.names.iter().cloned().collect(),
            wildcard: w.resource.wildcard,
            version_sent: w.version_sent.clone(),
            nonce_sent: w.nonce_sent.clone(),
            nonce_acked: w.nonce_acked.clone(),
            nonce_nacked: w.nonce_nacked.clone(),
            last_error: w.last_error.clone(),
            last_sent: w.last_sent.map(rfc3339),
            resources: w.known.len(),
        }
    }
}

/// The last push: its version, when, why, and what was sent for it so far.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PushStatus {
    pub version: String,
    /// RFC 3339, UTC, when the snapshot was built.
    pub time: String,
    pub full: bool,
    pub reason: BTreeMap<String, u32>,
    /// Number of changed configs (0 = everything).
    pub configs_updated: usize,
    /// Seconds spent building the snapshot.
    pub build_seconds: f64,
    /// Connections marked for this push.
    pub connections: usize,
    /// Per short type (`cds`, `eds`, ...): responses and resources sent at this version.
    pub types: BTreeMap<String, PushTypeStatus>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PushTypeStatus {
    pub pushes: u64,
    pub resources: u64,
}

/// Formats a time as RFC 3339 in UTC with second precision.
pub(crate) fn rfc3339(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to (year, month, day), Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn formats_rfc3339() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29T00:00:00Z"
        );
        assert_eq!(
            rfc3339(UNIX_EPOCH + Duration::from_secs(1_795_287_600)),
            "2026-11-21T19:00:00Z"
        );
    }
}
