//! Envoy matchers for AuthorizationPolicy values, as Istio's `security/authz/matcher`: `*` alone
//! matches any non-empty value, a leading `*` is a suffix match, a trailing `*` a prefix match.

use xds_api::envoy::config::core::v3::{CidrRange, TypedExtensionConfig};
use xds_api::envoy::config::route::v3::{HeaderMatcher, header_matcher::HeaderMatchSpecifier};
use xds_api::envoy::extensions::path::r#match::uri_template::v3::UriTemplateMatchConfig;
use xds_api::envoy::r#type::matcher::v3::{
    ListMatcher, MetadataMatcher, OrMatcher, PathMatcher, RegexMatcher, StringMatcher, ValueMatcher, list_matcher,
    metadata_matcher, path_matcher, string_matcher, value_matcher,
};
use xds_api::pbwkt::UInt32Value;

/// The dynamic metadata namespace of Envoy's JWT filter, and the key of the verified payload
/// (Istio's `EnvoyJwtFilterName`, `EnvoyJwtFilterPayload`).
pub(crate) const JWT_FILTER: &str = "envoy.filters.http.jwt_authn";
pub(crate) const JWT_PAYLOAD: &str = "payload";

pub(crate) fn exact(v: &str, ignore_case: bool) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::Exact(v.to_owned())),
        ignore_case,
    }
}

pub(crate) fn prefix(v: &str, ignore_case: bool) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::Prefix(v.to_owned())),
        ignore_case,
    }
}

pub(crate) fn suffix(v: &str, ignore_case: bool) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::Suffix(v.to_owned())),
        ignore_case,
    }
}

pub(crate) fn regex(re: &str) -> StringMatcher {
    StringMatcher {
        match_pattern: Some(string_matcher::MatchPattern::SafeRegex(RegexMatcher {
            regex: re.to_owned(),
            ..Default::default()
        })),
        ignore_case: false,
    }
}

/// Go's `regexp.QuoteMeta`: a backslash before every RE2 metacharacter.
pub(crate) fn quote_meta(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Istio's `StringMatcher`.
pub(crate) fn string(v: &str) -> StringMatcher {
    with_prefix(v, "")
}

/// Istio's `StringMatcherWithPrefix`: `prefix` inserted before the value (ignored for `*`).
pub(crate) fn with_prefix(v: &str, pre: &str) -> StringMatcher {
    if v == "*" {
        return regex(".+");
    }
    if let Some(rest) = v.strip_prefix('*') {
        if pre.is_empty() {
            return suffix(rest, false);
        }
        return regex(&format!("{pre}.*{}", quote_meta(rest)));
    }
    if let Some(rest) = v.strip_suffix('*') {
        return prefix(&format!("{pre}{rest}"), false);
    }
    exact(&format!("{pre}{v}"), false)
}

fn header(name: &str, v: &str, ignore_case: bool) -> HeaderMatcher {
    let specifier = if v == "*" {
        HeaderMatchSpecifier::PresentMatch(true)
    } else if let Some(rest) = v.strip_prefix('*') {
        HeaderMatchSpecifier::StringMatch(suffix(rest, ignore_case))
    } else if let Some(rest) = v.strip_suffix('*') {
        HeaderMatchSpecifier::StringMatch(prefix(rest, ignore_case))
    } else {
        HeaderMatchSpecifier::StringMatch(exact(v, ignore_case))
    };
    HeaderMatcher {
        name: name.to_owned(),
        header_match_specifier: Some(specifier),
        ..Default::default()
    }
}

/// Istio's `HeaderMatcher`: case-sensitive.
pub(crate) fn header_matcher(name: &str, v: &str) -> HeaderMatcher {
    header(name, v, false)
}

/// Istio's `HostMatcher`: host names compare case-insensitively.
pub(crate) fn host_matcher(name: &str, v: &str) -> HeaderMatcher {
    header(name, v, true)
}

pub(crate) fn path_matcher(path: &str) -> PathMatcher {
    PathMatcher {
        rule: Some(path_matcher::Rule::Path(string(path))),
    }
}

/// Istio's `PathTemplateMatcher`: `{*}` → `*`, `{**}` → `**`, as a `uri-template` extension.
pub(crate) fn path_template(path: &str) -> TypedExtensionConfig {
    let template = path
        .replace(model::validation::MATCH_ANY_TEMPLATE, "**")
        .replace(model::validation::MATCH_ONE_TEMPLATE, "*");
    TypedExtensionConfig {
        name: "uri-template".into(),
        typed_config: Some(xds_api::pack(&UriTemplateMatchConfig {
            path_template: template,
        })),
    }
}

fn string_value(m: StringMatcher) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)),
    }
}

/// Istio's `OrMatcher`: the single matcher itself, else an OR of them.
pub(crate) fn or_values(mut matchers: Vec<ValueMatcher>) -> ValueMatcher {
    if matchers.len() == 1 {
        return matchers.remove(0);
    }
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
            value_matchers: matchers,
        })),
    }
}

/// Istio's `StringOrMatcher`.
pub(crate) fn string_or(values: &[String]) -> ValueMatcher {
    or_values(values.iter().map(|v| string_value(string(v))).collect())
}

fn path(keys: &[&str]) -> Vec<metadata_matcher::PathSegment> {
    keys.iter()
        .map(|k| metadata_matcher::PathSegment {
            segment: Some(metadata_matcher::path_segment::Segment::Key((*k).to_owned())),
        })
        .collect()
}

/// Istio's `MetadataValueMatcher`: `filter` metadata at `key`.
pub(crate) fn metadata_value(filter: &str, keys: &[&str], value: ValueMatcher) -> MetadataMatcher {
    MetadataMatcher {
        filter: filter.to_owned(),
        path: path(keys),
        value: Some(value),
        invert: false,
    }
}

fn one_of(value: ValueMatcher) -> ValueMatcher {
    ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(ListMatcher {
            match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(value))),
        }))),
    }
}

/// Istio's `MetadataListValueMatcher`: a list containing a value; `extended_jwt` also accepts the
/// value itself (claims that are strings, not lists).
pub(crate) fn metadata_list_value(
    filter: &str,
    keys: &[&str],
    value: ValueMatcher,
    extended_jwt: bool,
) -> MetadataMatcher {
    let list = one_of(value.clone());
    let value = if extended_jwt {
        or_values(vec![list, value])
    } else {
        list
    };
    metadata_value(filter, keys, value)
}

/// A claim of the verified JWT (`payload.<claim>`) matching `m` (Istio's `MetadataStringMatcherForJWTClaim`).
pub(crate) fn jwt_claim_string(claim: &str, m: StringMatcher) -> MetadataMatcher {
    metadata_value(JWT_FILTER, &[JWT_PAYLOAD, claim], string_value(m))
}

/// Nested claims (`payload.<c1>.<c2>...`) holding, or listing, one of the values (Istio's
/// `MetadataListValueMatcherForJWTClaims`).
pub(crate) fn jwt_claims_list(claims: &[String], value: ValueMatcher) -> MetadataMatcher {
    let mut keys = vec![JWT_PAYLOAD];
    keys.extend(claims.iter().map(String::as_str));
    metadata_list_value(JWT_FILTER, &keys, value, true)
}

/// Istio's `AddrStrToCidrRange`: an address (full length) or `address/len`, the address unmasked.
pub(crate) fn cidr_range(v: &str) -> Result<CidrRange, String> {
    let (addr, len) = if v.contains('/') {
        model::validation::parse_cidr(v).ok_or_else(|| format!("invalid CIDR range {v:?}"))?
    } else {
        let addr: std::net::IpAddr = v.parse().map_err(|_| format!("invalid IP address {v:?}"))?;
        (addr, if addr.is_ipv4() { 32 } else { 128 })
    };
    Ok(CidrRange {
        address_prefix: addr.to_string(),
        prefix_len: Some(UInt32Value { value: len }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_as_istio() {
        assert_eq!(string("*"), regex(".+"));
        assert_eq!(string("*.x"), suffix(".x", false));
        assert_eq!(string("a*"), prefix("a", false));
        assert_eq!(with_prefix("*/sa/x", "spiffe://"), regex("spiffe://.*/sa/x"));
        assert_eq!(
            with_prefix("td/ns/a/sa/b", "spiffe://"),
            exact("spiffe://td/ns/a/sa/b", false)
        );
        assert_eq!(quote_meta("a.b[0]"), r"a\.b\[0\]");
        assert_eq!(cidr_range("10.1.2.3/8").unwrap().address_prefix, "10.1.2.3");
        assert_eq!(cidr_range("::1").unwrap().prefix_len, Some(UInt32Value { value: 128 }));
        assert!(cidr_range("x").is_err());
    }
}
