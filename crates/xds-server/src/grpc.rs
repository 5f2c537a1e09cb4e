//! The ADS gRPC service, `AggregatedDiscoveryService` (Istio's `DiscoveryServer.Register` and
//! `StreamAggregatedResources` / `DeltaAggregatedResources`, `pilot/pkg/xds/ads.go`, `delta.go`):
//! each call is checked (path, server ready, the caller's identities on the secure port, Istio's
//! `authenticate`) and started as one stream task of its flavour. Written against tonic's
//! transport rather than generated, for the framing of its bodies (`framing.rs`).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;
use tonic::transport::server::TcpConnectInfo;

use crate::auth::StreamAuthenticator;
use crate::framing::{Requests, grpc_response};
use crate::metrics::ReasonLabel;
use crate::outbound;
use crate::snapshot::SnapshotBuilder;
use crate::state::ServerState;
use crate::stream::delta::Delta;
use crate::stream::sotw::Sotw;
use crate::stream::{Flavour, serve};

const SERVICE: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
const SOTW_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// `AggregatedDiscoveryService` over a [`DiscoveryServer`](crate::DiscoveryServer), for
/// `tonic::transport::Server`.
pub struct AdsService<B: SnapshotBuilder> {
    state: Arc<ServerState<B>>,
    /// Set on the secure port: every stream's caller is authenticated first.
    authenticator: Option<Arc<dyn StreamAuthenticator>>,
}

impl<B: SnapshotBuilder> Clone for AdsService<B> {
    fn clone(&self) -> Self {
        AdsService {
            state: self.state.clone(),
            authenticator: self.authenticator.clone(),
        }
    }
}

impl<B: SnapshotBuilder> AdsService<B> {
    pub(crate) fn new(state: Arc<ServerState<B>>) -> AdsService<B> {
        AdsService {
            state,
            authenticator: None,
        }
    }

    /// This service, authenticating every stream's caller with `authenticator` and serving only
    /// proxies of the identities it proves (Istio's secure port).
    pub fn authenticated(mut self, authenticator: Arc<dyn StreamAuthenticator>) -> AdsService<B> {
        self.authenticator = Some(authenticator);
        self
    }
}

impl<B: SnapshotBuilder> NamedService for AdsService<B> {
    const NAME: &'static str = SERVICE;
}

impl<B: SnapshotBuilder> Service<http::Request<Body>> for AdsService<B> {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let state = self.state.clone();
        let authenticator = self.authenticator.clone();
        Box::pin(async move {
            let path = req.uri().path().to_owned();
            if path != SOTW_PATH && path != DELTA_PATH {
                return Ok(Status::unimplemented(format!("{path}: not served here")).into_http());
            }
            if !state.ready() {
                return Ok(Status::unavailable("server is not ready to serve discovery information").into_http());
            }
            let peer_addr = peer_of(&req);
            let peer = peer_addr.map_or_else(|| "0.0.0.0".to_owned(), |a| a.to_string());
            let identities = match &authenticator {
                None => None,
                Some(a) => {
                    let certs = req
                        .extensions()
                        .get::<tonic::transport::server::TlsConnectInfo<TcpConnectInfo>>()
                        .and_then(|i| i.peer_certs());
                    match a.authenticate(req.headers().clone(), certs, peer_addr).await {
                        Ok(ids) => Some(ids),
                        Err(reason) => {
                            state
                                .metrics
                                .auth_failures
                                .get_or_create(&ReasonLabel {
                                    reason: "authentication",
                                })
                                .inc();
                            if let Some(suppressed) = monitoring::throttle::allow("ads_unauthenticated") {
                                tracing::warn!(suppressed, "ADS: {peer} refused: authentication failure: {reason}");
                            }
                            return Ok(Status::unauthenticated(format!("authentication failure: {reason}")).into_http());
                        }
                    }
                }
            };
            let body = req.into_body();
            Ok(if path == SOTW_PATH {
                start_stream::<B, Sotw>(state, body, peer, identities)
            } else {
                start_stream::<B, Delta>(state, body, peer, identities)
            })
        })
    }
}

/// Starts the stream's task and returns the response whose body carries what it sends.
fn start_stream<B: SnapshotBuilder, F: Flavour>(
    state: Arc<ServerState<B>>,
    body: Body,
    peer: String,
    identities: Option<Vec<String>>,
) -> http::Response<Body> {
    let inbound = Requests::<F::Request>::new(body, state.max_recv_msg_size());
    let (tx, rx) = outbound::channel();
    tokio::spawn(serve::<B, F>(state, inbound, tx, peer, identities));
    grpc_response(rx)
}

/// The client's address, plaintext or TLS, as `tonic::Request::remote_addr`.
fn peer_of(req: &http::Request<Body>) -> Option<SocketAddr> {
    let ext = req.extensions();
    ext.get::<TcpConnectInfo>()
        .and_then(TcpConnectInfo::remote_addr)
        .or_else(|| {
            ext.get::<tonic::transport::server::TlsConnectInfo<TcpConnectInfo>>()
                .and_then(|i| i.get_ref().remote_addr())
        })
}
