//! A fake pilot-discovery for the proxy's tests: a tonic ADS server on 127.0.0.1 that hands each
//! stream (its metadata, its requests, a sender for its responses) to the test to script. It runs
//! on its own runtime, so [`FakeUpstream::kill`] drops every connection at once, like a process
//! that dies; a new one can then start on the same port.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio_stream::wrappers::{TcpListenerStream, UnboundedReceiverStream};
use tonic::metadata::MetadataMap;
use tonic::transport::{Identity, Server, ServerTlsConfig};
use tonic::{Request, Response, Status, Streaming};
use xds_api::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use xds_api::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};

use super::within;

/// One upstream stream as the fake sees it.
pub(crate) struct FakeStream<Req, Resp> {
    pub metadata: MetadataMap,
    pub requests: Streaming<Req>,
    pub responses: mpsc::UnboundedSender<Result<Resp, Status>>,
}

impl<Req: Default + prost::Message + std::fmt::Debug + 'static, Resp> FakeStream<Req, Resp> {
    /// The next request the proxy forwarded; panics on end, error or timeout.
    pub(crate) async fn recv(&mut self) -> Req {
        match within("a request upstream", self.requests.message()).await {
            Ok(Some(req)) => req,
            other => panic!("upstream stream ended: {other:?}"),
        }
    }

    pub(crate) fn send(&self, resp: Resp) {
        let _ = self.responses.send(Ok(resp));
    }

    /// Asserts no request arrives for `wait`.
    pub(crate) async fn expect_silence(&mut self, wait: Duration) {
        if let Ok(msg) = tokio::time::timeout(wait, self.requests.message()).await {
            panic!("expected no request upstream, got {msg:?}");
        }
    }
}

pub(crate) type SotwStream = FakeStream<DiscoveryRequest, DiscoveryResponse>;
pub(crate) type DeltaStream = FakeStream<DeltaDiscoveryRequest, DeltaDiscoveryResponse>;

pub(crate) struct FakeUpstream {
    pub addr: SocketAddr,
    runtime: Option<tokio::runtime::Runtime>,
    sotw: mpsc::UnboundedReceiver<SotwStream>,
    delta: mpsc::UnboundedReceiver<DeltaStream>,
}

impl FakeUpstream {
    /// Plaintext on a free port.
    pub(crate) fn start() -> FakeUpstream {
        Self::start_on(0, None)
    }

    /// On `port` (0: any), with TLS when `identity` (cert and key PEM) is given.
    pub(crate) fn start_on(port: u16, identity: Option<(String, String)>) -> FakeUpstream {
        let listener = bind_retrying(port);
        let addr = listener.local_addr().unwrap();
        listener.set_nonblocking(true).unwrap();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (sotw_tx, sotw) = mpsc::unbounded_channel();
        let (delta_tx, delta) = mpsc::unbounded_channel();
        let service = AggregatedDiscoveryServiceServer::new(FakeAds {
            sotw: sotw_tx,
            delta: delta_tx,
        })
        .max_decoding_message_size(usize::MAX);
        runtime.spawn(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let mut builder = Server::builder();
            if let Some((cert, key)) = identity {
                builder = builder
                    .tls_config(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
                    .unwrap();
            }
            let _ = builder
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
        });
        FakeUpstream {
            addr,
            runtime: Some(runtime),
            sotw,
            delta,
        }
    }

    pub(crate) async fn next_sotw(&mut self) -> SotwStream {
        within("a SotW stream upstream", self.sotw.recv()).await.unwrap()
    }

    pub(crate) async fn next_delta(&mut self) -> DeltaStream {
        within("a delta stream upstream", self.delta.recv()).await.unwrap()
    }

    /// Asserts no new stream arrives for `wait`.
    pub(crate) async fn expect_no_stream(&mut self, wait: Duration) {
        if tokio::time::timeout(wait, self.sotw.recv()).await.is_ok() {
            panic!("expected no stream upstream");
        }
    }

    /// Dies: every connection and the listener close at once, without gRPC trailers.
    pub(crate) fn kill(mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

/// Binds 127.0.0.1:`port`, retrying while a killed predecessor's listener is still closing.
fn bind_retrying(port: u16) -> std::net::TcpListener {
    let mut last = None;
    for _ in 0..50 {
        match std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
            Ok(l) => return l,
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("cannot bind 127.0.0.1:{port}: {last:?}");
}

struct FakeAds {
    sotw: mpsc::UnboundedSender<SotwStream>,
    delta: mpsc::UnboundedSender<DeltaStream>,
}

fn hand_over<Req, Resp>(
    tests: &mpsc::UnboundedSender<FakeStream<Req, Resp>>,
    request: Request<Streaming<Req>>,
) -> Result<Response<UnboundedReceiverStream<Result<Resp, Status>>>, Status> {
    let metadata = request.metadata().clone();
    let (responses, rx) = mpsc::unbounded_channel();
    let stream = FakeStream {
        metadata,
        requests: request.into_inner(),
        responses,
    };
    tests
        .send(stream)
        .map_err(|_| Status::unavailable("the test is gone"))?;
    Ok(Response::new(UnboundedReceiverStream::new(rx)))
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for FakeAds {
    type StreamAggregatedResourcesStream = UnboundedReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = UnboundedReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        hand_over(&self.sotw, request)
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        hand_over(&self.delta, request)
    }
}
