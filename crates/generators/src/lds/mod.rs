//! LDS: listeners for a proxy. Routers (gateways) get Istio's gateway listeners; sidecar
//! listeners (inbound, outbound, virtual) are a later issue and return nothing yet.

pub mod gateway;
pub mod hcm;
pub mod merged_gateway;
pub mod tls;

use model::Proxy;
use push_index::PushContext;
use xds_api::envoy::config::listener::v3::Listener;

use crate::route::PushView;

/// All listeners of `proxy` for this push.
pub fn build_listeners(proxy: &Proxy, push: &PushContext) -> Vec<Listener> {
    build_listeners_from(proxy, push)
}

/// `build_listeners` over any push view (tests use a fake one).
pub fn build_listeners_from<P: PushView>(proxy: &Proxy, push: &P) -> Vec<Listener> {
    if proxy.is_router() {
        return gateway::build_gateway_listeners(proxy, push);
    }
    // TODO(sidecar-listeners): virtualOutbound/virtualInbound and per-port outbound/inbound
    // listeners (Istio's buildSidecarListeners) go here.
    Vec::new()
}

#[cfg(test)]
mod envoy_tests;
#[cfg(test)]
mod tests;
