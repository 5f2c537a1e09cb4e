//! Kubernetes objects to services and endpoints, as Istio's `serviceregistry/kube/conversion.go`
//! and the EndpointSlice controller: one service per Service, endpoints from its EndpointSlices
//! with the labels, service account and locality of their Pods and Nodes.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, Pod, Service as KubeService, ServicePort};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use model::networking::WorkloadEntry;
use model::service::{ServiceAttributes, TrafficDistribution, Visibility};
use model::{Config, ConfigKind, ConfigMeta, ConfigSpec, Endpoint, Locality, Port, Protocol, Resolution, Service};
use registry::SERVICE_REGISTRY_KUBERNETES;
use registry::{LOCALITY_LABEL, TOPOLOGY_REGION, TOPOLOGY_SUBZONE, TOPOLOGY_ZONE, augment_labels};
/// The annotation that exports a Service (`networking.istio.io/exportTo: ".,istio-system"`).
pub(crate) const EXPORT_TO_ANNOTATION: &str = "networking.istio.io/exportTo";
/// The label Istio puts on a workload for its cluster (`AugmentLabels`).
pub(crate) const CLUSTER_LABEL: &str = "topology.istio.io/cluster";
/// The label an EndpointSlice names its Service by.
pub(crate) const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What the conversion needs besides the objects.
#[derive(Debug, Clone)]
pub struct Context {
    /// `--domain` (`cluster.local`): hostnames are `<name>.<namespace>.svc.<domain>`.
    pub domain: String,
    pub trust_domain: String,
    pub cluster_id: String,
    /// pilot-discovery's namespace (`POD_NAMESPACE`), the cluster's system namespace: its
    /// `topology.istio.io/network` label is the network of the cluster's Pods.
    pub system_namespace: String,
    /// meshConfig `discoverySelectors`: only namespaces matching one are served (all when empty).
    pub discovery_selectors: Vec<model::mesh::LabelSelector>,
}

/// Istio's `kube.ConvertProtocol`: UDP, then appProtocol, then the port name's prefix.
pub(crate) fn convert_protocol(port: &ServicePort) -> Protocol {
    if port.protocol.as_deref() == Some("UDP") {
        return Protocol::Udp;
    }
    if let Some(app) = port.app_protocol.as_deref() {
        let p = match app {
            "kubernetes.io/h2c" => Protocol::Http2,
            "kubernetes.io/ws" => Protocol::Http,
            "kubernetes.io/wss" => Protocol::Https,
            other => Protocol::parse(other),
        };
        if p != Protocol::Unsupported {
            return p;
        }
    }
    let name = port.name.as_deref().unwrap_or("");
    if name.starts_with("grpc-web") {
        return Protocol::GrpcWeb;
    }
    Protocol::parse(name.split('-').next().unwrap_or(""))
}

/// Whether `address` is an IP address (of the EndpointSlice `addressType` `family`, when given).
pub fn is_ip(address: &str, family: Option<&str>) -> bool {
    match address.parse::<IpAddr>() {
        Ok(IpAddr::V4(_)) => family != Some("IPv6"),
        Ok(IpAddr::V6(_)) => family != Some("IPv4"),
        Err(_) => false,
    }
}

/// A Service port's number, when it is one (1-65535; a missing `port` reads as 0).
fn port_number(p: &ServicePort) -> Option<u16> {
    u16::try_from(p.port).ok().filter(|n| *n != 0)
}

/// What [`convert_service`] drops of `svc`: cluster IPs that are not IPs, ports without a valid
/// number (the API server refuses both; a Service from elsewhere may have them).
pub(crate) fn service_defects(svc: &KubeService) -> Vec<crate::problems::Defect> {
    let Some(spec) = svc.spec.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let ips = spec.cluster_ip.iter().chain(spec.cluster_ips.iter().flatten());
    let mut bad: Vec<&String> = ips
        .filter(|ip| !ip.is_empty() && *ip != "None" && !is_ip(ip, None))
        .collect();
    bad.dedup();
    for ip in bad {
        out.push(("invalid_ip", format!("cluster IP {ip:?} is not an IP address: dropped")));
    }
    for p in spec.ports.iter().flatten().filter(|p| port_number(p).is_none()) {
        out.push((
            "invalid_port",
            format!(
                "port {:?} has no valid port number ({}; 1-65535 wanted, a missing `port` reads as 0): the port is ignored",
                p.name.as_deref().unwrap_or(""),
                p.port
            ),
        ));
    }
    out
}

/// What [`convert_endpoints`] drops of `slice`: endpoint addresses that are not IPs of the
/// slice's `addressType`.
pub(crate) fn slice_defects(slice: &EndpointSlice) -> Vec<crate::problems::Defect> {
    let family = slice.address_type.as_str();
    if !matches!(family, "IPv4" | "IPv6") {
        return Vec::new();
    }
    slice
        .endpoints
        .iter()
        .flat_map(|ep| &ep.addresses)
        .filter(|a| !is_ip(a, Some(family)))
        .map(|a| {
            (
                "invalid_ip",
                format!("endpoint address {a:?} is not an {family} address: dropped"),
            )
        })
        .collect()
}

/// Istio's `ConvertService`.
pub(crate) fn convert_service(svc: &KubeService, ctx: &Context) -> Option<Service> {
    let name = svc.metadata.name.as_deref()?;
    let namespace = svc.metadata.namespace.as_deref().unwrap_or("default");
    let spec = svc.spec.as_ref()?;
    let external_name = (spec.type_.as_deref() == Some("ExternalName"))
        .then(|| spec.external_name.clone().unwrap_or_default())
        .filter(|n| !n.is_empty());
    let cluster_ip = spec.cluster_ip.as_deref().unwrap_or("");
    let (addresses, resolution) = if external_name.is_some() {
        (Vec::new(), Resolution::DnsLb)
    } else if cluster_ip == "None" {
        (Vec::new(), Resolution::Passthrough)
    } else if cluster_ip.is_empty() {
        (Vec::new(), Resolution::ClientSideLb)
    } else {
        let mut ips = spec.cluster_ips.clone().unwrap_or_default();
        if !ips.iter().any(|ip| ip == cluster_ip) {
            ips.insert(0, cluster_ip.to_owned());
        }
        // not IPs: dropped (see `service_defects`)
        ips.retain(|ip| is_ip(ip, None));
        (ips, Resolution::ClientSideLb)
    };
    let ports = spec
        .ports
        .iter()
        .flatten()
        .filter_map(|p| {
            Some(Port {
                name: p.name.clone().unwrap_or_default(),
                // without a valid number: ignored (see `service_defects`)
                port: port_number(p)?,
                protocol: convert_protocol(p),
            })
        })
        .collect();
    let annotations = svc.metadata.annotations.as_ref();
    let export_to = annotations
        .and_then(|a| a.get(EXPORT_TO_ANNOTATION))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(Visibility::parse)
                .collect()
        })
        .unwrap_or_default();
    let cluster_vips = if addresses.is_empty() {
        BTreeMap::new()
    } else {
        BTreeMap::from([(ctx.cluster_id.clone(), addresses.clone())])
    };
    Some(Service {
        cluster_vips,
        hostname: format!("{name}.{namespace}.svc.{}", ctx.domain),
        ports,
        addresses,
        resolution,
        mesh_external: external_name.is_some(),
        attributes: ServiceAttributes {
            service_registry: SERVICE_REGISTRY_KUBERNETES.to_owned(),
            name: name.to_owned(),
            namespace: namespace.to_owned(),
            labels: svc.metadata.labels.clone().unwrap_or_default(),
            export_to,
            label_selectors: spec.selector.clone().unwrap_or_default(),
            cluster_id: ctx.cluster_id.clone(),
            service_accounts: Vec::new(),
            traffic_distribution: TrafficDistribution::of(
                spec.traffic_distribution.as_deref(),
                annotations
                    .and_then(|a| a.get(model::service::TRAFFIC_DISTRIBUTION_ANNOTATION))
                    .map(String::as_str),
            ),
        },
        origin: format!("Service/{namespace}/{name} ({})", ctx.cluster_id),
    })
}

/// Where a Pod runs and who it is, for its endpoints.
pub struct PodInfo<'a> {
    pub pod: &'a Pod,
    pub node: Option<&'a Node>,
}

/// A Pod's locality: its `istio-locality` label, else its Node's topology labels.
pub fn locality(pod: Option<&Pod>, node: Option<&Node>) -> String {
    if let Some(l) = pod
        .and_then(|p| p.metadata.labels.as_ref())
        .and_then(|l| l.get(LOCALITY_LABEL))
        .filter(|l| !l.is_empty())
    {
        return l.replace('.', "/");
    }
    let labels = node.and_then(|n| n.metadata.labels.as_ref());
    let get = |k: &str| labels.and_then(|l| l.get(k)).cloned().unwrap_or_default();
    let (region, zone, subzone) = (get(TOPOLOGY_REGION), get(TOPOLOGY_ZONE), get(TOPOLOGY_SUBZONE));
    if region.is_empty() && zone.is_empty() && subzone.is_empty() {
        return String::new();
    }
    format!("{region}/{zone}/{subzone}")
}

/// The endpoints of `svc` from its EndpointSlices: ready addresses (or all of them when the
/// Service publishes not-ready addresses), per service port the slice serves (matched by port
/// name), with the Pod's labels, service account and locality.
pub(crate) fn convert_endpoints<'a>(
    svc: &Service,
    publish_not_ready: bool,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
    pod: impl Fn(&str) -> Option<PodInfo<'a>>,
    (ctx, cluster_network): (&Context, &str),
) -> Vec<Endpoint> {
    let mut out = Vec::new();
    for slice in slices {
        if !matches!(slice.address_type.as_str(), "IPv4" | "IPv6") {
            continue;
        }
        let slice_name = slice.metadata.name.as_deref().unwrap_or("");
        for ep in &slice.endpoints {
            let conditions = ep.conditions.as_ref();
            let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
            let terminating = conditions.and_then(|c| c.terminating).unwrap_or(false);
            if !(ready && !terminating || publish_not_ready) {
                continue;
            }
            let pod_name = ep
                .target_ref
                .as_ref()
                .filter(|r| r.kind.as_deref() == Some("Pod"))
                .and_then(|r| r.name.as_deref());
            let info = pod_name.and_then(&pod);
            let pod_labels = info
                .as_ref()
                .and_then(|i| i.pod.metadata.labels.clone())
                .unwrap_or_default();
            let sa = info
                .as_ref()
                .and_then(|i| i.pod.spec.as_ref())
                .map(|s| s.service_account_name.clone().unwrap_or_else(|| "default".into()));
            let loc = locality(info.as_ref().map(|i| i.pod), info.as_ref().and_then(|i| i.node));
            // Istio's `AugmentLabels`: the locality's and the cluster's topology labels (a
            // DestinationRule subset or failover priority may select them)
            let mut labels = augment_labels(&pod_labels, &loc, "");
            labels.insert(CLUSTER_LABEL.to_owned(), ctx.cluster_id.clone());
            for slice_port in slice.ports.iter().flatten() {
                let Some(sp) = svc
                    .ports
                    .iter()
                    .find(|p| p.name == slice_port.name.as_deref().unwrap_or(""))
                else {
                    continue;
                };
                let Some(port) = slice_port.port.and_then(|p| u16::try_from(p).ok()) else {
                    continue;
                };
                // not IPs of the slice's family: dropped (see `slice_defects`)
                for address in ep.addresses.iter().filter(|a| is_ip(a, Some(&slice.address_type))) {
                    out.push(Endpoint {
                        cluster_id: ctx.cluster_id.clone(),
                        address: address.clone(),
                        endpoint_port: port,
                        service_port_name: sp.name.clone(),
                        labels: labels.clone(),
                        locality: Locality::parse(&loc),
                        weight: 0,
                        service_account: sa
                            .as_ref()
                            .map(|sa| format!("spiffe://{}/ns/{}/sa/{sa}", ctx.trust_domain, svc.namespace()))
                            .unwrap_or_default(),
                        // Istio's `Network`: the Pod's `topology.istio.io/network` label, else
                        // the system namespace's (else meshNetworks, read at push time)
                        network: labels
                            .get(registry::TOPOLOGY_NETWORK)
                            .map_or(cluster_network, String::as_str)
                            .to_owned(),
                        namespace: svc.namespace().to_owned(),
                        origin: format!("EndpointSlice/{}/{slice_name}", svc.namespace()),
                    });
                }
            }
        }
    }
    out.sort_by(|a, b| {
        (&a.service_port_name, &a.address, a.endpoint_port).cmp(&(&b.service_port_name, &b.address, b.endpoint_port))
    });
    out.dedup_by(|a, b| {
        a.service_port_name == b.service_port_name && a.address == b.address && a.endpoint_port == b.endpoint_port
    });
    out
}

/// The endpoint of an ExternalName Service: its external name, on each service port.
pub(crate) fn external_name_endpoints(svc: &Service, external_name: &str) -> Vec<Endpoint> {
    svc.ports
        .iter()
        .map(|p| Endpoint {
            cluster_id: svc.attributes.cluster_id.clone(),
            address: external_name.to_owned(),
            endpoint_port: p.port,
            service_port_name: p.name.clone(),
            labels: BTreeMap::new(),
            locality: Locality::default(),
            weight: 0,
            service_account: String::new(),
            network: String::new(),
            namespace: svc.namespace().to_owned(),
            origin: svc.origin.clone(),
        })
        .collect()
}

/// A Pod as the workload a ServiceEntry's `workloadSelector` selects, as Istio's Pod
/// `WorkloadInstance` (pod.go `notifyWorkloadHandlers`): only a Pod that belongs in endpoints
/// (not terminal, not terminating, with an IP) and is ready. Shaped as the WorkloadEntry the
/// ServiceEntry registry selects: its IP, labels, service account, locality, and its named TCP
/// container ports (Istio's `getPortMap`: the first of a name wins; native sidecar init
/// containers too), which a ServiceEntry port of the same name targets.
pub(crate) fn workload_instance(pod: &Pod, node: Option<&Node>) -> Option<Config> {
    let status = pod.status.as_ref()?;
    if matches!(status.phase.as_deref(), Some("Failed" | "Succeeded")) || pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let ip = status
        .pod_ip
        .clone()
        .filter(|ip| !ip.is_empty())
        .or_else(|| status.pod_ips.iter().flatten().map(|i| i.ip.clone()).next())?;
    if !ready {
        return None;
    }
    let spec = pod.spec.as_ref();
    let mut ports = BTreeMap::new();
    let containers = spec.map(|s| s.containers.iter()).into_iter().flatten();
    let sidecars = spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.restart_policy.as_deref() == Some("Always"));
    for port in containers.chain(sidecars).flat_map(|c| c.ports.iter().flatten()) {
        let Some(name) = port.name.as_ref().filter(|n| !n.is_empty()) else {
            continue;
        };
        if port.protocol.as_deref().unwrap_or("TCP") != "TCP" {
            continue;
        }
        if let Ok(number) = u32::try_from(port.container_port) {
            ports.entry(name.clone()).or_insert(number);
        }
    }
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let entry = WorkloadEntry {
        address: ip,
        ports,
        labels: labels.clone(),
        network: String::new(),
        locality: locality(Some(pod), node),
        weight: 0,
        service_account: spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_else(|| "default".into()),
    };
    Some(Config {
        kind: ConfigKind::Pod,
        meta: ConfigMeta {
            name: pod.metadata.name.clone()?,
            namespace: pod.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            labels,
            ..Default::default()
        },
        spec: ConfigSpec::WorkloadEntry(entry),
    })
}
