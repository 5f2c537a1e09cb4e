//! AuthorizationPolicy → Envoy RBAC filters, as Istio's `security/authz/builder`: one RBAC filter
//! per action in the order AUDIT, DENY, ALLOW (so DENY is decided before ALLOW), HTTP filters for
//! HTTP chains and network filters (stat prefix `tcp.`) for TCP chains. Each rule of a policy is
//! one RBAC policy `ns[<ns>]-policy[<name>]-rule[<i>]`; a policy without rules matches nothing
//! (an ALLOW policy without rules allows nothing); policies annotated `istio.io/dry-run: "true"`
//! go into the shadow rules (stats `istio_dry_run_allow_`/`istio_dry_run_deny_`).
//!
//! CUSTOM policies (ext_authz through the mesh's `extensionProviders`) are not built yet: they get
//! what Istio generates for a CUSTOM policy whose provider it cannot use, a DENY of the requests
//! the policy would send to the provider (fail closed), never an allow.

mod matcher;
mod rule;
mod trust_domain;

#[cfg(test)]
mod corpus_tests;

use std::collections::HashMap;
use std::sync::Arc;

use model::{Config, MeshConfig, Proxy};
use push_index::PushContext;
use push_index::security_policies::{AuthorizationPoliciesResult, authorization_policy};
use xds_api::envoy::config::listener::v3::{Filter, filter};
use xds_api::envoy::config::rbac::v3::{Rbac, rbac::Action};
use xds_api::envoy::extensions::filters::http::rbac::v3::Rbac as HttpRbac;
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, http_filter,
};
use xds_api::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;

pub(crate) use trust_domain::Bundle;

pub(crate) const HTTP_RBAC_FILTER: &str = "envoy.filters.http.rbac";
pub(crate) const NETWORK_RBAC_FILTER: &str = "envoy.filters.network.rbac";
const TCP_STAT_PREFIX: &str = "tcp.";
const DRY_RUN_ANNOTATION: &str = "istio.io/dry-run";
const EXT_AUTHZ_PREFIX: &str = "istio-ext-authz";
const BAD_CUSTOM_SUFFIX: &str = "-deny-due-to-bad-CUSTOM-action";

/// The authorization filters of one workload.
#[derive(Debug)]
pub(crate) struct Builder {
    bundle: Bundle,
    policies: AuthorizationPoliciesResult,
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
        let (custom, local) = builder.as_ref().map(Builder::http_filters_by_stage).unwrap_or_default();
        let mut http = custom;
        http.extend(crate::authn::jwt_filter(push, proxy));
        http.extend(local);
        AuthzFilters {
            http,
            network: builder.map(|b| b.network_filters()).unwrap_or_default(),
        }
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

/// The enforced and the dry-run rules of one action.
struct Built {
    rules: Option<Rbac>,
    shadow: Option<Rbac>,
}

impl Builder {
    /// The policies that apply to the proxy's workload; `None` when there are none.
    pub(crate) fn for_proxy(push: &PushContext, proxy: &Proxy) -> Option<Builder> {
        let policies = push.authorization_policies(&proxy.config_namespace, &proxy.labels);
        Builder::new(push.mesh(), policies)
    }

    pub(crate) fn new(mesh: &MeshConfig, policies: AuthorizationPoliciesResult) -> Option<Builder> {
        Builder::with_bundle(Bundle::new(&mesh.trust_domain, &mesh.trust_domain_aliases), policies)
    }

    /// With the given trust domains (Istio's tests build some without any).
    pub(crate) fn with_bundle(bundle: Bundle, policies: AuthorizationPoliciesResult) -> Option<Builder> {
        if policies.is_empty() {
            return None;
        }
        Some(Builder { bundle, policies })
    }

    /// The HTTP RBAC filters, CUSTOM first.
    #[cfg(test)]
    pub(crate) fn http_filters(&self) -> Vec<HttpFilter> {
        let (mut custom, local) = self.http_filters_by_stage();
        custom.extend(local);
        custom
    }

    /// (CUSTOM, AUDIT/DENY/ALLOW) HTTP RBAC filters: authentication goes between them.
    pub(crate) fn http_filters_by_stage(&self) -> (Vec<HttpFilter>, Vec<HttpFilter>) {
        let custom = usize::from(!self.policies.custom.is_empty());
        let mut all: Vec<HttpFilter> = self
            .rbacs(false)
            .into_iter()
            .map(|(rules, shadow, shadow_prefix)| HttpFilter {
                name: HTTP_RBAC_FILTER.into(),
                config_type: Some(http_filter::ConfigType::TypedConfig(xds_api::pack(&HttpRbac {
                    shadow_rules_stat_prefix: shadow_prefix.into(),
                    rules,
                    shadow_rules: shadow,
                    ..Default::default()
                }))),
                ..Default::default()
            })
            .collect();
        let local = all.split_off(custom);
        (all, local)
    }

    /// The network RBAC filters, to go before the chain's tcp_proxy.
    pub(crate) fn network_filters(&self) -> Vec<Filter> {
        self.rbacs(true)
            .into_iter()
            .map(|(rules, shadow, shadow_prefix)| Filter {
                name: NETWORK_RBAC_FILTER.into(),
                config_type: Some(filter::ConfigType::TypedConfig(xds_api::pack(&NetworkRbac {
                    shadow_rules_stat_prefix: shadow_prefix.into(),
                    stat_prefix: TCP_STAT_PREFIX.into(),
                    rules,
                    shadow_rules: shadow,
                    ..Default::default()
                }))),
            })
            .collect()
    }

    /// (rules, shadow rules, shadow stat prefix) of each filter: the CUSTOM deny, then AUDIT,
    /// DENY, ALLOW.
    fn rbacs(&self, for_tcp: bool) -> Vec<(Option<Rbac>, Option<Rbac>, &'static str)> {
        let mut out = Vec::new();
        if !self.policies.custom.is_empty() {
            out.push((Some(self.bad_custom_deny(for_tcp)), None, ""));
        }
        let actions = [
            (&self.policies.audit, Action::Log),
            (&self.policies.deny, Action::Deny),
            (&self.policies.allow, Action::Allow),
        ];
        for (policies, action) in actions {
            if let Some(built) = self.build(policies, action, for_tcp) {
                let prefix = shadow_stat_prefix(built.shadow.as_ref());
                out.push((built.rules, built.shadow, prefix));
            }
        }
        out
    }

    fn build(&self, policies: &[Arc<Config>], action: Action, for_tcp: bool) -> Option<Built> {
        if policies.is_empty() {
            return None;
        }
        let empty = || Rbac {
            action: action as i32,
            policies: HashMap::new(),
            audit_logging_options: None,
        };
        let (mut rules, mut shadow) = (empty(), empty());
        let (mut enforced, mut dry_run) = (false, false);
        for config in policies {
            let target = if is_dry_run(config) {
                dry_run = true;
                &mut shadow
            } else {
                enforced = true;
                &mut rules
            };
            target.policies.extend(self.policies_of(config, action, for_tcp, ""));
        }
        Some(Built {
            rules: enforced.then_some(rules),
            shadow: dry_run.then_some(shadow),
        })
    }

    /// The RBAC policies of one AuthorizationPolicy, by name; rules that cannot be built for this
    /// chain are left out (and logged), as Istio.
    fn policies_of(
        &self,
        config: &Config,
        action: Action,
        for_tcp: bool,
        name_prefix: &str,
    ) -> Vec<(String, xds_api::envoy::config::rbac::v3::Policy)> {
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

    /// Istio's `getBadCustomDenyRules`: the CUSTOM policies' rules as DENY.
    fn bad_custom_deny(&self, for_tcp: bool) -> Rbac {
        let mut policies = HashMap::new();
        for config in &self.policies.custom {
            let provider = authorization_policy(config)
                .and_then(|p| p.provider.as_ref())
                .map(|p| p.name.as_str())
                .unwrap_or_default();
            let prefix = if provider.is_empty() {
                format!("{EXT_AUTHZ_PREFIX}-")
            } else {
                format!("{EXT_AUTHZ_PREFIX}-{provider}-")
            };
            for (name, policy) in self.policies_of(config, Action::Deny, for_tcp, &prefix) {
                policies.insert(format!("{name}{BAD_CUSTOM_SUFFIX}"), policy);
            }
        }
        Rbac {
            action: Action::Deny as i32,
            policies,
            audit_logging_options: None,
        }
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
