//! Target `agent_xds_proxy`: pilot-agent's xDS proxy between an "Envoy" on its Unix socket and an
//! upstream pilot-discovery, both sides fuzzed. The upstream is scripted: on each stream it sends
//! the input's responses (whatever pilot-discovery might send: any types, nonces, resources,
//! agent-internal NDS tables), then reads what the proxy forwards until it goes quiet, and ends the
//! stream. Envoy sends the input's requests (ACKs, NACKs with any detail, subscriptions).
//! The proxy must forward, hand NDS to its handler, and end Envoy's stream when upstream's ends.
//!
//! Input: `[mode]` then chunks (`input::chunks`). Mode bit 0: delta. Chunk tag bit 0 clear: a
//! request from Envoy; set: a response from upstream (chunks that do not decode are skipped:
//! tonic, not the proxy, refuses undecodable messages).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use prometheus_client::registry::Registry;
use prost::Message;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status, Streaming};
use xds_api::envoy::service::discovery::v3::aggregated_discovery_service_client::AggregatedDiscoveryServiceClient;
use xds_api::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use xds_api::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};

use agent::xds_proxy::{Backoff, XdsProxy, XdsProxyConfig};

use crate::input::chunks;

/// Istio's NDS type: handed to the agent's DNS proxy, never to Envoy.
pub(crate) const NDS: &str = "type.googleapis.com/istio.networking.nds.v1.NameTable";

/// Longest the whole exchange may take; the proxy must not hang Envoy's stream.
const END_WITHIN: Duration = Duration::from_secs(10);

/// How long upstream waits for one more forwarded request before it ends its stream.
const QUIET: Duration = Duration::from_millis(20);

#[derive(Default)]
struct Script {
    sotw: Vec<DiscoveryResponse>,
    delta: Vec<DeltaDiscoveryResponse>,
}

struct Upstream(Arc<Mutex<Script>>);

/// Sends `responses`, then reads requests until none comes for `QUIET`, then ends.
fn scripted<Req: Send + 'static, Resp: Send + 'static>(
    responses: Vec<Resp>,
    mut requests: Streaming<Req>,
) -> std::pin::Pin<Box<dyn futures::Stream<Item = Result<Resp, Status>> + Send>> {
    Box::pin(async_stream::stream! {
        for r in responses {
            yield Ok(r);
        }
        while let Ok(Ok(Some(_))) = tokio::time::timeout(QUIET, requests.message()).await {}
    })
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Upstream {
    type StreamAggregatedResourcesStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<DiscoveryResponse, Status>> + Send>>;
    type DeltaAggregatedResourcesStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<DeltaDiscoveryResponse, Status>> + Send>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        let responses = std::mem::take(&mut lock(&self.0).sotw);
        Ok(Response::new(scripted(responses, request.into_inner())))
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        let responses = std::mem::take(&mut lock(&self.0).delta);
        Ok(Response::new(scripted(responses, request.into_inner())))
    }
}

/// Envoy's requests on a stream Envoy keeps open (as Envoy does: the proxy takes a half-close
/// for Envoy going away), until upstream's end ends it.
fn open<T: Send + 'static>(requests: Vec<T>) -> impl futures::Stream<Item = T> + Send + 'static {
    use futures::StreamExt;
    futures::stream::iter(requests).chain(futures::stream::pending())
}

fn lock(m: &Mutex<Script>) -> std::sync::MutexGuard<'_, Script> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

struct Harness {
    rt: tokio::runtime::Runtime,
    script: Arc<Mutex<Script>>,
    envoy: Channel,
    _proxy: XdsProxy,
    _dir: tempfile::TempDir,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = crate::harness_runtime();
        let script = Arc::new(Mutex::new(Script::default()));
        let (proxy, envoy, dir) = rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .unwrap_or_else(|e| panic!("upstream listener: {e}"));
            let addr: SocketAddr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
            let svc =
                AggregatedDiscoveryServiceServer::new(Upstream(script.clone())).max_decoding_message_size(usize::MAX);
            tokio::spawn(
                Server::builder()
                    .add_service(svc)
                    .serve_with_incoming(TcpListenerStream::new(listener)),
            );
            let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("tempdir: {e}"));
            let mut cfg = XdsProxyConfig::new(dir.path().join("XDS"), addr.to_string());
            cfg.backoff = Backoff {
                initial: Duration::from_millis(1),
                max: Duration::from_millis(10),
            };
            let proxy = XdsProxy::start(cfg, &mut Registry::default())
                .await
                .unwrap_or_else(|e| panic!("xDS proxy: {e}"));
            proxy.register_handler(NDS, |any| {
                if any.value.is_empty() {
                    Err("empty name table".into())
                } else {
                    Ok(())
                }
            });
            let envoy = Endpoint::from_shared(format!("unix://{}", proxy.uds_path().display()))
                .unwrap_or_else(|e| panic!("{e}"))
                .connect()
                .await
                .unwrap_or_else(|e| panic!("connecting to the proxy's socket: {e}"));
            (proxy, envoy, dir)
        });
        Harness {
            rt,
            script,
            envoy,
            _proxy: proxy,
            _dir: dir,
        }
    })
}

pub fn agent_xds_proxy(data: &[u8]) {
    exchange(data);
}

/// Runs the exchange; returns how many responses reached Envoy.
pub(crate) fn exchange(data: &[u8]) -> usize {
    let Some((&mode, rest)) = data.split_first() else {
        return 0;
    };
    let h = harness();
    let delta = mode & 1 == 1;
    let mut script = Script::default();
    let mut sotw_requests = Vec::new();
    let mut delta_requests = Vec::new();
    for c in chunks(rest) {
        match (c.tag & 1 == 1, delta) {
            (false, false) => sotw_requests.extend(DiscoveryRequest::decode(c.bytes).ok()),
            (false, true) => delta_requests.extend(DeltaDiscoveryRequest::decode(c.bytes).ok()),
            (true, false) => script.sotw.extend(DiscoveryResponse::decode(c.bytes).ok()),
            (true, true) => script.delta.extend(DeltaDiscoveryResponse::decode(c.bytes).ok()),
        }
    }
    *lock(&h.script) = script;
    h.rt.block_on(async {
        let mut client = AggregatedDiscoveryServiceClient::new(h.envoy.clone()).max_decoding_message_size(usize::MAX);
        let done = tokio::time::timeout(END_WITHIN, async {
            let mut received = 0;
            if delta {
                if let Ok(r) = client.delta_aggregated_resources(open(delta_requests)).await {
                    let mut rx = r.into_inner();
                    while let Ok(Some(_)) = rx.message().await {
                        received += 1;
                    }
                }
            } else if let Ok(r) = client.stream_aggregated_resources(open(sotw_requests)).await {
                let mut rx = r.into_inner();
                while let Ok(Some(_)) = rx.message().await {
                    received += 1;
                }
            }
            received
        })
        .await;
        done.unwrap_or_else(|_| panic!("Envoy's stream did not end within {END_WITHIN:?} of upstream's"))
    })
}
