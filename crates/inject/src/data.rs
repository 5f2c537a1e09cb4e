//! The data a template runs on, Istio's `SidecarTemplateData`: Go field names on top
//! (`.ObjectMeta`, `.Spec`, `.ProxyConfig`, `.Values`, ...), each struct readable by Go field
//! name and writable (`toJSON`, `toYaml`) with the API's JSON names (see `template::value`).

use std::collections::BTreeMap;

use serde_json::{Value as Json, json};

use crate::meta::DeployMeta;
use crate::template::value::{Kind, Value};

/// Everything `SidecarTemplateData` holds.
pub(crate) struct TemplateInput<'a> {
    pub(crate) deploy: &'a DeployMeta,
    pub(crate) pod: &'a Json,
    pub(crate) proxy_config: &'a Json,
    pub(crate) mesh: &'a Json,
    pub(crate) values: &'a Json,
    pub(crate) revision: &'a str,
    pub(crate) native_sidecars: bool,
    pub(crate) proxy_image: String,
    pub(crate) proxy_init_image: String,
    pub(crate) proxy_uid: i64,
    pub(crate) proxy_gid: i64,
    pub(crate) inbound_traffic_policy_mode: &'a str,
    pub(crate) compliance_policy: &'a str,
}

pub(crate) fn template_data(i: &TemplateInput<'_>) -> Value {
    let mut top = BTreeMap::new();
    let mut put = |k: &str, v: Value| {
        top.insert(k.to_string(), v);
    };
    put(
        "TypeMeta",
        Value::structure(
            Kind::Kube,
            json!({"apiVersion": i.deploy.api_version, "kind": i.deploy.kind}),
        ),
    );
    put(
        "DeploymentMeta",
        Value::structure(
            Kind::Kube,
            json!({"name": i.deploy.name, "namespace": i.deploy.namespace}),
        ),
    );
    put(
        "ObjectMeta",
        Value::structure(Kind::Kube, i.pod.get("metadata").cloned().unwrap_or_else(|| json!({}))),
    );
    put(
        "Spec",
        Value::structure(Kind::Kube, i.pod.get("spec").cloned().unwrap_or_else(|| json!({}))),
    );
    put(
        "ProxyConfig",
        Value::structure(Kind::ProxyConfig, i.proxy_config.clone()),
    );
    put("MeshConfig", Value::structure(Kind::Proto, i.mesh.clone()));
    put("Values", Value::from_json(i.values));
    put("Revision", Value::str(i.revision));
    put("NativeSidecars", Value::Bool(i.native_sidecars));
    put("ProxyImage", Value::Str(i.proxy_image.clone()));
    put("ProxyInitImage", Value::Str(i.proxy_init_image.clone()));
    put("ProxyUID", Value::Int(i.proxy_uid));
    put("ProxyGID", Value::Int(i.proxy_gid));
    put("InboundTrafficPolicyMode", Value::str(i.inbound_traffic_policy_mode));
    put("CompliancePolicy", Value::str(i.compliance_policy));
    Value::map(top)
}
