//! The plugged-in CA reloaded when its files change, without a restart: istiod's
//! `initCACertsAndCRLWatcher`, `handleCACertsFileWatch` and `handleEvent`
//! (pilot/pkg/bootstrap/istio_ca.go), then `updateRootCertAndGenKeyCert`
//! (pilot/pkg/bootstrap/certcontroller.go) through the serving certificate's rotation.
//!
//! Only a plugged-in CA (`ca-cert.pem`, `ca-key.pem`, `root-cert.pem`, `cert-chain.pem` in
//! `ROOT_CA_DIR`, mounted from the `cacerts` Secret) is watched, as istiod does; a self-signed
//! root is not. The directory is watched, not the files: a Secret mount replaces its files by
//! swapping a `..data` symlink. A change is read 100 ms later (istiod's debounce), and then:
//! - `root-cert.pem` holds other roots than the current ones: refused, as istiod without
//!   `ISTIO_MULTIROOT_MESH` (which needs trust-anchor distribution we do not have): a warning
//!   naming the directory, counted as `root_changed`, the current CA keeps signing;
//! - the four files do not make a CA (one missing, a key of another certificate, a chain that
//!   does not verify to the root, expired, not PEM): an error naming the file and why, counted
//!   as `invalid`, the current CA keeps signing. Never a self-signed root in its place;
//! - the same signing certificate and chain: nothing;
//! - else the new intermediate signs from then on: the CA service follows the published CA, and
//!   istiod's serving certificate is signed again by it (`serving_cert::rotate`); counted as
//!   `updated`, with `citadel_server_root_cert_expiry_timestamp` and
//!   `citadel_server_cert_chain_expiry_timestamp` recorded again (Istio's `RecordCertsExpiry`).
//!
//! Istio compares the bytes of `root-cert.pem`; here the certificates it holds are compared, so
//! the same roots written out again (other line breaks, a comment) are not a root change.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ca::{CaError, CaSource, CertificateAuthority};
use notify::{EventKind, RecursiveMode, Watcher};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use security::CaMetrics;
use tokio::sync::{mpsc, watch};

/// istiod's debounce of `cacerts` events.
const DEBOUNCE: Duration = Duration::from_millis(100);

/// The current mesh CA; a new value when the plugged-in files are replaced.
pub type CaWatch = watch::Receiver<Arc<CertificateAuthority>>;

/// `pilot_ca_cacerts_reloads{result="updated"|"root_changed"|"invalid"}` (a counter, without
/// `_total` as Istio's counters are exposed).
#[derive(Clone, Default)]
pub struct ReloadMetrics {
    reloads: Family<Vec<(String, String)>, Counter>,
}

impl ReloadMetrics {
    pub fn register(registry: &mut Registry) -> ReloadMetrics {
        let m = ReloadMetrics::default();
        registry.register(
            "pilot_ca_cacerts_reloads",
            "Reloads of the plugged-in CA (ROOT_CA_DIR) after its files changed, by result: updated (a new \
             intermediate signs), root_changed (refused: a new root is not supported), invalid (refused: the \
             files do not make a CA)",
            m.reloads.clone(),
        );
        m
    }

    fn count(&self, result: &str) {
        self.reloads
            .get_or_create(&vec![("result".to_owned(), result.to_owned())])
            .inc();
    }

    #[cfg(test)]
    pub fn get(&self, result: &str) -> u64 {
        self.reloads
            .get_or_create(&vec![("result".to_owned(), result.to_owned())])
            .get()
    }
}

/// What reading the plugged-in CA's directory again decided.
#[derive(Debug)]
pub enum Reload {
    /// A new signing certificate under the same roots.
    Updated(Box<CertificateAuthority>),
    /// The same signing certificate and chain.
    Unchanged,
    /// `root-cert.pem` holds other roots: not supported.
    RootChanged,
    /// The files do not make a CA.
    Invalid(CaError),
}

/// Reads `current`'s directory again, as istiod's `handleEvent`: the roots first, then the whole
/// plugged-in bundle, checked as at start.
pub fn decide(current: &CertificateAuthority) -> Reload {
    let dir = current.dir();
    let roots = match CertificateAuthority::read_root_certs(dir) {
        Ok(r) => r,
        Err(e) => return Reload::Invalid(e),
    };
    if roots != current.roots() {
        return Reload::RootChanged;
    }
    match CertificateAuthority::load_plugged(dir) {
        Err(e) => Reload::Invalid(e),
        Ok(new) if new.signing_cert() == current.signing_cert() && new.cert_chain() == current.cert_chain() => {
            Reload::Unchanged
        }
        Ok(new) => Reload::Updated(Box::new(new)),
    }
}

/// Publishes `ca` and, when it is plugged in, follows its directory for as long as a receiver of
/// the returned watch lives. A directory that cannot be watched is logged (as istiod) and the CA
/// is then fixed until a restart.
pub fn follow(ca: CertificateAuthority, metrics: ReloadMetrics, ca_metrics: CaMetrics) -> CaWatch {
    let dir = ca.dir().to_path_buf();
    let plugged = ca.source() == CaSource::PluggedIn;
    let (tx, rx) = watch::channel(Arc::new(ca));
    if !plugged {
        return rx;
    }
    match watch_dir(&dir) {
        Ok((watcher, events)) => {
            tracing::info!(dir = %dir.display(), "watching the plugged-in CA's files (cacerts) for a new intermediate");
            tokio::spawn(run(tx, watcher, events, metrics, ca_metrics));
        }
        Err(e) => tracing::warn!(
            dir = %dir.display(),
            "cannot watch the plugged-in CA's files: {e}; a new intermediate is used only after a restart"
        ),
    }
    rx
}

type Events = mpsc::UnboundedReceiver<Result<bool, String>>;

fn watch_dir(dir: &Path) -> notify::Result<(notify::RecommendedWatcher, Events)> {
    let (events_tx, events) = mpsc::unbounded_channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let _ = events_tx.send(event.map(|e| relevant(&e.kind)).map_err(|e| e.to_string()));
    })?;
    watcher.watch(dir, RecursiveMode::NonRecursive)?;
    Ok((watcher, events))
}

/// istiod reacts to writes and creations (a rename into the directory is one); not to reads,
/// which reloading itself makes, nor to removals or attribute changes (fsnotify's `Chmod`).
fn relevant(kind: &EventKind) -> bool {
    use notify::event::{AccessKind, AccessMode, ModifyKind};
    match kind {
        EventKind::Create(_) | EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Modify(m) => !matches!(m, ModifyKind::Metadata(_)),
        _ => false,
    }
}

async fn run(
    tx: watch::Sender<Arc<CertificateAuthority>>,
    _watcher: notify::RecommendedWatcher,
    mut events: Events,
    metrics: ReloadMetrics,
    ca_metrics: CaMetrics,
) {
    loop {
        let event = tokio::select! {
            e = events.recv() => e,
            _ = tx.closed() => return,
        };
        match event {
            None => return,
            Some(Err(e)) => {
                tracing::warn!("watching the plugged-in CA's files: {e}");
                continue;
            }
            Some(Ok(false)) => continue,
            Some(Ok(true)) => {}
        }
        tokio::time::sleep(DEBOUNCE).await;
        while events.try_recv().is_ok() {}
        let current = tx.borrow().clone();
        apply(&tx, &current, decide(&current), &metrics, &ca_metrics);
    }
}

/// Publishes, logs and counts what [`decide`] found.
fn apply(
    tx: &watch::Sender<Arc<CertificateAuthority>>,
    current: &CertificateAuthority,
    reload: Reload,
    metrics: &ReloadMetrics,
    ca_metrics: &CaMetrics,
) {
    let dir = current.dir().display();
    match reload {
        Reload::Unchanged => tracing::debug!(%dir, "plugged-in CA files changed; same signing certificate"),
        Reload::RootChanged => {
            metrics.count("root_changed");
            tracing::warn!(
                %dir,
                "the plugged-in CA's root-cert.pem in {dir} holds other roots: updating the root CA is not \
                 supported (Istio's ISTIO_MULTIROOT_MESH is not implemented); still signing with the current CA"
            );
        }
        Reload::Invalid(e) => {
            metrics.count("invalid");
            tracing::error!(%dir, "failed to update the plugged-in CA: {e}; still signing with the current CA");
        }
        Reload::Updated(new) => {
            metrics.count("updated");
            ca_metrics.record_expiry(&new);
            tracing::info!(
                %dir,
                not_after = %new.signing_cert_not_after(),
                "Istiod has detected the newly added intermediate CA and updated its key and certs accordingly"
            );
            tx.send_replace(Arc::from(new));
        }
    }
}

#[cfg(test)]
mod tests;
