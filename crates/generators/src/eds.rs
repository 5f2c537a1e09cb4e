//! EDS: `ClusterLoadAssignment`s for the EDS clusters a proxy watches, as Istio's
//! `EndpointBuilder`: the endpoints of the service port (by port name), filtered by the subset's
//! labels, grouped by locality (sorted), weighted, and prioritized for the proxy's locality when
//! locality load balancing applies.

pub(crate) mod locality;
mod networks;

#[cfg(test)]
mod network_tests;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use model::{ConfigKey, Endpoint, Port, Proxy, Service};
use push_index::{MergedDestinationRule, PushContext};
use xds_api::envoy::config::core::v3 as core;
use xds_api::envoy::config::endpoint::v3::{ClusterLoadAssignment, LbEndpoint, LocalityLbEndpoints, lb_endpoint};
use xds_api::pbwkt;

use crate::names::{TrafficDirection, parse_dns_srv_subset_key, parse_subset_key};
use crate::traffic_policy::cluster_policy;

/// Prefix of a Unix domain socket endpoint address.
const UNIX_PREFIX: &str = "unix://";

/// An assignment without endpoints, for a name that is not an EDS cluster of a visible service
/// or a cluster without endpoints (Envoy would otherwise keep waiting).
pub(crate) fn empty(name: &str) -> ClusterLoadAssignment {
    ClusterLoadAssignment {
        cluster_name: name.to_owned(),
        ..Default::default()
    }
}

/// What a cluster name refers to, for a given proxy.
pub(crate) struct Target {
    pub(crate) name: String,
    pub(crate) service: Arc<Service>,
    pub(crate) port: Port,
    pub(crate) subset: String,
    pub(crate) rule: Option<Arc<MergedDestinationRule>>,
    /// An SNI-DNAT cluster (`outbound_.<port>_.<subset>_.<host>`) of an AUTO_PASSTHROUGH gateway:
    /// only endpoints that take Istio mTLS (Istio's `EndpointsWithMTLSFilter`).
    pub(crate) sni_dnat: bool,
}

/// Everything an assignment depends on besides the push: proxies with equal keys get equal bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct EdsKey {
    name: String,
    service_namespace: String,
    rule_from: Vec<ConfigKey>,
    locality: String,
    labels: Option<BTreeMap<String, String>>,
    /// The proxy's cluster (cluster-local services), network and requested network view
    /// (split-horizon EDS).
    cluster: String,
    network: String,
    network_view: Vec<String>,
}

impl Target {
    /// Parses `outbound|port|subset|host` and finds the proxy's service for it; `None` for
    /// inbound or malformed names, unknown hosts or ports, and non-EDS services.
    pub(crate) fn resolve(proxy: &Proxy, push: &PushContext, name: &str) -> Option<Target> {
        let (parsed, sni_dnat) = match parse_subset_key(name) {
            Some(p) => (p, false),
            None => (parse_dns_srv_subset_key(name)?, true),
        };
        let (direction, subset, host, port) = parsed;
        if direction != TrafficDirection::Outbound {
            return None;
        }
        let service = push.service_for_host(proxy, host).filter(|s| s.hostname == host)?;
        if crate::cds::discovery_type(proxy, &service)
            != xds_api::envoy::config::cluster::v3::cluster::DiscoveryType::Eds
        {
            return None;
        }
        let port = service.port_by_number(port)?.clone();
        let rule = push.destination_rule(proxy, &service);
        Some(Target {
            name: name.to_owned(),
            service,
            port,
            subset: subset.to_owned(),
            rule,
            sni_dnat,
        })
    }

    pub(crate) fn key(&self, proxy: &Proxy, push: &PushContext) -> EdsKey {
        let policy = cluster_policy(
            self.rule.as_ref().map(|r| &r.rule),
            self.port.port,
            &self.subset,
            push.mesh().default_traffic_policy.as_ref(),
        );
        let setting = locality::effective_setting(
            push.mesh(),
            policy.as_ref().and_then(|p| p.load_balancer.as_ref()),
            &self.service,
        );
        let uses_labels = setting.as_ref().is_some_and(|s| !s.failover_priority().is_empty());
        EdsKey {
            name: self.name.clone(),
            service_namespace: self.service.namespace().to_owned(),
            rule_from: self.rule.as_ref().map(|r| r.from.clone()).unwrap_or_default(),
            locality: proxy.locality.to_string(),
            labels: uses_labels.then(|| proxy.labels.clone()),
            cluster: proxy.cluster_id().to_owned(),
            network: proxy.network().to_owned(),
            network_view: proxy.requested_network_view().to_vec(),
        }
    }

    pub(crate) fn build(&self, proxy: &Proxy, push: &PushContext) -> ClusterLoadAssignment {
        let labels = crate::cds::subset_labels(self.rule.as_deref(), &self.subset);
        let endpoints = push.endpoints(&self.service.hostname, self.service.namespace());
        let cluster_local = push.is_cluster_local(&self.service.hostname);
        let selected: Vec<&Endpoint> = endpoints
            .iter()
            .filter(|e| e.service_port_name == self.port.name)
            .filter(|e| networks::visible(proxy, push.networks(), cluster_local, e))
            .filter(|e| e.address.starts_with(UNIX_PREFIX) || e.address.parse::<IpAddr>().is_ok())
            .filter(|e| {
                labels
                    .iter()
                    .all(|(k, v)| e.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        // Istio's `mtlsChecker`: an endpoint whose own PeerAuthentication disables mTLS on its
        // port is reached in plaintext even if it has a sidecar.
        let mtls = |e: &Endpoint| {
            e.tls_mode() == "istio"
                && push
                    .peer_authentication(&e.namespace, &e.labels)
                    .for_port(u32::from(e.endpoint_port))
                    != model::security::MtlsMode::Disable
        };
        let selected: Vec<&Endpoint> = if self.sni_dnat {
            // passthrough TLS cannot be checked at the gateway: only mTLS endpoints are reachable
            selected.into_iter().filter(|e| mtls(e)).collect()
        } else {
            selected
        };
        if selected.is_empty() {
            return empty(&self.name);
        }
        let horizon = networks::split_horizon(proxy, push.networks(), group_by_locality(&selected), &mtls);
        let groups: Vec<(&model::Locality, Vec<&Endpoint>)> = horizon
            .iter()
            .map(|(l, eps)| (*l, eps.iter().map(AsRef::as_ref).collect()))
            .collect();
        if groups.is_empty() {
            return empty(&self.name);
        }
        let mut cla = ClusterLoadAssignment {
            cluster_name: self.name.clone(),
            endpoints: groups.iter().map(|(l, eps)| locality_group(l, eps, &mtls)).collect(),
            ..Default::default()
        };
        let policy = cluster_policy(
            self.rule.as_ref().map(|r| &r.rule),
            self.port.port,
            &self.subset,
            push.mesh().default_traffic_policy.as_ref(),
        );
        let enable_failover = policy.as_ref().is_some_and(|p| p.outlier_detection.is_some());
        let lb = policy.as_ref().and_then(|p| p.load_balancer.as_ref());
        if let Some(setting) = locality::effective_setting(push.mesh(), lb, &self.service) {
            let istio: Vec<Vec<&Endpoint>> = groups.into_iter().map(|(_, eps)| eps).collect();
            setting.apply(&mut cla, &istio, &proxy.locality, &proxy.labels, enable_failover);
        }
        cla
    }
}

/// Endpoints grouped by locality label, localities in label order (Istio sorts them).
pub(crate) fn group_by_locality<'a>(endpoints: &[&'a Endpoint]) -> Vec<(&'a model::Locality, Vec<&'a Endpoint>)> {
    let mut by_label: BTreeMap<String, (&model::Locality, Vec<&Endpoint>)> = BTreeMap::new();
    for e in endpoints {
        by_label
            .entry(e.locality.to_string())
            .or_insert_with(|| (&e.locality, Vec::new()))
            .1
            .push(e);
    }
    by_label.into_values().collect()
}

/// Locality groups for a cluster's `load_assignment` (DNS clusters: addresses may be hostnames).
pub(crate) fn locality_lb_endpoints(endpoints: &[Endpoint]) -> Vec<LocalityLbEndpoints> {
    let refs: Vec<&Endpoint> = endpoints.iter().collect();
    let mtls = |e: &Endpoint| e.tls_mode() == "istio";
    group_by_locality(&refs)
        .iter()
        .map(|(l, eps)| locality_group(l, eps, &mtls))
        .collect()
}

/// One `LocalityLbEndpoints`: its weight is the sum of its endpoints' weights.
fn locality_group(
    locality: &model::Locality,
    endpoints: &[&Endpoint],
    mtls: &dyn Fn(&Endpoint) -> bool,
) -> LocalityLbEndpoints {
    let lb_endpoints: Vec<LbEndpoint> = endpoints.iter().map(|e| lb_endpoint(e, mtls(e))).collect();
    let weight = lb_endpoints.iter().fold(0u32, |acc, e| {
        acc.saturating_add(e.load_balancing_weight.as_ref().map_or(0, |w| w.value))
    });
    LocalityLbEndpoints {
        locality: Some(locality::envoy_locality(locality)),
        lb_endpoints,
        load_balancing_weight: Some(pbwkt::UInt32Value { value: weight }),
        ..Default::default()
    }
}

/// An Envoy endpoint: `address:endpoint_port` (or a Unix socket), weight 1 when unset; with
/// `mtls`, the `envoy.transport_socket_match` metadata `tlsMode: istio` that auto mTLS clusters
/// match (Istio's `AppendLbEndpointMetadata`).
fn lb_endpoint(e: &Endpoint, mtls: bool) -> LbEndpoint {
    let address = match e.address.strip_prefix(UNIX_PREFIX) {
        Some(path) => core::address::Address::Pipe(core::Pipe {
            path: path.to_owned(),
            mode: 0,
        }),
        None => core::address::Address::SocketAddress(core::SocketAddress {
            address: e.address.clone(),
            port_specifier: Some(core::socket_address::PortSpecifier::PortValue(u32::from(
                e.endpoint_port,
            ))),
            ..Default::default()
        }),
    };
    LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(
            xds_api::envoy::config::endpoint::v3::Endpoint {
                address: Some(core::Address { address: Some(address) }),
                ..Default::default()
            },
        )),
        health_status: core::HealthStatus::Healthy as i32,
        load_balancing_weight: Some(pbwkt::UInt32Value { value: e.weight.max(1) }),
        metadata: mtls.then(tls_mode_metadata),
    }
}

fn tls_mode_metadata() -> core::Metadata {
    let istio = pbwkt::Struct {
        fields: [(
            crate::cds::TLS_MODE_KEY.to_owned(),
            pbwkt::Value {
                kind: Some(pbwkt::value::Kind::StringValue("istio".into())),
            },
        )]
        .into(),
    };
    core::Metadata {
        filter_metadata: [("envoy.transport_socket_match".to_owned(), istio)].into(),
        ..Default::default()
    }
}
