//! Istio's `IstioCertificateService` (security/pkg/server/ca/server.go): authenticate the caller,
//! sign the CSR for the identities it proved (never the CSR's own names), answer the leaf, the
//! CA's chain and the root, one certificate per element; count what happened under Istio's
//! `citadel_server_*` names.
//!
//! The service signs with the CA current when a CSR arrives: it follows a `watch` of the CA, so
//! a plugged-in intermediate replaced on disk (istiod's `handleCACertsFileWatch`) signs the next
//! CSR without a restart.

use std::sync::Arc;

use ca::{CertificateAuthority, SignError, WorkloadTtl};
use istio_api::ca::istio_certificate_service_server::{IstioCertificateService, IstioCertificateServiceServer};
use istio_api::ca::{IstioCertificateRequest, IstioCertificateResponse};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use crate::authn::{AuthContext, Authenticator, authenticate};

/// Istio's CA server metrics.
#[derive(Clone, Default)]
pub struct CaMetrics {
    pub csr: Counter,
    pub authentication_failure: Counter,
    pub csr_parsing_error: Counter,
    pub csr_sign_error: Family<Vec<(String, String)>, Counter>,
    pub success: Counter,
    pub root_cert_expiry_timestamp: Gauge,
    pub cert_chain_expiry_timestamp: Gauge,
}

impl CaMetrics {
    pub fn register(registry: &mut Registry) -> CaMetrics {
        let m = CaMetrics::default();
        registry.register(
            "citadel_server_csr_count",
            "The number of CSRs received by Citadel server.",
            m.csr.clone(),
        );
        registry.register(
            "citadel_server_authentication_failure_count",
            "The number of authentication failures.",
            m.authentication_failure.clone(),
        );
        registry.register(
            "citadel_server_csr_parsing_err_count",
            "The number of errors occurred when parsing the CSR.",
            m.csr_parsing_error.clone(),
        );
        registry.register(
            "citadel_server_csr_sign_err_count",
            "The number of errors occurred when signing the CSR.",
            m.csr_sign_error.clone(),
        );
        registry.register(
            "citadel_server_success_cert_issuance_count",
            "The number of certificates issuances that have succeeded.",
            m.success.clone(),
        );
        registry.register(
            "citadel_server_root_cert_expiry_timestamp",
            "The unix timestamp, in seconds, when the root cert will expire.",
            m.root_cert_expiry_timestamp.clone(),
        );
        registry.register(
            "citadel_server_cert_chain_expiry_timestamp",
            "The unix timestamp, in seconds, when Istio generated cert chain will expire.",
            m.cert_chain_expiry_timestamp.clone(),
        );
        m
    }

    /// Istio's `RecordCertsExpiry`: when the first root expires and, with a chain (a plugged-in
    /// CA), when its first certificate does. At start and after each reload of the CA.
    pub fn record_expiry(&self, ca: &CertificateAuthority) {
        if let Some(t) = ca.root_not_after_unix() {
            self.root_cert_expiry_timestamp.set(t);
        }
        if let Some(t) = ca.cert_chain_not_after_unix() {
            self.cert_chain_expiry_timestamp.set(t);
        }
    }
}

/// The CA's gRPC service.
#[derive(Clone)]
pub struct CaService {
    ca: watch::Receiver<Arc<CertificateAuthority>>,
    authenticators: Arc<Vec<Arc<dyn Authenticator>>>,
    ttl: WorkloadTtl,
    metrics: CaMetrics,
}

impl CaService {
    /// A service that signs with `ca` for as long as it runs.
    pub fn new(
        ca: Arc<CertificateAuthority>,
        authenticators: Vec<Arc<dyn Authenticator>>,
        ttl: WorkloadTtl,
        metrics: CaMetrics,
    ) -> CaService {
        Self::following(watch::channel(ca).1, authenticators, ttl, metrics)
    }

    /// A service that signs each CSR with the CA current in `ca` at that moment.
    pub fn following(
        ca: watch::Receiver<Arc<CertificateAuthority>>,
        authenticators: Vec<Arc<dyn Authenticator>>,
        ttl: WorkloadTtl,
        metrics: CaMetrics,
    ) -> CaService {
        metrics.record_expiry(&ca.borrow());
        CaService {
            ca,
            authenticators: Arc::new(authenticators),
            ttl,
            metrics,
        }
    }

    pub fn into_server(self) -> IstioCertificateServiceServer<CaService> {
        IstioCertificateServiceServer::new(self)
    }
}

#[tonic::async_trait]
impl IstioCertificateService for CaService {
    async fn create_certificate(
        &self,
        request: Request<IstioCertificateRequest>,
    ) -> Result<Response<IstioCertificateResponse>, Status> {
        self.metrics.csr.inc();
        let ctx = AuthContext::from_grpc(request.metadata(), request.peer_certs(), request.remote_addr());
        let caller = match authenticate(&self.authenticators, &ctx).await {
            Ok(c) => c,
            Err(e) => {
                self.metrics.authentication_failure.inc();
                tracing::warn!(peer = ?ctx.peer_addr, "CSR refused: request authentication failure: {e}");
                return Err(Status::unauthenticated(format!("request authenticate failure: {e}")));
            }
        };
        let req = request.into_inner();
        let ca = self.ca.borrow().clone();
        match ca.sign_csr(&req.csr, &caller.identities, req.validity_duration, self.ttl) {
            Ok(cert_chain) => {
                self.metrics.success.inc();
                tracing::debug!(identities = ?caller.identities, "CSR signed");
                Ok(Response::new(IstioCertificateResponse { cert_chain }))
            }
            Err(e) => {
                if matches!(e, SignError::Csr(_)) {
                    self.metrics.csr_parsing_error.inc();
                }
                self.metrics
                    .csr_sign_error
                    .get_or_create(&vec![("error".to_owned(), e.error_type().to_owned())])
                    .inc();
                tracing::warn!(identities = ?caller.identities, "CSR signing error: {e}");
                Err(match e {
                    SignError::Csr(_) | SignError::Ttl { .. } => {
                        Status::invalid_argument(format!("CSR signing error ({e})"))
                    }
                    SignError::CertGen(_) => Status::internal(format!("CSR signing error ({e})")),
                })
            }
        }
    }
}
