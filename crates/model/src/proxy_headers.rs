//! ProxyConfig `proxyHeaders` (Istio's `ProxyConfig.ProxyHeaders`): which headers the proxy adds
//! or removes (`server`, `x-request-id`, `x-envoy-attempt-count`, Envoy's debug headers, XFCC,
//! `x-forwarded-port`/`-host`) and whether HTTP/1 header case is preserved. Set mesh-wide in
//! `meshConfig.defaultConfig`, per proxy in the ProxyConfig the agent sends (`PROXY_CONFIG`).
//! Fields of newer Istio versions are ignored, as the rest of ProxyConfig; wrong types are not.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProxyHeaders {
    /// Inbound XFCC handling: `SANITIZE`, `FORWARD_ONLY`, `APPEND_FORWARD` (default),
    /// `SANITIZE_SET`, `ALWAYS_FORWARD_ONLY`.
    pub forwarded_client_cert: Option<String>,
    pub set_current_client_cert_details: Option<SetCurrentClientCertDetails>,
    pub request_id: Option<Disableable>,
    pub server: Option<ServerHeader>,
    pub attempt_count: Option<Disableable>,
    pub envoy_debug_headers: Option<Disableable>,
    /// `IN_MESH` drops Istio's metadata-exchange headers outside the mesh; upstream Envoy has no
    /// metadata exchange, so there is nothing to drop.
    pub metadata_exchange_headers: Option<MetadataExchangeHeaders>,
    pub preserve_http1_header_case: Option<bool>,
    pub x_forwarded_port: Option<Enableable>,
    pub x_forwarded_host: Option<Enableable>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Disableable {
    pub disabled: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Enableable {
    pub enabled: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServerHeader {
    pub disabled: Option<bool>,
    pub value: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MetadataExchangeHeaders {
    /// `UNDEFINED` or `IN_MESH`.
    pub mode: String,
}

/// Which client certificate details go into XFCC (`subject`, `uri`, `dns` default on).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SetCurrentClientCertDetails {
    pub subject: Option<bool>,
    pub cert: Option<bool>,
    pub chain: Option<bool>,
    pub dns: Option<bool>,
    pub uri: Option<bool>,
}

/// Istio's `ForwardClientCertDetails` names.
pub(crate) const FORWARD_CLIENT_CERT_DETAILS: [&str; 6] = [
    "UNDEFINED",
    "SANITIZE",
    "FORWARD_ONLY",
    "APPEND_FORWARD",
    "SANITIZE_SET",
    "ALWAYS_FORWARD_ONLY",
];

impl ProxyHeaders {
    /// Values outside Istio's enums, as `field: reason`.
    pub fn errors(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(f) = &self.forwarded_client_cert
            && !FORWARD_CLIENT_CERT_DETAILS.contains(&f.as_str())
        {
            out.push(format!("proxyHeaders.forwardedClientCert: unknown value {f:?}"));
        }
        if let Some(m) = &self.metadata_exchange_headers
            && !matches!(m.mode.as_str(), "" | "UNDEFINED" | "IN_MESH")
        {
            out.push(format!(
                "proxyHeaders.metadataExchangeHeaders.mode: unknown value {:?}",
                m.mode
            ));
        }
        out
    }
}
