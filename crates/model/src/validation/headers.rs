//! HTTP header names and values in VirtualService matches and header operations, as Istio's
//! `ValidateHTTPHeader*` functions and its port of Envoy's header value parser.

use super::common::{Check, Errors};
use crate::networking::Headers;

/// RFC 7230 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

fn is_token(name: &str) -> bool {
    !name.is_empty() && name.bytes().all(is_tchar)
}

/// Header name prefix that routes on a JWT claim, e.g. `@request.auth.claims.groups`.
const JWT_CLAIM_HEADER: &str = "@request.auth.claims";

/// Whether a match header name is a JWT claim route (`@request.auth.claims.a.b` or `...[a][b]`).
pub(crate) fn is_jwt_claim_route(name: &str) -> bool {
    let Some(rest) = name.get(JWT_CLAIM_HEADER.len()..) else {
        return false;
    };
    if !name[..JWT_CLAIM_HEADER.len()].eq_ignore_ascii_case(JWT_CLAIM_HEADER) {
        return false;
    }
    (rest.starts_with('.') && rest.len() > 1) || (rest.starts_with('[') && rest.ends_with(']') && rest.len() > 2)
}

/// `ValidateHTTPHeaderNameOrJwtClaimRoute`: a token, a pseudo header, or a JWT claim route.
pub(crate) fn validate_match_header_name(name: &str) -> Check {
    if name.is_empty() {
        return Err("header name cannot be empty".into());
    }
    if is_jwt_claim_route(name) || matches!(name, ":method" | ":scheme" | ":authority" | ":path" | ":status") {
        return Ok(());
    }
    if !is_token(name) {
        return Err(format!("header name {name} is not a valid header name"));
    }
    Ok(())
}

/// `ValidateCORSHTTPHeaderName`: `*` or a token.
pub(crate) fn validate_cors_header_name(name: &str) -> Check {
    if name.is_empty() {
        return Err("header name cannot be empty".into());
    }
    if name != "*" && !is_token(name) {
        return Err(format!("header name {name} is not a valid header name"));
    }
    Ok(())
}

fn is_internal_header(name: &str) -> bool {
    name.starts_with(':') || name.eq_ignore_ascii_case("host")
}

pub(crate) fn is_authority_header(name: &str) -> bool {
    name.eq_ignore_ascii_case(":authority") || name.eq_ignore_ascii_case("host")
}

/// `ValidateHTTPHeaderWithAuthorityOperationName`: request headers to add or set; the authority may be set.
fn validate_request_set_name(name: &str) -> Check {
    if name.is_empty() {
        return Err("header name cannot be empty".into());
    }
    if is_internal_header(name) && !is_authority_header(name) {
        return Err(format!("invalid header {name:?}: header cannot have \":\" prefix"));
    }
    Ok(())
}

/// `ValidateHTTPHeaderOperationName`: headers to remove, and response headers.
fn validate_operation_name(name: &str) -> Check {
    if name.is_empty() {
        return Err("header name cannot be empty".into());
    }
    if name.eq_ignore_ascii_case("host") {
        return Err(format!("invalid header {name:?}: cannot set Host header"));
    }
    if is_internal_header(name) {
        return Err(format!("invalid header {name:?}: header cannot have \":\" prefix"));
    }
    Ok(())
}

/// `ValidateHTTPHeaderValue`: no control characters, and `%VAR%` expressions Envoy can parse.
pub(crate) fn validate_header_value(value: &str) -> Check {
    if value.bytes().any(|b| matches!(b, 0x00..=0x08 | 0x0A..=0x1F | 0x7F)) {
        return Err(format!("header value configuration {value:?} is invalid"));
    }
    envoy_header_format(value).map_err(|e| format!("header value configuration: {e}"))
}

/// Istio's port of Envoy's `HeaderParser` state machine over `%VAR%`, `%VAR(args)%` and `%%`.
fn envoy_header_format(v: &str) -> Check {
    #[derive(PartialEq)]
    enum S {
        Literal,
        VariableName,
        ExpectArray,
        ExpectString,
        String,
        ExpectDelimiterOrEnd,
        ExpectArgsEnd,
        ExpectVariableEnd,
    }
    let b = v.as_bytes();
    let mut state = S::Literal;
    let mut pos = 0;
    while pos < b.len() {
        let ch = b[pos];
        let has_next = pos + 1 < b.len();
        match state {
            S::Literal if ch == b'%' => {
                if !has_next {
                    return Err("invalid header configuration. Un-escaped %".into());
                }
                if b[pos + 1] == b'%' {
                    pos += 1;
                } else {
                    state = S::VariableName;
                }
            }
            S::Literal => {}
            S::VariableName if ch == b'%' => state = S::Literal,
            S::VariableName if ch == b'(' => state = S::ExpectArray,
            S::VariableName => {}
            S::ExpectArray if ch == b'[' => state = S::ExpectString,
            S::ExpectArray if ch != b' ' => state = S::String,
            S::ExpectArray => {}
            S::ExpectDelimiterOrEnd => match ch {
                b',' => state = S::ExpectString,
                b']' => state = S::ExpectArgsEnd,
                b' ' => {}
                _ => return Err("invalid header configuration. Expecting ',', ']', or whitespace".into()),
            },
            S::ExpectString => match ch {
                b'"' => state = S::String,
                b' ' => {}
                _ => return Err("invalid header configuration. Expecting '\"'".into()),
            },
            S::String => match ch {
                b'\\' if !has_next => {
                    return Err("invalid header configuration. Un-terminated backslash in JSON string".into());
                }
                b'\\' => pos += 1,
                b')' => state = S::ExpectVariableEnd,
                b'"' => state = S::ExpectDelimiterOrEnd,
                _ => {}
            },
            S::ExpectArgsEnd => match ch {
                b')' => state = S::ExpectVariableEnd,
                b' ' => {}
                _ => return Err("invalid header configuration. Expecting ')' or whitespace".into()),
            },
            S::ExpectVariableEnd => match ch {
                b'%' => state = S::Literal,
                b' ' => {}
                _ => return Err("invalid header configuration. Expecting '%' or whitespace".into()),
            },
        }
        pos += 1;
    }
    if state != S::Literal {
        return Err(format!(
            "invalid header configuration. Un-terminated variable expression {v:?}"
        ));
    }
    Ok(())
}

/// Header manipulation of a route or a route destination (`spec.http[i].headers`).
pub(crate) fn check_headers(errs: &mut Errors, path: &str, headers: Option<&Headers>) {
    let Some(h) = headers else { return };
    if let Some(req) = &h.request {
        for (name, value) in req.add.iter().chain(&req.set) {
            errs.check(&format!("{path}.request"), validate_request_set_name(name));
            errs.check(&format!("{path}.request[{name}]"), validate_header_value(value));
        }
        for name in &req.remove {
            errs.check(&format!("{path}.request.remove"), validate_operation_name(name));
        }
    }
    if let Some(resp) = &h.response {
        for (name, value) in resp.add.iter().chain(&resp.set) {
            errs.check(&format!("{path}.response"), validate_operation_name(name));
            errs.check(&format!("{path}.response[{name}]"), validate_header_value(value));
        }
        for name in &resp.remove {
            errs.check(&format!("{path}.response.remove"), validate_operation_name(name));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::networking::HeaderOperations;

    #[test]
    fn match_header_names() {
        assert!(validate_match_header_name("x-user").is_ok());
        assert!(validate_match_header_name(":authority").is_ok());
        assert!(validate_match_header_name("@request.auth.claims.groups").is_ok());
        assert!(validate_match_header_name("@request.auth.claims[a][b]").is_ok());
        assert!(validate_match_header_name("@request.auth.claims").is_err());
        assert!(validate_match_header_name("bad header").is_err());
        assert!(validate_match_header_name("").is_err());
        assert!(validate_cors_header_name("*").is_ok() && validate_cors_header_name("x/y").is_err());
    }

    #[test]
    fn header_values() {
        for ok in [
            "foo",
            "%HOSTNAME%",
            "100%%",
            "prefix %HOSTNAME% suffix",
            "%REQ(x-foo)%",
            "%START_TIME(%s)%",
            "",
        ] {
            assert!(validate_header_value(ok).is_ok(), "{ok}");
        }
        for bad in ["abc%123", "%START_TIME%%", "a\nb", "%FOO(\"x\"", "trailing %"] {
            assert!(validate_header_value(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn header_operations() {
        let ops = |set: &[(&str, &str)], remove: &[&str]| HeaderOperations {
            set: set
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            add: BTreeMap::new(),
            remove: remove.iter().map(|s| s.to_string()).collect(),
        };
        let mut errs = Errors::default();
        let ok = Headers {
            request: Some(ops(&[("x-a", "b"), (":authority", "foo"), ("host", "bar")], &["x-b"])),
            response: None,
        };
        check_headers(&mut errs, "spec.http[0].headers", Some(&ok));
        assert!(errs.into_vec().is_empty());

        let mut errs = Errors::default();
        let bad = Headers {
            request: Some(ops(&[(":path", "/x")], &["host"])),
            response: Some(ops(&[("host", "x"), ("x-v", "bad%")], &[":status"])),
        };
        check_headers(&mut errs, "spec.http[0].headers", Some(&bad));
        let errs = errs.into_vec();
        assert_eq!(errs.len(), 5, "{errs:?}");
        assert!(errs[0].starts_with("spec.http[0].headers.request: invalid header \":path\""));
        assert!(errs[1].starts_with("spec.http[0].headers.request.remove: invalid header \"host\""));
    }
}
