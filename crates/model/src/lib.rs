//! The data model of pilot-discovery: typed, validated Istio config, the service registry's
//! `Service` and `Endpoint`, the connected `Proxy`, `MeshConfig`, and the `PushRequest` a change
//! makes. Plain data: no I/O, no tokio.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

pub mod config;
pub mod duration;
pub mod event;
pub mod features;
pub mod host;
pub mod mesh;
pub mod mesh_networks;
pub mod networking;
pub mod proxy;
pub mod proxy_headers;
pub mod push;
pub mod security;
pub mod service;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod validation;

pub use config::{Config, ConfigKey, ConfigKind, ConfigMeta, ConfigSpec};
pub use event::{ConfigChange, ConfigEvent};
pub use features::Features;
pub use mesh::MeshConfig;
pub use proxy::{NodeType, Proxy, ProxyError, VerifiedIdentity, WorkloadTarget};
pub use push::{Changed, ConfigsUpdated, PushRequest, ReasonStats, TriggerReason};
pub use service::{Endpoint, Locality, Port, Protocol, Resolution, Service, ServiceAttributes, ServiceKey};
