//! The service instances a proxy runs, as Istio's `GetProxyServiceTargets`: every service port one
//! of whose endpoints has one of the proxy's IP addresses. Sidecars build their inbound listener
//! chains and `inbound|<port>||` clusters from them.

use std::net::IpAddr;
use std::sync::Arc;

use model::{Port, Proxy, Service};

use crate::PushContext;

/// One service port served by the proxy's workload, as Istio's `ServiceTarget`.
#[derive(Debug, Clone)]
pub struct ServiceInstance {
    pub service: Arc<Service>,
    /// The service port (number, name, protocol).
    pub service_port: Port,
    /// The port the workload listens on (the endpoint port), Istio's `TargetPort`.
    pub target_port: u16,
}

impl PushContext {
    /// The proxy's service instances, in service order (hostname, namespace) then port order; one
    /// per (service, service port, target port), whatever the number of matching endpoints.
    pub fn service_instances(&self, proxy: &Proxy) -> Vec<ServiceInstance> {
        let mut out: Vec<ServiceInstance> = Vec::new();
        if proxy.ip_addresses.is_empty() {
            return out;
        }
        for service in &self.registry().services {
            let endpoints = self.endpoints(&service.hostname, service.namespace());
            for port in &service.ports {
                for e in endpoints.iter().filter(|e| e.service_port_name == port.name) {
                    if !is_proxy_address(proxy, &e.address) {
                        continue;
                    }
                    let target_port = if e.endpoint_port == 0 {
                        port.port
                    } else {
                        e.endpoint_port
                    };
                    let seen = out.iter().any(|i| {
                        Arc::ptr_eq(&i.service, service) && i.service_port == *port && i.target_port == target_port
                    });
                    if !seen {
                        out.push(ServiceInstance {
                            service: service.clone(),
                            service_port: port.clone(),
                            target_port,
                        });
                    }
                }
            }
        }
        out
    }
}

pub(crate) fn is_proxy_address(proxy: &Proxy, address: &str) -> bool {
    address
        .parse::<IpAddr>()
        .is_ok_and(|ip| proxy.ip_addresses.contains(&ip))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use model::config::parse_config;
    use model::proxy::NodeMetadata;
    use model::{MeshConfig, Protocol, Proxy};
    use serde_json::json;

    use crate::{PushContext, PushInput};

    fn push(docs: Vec<serde_json::Value>) -> PushContext {
        let mesh = Arc::new(MeshConfig::default());
        let configs: Vec<_> = docs
            .into_iter()
            .map(|d| Arc::new(parse_config(d, "default").unwrap()))
            .collect();
        let registry = Arc::new(registry::build(&configs, &mesh));
        PushContext::new(PushInput {
            mesh,
            domain: "cluster.local".into(),
            configs,
            registry,
            version: "1".into(),
        })
    }

    fn proxy(ip: &str) -> Proxy {
        let md = NodeMetadata::from_json("test", &json!({"NAMESPACE": "default"})).unwrap();
        Proxy::parse(&format!("sidecar~{ip}~p.default~default.svc.cluster.local"), md).unwrap()
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
}
