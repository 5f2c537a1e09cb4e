//! The proxy on the other end of an xDS stream: parsed from Envoy's node ID
//! (`type~ip~id~domain`) and node metadata, as Istio's `model.Proxy`.

use std::collections::BTreeMap;
use std::net::IpAddr;

use serde_json::Value;

/// Istio's proxy types (the first field of the node ID).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NodeType {
    SidecarProxy,
    Router,
    Waypoint,
    Ztunnel,
}

impl NodeType {
    pub fn as_str(&self) -> &'static str {
        match self {
            NodeType::SidecarProxy => "sidecar",
            NodeType::Router => "router",
            NodeType::Waypoint => "waypoint",
            NodeType::Ztunnel => "ztunnel",
        }
    }
}

/// Why a node could not be accepted. Shown to the proxy as a gRPC `InvalidArgument`.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ProxyError {
    #[error("missing node ID")]
    MissingId,
    #[error("node ID {id:?} has {found} parts, expected 4 (type~ip~id~domain)")]
    WrongParts { id: String, found: usize },
    #[error("node ID {id:?}: invalid node type {node_type:?} (want sidecar, router, waypoint or ztunnel)")]
    InvalidType { id: String, node_type: String },
    #[error("node ID {id:?}: invalid IP address {ip:?}")]
    InvalidIp { id: String, ip: String },
    #[error("node ID {id:?}: empty {field}")]
    EmptyField { id: String, field: &'static str },
    #[error("node {id:?}: invalid metadata {key}: {reason}")]
    InvalidMetadata {
        id: String,
        key: &'static str,
        reason: String,
    },
}

/// Node metadata fields that Istio's agent sends (`ISTIO_META_*`), the ones pilot reads.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeMetadata {
    pub namespace: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub cluster_id: Option<String>,
    pub istio_version: Option<String>,
    pub instance_ips: Vec<IpAddr>,
    pub network: Option<String>,
    /// `REQUESTED_NETWORK_VIEW` (Istio's `StringList`, comma separated): the only networks whose
    /// endpoints the proxy wants; empty: all.
    pub requested_network_view: Vec<String>,
    pub service_account: Option<String>,
    pub workload_name: Option<String>,
    pub mesh_id: Option<String>,
    pub generator: Option<String>,
    pub dns_capture: bool,
    pub dns_auto_allocate: bool,
    /// Whether the node sent its ProxyConfig (`PROXY_CONFIG`): then its `proxyHeaders` apply,
    /// not the mesh's `defaultConfig` (Istio's `ProxyConfigOrDefault`).
    pub proxy_config: bool,
    pub proxy_headers: Option<crate::proxy_headers::ProxyHeaders>,
    /// Everything else, as sent.
    pub raw: BTreeMap<String, Value>,
}

impl NodeMetadata {
    /// Reads Istio's metadata keys from the node's `metadata` Struct (as JSON).
    /// String-typed booleans ("true") are accepted as Istio's `StringBool`.
    pub fn from_json(id: &str, v: &Value) -> Result<Self, ProxyError> {
        let mut md = NodeMetadata::default();
        let Some(obj) = v.as_object() else {
            return Ok(md);
        };
        let s = |k: &str| {
            obj.get(k)
                .and_then(Value::as_str)
                .map(str::to_owned)
                .filter(|s| !s.is_empty())
        };
        md.namespace = s("NAMESPACE");
        md.cluster_id = s("CLUSTER_ID");
        md.istio_version = s("ISTIO_VERSION");
        md.network = s("NETWORK");
        md.requested_network_view = s("REQUESTED_NETWORK_VIEW")
            .map(|v| {
                v.split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        md.service_account = s("SERVICE_ACCOUNT");
        md.workload_name = s("WORKLOAD_NAME");
        md.mesh_id = s("MESH_ID");
        md.generator = s("GENERATOR");
        let b = |k: &str| match obj.get(k) {
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) => s == "true" || s == "1",
            _ => false,
        };
        md.dns_capture = b("DNS_CAPTURE");
        md.dns_auto_allocate = b("DNS_AUTO_ALLOCATE");
        match obj.get("LABELS") {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    match v {
                        Value::String(s) => {
                            md.labels.insert(k.clone(), s.clone());
                        }
                        other => {
                            return Err(ProxyError::InvalidMetadata {
                                id: id.to_owned(),
                                key: "LABELS",
                                reason: format!("label {k:?} has non-string value {other}"),
                            });
                        }
                    }
                }
            }
            Some(other) => {
                return Err(ProxyError::InvalidMetadata {
                    id: id.to_owned(),
                    key: "LABELS",
                    reason: format!("expected an object, got {other}"),
                });
            }
        }
        if let Some(pc) = obj.get("PROXY_CONFIG").filter(|v| !v.is_null()) {
            let invalid = |reason: String| ProxyError::InvalidMetadata {
                id: id.to_owned(),
                key: "PROXY_CONFIG",
                reason,
            };
            let Some(pc) = pc.as_object() else {
                return Err(invalid(format!("expected an object, got {pc}")));
            };
            md.proxy_config = true;
            if let Some(h) = pc.get("proxyHeaders").filter(|v| !v.is_null()) {
                let h: crate::proxy_headers::ProxyHeaders =
                    serde_json::from_value(h.clone()).map_err(|e| invalid(format!("proxyHeaders: {e}")))?;
                if let Some(e) = h.errors().into_iter().next() {
                    return Err(invalid(e));
                }
                md.proxy_headers = Some(h);
            }
        }
        if let Some(ips) = s("INSTANCE_IPS") {
            for ip in ips.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let ip = ip.parse().map_err(|_| ProxyError::InvalidMetadata {
                    id: id.to_owned(),
                    key: "INSTANCE_IPS",
                    reason: format!("{ip:?} is not an IP address"),
                })?;
                md.instance_ips.push(ip);
            }
        }
        md.raw = obj.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        Ok(md)
    }
}

/// A connected proxy, as Istio's `model.Proxy`.
#[derive(Debug, Clone, PartialEq)]
pub struct Proxy {
    /// The full node ID as sent.
    pub node_id: String,
    pub node_type: NodeType,
    /// IP addresses of the workload: the node ID's IP first, then INSTANCE_IPS.
    pub ip_addresses: Vec<IpAddr>,
    /// The third field: `pod.namespace` for Kubernetes workloads.
    pub id: String,
    /// The fourth field: `namespace.svc.cluster.local`.
    pub dns_domain: String,
    /// The config namespace: NAMESPACE metadata, else the second label of `id`.
    pub config_namespace: String,
    pub labels: BTreeMap<String, String>,
    pub metadata: NodeMetadata,
    /// Envoy's locality from the node (`region/zone/subzone`), if any.
    pub locality: crate::service::Locality,
    /// The identity the caller of the stream proved (Istio's `VerifiedIdentity`): set by the xDS
    /// server for streams of the secure port only, `None` on the plaintext port. Nothing the node
    /// sends sets it: [`Proxy::parse`] leaves it `None`.
    pub verified_identity: Option<VerifiedIdentity>,
    /// The ports of the Services that select the proxy's workload, as the registry that knows its
    /// Pod finds them from the Pod and the Services' selectors, ready or not (Istio's Kubernetes
    /// `GetProxyServiceTargets`); `None` when no registry does, and the proxy's service
    /// instances are those of the endpoints at its IPs. Set by the registries, never by the node.
    pub service_targets: Option<Vec<WorkloadTarget>>,
}

/// One port of a Service that selects a proxy's workload (Istio's `ServiceTarget` of a Pod).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadTarget {
    pub service: crate::ServiceKey,
    /// The name of the service port (the Service's port of that name).
    pub port_name: String,
    /// The port the workload listens on (the Service port's `targetPort` in the Pod).
    pub target_port: u16,
}

/// A proven workload identity, `spiffe://<trust domain>/ns/<namespace>/sa/<service account>`
/// (Istio's `spiffe.Identity`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct VerifiedIdentity {
    pub trust_domain: String,
    pub namespace: String,
    pub service_account: String,
}

impl VerifiedIdentity {
    /// Parses a SPIFFE URI of a Kubernetes service account; `None` for anything else.
    pub fn from_spiffe(uri: &str) -> Option<VerifiedIdentity> {
        let rest = uri.strip_prefix("spiffe://")?;
        let mut p = rest.split('/');
        match (p.next(), p.next(), p.next(), p.next(), p.next(), p.next()) {
            (Some(td), Some("ns"), Some(ns), Some("sa"), Some(sa), None)
                if !td.is_empty() && !ns.is_empty() && !sa.is_empty() =>
            {
                Some(VerifiedIdentity {
                    trust_domain: td.to_owned(),
                    namespace: ns.to_owned(),
                    service_account: sa.to_owned(),
                })
            }
            _ => None,
        }
    }
}

impl std::fmt::Display for VerifiedIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "spiffe://{}/ns/{}/sa/{}",
            self.trust_domain, self.namespace, self.service_account
        )
    }
}

impl Proxy {
    /// Parses `type~ip~id~domain` plus metadata, refusing malformed input with a reason.
    pub fn parse(node_id: &str, metadata: NodeMetadata) -> Result<Proxy, ProxyError> {
        if node_id.is_empty() {
            return Err(ProxyError::MissingId);
        }
        let parts: Vec<&str> = node_id.split('~').collect();
        if parts.len() != 4 {
            return Err(ProxyError::WrongParts {
                id: node_id.to_owned(),
                found: parts.len(),
            });
        }
        let node_type = match parts[0] {
            "sidecar" => NodeType::SidecarProxy,
            "router" => NodeType::Router,
            "waypoint" => NodeType::Waypoint,
            "ztunnel" => NodeType::Ztunnel,
            other => {
                return Err(ProxyError::InvalidType {
                    id: node_id.to_owned(),
                    node_type: other.to_owned(),
                });
            }
        };
        let ip: IpAddr = parts[1].parse().map_err(|_| ProxyError::InvalidIp {
            id: node_id.to_owned(),
            ip: parts[1].to_owned(),
        })?;
        if parts[2].is_empty() {
            return Err(ProxyError::EmptyField {
                id: node_id.to_owned(),
                field: "id",
            });
        }
        let mut ip_addresses = vec![ip];
        for extra in &metadata.instance_ips {
            if !ip_addresses.contains(extra) {
                ip_addresses.push(*extra);
            }
        }
        let config_namespace = metadata
            .namespace
            .clone()
            .or_else(|| parts[2].split_once('.').map(|(_, ns)| ns.to_owned()))
            .unwrap_or_else(|| "default".to_owned());
        Ok(Proxy {
            node_id: node_id.to_owned(),
            node_type,
            ip_addresses,
            id: parts[2].to_owned(),
            dns_domain: parts[3].to_owned(),
            config_namespace,
            labels: metadata.labels.clone(),
            metadata,
            locality: Default::default(),
            verified_identity: None,
            service_targets: None,
        })
    }

    pub fn is_router(&self) -> bool {
        self.node_type == NodeType::Router
    }

    /// Whether the proxy runs beside an agent that serves it workload certificates over SDS: Istio's
    /// agents (and pilot-agent) send `WORKLOAD_IDENTITY_SOCKET_FILE`. An Envoy bootstrapped by
    /// hand without one has no identity, and is served plaintext where Istio would use mTLS.
    /// Node metadata `DNS_CAPTURE` (`ISTIO_META_DNS_CAPTURE`): the agent answers the pod's DNS.
    pub fn dns_capture(&self) -> bool {
        self.metadata_flag("DNS_CAPTURE")
    }

    /// Istio's `nodeUsesAutoallocatedIPs`: a proxy that captures DNS consumes the VIPs allocated to
    /// ServiceEntries without addresses, when allocation is on (`PILOT_ENABLE_IP_AUTOALLOCATE`, or
    /// the proxy's own `DNS_AUTO_ALLOCATE`).
    pub fn uses_auto_allocated_ips(&self, enable_ip_autoallocate: bool) -> bool {
        self.dns_capture() && (enable_ip_autoallocate || self.metadata_flag("DNS_AUTO_ALLOCATE"))
    }

    /// A metadata value that is `true` (Istio's `StringBool`: a string or a JSON boolean).
    fn metadata_flag(&self, key: &str) -> bool {
        match self.metadata.raw.get(key) {
            Some(serde_json::Value::Bool(b)) => *b,
            Some(serde_json::Value::String(s)) => s.eq_ignore_ascii_case("true") || s == "1",
            _ => false,
        }
    }

    /// Whether the proxy has an IPv4 (`.0`) and an IPv6 (`.1`) address; a proxy without any is
    /// taken as IPv4 (Istio's `SupportsIPv4`).
    pub fn ip_families(&self) -> (bool, bool) {
        let v4 = self.ip_addresses.iter().any(std::net::IpAddr::is_ipv4);
        let v6 = self.ip_addresses.iter().any(std::net::IpAddr::is_ipv6);
        (v4 || !v6, v6)
    }

    pub fn has_workload_identity(&self) -> bool {
        self.metadata
            .raw
            .get("WORKLOAD_IDENTITY_SOCKET_FILE")
            .and_then(serde_json::Value::as_str)
            .is_some_and(|s| !s.is_empty())
    }

    /// The `proxyHeaders` in effect (Istio's `ProxyConfigOrDefault(...).GetProxyHeaders()`):
    /// the proxy's own ProxyConfig's if it sent one, else the mesh's `defaultConfig`.
    pub fn proxy_headers_config<'a>(
        &'a self,
        mesh: &'a crate::MeshConfig,
    ) -> Option<&'a crate::proxy_headers::ProxyHeaders> {
        if self.metadata.proxy_config {
            self.metadata.proxy_headers.as_ref()
        } else {
            mesh.default_config.proxy_headers.as_ref()
        }
    }

    pub fn is_sidecar(&self) -> bool {
        self.node_type == NodeType::SidecarProxy
    }

    /// The cluster this proxy runs in (CLUSTER_ID metadata), Istio's default `Kubernetes`.
    pub fn cluster_id(&self) -> &str {
        self.metadata.cluster_id.as_deref().unwrap_or("Kubernetes")
    }

    /// The network this proxy is on (`NETWORK` metadata, `ISTIO_META_NETWORK`); empty: unknown.
    pub fn network(&self) -> &str {
        self.metadata.network.as_deref().unwrap_or_default()
    }

    /// Istio's `InNetwork`: `network` is the proxy's, or either is unknown.
    pub fn in_network(&self, network: &str) -> bool {
        network.is_empty() || self.network().is_empty() || network == self.network()
    }

    /// Istio's `ProxyView`: whether endpoints of `network` are visible to the proxy (all without
    /// `REQUESTED_NETWORK_VIEW`; endpoints of no known network always are).
    pub fn sees_network(&self, network: &str) -> bool {
        let view = &self.metadata.requested_network_view;
        view.is_empty() || network.is_empty() || view.iter().any(|n| n == network)
    }

    /// `REQUESTED_NETWORK_VIEW`, as sent.
    pub fn requested_network_view(&self) -> &[String] {
        &self.metadata.requested_network_view
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Only the xDS server sets the verified identity: no node metadata key does.
    #[test]
    fn node_metadata_cannot_claim_a_verified_identity() {
        let md = NodeMetadata::from_json(
            "x",
            &json!({
                "NAMESPACE": "istio-system",
                "VERIFIED_IDENTITY": "spiffe://cluster.local/ns/istio-system/sa/istio-ingressgateway",
                "VerifiedIdentity": {"namespace": "istio-system", "serviceAccount": "gw"},
                "SERVICE_ACCOUNT": "istio-ingressgateway",
            }),
        )
        .unwrap();
        let p = Proxy::parse("router~10.0.0.1~gw.istio-system~istio-system.svc.cluster.local", md).unwrap();
        assert_eq!(p.verified_identity, None);
    }

    #[test]
    fn verified_identities_are_spiffe_ids_of_service_accounts() {
        let id = VerifiedIdentity::from_spiffe("spiffe://cluster.local/ns/istio-system/sa/gw").unwrap();
        assert_eq!(
            (
                id.trust_domain.as_str(),
                id.namespace.as_str(),
                id.service_account.as_str()
            ),
            ("cluster.local", "istio-system", "gw")
        );
        assert_eq!(id.to_string(), "spiffe://cluster.local/ns/istio-system/sa/gw");
        for bad in [
            "spiffe://cluster.local/ns/istio-system",
            "spiffe://cluster.local/ns//sa/gw",
            "spiffe:///ns/a/sa/b",
            "spiffe://td/ns/a/sa/b/extra",
            "https://td/ns/a/sa/b",
        ] {
            assert_eq!(VerifiedIdentity::from_spiffe(bad), None, "{bad}");
        }
    }

    #[test]
    fn proxy_headers_come_from_the_proxys_own_proxy_config_else_the_mesh() {
        let md = |v| NodeMetadata::from_json("x", &v);
        let mut mesh = crate::MeshConfig::default();
        mesh.default_config.proxy_headers = Some(crate::proxy_headers::ProxyHeaders {
            preserve_http1_header_case: Some(true),
            ..Default::default()
        });
        let proxy = |m: NodeMetadata| Proxy::parse("sidecar~10.0.0.1~a.default~default.svc.cluster.local", m).unwrap();
        let own = proxy(md(json!({"PROXY_CONFIG": {"proxyHeaders": {"server": {"disabled": true}}}})).unwrap());
        assert_eq!(
            own.proxy_headers_config(&mesh)
                .and_then(|h| h.server.clone())
                .and_then(|s| s.disabled),
            Some(true)
        );
        // a ProxyConfig without proxyHeaders has none: the mesh default is not merged in
        let bare = proxy(md(json!({"PROXY_CONFIG": {"concurrency": 2}})).unwrap());
        assert_eq!(bare.proxy_headers_config(&mesh), None);
        let none = proxy(md(json!({})).unwrap());
        assert_eq!(
            none.proxy_headers_config(&mesh),
            mesh.default_config.proxy_headers.as_ref()
        );
        for bad in [
            json!({"PROXY_CONFIG": "yes"}),
            json!({"PROXY_CONFIG": {"proxyHeaders": {"server": "off"}}}),
            json!({"PROXY_CONFIG": {"proxyHeaders": {"forwardedClientCert": "SOMETIMES"}}}),
        ] {
            let e = md(bad.clone()).unwrap_err().to_string();
            assert!(e.contains("invalid metadata PROXY_CONFIG"), "{bad}: {e}");
        }
    }

    #[test]
    fn parses_istio_node_id() {
        let md = NodeMetadata::from_json(
            "x",
            &json!({"NAMESPACE": "istio-system", "LABELS": {"istio": "ingressgateway"}, "INSTANCE_IPS": "10.0.0.1,fd00::1"}),
        )
        .unwrap();
        let p = Proxy::parse("router~10.0.0.1~gw-1.istio-system~istio-system.svc.cluster.local", md).unwrap();
        assert_eq!(p.node_type, NodeType::Router);
        assert_eq!(p.config_namespace, "istio-system");
        assert_eq!(p.labels.get("istio").map(String::as_str), Some("ingressgateway"));
        assert_eq!(p.ip_addresses.len(), 2);
        assert_eq!(p.dns_domain, "istio-system.svc.cluster.local");
    }

    #[test]
    fn namespace_from_id_when_metadata_missing() {
        let p = Proxy::parse(
            "sidecar~10.0.0.2~reviews-v1.bookinfo~bookinfo.svc.cluster.local",
            NodeMetadata::default(),
        )
        .unwrap();
        assert_eq!(p.config_namespace, "bookinfo");
    }

    #[test]
    fn refuses_malformed_ids() {
        let md = NodeMetadata::default;
        assert_eq!(Proxy::parse("", md()), Err(ProxyError::MissingId));
        assert!(matches!(
            Proxy::parse("sidecar~1.2.3.4~x", md()),
            Err(ProxyError::WrongParts { found: 3, .. })
        ));
        assert!(matches!(
            Proxy::parse("gateway~1.2.3.4~x~d", md()),
            Err(ProxyError::InvalidType { .. })
        ));
        assert!(matches!(
            Proxy::parse("sidecar~not-ip~x~d", md()),
            Err(ProxyError::InvalidIp { .. })
        ));
        assert!(matches!(
            Proxy::parse("sidecar~1.2.3.4~~d", md()),
            Err(ProxyError::EmptyField { .. })
        ));
        let bad = NodeMetadata::from_json("x", &json!({"LABELS": {"a": 1}}));
        assert!(matches!(bad, Err(ProxyError::InvalidMetadata { key: "LABELS", .. })));
    }
}
