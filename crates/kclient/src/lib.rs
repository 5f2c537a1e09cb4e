//! The API server client every Kubernetes reader shares, as Istio's `pkg/kube`: the client's
//! config and connection, the list + watch of a kind ([`informer`], client-go's reflector) with
//! each object decoded on its own ([`decode`]), and the metrics of what was read. The Kubernetes
//! registry (`kube-registry`) and the Kubernetes config source (`config-sources`' `crdclient`)
//! both read through it.
#![forbid(unsafe_code)]
#![warn(unreachable_pub)]

mod client;
pub mod decode;
pub mod informer;
mod metrics;

pub use client::{Error, client_config, connect};
pub use metrics::{EventLabels, ObjectErrorLabels, WatchErrorLabels, WatchMetrics};

/// A change to objects of one kind.
#[derive(Debug, Clone)]
pub enum Change<K> {
    /// Added or modified.
    Apply(K),
    Delete(K),
    /// Everything of the kind, after a (re-)list: replaces what was known.
    Replace(Vec<K>),
}
