//! Tests of the xDS proxy: a scripted fake pilot-discovery upstream ([`fake::FakeUpstream`]), a
//! tonic client on the proxy's Unix socket playing Envoy ([`EnvoyClient`]), and one test with a
//! real Envoy and a real pilot-discovery.

mod delta;
mod envoy;
mod failures;
mod fake;
mod lifecycle;
mod limits;
mod sotw;
mod tls;

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::Streaming;
use tonic::transport::Endpoint;
use xds_api::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use xds_api::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use xds_api::pbwkt::Any;

use super::{Backoff, XdsProxy, XdsProxyConfig};

/// How long any single expected event may take.
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// Awaits `f`, failing the test after [`WAIT`].
pub(crate) async fn within<T>(what: &str, f: impl Future<Output = T>) -> T {
    match tokio::time::timeout(WAIT, f).await {
        Ok(v) => v,
        Err(_) => panic!("timed out after {WAIT:?} waiting for {what}"),
    }
}

/// A proxy on `<dir>/XDS` forwarding to `upstream`, with a short backoff.
pub(crate) async fn start_proxy(
    dir: &Path,
    upstream: SocketAddr,
    configure: impl FnOnce(&mut XdsProxyConfig),
) -> XdsProxy {
    let mut cfg = XdsProxyConfig::new(dir.join("etc/istio/proxy/XDS"), upstream.to_string());
    cfg.backoff = Backoff {
        initial: Duration::from_millis(50),
        max: Duration::from_millis(400),
    };
    configure(&mut cfg);
    XdsProxy::start(cfg, &mut Registry::default()).await.unwrap()
}

/// A packed resource of `type_url` carrying `payload`.
pub(crate) fn resource(type_url: &str, payload: &[u8]) -> Any {
    Any {
        type_url: type_url.to_owned(),
        value: payload.to_vec(),
    }
}

pub(crate) fn sotw_response(type_url: &str, version: &str, nonce: &str, resources: Vec<Any>) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: version.to_owned(),
        type_url: type_url.to_owned(),
        nonce: nonce.to_owned(),
        resources,
        ..Default::default()
    }
}

pub(crate) fn sotw_request(type_url: &str, version: &str, nonce: &str) -> DiscoveryRequest {
    DiscoveryRequest {
        version_info: version.to_owned(),
        type_url: type_url.to_owned(),
        response_nonce: nonce.to_owned(),
        ..Default::default()
    }
}

/// The "Envoy" side: one ADS stream on the proxy's Unix socket.
pub(crate) struct EnvoyClient<Req, Resp> {
    pub tx: mpsc::UnboundedSender<Req>,
    pub rx: Streaming<Resp>,
}

async fn uds_client(path: &Path) -> AggregatedDiscoveryServiceClient<tonic::transport::Channel> {
    let channel = Endpoint::from_shared(format!("unix://{}", path.display()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    AggregatedDiscoveryServiceClient::new(channel).max_decoding_message_size(usize::MAX)
}

impl EnvoyClient<DiscoveryRequest, DiscoveryResponse> {
    pub(crate) async fn sotw(path: &Path) -> Self {
        let mut client = uds_client(path).await;
        let (tx, rx) = mpsc::unbounded_channel();
        let rx = client
            .stream_aggregated_resources(UnboundedReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        EnvoyClient { tx, rx }
    }
}

impl EnvoyClient<DeltaDiscoveryRequest, DeltaDiscoveryResponse> {
    pub(crate) async fn delta(path: &Path) -> Self {
        let mut client = uds_client(path).await;
        let (tx, rx) = mpsc::unbounded_channel();
        let rx = client
            .delta_aggregated_resources(UnboundedReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        EnvoyClient { tx, rx }
    }
}

impl<Req, Resp: Default + prost::Message + std::fmt::Debug + 'static> EnvoyClient<Req, Resp> {
    pub(crate) fn send(&self, req: Req) {
        self.tx.send(req).unwrap_or_else(|_| panic!("envoy stream closed"));
    }

    /// The next response; panics on error, end of stream or timeout.
    pub(crate) async fn recv(&mut self) -> Resp {
        match within("a response at Envoy", self.rx.message()).await {
            Ok(Some(resp)) => resp,
            Ok(None) => panic!("the proxy ended Envoy's stream"),
            Err(status) => panic!("the proxy ended Envoy's stream: {status}"),
        }
    }

    /// How the stream ended (`None`: cleanly).
    pub(crate) async fn ended(&mut self) -> Option<tonic::Status> {
        loop {
            match within("the end of Envoy's stream", self.rx.message()).await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(status) => return Some(status),
            }
        }
    }

    /// Asserts nothing arrives for `wait`.
    pub(crate) async fn expect_silence(&mut self, wait: Duration) {
        if let Ok(msg) = tokio::time::timeout(wait, self.rx.message()).await {
            panic!("expected nothing at Envoy, got {msg:?}");
        }
    }
}
