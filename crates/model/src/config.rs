//! Typed Istio config: the kinds pilot-discovery understands, their metadata, and the decode +
//! validate step that turns one YAML/JSON document into a `Config` or an error naming it.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

use crate::networking::{DestinationRule, Gateway, ServiceEntry, Sidecar, VirtualService, WorkloadEntry};

/// Config kinds: Istio's (those in `SUPPORTED` are served; the others are kept and reported as not
/// yet supported), and core Kubernetes kinds read as manifests or watched.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum ConfigKind {
    VirtualService,
    DestinationRule,
    Gateway,
    ServiceEntry,
    WorkloadEntry,
    Sidecar,
    EnvoyFilter,
    WorkloadGroup,
    ProxyConfig,
    PeerAuthentication,
    AuthorizationPolicy,
    RequestAuthentication,
    Telemetry,
    WasmPlugin,
    TrafficExtension,
    // Core Kubernetes kinds, read from --configDir manifests by the Kubernetes registry.
    Service,
    Endpoints,
    EndpointSlice,
    Pod,
    Node,
    Namespace,
    /// A Kubernetes Secret: gateway credentials (`credentialName`), served over SDS.
    Secret,
    /// networking.k8s.io/v1 Ingress and IngressClass: converted to Gateways and VirtualServices
    /// (the `ingress` crate, Istio's `pilot/pkg/config/kube/ingress`).
    Ingress,
    IngressClass,
}

impl ConfigKind {
    pub const SUPPORTED: [ConfigKind; 10] = [
        ConfigKind::VirtualService,
        ConfigKind::DestinationRule,
        ConfigKind::Gateway,
        ConfigKind::ServiceEntry,
        ConfigKind::WorkloadEntry,
        ConfigKind::Sidecar,
        ConfigKind::PeerAuthentication,
        ConfigKind::AuthorizationPolicy,
        ConfigKind::RequestAuthentication,
        ConfigKind::Secret,
    ];

    /// Looks a kind up by its API group, version and kind, as Istio's schema collections.
    pub fn from_gvk(group: &str, version: &str, kind: &str) -> Option<ConfigKind> {
        match (group, version, kind) {
            ("", "v1", "Service") => return Some(ConfigKind::Service),
            ("", "v1", "Endpoints") => return Some(ConfigKind::Endpoints),
            ("", "v1", "Pod") => return Some(ConfigKind::Pod),
            ("", "v1", "Node") => return Some(ConfigKind::Node),
            ("", "v1", "Namespace") => return Some(ConfigKind::Namespace),
            ("", "v1", "Secret") => return Some(ConfigKind::Secret),
            ("discovery.k8s.io", "v1", "EndpointSlice") => return Some(ConfigKind::EndpointSlice),
            ("networking.k8s.io", "v1", "Ingress") => return Some(ConfigKind::Ingress),
            ("networking.k8s.io", "v1", "IngressClass") => return Some(ConfigKind::IngressClass),
            _ => {}
        }
        let networking = ["v1", "v1beta1", "v1alpha3"];
        let k = match (group, kind) {
            ("networking.istio.io", "VirtualService") => ConfigKind::VirtualService,
            ("networking.istio.io", "DestinationRule") => ConfigKind::DestinationRule,
            ("networking.istio.io", "Gateway") => ConfigKind::Gateway,
            ("networking.istio.io", "ServiceEntry") => ConfigKind::ServiceEntry,
            ("networking.istio.io", "WorkloadEntry") => ConfigKind::WorkloadEntry,
            ("networking.istio.io", "Sidecar") => ConfigKind::Sidecar,
            ("networking.istio.io", "EnvoyFilter") => {
                return (version == "v1alpha3").then_some(ConfigKind::EnvoyFilter);
            }
            ("networking.istio.io", "WorkloadGroup") => ConfigKind::WorkloadGroup,
            ("networking.istio.io", "ProxyConfig") => return (version == "v1beta1").then_some(ConfigKind::ProxyConfig),
            ("security.istio.io", "PeerAuthentication") => return security(version, ConfigKind::PeerAuthentication),
            ("security.istio.io", "AuthorizationPolicy") => return security(version, ConfigKind::AuthorizationPolicy),
            ("security.istio.io", "RequestAuthentication") => {
                return security(version, ConfigKind::RequestAuthentication);
            }
            ("telemetry.istio.io", "Telemetry") => {
                return matches!(version, "v1" | "v1alpha1").then_some(ConfigKind::Telemetry);
            }
            ("extensions.istio.io", "WasmPlugin") => {
                return matches!(version, "v1alpha1").then_some(ConfigKind::WasmPlugin);
            }
            ("extensions.istio.io", "TrafficExtension") => {
                return matches!(version, "v1alpha1").then_some(ConfigKind::TrafficExtension);
            }
            _ => return None,
        };
        networking.contains(&version).then_some(k)
    }

    pub fn is_supported(&self) -> bool {
        Self::SUPPORTED.contains(self) || self.is_kubernetes()
    }

    /// A core Kubernetes kind (Service, Endpoints, EndpointSlice, Pod, Node, Namespace, Ingress,
    /// IngressClass), kept whole for the Kubernetes registry or the Ingress conversion rather than
    /// the push index.
    pub fn is_kubernetes(&self) -> bool {
        matches!(
            self,
            ConfigKind::Service
                | ConfigKind::Endpoints
                | ConfigKind::EndpointSlice
                | ConfigKind::Pod
                | ConfigKind::Node
                | ConfigKind::Namespace
                | ConfigKind::Ingress
                | ConfigKind::IngressClass
        )
    }

    /// Kinds without a namespace.
    pub fn is_cluster_scoped(&self) -> bool {
        matches!(
            self,
            ConfigKind::Node | ConfigKind::Namespace | ConfigKind::IngressClass
        )
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            ConfigKind::VirtualService => "VirtualService",
            ConfigKind::DestinationRule => "DestinationRule",
            ConfigKind::Gateway => "Gateway",
            ConfigKind::ServiceEntry => "ServiceEntry",
            ConfigKind::WorkloadEntry => "WorkloadEntry",
            ConfigKind::Sidecar => "Sidecar",
            ConfigKind::EnvoyFilter => "EnvoyFilter",
            ConfigKind::WorkloadGroup => "WorkloadGroup",
            ConfigKind::ProxyConfig => "ProxyConfig",
            ConfigKind::PeerAuthentication => "PeerAuthentication",
            ConfigKind::AuthorizationPolicy => "AuthorizationPolicy",
            ConfigKind::RequestAuthentication => "RequestAuthentication",
            ConfigKind::Telemetry => "Telemetry",
            ConfigKind::WasmPlugin => "WasmPlugin",
            ConfigKind::TrafficExtension => "TrafficExtension",
            ConfigKind::Service => "Service",
            ConfigKind::Endpoints => "Endpoints",
            ConfigKind::EndpointSlice => "EndpointSlice",
            ConfigKind::Pod => "Pod",
            ConfigKind::Node => "Node",
            ConfigKind::Namespace => "Namespace",
            ConfigKind::Secret => "Secret",
            ConfigKind::Ingress => "Ingress",
            ConfigKind::IngressClass => "IngressClass",
        }
    }
}

fn security(version: &str, k: ConfigKind) -> Option<ConfigKind> {
    matches!(version, "v1" | "v1beta1").then_some(k)
}

impl fmt::Display for ConfigKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Identifies one config resource.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct ConfigKey {
    pub kind: ConfigKind,
    pub namespace: String,
    pub name: String,
}

impl fmt::Display for ConfigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}/{}", self.kind, self.namespace, self.name)
    }
}

/// Kubernetes-style metadata of a config resource.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ConfigMeta {
    pub name: String,
    pub namespace: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub resource_version: Option<String>,
    /// `metadata.creationTimestamp` as seconds and nanoseconds since the Unix epoch: the older of
    /// two conflicting configs wins, as Istio orders them (`None`: Go's zero time, first).
    #[serde(skip_serializing)]
    pub creation_time: Option<(i64, u32)>,
    pub generation: i64,
    /// `apiVersion` as written (e.g. `networking.istio.io/v1beta1`).
    pub api_version: String,
}

/// A typed spec. Configs live behind `Arc`, so the size difference between variants is harmless.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[serde(untagged)]
pub enum ConfigSpec {
    VirtualService(VirtualService),
    DestinationRule(DestinationRule),
    Gateway(Gateway),
    ServiceEntry(ServiceEntry),
    WorkloadEntry(WorkloadEntry),
    Sidecar(Sidecar),
    PeerAuthentication(crate::security::PeerAuthentication),
    AuthorizationPolicy(crate::security::AuthorizationPolicy),
    RequestAuthentication(crate::security::RequestAuthentication),
    /// An Istio kind that is kept but not yet acted on.
    Unsupported(Value),
    /// A core Kubernetes object, whole (metadata, spec, status, EndpointSlice endpoints, ...).
    Kubernetes(Value),
}

/// One config resource.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Config {
    pub kind: ConfigKind,
    pub meta: ConfigMeta,
    pub spec: ConfigSpec,
}

/// Istio's `constants.InternalRouteSemantics` annotation: a VirtualService made from a Kubernetes
/// Ingress carries it with [`ROUTE_SEMANTICS_INGRESS`].
pub const INTERNAL_ROUTE_SEMANTICS: &str = "internal.istio.io/route-semantics";
pub const ROUTE_SEMANTICS_INGRESS: &str = "ingress";

impl Config {
    pub fn key(&self) -> ConfigKey {
        ConfigKey {
            kind: self.kind,
            namespace: self.meta.namespace.clone(),
            name: self.meta.name.clone(),
        }
    }

    /// Istio's `UseIngressSemantics`: a VirtualService made from a Kubernetes Ingress, whose
    /// prefix matches are path-separated (`/foo` matches `/foo` and `/foo/bar`, not `/foobar`).
    pub fn uses_ingress_semantics(&self) -> bool {
        self.meta.annotations.get(INTERNAL_ROUTE_SEMANTICS).map(String::as_str) == Some(ROUTE_SEMANTICS_INGRESS)
    }
}

/// Why a document did not become a `Config`. Every variant names the resource as far as known.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum ConfigError {
    #[error("document is not an object with apiVersion and kind")]
    NotAResource,
    #[error("unknown kind {kind:?} (apiVersion {api_version:?}): skipped")]
    UnknownKind { api_version: String, kind: String },
    #[error("{kind} {namespace}/{name}: invalid metadata: {reason}")]
    Metadata {
        kind: String,
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("{key}: {reason}")]
    Decode { key: ConfigKey, reason: String },
    #[error("{key}: {}", errors.join("; "))]
    Invalid { key: ConfigKey, errors: Vec<String> },
}

impl ConfigError {
    /// The resource the error is about, if it got that far.
    pub fn key(&self) -> Option<&ConfigKey> {
        match self {
            ConfigError::Decode { key, .. } | ConfigError::Invalid { key, .. } => Some(key),
            _ => None,
        }
    }
}

/// Turns one decoded document into a typed, validated `Config`.
/// `default_namespace` applies when metadata has no namespace (Istio's file source uses `default`).
pub fn parse_config(doc: Value, default_namespace: &str) -> Result<Config, ConfigError> {
    let Value::Object(mut obj) = doc else {
        return Err(ConfigError::NotAResource);
    };
    let api_version = obj
        .get("apiVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let kind_name = obj.get("kind").and_then(Value::as_str).unwrap_or_default().to_owned();
    if api_version.is_empty() || kind_name.is_empty() {
        return Err(ConfigError::NotAResource);
    }
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version.as_str()));
    let Some(kind) = ConfigKind::from_gvk(group, version, &kind_name) else {
        return Err(ConfigError::UnknownKind {
            api_version,
            kind: kind_name,
        });
    };
    let mut meta = parse_meta(kind, obj.get("metadata").cloned(), default_namespace, &api_version)?;
    if kind.is_kubernetes() {
        // Kept whole for the Kubernetes registry, with the namespace the file gave it.
        if kind.is_cluster_scoped() {
            meta.namespace.clear();
        }
        let md = obj
            .entry("metadata")
            .or_insert_with(|| Value::Object(Default::default()));
        if let Value::Object(md) = md {
            md.remove("namespace");
            if !meta.namespace.is_empty() {
                md.insert("namespace".into(), Value::String(meta.namespace.clone()));
            }
        }
        return Ok(Config {
            kind,
            meta,
            spec: ConfigSpec::Kubernetes(Value::Object(obj)),
        });
    }
    obj.remove("metadata");
    if kind == ConfigKind::Secret {
        // No `spec`: its `type`, `data` and `stringData`, kept for the SDS generator (and never
        // shown in /debug/configz, which leaves Kubernetes objects out).
        return Ok(Config {
            kind,
            meta,
            spec: ConfigSpec::Kubernetes(Value::Object(obj)),
        });
    }
    let key = ConfigKey {
        kind,
        namespace: meta.namespace.clone(),
        name: meta.name.clone(),
    };
    let spec_value = obj.remove("spec").unwrap_or(Value::Object(Default::default()));
    let spec = decode_spec(kind, spec_value).map_err(|reason| ConfigError::Decode {
        key: key.clone(),
        reason,
    })?;
    let config = Config { kind, meta, spec };
    let errors = crate::validation::validate(&config);
    if !errors.is_empty() {
        return Err(ConfigError::Invalid { key, errors });
    }
    Ok(config)
}

fn decode_spec(kind: ConfigKind, v: Value) -> Result<ConfigSpec, String> {
    fn de<T: serde::de::DeserializeOwned>(v: Value) -> Result<T, String> {
        serde_json::from_value(v).map_err(|e| format!("spec: {e}"))
    }
    Ok(match kind {
        ConfigKind::VirtualService => ConfigSpec::VirtualService(de(v)?),
        ConfigKind::DestinationRule => ConfigSpec::DestinationRule(de(v)?),
        ConfigKind::Gateway => ConfigSpec::Gateway(de(v)?),
        ConfigKind::ServiceEntry => ConfigSpec::ServiceEntry(de(v)?),
        ConfigKind::WorkloadEntry => ConfigSpec::WorkloadEntry(de(v)?),
        ConfigKind::Sidecar => ConfigSpec::Sidecar(de(v)?),
        ConfigKind::PeerAuthentication => ConfigSpec::PeerAuthentication(de(v)?),
        ConfigKind::AuthorizationPolicy => ConfigSpec::AuthorizationPolicy(de(v)?),
        ConfigKind::RequestAuthentication => ConfigSpec::RequestAuthentication(de(v)?),
        _ => ConfigSpec::Unsupported(v),
    })
}

fn parse_meta(
    kind: ConfigKind,
    v: Option<Value>,
    default_ns: &str,
    api_version: &str,
) -> Result<ConfigMeta, ConfigError> {
    let obj = match v {
        Some(Value::Object(o)) => o,
        _ => {
            return Err(ConfigError::Metadata {
                kind: kind.to_string(),
                namespace: default_ns.to_owned(),
                name: String::new(),
                reason: "metadata is missing".into(),
            });
        }
    };
    let name = obj.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
    let namespace = obj
        .get("namespace")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or(default_ns)
        .to_owned();
    let err = |reason: String| ConfigError::Metadata {
        kind: kind.to_string(),
        namespace: namespace.clone(),
        name: name.clone(),
        reason,
    };
    if name.is_empty() {
        return Err(err("metadata.name is required".into()));
    }
    if !crate::validation::is_dns1123_label(&namespace) {
        return Err(err(format!("namespace {namespace:?} is not a valid DNS-1123 label")));
    }
    if !crate::validation::is_dns1123_subdomain(&name) {
        return Err(err(format!("name {name:?} is not a valid DNS-1123 subdomain")));
    }
    let string_map = |field: &str| -> Result<BTreeMap<String, String>, ConfigError> {
        match obj.get(field) {
            None | Some(Value::Null) => Ok(BTreeMap::new()),
            Some(Value::Object(m)) => m
                .iter()
                .map(|(k, v)| match v {
                    Value::String(s) => Ok((k.clone(), s.clone())),
                    other => Err(err(format!("metadata.{field}.{k} must be a string, got {other}"))),
                })
                .collect(),
            Some(other) => Err(err(format!("metadata.{field} must be a map, got {other}"))),
        }
    };
    let creation_time = match obj.get("creationTimestamp") {
        None | Some(Value::Null) => None,
        Some(Value::String(t)) => Some(
            crate::duration::parse_rfc3339(t)
                .ok_or_else(|| err(format!("metadata.creationTimestamp {t:?} is not an RFC 3339 time")))?,
        ),
        Some(other) => return Err(err(format!("metadata.creationTimestamp must be a string, got {other}"))),
    };
    Ok(ConfigMeta {
        labels: string_map("labels")?,
        creation_time,
        annotations: string_map("annotations")?,
        resource_version: obj.get("resourceVersion").and_then(Value::as_str).map(str::to_owned),
        generation: obj.get("generation").and_then(Value::as_i64).unwrap_or(0),
        api_version: api_version.to_owned(),
        name,
        namespace,
    })
}
