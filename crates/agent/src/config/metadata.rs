//! Envoy's node metadata, as Istio's `bootstrap.GetNodeMetaData`: `ISTIO_META_*` variables (and
//! `ISTIO_META_*` keys of `proxyMetadata`) pass through by name, `ISTIO_METAJSON_*` objects merge
//! in, and the agent's typed fields (`NAMESPACE`, `LABELS`, `INSTANCE_IPS`, `PROXY_CONFIG`, ...) win
//! over anything passed through. Also the Kubernetes downward-API files and the node's locality and
//! service cluster.

use std::collections::BTreeMap;
use std::net::IpAddr;

use model::mesh::ProxyConfig;
use serde_json::{Map, Value};

use super::ConfigError;
use super::env::Vars;

/// The Kubernetes label Istio reads a locality from (`region.zone.subzone` or with `/`).
pub(super) const LOCALITY_LABEL: &str = "topology.istio.io/locality";
/// Istio's legacy locality label; the agent writes the sanitized locality back under it.
pub(super) const LEGACY_LOCALITY_LABEL: &str = "istio-locality";
/// A label Kubernetes adds to every pod of a Deployment; Istio leaves it out of `LABELS`.
const POD_TEMPLATE_HASH: &str = "pod-template-hash";

/// `ISTIO_META_*` and `ISTIO_METAJSON_*`, before the typed fields are laid over them.
pub(crate) fn raw_metadata(vars: &Vars<'_>, proxy: &ProxyConfig) -> Result<Map<String, Value>, ConfigError> {
    let mut raw = Map::new();
    for (k, v) in &proxy.proxy_metadata {
        if let Some(key) = k.strip_prefix("ISTIO_META_").filter(|k| !k.is_empty()) {
            raw.insert(key.to_owned(), Value::String(v.clone()));
        }
    }
    for (key, v) in vars.with_prefix("ISTIO_META_") {
        raw.insert(key, Value::String(v));
    }
    for (key, v) in vars.with_prefix("ISTIO_METAJSON_") {
        let var = format!("ISTIO_METAJSON_{key}");
        let parsed: Map<String, Value> = serde_json::from_str(&v).map_err(|e| ConfigError::Env {
            var: var.clone(),
            value: v.clone(),
            reason: format!("not a JSON object: {e}"),
        })?;
        raw.extend(parsed);
    }
    if let Some(addr) = vars.get("DNS_PROXY_ADDR") {
        raw.insert("DNS_PROXY_ADDR".into(), Value::String(addr));
    }
    Ok(raw)
}

/// `ISTIO_METAJSON_LABELS`: the workload's labels when no pod labels file exists.
pub(crate) fn labels_from_env(vars: &Vars<'_>) -> Result<BTreeMap<String, String>, ConfigError> {
    let Some(v) = vars.get("ISTIO_METAJSON_LABELS") else {
        return Ok(BTreeMap::new());
    };
    serde_json::from_str(&v).map_err(|e| ConfigError::Env {
        var: "ISTIO_METAJSON_LABELS".into(),
        value: v.clone(),
        reason: format!("not a JSON object of strings: {e}"),
    })
}

/// Laid over the env labels: the pod labels file wins, `pod-template-hash` is dropped.
pub(crate) fn merge_labels(
    static_labels: &BTreeMap<String, String>,
    pod_labels: Option<BTreeMap<String, String>>,
) -> BTreeMap<String, String> {
    let mut labels = static_labels.clone();
    for (k, v) in pod_labels.unwrap_or_default() {
        if k != POD_TEMPLATE_HASH {
            labels.insert(k, v);
        }
    }
    labels
}

/// Parses a downward-API file: `key="value"` lines, the value a Go-quoted string.
pub fn parse_downward_api(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let Some((key, quoted)) = line.split_once('=') else {
            continue;
        };
        let value = unquote(quoted).ok_or_else(|| format!("line {}: {quoted} is not a quoted string", n + 1))?;
        out.insert(key.to_owned(), value);
    }
    Ok(out)
}

/// Go's `strconv.Unquote` for double-quoted strings with the escapes Kubernetes writes.
fn unquote(s: &str) -> Option<String> {
    let inner = s.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return None,
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                'r' => out.push('\r'),
                '\\' => out.push('\\'),
                '"' => out.push('"'),
                '\'' => out.push('\''),
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
                }
                'x' => {
                    let hex: String = chars.by_ref().take(2).collect();
                    out.push(char::from(u8::from_str_radix(&hex, 16).ok()?));
                }
                _ => return None,
            },
            c => out.push(c),
        }
    }
    Some(out)
}

/// The node's locality from its labels (`topology.istio.io/locality`, then `istio-locality`),
/// with Kubernetes' `.` separators turned into `/`. Writes the result back as `istio-locality`.
pub(crate) fn locality(labels: &mut BTreeMap<String, String>) -> model::Locality {
    let label = labels
        .get(LOCALITY_LABEL)
        .or_else(|| labels.get(LEGACY_LOCALITY_LABEL))
        .cloned()
        .unwrap_or_default();
    if label.is_empty() {
        return model::Locality::default();
    }
    let sanitized = if label.contains('/') {
        label
    } else {
        label.replace('.', "/")
    };
    labels.insert(LEGACY_LOCALITY_LABEL.into(), sanitized.clone());
    model::Locality::parse(&sanitized)
}

/// Envoy's `node.cluster`, as Istio's `getServiceCluster`: the configured service cluster unless it
/// is the default `istio-proxy`, else `<app>.<namespace>`, `<workload>.<namespace>`,
/// `istio-proxy.<namespace>`. `tracingServiceName` picks the canonical service name instead.
pub(crate) fn service_cluster(
    proxy: &ProxyConfig,
    labels: &BTreeMap<String, String>,
    workload_name: &str,
    namespace: &str,
) -> String {
    let configured = proxy.service_cluster.as_str();
    let tracing_name = proxy.extra.get("tracingServiceName").and_then(Value::as_str);
    let canonical = || {
        ["service.istio.io/canonical-name", "app.kubernetes.io/name", "app"]
            .iter()
            .find_map(|k| labels.get(*k).cloned())
            .unwrap_or_else(|| {
                if workload_name.is_empty() {
                    "istio-proxy".into()
                } else {
                    workload_name.to_owned()
                }
            })
    };
    let name = match tracing_name {
        Some("CANONICAL_NAME_ONLY") if configured.is_empty() || configured == "istio-proxy" => canonical(),
        Some("CANONICAL_NAME_AND_NAMESPACE") if configured.is_empty() || configured == "istio-proxy" => {
            let cs = canonical();
            if !namespace.is_empty() {
                return format!("{cs}.{namespace}");
            }
            cs
        }
        _ => configured.to_owned(),
    };
    if !name.is_empty() && name != "istio-proxy" {
        return name;
    }
    let app = ["app", "app.kubernetes.io/name", "service.istio.io/canonical-name"]
        .iter()
        .find_map(|k| labels.get(*k));
    match app {
        Some(app) => format!("{app}.{namespace}"),
        None if !workload_name.is_empty() => format!("{workload_name}.{namespace}"),
        None if !namespace.is_empty() => format!("istio-proxy.{namespace}"),
        None => "istio-proxy".into(),
    }
}

/// Istio's `GetPilotSan`: the host of the discovery address (`localhost` → istiod's name).
pub(crate) fn pilot_san(discovery_address: &str) -> String {
    let host = discovery_address.split(':').next().unwrap_or_default();
    if host == "localhost" {
        "istiod.istio-system.svc".into()
    } else {
        host.to_owned()
    }
}

/// The typed fields the agent owns, each of which wins over a passed-through key of the same name.
pub(crate) struct TypedMetadata<'a> {
    pub namespace: &'a str,
    pub pod_name: &'a str,
    pub service_account: &'a str,
    pub labels: &'a BTreeMap<String, String>,
    pub static_labels: &'a BTreeMap<String, String>,
    pub annotations: &'a BTreeMap<String, String>,
    pub instance_ips: &'a [IpAddr],
    pub proxy_config: &'a ProxyConfig,
    pub pilot_san: &'a [String],
    pub outlier_log_path: Option<&'a str>,
    pub envoy_status_port: u16,
    pub envoy_prometheus_port: u16,
    pub sts_port: u16,
    pub exit_on_zero_active_connections: bool,
    pub workload_identity_socket_file: &'a str,
}

impl TypedMetadata<'_> {
    /// The node metadata JSON: typed fields (empty ones left out, as Go's `omitempty`), then every
    /// passed-through key the typed fields do not set.
    pub(crate) fn into_json(self, raw: Map<String, Value>) -> Value {
        let mut md = Map::new();
        let mut put = |k: &str, v: Value| {
            let empty = match &v {
                Value::Null => true,
                Value::String(s) => s.is_empty(),
                Value::Array(a) => a.is_empty(),
                Value::Object(o) => o.is_empty(),
                Value::Number(n) => n.as_u64() == Some(0),
                Value::Bool(_) => false,
            };
            if !empty {
                md.insert(k.to_owned(), v);
            }
        };
        put("NAMESPACE", self.namespace.into());
        put("NAME", self.pod_name.into());
        put("SERVICE_ACCOUNT", self.service_account.into());
        put("LABELS", to_json(self.labels));
        put("STATIC_LABELS", to_json(self.static_labels));
        put("ANNOTATIONS", to_json(self.annotations));
        let ips: Vec<String> = self.instance_ips.iter().map(IpAddr::to_string).collect();
        put("INSTANCE_IPS", ips.join(",").into());
        put("PROXY_CONFIG", proxy_config_json(self.proxy_config));
        put("PILOT_SAN", to_json(self.pilot_san));
        put("OUTLIER_LOG_PATH", self.outlier_log_path.unwrap_or_default().into());
        put("ENVOY_STATUS_PORT", self.envoy_status_port.into());
        put("ENVOY_PROMETHEUS_PORT", self.envoy_prometheus_port.into());
        if self.sts_port != 0 {
            put("STS_PORT", self.sts_port.to_string().into());
        }
        if self.exit_on_zero_active_connections {
            put("EXIT_ON_ZERO_ACTIVE_CONNECTIONS", "true".into());
        }
        put(
            "WORKLOAD_IDENTITY_SOCKET_FILE",
            self.workload_identity_socket_file.into(),
        );
        let istio_version = raw
            .get("ISTIO_VERSION")
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .unwrap_or(env!("CARGO_PKG_VERSION"))
            .to_owned();
        put("ISTIO_VERSION", istio_version.into());
        // Istio turns metadata discovery on only with ambient (HBONE); it is an Istio-proxy filter.
        let hbone = raw.get("ENABLE_HBONE").and_then(Value::as_str) == Some("true");
        put("METADATA_DISCOVERY", (if hbone { "true" } else { "false" }).into());
        for (k, v) in raw {
            md.entry(k).or_insert(v);
        }
        Value::Object(md)
    }
}

fn to_json<T: serde::Serialize + ?Sized>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// The effective ProxyConfig as Istio's protobuf JSON writes it: unset and empty fields left out.
pub fn proxy_config_json(pc: &ProxyConfig) -> Value {
    fn prune(v: Value) -> Option<Value> {
        match v {
            Value::Null => None,
            Value::String(s) if s.is_empty() => None,
            Value::Array(a) if a.is_empty() => None,
            Value::Object(o) => {
                let o: Map<String, Value> = o.into_iter().filter_map(|(k, v)| Some((k, prune(v)?))).collect();
                (!o.is_empty()).then_some(Value::Object(o))
            }
            v => Some(v),
        }
    }
    prune(to_json(pc)).unwrap_or_else(|| Value::Object(Map::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn downward_api_file_is_parsed() {
        let text = "app=\"reviews\"\nversion=\"v1\"\nnote=\"a \\\"q\\\" \\u00e9\"\n\nbroken line\n";
        let parsed = parse_downward_api(text).unwrap();
        assert_eq!(
            parsed,
            labels(&[("app", "reviews"), ("version", "v1"), ("note", "a \"q\" é")])
        );
        let err = parse_downward_api("app=reviews\n").unwrap_err();
        assert!(err.contains("line 1"), "{err}");
    }

    #[test]
    fn pod_labels_win_and_pod_template_hash_is_dropped() {
        let merged = merge_labels(
            &labels(&[("app", "env"), ("team", "a")]),
            Some(labels(&[("app", "file"), (POD_TEMPLATE_HASH, "abc")])),
        );
        assert_eq!(merged, labels(&[("app", "file"), ("team", "a")]));
    }

    #[test]
    fn locality_from_labels() {
        let mut l = labels(&[(LOCALITY_LABEL, "us-east.zone1.rack2")]);
        let loc = locality(&mut l);
        assert_eq!(
            (loc.region.as_str(), loc.zone.as_str(), loc.subzone.as_str()),
            ("us-east", "zone1", "rack2")
        );
        assert_eq!(l[LEGACY_LOCALITY_LABEL], "us-east/zone1/rack2");
        let mut none = labels(&[]);
        assert_eq!(locality(&mut none), model::Locality::default());
        assert!(none.is_empty());
    }

    #[test]
    fn service_cluster_follows_istio() {
        let pc = ProxyConfig::default();
        let app = labels(&[("app", "reviews")]);
        assert_eq!(service_cluster(&pc, &app, "", "ns"), "reviews.ns");
        assert_eq!(service_cluster(&pc, &labels(&[]), "wl", "ns"), "wl.ns");
        assert_eq!(service_cluster(&pc, &labels(&[]), "", "ns"), "istio-proxy.ns");
        assert_eq!(service_cluster(&pc, &labels(&[]), "", ""), "istio-proxy");
        let named = ProxyConfig {
            service_cluster: "custom".into(),
            ..ProxyConfig::default()
        };
        assert_eq!(service_cluster(&named, &app, "", "ns"), "custom");
        let mut canonical = ProxyConfig::default();
        canonical
            .extra
            .insert("tracingServiceName".into(), "CANONICAL_NAME_AND_NAMESPACE".into());
        let cs = labels(&[("app", "a"), ("service.istio.io/canonical-name", "cs")]);
        assert_eq!(service_cluster(&canonical, &cs, "", "ns"), "cs.ns");
    }

    #[test]
    fn pilot_san_is_the_discovery_host() {
        assert_eq!(pilot_san("istiod.istio-system.svc:15012"), "istiod.istio-system.svc");
        assert_eq!(pilot_san("localhost:15012"), "istiod.istio-system.svc");
    }

    #[test]
    fn proxy_config_json_leaves_out_empty_fields() {
        let v = proxy_config_json(&ProxyConfig::default());
        assert_eq!(v["proxyAdminPort"], 15000);
        assert_eq!(v["configPath"], "./etc/istio/proxy");
        assert!(v.get("customConfigFile").is_none());
        assert!(v.get("concurrency").is_none());
        assert!(v.get("proxyMetadata").is_none());
    }
}
