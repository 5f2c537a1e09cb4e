//! One `HTTPRoute` of a VirtualService, as Istio's `validateHTTPRoute`: route vs redirect vs
//! direct response vs delegate, matches, headers, mirrors, redirects, rewrites. CORS, fault injection and
//! retries are in `http_policy`.

use super::common::{Errors, check_duration, check_enum, check_labels, validate_port, validate_regex};
use super::headers::{check_headers, is_authority_header, validate_match_header_name};
use super::hosts::is_dns1123_label;
use super::http_policy::{check_cors, check_fault, check_http_status, check_retries};
use super::virtual_service::{check_destination, check_gateway_names, check_string_match, check_weights};
use crate::networking::{HttpBody, HttpRoute, StringMatch};

/// Largest direct response body Istio accepts.
const MAX_DIRECT_RESPONSE_BODY: usize = 1024 * 1024;

/// `delegate`: the route belongs to a delegate VirtualService (one without hosts).
pub(crate) fn check_http_route(errs: &mut Errors, path: &str, http: &HttpRoute, delegate: bool) {
    check_conflicts(errs, path, http, delegate);
    check_matches(errs, path, http);
    check_headers(errs, &format!("{path}.headers"), http.headers.as_ref());
    check_cors(errs, &format!("{path}.corsPolicy"), http);
    check_fault(errs, &format!("{path}.fault"), http);

    if let Some(p) = http.mirror_percent
        && p > 100
    {
        errs.add(
            &format!("{path}.mirrorPercent"),
            format!("mirror_percent must have a max value of 100 (it has {p})"),
        );
    }
    if let Some(p) = &http.mirror_percentage {
        check_mirror_percentage(errs, &format!("{path}.mirrorPercentage"), p.value);
    }
    if let Some(m) = &http.mirror {
        check_destination(errs, &format!("{path}.mirror"), m);
    }
    for (i, m) in http.mirrors.iter().enumerate() {
        check_destination(errs, &format!("{path}.mirrors[{i}].destination"), &m.destination);
        if let Some(p) = &m.percentage {
            check_mirror_percentage(errs, &format!("{path}.mirrors[{i}].percentage"), p.value);
        }
    }
    check_redirect(errs, &format!("{path}.redirect"), http);
    if let Some(dr) = &http.direct_response {
        let size = match &dr.body {
            Some(HttpBody::String(s)) => s.len(),
            Some(HttpBody::Bytes(b64)) => b64.len() / 4 * 3,
            None => 0,
        };
        if size > MAX_DIRECT_RESPONSE_BODY {
            errs.add(
                &format!("{path}.directResponse.body"),
                "large direct_responses may impact control plane performance, must be less than 1MB",
            );
        }
        check_http_status(errs, &format!("{path}.directResponse.status"), i64::from(dr.status));
    }
    check_retries(errs, &format!("{path}.retries"), http);
    check_rewrite(errs, &format!("{path}.rewrite"), http);
    for (i, r) in http.route.iter().enumerate() {
        let rpath = format!("{path}.route[{i}]");
        check_headers(errs, &format!("{rpath}.headers"), r.headers.as_ref());
        check_destination(errs, &format!("{rpath}.destination"), &r.destination);
    }
    check_weights(errs, &format!("{path}.route"), http.route.iter().map(|r| r.weight));
    check_duration(errs, &format!("{path}.timeout"), http.timeout.as_ref());
}

/// `validateHTTPRouteConflict`.
fn check_conflicts(errs: &mut Errors, path: &str, http: &HttpRoute, delegate: bool) {
    if !delegate && http.delegate.is_some() {
        // a root route only delegates
        let name = if http.name.is_empty() {
            String::new()
        } else {
            format!(" {:?}", http.name)
        };
        if http.redirect.is_some() {
            errs.add(path, format!("root HTTP route{name} must not specify redirect"));
        }
        if !http.route.is_empty() {
            errs.add(path, format!("root HTTP route{name} must not specify route"));
        }
        return;
    }
    if delegate && http.delegate.is_some() {
        errs.add(
            &format!("{path}.delegate"),
            "delegate HTTP route cannot contain delegate",
        );
    }
    let (fault, rewrite) = (http.fault.is_some(), http.rewrite.is_some());
    if http.redirect.is_some() {
        if !http.route.is_empty() {
            errs.add(path, "HTTP route cannot contain both route and redirect");
        }
        if fault {
            errs.add(path, "HTTP route cannot contain both fault and redirect");
        }
        if rewrite {
            errs.add(path, "HTTP route rule cannot contain both rewrite and redirect");
        }
        if http.direct_response.is_some() {
            errs.add(path, "HTTP route rule cannot contain both direct_response and redirect");
        }
    } else if http.direct_response.is_some() {
        if !http.route.is_empty() {
            errs.add(path, "HTTP route cannot contain both route and direct_response");
        }
        if fault {
            errs.add(path, "HTTP route cannot contain both fault and direct_response");
        }
        if rewrite {
            errs.add(path, "HTTP route rule cannot contain both rewrite and direct_response");
        }
    } else if http.route.is_empty() {
        errs.add(path, "HTTP route, redirect or direct_response is required");
    }
    if http.mirror.is_some() && !http.mirrors.is_empty() {
        errs.add(path, "HTTP route cannot contain both mirror and mirrors");
    }
}

/// `validateHTTPRouteMatchRequest`.
fn check_matches(errs: &mut Errors, path: &str, http: &HttpRoute) {
    for (i, m) in http.match_.iter().enumerate() {
        let mpath = format!("{path}.match[{i}]");
        for (name, sm) in &m.headers {
            let hpath = format!("{mpath}.headers[{name}]");
            errs.check(&hpath, validate_match_header_name(name));
            check_string_match(errs, &hpath, sm, false);
        }
        for (name, sm) in &m.without_headers {
            let hpath = format!("{mpath}.withoutHeaders[{name}]");
            errs.check(&hpath, validate_match_header_name(name));
            // regex `*` is not RE2 here: it means "present"
            if sm.regex.as_deref() != Some("*") {
                check_string_match(errs, &hpath, sm, false);
            }
        }
        let fields: [(&str, Option<&StringMatch>); 4] = [
            ("uri", m.uri.as_ref()),
            ("scheme", m.scheme.as_ref()),
            ("method", m.method.as_ref()),
            ("authority", m.authority.as_ref()),
        ];
        for (field, sm) in fields {
            if let Some(sm) = sm {
                // Envoy allows an empty URI prefix, not an empty scheme/method/authority prefix
                check_string_match(errs, &format!("{mpath}.{field}"), sm, field == "uri");
            }
        }
        for (name, sm) in &m.query_params {
            check_string_match(errs, &format!("{mpath}.queryParams[{name}]"), sm, false);
        }
        if m.port != 0 {
            errs.check(&format!("{mpath}.port"), validate_port(m.port.into()));
        }
        check_labels(errs, &format!("{mpath}.sourceLabels"), &m.source_labels);
        check_gateway_names(errs, &format!("{mpath}.gateways"), &m.gateways);
        if !m.source_namespace.is_empty() && !is_dns1123_label(&m.source_namespace) {
            errs.add(
                &format!("{mpath}.sourceNamespace"),
                format!("sourceNamespace match {} is invalid", m.source_namespace),
            );
        }
    }
}

fn check_mirror_percentage(errs: &mut Errors, path: &str, value: f64) {
    if value > 100.0 {
        errs.add(
            path,
            format!("mirror percentage must have a max value of 100 (it has {value})"),
        );
    }
    if value < 0.0 {
        errs.add(
            path,
            format!("mirror percentage must have a min value of 0 (it has {value})"),
        );
    }
}

fn check_redirect(errs: &mut Errors, path: &str, http: &HttpRoute) {
    let Some(r) = &http.redirect else { return };
    if r.port.is_some() && r.derive_port.is_some() {
        errs.add(path, "only one of port or derivePort may be set");
    }
    check_enum(
        errs,
        &format!("{path}.derivePort"),
        r.derive_port.as_ref(),
        &["FROM_PROTOCOL_DEFAULT", "FROM_REQUEST_PORT"],
    );
    if !r.uri.is_empty() && !r.prefix_rewrite.is_empty() {
        errs.add(path, "redirect may only specify one of uri or prefix_rewrite");
    }
    if !r.prefix_rewrite.is_empty()
        && http
            .match_
            .iter()
            .any(|m| m.uri.as_ref().is_some_and(|u| u.prefix.is_none()))
    {
        errs.add(
            path,
            "redirect prefix_rewrite requires all URI matches to use prefix match type",
        );
    }
    if r.uri.is_empty()
        && r.prefix_rewrite.is_empty()
        && r.authority.is_empty()
        && r.port.is_none()
        && r.derive_port.is_none()
        && r.scheme.is_empty()
    {
        errs.add(path, "redirect must specify URI, authority, scheme, or port");
    }
    if r.redirect_code != 0 && !(300..=399).contains(&r.redirect_code) {
        errs.add(
            &format!("{path}.redirectCode"),
            format!("{} is not a valid redirect code, must be 3xx", r.redirect_code),
        );
    }
    if !r.scheme.is_empty() && r.scheme != "http" && r.scheme != "https" {
        errs.add(
            &format!("{path}.scheme"),
            "invalid redirect scheme, must be \"http\" or \"https\"",
        );
    }
    if let Some(p) = r.port
        && p > 0
    {
        errs.check(&format!("{path}.port"), validate_port(p.into()));
    }
}

fn check_rewrite(errs: &mut Errors, path: &str, http: &HttpRoute) {
    if let Some(rw) = &http.rewrite {
        if !rw.uri.is_empty() && rw.uri_regex_rewrite.is_some() {
            errs.add(path, "rewrite may only contain one of URI or UriRegexRewrite");
        } else if rw.uri.is_empty() && rw.uri_regex_rewrite.is_none() && rw.authority.is_empty() {
            errs.add(
                path,
                "rewrite must specify at least one of URI, UriRegexRewrite, or authority",
            );
        } else if let Some(re) = &rw.uri_regex_rewrite {
            let rpath = format!("{path}.uriRegexRewrite");
            if re.match_.is_empty() || re.rewrite.is_empty() {
                errs.add(
                    &rpath,
                    "UriRegexRewrite requires both Rewrite and Match fields to be specified",
                );
            } else {
                errs.check(&format!("{rpath}.match"), validate_regex(&re.match_));
            }
        }
    }
    // the authority may be rewritten in one place only
    let mut current = http.rewrite.as_ref().map(|r| r.authority.as_str()).unwrap_or("");
    if let Some(req) = http.headers.as_ref().and_then(|h| h.request.as_ref()) {
        for (k, v) in req.set.iter().chain(&req.add).filter(|(k, _)| is_authority_header(k)) {
            if !current.is_empty() {
                errs.add(
                    &format!("{path}.authority"),
                    format!(
                        "authority header cannot be set multiple times: have {current:?}, attempting to set {v:?} ({k})"
                    ),
                );
                return;
            }
            current = v;
        }
    }
}

#[cfg(test)]
/// Errors of a VirtualService with one HTTP route: `extra` merged into a route to `a`.
pub(super) fn http_route_errors(extra: serde_json::Value) -> Vec<String> {
    let mut route = serde_json::json!({"route": [{"destination": {"host": "a"}}]});
    for (k, v) in extra.as_object().unwrap() {
        if v.is_null() {
            route.as_object_mut().unwrap().remove(k);
        } else {
            route[k] = v.clone();
        }
    }
    crate::validation::errors_of(
        "VirtualService",
        serde_json::json!({"hosts": ["a.com"], "http": [route]}),
    )
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::http_route_errors as http;

    #[test]
    fn route_redirect_direct_response_are_exclusive() {
        assert!(http(json!({})).is_empty());
        assert!(http(json!({"route": null, "redirect": {"uri": "/new"}})).is_empty());
        assert!(http(json!({"route": null, "directResponse": {"status": 503, "body": {"string": "down"}}})).is_empty());
        assert_eq!(
            http(json!({"redirect": {"uri": "/new"}})),
            ["spec.http[0]: HTTP route cannot contain both route and redirect"]
        );
        assert_eq!(
            http(json!({"directResponse": {"status": 503}})),
            ["spec.http[0]: HTTP route cannot contain both route and direct_response"]
        );
        assert_eq!(
            http(json!({"route": null, "redirect": {"uri": "/x"}, "rewrite": {"uri": "/y"}})),
            ["spec.http[0]: HTTP route rule cannot contain both rewrite and redirect"]
        );
        assert_eq!(
            http(json!({"route": null})),
            ["spec.http[0]: HTTP route, redirect or direct_response is required"]
        );
        assert_eq!(
            http(json!({"route": null, "delegate": {"name": "d", "namespace": "n"}, "redirect": {"uri": "/x"}})),
            ["spec.http[0]: root HTTP route must not specify redirect"]
        );
        assert!(http(json!({"route": null, "delegate": {"name": "d"}})).is_empty());
        assert_eq!(
            http(json!({"mirror": {"host": "m"}, "mirrors": [{"destination": {"host": "m"}}]})),
            ["spec.http[0]: HTTP route cannot contain both mirror and mirrors"]
        );
        assert!(
            http(json!({"route": null, "directResponse": {"status": 100}}))[0]
                .contains("HTTP status 100 is not in range")
        );
    }

    #[test]
    fn redirects() {
        let redirect = |r: Value| http(json!({"route": null, "redirect": r}));
        assert!(
            redirect(json!({"authority": "b.com", "redirectCode": 308, "scheme": "https", "port": 8443})).is_empty()
        );
        assert!(redirect(json!({"derivePort": "FROM_REQUEST_PORT"})).is_empty());
        assert_eq!(
            redirect(json!({"redirectCode": 308})),
            ["spec.http[0].redirect: redirect must specify URI, authority, scheme, or port"]
        );
        assert_eq!(
            http(json!({"route": null, "match": [{"uri": {"prefix": "/v1/"}}], "redirect": {"prefixRewrite": "/v2/"}})),
            Vec::<String>::new()
        );
        assert_eq!(
            redirect(json!({"uri": "/a", "prefixRewrite": "/b"})),
            ["spec.http[0].redirect: redirect may only specify one of uri or prefix_rewrite"]
        );
        assert_eq!(
            http(json!({"route": null, "match": [{"uri": {"exact": "/v1"}}], "redirect": {"prefixRewrite": "/v2/"}})),
            ["spec.http[0].redirect: redirect prefix_rewrite requires all URI matches to use prefix match type"]
        );
        // The deprecated `mirror_percent` spelling of Istio's CRD is `mirrorPercent`.
        assert!(
            http(json!({"route": [{"destination": {"host": "a"}}], "mirror": {"host": "b"}, "mirror_percent": 5}))
                .is_empty()
        );
        assert!(redirect(json!({"uri": "/x", "redirectCode": 200}))[0].contains("not a valid redirect code"));
        assert!(redirect(json!({"uri": "/x", "scheme": "ftp"}))[0].starts_with("spec.http[0].redirect.scheme"));
        assert!(
            redirect(json!({"port": 80, "derivePort": "FROM_REQUEST_PORT"}))[0]
                .contains("only one of port or derivePort")
        );
        assert!(
            redirect(json!({"derivePort": "SOMEWHERE"}))[0]
                .starts_with("spec.http[0].redirect.derivePort: unknown value")
        );
        assert!(redirect(json!({"port": 70000}))[0].starts_with("spec.http[0].redirect.port"));
    }

    #[test]
    fn rewrites_and_authority() {
        assert!(http(json!({"rewrite": {"uri": "/v2", "authority": "b.com"}})).is_empty());
        assert!(http(json!({"rewrite": {"uriRegexRewrite": {"match": "^/v1/(.*)", "rewrite": "/v2/\\1"}}})).is_empty());
        assert!(http(json!({"rewrite": {}}))[0].contains("rewrite must specify at least one"));
        assert!(
            http(json!({"rewrite": {"uri": "/a", "uriRegexRewrite": {"match": "a", "rewrite": "b"}}}))[0]
                .contains("only contain one")
        );
        assert!(http(json!({"rewrite": {"uriRegexRewrite": {"match": "a"}}}))[0].contains("requires both"));
        assert!(
            http(json!({"rewrite": {"uriRegexRewrite": {"match": "(", "rewrite": "b"}}}))[0]
                .starts_with("spec.http[0].rewrite.uriRegexRewrite.match: invalid regex")
        );
        let twice =
            http(json!({"rewrite": {"authority": "b.com"}, "headers": {"request": {"set": {"host": "c.com"}}}}));
        assert!(
            twice[0].contains("authority header cannot be set multiple times"),
            "{twice:?}"
        );
    }

    #[test]
    fn mirrors_and_matches() {
        assert!(http(json!({"mirrors": [{"destination": {"host": "m"}, "percentage": {"value": 50}}]})).is_empty());
        assert!(http(json!({"mirrorPercentage": {"value": 120}}))[0].contains("max value of 100"));
        assert!(
            http(json!({"mirrors": [{"destination": {"host": "*"}}]}))[0]
                .starts_with("spec.http[0].mirrors[0].destination.host")
        );

        let m = |m: Value| http(json!({"match": [m]}));
        assert!(m(json!({"withoutHeaders": {"x-a": {"regex": "*"}}, "port": 8080, "sourceNamespace": "prod", "queryParams": {"q": {"exact": ""}}})).is_empty());
        assert!(
            m(json!({"headers": {"x-a": {"regex": "*"}}}))[0]
                .starts_with("spec.http[0].match[0].headers[x-a]: invalid regex")
        );
        assert!(m(json!({"headers": {"bad name": {"exact": "x"}}}))[0].contains("not a valid header name"));
        assert_eq!(
            m(json!({"sourceNamespace": "Not_A_Label"})),
            ["spec.http[0].match[0].sourceNamespace: sourceNamespace match Not_A_Label is invalid"]
        );
        assert!(
            m(json!({"sourceLabels": {"app": "a b"}}))[0]
                .starts_with("spec.http[0].match[0].sourceLabels: invalid tag value")
        );
        assert!(
            m(json!({"queryParams": {"q": {"prefix": ""}}}))[0].contains("prefix string match should not be empty")
        );
    }
}
