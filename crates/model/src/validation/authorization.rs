//! Istio's `ValidateAuthorizationPolicy` (with `pkg/config/security`'s value checks) and the
//! CRD's constraints; the target reference checks are shared with RequestAuthentication.

use std::net::IpAddr;

use super::common::{Errors, check_selector};
use crate::networking::WorkloadSelector;
use crate::security::{AuthorizationPolicy, AuthzAction, Operation, PolicyTargetReference, Rule, Source};

/// `{*}` (one path segment) and `{**}` (any number, last only) in `paths`.
pub const MATCH_ONE_TEMPLATE: &str = "{*}";
pub const MATCH_ANY_TEMPLATE: &str = "{**}";

pub(crate) fn check_authorization_policy(errs: &mut Errors, ap: &AuthorizationPolicy) {
    check_scope(
        errs,
        ap.selector.as_ref(),
        ap.target_ref.as_ref(),
        &ap.target_refs,
        true,
    );
    if ap.action == AuthzAction::Custom {
        match &ap.rules {
            None => errs.add(
                "spec.rules",
                "CUSTOM action without `rules` is meaningless as it will never be triggered, add an empty rule \
                 `{}` if you want it be triggered for every request",
            ),
            Some(_) if ap.provider.as_ref().is_none_or(|p| p.name.is_empty()) => {
                errs.add("spec.provider.name", "`provider.name` must not be empty")
            }
            Some(rules) => {
                for (i, rule) in rules.iter().enumerate() {
                    if let Some(rule) = rule {
                        check_custom_rule(errs, i, rule);
                    }
                }
            }
        }
    }
    if ap.provider.is_some() && ap.action != AuthzAction::Custom {
        errs.add(
            "spec.provider",
            format!("`provider` must not be with non CUSTOM action, found {}", ap.action),
        );
    }
    if ap.action == AuthzAction::Deny && ap.rules.is_none() {
        errs.add(
            "spec.rules",
            "DENY action without `rules` is meaningless as it will never be triggered, add an empty rule `{}` \
             if you want it be triggered for every request",
        );
    }
    for (i, rule) in ap.rules.iter().flatten().enumerate() {
        let path = format!("spec.rules[{i}]");
        match rule {
            None => errs.add(&path, format!("`rule` must not be nil, found at rule {i}")),
            Some(rule) => check_rule(errs, &path, i, rule),
        }
    }
}

/// Istio: CUSTOM policies cannot match on identities (the ext_authz filter runs before them).
fn check_custom_rule(errs: &mut Errors, i: usize, rule: &Rule) {
    let path = format!("spec.rules[{i}]");
    for src in rule.from.iter().flatten().flatten().filter_map(|f| f.source.as_ref()) {
        let fields: [(&[String], &str); 10] = [
            (&src.namespaces, "From.Namespaces"),
            (&src.not_namespaces, "From.NotNamespaces"),
            (&src.service_accounts, "From.ServiceAccounts"),
            (&src.not_service_accounts, "From.NotServiceAccounts"),
            (&src.trust_domains, "From.TrustDomains"),
            (&src.not_trust_domains, "From.NotTrustDomains"),
            (&src.principals, "From.Principals"),
            (&src.not_principals, "From.NotPrincipals"),
            (&src.request_principals, "From.RequestPrincipals"),
            (&src.not_request_principals, "From.NotRequestPrincipals"),
        ];
        for (values, name) in fields {
            if !values.is_empty() {
                errs.add(&path, format!("{name} is currently not supported with CUSTOM action"));
            }
        }
    }
    for when in rule.when.iter().flatten() {
        let k = when.key.as_str();
        if matches!(
            k,
            "source.namespace" | "source.serviceAccount" | "source.trustDomain" | "source.principal"
        ) || k.starts_with("request.auth.")
        {
            errs.add(&path, format!("{k} is currently not supported with CUSTOM action"));
        }
    }
}

fn check_rule(errs: &mut Errors, path: &str, i: usize, rule: &Rule) {
    if rule.from.as_ref().is_some_and(Vec::is_empty) {
        errs.add(path, format!("`from` must not be empty, found at rule {i}"));
    }
    for from in rule.from.iter().flatten() {
        match from.as_ref().map(|f| f.source.as_ref()) {
            None => errs.add(path, format!("`from` must not be nil, found at rule {i}")),
            Some(None) => errs.add(path, format!("`from.source` must not be nil, found at rule {i}")),
            Some(Some(src)) => check_source(errs, path, i, src),
        }
    }
    if rule.to.as_ref().is_some_and(Vec::is_empty) {
        errs.add(path, format!("`to` must not be empty, found at rule {i}"));
    }
    for to in rule.to.iter().flatten() {
        match to.as_ref().map(|t| t.operation.as_ref()) {
            None => errs.add(path, format!("`to` must not be nil, found at rule {i}")),
            Some(None) => errs.add(path, format!("`to.operation` must not be nil, found at rule {i}")),
            Some(Some(op)) => check_operation(errs, path, i, op),
        }
    }
    for condition in &rule.when {
        let Some(c) = condition else {
            errs.add(path, "when field cannot be nil");
            continue;
        };
        if c.key.is_empty() {
            errs.add(path, "`key` must not be empty");
        } else if c.values.is_empty() && c.not_values.is_empty() {
            errs.add(
                path,
                format!("at least one of `values` or `notValues` must be set for key {}", c.key),
            );
        } else {
            if let Err(e) = validate_attribute(&c.key, &c.values) {
                errs.add(path, format!("invalid `value` for `key` {}: {e}", c.key));
            }
            if let Err(e) = validate_attribute(&c.key, &c.not_values) {
                errs.add(path, format!("invalid `notValue` for `key` {}: {e}", c.key));
            }
        }
    }
}

fn check_source(errs: &mut Errors, path: &str, i: usize, src: &Source) {
    let identities = src.principals.len() + src.not_principals.len() + src.namespaces.len() + src.not_namespaces.len();
    if identities > 0 && src.service_accounts.len() + src.not_service_accounts.len() > 0 {
        errs.add(
            path,
            format!("cannot set serviceAccounts with namespaces or principals, found at rule {i}"),
        );
    }
    if src.is_empty() {
        errs.add(path, format!("`from.source` must not be empty, found at rule {i}"));
    }
    for ips in [
        &src.ip_blocks,
        &src.not_ip_blocks,
        &src.remote_ip_blocks,
        &src.not_remote_ip_blocks,
    ] {
        errs.check(path, validate_ips(ips));
    }
    let non_empty: [(&str, &[String]); 10] = [
        ("Principals", &src.principals),
        ("RequestPrincipals", &src.request_principals),
        ("Namespaces", &src.namespaces),
        ("IpBlocks", &src.ip_blocks),
        ("RemoteIpBlocks", &src.remote_ip_blocks),
        ("NotPrincipals", &src.not_principals),
        ("NotRequestPrincipals", &src.not_request_principals),
        ("NotNamespaces", &src.not_namespaces),
        ("NotIpBlocks", &src.not_ip_blocks),
        ("NotRemoteIpBlocks", &src.not_remote_ip_blocks),
    ];
    for (key, values) in non_empty {
        errs.check(path, check_empty_values(key, values));
    }
    errs.check(path, check_service_accounts("ServiceAccounts", &src.service_accounts));
    errs.check(
        path,
        check_service_accounts("NotServiceAccounts", &src.not_service_accounts),
    );
    errs.check(path, check_trust_domains("TrustDomains", &src.trust_domains));
    errs.check(path, check_trust_domains("NotTrustDomains", &src.not_trust_domains));
}

fn check_operation(errs: &mut Errors, path: &str, i: usize, op: &Operation) {
    if op.is_empty() {
        errs.add(path, format!("`to.operation` must not be empty, found at rule {i}"));
    }
    errs.check(path, validate_ports(&op.ports));
    errs.check(path, validate_ports(&op.not_ports));
    let non_empty: [(&str, &[String]); 8] = [
        ("Ports", &op.ports),
        ("Methods", &op.methods),
        ("Paths", &op.paths),
        ("Hosts", &op.hosts),
        ("NotPorts", &op.not_ports),
        ("NotMethods", &op.not_methods),
        ("NotPaths", &op.not_paths),
        ("NotHosts", &op.not_hosts),
    ];
    for (key, values) in non_empty {
        errs.check(path, check_empty_values(key, values));
    }
    errs.check(path, check_path_templates("Paths", &op.paths));
    errs.check(path, check_path_templates("NotPaths", &op.not_paths));
}

/// `validateOneOfSelectorType`, `validateWorkloadSelector` and `validatePolicyTargetReference(s)`;
/// `gateway_kinds`: AuthorizationPolicy may also target a Gateway or GatewayClass.
pub(crate) fn check_scope(
    errs: &mut Errors,
    selector: Option<&WorkloadSelector>,
    target_ref: Option<&PolicyTargetReference>,
    target_refs: &[PolicyTargetReference],
    gateway_kinds: bool,
) {
    let set =
        usize::from(selector.is_some()) + usize::from(target_ref.is_some()) + usize::from(!target_refs.is_empty());
    if set > 1 {
        errs.add("spec", "only one of targetRefs or selector can be set");
    }
    if let Some(s) = selector {
        check_selector(errs, "spec.selector.matchLabels", &s.match_labels);
    }
    let refs = target_ref.map(|r| ("spec.targetRef".to_owned(), r)).into_iter().chain(
        target_refs
            .iter()
            .enumerate()
            .map(|(i, r)| (format!("spec.targetRefs[{i}]"), r)),
    );
    for (path, r) in refs {
        check_target_ref(errs, &path, r, gateway_kinds);
    }
}

fn check_target_ref(errs: &mut Errors, path: &str, r: &PolicyTargetReference, gateway_kinds: bool) {
    if r.name.is_empty() {
        errs.add(&format!("{path}.name"), "Required value: targetRef name must be set");
    }
    if !r.namespace.is_empty() {
        errs.add(
            &format!("{path}.namespace"),
            "targetRef namespace must not be set; cross namespace referencing is not currently supported",
        );
    }
    if !is_group_name(&r.group) {
        errs.add(
            &format!("{path}.group"),
            format!("{:?}: should match a DNS subdomain", r.group),
        );
    }
    if !is_kind_name(&r.kind) {
        errs.add(
            &format!("{path}.kind"),
            format!("{:?}: should match a kind name", r.kind),
        );
    }
    let group = if r.group.is_empty() { "core" } else { r.group.as_str() };
    let allowed = matches!(
        (group, r.kind.as_str()),
        ("core", "Service") | ("networking.istio.io", "ServiceEntry")
    ) || (gateway_kinds
        && matches!(
            (group, r.kind.as_str()),
            ("gateway.networking.k8s.io", "Gateway" | "GatewayClass")
        ));
    if !allowed {
        errs.add(
            path,
            format!(
                "targetRef must be to one of Service, ServiceEntry, Gateway, GatewayClass but was {}/{}",
                r.group, r.kind
            ),
        );
    }
}

/// The CRD's group pattern: empty, or a lowercase DNS subdomain.
fn is_group_name(g: &str) -> bool {
    g.is_empty() || super::is_dns1123_subdomain(g)
}

/// The CRD's kind pattern `^[a-zA-Z]([-a-zA-Z0-9]*[a-zA-Z0-9])?$`.
fn is_kind_name(k: &str) -> bool {
    let b = k.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphabetic()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        && b[b.len() - 1].is_ascii_alphanumeric()
}

fn check_empty_values(key: &str, values: &[String]) -> Result<(), String> {
    if values.iter().any(String::is_empty) {
        return Err(format!("empty value not allowed, found in {key}"));
    }
    Ok(())
}

fn check_wildcard_values(key: &str, values: &[String]) -> Result<(), String> {
    check_empty_values(key, values)?;
    for v in values {
        let count = v.matches('*').count();
        if count > 1 {
            return Err(format!("at most one wildcard is allowed, found in {key}: {v:?}"));
        }
        if count == 1 && v != "*" && !v.starts_with('*') && !v.ends_with('*') {
            return Err(format!(
                "wildcard is only allowed at the start or end, found in {key}: {v:?}"
            ));
        }
    }
    Ok(())
}

fn check_trust_domains(key: &str, values: &[String]) -> Result<(), String> {
    check_wildcard_values(key, values)?;
    if let Some(v) = values.iter().find(|v| v.contains('/')) {
        return Err(format!("trust domain must not contain '/', found in {key}: {v:?}"));
    }
    Ok(())
}

/// `CheckServiceAccount`: `sa` or `namespace/sa`, no wildcard, at most 16 values of 320 characters.
fn check_service_accounts(key: &str, values: &[String]) -> Result<(), String> {
    if values.len() > 16 {
        return Err("may not have more than 16 values".into());
    }
    for v in values {
        if v.is_empty() {
            return Err(format!("empty value not allowed, found in {key}"));
        }
        if v.contains('*') {
            return Err(format!("wildcard not allowed, found in {key}"));
        }
        if v.matches('/').count() > 1 {
            return Err(format!(
                "expected format 'serviceAccount' or 'namespace/serviceAccount', found {v:?} in {key}"
            ));
        }
        if v.len() > 320 {
            return Err(format!("value cannot exceed 320 characters, found {v:?} in {key}"));
        }
        if let Some((ns, sa)) = v.split_once('/') {
            if ns.is_empty() {
                return Err(format!(
                    "expected format 'serviceAccount' or 'namespace/serviceAccount', found empty namespace {v:?} in {key}"
                ));
            }
            if sa.is_empty() {
                return Err(format!(
                    "expected format 'serviceAccount' or 'namespace/serviceAccount', found empty serviceAccount {v:?} in {key}"
                ));
            }
        }
    }
    Ok(())
}

/// Whether a path uses `{*}` or `{**}`.
pub fn contains_path_template(path: &str) -> bool {
    path.contains(MATCH_ONE_TEMPLATE) || path.contains(MATCH_ANY_TEMPLATE)
}

/// `CheckValidPathTemplate`: `{**}` last, no other braces, literal segments of URI characters.
fn check_path_templates(key: &str, paths: &[String]) -> Result<(), String> {
    for path in paths {
        let template = contains_path_template(path);
        let mut any_seen = false;
        let trimmed = path.trim_matches('/');
        for glob in trimmed.split('/') {
            if glob == MATCH_ONE_TEMPLATE && !any_seen {
                continue;
            }
            if glob == MATCH_ANY_TEMPLATE && !any_seen {
                any_seen = true;
                continue;
            }
            if glob == MATCH_ANY_TEMPLATE || glob == MATCH_ONE_TEMPLATE {
                return Err(format!(
                    "invalid or unsupported path {trimmed}, found in {key}. {{**}} is not the last operator"
                ));
            }
            if glob.contains(['{', '}']) {
                return Err(format!(
                    "invalid or unsupported path {trimmed}, found in {key}. Contains '{{' or '}}' beyond a supported path template"
                ));
            }
            if template && !is_valid_literal(glob) {
                return Err(format!(
                    "invalid or unsupported path {trimmed}, found in {key}. Contains segment {glob} with invalid string literal"
                ));
            }
        }
    }
    Ok(())
}

/// `^[a-zA-Z0-9-._~%!$&'()+,;:@=]+$`.
fn is_valid_literal(glob: &str) -> bool {
    !glob.is_empty()
        && glob
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~%!$&'()+,;:@=".contains(&b))
}

/// `ValidateAttribute`: the `when` keys Istio knows, with their values' formats.
fn validate_attribute(key: &str, values: &[String]) -> Result<(), String> {
    check_empty_values(key, values)?;
    match key {
        "source.ip" | "remote.ip" | "destination.ip" => validate_ips(values),
        "source.serviceAccount" => check_service_accounts(key, values),
        "source.trustDomain" => check_wildcard_values(key, values),
        "destination.port" => validate_ports(values),
        "source.namespace"
        | "source.principal"
        | "request.auth.principal"
        | "request.auth.audiences"
        | "request.auth.presenter"
        | "connection.sni" => Ok(()),
        "destination.namespace" => Err(format!("attribute {key} is replaced by the metadata.namespace")),
        "destination.name" | "destination.user" => {
            Err(format!("deprecated attribute {key}: only supported in v1alpha1"))
        }
        k if k.starts_with("request.headers")
            || k.starts_with("request.auth.claims")
            || k.starts_with("experimental.envoy.filters.") =>
        {
            validate_map_key(k)
        }
        k if k.starts_with("destination.labels") => Err(format!("attribute {k} is replaced by the workload selector")),
        k => Err(format!("unknown attribute: {k}")),
    }
}

/// `a[b]`: a name, then a non-empty bracketed key at the end.
fn validate_map_key(key: &str) -> Result<(), String> {
    match key.find('[') {
        Some(open) if key.ends_with(']') && open > 0 && open < key.len() - 2 => Ok(()),
        _ => Err(format!("bad key ({key}): should have format a[b]")),
    }
}

/// An IP address or a CIDR range each.
pub(super) fn validate_ips(values: &[String]) -> Result<(), String> {
    let bad: Vec<String> = values
        .iter()
        .filter_map(|v| match v.split_once('/') {
            Some(_) if parse_cidr(v).is_none() => Some(format!("bad CIDR range ({v})")),
            None if v.parse::<IpAddr>().is_err() => Some(format!("bad IP address ({v})")),
            _ => None,
        })
        .collect();
    if bad.is_empty() { Ok(()) } else { Err(bad.join("; ")) }
}

/// `address/len` with `len` within the family's bits.
pub fn parse_cidr(v: &str) -> Option<(IpAddr, u32)> {
    let (addr, len) = v.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    let len: u32 = len.parse().ok()?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    (len <= max).then_some((addr, len))
}

/// Ports 0..=65535 as decimal strings.
pub(super) fn validate_ports(values: &[String]) -> Result<(), String> {
    // Go's ParseUint: digits only (no sign)
    match values
        .iter()
        .find(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) || p.parse::<u16>().is_err())
    {
        Some(p) => Err(format!("bad port ({p})")),
        None => Ok(()),
    }
}

#[cfg(test)]
#[path = "authorization_tests.rs"]
mod tests;
