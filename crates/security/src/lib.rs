//! Caller authentication and the CA's gRPC service, as Istio's `pkg/security` and
//! `security/pkg/server/ca`: a caller of the secure port (15012) proves who it is with a bearer
//! JWT (`JWT_RULE` without a cluster; a Kubernetes TokenReview with one) or with a workload
//! certificate of the mesh CA, and gets SPIFFE identities; `IstioCertificateService` signs CSRs
//! for those identities only.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod authn;
mod ca_service;
mod client_cert;
mod jwt;
pub mod spiffe;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use authn::{AuthContext, AuthError, AuthFuture, AuthSource, Authenticator, Caller, authenticate};
pub use ca_service::{CaMetrics, CaService};
pub use client_cert::{ClientCertAuthenticator, uri_sans as spiffe_uri_sans};
pub use jwt::{JwtAuthenticator, JwtRule};
