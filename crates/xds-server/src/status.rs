//! Debug views of the server (`/debug/adsz`, `/debug/syncz`, `/debug/push_status`): plain
//! serializable copies, taken under short locks.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::clock::rfc3339;
use crate::watched::Watch;

/// One connected proxy, as Istio's `adsz` entry plus the per type sync state of `syncz`.
#[derive(Debug, Clone, Serialize)]
pub struct ConnectionStatus {
    /// `<proxy id>-<counter>`, as Istio's connection ID.
    pub connection_id: String,
    pub node_id: String,
    /// Istio's proxy ID, `pod.namespace`.
    pub proxy_id: String,
    /// `sidecar`, `router`, ...
    pub proxy_type: String,
    /// CLUSTER_ID of the node metadata, empty if not sent.
    pub cluster_id: String,
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
            names: w.resource.names.iter().map(|n| n.to_string()).collect(),
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
