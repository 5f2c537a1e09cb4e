//! Services and endpoints of the service registry, as Istio's `model.Service` and
//! `model.IstioEndpoint`. Registries (ServiceEntry, Kubernetes) produce them; generators read them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

/// Protocol of a service port, as Istio's `protocol.Instance`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Protocol {
    Http,
    Http2,
    Https,
    Grpc,
    GrpcWeb,
    Tcp,
    Tls,
    Mongo,
    Redis,
    Mysql,
    Udp,
    /// Not declared: sniffed by Envoy.
    Unsupported,
}

impl Protocol {
    /// Parses Istio's protocol names, case-insensitively (`HTTP`, `http2`, `gRPC`, ...).
    pub fn parse(s: &str) -> Protocol {
        match s.to_ascii_lowercase().as_str() {
            "http" => Protocol::Http,
            "http2" => Protocol::Http2,
            "https" => Protocol::Https,
            "grpc" => Protocol::Grpc,
            "grpc-web" => Protocol::GrpcWeb,
            "tcp" => Protocol::Tcp,
            "tls" => Protocol::Tls,
            "mongo" => Protocol::Mongo,
            "redis" => Protocol::Redis,
            "mysql" => Protocol::Mysql,
            "udp" => Protocol::Udp,
            _ => Protocol::Unsupported,
        }
    }

    /// The protocol of a port from Istio's rules: explicit protocol, else `appProtocol`,
    /// else the port name prefix (`http-web`, `grpc`, ...).
    pub fn from_port(protocol: Option<&str>, app_protocol: Option<&str>, name: &str) -> Protocol {
        if let Some(p) = protocol.map(Protocol::parse).filter(|p| *p != Protocol::Unsupported) {
            return p;
        }
        if let Some(p) = app_protocol
            .map(Protocol::parse)
            .filter(|p| *p != Protocol::Unsupported)
        {
            return p;
        }
        let prefix = name.split('-').next().unwrap_or("");
        Protocol::parse(prefix)
    }

    pub fn is_http(&self) -> bool {
        matches!(
            self,
            Protocol::Http | Protocol::Http2 | Protocol::Grpc | Protocol::GrpcWeb
        )
    }

    pub fn is_http2(&self) -> bool {
        matches!(self, Protocol::Http2 | Protocol::Grpc)
    }

    pub fn is_tcp(&self) -> bool {
        matches!(
            self,
            Protocol::Tcp | Protocol::Https | Protocol::Tls | Protocol::Mongo | Protocol::Redis | Protocol::Mysql
        )
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Protocol::Https | Protocol::Tls)
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Protocol::Http => "HTTP",
            Protocol::Http2 => "HTTP2",
            Protocol::Https => "HTTPS",
            Protocol::Grpc => "GRPC",
            Protocol::GrpcWeb => "GRPC-Web",
            Protocol::Tcp => "TCP",
            Protocol::Tls => "TLS",
            Protocol::Mongo => "Mongo",
            Protocol::Redis => "Redis",
            Protocol::Mysql => "MySQL",
            Protocol::Udp => "UDP",
            Protocol::Unsupported => "UnsupportedProtocol",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A service port.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Port {
    pub name: String,
    pub port: u16,
    pub protocol: Protocol,
}

/// How a service's endpoints are found, as ServiceEntry `resolution`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize)]
pub enum Resolution {
    /// Endpoints come from the registry (EDS); Istio's `ClientSideLB` (ServiceEntry STATIC).
    #[default]
    ClientSideLb,
    /// Envoy resolves the hostnames (STRICT_DNS).
    DnsLb,
    /// Envoy resolves and uses one address at a time (LOGICAL_DNS).
    DnsRoundRobinLb,
    /// Forward to the original destination (ServiceEntry NONE).
    Passthrough,
}

/// Namespace visibility (`exportTo`) of a service or config.
#[derive(Debug, Clone, PartialEq, Eq, Hash, serde::Serialize)]
pub enum Visibility {
    /// `*`: every namespace.
    Public,
    /// `.`: only the owner's namespace.
    Private,
    /// `~`: nowhere.
    None,
    /// A named namespace.
    Namespace(String),
}

impl Visibility {
    pub fn parse(s: &str) -> Visibility {
        match s {
            "*" => Visibility::Public,
            "." => Visibility::Private,
            "~" => Visibility::None,
            ns => Visibility::Namespace(ns.to_owned()),
        }
    }
}

/// Whether something exported by `exported` from `owner_ns` is visible to `client_ns`
/// (empty `exported` means the mesh default, everywhere).
pub fn is_visible(exported: &[Visibility], owner_ns: &str, client_ns: &str) -> bool {
    if exported.is_empty() {
        return true;
    }
    exported.iter().any(|v| match v {
        Visibility::Public => true,
        Visibility::Private => owner_ns == client_ns,
        Visibility::None => false,
        Visibility::Namespace(ns) => ns == client_ns,
    })
}

/// Attributes of a service that are not about routing.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ServiceAttributes {
    /// Which registry produced it: `External` (ServiceEntry) or `Kubernetes`.
    pub service_registry: String,
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub export_to: Vec<Visibility>,
    /// For ServiceEntries with a workloadSelector: the selector labels.
    pub label_selectors: BTreeMap<String, String>,
    /// The cluster a Kubernetes service was read from (`--clusterID`); empty for ServiceEntries.
    pub cluster_id: String,
    /// Kubernetes `spec.trafficDistribution` or the `networking.istio.io/traffic-distribution`
    /// annotation: same-zone or same-node endpoints first.
    pub traffic_distribution: TrafficDistribution,
    /// Identities the service's workloads may present besides their endpoints' service accounts:
    /// a ServiceEntry's `subjectAltNames` (Istio's `Service.ServiceAccounts`).
    pub service_accounts: Vec<String>,
}

/// Istio's `TrafficDistribution`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, serde::Serialize)]
pub enum TrafficDistribution {
    #[default]
    Any,
    /// `PreferSameZone` (or `PreferClose`): zone, then region, then network.
    PreferSameZone,
    /// `PreferSameNode`: node, subzone, zone, region, network.
    PreferSameNode,
}

/// Istio's annotation for a traffic distribution where the API has no field (ServiceEntries,
/// Kubernetes versions without `spec.trafficDistribution`).
pub const TRAFFIC_DISTRIBUTION_ANNOTATION: &str = "networking.istio.io/traffic-distribution";

impl TrafficDistribution {
    /// Istio's `GetTrafficDistribution`: the spec field, else the annotation (case-insensitive;
    /// an unknown annotation value is `Any`).
    pub fn of(spec: Option<&str>, annotation: Option<&str>) -> TrafficDistribution {
        match spec {
            Some("PreferSameZone" | "PreferClose") => return TrafficDistribution::PreferSameZone,
            Some("PreferSameNode") => return TrafficDistribution::PreferSameNode,
            _ => {}
        }
        match annotation.map(str::to_ascii_lowercase).as_deref() {
            Some("preferclose" | "prefersamezone") => TrafficDistribution::PreferSameZone,
            Some("prefersamenode") => TrafficDistribution::PreferSameNode,
            Some(other) if !other.is_empty() => {
                tracing::warn!(
                    value = other,
                    "unknown traffic distribution annotation, defaulting to any"
                );
                TrafficDistribution::Any
            }
            _ => TrafficDistribution::Any,
        }
    }
}

/// A service of the mesh, keyed by hostname.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Service {
    /// FQDN, possibly a wildcard (`*.example.com`).
    pub hostname: String,
    pub ports: Vec<Port>,
    /// VIPs (ServiceEntry addresses, the Kubernetes Service's cluster IPs in the first cluster
    /// that has it); empty for headless or external wildcard services.
    pub addresses: Vec<String>,
    /// Istio's `ClusterVIPs`: a Kubernetes service's cluster IPs per cluster ID, one entry per
    /// cluster that has the Service (the aggregate merges them); empty for ServiceEntries.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub cluster_vips: BTreeMap<String, Vec<String>>,
    pub resolution: Resolution,
    pub mesh_external: bool,
    pub attributes: ServiceAttributes,
    /// The config that created it (`ServiceEntry/ns/name`), for debugging.
    pub origin: String,
}

impl Service {
    pub fn port_by_number(&self, port: u16) -> Option<&Port> {
        self.ports.iter().find(|p| p.port == port)
    }

    pub fn port_by_name(&self, name: &str) -> Option<&Port> {
        self.ports.iter().find(|p| p.name == name)
    }

    pub fn namespace(&self) -> &str {
        &self.attributes.namespace
    }

    /// Istio's `GetAllAddressesForProxy` without auto-allocation: the VIPs the service has in the
    /// proxy's cluster, else its default addresses.
    pub fn addresses_for(&self, cluster_id: &str) -> &[String] {
        match self.cluster_vips.get(cluster_id) {
            Some(vips) if !vips.is_empty() => vips,
            _ => &self.addresses,
        }
    }
}

/// A service without a VIP whose clients reach the endpoints themselves (resolution NONE,
/// Kubernetes headless): its endpoints' addresses are its DNS answers.
pub fn is_headless(s: &Service) -> bool {
    s.resolution == Resolution::Passthrough && s.addresses.is_empty()
}

/// Locality of an endpoint: `region/zone/subzone`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct Locality {
    pub region: String,
    pub zone: String,
    pub subzone: String,
}

impl Locality {
    /// Parses Istio's `region/zone/subzone` form; missing parts are empty.
    pub fn parse(s: &str) -> Locality {
        let mut it = s.splitn(3, '/');
        Locality {
            region: it.next().unwrap_or("").to_owned(),
            zone: it.next().unwrap_or("").to_owned(),
            subzone: it.next().unwrap_or("").to_owned(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.region.is_empty() && self.zone.is_empty() && self.subzone.is_empty()
    }
}

impl fmt::Display for Locality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return Ok(());
        }
        write!(f, "{}/{}/{}", self.region, self.zone, self.subzone)
    }
}

/// One endpoint of one service port, as Istio's `IstioEndpoint`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Endpoint {
    /// IP address, or a hostname for DNS-resolved services.
    pub address: String,
    /// The port the workload listens on.
    pub endpoint_port: u16,
    /// The name of the service port this endpoint serves.
    pub service_port_name: String,
    pub labels: BTreeMap<String, String>,
    pub locality: Locality,
    /// Load-balancing weight; 0 means unset (Envoy's default of 1).
    pub weight: u32,
    pub service_account: String,
    pub network: String,
    /// The cluster it was read from (Istio's `Locality.ClusterID`): the Kubernetes registry's
    /// cluster ID; empty for ServiceEntry and WorkloadEntry endpoints.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub cluster_id: String,
    pub namespace: String,
    /// Where it came from (`WorkloadEntry/ns/name` or `ServiceEntry/ns/name`), for debugging.
    pub origin: String,
}

/// The label sidecar injection sets on Pods: `istio` when the workload takes Istio mTLS.
pub const TLS_MODE_LABEL: &str = "security.istio.io/tlsMode";

impl Endpoint {
    /// Its mTLS mode, as Istio's `IstioEndpoint.TLSMode`: the `security.istio.io/tlsMode` label
    /// (set on Pods by sidecar injection) if any; else, for Kubernetes endpoints, `disabled`
    /// (Istio's `PodTLSMode`), and for WorkloadEntries and ServiceEntry endpoints `istio` when they
    /// have a service account (`getTLSModeFromWorkloadEntry`).
    pub fn tls_mode(&self) -> &str {
        match self.labels.get(TLS_MODE_LABEL) {
            Some(mode) => mode,
            None if self.origin.starts_with("EndpointSlice/") || self.origin.starts_with("Pod/") => "disabled",
            None if !self.service_account.is_empty() => "istio",
            None => "disabled",
        }
    }
}

/// Shared, immutable list of endpoints for one (hostname, namespace) service.
pub type Endpoints = Arc<Vec<Endpoint>>;

/// Identifies a service of a registry: Istio keys services and their endpoints by hostname and
/// namespace, so one hostname may exist once per namespace.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub hostname: String,
    pub namespace: String,
}

impl ServiceKey {
    pub fn new(hostname: impl Into<String>, namespace: impl Into<String>) -> ServiceKey {
        ServiceKey {
            hostname: hostname.into(),
            namespace: namespace.into(),
        }
    }

    pub fn of(service: &Service) -> ServiceKey {
        ServiceKey::new(service.hostname.clone(), service.namespace())
    }
}

impl std::fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.hostname)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_mode_rules() {
        let mut ep = Endpoint {
            cluster_id: Default::default(),
            address: "10.0.0.1".into(),
            endpoint_port: 80,
            service_port_name: "http".into(),
            labels: Default::default(),
            locality: Locality::default(),
            weight: 0,
            service_account: String::new(),
            network: String::new(),
            namespace: "default".into(),
            origin: "test".into(),
        };
        assert_eq!(ep.tls_mode(), "disabled");
        ep.service_account = "spiffe://cluster.local/ns/default/sa/vm".into();
        assert_eq!(ep.tls_mode(), "istio");
        ep.labels.insert(TLS_MODE_LABEL.into(), "disabled".into());
        assert_eq!(ep.tls_mode(), "disabled");
    }

    #[test]
    fn traffic_distribution_from_spec_then_annotation() {
        use TrafficDistribution as T;
        assert_eq!(T::of(Some("PreferClose"), Some("PreferSameNode")), T::PreferSameZone);
        assert_eq!(T::of(Some("PreferSameNode"), None), T::PreferSameNode);
        assert_eq!(T::of(None, Some("prefersamezone")), T::PreferSameZone);
        assert_eq!(T::of(Some("Unknown"), Some("PREFERSAMENODE")), T::PreferSameNode);
        assert_eq!(T::of(None, Some("everywhere")), T::Any);
        assert_eq!(T::of(None, None), T::Any);
    }

    #[test]
    fn protocol_from_port_follows_istio_precedence() {
        assert_eq!(
            Protocol::from_port(Some("TCP"), Some("http"), "http-web"),
            Protocol::Tcp
        );
        assert_eq!(Protocol::from_port(None, Some("grpc"), "tcp"), Protocol::Grpc);
        assert_eq!(Protocol::from_port(None, None, "http2-api"), Protocol::Http2);
        assert_eq!(Protocol::from_port(None, None, "web"), Protocol::Unsupported);
    }

    #[test]
    fn visibility() {
        let p = vec![Visibility::Private];
        assert!(is_visible(&p, "a", "a"));
        assert!(!is_visible(&p, "a", "b"));
        assert!(is_visible(&[], "a", "b"));
        assert!(is_visible(&[Visibility::Namespace("b".into())], "a", "b"));
        assert!(!is_visible(&[Visibility::None], "a", "a"));
    }

    #[test]
    fn locality_round_trip() {
        let l = Locality::parse("us-east/zone-a/sub");
        assert_eq!(l.to_string(), "us-east/zone-a/sub");
        assert_eq!(Locality::parse("r").zone, "");
    }
}
