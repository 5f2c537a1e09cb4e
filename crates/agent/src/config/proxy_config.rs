//! The effective ProxyConfig, as Istio's `pilot-agent/config.ConstructProxyConfig`: Istio's defaults,
//! then the mesh file (`--meshConfig`), then `PROXY_CONFIG`, then the pod annotation
//! `proxy.istio.io/config`. Each overlay replaces the fields it names; objects are merged field by
//! field (so `proxyMetadata` entries add up) and lists are replaced.

use std::collections::BTreeMap;
use std::path::Path;

use model::mesh::{MeshConfig, ProxyConfig};
use serde_json::Value;

use super::ConfigError;
use super::env::{Files, Vars};

/// The pod annotation carrying a ProxyConfig overlay.
pub const PROXY_CONFIG_ANNOTATION: &str = "proxy.istio.io/config";
/// Pod annotations that override single ProxyConfig fields (Istio's `applyAnnotations`).
const DISCOVERY_ADDRESS_ANNOTATION: &str = "sidecar.istio.io/discoveryAddress";
const STATUS_PORT_ANNOTATION: &str = "status.sidecar.istio.io/port";

/// Reads the mesh file (absent: Istio's defaults) and applies the overlays.
pub(crate) fn construct(
    mesh_file: &Path,
    vars: &Vars<'_>,
    files: &dyn Files,
    annotations: &BTreeMap<String, String>,
) -> Result<(MeshConfig, ProxyConfig), ConfigError> {
    let mesh_value = match files.read(mesh_file) {
        Ok(Some(text)) => parse_yaml_or_json(&text).map_err(|reason| ConfigError::MeshConfig {
            path: mesh_file.to_path_buf(),
            reason,
        })?,
        Ok(None) => Value::Null,
        Err(source) => {
            return Err(ConfigError::File {
                path: mesh_file.to_path_buf(),
                source,
            });
        }
    };
    let mesh = MeshConfig::from_value(mesh_value).map_err(|e| ConfigError::MeshConfig {
        path: mesh_file.to_path_buf(),
        reason: e.to_string(),
    })?;

    let mut proxy = serde_json::to_value(&mesh.default_config).map_err(|e| ConfigError::MeshConfig {
        path: mesh_file.to_path_buf(),
        reason: e.to_string(),
    })?;
    if let Some(text) = vars.get("PROXY_CONFIG") {
        apply_overlay(&mut proxy, &text, "PROXY_CONFIG")?;
    }
    if let Some(text) = annotations.get(PROXY_CONFIG_ANNOTATION) {
        apply_overlay(&mut proxy, text, "annotation proxy.istio.io/config")?;
    }
    let mut proxy: ProxyConfig = serde_json::from_value(proxy).map_err(|e| ConfigError::ProxyConfig {
        source_name: "PROXY_CONFIG",
        reason: e.to_string(),
    })?;
    if let Some(addr) = annotations.get(DISCOVERY_ADDRESS_ANNOTATION) {
        proxy.discovery_address = addr.clone();
    }
    if let Some(port) = annotations.get(STATUS_PORT_ANNOTATION) {
        proxy.status_port = port.parse().map_err(|_| ConfigError::ProxyConfig {
            source_name: "annotation status.sidecar.istio.io/port",
            reason: format!("{port:?} is not a port number"),
        })?;
    }
    validate(&proxy)?;
    Ok((mesh, proxy))
}

fn apply_overlay(base: &mut Value, text: &str, source_name: &'static str) -> Result<(), ConfigError> {
    let overlay = parse_yaml_or_json(text).map_err(|reason| ConfigError::ProxyConfig { source_name, reason })?;
    match overlay {
        Value::Null => Ok(()),
        Value::Object(_) => {
            merge(base, overlay);
            // Decode now so the error names the overlay that broke it.
            serde_json::from_value::<ProxyConfig>(base.clone())
                .map(|_| ())
                .map_err(|e| ConfigError::ProxyConfig {
                    source_name,
                    reason: e.to_string(),
                })
        }
        other => Err(ConfigError::ProxyConfig {
            source_name,
            reason: format!("want a ProxyConfig object, got {}", kind(&other)),
        }),
    }
}

/// Merges `overlay` into `base`: objects field by field, anything else replaced.
pub(crate) fn merge(base: &mut Value, overlay: Value) {
    match (base, overlay) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    Some(existing) if existing.is_object() && v.is_object() => merge(existing, v),
                    _ => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (b, o) => *b = o,
    }
}

/// YAML (a superset of JSON); empty text is `null`.
pub(crate) fn parse_yaml_or_json(text: &str) -> Result<Value, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Ok(Value::Null);
    }
    if trimmed.starts_with('{')
        && let Ok(v) = serde_json::from_str(trimmed)
    {
        return Ok(v);
    }
    serde_saphyr::from_str::<Value>(text).map_err(|e| e.to_string())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Istio's `ValidateMeshConfigProxyConfig`, the checks that matter to the agent.
fn validate(pc: &ProxyConfig) -> Result<(), ConfigError> {
    let invalid = |field: &'static str, reason: String| ConfigError::ProxyConfig {
        source_name: "effective ProxyConfig",
        reason: format!("{field}: {reason}"),
    };
    if pc.config_path.is_empty() {
        return Err(invalid("configPath", "must be set".into()));
    }
    if pc.discovery_address.is_empty() {
        return Err(invalid("discoveryAddress", "must be set".into()));
    }
    if !has_port(&pc.discovery_address) {
        return Err(invalid(
            "discoveryAddress",
            format!("{:?} is not host:port", pc.discovery_address),
        ));
    }
    for (field, d) in [
        ("drainDuration", &pc.drain_duration),
        ("terminationDrainDuration", &pc.termination_drain_duration),
    ] {
        if model::duration::parse(d).is_none() {
            return Err(invalid(field, format!("{d:?} is not a duration")));
        }
    }
    if pc.proxy_admin_port == 0 {
        return Err(invalid("proxyAdminPort", "must not be 0".into()));
    }
    if pc.status_port != 0 && pc.status_port == pc.proxy_admin_port {
        return Err(invalid(
            "statusPort",
            format!("{} is also proxyAdminPort", pc.status_port),
        ));
    }
    Ok(())
}

/// `host:port` or `[v6]:port` with a numeric port.
pub(crate) fn has_port(addr: &str) -> bool {
    addr.rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    const MESH: &str = "./etc/istio/config/mesh";

    fn run(mesh: Option<&str>, env: &[(&str, &str)]) -> Result<(MeshConfig, ProxyConfig), ConfigError> {
        let env: BTreeMap<String, String> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let mut files = BTreeMap::<PathBuf, String>::new();
        if let Some(m) = mesh {
            files.insert(PathBuf::from(MESH), m.to_owned());
        }
        construct(Path::new(MESH), &Vars::new(&env), &files, &BTreeMap::new())
    }

    #[test]
    fn no_mesh_file_gives_istio_defaults() {
        let (mesh, pc) = run(None, &[]).unwrap();
        assert_eq!(mesh, MeshConfig::default());
        assert_eq!(pc, ProxyConfig::default());
    }

    #[test]
    fn proxy_config_env_overrides_the_mesh_default_config() {
        let mesh = "defaultConfig:\n  discoveryAddress: pilot:15010\n  proxyAdminPort: 15001\n  \
                    proxyMetadata:\n    A: mesh\n    B: mesh\n";
        let env = [(
            "PROXY_CONFIG",
            r#"{"proxyAdminPort": 15002, "proxyMetadata": {"B": "env"}, "extraStatTags": ["x"]}"#,
        )];
        let (mesh, pc) = run(Some(mesh), &env).unwrap();
        assert_eq!(mesh.default_config.proxy_admin_port, 15001);
        assert_eq!(pc.proxy_admin_port, 15002);
        assert_eq!(pc.discovery_address, "pilot:15010");
        assert_eq!(pc.proxy_metadata.get("A").map(String::as_str), Some("mesh"));
        assert_eq!(pc.proxy_metadata.get("B").map(String::as_str), Some("env"));
        assert_eq!(pc.extra_stat_tags, vec!["x".to_string()]);
        assert_eq!(pc.drain_duration, "45s");
    }

    #[test]
    fn proxy_config_env_may_be_yaml() {
        let (_, pc) = run(None, &[("PROXY_CONFIG", "concurrency: 2\nstatusPort: 15030\n")]).unwrap();
        assert_eq!(pc.concurrency, Some(2));
        assert_eq!(pc.status_port, 15030);
    }

    #[test]
    fn bad_inputs_name_their_source() {
        let err = run(None, &[("PROXY_CONFIG", "{proxyAdminPort: [")])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("PROXY_CONFIG"), "{err}");
        let err = run(None, &[("PROXY_CONFIG", r#"{"proxyAdminPort": "x"}"#)])
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("PROXY_CONFIG") && err.contains("invalid"), "{err}");
        let err = run(None, &[("PROXY_CONFIG", "- a\n- b\n")]).unwrap_err().to_string();
        assert!(err.contains("want a ProxyConfig object, got a list"), "{err}");
        let err = run(Some("defaultConfig:\n  drainDuration: soon\n"), &[])
            .unwrap_err()
            .to_string();
        assert!(err.contains(MESH) && err.contains("drainDuration"), "{err}");
        let err = run(None, &[("PROXY_CONFIG", r#"{"discoveryAddress": "nohost"}"#)])
            .unwrap_err()
            .to_string();
        assert!(err.contains("discoveryAddress") && err.contains("host:port"), "{err}");
    }

    #[test]
    fn annotations_apply_after_the_env() {
        let env: BTreeMap<String, String> = [("PROXY_CONFIG".to_string(), "{statusPort: 15030}".to_string())].into();
        let annotations: BTreeMap<String, String> = [
            (PROXY_CONFIG_ANNOTATION.to_string(), "drainDuration: 3s".to_string()),
            (DISCOVERY_ADDRESS_ANNOTATION.to_string(), "other:15010".to_string()),
        ]
        .into();
        let files = BTreeMap::<PathBuf, String>::new();
        let (_, pc) = construct(Path::new(MESH), &Vars::new(&env), &files, &annotations).unwrap();
        assert_eq!(pc.status_port, 15030);
        assert_eq!(pc.drain_duration, "3s");
        assert_eq!(pc.discovery_address, "other:15010");
    }

    #[test]
    fn merge_replaces_lists_and_merges_objects() {
        let mut base = serde_json::json!({"a": {"x": 1, "y": 2}, "l": [1, 2], "s": "k"});
        merge(&mut base, serde_json::json!({"a": {"y": 3}, "l": [9], "n": null}));
        assert_eq!(
            base,
            serde_json::json!({"a": {"x": 1, "y": 3}, "l": [9], "s": "k", "n": null})
        );
    }
}
