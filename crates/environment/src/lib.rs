//! The control-plane core, as Istio's `model.Environment`: the current Istio config and service
//! registries, the [`PushRequest`] each change makes (full, EDS-only or none, and what it covers),
//! and the snapshot each push is generated from (a `PushContext` and the generators' caches).
//!
//! ```text
//! config sources ──ConfigChange──► Environment::config_changed ──PushRequest──► xds-server
//! (directory, Kubernetes)           │ configs, registries          (debounce, then build)
//! registries ──RegistryDiff──► Environment::services_changed            │
//! (ServiceEntry, Kubernetes)    └─ changed workloads' IPs ─► ProxyUpdate ▼
//!                          Environment::build (SnapshotBuilder) ──► Push (PushSnapshot)
//! ```
//!
//! A second config source only has to produce `ConfigChange`s; a second registry implements
//! `registry::ServiceRegistry` and reports its own changes with [`Environment::services_changed`]. The
//! xDS server sees neither: it asks for a snapshot per push and generates from it.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod environment;
mod push;

#[cfg(test)]
mod ingress_tests;
#[cfg(test)]
mod tests;

pub use environment::{Environment, EnvironmentStats, Update};
pub use model::{Changed, ConfigsUpdated, PushRequest, TriggerReason};
pub use push::Push;
