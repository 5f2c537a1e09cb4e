//! Istio's own gRPC APIs, beside Envoy's (`xds-api`): the CA's `IstioCertificateService`
//! (`istio.v1.auth`), which pilot-discovery serves and pilot-agent calls.
#![forbid(unsafe_code)]

/// `istio.v1.auth`: `IstioCertificateService/CreateCertificate`.
pub mod ca {
    #![allow(clippy::all, clippy::pedantic, missing_docs)]
    tonic::include_proto!("istio.v1.auth");
}
