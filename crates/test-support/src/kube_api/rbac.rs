//! The API server's RBAC authorizer, for tokens that are restricted: either to one ClusterRole
//! bound to the token ([`FakeApiServer::bind_cluster_role`](super::FakeApiServer::bind_cluster_role))
//! and Roles of namespaces ([`FakeApiServer::bind_role`](super::FakeApiServer::bind_role)),
//! or, as a cluster does, to the ClusterRoles and Roles that the stored ClusterRoleBindings and
//! RoleBindings grant the token's service account
//! ([`FakeApiServer::authorize_by_bindings`](super::FakeApiServer::authorize_by_bindings)), so
//! that an install's own RBAC objects, applied with `kubectl`, are what its workload may do. A
//! request for a resource and verb no rule allows is answered 403 Forbidden, as a cluster
//! answers a service account short of permissions. Discovery is open to everyone
//! (`system:discovery`); other tokens are not restricted.

use anyhow::Context;
use axum::http::Method;
use serde_json::Value;

/// One rule of a ClusterRole or Role (`*` matches anything).
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    groups: Vec<String>,
    resources: Vec<String>,
    verbs: Vec<String>,
    /// When not empty, the rule allows only requests for one of these objects (never a list,
    /// watch or create, as Kubernetes).
    names: Vec<String>,
}

/// The rules of a ClusterRole written as YAML (as `kubectl apply -f` takes it).
pub(crate) fn cluster_role_rules(yaml: &str) -> anyhow::Result<Vec<Rule>> {
    let role: Value = serde_saphyr::from_str(yaml).context("ClusterRole YAML")?;
    anyhow::ensure!(role["kind"] == "ClusterRole", "not a ClusterRole: {role}");
    Ok(role_rules(&role))
}

/// A Role's namespace and rules.
pub(crate) type NamespaceRole = (String, Vec<Rule>);

/// The namespace and rules of a Role written as YAML.
pub(crate) fn namespaced_role_rules(yaml: &str) -> anyhow::Result<NamespaceRole> {
    let role: Value = serde_saphyr::from_str(yaml).context("Role YAML")?;
    anyhow::ensure!(role["kind"] == "Role", "not a Role: {role}");
    let namespace = role["metadata"]["namespace"]
        .as_str()
        .context("a Role without metadata.namespace")?
        .to_owned();
    Ok((namespace, role_rules(&role)))
}

/// The rules of a ClusterRole or Role object.
fn role_rules(role: &Value) -> Vec<Rule> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(str::to_owned))
            .collect()
    };
    role["rules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| Rule {
            groups: strings(&r["apiGroups"]),
            resources: strings(&r["resources"]),
            verbs: strings(&r["verbs"]),
            names: strings(&r["resourceNames"]),
        })
        .collect()
}

/// Whether any rule allows `verb` on `resource` of `group` (the object `name`, when the
/// request names one).
pub(crate) fn allows(rules: &[Rule], group: &str, resource: &str, verb: &str, name: Option<&str>) -> bool {
    let has = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
    rules.iter().any(|r| {
        has(&r.groups, group)
            && has(&r.resources, resource)
            && has(&r.verbs, verb)
            && (r.names.is_empty() || name.is_some_and(|n| r.names.iter().any(|x| x == n)))
    })
}

/// The objects RBAC is read from: `(kind, namespace)` → the stored objects of that kind there
/// (`""` for cluster-scoped kinds).
pub(crate) trait RbacObjects {
    fn objects(&self, kind: &str, namespace: &str) -> Vec<std::sync::Arc<Value>>;
}

/// What the stored bindings grant the service account `namespace/name` for a request in
/// `request_ns` (`None`: cluster-scoped or across namespaces): the rules of every ClusterRole
/// bound by a ClusterRoleBinding, and in `request_ns`, of every Role or ClusterRole bound by a
/// RoleBinding there.
pub(crate) fn granted(
    store: &dyn RbacObjects,
    sa_namespace: &str,
    sa_name: &str,
    request_ns: Option<&str>,
) -> Vec<Rule> {
    let names_sa = |binding: &Value| {
        binding["subjects"].as_array().into_iter().flatten().any(|s| {
            (s["kind"] == "ServiceAccount" && s["name"] == sa_name && s["namespace"] == sa_namespace)
                || (s["kind"] == "Group"
                    && (s["name"] == "system:serviceaccounts"
                        || s["name"] == format!("system:serviceaccounts:{sa_namespace}").as_str()))
        })
    };
    let role = |binding: &Value, ns: &str| -> Vec<Rule> {
        let name = binding["roleRef"]["name"].as_str().unwrap_or_default();
        let (kind, ns) = match binding["roleRef"]["kind"].as_str() {
            Some("Role") => ("Role", ns),
            _ => ("ClusterRole", ""),
        };
        store
            .objects(kind, ns)
            .iter()
            .filter(|r| r["metadata"]["name"] == name)
            .flat_map(|r| role_rules(r))
            .collect()
    };
    let mut rules: Vec<Rule> = store
        .objects("ClusterRoleBinding", "")
        .iter()
        .filter(|b| names_sa(b))
        .flat_map(|b| role(b, ""))
        .collect();
    if let Some(ns) = request_ns {
        rules.extend(
            store
                .objects("RoleBinding", ns)
                .iter()
                .filter(|b| names_sa(b))
                .flat_map(|b| role(b, ns)),
        );
    }
    rules
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
        assert!(allows(&rules, "", "services", "watch", None));
        assert!(!allows(&rules, "", "services", "create", None));
        assert!(!allows(&rules, "", "secrets", "list", None));
        assert!(allows(&rules, "networking.istio.io", "envoyfilters", "list", None));
        assert!(!allows(&rules, "networking.istio.io", "envoyfilters", "watch", None));
        assert_eq!(verb(&Method::GET, false, true), "watch");
        assert_eq!(verb(&Method::GET, true, false), "get");
        assert_eq!(verb(&Method::PUT, true, false), "update");
    }

    struct Objects(Vec<(&'static str, &'static str, Value)>);
    impl RbacObjects for Objects {
        fn objects(&self, kind: &str, namespace: &str) -> Vec<std::sync::Arc<Value>> {
            self.0
                .iter()
                .filter(|(k, n, _)| *k == kind && *n == namespace)
                .map(|(_, _, v)| std::sync::Arc::new(v.clone()))
                .collect()
        }
    }

    #[test]
    fn bindings_grant_their_roles_to_the_service_account_only() {
        let store = Objects(vec![
            (
                "ClusterRole",
                "",
                serde_json::json!({"metadata": {"name": "reader"}, "rules": [
                    {"apiGroups": [""], "resources": ["services"], "verbs": ["list"]}]}),
            ),
            (
                "ClusterRoleBinding",
                "",
                serde_json::json!({"metadata": {"name": "b"}, "roleRef": {"kind": "ClusterRole", "name": "reader"},
                    "subjects": [{"kind": "ServiceAccount", "name": "istiod", "namespace": "istio-system"}]}),
            ),
            (
                "Role",
                "istio-system",
                serde_json::json!({"metadata": {"name": "istiod"}, "rules": [
                    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"], "resourceNames": ["istio-ca-secret"]}]}),
            ),
            (
                "RoleBinding",
                "istio-system",
                serde_json::json!({"metadata": {"name": "istiod"}, "roleRef": {"kind": "Role", "name": "istiod"},
                    "subjects": [{"kind": "ServiceAccount", "name": "istiod", "namespace": "istio-system"}]}),
            ),
        ]);
        let cluster = granted(&store, "istio-system", "istiod", None);
        assert!(allows(&cluster, "", "services", "list", None));
        assert!(!allows(&cluster, "", "secrets", "get", Some("istio-ca-secret")));
        let ns = granted(&store, "istio-system", "istiod", Some("istio-system"));
        assert!(allows(&ns, "", "secrets", "get", Some("istio-ca-secret")));
        assert!(!allows(&ns, "", "secrets", "get", Some("other")));
        assert!(!allows(&ns, "", "secrets", "list", None));
        assert!(granted(&store, "default", "istiod", Some("istio-system")).is_empty());
    }
}
