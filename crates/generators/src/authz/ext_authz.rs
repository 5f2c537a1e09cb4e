//! The mesh's ext_authz extension providers (`meshConfig.extensionProviders[].envoyExtAuthzHttp`
//! / `envoyExtAuthzGrpc`) as Envoy `ext_authz` filters, as Istio's `processExtensionProvider`:
//! each provider's service (`<ns>/<host>` or a host one namespace has) and port name the outbound
//! cluster; the filter runs only for requests an RBAC shadow rule of a CUSTOM policy of that
//! provider matched (`filter_enabled_metadata` on `istio_ext_authz_shadow_effective_policy_id`).
//! A provider that is missing or wrong is an error the builder turns into a DENY (fail closed).

use std::collections::BTreeMap;

use serde_json::Value;
use xds_api::envoy::config::core::v3::{ApiVersion, GrpcService, HeaderValue, HttpUri, grpc_service, http_uri};
use xds_api::envoy::extensions::filters::http::ext_authz::v3::{
    AuthorizationRequest, AuthorizationResponse, BufferSettings, ExtAuthz as HttpExtAuthz, HttpService, ext_authz,
};
use xds_api::envoy::extensions::filters::network::ext_authz::v3::ExtAuthz as NetworkExtAuthz;
use xds_api::envoy::r#type::matcher::v3::{
    ListStringMatcher, MetadataMatcher, StringMatcher, ValueMatcher, metadata_matcher, string_matcher, value_matcher,
};
use xds_api::envoy::r#type::v3::{HttpStatus, StatusCode};
use xds_api::pbwkt::Duration;

use super::{EXT_AUTHZ_PREFIX, HTTP_RBAC_FILTER, NETWORK_RBAC_FILTER};

/// The RBAC dynamic metadata key a shadow rule match sets (Istio's
/// `RBACExtAuthzShadowRulesStatPrefix + RBACShadowEffectivePolicyID`).
const SHADOW_EFFECTIVE_POLICY_ID: &str = "istio_ext_authz_shadow_effective_policy_id";
/// Istio's `timeoutOrDefault`.
const DEFAULT_TIMEOUT: Duration = Duration { seconds: 600, nanos: 0 };

/// One provider, built.
#[derive(Debug, Clone, Default)]
pub(crate) struct BuiltExtAuthz {
    pub(crate) http: Option<HttpExtAuthz>,
    /// gRPC providers only: HTTP ones do not check TCP connections.
    pub(crate) tcp: Option<NetworkExtAuthz>,
    pub(crate) err: Option<String>,
}

/// Resolves `<ns>/<host>` or `<host>` and a port to (hostname, outbound cluster).
pub(crate) type LookupCluster<'a> = &'a dyn Fn(&str, u16) -> Result<(String, String), String>;

/// Istio's `processExtensionProvider`: the ext_authz providers by name.
pub(crate) fn process_extension_providers(
    providers: &[Value],
    lookup: LookupCluster<'_>,
) -> BTreeMap<String, BuiltExtAuthz> {
    let mut out: BTreeMap<String, BuiltExtAuthz> = BTreeMap::new();
    for (i, p) in providers.iter().enumerate() {
        let name = p.get("name").and_then(Value::as_str).unwrap_or_default().to_owned();
        let mut errs = Vec::new();
        if name.is_empty() {
            errs.push(format!(
                "extension provider name must not be empty, found empty at index: {i}"
            ));
        } else if out.contains_key(&name) {
            errs.push(format!(
                "extension provider name must be unique, found duplicate: {name}"
            ));
        }
        if !name.is_empty()
            && let Err(e) = validate_provider_name(&name)
        {
            errs.push(format!("invalid provider name {name:?}: {e}"));
        }
        let built = if let Some(http) = p.get("envoyExtAuthzHttp") {
            build_http(http, lookup)
        } else if let Some(grpc) = p.get("envoyExtAuthzGrpc") {
            build_grpc(grpc, lookup)
        } else {
            continue;
        };
        let mut built = match built {
            Ok(b) => b,
            Err(e) => {
                errs.push(format!("failed to parse extension provider {name:?}: {e}"));
                BuiltExtAuthz::default()
            }
        };
        built.err = (!errs.is_empty()).then(|| errs.join("; "));
        out.insert(name, built);
    }
    out
}

/// Istio's `validateProviderName`: a DNS label of lowercase letters, digits and `-`.
fn validate_provider_name(name: &str) -> Result<(), String> {
    if name.len() > 63 {
        return Err(format!("provider name too long (max 63 characters): {}", name.len()));
    }
    if let Some((i, c)) = name
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return Err(format!(
            "invalid character {c:?} at position {i} (only lowercase letters, digits, and hyphens allowed)"
        ));
    }
    if name.starts_with('-') || name.ends_with('-') {
        return Err("provider name cannot start or end with hyphen".into());
    }
    Ok(())
}

fn str_field<'a>(v: &'a Value, k: &str) -> &'a str {
    v.get(k).and_then(Value::as_str).unwrap_or_default()
}

fn strings(v: &Value, k: &str) -> Vec<String> {
    v.get(k)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// (hostname, cluster, status on error, timeout) of a provider, or every problem with them.
fn common(v: &Value, lookup: LookupCluster<'_>) -> Result<(String, String, Option<HttpStatus>, Duration), String> {
    let mut errs = Vec::new();
    let port = v.get("port").and_then(Value::as_u64).unwrap_or(0);
    let port = match u16::try_from(port) {
        Ok(p) if p >= 1 => Some(p),
        _ => {
            errs.push(format!("port must be in the range [1, 65535], found: {port}"));
            None
        }
    };
    let service = str_field(v, "service");
    let target = port.map(|p| lookup(service, p));
    if let Some(Err(e)) = &target {
        errs.push(e.clone());
    }
    let status = match str_field(v, "statusOnError") {
        "" => None,
        s => match s
            .parse::<i32>()
            .ok()
            .filter(|c| StatusCode::try_from(*c).is_ok() && *c != 0)
        {
            Some(code) => Some(HttpStatus { code }),
            None => {
                errs.push(format!("unsupported statusOnError {s}"));
                None
            }
        },
    };
    let timeout = match v.get("timeout") {
        None | Some(Value::Null) => DEFAULT_TIMEOUT,
        Some(t) => match t.as_str().and_then(model::duration::parse) {
            Some(d) => crate::route::policy::proto_duration(d),
            None => {
                errs.push(format!("invalid timeout {t}"));
                DEFAULT_TIMEOUT
            }
        },
    };
    match target {
        Some(Ok((hostname, cluster))) if errs.is_empty() => Ok((hostname, cluster, status, timeout)),
        _ => Err(errs.join("; ")),
    }
}

fn build_http(v: &Value, lookup: LookupCluster<'_>) -> Result<BuiltExtAuthz, String> {
    let common = common(v, lookup);
    let mut errs: Vec<String> = common.as_ref().err().cloned().into_iter().collect();
    let path_prefix = str_field(v, "pathPrefix");
    if !path_prefix.is_empty() && !path_prefix.starts_with('/') {
        errs.push(format!("pathPrefix must begin with `/`, found: {path_prefix:?}"));
    }
    for field in [
        "includeRequestHeadersInCheck",
        "includeHeadersInCheck",
        "headersToDownstreamOnDeny",
        "headersToDownstreamOnAllow",
        "headersToUpstreamOnAllow",
    ] {
        if strings(v, field).iter().any(|h| h == "*") {
            errs.push(format!(
                "a single wildcard (\"*\") is not supported, change it to either prefix or suffix match: {field}"
            ));
        }
    }
    let (hostname, cluster, status, timeout) = match common {
        Ok(c) if errs.is_empty() => c,
        _ => return Err(errs.join("; ")),
    };
    let mut service = HttpService {
        path_prefix: path_prefix.to_owned(),
        server_uri: Some(HttpUri {
            uri: format!("http://{hostname}"),
            timeout: Some(timeout),
            http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster)),
        }),
        ..Default::default()
    };
    let mut allowed = headers(&strings(v, "includeRequestHeadersInCheck"));
    if allowed.is_none() {
        allowed = headers(&strings(v, "includeHeadersInCheck"));
    }
    let additional: BTreeMap<String, String> = v
        .get("includeAdditionalHeadersInCheck")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_owned())))
                .collect()
        })
        .unwrap_or_default();
    if !additional.is_empty() {
        service.authorization_request = Some(AuthorizationRequest {
            headers_to_add: additional
                .into_iter()
                .map(|(key, value)| HeaderValue {
                    key,
                    value,
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        });
    }
    let (upstream, on_deny, on_allow) = (
        strings(v, "headersToUpstreamOnAllow"),
        strings(v, "headersToDownstreamOnDeny"),
        strings(v, "headersToDownstreamOnAllow"),
    );
    if !upstream.is_empty() || !on_deny.is_empty() || !on_allow.is_empty() {
        service.authorization_response = Some(AuthorizationResponse {
            allowed_upstream_headers: headers(&upstream),
            allowed_client_headers: headers(&on_deny),
            allowed_client_headers_on_success: headers(&on_allow),
            ..Default::default()
        });
    }
    Ok(BuiltExtAuthz {
        http: Some(HttpExtAuthz {
            status_on_error: status,
            failure_mode_allow: v.get("failOpen").and_then(Value::as_bool).unwrap_or(false),
            transport_api_version: ApiVersion::V3 as i32,
            services: Some(ext_authz::Services::HttpService(service)),
            filter_enabled_metadata: Some(filter_enabled(HTTP_RBAC_FILTER, EXT_AUTHZ_PREFIX)),
            with_request_body: request_body(v),
            allowed_headers: allowed,
            ..Default::default()
        }),
        tcp: None,
        err: None,
    })
}

fn build_grpc(v: &Value, lookup: LookupCluster<'_>) -> Result<BuiltExtAuthz, String> {
    let (hostname, cluster, status, timeout) = common(v, lookup)?;
    let grpc = GrpcService {
        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(grpc_service::EnvoyGrpc {
            cluster_name: cluster,
            authority: hostname,
            ..Default::default()
        })),
        timeout: Some(timeout),
        ..Default::default()
    };
    let fail_open = v.get("failOpen").and_then(Value::as_bool).unwrap_or(false);
    Ok(BuiltExtAuthz {
        http: Some(HttpExtAuthz {
            status_on_error: status,
            failure_mode_allow: fail_open,
            services: Some(ext_authz::Services::GrpcService(grpc.clone())),
            filter_enabled_metadata: Some(filter_enabled(HTTP_RBAC_FILTER, EXT_AUTHZ_PREFIX)),
            transport_api_version: ApiVersion::V3 as i32,
            with_request_body: request_body(v),
            ..Default::default()
        }),
        tcp: Some(NetworkExtAuthz {
            stat_prefix: "tcp.".into(),
            failure_mode_allow: fail_open,
            transport_api_version: ApiVersion::V3 as i32,
            grpc_service: Some(grpc),
            filter_enabled_metadata: Some(filter_enabled(NETWORK_RBAC_FILTER, EXT_AUTHZ_PREFIX)),
            ..Default::default()
        }),
        err: None,
    })
}

fn request_body(v: &Value) -> Option<BufferSettings> {
    let b = v.get("includeRequestBodyInCheck")?;
    Some(BufferSettings {
        max_request_bytes: b.get("maxRequestBytes").and_then(Value::as_u64).unwrap_or(0) as u32,
        allow_partial_message: b.get("allowPartialMessage").and_then(Value::as_bool).unwrap_or(false),
        pack_as_bytes: b.get("packAsBytes").and_then(Value::as_bool).unwrap_or(false),
    })
}

/// Istio's `generateHeaders`: `*x` suffix, `x*` prefix, else exact; case-insensitive.
fn headers(names: &[String]) -> Option<ListStringMatcher> {
    if names.is_empty() {
        return None;
    }
    let patterns = names
        .iter()
        .map(|h| StringMatcher {
            ignore_case: true,
            match_pattern: Some(if let Some(s) = h.strip_prefix('*') {
                string_matcher::MatchPattern::Suffix(s.to_owned())
            } else if let Some(p) = h.strip_suffix('*') {
                string_matcher::MatchPattern::Prefix(p.to_owned())
            } else {
                string_matcher::MatchPattern::Exact(h.clone())
            }),
        })
        .collect();
    Some(ListStringMatcher { patterns })
}

/// Istio's `generateFilterMatcher(ForProvider)`: the RBAC filter `filter` set the shadow effective
/// policy ID to a name starting with `prefix`.
pub(crate) fn filter_enabled(filter: &str, prefix: &str) -> MetadataMatcher {
    MetadataMatcher {
        filter: filter.to_owned(),
        path: vec![metadata_matcher::PathSegment {
            segment: Some(metadata_matcher::path_segment::Segment::Key(
                SHADOW_EFFECTIVE_POLICY_ID.to_owned(),
            )),
        }],
        value: Some(ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::StringMatch(StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Prefix(prefix.to_owned())),
                ignore_case: false,
            })),
        }),
        invert: false,
    }
}
