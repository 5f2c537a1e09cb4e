//! CUSTOM AuthorizationPolicies, as Istio's builder with `IsCustomBuilder`: per extension provider
//! (sorted by name), an RBAC filter whose shadow rules are the provider's policies (DENY, names
//! `istio-ext-authz-<provider>-ns[..]-policy[..]-rule[..]`, stats `istio_ext_authz_`) and that
//! enforces nothing, then the provider's ext_authz filter, enabled only for requests a shadow rule
//! matched. Dry-run CUSTOM policies go into that RBAC filter's enforced rules, as Istio (which
//! notes the limitation: they still reach ext_authz). A provider that is missing, invalid or
//! whose service has no cluster, and CUSTOM policies of several providers on one workload without
//! `PILOT_ENABLE_MULTIPLE_CUSTOM_AUTHZ_PROVIDERS`, get a DENY of the policies' rules instead
//! (`-deny-due-to-bad-CUSTOM-action`): fail closed. An HTTP provider on a TCP chain adds nothing.

use std::collections::BTreeMap;

use xds_api::envoy::config::listener::v3::{Filter, filter};
use xds_api::envoy::config::rbac::v3::{Rbac, rbac::Action};
use xds_api::envoy::extensions::filters::network::http_connection_manager::v3::{HttpFilter, http_filter};

use super::ext_authz::filter_enabled;
use super::{
    Builder, EXT_AUTHZ_PREFIX, HTTP_RBAC_FILTER, NETWORK_RBAC_FILTER, RbacConfig, authorization_policy, empty_rbac,
    is_dry_run,
};

pub(crate) const BAD_CUSTOM_SUFFIX: &str = "-deny-due-to-bad-CUSTOM-action";
const EXT_AUTHZ_SHADOW_STAT_PREFIX: &str = "istio_ext_authz_";
const HTTP_EXT_AUTHZ_FILTER: &str = "envoy.filters.http.ext_authz";
const NETWORK_EXT_AUTHZ_FILTER: &str = "envoy.filters.network.ext_authz";

/// A filter of the CUSTOM stage.
enum CustomFilter {
    Rbac(RbacConfig),
    /// The provider's ext_authz (its name: the filter enabled for it).
    ExtAuthz(String),
}

impl Builder {
    pub(crate) fn custom_http_filters(&self) -> Vec<HttpFilter> {
        self.custom(false)
            .into_iter()
            .filter_map(|f| match f {
                CustomFilter::Rbac(r) => Some(r.http()),
                CustomFilter::ExtAuthz(provider) => {
                    let mut config = self.extensions.get(&provider)?.http.clone()?;
                    config.filter_enabled_metadata = Some(filter_enabled(HTTP_RBAC_FILTER, &enabled_prefix(&provider)));
                    Some(HttpFilter {
                        name: HTTP_EXT_AUTHZ_FILTER.into(),
                        config_type: Some(http_filter::ConfigType::TypedConfig(xds_api::pack(&config))),
                        ..Default::default()
                    })
                }
            })
            .collect()
    }

    pub(crate) fn custom_network_filters(&self) -> Vec<Filter> {
        self.custom(true)
            .into_iter()
            .filter_map(|f| match f {
                CustomFilter::Rbac(r) => Some(r.network()),
                CustomFilter::ExtAuthz(provider) => {
                    let mut config = self.extensions.get(&provider)?.tcp.clone()?;
                    config.filter_enabled_metadata =
                        Some(filter_enabled(NETWORK_RBAC_FILTER, &enabled_prefix(&provider)));
                    Some(Filter {
                        name: NETWORK_EXT_AUTHZ_FILTER.into(),
                        config_type: Some(filter::ConfigType::TypedConfig(xds_api::pack(&config))),
                    })
                }
            })
            .collect()
    }

    fn custom(&self, for_tcp: bool) -> Vec<CustomFilter> {
        if self.policies.custom.is_empty() {
            return Vec::new();
        }
        // provider -> (enforced rules, dry-run rules)
        let mut by_provider: BTreeMap<String, (Rbac, Rbac)> = BTreeMap::new();
        for config in self.policies.custom.iter() {
            let provider = provider_of(config);
            let prefix = policy_prefix(&provider);
            let (rules, shadow) = by_provider
                .entry(provider)
                .or_insert_with(|| (empty_rbac(Action::Deny), empty_rbac(Action::Deny)));
            let target = if is_dry_run(config) { shadow } else { rules };
            target
                .policies
                .extend(self.policies_of(config, Action::Deny, for_tcp, &prefix));
        }
        let several = by_provider.len() > 1 && !self.multiple_custom_providers;
        if several {
            tracing::warn!(
                providers = ?by_provider.keys().collect::<Vec<_>>(),
                "multiple CUSTOM authorization providers per workload need \
                 PILOT_ENABLE_MULTIPLE_CUSTOM_AUTHZ_PROVIDERS: their requests are denied"
            );
        }
        let mut out = Vec::new();
        for (provider, (rules, shadow)) in by_provider {
            let usable = match self.extensions.get(&provider) {
                _ if several => Err(String::new()),
                None => Err(format!(
                    "available providers are {:?} but found {provider:?}",
                    self.extensions.keys().collect::<Vec<_>>()
                )),
                Some(b) => match &b.err {
                    Some(e) => Err(format!("found errors in provider {provider}: {e}")),
                    None => Ok(b),
                },
            };
            match usable {
                Err(why) => {
                    if !why.is_empty() {
                        tracing::warn!(%provider, "CUSTOM authorization denies its requests: {why}");
                    }
                    out.push(CustomFilter::Rbac(RbacConfig {
                        rules: Some(bad_custom_deny(rules)),
                        shadow: None,
                        shadow_prefix: "",
                    }));
                }
                Ok(b) if for_tcp && b.tcp.is_none() => {
                    tracing::debug!(%provider, "HTTP ext_authz provider: nothing to check on TCP chains");
                }
                Ok(_) => {
                    out.push(CustomFilter::Rbac(RbacConfig {
                        rules: (!shadow.policies.is_empty()).then_some(shadow),
                        shadow: Some(rules),
                        shadow_prefix: EXT_AUTHZ_SHADOW_STAT_PREFIX,
                    }));
                    out.push(CustomFilter::ExtAuthz(provider));
                }
            }
        }
        out
    }
}

fn provider_of(config: &model::Config) -> String {
    authorization_policy(config)
        .and_then(|p| p.provider.as_ref())
        .map(|p| p.name.clone())
        .unwrap_or_default()
}

/// Istio's `policyName` prefix for CUSTOM: `istio-ext-authz-<provider>-`.
fn policy_prefix(provider: &str) -> String {
    if provider.is_empty() {
        format!("{EXT_AUTHZ_PREFIX}-")
    } else {
        format!("{EXT_AUTHZ_PREFIX}-{provider}-")
    }
}

/// What the provider's ext_authz filter is enabled by (Istio's `generateFilterMatcherForProvider`).
fn enabled_prefix(provider: &str) -> String {
    format!("{EXT_AUTHZ_PREFIX}-{provider}")
}

/// Istio's `getBadCustomDenyRules`.
fn bad_custom_deny(rules: Rbac) -> Rbac {
    Rbac {
        action: Action::Deny as i32,
        policies: rules
            .policies
            .into_iter()
            .map(|(k, v)| (format!("{k}{BAD_CUSTOM_SUFFIX}"), v))
            .collect(),
        audit_logging_options: None,
    }
}
