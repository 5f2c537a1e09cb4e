//! RDS: route configurations by name. Gateway names (`http.<port>`, `https.<port>.<...>`) are
//! served from the merged gateway; sidecar route names (`<port>`) from the services and mesh
//! VirtualServices the sidecar sees (`sidecar`); any other name gets an empty configuration with
//! that name (so Envoy does not wait).

pub mod gateway;
pub mod sidecar;

use model::Proxy;
use push_index::PushContext;
use xds_api::envoy::config::route::v3::RouteConfiguration;
use xds_api::pbwkt::BoolValue;

use crate::lds::merged_gateway::MergedGateway;
use sidecar::SidecarPushView;

/// The route configurations `names` asks for, one per name, in the order asked.
pub fn build_route_configs(proxy: &Proxy, push: &PushContext, names: &[String]) -> Vec<RouteConfiguration> {
    build_route_configs_from(proxy, push, names)
}

/// `build_route_configs` over any push view (tests use a fake one).
pub fn build_route_configs_from<P: SidecarPushView>(
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
    let merged = MergedGateway::merge(&push.gateways_for_proxy(proxy));
    names
        .iter()
        .map(|n| gateway::build_gateway_http_route_config(proxy, push, &merged, n))
        .collect()
}

/// A configuration with no virtual hosts (every request gets 404 NR), as Istio for unknown names.
pub fn empty_route_config(name: &str) -> RouteConfiguration {
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
