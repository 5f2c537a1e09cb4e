//! The validating webhook, `/validate` (Istio's `pkg/webhooks/validation/server`): an Istio
//! object sent by the API server on CREATE or UPDATE is decoded and validated exactly as the same
//! object read from a file or the API server (`model::config::parse_config`), and denied with the
//! reason (naming the field) when it would be rejected there. Istio's answers and metric reasons:
//!
//! - another operation: allowed (`unsupported_operation`);
//! - an object that is not JSON with apiVersion/kind/metadata: "cannot decode configuration"
//!   (`yaml_decode_error`);
//! - a kind of an Istio group (`*.istio.io`) that Istio does not know: "unrecognized type"
//!   (`unknown_type`), as istiod; a kind of another group is not ours to judge and is allowed
//!   (the webhook configuration sends only Istio groups);
//! - a spec that does not decode: "error decoding configuration" (`crd_conversion_error`);
//! - an invalid one: "configuration is invalid" (`invalid_resource`);
//! - a top-level field other than apiVersion, kind, metadata, spec, status: "unknown field"
//!   (`invalid_resource`).
//!
//! Dry runs are answered the same, with " (dry run)" in the log, and are not counted as failures.

use model::ConfigKind;
use model::config::{ConfigError, parse_config};
use serde_json::Value;

use crate::admission::{AdmissionRequest, AdmissionResponse, bounded};

const VALID_FIELDS: &[&str] = &["apiVersion", "kind", "metadata", "spec", "status"];

/// Istio's `constants.AlwaysReject`: an object carrying it is always denied. The validation
/// controller dry-runs one to learn that the webhook answers before it makes it fail closed.
pub const ALWAYS_REJECT: &str = "internal.istio.io/webhook-always-reject";

/// What Istio counts of a review: `galley_validation_passed`, or `galley_validation_failed` with
/// the reason, labelled with the request's resource (e.g. `virtualservices`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Count {
    Passed { resource: String },
    Failed { resource: String, reason: &'static str },
}

/// A review's answer and what to count of it (nothing for a failed dry run).
#[derive(Debug)]
pub struct Verdict {
    pub response: AdmissionResponse,
    pub count: Option<Count>,
}

/// One review's verdict.
pub fn validate(request: &AdmissionRequest) -> Verdict {
    let dry_run = request.dry_run == Some(true);
    let resource = &request.resource.resource;
    let failed = |reason: &'static str| {
        (!dry_run).then(|| Count::Failed {
            resource: resource.clone(),
            reason,
        })
    };
    if !matches!(request.operation.as_str(), "CREATE" | "UPDATE") {
        tracing::warn!(
            "validation webhook: unsupported operation {:?}",
            bounded(&request.operation)
        );
        return Verdict {
            response: AdmissionResponse::allowed(),
            count: failed("unsupported_operation"),
        };
    }
    match judge(request) {
        Ok(()) => Verdict {
            response: AdmissionResponse::allowed(),
            count: Some(Count::Passed {
                resource: resource.clone(),
            }),
        },
        Err(denied) => {
            if denied.logged {
                tracing::info!(
                    "validation webhook: {} {}/{} denied: {}{}",
                    bounded(&request.kind.kind),
                    bounded(&request.namespace),
                    bounded(&request.name),
                    denied.message,
                    if dry_run { " (dry run)" } else { "" }
                );
            }
            Verdict {
                response: AdmissionResponse::denied(denied.message),
                count: failed(denied.reason),
            }
        }
    }
}

/// Why an object is refused: the metric's reason, the message, and whether it is logged.
struct Denied {
    reason: &'static str,
    message: String,
    logged: bool,
}

fn denied(reason: &'static str, message: String) -> Denied {
    Denied {
        reason,
        message,
        logged: true,
    }
}

/// The object of a CREATE or UPDATE judged: allowed (an Istio kind that is valid, or a kind
/// that is not Istio's), or why not.
fn judge(request: &AdmissionRequest) -> Result<(), Denied> {
    let Some(Value::Object(object)) = &request.object else {
        return Err(denied(
            "yaml_decode_error",
            "cannot decode configuration: the object is not a JSON object".into(),
        ));
    };
    let text = |f: &str| object.get(f).and_then(Value::as_str).unwrap_or_default();
    let (api_version, kind) = (text("apiVersion"), text("kind"));
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    if api_version.is_empty() || kind.is_empty() {
        return Err(denied(
            "yaml_decode_error",
            "cannot decode configuration: Object 'Kind' is missing or apiVersion is empty".into(),
        ));
    }
    if ConfigKind::from_gvk(group, version, kind).is_none() && !group.ends_with(".istio.io") {
        return Ok(());
    }
    // Istio's internal annotation: always rejected (istiod's readiness check sends it).
    if object
        .get("metadata")
        .and_then(|m| m.get("annotations"))
        .and_then(|a| a.get(ALWAYS_REJECT))
        .is_some()
    {
        return Err(Denied {
            reason: "invalid_resource",
            message: format!("configuration is invalid: {ALWAYS_REJECT:?} annotation found, rejecting"),
            logged: false,
        });
    }
    // The namespace of a namespaced object created without one is the request's.
    let namespace = if request.namespace.is_empty() {
        "default"
    } else {
        &request.namespace
    };
    if let Err(e) = parse_config(Value::Object(object.clone()), namespace) {
        let gvk = format!("{}/{}/{}", if group.is_empty() { "core" } else { group }, version, kind);
        return Err(config_error(e, &gvk));
    }
    if let Some(field) = object.keys().find(|k| !VALID_FIELDS.contains(&k.as_str())) {
        let name = object
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(Value::as_str)
            .unwrap_or(&request.name);
        return Err(denied(
            "invalid_resource",
            format!(
                "unknown field {:?} on {} resource {}/{}",
                bounded(field),
                bounded(kind),
                bounded(&request.namespace),
                bounded(name)
            ),
        ));
    }
    Ok(())
}

/// What Istio's webhook answers, and counts, for an object the config decoder refuses.
fn config_error(e: ConfigError, gvk: &str) -> Denied {
    match e {
        ConfigError::UnknownKind { .. } => denied("unknown_type", format!("unrecognized type {}", bounded(gvk))),
        ConfigError::NotAResource => denied(
            "yaml_decode_error",
            "cannot decode configuration: not an object with apiVersion and kind".into(),
        ),
        ConfigError::Decode { reason, .. } => denied(
            "crd_conversion_error",
            format!("error decoding configuration: {reason}"),
        ),
        ConfigError::Metadata { reason, .. } => {
            denied("invalid_resource", format!("configuration is invalid: {reason}"))
        }
        ConfigError::Invalid { errors, .. } => denied(
            "invalid_resource",
            format!("configuration is invalid: {}", errors.join("; ")),
        ),
    }
}

#[cfg(test)]
#[path = "validation_tests.rs"]
mod tests;
