//! RDS: route configurations by name. Gateway names (`http.<port>`, `https.<port>.<...>`) are
//! served from the merged gateway; sidecar route names (`<port>`) from the services and mesh
//! VirtualServices the sidecar sees (`sidecar`); any other name gets an empty configuration with
//! that name (so Envoy does not wait).

pub(crate) mod gateway;
pub(crate) mod sidecar;

use model::Proxy;
use push_index::PushContext;
use xds_api::envoy::config::route::v3::{RouteConfiguration, VirtualHost};
use xds_api::pbwkt::{BoolValue, UInt32Value};

use crate::lds::merged_gateway::MergedGateway;
use sidecar::SidecarPushView;

/// The route configurations `names` asks for, one per name, in the order asked.
pub(crate) fn build_route_configs(proxy: &Proxy, push: &PushContext, names: &[String]) -> Vec<RouteConfiguration> {
    build_route_configs_from(proxy, push, names)
}

/// `build_route_configs` over any push view (tests use a fake one).
pub(crate) fn build_route_configs_from<P: SidecarPushView>(
    proxy: &Proxy,
    push: &P,
    names: &[String],
) -> Vec<RouteConfiguration> {
    if proxy.is_sidecar() {
        return names
            .iter()
            .map(|n| sidecar::build_sidecar_outbound_http_route_config(proxy, push, n))
            .collect();
    }
    if !proxy.is_router() {
        return names.iter().map(|n| empty_route_config(n)).collect();
    }
    let merged = MergedGateway::for_proxy(push, proxy);
    names
        .iter()
        .map(|n| gateway::build_gateway_http_route_config(proxy, push, &merged, n))
        .collect()
}

/// Istio's `DefaultMaxDirectResponseBodySizeBytes` (1 MiB, the limit validation allows).
const MAX_DIRECT_RESPONSE_BODY_SIZE_BYTES: u32 = 1024 * 1024;

/// A route configuration as Istio builds it for gateways and sidecars: clusters not validated,
/// ports ignored in host matching, direct responses up to 1 MiB.
fn route_config(name: &str, virtual_hosts: Vec<VirtualHost>) -> RouteConfiguration {
    RouteConfiguration {
        name: name.to_owned(),
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: false }),
        ignore_port_in_host_matching: true,
        max_direct_response_body_size_bytes: Some(UInt32Value {
            value: MAX_DIRECT_RESPONSE_BODY_SIZE_BYTES,
        }),
        ..Default::default()
    }
}

/// A configuration with no virtual hosts (every request gets 404 NR), as Istio for unknown names.
pub(crate) fn empty_route_config(name: &str) -> RouteConfiguration {
    RouteConfiguration {
        name: name.to_owned(),
        validate_clusters: Some(BoolValue { value: false }),
        ..Default::default()
    }
}

#[cfg(test)]
mod behaviour_tests;
#[cfg(test)]
mod delegate_tests;
#[cfg(test)]
pub(crate) mod golden_tests;
#[cfg(test)]
mod sidecar_tests;
