//! Whether an injected proxy runs as a native sidecar (an init container with `restartPolicy:
//! Always`), as Istio's `DetectNativeSidecar` (`pkg/kube/inject/webhook.go`) and
//! `ENABLE_NATIVE_SIDECARS` (`pilot/pkg/features/pilot.go`): `true` always, `false` never, `auto`
//! (the default) when the Pod's node, or if it has none yet every node, runs a kubelet of
//! Kubernetes 1.33 or later. The nodes are read from an informer on `Node`.

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::reflector::{self, Store, reflector};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::Value;

/// Native sidecars became stable in Kubernetes 1.33.
const MIN_MINOR: u64 = 33;

#[derive(Clone)]
pub enum Native {
    Enabled,
    Disabled,
    /// Decided by the nodes' kubelet versions; `None` without a cluster (then never, as Istio
    /// without a node client).
    Auto(Option<Store<Node>>),
}

impl Native {
    /// From `ENABLE_NATIVE_SIDECARS`; `auto` starts the node informer.
    pub fn from_env(value: Option<&str>, client: Option<&kube::Client>) -> Native {
        match value.unwrap_or("auto") {
            "true" => Native::Enabled,
            "false" => Native::Disabled,
            "auto" => Native::Auto(client.map(|c| nodes(c.clone()))),
            other => {
                tracing::warn!("Unknown value for ENABLE_NATIVE_SIDECARS: {other}, defaulting to false");
                Native::Disabled
            }
        }
    }

    /// Istio's `DetectNativeSidecar` for the Pod (its `spec.nodeName`).
    pub fn for_pod(&self, pod: &Value) -> bool {
        let store = match self {
            Native::Enabled => return true,
            Native::Disabled => return false,
            Native::Auto(None) => {
                tracing::warn!("configured to auto detect native sidecar support, but couldn't find a client");
                return false;
            }
            Native::Auto(Some(store)) => store,
        };
        let nodes = store.state();
        let node_name = pod
            .pointer("/spec/nodeName")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if !node_name.is_empty() {
            if let Some(node) = nodes.iter().find(|n| n.metadata.name.as_deref() == Some(node_name)) {
                return supports(node);
            }
            tracing::warn!("pod assigned to node {node_name:?} but node not found in cluster");
        }
        nodes.iter().all(|n| supports(n))
    }
}

fn supports(node: &Node) -> bool {
    let version = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.kubelet_version.as_str())
        .unwrap_or_default();
    match kubelet_minor(version) {
        Some(minor) => minor >= MIN_MINOR,
        None => {
            tracing::warn!(
                "could not read node version for {}: {version:?}",
                node.metadata.name.as_deref().unwrap_or_default()
            );
            false
        }
    }
}

/// The minor version of a kubelet version (`v1.33.1-gke.100` → 33), as go-version's segments.
fn kubelet_minor(version: &str) -> Option<u64> {
    let v = version.strip_prefix('v').unwrap_or(version);
    let core = v.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let major = parts.next()?;
    if major.is_empty() || !major.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match parts.next() {
        None => Some(0),
        Some(minor) => minor.parse().ok(),
    }
}

fn nodes(client: kube::Client) -> Store<Node> {
    let (reader, writer) = reflector::store::<Node>();
    let stream = reflector(writer, watcher(Api::<Node>::all(client), watcher::Config::default()))
        .default_backoff()
        .applied_objects();
    tokio::spawn(async move {
        let mut stream = stream.boxed();
        while let Some(event) = stream.next().await {
            if let Err(e) = event {
                tracing::debug!("watching Nodes for native sidecar support: {e}");
            }
        }
    });
    reader
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_versions_as_go_version_reads_them() {
        assert_eq!(kubelet_minor("v1.33.1"), Some(33));
        assert_eq!(kubelet_minor("v1.29.4-gke.1043002"), Some(29));
        assert_eq!(kubelet_minor("1.34"), Some(34));
        assert_eq!(kubelet_minor("v1"), Some(0));
        assert_eq!(kubelet_minor(""), None);
        assert_eq!(kubelet_minor("garbage"), None);
    }

    fn node(name: &str, version: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {"nodeInfo": {"kubeletVersion": version, "architecture": "", "bootID": "",
                "containerRuntimeVersion": "", "kernelVersion": "", "kubeProxyVersion": "", "machineID": "",
                "operatingSystem": "", "osImage": "", "systemUUID": ""}}
        }))
        .unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn auto_asks_the_pods_node_or_every_node() {
        let (reader, mut writer) = reflector::store::<Node>();
        writer.apply_watcher_event(&watcher::Event::Apply(node("new", "v1.33.0")));
        writer.apply_watcher_event(&watcher::Event::Apply(node("old", "v1.30.2")));
        let auto = Native::Auto(Some(reader));
        assert!(auto.for_pod(&serde_json::json!({"spec": {"nodeName": "new"}})));
        assert!(!auto.for_pod(&serde_json::json!({"spec": {"nodeName": "old"}})));
        assert!(!auto.for_pod(&serde_json::json!({"spec": {}})));
        assert!(!Native::from_env(Some("yes"), None).for_pod(&Value::Null));
        assert!(Native::from_env(Some("true"), None).for_pod(&Value::Null));
    }
}
