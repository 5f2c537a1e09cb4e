//! AuthorizationPolicies and RequestAuthentications that apply to a workload, as Istio's
//! `AuthorizationPolicies.ListAuthorizationPolicies` / `AuthenticationPolicies.GetJwtPoliciesForWorkload`
//! with `WorkloadPolicyMatcher.ShouldAttachPolicy`: the policies of the root namespace and of the
//! workload's namespace, oldest first, whose selector (none: all) matches the workload's labels.
//! Policies with `targetRef(s)` attach only to Kubernetes Gateway API gateways (by the
//! `gateway.networking.k8s.io/gateway-name` label), never to sidecars; a Gateway API gateway
//! also takes selector policies (Istio's `PILOT_ENABLE_SELECTOR_BASED_K8S_GATEWAY_POLICY`, on).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use model::security::{AuthorizationPolicy, AuthzAction, PolicyTargetReference, RequestAuthentication};
use model::{Config, ConfigSpec};

/// A JWKS to fetch: a RequestAuthentication rule's issuer and `jwksUri` (empty: the issuer's
/// OpenID discovery document names it), as Istio's `jwtKey`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct JwksKey {
    pub issuer: String,
    pub jwks_uri: String,
}

/// Fetched JWKS documents (JSON), by key.
pub type JwksKeys = std::collections::BTreeMap<JwksKey, String>;

/// The JWKS that rules without inline `jwks` need, and the RequestAuthentications asking for each.
pub fn jwks_wanted(configs: &[Arc<Config>]) -> std::collections::BTreeMap<JwksKey, Vec<model::ConfigKey>> {
    let mut out: std::collections::BTreeMap<JwksKey, Vec<model::ConfigKey>> = Default::default();
    for c in configs {
        let Some(ra) = request_authentication(c) else { continue };
        for rule in ra.jwt_rules.iter().flatten().filter(|r| r.jwks.is_empty()) {
            let key = JwksKey {
                issuer: rule.issuer.clone(),
                jwks_uri: rule.jwks_uri.clone(),
            };
            out.entry(key).or_default().push(c.key());
        }
    }
    out
}

/// The label Gateway API deployments carry, naming their Gateway.
pub(crate) const GATEWAY_NAME_LABEL: &str = "gateway.networking.k8s.io/gateway-name";

/// The AuthorizationPolicies of one workload by action, each list oldest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuthorizationPoliciesResult {
    pub custom: Vec<Arc<Config>>,
    pub deny: Vec<Arc<Config>>,
    pub allow: Vec<Arc<Config>>,
    pub audit: Vec<Arc<Config>>,
}

impl AuthorizationPoliciesResult {
    pub fn is_empty(&self) -> bool {
        self.custom.is_empty() && self.deny.is_empty() && self.allow.is_empty() && self.audit.is_empty()
    }
}

/// The spec of an AuthorizationPolicy config.
pub fn authorization_policy(c: &Config) -> Option<&AuthorizationPolicy> {
    match &c.spec {
        ConfigSpec::AuthorizationPolicy(ap) => Some(ap),
        _ => None,
    }
}

/// The spec of a RequestAuthentication config.
pub fn request_authentication(c: &Config) -> Option<&RequestAuthentication> {
    match &c.spec {
        ConfigSpec::RequestAuthentication(ra) => Some(ra),
        _ => None,
    }
}

/// A policy's workload selector labels (none: every workload) and target references.
pub struct PolicyScope<'a> {
    pub selector: Option<&'a BTreeMap<String, String>>,
    pub target_refs: Vec<&'a PolicyTargetReference>,
}

/// Reads the scope of a config of the index's kind (`None`: another kind).
pub(crate) type ScopeOf = for<'a> fn(&'a Config) -> Option<PolicyScope<'a>>;

/// The policies of one kind by namespace, oldest first.
#[derive(Debug, Default)]
pub struct PolicyIndex {
    by_namespace: HashMap<String, Vec<Arc<Config>>>,
    root_namespace: String,
}

impl PolicyIndex {
    /// The configs for which `is_kind` holds.
    pub fn new(configs: &[Arc<Config>], root_namespace: &str, is_kind: fn(&Config) -> bool) -> PolicyIndex {
        let mut policies: Vec<Arc<Config>> = configs.iter().filter(|c| is_kind(c)).cloned().collect();
        policies.sort_by(|a, b| crate::creation_order(a, b));
        let mut by_namespace: HashMap<String, Vec<Arc<Config>>> = HashMap::new();
        for p in policies {
            by_namespace.entry(p.meta.namespace.clone()).or_default().push(p);
        }
        PolicyIndex {
            by_namespace,
            root_namespace: root_namespace.to_owned(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_namespace.is_empty()
    }

    /// The policies that attach to a workload of `namespace` with `labels`: the root namespace's
    /// first, then the workload namespace's.
    pub fn for_workload<'a>(
        &'a self,
        namespace: &'a str,
        labels: &'a BTreeMap<String, String>,
        scope: ScopeOf,
    ) -> impl Iterator<Item = &'a Arc<Config>> + 'a {
        let namespaces = if namespace == self.root_namespace {
            vec![namespace]
        } else {
            vec![self.root_namespace.as_str(), namespace]
        };
        namespaces
            .into_iter()
            .filter_map(|ns| self.by_namespace.get(ns))
            .flatten()
            .filter(move |c| {
                scope(c)
                    .is_some_and(|s| should_attach(namespace, labels, &c.meta.namespace, s.selector, &s.target_refs))
            })
    }
}

/// A policy's selector labels and target references.
pub fn authorization_scope(c: &Config) -> Option<PolicyScope<'_>> {
    authorization_policy(c).map(|p| PolicyScope {
        selector: p.selector.as_ref().map(|s| &s.match_labels),
        target_refs: p.target_refs(),
    })
}

/// A RequestAuthentication's selector labels and target references.
pub(crate) fn request_authentication_scope(c: &Config) -> Option<PolicyScope<'_>> {
    request_authentication(c).map(|p| PolicyScope {
        selector: p.selector.as_ref().map(|s| &s.match_labels),
        target_refs: p.target_refs(),
    })
}

/// Istio's `ShouldAttachPolicy` for sidecars and gateways (no waypoints).
fn should_attach(
    workload_namespace: &str,
    labels: &BTreeMap<String, String>,
    policy_namespace: &str,
    selector: Option<&BTreeMap<String, String>>,
    target_refs: &[&PolicyTargetReference],
) -> bool {
    let selected = || selector.is_none_or(|s| s.iter().all(|(k, v)| labels.get(k) == Some(v)));
    let Some(gateway_name) = labels.get(GATEWAY_NAME_LABEL) else {
        return target_refs.is_empty() && selected();
    };
    if target_refs.is_empty() {
        return selected();
    }
    policy_namespace == workload_namespace
        && target_refs.iter().any(|r| {
            r.group == "gateway.networking.k8s.io"
                && r.kind == "Gateway"
                && &r.name == gateway_name
                && (r.namespace.is_empty() || r.namespace == workload_namespace)
        })
}

/// Sorts a workload's AuthorizationPolicies by action.
pub fn by_action<'a>(policies: impl Iterator<Item = &'a Arc<Config>>) -> AuthorizationPoliciesResult {
    let mut out = AuthorizationPoliciesResult::default();
    for c in policies {
        let Some(p) = authorization_policy(c) else { continue };
        let list = match p.action {
            AuthzAction::Allow => &mut out.allow,
            AuthzAction::Deny => &mut out.deny,
            AuthzAction::Audit => &mut out.audit,
            AuthzAction::Custom => &mut out.custom,
        };
        list.push(c.clone());
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn policy(name: &str, ns: &str, spec: serde_json::Value) -> Arc<Config> {
        let doc = json!({"apiVersion": "security.istio.io/v1", "kind": "AuthorizationPolicy",
            "metadata": {"name": name, "namespace": ns}, "spec": spec});
        Arc::new(model::config::parse_config(doc, "default").unwrap())
    }

    fn labels(l: &[(&str, &str)]) -> BTreeMap<String, String> {
        l.iter().map(|(k, v)| ((*k).into(), (*v).into())).collect()
    }

    fn names(index: &PolicyIndex, ns: &str, l: &BTreeMap<String, String>) -> Vec<String> {
        index
            .for_workload(ns, l, authorization_scope)
            .map(|c| format!("{}/{}", c.meta.namespace, c.meta.name))
            .collect()
    }

    #[test]
    fn root_then_own_namespace_by_selector_and_gateways_by_target_ref() {
        let configs = vec![
            policy("mesh", "istio-system", json!({"action": "DENY", "rules": [{}]})),
            policy(
                "mesh-app",
                "istio-system",
                json!({"selector": {"matchLabels": {"app": "a"}}}),
            ),
            policy("ns", "foo", json!({})),
            policy("app-b", "foo", json!({"selector": {"matchLabels": {"app": "b"}}})),
            policy("other", "bar", json!({})),
            policy(
                "gw",
                "foo",
                json!({"targetRefs": [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "web"}]}),
            ),
        ];
        let index = PolicyIndex::new(&configs, "istio-system", |c| authorization_policy(c).is_some());
        assert_eq!(
            names(&index, "foo", &labels(&[("app", "a")])),
            ["istio-system/mesh", "istio-system/mesh-app", "foo/ns"]
        );
        assert_eq!(
            names(&index, "foo", &labels(&[("app", "b")])),
            ["istio-system/mesh", "foo/app-b", "foo/ns"],
            "oldest first; without creation times by name"
        );
        assert_eq!(names(&index, "istio-system", &labels(&[])), ["istio-system/mesh"]);
        let gateway = labels(&[(GATEWAY_NAME_LABEL, "web")]);
        assert_eq!(
            names(&index, "foo", &gateway),
            ["istio-system/mesh", "foo/gw", "foo/ns"]
        );
        let result = by_action(index.for_workload("foo", &gateway, authorization_scope));
        assert_eq!((result.deny.len(), result.allow.len()), (1, 2));
    }
}
