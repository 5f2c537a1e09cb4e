//! What the two ADS protocols do differently, behind one stream loop: a [`Flavour`] is state of
//! the world (`sotw.rs`, Istio's `StreamAggregatedResources` and `ShouldRespond`) or delta
//! (`delta.rs`, Istio's `StreamDeltas` and `shouldRespondDelta`): how a request updates the
//! watches and what a response looks like.

use std::collections::HashMap;

use xds_api::Resource;
use xds_api::envoy::config::core::v3::Node;

use super::generate::Generated;
use crate::connection::Connection;
use crate::framing::Decode;
use crate::response::Framed;
use crate::snapshot::PushSnapshot;
use crate::watched::{NameInterner, Outcome, Watch, WatchedResource};

/// Why a response is being built: answering a request always answers; a push (delta) only when
/// something changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cause {
    Request,
    Push,
}

/// What state of the world and delta streams do differently.
pub(crate) trait Flavour: Send + Sync + 'static {
    type Request: Decode + Send + 'static;
    type Response: Framed;
    const DELTA: bool;
    /// "" or "delta ", for logs.
    const LOG: &'static str;

    fn node(req: &Self::Request) -> Option<&Node>;
    fn type_url(req: &Self::Request) -> &str;

    /// Records `req` in the connection's watches: what it meant, and what to answer with.
    fn on_request(
        watched: &mut HashMap<String, Watch>,
        req: &Self::Request,
        names: &NameInterner,
    ) -> (Outcome, Option<WatchedResource>);

    /// The response for `resources` (generated for `g.watched`), without its nonce: the resources
    /// it carries and, for logs, what it removes. `None` when there is nothing to send.
    fn response(
        conn: &Connection<impl PushSnapshot>,
        names: &NameInterner,
        g: &Generated,
        resources: &[Resource],
        version: &str,
        cause: Cause,
    ) -> Option<(Self::Response, usize, String)>;

    fn set_nonce(resp: &mut Self::Response, nonce: String);
}
