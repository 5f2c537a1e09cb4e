//! The start of a stream, as Istio's `Receive` of a first request (`pkg/xds/server.go`) with
//! `initConnection` and `initProxyMetadata` (`pilot/pkg/xds/ads.go`) and `authorize` (`auth.go`):
//! the node of the first request parsed into a proxy (refused with `InvalidArgument` naming what
//! is wrong), checked against the identities the caller proved on the secure port, and registered
//! as a connection. Also how a stream whose request side fails ends, at its start or later.

use std::sync::Arc;

use futures::StreamExt;
use tonic::Status;
use xds_api::envoy::config::core::v3::Node;

use crate::Proxy;
use crate::auth::authorize;
use crate::framing::{Decode, RequestError, Requests};
use crate::metrics::ReasonLabel;
use crate::outbound::{OutSender, Outbound};
use crate::snapshot::SnapshotBuilder;
use crate::state::{Registration, ServerState};

/// Reads a stream's first request and registers its proxy, as both ADS flavours start. A node that
/// cannot be parsed is refused with `InvalidArgument` naming what is wrong (counted in
/// `pilot_xds_invalid_node`), one the caller may not serve as with `PermissionDenied`. `None`
/// when the stream ended or was refused.
pub(super) async fn accept<B: SnapshotBuilder, Req: Decode, Resp>(
    state: &Arc<ServerState<B>>,
    inbound: &mut Requests<Req>,
    out: &OutSender<Resp>,
    peer: String,
    identities: Option<Vec<String>>,
    delta: bool,
    node: impl Fn(&Req) -> Option<&Node>,
) -> Option<(Req, Registration<B>)> {
    let first = match inbound.next().await {
        Some(Ok(req)) => req,
        Some(Err(e)) => {
            end_with(state, out, &peer, e).await;
            return None;
        }
        None => return None,
    };
    match authorize_node(node(&first), identities.as_deref()) {
        Ok((node, identity)) => Some((first, state.register(node, peer, identity, delta))),
        Err(status) if status.code() == tonic::Code::PermissionDenied => {
            if let Some(suppressed) = monitoring::throttle::allow("ads_unauthorized") {
                tracing::warn!(suppressed, "ADS: {peer} unauthorized XDS: {}", status.message());
            }
            state
                .metrics
                .auth_failures
                .get_or_create(&ReasonLabel {
                    reason: "authorization",
                })
                .inc();
            let _ = out.send(Outbound::message(Err(status))).await;
            None
        }
        Err(status) => {
            if let Some(suppressed) = monitoring::throttle::allow("ads_refused_node") {
                tracing::warn!(suppressed, "ADS: {peer} refused: {}", status.message());
            }
            state.metrics.invalid_nodes.inc();
            let _ = out.send(Outbound::message(Err(status))).await;
            None
        }
    }
}

/// Ends a stream whose request side failed: a request the client sent that cannot be read is
/// counted, logged and answered with its status (`INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED`, ...);
/// a transport failure has nobody to tell.
pub(super) async fn end_with<B: SnapshotBuilder, T>(
    state: &ServerState<B>,
    out: &OutSender<T>,
    who: &str,
    e: RequestError,
) {
    match e {
        RequestError::Invalid { status, reason } => {
            state.record_invalid_request(who, reason, &status);
            let _ = out.send(Outbound::message(Err(status))).await;
        }
        RequestError::Transport(status) => tracing::debug!("ADS: {who} receive error: {status}"),
    }
}

/// The proxy of a stream's first node and the identity it is served as: on the secure port
/// (`identities`, those its caller proved) one of them that the proxy belongs to, else
/// `PermissionDenied`. That identity becomes the proxy's `verified_identity` (Istio's
/// `VerifiedIdentity`, never one a node's metadata names), which the generators read (SDS serves
/// credentials only to a proxy that has one); on the plaintext port it stays `None`.
fn authorize_node(node: Option<&Node>, identities: Option<&[String]>) -> Result<(Proxy, Option<String>), Status> {
    let mut proxy = parse_node(node)?;
    match identities {
        Some(ids) => {
            let id = authorize(&proxy, ids)?;
            proxy.verified_identity = model::VerifiedIdentity::from_spiffe(&id);
            Ok((proxy, Some(id)))
        }
        None => Ok((proxy, None)),
    }
}

/// The longest node ID accepted (Envoy's are `type~ip~pod.namespace~domain`).
pub(crate) const MAX_NODE_ID: usize = 1024;
/// The most node metadata accepted, encoded, per stream (Envoy's and the agent's are a few KB).
pub(crate) const MAX_NODE_METADATA: usize = 256 * 1024;

/// Parses the node of the first request, refusing it with `InvalidArgument` naming what is wrong:
/// an ID with control characters (it would forge log lines) or too long, metadata over
/// [`MAX_NODE_METADATA`], or what `Proxy::parse` refuses.
pub(crate) fn parse_node(node: Option<&Node>) -> Result<Proxy, Status> {
    let Some(node) = node.filter(|n| !n.id.is_empty()) else {
        return Err(Status::invalid_argument(
            "missing node information (the first request must carry node.id)",
        ));
    };
    if node.id.len() > MAX_NODE_ID || node.id.chars().any(char::is_control) {
        return Err(Status::invalid_argument(format!(
            "node.id {:?} has control characters or is over {MAX_NODE_ID} bytes",
            node.id.chars().take(128).collect::<String>()
        )));
    }
    let metadata_size = node.metadata.as_ref().map_or(0, prost::Message::encoded_len);
    if metadata_size > MAX_NODE_METADATA {
        return Err(Status::invalid_argument(format!(
            "node {:?}: metadata of {metadata_size} bytes is over the limit of {MAX_NODE_METADATA} bytes",
            node.id
        )));
    }
    let metadata = match &node.metadata {
        Some(s) => model::proxy::NodeMetadata::from_json(&node.id, &xds_api::struct_to_json(s)),
        None => Ok(model::proxy::NodeMetadata::default()),
    };
    let mut proxy = metadata
        .and_then(|md| Proxy::parse(&node.id, md))
        .map_err(|e| Status::invalid_argument(e.to_string()))?;
    if let Some(l) = &node.locality {
        proxy.locality = model::Locality {
            region: l.region.clone(),
            zone: l.zone.clone(),
            subzone: l.sub_zone.clone(),
        };
    }
    Ok(proxy)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The secure port's proven identity becomes the proxy's `verified_identity`; the plaintext
    /// port gives none, whatever the node's metadata says.
    #[test]
    fn only_the_secure_ports_proven_identity_is_the_proxys_verified_identity() {
        let metadata = xds_api::json_to_struct(&serde_json::json!({
            "NAMESPACE": "a",
            "VERIFIED_IDENTITY": "spiffe://cluster.local/ns/a/sa/admin",
        }));
        let node = Node {
            id: "router~10.0.0.1~gw.a~a.svc.cluster.local".into(),
            metadata: Some(metadata),
            ..Default::default()
        };
        let (plaintext, id) = authorize_node(Some(&node), None).unwrap();
        assert_eq!((plaintext.verified_identity, id), (None, None));
        let proven = ["spiffe://cluster.local/ns/a/sa/gw".to_owned()];
        let (secure, id) = authorize_node(Some(&node), Some(&proven)).unwrap();
        let verified = secure.verified_identity.unwrap();
        assert_eq!(
            (verified.namespace.as_str(), verified.service_account.as_str()),
            ("a", "gw")
        );
        assert_eq!(id.as_deref(), Some("spiffe://cluster.local/ns/a/sa/gw"));
        let other = ["spiffe://cluster.local/ns/b/sa/gw".to_owned()];
        let refused = authorize_node(Some(&node), Some(&other)).unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied);
    }

    #[test]
    fn refuses_bad_nodes_with_invalid_argument_naming_the_node() {
        let e = parse_node(None).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        let node = Node {
            id: "sidecar~not-an-ip~a.ns~ns.svc.cluster.local".into(),
            ..Default::default()
        };
        let e = parse_node(Some(&node)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("not-an-ip"), "{}", e.message());
        let md = xds_api::json_to_struct(&serde_json::json!({"LABELS": "x"}));
        let node = Node {
            id: "sidecar~1.2.3.4~a.ns~ns.svc.cluster.local".into(),
            metadata: Some(md),
            ..Default::default()
        };
        let e = parse_node(Some(&node)).unwrap_err();
        assert!(
            e.message().contains("LABELS") && e.message().contains("sidecar~1.2.3.4"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn refuses_control_characters_in_the_id_and_oversized_metadata() {
        let forged = Node {
            id: "sidecar~1.2.3.4~a.ns~ns.svc.cluster.local\nERROR forged line".into(),
            ..Default::default()
        };
        let e = parse_node(Some(&forged)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(
            e.message().contains("\\n") && !e.message().contains('\n'),
            "{}",
            e.message()
        );
        let big = xds_api::json_to_struct(&serde_json::json!({"PADDING": "x".repeat(MAX_NODE_METADATA)}));
        let heavy = Node {
            id: "sidecar~1.2.3.4~a.ns~ns.svc.cluster.local".into(),
            metadata: Some(big),
            ..Default::default()
        };
        let e = parse_node(Some(&heavy)).unwrap_err();
        assert!(
            e.message().contains("over the limit of 262144 bytes"),
            "{}",
            e.message()
        );
    }

    #[test]
    fn parses_node_locality() {
        let node = Node {
            id: "router~1.2.3.4~gw.ns~ns.svc.cluster.local".into(),
            locality: Some(xds_api::envoy::config::core::v3::Locality {
                region: "r".into(),
                zone: "z".into(),
                sub_zone: "s".into(),
            }),
            ..Default::default()
        };
        let p = parse_node(Some(&node)).unwrap();
        assert_eq!(p.locality.zone, "z");
        assert!(p.is_router());
    }
}
