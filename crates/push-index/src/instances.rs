//! The service instances a proxy runs, as Istio's `GetProxyServiceTargets`: for a proxy whose
//! Pod a registry knows, the ports of the Services selecting it (`Proxy::service_targets`, ready
//! or not, as Istio's Kubernetes controller reads the Pod), with the other registries' (a
//! ServiceEntry selecting the workload) from their endpoints; for any other proxy, every service
//! port one of whose endpoints has one of the proxy's IP addresses. Sidecars build their inbound
//! listener chains and `inbound|<port>||` clusters from them. The instances of every endpoint
//! address are indexed once per push (on first use), so a lookup costs what the proxy's IPs have.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, OnceLock};

use model::{Port, Proxy, Service};

use crate::PushContext;

/// The provider of Kubernetes Services (`ServiceAttributes::service_registry`), whose instances
/// come from a proxy's service targets when it has them.
const KUBERNETES: &str = "Kubernetes";

/// One service port served by the proxy's workload, as Istio's `ServiceTarget`.
#[derive(Debug, Clone)]
pub struct ServiceInstance {
    pub service: Arc<Service>,
    /// The service port (number, name, protocol).
    pub service_port: Port,
    /// The port the workload listens on (the endpoint port), Istio's `TargetPort`.
    pub target_port: u16,
}

/// Where an instance comes from: (service, port, endpoint) positions in the registry, for the
/// order and the de-duplication of `service_instances` across a proxy's addresses.
type Position = (usize, usize, usize);

/// The instances of every endpoint address of a push, as (position, target port) in registry
/// order (service, then port, then endpoint), one per (service, port, target port) and address.
#[derive(Debug, Default)]
pub(crate) struct InstancesByAddress(OnceLock<HashMap<IpAddr, Vec<(Position, u16)>>>);

impl InstancesByAddress {
    fn build(push: &PushContext) -> HashMap<IpAddr, Vec<(Position, u16)>> {
        let mut out: HashMap<IpAddr, Vec<(Position, u16)>> = HashMap::new();
        for (si, service) in push.registry().services.iter().enumerate() {
            let endpoints = push.endpoints(&service.hostname, service.namespace());
            for (pi, port) in service.ports.iter().enumerate() {
                let of_port = endpoints
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| e.service_port_name == port.name);
                for (ei, e) in of_port {
                    let Ok(ip) = e.address.parse::<IpAddr>() else {
                        continue;
                    };
                    let target_port = if e.endpoint_port == 0 {
                        port.port
                    } else {
                        e.endpoint_port
                    };
                    let list = out.entry(ip).or_default();
                    if !list
                        .iter()
                        .any(|((s, p, _), t)| (*s, *p) == (si, pi) && *t == target_port)
                    {
                        list.push(((si, pi, ei), target_port));
                    }
                }
            }
        }
        out
    }
}

impl PushContext {
    /// Runs `f` over this push's instances by address, built on first use.
    fn with_instances<R>(&self, f: impl FnOnce(&HashMap<IpAddr, Vec<(Position, u16)>>) -> R) -> R {
        f(self.instances.0.get_or_init(|| InstancesByAddress::build(self)))
    }

    /// Whether the proxy runs an instance of the service (`hostname`, `namespace`): one of the
    /// service's endpoints, on one of its ports, at one of the proxy's IPs. Read from the service's
    /// own endpoints, so that deciding who an endpoint change concerns (every EDS push asks) costs
    /// what that service has, not an index of every endpoint of the mesh.
    pub(crate) fn serves(&self, proxy: &Proxy, hostname: &str, namespace: &str) -> bool {
        let Some(service) = self.registry().service(hostname, namespace) else {
            return false;
        };
        if let Some(targets) = &proxy.service_targets
            && service.attributes.service_registry == KUBERNETES
        {
            return targets
                .iter()
                .any(|t| t.service.hostname == hostname && t.service.namespace == namespace);
        }
        self.endpoints(hostname, namespace).iter().any(|e| {
            service.ports.iter().any(|p| p.name == e.service_port_name)
                && e.address
                    .parse::<IpAddr>()
                    .is_ok_and(|ip| proxy.ip_addresses.contains(&ip))
        })
    }

    /// The proxy's service instances: its service targets (see the module doc) first, in their
    /// order, then those of its endpoints of other registries; else those of its endpoints.
    pub fn service_instances(&self, proxy: &Proxy) -> Vec<ServiceInstance> {
        let Some(targets) = &proxy.service_targets else {
            return self.endpoint_instances(proxy);
        };
        let registry = self.registry();
        let mut out: Vec<ServiceInstance> = targets
            .iter()
            .filter_map(|t| {
                let service = registry.service(&t.service.hostname, &t.service.namespace)?;
                let port = service.ports.iter().find(|p| p.name == t.port_name)?;
                Some(ServiceInstance {
                    service: service.clone(),
                    service_port: port.clone(),
                    target_port: t.target_port,
                })
            })
            .collect();
        out.extend(
            self.endpoint_instances(proxy)
                .into_iter()
                .filter(|i| i.service.attributes.service_registry != KUBERNETES),
        );
        out
    }

    /// The instances of the endpoints at the proxy's IPs, in service order (hostname, namespace)
    /// then port order; one per (service, service port, target port), whatever the number of
    /// matching endpoints.
    fn endpoint_instances(&self, proxy: &Proxy) -> Vec<ServiceInstance> {
        let mut found: Vec<(Position, u16)> = self.with_instances(|by_address| {
            proxy
                .ip_addresses
                .iter()
                .filter_map(|ip| by_address.get(ip))
                .flatten()
                .copied()
                .collect()
        });
        if proxy.ip_addresses.len() > 1 {
            // several addresses: back to registry order, and one instance for all of them
            found.sort_unstable();
            let mut seen = std::collections::HashSet::new();
            found.retain(|((s, p, _), t)| seen.insert((*s, *p, *t)));
        }
        let services = &self.registry().services;
        found
            .into_iter()
            .filter_map(|((si, pi, _), target_port)| {
                let service = services.get(si)?;
                Some(ServiceInstance {
                    service: service.clone(),
                    service_port: service.ports.get(pi)?.clone(),
                    target_port,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use model::proxy::NodeMetadata;
    use model::{Protocol, Proxy};
    use serde_json::json;

    use crate::testing::push;

    fn proxy(ip: &str) -> Proxy {
        model::testing::proxy("sidecar", ip, "default", json!({}))
    }

    #[test]
    fn instances_are_the_service_ports_with_an_endpoint_at_the_proxy_ip() {
        let p = push(vec![json!({
            "apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
            "metadata": {"name": "reviews", "namespace": "default"},
            "spec": {"hosts": ["reviews.default.svc.cluster.local"], "location": "MESH_INTERNAL",
                "resolution": "STATIC",
                "ports": [{"number": 9080, "name": "http", "protocol": "HTTP", "targetPort": 8080},
                          {"number": 9090, "name": "tcp", "protocol": "TCP"}],
                "endpoints": [{"address": "10.0.0.9"}, {"address": "10.0.0.10"}]}
        })]);
        let mine = p.service_instances(&proxy("10.0.0.9"));
        let ports: Vec<_> = mine.iter().map(|i| (i.service_port.port, i.target_port)).collect();
        assert_eq!(ports, vec![(9080, 8080), (9090, 9090)]);
        assert_eq!(mine[0].service_port.protocol, Protocol::Http);
        assert_eq!(mine[0].service.hostname, "reviews.default.svc.cluster.local");
        assert!(p.service_instances(&proxy("10.0.0.11")).is_empty());
    }

    #[test]
    fn a_proxy_with_several_addresses_gets_each_instance_once_in_registry_order() {
        let se = |name: &str, endpoints: serde_json::Value| {
            json!({
                "apiVersion": "networking.istio.io/v1", "kind": "ServiceEntry",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"hosts": [format!("{name}.default.svc.cluster.local")], "location": "MESH_INTERNAL",
                    "resolution": "STATIC",
                    "ports": [{"number": 80, "name": "http", "protocol": "HTTP", "targetPort": 8080}],
                    "endpoints": endpoints}
            })
        };
        let p = push(vec![
            se(
                "a",
                json!([{"address": "10.0.0.10"}, {"address": "10.0.0.9", "ports": {"http": 9000}}]),
            ),
            se(
                "b",
                json!([{"address": "10.0.0.9"}, {"address": "10.0.0.10"}, {"address": "10.0.0.11"}]),
            ),
        ]);
        let md =
            NodeMetadata::from_json("test", &json!({"NAMESPACE": "default", "INSTANCE_IPS": "10.0.0.10"})).unwrap();
        let two = Proxy::parse("sidecar~10.0.0.9~p.default~default.svc.cluster.local", md).unwrap();
        let got: Vec<_> = p
            .service_instances(&two)
            .iter()
            .map(|i| (i.service.hostname.clone(), i.target_port))
            .collect();
        // service a: the 10.0.0.10 endpoint (8080) comes first in the registry, then 10.0.0.9's 9000;
        // service b: both addresses share target port 8080, so one instance
        assert_eq!(
            got,
            [
                ("a.default.svc.cluster.local".to_owned(), 8080),
                ("a.default.svc.cluster.local".to_owned(), 9000),
                ("b.default.svc.cluster.local".to_owned(), 8080),
            ]
        );
        let one: Vec<_> = p
            .service_instances(&proxy("10.0.0.11"))
            .iter()
            .map(|i| i.target_port)
            .collect();
        assert_eq!(one, [8080]);
    }
}
