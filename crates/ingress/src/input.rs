//! The objects the conversion reads, decoded from the configs the sources keep whole: an
//! Ingress's name, namespace, creation time, annotations and spec, and an IngressClass's
//! controller.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{IngressClassSpec, IngressSpec};
use model::{Config, ConfigKind, ConfigSpec};

/// One networking.k8s.io/v1 Ingress.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IngressInput {
    pub namespace: String,
    pub name: String,
    /// `metadata.creationTimestamp`: the oldest Ingress of a host names its VirtualService.
    pub creation_time: Option<(i64, u32)>,
    pub annotations: BTreeMap<String, String>,
    pub spec: IngressSpec,
}

impl IngressInput {
    /// The Ingress of a config (`ConfigKind::Ingress`), or why its spec does not decode.
    pub fn from_config(c: &Config) -> Result<IngressInput, String> {
        let spec = decode_spec::<IngressSpec>(c, ConfigKind::Ingress)?;
        Ok(IngressInput {
            namespace: c.meta.namespace.clone(),
            name: c.meta.name.clone(),
            creation_time: c.meta.creation_time,
            annotations: c.meta.annotations.clone(),
            spec,
        })
    }
}

/// The `spec.controller` of an IngressClass config (empty when it names none).
pub fn ingress_class_controller(c: &Config) -> Result<String, String> {
    let spec = decode_spec::<IngressClassSpec>(c, ConfigKind::IngressClass)?;
    Ok(spec.controller.unwrap_or_default())
}

fn decode_spec<T: serde::de::DeserializeOwned + Default>(c: &Config, kind: ConfigKind) -> Result<T, String> {
    if c.kind != kind {
        return Err(format!("{} is not an {kind}", c.key()));
    }
    let ConfigSpec::Kubernetes(v) = &c.spec else {
        return Err(format!("{} is not kept as a Kubernetes object", c.key()));
    };
    match v.get("spec") {
        None | Some(serde_json::Value::Null) => Ok(T::default()),
        Some(spec) => serde_json::from_value(spec.clone()).map_err(|e| format!("spec does not decode: {e}")),
    }
}
