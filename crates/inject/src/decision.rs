//! Whether a Pod gets a sidecar: the selectors of Istio's `istio-sidecar-injector`
//! MutatingWebhookConfiguration (namespace `istio-injection` / `istio.io/rev` labels, the Pod's
//! `sidecar.istio.io/inject` and `istio.io/rev` labels), then Istio's `injectRequired`
//! (`pkg/kube/inject/inject.go`): host network, ignored namespaces, the
//! `sidecar.istio.io/inject` label or annotation, never/always selectors, the policy.

use std::collections::BTreeMap;

use crate::config::{InjectorConfig, Policy};

/// Istio's `IgnoredNamespaces`: system namespaces never injected.
pub const IGNORED_NAMESPACES: &[&str] = &["kube-system", "kube-public", "kube-node-lease", "local-path-storage"];

const INJECT_KEY: &str = "sidecar.istio.io/inject";

/// Why a Pod was not injected (the `sidecar_injection_skip_total` reason).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// The webhook configuration's selectors do not select the Pod (Kubernetes would not call).
    NotSelected,
    HostNetwork,
    IgnoredNamespace(String),
    /// `sidecar.istio.io/inject: "false"` on the Pod.
    Disabled,
    /// The Pod's labels match a `neverInjectSelector`.
    NeverInjectSelector,
    /// The policy is `disabled` and nothing asked for injection.
    PolicyDisabled,
    /// The policy is neither `enabled` nor `disabled`.
    IllegalPolicy(String),
}

impl SkipReason {
    /// A short label for a metric.
    pub fn label(&self) -> &'static str {
        match self {
            SkipReason::NotSelected => "not_selected",
            SkipReason::HostNetwork => "host_network",
            SkipReason::IgnoredNamespace(_) => "ignored_namespace",
            SkipReason::Disabled => "disabled",
            SkipReason::NeverInjectSelector => "never_inject_selector",
            SkipReason::PolicyDisabled => "policy_disabled",
            SkipReason::IllegalPolicy(_) => "illegal_policy",
        }
    }
}

/// Whether one of the injector's webhooks selects the Pod, as the API server decides from the
/// webhook configuration Istio installs for `revision` (`default` also has the
/// `istio-injection=enabled` and object-label webhooks).
pub fn webhook_selects(
    revision: &str,
    namespace_labels: &BTreeMap<String, String>,
    pod_labels: &BTreeMap<String, String>,
) -> bool {
    let ns = |k: &str| namespace_labels.get(k).map(String::as_str);
    let pod = |k: &str| pod_labels.get(k).map(String::as_str);
    let revision = if revision.is_empty() { "default" } else { revision };
    let not_disabled = pod(INJECT_KEY) != Some("false");
    let rev_namespace = ns("istio.io/rev") == Some(revision) && ns("istio-injection").is_none() && not_disabled;
    let rev_object = ns("istio.io/rev").is_none()
        && ns("istio-injection").is_none()
        && not_disabled
        && pod("istio.io/rev") == Some(revision);
    let default_rev = revision == "default";
    let namespace = default_rev && ns("istio-injection") == Some("enabled") && not_disabled;
    let object = default_rev
        && ns("istio-injection").is_none()
        && ns("istio.io/rev").is_none()
        && pod(INJECT_KEY) == Some("true")
        && pod("istio.io/rev").is_none();
    rev_namespace || rev_object || namespace || object
}

/// Istio's `injectRequired`: `Ok(())` when the Pod is to be injected.
pub(crate) fn inject_required(
    cfg: &InjectorConfig,
    namespace: &str,
    host_network: bool,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Result<(), SkipReason> {
    if host_network {
        return Err(SkipReason::HostNetwork);
    }
    if IGNORED_NAMESPACES.contains(&namespace) {
        return Err(SkipReason::IgnoredNamespace(namespace.to_string()));
    }
    // The label wins over the annotation; other values fall back to the policy.
    let selector = labels
        .get(INJECT_KEY)
        .or(annotations.get(INJECT_KEY))
        .map(String::as_str)
        .unwrap_or("");
    let mut explicit = match selector {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    };
    let matches = |s: &model::mesh::LabelSelector| {
        (!s.match_labels.is_empty() || !s.match_expressions.is_empty()) && s.matches(labels)
    };
    if explicit.is_none() && cfg.never_inject.iter().any(matches) {
        return Err(SkipReason::NeverInjectSelector);
    }
    if explicit.is_none() && cfg.always_inject.iter().any(matches) {
        explicit = Some(true);
    }
    match (&cfg.policy, explicit) {
        (Policy::Other(p), _) => Err(SkipReason::IllegalPolicy(p.clone())),
        (_, Some(true)) => Ok(()),
        (_, Some(false)) => Err(SkipReason::Disabled),
        (Policy::Enabled, None) => Ok(()),
        (Policy::Disabled, None) => Err(SkipReason::PolicyDisabled),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(policy: &str, extra: &str) -> InjectorConfig {
        InjectorConfig::parse(&format!("policy: {policy}\n{extra}"), "{}").unwrap_or_else(|e| panic!("{e}"))
    }

    fn m(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn inject_required_as_istio() {
        let on = cfg("enabled", "");
        let off = cfg("disabled", "");
        let none = m(&[]);
        assert_eq!(inject_required(&on, "default", false, &none, &none), Ok(()));
        assert_eq!(
            inject_required(&on, "default", true, &none, &none),
            Err(SkipReason::HostNetwork)
        );
        assert_eq!(
            inject_required(&on, "kube-system", false, &none, &none),
            Err(SkipReason::IgnoredNamespace("kube-system".into()))
        );
        assert_eq!(
            inject_required(&off, "default", false, &none, &none),
            Err(SkipReason::PolicyDisabled)
        );
        let ann_true = m(&[(INJECT_KEY, "true")]);
        assert_eq!(inject_required(&off, "default", false, &none, &ann_true), Ok(()));
        // the label wins over the annotation
        assert_eq!(
            inject_required(&on, "default", false, &m(&[(INJECT_KEY, "false")]), &ann_true),
            Err(SkipReason::Disabled)
        );
        // an invalid value falls back to the policy
        assert_eq!(
            inject_required(&off, "default", false, &none, &m(&[(INJECT_KEY, "yes")])),
            Err(SkipReason::PolicyDisabled)
        );
        assert!(matches!(
            inject_required(&cfg("bogus", ""), "default", false, &none, &none),
            Err(SkipReason::IllegalPolicy(_))
        ));
    }

    #[test]
    fn selectors_never_wins_over_always() {
        let c = cfg(
            "disabled",
            "neverInjectSelector:\n- matchLabels: {a: b}\nalwaysInjectSelector:\n- matchLabels: {a: b}\n- matchLabels: {x: z}\n- {}\n",
        );
        let none = m(&[]);
        assert_eq!(
            inject_required(&c, "ns", false, &m(&[("a", "b")]), &none),
            Err(SkipReason::NeverInjectSelector)
        );
        assert_eq!(inject_required(&c, "ns", false, &m(&[("x", "z")]), &none), Ok(()));
        // the empty selector matches nothing
        assert_eq!(
            inject_required(&c, "ns", false, &m(&[("q", "r")]), &none),
            Err(SkipReason::PolicyDisabled)
        );
    }

    #[test]
    fn webhook_selectors_of_the_default_revision() {
        let none = m(&[]);
        assert!(webhook_selects("default", &m(&[("istio-injection", "enabled")]), &none));
        assert!(!webhook_selects(
            "default",
            &m(&[("istio-injection", "enabled")]),
            &m(&[(INJECT_KEY, "false")])
        ));
        assert!(webhook_selects("default", &m(&[("istio.io/rev", "default")]), &none));
        assert!(!webhook_selects("default", &m(&[("istio.io/rev", "canary")]), &none));
        assert!(webhook_selects("canary", &m(&[("istio.io/rev", "canary")]), &none));
        assert!(!webhook_selects("canary", &m(&[("istio-injection", "enabled")]), &none));
        assert!(webhook_selects("default", &none, &m(&[(INJECT_KEY, "true")])));
        assert!(webhook_selects("default", &none, &m(&[("istio.io/rev", "default")])));
        assert!(!webhook_selects("default", &none, &none));
    }
}
