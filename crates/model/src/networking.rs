//! Istio `networking.istio.io` API types (v1 / v1beta1 / v1alpha3 share one schema), decoded from
//! the camelCase JSON/YAML form users write. Unknown fields are rejected, as `istioctl validate`.

mod destination_rule;
mod gateway;
mod service_entry;
mod sidecar;
mod virtual_service;

pub use destination_rule::*;
pub use gateway::*;
pub use service_entry::*;
pub use sidecar::*;
pub use virtual_service::*;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `istio.type.v1beta1.WorkloadSelector` (`matchLabels`, DestinationRule); also accepts the
/// `networking.v1alpha3.WorkloadSelector` form (`labels`) that ServiceEntry and Sidecar use.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct WorkloadSelector {
    #[serde(alias = "labels")]
    pub match_labels: BTreeMap<String, String>,
}

/// `StringMatch`: at most one of exact, prefix, regex (RE2). An empty match (`{}`) on a header
/// means "present", as Istio.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct StringMatch {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exact: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub regex: Option<String>,
}

/// The one match a `StringMatch` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchType<'a> {
    Exact(&'a str),
    Prefix(&'a str),
    Regex(&'a str),
}

impl StringMatch {
    /// The match, or `None` for an empty (presence) match. Validation guarantees at most one is set.
    pub fn match_type(&self) -> Option<MatchType<'_>> {
        if let Some(s) = &self.exact {
            Some(MatchType::Exact(s))
        } else if let Some(s) = &self.prefix {
            Some(MatchType::Prefix(s))
        } else {
            self.regex.as_deref().map(MatchType::Regex)
        }
    }

    pub fn exact(s: &str) -> StringMatch {
        StringMatch {
            exact: Some(s.to_owned()),
            ..Default::default()
        }
    }

    pub fn prefix(s: &str) -> StringMatch {
        StringMatch {
            prefix: Some(s.to_owned()),
            ..Default::default()
        }
    }

    pub fn regex(s: &str) -> StringMatch {
        StringMatch {
            regex: Some(s.to_owned()),
            ..Default::default()
        }
    }
}

/// `PortSelector`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct PortSelector {
    pub number: u32,
}

/// `Percent`: a value in [0, 100].
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Percent {
    pub value: f64,
}

/// Protobuf `Duration` in its JSON form (`"5s"`, `"0.25s"`; Go forms like `"1m30s"` accepted),
/// kept as written; `crate::duration::parse` turns it into a `std::time::Duration`.
pub(crate) type DurationString = String;
