//! An external serving certificate from files (Istio's `initFileCertificateWatches`,
//! pilot/pkg/bootstrap/certcontroller.go, and `KeyCertBundle.SetFromFilesAndNotify`): read at
//! start, then watched; a change of any of the three files is read again 100 ms later (Istio's
//! `watchDebounceDelay`) and, when it makes a valid bundle that differs, published. A bundle
//! that does not load (a key of another certificate, half of a rotation written) is logged and
//! counted in `pilot_istiod_cert_errors_total`, and the last good one keeps serving.
//!
//! The directories are watched rather than the files: a Kubernetes Secret or ConfigMap mount
//! replaces its files by swapping a `..data` symlink, which changes no watched file's inode.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, watch};

use super::bundle::{BundleError, Bundles, KeyCertBundle, log_loaded};
use super::source::TlsFiles;

/// Istio's `watchDebounceDelay`.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// Reads the three files into a bundle.
pub fn load(files: &TlsFiles) -> Result<KeyCertBundle, BundleError> {
    let read = |p: &Path| {
        std::fs::read_to_string(p).map_err(|source| BundleError::Read {
            path: p.display().to_string(),
            source,
        })
    };
    KeyCertBundle::new(read(&files.cert)?, read(&files.key)?, read(&files.ca)?)
}

/// Loads `files` and keeps the published bundle up to date with them for as long as the
/// returned receivers live. An error when they cannot be read at start.
pub fn watch_files(files: TlsFiles, errors: Counter) -> anyhow::Result<Bundles> {
    let first = load(&files).map_err(|e| {
        anyhow::anyhow!(
            "istiod's serving certificate from {}, {} and {}: {e}",
            files.cert.display(),
            files.key.display(),
            files.ca.display()
        )
    })?;
    log_loaded(&first, &format!("loaded from {}", files.cert.display()));
    let (tx, rx) = watch::channel(Arc::new(first));
    let (events_tx, events) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let _ = events_tx.send(event.map(|_| ()).map_err(|e| e.to_string()));
    })?;
    let mut dirs: Vec<PathBuf> = [&files.cert, &files.key, &files.ca]
        .iter()
        .map(|p| {
            p.parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."))
                .to_path_buf()
        })
        .collect();
    dirs.sort();
    dirs.dedup();
    for dir in &dirs {
        watcher
            .watch(dir, RecursiveMode::NonRecursive)
            .map_err(|e| anyhow::anyhow!("watching {} for istiod's serving certificate: {e}", dir.display()))?;
        tracing::info!(dir = %dir.display(), "watching istiod's serving certificate files");
    }
    tokio::spawn(follow(files, watcher, events, tx, errors));
    Ok(rx)
}

async fn follow(
    files: TlsFiles,
    _watcher: notify::RecommendedWatcher,
    mut events: mpsc::UnboundedReceiver<Result<(), String>>,
    tx: watch::Sender<Arc<KeyCertBundle>>,
    errors: Counter,
) {
    while let Some(event) = events.recv().await {
        if let Err(e) = event {
            tracing::warn!("watching istiod's serving certificate files: {e}");
            continue;
        }
        tokio::time::sleep(DEBOUNCE).await;
        while events.try_recv().is_ok() {}
        match load(&files) {
            Ok(bundle) => {
                let current = tx.borrow().clone();
                if bundle.cert_chain_pem == current.cert_chain_pem
                    && bundle.key_pem == current.key_pem
                    && bundle.ca_bundle_pem == current.ca_bundle_pem
                {
                    continue;
                }
                log_loaded(&bundle, &format!("reloaded from {}", files.cert.display()));
                tx.send_replace(Arc::new(bundle));
            }
            Err(e) => {
                errors.inc();
                tracing::warn!(
                    "istiod's serving certificate: {e}; still serving the one loaded before (cert {})",
                    files.cert.display()
                );
            }
        }
        if tx.is_closed() {
            return;
        }
    }
}
