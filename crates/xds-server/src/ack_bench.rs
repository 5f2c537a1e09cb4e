//! The state-of-the-world ACK path for benchmarks (`benches/ack.rs`): one connection's EDS watch
//! and the reading and applying of an ACK to it, as `framing.rs` and `watched.rs` do for a stream
//! (Istio's `ShouldRespond` on a decoded `DiscoveryRequest`). Hidden from the docs: not an API.

use std::collections::HashMap;

use bytes::Bytes;
use xds_api::envoy::service::discovery::v3::DiscoveryRequest;

use crate::request::SotwRequest;
use crate::watched::{NameInterner, Respond, Watch, sotw_request};

/// A connection subscribed to `names` of EDS, its last response sent with nonce "1".
pub struct AckPath {
    watched: HashMap<String, Watch>,
    interner: NameInterner,
}

impl AckPath {
    pub fn new(names: &[String]) -> AckPath {
        let mut path = AckPath {
            watched: HashMap::new(),
            interner: NameInterner::default(),
        };
        let first = DiscoveryRequest {
            type_url: xds_api::type_url::ENDPOINT.into(),
            resource_names: names.to_vec(),
            ..Default::default()
        };
        let _ = path.apply(prost::Message::encode_to_vec(&first).into());
        if let Some(w) = path.watched.get_mut(xds_api::type_url::ENDPOINT) {
            w.nonce_sent = "1".into();
        }
        path
    }

    /// Reads `encoded` (a `DiscoveryRequest`) and applies it; whether it is answered.
    pub fn apply(&mut self, encoded: Bytes) -> Result<bool, String> {
        let req = SotwRequest::decode(encoded)?;
        let (_, respond) = sotw_request(&mut self.watched, &req, &self.interner);
        Ok(respond != Respond::No)
    }
}
