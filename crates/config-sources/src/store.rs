//! `FileConfigStore`: the configs of a directory, per file its last good parse. A file with a syntax
//! error (or that cannot be read) keeps its last good contents; a file that parses drops only its
//! invalid documents; a key defined twice goes to the first file by sorted path.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use model::{Config, ConfigKey};

use crate::error::{DocRef, SourceError};
use crate::parse::{DEFAULT_NAMESPACE, is_config_file, parse_file};
use crate::scan::{is_hidden, list_config_files};
use model::event::SourceErrorEntry;
use model::event::{ConfigChange, ConfigEvent, ConfigSnapshot, diff};

/// Called with the kind (the `type` label of `pilot_config_invalid`) of every rejected resource,
/// once per parse of a file's new contents.
pub type InvalidObserver = Arc<dyn Fn(&str) + Send + Sync>;

/// The store at one moment, cheap to clone: what `/debug/configz` and `/debug/config_errors` show.
#[derive(Debug, Clone, Default)]
pub struct StoreSnapshot {
    pub configs: ConfigSnapshot,
    /// The file each config came from.
    pub origins: Arc<BTreeMap<ConfigKey, PathBuf>>,
    pub errors: Arc<Vec<SourceErrorEntry>>,
    /// Rejected resources by kind since start (monotonic).
    pub invalid_counts: Arc<BTreeMap<String, u64>>,
    /// How many scans of the directory this reflects (full walks and reads of changed files).
    pub scans: u64,
    /// How many times a file was read, since start.
    pub files_read: u64,
}

/// What the store holds for one file.
#[derive(Debug, Default)]
struct FileState {
    /// The bytes last read; `None` after a read error, so the next good read is parsed.
    content: Option<Vec<u8>>,
    /// The documents of the last contents that parsed.
    good: Vec<(DocRef, Arc<Config>)>,
    /// Problems with the last contents read (including warnings for kept configs).
    errors: Vec<SourceError>,
}

/// One document defining a key: its file, where in the file, and the config.
type Definition<'a> = (&'a PathBuf, DocRef, &'a Arc<Config>);

/// Where a duplicate sits (file, then document): the order a full rebuild reports them in.
fn duplicate_order(e: &SourceError) -> (&Path, u32, Option<u32>) {
    match e {
        SourceError::Duplicate { file, doc, .. } => (file, doc.document, doc.item),
        other => (other.file(), 0, None),
    }
}

/// What an event's path means for [`FileConfigStore::rescan_paths`].
enum PathChange {
    /// A config file that exists: read it.
    Refresh,
    /// Nothing there any more: drop it (and what was under it).
    Gone,
    /// Not config (a hidden temporary file, another extension).
    Ignore,
}

/// The configs of one directory tree.
pub struct FileConfigStore {
    dir: PathBuf,
    default_namespace: String,
    files: BTreeMap<PathBuf, FileState>,
    configs: ConfigSnapshot,
    origins: Arc<BTreeMap<ConfigKey, PathBuf>>,
    dir_error: Option<SourceError>,
    walk_errors: Vec<SourceError>,
    duplicates: Vec<SourceError>,
    invalid_counts: BTreeMap<String, u64>,
    observer: Option<InvalidObserver>,
    scans: u64,
    files_read: u64,
    /// The last full walk went through a symlink: see [`Listing::symlinks`].
    symlinks: bool,
}

impl std::fmt::Debug for FileConfigStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileConfigStore")
            .field("dir", &self.dir)
            .field("files", &self.files.len())
            .field("configs", &self.configs.len())
            .field("scans", &self.scans)
            .finish_non_exhaustive()
    }
}

impl FileConfigStore {
    /// An empty store for `dir`; nothing is read until `rescan`.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        FileConfigStore {
            dir: dir.into(),
            default_namespace: DEFAULT_NAMESPACE.to_owned(),
            files: BTreeMap::new(),
            configs: Arc::default(),
            origins: Arc::default(),
            dir_error: None,
            walk_errors: Vec::new(),
            duplicates: Vec::new(),
            invalid_counts: BTreeMap::new(),
            observer: None,
            scans: 0,
            files_read: 0,
            symlinks: false,
        }
    }

    /// Reads `dir`; fails when the directory itself cannot be listed.
    pub fn load(dir: impl Into<PathBuf>) -> Result<Self, SourceError> {
        let mut store = Self::new(dir);
        store.rescan();
        match store.dir_error.take() {
            Some(e) => Err(e),
            None => Ok(store),
        }
    }

    /// Namespace for documents that name none (default `default`). Applies from the next parse.
    pub fn set_default_namespace(&mut self, namespace: impl Into<String>) {
        self.default_namespace = namespace.into();
    }

    pub fn set_invalid_observer(&mut self, observer: InvalidObserver) {
        self.observer = Some(observer);
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Re-reads the directory and returns what changed. Files whose bytes did not change are not
    /// parsed again. When the directory itself cannot be listed, everything is kept and the
    /// problem is reported in `errors()`.
    pub fn rescan(&mut self) -> ConfigChange {
        self.scans += 1;
        let listing = match list_config_files(&self.dir) {
            Ok(listing) => listing,
            Err(e) => {
                // Once per problem, not once per rescan (a missing directory is polled every second).
                if self.dir_error.as_ref().map(ToString::to_string) != Some(e.to_string()) {
                    tracing::warn!(error = %e, "config directory unreadable: keeping the last good config");
                } else {
                    tracing::debug!(error = %e, "config directory still unreadable");
                }
                self.dir_error = Some(e);
                return ConfigChange::default();
            }
        };
        if self.dir_error.take().is_some() {
            tracing::info!(dir = %self.dir.display(), "config directory readable again");
        }
        let listed: BTreeSet<&PathBuf> = listing.files.iter().collect();
        self.files
            .retain(|path, _| listed.contains(path) || listing.under_unreadable_dir(path));
        for path in &listing.files {
            self.refresh_file(path);
        }
        self.walk_errors = listing.errors;
        self.symlinks = listing.symlinks;
        self.rebuild()
    }

    /// Re-reads only `paths` (what file-system events named) and returns what changed; a full
    /// [`rescan`](Self::rescan) when they cannot tell: a directory or a symlink among them, a
    /// path outside the directory or one that cannot be looked at, or a tree with symlinks in it
    /// (where a file changes under another name than the one events give). A reading of 1,000
    /// files takes 10-15 ms, of one file well under one.
    pub fn rescan_paths<'a>(&mut self, paths: impl IntoIterator<Item = &'a Path>) -> ConfigChange {
        if self.symlinks || self.dir_error.is_some() {
            return self.rescan();
        }
        let mut refresh = Vec::new();
        let mut gone = Vec::new();
        for path in paths {
            match self.classify(path) {
                Some(PathChange::Refresh) => refresh.push(path.to_path_buf()),
                Some(PathChange::Gone) => gone.push(path.to_path_buf()),
                Some(PathChange::Ignore) => {}
                None => {
                    tracing::debug!(path = %path.display(), "config directory: reading everything again");
                    return self.rescan();
                }
            }
        }
        self.scans += 1;
        // The keys the files read or dropped here defined before and define now: only their
        // owners can change.
        let mut keys: BTreeSet<ConfigKey> = BTreeSet::new();
        let mut read = Vec::with_capacity(refresh.len());
        for path in gone {
            // A file, or a directory moved away: everything under it.
            self.files.retain(|p, state| {
                let under = p.starts_with(&path);
                if under {
                    keys.extend(state.good.iter().map(|(_, c)| c.key()));
                }
                !under
            });
        }
        for path in refresh {
            if let Some(state) = self.files.get(&path) {
                keys.extend(state.good.iter().map(|(_, c)| c.key()));
            }
            self.refresh_file(&path);
            if let Some(state) = self.files.get(&path) {
                keys.extend(state.good.iter().map(|(_, c)| c.key()));
            }
            read.push(path);
        }
        self.rebuild_keys(&keys, read)
    }

    /// What a changed `path` means, `None` when only a full walk can tell.
    fn classify(&self, path: &Path) -> Option<PathChange> {
        let relative = path.strip_prefix(&self.dir).ok()?;
        let mut components = relative.components();
        components.next_back()?;
        // Under a hidden directory: never walked, and no symlink leads there (there are none).
        if components.any(|c| is_hidden(c.as_os_str())) {
            return Some(PathChange::Ignore);
        }
        match fs::symlink_metadata(path) {
            // `is_config_file` also refuses hidden names (a temporary file renamed over).
            Ok(meta) if meta.is_file() => Some(if is_config_file(path) {
                PathChange::Refresh
            } else {
                PathChange::Ignore
            }),
            // A new directory (its files came with it) or symlink.
            Ok(_) => None,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Some(PathChange::Gone),
            Err(_) => None,
        }
    }

    fn refresh_file(&mut self, path: &Path) {
        self.files_read += 1;
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.files.remove(path);
                return;
            }
            Err(e) => {
                let state = self.files.entry(path.to_path_buf()).or_default();
                state.content = None;
                state.errors = vec![SourceError::Read {
                    file: path.to_path_buf(),
                    reason: e.to_string(),
                }];
                return;
            }
        };
        if self
            .files
            .get(path)
            .is_some_and(|s| s.content.as_deref() == Some(&bytes[..]))
        {
            return;
        }
        let parsed = match std::str::from_utf8(&bytes) {
            Ok(text) => parse_file(text, path, &self.default_namespace),
            Err(e) => Err(SourceError::Syntax {
                file: path.to_path_buf(),
                reason: format!("not UTF-8: {e}"),
            }),
        };
        let state = self.files.entry(path.to_path_buf()).or_default();
        state.content = Some(bytes);
        let docs = match parsed {
            Ok(docs) => docs,
            Err(e) => {
                tracing::warn!(error = %e, kept = state.good.len(), "config file rejected: keeping its last good contents");
                state.errors = vec![e];
                return;
            }
        };
        // An invalid new version of a resource this file already defined keeps the last valid
        // version, as the API server keeps a resource whose update failed validation.
        let previous = std::mem::take(&mut state.good);
        state.errors.clear();
        for parsed in docs {
            match parsed.result {
                Ok(config) => {
                    if !config.kind.is_supported() {
                        let key = config.key();
                        state.errors.push(SourceError::Unsupported {
                            file: path.to_path_buf(),
                            doc: parsed.doc,
                            key,
                        });
                    }
                    state.good.push((parsed.doc, Arc::new(config)));
                }
                Err(e) => {
                    if e.is_invalid_resource() {
                        let kind = e.kind().unwrap_or_else(|| "unknown".to_owned());
                        if let Some(observer) = &self.observer {
                            observer(&kind);
                        }
                        *self.invalid_counts.entry(kind).or_default() += 1;
                    }
                    let kept = e
                        .invalid_key()
                        .and_then(|key| previous.iter().find(|(_, c)| c.key() == *key))
                        .cloned();
                    match kept {
                        Some(last_valid) => {
                            tracing::warn!(error = %e, "config update rejected: keeping the last valid version");
                            state.good.push(last_valid);
                        }
                        None => tracing::warn!(error = %e, "config document rejected"),
                    }
                    state.errors.push(e);
                }
            }
        }
    }

    /// Assembles the configs of every file. A key defined more than once goes to the file that
    /// served it before, while that file still defines it (a newcomer never replaces a live
    /// resource); otherwise to the first file by sorted path (the first document in a file). Each
    /// other copy is an error naming it, warned about and counted when it first appears.
    fn rebuild(&mut self) -> ConfigChange {
        let mut owners: BTreeMap<ConfigKey, &PathBuf> = BTreeMap::new();
        for (path, state) in &self.files {
            for (_, config) in &state.good {
                let key = config.key();
                let live = self.origins.get(&key) == Some(path);
                if live || !owners.contains_key(&key) {
                    owners.insert(key, path);
                }
            }
        }
        let mut configs = BTreeMap::new();
        let mut origins: BTreeMap<ConfigKey, PathBuf> = BTreeMap::new();
        let mut duplicates = Vec::new();
        for (path, state) in &self.files {
            for (doc, config) in &state.good {
                let key = config.key();
                let owner = owners.get(&key).copied().unwrap_or(path);
                if owner != path || origins.contains_key(&key) {
                    duplicates.push(SourceError::Duplicate {
                        file: path.clone(),
                        doc: *doc,
                        key,
                        first: owner.clone(),
                    });
                    continue;
                }
                origins.insert(key.clone(), path.clone());
                configs.insert(key, config.clone());
            }
        }
        self.warn_new_duplicates(&duplicates);
        let change = diff(&self.configs, &configs);
        self.configs = Arc::new(configs);
        self.origins = Arc::new(origins);
        self.duplicates = duplicates;
        change
    }

    /// As [`rebuild`](Self::rebuild) for `keys` only, the keys defined before or now by the files
    /// just `read` (or dropped): the other keys keep their owners, since their files did not
    /// change. A key's possible owners are the files just read, the file it came from and the
    /// files where it was a duplicate.
    fn rebuild_keys(&mut self, keys: &BTreeSet<ConfigKey>, read: Vec<PathBuf>) -> ConfigChange {
        if keys.is_empty() {
            return ConfigChange::default();
        }
        let mut holders: BTreeSet<PathBuf> = read.into_iter().collect();
        holders.extend(keys.iter().filter_map(|k| self.origins.get(k)).cloned());
        holders.extend(self.duplicates.iter().filter_map(|d| match d {
            SourceError::Duplicate { file, key, .. } if keys.contains(key) => Some(file.clone()),
            _ => None,
        }));
        // Each key's definitions in path order, then document order: the full rebuild's order.
        let mut definitions: BTreeMap<&ConfigKey, Vec<Definition<'_>>> = BTreeMap::new();
        for (path, state) in holders.iter().filter_map(|p| self.files.get_key_value(p)) {
            for (doc, config) in &state.good {
                if let Some(key) = keys.get(&config.key()) {
                    definitions.entry(key).or_default().push((path, *doc, config));
                }
            }
        }
        let configs = Arc::make_mut(&mut self.configs);
        let origins = Arc::make_mut(&mut self.origins);
        let mut duplicates: Vec<SourceError> = self
            .duplicates
            .iter()
            .filter(|d| !matches!(d, SourceError::Duplicate { key, .. } if keys.contains(key)))
            .cloned()
            .collect();
        let mut events = Vec::new();
        let mut deleted = Vec::new();
        for key in keys {
            let defs = definitions.get(key).map(Vec::as_slice).unwrap_or_default();
            let live = origins.get(key).filter(|o| defs.iter().any(|(p, ..)| p == o));
            let Some(owner) = live.or_else(|| defs.first().map(|(p, ..)| *p)).cloned() else {
                if let Some(old) = configs.remove(key) {
                    deleted.push(ConfigEvent::Deleted(old));
                }
                origins.remove(key);
                continue;
            };
            let mut winner = None;
            for (path, doc, config) in defs {
                if **path == owner && winner.is_none() {
                    winner = Some(*config);
                } else {
                    duplicates.push(SourceError::Duplicate {
                        file: (*path).clone(),
                        doc: *doc,
                        key: key.clone(),
                        first: owner.clone(),
                    });
                }
            }
            let Some(new) = winner else { continue };
            match configs.insert(key.clone(), new.clone()) {
                None => events.push(ConfigEvent::Added(new.clone())),
                Some(old) if !Arc::ptr_eq(&old, new) && old != *new => {
                    events.push(ConfigEvent::Updated { old, new: new.clone() })
                }
                Some(_) => {}
            }
            origins.insert(key.clone(), owner);
        }
        events.extend(deleted);
        duplicates.sort_by(|a, b| duplicate_order(a).cmp(&duplicate_order(b)));
        self.warn_new_duplicates(&duplicates);
        self.duplicates = duplicates;
        ConfigChange { events }
    }

    /// Gives the store maps of its own, copying those the last [`snapshot`](Self::snapshot)
    /// shares, so that the next read changes them in place. The watcher calls it while a batch
    /// settles, before the batch is read.
    pub(crate) fn detach(&mut self) {
        Arc::make_mut(&mut self.configs);
        Arc::make_mut(&mut self.origins);
    }

    fn warn_new_duplicates(&mut self, duplicates: &[SourceError]) {
        for d in duplicates.iter().filter(|d| !self.duplicates.contains(d)) {
            tracing::warn!(error = %d, "duplicate config ignored");
            let kind = d.kind().unwrap_or_else(|| "unknown".to_owned());
            if let Some(observer) = &self.observer {
                observer(&kind);
            }
            *self.invalid_counts.entry(kind).or_default() += 1;
        }
    }

    /// Every config, in key order.
    pub fn configs(&self) -> Vec<Arc<Config>> {
        self.configs.values().cloned().collect()
    }

    /// The configs as one shared map.
    pub fn config_snapshot(&self) -> ConfigSnapshot {
        self.configs.clone()
    }

    pub fn get(&self, key: &ConfigKey) -> Option<Arc<Config>> {
        self.configs.get(key).cloned()
    }

    /// The file a config came from.
    pub fn origin(&self, key: &ConfigKey) -> Option<&Path> {
        self.origins.get(key).map(PathBuf::as_path)
    }

    /// Every current problem, ordered by file.
    pub fn source_errors(&self) -> Vec<SourceError> {
        let mut errors: Vec<SourceError> = self.dir_error.iter().cloned().collect();
        errors.extend(self.walk_errors.iter().cloned());
        errors.extend(self.files.values().flat_map(|s| s.errors.iter().cloned()));
        errors.extend(self.duplicates.iter().cloned());
        errors.sort_by(|a, b| a.file().cmp(b.file()));
        errors
    }

    /// Every current problem as `/debug/config_errors` shows it. A file-level error says how many
    /// resources of the file's last good contents are still served.
    pub fn errors(&self) -> Vec<SourceErrorEntry> {
        self.source_errors()
            .iter()
            .map(|e| {
                let mut entry = e.to_entry();
                let kept = self.files.get(e.file()).map_or(0, |s| s.good.len());
                let kept = if matches!(e, SourceError::Directory { .. }) {
                    self.configs.len()
                } else {
                    kept
                };
                if e.is_file_level() && kept > 0 {
                    entry
                        .reason
                        .push_str(&format!(" (keeping the {kept} resources of its last good contents)"));
                }
                entry
            })
            .collect()
    }

    /// Rejected resources by kind since start; the counts behind `pilot_config_invalid{type}`.
    pub fn invalid_counts(&self) -> &BTreeMap<String, u64> {
        &self.invalid_counts
    }

    pub fn snapshot(&self) -> StoreSnapshot {
        StoreSnapshot {
            configs: self.configs.clone(),
            origins: self.origins.clone(),
            errors: Arc::new(self.errors()),
            invalid_counts: Arc::new(self.invalid_counts.clone()),
            scans: self.scans,
            files_read: self.files_read,
        }
    }
}

#[cfg(test)]
#[path = "store_tests.rs"]
mod tests;
