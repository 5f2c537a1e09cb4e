//! The ADS server of pilot-discovery, as Istio's `pilot/pkg/xds`: state-of-the-world and delta
//! streams, ACK/NACK by nonce, the debouncer, the per-connection push slot and push throttling.
//!
//! The server knows nothing of Istio config: what to send comes from a [`PushSnapshot`] that a
//! [`SnapshotBuilder`] builds once per debounced push (the environment: the push index plus the
//! generators). Both are plugged in as type parameters, so the server's tests can drive it with a
//! fake mesh while pilot-discovery plugs in the real one.
#![forbid(unsafe_code)]

mod auth;
mod clock;
mod connection;
mod current;
mod debounce;
mod debug;
mod delta;
mod grpc;
mod metrics;
mod names;
mod outbound;
mod request;
mod response;
mod server;
mod sotw;
mod status;
mod stream;
mod type_filter;
mod watched;

use std::sync::Arc;

pub use auth::StreamAuthenticator;
pub use clock::rfc3339;
pub use current::{CurrentResources, CurrentResourcesError};
pub use grpc::AdsService;
pub use model::{Changed, ConfigsUpdated, Proxy, PushRequest, TriggerReason};
pub use server::{DEFAULT_MAX_RESOURCE_NAMES, DiscoveryServer, ServerOptions};
pub use status::{ConnectionStatus, PushStatus, PushTypeStatus, WatchedStatus};
pub use type_filter::type_needs_push;
pub use watched::{Names, WatchedResource};
pub use xds_api::{GenerateError, Resource};

#[doc(hidden)]
pub use request::bench as ack_bench;

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
