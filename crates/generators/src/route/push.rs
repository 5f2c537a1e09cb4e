//! What the gateway listener, route-configuration and route builders read from the push index:
//! the `PushView` trait. `push_index::PushContext` implements it; tests implement it over plain
//! maps, so the builders are exercised without a full push.

use std::sync::Arc;

use model::networking::DestinationRule;
use model::{Config, Features, MeshConfig, Proxy, Service};

use crate::lds::merged_gateway::{DISABLE_PORT_TRANSLATION_LABEL, GatewayTarget};

/// Read-only view of one push, as the builders need it (a narrow slice of Istio's `PushContext`).
pub(crate) trait PushView {
    fn mesh(&self) -> &MeshConfig;
    /// The cluster domain (`cluster.local`), used to resolve short host names.
    fn domain(&self) -> &str;
    /// Istio's feature flags of this push.
    fn features(&self) -> &Features;
    fn service_for_host(&self, proxy: &Proxy, host: &str) -> Option<Arc<Service>>;
    /// Calls `f` with the DestinationRule that applies to `service` for this proxy, if any.
    fn with_destination_rule<R>(
        &self,
        proxy: &Proxy,
        service: &Service,
        f: impl FnOnce(&DestinationRule) -> R,
    ) -> Option<R>;
    /// Gateway configs selecting this proxy, sorted.
    fn gateways_for_proxy(&self, proxy: &Proxy) -> Vec<Arc<Config>>;
    /// The ports of the Services selecting this (gateway) proxy with their target ports, in
    /// Istio's `ServiceTargets` order: what a gateway server's port is translated by.
    fn gateway_targets(&self, proxy: &Proxy) -> Vec<GatewayTarget>;
    /// The services the proxy's clusters are built for (Istio's `SidecarScope.Services()`).
    fn scope_services(&self, proxy: &Proxy) -> Vec<Arc<Service>>;
    /// VirtualServices bound to `gateway` (`ns/name`) and visible to the proxy, in Istio's order.
    fn virtual_services_for_gateway(&self, proxy: &Proxy, gateway: &str) -> Vec<Arc<Config>>;
}

impl PushView for push_index::PushContext {
    fn mesh(&self) -> &MeshConfig {
        push_index::PushContext::mesh(self)
    }

    fn domain(&self) -> &str {
        push_index::PushContext::domain(self)
    }

    fn features(&self) -> &Features {
        push_index::PushContext::features(self)
    }

    fn service_for_host(&self, proxy: &Proxy, host: &str) -> Option<Arc<Service>> {
        push_index::PushContext::service_for_host(self, proxy, host)
    }

    fn with_destination_rule<R>(
        &self,
        proxy: &Proxy,
        service: &Service,
        f: impl FnOnce(&DestinationRule) -> R,
    ) -> Option<R> {
        push_index::PushContext::destination_rule(self, proxy, service).map(|merged| f(&merged.rule))
    }

    fn gateways_for_proxy(&self, proxy: &Proxy) -> Vec<Arc<Config>> {
        push_index::PushContext::gateways_for_proxy(self, proxy)
    }

    fn gateway_targets(&self, proxy: &Proxy) -> Vec<GatewayTarget> {
        gateway_targets(self, proxy)
    }

    fn scope_services(&self, proxy: &Proxy) -> Vec<Arc<Service>> {
        crate::cds::scope_services(proxy, self)
    }

    fn virtual_services_for_gateway(&self, proxy: &Proxy, gateway: &str) -> Vec<Arc<Config>> {
        push_index::PushContext::virtual_services_for_gateway(self, proxy, gateway)
    }
}

/// The proxy's service instances as gateway targets: each port of a Service with an endpoint at
/// the proxy's address, and the endpoint's port.
pub(crate) fn gateway_targets(push: &push_index::PushContext, proxy: &Proxy) -> Vec<GatewayTarget> {
    push.service_instances(proxy)
        .into_iter()
        .map(|i| GatewayTarget {
            service_port: u32::from(i.service_port.port),
            target_port: u32::from(i.target_port),
            disable_translation: i.service.attributes.labels.contains_key(DISABLE_PORT_TRANSLATION_LABEL),
        })
        .collect()
}
