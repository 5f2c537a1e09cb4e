//! The ADS server of pilot-discovery, as Istio's `pilot/pkg/xds`: state-of-the-world and delta
//! streams, ACK/NACK by nonce, the debouncer, the per-connection push slot and push throttling.
//!
//! The server knows nothing of Istio config: what to send comes from a [`PushSnapshot`] that a
//! [`SnapshotBuilder`] builds once per debounced push (the environment: the push index plus the
//! generators). Both are plugged in as type parameters, so the server's tests can drive it with a
//! fake mesh while pilot-discovery plugs in the real one.
//!
//! Read it top down: the server, then the stream, then the connection state, then the responses
//! and their framing. Layers, top first; each file imports only files of the layers below it
//! (`python3 scripts/house/imports.py crates/xds-server --check` reads this list and checks it):
//!
//! 1. `server`, `ack_bench`: `DiscoveryServer`, what pilot-discovery holds (push requests, the
//!    push loop, the debug views); the ACK path for benchmarks.
//! 2. `grpc`, `server::debounce`: the ADS service, one stream task per call; the debouncer.
//! 3. `stream`, `stream::sotw`, `stream::delta`: the stream loop and its two flavours.
//! 4. `stream::accept`, `stream::flavour`, `debug`: a stream's start (node, identity,
//!    registration); the `Flavour` contract; the debug types a stream answers.
//! 5. `stream::generate`, `current`: generation in the blocking pool; what a proxy would be sent.
//! 6. `state`: what the server shares with its streams (connections, snapshot, throttle, nonces).
//! 7. `connection`: one connection: its proxy, its watches, its pending push.
//! 8. `snapshot`, `status`: the contract the server is generic over; the debug views' copies.
//! 9. `watched`: the watches and the ACK/NACK rules.
//! 10. `framing`, `names`: gRPC framing of the stream bodies; the interned subscribed names.
//! 11. `request`, `response`, `outbound`, `auth`, `clock`, `lock`, `metrics`, `options`,
//!     `type_filter`: a request as read, a response as framed, the response channel, helpers.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

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
