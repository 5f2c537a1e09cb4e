//! Target `xds_request`: one ADS stream as a client sends it, straight into pilot-discovery's ADS
//! service (`xds_server::AdsService`, the same code behind 15010 and 15012): gRPC framing, request
//! decoding and limits, node parsing, subscriptions, ACK/NACK and delta state, generation.
//!
//! Input: `[mode]` then chunks (`input::chunks`). Mode bit 0: delta instead of state of the world;
//! bit 1: the chunks are the raw request body (each a data frame), not messages to frame. When the
//! client's side ends, the stream must end too.

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use environment::Environment;
use futures::StreamExt;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use tonic::body::Body;
use tonic::codegen::{Service, http};
use xds_server::DiscoveryServer;

use crate::input::chunks;

const SOTW: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Longest a stream may take to end once its client has sent everything.
const END_WITHIN: Duration = Duration::from_secs(10);

struct Harness {
    rt: tokio::runtime::Runtime,
    server: Arc<DiscoveryServer<Environment>>,
}

fn harness() -> &'static Harness {
    static H: OnceLock<Harness> = OnceLock::new();
    H.get_or_init(|| {
        let rt = crate::harness_runtime();
        let server = rt.block_on(crate::mesh::discovery_server());
        Harness { rt, server }
    })
}

/// A gRPC message frame: uncompressed, length-prefixed.
pub(crate) fn grpc_frame(message: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(message.len() + 5);
    b.put_u8(0);
    b.put_u32(u32::try_from(message.len()).unwrap_or(u32::MAX));
    b.put_slice(message);
    b.freeze()
}

pub fn xds_request(data: &[u8]) {
    exchange(data);
}

/// Runs the stream; returns how many response bytes the client received.
pub(crate) fn exchange(data: &[u8]) -> usize {
    let Some((&mode, rest)) = data.split_first() else {
        return 0;
    };
    let h = harness();
    let frames: Vec<Bytes> = chunks(rest)
        .iter()
        .map(|c| {
            if mode & 2 == 0 {
                grpc_frame(c.bytes)
            } else {
                Bytes::copy_from_slice(c.bytes)
            }
        })
        .collect();
    let body = Body::new(StreamBody::new(futures::stream::iter(
        frames.into_iter().map(|b| Ok::<_, Infallible>(Frame::data(b))),
    )));
    let path = if mode & 1 == 0 { SOTW } else { DELTA };
    let req = http::Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/grpc")
        .body(body)
        .unwrap_or_else(|e| panic!("request: {e}"));
    h.rt.block_on(async {
        let mut svc = h.server.ads_service();
        let Ok(resp) = svc.call(req).await;
        let mut body = resp.into_body().into_data_stream();
        let drained = tokio::time::timeout(END_WITHIN, async {
            let mut bytes = 0usize;
            while let Some(chunk) = body.next().await {
                match chunk {
                    Ok(c) => bytes += c.len(),
                    Err(_) => break,
                }
            }
            bytes
        })
        .await;
        drained.unwrap_or_else(|_| panic!("the stream did not end within {END_WITHIN:?} of its client's last request"))
    })
}
