//! Authenticated xDS (Istio's `DiscoveryServer.authenticate` / `authorize`, pilot/pkg/xds/auth.go):
//! on the secure port every stream's caller proves its identities before the first request is
//! read, and the proxy it then announces must be one of them: its namespace (and service
//! account, when its metadata names one) must match a SPIFFE identity the caller proved, so a
//! workload cannot fetch another namespace's config by naming another node.

use std::net::SocketAddr;
use std::sync::Arc;

use model::Proxy;
use rustls::pki_types::CertificateDer;
use tonic::Status;
use tonic::codegen::{BoxFuture, http};

/// Proves the caller of a stream (bearer token in `headers`, or the verified client certificate).
pub trait StreamAuthenticator: Send + Sync + 'static {
    /// The caller's SPIFFE identities, or why it is not authenticated.
    fn authenticate(
        &self,
        headers: http::HeaderMap,
        peer_certs: Option<Arc<Vec<CertificateDer<'static>>>>,
        peer: Option<SocketAddr>,
    ) -> BoxFuture<Vec<String>, String>;
}

/// Istio's `checkConnectionIdentity`: the first identity whose namespace is the proxy's (and whose
/// service account is the one its metadata names, if any).
pub(crate) fn authorize(proxy: &Proxy, identities: &[String]) -> Result<String, Status> {
    let sa = proxy.metadata.service_account.as_deref().unwrap_or_default();
    identities
        .iter()
        .find(|id| {
            parse_spiffe(id).is_some_and(|(ns, id_sa)| {
                (proxy.config_namespace.is_empty() || ns == proxy.config_namespace) && (sa.is_empty() || id_sa == sa)
            })
        })
        .cloned()
        .ok_or_else(|| {
            Status::permission_denied(format!(
                "authorization failed: no identities ({identities:?}) matched {}/{sa}",
                proxy.config_namespace
            ))
        })
}

/// (namespace, service account) of `spiffe://<td>/ns/<ns>/sa/<sa>`.
fn parse_spiffe(id: &str) -> Option<(String, String)> {
    model::VerifiedIdentity::from_spiffe(id).map(|v| (v.namespace, v.service_account))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn proxy(ns: &str, sa: Option<&str>) -> Proxy {
        let mut md = json!({"NAMESPACE": ns});
        if let Some(sa) = sa {
            md["SERVICE_ACCOUNT"] = json!(sa);
        }
        let md = model::proxy::NodeMetadata::from_json("x", &md).unwrap();
        Proxy::parse(&format!("sidecar~10.0.0.1~a.{ns}~{ns}.svc.cluster.local"), md).unwrap()
    }

    #[test]
    fn a_proxy_must_be_one_of_the_callers_identities() {
        let ids = ["spiffe://cluster.local/ns/default/sa/reviews".to_owned()];
        assert!(authorize(&proxy("default", None), &ids).is_ok());
        assert!(authorize(&proxy("default", Some("reviews")), &ids).is_ok());
        let e = authorize(&proxy("istio-system", None), &ids).unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        assert!(e.message().contains("matched istio-system/"), "{}", e.message());
        assert!(authorize(&proxy("default", Some("ratings")), &ids).is_err());
        assert!(authorize(&proxy("default", None), &["not-a-spiffe-id".to_owned()]).is_err());
        assert!(authorize(&proxy("default", None), &[]).is_err());
    }
}
