//! The file-directory config source of pilot-discovery (`--configDir`): reads every YAML/JSON
//! file under a directory into typed, validated `Config`s, keeps each file's last good contents,
//! and watches the directory, emitting `ConfigEvent`s for what changed.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod error;
mod parse;
mod scan;
mod store;
#[cfg(test)]
mod testutil;
mod watch;

pub use error::{DocRef, Level, SourceError, SourceErrorEntry};
pub use model::event::{ConfigChange, ConfigEvent, ConfigSnapshot, diff};
pub use parse::{DEFAULT_NAMESPACE, is_config_file, parse_documents};
pub use store::{FileConfigStore, InvalidObserver, StoreSnapshot};
pub use watch::{ConfigDirWatch, watch, watch_store};
