//! LDS: listeners for a proxy. Routers (gateways) get Istio's gateway listeners; sidecars get
//! virtualOutbound, virtualInbound and per-port outbound listeners (`sidecar`, `sidecar_inbound`).

pub(crate) mod gateway;
pub(crate) mod gateway_tcp;
pub(crate) mod hcm;
mod inbound_mtls;
mod inspectors;
pub(crate) mod merged_gateway;
pub(crate) mod sidecar;
pub(crate) mod sidecar_inbound;
pub(crate) mod sidecar_tcp;
pub(crate) mod tls;

use model::Proxy;
use push_index::PushContext;
use xds_api::envoy::config::listener::v3::Listener;

/// All listeners of `proxy` for this push: gateway listeners for routers, sidecar listeners for
/// the others.
pub(crate) fn build_listeners(proxy: &Proxy, push: &PushContext) -> Vec<Listener> {
    if proxy.is_router() {
        let authz = crate::authz::AuthzFilters::for_proxy(push, proxy);
        gateway::build_gateway_listeners(proxy, push, &authz)
    } else {
        sidecar::build_sidecar_listeners(proxy, push)
    }
}

#[cfg(test)]
mod envoy_tests;
#[cfg(test)]
mod sidecar_tcp_tests;
#[cfg(test)]
mod sidecar_tests;
#[cfg(test)]
mod tests;
