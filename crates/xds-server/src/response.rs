//! A response as it is framed: the discovery response's own fields, then its resources as the
//! push's shared `Any`s (`xds_api::Resource`), encoded straight into the gRPC frame. Building a
//! `DiscoveryResponse` first copied every resource out of its `Arc` (envoy-types' `Any.value` is a
//! `Vec<u8>`), so each response existed twice while it waited to be framed: 1 MB per sidecar per
//! push for the route configuration of an unscoped mesh of 1,000 services. The bytes are a valid
//! response: protobuf allows fields in any order, and decoding gives the message prost builds.
//!
//! The chunks are made as HTTP/2 asks for them ([`Framed::next_chunk`]), at most [`CHUNK`] of
//! copies each: hyper takes the next chunk only once the stream's send buffer has room, so a
//! response of many small resources (1,000 clusters: 1 MB) is not copied whole while it waits.

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
/// Copied bytes gathered into one chunk before it is handed to HTTP/2 (the last resource may
/// take it up to [`SHARE_AT`] over).
const CHUNK: usize = 32 * 1024;

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
    /// Encodes the resource onto `buf`, except that a value of [`SHARE_AT`] bytes or more is
    /// returned, the push's bytes uncopied, to follow `buf` as a chunk of its own; what comes
    /// after the value then goes to `tail`.
    fn frame(&self, buf: &mut Vec<u8>, tail: &mut Vec<u8>) -> Option<Bytes> {
        let any = self.any();
        if any.value.len() < SHARE_AT {
            self.encode(buf);
            return None;
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
        if let Shared::Delta { name, .. } = self {
            encoding::string::encode(3, name, tail);
        }
        Some(Bytes::from_owner(Value(any.clone())))
    }
}

/// How far a response has been framed.
#[derive(Debug, Default)]
pub(crate) struct Cursor {
    /// The gRPC header and the message's own fields are framed.
    started: bool,
    /// The next resource to frame.
    next: usize,
    /// A large value, the next chunk.
    shared: Option<Bytes>,
    /// What follows `shared`, the start of the chunk after it.
    tail: Vec<u8>,
    /// Bytes of the length-prefixed message not yet framed.
    left: usize,
}

/// A response message as the chunks of the response body.
pub(crate) trait Framed: Message + Send + 'static {
    /// The next chunk of the length-prefixed gRPC message after `cursor` (copied pieces of at
    /// most about [`CHUNK`] bytes, and resource values of [`SHARE_AT`] bytes or more as they are
    /// in the push); `None` once the message is framed.
    fn next_chunk(&self, cursor: &mut Cursor) -> Option<Bytes>;

    /// All the chunks at once.
    #[cfg(test)]
    fn frame(&self) -> Vec<Bytes> {
        let mut cursor = Cursor::default();
        std::iter::from_fn(|| self.next_chunk(&mut cursor)).collect()
    }
}

impl<M: Message + Send + 'static> Framed for Response<M> {
    fn next_chunk(&self, cursor: &mut Cursor) -> Option<Bytes> {
        if let Some(value) = cursor.shared.take() {
            cursor.left = cursor.left.saturating_sub(value.len());
            return Some(value);
        }
        let mut buf = std::mem::take(&mut cursor.tail);
        if !cursor.started {
            cursor.started = true;
            let len = self.encoded_len();
            cursor.left = HEADER_SIZE + len;
            buf.reserve(cursor.left.min(CHUNK + SHARE_AT));
            buf.put_u8(0);
            buf.put_u32(u32::try_from(len).unwrap_or(u32::MAX));
            self.message.encode_raw(&mut buf);
        } else if buf.len() < cursor.left {
            buf.reserve((cursor.left - buf.len()).min(CHUNK + SHARE_AT));
        }
        while buf.len() < CHUNK
            && let Some(r) = self.resources.get(cursor.next)
        {
            cursor.next += 1;
            if let Some(value) = r.frame(&mut buf, &mut cursor.tail) {
                cursor.shared = Some(value);
                break;
            }
        }
        if buf.is_empty() {
            return None;
        }
        cursor.left = cursor.left.saturating_sub(buf.len());
        Some(Bytes::from(buf))
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

    /// A response of many small resources is copied a chunk at a time, never whole: each chunk
    /// is made when the body is polled for it.
    #[test]
    fn many_small_resources_are_framed_in_bounded_chunks() {
        let small: Vec<Arc<Any>> = (0..1000)
            .map(|i| any(xds_api::type_url::CLUSTER, &[(i % 251) as u8; 1000]))
            .collect();
        let large = any(xds_api::type_url::CLUSTER, &[9; 2 * SHARE_AT]);
        let mut all = small.clone();
        all.insert(500, large.clone());
        let sotw = Response {
            message: DiscoveryResponse {
                nonce: "n".into(),
                ..Default::default()
            },
            resources: all.iter().cloned().map(Shared::Any).collect(),
        };
        let delta = Response {
            message: DeltaDiscoveryResponse {
                nonce: "n".into(),
                ..Default::default()
            },
            resources: all
                .iter()
                .enumerate()
                .map(|(i, any)| Shared::Delta {
                    name: format!("outbound|80||svc-{i}.default.svc.cluster.local"),
                    version: format!("v{i}"),
                    any: any.clone(),
                })
                .collect(),
        };
        fn check<M: Message + Send + 'static>(response: Response<M>, large: &Any) {
            let mut cursor = Cursor::default();
            let mut chunks = Vec::new();
            while let Some(chunk) = response.next_chunk(&mut cursor) {
                chunks.push(chunk);
            }
            assert!(response.next_chunk(&mut cursor).is_none(), "framed once");
            let wire: Vec<u8> = chunks.iter().flat_map(|c| c.iter().copied()).collect();
            assert_eq!(wire[HEADER_SIZE..], response.encode_to_vec()[..]);
            assert_eq!(cursor.left, 0);
            for c in &chunks {
                let shared = c.as_ptr() == large.value.as_ptr();
                assert!(
                    shared || c.len() <= CHUNK + SHARE_AT,
                    "a copied chunk of {} bytes",
                    c.len()
                );
            }
            assert!(
                chunks.len() > wire.len() / (CHUNK + SHARE_AT),
                "{} chunks",
                chunks.len()
            );
        }
        check(sotw, &large);
        check(delta, &large);
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
