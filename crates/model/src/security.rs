//! Istio `security.istio.io` API types (v1 and v1beta1 share one schema).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::networking::WorkloadSelector;

/// `PeerAuthentication`: whether workloads accept plaintext, mutual TLS, or both.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PeerAuthentication {
    pub selector: Option<WorkloadSelector>,
    pub mtls: Option<PeerMtls>,
    /// Per workload port (the container port), overriding `mtls`; only with a selector.
    pub port_level_mtls: Option<BTreeMap<u32, PeerMtls>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PeerMtls {
    pub mode: MtlsMode,
}

/// `PeerAuthentication.MutualTLS.Mode`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MtlsMode {
    /// Inherit from the parent (namespace, then mesh); PERMISSIVE at the top.
    #[default]
    Unset,
    Disable,
    Permissive,
    Strict,
}

mod authorization;
mod request_authentication;

pub use authorization::{
    AuthorizationPolicy, AuthzAction, Condition, Operation, PolicyTargetReference, Provider, Rule, RuleFrom, RuleTo,
    Source,
};
pub use request_authentication::{ClaimToHeader, JwtHeader, JwtRule, RequestAuthentication};
