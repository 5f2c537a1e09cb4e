//! Test fixtures shared by the crates above this one (feature `testing`, as ztunnel's
//! `test_helpers`): configs from JSON documents and proxies from a node ID's parts. They panic on
//! bad input: they are for tests only.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::config::parse_config;
use crate::proxy::NodeMetadata;
use crate::{Config, Proxy};

/// A validated config from a Kubernetes-style document (namespace `default` when it names none).
pub fn config(doc: Value) -> Arc<Config> {
    Arc::new(parse_config(doc, "default").unwrap_or_else(|e| panic!("fixture config: {e}")))
}

/// A proxy `<node_type>~<ip>~p.<ns>~<ns>.svc.cluster.local` in namespace `ns` with these labels.
pub fn proxy(node_type: &str, ip: &str, ns: &str, labels: Value) -> Proxy {
    let md = NodeMetadata::from_json("x", &json!({"NAMESPACE": ns, "LABELS": labels}))
        .unwrap_or_else(|e| panic!("fixture metadata: {e}"));
    Proxy::parse(&format!("{node_type}~{ip}~p.{ns}~{ns}.svc.cluster.local"), md)
        .unwrap_or_else(|e| panic!("fixture proxy: {e}"))
}
