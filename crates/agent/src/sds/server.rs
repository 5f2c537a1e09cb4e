//! The SDS server Envoy's `sds-grpc` cluster points at (Istio's `security/pkg/nodeagent/sds`):
//! `SecretDiscoveryService/StreamSecrets` over the agent's Unix socket. Each stream answers the
//! names Envoy asks for with the secret manager's secrets, and again whenever they change
//! (renewal, new files): Envoy swaps them in place, so connections stay up.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, UnixListenerStream};
use tonic::{Request, Response, Status, Streaming};
use xds_api::envoy::config::core::v3::{DataSource, data_source};
use xds_api::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, Secret, TlsCertificate, secret,
};
use xds_api::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use xds_api::envoy::service::secret::v3::secret_discovery_service_server::{
    SecretDiscoveryService, SecretDiscoveryServiceServer,
};

use super::cache::{SecretError, SecretItem, SecretManager, WORKLOAD};
use super::problem::Problem;

const SECRET_TYPE: &str = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret";
const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// What the readiness probe asks: does Envoy have the workload certificate it asked for, and if
/// not, why?
#[derive(Clone, Default, Debug)]
pub struct SdsStatus {
    /// Per stream: asked for `default` and not yet ACKed an answer carrying it.
    waiting: Arc<Mutex<BTreeMap<u64, bool>>>,
    /// Why the secret manager could not get the certificate, while it cannot.
    problem: Problem,
}

impl SdsStatus {
    /// `Some(reason)` while a stream of Envoy waits for its workload certificate.
    pub fn pending(&self) -> Option<String> {
        self.waiting().then(|| {
            self.problem
                .current()
                .unwrap_or_else(|| "Envoy has not received its workload certificate yet".to_owned())
        })
    }

    /// `Some(reason)` while Envoy waits for a certificate that could not be had: the cause of
    /// any other readiness failure (Envoy's clusters wait for it), so it is said first.
    pub fn failing(&self) -> Option<String> {
        self.problem.current().filter(|_| self.waiting())
    }

    fn waiting(&self) -> bool {
        lock(&self.waiting).values().any(|w| *w)
    }

    fn set(&self, stream: u64, waiting: bool) {
        lock(&self.waiting).insert(stream, waiting);
    }

    fn remove(&self, stream: u64) {
        lock(&self.waiting).remove(&stream);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The running SDS server.
pub struct SdsServer {
    path: PathBuf,
    status: SdsStatus,
    stop: Option<oneshot::Sender<()>>,
}

impl SdsServer {
    /// Serves `secrets` on the Unix socket at `path`.
    pub fn start(path: &Path, secrets: SecretManager) -> std::io::Result<SdsServer> {
        let listener = crate::xds_proxy::bind(path)?;
        let status = SdsStatus {
            problem: secrets.problem(),
            ..SdsStatus::default()
        };
        let service = SdsService {
            secrets,
            status: status.clone(),
            streams: Arc::new(AtomicU64::new(0)),
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tonic::transport::Server::builder()
            .add_service(SecretDiscoveryServiceServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            });
        let shown = path.display().to_string();
        tokio::spawn(async move {
            if let Err(e) = server.await {
                tracing::error!(path = shown, error = %e, "SDS server failed");
            }
        });
        tracing::info!(path = %path.display(), "SDS server listening");
        Ok(SdsServer {
            path: path.to_path_buf(),
            status,
            stop: Some(stop),
        })
    }

    pub fn status(&self) -> SdsStatus {
        self.status.clone()
    }
}

impl Drop for SdsServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

#[derive(Clone)]
struct SdsService {
    secrets: SecretManager,
    status: SdsStatus,
    streams: Arc<AtomicU64>,
}

type Outbound<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl SecretDiscoveryService for SdsService {
    type DeltaSecretsStream = Outbound<DeltaDiscoveryResponse>;
    type StreamSecretsStream = Outbound<DiscoveryResponse>;

    async fn delta_secrets(
        &self,
        _request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaSecretsStream>, Status> {
        Err(Status::unimplemented(
            "SDS is served as state of the world (StreamSecrets), as Istio's agent",
        ))
    }

    async fn stream_secrets(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamSecretsStream>, Status> {
        let (tx, rx) = mpsc::channel(4);
        let id = self.streams.fetch_add(1, Ordering::Relaxed);
        let stream = SdsStream {
            id,
            secrets: self.secrets.clone(),
            status: self.status.clone(),
            out: tx,
            names: Vec::new(),
            nonce: 0,
            version: 0,
        };
        tokio::spawn(stream.run(request.into_inner()));
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn fetch_secrets(&self, request: Request<DiscoveryRequest>) -> Result<Response<DiscoveryResponse>, Status> {
        let req = request.into_inner();
        let mut resources = Vec::new();
        for name in &req.resource_names {
            let item = self
                .secrets
                .generate(name)
                .await
                .map_err(|e| Status::unavailable(e.to_string()))?;
            resources.push(xds_api::pack(&to_secret(name, &item)));
        }
        Ok(Response::new(DiscoveryResponse {
            version_info: "1".into(),
            resources,
            type_url: SECRET_TYPE.into(),
            ..Default::default()
        }))
    }
}

struct SdsStream {
    id: u64,
    secrets: SecretManager,
    status: SdsStatus,
    out: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    names: Vec<String>,
    nonce: u64,
    version: u64,
}

impl SdsStream {
    async fn run(mut self, mut inbound: Streaming<DiscoveryRequest>) {
        let mut changes = self.secrets.changes();
        let mut retry: Option<Duration> = None;
        loop {
            let timer = async {
                match retry {
                    Some(d) => tokio::time::sleep(d).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                msg = inbound.message() => match msg {
                    Ok(Some(req)) => {
                        if let Some(e) = &req.error_detail {
                            tracing::warn!(names = ?req.resource_names, "SDS: Envoy rejected secrets: {}", e.message);
                            continue;
                        }
                        let ack = !req.response_nonce.is_empty() && req.response_nonce == self.nonce.to_string();
                        if ack && req.resource_names == self.names {
                            // Envoy has what it asked for
                            self.status.set(self.id, false);
                            continue;
                        }
                        self.names = req.resource_names;
                        self.status.set(self.id, self.names.iter().any(|n| n == WORKLOAD));
                        retry = self.push().await.err();
                    }
                    Ok(None) | Err(_) => break,
                },
                changed = changes.changed() => {
                    if changed.is_err() { break; }
                    if !self.names.is_empty() {
                        retry = self.push().await.err();
                    }
                }
                () = timer => {
                    let last = retry.unwrap_or(RETRY_MIN);
                    retry = self.push().await.err().map(|_| (last * 2).min(RETRY_MAX));
                }
            }
            if self.out.is_closed() {
                break;
            }
        }
        self.status.remove(self.id);
    }

    /// Sends every asked secret; `Err(retry delay)` when one could not be had yet.
    async fn push(&mut self) -> Result<(), Duration> {
        let mut resources = Vec::with_capacity(self.names.len());
        for name in &self.names {
            match self.secrets.generate(name).await {
                Ok(item) => resources.push(xds_api::pack(&to_secret(name, &item))),
                // The secret manager logs why the CA gave no certificate, at a bounded rate.
                Err(e @ (SecretError::Ca(_) | SecretError::NoCa(_))) => {
                    tracing::debug!(secret = name, error = %e, "SDS: secret not available yet; retrying");
                    return Err(RETRY_MIN);
                }
                Err(e) => {
                    tracing::warn!(secret = name, error = %e, "SDS: secret not available yet; retrying");
                    return Err(RETRY_MIN);
                }
            }
        }
        self.nonce += 1;
        self.version += 1;
        let response = DiscoveryResponse {
            version_info: self.version.to_string(),
            resources,
            type_url: SECRET_TYPE.into(),
            nonce: self.nonce.to_string(),
            ..Default::default()
        };
        tracing::debug!(names = ?self.names, version = self.version, "SDS: pushing secrets");
        let _ = self.out.send(Ok(response)).await;
        Ok(())
    }
}

/// Envoy's `Secret`: a TLS certificate, or a validation context with the trusted roots.
fn to_secret(name: &str, item: &SecretItem) -> Secret {
    let inline = |s: &str| DataSource {
        specifier: Some(data_source::Specifier::InlineBytes(s.as_bytes().to_vec())),
        ..Default::default()
    };
    let r#type = match item {
        SecretItem::Certificate {
            cert_chain_pem,
            key_pem,
        } => secret::Type::TlsCertificate(TlsCertificate {
            certificate_chain: Some(inline(cert_chain_pem)),
            private_key: Some(inline(key_pem)),
            ..Default::default()
        }),
        SecretItem::Root { root_pem } => secret::Type::ValidationContext(CertificateValidationContext {
            trusted_ca: Some(inline(root_pem)),
            ..Default::default()
        }),
    };
    Secret {
        name: name.to_owned(),
        r#type: Some(r#type),
    }
}
