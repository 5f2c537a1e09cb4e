//! ServiceEntry and WorkloadEntry conversion, as Istio's `serviceentry/conversion.go`: one `Service`
//! per host of a ServiceEntry, and one `Endpoint` per (service, service port, workload).

use std::collections::BTreeMap;
use std::net::IpAddr;

use model::mesh::MeshConfig;
use model::networking::{ServiceEntry, ServicePort, WorkloadEntry};
use model::service::{Visibility, is_visible};
use model::{ConfigMeta, Endpoint, Locality, Port, Protocol, Resolution, Service, ServiceAttributes};

/// `provider.External`: the registry name of ServiceEntry services.
pub const SERVICE_REGISTRY_EXTERNAL: &str = "External";
/// Istio's `provider.Kubernetes`: the registry of Kubernetes Services (one per cluster).
pub const SERVICE_REGISTRY_KUBERNETES: &str = "Kubernetes";
/// Prefix of a Unix domain socket endpoint address (`unix:///var/run/app.sock`).
pub const UNIX_ADDRESS_PREFIX: &str = "unix://";
/// Old-style locality label (`region.zone.subzone`, dots because Kubernetes labels allow no `/`).
pub const LOCALITY_LABEL: &str = "istio-locality";
/// Label naming the endpoint's mTLS mode (`istio` or `disabled`).
pub const TOPOLOGY_REGION: &str = "topology.kubernetes.io/region";
pub const TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
pub const TOPOLOGY_SUBZONE: &str = "topology.istio.io/subzone";
pub const TOPOLOGY_NETWORK: &str = "topology.istio.io/network";

/// What an endpoint address is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AddressKind {
    Ip,
    Hostname,
    Unix,
    Invalid,
}

impl AddressKind {
    pub(crate) fn of(addr: &str) -> AddressKind {
        if addr.parse::<IpAddr>().is_ok() {
            AddressKind::Ip
        } else if let Some(path) = addr.strip_prefix(UNIX_ADDRESS_PREFIX) {
            if path.len() > 1 && (path.starts_with('/') || path.starts_with('@')) {
                AddressKind::Unix
            } else {
                AddressKind::Invalid
            }
        } else if is_hostname(addr) {
            AddressKind::Hostname
        } else {
            AddressKind::Invalid
        }
    }
}

/// A DNS name (no wildcard): dot-separated labels of letters, digits and '-', optional final dot.
fn is_hostname(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// ServiceEntry `resolution` as the model's: NONE (default) is passthrough, STATIC is EDS.
pub(crate) fn resolution(s: Option<&str>) -> Resolution {
    match s.unwrap_or("NONE") {
        "STATIC" => Resolution::ClientSideLb,
        "DNS" => Resolution::DnsLb,
        "DNS_ROUND_ROBIN" => Resolution::DnsRoundRobinLb,
        _ => Resolution::Passthrough,
    }
}

/// Istio's `isDNSTypeServiceEntry`.
pub(crate) fn is_dns(resolution: Resolution) -> bool {
    matches!(resolution, Resolution::DnsLb | Resolution::DnsRoundRobinLb)
}

/// The service ports of a ServiceEntry that fit in a port number; the rest are skipped with a warning.
pub(crate) fn valid_ports<'a>(origin: &str, se: &'a ServiceEntry) -> Vec<(&'a ServicePort, u16)> {
    se.ports
        .iter()
        .filter_map(|p| match u16::try_from(p.number) {
            Ok(n) if n > 0 => Some((p, n)),
            _ => {
                tracing::warn!(
                    origin,
                    port = p.number,
                    name = p.name,
                    "ServiceEntry port out of range: skipped"
                );
                None
            }
        })
        .collect()
}

/// Istio's `convertServices`: one `Service` per host, hostnames as written.
/// `ports` are the ServiceEntry's `valid_ports`; `origin` is `ServiceEntry/ns/name`.
pub(crate) fn convert_services(
    meta: &ConfigMeta,
    origin: &str,
    se: &ServiceEntry,
    ports: &[(&ServicePort, u16)],
    mesh: &MeshConfig,
) -> Vec<Service> {
    let ports: Vec<Port> = ports
        .iter()
        .map(|&(p, number)| Port {
            name: p.name.clone(),
            port: number,
            protocol: Protocol::from_port(Some(p.protocol.as_str()), None, &p.name),
        })
        .collect();
    let addresses = convert_addresses(origin, &se.addresses);
    let export_to = export_to(if se.export_to.is_empty() {
        &mesh.default_service_export_to
    } else {
        &se.export_to
    });
    let label_selectors = se
        .workload_selector
        .as_ref()
        .map(|s| s.match_labels.clone())
        .unwrap_or_default();
    se.hosts
        .iter()
        .map(|host| Service {
            cluster_vips: Default::default(),
            hostname: host.clone(),
            ports: ports.clone(),
            addresses: addresses.clone(),
            resolution: resolution(se.resolution.as_deref()),
            mesh_external: se.location.as_deref() != Some("MESH_INTERNAL"),
            attributes: ServiceAttributes {
                service_registry: SERVICE_REGISTRY_EXTERNAL.to_owned(),
                name: host.clone(),
                namespace: meta.namespace.clone(),
                labels: meta.labels.clone(),
                export_to: export_to.clone(),
                label_selectors: label_selectors.clone(),
                cluster_id: String::new(),
                service_accounts: se.subject_alt_names.clone(),
                traffic_distribution: model::service::TrafficDistribution::of(
                    None,
                    meta.annotations
                        .get(model::service::TRAFFIC_DISTRIBUTION_ANNOTATION)
                        .map(String::as_str),
                ),
            },
            origin: origin.to_owned(),
        })
        .collect()
}

/// VIPs: IPs as written, CIDRs as written except a full-length prefix (`/32`, `/128`), which
/// becomes the bare IP; anything else is dropped.
fn convert_addresses(origin: &str, addresses: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(addresses.len());
    for a in addresses {
        if a.parse::<IpAddr>().is_ok() {
            out.push(a.clone());
        } else if let Ok(net) = a.parse::<ipnet::IpNet>() {
            if net.prefix_len() == net.max_prefix_len() {
                out.push(net.addr().to_string());
            } else {
                out.push(a.clone());
            }
        } else {
            tracing::warn!(
                origin,
                address = a,
                "ServiceEntry address is neither an IP nor a CIDR: skipped"
            );
        }
    }
    out
}

/// `exportTo` values, deduplicated in the order written (`.` is the owner's namespace).
fn export_to(values: &[String]) -> Vec<Visibility> {
    let mut out: Vec<Visibility> = Vec::with_capacity(values.len());
    for v in values {
        let v = Visibility::parse(v);
        if !out.contains(&v) {
            out.push(v);
        }
    }
    out
}

/// One workload as an endpoint source: a ServiceEntry's inline endpoint or a WorkloadEntry.
pub(crate) struct WorkloadRef<'a> {
    pub entry: &'a WorkloadEntry,
    /// Spec labels, overlaid with the WorkloadEntry's metadata labels (metadata wins, as Istio).
    pub labels: BTreeMap<String, String>,
    /// `WorkloadEntry/ns/name` or `ServiceEntry/ns/name`.
    pub origin: String,
}

/// Istio's `convertEndpoint`: the endpoint of `workload` for one service port, or `None` (with a
/// warning) when its address or port cannot be used.
pub(crate) fn convert_endpoint(
    service: &Service,
    port: &ServicePort,
    workload: &WorkloadRef<'_>,
    mesh: &MeshConfig,
) -> Option<Endpoint> {
    let wle = workload.entry;
    let kind = AddressKind::of(&wle.address);
    if kind == AddressKind::Invalid {
        tracing::warn!(
            origin = workload.origin,
            address = wle.address,
            "endpoint address is not an IP, hostname or unix socket: skipped"
        );
        return None;
    }
    // priority: unix socket > workload port by name > targetPort > service port number
    let endpoint_port = if kind == AddressKind::Unix {
        0
    } else {
        let raw = match wle.ports.get(&port.name) {
            Some(p) if *p > 0 => *p,
            _ if port.target_port > 0 => port.target_port,
            _ => port.number,
        };
        match u16::try_from(raw) {
            Ok(p) => p,
            Err(_) => {
                tracing::warn!(
                    origin = workload.origin,
                    port = raw,
                    "endpoint port out of range: skipped"
                );
                return None;
            }
        }
    };
    let namespace = service.namespace();
    let service_account = if wle.service_account.is_empty() {
        String::new()
    } else {
        format!(
            "spiffe://{}/ns/{}/sa/{}",
            mesh.trust_domain, namespace, wle.service_account
        )
    };
    let locality = match (wle.locality.is_empty(), workload.labels.get(LOCALITY_LABEL)) {
        (true, Some(l)) if !l.is_empty() => l.replace('.', "/"),
        _ => wle.locality.clone(),
    };
    Some(Endpoint {
        cluster_id: Default::default(),
        address: wle.address.clone(),
        endpoint_port,
        service_port_name: port.name.clone(),
        labels: augment_labels(&workload.labels, &locality, &wle.network),
        locality: Locality::parse(&locality),
        weight: wle.weight,
        service_account,
        network: wle.network.clone(),
        namespace: namespace.to_owned(),
        origin: workload.origin.clone(),
    })
}

/// Istio's `AugmentLabels`: adds the topology labels of the locality and network.
pub fn augment_labels(labels: &BTreeMap<String, String>, locality: &str, network: &str) -> BTreeMap<String, String> {
    let mut out = labels.clone();
    let mut parts = locality.split('/');
    for key in [TOPOLOGY_REGION, TOPOLOGY_ZONE, TOPOLOGY_SUBZONE] {
        match parts.next() {
            Some(v) if !v.is_empty() => {
                out.insert(key.to_owned(), v.to_owned());
            }
            _ => {}
        }
    }
    if !network.is_empty() && out.get(TOPOLOGY_NETWORK).is_none_or(|v| v.is_empty()) {
        out.insert(TOPOLOGY_NETWORK.to_owned(), network.to_owned());
    }
    out
}

/// For a DNS ServiceEntry with neither endpoints nor a workloadSelector: the host itself is the
/// endpoint, on the target port if set, else the service port.
pub(crate) fn host_endpoint(service: &Service, port: &ServicePort, number: u16) -> Option<Endpoint> {
    if AddressKind::of(&service.hostname) != AddressKind::Hostname {
        tracing::warn!(
            origin = service.origin,
            host = service.hostname,
            "DNS ServiceEntry host is not a resolvable name: no endpoint"
        );
        return None;
    }
    let endpoint_port = match port.target_port {
        0 => number,
        t => u16::try_from(t).ok()?,
    };
    Some(Endpoint {
        cluster_id: Default::default(),
        address: service.hostname.clone(),
        endpoint_port,
        service_port_name: port.name.clone(),
        labels: BTreeMap::new(),
        locality: Locality::default(),
        weight: 0,
        service_account: String::new(),
        network: String::new(),
        namespace: service.namespace().to_owned(),
        origin: service.origin.clone(),
    })
}

/// Whether `service` is visible from `namespace` (its `exportTo`, resolved against its own namespace).
pub fn visible_from(service: &Service, namespace: &str) -> bool {
    is_visible(&service.attributes.export_to, service.namespace(), namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_kinds() {
        assert_eq!(AddressKind::of("10.0.0.1"), AddressKind::Ip);
        assert_eq!(AddressKind::of("2001:db8::1"), AddressKind::Ip);
        assert_eq!(AddressKind::of("api.example.com"), AddressKind::Hostname);
        assert_eq!(AddressKind::of("vm-1"), AddressKind::Hostname);
        assert_eq!(AddressKind::of("unix:///var/run/app.sock"), AddressKind::Unix);
        assert_eq!(AddressKind::of("unix://@abstract"), AddressKind::Unix);
        assert_eq!(AddressKind::of("unix://relative"), AddressKind::Invalid);
        assert_eq!(AddressKind::of("*.example.com"), AddressKind::Invalid);
        assert_eq!(AddressKind::of("bad host"), AddressKind::Invalid);
        assert_eq!(AddressKind::of(""), AddressKind::Invalid);
        assert_eq!(AddressKind::of("-lead.example.com"), AddressKind::Invalid);
    }

    #[test]
    fn resolutions() {
        assert_eq!(resolution(None), Resolution::Passthrough);
        assert_eq!(resolution(Some("NONE")), Resolution::Passthrough);
        assert_eq!(resolution(Some("STATIC")), Resolution::ClientSideLb);
        assert_eq!(resolution(Some("DNS")), Resolution::DnsLb);
        assert_eq!(resolution(Some("DNS_ROUND_ROBIN")), Resolution::DnsRoundRobinLb);
    }

    #[test]
    fn addresses_keep_cidrs_and_strip_full_prefixes() {
        let got = convert_addresses(
            "t",
            &[
                "10.1.0.0/16".into(),
                "10.2.0.7/32".into(),
                "2001:db8::/64".into(),
                "192.168.1.1".into(),
                "nope".into(),
            ],
        );
        assert_eq!(got, vec!["10.1.0.0/16", "10.2.0.7", "2001:db8::/64", "192.168.1.1"]);
    }

    #[test]
    fn export_to_dedups_in_written_order() {
        let got = export_to(&["b".into(), ".".into(), "b".into()]);
        assert_eq!(got, vec![Visibility::Namespace("b".into()), Visibility::Private]);
    }

    #[test]
    fn augment_adds_topology_but_keeps_explicit_network_label() {
        let mut labels = BTreeMap::new();
        labels.insert(TOPOLOGY_NETWORK.to_owned(), "from-label".to_owned());
        let out = augment_labels(&labels, "us-east/zone-a", "net-1");
        assert_eq!(out[TOPOLOGY_REGION], "us-east");
        assert_eq!(out[TOPOLOGY_ZONE], "zone-a");
        assert!(!out.contains_key(TOPOLOGY_SUBZONE));
        assert_eq!(out[TOPOLOGY_NETWORK], "from-label");
        let out = augment_labels(&BTreeMap::new(), "", "net-1");
        assert_eq!(out.len(), 1);
        assert_eq!(out[TOPOLOGY_NETWORK], "net-1");
    }
}
