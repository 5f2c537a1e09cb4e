//! Istio's `ValidateRequestAuthentication` (`validateJwtRule`) and the CRD's constraints.

use super::authorization::check_scope;
use super::common::{Errors, validate_duration};
use crate::security::{JwtRule, RequestAuthentication};

pub(crate) fn check_request_authentication(errs: &mut Errors, ra: &RequestAuthentication) {
    check_scope(
        errs,
        ra.selector.as_ref(),
        ra.target_ref.as_ref(),
        &ra.target_refs,
        false,
    );
    for (i, rule) in ra.jwt_rules.iter().enumerate() {
        let path = format!("spec.jwtRules[{i}]");
        match rule {
            None => errs.add(&path, "in body must be of type object"),
            Some(rule) => check_jwt_rule(errs, &path, rule),
        }
    }
}

fn check_jwt_rule(errs: &mut Errors, path: &str, rule: &JwtRule) {
    for (i, aud) in rule.audiences.iter().enumerate() {
        if aud.is_empty() {
            errs.add(
                &format!("{path}.audiences[{i}]"),
                "audience must be non-empty string (audiences[{i}] in body should be at least 1 chars long)",
            );
        }
    }
    if rule.issuer.is_empty() && rule.jwks_uri.is_empty() {
        errs.add(path, "issuer or jwksUri must be non-empty string");
    }
    if !rule.jwks_uri.is_empty()
        && let Err(e) = parse_jwks_uri(&rule.jwks_uri)
    {
        errs.add(&format!("{path}.jwksUri"), e);
    }
    if !rule.jwks.is_empty()
        && let Err(e) = check_jwks(&rule.jwks)
    {
        errs.add(&format!("{path}.jwks"), format!("jwks parse error: {e}"));
    }
    check_token_locations(errs, path, rule);
    check_claims_to_headers(errs, path, rule);
    if let Some(t) = &rule.timeout
        && let Err(e) = validate_duration(t)
    {
        errs.add(
            &format!("{path}.timeout"),
            format!("{e} (must be a valid duration greater than 1ms)"),
        );
    }
    if let Some(p) = &rule.presence
        && !matches!(p.as_str(), "OPTIONAL" | "REQUIRED")
    {
        errs.add(
            &format!("{path}.presence"),
            format!("Unsupported value: {p:?}: supported values: \"OPTIONAL\", \"REQUIRED\""),
        );
    }
}

/// Where the token may be: headers, query parameters, cookies (and the claims split on spaces).
fn check_token_locations(errs: &mut Errors, path: &str, rule: &JwtRule) {
    for (i, h) in rule.from_headers.iter().enumerate() {
        if h.name.is_empty() {
            errs.add(
                &format!("{path}.fromHeaders[{i}].name"),
                "Required value: location header name must be non-empty string",
            );
        }
    }
    let lists: [(&str, &[String], &str); 3] = [
        (
            "fromParams",
            &rule.from_params,
            "location query must be non-empty string",
        ),
        (
            "fromCookies",
            &rule.from_cookies,
            "cookie name must be non-empty string",
        ),
        (
            "spaceDelimitedClaims",
            &rule.space_delimited_claims,
            "claim name must be non-empty string",
        ),
    ];
    for (field, values, reason) in lists {
        for (i, _) in values.iter().enumerate().filter(|(_, v)| v.is_empty()) {
            errs.add(
                &format!("{path}.{field}[{i}]"),
                format!("{reason} ({field}[{i}] in body should be at least 1 chars long)"),
            );
        }
    }
}

/// `outputClaimToHeaders`: a claim and a valid header name each.
fn check_claims_to_headers(errs: &mut Errors, path: &str, rule: &JwtRule) {
    for (i, c) in rule.output_claim_to_headers.iter().enumerate() {
        let here = format!("{path}.outputClaimToHeaders[{i}]");
        let Some(c) = c else {
            errs.add(
                &here,
                "outputClaimToHeaders must not be null (in body must be of type object)",
            );
            continue;
        };
        if c.claim.is_empty() || c.header.is_empty() {
            errs.add(
                &here,
                "outputClaimToHeaders header and claim value must be non-empty string (claim/header in body should \
                 be at least 1 chars long)",
            );
            continue;
        }
        if !c
            .header
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            errs.add(
                &format!("{here}.header"),
                format!(
                    "header name {} is not a valid header name (header in body should match '^[-_A-Za-z0-9]+$')",
                    c.header
                ),
            );
        }
    }
}

/// A JWKS URI as Istio's `ParseJwksURI`: http or https, a host, an optional port.
/// Returns (https, host, port).
pub fn parse_jwks_uri(uri: &str) -> Result<(bool, String, u16), String> {
    if uri.chars().any(|c| c.is_control() || c == ' ') {
        return Err(format!("{uri:?}: invalid control character in URL"));
    }
    let Some((scheme, rest)) = uri.split_once("://") else {
        return Err(format!("{uri:?}: url must have scheme http or https"));
    };
    let https = match scheme.to_ascii_lowercase().as_str() {
        "http" => false,
        "https" => true,
        other => return Err(format!("URI scheme {other:?} is not supported")),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']').ok_or_else(|| format!("{uri:?}: bad IPv6 host"))?;
        (h.to_owned(), after.strip_prefix(':'))
    } else {
        match authority.rsplit_once(':') {
            Some((h, p)) => (h.to_owned(), Some(p)),
            None => (authority.to_owned(), None),
        }
    };
    let port = match port {
        None | Some("") => {
            if https {
                443
            } else {
                80
            }
        }
        Some(p) => p.parse::<u16>().map_err(|_| format!("{uri:?}: invalid port {p:?}"))?,
    };
    if host.is_empty() {
        return Err(format!("{uri:?}: url must have a host"));
    }
    Ok((https, host, port))
}

/// A JWKS document: a JSON object with a `keys` array of objects with a `kty` each.
fn check_jwks(jwks: &str) -> Result<(), String> {
    let v: serde_json::Value = serde_json::from_str(jwks).map_err(|e| e.to_string())?;
    let keys = v
        .get("keys")
        .and_then(serde_json::Value::as_array)
        .ok_or("no \"keys\" array")?;
    for (i, k) in keys.iter().enumerate() {
        if k.get("kty").and_then(serde_json::Value::as_str).is_none() {
            return Err(format!("key {i} has no \"kty\""));
        }
    }
    Ok(())
}
