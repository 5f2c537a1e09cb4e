//! Who is calling (Istio's `security.Caller`, `security.Authenticate`): each authenticator looks at
//! what it knows (a bearer token in the gRPC metadata, the client certificate the TLS handshake
//! verified) and either proves identities or says why not; the first that proves wins.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use tonic::metadata::MetadataMap;

/// How the caller was authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthSource {
    /// A bearer JWT (Istio's `AuthSourceIDToken`).
    IdToken,
    /// A client certificate (Istio's `AuthSourceClientCertificate`).
    ClientCertificate,
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub source: AuthSource,
    /// SPIFFE IDs the caller proved.
    pub identities: Vec<String>,
}

/// What one request offers to prove its caller.
#[derive(Debug, Clone, Default)]
pub struct AuthContext {
    /// The `authorization: Bearer <token>` value's token, if any.
    pub bearer_token: Option<String>,
    /// The client certificate chain the TLS handshake verified (leaf first), if any.
    pub peer_certs: Option<Arc<Vec<CertificateDer<'static>>>>,
    pub peer_addr: Option<SocketAddr>,
}

impl AuthContext {
    /// From a gRPC request's metadata and connection.
    pub fn from_grpc(
        metadata: &MetadataMap,
        peer_certs: Option<Arc<Vec<CertificateDer<'static>>>>,
        peer_addr: Option<SocketAddr>,
    ) -> AuthContext {
        let bearer_token = metadata
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
            .map(str::to_owned);
        AuthContext {
            bearer_token,
            peer_certs,
            peer_addr,
        }
    }

    /// From an HTTP request's headers (gRPC over HTTP/2 before tonic decodes it).
    pub fn from_http(
        headers: &tonic::codegen::http::HeaderMap,
        peer_certs: Option<Arc<Vec<CertificateDer<'static>>>>,
        peer_addr: Option<SocketAddr>,
    ) -> AuthContext {
        AuthContext {
            bearer_token: headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(bearer)
                .map(str::to_owned),
            peer_certs,
            peer_addr,
        }
    }
}

/// Istio's `ExtractBearerToken`: the token of `Bearer <token>`.
fn bearer(value: &str) -> Option<&str> {
    let token = value.strip_prefix("Bearer ")?.trim();
    (!token.is_empty()).then_some(token)
}

/// Why a caller was not authenticated (a reason safe to log; the caller is told less).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The request offers nothing this authenticator reads (no token, no certificate).
    #[error("{0}")]
    NotPresented(String),
    #[error("{0}")]
    Invalid(String),
}

pub type AuthFuture<'a> = Pin<Box<dyn Future<Output = Result<Caller, AuthError>> + Send + 'a>>;

/// One way of proving a caller (Istio's `security.Authenticator`).
pub trait Authenticator: Send + Sync {
    /// Istio's authenticator type name, for logs.
    fn kind(&self) -> &'static str;
    fn authenticate<'a>(&'a self, ctx: &'a AuthContext) -> AuthFuture<'a>;
}

/// Istio's `security.Authenticate`: the first authenticator that proves the caller, else every
/// reason, joined.
pub async fn authenticate(authenticators: &[Arc<dyn Authenticator>], ctx: &AuthContext) -> Result<Caller, AuthError> {
    let mut reasons = Vec::new();
    for a in authenticators {
        match a.authenticate(ctx).await {
            Ok(caller) => return Ok(caller),
            Err(e) => reasons.push(format!("{}: {e}", a.kind())),
        }
    }
    if reasons.is_empty() {
        return Err(AuthError::Invalid("no authenticator is configured".into()));
    }
    Err(AuthError::Invalid(reasons.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read_as_istio_reads_them() {
        let mut md = MetadataMap::new();
        md.insert("authorization", "Bearer abc.def".parse().unwrap());
        assert_eq!(
            AuthContext::from_grpc(&md, None, None).bearer_token.as_deref(),
            Some("abc.def")
        );
        md.insert("authorization", "Basic abc".parse().unwrap());
        assert_eq!(AuthContext::from_grpc(&md, None, None).bearer_token, None);
        md.insert("authorization", "Bearer ".parse().unwrap());
        assert_eq!(AuthContext::from_grpc(&md, None, None).bearer_token, None);
    }
}
