//! The ADS server of pilot-discovery, as Istio's `pilot/pkg/xds`: state-of-the-world and delta
//! streams, ACK/NACK by nonce, the debouncer, the per-connection push slot and push throttling.
//!
//! The server knows nothing of Istio config: what to send comes from a [`PushSnapshot`] that a
//! [`SnapshotBuilder`] builds once per debounced push (the push index plus the generators).
#![forbid(unsafe_code)]

mod clock;
mod connection;
mod debounce;
mod delta;
mod grpc;
mod metrics;
mod names;
mod outbound;
mod push_request;
mod server;
mod sotw;
mod status;
mod type_filter;
mod watched;

use std::sync::{Arc, OnceLock};

pub use clock::rfc3339;
pub use grpc::AdsService;
pub use model::Proxy;
pub use push_request::{PushRequest, reason};
pub use server::{DiscoveryServer, ServerOptions};
pub use status::{ConnectionStatus, PushStatus, PushTypeStatus, WatchedStatus};
pub use watched::{Names, WatchedResource};

/// One immutable push snapshot (push index + generators). Built once per push.
pub trait PushSnapshot: Send + Sync + 'static {
    /// Version of this push, e.g. "2026-11-21T19:00:00Z/7"; used as `version_info`.
    fn version(&self) -> &str;

    /// Resources of `type_url` for `proxy`. `watched.names` are the subscribed names (empty and
    /// `watched.wildcard` for CDS/LDS).
    fn generate(
        &self,
        proxy: &Proxy,
        type_url: &str,
        watched: &WatchedResource,
        req: &PushRequest,
    ) -> Result<Vec<Resource>, GenerateError>;

    /// Whether this push concerns this proxy at all (Istio's `ProxyNeedsPush`). `last_pushed` is
    /// the snapshot the proxy's config was last generated from, so that a change that hides
    /// something from the proxy still reaches it. Default: true.
    fn needs_push(&self, _proxy: &Proxy, _req: &PushRequest, _last_pushed: Option<&dyn PushSnapshot>) -> bool {
        true
    }

    /// For implementations to recognise their own snapshots in `needs_push`.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Builds the snapshot of each push.
pub trait SnapshotBuilder: Send + Sync + 'static {
    /// Called once per debounced push with the merged request (and once at start with a full
    /// request).
    fn build(&self, req: &PushRequest) -> Arc<dyn PushSnapshot>;
}

/// One named resource, encoded once and shared (`Arc`) across every proxy that gets it.
#[derive(Debug, Clone)]
pub struct Resource {
    pub name: String,
    pub resource: Arc<xds_api::pbwkt::Any>,
    /// The delta version of `resource`, computed on first use (`Resource::version`). Generators
    /// that share `resource` share this slot with it, so each shared resource is hashed once.
    pub version: Arc<OnceLock<String>>,
}

impl Resource {
    /// Packs `m` into a shared `Any`.
    pub fn new<M: prost::Message + prost::Name>(name: impl Into<String>, m: &M) -> Resource {
        Resource {
            name: name.into(),
            resource: Arc::new(xds_api::pack(m)),
            version: Arc::default(),
        }
    }

    /// The delta version: a hash of the resource's type URL and bytes.
    pub fn version(&self) -> &str {
        self.version
            .get_or_init(|| connection::resource_version(&self.resource))
    }
}

/// Why a generator produced nothing for a type. The server logs it and sends nothing for that
/// type (the proxy keeps its last config).
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error("no generator for type {type_url} (proxy {proxy})")]
    UnsupportedType { type_url: String, proxy: String },
    #[error("generating {type_url} for {proxy}: {reason}")]
    Failed {
        type_url: String,
        proxy: String,
        reason: String,
    },
}
