//! `RequestAuthentication` (security.istio.io v1 and v1beta1): which JWTs the selected workloads
//! accept. A request with an invalid token is rejected; one without a token is let through for
//! AuthorizationPolicy to decide.

use serde::{Deserialize, Serialize};

use super::PolicyTargetReference;
use crate::networking::WorkloadSelector;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct RequestAuthentication {
    pub selector: Option<WorkloadSelector>,
    pub target_ref: Option<PolicyTargetReference>,
    pub target_refs: Vec<PolicyTargetReference>,
    /// A `null` item is kept as `None` for validation to name.
    pub jwt_rules: Vec<Option<JwtRule>>,
}

impl RequestAuthentication {
    /// `targetRefs`, else the single `targetRef`.
    pub fn target_refs(&self) -> Vec<&PolicyTargetReference> {
        if self.target_refs.is_empty() {
            self.target_ref.iter().collect()
        } else {
            self.target_refs.iter().collect()
        }
    }
}

/// `JWTRule`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct JwtRule {
    pub issuer: String,
    pub audiences: Vec<String>,
    /// `jwksUri` (the CRD also accepts `jwks_uri`).
    #[serde(alias = "jwks_uri")]
    pub jwks_uri: String,
    /// Inline JWKS (JSON).
    pub jwks: String,
    pub from_headers: Vec<JwtHeader>,
    pub from_params: Vec<String>,
    pub from_cookies: Vec<String>,
    pub output_payload_to_header: String,
    pub forward_original_token: bool,
    pub output_claim_to_headers: Vec<Option<ClaimToHeader>>,
    /// The JWKS fetch timeout (a duration string).
    pub timeout: Option<String>,
    pub space_delimited_claims: Vec<String>,
    /// `OPTIONAL` (default) or `REQUIRED`: kept as written, checked by validation.
    pub presence: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct JwtHeader {
    pub name: String,
    pub prefix: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct ClaimToHeader {
    pub header: String,
    pub claim: String,
}
