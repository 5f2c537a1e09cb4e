//! `AuthorizationPolicy` (security.istio.io v1 and v1beta1): who may call what on the workloads a
//! policy selects. `None` and an empty list differ where Istio's validation tells them apart
//! (`rules`, `from`, `to`, a `null` rule).

use serde::{Deserialize, Serialize};

use crate::networking::WorkloadSelector;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct AuthorizationPolicy {
    pub selector: Option<WorkloadSelector>,
    pub target_ref: Option<PolicyTargetReference>,
    pub target_refs: Vec<PolicyTargetReference>,
    /// `None`: no `rules` field (ALLOW: allow nothing; DENY/CUSTOM: invalid). A `null` item is
    /// kept as `None` for validation to name.
    pub rules: Option<Vec<Option<Rule>>>,
    pub action: AuthzAction,
    /// The extension provider of a CUSTOM policy.
    pub provider: Option<Provider>,
}

impl AuthorizationPolicy {
    /// `targetRefs`, else the single `targetRef` (Istio's `GetTargetRefs`).
    pub fn target_refs(&self) -> Vec<&PolicyTargetReference> {
        if self.target_refs.is_empty() {
            self.target_ref.iter().collect()
        } else {
            self.target_refs.iter().collect()
        }
    }
}

/// `AuthorizationPolicy.Action`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AuthzAction {
    #[default]
    Allow,
    Deny,
    Audit,
    Custom,
}

impl std::fmt::Display for AuthzAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AuthzAction::Allow => "ALLOW",
            AuthzAction::Deny => "DENY",
            AuthzAction::Audit => "AUDIT",
            AuthzAction::Custom => "CUSTOM",
        })
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Provider {
    pub name: String,
}

/// `istio.type.v1beta1.PolicyTargetReference`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PolicyTargetReference {
    pub group: String,
    pub kind: String,
    pub name: String,
    pub namespace: String,
}

/// One rule: it matches when a source, an operation and every condition match.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Rule {
    pub from: Option<Vec<Option<RuleFrom>>>,
    pub to: Option<Vec<Option<RuleTo>>>,
    pub when: Vec<Option<Condition>>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RuleFrom {
    pub source: Option<Source>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RuleTo {
    pub operation: Option<Operation>,
}

/// Where a request comes from; the lists are ORed, the fields ANDed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Source {
    pub principals: Vec<String>,
    pub not_principals: Vec<String>,
    pub request_principals: Vec<String>,
    pub not_request_principals: Vec<String>,
    pub namespaces: Vec<String>,
    pub not_namespaces: Vec<String>,
    pub service_accounts: Vec<String>,
    pub not_service_accounts: Vec<String>,
    pub trust_domains: Vec<String>,
    pub not_trust_domains: Vec<String>,
    pub ip_blocks: Vec<String>,
    pub not_ip_blocks: Vec<String>,
    pub remote_ip_blocks: Vec<String>,
    pub not_remote_ip_blocks: Vec<String>,
}

impl Source {
    /// Whether no field is set (Istio refuses an empty `source`).
    pub fn is_empty(&self) -> bool {
        self == &Source::default()
    }
}

/// What a request asks for; the lists are ORed, the fields ANDed.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Operation {
    pub hosts: Vec<String>,
    pub not_hosts: Vec<String>,
    pub ports: Vec<String>,
    pub not_ports: Vec<String>,
    pub methods: Vec<String>,
    pub not_methods: Vec<String>,
    pub paths: Vec<String>,
    pub not_paths: Vec<String>,
}

impl Operation {
    pub fn is_empty(&self) -> bool {
        self == &Operation::default()
    }
}

/// A `when` condition on one attribute (`key`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Condition {
    pub key: String,
    pub values: Vec<String>,
    pub not_values: Vec<String>,
}
