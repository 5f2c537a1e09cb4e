//! The secret manager (Istio's `SecretManagerClient`, security/pkg/nodeagent/cache): the
//! workload's certificate (`default`) and the mesh root (`ROOTCA`), signed by the CA from a key
//! made here, or read from files mounted at `./etc/certs`; any files named by `file-cert:` and
//! `file-root:` resources. The workload certificate is renewed when `SECRET_GRACE_PERIOD_RATIO`
//! (with jitter) of its life is left; files are watched. Every change bumps a generation that the
//! SDS streams follow, so Envoy gets the new secrets without restarting or dropping connections.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

use super::ca_client::{CaClient, CaClientError, Signed};
use super::files::{self, FileSecretError};
use super::problem::{Problem, describe};
use crate::config::SecretConfig;

/// Istio's `WorkloadKeyCertResourceName`.
pub const WORKLOAD: &str = "default";
/// Istio's `RootCertReqResourceName`.
pub const ROOT: &str = "ROOTCA";
pub(super) const FILE_CERT_PREFIX: &str = "file-cert:";
pub(super) const FILE_ROOT_PREFIX: &str = "file-root:";
/// Istio's mounted-certificate files (`./etc/certs`).
pub(super) const CERT_CHAIN_FILE: &str = "cert-chain.pem";
pub(super) const KEY_FILE: &str = "key.pem";
pub(super) const ROOT_CERT_FILE: &str = "root-cert.pem";

const FILE_POLL: Duration = Duration::from_secs(2);
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// One secret as SDS serves it.
#[derive(Clone, PartialEq, Eq)]
pub enum SecretItem {
    Certificate { cert_chain_pem: String, key_pem: String },
    Root { root_pem: String },
}

impl std::fmt::Debug for SecretItem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretItem::Certificate { cert_chain_pem, .. } => f
                .debug_struct("Certificate")
                .field("cert_chain_pem", cert_chain_pem)
                .finish_non_exhaustive(),
            SecretItem::Root { root_pem } => f.debug_struct("Root").field("root_pem", root_pem).finish(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("unknown secret {0:?} (served: default, ROOTCA, file-cert:<cert>~<key>, file-root:<root>)")]
    Unknown(String),
    /// A secret file that cannot be read or is not PEM certificates/keys; counted in
    /// `istio_agent_num_file_secret_failures_total`.
    #[error(transparent)]
    File(#[from] FileSecretError),
    #[error(transparent)]
    Ca(#[from] CaClientError),
    #[error("no CA to sign the workload certificate and no certificate files in {0}")]
    NoCa(PathBuf),
}

#[derive(Debug, Clone)]
struct Workload {
    signed: Signed,
    /// When the agent got it.
    created: SystemTime,
    not_after: SystemTime,
}

struct Inner {
    identity: String,
    ca: Option<CaClient>,
    config: SecretConfig,
    cert_dir: PathBuf,
    workload: tokio::sync::Mutex<Option<Workload>>,
    /// Bumped on every change of a secret.
    generation: watch::Sender<u64>,
    /// Modification times of the files served, for the watcher.
    files: Mutex<BTreeMap<PathBuf, Option<SystemTime>>>,
    /// Why the last attempt to get the workload certificate failed, for the log and readiness.
    problem: Problem,
    /// Istio's `num_file_secret_failures_total`.
    file_failures: Counter,
}

/// Shared by the SDS server and the renewal task.
#[derive(Clone)]
pub struct SecretManager {
    inner: Arc<Inner>,
}

impl SecretManager {
    /// A manager for `identity` (`spiffe://<td>/ns/<ns>/sa/<sa>`) signed by `ca`, serving the
    /// files of `cert_dir` instead when they are there.
    pub fn new(identity: String, ca: Option<CaClient>, config: SecretConfig, cert_dir: PathBuf) -> SecretManager {
        SecretManager {
            inner: Arc::new(Inner {
                identity,
                ca,
                config,
                cert_dir,
                workload: tokio::sync::Mutex::new(None),
                generation: watch::channel(0).0,
                files: Mutex::new(BTreeMap::new()),
                problem: Problem::default(),
                file_failures: Counter::default(),
            }),
        }
    }

    /// Registers Istio's `istio_agent_num_file_secret_failures_total`.
    pub fn register_metrics(&self, registry: &mut Registry) {
        // OpenMetrics adds `_total` again; the merged scrape strips it.
        registry.register(
            "istio_agent_num_file_secret_failures_total",
            "Number of times secret generation failed for files",
            self.inner.file_failures.clone(),
        );
    }

    /// How many times a secret file could not be served.
    pub fn file_secret_failures(&self) -> u64 {
        self.inner.file_failures.get()
    }

    pub fn identity(&self) -> &str {
        &self.inner.identity
    }

    /// Why the workload certificate could not be had, while it cannot.
    pub fn problem(&self) -> Problem {
        self.inner.problem.clone()
    }

    /// Changes: the value is bumped whenever a secret changed.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.generation.subscribe()
    }

    /// Whether the workload certificate comes from `./etc/certs` (Istio's mounted certs).
    fn uses_mounted_files(&self) -> bool {
        let d = &self.inner.cert_dir;
        d.join(CERT_CHAIN_FILE).is_file() && d.join(KEY_FILE).is_file()
    }

    /// The secret `name`, signing the workload certificate first if there is none yet.
    pub async fn generate(&self, name: &str) -> Result<SecretItem, SecretError> {
        let dir = self.inner.cert_dir.clone();
        match name {
            WORKLOAD if self.uses_mounted_files() => self.key_pair(dir.join(CERT_CHAIN_FILE), dir.join(KEY_FILE)).await,
            ROOT if self.uses_mounted_files() && dir.join(ROOT_CERT_FILE).is_file() => {
                self.root(dir.join(ROOT_CERT_FILE)).await
            }
            WORKLOAD => {
                let w = self.workload().await?;
                Ok(SecretItem::Certificate {
                    cert_chain_pem: w.signed.cert_chain_pem,
                    key_pem: w.signed.key_pem,
                })
            }
            ROOT => Ok(SecretItem::Root {
                root_pem: self.workload().await?.signed.root_pem,
            }),
            _ => {
                if let Some(paths) = name.strip_prefix(FILE_CERT_PREFIX) {
                    let (cert, key) = paths
                        .split_once('~')
                        .ok_or_else(|| SecretError::Unknown(name.to_owned()))?;
                    self.key_pair(PathBuf::from(cert), PathBuf::from(key)).await
                } else if let Some(path) = name.strip_prefix(FILE_ROOT_PREFIX) {
                    self.root(PathBuf::from(path)).await
                } else {
                    Err(SecretError::Unknown(name.to_owned()))
                }
            }
        }
    }

    /// Reads a root certificate file (see [`files::read_root`]) and remembers it for the watcher.
    async fn root(&self, path: PathBuf) -> Result<SecretItem, SecretError> {
        let stamp = modified(&path);
        match files::read_root(path.clone()).await {
            Ok(root_pem) => {
                lock(&self.inner.files).insert(path, stamp);
                Ok(SecretItem::Root { root_pem })
            }
            Err(e) => Err(self.file_failed(e)),
        }
    }

    /// Reads a certificate chain and its key (see [`files::read_key_pair`]) and remembers the
    /// chain for the watcher (as Istio: the key does not change without the certificate).
    async fn key_pair(&self, cert: PathBuf, key: PathBuf) -> Result<SecretItem, SecretError> {
        let stamp = modified(&cert);
        match files::read_key_pair(cert.clone(), key).await {
            Ok((cert_chain_pem, key_pem)) => {
                lock(&self.inner.files).insert(cert, stamp);
                Ok(SecretItem::Certificate {
                    cert_chain_pem,
                    key_pem,
                })
            }
            Err(e) => Err(self.file_failed(e)),
        }
    }

    fn file_failed(&self, error: FileSecretError) -> SecretError {
        self.inner.file_failures.inc();
        SecretError::File(error)
    }

    /// The current workload certificate, signed now if there is none or it expired.
    async fn workload(&self) -> Result<Workload, SecretError> {
        let mut current = self.inner.workload.lock().await;
        if let Some(w) = current.as_ref().filter(|w| w.not_after > SystemTime::now()) {
            return Ok(w.clone());
        }
        match self.sign().await {
            Ok(w) => {
                self.inner.problem.cleared();
                *current = Some(w.clone());
                Ok(w)
            }
            Err(e) => {
                let line = describe(&self.inner.identity, &e, self.inner.ca.as_ref(), &self.inner.cert_dir);
                if self.inner.problem.failed(line.clone()) {
                    tracing::error!("{line}");
                }
                Err(e)
            }
        }
    }

    async fn sign(&self) -> Result<Workload, SecretError> {
        let ca = self
            .inner
            .ca
            .as_ref()
            .ok_or_else(|| SecretError::NoCa(self.inner.cert_dir.clone()))?;
        let signed = ca
            .sign(&self.inner.identity, self.inner.config.ttl, self.inner.config.key)
            .await?;
        // The lifetime counts from now, not from the certificate's notBefore (backdated for
        // clock skew), as Istio's `rotateTime` counts from the secret's creation.
        let created = SystemTime::now();
        let not_after = validity(&signed.cert_chain_pem).map_or(created + self.inner.config.ttl, |(_, end)| end);
        tracing::info!(
            identity = %self.inner.identity,
            expires_in = ?not_after.duration_since(SystemTime::now()).unwrap_or_default(),
            "workload certificate signed"
        );
        Ok(Workload {
            signed,
            created,
            not_after,
        })
    }

    /// When the current workload certificate is to be renewed (Istio's `rotateTime`): its expiry
    /// minus `grace ± jitter` of its lifetime.
    fn renew_at(&self, w: &Workload) -> SystemTime {
        let cfg = &self.inner.config;
        let random = RandomState::new().hash_one(SystemTime::now()) as f64 / u64::MAX as f64;
        let jitter = (random * 2.0 - 1.0) * cfg.grace_period_ratio_jitter;
        let ratio = (cfg.grace_period_ratio + jitter).clamp(0.0, 1.0);
        let life = w.not_after.duration_since(w.created).unwrap_or_default();
        w.not_after - life.mul_f64(ratio)
    }

    /// Renews the workload certificate before it expires and watches the served files, for as
    /// long as the agent runs.
    pub async fn run(self) {
        let mut retry = RETRY_MIN;
        loop {
            let current = self.inner.workload.lock().await.clone();
            let due = current
                .filter(|_| !self.uses_mounted_files())
                .map(|w| self.renew_at(&w));
            let now = SystemTime::now();
            match due {
                Some(at) if at <= now => {
                    match self.sign().await {
                        Ok(w) => {
                            retry = RETRY_MIN;
                            *self.inner.workload.lock().await = Some(w);
                            self.inner.generation.send_modify(|g| *g += 1);
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, ?retry, "renewing the workload certificate failed; the current one stays until it expires");
                            tokio::time::sleep(retry).await;
                            retry = (retry * 2).min(RETRY_MAX);
                        }
                    }
                    continue;
                }
                Some(at) => tokio::time::sleep(at.duration_since(now).unwrap_or_default().min(FILE_POLL)).await,
                // nothing signed yet: SDS signs on Envoy's first request
                None => tokio::time::sleep(FILE_POLL).await,
            }
            self.check_files();
        }
    }

    /// Bumps the generation when a served file changed.
    fn check_files(&self) {
        let changed = {
            let mut files = lock(&self.inner.files);
            let mut changed = false;
            for (path, stamp) in files.iter_mut() {
                let now = modified(path);
                if now != *stamp {
                    *stamp = now;
                    changed = true;
                }
            }
            changed
        };
        if changed {
            tracing::info!("certificate files changed: pushing them to Envoy");
            self.inner.generation.send_modify(|g| *g += 1);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The leaf's validity period.
pub(crate) fn validity(chain_pem: &str) -> Option<(SystemTime, SystemTime)> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let der = CertificateDer::from_pem_slice(chain_pem.as_bytes()).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).ok()?;
    let at = |t: i64| -> Option<SystemTime> { Some(UNIX_EPOCH + Duration::from_secs(u64::try_from(t).ok()?)) };
    Some((
        at(cert.validity().not_before.timestamp())?,
        at(cert.validity().not_after.timestamp())?,
    ))
}
