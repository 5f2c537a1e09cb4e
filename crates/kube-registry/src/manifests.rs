//! Core Kubernetes objects from `--configDir` manifests (Service, Endpoints, EndpointSlice, Pod,
//! Node, Namespace, also inside `kind: List`), turned into the same [`KubeEvent`]s the watchers
//! produce, so that a cluster's mesh can be run from files. v1 Endpoints become the EndpointSlice
//! the EndpointSlice mirroring controller would make of them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use model::ConfigEvent;
use model::{ConfigKind, ConfigSpec};
use serde::de::DeserializeOwned;

use crate::conversion::SERVICE_NAME_LABEL;
use crate::{Change, KubeEvent};

/// A manifest that does not decode as its kind.
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestError {
    pub object: String,
    pub reason: String,
}

/// The Kubernetes events of a batch of config events (other kinds are skipped).
pub fn events(config_events: &[ConfigEvent]) -> (Vec<KubeEvent>, Vec<ManifestError>) {
    let mut out = Vec::new();
    let mut errors = Vec::new();
    for e in config_events {
        let (config, delete) = match e {
            ConfigEvent::Added(c) | ConfigEvent::Updated { new: c, .. } => (c, false),
            ConfigEvent::Deleted(c) => (c, true),
        };
        let ConfigSpec::Kubernetes(v) = &config.spec else {
            continue;
        };
        match event(config.kind, v, delete) {
            Ok(Some(ev)) => out.push(ev),
            Ok(None) => {}
            Err(reason) => errors.push(ManifestError {
                object: format!("{} {}/{}", config.kind, config.meta.namespace, config.meta.name),
                reason,
            }),
        }
    }
    (out, errors)
}

fn decode<K: DeserializeOwned>(v: &serde_json::Value) -> Result<K, String> {
    serde_json::from_value(v.clone()).map_err(|e| e.to_string())
}

fn change<K>(obj: K, delete: bool) -> Change<K> {
    if delete {
        Change::Delete(obj)
    } else {
        Change::Apply(obj)
    }
}

fn event(kind: ConfigKind, v: &serde_json::Value, delete: bool) -> Result<Option<KubeEvent>, String> {
    Ok(Some(match kind {
        ConfigKind::Service => KubeEvent::Service(change(decode(v)?, delete)),
        ConfigKind::EndpointSlice => KubeEvent::EndpointSlice(change(decode(v)?, delete)),
        ConfigKind::Endpoints => KubeEvent::EndpointSlice(change(mirror(&decode(v)?), delete)),
        ConfigKind::Pod => KubeEvent::Pod(change(decode(v)?, delete)),
        ConfigKind::Node => KubeEvent::Node(change(decode(v)?, delete)),
        ConfigKind::Namespace => KubeEvent::Namespace(change(decode(v)?, delete)),
        _ => return Ok(None),
    }))
}

/// The EndpointSlice of a v1 Endpoints object (one slice per Endpoints, IPv4, ready addresses
/// ready and `notReadyAddresses` not), named after it.
pub fn mirror(ep: &Endpoints) -> EndpointSlice {
    let name = ep.metadata.name.clone().unwrap_or_default();
    let mut endpoints = Vec::new();
    let mut ports: Vec<EndpointPort> = Vec::new();
    for subset in ep.subsets.iter().flatten() {
        for (addresses, ready) in [(&subset.addresses, true), (&subset.not_ready_addresses, false)] {
            for a in addresses.iter().flatten() {
                endpoints.push(Endpoint {
                    addresses: vec![a.ip.clone()],
                    conditions: Some(EndpointConditions {
                        ready: Some(ready),
                        ..Default::default()
                    }),
                    hostname: a.hostname.clone(),
                    node_name: a.node_name.clone(),
                    target_ref: a.target_ref.clone(),
                    ..Default::default()
                });
            }
        }
        for p in subset.ports.iter().flatten() {
            let port = EndpointPort {
                name: p.name.clone(),
                port: Some(p.port),
                protocol: p.protocol.clone(),
                app_protocol: p.app_protocol.clone(),
            };
            if !ports.contains(&port) {
                ports.push(port);
            }
        }
    }
    let mut labels = BTreeMap::new();
    labels.insert(SERVICE_NAME_LABEL.to_owned(), name.clone());
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("{name}-endpoints")),
            namespace: ep.metadata.namespace.clone(),
            labels: Some(labels),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints,
        ports: Some(ports),
    }
}
