//! The mesh config the templates see (`.MeshConfig`, `.ProxyConfig`), as protobuf JSON: Istio's
//! defaults (`pkg/config/mesh` `DefaultMeshConfig`, `DefaultProxyConfig`), the `istio`
//! ConfigMap's `mesh` YAML over them (`ApplyMeshConfig`: fields replace, `defaultConfig` and
//! `proxyMetadata` merge, `extensionProviders` merge by name), the `proxy.istio.io/config`
//! annotation over `defaultConfig` (`MergeProxyConfig`), and `protoToJSON`'s
//! `cleanProxyConfig`.

use serde_json::{Value as Json, json};

use crate::yaml::from_yaml;

/// The mesh config: Istio's defaults with the `mesh` YAML applied. Cheap to clone.
#[derive(Debug, Clone, PartialEq)]
pub struct MeshConfig {
    json: Json,
}

/// A mesh config or ProxyConfig that is not YAML or not an object.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{what}: {reason}")]
pub struct MeshError {
    pub what: &'static str,
    pub reason: String,
}

/// Istio's `DefaultProxyConfig`.
fn default_proxy_config() -> Json {
    json!({
        "configPath": "./etc/istio/proxy",
        "binaryPath": "/usr/local/bin/envoy",
        "serviceCluster": "istio-proxy",
        "drainDuration": "45s",
        "terminationDrainDuration": "5s",
        "discoveryAddress": "istiod.istio-system.svc:15012",
        "proxyAdminPort": 15000,
        "controlPlaneAuthPolicy": "MUTUAL_TLS",
        "statNameLength": 189,
        "statusPort": 15020
    })
}

impl Default for MeshConfig {
    /// Istio's `DefaultMeshConfig`.
    fn default() -> Self {
        MeshConfig {
            json: json!({
                "enableTracing": true,
                "accessLogEncoding": "TEXT",
                "protocolDetectionTimeout": "0s",
                "ingressService": "istio-ingressgateway",
                "ingressControllerMode": "STRICT",
                "ingressClass": "istio",
                "trustDomain": "cluster.local",
                "trustDomainAliases": [],
                "enableAutoMtls": true,
                "outboundTrafficPolicy": {"mode": "ALLOW_ANY"},
                "inboundTrafficPolicy": {"mode": "PASSTHROUGH"},
                "localityLbSetting": {"enabled": true},
                "certificates": [],
                "defaultConfig": default_proxy_config(),
                "rootNamespace": "istio-system",
                "proxyListenPort": 15001,
                "proxyInboundListenPort": 15006,
                "connectTimeout": "10s",
                "defaultServiceExportTo": ["*"],
                "defaultVirtualServiceExportTo": ["*"],
                "defaultDestinationRuleExportTo": ["*"],
                "dnsRefreshRate": "60s",
                "serviceSettings": [],
                "enablePrometheusMerge": true,
                "defaultProviders": {},
                "extensionProviders": [
                    {"name": "prometheus", "prometheus": {}},
                    {"name": "stackdriver", "stackdriver": {}},
                    {"name": "envoy", "envoyFileAccessLog": {"path": "/dev/stdout"}}
                ]
            }),
        }
    }
}

impl MeshConfig {
    /// Istio's defaults with the `istio` ConfigMap's `mesh` YAML applied.
    pub fn parse(mesh_yaml: &str) -> Result<MeshConfig, MeshError> {
        MeshConfig::default().apply(mesh_yaml)
    }

    /// This config with more mesh YAML applied over it (Istio's `ApplyMeshConfig`).
    pub fn apply(&self, mesh_yaml: &str) -> Result<MeshConfig, MeshError> {
        let overlay = yaml_object(mesh_yaml, "mesh config")?;
        let mut json = self.json.clone();
        let Json::Object(target) = &mut json else {
            return Ok(self.clone());
        };
        for (k, v) in overlay {
            match (k.as_str(), target.get_mut(&k)) {
                ("defaultConfig", Some(prev)) => merge(prev, v),
                ("extensionProviders", Some(Json::Array(prev))) => {
                    for p in v.as_array().cloned().unwrap_or_default() {
                        match prev
                            .iter_mut()
                            .find(|e| e.get("name").is_some() && e.get("name") == p.get("name"))
                        {
                            Some(slot) => *slot = p,
                            None => prev.push(p),
                        }
                    }
                }
                _ => {
                    target.insert(k, v);
                }
            }
        }
        Ok(MeshConfig { json })
    }

    pub fn as_json(&self) -> &Json {
        &self.json
    }

    /// `defaultConfig`, the mesh-wide ProxyConfig.
    pub fn default_config(&self) -> Json {
        self.json
            .get("defaultConfig")
            .cloned()
            .unwrap_or_else(default_proxy_config)
    }

    /// The agent's status port (`defaultConfig.statusPort`).
    pub fn status_port(&self) -> i64 {
        self.json
            .pointer("/defaultConfig/statusPort")
            .and_then(Json::as_i64)
            .unwrap_or(15020)
    }

    /// `enablePrometheusMerge` (true when unset, as Istio).
    pub fn prometheus_merge(&self) -> bool {
        self.json
            .get("enablePrometheusMerge")
            .and_then(Json::as_bool)
            .unwrap_or(true)
    }

    /// Istio's `InboundTrafficPolicyMode`: `localhost` or `passthrough`.
    pub fn inbound_traffic_policy_mode(&self) -> &'static str {
        match self.json.pointer("/inboundTrafficPolicy/mode").and_then(Json::as_str) {
            Some("LOCALHOST") => "localhost",
            _ => "passthrough",
        }
    }
}

/// `defaultConfig` with a `proxy.istio.io/config` annotation merged over it (`MergeProxyConfig`).
pub(crate) fn merge_proxy_config(base: &Json, yaml: &str) -> Result<Json, MeshError> {
    let overlay = yaml_object(yaml, "proxy config")?;
    let mut out = base.clone();
    merge(&mut out, Json::Object(overlay));
    Ok(out)
}

fn yaml_object(text: &str, what: &'static str) -> Result<serde_json::Map<String, Json>, MeshError> {
    match from_yaml(text).map_err(|reason| MeshError { what, reason })? {
        Json::Object(o) => Ok(o),
        Json::Null => Ok(serde_json::Map::new()),
        other => Err(MeshError {
            what,
            reason: format!("not a map: {other}"),
        }),
    }
}

/// Protobuf merge of JSON: objects merge field by field (maps key by key), the rest replaces.
fn merge(target: &mut Json, overlay: Json) {
    match (target, overlay) {
        (Json::Object(t), Json::Object(o)) => {
            for (k, v) in o {
                match t.get_mut(&k) {
                    Some(slot @ Json::Object(_)) if v.is_object() => merge(slot, v),
                    _ => {
                        t.insert(k, v);
                    }
                }
            }
        }
        (t, o) => *t = o,
    }
}

/// Wrapper-typed ProxyConfig fields: protojson writes them even when zero.
const WRAPPER_FIELDS: &[&str] = &["concurrency", "holdApplicationUntilProxyStarts", "fileFlushMinSizeKb"];

/// Istio's `cleanProxyConfig` and protojson's omission of zero fields: the ProxyConfig that
/// `protoToJSON` writes, without what equals Istio's defaults.
pub(crate) fn clean_proxy_config(pc: &Json) -> Json {
    let Json::Object(m) = pc else { return json!({}) };
    let defaults = default_proxy_config();
    let mut out = serde_json::Map::new();
    for (k, v) in m {
        let is_default = defaults.get(k) == Some(v);
        let is_zero = match v {
            Json::Null => true,
            Json::String(s) => s.is_empty() || (k == "interceptionMode" && s == "REDIRECT"),
            Json::Number(n) => n.as_f64() == Some(0.0) && !WRAPPER_FIELDS.contains(&k.as_str()),
            Json::Bool(b) => !b && !WRAPPER_FIELDS.contains(&k.as_str()),
            Json::Object(o) => o.is_empty() && k == "proxyMetadata",
            Json::Array(a) => a.is_empty(),
        };
        if !is_default && !is_zero {
            out.insert(k.clone(), v.clone());
        }
    }
    Json::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mesh_yaml_applies_over_defaults_and_merges_proxy_config() {
        let m = MeshConfig::parse(
            "defaultConfig:\n  discoveryAddress: foo:123\n  proxyMetadata: {A: b}\ntrustDomain: x.y\n",
        )
        .unwrap_or_default();
        assert_eq!(m.as_json()["trustDomain"], "x.y");
        assert_eq!(m.default_config()["statusPort"], 15020);
        let m2 = m.apply("defaultConfig:\n  proxyMetadata: {C: d}\n").unwrap_or_default();
        assert_eq!(m2.default_config()["proxyMetadata"], json!({"A": "b", "C": "d"}));
        assert!(MeshConfig::parse("[1]").is_err());
    }

    #[test]
    fn clean_proxy_config_drops_defaults_keeps_wrappers() {
        let m = MeshConfig::default();
        assert_eq!(clean_proxy_config(&m.default_config()), json!({}));
        let pc = merge_proxy_config(
            &m.default_config(),
            "concurrency: 0\nholdApplicationUntilProxyStarts: false\ntracing: {}\n",
        )
        .unwrap_or_default();
        assert_eq!(
            clean_proxy_config(&pc),
            json!({"concurrency": 0, "holdApplicationUntilProxyStarts": false, "tracing": {}})
        );
    }
}
