//! Istio's `HTTPMatchRequest` to Envoy's `RouteMatch`, as `TranslateRouteMatch` in
//! `pilot/pkg/networking/core/route/route.go`: URI, headers, withoutHeaders, method, authority,
//! scheme and query parameters.

use model::networking::{HttpMatchRequest, MatchType, StringMatch};
use xds_api::envoy::config::route::v3::{
    HeaderMatcher, QueryParameterMatcher, RouteMatch, header_matcher::HeaderMatchSpecifier,
    query_parameter_matcher::QueryParameterMatchSpecifier, route_match::PathSpecifier,
};
use xds_api::envoy::r#type::matcher::v3::{
    MetadataMatcher, RegexMatcher, StringMatcher, ValueMatcher, metadata_matcher, string_matcher::MatchPattern,
    value_matcher,
};
use xds_api::pbwkt::BoolValue;

/// Pseudo-headers with special meaning in Envoy.
pub(crate) const HEADER_METHOD: &str = ":method";
pub(crate) const HEADER_AUTHORITY: &str = ":authority";
pub(crate) const HEADER_SCHEME: &str = ":scheme";

/// Header names that route on JWT claims (`@request.auth.claims.<name>` or `@request.auth.claims[a][b]`).
const HEADER_JWT_CLAIM: &str = "@request.auth.claims";
const ENVOY_JWT_FILTER: &str = "envoy.filters.http.jwt_authn";
const ENVOY_JWT_FILTER_PAYLOAD: &str = "payload";

/// Translates one match condition; `None` is the catch-all `prefix: /`.
pub(crate) fn translate_route_match(m: Option<&HttpMatchRequest>) -> RouteMatch {
    let mut out = RouteMatch {
        path_specifier: Some(PathSpecifier::Prefix("/".into())),
        ..Default::default()
    };
    let Some(m) = m else {
        return out;
    };
    for (name, sm) in &m.headers {
        match jwt_claim_matcher(name, sm) {
            Some(metadata) => out.dynamic_metadata.push(metadata),
            None => out.headers.push(header_matcher(name, sm)),
        }
    }
    for (name, sm) in &m.without_headers {
        match jwt_claim_matcher(name, sm) {
            Some(mut metadata) => {
                metadata.invert = true;
                out.dynamic_metadata.push(metadata);
            }
            None => {
                let mut h = header_matcher(name, sm);
                h.invert_match = true;
                // treat_missing_header_as_empty conflicts with present_match
                h.treat_missing_header_as_empty = !is_presence_match(sm);
                out.headers.push(h);
            }
        }
    }
    // guarantee ordering of headers, as Istio
    out.headers.sort_by(|a, b| a.name.cmp(&b.name));

    if let Some(uri) = &m.uri {
        match uri.match_type() {
            Some(MatchType::Exact(p)) => out.path_specifier = Some(PathSpecifier::Path(p.to_owned())),
            Some(MatchType::Prefix(p)) => out.path_specifier = Some(PathSpecifier::Prefix(p.to_owned())),
            Some(MatchType::Regex(r)) => out.path_specifier = Some(PathSpecifier::SafeRegex(regex_matcher(r))),
            None => {}
        }
    }
    out.case_sensitive = Some(BoolValue {
        value: !m.ignore_uri_case,
    });
    for (name, sm) in [
        (HEADER_METHOD, &m.method),
        (HEADER_AUTHORITY, &m.authority),
        (HEADER_SCHEME, &m.scheme),
    ] {
        if let Some(sm) = sm {
            out.headers.push(header_matcher(name, sm));
        }
    }
    for (name, sm) in &m.query_params {
        let specifier = if is_presence_match(sm) {
            QueryParameterMatchSpecifier::PresentMatch(true)
        } else {
            match string_matcher(sm) {
                Some(s) => QueryParameterMatchSpecifier::StringMatch(s),
                None => QueryParameterMatchSpecifier::PresentMatch(true),
            }
        };
        out.query_parameters.push(QueryParameterMatcher {
            name: name.clone(),
            query_parameter_match_specifier: Some(specifier),
        });
    }
    out
}

/// Istio's Ingress route semantics (`UseIngressSemantics` in `TranslateRouteMatch`): a URI prefix
/// other than `/` matches whole path segments, as Envoy's `path_separated_prefix` (the prefix
/// without its trailing `/`): `/foo` matches `/foo` and `/foo/bar`, not `/foobar`. A prefix Envoy
/// refuses there (`^[^?#]+[^?#/]$`: with `?` or `#`, or still ending in `/`) stays a plain prefix
/// instead of being NACKed.
pub(crate) fn path_separated(m: &mut RouteMatch) {
    let Some(PathSpecifier::Prefix(p)) = &m.path_specifier else {
        return;
    };
    if p == "/" {
        return;
    }
    let path = p.strip_suffix('/').unwrap_or(p);
    if !path.is_empty() && !path.ends_with('/') && !path.contains(['?', '#']) {
        m.path_specifier = Some(PathSpecifier::PathSeparatedPrefix(path.to_owned()));
    }
}

/// `HeaderMatcher` for one StringMatch; an empty match (or regex `*`) means "present", as Istio.
pub(crate) fn header_matcher(name: &str, sm: &StringMatch) -> HeaderMatcher {
    let specifier = if is_presence_match(sm) {
        HeaderMatchSpecifier::PresentMatch(true)
    } else {
        match string_matcher(sm) {
            Some(s) => HeaderMatchSpecifier::StringMatch(s),
            None => HeaderMatchSpecifier::PresentMatch(true),
        }
    };
    HeaderMatcher {
        name: name.to_owned(),
        header_match_specifier: Some(specifier),
        ..Default::default()
    }
}

/// Istio's `canBeConvertedToPresentMatch`: no match type, or the regex `*` (not RE2; it means "any").
/// An empty prefix matches every value too; Envoy rejects `prefix: ""` in a StringMatcher, so it
/// becomes a presence match here.
fn is_presence_match(sm: &StringMatch) -> bool {
    matches!(
        sm.match_type(),
        None | Some(MatchType::Regex("*")) | Some(MatchType::Prefix(""))
    )
}

/// Istio's `ConvertToEnvoyMatch`.
pub(crate) fn string_matcher(sm: &StringMatch) -> Option<StringMatcher> {
    let pattern = match sm.match_type()? {
        MatchType::Exact(s) => MatchPattern::Exact(s.to_owned()),
        MatchType::Prefix(s) => MatchPattern::Prefix(s.to_owned()),
        MatchType::Regex(r) => MatchPattern::SafeRegex(regex_matcher(r)),
    };
    Some(StringMatcher {
        match_pattern: Some(pattern),
        ignore_case: false,
    })
}

/// A RE2 `RegexMatcher` (Envoy's default engine is Google RE2).
pub(crate) fn regex_matcher(regex: &str) -> RegexMatcher {
    RegexMatcher {
        regex: regex.to_owned(),
        engine_type: None,
    }
}

/// A header named `@request.auth.claims...` routes on a JWT claim: a dynamic metadata matcher on
/// the JWT filter's payload, as Istio's `translateMetadataMatch`. Without a JWT filter (not yet
/// generated) it never matches, which fails closed.
fn jwt_claim_matcher(name: &str, sm: &StringMatch) -> Option<MetadataMatcher> {
    let lower = name.to_ascii_lowercase();
    let rest = lower
        .strip_prefix(HEADER_JWT_CLAIM)
        .map(|_| &name[HEADER_JWT_CLAIM.len()..])?;
    let claims: Vec<&str> = if let Some(dotted) = rest.strip_prefix('.').filter(|s| !s.is_empty()) {
        dotted.split('.').collect()
    } else if rest.len() > 2 && rest.starts_with('[') && rest.ends_with(']') {
        rest[1..rest.len() - 1].split("][").collect()
    } else {
        return None;
    };
    let path = std::iter::once(ENVOY_JWT_FILTER_PAYLOAD)
        .chain(claims)
        .map(|k| metadata_matcher::PathSegment {
            segment: Some(metadata_matcher::path_segment::Segment::Key(k.into())),
        })
        .collect();
    let value = string_matcher(sm).map(|s| ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::StringMatch(s)),
    });
    Some(MetadataMatcher {
        filter: ENVOY_JWT_FILTER.into(),
        path,
        value,
        invert: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn header_spec(m: &RouteMatch, name: &str) -> Option<HeaderMatchSpecifier> {
        m.headers
            .iter()
            .find(|h| h.name == name)
            .and_then(|h| h.header_match_specifier.clone())
    }

    #[test]
    fn catch_all_without_match() {
        let m = translate_route_match(None);
        assert_eq!(m.path_specifier, Some(PathSpecifier::Prefix("/".into())));
        assert!(m.case_sensitive.is_none());
    }

    #[test]
    fn uri_method_authority_scheme_and_headers() {
        let m = HttpMatchRequest {
            uri: Some(StringMatch::regex("/api/v[0-9]+")),
            ignore_uri_case: true,
            method: Some(StringMatch::exact("GET")),
            authority: Some(StringMatch::prefix("foo.")),
            scheme: Some(StringMatch::exact("https")),
            headers: BTreeMap::from([
                ("x-b".to_owned(), StringMatch::default()),
                ("x-a".to_owned(), StringMatch::exact("1")),
                ("x-star".to_owned(), StringMatch::regex("*")),
            ]),
            without_headers: BTreeMap::from([("x-deny".to_owned(), StringMatch::exact("yes"))]),
            query_params: BTreeMap::from([("q".to_owned(), StringMatch::prefix("ab"))]),
            ..Default::default()
        };
        let out = translate_route_match(Some(&m));
        assert_eq!(
            out.path_specifier,
            Some(PathSpecifier::SafeRegex(regex_matcher("/api/v[0-9]+")))
        );
        assert_eq!(out.case_sensitive, Some(BoolValue { value: false }));
        let names: Vec<&str> = out.headers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(
            names,
            ["x-a", "x-b", "x-deny", "x-star", ":method", ":authority", ":scheme"]
        );
        assert_eq!(header_spec(&out, "x-b"), Some(HeaderMatchSpecifier::PresentMatch(true)));
        assert_eq!(
            header_spec(&out, "x-star"),
            Some(HeaderMatchSpecifier::PresentMatch(true))
        );
        let deny = out.headers.iter().find(|h| h.name == "x-deny").unwrap();
        assert!(deny.invert_match && deny.treat_missing_header_as_empty);
        assert!(matches!(
            header_spec(&out, ":method"),
            Some(HeaderMatchSpecifier::StringMatch(StringMatcher { match_pattern: Some(MatchPattern::Exact(ref s)), .. })) if s == "GET"
        ));
        assert_eq!(out.query_parameters.len(), 1);
    }

    #[test]
    fn ingress_prefixes_are_path_separated() {
        let separated = |prefix: &str| {
            let m = HttpMatchRequest {
                uri: Some(StringMatch::prefix(prefix)),
                ..Default::default()
            };
            let mut out = translate_route_match(Some(&m));
            path_separated(&mut out);
            out.path_specifier
        };
        assert_eq!(
            separated("/foo/"),
            Some(PathSpecifier::PathSeparatedPrefix("/foo".into()))
        );
        assert_eq!(
            separated("/foo"),
            Some(PathSpecifier::PathSeparatedPrefix("/foo".into()))
        );
        assert_eq!(separated("/"), Some(PathSpecifier::Prefix("/".into())));
        // what Envoy's path_separated_prefix refuses stays a prefix
        assert_eq!(separated("/a?b"), Some(PathSpecifier::Prefix("/a?b".into())));
        assert_eq!(separated("/a//"), Some(PathSpecifier::Prefix("/a//".into())));
        let mut all = translate_route_match(None);
        path_separated(&mut all);
        assert_eq!(all.path_specifier, Some(PathSpecifier::Prefix("/".into())));
    }

    #[test]
    fn jwt_claims_become_metadata_matchers() {
        let m = HttpMatchRequest {
            headers: BTreeMap::from([(
                "@request.auth.claims[group][id]".to_owned(),
                StringMatch::exact("admin"),
            )]),
            ..Default::default()
        };
        let out = translate_route_match(Some(&m));
        assert!(out.headers.is_empty());
        assert_eq!(out.dynamic_metadata.len(), 1);
        let md = &out.dynamic_metadata[0];
        assert_eq!(md.filter, ENVOY_JWT_FILTER);
        assert_eq!(md.path.len(), 3);
    }
}
