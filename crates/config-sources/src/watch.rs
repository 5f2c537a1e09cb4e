//! Watching a config directory: a thread that waits for file-system events (notify, recursive),
//! debounces each burst, rescans the whole directory and sends what changed. It survives the
//! directory vanishing and coming back, Kubernetes ConfigMap `..data` swaps, and a failing
//! inotify (it falls back to polling).

use std::path::{Path, PathBuf};
use std::sync::mpsc as std_mpsc;
use std::thread;
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};

use crate::error::SourceError;
use crate::events::ConfigChange;
use crate::store::{FileConfigStore, StoreSnapshot};

/// Quiet period after the last file event before rescanning (Istio's file debounce).
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(100);
/// How often to poll while the directory cannot be watched, and to check for shutdown.
const POLL_INTERVAL: Duration = Duration::from_secs(1);
/// Changes not yet taken by the consumer before the watcher waits for it.
const CHANGE_QUEUE: usize = 64;

/// A running watch of a config directory. Dropping `changes` stops it (within a second).
#[derive(Debug)]
pub struct ConfigDirWatch {
    /// The store as first read; `changes` are relative to it.
    pub initial: StoreSnapshot,
    /// One `ConfigChange` per debounced burst that changed any config.
    pub changes: mpsc::Receiver<ConfigChange>,
    /// The latest state after every rescan (configs, errors, counts), for `/debug/configz`.
    pub state: watch::Receiver<StoreSnapshot>,
}

/// Reads `dir` and starts watching it. Fails only when `dir` cannot be read at start.
pub fn watch(dir: impl Into<PathBuf>, debounce: Duration) -> Result<ConfigDirWatch, SourceError> {
    let store = FileConfigStore::load(dir)?;
    watch_store(store, debounce)
}

/// Starts watching the directory of an already-read `store` (e.g. one with an invalid-config
/// observer set). Fails only when the watcher thread cannot be started.
pub fn watch_store(store: FileConfigStore, debounce: Duration) -> Result<ConfigDirWatch, SourceError> {
    let initial = store.snapshot();
    let (changes_tx, changes) = mpsc::channel(CHANGE_QUEUE);
    let (state_tx, state) = watch::channel(initial.clone());
    let dir = store.dir().to_path_buf();
    let (signal_tx, signal_rx) = std_mpsc::channel();
    let mut dir_watch = DirWatcher {
        dir: dir.clone(),
        store,
        debounce,
        max_delay: debounce.saturating_mul(10).max(Duration::from_secs(1)),
        signal_tx,
        signal_rx,
        watcher: None,
        watched: None,
        changes: changes_tx,
        state: state_tx,
    };
    dir_watch.ensure_watched();
    // One rescan right away catches what changed between the load and the start of the watch.
    let _ = dir_watch.signal_tx.send(());
    thread::Builder::new()
        .name("config-dir-watch".into())
        .spawn(move || dir_watch.run())
        .map_err(|e| SourceError::Watch {
            dir,
            reason: format!("cannot start the watcher thread: {e}"),
        })?;
    Ok(ConfigDirWatch {
        initial,
        changes,
        state,
    })
}

/// Identity of the directory being watched, to notice it was replaced.
type DirIdentity = (u64, u64);

struct DirWatcher {
    dir: PathBuf,
    store: FileConfigStore,
    debounce: Duration,
    max_delay: Duration,
    signal_tx: std_mpsc::Sender<()>,
    signal_rx: std_mpsc::Receiver<()>,
    watcher: Option<RecommendedWatcher>,
    /// The directory the notify watch is on; `None` while not watching (then we poll).
    watched: Option<DirIdentity>,
    changes: mpsc::Sender<ConfigChange>,
    state: watch::Sender<StoreSnapshot>,
}

impl DirWatcher {
    fn run(mut self) {
        loop {
            match self.signal_rx.recv_timeout(POLL_INTERVAL) {
                Ok(()) => self.wait_for_quiet(),
                Err(std_mpsc::RecvTimeoutError::Timeout) if self.watched.is_some() => {
                    if self.changes.is_closed() {
                        return;
                    }
                    continue;
                }
                // Not watching (or no watcher at all): poll.
                Err(_) => {}
            }
            if self.changes.is_closed() {
                return;
            }
            self.ensure_watched();
            let change = self.store.rescan();
            if !change.is_empty() {
                tracing::info!(dir = %self.dir.display(), events = change.events.len(), "config directory changed");
                if self.changes.blocking_send(change).is_err() {
                    return;
                }
            }
            self.state.send_replace(self.store.snapshot());
        }
    }

    /// Swallows the rest of a burst: returns after `debounce` without events, or at `max_delay`.
    fn wait_for_quiet(&self) {
        let deadline = Instant::now() + self.max_delay;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || self.signal_rx.recv_timeout(self.debounce.min(left)).is_err() {
                return;
            }
        }
    }

    /// (Re)starts the notify watch when the directory is not watched or was replaced.
    fn ensure_watched(&mut self) {
        let current = identity(&self.dir);
        if current.is_some() && current == self.watched {
            return;
        }
        if let (Some(watcher), Some(_)) = (self.watcher.as_mut(), self.watched.take()) {
            let _ = watcher.unwatch(&self.dir);
        }
        if current.is_none() {
            return;
        }
        if self.watcher.is_none() {
            let tx = self.signal_tx.clone();
            match notify::recommended_watcher(move |event: notify::Result<notify::Event>| match event {
                Ok(event) if is_noise(&event.kind) => {}
                Ok(_) => {
                    let _ = tx.send(());
                }
                Err(e) => {
                    tracing::warn!(error = %e, "config directory watch error: rescanning");
                    let _ = tx.send(());
                }
            }) {
                Ok(watcher) => self.watcher = Some(watcher),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot create a file watcher: polling the config directory");
                    return;
                }
            }
        }
        let Some(watcher) = self.watcher.as_mut() else { return };
        match watcher.watch(&self.dir, RecursiveMode::Recursive) {
            Ok(()) => self.watched = current,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "cannot watch the config directory: polling")
            }
        }
    }
}

/// Events that never change what a file holds: opens, reads, and closes after reading (our own
/// rescans cause these).
fn is_noise(kind: &EventKind) -> bool {
    matches!(kind, EventKind::Access(access) if !matches!(access, AccessKind::Close(AccessMode::Write)))
}

#[cfg(unix)]
fn identity(dir: &Path) -> Option<DirIdentity> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir)
        .ok()
        .filter(|m| m.is_dir())
        .map(|m| (m.dev(), m.ino()))
}

#[cfg(not(unix))]
fn identity(dir: &Path) -> Option<DirIdentity> {
    std::fs::metadata(dir).ok().filter(|m| m.is_dir()).map(|_| (0, 0))
}

#[cfg(test)]
#[path = "watch_tests.rs"]
mod tests;
