//! A response as it is framed: the discovery response's own fields, then its resources as the
//! push's shared `Any`s (`xds_api::Resource`), encoded straight into the gRPC frame. Building a
//! `DiscoveryResponse` first copied every resource out of its `Arc` (envoy-types' `Any.value` is a
//! `Vec<u8>`), so each response existed twice while it waited to be framed: 1 MB per sidecar per
//! push for the route configuration of an unscoped mesh of 1,000 services. The bytes are a valid
//! response: protobuf allows fields in any order, and decoding gives the message prost builds.

use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use prost::encoding::{self, DecodeContext, WireType};
use xds_api::pbwkt::Any;

/// `resources`, field 2 of both `DiscoveryResponse` and `DeltaDiscoveryResponse`.
const RESOURCES: u32 = 2;
/// gRPC's length-prefixed message header: a compression flag and a big-endian length.
pub(crate) const HEADER_SIZE: usize = 5;
/// Resource values this long or longer are framed as the push's own bytes instead of copied:
/// one response of an unscoped mesh is a single 1 MB route configuration, shared by every sidecar.
const SHARE_AT: usize = 8 * 1024;

/// The bytes of a shared `Any`'s value, for `Bytes::from_owner`.
struct Value(Arc<Any>);

impl AsRef<[u8]> for Value {
    fn as_ref(&self) -> &[u8] {
        &self.0.value
    }
}

/// `message` (its `resources` empty) with `resources` after its own fields.
#[derive(Debug, Default)]
pub(crate) struct Response<M> {
    pub message: M,
    pub resources: Vec<Shared>,
}

/// One resource of a response, its `Any` shared with the push.
#[derive(Debug)]
pub(crate) enum Shared {
    /// State of the world: the `Any` itself.
    Any(Arc<Any>),
    /// Delta: an `envoy.service.discovery.v3.Resource` of this name and version.
    Delta {
        name: String,
        version: String,
        any: Arc<Any>,
    },
}

impl Shared {
    fn any(&self) -> &Arc<Any> {
        match self {
            Shared::Any(any) | Shared::Delta { any, .. } => any,
        }
    }

    /// The length of the resource's message, without its field key and length.
    fn body_len(&self) -> usize {
        match self {
            Shared::Any(any) => any.encoded_len(),
            Shared::Delta { name, version, any } => {
                encoding::string::encoded_len(1, version)
                    + encoding::message::encoded_len(2, any.as_ref())
                    + encoding::string::encoded_len(3, name)
            }
        }
    }

    fn encoded_len(&self) -> usize {
        let len = self.body_len();
        encoding::key_len(RESOURCES) + encoding::encoded_len_varint(len as u64) + len
    }

    fn encode(&self, buf: &mut impl BufMut) {
        match self {
            Shared::Any(any) => encoding::message::encode(RESOURCES, any.as_ref(), buf),
            Shared::Delta { name, version, any } => {
                encoding::encode_key(RESOURCES, WireType::LengthDelimited, buf);
                encoding::encode_varint(self.body_len() as u64, buf);
                encoding::string::encode(1, version, buf);
                encoding::message::encode(2, any.as_ref(), buf);
                encoding::string::encode(3, name, buf);
            }
        }
    }
}

impl Shared {
    /// Encodes the resource onto `buf`, except that a value of [`SHARE_AT`] bytes or more ends
    /// `buf` as a chunk and follows it as a chunk of its own, the push's bytes uncopied.
    fn frame(&self, buf: &mut Vec<u8>, chunks: &mut Vec<Bytes>) {
        let any = self.any();
        if any.value.len() < SHARE_AT {
            self.encode(buf);
            return;
        }
        encoding::encode_key(RESOURCES, WireType::LengthDelimited, buf);
        encoding::encode_varint(self.body_len() as u64, buf);
        if let Shared::Delta { version, .. } = self {
            encoding::string::encode(1, version, buf);
            encoding::encode_key(2, WireType::LengthDelimited, buf);
            encoding::encode_varint(any.encoded_len() as u64, buf);
        }
        // `Any` as prost encodes it: an empty `type_url` is left out.
        if !any.type_url.is_empty() {
            encoding::string::encode(1, &any.type_url, buf);
        }
        encoding::encode_key(2, WireType::LengthDelimited, buf);
        encoding::encode_varint(any.value.len() as u64, buf);
        chunks.push(Bytes::from(std::mem::take(buf)));
        chunks.push(Bytes::from_owner(Value(any.clone())));
        if let Shared::Delta { name, .. } = self {
            encoding::string::encode(3, name, buf);
        }
    }
}

/// A response message as the chunks of the response body.
pub(crate) trait Framed: Message + Send + 'static {
    /// The length-prefixed gRPC message, in chunks.
    fn frame(&self) -> Vec<Bytes>;
}

impl<M: Message + Send + 'static> Framed for Response<M> {
    /// Copied pieces, and resource values of [`SHARE_AT`] bytes or more as they are in the push.
    fn frame(&self) -> Vec<Bytes> {
        let len = self.encoded_len();
        let mut chunks = Vec::new();
        let mut buf = Vec::with_capacity((HEADER_SIZE + len).min(64 * 1024));
        buf.put_u8(0);
        buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
        self.message.encode_raw(&mut buf);
        for r in &self.resources {
            r.frame(&mut buf, &mut chunks);
        }
        if !buf.is_empty() {
            chunks.push(Bytes::from(buf));
        }
        chunks
    }
}

impl<M: Message> Message for Response<M> {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        self.message.encode_raw(buf);
        for r in &self.resources {
            r.encode(buf);
        }
    }

    /// Decoding reads every field, resources too, into `message`.
    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        self.message.merge_field(tag, wire_type, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.message.encoded_len() + self.resources.iter().map(Shared::encoded_len).sum::<usize>()
    }

    fn clear(&mut self) {
        self.message.clear();
        self.resources.clear();
    }
}

#[cfg(test)]
mod tests {
    use xds_api::envoy::service::discovery::v3::{DeltaDiscoveryResponse, DiscoveryResponse, Resource};

    use super::*;

    fn any(type_url: &str, value: &[u8]) -> Arc<Any> {
        Arc::new(Any {
            type_url: type_url.into(),
            value: value.to_vec(),
        })
    }

    #[test]
    fn a_state_of_the_world_response_decodes_as_the_message_with_its_resources() {
        let message = DiscoveryResponse {
            version_info: "2026-11-24T00:00:00Z/3".into(),
            type_url: xds_api::type_url::CLUSTER.into(),
            nonce: "7-abc".into(),
            ..Default::default()
        };
        let resources = [
            any(xds_api::type_url::CLUSTER, b"one"),
            any(xds_api::type_url::CLUSTER, &[0; 300]),
        ];
        let response = Response {
            message: message.clone(),
            resources: resources.iter().cloned().map(Shared::Any).collect(),
        };
        let bytes = response.encode_to_vec();
        assert_eq!(bytes.len(), response.encoded_len());
        let want = DiscoveryResponse {
            resources: resources.iter().map(|a| (**a).clone()).collect(),
            ..message
        };
        assert_eq!(DiscoveryResponse::decode(&bytes[..]).unwrap(), want);
        assert_eq!(bytes.len(), want.encoded_len());
    }

    /// The chunks are the length-prefixed message; a large value is the push's own bytes.
    fn assert_framed<M: Message + Send + 'static>(response: Response<M>, large: &Any, small: &Any) {
        let chunks = response.frame();
        let wire: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
        let body = response.encode_to_vec();
        assert_eq!(wire[0], 0);
        assert_eq!(
            u32::from_be_bytes([wire[1], wire[2], wire[3], wire[4]]) as usize,
            body.len()
        );
        assert_eq!(wire[HEADER_SIZE..], body[..]);
        assert!(
            chunks
                .iter()
                .any(|c| c.as_ptr() == large.value.as_ptr() && c.len() == large.value.len()),
            "the large value is shared, not copied"
        );
        assert!(!chunks.iter().any(|c| c.as_ptr() == small.value.as_ptr()));
    }

    #[test]
    fn a_frame_is_the_length_prefixed_message_with_large_values_uncopied() {
        let small = any(xds_api::type_url::ROUTE, b"small");
        let large = any(xds_api::type_url::ROUTE, &[9; SHARE_AT + 1]);
        let untyped = any("", &[3; SHARE_AT]);
        let sotw = Response {
            message: DiscoveryResponse {
                version_info: "v1".into(),
                nonce: "n".into(),
                ..Default::default()
            },
            resources: vec![
                Shared::Any(small.clone()),
                Shared::Any(large.clone()),
                Shared::Any(untyped),
            ],
        };
        assert_framed(sotw, &large, &small);
        let delta = Response {
            message: DeltaDiscoveryResponse {
                nonce: "n".into(),
                removed_resources: vec!["gone".into()],
                ..Default::default()
            },
            resources: vec![
                Shared::Delta {
                    name: "a".into(),
                    version: "v".into(),
                    any: large.clone(),
                },
                Shared::Delta {
                    name: "b".into(),
                    version: "w".into(),
                    any: small.clone(),
                },
            ],
        };
        assert_framed(delta, &large, &small);
    }

    #[test]
    fn a_delta_response_decodes_as_the_message_with_named_versioned_resources() {
        let message = DeltaDiscoveryResponse {
            system_version_info: "v3".into(),
            type_url: xds_api::type_url::ROUTE.into(),
            nonce: "9-abc".into(),
            removed_resources: vec!["gone".into()],
            ..Default::default()
        };
        let a = any(xds_api::type_url::ROUTE, &[7; 200]);
        let response = Response {
            message: message.clone(),
            resources: vec![Shared::Delta {
                name: "8080".into(),
                version: "h1".into(),
                any: a.clone(),
            }],
        };
        let bytes = response.encode_to_vec();
        assert_eq!(bytes.len(), response.encoded_len());
        let want = DeltaDiscoveryResponse {
            resources: vec![Resource {
                name: "8080".into(),
                version: "h1".into(),
                resource: Some((*a).clone()),
                ..Default::default()
            }],
            ..message
        };
        assert_eq!(DeltaDiscoveryResponse::decode(&bytes[..]).unwrap(), want);
        assert_eq!(bytes.len(), want.encoded_len());
    }
}
