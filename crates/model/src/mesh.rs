//! `MeshConfig` (the `mesh` file given by `--meshConfig`) and its `defaultConfig` ProxyConfig, with
//! Istio's defaults for every field that is absent. Fields pilot does not model yet are kept in
//! `extra` so a real Istio mesh file loads as is.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MeshConfig {
    pub root_namespace: String,
    pub trust_domain: String,
    pub trust_domain_aliases: Vec<String>,
    pub outbound_traffic_policy: OutboundTrafficPolicy,
    pub enable_auto_mtls: bool,
    pub default_config: ProxyConfig,
    pub connect_timeout: String,
    pub protocol_detection_timeout: String,
    pub dns_refresh_rate: String,
    /// Kubernetes Ingress (Istio's `pilot/pkg/config/kube/ingress`): the class this mesh's
    /// controller takes (`kubernetes.io/ingress.class`), the gateway Service and pod label
    /// (`istio: <ingressSelector>`) of the Gateways made from Ingresses, and which Ingresses are
    /// taken: `OFF`, `STRICT` (only those of the class) or `DEFAULT` (also those without one).
    pub ingress_class: String,
    pub ingress_service: String,
    pub ingress_selector: String,
    pub ingress_controller_mode: String,
    pub enable_tracing: bool,
    pub access_log_file: String,
    pub access_log_encoding: String,
    pub default_service_export_to: Vec<String>,
    pub default_virtual_service_export_to: Vec<String>,
    pub default_destination_rule_export_to: Vec<String>,
    pub locality_lb_setting: Option<crate::networking::LocalityLbSetting>,
    /// Mesh-wide zone-aware load balancing; wins over `localityLbSetting` (Istio's
    /// `GetEffectiveLbSetting`), not over a DestinationRule's locality setting.
    pub zone_aware_lb_setting: Option<crate::networking::ZoneAwareLbSetting>,
    /// `DO_NOT_UPGRADE` or `UPGRADE`.
    pub h2_upgrade_policy: String,
    pub inbound_cluster_stat_name: String,
    pub outbound_cluster_stat_name: String,
    pub mesh_mtls: Option<Value>,
    pub extension_providers: Vec<Value>,
    pub default_providers: Option<Value>,
    pub tcp_keepalive: Option<Value>,
    /// Namespaces the Kubernetes registry serves: those matching any selector (all when empty).
    pub discovery_selectors: Vec<LabelSelector>,
    /// Settings of groups of hosts: `clusterLocal` keeps a service's traffic in its cluster.
    pub service_settings: Vec<ServiceSettings>,
    /// Connection pool and outlier detection of every cluster whose DestinationRule (if any) sets
    /// none (Istio's `applyDefaultTrafficPolicy`).
    pub default_traffic_policy: Option<DefaultTrafficPolicy>,
    /// Retries of outbound HTTP routes that set none (a VirtualService's, and default routes).
    pub default_http_retry_policy: Option<crate::networking::HttpRetry>,
    /// Retries of sidecars' inbound HTTP routes (only attempts, retryOn and backoff apply there).
    pub default_inbound_http_retry_policy: Option<crate::networking::HttpRetry>,
    /// Istio's `tlsDefaults`: what TLS contexts that set none get (gateway SIMPLE/MUTUAL servers,
    /// DestinationRule TLS origination).
    pub tls_defaults: Option<TlsDefaults>,
    /// Everything else from the file, kept as written.
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

/// meshConfig `tlsDefaults` (Istio's `MeshConfig.TLSConfig`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct TlsDefaults {
    /// `TLS_AUTO` (Envoy's default), `TLSV1_2` or `TLSV1_3`: the least version downstream TLS
    /// accepts.
    pub min_protocol_version: String,
    pub ecdh_curves: Vec<String>,
    pub cipher_suites: Vec<String>,
}

/// meshConfig `defaultTrafficPolicy`: the baseline under every DestinationRule.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DefaultTrafficPolicy {
    pub connection_pool: Option<crate::networking::ConnectionPoolSettings>,
    pub outlier_detection: Option<crate::networking::OutlierDetection>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OutboundTrafficPolicy {
    /// `ALLOW_ANY` (default) or `REGISTRY_ONLY`.
    pub mode: String,
}

impl Default for OutboundTrafficPolicy {
    fn default() -> Self {
        OutboundTrafficPolicy {
            mode: "ALLOW_ANY".into(),
        }
    }
}

/// `ProxyConfig`, as `meshConfig.defaultConfig`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProxyConfig {
    pub config_path: String,
    pub binary_path: String,
    pub service_cluster: String,
    pub drain_duration: String,
    pub termination_drain_duration: String,
    pub discovery_address: String,
    pub proxy_admin_port: u16,
    pub status_port: u16,
    pub concurrency: Option<u32>,
    pub control_plane_auth_policy: String,
    pub custom_config_file: String,
    pub stat_name_length: u32,
    pub proxy_metadata: BTreeMap<String, String>,
    pub hold_application_until_proxy_starts: Option<bool>,
    pub tracing: Option<Value>,
    pub proxy_stats_matcher: Option<Value>,
    pub extra_stat_tags: Vec<String>,
    pub gateway_topology: Option<Value>,
    pub ca_certificates_pem: Vec<String>,
    pub image: Option<Value>,
    pub private_key_provider: Option<Value>,
    pub readiness_probe: Option<Value>,
    pub proxy_headers: Option<crate::proxy_headers::ProxyHeaders>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, Value>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            config_path: "./etc/istio/proxy".into(),
            binary_path: "/usr/local/bin/envoy".into(),
            service_cluster: "istio-proxy".into(),
            drain_duration: "45s".into(),
            termination_drain_duration: "5s".into(),
            discovery_address: "istiod.istio-system.svc:15012".into(),
            proxy_admin_port: 15000,
            status_port: 15020,
            concurrency: None,
            control_plane_auth_policy: "MUTUAL_TLS".into(),
            custom_config_file: String::new(),
            stat_name_length: 189,
            proxy_metadata: BTreeMap::new(),
            hold_application_until_proxy_starts: None,
            tracing: None,
            proxy_stats_matcher: None,
            extra_stat_tags: Vec::new(),
            gateway_topology: None,
            ca_certificates_pem: Vec::new(),
            image: None,
            private_key_provider: None,
            readiness_probe: None,
            proxy_headers: None,
            extra: BTreeMap::new(),
        }
    }
}

/// `MeshConfig.ServiceSettings`: settings for the services of `hosts` (names or `*.` wildcards).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceSettings {
    pub settings: ServiceSettingsSettings,
    pub hosts: Vec<String>,
}

/// `MeshConfig.ServiceSettings.Settings`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceSettingsSettings {
    /// The service's endpoints are only those of the caller's cluster (Istio's `clusterLocal`).
    pub cluster_local: bool,
}

impl Default for MeshConfig {
    fn default() -> Self {
        MeshConfig {
            root_namespace: "istio-system".into(),
            trust_domain: "cluster.local".into(),
            trust_domain_aliases: Vec::new(),
            outbound_traffic_policy: OutboundTrafficPolicy::default(),
            enable_auto_mtls: true,
            default_config: ProxyConfig::default(),
            connect_timeout: "10s".into(),
            protocol_detection_timeout: "0s".into(),
            dns_refresh_rate: "60s".into(),
            ingress_class: "istio".into(),
            ingress_service: "istio-ingressgateway".into(),
            ingress_selector: String::new(),
            ingress_controller_mode: "STRICT".into(),
            enable_tracing: true,
            access_log_file: String::new(),
            access_log_encoding: "TEXT".into(),
            default_service_export_to: vec!["*".into()],
            default_virtual_service_export_to: vec!["*".into()],
            default_destination_rule_export_to: vec!["*".into()],
            locality_lb_setting: None,
            zone_aware_lb_setting: None,
            h2_upgrade_policy: "DO_NOT_UPGRADE".into(),
            inbound_cluster_stat_name: String::new(),
            outbound_cluster_stat_name: String::new(),
            mesh_mtls: None,
            extension_providers: Vec::new(),
            default_providers: None,
            tcp_keepalive: None,
            discovery_selectors: Vec::new(),
            service_settings: Vec::new(),
            default_traffic_policy: None,
            default_http_retry_policy: None,
            default_inbound_http_retry_policy: None,
            tls_defaults: None,
            extra: BTreeMap::new(),
        }
    }
}

/// Why a mesh config could not be used.
#[derive(Debug, thiserror::Error)]
pub enum MeshConfigError {
    #[error("mesh config: {0}")]
    Decode(String),
    #[error("mesh config: {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    /// Istio's `ValidateMeshConfig` findings, each `field: reason`.
    #[error("mesh config: {}", .0.join("; "))]
    Validation(Vec<String>),
}

impl MeshConfig {
    /// Applies a decoded mesh file over Istio's defaults and validates the result.
    pub fn from_value(v: Value) -> Result<MeshConfig, MeshConfigError> {
        let v = if v.is_null() {
            Value::Object(Default::default())
        } else {
            v
        };
        let mesh: MeshConfig = serde_json::from_value(v).map_err(|e| MeshConfigError::Decode(e.to_string()))?;
        mesh.validate()?;
        Ok(mesh)
    }

    fn validate(&self) -> Result<(), MeshConfigError> {
        match self.outbound_traffic_policy.mode.as_str() {
            "ALLOW_ANY" | "REGISTRY_ONLY" => {}
            other => {
                return Err(MeshConfigError::Invalid {
                    field: "outboundTrafficPolicy.mode",
                    reason: format!("{other:?} is not ALLOW_ANY or REGISTRY_ONLY"),
                });
            }
        }
        for (field, d) in [
            ("connectTimeout", &self.connect_timeout),
            ("defaultConfig.drainDuration", &self.default_config.drain_duration),
            (
                "defaultConfig.terminationDrainDuration",
                &self.default_config.termination_drain_duration,
            ),
            ("dnsRefreshRate", &self.dns_refresh_rate),
        ] {
            if crate::duration::parse(d).is_none() {
                return Err(MeshConfigError::Invalid {
                    field,
                    reason: format!("{d:?} is not a duration"),
                });
            }
        }
        if !matches!(
            self.ingress_controller_mode.as_str(),
            "UNSPECIFIED" | "OFF" | "DEFAULT" | "STRICT"
        ) {
            return Err(MeshConfigError::Invalid {
                field: "ingressControllerMode",
                reason: format!(
                    "{:?} is not UNSPECIFIED, OFF, DEFAULT or STRICT",
                    self.ingress_controller_mode
                ),
            });
        }
        if self.root_namespace.is_empty() {
            return Err(MeshConfigError::Invalid {
                field: "rootNamespace",
                reason: "must not be empty".into(),
            });
        }
        let mut errors = crate::validation::mesh_config_errors(self);
        if let Some(h) = &self.default_config.proxy_headers {
            errors.extend(h.errors().into_iter().map(|e| format!("defaultConfig.{e}")));
        }
        if !errors.is_empty() {
            return Err(MeshConfigError::Validation(errors));
        }
        Ok(())
    }

    pub fn registry_only(&self) -> bool {
        self.outbound_traffic_policy.mode == "REGISTRY_ONLY"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_fill_partial_file() {
        let m = MeshConfig::from_value(json!({
            "defaultConfig": {"proxyAdminPort": 15001},
            "outboundTrafficPolicy": {"mode": "REGISTRY_ONLY"},
            "somethingNew": {"a": 1}
        }))
        .unwrap();
        assert_eq!(m.default_config.proxy_admin_port, 15001);
        assert_eq!(m.default_config.drain_duration, "45s");
        assert_eq!(m.root_namespace, "istio-system");
        assert!(m.registry_only());
        assert!(m.extra.contains_key("somethingNew"));
    }

    #[test]
    fn rejects_bad_values() {
        assert!(MeshConfig::from_value(json!({"outboundTrafficPolicy": {"mode": "SOMETIMES"}})).is_err());
        assert!(MeshConfig::from_value(json!({"connectTimeout": "ten"})).is_err());
        assert!(MeshConfig::from_value(json!({"enableAutoMtls": "maybe"})).is_err());
        let mode = MeshConfig::from_value(json!({"ingressControllerMode": "LOOSE"})).unwrap_err();
        assert!(mode.to_string().contains("ingressControllerMode"), "{mode}");
        let m = MeshConfig::from_value(json!({"ingressControllerMode": "DEFAULT", "ingressSelector": "gw"})).unwrap();
        assert_eq!(
            (m.ingress_controller_mode.as_str(), m.ingress_selector.as_str()),
            ("DEFAULT", "gw")
        );
    }
}

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`), as in `discoverySelectors`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelSelector {
    pub match_labels: BTreeMap<String, String>,
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One `matchExpressions` entry: `In`, `NotIn`, `Exists` or `DoesNotExist`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct LabelSelectorRequirement {
    pub key: String,
    pub operator: String,
    pub values: Vec<String>,
}

impl LabelSelector {
    /// Whether `labels` match (the empty selector matches everything; an unknown operator nothing).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|r| {
                let v = labels.get(&r.key);
                match r.operator.as_str() {
                    "In" => v.is_some_and(|v| r.values.contains(v)),
                    "NotIn" => v.is_none_or(|v| !r.values.contains(v)),
                    "Exists" => v.is_some(),
                    "DoesNotExist" => v.is_none(),
                    _ => false,
                }
            })
    }
}

#[cfg(test)]
mod selector_tests {
    use super::*;

    #[test]
    fn discovery_selectors_parse_and_match_as_kubernetes_label_selectors() {
        let mesh: MeshConfig = serde_json::from_value(serde_json::json!({"discoverySelectors": [
            {"matchLabels": {"istio-discovery": "enabled"}},
            {"matchExpressions": [{"key": "env", "operator": "In", "values": ["prod", "staging"]},
                                  {"key": "legacy", "operator": "DoesNotExist"}]},
        ]}))
        .unwrap_or_default();
        assert_eq!(mesh.discovery_selectors.len(), 2);
        let l = |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert!(mesh.discovery_selectors[0].matches(&l(&[("istio-discovery", "enabled")])));
        assert!(!mesh.discovery_selectors[0].matches(&l(&[])));
        assert!(mesh.discovery_selectors[1].matches(&l(&[("env", "prod")])));
        assert!(!mesh.discovery_selectors[1].matches(&l(&[("env", "prod"), ("legacy", "x")])));
        assert!(LabelSelector::default().matches(&l(&[])));
    }
}
