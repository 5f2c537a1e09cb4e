//! The ADS server of pilot-discovery, as Istio's `pilot/pkg/xds`: state-of-the-world and delta
//! streams, ACK/NACK by nonce, the debouncer, the per-connection push slot and push throttling.
//!
//! The server knows nothing of Istio config: what to send comes from a [`PushSnapshot`] that a
//! [`SnapshotBuilder`] builds once per debounced push (the environment: the push index plus the
//! generators). Both are plugged in as type parameters, so the server's tests can drive it with a
//! fake mesh while pilot-discovery plugs in the real one.
#![forbid(unsafe_code)]

#[doc(hidden)]
pub mod ack_bench;
mod auth;
mod clock;
mod connection;
mod current;
mod debug;
mod framing;
mod grpc;
mod lock;
mod metrics;
mod names;
mod options;
mod outbound;
mod request;
mod response;
mod server;
mod snapshot;
mod state;
mod status;
mod stream;
mod type_filter;
mod watched;

pub use auth::StreamAuthenticator;
pub use clock::rfc3339;
pub use current::{CurrentResources, CurrentResourcesError};
pub use grpc::AdsService;
pub use model::{Changed, ConfigsUpdated, Proxy, PushRequest, TriggerReason};
pub use options::{DEFAULT_MAX_RESOURCE_NAMES, ServerOptions};
pub use server::DiscoveryServer;
pub use snapshot::{PushSnapshot, SnapshotBuilder};
pub use status::{ConnectionStatus, PushStatus, PushTypeStatus, WatchedStatus};
pub use type_filter::type_needs_push;
pub use watched::{Names, WatchedResource};
pub use xds_api::{GenerateError, Resource};
