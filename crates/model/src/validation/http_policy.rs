//! Policies of a VirtualService HTTP route, as Istio's `validateCORSPolicy`,
//! `validateHTTPFaultInjection` and `ValidateHTTPRetry`.

use super::common::{Errors, check_duration, check_enum, validate_duration, validate_percentage};
use super::headers::validate_cors_header_name;
use super::virtual_service::check_string_match;
use crate::networking::{FaultAbort, HttpRetry, HttpRoute};

/// Envoy `retry_on` policies Istio accepts besides HTTP status codes.
const RETRY_ON: &[&str] = &[
    "5xx",
    "gateway-error",
    "reset",
    "reset-before-request",
    "connect-failure",
    "retriable-4xx",
    "refused-stream",
    "retriable-status-codes",
    "retriable-headers",
    "envoy-ratelimited",
    "http3-post-connect-failure",
    "cancelled",
    "deadline-exceeded",
    "internal",
    "resource-exhausted",
    "unavailable",
];

const CORS_METHODS: &[&str] = &[
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "CONNECT", "OPTIONS", "TRACE", "*",
];

pub(super) fn check_cors(errs: &mut Errors, path: &str, http: &HttpRoute) {
    let Some(cors) = &http.cors_policy else { return };
    for (i, origin) in cors.allow_origins.iter().enumerate() {
        let opath = format!("{path}.allowOrigins[{i}]");
        let value = origin
            .exact
            .as_deref()
            .or(origin.prefix.as_deref())
            .or(origin.regex.as_deref())
            .unwrap_or("");
        if value.is_empty() {
            errs.add(
                &opath,
                format!("'{value}' is not a valid match type for CORS allow origins"),
            );
        } else {
            check_string_match(errs, &opath, origin, true);
        }
    }
    for m in &cors.allow_methods {
        if !CORS_METHODS.contains(&m.as_str()) {
            errs.add(
                &format!("{path}.allowMethods"),
                format!("{m:?} is not a supported HTTP method"),
            );
        }
    }
    for h in &cors.allow_headers {
        errs.check(&format!("{path}.allowHeaders"), validate_cors_header_name(h));
    }
    for h in &cors.expose_headers {
        errs.check(&format!("{path}.exposeHeaders"), validate_cors_header_name(h));
    }
    if let Some(max_age) = &cors.max_age {
        match validate_duration(max_age) {
            Ok(d) if d.subsec_nanos() != 0 => {
                errs.add(
                    &format!("{path}.maxAge"),
                    "max_age duration is accurate only to seconds precision",
                );
            }
            Ok(_) => {}
            Err(e) => errs.add(&format!("{path}.maxAge"), e),
        }
    }
    check_enum(
        errs,
        &format!("{path}.unmatchedPreflights"),
        cors.unmatched_preflights.as_ref(),
        &["UNSPECIFIED", "FORWARD", "IGNORE"],
    );
}

pub(super) fn check_fault(errs: &mut Errors, path: &str, http: &HttpRoute) {
    let Some(fault) = &http.fault else { return };
    if fault.abort.is_none() && fault.delay.is_none() {
        errs.add(path, "HTTP fault injection must have an abort and/or a delay");
    }
    if let Some(abort) = &fault.abort {
        check_abort(errs, &format!("{path}.abort"), abort);
    }
    if let Some(delay) = &fault.delay {
        let dpath = format!("{path}.delay");
        if let Some(p) = &delay.percentage {
            errs.check(&format!("{dpath}.percentage"), validate_percentage(p.value));
        }
        match (&delay.fixed_delay, &delay.exponential_delay) {
            (Some(_), Some(_)) => errs.add(&dpath, "only one of fixedDelay or exponentialDelay may be set"),
            (Some(d), None) => check_duration(errs, &format!("{dpath}.fixedDelay"), Some(d)),
            (None, Some(d)) => {
                check_duration(errs, &format!("{dpath}.exponentialDelay"), Some(d));
                errs.add(
                    &format!("{dpath}.exponentialDelay"),
                    "exponentialDelay not supported yet",
                );
            }
            (None, None) => {}
        }
    }
}

fn check_abort(errs: &mut Errors, path: &str, abort: &FaultAbort) {
    if let Some(p) = &abort.percentage {
        errs.check(&format!("{path}.percentage"), validate_percentage(p.value));
    }
    let set = [
        abort.http_status.is_some(),
        abort.grpc_status.is_some(),
        abort.http2_error.is_some(),
    ];
    if set.iter().filter(|s| **s).count() > 1 {
        errs.add(path, "only one of httpStatus, grpcStatus or http2Error may be set");
        return;
    }
    if let Some(status) = abort.http_status {
        check_http_status(errs, &format!("{path}.httpStatus"), i64::from(status));
    }
    if let Some(status) = &abort.grpc_status
        && crate::networking::grpc_status_code(status).is_none()
    {
        errs.add(
            &format!("{path}.grpcStatus"),
            format!("gRPC status {status:?} is not supported, use a name such as NOT_FOUND"),
        );
    }
    if abort.http2_error.is_some() {
        errs.add(
            &format!("{path}.http2Error"),
            "HTTP/2 abort fault injection not supported yet",
        );
    }
}

/// `validateHTTPStatus`: Istio accepts 200 to 600.
pub(super) fn check_http_status(errs: &mut Errors, path: &str, status: i64) {
    if !(200..=600).contains(&status) {
        errs.add(path, format!("HTTP status {status} is not in range 200-599"));
    }
}

/// `ValidateHTTPRetry` of a route's retries.
pub(super) fn check_retries(errs: &mut Errors, path: &str, http: &HttpRoute) {
    if let Some(r) = &http.retries {
        check_http_retry(errs, path, r);
    }
}

/// `ValidateHTTPRetry`.
pub(super) fn check_http_retry(errs: &mut Errors, path: &str, r: &HttpRetry) {
    if r.attempts < 0 {
        errs.add(&format!("{path}.attempts"), "attempts cannot be negative");
    }
    if r.attempts == 0 && (r.per_try_timeout.is_some() || !r.retry_on.is_empty() || r.retry_remote_localities.is_some())
    {
        errs.add(
            path,
            "http retry policy configured when attempts are set to 0 (disabled)",
        );
    }
    check_duration(errs, &format!("{path}.perTryTimeout"), r.per_try_timeout.as_ref());
    check_duration(errs, &format!("{path}.backoff"), r.backoff.as_ref());
    if !r.retry_on.is_empty() {
        for policy in r.retry_on.split(',') {
            let is_status = policy.parse::<u16>().is_ok_and(is_known_http_status);
            if !is_status && !RETRY_ON.contains(&policy) {
                errs.add(
                    &format!("{path}.retryOn"),
                    format!("{policy:?} is not a valid retryOn policy"),
                );
            }
        }
    }
}

/// The status codes Go's `http.StatusText` names.
fn is_known_http_status(code: u16) -> bool {
    matches!(code, 100..=103 | 200..=208 | 226 | 300..=305 | 307 | 308 | 400..=418 | 421..=426 | 428 | 429 | 431 | 451
        | 500..=508 | 510 | 511)
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::super::http_route::http_route_errors as http;

    #[test]
    fn fault_injection() {
        let abort = |a: Value| http(json!({"fault": {"abort": a}}));
        assert!(abort(json!({"httpStatus": 503, "percentage": {"value": 10.5}})).is_empty());
        assert!(abort(json!({"grpcStatus": "UNAVAILABLE"})).is_empty());
        assert_eq!(
            abort(json!({"httpStatus": 700})),
            ["spec.http[0].fault.abort.httpStatus: HTTP status 700 is not in range 200-599"]
        );
        assert!(abort(json!({"grpcStatus": "NOPE"}))[0].starts_with("spec.http[0].fault.abort.grpcStatus"));
        assert!(abort(json!({"http2Error": "x"}))[0].contains("not supported yet"));
        assert!(abort(json!({"httpStatus": 503, "grpcStatus": "OK"}))[0].contains("only one of"));
        assert!(
            abort(json!({"httpStatus": 503, "percentage": {"value": 101}}))[0]
                .starts_with("spec.http[0].fault.abort.percentage")
        );
        let delay = |d: Value| http(json!({"fault": {"delay": d}}));
        assert!(delay(json!({"fixedDelay": "5s", "percentage": {"value": 100}})).is_empty());
        assert!(
            delay(json!({"fixedDelay": "0s"}))[0]
                .starts_with("spec.http[0].fault.delay.fixedDelay: duration must be greater than 1ms")
        );
        assert!(delay(json!({"exponentialDelay": "1s"}))[0].contains("exponentialDelay not supported yet"));
        assert_eq!(
            http(json!({"fault": {}})),
            ["spec.http[0].fault: HTTP fault injection must have an abort and/or a delay"]
        );
    }

    #[test]
    fn retries_and_timeouts() {
        let retries = |r: Value| http(json!({"retries": r}));
        assert!(
            retries(json!({"attempts": 3, "perTryTimeout": "2s", "retryOn": "5xx,connect-failure,503"})).is_empty()
        );
        assert!(retries(json!({"attempts": 0})).is_empty());
        assert_eq!(
            retries(json!({"attempts": -1})),
            ["spec.http[0].retries.attempts: attempts cannot be negative"]
        );
        assert_eq!(
            retries(json!({"attempts": 0, "retryOn": "5xx"})),
            ["spec.http[0].retries: http retry policy configured when attempts are set to 0 (disabled)"]
        );
        assert_eq!(
            retries(json!({"attempts": 2, "retryOn": "5xx,599"})),
            ["spec.http[0].retries.retryOn: \"599\" is not a valid retryOn policy"]
        );
        assert!(
            retries(json!({"attempts": 2, "perTryTimeout": "0.5ms"}))[0]
                .starts_with("spec.http[0].retries.perTryTimeout")
        );
        // Istio 1.26+ fields: accepted (they were "unknown field"), backoff validated as a duration.
        assert!(retries(json!({"attempts": 2, "backoff": "25ms", "retryIgnorePreviousHosts": false})).is_empty());
        assert_eq!(
            retries(json!({"attempts": 2, "backoff": "0.5ms"})),
            ["spec.http[0].retries.backoff: duration must be greater than 1ms"]
        );
        assert!(http(json!({"timeout": "10s"})).is_empty());
        assert_eq!(
            http(json!({"timeout": "0s"})),
            ["spec.http[0].timeout: duration must be greater than 1ms"]
        );
    }

    #[test]
    fn cors_policy() {
        let cors = |c: Value| http(json!({"corsPolicy": c}));
        assert!(cors(json!({"allowOrigins": [{"exact": "https://a.com"}, {"regex": ".*\\.a\\.com"}], "allowMethods": ["GET", "POST"],
            "allowHeaders": ["x-a", "*"], "maxAge": "24h", "unmatchedPreflights": "IGNORE"})).is_empty());
        assert!(cors(json!({"allowOrigins": [{"exact": ""}]}))[0].contains("not a valid match type for CORS"));
        assert_eq!(
            cors(json!({"allowMethods": ["FETCH"]})),
            ["spec.http[0].corsPolicy.allowMethods: \"FETCH\" is not a supported HTTP method"]
        );
        assert!(cors(json!({"allowHeaders": ["bad header"]}))[0].starts_with("spec.http[0].corsPolicy.allowHeaders"));
        assert!(cors(json!({"maxAge": "1.5s"}))[0].contains("seconds precision"));
    }
}
