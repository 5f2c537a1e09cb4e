//! Which endpoints a proxy reaches, and how, across clusters and networks, as Istio's
//! `EndpointBuilder`: `filterIstioEndpoint` (a cluster-local service's endpoints of other
//! clusters and the endpoints of networks outside the proxy's `REQUESTED_NETWORK_VIEW` are left
//! out) and `EndpointsByNetworkFilter`, split-horizon EDS: once meshNetworks names a gateway, an
//! endpoint on another network than the proxy's is reached through that network's gateways, which
//! take its weight (only endpoints that take Istio mTLS: the gateway routes by SNI), and endpoint
//! weights are scaled so that they split evenly over the gateways.

use std::borrow::Cow;
use std::collections::BTreeMap;

use model::mesh_networks::{NetworkGateway, NetworkIndex};
use model::service::TLS_MODE_LABEL;
use model::{Endpoint, Locality, Proxy};

/// The label Istio sets on the endpoints of a network (`label.TopologyNetwork`).
const NETWORK_LABEL: &str = "topology.istio.io/network";
/// The label Istio sets on the endpoints of a cluster (`label.TopologyCluster`).
const CLUSTER_LABEL: &str = "topology.istio.io/cluster";

/// `filterIstioEndpoint`: whether the proxy may see `e` at all.
pub(super) fn visible(proxy: &Proxy, networks: &NetworkIndex, cluster_local: bool, e: &Endpoint) -> bool {
    if cluster_local && !e.cluster_id.is_empty() && e.cluster_id != proxy.cluster_id() {
        return false;
    }
    proxy.sees_network(networks.network_of(e))
}

/// Locality groups after `EndpointsByNetworkFilter`; the groups unchanged when no network has a
/// gateway (Istio then reaches every endpoint directly).
pub(super) fn split_horizon<'a>(
    proxy: &Proxy,
    networks: &NetworkIndex,
    groups: Vec<(&'a Locality, Vec<&'a Endpoint>)>,
    mtls: &dyn Fn(&Endpoint) -> bool,
) -> Vec<(&'a Locality, Vec<Cow<'a, Endpoint>>)> {
    if !networks.is_multi_network() {
        return groups
            .into_iter()
            .map(|(l, eps)| (l, eps.into_iter().map(Cow::Borrowed).collect()))
            .collect();
    }
    let scale = networks.scale_factor().max(1);
    groups
        .into_iter()
        .map(|(locality, eps)| {
            let mut out: Vec<Cow<'a, Endpoint>> = Vec::new();
            let mut through: BTreeMap<&NetworkGateway, u32> = BTreeMap::new();
            for e in eps {
                let network = networks.network_of(e);
                // Sidecars reach a gateway on its mTLS port: gateways without one are not theirs.
                let gateways: Vec<&NetworkGateway> = networks
                    .gateways_for(network, &e.cluster_id)
                    .into_iter()
                    .filter(|g| g.port != 0)
                    .collect();
                let weight = e.weight.max(1).saturating_mul(scale);
                // A proxy of no known network still goes through the gateways of an endpoint's.
                let force_gateway = proxy.network().is_empty() && !network.is_empty() && !gateways.is_empty();
                if !force_gateway && (proxy.in_network(network) || gateways.is_empty()) {
                    out.push(scaled(e, weight));
                    continue;
                }
                // Cross-network traffic is routed by SNI: only endpoints that take Istio mTLS.
                if !mtls(e) {
                    continue;
                }
                let share = weight / u32::try_from(gateways.len()).unwrap_or(u32::MAX).max(1);
                for g in gateways {
                    let w = through.entry(g).or_default();
                    *w = w.saturating_add(share);
                }
            }
            out.extend(
                through
                    .into_iter()
                    .map(|(g, weight)| Cow::Owned(gateway_endpoint(g, locality, weight))),
            );
            (locality, out)
        })
        .filter(|(_, eps)| !eps.is_empty())
        .collect()
}

fn scaled(e: &Endpoint, weight: u32) -> Cow<'_, Endpoint> {
    if e.weight.max(1) == weight {
        return Cow::Borrowed(e);
    }
    Cow::Owned(Endpoint { weight, ..e.clone() })
}

/// The endpoint of a gateway into another network, in the locality of the endpoints it stands
/// for, marked for Istio mTLS (`tlsMode: istio`) with the gateway's network and cluster.
fn gateway_endpoint(g: &NetworkGateway, locality: &Locality, weight: u32) -> Endpoint {
    let mut labels = BTreeMap::from([(TLS_MODE_LABEL.to_owned(), "istio".to_owned())]);
    labels.insert(NETWORK_LABEL.to_owned(), g.network.clone());
    if !g.cluster.is_empty() {
        labels.insert(CLUSTER_LABEL.to_owned(), g.cluster.clone());
    }
    Endpoint {
        address: g.addr.clone(),
        endpoint_port: u16::try_from(g.port).unwrap_or_default(),
        labels,
        locality: locality.clone(),
        weight: weight.max(1),
        network: g.network.clone(),
        cluster_id: g.cluster.clone(),
        origin: format!("meshNetworks gateway {}:{} of {}", g.addr, g.port, g.network),
        ..Default::default()
    }
}
