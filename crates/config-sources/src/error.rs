//! What can go wrong reading a config directory: `SourceError` (one per file or document, naming the
//! file, the document and the resource as far as known) and `SourceErrorEntry`, its flat form for
//! `/debug/config_errors`.

use std::fmt;
use std::path::PathBuf;

use model::ConfigKey;
use model::config::ConfigError;
use model::event::{Level, SourceErrorEntry};

/// Where a document sits in its file: its number among the file's non-empty documents (from 1),
/// the entry of a `List`'s `items` it came from, and the line it starts on when known.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DocRef {
    pub document: u32,
    pub item: Option<u32>,
    pub line: Option<u32>,
}

impl fmt::Display for DocRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "document {}", self.document)?;
        if let Some(item) = self.item {
            write!(f, " items[{item}]")?;
        }
        if let Some(line) = self.line {
            write!(f, " (line {line})")?;
        }
        Ok(())
    }
}

/// One problem found reading the config directory.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SourceError {
    /// The config directory itself cannot be listed.
    #[error("{}: cannot read config directory: {reason} (hint: does --configDir exist and is it readable?)", dir.display())]
    Directory { dir: PathBuf, reason: String },
    /// The directory cannot be watched at all (the watcher thread did not start).
    #[error("{}: cannot watch config directory: {reason}", dir.display())]
    Watch { dir: PathBuf, reason: String },
    /// A file (or a subdirectory) cannot be read.
    #[error("{}: cannot read: {reason}", file.display())]
    Read { file: PathBuf, reason: String },
    /// The file is not valid YAML/JSON; no document of it was read.
    #[error("{}: syntax error: {reason}", file.display())]
    Syntax { file: PathBuf, reason: String },
    /// A document of a kind pilot does not know; skipped.
    #[error("{}: {doc}: unknown kind {kind:?} (apiVersion {api_version:?}){}: skipped", file.display(), named(resource))]
    UnknownKind {
        file: PathBuf,
        doc: DocRef,
        api_version: String,
        kind: String,
        resource: Option<String>,
    },
    /// A document that did not decode or validate; dropped, its siblings in the file still apply.
    #[error("{}: {doc}: {source}", file.display())]
    Invalid {
        file: PathBuf,
        doc: DocRef,
        resource: Option<String>,
        #[source]
        source: Box<ConfigError>,
    },
    /// An Istio kind that is kept in the store but not yet acted on.
    #[error("{}: {doc}: {key}: kind not yet supported: kept, but not acted on", file.display())]
    Unsupported { file: PathBuf, doc: DocRef, key: ConfigKey },
    /// The same kind/namespace/name already came from an earlier file (or document); ignored.
    #[error("{}: {doc}: {key} is already defined in {}: this copy is ignored", file.display(), first.display())]
    Duplicate {
        file: PathBuf,
        doc: DocRef,
        key: ConfigKey,
        first: PathBuf,
    },
}

fn named(resource: &Option<String>) -> String {
    resource.as_ref().map(|r| format!(" for {r}")).unwrap_or_default()
}

impl SourceError {
    /// The file (or directory) the problem is in.
    /// The resource an invalid document was meant to be, when its kind, namespace and name are known.
    pub fn invalid_key(&self) -> Option<&ConfigKey> {
        match self {
            SourceError::Invalid { source, .. } => source.key(),
            _ => None,
        }
    }

    pub fn file(&self) -> &PathBuf {
        match self {
            SourceError::Directory { dir: file, .. }
            | SourceError::Watch { dir: file, .. }
            | SourceError::Read { file, .. }
            | SourceError::Syntax { file, .. }
            | SourceError::UnknownKind { file, .. }
            | SourceError::Invalid { file, .. }
            | SourceError::Unsupported { file, .. }
            | SourceError::Duplicate { file, .. } => file,
        }
    }

    /// The resource as `Kind namespace/name`, as far as known.
    pub fn resource(&self) -> Option<String> {
        match self {
            SourceError::Directory { .. }
            | SourceError::Watch { .. }
            | SourceError::Read { .. }
            | SourceError::Syntax { .. } => None,
            SourceError::UnknownKind { resource, .. } | SourceError::Invalid { resource, .. } => resource.clone(),
            SourceError::Unsupported { key, .. } | SourceError::Duplicate { key, .. } => Some(key.to_string()),
        }
    }

    /// The config kind the problem is about, as the `type` label of `pilot_config_invalid`.
    pub fn kind(&self) -> Option<String> {
        match self {
            SourceError::Directory { .. }
            | SourceError::Watch { .. }
            | SourceError::Read { .. }
            | SourceError::Syntax { .. } => None,
            SourceError::UnknownKind { kind, .. } => Some(kind.clone()),
            SourceError::Invalid { source, resource, .. } => match source.as_ref() {
                ConfigError::Decode { key, .. } | ConfigError::Invalid { key, .. } => Some(key.kind.to_string()),
                ConfigError::Metadata { kind, .. } => Some(kind.clone()),
                ConfigError::UnknownKind { kind, .. } => Some(kind.clone()),
                ConfigError::NotAResource => resource.as_ref().and_then(|r| r.split(' ').next()).map(str::to_owned),
            },
            SourceError::Unsupported { key, .. } | SourceError::Duplicate { key, .. } => Some(key.kind.to_string()),
        }
    }

    pub fn level(&self) -> Level {
        match self {
            SourceError::UnknownKind { .. } | SourceError::Unsupported { .. } => Level::Warning,
            _ => Level::Error,
        }
    }

    /// True when the error is about the whole file (nothing of it was read this time).
    pub fn is_file_level(&self) -> bool {
        matches!(
            self,
            SourceError::Directory { .. } | SourceError::Read { .. } | SourceError::Syntax { .. }
        )
    }

    /// True for a rejected resource: counted by `pilot_config_invalid`.
    pub fn is_invalid_resource(&self) -> bool {
        matches!(self, SourceError::Invalid { .. })
    }

    pub fn to_entry(&self) -> SourceErrorEntry {
        SourceErrorEntry {
            file: self.file().clone(),
            resource: self.resource(),
            reason: self.to_string(),
            level: self.level(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use model::ConfigKind;

    #[test]
    fn messages_name_file_document_and_resource() {
        let key = ConfigKey {
            kind: ConfigKind::ServiceEntry,
            namespace: "default".into(),
            name: "httpbin".into(),
        };
        let doc = DocRef {
            document: 2,
            item: Some(1),
            line: Some(14),
        };
        let err = SourceError::Invalid {
            file: "/etc/istio/se.yaml".into(),
            doc,
            resource: Some(key.to_string()),
            source: Box::new(ConfigError::Decode {
                key: key.clone(),
                reason: "spec: unknown field `hostz`".into(),
            }),
        };
        assert_eq!(
            err.to_string(),
            "/etc/istio/se.yaml: document 2 items[1] (line 14): ServiceEntry default/httpbin: spec: unknown field `hostz`"
        );
        let entry = err.to_entry();
        assert_eq!(entry.resource.as_deref(), Some("ServiceEntry default/httpbin"));
        assert_eq!(entry.level, Level::Error);
        assert_eq!(err.kind().as_deref(), Some("ServiceEntry"));
        assert!(err.is_invalid_resource());

        let warn = SourceError::UnknownKind {
            file: "a.yaml".into(),
            doc: DocRef {
                document: 1,
                item: None,
                line: None,
            },
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            resource: Some("ConfigMap default/x".into()),
        };
        assert_eq!(warn.level(), Level::Warning);
        assert_eq!(
            warn.to_string(),
            "a.yaml: document 1: unknown kind \"ConfigMap\" (apiVersion \"v1\") for ConfigMap default/x: skipped"
        );
        let json = serde_json::to_value(warn.to_entry()).unwrap();
        assert_eq!(json["level"], "warning");
    }
}
