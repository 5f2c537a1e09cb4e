//! One AuthorizationPolicy rule as Envoy RBAC permissions and principals, as Istio's
//! `security/authz/model` (`New`, `Generate`, the per-attribute generators). `to` operations and
//! the `when` keys about the destination become permissions, `from` sources and the `when` keys
//! about the caller principals: a request matches the policy when some permission and some
//! principal match. HTTP-only attributes on a TCP chain are an error: for ALLOW the rule is left
//! out (allowing less), for DENY and AUDIT the attribute is (denying more), as Istio.

use xds_api::envoy::config::rbac::v3::{Permission, Policy, Principal, permission, principal, rbac::Action};
use xds_api::envoy::r#type::matcher::v3::{ListMatcher, ValueMatcher, list_matcher, value_matcher};

use super::matcher as m;
use super::trust_domain::Bundle;
use model::security::Rule;

const REQUEST_HEADER: &str = "request.headers";
const REQUEST_CLAIMS: &str = "request.auth.claims";
const ENVOY_FILTER: &str = "experimental.envoy.filters.";
const SRC_PRINCIPAL: &str = "source.principal";
const SRC_TRUST_DOMAIN: &str = "source.trustDomain";

/// What a permission condition looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PermissionAttr {
    DestIp,
    DestPort,
    ConnSni,
    /// `experimental.envoy.filters.<filter>[<key>]`: all values in one matcher.
    EnvoyFilter,
    Host,
    Path,
    Method,
}

/// What a principal condition looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PrincipalAttr {
    SrcIp,
    RemoteIp,
    SrcNamespace,
    SrcTrustDomain,
    SrcServiceAccount,
    SrcPrincipal,
    /// The rest take all values in one matcher (Istio's "extended" generators).
    RequestPrincipal,
    RequestAudiences,
    RequestPresenter,
    RequestHeader,
    RequestClaims,
}

#[derive(Debug, Clone)]
struct Condition<A> {
    attr: A,
    key: String,
    values: Vec<String>,
    not_values: Vec<String>,
}

type Conditions<A> = Vec<Condition<A>>;

fn push<A>(list: &mut Conditions<A>, front: bool, attr: A, key: &str, values: &[String], not_values: &[String]) {
    if values.is_empty() && not_values.is_empty() {
        return;
    }
    let c = Condition {
        attr,
        key: key.to_owned(),
        values: values.to_vec(),
        not_values: not_values.to_vec(),
    };
    if front {
        list.insert(0, c);
    } else {
        list.push(c);
    }
}

/// The `when` conditions: those of the destination go to every permission, those of the source
/// and the request to every principal.
#[allow(clippy::type_complexity)]
fn when_conditions(rule: &Rule) -> Result<(Conditions<PermissionAttr>, Conditions<PrincipalAttr>), String> {
    let mut base_permission = Vec::new();
    let mut base_principal = Vec::new();
    for when in rule.when.iter().flatten() {
        let (k, v, n) = (when.key.as_str(), &when.values, &when.not_values);
        use PermissionAttr as P;
        use PrincipalAttr as S;
        match k {
            "destination.ip" => push(&mut base_permission, false, P::DestIp, k, v, n),
            "destination.port" => push(&mut base_permission, false, P::DestPort, k, v, n),
            "connection.sni" => push(&mut base_permission, false, P::ConnSni, k, v, n),
            _ if k.starts_with(ENVOY_FILTER) => push(&mut base_permission, false, P::EnvoyFilter, k, v, n),
            "source.ip" => push(&mut base_principal, false, S::SrcIp, k, v, n),
            "remote.ip" => push(&mut base_principal, false, S::RemoteIp, k, v, n),
            "source.namespace" => push(&mut base_principal, false, S::SrcNamespace, k, v, n),
            SRC_TRUST_DOMAIN => push(&mut base_principal, false, S::SrcTrustDomain, k, v, n),
            "source.serviceAccount" => push(&mut base_principal, false, S::SrcServiceAccount, k, v, n),
            SRC_PRINCIPAL => push(&mut base_principal, false, S::SrcPrincipal, k, v, n),
            "request.auth.principal" => push(&mut base_principal, false, S::RequestPrincipal, k, v, n),
            "request.auth.audiences" => push(&mut base_principal, false, S::RequestAudiences, k, v, n),
            "request.auth.presenter" => push(&mut base_principal, false, S::RequestPresenter, k, v, n),
            _ if k.starts_with(REQUEST_HEADER) => push(&mut base_principal, false, S::RequestHeader, k, v, n),
            _ if k.starts_with(REQUEST_CLAIMS) => push(&mut base_principal, false, S::RequestClaims, k, v, n),
            _ => return Err(format!("unknown attribute {k}")),
        }
    }
    Ok((base_permission, base_principal))
}

/// A `from`'s source, in front of the `when` conditions (Istio's order).
fn source_conditions(l: &mut Conditions<PrincipalAttr>, s: &model::security::Source) {
    use PrincipalAttr as S;
    push(l, true, S::SrcIp, "source.ip", &s.ip_blocks, &s.not_ip_blocks);
    push(
        l,
        true,
        S::RemoteIp,
        "remote.ip",
        &s.remote_ip_blocks,
        &s.not_remote_ip_blocks,
    );
    push(
        l,
        true,
        S::SrcNamespace,
        "source.namespace",
        &s.namespaces,
        &s.not_namespaces,
    );
    push(
        l,
        true,
        S::SrcTrustDomain,
        SRC_TRUST_DOMAIN,
        &s.trust_domains,
        &s.not_trust_domains,
    );
    push(
        l,
        true,
        S::SrcServiceAccount,
        "source.serviceAccount",
        &s.service_accounts,
        &s.not_service_accounts,
    );
    push(
        l,
        true,
        S::RequestPrincipal,
        "request.auth.principal",
        &s.request_principals,
        &s.not_request_principals,
    );
    push(
        l,
        true,
        S::SrcPrincipal,
        SRC_PRINCIPAL,
        &s.principals,
        &s.not_principals,
    );
}

/// A `to`'s operation, in front of the `when` conditions.
fn operation_conditions(l: &mut Conditions<PermissionAttr>, o: &model::security::Operation) {
    use PermissionAttr as P;
    push(l, true, P::DestPort, "destination.port", &o.ports, &o.not_ports);
    push(l, true, P::Path, "path-matcher", &o.paths, &o.not_paths);
    push(l, true, P::Method, ":method", &o.methods, &o.not_methods);
    push(l, true, P::Host, ":authority", &o.hosts, &o.not_hosts);
}

/// A rule, its conditions sorted into permissions (one list per `to`) and principals (one per
/// `from`), in Istio's order.
#[derive(Debug, Clone)]
pub(crate) struct RuleModel {
    permissions: Vec<Conditions<PermissionAttr>>,
    principals: Vec<Conditions<PrincipalAttr>>,
    /// The policy's namespace: service accounts without one are of this namespace.
    namespace: String,
}

impl RuleModel {
    /// Istio's `model.New`; an unknown `when` key is an error (validation refuses it first).
    pub(crate) fn new(namespace: &str, rule: &Rule) -> Result<RuleModel, String> {
        let (base_permission, base_principal) = when_conditions(rule)?;
        let mut principals: Vec<_> = rule
            .from
            .iter()
            .flatten()
            .flatten()
            .map(|from| {
                let mut merged = base_principal.clone();
                if let Some(s) = &from.source {
                    source_conditions(&mut merged, s);
                }
                merged
            })
            .collect();
        if rule.from.as_ref().is_none_or(Vec::is_empty) {
            principals.push(base_principal);
        }
        let mut permissions: Vec<_> = rule
            .to
            .iter()
            .flatten()
            .flatten()
            .map(|to| {
                let mut merged = base_permission.clone();
                if let Some(o) = &to.operation {
                    operation_conditions(&mut merged, o);
                }
                merged
            })
            .collect();
        if rule.to.as_ref().is_none_or(Vec::is_empty) {
            permissions.push(base_permission);
        }
        Ok(RuleModel {
            permissions,
            principals,
            namespace: namespace.to_owned(),
        })
    }

    /// Istio's `MigrateTrustDomain`.
    pub(crate) fn migrate_trust_domain(&mut self, bundle: &Bundle) {
        for c in self.principals.iter_mut().flatten() {
            match c.key.as_str() {
                SRC_PRINCIPAL => {
                    c.values = bundle.replace_trust_domain_aliases(&c.values);
                    c.not_values = bundle.replace_trust_domain_aliases(&c.not_values);
                }
                SRC_TRUST_DOMAIN => {
                    c.values = bundle.expand_trust_domain_aliases(&c.values);
                    c.not_values = bundle.expand_trust_domain_aliases(&c.not_values);
                }
                _ => {}
            }
        }
    }

    /// Istio's `Model.Generate` (principals as `authenticated`, not filter state).
    pub(crate) fn generate(&self, for_tcp: bool, action: Action) -> Result<Policy, String> {
        let mut permissions = Vec::new();
        for list in &self.permissions {
            let mut and = Vec::new();
            for c in list {
                and.extend(condition_permissions(c, for_tcp, action)?);
            }
            if and.is_empty() {
                and.push(permission_any());
            }
            permissions.push(permission_and(and));
        }
        let mut principals = Vec::new();
        for list in &self.principals {
            let mut and = Vec::new();
            for c in list {
                and.extend(condition_principals(c, &self.namespace, for_tcp, action)?);
            }
            if and.is_empty() {
                and.push(principal_any());
            }
            principals.push(principal_and(and));
        }
        Ok(Policy {
            permissions,
            principals,
            ..Default::default()
        })
    }
}

/// Istio's `checkError`: ALLOW keeps the error (the rule is dropped); DENY and AUDIT drop the
/// value instead.
fn check<T>(action: Action, r: Result<Option<T>, String>) -> Result<Option<T>, String> {
    match r {
        Err(e) if action == Action::Allow => Err(e),
        Err(_) => Ok(None),
        ok => ok,
    }
}

fn condition_permissions(
    c: &Condition<PermissionAttr>,
    for_tcp: bool,
    action: Action,
) -> Result<Vec<Permission>, String> {
    let mut out = Vec::new();
    if c.attr == PermissionAttr::EnvoyFilter {
        if !c.values.is_empty()
            && let Some(p) = check(action, envoy_filter_permission(&c.key, &c.values))?
        {
            out.push(p);
        }
        if !c.not_values.is_empty()
            && let Some(p) = check(action, envoy_filter_permission(&c.key, &c.not_values))?
        {
            out.push(permission_not(p));
        }
        return Ok(out);
    }
    let mut or = Vec::new();
    for v in &c.values {
        or.extend(check(action, permission(c.attr, &c.key, v, for_tcp))?);
    }
    if !or.is_empty() {
        out.push(permission_or(or));
    }
    let mut or = Vec::new();
    for v in &c.not_values {
        or.extend(check(action, permission(c.attr, &c.key, v, for_tcp))?);
    }
    if !or.is_empty() {
        out.push(permission_not(permission_or(or)));
    }
    Ok(out)
}

fn condition_principals(
    c: &Condition<PrincipalAttr>,
    namespace: &str,
    for_tcp: bool,
    action: Action,
) -> Result<Vec<Principal>, String> {
    use PrincipalAttr as S;
    let mut out = Vec::new();
    if matches!(
        c.attr,
        S::RequestPrincipal | S::RequestAudiences | S::RequestPresenter | S::RequestClaims
    ) {
        if !c.values.is_empty()
            && let Some(p) = check(action, extended_principal(c.attr, &c.key, &c.values, for_tcp))?
        {
            out.push(p);
        }
        if !c.not_values.is_empty()
            && let Some(p) = check(action, extended_principal(c.attr, &c.key, &c.not_values, for_tcp))?
        {
            out.push(principal_not(p));
        }
        return Ok(out);
    }
    let mut or = Vec::new();
    for v in &c.values {
        or.extend(check(action, principal(c.attr, namespace, &c.key, v, for_tcp))?);
    }
    if !or.is_empty() {
        out.push(principal_or(or));
    }
    let mut or = Vec::new();
    for v in &c.not_values {
        or.extend(check(action, principal(c.attr, namespace, &c.key, v, for_tcp))?);
    }
    if !or.is_empty() {
        out.push(principal_not(principal_or(or)));
    }
    Ok(out)
}

fn http_only(key: &str, for_tcp: bool) -> Result<(), String> {
    if for_tcp {
        return Err(format!("{key:?} is HTTP only"));
    }
    Ok(())
}

fn permission(attr: PermissionAttr, key: &str, v: &str, for_tcp: bool) -> Result<Option<Permission>, String> {
    use permission::Rule as R;
    let rule = match attr {
        PermissionAttr::DestIp => R::DestinationIp(m::cidr_range(v)?),
        PermissionAttr::DestPort => {
            let port = v
                .parse::<u16>()
                .ok()
                .filter(|_| v.bytes().all(|b| b.is_ascii_digit()))
                .ok_or_else(|| format!("invalid port {v}"))?;
            R::DestinationPort(u32::from(port))
        }
        PermissionAttr::ConnSni => R::RequestedServerName(m::string(v)),
        PermissionAttr::Host => {
            http_only(key, for_tcp)?;
            R::Header(m::host_matcher(":authority", v))
        }
        PermissionAttr::Method => {
            http_only(key, for_tcp)?;
            R::Header(m::header_matcher(":method", v))
        }
        PermissionAttr::Path => {
            http_only(key, for_tcp)?;
            if model::validation::contains_path_template(v) {
                R::UriTemplate(m::path_template(v))
            } else {
                R::UrlPath(m::path_matcher(v))
            }
        }
        PermissionAttr::EnvoyFilter => return Err("envoy filter values are matched together".into()),
    };
    Ok(Some(Permission { rule: Some(rule) }))
}

/// `experimental.envoy.filters.<filter>[<key>]`: the filter's dynamic metadata at `key` matches a
/// value (`[v]`: a list containing `v`). RBAC's `metadata` is deprecated in favour of
/// `sourced_metadata` but still what Istio generates, and Envoy 1.40 takes it.
#[allow(deprecated)]
fn envoy_filter_permission(key: &str, values: &[String]) -> Result<Option<Permission>, String> {
    let trimmed = key.strip_prefix("experimental.").unwrap_or(key);
    let trimmed = trimmed.strip_suffix(']').unwrap_or(trimmed);
    let Some((filter, field)) = trimmed.split_once('[') else {
        return Err(format!("invalid key: {key}"));
    };
    let matchers = values
        .iter()
        .map(|v| match v.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
            Some(inner) => ValueMatcher {
                match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(ListMatcher {
                    match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(ValueMatcher {
                        match_pattern: Some(value_matcher::MatchPattern::StringMatch(m::string(inner))),
                    }))),
                }))),
            },
            None => ValueMatcher {
                match_pattern: Some(value_matcher::MatchPattern::StringMatch(m::string(v))),
            },
        })
        .collect();
    let matcher = m::metadata_value(filter, &[field], m::or_values(matchers));
    Ok(Some(Permission {
        rule: Some(permission::Rule::Metadata(matcher)),
    }))
}

fn authenticated(name: xds_api::envoy::r#type::matcher::v3::StringMatcher) -> principal::Identifier {
    principal::Identifier::Authenticated(principal::Authenticated {
        principal_name: Some(name),
    })
}

fn principal(
    attr: PrincipalAttr,
    namespace: &str,
    key: &str,
    v: &str,
    for_tcp: bool,
) -> Result<Option<Principal>, String> {
    use principal::Identifier as I;
    let id = match attr {
        PrincipalAttr::SrcIp => I::DirectRemoteIp(m::cidr_range(v)?),
        PrincipalAttr::RemoteIp => I::RemoteIp(m::cidr_range(v)?),
        PrincipalAttr::SrcNamespace => {
            let ns = v.split('*').map(m::quote_meta).collect::<Vec<_>>().join(".*");
            authenticated(m::regex(&format!(".*/ns/{ns}/.*")))
        }
        PrincipalAttr::SrcTrustDomain => authenticated(if v == "*" {
            m::prefix("spiffe://", false)
        } else if !v.contains('*') {
            m::prefix(&format!("spiffe://{v}/"), false)
        } else {
            let (a, b) = v.split_once('*').unwrap_or((v, ""));
            m::regex(&format!("spiffe://{}[^/]*{}/.*", m::quote_meta(a), m::quote_meta(b)))
        }),
        PrincipalAttr::SrcServiceAccount => {
            let (ns, sa) = v.split_once('/').unwrap_or((namespace, v));
            authenticated(m::regex(&format!(
                "spiffe://.+/ns/{}/(.+/|)sa/{}(/.+)?",
                m::quote_meta(ns),
                m::quote_meta(sa)
            )))
        }
        PrincipalAttr::SrcPrincipal => authenticated(m::with_prefix(v, "spiffe://")),
        PrincipalAttr::RequestHeader => {
            http_only(key, for_tcp)?;
            let name = bracketed(key.strip_prefix(REQUEST_HEADER).unwrap_or(key))?;
            I::Header(m::header_matcher(&name, v))
        }
        _ => return Err(format!("{key}: values are matched together")),
    };
    Ok(Some(Principal { identifier: Some(id) }))
}

#[allow(deprecated)] // RBAC `metadata`, as Istio (see `envoy_filter_permission`)
fn extended_principal(
    attr: PrincipalAttr,
    key: &str,
    values: &[String],
    for_tcp: bool,
) -> Result<Option<Principal>, String> {
    http_only(key, for_tcp)?;
    use principal::Identifier as I;
    let id = match attr {
        PrincipalAttr::RequestPrincipal => return Ok(request_principals(values)),
        PrincipalAttr::RequestAudiences => I::Metadata(m::jwt_claims_list(&["aud".to_owned()], m::string_or(values))),
        PrincipalAttr::RequestPresenter => I::Metadata(m::jwt_claims_list(&["azp".to_owned()], m::string_or(values))),
        PrincipalAttr::RequestClaims => {
            let claims = nested_bracketed(key.strip_prefix(REQUEST_CLAIMS).unwrap_or(key))?;
            I::Metadata(m::jwt_claims_list(&claims, m::string_or(values)))
        }
        _ => return Err(format!("{key}: values are matched one by one")),
    };
    Ok(Some(Principal { identifier: Some(id) }))
}

#[allow(deprecated)] // RBAC `metadata`, as Istio (see `envoy_filter_permission`)
/// `<iss>/<sub>` (split at the last `/`, the issuer may be a URL) with `*` at either end, as
/// the JWT's `iss` and `sub` claims.
fn request_principals(values: &[String]) -> Option<Principal> {
    let any = || m::regex(".+");
    let mut or: Vec<Principal> = values
        .iter()
        .map(|value| {
            let split = value.rfind('/').map(|i| (&value[..i], &value[i + 1..]));
            let (iss, sub) = match (value.as_str(), split) {
                ("*", _) => (any(), any()),
                (v, Some((iss, sub))) if v.starts_with('*') => (
                    if iss == "*" { any() } else { m::suffix(&iss[1..], false) },
                    m::exact(sub, false),
                ),
                (v, None) if v.starts_with('*') => (any(), m::suffix(&v[1..], false)),
                (v, Some((iss, sub))) if v.ends_with('*') => (
                    m::exact(iss, false),
                    if sub == "*" {
                        any()
                    } else {
                        m::prefix(&sub[..sub.len() - 1], false)
                    },
                ),
                (v, None) if v.ends_with('*') => (m::prefix(&v[..v.len() - 1], false), any()),
                (_, Some((iss, sub))) => (m::exact(iss, false), m::exact(sub, false)),
                (v, None) => (m::exact(v, false), m::exact("", false)),
            };
            principal_and(vec![
                Principal {
                    identifier: Some(principal::Identifier::Metadata(m::jwt_claim_string("iss", iss))),
                },
                Principal {
                    identifier: Some(principal::Identifier::Metadata(m::jwt_claim_string("sub", sub))),
                },
            ])
        })
        .collect();
    match or.len() {
        0 => None,
        1 => or.pop(),
        _ => Some(principal_or(or)),
    }
}

/// `[name]` → `name`.
fn bracketed(s: &str) -> Result<String, String> {
    s.strip_prefix('[')
        .and_then(|s| s.strip_suffix(']'))
        .map(str::to_owned)
        .ok_or_else(|| format!("expecting format [<NAME>], but found {s}"))
}

/// Istio's `extractNameInNestedBrackets`: `[a][b]` → `[a, b]`; otherwise one bracketed name.
fn nested_bracketed(s: &str) -> Result<Vec<String>, String> {
    let mut claims = Vec::new();
    let mut rest = s;
    while !rest.is_empty() {
        let closing = rest
            .strip_prefix('[')
            .and_then(|r| r.find(['[', ']']).filter(|i| r.as_bytes()[*i] == b']').map(|i| (r, i)));
        match closing {
            Some((r, i)) => {
                claims.push(r[..i].to_owned());
                rest = &r[i + 1..];
            }
            None => return Ok(vec![bracketed(s)?]),
        }
    }
    Ok(claims)
}

fn permission_any() -> Permission {
    Permission {
        rule: Some(permission::Rule::Any(true)),
    }
}

fn permission_and(rules: Vec<Permission>) -> Permission {
    Permission {
        rule: Some(permission::Rule::AndRules(permission::Set { rules })),
    }
}

fn permission_or(rules: Vec<Permission>) -> Permission {
    Permission {
        rule: Some(permission::Rule::OrRules(permission::Set { rules })),
    }
}

fn permission_not(p: Permission) -> Permission {
    Permission {
        rule: Some(permission::Rule::NotRule(Box::new(p))),
    }
}

fn principal_any() -> Principal {
    Principal {
        identifier: Some(principal::Identifier::Any(true)),
    }
}

fn principal_and(ids: Vec<Principal>) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::AndIds(principal::Set { ids })),
    }
}

fn principal_or(ids: Vec<Principal>) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::OrIds(principal::Set { ids })),
    }
}

fn principal_not(p: Principal) -> Principal {
    Principal {
        identifier: Some(principal::Identifier::NotId(Box::new(p))),
    }
}

/// Istio's `rbacPolicyMatchNever`: a policy without rules matches nothing.
pub(crate) fn policy_match_never() -> Policy {
    Policy {
        permissions: vec![permission_not(permission_any())],
        principals: vec![principal_not(principal_any())],
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_claims_as_istio() {
        assert_eq!(nested_bracketed("[a][b]").unwrap(), ["a", "b"]);
        assert_eq!(nested_bracketed("[a]").unwrap(), ["a"]);
        assert!(nested_bracketed("a").is_err());
        assert_eq!(nested_bracketed("[a.b]").unwrap(), ["a.b"]);
    }
}
