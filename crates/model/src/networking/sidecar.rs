//! `Sidecar`.

use serde::{Deserialize, Serialize};

use super::{ConnectionPoolSettings, WorkloadSelector};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Sidecar {
    pub workload_selector: Option<WorkloadSelector>,
    pub ingress: Vec<IstioIngressListener>,
    pub egress: Vec<IstioEgressListener>,
    pub inbound_connection_pool: Option<ConnectionPoolSettings>,
    pub outbound_traffic_policy: Option<OutboundTrafficPolicy>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct SidecarPort {
    pub number: u32,
    pub protocol: String,
    pub name: String,
    pub target_port: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IstioIngressListener {
    pub port: Option<SidecarPort>,
    pub bind: String,
    /// IPTABLES or NONE.
    pub capture_mode: Option<String>,
    pub default_endpoint: String,
    pub tls: Option<super::ServerTlsSettings>,
    pub connection_pool: Option<ConnectionPoolSettings>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct IstioEgressListener {
    pub port: Option<SidecarPort>,
    pub bind: String,
    pub capture_mode: Option<String>,
    /// `namespace/dnsName`, e.g. `./*`, `istio-system/*`, `*/reviews.default.svc.cluster.local`.
    pub hosts: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct OutboundTrafficPolicy {
    /// REGISTRY_ONLY or ALLOW_ANY.
    pub mode: Option<String>,
    pub egress_proxy: Option<super::Destination>,
}
