//! A state-of-the-world request as the server reads it: `DiscoveryRequest`'s fields, except that
//! the resource names stay where they arrived, in the request's bytes. Every ACK repeats every
//! subscribed name (2,000 for a sidecar that sees 2,000 clusters, at each EDS push); decoding
//! them into strings spent a `String` allocation, a copy and a UTF-8 check per name on names that
//! are then only compared with the watch's. Here they are spans of one buffer, checked for UTF-8
//! at once, and compared as bytes; only a changed subscription turns them into strings.

use std::ops::Range;

use bytes::{Buf, Bytes};
use prost::encoding::{
    DecodeContext, WireType, check_wire_type, decode_key, decode_varint, message, skip_field, string,
};
use xds_api::envoy::config::core::v3::Node;
use xds_api::envoy_types::pb::google::rpc::Status as RpcStatus;

/// `envoy.service.discovery.v3.DiscoveryRequest`, names kept as spans of the received bytes.
#[derive(Default)]
pub(crate) struct SotwRequest {
    pub version_info: String,
    pub node: Option<Node>,
    pub type_url: String,
    pub response_nonce: String,
    pub error_detail: Option<RpcStatus>,
    buf: Bytes,
    names: Vec<Range<usize>>,
}

/// DiscoveryRequest's field numbers.
const VERSION_INFO: u32 = 1;
const NODE: u32 = 2;
const RESOURCE_NAMES: u32 = 3;
const TYPE_URL: u32 = 4;
const RESPONSE_NONCE: u32 = 5;
const ERROR_DETAIL: u32 = 6;

impl SotwRequest {
    /// Reads one encoded `DiscoveryRequest`. Fields it does not use (`resource_locators`) and
    /// unknown ones are skipped, as prost skips them. Names must be UTF-8, as prost requires.
    pub(crate) fn decode(buf: Bytes) -> Result<SotwRequest, String> {
        let mut req = SotwRequest::default();
        let mut rest: &[u8] = &buf;
        let ctx = DecodeContext::default();
        while rest.has_remaining() {
            let (tag, wire_type) = decode_key(&mut rest).map_err(|e| e.to_string())?;
            let field = match tag {
                VERSION_INFO => string::merge(wire_type, &mut req.version_info, &mut rest, ctx.clone()),
                NODE => message::merge(
                    wire_type,
                    req.node.get_or_insert_with(Node::default),
                    &mut rest,
                    ctx.clone(),
                ),
                RESOURCE_NAMES => {
                    check_wire_type(WireType::LengthDelimited, wire_type).map_err(|e| e.to_string())?;
                    let len = decode_varint(&mut rest).map_err(|e| e.to_string())?;
                    let len = usize::try_from(len)
                        .ok()
                        .filter(|len| *len <= rest.len())
                        .ok_or("DiscoveryRequest.resource_names: buffer underflow")?;
                    let start = buf.len() - rest.len();
                    req.names.push(start..start + len);
                    rest.advance(len);
                    Ok(())
                }
                TYPE_URL => string::merge(wire_type, &mut req.type_url, &mut rest, ctx.clone()),
                RESPONSE_NONCE => string::merge(wire_type, &mut req.response_nonce, &mut rest, ctx.clone()),
                ERROR_DETAIL => message::merge(
                    wire_type,
                    req.error_detail.get_or_insert_with(RpcStatus::default),
                    &mut rest,
                    ctx.clone(),
                ),
                _ => skip_field(wire_type, tag, &mut rest, ctx.clone()),
            };
            field.map_err(|e| e.to_string())?;
        }
        // The bytes from the first name to the end of the last (keys, lengths and whatever else
        // lies between) are one slice: when it is all ASCII, as resource names are, every name is
        // UTF-8 without a check per name; otherwise each name is checked.
        if let (Some(first), Some(last)) = (req.names.first(), req.names.last()) {
            let all = buf.get(first.start..last.end).unwrap_or_default();
            if !all.is_ascii() {
                for (i, n) in req.names.iter().enumerate() {
                    if std::str::from_utf8(&buf[n.clone()]).is_err() {
                        return Err(format!(
                            "DiscoveryRequest.resource_names[{i}]: invalid string value: data is not UTF-8 encoded"
                        ));
                    }
                }
            }
        }
        req.buf = buf;
        Ok(req)
    }

    /// The resource names, as sent (UTF-8, checked by [`decode`](Self::decode)).
    pub(crate) fn resource_names(&self) -> impl Iterator<Item = &[u8]> + Clone {
        self.names.iter().map(|n| &self.buf[n.clone()])
    }

    /// The resource names as text, for the rare request whose names differ from the watch's.
    pub(crate) fn resource_names_str(&self) -> impl Iterator<Item = &str> + Clone {
        // Checked by `decode`, so nothing is dropped here.
        self.resource_names().filter_map(|n| std::str::from_utf8(n).ok())
    }
}

impl std::fmt::Debug for SotwRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SotwRequest")
            .field("version_info", &self.version_info)
            .field("node", &self.node.as_ref().map(|n| &n.id))
            .field("resource_names", &self.resource_names_str().collect::<Vec<_>>())
            .field("type_url", &self.type_url)
            .field("response_nonce", &self.response_nonce)
            .field("error_detail", &self.error_detail)
            .finish()
    }
}

/// For tests: the request as the server would read it off the wire.
#[cfg(test)]
impl From<&xds_api::envoy::service::discovery::v3::DiscoveryRequest> for SotwRequest {
    fn from(req: &xds_api::envoy::service::discovery::v3::DiscoveryRequest) -> SotwRequest {
        use prost::Message;
        match SotwRequest::decode(req.encode_to_vec().into()) {
            Ok(r) => r,
            Err(e) => panic!("a DiscoveryRequest that prost encoded must decode: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;
    use xds_api::envoy::service::discovery::v3::DiscoveryRequest;

    use super::*;

    fn full() -> DiscoveryRequest {
        DiscoveryRequest {
            version_info: "v1".into(),
            node: Some(Node {
                id: "sidecar~10.0.0.1~a.ns~ns.svc.cluster.local".into(),
                ..Default::default()
            }),
            resource_names: vec!["outbound|80||a.ns.svc.cluster.local".into(), "b".into(), "ü".into()],
            type_url: xds_api::type_url::ENDPOINT.into(),
            response_nonce: "n1".into(),
            error_detail: Some(RpcStatus {
                code: 13,
                message: "bad".into(),
                details: vec![],
            }),
            resource_locators: vec![Default::default()],
        }
    }

    #[test]
    fn every_field_reads_as_prost_reads_it() {
        let sent = full();
        let req = SotwRequest::decode(sent.encode_to_vec().into()).unwrap();
        assert_eq!(req.version_info, sent.version_info);
        assert_eq!(req.node, sent.node);
        assert_eq!(req.type_url, sent.type_url);
        assert_eq!(req.response_nonce, sent.response_nonce);
        assert_eq!(req.error_detail, sent.error_detail);
        assert_eq!(req.resource_names_str().collect::<Vec<_>>(), sent.resource_names);
        let bytes: Vec<&[u8]> = req.resource_names().collect();
        assert_eq!(
            bytes,
            sent.resource_names.iter().map(|n| n.as_bytes()).collect::<Vec<_>>()
        );
        assert_eq!(SotwRequest::decode(Bytes::new()).unwrap().resource_names().count(), 0);
    }

    #[test]
    fn malformed_requests_are_errors_as_prost_has_them() {
        let bytes = full().encode_to_vec();
        // cut anywhere: prost refuses it, and so does this
        for cut in 1..bytes.len() {
            let part = Bytes::copy_from_slice(&bytes[..cut]);
            assert_eq!(
                DiscoveryRequest::decode(part.clone()).is_err(),
                SotwRequest::decode(part).is_err(),
                "cut at {cut}"
            );
        }
        // a name that is not UTF-8
        let mut bad = DiscoveryRequest {
            resource_names: vec!["ok".into(), "XY".into()],
            ..Default::default()
        }
        .encode_to_vec();
        let at = bad.len() - 2;
        bad[at] = 0xff;
        let e = SotwRequest::decode(bad.clone().into()).unwrap_err();
        assert!(e.contains("resource_names[1]") && e.contains("UTF-8"), "{e}");
        assert!(DiscoveryRequest::decode(&bad[..]).is_err());
        // resource_names (field 3) as a varint (wire type 0)
        let e = SotwRequest::decode(vec![3 << 3, 1].into()).unwrap_err();
        assert!(e.contains("wire type"), "{e}");
    }
}
