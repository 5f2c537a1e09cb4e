//! `Gateway`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Gateway {
    pub servers: Vec<Server>,
    pub selector: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Server {
    pub port: Option<GatewayPort>,
    pub bind: String,
    /// `[namespace/]host`, e.g. `*/foo.example.com`, `./*`.
    pub hosts: Vec<String>,
    pub tls: Option<ServerTlsSettings>,
    pub default_endpoint: String,
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct GatewayPort {
    pub number: u32,
    /// HTTP, HTTPS, GRPC, GRPC-WEB, HTTP2, MONGO, TCP, TLS.
    pub protocol: String,
    pub name: String,
    pub target_port: u32,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ServerTlsSettings {
    pub https_redirect: bool,
    /// PASSTHROUGH, SIMPLE, MUTUAL, AUTO_PASSTHROUGH, ISTIO_MUTUAL, OPTIONAL_MUTUAL.
    pub mode: Option<String>,
    pub server_certificate: String,
    pub private_key: String,
    pub ca_certificates: String,
    pub ca_crl: String,
    pub credential_name: String,
    pub credential_names: Vec<String>,
    pub tls_certificates: Vec<serde_json::Value>,
    pub subject_alt_names: Vec<String>,
    pub verify_certificate_spki: Vec<String>,
    pub verify_certificate_hash: Vec<String>,
    /// TLS_AUTO, TLSV1_0, TLSV1_1, TLSV1_2, TLSV1_3.
    pub min_protocol_version: Option<String>,
    pub max_protocol_version: Option<String>,
    pub cipher_suites: Vec<String>,
    /// Elliptic curves offered for ECDH key exchange (Envoy's `ecdh_curves`).
    pub ecdh_curves: Vec<String>,
    /// The credential holding the CA certificate for client validation, instead of
    /// `<credentialName>-cacert` (used with `credentialName`, served over SDS).
    pub ca_cert_credential_name: String,
    /// Accept client certificates whatever their trust chain (MUTUAL and OPTIONAL_MUTUAL).
    pub insecure_skip_verify: Option<bool>,
}
