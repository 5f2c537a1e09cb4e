//! The `istio-sidecar-injector` ConfigMap (Istio's `inject.Config`, `UnmarshalConfig`,
//! `NewValuesConfig`): the `config` key (policy, selectors, injected annotations, templates
//! parsed once here, aliases) and the `values` key (Helm values, as JSON or YAML).

use std::collections::BTreeMap;

use model::mesh::LabelSelector;
use serde::Deserialize;
use serde_json::Value as Json;

use crate::template::{Template, TemplateError};
use crate::yaml::from_yaml;

/// Istio's `InjectionPolicy`: inject by default (`enabled`) or only on request (`disabled`); any
/// other value disables injection, as Istio does after logging it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Policy {
    Enabled,
    Disabled,
    Other(String),
}

/// What is wrong with the ConfigMap; the caller keeps serving the last good config.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("istio-sidecar-injector config: {0}")]
    Config(String),
    #[error("istio-sidecar-injector config: template {name:?}: {source}")]
    Template {
        name: String,
        #[source]
        source: TemplateError,
    },
    #[error("istio-sidecar-injector values: {0}")]
    Values(String),
}

/// The parsed ConfigMap, templates ready to run. Immutable; share it behind an `Arc`.
#[derive(Debug, Clone)]
pub struct InjectorConfig {
    pub(crate) policy: Policy,
    pub(crate) default_templates: Vec<String>,
    pub(crate) templates: BTreeMap<String, Template>,
    pub(crate) aliases: BTreeMap<String, Vec<String>>,
    pub(crate) never_inject: Vec<LabelSelector>,
    pub(crate) always_inject: Vec<LabelSelector>,
    pub(crate) injected_annotations: BTreeMap<String, String>,
    pub(crate) values: Json,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawConfig {
    #[serde(default)]
    policy: Option<String>,
    #[serde(default)]
    default_templates: Option<Vec<String>>,
    #[serde(default)]
    templates: Option<BTreeMap<String, String>>,
    #[serde(default)]
    aliases: Option<BTreeMap<String, Vec<String>>>,
    #[serde(default)]
    never_inject_selector: Option<Vec<LabelSelector>>,
    #[serde(default)]
    always_inject_selector: Option<Vec<LabelSelector>>,
    #[serde(default)]
    injected_annotations: Option<BTreeMap<String, String>>,
}

impl InjectorConfig {
    /// Parses the ConfigMap's `config` (YAML) and `values` (JSON or YAML) keys.
    pub fn parse(config: &str, values: &str) -> Result<InjectorConfig, ConfigError> {
        let json = from_yaml(config).map_err(ConfigError::Config)?;
        let raw: RawConfig = match json {
            Json::Null => return Err(ConfigError::Config("empty".into())),
            j => serde_json::from_value(j).map_err(|e| ConfigError::Config(e.to_string()))?,
        };
        let policy = match raw.policy.as_deref() {
            Some("enabled") => Policy::Enabled,
            Some("disabled") => Policy::Disabled,
            other => Policy::Other(other.unwrap_or_default().to_string()),
        };
        let mut templates = BTreeMap::new();
        for (name, text) in raw.templates.unwrap_or_default() {
            let t = Template::parse(&text).map_err(|source| ConfigError::Template {
                name: name.clone(),
                source,
            })?;
            templates.insert(name, t);
        }
        let values = match from_yaml(values).map_err(ConfigError::Values)? {
            v @ Json::Object(_) => v,
            Json::Null => return Err(ConfigError::Values("empty".into())),
            other => return Err(ConfigError::Values(format!("not a map: {other}"))),
        };
        Ok(InjectorConfig {
            policy,
            default_templates: raw
                .default_templates
                .filter(|t| !t.is_empty())
                .unwrap_or_else(|| vec!["sidecar".into()]),
            templates,
            aliases: raw.aliases.unwrap_or_default(),
            never_inject: raw.never_inject_selector.unwrap_or_default(),
            always_inject: raw.always_inject_selector.unwrap_or_default(),
            injected_annotations: raw.injected_annotations.unwrap_or_default(),
            values,
        })
    }

    /// The names of the templates, for errors and the debug page.
    pub fn template_names(&self) -> impl Iterator<Item = &str> {
        self.templates.keys().map(String::as_str)
    }

    pub(crate) fn value(&self, pointer: &str) -> Option<&Json> {
        self.values.pointer(pointer)
    }

    pub(crate) fn value_str(&self, pointer: &str) -> String {
        match self.value(pointer) {
            Some(Json::String(s)) => s.clone(),
            Some(Json::Null) | None => String::new(),
            Some(other) => other.to_string(),
        }
    }

    pub(crate) fn value_bool(&self, pointer: &str) -> bool {
        self.value(pointer).and_then(Json::as_bool).unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_is_shared_across_request_threads() {
        fn shared<T: Send + Sync>() {}
        shared::<InjectorConfig>();
        shared::<crate::MeshConfig>();
    }

    #[test]
    fn parses_config_and_names_what_is_wrong() {
        let c = InjectorConfig::parse(
            "policy: disabled\ntemplates:\n  a: \"x: {{ .Revision }}\"\n",
            "{\"global\": {}}",
        );
        let c = c.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.policy, Policy::Disabled);
        assert_eq!(c.default_templates, vec!["sidecar".to_string()]);
        assert_eq!(c.template_names().collect::<Vec<_>>(), vec!["a"]);

        let bad = InjectorConfig::parse("templates:\n  broken: \"{{ if }}\"\n", "{}");
        assert!(
            matches!(bad, Err(ConfigError::Template { ref name, .. }) if name == "broken"),
            "{bad:?}"
        );
        assert!(matches!(
            InjectorConfig::parse("policy: [", "{}"),
            Err(ConfigError::Config(_))
        ));
        assert!(matches!(
            InjectorConfig::parse("policy: enabled", "[1]"),
            Err(ConfigError::Values(_))
        ));
        assert!(matches!(
            InjectorConfig::parse("templates: 3", "{}"),
            Err(ConfigError::Config(_))
        ));
    }
}
