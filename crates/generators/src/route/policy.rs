//! Per-route policies of an Istio `HTTPRoute`: retries (`route/retry/retry.go`), timeouts, fault
//! injection, CORS, mirroring percentages and header operations, as `route.go` translates them.

use std::collections::BTreeMap;
use std::time::Duration;

use model::networking::{CorsPolicy, HeaderOperations, Headers, HttpFaultInjection, HttpRetry, Percent};
use xds_api::envoy::config::core::v3::{HeaderValue, HeaderValueOption, RuntimeFractionalPercent, header_value_option};
use xds_api::envoy::config::route::v3::{RetryPolicy, retry_policy};
use xds_api::envoy::extensions::filters::common::fault::v3::{FaultDelay, fault_delay};
use xds_api::envoy::extensions::filters::http::cors::v3::CorsPolicy as EnvoyCorsPolicy;
use xds_api::envoy::extensions::filters::http::fault::v3::{FaultAbort, HttpFault, fault_abort};
use xds_api::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use xds_api::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
use xds_api::envoy::r#type::v3::{FractionalPercent, fractional_percent::DenominatorType};
use xds_api::pbwkt::{BoolValue, UInt32Value};

use super::matching::string_matcher;

/// Istio's default `retryOn` (503 is no longer retried by default since Istio 1.24: unsafe for
/// non-idempotent requests; `retriable-status-codes` stays so user codes work).
pub(crate) const DEFAULT_RETRY_ON: &str = "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes";
const DEFAULT_NUM_RETRIES: u32 = 2;
/// Istio's `defaultInboundRetryOn`: a request reset before it reached the application was never
/// processed, so retrying it is safe for any method.
const DEFAULT_INBOUND_RETRY_ON: &str = "reset-before-request";
const HOST_SELECTION_RETRY_MAX_ATTEMPTS: i64 = 5;

/// Protobuf duration from std.
pub(crate) fn proto_duration(d: Duration) -> xds_api::pbwkt::Duration {
    xds_api::pbwkt::Duration {
        seconds: d.as_secs() as i64,
        nanos: d.subsec_nanos() as i32,
    }
}

/// A duration from config (`"5s"`, `"100ms"`); malformed input counts as absent.
pub(crate) fn parse_duration(s: Option<&str>) -> Option<xds_api::pbwkt::Duration> {
    s.and_then(model::duration::parse).map(proto_duration)
}

/// `retry.ConvertPolicy`: `None` input is Istio's default policy; `attempts <= 0` disables retries.
/// With consistent hashing the previous-hosts predicate is left out, so retries stay on the hashed
/// host, unless `retryIgnorePreviousHosts` says otherwise.
pub(crate) fn retry_policy(retries: Option<&HttpRetry>, consistent_hash: bool) -> Option<RetryPolicy> {
    let out = RetryPolicy {
        num_retries: Some(UInt32Value {
            value: DEFAULT_NUM_RETRIES,
        }),
        retry_on: DEFAULT_RETRY_ON.into(),
        host_selection_retry_max_attempts: HOST_SELECTION_RETRY_MAX_ATTEMPTS,
        retry_host_predicate: if consistent_hash {
            Vec::new()
        } else {
            vec![previous_hosts_predicate()]
        },
        ..Default::default()
    };
    let Some(retries) = retries else {
        return Some(out);
    };
    let mut out = with_attempts_retry_on_and_back_off(out, retries)?;
    if let Some(d) = parse_duration(retries.per_try_timeout.as_deref()) {
        out.per_try_timeout = Some(d);
    }
    if let Some(ignore) = retries.retry_ignore_previous_hosts {
        out.retry_host_predicate = if ignore {
            vec![previous_hosts_predicate()]
        } else {
            Vec::new()
        };
    }
    if retries.retry_remote_localities == Some(true) {
        out.retry_priority = Some(retry_policy::RetryPriority {
            name: "envoy.retry_priorities.previous_priorities".into(),
            config_type: Some(retry_policy::retry_priority::ConfigType::TypedConfig(xds_api::pack(
                &PreviousPrioritiesConfig { update_frequency: 2 },
            ))),
        });
    }
    Some(out)
}

/// `retry.ConvertInboundPolicy`, for a sidecar's inbound routes (`meshConfig.
/// defaultInboundHttpRetryPolicy`): by default two retries of requests reset before they reached
/// the application (safe for any method); only `attempts`, `retryOn` and `backoff` apply, as the
/// route has one local destination.
pub(crate) fn inbound_retry_policy(retries: Option<&HttpRetry>) -> Option<RetryPolicy> {
    let out = RetryPolicy {
        num_retries: Some(UInt32Value {
            value: DEFAULT_NUM_RETRIES,
        }),
        retry_on: DEFAULT_INBOUND_RETRY_ON.into(),
        ..Default::default()
    };
    match retries {
        None => Some(out),
        Some(retries) => with_attempts_retry_on_and_back_off(out, retries),
    }
}

/// What both conversions take from a policy over their default: `attempts` (`<= 0` disables
/// retries: `None`), `retryOn` and `backoff`.
fn with_attempts_retry_on_and_back_off(mut out: RetryPolicy, retries: &HttpRetry) -> Option<RetryPolicy> {
    if retries.attempts <= 0 {
        return None;
    }
    out.num_retries = Some(UInt32Value {
        value: retries.attempts as u32,
    });
    if !retries.retry_on.is_empty() {
        (out.retry_on, out.retriable_status_codes) = retry_on(&retries.retry_on);
    }
    out.retry_back_off = back_off(retries);
    Some(out)
}

/// `retryOn` as Envoy's policies and status codes, `retriable-status-codes` added for codes.
fn retry_on(text: &str) -> (String, Vec<u32>) {
    let (mut retry_on, codes) = parse_retry_on(text);
    if !codes.is_empty() && !retry_on.contains("retriable-status-codes") {
        if !retry_on.is_empty() {
            retry_on.push(',');
        }
        retry_on.push_str("retriable-status-codes");
    }
    (retry_on, codes)
}

/// `backoff`: the base interval of Envoy's exponential back-off.
fn back_off(retries: &HttpRetry) -> Option<retry_policy::RetryBackOff> {
    let base_interval = parse_duration(retries.backoff.as_deref())?;
    Some(retry_policy::RetryBackOff {
        base_interval: Some(base_interval),
        ..Default::default()
    })
}

fn previous_hosts_predicate() -> retry_policy::RetryHostPredicate {
    retry_policy::RetryHostPredicate {
        name: "envoy.retry_host_predicates.previous_hosts".into(),
        config_type: Some(retry_policy::retry_host_predicate::ConfigType::TypedConfig(
            xds_api::pack(&PreviousHostsPredicate {}),
        )),
    }
}

/// Splits `retryOn` into Envoy policies and HTTP status codes (any integer that is a known status).
fn parse_retry_on(retry_on: &str) -> (String, Vec<u32>) {
    let mut codes = Vec::new();
    let mut policies = Vec::new();
    for part in retry_on.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<u32>() {
            Ok(code) if (100..=599).contains(&code) => codes.push(code),
            _ => policies.push(part),
        }
    }
    (policies.join(","), codes)
}

/// `translatePercentToFractionalPercent`: a percent in [0, 100] as parts per million.
pub(crate) fn percent_to_fractional(p: &Percent) -> FractionalPercent {
    FractionalPercent {
        numerator: (p.value.clamp(0.0, 100.0) * 10_000.0) as u32,
        denominator: DenominatorType::Million as i32,
    }
}

/// `translateIntegerToFractionalPercent`: an integer percent, out of a hundred.
pub(crate) fn integer_to_fractional(p: u32) -> FractionalPercent {
    FractionalPercent {
        numerator: p,
        denominator: DenominatorType::Hundred as i32,
    }
}

/// Mirror fraction from `mirrorPercentage`, else the deprecated `mirrorPercent`, else 100%.
/// An explicit 0 means "do not mirror" (`None`), as `MirrorPercent`.
pub(crate) fn mirror_fraction(
    percentage: Option<&Percent>,
    legacy_percent: Option<u32>,
) -> Option<RuntimeFractionalPercent> {
    let fraction = match (percentage, legacy_percent) {
        (Some(p), _) if p.value > 0.0 => percent_to_fractional(p),
        (Some(_), _) => return None,
        (None, Some(p)) if p > 0 => integer_to_fractional(p),
        (None, Some(_)) => return None,
        (None, None) => integer_to_fractional(100),
    };
    Some(RuntimeFractionalPercent {
        default_value: Some(fraction),
        runtime_key: String::new(),
    })
}

/// `TranslateFault`: fixed delays and HTTP/gRPC aborts; anything else is dropped with a warning.
pub(crate) fn translate_fault(fault: &HttpFaultInjection) -> Option<HttpFault> {
    let mut out = HttpFault::default();
    if let Some(delay) = &fault.delay {
        let percentage = match &delay.percentage {
            Some(p) => percent_to_fractional(p),
            None => integer_to_fractional(delay.percent.unwrap_or(0).max(0) as u32),
        };
        match parse_duration(delay.fixed_delay.as_deref()) {
            Some(d) => {
                out.delay = Some(FaultDelay {
                    percentage: Some(percentage),
                    fault_delay_secifier: Some(fault_delay::FaultDelaySecifier::FixedDelay(d)),
                })
            }
            None => tracing::warn!("fault injection: only fixed delays are supported; delay ignored"),
        }
    }
    if let Some(abort) = &fault.abort {
        let error_type = match (&abort.http_status, &abort.grpc_status) {
            (Some(status), _) => Some(fault_abort::ErrorType::HttpStatus(*status as u32)),
            (None, Some(code)) => model::networking::grpc_status_code(code).map(fault_abort::ErrorType::GrpcStatus),
            _ => None,
        };
        match error_type {
            Some(e) => {
                out.abort = Some(FaultAbort {
                    percentage: abort.percentage.as_ref().map(percent_to_fractional),
                    error_type: Some(e),
                    ..Default::default()
                })
            }
            None => tracing::warn!("fault injection: only HTTP and gRPC status aborts are supported; abort ignored"),
        }
    }
    (out.delay.is_some() || out.abort.is_some()).then_some(out)
}

/// `TranslateCORSPolicy`.
pub(crate) fn translate_cors(cors: &CorsPolicy) -> EnvoyCorsPolicy {
    let allow_origin_string_match = if !cors.allow_origins.is_empty() {
        cors.allow_origins.iter().filter_map(string_matcher).collect()
    } else {
        cors.allow_origin
            .iter()
            .filter_map(|o| string_matcher(&model::networking::StringMatch::exact(o)))
            .collect()
    };
    EnvoyCorsPolicy {
        allow_origin_string_match,
        allow_methods: cors.allow_methods.join(","),
        allow_headers: cors.allow_headers.join(","),
        expose_headers: cors.expose_headers.join(","),
        max_age: cors
            .max_age
            .as_deref()
            .and_then(model::duration::parse)
            .map(|d| d.as_secs().to_string())
            .unwrap_or_default(),
        allow_credentials: cors.allow_credentials.map(|value| BoolValue { value }),
        filter_enabled: Some(RuntimeFractionalPercent {
            default_value: Some(integer_to_fractional(100)),
            runtime_key: String::new(),
        }),
        // Envoy's behaviour before 1.30, unless the user asks to IGNORE unmatched preflights
        forward_not_matching_preflights: Some(BoolValue {
            value: cors.unmatched_preflights.as_deref() != Some("IGNORE"),
        }),
        ..Default::default()
    }
}

/// Header operations of one `Headers` block, as Istio's `HeadersOperations`.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct HeadersOperations {
    pub(crate) request_headers_to_add: Vec<HeaderValueOption>,
    pub(crate) response_headers_to_add: Vec<HeaderValueOption>,
    pub(crate) request_headers_to_remove: Vec<String>,
    pub(crate) response_headers_to_remove: Vec<String>,
    /// A request `set`/`add` of `:authority` or `host`: becomes a host rewrite.
    pub(crate) authority: String,
}

/// `TranslateHeadersOperations`: `set` overwrites, `add` appends; pseudo-headers and `host` are
/// dropped (an authority becomes `authority`, `set` winning over `add`).
pub(crate) fn translate_headers(headers: &Headers) -> HeadersOperations {
    let empty = HeaderOperations::default();
    let req = headers.request.as_ref().unwrap_or(&empty);
    let resp = headers.response.as_ref().unwrap_or(&empty);
    let (mut request_headers_to_add, set_authority) = append_headers(&req.set, false);
    let (req_add, add_authority) = append_headers(&req.add, true);
    request_headers_to_add.extend(req_add);
    let (mut response_headers_to_add, _) = append_headers(&resp.set, false);
    response_headers_to_add.extend(append_headers(&resp.add, true).0);
    HeadersOperations {
        request_headers_to_add,
        response_headers_to_add,
        request_headers_to_remove: drop_internal(&req.remove),
        response_headers_to_remove: drop_internal(&resp.remove),
        authority: if set_authority.is_empty() {
            add_authority
        } else {
            set_authority
        },
    }
}

fn append_headers(headers: &BTreeMap<String, String>, append: bool) -> (Vec<HeaderValueOption>, String) {
    let mut authority = String::new();
    let mut out = Vec::with_capacity(headers.len());
    for (key, value) in headers {
        if key.eq_ignore_ascii_case(":authority") || key.eq_ignore_ascii_case("host") {
            authority = value.clone();
        }
        if is_internal_header(key) {
            continue;
        }
        let action = if append {
            header_value_option::HeaderAppendAction::AppendIfExistsOrAdd
        } else {
            header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd
        };
        out.push(HeaderValueOption {
            header: Some(HeaderValue {
                key: key.clone(),
                value: value.clone(),
                ..Default::default()
            }),
            append_action: action as i32,
            ..Default::default()
        });
    }
    (out, authority)
}

fn is_internal_header(key: &str) -> bool {
    key.starts_with(':') || key.eq_ignore_ascii_case("host")
}

fn drop_internal(keys: &[String]) -> Vec<String> {
    keys.iter().filter(|k| !is_internal_header(k)).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_retry_policy_is_istios() {
        let p = retry_policy(None, false).unwrap();
        assert_eq!(p.num_retries, Some(UInt32Value { value: 2 }));
        assert_eq!(p.retry_on, DEFAULT_RETRY_ON);
        assert_eq!(p.host_selection_retry_max_attempts, 5);
        assert_eq!(
            p.retry_host_predicate[0].name,
            "envoy.retry_host_predicates.previous_hosts"
        );
        assert!(p.retriable_status_codes.is_empty());
        assert!(retry_policy(None, true).unwrap().retry_host_predicate.is_empty());
    }

    #[test]
    fn custom_and_disabled_retries() {
        let r = HttpRetry {
            attempts: 3,
            per_try_timeout: Some("2s".into()),
            retry_on: "gateway-error, 503,connect-failure,425".into(),
            retry_remote_localities: Some(true),
            ..Default::default()
        };
        let p = retry_policy(Some(&r), false).unwrap();
        assert_eq!(p.num_retries, Some(UInt32Value { value: 3 }));
        assert_eq!(p.retry_on, "gateway-error,connect-failure,retriable-status-codes");
        assert_eq!(p.retriable_status_codes, [503, 425]);
        assert_eq!(
            p.per_try_timeout,
            Some(xds_api::pbwkt::Duration { seconds: 2, nanos: 0 })
        );
        assert!(p.retry_priority.is_some());
        assert_eq!(
            retry_policy(
                Some(&HttpRetry {
                    attempts: 0,
                    ..Default::default()
                }),
                false
            ),
            None
        );
    }

    /// Istio 1.26+'s `retryIgnorePreviousHosts` and `backoff`, and the inbound policy.
    #[test]
    fn previous_hosts_back_off_and_inbound_retries() {
        let r = |v: serde_json::Value| serde_json::from_value::<HttpRetry>(v).unwrap();
        let keep = r(serde_json::json!({"attempts": 2, "retryIgnorePreviousHosts": true, "backoff": "25ms"}));
        let p = retry_policy(Some(&keep), true).unwrap();
        assert_eq!(
            p.retry_host_predicate.len(),
            1,
            "asked for, even with consistent hashing"
        );
        assert_eq!(
            p.retry_back_off.unwrap().base_interval,
            Some(xds_api::pbwkt::Duration {
                seconds: 0,
                nanos: 25_000_000
            })
        );
        let drop = r(serde_json::json!({"attempts": 2, "retryIgnorePreviousHosts": false}));
        assert!(
            retry_policy(Some(&drop), false)
                .unwrap()
                .retry_host_predicate
                .is_empty()
        );

        let inbound = inbound_retry_policy(None).unwrap();
        assert_eq!(inbound.retry_on, "reset-before-request");
        assert_eq!(inbound.num_retries, Some(UInt32Value { value: 2 }));
        assert!(inbound.retry_host_predicate.is_empty() && inbound.host_selection_retry_max_attempts == 0);
        let custom = r(serde_json::json!({"attempts": 4, "retryOn": "reset,503", "perTryTimeout": "1s"}));
        let p = inbound_retry_policy(Some(&custom)).unwrap();
        assert_eq!(
            (p.num_retries.unwrap().value, p.retry_on.as_str()),
            (4, "reset,retriable-status-codes")
        );
        assert_eq!(p.retriable_status_codes, [503]);
        assert!(p.per_try_timeout.is_none(), "not for inbound routes");
        assert!(inbound_retry_policy(Some(&r(serde_json::json!({"attempts": 0})))).is_none());
    }

    #[test]
    fn mirror_fractions() {
        let million = |n| {
            Some(FractionalPercent {
                numerator: n,
                denominator: DenominatorType::Million as i32,
            })
        };
        assert_eq!(
            mirror_fraction(Some(&Percent { value: 12.5 }), None)
                .unwrap()
                .default_value,
            million(125_000)
        );
        assert_eq!(mirror_fraction(Some(&Percent { value: 0.0 }), Some(50)), None);
        assert_eq!(mirror_fraction(None, Some(0)), None);
        assert_eq!(
            mirror_fraction(None, None).unwrap().default_value,
            Some(integer_to_fractional(100))
        );
    }

    #[test]
    fn faults() {
        use model::networking::{FaultAbort as IstioAbort, FaultDelay as IstioDelay};
        let f = HttpFaultInjection {
            delay: Some(IstioDelay {
                fixed_delay: Some("5s".into()),
                percentage: Some(Percent { value: 10.0 }),
                ..Default::default()
            }),
            abort: Some(IstioAbort {
                grpc_status: Some("UNAVAILABLE".into()),
                ..Default::default()
            }),
        };
        let out = translate_fault(&f).unwrap();
        let delay = out.delay.unwrap();
        assert_eq!(delay.percentage.unwrap().numerator, 100_000);
        let abort = out.abort.unwrap();
        assert_eq!(abort.error_type, Some(fault_abort::ErrorType::GrpcStatus(14)));
        assert_eq!(abort.percentage, None);
        let exp = HttpFaultInjection {
            delay: Some(IstioDelay {
                exponential_delay: Some("1s".into()),
                ..Default::default()
            }),
            abort: None,
        };
        assert_eq!(translate_fault(&exp), None);
    }

    #[test]
    fn header_operations() {
        let h = Headers {
            request: Some(HeaderOperations {
                set: BTreeMap::from([("x-a".into(), "1".into()), (":authority".into(), "set.example".into())]),
                add: BTreeMap::from([("host".into(), "add.example".into()), ("x-b".into(), "2".into())]),
                remove: vec!["x-c".into(), ":path".into()],
            }),
            response: None,
        };
        let ops = translate_headers(&h);
        assert_eq!(ops.authority, "set.example");
        let keys: Vec<_> = ops
            .request_headers_to_add
            .iter()
            .map(|o| o.header.as_ref().unwrap().key.as_str())
            .collect();
        assert_eq!(keys, ["x-a", "x-b"]);
        assert_eq!(ops.request_headers_to_remove, ["x-c"]);
    }
}
