//! The raw limit of a change: the responses one proxy received from pilot-discovery (its state
//! before the change and the push that delivered it) replayed, already built, by an in-process
//! ADS server to the same number of simulated proxies, which decode and ACK them exactly as in
//! the real run. No generation happens, so the time from the push to each proxy's ACK is what
//! delivering the same bytes over the same streams costs.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use prost::Message;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status, Streaming};
use xds_api::envoy::service::discovery::v3::aggregated_discovery_service_server::{
    AggregatedDiscoveryService, AggregatedDiscoveryServiceServer,
};
use xds_api::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};

use crate::proxy::{ProxyOptions, Recorded, Watched, run_proxy};
use crate::tally::Tally;
use crate::upstream::Upstream;

/// Responses buffered per stream.
const STREAM_BUFFER: usize = 16;
/// How long the server's count of complete ACKs may trail the proxies' own reports.
const ACK_WAIT: Duration = Duration::from_secs(5);

/// What one stream is sent: the handshake, one answer per type's first request, and the push.
#[derive(Debug, Default)]
pub struct Script<R> {
    /// State of the world: the last response of each type before the change; delta: every
    /// response before it, in order.
    pub handshake: Vec<R>,
    /// The responses from the change to the recording proxy's ACK of it, in order.
    pub push: Vec<R>,
}

/// A recorded change, as state-of-the-world or delta responses.
#[derive(Debug, Clone)]
pub enum Capture {
    Sotw(Arc<Script<DiscoveryResponse>>),
    Delta(Arc<Script<DeltaDiscoveryResponse>>),
}

impl Capture {
    /// Splits what the recording proxy received into its state before the change `made`, and
    /// the push up to `acked` (its ACK of the change).
    pub fn new(recorded: Vec<(Instant, Recorded)>, made: Instant, acked: Option<Instant>) -> Result<Capture> {
        let Some(acked) = acked else {
            bail!("the recording proxy (proxy 0) never ACKed the change");
        };
        let delta = matches!(recorded.first(), Some((_, Recorded::Delta(_))));
        let capture = if delta {
            let r = recorded.into_iter().map(|(at, r)| match r {
                Recorded::Delta(r) => Ok((at, r)),
                Recorded::Sotw(_) => Err(()),
            });
            Capture::Delta(Arc::new(split(r, made, acked, false)?))
        } else {
            let r = recorded.into_iter().map(|(at, r)| match r {
                Recorded::Sotw(r) => Ok((at, r)),
                Recorded::Delta(_) => Err(()),
            });
            Capture::Sotw(Arc::new(split(r, made, acked, true)?))
        };
        let (handshake, push) = match &capture {
            Capture::Sotw(s) => (s.handshake.len(), s.push.len()),
            Capture::Delta(s) => (s.handshake.len(), s.push.len()),
        };
        if handshake == 0 || push == 0 {
            bail!("nothing to replay: {handshake} handshake and {push} push responses recorded");
        }
        Ok(capture)
    }

    /// Responses in the push.
    pub fn push_len(&self) -> usize {
        match self {
            Capture::Sotw(s) => s.push.len(),
            Capture::Delta(s) => s.push.len(),
        }
    }

    /// Encoded size of the push, as sent to each proxy.
    pub fn push_bytes(&self) -> u64 {
        let sum = match self {
            Capture::Sotw(s) => s.push.iter().map(Message::encoded_len).sum::<usize>(),
            Capture::Delta(s) => s.push.iter().map(Message::encoded_len).sum(),
        };
        sum as u64
    }
}

fn split<R: Reply>(
    recorded: impl Iterator<Item = Result<(Instant, R), ()>>,
    made: Instant,
    acked: Instant,
    last_of_each_type: bool,
) -> Result<Script<R>> {
    let mut script = Script {
        handshake: Vec::new(),
        push: Vec::new(),
    };
    for r in recorded {
        let Ok((at, r)) = r else {
            bail!("the recording proxy received both state-of-the-world and delta responses");
        };
        if at >= made {
            if at <= acked {
                script.push.push(r);
            }
        } else if let Some(old) = script
            .handshake
            .iter_mut()
            .find(|h| last_of_each_type && h.type_url() == r.type_url())
        {
            *old = r;
        } else {
            script.handshake.push(r);
        }
    }
    Ok(script)
}

/// A response the replay server sends.
pub(crate) trait Reply: Clone + Send + Sync + 'static {
    fn type_url(&self) -> &str;
    fn nonce(&self) -> &str;
}

impl Reply for DiscoveryResponse {
    fn type_url(&self) -> &str {
        &self.type_url
    }
    fn nonce(&self) -> &str {
        &self.nonce
    }
}

impl Reply for DeltaDiscoveryResponse {
    fn type_url(&self) -> &str {
        &self.type_url
    }
    fn nonce(&self) -> &str {
        &self.nonce
    }
}

/// A request the replay server reads: only its type, nonce and NACK flag matter.
trait Ask: Send + Sync + 'static {
    fn type_url(&self) -> &str;
    fn response_nonce(&self) -> &str;
    fn is_nack(&self) -> bool;
}

impl Ask for DiscoveryRequest {
    fn type_url(&self) -> &str {
        &self.type_url
    }
    fn response_nonce(&self) -> &str {
        &self.response_nonce
    }
    fn is_nack(&self) -> bool {
        self.error_detail.is_some()
    }
}

impl Ask for DeltaDiscoveryRequest {
    fn type_url(&self) -> &str {
        &self.type_url
    }
    fn response_nonce(&self) -> &str {
        &self.response_nonce
    }
    fn is_nack(&self) -> bool {
        self.error_detail.is_some()
    }
}

/// An ADS server on loopback that replays a [`Capture`] to every stream: each type's first
/// request is answered with the handshake responses of that type, and on [`push`](Self::push)
/// every stream is sent the push, without waiting for ACKs.
pub(crate) struct ReplayServer {
    pub addr: SocketAddr,
    trigger: watch::Sender<bool>,
    complete: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl ReplayServer {
    pub(crate) async fn start(capture: Capture) -> Result<ReplayServer> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .context("raw phase: listening on loopback")?;
        let addr = listener.local_addr()?;
        let (trigger, pushed) = watch::channel(false);
        let complete = Arc::new(AtomicUsize::new(0));
        let replay = Replay {
            capture,
            pushed,
            complete: complete.clone(),
        };
        let svc = AggregatedDiscoveryServiceServer::new(replay)
            .max_decoding_message_size(test_support::ads::MAX_MESSAGE_SIZE)
            .max_encoding_message_size(test_support::ads::MAX_MESSAGE_SIZE);
        // Nagle off, as pilot-discovery's listener.
        let incoming = TcpListenerStream::new(listener).map(|conn| {
            if let Ok(stream) = &conn {
                let _ = stream.set_nodelay(true);
            }
            conn
        });
        let task = tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(incoming)
                .await;
        });
        Ok(ReplayServer {
            addr,
            trigger,
            complete,
            task,
        })
    }

    /// Sends the push to every stream.
    pub(crate) fn push(&self) {
        self.trigger.send_replace(true);
    }

    /// Streams that have ACKed every response of the push.
    pub(crate) fn complete(&self) -> usize {
        self.complete.load(Ordering::Relaxed)
    }
}

impl Drop for ReplayServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct Replay {
    capture: Capture,
    pushed: watch::Receiver<bool>,
    complete: Arc<AtomicUsize>,
}

impl Replay {
    fn serve<Q: Ask, R: Reply>(
        &self,
        script: Arc<Script<R>>,
        inbound: Streaming<Q>,
    ) -> ReceiverStream<Result<R, Status>> {
        let (tx, rx) = mpsc::channel(STREAM_BUFFER);
        let mut pushed = self.pushed.clone();
        let (push, push_tx) = (script.clone(), tx.clone());
        tokio::spawn(async move {
            if pushed.wait_for(|p| *p).await.is_err() {
                return;
            }
            for r in &push.push {
                if push_tx.send(Ok(r.clone())).await.is_err() {
                    return;
                }
            }
        });
        tokio::spawn(answer(script, inbound, tx, self.complete.clone()));
        ReceiverStream::new(rx)
    }
}

/// Reads one stream's requests: answers each type's first, counts ACKs of the push.
async fn answer<Q: Ask, R: Reply>(
    script: Arc<Script<R>>,
    mut inbound: Streaming<Q>,
    tx: mpsc::Sender<Result<R, Status>>,
    complete: Arc<AtomicUsize>,
) {
    let mut answered: Vec<String> = Vec::new();
    let mut acked = vec![false; script.push.len()];
    let mut done = false;
    while let Ok(Some(req)) = inbound.message().await {
        if !answered.iter().any(|t| t == req.type_url()) {
            answered.push(req.type_url().to_owned());
            for r in script.handshake.iter().filter(|r| r.type_url() == req.type_url()) {
                if tx.send(Ok(r.clone())).await.is_err() {
                    return;
                }
            }
        }
        if req.is_nack() {
            continue;
        }
        for (a, r) in acked.iter_mut().zip(&script.push) {
            *a |= r.nonce() == req.response_nonce();
        }
        if !done && acked.iter().all(|a| *a) {
            done = true;
            complete.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[tonic::async_trait]
impl AggregatedDiscoveryService for Replay {
    type StreamAggregatedResourcesStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type DeltaAggregatedResourcesStream = ReceiverStream<Result<DeltaDiscoveryResponse, Status>>;

    async fn stream_aggregated_resources(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamAggregatedResourcesStream>, Status> {
        match &self.capture {
            Capture::Sotw(script) => Ok(Response::new(self.serve(script.clone(), request.into_inner()))),
            Capture::Delta(_) => Err(Status::unimplemented("this raw phase replays delta xDS")),
        }
    }

    async fn delta_aggregated_resources(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Response<Self::DeltaAggregatedResourcesStream>, Status> {
        match &self.capture {
            Capture::Delta(script) => Ok(Response::new(self.serve(script.clone(), request.into_inner()))),
            Capture::Sotw(_) => Err(Status::unimplemented("this raw phase replays state-of-the-world xDS")),
        }
    }
}

/// What the raw phase measured.
#[derive(Debug, Default)]
pub struct RawOutcome {
    /// Connect to last handshake ACK, per proxy, against the replay server.
    pub connect: Vec<Duration>,
    /// Push to the ACK of the changed `watched` type, per proxy.
    pub samples: Vec<Duration>,
    pub bytes: u64,
    pub errors: Vec<String>,
}

/// Connects `proxies` simulated proxies (`streams_per_connection` on each connection) to a
/// [`ReplayServer`] of `capture`, waits for their handshakes, pushes, and times each proxy's ACK
/// of the changed `watched` type (the last response of the push).
pub async fn raw_phase(
    capture: Capture,
    watched: Watched,
    proxies: usize,
    streams_per_connection: usize,
    light: bool,
    timeout: Duration,
) -> Result<RawOutcome> {
    let delta = matches!(capture, Capture::Delta(_));
    let server = ReplayServer::start(capture).await?;
    let upstream = Upstream::new(server.addr.to_string(), streams_per_connection);
    let (tx, rx) = mpsc::unbounded_channel();
    let mut tasks = JoinSet::new();
    for n in 0..proxies {
        let opts = ProxyOptions {
            delta,
            light,
            ..Default::default()
        };
        tasks.spawn(run_proxy(upstream.clone(), n, opts, tx.clone()));
    }
    drop(tx);
    let mut tally = Tally::new(proxies, rx, tokio::time::Instant::now() + timeout);
    tally.until(Tally::settled).await;
    let connect = tally.connect_times(0..proxies);
    tally.deadline = tokio::time::Instant::now() + timeout;
    tally.change_made(watched, Instant::now());
    server.push();
    tally.until(Tally::all_changed).await;
    let samples = tally.change_times();
    let waited = Instant::now();
    while server.complete() < samples.len() && waited.elapsed() < ACK_WAIT {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    if server.complete() < samples.len() {
        let msg = format!(
            "only {} of {} streams ACKed every response of the push",
            server.complete(),
            samples.len()
        );
        tally.errors.push(msg);
    }
    tasks.shutdown().await;
    drop(server);
    Ok(RawOutcome {
        connect,
        samples,
        bytes: tally.bytes,
        errors: tally.errors,
    })
}
