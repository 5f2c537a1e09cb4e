//! A state-of-the-world request as the client sends it: `DiscoveryRequest`'s fields, and the
//! resource names encoded once per subscription. Every ACK repeats every subscribed name, as
//! Envoy's do; cloning 2,000 names into each ACK of each of 2,000 simulated sidecars cost the load
//! generator more CPU than pilot-discovery spent answering them, on the same two cores.

use std::collections::BTreeSet;

use bytes::{Buf, BufMut, Bytes};
use prost::encoding::{DecodeContext, WireType};
use xds_api::envoy::service::discovery::v3::DiscoveryRequest;

/// `req`, with `names` (encoded `resource_names` entries, field 3) after its own fields. The
/// bytes are a valid `DiscoveryRequest`: protobuf allows fields in any order.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Outgoing {
    pub req: DiscoveryRequest,
    pub names: Bytes,
}

impl From<DiscoveryRequest> for Outgoing {
    fn from(req: DiscoveryRequest) -> Outgoing {
        Outgoing {
            req,
            names: Bytes::new(),
        }
    }
}

/// `names` as `DiscoveryRequest.resource_names` entries.
pub(crate) fn encode_names(names: &BTreeSet<String>) -> Bytes {
    let mut buf = Vec::new();
    for n in names {
        prost::encoding::string::encode(3, n, &mut buf);
    }
    buf.into()
}

impl prost::Message for Outgoing {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.req.encode_raw(buf);
        buf.put_slice(&self.names);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        self.req.merge_field(tag, wire_type, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.req.encoded_len() + self.names.len()
    }

    fn clear(&mut self) {
        self.req.clear();
        self.names = Bytes::new();
    }
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn encodes_as_the_request_with_its_names() {
        let names: BTreeSet<String> = ["a".to_string(), "outbound|80||b.ns.svc.cluster.local".into()].into();
        let req = DiscoveryRequest {
            version_info: "v1".into(),
            type_url: xds_api::type_url::ENDPOINT.into(),
            response_nonce: "n".into(),
            ..Default::default()
        };
        let out = Outgoing {
            req: req.clone(),
            names: encode_names(&names),
        };
        let bytes = out.encode_to_vec();
        assert_eq!(bytes.len(), out.encoded_len());
        let read = DiscoveryRequest::decode(&bytes[..]).unwrap();
        assert_eq!(
            read,
            DiscoveryRequest {
                resource_names: names.into_iter().collect(),
                ..req
            }
        );
    }
}
