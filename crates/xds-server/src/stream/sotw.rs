//! State-of-the-world ADS (`StreamAggregatedResources`): every response carries every resource
//! of its type that the watch covers.

use std::collections::HashMap;

use xds_api::Resource;
use xds_api::envoy::config::core::v3::Node;
use xds_api::envoy::service::discovery::v3::DiscoveryResponse;

use super::flavour::{Cause, Flavour};
use super::generate::Generated;
use crate::connection::Connection;
use crate::request::SotwRequest;
use crate::response::{Response, Shared};
use crate::snapshot::PushSnapshot;
use crate::watched::{NameInterner, Outcome, Respond, Watch, WatchedResource, sotw_request};

pub(crate) struct Sotw;

impl Flavour for Sotw {
    type Request = SotwRequest;
    type Response = Response<DiscoveryResponse>;
    const DELTA: bool = false;
    const LOG: &'static str = "";

    fn node(req: &SotwRequest) -> Option<&Node> {
        req.node.as_ref()
    }

    fn type_url(req: &SotwRequest) -> &str {
        &req.type_url
    }

    fn on_request(
        watched: &mut HashMap<String, Watch>,
        req: &SotwRequest,
        names: &NameInterner,
    ) -> (Outcome, Option<WatchedResource>) {
        let (outcome, respond) = sotw_request(watched, req, names);
        let target = match respond {
            Respond::No => None,
            _ => watched.get(&req.type_url).map(|w| w.resource.clone()),
        };
        (outcome, target)
    }

    fn response(
        _conn: &Connection<impl PushSnapshot>,
        _names: &NameInterner,
        g: &Generated,
        resources: &[Resource],
        version: &str,
        _cause: Cause,
    ) -> Option<(Response<DiscoveryResponse>, usize, String)> {
        let resp = Response {
            message: DiscoveryResponse {
                version_info: version.to_owned(),
                type_url: g.watched.type_url.clone(),
                ..Default::default()
            },
            resources: resources.iter().map(|r| Shared::Any(r.resource.clone())).collect(),
        };
        Some((resp, resources.len(), String::new()))
    }

    fn set_nonce(resp: &mut Response<DiscoveryResponse>, nonce: String) {
        resp.message.nonce = nonce;
    }
}
