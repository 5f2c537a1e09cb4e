//! Requests that cannot be read end the stream with a status that says why (never OK), are
//! counted in `pilot_xds_invalid_request` and leave the server serving others. The client sends
//! raw bytes through tonic, as a broken or hostile peer would.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::{Buf, BufMut};
use common::*;
use futures::StreamExt;
use prost::Message;
use test_support::ads::AdsClient;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::{Code, Status};
use xds_api::envoy::config::core::v3::Node;
use xds_api::envoy::service::discovery::v3::{DeltaDiscoveryRequest, DiscoveryRequest};
use xds_api::type_url;

const SOTW: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// Messages as the bytes given, unchanged.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;

    fn encoder(&mut self) -> Raw {
        Raw
    }

    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        let v = src.chunk().to_vec();
        src.advance(v.len());
        Ok(Some(v))
    }
}

/// Sends `message` as the stream's first request; the status the stream ends with.
async fn status_for(ts: &TestServer, path: &'static str, message: Vec<u8>) -> Status {
    status_after(ts, path, vec![message]).await
}

/// Sends `messages` on one stream; the status the stream ends with, after any answers.
async fn status_after(ts: &TestServer, path: &'static str, messages: Vec<Vec<u8>>) -> Status {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", ts.addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let requests = futures::stream::iter(messages).chain(futures::stream::pending());
    let response = grpc
        .streaming(tonic::Request::new(requests), PathAndQuery::from_static(path), Raw)
        .await;
    let mut responses = match response {
        Err(status) => return status,
        Ok(r) => r.into_inner(),
    };
    // Answers to the requests before the bad one may come first.
    loop {
        match responses.message().await {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("the stream must end with an error, not OK"),
            Err(status) => return status,
        }
    }
}

#[tokio::test]
async fn garbage_and_oversized_requests_end_the_stream_with_a_status_that_says_why() {
    let opts = xds_server::ServerOptions {
        max_recv_msg_size: 64 * 1024,
        ..fast_options()
    };
    let ts = serve(Mesh::basic(), opts).await;

    // Not protobuf: a field with wire type 7.
    let garbage = status_for(&ts, SOTW, vec![0xff, 0xff, 0xff]).await;
    assert_eq!(garbage.code(), Code::InvalidArgument, "{garbage:?}");
    assert!(garbage.message().contains("malformed request"), "{garbage:?}");

    // A node ID that is not UTF-8 (field 1 of node, field 1 of the request): delta this time.
    let node = [0x0a, 0x03, 0x0a, 0x01, 0xff];
    let bad_utf8 = status_for(&ts, DELTA, node.to_vec()).await;
    assert_eq!(bad_utf8.code(), Code::InvalidArgument, "{bad_utf8:?}");

    // Over ISTIO_GPRC_MAXRECVMSGSIZE.
    let large = status_for(&ts, SOTW, vec![0; 100 * 1024]).await;
    assert_eq!(large.code(), Code::ResourceExhausted, "{large:?}");
    assert!(large.message().contains("ISTIO_GPRC_MAXRECVMSGSIZE"), "{large:?}");

    assert_eq!(
        ts.metric(r#"pilot_xds_invalid_request_total{reason="malformed"}"#),
        Some(2.0)
    );
    assert_eq!(
        ts.metric(r#"pilot_xds_invalid_request_total{reason="too_large"}"#),
        Some(1.0)
    );
    // The server still serves a well-behaved proxy.
    let mut c = AdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    assert_eq!(c.handshake(None).await.unwrap().clusters.unwrap().names, vec![A, B, C]);
}

fn node() -> Option<Node> {
    Some(Node {
        id: NODE.into(),
        metadata: Some(xds_api::json_to_struct(&metadata())),
        ..Default::default()
    })
}

#[tokio::test]
async fn a_stream_watching_too_many_names_ends_with_resource_exhausted() {
    let opts = xds_server::ServerOptions {
        max_resource_names: 10,
        ..fast_options()
    };
    let ts = serve(Mesh::basic(), opts).await;
    let names = |n: usize| {
        (0..n)
            .map(|i| format!("outbound|80||s{i}.default.svc.cluster.local"))
            .collect::<Vec<_>>()
    };

    // One EDS request naming 11.
    let eds = DiscoveryRequest {
        node: node(),
        type_url: type_url::ENDPOINT.into(),
        resource_names: names(11),
        ..Default::default()
    };
    let status = status_for(&ts, SOTW, eds.encode_to_vec()).await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status
            .message()
            .contains("11 resource names of eds exceed PILOT_XDS_MAX_RESOURCE_NAMES (10)"),
        "{status:?}"
    );

    // Delta subscriptions add up: 6 then 6 more.
    let subscribe = |first: bool, names: Vec<String>| DeltaDiscoveryRequest {
        node: if first { node() } else { None },
        type_url: type_url::ENDPOINT.into(),
        resource_names_subscribe: names,
        ..Default::default()
    };
    let all = names(12);
    let status = status_after(
        &ts,
        DELTA,
        vec![
            subscribe(true, all[..6].to_vec()).encode_to_vec(),
            subscribe(false, all[6..].to_vec()).encode_to_vec(),
        ],
    )
    .await;
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");

    assert_eq!(
        ts.metric(r#"pilot_xds_invalid_request_total{reason="too_many_names"}"#),
        Some(2.0)
    );
    // Ten is fine.
    let mut c = AdsClient::connect(ts.addr, NODE, metadata()).await.unwrap();
    assert_eq!(c.handshake(None).await.unwrap().clusters.unwrap().names, vec![A, B, C]);
}
