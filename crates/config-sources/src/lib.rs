//! pilot-discovery's config sources, each emitting `ConfigEvent`s for what changed: the file
//! directory (`--configDir`: every YAML/JSON file under it read into typed, validated `Config`s,
//! each file's last good contents kept, the directory watched), and the Kubernetes API server
//! ([`crdclient`], Istio's `pilot/pkg/config/kube/crdclient`).
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod config_kinds;
pub mod crdclient;
mod error;
mod parse;
mod scan;
mod store;
#[cfg(test)]
mod testutil;
mod watch;

pub use error::{DocRef, SourceError};
pub use model::event::{ConfigChange, ConfigEvent, ConfigSnapshot, Level, SourceErrorEntry, diff};
pub use parse::{DEFAULT_NAMESPACE, is_config_file, parse_documents};
pub use store::{FileConfigStore, InvalidObserver, StoreSnapshot};
pub use watch::{ConfigDirWatch, watch, watch_store};
