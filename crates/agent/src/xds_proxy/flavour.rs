//! The two ADS flavours the proxy forwards, state of the world and delta, behind one trait so
//! that one stream loop serves both.

use std::future::Future;

use futures::stream::BoxStream;
use tonic::{Status, Streaming};
use xds_api::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
};
use xds_api::envoy_types::pb::google::rpc;
use xds_api::pbwkt::Any;

use super::upstream::AdsClient;

/// gRPC's `Internal`, the code Istio puts in the agent's NACKs.
const INTERNAL: i32 = 13;

/// What the stream loop needs to know about one ADS flavour's messages.
pub(crate) trait Flavour: Send + Sync + 'static {
    type Request: Send + Sync + 'static;
    type Response: Send + Sync + 'static;
    /// For logs.
    const NAME: &'static str;

    fn request_type_url(req: &Self::Request) -> &str;
    fn request_nonce(req: &Self::Request) -> &str;
    fn request_error(req: &Self::Request) -> Option<&str>;
    fn response_type_url(resp: &Self::Response) -> &str;
    fn response_nonce(resp: &Self::Response) -> &str;
    fn response_version(resp: &Self::Response) -> &str;
    /// The one resource an agent-internal response (NDS, PCDS) carries.
    fn first_resource(resp: &Self::Response) -> Option<&Any>;
    /// The agent's ACK (no `error`) or NACK of `resp`; `version` is the one it accepts.
    fn ack(resp: &Self::Response, version: &str, error: Option<String>) -> Self::Request;
    /// A first subscription to `type_url` (the agent asking for NDS and PCDS itself).
    fn subscribe(type_url: &str) -> Self::Request;
    /// Opens the upstream stream of this flavour.
    fn open<'a>(
        client: &'a mut AdsClient,
        request: tonic::Request<BoxStream<'static, Self::Request>>,
    ) -> impl Future<Output = Result<tonic::Response<Streaming<Self::Response>>, Status>> + Send + 'a;
}

fn nack_detail(error: Option<String>) -> Option<rpc::Status> {
    error.map(|message| rpc::Status {
        code: INTERNAL,
        message,
        details: Vec::new(),
    })
}

/// State-of-the-world ADS (`StreamAggregatedResources`).
pub(crate) struct Sotw;

impl Flavour for Sotw {
    type Request = DiscoveryRequest;
    type Response = DiscoveryResponse;
    const NAME: &'static str = "sotw";

    fn request_type_url(req: &DiscoveryRequest) -> &str {
        &req.type_url
    }
    fn request_nonce(req: &DiscoveryRequest) -> &str {
        &req.response_nonce
    }
    fn request_error(req: &DiscoveryRequest) -> Option<&str> {
        req.error_detail.as_ref().map(|e| e.message.as_str())
    }
    fn response_type_url(resp: &DiscoveryResponse) -> &str {
        &resp.type_url
    }
    fn response_nonce(resp: &DiscoveryResponse) -> &str {
        &resp.nonce
    }
    fn response_version(resp: &DiscoveryResponse) -> &str {
        &resp.version_info
    }
    fn first_resource(resp: &DiscoveryResponse) -> Option<&Any> {
        resp.resources.first()
    }
    fn ack(resp: &DiscoveryResponse, version: &str, error: Option<String>) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: version.to_owned(),
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: nack_detail(error),
            ..Default::default()
        }
    }
    fn subscribe(type_url: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: type_url.to_owned(),
            ..Default::default()
        }
    }
    fn open<'a>(
        client: &'a mut AdsClient,
        request: tonic::Request<BoxStream<'static, DiscoveryRequest>>,
    ) -> impl Future<Output = Result<tonic::Response<Streaming<DiscoveryResponse>>, Status>> + Send + 'a {
        client.stream_aggregated_resources(request)
    }
}

/// Incremental ADS (`DeltaAggregatedResources`).
pub(crate) struct Delta;

impl Flavour for Delta {
    type Request = DeltaDiscoveryRequest;
    type Response = DeltaDiscoveryResponse;
    const NAME: &'static str = "delta";

    fn request_type_url(req: &DeltaDiscoveryRequest) -> &str {
        &req.type_url
    }
    fn request_nonce(req: &DeltaDiscoveryRequest) -> &str {
        &req.response_nonce
    }
    fn request_error(req: &DeltaDiscoveryRequest) -> Option<&str> {
        req.error_detail.as_ref().map(|e| e.message.as_str())
    }
    fn response_type_url(resp: &DeltaDiscoveryResponse) -> &str {
        &resp.type_url
    }
    fn response_nonce(resp: &DeltaDiscoveryResponse) -> &str {
        &resp.nonce
    }
    fn response_version(resp: &DeltaDiscoveryResponse) -> &str {
        &resp.system_version_info
    }
    fn first_resource(resp: &DeltaDiscoveryResponse) -> Option<&Any> {
        resp.resources.first().and_then(|r| r.resource.as_ref())
    }
    fn ack(resp: &DeltaDiscoveryResponse, _version: &str, error: Option<String>) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: resp.type_url.clone(),
            response_nonce: resp.nonce.clone(),
            error_detail: nack_detail(error),
            ..Default::default()
        }
    }
    fn subscribe(type_url: &str) -> DeltaDiscoveryRequest {
        DeltaDiscoveryRequest {
            type_url: type_url.to_owned(),
            ..Default::default()
        }
    }
    fn open<'a>(
        client: &'a mut AdsClient,
        request: tonic::Request<BoxStream<'static, DeltaDiscoveryRequest>>,
    ) -> impl Future<Output = Result<tonic::Response<Streaming<DeltaDiscoveryResponse>>, Status>> + Send + 'a {
        client.delta_aggregated_resources(request)
    }
}
