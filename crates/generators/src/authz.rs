//! AuthorizationPolicy → Envoy filters, as Istio's `security/authz/builder`: one RBAC filter per
//! action in the order AUDIT, DENY, ALLOW (so DENY is decided before ALLOW), HTTP filters for
//! HTTP chains and network filters (stat prefix `tcp.`) for TCP chains. Each rule of a policy is
//! one RBAC policy `ns[<ns>]-policy[<name>]-rule[<i>]`; a policy without rules matches nothing
//! (an ALLOW policy without rules allows nothing); policies annotated `istio.io/dry-run: "true"`
//! go into the shadow rules (stats `istio_dry_run_allow_`/`istio_dry_run_deny_`). CUSTOM policies
//! become ext_authz filters (`custom`, `ext_authz`).

mod custom;
mod ext_authz;
mod matcher;
mod rule;
mod trust_domain;

#[cfg(test)]
mod corpus_tests;

use std::collections::{BTreeMap, HashMap};

use model::{Config, Proxy};
use push_index::PushContext;
use push_index::security_policies::{AuthorizationPoliciesResult, authorization_policy};
use xds_api::envoy::config::listener::v3::{Filter, filter};
use xds_api::envoy::config::rbac::v3::{Policy, Rbac, rbac::Action};
use xds_api::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_filter,
};
use xds_api::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;

pub(crate) use ext_authz::BuiltExtAuthz;
pub(crate) use trust_domain::Bundle;

pub(crate) const HTTP_RBAC_FILTER: &str = "envoy.filters.http.rbac";
pub(crate) const NETWORK_RBAC_FILTER: &str = "envoy.filters.network.rbac";
const TCP_STAT_PREFIX: &str = "tcp.";
const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";
const EXT_AUTHZ_PREFIX: &str = "istio-ext-authz";

/// The authorization filters of one workload.
#[derive(Debug)]
pub(crate) struct Builder {
    bundle: Bundle,
    policies: AuthorizationPoliciesResult,
    /// The mesh's ext_authz providers, by name (for CUSTOM policies).
    extensions: BTreeMap<String, BuiltExtAuthz>,
    /// `PILOT_ENABLE_MULTIPLE_CUSTOM_AUTHZ_PROVIDERS`.
    multiple_custom_providers: bool,
}

/// The authorization filters of one proxy, built once per listener generation and put in front of
/// every inbound (and gateway) chain: HTTP filters before the HCM's own, network filters before
/// tcp_proxy. Sidecar outbound chains get none, as Istio.
#[derive(Debug, Default)]
pub(crate) struct AuthzFilters {
    http: Vec<HttpFilter>,
    network: Vec<Filter>,
}

impl AuthzFilters {
    /// Istio's order: CUSTOM, then authentication (`jwt_authn`), then the RBAC of AUDIT, DENY
    /// and ALLOW.
    pub(crate) fn for_proxy(push: &PushContext, proxy: &Proxy) -> AuthzFilters {
        let builder = Builder::for_proxy(push, proxy);
        let mut http = builder.as_ref().map(|b| b.custom_http_filters()).unwrap_or_default();
        http.extend(crate::authn::jwt_filter(push, proxy));
        http.extend(builder.as_ref().map(|b| b.http_filters()).unwrap_or_default());
        let network = builder
            .map(|b| {
                let mut n = b.custom_network_filters();
                n.extend(b.network_filters());
                n
            })
            .unwrap_or_default();
        AuthzFilters { http, network }
    }

    /// The HCM with the RBAC filters first.
    pub(crate) fn apply_to_hcm(&self, hcm: &mut HttpConnectionManager) {
        if !self.http.is_empty() {
            hcm.http_filters.splice(0..0, self.http.iter().cloned());
        }
    }

    /// The RBAC network filters, then `filters`.
    pub(crate) fn network_filters(&self, filters: Vec<Filter>) -> Vec<Filter> {
        if self.network.is_empty() {
            return filters;
        }
        self.network.iter().cloned().chain(filters).collect()
    }
}

/// One RBAC filter: enforced rules, shadow rules and the shadow stats' prefix.
#[derive(Debug, Clone)]
struct RbacConfig {
    rules: Option<Rbac>,
    shadow: Option<Rbac>,
    shadow_prefix: &'static str,
}

impl RbacConfig {
    fn http(self) -> HttpFilter {
        HttpFilter {
            name: HTTP_RBAC_FILTER.into(),
            config_type: Some(http_filter::ConfigType::TypedConfig(xds_api::pack(&HttpRbac {
                shadow_rules_stat_prefix: self.shadow_prefix.into(),
                rules: self.rules,
                shadow_rules: self.shadow,
                ..Default::default()
            }))),
            ..Default::default()
        }
    }

    fn network(self) -> Filter {
        Filter {
            name: NETWORK_RBAC_FILTER.into(),
            config_type: Some(filter::ConfigType::TypedConfig(xds_api::pack(&NetworkRbac {
                shadow_rules_stat_prefix: self.shadow_prefix.into(),
                stat_prefix: TCP_STAT_PREFIX.into(),
                rules: self.rules,
                shadow_rules: self.shadow,
                ..Default::default()
            }))),
        }
    }
}

fn empty_rbac(action: Action) -> Rbac {
    Rbac {
        action: action as i32,
        policies: HashMap::new(),
        audit_logging_options: None,
    }
}

impl Builder {
    /// The policies that apply to the proxy's workload; `None` when there are none.
    pub(crate) fn for_proxy(push: &PushContext, proxy: &Proxy) -> Option<Builder> {
        let policies = push.authorization_policies(&proxy.config_namespace, &proxy.labels);
        if policies.is_empty() {
            return None;
        }
        let mesh = push.mesh();
        let extensions = if policies.custom.is_empty() {
            BTreeMap::new()
        } else {
            let lookup = |service: &str, port: u16| -> Result<(String, String), String> {
                let cluster = push.lookup_cluster(service, port)?;
                let host = cluster.rsplit("||").next().unwrap_or_default().to_owned();
                Ok((host, cluster))
            };
            ext_authz::process_extension_providers(&mesh.extension_providers, &lookup)
        };
        Some(Builder {
            bundle: Bundle::new(&mesh.trust_domain, &mesh.trust_domain_aliases),
            policies,
            extensions,
            multiple_custom_providers: push.features().enable_multiple_custom_authz_providers,
        })
    }

    /// A builder with the given trust domains, ext_authz providers (`meshConfig.extensionProviders`)
    /// and cluster lookup, as Istio's builder tests make them.
    #[cfg(test)]
    pub(crate) fn for_test(
        bundle: Bundle,
        policies: AuthorizationPoliciesResult,
        extension_providers: &[serde_json::Value],
        lookup: ext_authz::LookupCluster<'_>,
    ) -> Option<Builder> {
        if policies.is_empty() {
            return None;
        }
        Some(Builder {
            bundle,
            policies,
            extensions: ext_authz::process_extension_providers(extension_providers, lookup),
            multiple_custom_providers: false,
        })
    }

    /// The HTTP RBAC filters of AUDIT, DENY and ALLOW.
    pub(crate) fn http_filters(&self) -> Vec<HttpFilter> {
        self.rbacs(false).into_iter().map(RbacConfig::http).collect()
    }

    /// The network RBAC filters of AUDIT, DENY and ALLOW, to go before the chain's tcp_proxy.
    pub(crate) fn network_filters(&self) -> Vec<Filter> {
        self.rbacs(true).into_iter().map(RbacConfig::network).collect()
    }

    /// The filter of each local action: AUDIT, DENY, ALLOW.
    fn rbacs(&self, for_tcp: bool) -> Vec<RbacConfig> {
        let actions = [
            (&self.policies.audit, Action::Log),
            (&self.policies.deny, Action::Deny),
            (&self.policies.allow, Action::Allow),
        ];
        let mut out = Vec::new();
        for (policies, action) in actions {
            if policies.is_empty() {
                continue;
            }
            let (mut rules, mut shadow) = (empty_rbac(action), empty_rbac(action));
            let (mut enforced, mut dry_run) = (false, false);
            for config in policies.iter() {
                let target = if is_dry_run(config) {
                    dry_run = true;
                    &mut shadow
                } else {
                    enforced = true;
                    &mut rules
                };
                target.policies.extend(self.policies_of(config, action, for_tcp, ""));
            }
            let shadow = dry_run.then_some(shadow);
            out.push(RbacConfig {
                shadow_prefix: shadow_stat_prefix(shadow.as_ref()),
                rules: enforced.then_some(rules),
                shadow,
            });
        }
        out
    }

    /// The RBAC policies of one AuthorizationPolicy, by name; rules that cannot be built for this
    /// chain are left out (and logged), as Istio.
    fn policies_of(&self, config: &Config, action: Action, for_tcp: bool, name_prefix: &str) -> Vec<(String, Policy)> {
        let Some(spec) = authorization_policy(config) else {
            return Vec::new();
        };
        let (ns, name) = (&config.meta.namespace, &config.meta.name);
        let policy_name = |i: usize| format!("{name_prefix}ns[{ns}]-policy[{name}]-rule[{i}]");
        let rules = spec.rules.as_deref().unwrap_or_default();
        if rules.is_empty() {
            return vec![(policy_name(0), rule::policy_match_never())];
        }
        let mut out = Vec::new();
        for (i, r) in rules.iter().enumerate() {
            let Some(r) = r else { continue };
            let generated = rule::RuleModel::new(ns, r).and_then(|mut m| {
                m.migrate_trust_domain(&self.bundle);
                m.generate(for_tcp, action)
            });
            match generated {
                Ok(p) => out.push((policy_name(i), p)),
                Err(e) => tracing::debug!(
                    policy = %policy_name(i),
                    chain = if for_tcp { "TCP" } else { "HTTP" },
                    "authorization rule skipped: {e}"
                ),
            }
        }
        out
    }
}

/// The policy's `istio.io/dry-run` annotation, as Go's `strconv.ParseBool` (unparsable: false).
fn is_dry_run(config: &Config) -> bool {
    matches!(
        config.meta.annotations.get(DRY_RUN_ANNOTATION).map(String::as_str),
        Some("1" | "t" | "T" | "true" | "TRUE" | "True")
    )
}

/// Istio's `shadowRuleStatPrefix` (of a missing shadow rule set too: its action reads as ALLOW).
fn shadow_stat_prefix(shadow: Option<&Rbac>) -> &'static str {
    match shadow.map_or(Action::Allow as i32, |r| r.action) {
        a if a == Action::Allow as i32 => "istio_dry_run_allow_",
        a if a == Action::Deny as i32 => "istio_dry_run_deny_",
        _ => "",
    }
}
