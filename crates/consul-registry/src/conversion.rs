//! A Consul service's instances turned into one `Service` and its `Endpoint`s, as Istio 1.7's
//! `pilot/pkg/serviceregistry/consul/conversion.go` did:
//!
//! - the service is `<name>.service.consul` in Istio's default namespace (`default`), registry
//!   `Consul`, no VIP (Istio's `0.0.0.0`), the identity of `default/default` (Istio's
//!   `GetIstioServiceAccounts`);
//! - one port per instance port number, named and typed by `ServiceMeta.protocol` (`tcp` when
//!   absent, TCP when not a protocol Istio knows); the first instance on a port decides its
//!   protocol; two port numbers of one protocol are named `<protocol>` and `<protocol>-<number>`
//!   (Istio matched endpoints to ports by number; here they match by name, so names are unique);
//! - `ServiceMeta.external` makes it mesh-external with passthrough resolution;
//! - an endpoint per instance: `ServiceAddress`, else the node's `Address`; labels from
//!   `key|value` tags; the datacenter as locality (region).
//!
//! Instances that cannot be served (no IP address, a port out of range) and service names that
//! are no host name are left out and reported ([`Problem`]): Envoy would reject their config.

use std::collections::{BTreeMap, BTreeSet};

use model::service::{Locality, ServiceAttributes};
use model::{Endpoint, Port, Protocol, Resolution, Service};

use crate::catalog::CatalogService;

/// Istio's provider ID and `ServiceAttributes.ServiceRegistry` of this registry.
pub const SERVICE_REGISTRY_CONSUL: &str = "Consul";
/// Istio's `IstioDefaultConfigNamespace`: the namespace of every Consul service.
pub const NAMESPACE: &str = "default";
/// `ServiceMeta` key of the port protocol.
pub const PROTOCOL_META: &str = "protocol";
/// `ServiceMeta` key that makes a service mesh-external.
pub const EXTERNAL_META: &str = "external";

/// The host name of a Consul service (Istio's `serviceHostname`).
pub fn service_hostname(name: &str) -> String {
    format!("{name}.service.consul")
}

/// A service and its endpoints.
#[derive(Debug, Clone, PartialEq)]
pub struct Converted {
    pub service: Service,
    pub endpoints: Vec<Endpoint>,
}

/// Something of the catalog left out, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `service web` or `instance web/node-a/web-1`.
    pub what: String,
    pub reason: String,
}

/// The service `name` from its instances; `None` when no instance can be served.
pub fn convert(name: &str, instances: &[CatalogService], trust_domain: &str) -> (Option<Converted>, Vec<Problem>) {
    if let Err(reason) = check_name(name) {
        return (
            None,
            vec![Problem {
                what: format!("service {name:?}"),
                reason,
            }],
        );
    }
    let mut problems = Vec::new();
    let mut valid: Vec<(&CatalogService, u16)> = Vec::new();
    for inst in instances {
        match check_instance(inst) {
            Ok(port) => valid.push((inst, port)),
            Err(reason) => problems.push(Problem {
                what: format!("instance {name}/{}/{}", inst.node, inst.service_id),
                reason,
            }),
        }
    }
    if valid.is_empty() {
        return (None, problems);
    }
    // Consul lists instances in no promised order: the first per port must not depend on it.
    valid.sort_by(|(a, _), (b, _)| (&a.node, &a.service_id).cmp(&(&b.node, &b.service_id)));
    let ports = service_ports(name, &valid);
    let external = valid
        .iter()
        .any(|(i, _)| i.service_meta.get(EXTERNAL_META).is_some_and(|v| !v.is_empty()));
    let hostname = service_hostname(name);
    let endpoints = valid
        .iter()
        .map(|&(inst, port)| endpoint(name, inst, port, &ports))
        .collect();
    let service = Service {
        hostname: hostname.clone(),
        ports: ports.into_values().collect(),
        addresses: Vec::new(),
        cluster_vips: Default::default(),
        resolution: if external {
            Resolution::Passthrough
        } else {
            Resolution::ClientSideLb
        },
        mesh_external: external,
        attributes: ServiceAttributes {
            service_registry: SERVICE_REGISTRY_CONSUL.to_owned(),
            name: hostname,
            namespace: NAMESPACE.to_owned(),
            service_accounts: vec![format!("spiffe://{trust_domain}/ns/default/sa/default")],
            ..Default::default()
        },
        origin: format!("Consul/{name}"),
    };
    (Some(Converted { service, endpoints }), problems)
}

/// Istio's `convertLabels`: `key|value` tags; other tags are not labels.
pub fn convert_labels(tags: &[String]) -> BTreeMap<String, String> {
    tags.iter()
        .filter_map(|tag| {
            let mut parts = tag.split('|');
            match (parts.next(), parts.next()) {
                (Some(k), Some(v)) => Some((k.to_owned(), v.to_owned())),
                _ => {
                    tracing::debug!(tag, "Consul tag ignored: not of the form key|value");
                    None
                }
            }
        })
        .collect()
}

/// Istio's `convertProtocol`: the `protocol` meta, `tcp` when absent, TCP when unknown.
fn port_protocol(inst: &CatalogService) -> (String, Protocol) {
    let name = match inst.service_meta.get(PROTOCOL_META) {
        Some(p) if !p.is_empty() => p.clone(),
        _ => "tcp".to_owned(),
    };
    match Protocol::parse(&name) {
        Protocol::Unsupported => {
            tracing::warn!(
                service = inst.service_name,
                protocol = name,
                "Consul service's protocol is not one Istio knows: TCP"
            );
            (name, Protocol::Tcp)
        }
        p => (name, p),
    }
}

/// One port per number (the first instance's protocol), with unique names.
fn service_ports(name: &str, valid: &[(&CatalogService, u16)]) -> BTreeMap<u16, Port> {
    let mut by_number: BTreeMap<u16, (String, Protocol)> = BTreeMap::new();
    for &(inst, number) in valid {
        let (port_name, protocol) = port_protocol(inst);
        match by_number.get(&number) {
            Some((_, first)) if *first != protocol => tracing::warn!(
                service = name,
                port = number,
                kept = %first,
                ignored = %protocol,
                "Consul service has two instances on one port with different protocols"
            ),
            Some(_) => {}
            None => {
                by_number.insert(number, (port_name, protocol));
            }
        }
    }
    let mut used = BTreeSet::new();
    by_number
        .into_iter()
        .map(|(number, (port_name, protocol))| {
            let port_name = if used.contains(&port_name) {
                format!("{port_name}-{number}")
            } else {
                port_name
            };
            used.insert(port_name.clone());
            (
                number,
                Port {
                    name: port_name,
                    port: number,
                    protocol,
                },
            )
        })
        .collect()
}

fn endpoint(name: &str, inst: &CatalogService, port: u16, ports: &BTreeMap<u16, Port>) -> Endpoint {
    Endpoint {
        address: inst.endpoint_address().to_owned(),
        endpoint_port: port,
        service_port_name: ports.get(&port).map(|p| p.name.clone()).unwrap_or_default(),
        labels: convert_labels(&inst.service_tags),
        locality: Locality {
            region: inst.datacenter.clone(),
            ..Default::default()
        },
        weight: 0,
        service_account: String::new(),
        network: String::new(),
        cluster_id: String::new(),
        namespace: NAMESPACE.to_owned(),
        origin: format!("Consul/{name}/{}/{}", inst.node, inst.service_id),
    }
}

/// The instance's port, or why it cannot be an endpoint.
fn check_instance(inst: &CatalogService) -> Result<u16, String> {
    let port = u16::try_from(inst.service_port)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("ServicePort {} is not a port (1-65535)", inst.service_port))?;
    let address = inst.endpoint_address();
    if address.parse::<std::net::IpAddr>().is_err() {
        return Err(format!(
            "address {address:?} (ServiceAddress, else the node's Address) is not an IP address"
        ));
    }
    Ok(port)
}

/// A service name must make a host name: letters, digits, `-` and `_`, dot-separated.
fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 253
        && name
            .split('.')
            .all(|l| !l.is_empty() && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    if ok {
        Ok(())
    } else {
        Err("not a host name (letters, digits, '-', '_', '.'): it cannot be served as <name>.service.consul".into())
    }
}

#[cfg(test)]
#[path = "conversion_tests.rs"]
mod tests;
