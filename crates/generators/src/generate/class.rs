//! Proxy classes: for each xDS type, everything the generated resources read from a proxy, so that
//! proxies with equal keys share one encoded copy per push. A field missing here is a correctness
//! bug (a proxy would get another's config); `class_tests` checks each field, and
//! `class_guard_tests` fails when a generator starts reading a proxy field that no key covers.
//!
//! Labels are keyed only on the keys some config of the push can match: DestinationRule workload
//! selectors and `failoverPriority` labels, VirtualService `sourceLabels`. Sidecar selection is
//! keyed by its outcome (the `Sidecar` in effect), gateway selection by the full labels (routers).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use model::networking::{DestinationRule, LoadBalancerSettings, VirtualService};
use model::proxy_headers::ProxyHeaders;
use model::{ConfigKey, ConfigSpec, NodeType, Protocol, Proxy};
use push_index::PushContext;

/// Node metadata (`metadata.raw`) keys that listeners read: `UNPRIVILEGED_POD` (gateways skip
/// ports below 1024), `HTTP10` (HTTP/1.0 on HCMs),
/// `IDLE_TIMEOUT` (HCM and tcp_proxy idle timeouts), `WORKLOAD_IDENTITY_SOCKET_FILE` (mTLS chains
/// only with a workload identity), `DNS_CAPTURE` and `DNS_AUTO_ALLOCATE` (listeners on the VIPs
/// allocated to ServiceEntries without addresses).
const LDS_METADATA_KEYS: &[&str] = &[
    "UNPRIVILEGED_POD",
    "HTTP10",
    "IDLE_TIMEOUT",
    "WORKLOAD_IDENTITY_SOCKET_FILE",
    "DNS_CAPTURE",
    "DNS_AUTO_ALLOCATE",
];

/// Label keys that the configs of one push can read from a proxy's labels, collected once per
/// push (`PushCache`).
#[derive(Debug, Default, PartialEq)]
pub(super) struct LabelKeys {
    /// DestinationRule `workloadSelector` keys and `failoverPriority` labels (mesh config too).
    destination_rules: BTreeSet<String>,
    /// VirtualService `sourceLabels` keys of http, tls and tcp matches.
    virtual_services: BTreeSet<String>,
    /// Whether some `failoverPriority` is set: it leaves proxies without any label alone.
    failover_priority: bool,
    /// Workload selector keys of PeerAuthentication, AuthorizationPolicy and
    /// RequestAuthentication (listeners: inbound mTLS and authorization filters).
    policies: BTreeSet<String>,
}

impl LabelKeys {
    pub(super) fn collect(push: &PushContext) -> LabelKeys {
        let mut keys = LabelKeys::default();
        if let Some(setting) = &push.mesh().locality_lb_setting {
            keys.add_failover_priority(&setting.failover_priority);
        }
        if let Some(setting) = &push.mesh().zone_aware_lb_setting {
            keys.add_failover_priority(&setting.failover_priority);
        }
        // a service's traffic distribution ranks endpoints by the proxy's topology labels
        let distributed = push
            .registry()
            .services
            .iter()
            .any(|s| s.attributes.traffic_distribution != model::service::TrafficDistribution::Any);
        if distributed {
            keys.add_failover_priority(&crate::eds::locality::TRAFFIC_DISTRIBUTION_LABELS.map(String::from));
        }
        for config in push.configs() {
            match &config.spec {
                ConfigSpec::DestinationRule(dr) => keys.add_destination_rule(dr),
                ConfigSpec::VirtualService(vs) => keys.add_virtual_service(vs),
                ConfigSpec::PeerAuthentication(pa) => keys.add_policy_selector(pa.selector.as_ref()),
                ConfigSpec::AuthorizationPolicy(ap) => keys.add_policy_selector(ap.selector.as_ref()),
                ConfigSpec::RequestAuthentication(ra) => keys.add_policy_selector(ra.selector.as_ref()),
                _ => {}
            }
        }
        keys
    }

    fn add_destination_rule(&mut self, dr: &DestinationRule) {
        if let Some(selector) = &dr.workload_selector {
            self.destination_rules.extend(selector.match_labels.keys().cloned());
        }
        let policies = dr
            .traffic_policy
            .iter()
            .chain(dr.subsets.iter().filter_map(|s| s.traffic_policy.as_ref()));
        for policy in policies {
            let port_level = policy.port_level_settings.iter().map(|p| p.load_balancer.as_ref());
            for lb in std::iter::once(policy.load_balancer.as_ref())
                .chain(port_level)
                .flatten()
            {
                self.add_load_balancer(lb);
            }
        }
    }

    fn add_load_balancer(&mut self, lb: &LoadBalancerSettings) {
        if let Some(setting) = &lb.locality_lb_setting {
            self.add_failover_priority(&setting.failover_priority);
        }
        if let Some(setting) = &lb.zone_aware_lb_setting {
            self.add_failover_priority(&setting.failover_priority);
        }
    }

    fn add_failover_priority(&mut self, failover_priority: &[String]) {
        for label in failover_priority {
            self.failover_priority = true;
            // `label=value` compares endpoints with the value, but keep the key anyway
            let key = label.split_once('=').map_or(label.as_str(), |(k, _)| k);
            self.destination_rules.insert(key.to_owned());
        }
    }

    fn add_policy_selector(&mut self, selector: Option<&model::networking::WorkloadSelector>) {
        if let Some(s) = selector {
            self.policies.extend(s.match_labels.keys().cloned());
        }
    }

    fn add_virtual_service(&mut self, vs: &VirtualService) {
        let http = vs.http.iter().flat_map(|r| &r.match_).map(|m| &m.source_labels);
        let tls = vs.tls.iter().flat_map(|r| &r.match_).map(|m| &m.source_labels);
        let tcp = vs.tcp.iter().flat_map(|r| &r.match_).map(|m| &m.source_labels);
        for labels in http.chain(tls).chain(tcp) {
            self.virtual_services.extend(labels.keys().cloned());
        }
    }
}

/// Which labels a type can read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LabelUse {
    /// Through DestinationRules only (clusters, endpoints).
    DestinationRules,
    /// Also through VirtualService matches; routers also select gateways by any label.
    Routes,
    /// As routes, and through the selectors of security policies.
    Listeners,
}

/// What every type depends on: the proxy's type, its namespace (visibility of services,
/// VirtualServices, DestinationRules; `sourceNamespace` matches), its cluster (a service's VIPs
/// in it, `ClusterVIPs`; the endpoints it sees), the Sidecar in effect (with the namespace it
/// decides the `SidecarScope`) and the labels that configs can match.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ProxyClass {
    node_type: NodeType,
    namespace: String,
    cluster_id: String,
    sidecar: Option<ConfigKey>,
    labels: BTreeMap<String, String>,
}

impl ProxyClass {
    fn new(push: &PushContext, proxy: &Proxy, keys: &LabelKeys, uses: LabelUse) -> ProxyClass {
        let routes = matches!(uses, LabelUse::Routes | LabelUse::Listeners);
        let labels = if routes && !proxy.is_sidecar() {
            proxy.labels.clone()
        } else {
            proxy
                .labels
                .iter()
                .filter(|(k, _)| {
                    keys.destination_rules.contains(*k)
                        || (routes && keys.virtual_services.contains(*k))
                        || (uses == LabelUse::Listeners && keys.policies.contains(*k))
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        };
        ProxyClass {
            node_type: proxy.node_type,
            namespace: proxy.config_namespace.clone(),
            cluster_id: proxy.cluster_id().to_owned(),
            sidecar: push.sidecar_scope(proxy).sidecar().cloned(),
            labels,
        }
    }
}

/// Clusters and endpoints: the class (labels through DestinationRules), whether the proxy has
/// labels at all when `failoverPriority` is used, and its locality (locality load balancing of
/// DNS clusters and endpoints).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct EndpointClass {
    class: ProxyClass,
    has_labels: Option<bool>,
    locality: String,
}

impl EndpointClass {
    pub(super) fn new(push: &PushContext, keys: &LabelKeys, proxy: &Proxy) -> EndpointClass {
        EndpointClass {
            class: ProxyClass::new(push, proxy, keys, LabelUse::DestinationRules),
            has_labels: keys.failover_priority.then_some(!proxy.labels.is_empty()),
            locality: proxy.locality.to_string(),
        }
    }
}

/// The proxy's IP family: IPv6-only proxies resolve AAAA records (DNS lookup family).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum IpFamily {
    V4,
    V6,
    Dual,
}

impl IpFamily {
    fn of(ips: &[IpAddr]) -> IpFamily {
        match (ips.iter().any(IpAddr::is_ipv4), ips.iter().any(IpAddr::is_ipv6)) {
            (_, false) => IpFamily::V4,
            (false, true) => IpFamily::V6,
            (true, true) => IpFamily::Dual,
        }
    }
}

/// A CDS response: the endpoint class, the IP family (DNS lookup family) and what the inbound
/// clusters are built from (ports, protocols, endpoints: a Sidecar ingress `defaultEndpoint` of
/// `0.0.0.0` is the proxy's own address).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct CdsKey {
    endpoints: EndpointClass,
    ip_family: IpFamily,
    inbound: Vec<crate::cds::inbound::InboundClusterSpec>,
    /// `proxyHeaders.preserveHttp1HeaderCase` (upstream HTTP/1 options).
    preserve_header_case: bool,
    /// Auto mTLS needs a workload identity.
    workload_identity: bool,
    /// Routers: the gateways selecting them (an AUTO_PASSTHROUGH server adds clusters).
    gateways: Option<GatewayClass>,
}

impl CdsKey {
    pub(super) fn new(push: &PushContext, keys: &LabelKeys, proxy: &Proxy) -> CdsKey {
        CdsKey {
            endpoints: EndpointClass::new(push, keys, proxy),
            ip_family: IpFamily::of(&proxy.ip_addresses),
            inbound: crate::cds::inbound::inbound_cluster_specs(proxy, push),
            preserve_header_case: crate::cds::preserve_header_case(proxy, push),
            workload_identity: proxy.has_workload_identity(),
            gateways: GatewayClass::of(push, proxy),
        }
    }
}

/// What a router's gateway config depends on besides its labels: the Gateways selecting it and
/// the ports of its Services (a server's port is translated to the Service's target port).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct GatewayClass {
    gateways: Vec<ConfigKey>,
    targets: Vec<crate::lds::merged_gateway::GatewayTarget>,
}

impl GatewayClass {
    fn of(push: &PushContext, proxy: &Proxy) -> Option<GatewayClass> {
        proxy.is_router().then(|| GatewayClass {
            gateways: push.gateways_for_proxy(proxy).iter().map(|c| c.key()).collect(),
            targets: crate::route::push::gateway_targets(push, proxy),
        })
    }
}

/// One route configuration: its name, the class (labels through VirtualService matches and
/// DestinationRules; all labels for routers, whose gateways select them) and the DNS domain
/// (the short host names of `generateVirtualHostDomains`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct RdsKey {
    class: ProxyClass,
    dns_domain: String,
    route_name: String,
    /// The `proxyHeaders` in effect (attempt count, `x-forwarded-host`).
    proxy_headers: Option<ProxyHeaders>,
    /// Routers: which servers a route name serves depends on their Services' ports.
    gateways: Option<GatewayClass>,
}

impl RdsKey {
    /// The key of each of `names`, in order.
    pub(super) fn for_names(push: &PushContext, keys: &LabelKeys, proxy: &Proxy, names: &[String]) -> Vec<RdsKey> {
        let class = ProxyClass::new(push, proxy, keys, LabelUse::Routes);
        let proxy_headers = proxy.proxy_headers_config(push.mesh()).cloned();
        let gateways = GatewayClass::of(push, proxy);
        names
            .iter()
            .map(|n| RdsKey {
                class: class.clone(),
                dns_domain: proxy.dns_domain.clone(),
                route_name: n.clone(),
                proxy_headers: proxy_headers.clone(),
                gateways: gateways.clone(),
            })
            .collect()
    }
}

/// One service instance as listeners see it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct InstanceKey {
    hostname: String,
    namespace: String,
    port: u16,
    port_name: String,
    protocol: Protocol,
    target_port: u16,
}

/// An LDS response: the class (as routes), the node metadata that listeners read, the service
/// instances (virtualInbound chains) and the address of Sidecar ingress listeners that bind a port
/// without `bind` (the proxy's own IP, only when there is such a listener).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct LdsKey {
    class: ProxyClass,
    metadata: Vec<Option<String>>,
    /// The `proxyHeaders` in effect (the connection managers' header settings).
    proxy_headers: Option<ProxyHeaders>,
    instances: Vec<InstanceKey>,
    ingress_bind: Option<IpAddr>,
    /// Which allocated VIPs (IPv4, IPv6) a proxy that captures DNS listens on.
    ip_family: IpFamily,
    /// Routers: their Services' ports (listener ports of the gateway servers).
    gateways: Option<GatewayClass>,
    /// What the HCMs' tracing tags read when the mesh traces: the canonical service and
    /// revision labels, the mesh and cluster IDs (the namespace is the class's).
    trace_tags: Option<[Option<String>; 4]>,
}

impl LdsKey {
    pub(super) fn new(push: &PushContext, keys: &LabelKeys, proxy: &Proxy) -> LdsKey {
        let instances = if proxy.is_router() {
            Vec::new()
        } else {
            push.service_instances(proxy)
                .into_iter()
                .map(|i| InstanceKey {
                    hostname: i.service.hostname.clone(),
                    namespace: i.service.namespace().to_owned(),
                    port: i.service_port.port,
                    port_name: i.service_port.name,
                    protocol: i.service_port.protocol,
                    target_port: i.target_port,
                })
                .collect()
        };
        LdsKey {
            class: ProxyClass::new(push, proxy, keys, LabelUse::Listeners),
            metadata: LDS_METADATA_KEYS
                .iter()
                .map(|k| proxy.metadata.raw.get(*k).map(ToString::to_string))
                .collect(),
            proxy_headers: proxy.proxy_headers_config(push.mesh()).cloned(),
            instances,
            ingress_bind: crate::lds::sidecar_inbound::ingress_default_bind(proxy, &push.sidecar_scope(proxy)),
            ip_family: IpFamily::of(&proxy.ip_addresses),
            gateways: GatewayClass::of(push, proxy),
            trace_tags: push.mesh().enable_tracing.then(|| {
                [
                    proxy.labels.get(crate::tracing_config::CANONICAL_NAME_LABEL).cloned(),
                    proxy
                        .labels
                        .get(crate::tracing_config::CANONICAL_REVISION_LABEL)
                        .cloned(),
                    proxy.metadata.mesh_id.clone(),
                    proxy.metadata.cluster_id.clone(),
                ]
            }),
        }
    }
}

#[cfg(test)]
#[path = "class_tests.rs"]
mod class_tests;

#[cfg(test)]
#[path = "class_guard_tests.rs"]
mod class_guard_tests;
