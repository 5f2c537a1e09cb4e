//! The gRPC app probe: kubelet's `grpc` handler, a `grpc.health.v1.Health/Check` call on
//! plaintext HTTP/2. SERVING is healthy; any other status, or an error, is not.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use tonic::codegen::http::uri::PathAndQuery;

pub(crate) const HEALTH_CHECK_PATH: &str = "/grpc.health.v1.Health/Check";
/// `grpc.health.v1.HealthCheckResponse.ServingStatus.SERVING`.
pub(crate) const SERVING: i32 = 1;

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    pub service: String,
}

/// `grpc.health.v1.HealthCheckResponse`; the status enum read as its number.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    pub status: i32,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum GrpcProbeError {
    #[error("failed to create grpc connection to probe app: {0}")]
    Connect(#[source] tonic::transport::Error),
    #[error("grpc connection to probe app timed out after {0:?}")]
    ConnectTimeout(Duration),
    #[error("grpc probe failed: {0}")]
    Check(#[source] tonic::Status),
}

/// Asks the app's health service about `service` ("" = the whole server) within `timeout`,
/// passing the kubelet's `User-Agent` as Istio does. `Ok(true)` when SERVING.
pub(crate) async fn check(
    addr: SocketAddr,
    source: Option<IpAddr>,
    service: &str,
    timeout: Duration,
    user_agent: Option<&str>,
) -> Result<bool, GrpcProbeError> {
    let mut endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(GrpcProbeError::Connect)?
        .connect_timeout(timeout)
        .timeout(timeout)
        .local_address(source);
    if let Some(user_agent) = user_agent {
        endpoint = endpoint
            .user_agent(user_agent.to_owned())
            .map_err(GrpcProbeError::Connect)?;
    }
    let channel = tokio::time::timeout(timeout, endpoint.connect())
        .await
        .map_err(|_| GrpcProbeError::ConnectTimeout(timeout))?
        .map_err(GrpcProbeError::Connect)?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(GrpcProbeError::Connect)?;
    let request = tonic::Request::new(HealthCheckRequest {
        service: service.to_owned(),
    });
    let codec = tonic_prost::ProstCodec::<HealthCheckRequest, HealthCheckResponse>::default();
    let response = grpc
        .unary(request, PathAndQuery::from_static(HEALTH_CHECK_PATH), codec)
        .await
        .map_err(GrpcProbeError::Check)?;
    Ok(response.into_inner().status == SERVING)
}
