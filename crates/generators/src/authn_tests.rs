use std::sync::Arc;

use prost::Message;
use serde_json::{Value, json};
use xds_api::envoy::extensions::filters::http::jwt_authn::v3::{JwtAuthentication, jwt_provider, jwt_requirement};
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::http_filter;

use super::*;
use crate::testing::{config_in, gateway_proxy, proxy, push_input, service_entry};
use push_index::security_policies::JwksKey;

const FETCHED: &str = r#"{"keys":[{"kty":"EC","crv":"P-256","x":"a","y":"b"}]}"#;

fn request_authn(name: &str, ns: &str, spec: Value) -> Value {
    config_in("security.istio.io/v1", "RequestAuthentication", name, ns, spec)
}

fn push_with(docs: Vec<Value>, fetched: &[(&str, &str)], mode: JwksFetchMode) -> PushContext {
    let mut input = push_input(model::MeshConfig::default(), docs);
    input.features.jwks_fetch_mode = mode;
    input.jwks = Arc::new(
        fetched
            .iter()
            .map(|(issuer, uri)| {
                (
                    JwksKey {
                        issuer: (*issuer).into(),
                        jwks_uri: (*uri).into(),
                    },
                    FETCHED.to_owned(),
                )
            })
            .collect(),
    );
    PushContext::new(input)
}

fn config_of(filter: &HttpFilter) -> JwtAuthentication {
    assert_eq!(filter.name, JWT_FILTER);
    let Some(http_filter::ConfigType::TypedConfig(any)) = &filter.config_type else {
        panic!("no typed config")
    };
    JwtAuthentication::decode(any.value.as_slice()).unwrap()
}

fn inline_keys(p: &JwtProvider) -> String {
    match &p.jwks_source_specifier {
        Some(jwt_provider::JwksSourceSpecifier::LocalJwks(DataSource {
            specifier: Some(data_source::Specifier::InlineString(s)),
            ..
        })) => s.clone(),
        other => panic!("not inline: {other:?}"),
    }
}

#[test]
fn one_rule_is_one_provider_that_allows_a_missing_token() {
    let ra = request_authn(
        "jwt",
        "default",
        json!({"selector": {"matchLabels": {"app": "reviews"}}, "jwtRules": [{
            "issuer": "https://issuer.example.com", "jwksUri": "https://issuer.example.com/jwks",
            "audiences": ["reviews"], "forwardOriginalToken": true, "outputPayloadToHeader": "x-jwt",
            "fromHeaders": [{"name": "x-token", "prefix": "Bearer "}], "fromParams": ["token"],
            "outputClaimToHeaders": [{"header": "x-sub", "claim": "sub"}], "spaceDelimitedClaims": ["roles"]}]}),
    );
    let push = push_with(
        vec![ra],
        &[("https://issuer.example.com", "https://issuer.example.com/jwks")],
        JwksFetchMode::Istiod,
    );
    let reviews = proxy("sidecar", "default", json!({"app": "reviews"}));
    assert!(jwt_filter(&push, &proxy("sidecar", "default", json!({"app": "other"}))).is_none());
    let config = config_of(&jwt_filter(&push, &reviews).unwrap());
    assert!(config.bypass_cors_preflight);
    let p = &config.providers["origins-0"];
    assert_eq!(p.issuer, "https://issuer.example.com");
    assert_eq!(p.audiences, ["reviews"]);
    assert!(p.forward && !p.clear_route_cache);
    assert_eq!(p.payload_in_metadata, "payload");
    assert_eq!(p.forward_payload_header, "x-jwt");
    assert_eq!(p.from_headers[0].value_prefix, "Bearer ");
    assert_eq!(p.from_params, ["token"]);
    assert_eq!(p.claim_to_headers[0].header_name, "x-sub");
    assert_eq!(
        p.normalize_payload_in_metadata.as_ref().unwrap().space_delimited_claims,
        ["permission", "roles", "scope"]
    );
    assert_eq!(inline_keys(p), FETCHED, "the keys pilot-discovery fetched, inlined");
    let rule = &config.rules[0];
    let Some(requirement_rule::RequirementType::Requires(req)) = &rule.requirement_type else {
        panic!("{rule:?}")
    };
    let Some(jwt_requirement::RequiresType::RequiresAny(any)) = &req.requires_type else {
        panic!("{req:?}")
    };
    assert_eq!(
        any.requirements
            .iter()
            .map(|r| r.requires_type.clone())
            .collect::<Vec<_>>(),
        [
            Some(jwt_requirement::RequiresType::ProviderName("origins-0".into())),
            Some(jwt_requirement::RequiresType::AllowMissing(Empty {})),
        ]
    );
    // gateways clear the route cache
    let gw_ra = request_authn(
        "gw",
        "istio-system",
        json!({"jwtRules": [{"issuer": "i", "jwks": FETCHED}]}),
    );
    let push = push_with(vec![gw_ra], &[], JwksFetchMode::Istiod);
    let config = config_of(&jwt_filter(&push, &gateway_proxy()).unwrap());
    assert!(config.providers["origins-0"].clear_route_cache);
}

#[test]
fn keys_not_fetched_yet_reject_every_token() {
    let ra = request_authn(
        "jwt",
        "default",
        json!({"jwtRules": [{"issuer": "https://down.example.com"}]}),
    );
    let push = push_with(vec![ra], &[], JwksFetchMode::Istiod);
    let config = config_of(&jwt_filter(&push, &proxy("sidecar", "default", json!({}))).unwrap());
    let keys = inline_keys(&config.providers["origins-0"]);
    assert_eq!(keys, PUBLIC_ONLY_JWKS);
    let v: Value = serde_json::from_str(&keys).unwrap();
    assert!(v["keys"][0].get("d").is_none(), "no private part");
}

#[test]
fn several_rules_need_one_valid_token_or_none() {
    let ra = request_authn(
        "jwt",
        "default",
        json!({"jwtRules": [{"issuer": "b", "jwks": FETCHED}, {"issuer": "a", "jwks": FETCHED}]}),
    );
    let push = push_with(vec![ra], &[], JwksFetchMode::Istiod);
    let config = config_of(&jwt_filter(&push, &proxy("sidecar", "default", json!({}))).unwrap());
    assert_eq!(config.providers["origins-0"].issuer, "a", "sorted by issuer");
    let Some(requirement_rule::RequirementType::Requires(req)) = &config.rules[0].requirement_type else {
        panic!()
    };
    let Some(jwt_requirement::RequiresType::RequiresAny(any)) = &req.requires_type else {
        panic!()
    };
    // origins-0 | origins-1 | (each of them or missing)
    assert_eq!(any.requirements.len(), 3);
    assert!(matches!(
        any.requirements[2].requires_type,
        Some(jwt_requirement::RequiresType::RequiresAll(_))
    ));
}

#[test]
fn envoy_mode_fetches_through_the_jwks_host_cluster() {
    let issuer_se = service_entry(
        "issuer",
        "default",
        json!({"hosts": ["issuer.example.com"], "location": "MESH_EXTERNAL", "resolution": "DNS",
            "ports": [{"number": 443, "name": "https", "protocol": "TLS"}]}),
    );
    let rule = json!({"jwtRules": [{"issuer": "i", "jwksUri": "https://issuer.example.com/jwks", "timeout": "2s"}]});
    let remote =
        |push: &PushContext| match &config_of(&jwt_filter(push, &proxy("sidecar", "default", json!({}))).unwrap())
            .providers["origins-0"]
            .jwks_source_specifier
        {
            Some(jwt_provider::JwksSourceSpecifier::RemoteJwks(r)) => {
                let uri = r.http_uri.clone().unwrap();
                assert_eq!(uri.timeout.unwrap().seconds, 2);
                uri.http_upstream_type.map(|http_uri::HttpUpstreamType::Cluster(c)| c)
            }
            _ => None,
        };
    let with_se = vec![request_authn("jwt", "default", rule.clone()), issuer_se];
    for mode in [JwksFetchMode::Envoy, JwksFetchMode::Hybrid] {
        let push = push_with(with_se.clone(), &[], mode);
        assert_eq!(remote(&push).as_deref(), Some("outbound|443||issuer.example.com"));
    }
    let without = vec![request_authn("jwt", "default", rule)];
    assert_eq!(
        remote(&push_with(without.clone(), &[], JwksFetchMode::Envoy)).as_deref(),
        Some("outbound|443||issuer.example.com"),
        "envoy mode names the cluster anyway"
    );
    assert_eq!(
        remote(&push_with(without, &[], JwksFetchMode::Hybrid)),
        None,
        "hybrid inlines without a cluster"
    );
}
