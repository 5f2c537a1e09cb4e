//! What the server is generic over (Istio's `PushContext` and `initPushContext`, behind the
//! generators): a [`PushSnapshot`] of everything one push sends, and the [`SnapshotBuilder`] that
//! builds one per debounced push. The server knows nothing of Istio config; pilot-discovery plugs
//! in the environment, the server's tests a fake mesh.

use std::sync::Arc;

use crate::watched::WatchedResource;
use crate::{GenerateError, Proxy, PushRequest, Resource};

/// One immutable push snapshot: what every proxy is sent for one push. Built once per push.
pub trait PushSnapshot: Send + Sync + 'static {
    /// Version of this push, e.g. "2026-11-21T19:00:00Z/7"; used as `version_info`.
    fn version(&self) -> &str;

    /// Resources of `watched.type_url` for `proxy`. `watched.names` are the subscribed names
    /// (empty and `watched.wildcard` for CDS/LDS); the server drops resources not asked for.
    /// A type nobody generates is `GenerateError::UnsupportedType`, answered with nothing.
    /// `delta`: the proxy is on delta xDS (where Envoy supports VHDS).
    fn generate(&self, proxy: &Proxy, watched: &WatchedResource, delta: bool) -> Result<Vec<Resource>, GenerateError>;

    /// Whether this push concerns this proxy at all (Istio's `ProxyNeedsPush`). `last_pushed` is
    /// the snapshot the proxy's config was last generated from, so that a change that hides
    /// something from the proxy still reaches it.
    fn needs_push(&self, proxy: &Proxy, req: &PushRequest, last_pushed: Option<&Self>) -> bool;
}

/// Builds the snapshot of each push (Istio's `initPushContext`).
pub trait SnapshotBuilder: Send + Sync + 'static {
    type Snapshot: PushSnapshot;

    /// Called once per debounced push with the merged request (and once at start with a full
    /// request).
    fn build(&self, req: &PushRequest) -> Arc<Self::Snapshot>;

    /// Completes a proxy as its node described it from what the registries know of its workload
    /// (Istio's `SetWorkloadLabels`, and the locality of its Pod's Node when the node has none).
    /// Called when it connects and again on `DiscoveryServer::proxy_update`.
    fn init_proxy(&self, _proxy: &mut Proxy) {}
}
