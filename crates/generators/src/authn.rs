//! RequestAuthentication → Envoy's `jwt_authn` filter, as Istio's authn policy applier
//! (`JwtFilter`, `convertToEnvoyJwtConfig`): every JWT rule of the RequestAuthentications that
//! select the workload is one provider `origins-<i>` (rules sorted by issuer); a request passes
//! with a token valid for one of them, or with none (`allow_missing`), and is refused with 401
//! when its token is invalid. The verified payload goes to the dynamic metadata `payload`, where
//! AuthorizationPolicy `requestPrincipals` and `request.auth.*` read it. On inbound chains and
//! gateways, never on sidecar outbound chains; gateways clear the route cache (claims may be
//! routed on).
//!
//! Keys (Istio's `PILOT_JWT_ENABLE_REMOTE_JWKS`): inline `jwks` as written; otherwise, in the
//! default `istiod` mode, the JWKS pilot-discovery fetched, inlined, or, while it has none, a key
//! set whose private key was discarded when it was made (every token is rejected: fail closed);
//! in `envoy` mode Envoy fetches from the outbound cluster of the `jwksUri` host; `hybrid` does
//! that when the mesh has the cluster and inlines otherwise.

use std::collections::HashMap;

use model::features::JwksFetchMode;
use model::security::JwtRule;
use model::{Proxy, validation};
use push_index::PushContext;
use push_index::security_policies::request_authentication;
use xds_api::envoy::config::core::v3::{DataSource, HttpUri, data_source, http_uri};
use xds_api::envoy::config::route::v3::{RouteMatch, route_match};
use xds_api::envoy::extensions::filters::http::jwt_authn::v3::{
    JwtAuthentication, JwtClaimToHeader, JwtHeader, JwtProvider, JwtRequirement, JwtRequirementAndList,
    JwtRequirementOrList, RemoteJwks, RequirementRule, jwt_provider, jwt_requirement, requirement_rule,
};
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{HttpFilter, http_filter};
use xds_api::pbwkt::{Duration, Empty};

pub(crate) const JWT_FILTER: &str = "envoy.filters.http.jwt_authn";

/// An RSA public key (JWK) whose private key was generated for this project and destroyed at
/// once: no token can be signed for it.
const PUBLIC_ONLY_JWKS: &str = r#"{"keys":[{"kty":"RSA","e":"AQAB","n":"kROcD7-v-oSf3RAin_wuAERPgkub-omJ4dwqnLBe3Q5IGniDFR6UIY2dyfuFXEAiBjZavOLvuTTqFpGxUGNzytRS-_7b5P0UUOWEL-C1SiskWQ8fNPK6jE9WAVeaFH8OFvbiI9AsE_Bbw1kQk86wBtqaMpkVcte4B3jgX0-GlNb34IbgB-ZprfQMhGoGQkl-_93R5Ji7upR7YWhEwuspS_p0nJJ_X2OHbF5DNnktTjqPczGjhRT6rYKMbyHtQtJZvtkrUSiNfQH4lchYHXRC3nLAbeF24xN-Vq8qFy24KW5oIUtyjI8rzhypc_nEXgyevgPx9iIVE3waSMOrv-3f5w"}]}"#;

/// Istio's default JWKS fetch timeout and Envoy's remote JWKS cache duration.
const DEFAULT_TIMEOUT: Duration = Duration { seconds: 5, nanos: 0 };
const REMOTE_CACHE: Duration = Duration { seconds: 300, nanos: 0 };

/// The proxy's `jwt_authn` filter; `None` when no RequestAuthentication selects it.
pub(crate) fn jwt_filter(push: &PushContext, proxy: &Proxy) -> Option<HttpFilter> {
    let configs = push.request_authentications(&proxy.config_namespace, &proxy.labels);
    let mut rules: Vec<&JwtRule> = configs
        .iter()
        .filter_map(|c| request_authentication(c))
        .flat_map(|ra| ra.jwt_rules.iter().flatten())
        .collect();
    if rules.is_empty() {
        return None;
    }
    rules.sort_by(|a, b| a.issuer.cmp(&b.issuer));
    let config = jwt_authentication(push, &rules, !proxy.is_sidecar());
    Some(HttpFilter {
        name: JWT_FILTER.into(),
        config_type: Some(http_filter::ConfigType::TypedConfig(xds_api::pack(&config))),
        ..Default::default()
    })
}

fn requirement(t: jwt_requirement::RequiresType) -> JwtRequirement {
    JwtRequirement { requires_type: Some(t) }
}

fn jwt_authentication(push: &PushContext, rules: &[&JwtRule], clear_route_cache: bool) -> JwtAuthentication {
    let mut providers = HashMap::new();
    let mut inner_and = Vec::new();
    let mut outer_or = Vec::new();
    for (i, rule) in rules.iter().enumerate() {
        let name = format!("origins-{i}");
        providers.insert(name.clone(), provider(push, rule, clear_route_cache));
        use jwt_requirement::RequiresType as R;
        inner_and.push(requirement(R::RequiresAny(JwtRequirementOrList {
            requirements: vec![
                requirement(R::ProviderName(name.clone())),
                requirement(R::AllowMissing(Empty {})),
            ],
        })));
        outer_or.push(requirement(R::ProviderName(name)));
    }
    let requires = if inner_and.len() == 1 {
        inner_and.remove(0)
    } else {
        outer_or.push(requirement(jwt_requirement::RequiresType::RequiresAll(
            JwtRequirementAndList {
                requirements: inner_and,
            },
        )));
        requirement(jwt_requirement::RequiresType::RequiresAny(JwtRequirementOrList {
            requirements: outer_or,
        }))
    };
    JwtAuthentication {
        providers,
        rules: vec![RequirementRule {
            r#match: Some(RouteMatch {
                path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                ..Default::default()
            }),
            requirement_type: Some(requirement_rule::RequirementType::Requires(requires)),
        }],
        bypass_cors_preflight: true,
        ..Default::default()
    }
}

fn provider(push: &PushContext, rule: &JwtRule, clear_route_cache: bool) -> JwtProvider {
    JwtProvider {
        issuer: rule.issuer.clone(),
        audiences: rule.audiences.clone(),
        forward: rule.forward_original_token,
        forward_payload_header: rule.output_payload_to_header.clone(),
        payload_in_metadata: "payload".into(),
        normalize_payload_in_metadata: Some(jwt_provider::NormalizePayload {
            space_delimited_claims: space_delimited_claims(&rule.space_delimited_claims),
        }),
        clear_route_cache,
        claim_to_headers: rule
            .output_claim_to_headers
            .iter()
            .flatten()
            .map(|c| JwtClaimToHeader {
                header_name: c.header.clone(),
                claim_name: c.claim.clone(),
                ..Default::default()
            })
            .collect(),
        from_headers: rule
            .from_headers
            .iter()
            .map(|h| JwtHeader {
                name: h.name.clone(),
                value_prefix: h.prefix.clone(),
            })
            .collect(),
        from_params: rule.from_params.clone(),
        from_cookies: rule.from_cookies.clone(),
        jwks_source_specifier: Some(jwks_source(push, rule)),
        ..Default::default()
    }
}

/// Istio's `buildSpaceDelimitedClaims`: `permission` and `scope` always, sorted with the rule's.
fn space_delimited_claims(claims: &[String]) -> Vec<String> {
    let mut out: Vec<String> = ["permission", "scope"].map(String::from).to_vec();
    out.extend(claims.iter().cloned());
    out.sort();
    out.dedup();
    out
}

fn jwks_source(push: &PushContext, rule: &JwtRule) -> jwt_provider::JwksSourceSpecifier {
    let mode = push.features().jwks_fetch_mode;
    if !rule.jwks.is_empty() {
        return inline(&rule.jwks);
    }
    if mode != JwksFetchMode::Istiod && !rule.jwks_uri.is_empty() {
        let timeout = rule
            .timeout
            .as_deref()
            .and_then(model::duration::parse)
            .map_or(DEFAULT_TIMEOUT, crate::route::policy::proto_duration);
        let remote = |cluster: String| {
            jwt_provider::JwksSourceSpecifier::RemoteJwks(RemoteJwks {
                http_uri: Some(HttpUri {
                    uri: rule.jwks_uri.clone(),
                    timeout: Some(timeout),
                    http_upstream_type: Some(http_uri::HttpUpstreamType::Cluster(cluster)),
                }),
                cache_duration: Some(REMOTE_CACHE),
                ..Default::default()
            })
        };
        match validation::parse_jwks_uri(&rule.jwks_uri) {
            Ok((_, host, port)) => match push.lookup_cluster(&host, port) {
                Ok(cluster) => return remote(cluster),
                Err(e) if mode == JwksFetchMode::Envoy => {
                    tracing::warn!(
                        jwks_uri = %rule.jwks_uri,
                        "no cluster for the JWKS host ({e}): create a ServiceEntry for it or set \
                         PILOT_JWT_ENABLE_REMOTE_JWKS to hybrid or istiod"
                    );
                    return remote(format!("outbound|{port}||{host}"));
                }
                Err(_) => {}
            },
            Err(e) => tracing::warn!(jwks_uri = %rule.jwks_uri, "bad JWKS URI: {e}"),
        }
    }
    inline(push.jwks(&rule.issuer, &rule.jwks_uri).unwrap_or(PUBLIC_ONLY_JWKS))
}

fn inline(jwks: &str) -> jwt_provider::JwksSourceSpecifier {
    jwt_provider::JwksSourceSpecifier::LocalJwks(DataSource {
        specifier: Some(data_source::Specifier::InlineString(jwks.to_owned())),
        ..Default::default()
    })
}

#[cfg(test)]
#[path = "authn_tests.rs"]
mod tests;
