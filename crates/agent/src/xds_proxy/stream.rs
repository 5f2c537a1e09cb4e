//! One Envoy stream and its upstream twin. Envoy's requests go into an unbounded queue that feeds
//! the upstream stream, so reading Envoy never waits on pilot-discovery (istio/istio#39209: the
//! proxy stuck sending responses to an Envoy stuck sending requests); responses are forwarded in
//! order, except agent-internal types (NDS, PCDS), which a handler takes and the agent ACKs or
//! NACKs itself. An upstream error ends the Envoy stream with a gRPC status so Envoy reconnects
//! and redoes the full xDS sequence; while pilot-discovery is down, a new stream waits and
//! retries with backoff, and Envoy keeps serving its last config.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::{Code, Status, Streaming};
use xds_api::type_url;

use super::Shared;
use super::ack::{ConnectedGuard, SentNonces};
use super::flavour::Flavour;
use super::metrics::{CANCELLED, ERROR};

/// How long ending Envoy's stream with the upstream's status may wait for Envoy to read.
const STATUS_SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the upstream half of a stream ended.
enum UpstreamEnd {
    /// Opening the stream failed, or it ended with an error.
    Failed(Status),
    /// pilot-discovery closed the stream cleanly (e.g. its maximum connection age).
    Closed,
    /// Envoy went away while a response was on its way to it.
    DownstreamGone,
}

/// Why the whole stream ended.
enum Outcome {
    Stopped,
    Downstream(Result<(), Status>),
    Upstream(UpstreamEnd),
}

/// Serves one Envoy stream until it, its upstream, or the proxy ends.
pub(crate) async fn run<F: Flavour>(
    shared: Arc<Shared>,
    id: u64,
    downstream: Streaming<F::Request>,
    down_tx: mpsc::Sender<Result<F::Response, Status>>,
    mut stop: oneshot::Receiver<()>,
) {
    tracing::debug!(id, flavour = F::NAME, "accepted xDS stream from Envoy");
    let (req_tx, req_rx) = mpsc::unbounded_channel::<F::Request>();
    let sent = Arc::new(SentNonces::default());
    let mut reader = tokio::spawn(read_downstream::<F>(
        shared.clone(),
        downstream,
        req_tx.clone(),
        sent.clone(),
    ));
    let outcome = tokio::select! {
        _ = &mut stop => Outcome::Stopped,
        end = &mut reader => Outcome::Downstream(end.unwrap_or(Ok(()))),
        _ = down_tx.closed() => Outcome::Downstream(Ok(())),
        end = proxy::<F>(&shared, id, req_rx, &req_tx, &down_tx, &sent) => Outcome::Upstream(end),
    };
    reader.abort();
    shared.unregister_stream(id);
    let metrics = &shared.metrics;
    match outcome {
        Outcome::Stopped => tracing::debug!(id, "stream stopped"),
        Outcome::Downstream(Ok(())) | Outcome::Upstream(UpstreamEnd::DownstreamGone) => {
            tracing::debug!(id, "Envoy closed the xDS stream");
            metrics.envoy_terminated(CANCELLED);
        }
        Outcome::Downstream(Err(status)) => {
            let kind = if expected(&status) { CANCELLED } else { ERROR };
            tracing::debug!(id, %status, "Envoy's xDS stream ended");
            metrics.envoy_terminated(kind);
            // A request the proxy refused (over the size limit: RESOURCE_EXHAUSTED, as gRPC's
            // server answers) ends the stream with that status, as Istio's agent does.
            if kind == ERROR {
                tracing::warn!(id, %status, "refused a request from Envoy");
                let _ = tokio::time::timeout(STATUS_SEND_TIMEOUT, down_tx.send(Err(status))).await;
            }
        }
        Outcome::Upstream(UpstreamEnd::Closed) => {
            tracing::info!(id, upstream = shared.upstream.addr(), "upstream closed the xDS stream");
            metrics.istiod_terminated(CANCELLED);
        }
        Outcome::Upstream(UpstreamEnd::Failed(status)) => {
            let kind = if expected(&status) { CANCELLED } else { ERROR };
            tracing::warn!(id, upstream = shared.upstream.addr(), %status, "upstream xDS stream failed");
            metrics.istiod_terminated(kind);
            // Propagate to Envoy: it reconnects and resumes the full xDS sequence.
            let message = format!("upstream {}: {}", shared.upstream.addr(), status.message());
            // After any response still buffered for Envoy; bounded, in case Envoy stopped reading.
            let status = Err(Status::new(status.code(), message));
            let _ = tokio::time::timeout(STATUS_SEND_TIMEOUT, down_tx.send(status)).await;
        }
    }
}

/// Cancellations and deadlines are how streams normally end; anything else is an error.
fn expected(status: &Status) -> bool {
    matches!(status.code(), Code::Cancelled | Code::DeadlineExceeded)
}

/// Reads Envoy's requests into the queue, noting ACKs and NACKs, and after Envoy's first LDS
/// request subscribes upstream to the agent-internal types that have a handler.
async fn read_downstream<F: Flavour>(
    shared: Arc<Shared>,
    mut downstream: Streaming<F::Request>,
    req_tx: mpsc::UnboundedSender<F::Request>,
    sent: Arc<SentNonces>,
) -> Result<(), Status> {
    let mut initial_requests_sent = false;
    while let Some(req) = downstream.message().await? {
        let type_url = F::request_type_url(&req).to_owned();
        shared
            .status
            .observe_request(&sent, &type_url, F::request_nonce(&req), F::request_error(&req));
        // A send error means the upstream half is gone; the stream is ending anyway.
        let _ = req_tx.send(req);
        if !initial_requests_sent && type_url == type_url::LISTENER {
            initial_requests_sent = true;
            for internal in [type_url::NAME_TABLE, type_url::PROXY_CONFIG] {
                if shared.handler(internal).is_some() {
                    let _ = req_tx.send(F::subscribe(internal));
                }
            }
        }
    }
    Ok(())
}

/// Connects upstream (with backoff), then forwards responses until one side ends.
async fn proxy<F: Flavour>(
    shared: &Shared,
    id: u64,
    req_rx: mpsc::UnboundedReceiver<F::Request>,
    req_tx: &mpsc::UnboundedSender<F::Request>,
    down_tx: &mpsc::Sender<Result<F::Response, Status>>,
    sent: &SentNonces,
) -> UpstreamEnd {
    let upstream = &shared.upstream;
    let (mut client, metadata) = loop {
        upstream.wait_backoff().await;
        let attempt =
            async { Ok::<_, super::upstream::DialError>((upstream.dial().await?, upstream.metadata().await?)) };
        match attempt.await {
            Ok(connected) => break connected,
            Err(err) => {
                tracing::warn!(id, %err, "failed to connect to upstream");
                shared.metrics.istiod_connection_failures.inc();
                upstream.record_failure();
            }
        }
    };
    let counter = shared.metrics.requests.clone();
    let requests = UnboundedReceiverStream::new(req_rx)
        .map(move |req| {
            counter.inc();
            req
        })
        .boxed();
    let mut request = tonic::Request::new(requests);
    *request.metadata_mut() = metadata;
    let mut responses = match F::open(&mut client, request).await {
        Ok(response) => response.into_inner(),
        Err(status) => {
            upstream.record_failure();
            return UpstreamEnd::Failed(status);
        }
    };
    tracing::info!(
        id,
        upstream = upstream.addr(),
        flavour = F::NAME,
        "connected to upstream XDS server"
    );
    let _connected = ConnectedGuard::new(&shared.status);
    // Versions the agent accepted per internal type: a NACK repeats the last accepted one.
    let mut accepted: HashMap<String, String> = HashMap::new();
    let mut delivered_any = false;
    loop {
        let resp = match responses.message().await {
            Ok(Some(resp)) => resp,
            end => {
                if !delivered_any {
                    upstream.record_failure();
                }
                return match end {
                    Err(status) => UpstreamEnd::Failed(status),
                    Ok(_) => UpstreamEnd::Closed,
                };
            }
        };
        if !delivered_any {
            delivered_any = true;
            upstream.record_success();
        }
        shared.metrics.responses.inc();
        let type_url = F::response_type_url(&resp);
        if let Some(handler) = shared.handler(type_url) {
            let result = F::first_resource(&resp).map_or(Ok(()), |any| handler(any));
            let ack = match result {
                Ok(()) => {
                    accepted.insert(type_url.to_owned(), F::response_version(&resp).to_owned());
                    F::ack(&resp, F::response_version(&resp), None)
                }
                Err(error) => {
                    tracing::warn!(id, type_url, %error, "agent rejected (NACK) an internal xDS response");
                    let previous = accepted.get(type_url).map_or("", String::as_str);
                    F::ack(&resp, previous, Some(error))
                }
            };
            let _ = req_tx.send(ack);
            continue;
        }
        if !is_envoy_type(type_url) {
            tracing::error!(
                id,
                type_url,
                "skipping a response that is not an Envoy type and has no handler"
            );
            continue;
        }
        sent.sent(type_url, F::response_nonce(&resp));
        if down_tx.send(Ok(resp)).await.is_err() {
            return UpstreamEnd::DownstreamGone;
        }
    }
}

/// Istio's `IsEnvoyType`: only Envoy's own types are forwarded to Envoy.
fn is_envoy_type(type_url: &str) -> bool {
    type_url.starts_with("type.googleapis.com/envoy")
}
