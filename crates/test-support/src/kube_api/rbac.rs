//! The API server's RBAC authorizer for one ClusterRole bound to a bearer token
//! ([`FakeApiServer::bind_cluster_role`](super::FakeApiServer::bind_cluster_role)): a request
//! bearing that token for a resource and verb the role's rules do not allow is answered 403
//! Forbidden, as a cluster answers a service account short of permissions. Discovery is open to
//! everyone (`system:discovery`); other tokens are not restricted.

use anyhow::Context;
use axum::http::Method;
use serde_json::Value;

/// One rule of a ClusterRole (`*` matches anything).
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
}

/// The rules of a ClusterRole written as YAML (as `kubectl apply -f` takes it).
pub(crate) fn cluster_role_rules(yaml: &str) -> anyhow::Result<Vec<Rule>> {
    let role: Value = serde_saphyr::from_str(yaml).context("ClusterRole YAML")?;
    anyhow::ensure!(role["kind"] == "ClusterRole", "not a ClusterRole: {role}");
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    Ok(role["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| Rule {
            groups: strings(&r["apiGroups"]),
            resources: strings(&r["resources"]),
            verbs: strings(&r["verbs"]),
        })
        .collect())
}

/// Whether any rule allows `verb` on `resource` of `group`.
pub(crate) fn allows(rules: &[Rule], group: &str, resource: &str, verb: &str) -> bool {
    let has = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
    rules
        .iter()
        .any(|r| has(&r.groups, group) && has(&r.resources, resource) && has(&r.verbs, verb))
}

/// The RBAC verb of a request: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`.
pub(crate) fn verb(method: &Method, object: bool, watch: bool) -> &'static str {
    match *method {
        Method::GET if watch => "watch",
        Method::GET if object => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE => "delete",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_allow_what_they_list_and_wildcards() {
        let rules = cluster_role_rules(
            "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: r}\nrules:\n\
             - apiGroups: [\"\"]\n  resources: [services]\n  verbs: [get, list, watch]\n\
             - apiGroups: [networking.istio.io]\n  resources: [\"*\"]\n  verbs: [list]\n",
        )
        .unwrap_or_default();
        assert!(allows(&rules, "", "services", "watch"));
        assert!(!allows(&rules, "", "services", "create"));
        assert!(!allows(&rules, "", "secrets", "list"));
        assert!(allows(&rules, "networking.istio.io", "envoyfilters", "list"));
        assert!(!allows(&rules, "networking.istio.io", "envoyfilters", "watch"));
        assert_eq!(verb(&Method::GET, false, true), "watch");
        assert_eq!(verb(&Method::GET, true, false), "get");
        assert_eq!(verb(&Method::PUT, true, false), "update");
    }
}
