//! What a webhook configuration patcher is to the shared driver (`patch.rs`): the kind it
//! watches, its label selector and retry limiter, and how it brings one configuration up to date.

use std::fmt::Debug;
use std::future::Future;

use kube::Api;
use serde::de::DeserializeOwned;

use super::queue;

/// What handling one configuration came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Up to date, or not ours to patch: nothing more until it changes.
    Done,
    /// Try again after the queue's delay.
    Retry,
}

/// One of Istio's patchers: which configurations it watches and how it brings one up to date.
pub trait Patcher: Send + Sync + 'static {
    type Config: kube::Resource<DynamicType = (), Scope = kube::core::ClusterResourceScope>
        + Clone
        + DeserializeOwned
        + Debug
        + Send
        + Sync
        + 'static;
    /// For logs: "validation webhook controller", ...
    const NAME: &'static str;
    /// The label selector of the watch, if any.
    fn selector(&self) -> Option<String>;
    fn limiter(&self) -> queue::Limiter;
    /// Brings configuration `name` up to date with `ca_bundle` (PEM).
    fn reconcile(&self, api: &Api<Self::Config>, name: &str, ca_bundle: &str) -> impl Future<Output = Outcome> + Send;
}
