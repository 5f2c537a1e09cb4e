//! LDS: listeners for a proxy. Routers (gateways) get Istio's gateway listeners; sidecars get
//! virtualOutbound, virtualInbound and per-port outbound listeners (`sidecar`, `sidecar_inbound`).

pub mod gateway;
pub mod hcm;
pub mod merged_gateway;
pub mod sidecar;
pub mod sidecar_inbound;
pub mod sidecar_tcp;
pub mod tls;

use model::Proxy;
use push_index::PushContext;
use xds_api::envoy::config::listener::v3::Listener;

use crate::route::PushView;

/// All listeners of `proxy` for this push.
pub fn build_listeners(proxy: &Proxy, push: &PushContext) -> Vec<Listener> {
    if !proxy.is_router() {
        return sidecar::build_sidecar_listeners(proxy, push);
    }
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
mod sidecar_tcp_tests;
#[cfg(test)]
mod sidecar_tests;
#[cfg(test)]
mod tests;
